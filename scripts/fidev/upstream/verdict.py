"""What upstream-tests says of a run once its files ran: pytest's usage errors across every file,
the failing tests (all of them in the run folder's FAILING_LIST, which `affected` reads), the
counts, a baseline recorded or compared against, and the exit status."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from fidev.core.failure import USAGE, Failure
from fidev.jit import kernel_source
from fidev.upstream import runs as upstream_runs

SHOWN = 200  # failing tests named after a run; the run folder's FAILING_LIST has all
FAILING_LIST = "failing.txt"  # in the run folder: a line "FAILED <id>" or "ERROR <what>" for each
COMPARED_SHOWN, COMPARED_LIST = (
    50,
    "compared.txt",
)  # a compare run's ids of each kind named; the run folder's file has all


NOT_FOUND = "ERROR: not found: "  # pytest's line for a node id its file has no test of (status 4)


def not_found(results: list, nodes: list[str]) -> list[str]:
    """The node ids of the selection (`nodes`) that name no test of their file, as the tree's paths name them
    (tests/utils/test_norm.py::nosuch): pytest's NOT_FOUND lines in the logs of the files it refused (status
    4), which drop a parametrized id's [...] part (`test_norm[nosuch]` is said `test_norm`)."""
    missing = []
    for r in results:
        if r.ended != "exit 4" or not r.log.is_file():
            continue
        lines = r.log.read_text(errors="replace").splitlines()
        said = {line.strip().removeprefix(NOT_FOUND).partition("::")[2] for line in lines if line.startswith(NOT_FOUND)}
        asked = [
            n.partition("::")[2]
            for n in nodes
            if "::" in n and Path(n.partition("::")[0]).resolve().as_posix().endswith("/" + r.file)
        ]
        named = [rest for rest in asked if rest.partition("[")[0] in said] or sorted(said - {""})
        missing += [f"{r.file}::{rest}" for rest in named]
    return missing


def refused(results: list, pytest_args: list[str], nodes: list[str] = ()) -> None:
    """Every file's pytest refused its arguments (status 4: a node id that names no test of its file, said
    so, or an option it does not know) or selected nothing (5): one usage error, in pytest's own words,
    instead of a count of nothing."""
    # where other files ran, a stale node id is its file's error, counted (a run's, and affected's, failure)
    missing = not_found(results, list(nodes)) if results and all(r.ended == "exit 4" for r in results) else []
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise Failure(
            f"no such test: {', '.join(missing[:3])}{more}: its file has no test of that name",
            f"name a test the file has: `upstream-tests {missing[0].split('::')[0]} --collect-only -q` lists them",
            exit_status=USAGE,
        )
    if results and all(r.ended == "exit 4" for r in results):
        log = results[0].log.read_text(errors="replace")
        if (
            "ImportError while loading conftest" in log
        ):  # pytest's status 4 too: FlashInfer's conftest imports torch and flashinfer
            said = next(
                (line[2:].strip() for line in log.splitlines() if line.startswith("E ") and "Error" in line),
                "see its log",
            )
            raise Failure(
                f"FlashInfer's tests/conftest.py could not be imported: {said} (log: {results[0].log})",
                "`python -c 'import flashinfer'` shows why; `pixi run -e flashinfer-dev preflight` names what is off",
            )
        lines = log.splitlines()  # pytest's first line is "ERROR: usage: ...", its second argparse's ": error: ..."
        said = next((line.strip() for line in lines if ": error: " in line), None) or next(
            (line.strip() for line in lines if "error:" in line.lower()), "pytest's usage error, in the file's log"
        )
        raise Failure(
            f"upstream-tests: pytest refused the arguments: {said}",
            "see `upstream_tests.py --help`; what it does not take goes to pytest (`python -m pytest --help` "
            "lists its options)",
            exit_status=USAGE,
        )
    if results and all(r.ended == "exit 5" for r in results):
        raise Failure(
            f"no upstream-tests test was selected ({' '.join(pytest_args) or 'none collected'})",
            "check the -k/-m expression; `upstream-tests FAMILY --collect-only -q` lists the tests",
        )


def name_failing(results: list, run_dir: Path) -> None:
    """Every failing test and unfinished file into the run folder's FAILING_LIST, the first SHOWN
    on the terminal, files that did not finish first."""
    failed = upstream_runs.failing(results)
    listed = run_dir / FAILING_LIST
    listed.write_text("".join(f"{word} {what}\n" for word, what in failed))  # all of them, for affected too
    for word, what in sorted(failed, key=lambda pair: "::" in pair[1])[:SHOWN]:  # files that did not finish first
        print(f"{word} {what}")
    if len(failed) > SHOWN:
        print(f"... and {len(failed) - SHOWN} more: {listed}")


def say_counts(results: list, mode: str, files: int, gpus: int, seconds: float) -> None:
    """The count line, the skips by reason, and each file that did not finish, or split unevenly,
    or lacked `cutlass`."""
    c, skips = upstream_runs.counts(results), upstream_runs.skip_summary(results)
    print(
        f"upstream-tests: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed, {c['error']} "
        f"errors; kernel source {mode}; {files} file(s) on {gpus or 'no'} GPU(s) in {seconds:.1f} s"
    )
    if skips:
        print("upstream-tests: skipped: " + ", ".join(f"{n} {kind}" for kind, n in sorted(skips.items())))
    for r in results:
        if r.crashed:
            print(f"upstream-tests: {r.name} did not finish: {r.ended} (its log: {r.log})")
    for f in upstream_runs.mismatched(results):
        print(
            f"upstream-tests: {f}: its parts collected different lists of tests, so their shares may miss "
            "some: an error"
            f"\nupstream-tests: fix: run it alone, whole: upstream-tests {f} --gpus 1"
        )
    no_cutlass = sorted(
        {
            r.file
            for r in results
            if r.log.is_file() and "No module named 'cutlass'" in r.log.read_text(errors="replace")
        }
    )
    if (
        no_cutlass
    ):  # FlashInfer 0.6.3's requirements.txt has nvidia-cutlass-dsl>=4.3.4; flashinfer-dev installs it with FlashInfer
        print(
            f"upstream-tests: {len(no_cutlass)} file(s) need `cutlass`, from nvidia-cutlass-dsl, which is not "
            f"installed here: {', '.join(no_cutlass)}"
            "\nupstream-tests: fix: run inside flashinfer-dev (pixi install -e flashinfer-dev brings it with "
            "FlashInfer's requirements)"
        )


def rerun_command(what: str, mode: str) -> str:
    """The command that runs one failing case again, alone, under the same kernel source mode (a
    process that did not finish, "<file> (<how it ended>)": its file)."""
    prefix = "" if mode == kernel_source.AUTO else f"{kernel_source.ENV}={mode} "
    return (
        f"{prefix}pixi run -e flashinfer-dev upstream-tests --no-plan "
        f"{shlex.quote(what if '::' in what else what.split(' (')[0])}"
    )


def say_stopped(results: list, stop_after: int, mode: str) -> None:
    """Where the run stopped early (--stop-after): that it did, what did not run, and each failing
    case with the command that runs it again alone. A run stopped early fails (judged by its caller)."""
    stopped = upstream_runs.stopped_early(results)
    if not stopped:
        return
    not_run = sum(r.not_run or 0 for r in stopped)
    uncounted = [r for r in stopped if r.not_run is None]
    why = (
        f"the run's failing cases reached --stop-after {stop_after}"
        if stop_after
        else "the run ended before them (its lines above say why)"
    )
    print(
        f"upstream-tests: stopped early: {why}; {not_run} case(s) did not run"
        + (
            f", nor did those of {len(uncounted)} process(es) that stopped before they counted theirs"
            if uncounted
            else ""
        )
        + ": a failing run, whatever the counts above"
    )
    for word, what in upstream_runs.failing(results):
        print(f"upstream-tests: {word} {what}: rerun: {rerun_command(what, mode)}")


def tree_name(found: str) -> str:
    """The tree a baseline was taken of: a git commit, shortened, or the source release's name."""
    return found[:12] if re.fullmatch(r"[0-9a-f]{40}", found) else found


def record_baseline(results: list, key: list[str], baseline_file: Path, commit: str, gpu: str) -> int:
    """--baseline: each test's outcome kept for the selection; refused where nothing passed."""
    if upstream_runs.counts(results)["passed"] == 0:
        raise Failure(
            "no test passed: a baseline of nothing (counts above; each file's log is in the run folder)",
            "run it on a host with an NVIDIA GPU, inside the flashinfer-dev environment",
        )
    upstream_runs.save_baseline(baseline_file, key, commit, gpu, results)
    print(
        f"upstream-tests: baseline of {sum(len(r.outcomes) for r in results)} tests recorded for {' '.join(key)} "
        f"(tree {tree_name(commit)}, {gpu}): {baseline_file}"
    )
    return 0


def passed_in(run_dir: Path) -> int:
    """How many tests passed in the run folder's outcome files (fidev.upstream.plugin's lines, one
    file per process: fidev.upstream.runs.read_outcomes)."""
    return sum(
        outcome == "passed"
        for f in sorted(run_dir.glob("*.jsonl"))
        for outcome in upstream_runs.read_outcomes(f).values()
    )


def say_compared(baseline: dict, baseline_file: Path, changes: dict[str, list[str]], run_dir: Path) -> int:
    """What changed since the baseline, all of it in the run folder's COMPARED_LIST; 1 where a test
    newly fails or errors; refused where no test passed and none newly failed or errored (every one
    skipped: nothing newly fails, and nothing was exercised either)."""
    listed = run_dir / COMPARED_LIST
    listed.write_text("".join(f"{what}: {i}\n" for what, ids in changes.items() for i in ids))
    print(
        f"upstream-tests: against the baseline of tree {tree_name(baseline['commit'])} on {baseline['gpu']} "
        f"({baseline_file}):"
    )
    for what, ids in changes.items():
        print(
            f"  {what}: {len(ids)}"
            + "".join(f"\n    {i}" for i in ids[:COMPARED_SHOWN])
            + (f"\n    ... and {len(ids) - COMPARED_SHOWN} more: {listed}" if len(ids) > COMPARED_SHOWN else "")
        )
    if passed_in(run_dir) == 0 and not changes["newly failing"] and not changes["newly erroring"]:
        raise Failure(
            "no test passed: a comparison with the baseline of nothing (counts above; each file's log is in "
            f"{run_dir})",
            "run it on a host with an NVIDIA GPU, inside the flashinfer-dev environment",
        )
    return 1 if changes["newly failing"] or changes["newly erroring"] else 0


def passed(results: list) -> int:
    """A run without a baseline: 0 where nothing failed, errored or skipped for out of memory or a
    missing JIT module; refused where nothing passed."""
    c, skips = upstream_runs.counts(results), upstream_runs.skip_summary(results)
    if c["passed"] == 0:
        raise Failure(
            "no upstream-tests test passed (counts above; each file's log is in the run folder)",
            "run it on a host with an NVIDIA GPU, inside the flashinfer-dev environment",
        )
    hidden = skips.get(upstream_runs.OOM, 0) + skips.get(upstream_runs.MISSING_JIT, 0)
    return 1 if c["failed"] or c["error"] or hidden else 0
