"""Time FlashInfer's own tests on one GPU and on several: a fixed selection, its modules built first.

  bench_upstream.py [--gpus 1,2] [--runs N] [--no-warm-up] [FAMILY ...]     (default: norm activation sampling)

One warm-up run (`upstream_tests.py FAMILY ... --no-plan`, which builds what the selection needs
and keeps each file's time), then, for each GPU count, --runs runs with `--gpus N` (a pytest
process per test file, a long file in a part per GPU, one worker per GPU, fidev.upstream.runs); it
prints each run's wall time and status with each process's GPU and time (a run on N GPUs takes at
least its longest process), the median, and the speedup against the first count. The goal (at
least 1.8x on 2 GPUs) is judged from these figures, not asserted in a test.

Each run's figures come from the summary upstream-tests writes (`--summary FILE`,
fidev.upstream.summary), not from its output: its counts, its status, and each process's file,
part, GPU and time, listed by file.

--no-warm-up, where an earlier run built the selection's modules: on a GPU host that limits each
command to 10 minutes, time one count per command. A run on a host with fewer GPUs than asked is
refused, not timed.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import argparse
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from fidev.core import numbers  # noqa: E402
from fidev.core.failure import (  # noqa: E402
    INTERRUPTED,
    ArgumentParser,
    Failure,
    option,
    run_main,
    stop_as_ctrl_c,
)
from fidev.core.manifest import pins  # noqa: E402
from fidev.tree import families as upstream_families  # noqa: E402
from fidev.upstream import bench as upstream_bench  # noqa: E402
from fidev.upstream import runs as upstream_runs  # noqa: E402
from fidev.upstream import suite as upstream_suite  # noqa: E402
from fidev.upstream import summary as upstream_summary  # noqa: E402

UPSTREAM = Path(__file__).resolve().parents[1] / "scripts" / "upstream_tests.py"
DEFAULT = list(upstream_bench.FAMILIES)  # what the acceptance run's bench-warm-up builds
TIMEOUT_S = 7200


def counts(text: str) -> list[int]:
    gpus = numbers.whole_number(most=64, example="2")
    try:
        values = [gpus(v) for v in text.split(",")]
    except Failure:
        values = []
    if not values or len(set(values)) != len(values):
        raise Failure(
            f"{numbers.quoted(text)} is not a list of distinct GPU counts",
            "give whole numbers from 1 to 64, each once, e.g. --gpus 1,2",
        )
    return values


def count_line(summary: upstream_summary.Summary) -> str:
    """The run's counts, files and GPUs, as upstream-tests' count line says them."""
    c = summary.counts
    files = len({p.file for p in summary.processes})
    return (
        f"upstream-tests: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed, {c['error']} errors; "
        f"kernel source {summary.kernel_source}; {files} file(s) on {len(summary.gpus) or 'no'} GPU(s) in "
        f"{summary.ended - summary.started:.1f} s"
    )


def process_lines(summary: upstream_summary.Summary) -> list[str]:
    """A line for each of the run's pytest processes, as upstream-tests says one as it ends
    (upstream_runs.FILE_LINE): its GPU, file and part, counts and time, and how it ended where it
    did not finish."""
    lines = []
    for n, p in enumerate(summary.processes, 1):
        name = p.file if p.part[1] == 1 else f"{p.file} (part {p.part[0]} of {p.part[1]})"
        c = p.counts
        crashed = f"{name} ({p.ended})" in summary.erroring  # a process that did not finish is an error of its own
        lines.append(
            f"[{n}/{len(summary.processes)}] GPU {p.gpu or '-'} {name}: {c['passed']} passed, {c['failed']} failed, "
            f"{c['error']} errors, {c['skipped']} skipped in {p.seconds:.0f} s" + (f", {p.ended}" if crashed else "")
        )
    return lines


def upstream_run(cmd: list[str], families: list[str]) -> tuple[int, str]:
    """One upstream-tests run to its end: (its status, its error output)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    except BaseException as e:  # a timeout, Ctrl-C, SIGTERM: upstream-tests stops its test files' processes on SIGTERM
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if isinstance(e, subprocess.TimeoutExpired):
            raise Failure(
                f"a run of {' '.join(families)} took over {TIMEOUT_S} s",
                "time a smaller selection (name fewer families)",
            ) from None
        raise
    return proc.returncode, err


def timed(families: list[str], gpus: int | None) -> tuple[float, int, str, list[str]]:
    """(wall time, status, the count line, each process's line) of one upstream-tests run, from its
    summary; a run that left none (it stopped before its files ran) says its last line of error."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / upstream_summary.NAME
        cmd = [
            sys.executable,
            str(UPSTREAM),
            *families,
            "--no-plan",
            *(["--gpus", str(gpus)] if gpus else []),
            "--summary",
            str(path),
        ]
        started = time.perf_counter()
        status, err = upstream_run(cmd, families)
        seconds = time.perf_counter() - started
        if not path.is_file():
            return seconds, status, (err.strip().splitlines() or ["no output"])[-1], []
        summary = upstream_summary.read(path)
    return seconds, summary.status or status, count_line(summary), process_lines(summary)


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--gpus", type=option(counts), default=[1, 2], help="GPU counts to compare, e.g. 1,2 (default 1,2)"
    )
    parser.add_argument(
        "--runs",
        type=option(numbers.whole_number(example="--runs 1")),
        default=1,
        help="timed runs per count; each count's median is compared (default 1)",
    )
    parser.add_argument(
        "--no-warm-up", action="store_true", help="no warm-up run: an earlier run built the selection's modules"
    )
    parser.add_argument(
        "families",
        nargs="*",
        default=DEFAULT,
        help=f"the kernel families to time (`upstream_tests.py --list` names them; default: {' '.join(DEFAULT)})",
    )
    args = parser.parse_args()
    stop_as_ctrl_c(signal.SIGHUP)  # as Ctrl-C and SIGTERM: the run in progress is stopped (timed)
    try:
        return bench(args)
    except KeyboardInterrupt:
        raise Failure(
            "interrupted (the run in progress was stopped)", "run it again", exit_status=INTERRUPTED
        ) from None


def check_selection(selection: list[str]) -> None:
    """The names upstream-tests is given, checked as it checks them, before the GPUs are looked at: a name that
    is neither a kernel family nor a path under the tree's tests/ (the empty one too) is bad usage (status 2)."""
    tests = pins().source_dir / "tests"
    for item in selection:
        if item not in upstream_families.BY_NAME:
            upstream_suite.path_node(item, tests)


def bench(args) -> int:
    check_selection(args.families)
    have = len(upstream_runs.host_gpus())
    if have == 0:
        raise Failure(
            "no GPU is visible here (the driver lists none, or CUDA_VISIBLE_DEVICES hides them)",
            "run it on a host with NVIDIA GPUs",
        )
    if max(args.gpus) > have:
        raise Failure(
            f"--gpus asks for {max(args.gpus)} GPUs and this host shows {have}",
            f"compare counts up to {have}: --gpus 1,{have}",
        )
    status = 0
    if not args.no_warm_up:
        warm_s, status, line, files = timed(args.families, None)
        print(
            f"warm-up ({' '.join(args.families)}): {warm_s:.1f} s, exit {status}: {line}",
            *(f"    {f}" for f in files),
            sep="\n",
            flush=True,
        )
    rows = timed_counts(args)
    print(f"{'gpus':>4}  {'median':>8}  {'speedup':>7}")
    first = rows[0][1]
    for n, median, _ in rows:
        print(f"{n:>4}  {median:7.1f}s  {first / median:6.2f}x")
    failed = [code for _, _, runs in rows for _, code, _, _ in runs if code] + ([status] if status else [])
    if failed:
        total = (not args.no_warm_up) + sum(len(r) for _, _, r in rows)
        raise Failure(
            f"{len(failed)} of {total} runs failed (exit {failed[0]}): the figures above time failing runs",
            f"run the selection once and read why: python scripts/upstream_tests.py {' '.join(args.families)} "
            "--no-plan",
        )
    return 0


def timed_counts(args) -> list[tuple[int, float, list]]:
    """(GPU count, median wall time, its runs) for each count, each run said as it ends."""
    rows = []
    for n in args.gpus:
        runs = [timed(args.families, n) for _ in range(args.runs)]
        median = statistics.median(s for s, _, _, _ in runs)
        rows.append((n, median, runs))
        for s, code, ln, files in runs:
            print(f"  {n} GPU(s): {s:.1f} s, exit {code}: {ln}", *(f"    {f}" for f in files), sep="\n", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(run_main(main))
