"""Time FlashInfer's own tests on one GPU and on several: a fixed selection, its modules built first.

  bench_upstream.py [--gpus 1,2] [--runs N] [--no-warm-up] [FAMILY ...]     (default: norm activation sampling)

One warm-up run (`upstream_tests.py FAMILY ... --no-plan`, which builds what the selection needs
and keeps each file's time), then, for each GPU count, --runs runs with `--gpus N` (a pytest
process per test file, a long file in a part per GPU, one worker per GPU, fidev.upstream.runs); it
prints each run's wall time and status with each process's GPU and time (a run on N GPUs takes at
least its longest process), the median, and the speedup against the first count. The goal (at least 1.8x on 2 GPUs) is judged from these figures,
not asserted in a test. --no-warm-up, where an earlier run built the selection's modules: a host
that limits a command's time (the device tool: 10 minutes) times one count per command. A run on a host with fewer GPUs than asked is refused, not timed.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # fidev
from fidev.core.failure import ArgumentParser, Failure, option, run_main  # noqa: E402
from fidev.upstream import runs as upstream_runs  # noqa: E402

UPSTREAM = Path(__file__).resolve().parents[1] / "scripts" / "upstream_tests.py"
DEFAULT = ["norm", "activation", "sampling"]
TIMEOUT_S = 7200


def counts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise Failure(f"{text!r} is not a list of distinct GPU counts", "give whole numbers of 1 or more, each once, e.g. --gpus 1,2")
    return values


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise Failure(f"{text!r} is not a positive whole number", "time at least one run: --runs 1")
    return int(text)


def timed(families: list[str], gpus: int | None) -> tuple[float, int, str, list[str]]:
    """(wall time, status, the count line, each file's line) of one upstream-tests run."""
    cmd = [sys.executable, str(UPSTREAM), *families, "--no-plan", *(["--gpus", str(gpus)] if gpus else [])]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except BaseException as e:  # a timeout, Ctrl-C, SIGTERM: upstream-tests stops its test files' processes on SIGTERM
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if isinstance(e, subprocess.TimeoutExpired):
            raise Failure(f"a run of {' '.join(families)} took over {TIMEOUT_S} s", "time a smaller selection (name fewer families)") from None
        raise
    line = next((ln for ln in out.splitlines()[::-1] if ln.startswith("upstream-tests: ") and " passed, " in ln), "")
    files = [ln.strip() for ln in out.splitlines() if upstream_runs.FILE_LINE.match(ln)]
    return time.perf_counter() - started, proc.returncode, line or (err.strip().splitlines() or ["no output"])[-1], files


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--gpus", type=option(counts), default=[1, 2], help="GPU counts to compare (default 1,2)")
    parser.add_argument("--runs", type=option(positive), default=1, help="timed runs per count (default 1)")
    parser.add_argument("--no-warm-up", action="store_true", help="the modules are built already: time at once")
    parser.add_argument("families", nargs="*", default=DEFAULT)
    args = parser.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):  # as Ctrl-C: the run in progress is stopped (timed)
        signal.signal(sig, signal.default_int_handler)
    try:
        return bench(args)
    except KeyboardInterrupt:
        raise Failure("interrupted (the run in progress was stopped)", "run it again", exit_status=130) from None


def bench(args) -> int:
    have = len(upstream_runs.host_gpus())
    if have == 0:
        raise Failure("no GPU is visible here (the driver lists none, or CUDA_VISIBLE_DEVICES hides them)", "run it on a host with NVIDIA GPUs")
    if max(args.gpus) > have:
        raise Failure(f"--gpus asks for {max(args.gpus)} GPUs and this host shows {have}", f"compare counts up to {have}: --gpus 1,{have}")
    status = 0
    if not args.no_warm_up:
        warm_s, status, line, files = timed(args.families, None)
        print(f"warm-up ({' '.join(args.families)}): {warm_s:.1f} s, exit {status}: {line}", *(f"    {f}" for f in files), sep="\n", flush=True)
    rows, first = [], None
    for n in args.gpus:
        runs = [timed(args.families, n) for _ in range(args.runs)]
        median = statistics.median(s for s, _, _, _ in runs)
        first = first or median
        rows.append((n, median, runs))
        for s, code, ln, files in runs:
            print(f"  {n} GPU(s): {s:.1f} s, exit {code}: {ln}", *(f"    {f}" for f in files), sep="\n", flush=True)
    print(f"{'gpus':>4}  {'median':>8}  {'speedup':>7}")
    for n, median, _ in rows:
        print(f"{n:>4}  {median:7.1f}s  {first / median:6.2f}x")
    failed = [code for _, _, runs in rows for _, code, _, _ in runs if code] + ([status] if status else [])
    if failed:
        total = (not args.no_warm_up) + sum(len(r) for _, _, r in rows)
        raise Failure(f"{len(failed)} of {total} runs failed (exit {failed[0]}): the figures above time failing runs",
                      f"run the selection once and read why: python scripts/upstream_tests.py {' '.join(args.families)} --no-plan")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
