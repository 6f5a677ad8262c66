"""FlashInfer's own tests of the changed modules, through upstream-tests in a process of its own,
started before the build and held at a gate (fidev.upstream.gate) that says which modules are built,
each case running once those it loads are; its result read from the summary it writes
(fidev.upstream.summary), not from its output."""

from __future__ import annotations

import math
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from fidev.core import workspace
from fidev.core.failure import Failure, report
from fidev.core.manifest import ROOT
from fidev.upstream import gate as upstream_gate
from fidev.upstream import sample as upstream_sample
from fidev.upstream import summary as upstream_summary
from fidev.upstream.settings import Settings, child_env

# Past CASES_PER_PROCESS cases a process, another pytest process on the GPU pays for its start
# (torch's import and the file's collection, and its CUDA context: all before the gate), at the
# rate FlashInfer's small cases run; fidev.upstream.runs.GATED_PER_GPU bounds them. The rates and the silu round's
# times with 4 and 8 processes that set them are in docs/measurements.md, rows "upstream baseline of norm"
# (2705 cases), "630 silu cases after the gate, 8 processes" and "630 silu cases, 4 against 8 processes".
CASES_PER_PROCESS = 80
# The first failing test ends the run (affected --keep-going runs every one): FlashInfer's tests stop at
# their first failing case (upstream-tests --stop-after), smoke's at their first failure (pytest -x), and
# either stops the other; the answer is "failed" by then, and the rerun commands name what failed
STOP_AFTER = 1
THREADS = "OMP_NUM_THREADS"  # torch's CPU thread pool in each process; the user's own value is kept
PAST_BUILD = re.compile(
    r"affected: FlashInfer's tests ended (\d+\.\d) s after the build \(their last case (\d+\.\d) s after it\)"
)


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
    per CASES_PER_PROCESS cases of the largest part, up to GATED_PER_GPU and half the cores shared
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
    n = max(1, min(upstream_runs.GATED_PER_GPU, cpus // (2 * at_once), math.ceil(largest / CASES_PER_PROCESS)))
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
        first_files: Sequence[str] = (),
    ):
        """`sample`: the modules the sample of their cases must exercise (upstream-tests --sample
        --sample-modules, fidev.upstream.sample); None: every case of the tests (--whole-family).
        `stop_after`: the failing cases that end their run (0: every case runs, --keep-going).
        `plan`: upstream-tests' plan first (its dry run, while the modules compile), so that the
        record names the modules of the sample's cases and their warmups build only those
        (fidev.upstream.plugin); else --no-plan. `first_files`: the test files whose cases' modules its plan
        builds ahead first (upstream-tests --first-files: those of the family nearest the edit)."""
        self.tests, self.plan, self.first_files = tests, plan, list(first_files)
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
        # --yes: the plan says what it will compile, and asks nothing
        planning = ["--yes"] if self.plan else ["--no-plan"]
        if self.plan and self.first_files:
            planning += ["--first-files", ",".join(self.first_files)]
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
    first_files: Sequence[str] = (),
) -> tuple:
    """FlashInfer's tests' run, and the tests its gate lets run: the one started before the
    regeneration where it has them all (the gate names these), else one that starts now, and
    imports and collects while the modules compile; a sample of their cases that exercises each
    changed module (unless `sampled` is off: --whole-family); with upstream-tests' plan first where
    the record names no case of a changed module in one of their files (unrecorded: a reached
    family's file, whose sampled cases the record may not name), which builds the modules of the cases of
    `first_files` ahead first."""
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
            first_files=first_files,
        )
        if theirs
        else None
    ), None


def unrecorded(tests: list[str], recorded: dict[str, list[str]]) -> list[str]:
    """The test files among `tests` (files or node ids) of which the record names no case."""
    named = {case.split("::")[0] for cases in recorded.values() for case in cases}
    return sorted({t.split("::")[0] for t in tests} - named)


def their_first(recorded: dict[str, list[str]], rebuilt, theirs: list[str]) -> tuple[str, ...]:
    """Of the modules `rebuilt`, those of one recorded case of each of FlashInfer's selected test
    functions (`theirs`: files, functions or cases), chosen greedily so that they are few: each step takes
    the function whose cheapest case needs the fewest modules not chosen yet (a module not rebuilt costs
    nothing: it is built). They rebuild first, as smoke's tests' modules do (tests.start_rebuild), so that each
    function has cases ready early behind the gate, whichever function catches the edit; the sample's
    cases (fidev.upstream.sample) come from the same record, and prefer cases whose modules are shared.
    In the order chosen: the rebuild starts them in it."""
    rebuilt = set(rebuilt)
    needs: dict[str, set[str]] = {}
    for module, cases in recorded.items():
        for case in cases:
            if any(case == t or case.startswith((t + "::", t + "[")) for t in theirs):
                needs.setdefault(case, set()).add(module)
    options: dict[str, set[frozenset[str]]] = {}
    for case, modules in needs.items():
        options.setdefault(case.split("[")[0], set()).add(frozenset(modules & rebuilt))
    chosen: dict[str, None] = {}  # in the order chosen
    while options:
        _, function, modules = min(
            (len(m - chosen.keys()), f, sorted(m)) for f, found in options.items() for m in found
        )
        chosen.update(dict.fromkeys(modules))
        del options[function]
    return tuple(chosen)
