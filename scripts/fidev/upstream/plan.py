"""upstream-tests' plan: before a run, which JIT modules the selection needs and how many of their
objects must compile, from a dry run of the selection under FLASHINFER_DISABLE_JIT=1 (nothing is
built or loaded: fidev.upstream.plugin hands each test a stand-in for each module it loads and
records what was asked for), and a rough estimate of the time, held against a budget; then the
modules the tests will load and nothing built, built ahead of them (build_ahead). The modules a
test asks for after a stand-in's answers (foreseen) count in the plan and are built ahead, never
put in the record of which test needs which module."""

from __future__ import annotations

import ast
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fidev.builds import module_builds
from fidev.core import workspace
from fidev.core.failure import Failure
from fidev.core.files import MayLack, fits, load_json, parse_json
from fidev.records import build_records, ninja_inputs
from fidev.upstream import gate as upstream_gate
from fidev.upstream import plugin as upstream_plugin
from fidev.upstream import runs as upstream_runs
from fidev.upstream.settings import Settings, child_env
from fidev.upstream.suite import pytest_options, scripts_path

# A rough cost model: one object of an attention or norm module takes SECONDS_PER_OBJECT to
# compile; a module's objects build side by side, modules one after another as the tests first
# load them. The compile times it comes from are the rebuilds of docs/measurements.md's "affected: ..." rows;
# how it held, its rows "plan dry run (norm)" and "plan dry run (activation)".
SECONDS_PER_OBJECT = 25
# The plan must cost little next to the run it plans; past this it is dropped.
PLAN_LIMIT_S = 60
DRY_RUN_WORKERS = 16


# An entry of a JIT report (read_jit_report), and what its spec_info holds of a module's sources
ENTRY = {
    "test_name": str,
    "module_name": str,
    "spec_info": MayLack(str | None),
    "warmup": MayLack(bool),
    upstream_plugin.FORESEEN: MayLack(bool),
}
SPEC_INFO = {"sources": MayLack(list[str])}


def read_jit_report(path: Path) -> list[dict]:
    """The entries of a JIT report: one JSON object per line, as FlashInfer's tests/conftest.py
    appends them in `pytest_terminal_summary` at v0.6.3: test_name, module_name, and spec_info, the
    str() of the dict `pytest_runtest_call` makes of a MissingJITCacheError's spec, or "None" when
    the error carried no spec. A line that is no such object (torn, or of another shape: ENTRY) is left out."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in filter(str.strip, lines):
        try:
            entry = parse_json(line)
        except ValueError:
            continue
        if fits(entry, ENTRY):
            found.append(entry)
    return found


def module_sources(entries: list[dict]) -> dict[str, list[str]]:
    """{module: its sources} from JIT-report entries; none where the spec_info does not name them."""
    needed = {}
    for entry in entries:
        try:
            info = ast.literal_eval(entry["spec_info"]) if entry.get("spec_info") not in (None, "None") else {}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # no str() of a dict of literals
            info = {}
        needed[entry["module_name"]] = info.get("sources", []) if fits(info, SPEC_INFO) else []
    return needed


def objects_to_compile(build_dir: Path, sources: list[str]) -> int:
    """How many objects of a module a build would compile: every source when the module was never
    built or ninja cannot tell, else fidev.records.ninja_inputs.dry_run's count (0 when it is current)."""
    ninja_file, library = workspace.module_files(build_dir)
    pending = ninja_inputs.dry_run(build_dir, ninja_file) if library.exists() and ninja_file.exists() else None
    return (len(sources) or 1) if pending is None else len(pending[0])


def dry_run_workers(nodes: list[str]) -> list[str]:
    """pytest-xdist's options for the dry run, where it is installed: the dry run costs each test's
    body less FlashInfer's kernels (its inputs, its references), which spreads over processes, a
    worker per core (on one GPU: of FlashInfer's kernels only the prebuilt modules' run, beside the
    tests' own torch work).
    Each worker keeps torch to one CPU thread (OMP_NUM_THREADS in `plan`), not a core count per
    worker: drawing CPU inputs is most of a dry run."""
    import importlib.util

    workers = min(DRY_RUN_WORKERS, os.cpu_count() or 1)
    if all("[" in node for node in nodes):  # single cases (affected asks for a few): a worker each at most
        workers = min(workers, len(nodes))
    if importlib.util.find_spec("xdist") is None or workers < 2:
        return []
    return ["-n", str(workers)]


def dry_run(
    nodes: list[str], pytest_args: list[str], tests: Path, scratch: str, sample: Path | None = None
) -> tuple[subprocess.Popen, str, float] | None:
    """The dry run's pytest, its records in `scratch`, of the sample `sample` specifies (None: every
    case): (the process, its output, its time); None when it took longer than PLAN_LIMIT_S (its processes killed)."""
    env = child_env(
        Settings(dry_dir=Path(scratch), sample=sample),
        FLASHINFER_DISABLE_JIT="1",
        FLASHINFER_JIT_CACHE_REPORT_FILE=str(
            Path(scratch) / "flashinfer-report.jsonl"
        ),  # FlashInfer's own, where it writes one
        PYTHONPATH=scripts_path(),
    )
    workers = dry_run_workers(nodes)
    if workers:
        env["OMP_NUM_THREADS"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *nodes,
        "-q",
        "-p",
        "no:cacheprovider",
        *upstream_runs.UNUSED_PLUGINS,
        "-p",
        "fidev.upstream.plugin",
        *workers,
        *pytest_options(tests),
        *pytest_args,
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=PLAN_LIMIT_S)
    except subprocess.TimeoutExpired:
        kill_group(proc)  # the xdist workers too
        proc.communicate()
        print(
            f"upstream-tests: the plan's dry run took over {PLAN_LIMIT_S} s: going ahead without it; each "
            "module's compile shows as it runs"
        )
        return None
    except BaseException:  # Ctrl-C, SIGTERM: its own session would outlive us
        kill_group(proc)
        raise
    return proc, out, time.perf_counter() - started


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the dry run's process group (its xdist workers too); none left is no error: the dry run
    may have ended, and been reaped, just as the signal or the time limit came."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass(frozen=True)
class Planned:
    """What the plan found: {module the selection needs: objects to compile}, the dry run's time,
    its JIT dir, and the modules its tests ask to load that were never built, with their sources
    (`ahead`: what the run's tests will wait for, to build from now: build_ahead), in the order they start,
    and the test files whose cases' modules start first (`first`, where they or their warmups load one)."""

    needed: dict[str, int]
    seconds: float
    jit_dir: Path
    ahead: dict[str, list[str]] = field(default_factory=dict)
    first: list[str] = field(default_factory=list)  # the test files whose cases' modules of `ahead` start first


def plan(
    nodes: list[str],
    pytest_args: list[str],
    tests: Path,
    sample: Path | None = None,
    first: frozenset[str] = frozenset(),
) -> Planned | None:
    """What the selection needs (Planned); None when the dry run took longer than PLAN_LIMIT_S (or
    did not finish), so that the run goes ahead without. The modules to build ahead are in the order they
    are to start (ahead_order: those of the test files `first`, tests/..., first).

    The dry run is the selection under FLASHINFER_DISABLE_JIT=1: nothing is built or loaded, and
    fidev.upstream.plugin records what was asked for; under --sample, of the sample (`sample`: its
    spec). The record of which test needs which module (`affected`'s map) takes what each test asked
    for first, never what it asked for after a stand-in's answers (fidev.upstream.plugin.FORESEEN)."""
    with tempfile.TemporaryDirectory() as scratch:
        ran = dry_run(nodes, pytest_args, tests, scratch, sample)
        if ran is None:
            return None
        proc, out, seconds = ran
        jit_dir_file = Path(scratch) / upstream_plugin.JIT_DIR_FILE
        if not jit_dir_file.is_file():
            said = out.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            print(f"upstream-tests: the plan's dry run did not finish ({said[0][:200]}): going ahead without it")
            return None
        reports = [read_jit_report(report) for report in sorted(Path(scratch).glob("*.jsonl"))]
        entries = [entry for report in reports for entry in report]
        order = collected_order(Path(scratch))
        needed = module_sources(entries)
        jit_dir = Path(jit_dir_file.read_text())
        # which test needs which module, for `affected`
        build_records.add_module_tests(jit_dir, [e for e in entries if not e.get(upstream_plugin.FORESEEN)])
    loaded = {e["module_name"] for e in entries if not e.get("warmup")}
    ahead = {
        name: needed[name]
        for name in ahead_order(reports, order, {n: s for n, s in needed.items() if n in loaded}, first)
        if not workspace.module_files(jit_dir / name)[1].exists()
        and workspace.module_files(jit_dir / name)[0].is_file()
    }
    return Planned(
        {name: objects_to_compile(jit_dir / name, sources) for name, sources in needed.items()},
        seconds,
        jit_dir,
        ahead,
        sorted({file_of(e) for e in entries if file_of(e) in first and e["module_name"] in ahead}),
    )


def file_of(entry: dict) -> str:
    """The test file of a JIT report's entry (tests/..., from the tree)."""
    return entry["test_name"].split("::")[0]


def collected_order(scratch: Path) -> list[str]:
    """The dry run's cases in pytest's order, as one of its processes collected them (each collects them
    all: fidev.upstream.plugin.COLLECTED_PREFIX); none where no process wrote a readable list."""
    for path in sorted(scratch.glob(f"{upstream_plugin.COLLECTED_PREFIX}*.json")):
        try:
            order = load_json(path)
        except (OSError, ValueError):
            continue
        if fits(order, list[str]):
            return order
    return []


def first_cases_first(reports: list[list[dict]], order: list[str] = ()) -> dict[str, int]:
    """{module: the earliest place, within its test file, of a case that loads it}: the builds ahead start
    in that order (fidev.builds.module_builds.Admission), so that each file's process, which runs its cases
    in pytest's order, has its first cases' modules early, where all at once every module ended near the
    end of all. A case's place is in pytest's `order` (the dry run's collection); where that does not name
    it, in the order its JIT report (one per dry-run process) lists it."""
    turn: dict[str, int] = {}
    ranks: dict[str, dict[str, int]] = {}
    for nodeid in order:
        in_file = ranks.setdefault(nodeid.split("::")[0], {})
        in_file.setdefault(nodeid, len(in_file))
    for report in reports:
        listed: dict[str, dict[str, int]] = {}
        for entry in report:
            if entry.get("warmup"):
                continue
            name, file = entry["test_name"], file_of(entry)
            place = ranks.get(file, {}).get(name)
            if place is None:
                in_report = listed.setdefault(file, {})
                place = in_report.setdefault(name, len(in_report))
            turn[entry["module_name"]] = min(place, turn.get(entry["module_name"], place))
    return turn


def ahead_order(
    reports: list[list[dict]], order: list[str], needed: dict[str, list[str]], first: frozenset[str] = frozenset()
) -> list[str]:
    """The modules of `needed` ({module a case of the reports loads: its sources}) in the order their builds
    ahead start: first those a case of a test file of `first` loads (by
    first_cases_first among their cases); then those the warmup of such a file asks for (a case the dry run's
    stand-ins stopped before it asked for them may load them: FlashInfer's shared-prefix decode case, after
    its batch modules, loads single prefill's for the shared part,
    `BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward` in flashinfer/cascade.py at v0.6.3), where a case
    of another file loads them (only a module a case of the dry run asked for has its ninja file written:
    fidev.upstream.plugin.ready_to_build); then the rest by first_cases_first; within each, the fewer
    sources, then the name."""
    near = first_cases_first([[e for e in r if file_of(e) in first] for r in reports], order)
    warm = {e["module_name"] for r in reports for e in r if e.get("warmup") and file_of(e) in first}
    turn = first_cases_first(reports, order)

    def key(name: str) -> tuple:
        rank = (0, near[name]) if name in near else (1, 0) if name in warm else (2, turn[name])
        return rank, len(needed[name]), name

    return sorted(needed, key=key)


def build_ahead(planned: Planned, gate: Path | None = None) -> module_builds.Ahead | None:
    """The modules the dry run's tests asked to load and that were never built (Planned.ahead), built
    side by side, starting in Planned.ahead's order (ahead_order), while the run's processes
    start, each under FlashInfer's lock of it (fidev.builds.module_builds.Ahead): a test that loads one
    waits for that one, not for the others;
    said as they build. Behind affected's `gate`, they start as it opens: affected's rebuild, which
    its first failure waits on, is not slowed. Each is marked built ahead (mark=True): one that no case
    then loads and no record names is removed at the run's end (module_builds.drop_unrecorded_ahead),
    or by the next `affected`, so that it never stands built with no test to run. None where there is none."""
    if not planned.ahead:
        return None
    when = "from now" if gate is None else "once affected's rebuild is done"
    first = f", those of {', '.join(planned.first)}'s cases first" if planned.first else ""
    print(
        f"upstream-tests: building the {len(planned.ahead)} module(s) its tests will load and nothing built, "
        f"side by side, {when}{first}: " + ", ".join(planned.ahead),
        flush=True,
    )
    folders = [module_builds.Folder(name, planned.jit_dir / name, tuple(s)) for name, s in planned.ahead.items()]
    return module_builds.Ahead(
        folders,
        lambda line: print(f"upstream-tests: ahead: {line.strip()}", flush=True),
        None if gate is None else lambda: upstream_gate.opened(gate),
        mark=True,
    )


def estimate_s(needed: dict[str, int]) -> float:
    cores = os.cpu_count() or 1
    return sum(math.ceil(objects / cores) * SECONDS_PER_OBJECT for objects in needed.values())


def hold_budget(planned: Planned, budget_s: float, yes: bool) -> None:
    """The plan said: the modules to compile and the time they may take; past `budget_s`, unless
    `yes`, a Failure."""
    needed, seconds = planned.needed, planned.seconds
    todo = {name: objects for name, objects in needed.items() if objects}
    guess = estimate_s(todo)
    print(
        f"upstream-tests: the selection needs {len(needed)} module(s); {len(todo)} to compile, "
        f"{sum(todo.values())} object(s), about {guess / 60:.0f} min on {os.cpu_count()} cores (plan "
        f"{seconds:.0f} s)"
    )
    for name, objects in sorted(todo.items()):
        print(f"  {name}  ({objects} object{'s' * (objects != 1)})")
    if guess > budget_s and not yes:
        raise Failure(
            f"compiling them would take about {guess / 60:.0f} min, past the {budget_s / 60:.0f} min budget",
            "narrow the selection (-k, a node id), or start it anyway with --yes (or a larger --budget MINUTES)",
        )
