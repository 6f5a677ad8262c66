"""affected's gate: FlashInfer's test processes import and collect while affected compiles their
modules, then wait at the gate file until it says "go" (open_gate); the lines after "go" may name the
tests to run of those collected (node ids, or test functions for all their cases). A gate whose owner
(the process that would open it) is gone never opens: the waiting process ends instead.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from fidev.core.files import write_whole

GO = "go"


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


def opened(path: Path) -> bool:
    """The gate file says go (open_gate writes it whole; the folder may go at the run's end)."""
    try:
        return path.read_text().split("\n")[0] == GO
    except (OSError, ValueError):  # gone, or not the text open_gate writes
        return False


def wait_for_gate(path: Path, owner: str, xdist_worker: bool) -> list[str] | None:
    """Until the gate file says go (the modules are built); then the tests it names, or None for
    all. A gate whose owner is gone never opens: the file's process ends, and under pytest-xdist its
    whole process group at once (the file's own session, fidev.upstream.runs), since a worker that
    exits is replaced by another."""
    import pytest  # in a pytest process: fidev itself imports only the standard library

    while True:
        lines = path.read_text().split("\n") if path.is_file() else []  # written whole, then renamed
        if lines and lines[0] == GO:
            return [line for line in lines[1:] if line] or None
        if not owner_alive(owner):
            if xdist_worker:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            pytest.exit(
                f"the process that started these tests ({owner}) is gone before they could run",
                returncode=pytest.ExitCode.INTERRUPTED,
            )
        time.sleep(0.05)


def make_cuda_context() -> None:
    """The process's CUDA context, made while it waits at the gate instead of in its first test
    after it, where all of it would come past the build (its cost per process: docs/measurements.md,
    row "CUDA context in a process's first case").
    Only where the tests' imports brought torch and it sees a GPU: fidev imports nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.empty(1, device="cuda")


def open_gate(path: Path, selection: list[str] | None = None) -> None:
    """Let the gated tests run: all of them, or those `selection` names (written whole)."""
    write_whole(path, "\n".join([GO, *(selection or [])]) + "\n")


def selected(nodeid: str, selection: list[str]) -> bool:
    """A node id the gate's selection names: itself, or a case of a named function."""
    return any(nodeid == s or nodeid.startswith(s + "[") for s in selection)


class Gate:
    """The plugin that holds a run's process at the gate once it has collected (an xdist worker too),
    and then narrows what it runs to the gate's selection (the last of the narrowing steps:
    fidev.upstream.plugin registers them in order). `selection` is what the gate named, once open."""

    def __init__(self, path: Path, owner: str):
        self.path, self.owner = path, owner
        self.selection: list[str] | None = None

    def narrow(self, config, items) -> None:
        make_cuda_context()
        self.selection = wait_for_gate(self.path, self.owner, hasattr(config, "workerinput"))
        if self.selection is not None:
            config.hook.pytest_deselected(items=[item for item in items if not selected(item.nodeid, self.selection)])
            items[:] = [item for item in items if selected(item.nodeid, self.selection)]
