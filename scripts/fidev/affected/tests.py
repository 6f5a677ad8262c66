"""Running the tests of the changed modules: smoke's and abi-smoke's in this process, FlashInfer's
own through upstream-tests in a process of its own, started before the build and held at a gate
(fidev.upstream.gate) that says which modules are built, each case running once those it loads are;
its result read from the summary it writes (fidev.upstream.summary), not from its output."""

from __future__ import annotations

import io
import math
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fidev.affected.report import short
from fidev.builds import module_builds, smoke_modules
from fidev.core import workspace
from fidev.core.failure import Failure, report
from fidev.core.manifest import ROOT
from fidev.smoke import gpu_suite
from fidev.upstream import gate as upstream_gate
from fidev.upstream import sample as upstream_sample
from fidev.upstream import summary as upstream_summary
from fidev.upstream.settings import Settings, child_env

NOTHING_PASSED = -1  # pytest's status 0 with every test skipped: not a pass
# Past CASES_PER_PROCESS cases a process, another pytest process on the GPU pays for its start
# (torch's import and the file's collection, and its CUDA context: all before the gate), at the
# rate FlashInfer's small cases run; MAX_PROCESSES bounds them. The rates and the silu round's
# times with 4 and 8 processes that set them are in docs/measurements.md, rows "upstream baseline of norm"
# (2705 cases), "630 silu cases after the gate, 8 processes" and "630 silu cases, 4 against 8 processes".
CASES_PER_PROCESS, MAX_PROCESSES = 80, 8
# The first failing test ends the run (affected --keep-going runs every one): FlashInfer's tests stop at
# their first failing case (upstream-tests --stop-after), smoke's at their first failure (pytest -x), and
# either stops the other; the answer is "failed" by then, and the rerun commands name what failed
STOP_AFTER = 1
THREADS = "OMP_NUM_THREADS"  # torch's CPU thread pool in each process; the user's own value is kept
PAST_BUILD = re.compile(
    r"affected: FlashInfer's tests ended (\d+\.\d) s after the build \(their last case (\d+\.\d) s after it\)"
)


def collector(stop: Callable[[], bool] | None = None):
    """The plugin run_ours gives smoke's pytest session: it collects the failing node ids (`ids`)
    and Ctrl-C (`interrupted`); with `stop` (a callable that says FlashInfer's tests failed), no
    test runs once stop() is true, and the session ends as -x ends it (`stopped`; pytest's
    shouldfail, not a KeyboardInterrupt). pytest is imported here: this runs in pytest's process."""
    import pytest

    class Failed:
        REASON = "FlashInfer's tests failed: the first failure ends the run (--keep-going runs every test)"

        def __init__(self):
            self.ids, self.interrupted, self.stopped = set(), False, False

        def pytest_runtest_logreport(self, report):
            if report.failed:
                self.ids.add(report.nodeid)

        def pytest_keyboard_interrupt(self, excinfo):  # pytest.main keeps Ctrl-C (SIGTERM, here) to itself: status 2
            self.interrupted = True

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(self, item, nextitem):
            if stop is None or self.stopped or not stop():
                return None
            self.stopped = True
            item.session.shouldfail = self.REASON
            return True  # not run

    return Failed()


WAIT_S = 0.1  # how often ready_first looks again while every test left waits for a module still building


def ready_first(loaded: list[tuple[tuple[str, ...], str]], pending: Callable[[], set[str]], stop=None):
    """The plugin whose run loop replaces pytest's for smoke's tests in affected's process: each test runs
    once none of the modules it loads is still building (`pending()`: the rebuild's and the builds
    beside it; `loaded`: (tests, module) pairs, as smoke_modules names them), the first such in
    pytest's order; while none is ready it waits. So a test of a module rebuilt early runs, and may be
    the first failure, while the others still build. A test that loads no module named is ready.
    pytest's `nextitem`, which says which fixtures a test's teardown keeps, is a test ready as the test
    before it starts, and that one runs next; where none is ready yet it is None, and every fixture is
    torn down, to be set up again by the next test. With `stop()` true, it waits for nothing (the
    collector ends the run). pytest is imported here."""
    import pytest

    class ReadyFirst:
        def __init__(self):
            self.modules: dict[str, set[str]] = {}

        def needs(self, item) -> set[str]:
            if item.nodeid not in self.modules:
                test = item.nodeid.removeprefix("tests/")
                self.modules[item.nodeid] = {name for tests, name in loaded if loads(test, tests)}
            return self.modules[item.nodeid]

        def ready(self, left: list):
            building = pending()
            return next((item for item in left if not self.needs(item) & building), None), building

        def next_ready(self, left: list):
            while True:
                item, building = self.ready(left)
                if item is not None or not building or (stop is not None and stop()):
                    return item or left[0]
                time.sleep(WAIT_S)

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtestloop(self, session):
            if session.testsfailed and not session.config.option.continue_on_collection_errors:
                return None  # pytest's own loop says it
            if session.config.option.collectonly:
                return True
            left, committed = list(session.items), None
            while left:
                item = committed if committed is not None else self.next_ready(left)
                left.remove(item)
                # the next test: one ready now, run next whatever else becomes ready meanwhile, so that the
                # fixtures kept for it are its own; none ready yet: every fixture torn down, set up again next
                committed = self.ready(left)[0] if left else None
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=committed)
                if session.shouldfail:
                    raise session.Failed(session.shouldfail)
                if session.shouldstop:
                    raise session.Interrupted(session.shouldstop)
            return True

    return ReadyFirst()


def run_ours(
    tests: list[str], wide: list[str], mode: str, stop: Callable[[], bool] | None = None, order=None
) -> tuple[int, set[str], bool]:
    """smoke's and abi-smoke's tests, in this process as smoke runs them (fidev.smoke.gpu_suite: no
    third-party plugin), so that a flashinfer the regeneration imported is not imported again:
    (status, the node ids that failed or errored, whether tests were left unrun). With `stop`, the
    first failure ends them (-x), and so does `stop()` turning true before a test (Failed). `order`: the
    plugin that runs each test once its modules are built (ready_first). Our conftest redirects
    FlashInfer's variables for the session; the environment is restored after it, for FlashInfer's
    own tests."""

    print(f"affected: smoke and abi-smoke tests: {short(tests, 4)}", flush=True)
    plugin, saved = collector(stop), dict(os.environ)
    os.environ[gpu_suite.NO_AUTOLOAD] = "1"
    first = ["-x"] if stop is not None else []
    try:
        status = gpu_suite.run_paths(
            "affected",
            [str(ROOT / "tests" / t) for t in tests],
            ["-q", *first, *wide],
            mode,
            plugins=(plugin,) if order is None else (plugin, order),
        )
    except Failure as failure:  # nothing passed: every test skipped, or none selected
        print(f"affected: {failure.problem}")
        status = NOTHING_PASSED
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if plugin.interrupted:
        raise KeyboardInterrupt  # so that what runs beside them is stopped too
    return status, plugin.ids, plugin.stopped or bool(first and plugin.ids)


def cases_by_file(recorded: dict[str, list[str]], modules) -> dict[str, int]:
    """{test file: how many recorded cases of these modules it has}."""
    found: dict[str, int] = {}
    for case in {t for name in modules for t in recorded.get(name, [])}:
        found[case.split("::")[0]] = found.get(case.split("::")[0], 0) + 1
    return found


def processes(cases_per_file: dict[str, int], file_times: Path) -> tuple[list[str], dict[str, str]]:
    """upstream-tests' option for FlashInfer's tests of an edit, how many processes run each file
    on each GPU at once (`--per-gpu`, fidev.upstream.runs: a part each; a long file is in a part
    per GPU already, fidev.upstream.runs.parts), and the environment of those processes: a process
    per CASES_PER_PROCESS cases of the largest part, up to MAX_PROCESSES and half the cores shared
    by the GPUs in use; one for a few cases. The cores are shared among their torch thread pools
    too (THREADS), unless the user set it: among all that start at once behind the gate
    (fidev.upstream.runs.at_once). Separate processes, not pytest-xdist's workers: those
    start only once xdist's controller has imported torch and flashinfer (FlashInfer's conftest
    imports both), and the last of them was not ready when the gate opened (docs/measurements.md,
    row "xdist workers ready after the gate").
    `file_times` is the task's workspace's (fidev.core.workspace.Workspace.file_times, read at its start): each
    file's last time."""
    from fidev.upstream import runs as upstream_runs

    gpus = len(upstream_runs.host_gpus())
    times = upstream_runs.load_times(file_times)
    split = {f: upstream_runs.parts(times.get(f), gpus) for f in cases_per_file}
    at_once = max(1, min(sum(split.values()), gpus))
    cpus = os.cpu_count() or 1
    largest = max((math.ceil(n / split[f]) for f, n in cases_per_file.items()), default=0)
    n = max(1, min(MAX_PROCESSES, cpus // (2 * at_once), math.ceil(largest / CASES_PER_PROCESS)))
    # behind the gate every process starts at once, as far as the GPUs and cores allow: their pools share the cores
    each = upstream_runs.at_once(sum(split.values()) * n, gpus, n, gated=True)
    # the user's own value kept; an empty one is unset (OpenMP reads it so: every core to each process)
    env = {} if os.environ.get(THREADS) else {THREADS: str(max(1, cpus // (at_once * each)))}
    return (["--per-gpu", str(n)] if n > 1 else []), env


def past_figures(ended: float, last: float | None, first_failure: float | None = None) -> dict[str, float | None]:
    """How long FlashInfer's tests ran after the gate opened, to their end and to their last case's
    (the rest is their processes' exit and upstream-tests' own summary), as the PAST_BUILD line says them,
    and to their first failing case's end (None where none failed)."""
    last_s = max(0.0, last if last is not None else ended)
    first_s = None if first_failure is None else round(max(0.0, first_failure), 1)
    return {"ended_s": round(max(0.0, ended), 1), "last_case_s": round(last_s, 1), "first_failure_s": first_s}


def past_build(past: dict[str, float]) -> str:
    """The PAST_BUILD line."""
    return (
        f"affected: FlashInfer's tests ended {past['ended_s']:.1f} s after the build (their last case "
        f"{past['last_case_s']:.1f} s after it)"
    )


class FlashInferTests:
    """FlashInfer's tests of the edited modules, through upstream-tests in a process of its own,
    started before the build so that its processes import and collect while the modules compile;
    they wait at a gate (fidev.upstream.gate) until `begin()` names the rebuild's modules and the tests
    to run (`deferred`: started for every module a Python edit may change), then run each case once
    `built()` said the modules it loads are built, or once `open()` said the whole rebuild is. Its
    output is held until `finish()`, so that it does not cut into smoke's tests, which run meanwhile in
    this process."""

    started: set[FlashInferTests] = set()  # stopped by run() however it ends

    def __init__(
        self,
        tests: list[str],
        cases_per_file: dict[str, int],
        file_times: Path,
        deferred: bool = False,
        sample: list[str] | None = None,
        stop_after: int = STOP_AFTER,
        plan: bool = False,
    ):
        """`sample`: the modules the sample of their cases must exercise (upstream-tests --sample
        --sample-modules, fidev.upstream.sample); None: every case of the tests (--whole-family).
        `stop_after`: the failing cases that end their run (0: every case runs, --keep-going).
        `plan`: upstream-tests' plan first (its dry run, while the modules compile), so that the
        record names the modules of the sample's cases and their warmups build only those
        (fidev.upstream.plugin); else --no-plan."""
        self.tests, self.plan = tests, plan
        # their run stopped at its first failures, or was stopped by smoke's: cases left unrun
        self.stopped_early = False
        self.missed: list[str] = []  # modules the sample had no recorded case of, once finished
        self.opened: float | None = None  # when the gate opened (time.time())
        self.past: dict[str, float] | None = None  # the PAST_BUILD line's figures, once finished
        self.unread: Failure | None = None  # why its summary could not be read, once finished
        # the test files with a case that passed or failed (tests/...), once finished
        self.exercised_files: set[str] = set()
        self.all_skipped = False  # every case skipped here, once finished
        # a sample is a few dozen cases a file, whatever the record counts (docs/measurements.md, row "sample sizes"):
        # a process a file or part
        workers, threads = processes(
            cases_per_file if sample is None else {f: min(n, CASES_PER_PROCESS) for f, n in cases_per_file.items()},
            file_times,
        )
        self.folder = Path(tempfile.mkdtemp(prefix=workspace.AFFECTED_SCRATCH))
        self.gate, self.summary = self.folder / "gate", self.folder / upstream_summary.NAME
        self.gating = upstream_gate.GateWriter(self.gate)
        cmd = self.command(workers, sample, stop_after)
        self.announce(cmd, sum(cases_per_file.values()), workers, deferred)
        self.start(cmd, threads)

    def command(self, workers: list[str], sample: list[str] | None, stop_after: int) -> list[str]:
        """The upstream-tests command of their run: its plan only where asked, no progress lines,
        its summary in our folder."""
        sampled = (
            ["--sample", *(["--sample-modules", ",".join(sorted(sample))] if sample else [])]
            if sample is not None
            else []
        )
        # no progress lines: its output is held until finish()
        stopping = ["--stop-after", str(stop_after)] if stop_after else []
        planning = (
            ["--yes"] if self.plan else ["--no-plan"]
        )  # --yes: the plan says what it will compile, and asks nothing
        return [
            sys.executable,
            str(ROOT / "scripts/upstream_tests.py"),
            *planning,
            *self.tests,
            *workers,
            *sampled,
            *stopping,
            "--progress",
            "0",
            "--summary",
            str(self.summary),
        ]

    def announce(self, cmd: list[str], cases: int, workers: list[str], deferred: bool) -> None:
        """The line that says their run starts now: how many recorded cases, and the command, less its summary."""
        # as before: the command less where its summary goes
        said = [c for c in cmd if c not in ("--summary", str(self.summary))]
        which = "of the modules the edit may change" if deferred else ""
        then = (
            "; those of the modules it changed run, each case once the modules it loads are rebuilt"
            if deferred
            else " and run, each case once the modules it loads are rebuilt"
        )
        print(
            f"affected: FlashInfer's tests {which}{' ' if which else ''}({cases} recorded case(s)"
            f"{f', {workers[1]} processes a GPU' if workers else ''}) start now{then}: "
            f"{' '.join(said[:5])}{' ...' if len(said) > 5 else ''}",
            flush=True,
        )

    def start(self, cmd: list[str], threads: dict[str, str]) -> None:
        """Start their process, held at the gate, and the thread that holds its output (the folder goes if it fails)."""
        env = child_env(Settings(gate=self.gate, gate_owner=upstream_gate.process_identity(os.getpid())), **threads)
        try:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
            )
        except OSError:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        FlashInferTests.started.add(self)
        self.lines: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self.pump, daemon=True)
        self.reader.start()

    def pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def ended_failing(self) -> bool:
        """Their run has ended naming a failing or erroring case (its summary: at its first, under
        --stop-after). One that ended otherwise (no summary, or none named) is no pass either, but
        smoke's tests go on: they were not stopped by a failure of FlashInfer's."""
        if self.proc.poll() in (None, 0):
            return False
        try:  # a small file, read before each of smoke's tests once their run has ended
            return bool(upstream_summary.read(self.summary).failed_ids)
        except Failure:
            return False

    def begin(self, modules: list[str], selection: list[str] | None = None, by_module: bool = True) -> None:
        """The rebuild of `modules` has begun, each under its lock: the tests may start, all or those
        `selection` names, each case once the modules it loads are built (`by_module` False: the rebuild
        could not take every module's lock, and every case waits for the whole rebuild)."""
        self.gating.begin(modules, selection, by_module)

    def built(self, name: str) -> None:
        """Module `name` is rebuilt, and its verdict kept: the cases that load it may run."""
        self.gating.built(name)

    def open(self) -> None:
        """The whole rebuild is done: every case may run."""
        self.gating.open()
        self.opened = time.time()

    def finish(self) -> tuple[int, set[str]]:
        """Its output, then (status, what failed or errored), from the summary it wrote
        (fidev.upstream.summary). A summary it could not read is no pass: its two lines are said,
        and the status is 1 where upstream-tests' was 0."""
        while (line := self.lines.get()) is not None:
            sys.stdout.write(line)
        status = self.proc.wait()
        ended = time.time()
        sys.stdout.flush()
        try:
            done = upstream_summary.read(self.summary)
        except Failure as failure:
            self.unread, done = failure, None
            report(failure)
            status = status or 1
        # each id as upstream-tests' FAILED and ERROR lines name it (a file that did not finish: its path alone)
        failed = {what.split()[0] for what in done.failed_ids if what.split()} if done else set()
        if done and done.sample:
            self.say_sample(done.sample)
        if done:
            self.stopped_early = done.stopped_early
            self.exercised_files = {p.file for p in done.processes if p.counts.get("passed") or p.counts.get("failed")}
            # every case skipped (nothing failed, nothing errored): no verdict of theirs, but a gap the coverage
            # says (affected's modules_untested, coverage_gaps); nothing selected at all stays a failure
            self.all_skipped = (
                done.counts.get("skipped", 0) > 0
                and not any(done.counts.get(k) for k in ("passed", "failed", "error"))
                and not done.failed_ids
            )
        if self.opened is not None:
            last = done.last_case_end if done else None
            first = done.started + done.first_failure_s if done and done.first_failure_s is not None else None
            self.past = past_figures(
                ended - self.opened,
                None if last is None else last - self.opened,
                None if first is None else first - self.opened,
            )
            print(past_build(self.past), flush=True)
        return status, failed

    def say_sample(self, sample: dict) -> None:
        """What the sample of their cases covered (upstream-tests' summary), and the modules it had no case of."""
        covered = upstream_sample.describe("FlashInfer's tests", sample["selected"], sample["total"])
        print(f"affected: {covered} (a sample; --whole-family runs every case)", flush=True)
        self.missed = sample.get("missed", [])

    def stop(self) -> None:
        """Stop it, if it runs (a failed build, Ctrl-C): upstream-tests stops its test files'
        processes on SIGTERM. Then the gate's folder goes (no rebuild's thread writes it again)."""
        self.gating.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        FlashInferTests.started.discard(self)


def import_meanwhile() -> threading.Thread | None:
    """flashinfer imported in a thread while the build runs, since smoke's tests run in this
    process and would pay for it after. Only a head start: where it fails, the tests' own import
    fails again and says why, as smoke does (a host without torch: they skip)."""
    if "flashinfer" in sys.modules:
        return None

    def work() -> None:
        try:
            import flashinfer  # noqa: F401
        except BaseException:  # noqa: BLE001, S110 (said by the tests' own import)
            pass

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


class BuildFailed(Failure):
    """The build of the changed modules failed: the verdict `build failed`."""


@dataclass
class Outcome:
    """What the rebuild and the tests did: the rebuild's line and time, what failed, what broke
    without a failed test named, the commands that rerun the failures alone, and the PAST_BUILD figures."""

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


def sample_of(modules, recorded: dict[str, list[str]], sampled: bool) -> list[str] | None:
    """The modules a sample of FlashInfer's tests must exercise: those of `modules` a test is
    recorded for; None where every case runs (--whole-family)."""
    return [m for m in sorted(modules) if recorded.get(m)] if sampled else None


def their_run(
    early: FlashInferTests | None,
    theirs: list[str],
    recorded: dict[str, list[str]],
    changed,
    file_times: Path,
    sampled: bool = True,
    stop_after: int = STOP_AFTER,
) -> tuple:
    """FlashInfer's tests' run, and the tests its gate lets run: the one started before the
    regeneration where it has them all (the gate names these), else one that starts now, and
    imports and collects while the modules compile; a sample of their cases that exercises each
    changed module (unless `sampled` is off: --whole-family); with upstream-tests' plan first where
    the record names no case of a changed module in one of their files (unrecorded: a reached
    family's file, whose sampled cases the record may not name)."""
    if early and theirs and set(theirs) <= set(early.tests):
        return early, theirs
    if early:
        early.stop()
    return (
        FlashInferTests(
            theirs,
            cases_by_file(recorded, changed),
            file_times,
            sample=sample_of(changed, recorded, sampled),
            stop_after=stop_after,
            plan=sampled and bool(unrecorded(theirs, {m: recorded.get(m, []) for m in changed})),
        )
        if theirs
        else None
    ), None


def unrecorded(tests: list[str], recorded: dict[str, list[str]]) -> list[str]:
    """The test files among `tests` (files or node ids) of which the record names no case."""
    named = {case.split("::")[0] for cases in recorded.values() for case in cases}
    return sorted({t.split("::")[0] for t in tests} - named)


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
    first: frozenset[str],
    rebuilt: Callable[[str], None] = lambda name: None,
) -> module_builds.Rebuild:
    """The changed modules' rebuild, started (fidev.builds.module_builds.Rebuild: each under its lock,
    held from now); `then(rebuild)` once all are built; `first`: the modules smoke's tests load
    (smoke_loaded) and those of a case of each of FlashInfer's test functions (their_first), which build
    first; `rebuilt(name)` as each is built, before its lock is let go (affected keeps it `unfinished`
    with the inputs its rebuild recorded)."""
    return module_builds.Rebuild(to_build, then, say, first, rebuilt)


def smoke_loaded(names, tier: dict[str, str], ours: list[str]) -> frozenset[str]:
    """Which of the modules `names` the selected smoke and abi-smoke tests load (`tier`: smoke's module
    key by name, from build's stamps: no import)."""
    return frozenset(
        name
        for name in names
        if (key := tier.get(name)) in smoke_modules.BY_KEY
        and any(loads(t, smoke_modules.BY_KEY[key].tests) for t in ours)
    )


def their_first(recorded: dict[str, list[str]], rebuilt, theirs: list[str]) -> frozenset[str]:
    """Of the modules `rebuilt`, those of one recorded case of each of FlashInfer's selected test
    functions (`theirs`: files, functions or cases), chosen greedily so that they are few: each step takes
    the function whose cheapest case needs the fewest modules not chosen yet (a module not rebuilt costs
    nothing: it is built). They rebuild first, as smoke's tests' modules do (start_rebuild), so that each
    function has cases ready early behind the gate, whichever function catches the edit; the sample's
    cases (fidev.upstream.sample) come from the same record, and prefer cases whose modules are shared."""
    rebuilt = set(rebuilt)
    needs: dict[str, set[str]] = {}
    for module, cases in recorded.items():
        for case in cases:
            if any(case == t or case.startswith((t + "::", t + "[")) for t in theirs):
                needs.setdefault(case, set()).add(module)
    options: dict[str, set[frozenset[str]]] = {}
    for case, modules in needs.items():
        options.setdefault(case.split("[")[0], set()).add(frozenset(modules & rebuilt))
    chosen: set[str] = set()
    while options:
        _, function, modules = min((len(m - chosen), f, sorted(m)) for f, found in options.items() for m in found)
        chosen.update(modules)
        del options[function]
    return frozenset(chosen)


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


def said_rebuilt(rebuilt: Callable[[str], None], run: FlashInferTests | None) -> Callable[[str], None]:
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


def loads(test: str, tests: tuple[str, ...]) -> bool:
    """A selected test (a node id, or a function for all its cases) that is, or has a case among, `tests`."""
    return any(test == t or t.startswith(test + "[") or test.startswith(t + "[") for t in tests)


def smoke_specs(ours: list[str]) -> list:
    """(module, its JitSpec) of smoke's and abi-smoke's modules (fidev.builds.smoke_modules, the wide tier
    too) that the selected tests load, for this GPU's architectures. flashinfer is imported by now
    (import_meanwhile, joined)."""
    from flashinfer.jit import core

    sm90 = any(major == 9 for major, _ in core.current_compilation_context.TARGET_CUDA_ARCHS)
    return [(m, m.make()) for m in smoke_modules.select(True, sm90, True) if any(loads(t, m.tests) for t in ours)]


def loaded_modules(ours: list[str]) -> list[tuple[tuple[str, ...], str]]:
    """(tests, module name) of each smoke module the selected tests load (ready_first's); none where
    flashinfer cannot name them (SmokeBuilds says so): every test is ready then."""
    try:
        return [(module.tests, spec.name) for module, spec in smoke_specs(ours)]
    except (ImportError, AttributeError):
        return []


def unbuilt_smoke_specs(ours: list[str]) -> list:
    """The JitSpecs of smoke's and abi-smoke's modules (fidev.builds.smoke_modules, the wide tier
    too) that the selected tests load and that are neither built nor prebuilt, for this GPU's
    architectures. flashinfer is imported by now (import_meanwhile, joined)."""
    return [spec for _, spec in smoke_specs(ours) if not spec.is_aot and not spec.jit_library_path.exists()]


class SmokeBuilds:
    """smoke's modules the selected tests load and nothing built (the wide tier's, which `build`
    leaves out by default), built side by side beside the rebuild, each under its own lock, taken
    before the tests start (module_builds.Ahead, at the rebuild's priority: the edit's tests wait
    for them as for it), so that smoke's tests do not compile them one after another: a test that
    loads one waits for it alone. Where the modules cannot be named (no flashinfer here), each test
    builds its own, and fails where it fails."""

    def __init__(self, ours: list[str], say: Callable[[str], None] = lambda line: print(line, flush=True)):
        """`say`: where their lines go (screen(): smoke's session captures stdout meanwhile)."""
        self.ahead: module_builds.Ahead | None = None
        self.said = say
        try:
            specs = unbuilt_smoke_specs(ours)
        except (ImportError, AttributeError) as e:
            print(f"affected: smoke's modules not named up front ({type(e).__name__}: {e}): each test builds its own")
            return
        if specs:
            print(
                f"affected: {len(specs)} module(s) smoke's tests load and nothing built build side by side now: "
                f"{short([spec.name for spec in specs], 3)}",
                flush=True,
            )
            # ninja's environment now: smoke's session changes and restores this process's while they build
            self.ahead = module_builds.Ahead(specs, self.say, nice=0, env=dict(os.environ))
            for spec in specs:  # smoke's modules, whoever's tests load them next (`build` stamps its own)
                smoke_modules.mark_built(spec)

    def say(self, line: str) -> None:
        self.said(f"affected: smoke's modules: {line.strip()}")

    def pending(self) -> set[str]:
        return set() if self.ahead is None else self.ahead.pending()

    def stop(self) -> None:
        """Stopped where they still run (the tests are done, or the run ended)."""
        if self.ahead is not None:
            self.ahead.stop()


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
    beside = SmokeBuilds(ours, say)
    order = ready_first(loaded_modules(ours), lambda: building() | beside.pending(), stop)
    try:
        status, bad, unrun = run_ours(ours, wide, mode, stop, order)
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
            if status == NOTHING_PASSED
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


def first_failure_elsewhere(rebuilding, run: FlashInferTests | None) -> Callable[[], bool]:
    """What stops smoke's tests: a module's rebuild failed (its test would load the old library), or
    FlashInfer's tests ended failing."""
    return lambda: rebuilding.failure is not None or (run is not None and run.ended_failing())


def stop_theirs(run: FlashInferTests, outcome: Outcome) -> bool:
    """FlashInfer's tests stopped, unrun: smoke's first failure is the answer."""
    run.stop()
    outcome.stopped = True
    print("affected: FlashInfer's tests stopped: smoke's tests failed first (--keep-going runs every test)", flush=True)
    return True


def build_and_test(
    to_build: list,
    early: FlashInferTests | None,
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
) -> Outcome:
    """Rebuild the changed modules while FlashInfer's tests import and collect, and run smoke's tests
    here meanwhile, each once the modules it loads are rebuilt (the rebuild holds each module's lock
    until it is built: start_rebuild, ready_first); FlashInfer's through their gate, each case once the
    modules the record names for it are rebuilt (`rebuilt(name)` keeps each first), the others once every
    module is; the modules smoke's tests load (`first`) build first. `built()` is called then, before
    the gate opens whole (affected keeps its `unfinished` verdicts), or once a rebuild the first failure
    stopped has ended. Unless `keep_going`, the first failing test ends the run: smoke's stops the
    rebuild and FlashInfer's tests, and FlashInfer's first failing case ends theirs, smoke's and the
    rebuild. Each is stopped however the run ends."""
    run, selection = their_run(early, theirs, recorded, changed, file_times, sampled, 0 if keep_going else STOP_AFTER)
    importing, their_status, their_failed, stopped_theirs, rebuilding, say = None, 0, set(), False, None, None
    outcome = Outcome("", 0.0, sorted(m.name for m in to_build))
    try:
        importing, say = import_meanwhile() if ours else None, screen()
        then, theirs_first = when_rebuilt(outcome, built, run, say), their_first(recorded, outcome.rebuilt, theirs)
        rebuilding = start_rebuild(to_build, then, say, first | theirs_first, said_rebuilt(rebuilt, run))
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
        if rebuilding:
            rebuilding.stop()
        if run:
            run.stop()
        if say is not None and hasattr(say, "close"):
            say.close()
        if importing:  # not left importing torch while the interpreter exits (a failed build)
            importing.join(timeout=60)
    if theirs and not stopped_theirs:
        their_outcome(run, their_status, their_failed, changed, outcome)
    return outcome


def their_outcome(run: FlashInferTests, status: int, failed: set[str], changed, outcome: Outcome) -> None:
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
