"""Run FlashInfer's own test suites (the source tree's tests/) against the editable install.

  upstream_tests.py FAMILY|PATH [FAMILY|PATH ...] [PYTEST_ARGS ...]
  upstream_tests.py --list

A FAMILY is a kernel family (--list names them and their files); a PATH is a file or node id
under the tree's tests/. From the first argument that starts with '-', the rest go to pytest
(e.g. `norm -k gemma -x`). The kernel source mode (FLASHINFER_DEV_KERNEL_SOURCE) is applied before
anything imports flashinfer, and printed: in the default mode, `prebuilt`, the modules
flashinfer-jit-cache ships load, and an edit to csrc/ or include/ is not what the tests run.

Before running it plans: a dry run with FLASHINFER_DISABLE_JIT=1 (FlashInfer then refuses to
build, and fidev.upstream.plugin records which module each test asked for; spread over a
pytest-xdist process per core, up to 16, where xdist is installed) names the modules the selection
needs, how many objects of them must compile, and estimates the time. Past --budget minutes
(default 10) it stops, unless given --yes. A dry run that takes over 60 s is dropped, and the run
shows each module's compile as it starts and ends instead.

The run is FlashInfer CI's (fidev.upstream.runs): a pytest process per test file, the files over
the host's GPUs (`--gpus N`: the first N) one worker per GPU, longest first, each file limited to
--file-timeout seconds (default 7200); a crash or a timeout is its file's alone. `--per-gpu N`
runs each file in N parts a GPU, N processes on each GPU at once (`affected` asks for it: its
tests' processes all start at once, where pytest-xdist's start after its controller's imports). JUnit XML and
logs go to a run folder beside FlashInfer's JIT dirs. Skips are counted by reason; out-of-memory
skips and missing-JIT-module skips (FlashInfer's conftest turns both failures into skips) fail the
run, as errors (collection, setup, teardown, a file that did not finish) do.

  upstream_tests.py FAMILY ... --baseline    record each test's outcome on this GPU at this tree
  upstream_tests.py FAMILY ...               then: only what changed since (exit 1 on new failures)

Every run that ran test files writes its result to summary.json in its run folder
(fidev.upstream.summary), and with --summary FILE to FILE as well: counts, failing and erroring
ids, each process's file, GPU and time, and when the last case ended. Other tools read that file,
not this output.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from fidev.core import workspace
from fidev.core.failure import USAGE, Failure, report, run_main
from fidev.core.manifest import ROOT, pins
from fidev.jit import kernel_source, module_choice
from fidev.tree import families as upstream_suites
from fidev.tree import source_tree
from fidev.upstream import plugin as upstream_plugin
from fidev.upstream import runs as upstream_runs
from fidev.upstream import summary as upstream_summary
from fidev.upstream.plan import DRY_RUN_WORKERS, PLAN_LIMIT_S, dry_run_workers, plan  # noqa: F401 (DRY_RUN_WORKERS, dry_run_workers: read here by tests/test_upstream_tests.py)
from fidev.upstream.suite import pytest_options, resolve, tests_dir

OURS = {"--list": 0, "--summary": 1, "--yes": 0, "--budget": 1, "--no-plan": 0, "--baseline": 0, "--gpus": 1, "--file-timeout": 1, "--per-gpu": 1, "-h": 0,
        "--help": 0}
# A rough cost model, from the H100 host (16 cores): one object of an attention or norm module
# takes 10 to 30 s to compile; a module's objects build side by side, modules one after another
# as the tests first load them. The figures in docs/flashinfer-dev.md say how it held.
SECONDS_PER_OBJECT = 25
SHOWN = 200  # failing tests named after a run; the run folder's FAILING_LIST has all
FAILING_LIST = "failing.txt"
COMPARED_SHOWN, COMPARED_LIST = 50, "compared.txt"  # a compare run's ids of each kind named; the run folder's file has all


def split_argv(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """(our options, the selection, pytest's arguments)."""
    ours, selection, rest, i = {}, [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in OURS:
            if OURS[arg] and i + 1 >= len(argv):
                raise Failure(f"{arg} needs a value", "see `upstream_tests.py --help`")
            ours[arg] = argv[i + 1] if OURS[arg] else True
            i += 1 + OURS[arg]
        elif arg.startswith("-") or rest:
            rest.append(arg)
            i += 1
        else:
            selection.append(arg)
            i += 1
    return ours, selection, rest


def minutes(text: str) -> float:
    """--budget: minutes of compiling the plan may cost, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not 0 <= value < math.inf:
        raise Failure(f"--budget {text!r} is not a number of minutes", "give it in minutes, 0 or more: --budget 30")
    return value


def whole(name: str, text: str) -> int:
    """--gpus, --file-timeout, --per-gpu: a whole number, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise Failure(f"{name} {text!r} is not a whole number of 1 or more", f"give it as one: {name} 2")
    return int(text)


def estimate_s(needed: dict[str, int]) -> float:
    cores = os.cpu_count() or 1
    return sum(math.ceil(objects / cores) * SECONDS_PER_OBJECT for objects in needed.values())


def suite_map(tests: Path) -> dict | None:
    """The suite's test cases, counted once while its files stay as they are: `pytest --collect-only`
    of the whole tests/ (36 s on the H100 host for v0.6.3's 267,824), kept beside the JIT dirs. None
    when it cannot collect here (no pytest, no FlashInfer)."""
    p = pins()
    # the suite as it is: each test file and pytest.ini, by size and mtime (an edited test recounts)
    files = sorted(f for f in [*tests.rglob("*.py"), tests.parent / "pytest.ini"] if f.is_file())
    commit = hashlib.sha256(json.dumps([(str(f.relative_to(tests.parent)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]).encode()).hexdigest()
    cache = workspace.read(p.flashinfer).suite_map
    try:
        known = json.loads(cache.read_text())
        if isinstance(known, dict) and known.get("suite") == commit:
            return known
    except (OSError, ValueError):
        pass
    print(f"upstream-tests: counting the suite's test cases (pytest --collect-only of {source_tree.shown(tests)}, once until it changes) ...", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    module_choice.apply()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", str(tests), "--collect-only", "-q", "--continue-on-collection-errors",
                               "-p", "no:cacheprovider", *pytest_options(tests)], capture_output=True, text=True, timeout=1200, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    nodes = [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    errors = re.search(r"(\d+) errors?", done.stdout.splitlines()[-1] if done.stdout.strip() else "")
    if not nodes:
        return None
    counts = {f.name: sum(1 for n in nodes if any(n == f"tests/{x}" or n.startswith(f"tests/{x}::") or n.startswith(f"tests/{x}[")
                                                     for x in f.nodes)) for f in upstream_suites.FAMILIES}
    known = {"suite": commit, "total": len(nodes), "files": len({n.split("::")[0] for n in nodes}), "not_collected": int(errors.group(1)) if errors else 0,
             "families": counts}
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(known))
    os.replace(tmp, cache)
    return known


def list_families() -> int:
    """The families, each with its test cases where the suite can be counted here, and what they leave out."""
    try:
        counted = suite_map(tests_dir())
    except Failure as failure:  # no runnable suite: the families alone, and why no counts
        counted = None
        print(f"upstream-tests: no counts: {failure.problem}")
    for family in upstream_suites.FAMILIES:
        cases = f"{counted['families'][family.name]:>7} cases" if counted else ""
        print(f"{family.name:15} {cases:13} {family.what}")
        for node in family.nodes:
            print(f"{'':15}   tests/{node}")
    if counted:
        covered = sum(counted["families"].values())
        print(f"{'left out':15} {counted['total'] - covered:>7} cases of {counted['total']} in {counted['files']} files "
              f"({counted['not_collected']} more files did not collect here): mostly Blackwell-only kernels (trtllm-gen, xqa, fp4 GEMM); "
              "name their files as paths")
    return 0


def main() -> int:
    try:  # usage errors: checked before anything runs, and status 2, as argparse's are
        ours, selection, pytest_args = split_argv(sys.argv[1:])
        budget_s = minutes(ours.get("--budget", "10")) * 60
        for name in ("--gpus", "--file-timeout", "--per-gpu"):
            if name in ours:
                ours[name] = whole(name, ours[name])
    except Failure as failure:
        report(failure)
        return USAGE
    if "-h" in ours or "--help" in ours:
        print(__doc__)
        return 0
    if "--list" in ours:
        return list_families()
    tests = tests_dir()
    if not selection:
        raise Failure("no family or path was named (the whole suite takes hours to compile)",
                      "name one: `upstream-tests norm`, or a path under tests/; `upstream-tests --list` names the families")
    nodes = resolve(selection, tests)
    mode = module_choice.apply()  # in `auto`, the tree's edits read now: two lines where nothing tells them
    edits = f"; edited vs the release: {module_choice.edited_summary()}" if mode == kernel_source.AUTO else ""
    print(f"upstream-tests: kernel source {mode}: {kernel_source.SAID[mode]}{edits}")
    for sig in (signal.SIGTERM, signal.SIGHUP):  # stop as Ctrl-C does: the dry run's and the files' processes are killed
        signal.signal(sig, signal.default_int_handler)
    try:
        planned = None if "--no-plan" in ours else plan(nodes, pytest_args, tests, PLAN_LIMIT_S)
    except KeyboardInterrupt:
        raise Failure("interrupted during the plan's dry run (its processes were stopped)", "run it again, or skip the plan: --no-plan",
                      exit_status=130) from None
    if planned is not None:
        needed, seconds = planned
        todo = {name: objects for name, objects in needed.items() if objects}
        guess = estimate_s(todo)
        print(f"upstream-tests: the selection needs {len(needed)} module(s); {len(todo)} to compile, {sum(todo.values())} object(s), "
              f"about {guess / 60:.0f} min on {os.cpu_count()} cores (plan {seconds:.0f} s)")
        for name, objects in sorted(todo.items()):
            print(f"  {name}  ({objects} object{'s' * (objects != 1)})")
        if guess > budget_s and "--yes" not in ours:
            raise Failure(f"compiling them would take about {guess / 60:.0f} min, past the {budget_s / 60:.0f} min budget",
                          "narrow the selection (-k, a node id), or start it anyway with --yes (or a larger --budget MINUTES)")
    return run(selection, nodes, pytest_args, tests, ours, mode)


def run(selection: list[str], nodes: list[str], pytest_args: list[str], tests: Path, ours: dict, mode: str) -> int:
    """The selection a process per file over the host's GPUs (fidev.upstream.runs), then its counts,
    and with a baseline of the same selection, what changed since; its summary written at its end,
    whatever the end."""
    record: dict = {}
    status = 1  # where it raises: what its Failure says, else not a pass
    try:
        status = run_selection(selection, nodes, pytest_args, tests, ours, mode, record)
        return status
    except Failure as failure:
        status = failure.exit_status
        raise
    finally:
        if "results" in record:  # the files ran: their result is kept, whatever came after
            write_summary(record, status, ours.get("--summary"))


def write_summary(record: dict, status: int, extra: str | None) -> None:
    """summary.json in the run folder, and at --summary FILE where asked (fidev.upstream.summary)."""
    results = record["results"]
    failed = upstream_runs.failing(results)
    processes = [upstream_summary.Process(r.file, list(r.part), r.gpu, round(r.seconds, 3), r.ended, upstream_runs.counts([r])) for r in results]
    done = upstream_summary.Summary(
        selection=record["key"], kernel_source=record["mode"], run_dir=str(record["run_dir"]), gpus=record["gpus"], gpu_name=record["gpu"],
        started=record["started"], ended=time.time(), status=status, counts=upstream_runs.counts(results),
        skips=upstream_runs.skip_summary(results), failing=[what for word, what in failed if word == "FAILED"],
        erroring=[what for word, what in failed if word == "ERROR"], processes=processes,
        last_case_end=upstream_runs.last_case_end(record["run_dir"]), compared=record.get("compared"))
    upstream_summary.write(done, record["run_dir"] / upstream_summary.NAME, *([Path(extra)] if extra else []))


def run_selection(selection: list[str], nodes: list[str], pytest_args: list[str], tests: Path, ours: dict, mode: str, record: dict) -> int:
    groups = upstream_runs.by_file(nodes)
    host = upstream_runs.host_gpus()
    wanted = ours.get("--gpus")
    if wanted and wanted > max(len(host), 1):
        raise Failure(f"--gpus {wanted}: this host shows {len(host)} GPU(s) (CUDA_VISIBLE_DEVICES included)",
                      f"ask for at most {len(host)}, or leave --gpus out to use them all", exit_status=USAGE)
    gpus = host[:wanted] if wanted else host
    limit_s = ours.get("--file-timeout", upstream_runs.FILE_LIMIT_S)
    p = pins()
    cache = workspace.read(p.flashinfer).version_dir
    run_dir = upstream_runs.run_folder(cache / upstream_runs.RUNS)
    key = [*selection, *pytest_args]
    baseline_file = upstream_runs.baseline_path(cache, key)
    baseline = None if "--baseline" in ours else upstream_runs.load_baseline(baseline_file)
    gpu = upstream_runs.gpu_name(gpus)
    times_file = upstream_runs.times_file(cache)
    times = upstream_runs.load_times(times_file)
    per_gpu = ours.get("--per-gpu", 1)
    in_parts = sum(k > 1 for k in upstream_runs.split(groups, len(gpus), tests.parent, times).values())
    in_parts = f" ({in_parts} long enough by their last run to go in parts over the GPUs, a process per part)" if in_parts else ""
    each = f"in {per_gpu} parts a GPU, {per_gpu} processes on each GPU at once" if per_gpu > 1 else f"a pytest process each{in_parts}"
    print(f"upstream-tests: {len(groups)} file(s), {each}, on {len(gpus) or 'no'} GPU(s) ({gpu}), "
          f"{limit_s:.0f} s per process at most; JUnit XML and logs in {run_dir}")
    started = time.perf_counter()
    record.update(key=key, mode=mode, run_dir=run_dir, gpus=gpus, gpu=gpu, started=time.time())
    try:
        results = upstream_runs.run_files(groups, gpus, run_dir, tests.parent, [*pytest_options(tests), *pytest_args], limit_s, times, per_gpu)
    except KeyboardInterrupt:
        raise Failure(f"interrupted: the running test files were stopped; what finished is in {run_dir}",
                      "run it again (a narrower selection, or --file-timeout SECONDS, to make it shorter)", exit_status=130) from None
    record["results"] = results
    refused(results, pytest_args)
    # behind affected's gate a file's time includes the wait for the build; with parts sharing a GPU, their sum is not its time
    if not os.environ.get(upstream_plugin.GATE) and per_gpu == 1:
        upstream_runs.save_times(times_file, results)
    c, skips = upstream_runs.counts(results), upstream_runs.skip_summary(results)
    failed = upstream_runs.failing(results)
    listed = run_dir / FAILING_LIST
    listed.write_text("".join(f"{word} {what}\n" for word, what in failed))  # all of them, for affected too
    for word, what in sorted(failed, key=lambda pair: "::" in pair[1])[:SHOWN]:  # files that did not finish first
        print(f"{word} {what}")
    if len(failed) > SHOWN:
        print(f"... and {len(failed) - SHOWN} more: {listed}")
    print(f"upstream-tests: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed, {c['error']} errors; kernel source {mode}; "
          f"{len(groups)} file(s) on {len(gpus) or 'no'} GPU(s) in {time.perf_counter() - started:.1f} s")
    if skips:
        print("upstream-tests: skipped: " + ", ".join(f"{n} {kind}" for kind, n in sorted(skips.items())))
    for r in results:
        if r.crashed:
            print(f"upstream-tests: {r.name} did not finish: {r.ended} (its log: {r.log})")
    for f in upstream_runs.mismatched(results):
        print(f"upstream-tests: {f}: its parts collected different lists of tests, so their shares may miss some: an error"
              f"\nupstream-tests: fix: run it alone, whole: upstream-tests {f} --gpus 1")
    no_cutlass = sorted({r.file for r in results if r.log.is_file() and "No module named 'cutlass'" in r.log.read_text(errors="replace")})
    if no_cutlass:  # FlashInfer 0.6.3's requirements.txt has nvidia-cutlass-dsl>=4.3.4; flashinfer-dev installs it with FlashInfer
        print(f"upstream-tests: {len(no_cutlass)} file(s) need `cutlass`, from nvidia-cutlass-dsl, which is not installed here: {', '.join(no_cutlass)}"
              "\nupstream-tests: fix: run inside flashinfer-dev (pixi install -e flashinfer-dev brings it with FlashInfer's requirements)")
    commit = source_tree.inspect(p.source_dir, p).found or "unknown"
    if "--baseline" in ours:
        if c["passed"] == 0:
            raise Failure("no test passed: a baseline of nothing (counts above; each file's log is in the run folder)",
                          "run it on a host with an NVIDIA GPU, inside the flashinfer-dev environment")
        upstream_runs.save_baseline(baseline_file, key, commit, gpu, results)
        print(f"upstream-tests: baseline of {sum(len(r.outcomes) for r in results)} tests recorded for {' '.join(key)} "
              f"(tree {tree_name(commit)}, {gpu}): {baseline_file}")
        return 0
    if baseline is not None:
        changes = upstream_runs.compare(baseline, results)
        record["compared"] = changes
        listed = run_dir / COMPARED_LIST
        listed.write_text("".join(f"{what}: {i}\n" for what, ids in changes.items() for i in ids))
        print(f"upstream-tests: against the baseline of tree {tree_name(baseline['commit'])} on {baseline['gpu']} ({baseline_file}):")
        for what, ids in changes.items():
            print(f"  {what}: {len(ids)}" + "".join(f"\n    {i}" for i in ids[:COMPARED_SHOWN]) +
                  (f"\n    ... and {len(ids) - COMPARED_SHOWN} more: {listed}" if len(ids) > COMPARED_SHOWN else ""))
        return 1 if changes["newly failing"] or changes["newly erroring"] else 0
    if c["passed"] == 0:
        raise Failure("no upstream-tests test passed (counts above; each file's log is in the run folder)",
                      "run it on a host with an NVIDIA GPU, inside the flashinfer-dev environment")
    hidden = skips.get(upstream_runs.OOM, 0) + skips.get(upstream_runs.MISSING_JIT, 0)
    return 1 if c["failed"] or c["error"] or hidden else 0


def tree_name(found: str) -> str:
    """The tree a baseline was taken of: a git commit, shortened, or the source release's name."""
    return found[:12] if re.fullmatch(r"[0-9a-f]{40}", found) else found


def refused(results: list, pytest_args: list[str]) -> None:
    """Every file's pytest refused its arguments (status 4) or selected nothing (5): one usage
    error, in pytest's own words, instead of a count of nothing."""
    if results and all(r.ended == "exit 4" for r in results):
        log = results[0].log.read_text(errors="replace")
        if "ImportError while loading conftest" in log:  # pytest's status 4 too: FlashInfer's conftest imports torch and flashinfer
            said = next((line.strip()[2:] for line in log.splitlines() if line.startswith("E ") and "Error" in line), "see its log")
            raise Failure(f"FlashInfer's tests/conftest.py could not be imported: {said} (log: {results[0].log})",
                          "`python -c 'import flashinfer'` shows why; `pixi run -e flashinfer-dev preflight` names what is off")
        said = next((line.strip() for line in log.splitlines() if "error:" in line.lower()),
                    "pytest's usage error, in the file's log")
        raise Failure(f"upstream-tests: pytest refused the arguments: {said}",
                      "see `upstream_tests.py --help`; what it does not take goes to pytest (`python -m pytest --help` lists its options)",
                      exit_status=USAGE)
    if results and all(r.ended == "exit 5" for r in results):
        raise Failure(f"no upstream-tests test was selected ({' '.join(pytest_args) or 'none collected'})",
                      "check the -k/-m expression; `upstream-tests FAMILY --collect-only -q` lists the tests")


if __name__ == "__main__":
    sys.exit(run_main(main))
