"""Running the tests of the changed modules around their rebuild: smoke's and abi-smoke's in this
process (fidev.affected.ours), FlashInfer's own in processes of their own behind their gate
(fidev.affected.theirs), each once the modules it loads are rebuilt; unless affected --keep-going, the
first failure of either ends the other and what still builds."""

from __future__ import annotations

import io
import os
import shlex
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fidev.affected import ours as our_tests
from fidev.affected import theirs as their_tests
from fidev.affected.report import short
from fidev.builds import module_builds
from fidev.core.failure import Failure


class BuildFailed(Failure):
    """The build of the changed modules failed: the verdict `build failed`."""


@dataclass
class Outcome:
    """What the rebuild and the tests did: the rebuild's line and time, what failed, what broke
    without a failed test named, the commands that rerun the failures alone, and the PAST_BUILD figures
    (theirs.past_figures)."""

    built: str
    build_s: float
    rebuilt: list[str]
    failed: set[str] = field(default_factory=set)
    broken: list[str] = field(default_factory=list)
    reruns: list[str] = field(default_factory=list)
    past: dict[str, float] | None = None
    exercised_files: set[str] = field(
        default_factory=set
    )  # FlashInfer's test files with a case that passed or failed: what covers a family
    stopped: bool = False  # the first failure ended the run: selected tests did not run (no module passes on them)


class Screen:
    """Lines said on this process's stdout as it is now, also while smoke's pytest session, which
    captures file descriptor 1 between its tests, runs in this process: the rebuild's and the builds
    beside it, said from their threads meanwhile, are not swallowed. Where stdout has no descriptor
    (a test's capture), print. close() lets its copy of the descriptor go."""

    def __init__(self):
        try:
            self.out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
        except (OSError, ValueError, io.UnsupportedOperation):
            self.out = None

    def __call__(self, line: str) -> None:
        if self.out is None:
            print(line, flush=True)
            return
        sys.stdout.flush()
        self.out.write(line.rstrip("\n") + "\n")

    def close(self) -> None:
        if self.out is not None:
            self.out.close()


def screen() -> Screen:
    return Screen()


def start_rebuild(
    to_build: list,
    then: Callable,
    say: Callable[[str], None],
    first: Sequence[str],
    rebuilt: Callable[[str], None] = lambda name: None,
) -> module_builds.Rebuild:
    """The changed modules' rebuild, started (fidev.builds.module_builds.Rebuild: each under its lock,
    held from now); `then(rebuild)` once all are built; `first`: the modules smoke's tests load
    (ours.smoke_loaded), then those of a case of each of FlashInfer's test functions (theirs.their_first),
    which build first, in that order, the head of it with the cores first (module_builds.leading);
    `rebuilt(name)` as each is built, before its lock is let go (affected keeps it `unfinished` with the
    inputs its rebuild recorded)."""
    return module_builds.Rebuild(to_build, then, say, first, rebuilt)


def rebuilt_line(names: list[str], seconds: float, slowest: list) -> str:
    """The rebuild's line."""
    return (
        f"{len(names)} module(s) rebuilt in {seconds:.1f} s"
        + (f" (slowest object {slowest[0][0]:.1f} s)" if slowest else "")
        if names
        else "no built module to rebuild"
    )


def when_rebuilt(outcome: Outcome, built: Callable[[], None], run, say: Callable[[str], None]) -> Callable:
    """What the rebuild does once every module is built, in its thread: its line, affected's `unfinished`
    verdicts kept (built()), then FlashInfer's gate opened whole: the cases the record names no modules
    of may run, and their builds beside the cases and ahead of them start (the rebuild had the cores)."""

    def then(rebuilding) -> None:
        outcome.built = rebuilt_line(outcome.rebuilt, rebuilding.seconds(), rebuilding.slowest())
        built()
        if run:
            run.open()
        say(f"affected: {outcome.built}")

    return then


def said_rebuilt(rebuilt: Callable[[str], None], run: their_tests.FlashInferTests | None) -> Callable[[str], None]:
    """What the rebuild does as each module is built, before its lock is let go: affected keeps it
    `unfinished` (rebuilt(name)), then FlashInfer's gate says it is built, so that the cases that load
    it may run while the others build."""
    if run is None:
        return rebuilt

    def both(name: str) -> None:
        rebuilt(name)
        run.built(name)

    return both


def finish_rebuild(
    rebuilding, outcome: Outcome, failed_table, built: Callable[[], None], stop: Callable[[], bool] | None = None
) -> None:
    """Once the rebuild has ended: its time in `outcome`; with `stop` (FlashInfer's tests ended failing),
    what still builds is stopped as soon as stop() is true. A failure shows the table with `build failed`
    (failed_table()) and is BuildFailed; a rebuild the first failure stopped says so, and leaves its
    modules `unfinished` (built())."""
    rebuilding.wait(stop)
    outcome.build_s = rebuilding.seconds()
    if rebuilding.failure is not None:
        print(failed_table())
        raise BuildFailed(
            f"the build of {short(outcome.rebuilt)} failed: {rebuilding.failure.problem}", rebuilding.failure.fix
        )
    if not outcome.built:  # stopped before every module was built
        outcome.built = f"the rebuild stopped at the first failure, {outcome.build_s:.1f} s in"
        print(f"affected: {outcome.built}", flush=True)
        built()


def ours_step(
    ours: list[str],
    importing: threading.Thread | None,
    outcome: Outcome,
    mode: str,
    stop: Callable[[], bool] | None = None,
    building: Callable[[], set[str]] = set,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> None:
    """smoke's tests (run_ours), each once its modules are built (ready_first: `building()` names the
    rebuild's modules still building); `stop`: the first failure ends them, and so does stop() turning true."""
    if importing:
        importing.join()
    wide = ["--wide"] if any("/test_wide.py::" in t for t in ours) else []
    beside = our_tests.SmokeBuilds(ours, say)
    order = our_tests.ready_first(our_tests.loaded_modules(ours), lambda: building() | beside.pending(), stop)
    try:
        status, bad, unrun = our_tests.run_ours(ours, wide, mode, stop, order)
    finally:
        beside.stop()
    outcome.stopped |= unrun
    if unrun and not bad:  # FlashInfer's tests, or the rebuild, failed first: that failure is the answer
        print(
            "affected: smoke's tests stopped: FlashInfer's tests or the rebuild failed first (--keep-going runs "
            "every test)",
            flush=True,
        )
        return
    outcome.failed |= bad
    if bad:
        outcome.reruns.append(
            "pixi run -e flashinfer-dev python -m pytest "
            + " ".join(map(shlex.quote, sorted(bad)))
            + "".join(f" {w}" for w in wide)
        )
    elif status != 0:
        outcome.broken.append(
            "no smoke or abi-smoke test passed (skipped: reasons above)"
            if status == our_tests.NOTHING_PASSED
            else f"tests/ exited {status} with no failed test named"
        )


def theirs_step(status: int, bad: set[str], unread: Failure | None, outcome: Outcome) -> None:
    outcome.failed |= bad
    if bad:
        first = " ".join(map(shlex.quote, sorted(bad)[:5]))
        outcome.reruns.append(
            f"pixi run -e flashinfer-dev upstream-tests --no-plan {first}"
            + (f" (the first 5 of {len(bad)})" if len(bad) > 5 else "")
        )
    elif unread is not None:
        outcome.broken.append(
            f"upstream-tests exited {status}, and its summary could not be read (the error above says why)"
        )
    elif status != 0:
        outcome.broken.append(
            f"upstream-tests exited {status} with no failed test named (its last lines above say why)"
        )


def first_failure_elsewhere(rebuilding, run: their_tests.FlashInferTests | None) -> Callable[[], bool]:
    """What stops smoke's tests: a module's rebuild failed (its test would load the old library), or
    FlashInfer's tests ended failing."""
    return lambda: rebuilding.failure is not None or (run is not None and run.ended_failing())


def stop_theirs(run: their_tests.FlashInferTests, outcome: Outcome) -> bool:
    """FlashInfer's tests stopped, unrun: smoke's first failure is the answer."""
    run.stop()
    outcome.stopped = True
    print("affected: FlashInfer's tests stopped: smoke's tests failed first (--keep-going runs every test)", flush=True)
    return True


def build_and_test(
    to_build: list,
    early: their_tests.FlashInferTests | None,
    ours: list[str],
    theirs: list[str],
    recorded: dict[str, list[str]],
    changed,
    file_times: Path,
    failed_table,
    built: Callable[[], None],
    sampled: bool,
    mode: str,
    keep_going: bool = False,
    first: frozenset[str] = frozenset(),
    rebuilt: Callable[[str], None] = lambda name: None,
    first_files: Sequence[str] = (),
) -> Outcome:
    """Rebuild the changed modules while FlashInfer's tests import and collect, and run smoke's tests
    here meanwhile, each once the modules it loads are rebuilt (the rebuild holds each module's lock
    until it is built: start_rebuild, ready_first); FlashInfer's through their gate, each case once the
    modules the record names for it are rebuilt (`rebuilt(name)` keeps each first), the others once every
    module is; the modules smoke's tests load (`first`) build first. `built()` is called then, before
    the gate opens whole (affected keeps its `unfinished` verdicts), or once a rebuild the first failure
    stopped has ended. Unless `keep_going`, the first failing test ends the run: smoke's stops the
    rebuild and FlashInfer's tests, and FlashInfer's first failing case ends theirs, smoke's and the
    rebuild. Each is stopped however the run ends. `first_files`: FlashInfer's test files whose cases'
    modules their plan builds ahead first (fidev.affected.theirs.their_run)."""
    stop_after = 0 if keep_going else their_tests.STOP_AFTER
    run, selection = their_tests.their_run(
        early, theirs, recorded, changed, file_times, sampled, stop_after, first_files
    )
    importing, their_status, their_failed, stopped_theirs, rebuilding, say = None, 0, set(), False, None, None
    outcome = Outcome("", 0.0, sorted(m.name for m in to_build))
    try:
        importing, say = our_tests.import_meanwhile() if ours else None, screen()
        then = when_rebuilt(outcome, built, run, say)
        theirs_first = their_tests.their_first(recorded, outcome.rebuilt, theirs)
        ranked = tuple(m.name for m in to_build if m.name in first) + tuple(m for m in theirs_first if m not in first)
        rebuilding = start_rebuild(to_build, then, say, ranked, said_rebuilt(rebuilt, run))
        if run:  # the rebuild holds its modules' locks: FlashInfer's cases may start, each once its modules are built
            run.begin(outcome.rebuilt, selection, rebuilding.all_held)
        if ours:
            stop = None if keep_going else first_failure_elsewhere(rebuilding, run)
            ours_step(ours, importing, outcome, mode, stop, rebuilding.pending, say)
        if outcome.failed and not keep_going:  # smoke's first failure is the answer: what still builds is stopped
            rebuilding.stop()
        # FlashInfer's first failing case, beside the rebuild, is the answer too: what still builds is stopped
        finish_rebuild(rebuilding, outcome, failed_table, built, run.ended_failing if run and not keep_going else None)
        if run and outcome.failed and not keep_going:  # smoke's first failure is the answer: theirs are stopped, unrun
            stopped_theirs = stop_theirs(run, outcome)
        elif run:
            their_status, their_failed = run.finish()
            outcome.stopped |= run.stopped_early
    finally:
        stop_all(rebuilding, run, say, importing)
    if theirs and not stopped_theirs:
        their_outcome(run, their_status, their_failed, changed, outcome)
    return outcome


def stop_all(rebuilding, run: their_tests.FlashInferTests | None, say, importing) -> None:
    """What build_and_test started, stopped however it ended (each where it started)."""
    if rebuilding:
        rebuilding.stop()
    if run:
        run.stop()
    if say is not None and hasattr(say, "close"):
        say.close()
    if importing:  # not left importing torch while the interpreter exits (a failed build)
        importing.join(timeout=60)


def their_outcome(run: their_tests.FlashInferTests, status: int, failed: set[str], changed, outcome: Outcome) -> None:
    """What FlashInfer's finished run says, in `outcome`: what failed or broke (theirs_step), a changed
    module its sample did not exercise (no pass), its times past the build and the files it exercised."""
    theirs_step(0 if run.all_skipped else status, failed, run.unread, outcome)
    if missed := [m for m in run.missed if m in changed]:  # no case of theirs ran it: not a pass
        outcome.broken.append(
            f"no collected FlashInfer test is recorded for {short(missed)}, so the sample did not exercise it "
            "(upstream-tests FAMILY records them again)"
        )
    outcome.past = run.past
    outcome.exercised_files = run.exercised_files
