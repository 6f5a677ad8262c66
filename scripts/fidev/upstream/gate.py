"""affected's gate: FlashInfer's test processes import and collect while affected rebuilds the modules
their cases load, then run each case as soon as the modules it loads are built, not once all are.

affected writes the gate file (GateWriter), whole each time (fidev.core.files.write_whole: a reader never
sees half of it); each test process reads it (read_state). Its fields (SCHEMA, version 1):
  schema      "fidev-affected-gate/2"
  selection   the tests to run of those collected (node ids, or test functions for all their cases);
              null: all of them
  modules     the modules the rebuild builds
  built       those of them built, each named once affected kept its verdict `unfinished` (a test may
              load it from then on)
  held        the rebuild holds the lock of each of its modules not built yet, from before the file's
              first text (a case that loads one waits for its build: FlashInfer's `build_and_load` takes
              the module's lock); false: `built` stays empty until open
  open        the whole rebuild is done: every case may run
No file: the rebuild has not started (a Python edit's tests start before the regeneration): they wait.

Before the gate is open a process runs a case where the record (the sample spec's {node id: modules})
names the modules it loads, each of them built and none still rebuilding (`ready`); where no such case is
left, and the rebuild holds its locks (`held`), a case the record does not name (a case no run has run
yet: the one that catches the edit may be among them), which compiles from the tree what nothing built
and waits for the lock of what still rebuilds. A case that would compile a module the record names and
nothing built waits for the whole rebuild (the builds ahead then compile those side by side), as does
every case of a run with no record (`--whole-family`: all unnamed, they would take every core from the
rebuild). Among the cases ready, pytest's order; while none is ready, the process waits (run_in_turn).
A gate whose owner (the process that writes it) is gone never opens: the waiting process ends instead;
a gate file of another schema ends it too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from fidev.core.files import fits, load_json, write_whole
from fidev.smoke import run_loop

SCHEMA = "fidev-affected-gate/2"
# the gate file's fields, less its schema
SHAPE = {"selection": list[str] | None, "modules": list[str], "built": list[str], "held": bool, "open": bool}
WAIT_S = 0.05  # how often a waiting process reads the gate file again


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces and parentheses):
    [0] is field 3, the state; [19] is field 22, the start time. None without /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def process_identity(pid: int) -> str:
    """A process as the gate names its owner: its pid and, where /proc has it, its start time (in
    clock ticks since boot), so that a pid used again is not the owner."""
    fields = stat_fields(pid)
    return f"{pid}:{fields[19] if fields else ''}"


def owner_alive(owner: str) -> bool:
    """The gate's owner still runs: the same process (pid and start time), and not a zombie."""
    pid, _, started = owner.partition(":")
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    except ValueError:
        return False
    fields = stat_fields(int(pid))
    if fields is None:
        return True  # no /proc: the pid alone
    return fields[0] != "Z" and (not started or fields[19] == started)


@dataclass(frozen=True)
class State:
    """What the gate file says: the tests to run (None: all), the rebuild's modules not built yet,
    whether the whole rebuild is done, and whether the rebuild holds the lock of each module waiting."""

    selection: list[str] | None
    waiting: frozenset[str]
    open: bool
    held: bool = False


def state_text(selection: list[str] | None, modules, built, is_open: bool, held: bool = False) -> str:
    """The gate file's text (SCHEMA)."""
    return json.dumps(
        {
            "schema": SCHEMA,
            "selection": selection,
            "modules": sorted(modules),
            "built": sorted(built),
            "held": held,
            "open": is_open,
        }
    )


def read_state(path: Path) -> State | None:
    """The gate's state; None where there is no gate file yet (or no more: the run's folder went at its
    end). ValueError for a file that cannot be read or is of another schema or shape: no gate of ours."""
    none_of_ours = f"the gate file {path} is not affected's gate of schema {SCHEMA}"
    try:
        data = load_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{none_of_ours} ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not fits(data, SHAPE):
        raise ValueError(none_of_ours)
    return State(data["selection"], frozenset(data["modules"]) - set(data["built"]), data["open"], data["held"])


def opened(path: Path) -> bool:
    """The whole rebuild is done (the builds ahead of the tests start then); False where there is no
    gate file, or none of ours."""
    try:
        state = read_state(path)
    except ValueError:
        return False
    return state is not None and state.open


def open_gate(path: Path, selection: list[str] | None = None) -> None:
    """A gate open at once: every case may run (all, or those `selection` names)."""
    write_whole(path, state_text(selection, [], [], True))


class GateWriter:
    """affected's side of the gate: begin() says the rebuild's modules and the tests to run, built(name)
    each module as it is built, open() the whole rebuild done. The file is written from begin() on
    (what came before is in its first text: the rebuild's thread may say a module built, or all, before
    the run's thread says it began), and never after close() (its folder goes). Called from the
    rebuild's threads: one writer at a time."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.selection: list[str] | None = None
        self.modules: set[str] = set()
        self.done: set[str] = set()
        self.is_open = self.begun = self.closed = False
        self.by_module = True

    def begin(self, modules, selection: list[str] | None, by_module: bool = True) -> None:
        """`by_module` False: no module is said built before open() (the rebuild does not hold every
        module's lock, so a case may load one before it is rebuilt: every case waits for the whole)."""
        with self.lock:
            self.modules, self.selection, self.begun, self.by_module = set(modules), selection, True, by_module
            self.write()

    def built(self, name: str) -> None:
        with self.lock:
            self.done.add(name)
            self.write()

    def open(self) -> None:
        with self.lock:
            self.is_open = True
            self.write()

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def write(self) -> None:
        if self.begun and not self.closed:
            built = self.done & self.modules if self.by_module else set()
            write_whole(self.path, state_text(self.selection, self.modules, built, self.is_open, self.by_module))


def ended(message: str, xdist_worker: bool) -> NoReturn:
    """The waiting process ends (pytest.exit), and under pytest-xdist its whole process group at once
    (the file's own session, fidev.upstream.runs), since a worker that exits is replaced by another."""
    import pytest  # in a pytest process: fidev itself imports only the standard library

    if xdist_worker:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    pytest.exit(message, returncode=pytest.ExitCode.INTERRUPTED)


def checked(path: Path, owner: str, xdist_worker: bool) -> State | None:
    """The gate's state now; the process ends where its owner is gone while the gate is not open, or
    where the file is none of ours."""
    try:
        state = read_state(path)
    except ValueError as e:
        ended(f"{e}: these tests cannot tell when their modules are built", xdist_worker)
    if (state is None or not state.open) and not owner_alive(owner):
        ended(f"the process that started these tests ({owner}) is gone before they could run", xdist_worker)
    return state


def wait_for_gate(path: Path, owner: str, xdist_worker: bool, until: Callable[[State], bool]) -> State:
    """Until the gate file says `until` (affected began its rebuild; an xdist worker, whose controller
    hands it its cases in its own order: the whole rebuild done); then its state."""
    while True:
        state = checked(path, owner, xdist_worker)
        if state is not None and until(state):
            return state
        time.sleep(WAIT_S)


def starts_once(xdist_worker: bool) -> Callable[[State], bool]:
    """When a process behind the gate may start on its cases: an xdist worker, whose controller hands
    it its cases in its own order, once the whole rebuild is done (it cannot pick the ready ones); any
    other once the rebuild began (it picks them itself: run_in_turn)."""
    return (lambda state: state.open) if xdist_worker else (lambda state: True)


def make_cuda_context() -> None:
    """The process's CUDA context, made while it waits at the gate instead of in its first test
    after it, where all of it would come past the build (its cost per process: docs/measurements.md,
    row "CUDA context in a process's first case").
    Only where the tests' imports brought torch and it sees a GPU: fidev imports nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.empty(1, device="cuda")


def selected(nodeid: str, selection: list[str]) -> bool:
    """A node id the gate's selection names: itself, or a case of a named function."""
    return any(nodeid == s or nodeid.startswith(s + "[") for s in selection)


class Gate:
    """The plugin that holds a run's process at the gate once it has collected (an xdist worker too),
    then narrows what it runs to the gate's selection (the last of the narrowing steps:
    fidev.upstream.plugin registers them in order), and, outside pytest-xdist, runs each case once the
    gate says the modules it loads are built (run_in_turn). `needs`: {node id: the modules the record
    names for it}; `built(name)`: the module is built (its library is there); `stopped()`: the run's
    early stop has come (the case it would run next is not run, fidev.upstream.outcomes.early_stop).
    `selection` is what the gate named, once begun."""

    def __init__(
        self,
        path: Path,
        owner: str,
        needs: dict[str, list[str]] | None = None,
        built: Callable[[str], bool] = lambda name: False,
        stopped: Callable[[], bool] = lambda: False,
    ):
        self.path, self.owner, self.needs, self.built, self.stopped = path, owner, needs or {}, built, stopped
        self.selection: list[str] | None = None
        self.in_turn = False  # this process collected, not under pytest-xdist: run_in_turn orders its cases
        self.last: State | None = None

    def narrow(self, config, items) -> None:
        make_cuda_context()
        worker = hasattr(config, "workerinput")
        self.last = wait_for_gate(self.path, self.owner, worker, starts_once(worker))
        self.selection = self.last.selection
        self.in_turn = not worker
        if self.selection is not None:
            config.hook.pytest_deselected(items=[item for item in items if not selected(item.nodeid, self.selection)])
            items[:] = [item for item in items if selected(item.nodeid, self.selection)]

    def state(self) -> State:
        """The gate's state now (the last one read where the file went: the run ends), its process ended
        where its owner is gone while it is not open."""
        self.last = checked(self.path, self.owner, False) or self.last
        return self.last

    def is_open(self) -> bool:
        """The whole rebuild is done (the warmups' builds beside the cases start then); read without ending
        the process: called from a build's thread."""
        return opened(self.path)

    def ready(self, left: list):
        """The first case of `left` to run now, else None: one whose modules the record names, each built
        and none still rebuilding; else, once the gate is open, the first left, and before, where the
        rebuild holds its locks and the run has a record, the first the record does not name."""
        state = self.state()
        for item in left:
            named = self.needs.get(item.nodeid)
            if named and not state.waiting.intersection(named) and all(self.built(m) for m in named):
                return item
        if state.open:
            return left[0] if left else None
        if state.held and self.needs:
            return next((item for item in left if not self.needs.get(item.nodeid)), None)
        return None

    def next_case(self, left: list):
        """The case to run next: the first ready, waited for; the first left where the early stop came."""
        while True:
            item = self.ready(left)
            if item is not None:
                return item
            if self.stopped():
                return left[0]
            time.sleep(WAIT_S)


def kept_for(item, left: list):
    """pytest's `nextitem` for `item` where no case is ready yet: a case left where every one left is of
    `item`'s parent (so that whichever runs next, the fixtures its parent holds, a warmup_jit's, are kept),
    else None (every fixture torn down, set up again by the next case)."""
    return left[0] if left and all(other.parent is item.parent for other in left) else None


def run_in_turn(gate: Gate):
    """The plugin whose run loop replaces pytest's in a gated process that collected (not under
    pytest-xdist): each case runs once the gate says the modules it loads are built (Gate.ready), the
    first such in pytest's order; while none is ready it waits (Gate.next_case). pytest's `nextitem` is a
    case ready as the case before it starts, and that one runs next; where none is ready yet, kept_for's.
    The early stop and pytest's -x end the loop as they end pytest's. pytest is imported here."""
    import pytest

    class InTurn:
        @pytest.hookimpl(tryfirst=True)
        def pytest_runtestloop(self, session):
            if not gate.in_turn:
                return None  # an xdist controller or worker: xdist's loop
            return run_loop.run_in_order(session, gate.next_case, gate.ready, kept_for)

    return InTurn()
