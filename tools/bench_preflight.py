"""Print preflight's median wall time beside `python -m torch.utils.collect_env`'s.

Each run is a fresh interpreter, as a user runs it. The target (<= 0.5 s) is judged from these
figures, not asserted in a test. Preflight's own exit status is shown too: a preflight that
cannot run (bad arguments, a broken manifest) is reported, not timed; so is a command that fails
(collect_env with a torch that cannot import): two lines and status 1, no time for it.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import importlib.util
import json
import statistics
import subprocess
import time
from pathlib import Path

from fidev.core import numbers  # noqa: E402
from fidev.core.failure import ArgumentParser, Failure, option, run_main  # noqa: E402

PREFLIGHT = Path(__file__).resolve().parents[1] / "scripts" / "preflight.py"
TIMEOUT_S = 300


def said(stderr: str) -> str:
    """A failed command's reason: its `error:` line, else its last line."""
    lines = stderr.strip().splitlines()
    return next(
        (line[len("error: ") :] for line in lines if line.startswith("error: ")),
        lines[-1][-200:] if lines else "no output",
    )


def timed(name: str, cmd: list[str], runs: int, ran: tuple[int, ...], fix: str) -> tuple[float, int]:
    """(median wall time, exit status of the last run); two lines where a run fails (a status not in
    `ran`) or runs past TIMEOUT_S: a failed command's time is no result."""
    times, code = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        try:
            done = subprocess.run(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace", timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise Failure(f"{name} ran past {TIMEOUT_S} s: no time to report", fix) from None
        times.append(time.perf_counter() - start)
        if done.returncode not in ran:
            raise Failure(
                f"{name} failed (exit status {done.returncode}): {said(done.stderr)}; a failed run's time is no result",
                fix,
            )
        code = done.returncode
    return statistics.median(times), code


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument(
        "--runs",
        type=option(numbers.whole_number(example="--runs 1")),
        default=11,
        help="runs of preflight to take the median of (default 11)",
    )
    parser.add_argument("preflight_args", nargs="*", help="passed to preflight.py (e.g. -- --cuda 13.0)")
    args = parser.parse_args()
    preflight = [sys.executable, str(PREFLIGHT), "--json", *args.preflight_args]
    try:
        first = subprocess.run(preflight, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Failure(
            f"preflight ran past {TIMEOUT_S} s: no time to report",
            "run preflight alone with the same arguments to see where it waits",
        ) from None
    try:
        report = json.loads(first.stdout)
    except ValueError:
        report = {}
    if first.returncode not in (0, 1) or "checks" not in report:  # it ran only if it reported its checks
        raise Failure(
            f"preflight did not run (exit status {first.returncode}): {said(first.stderr)}",
            "run preflight alone with the same arguments to see both its lines",
        )
    print(f"{'command':26} {'median wall (s)':>16} {'exit':>5} {'runs':>5}")
    again = "run preflight alone with the same arguments to see why"
    row("preflight.py", *timed("preflight.py", preflight, args.runs, (0, 1), again), args.runs)
    if importlib.util.find_spec("torch") is None:
        print("torch is not installed here: no collect_env figure to compare with")
        return 0
    runs = min(args.runs, 3)  # collect_env takes seconds
    collect_env = [sys.executable, "-m", "torch.utils.collect_env"]
    why = (
        "python -m torch.utils.collect_env shows why: torch must import in this interpreter for a figure to "
        "compare with"
    )
    row("torch.utils.collect_env", *timed("torch.utils.collect_env", collect_env, runs, (0,), why), runs)
    return 0


def row(name: str, seconds: float, code: int, runs: int) -> None:
    print(f"{name:26} {seconds:16.3f} {code:5} {runs:5}", flush=True)


if __name__ == "__main__":
    sys.exit(run_main(main))
