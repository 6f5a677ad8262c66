"""Print preflight's median wall time beside `python -m torch.utils.collect_env`'s.

Each run is a fresh interpreter, as a user runs it. The target (<= 0.5 s) is judged from these
figures, not asserted in a test. Preflight's own exit status is shown too: a preflight that
cannot run (bad arguments, a broken manifest) is reported, not timed.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # fidev
from fidev.core import numbers  # noqa: E402
from fidev.core.failure import ArgumentParser, Failure, option, run_main  # noqa: E402

PREFLIGHT = Path(__file__).resolve().parents[1] / "scripts" / "preflight.py"
TIMEOUT_S = 300


def timed(cmd: list[str], runs: int) -> tuple[float, int]:
    """(median wall time, exit status of the last run)."""
    times, code = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        code = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=TIMEOUT_S).returncode
        times.append(time.perf_counter() - start)
    return statistics.median(times), code


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--runs", type=option(numbers.whole_number(example="--runs 1")), default=11,
                        help="runs of preflight to take the median of (default 11)")
    parser.add_argument("preflight_args", nargs="*", help="passed to preflight.py (e.g. -- --cuda 13.0)")
    args = parser.parse_args()
    preflight = [sys.executable, str(PREFLIGHT), "--json", *args.preflight_args]
    first = subprocess.run(preflight, capture_output=True, text=True, timeout=TIMEOUT_S)
    try:
        report = json.loads(first.stdout)
    except ValueError:
        report = {}
    if first.returncode not in (0, 1) or "checks" not in report:  # it ran only if it reported its checks
        said = next((line[len("error: "):] for line in first.stderr.splitlines() if line.startswith("error: ")), first.stderr.strip()[-200:])
        raise Failure(f"preflight did not run (exit status {first.returncode}): {said}", "run preflight alone with the same arguments to see both its lines")
    rows = [("preflight.py", *timed(preflight, args.runs), args.runs)]
    if importlib.util.find_spec("torch") is not None:
        runs = min(args.runs, 3)  # collect_env takes seconds
        rows.append(("torch.utils.collect_env", *timed([sys.executable, "-m", "torch.utils.collect_env"], runs), runs))
    print(f"{'command':26} {'median wall (s)':>16} {'exit':>5} {'runs':>5}")
    for name, seconds, code, runs in rows:
        print(f"{name:26} {seconds:16.3f} {code:5} {runs:5}")
    if len(rows) == 1:
        print("torch is not installed here: no collect_env figure to compare with")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
