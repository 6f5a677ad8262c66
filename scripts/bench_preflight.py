"""Print preflight's median wall time beside `python -m torch.utils.collect_env`'s.

Each run is a fresh interpreter, as a user runs it. The target (<= 0.5 s) is judged from these
figures, not asserted in a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

PREFLIGHT = Path(__file__).with_name("preflight.py")


def median_wall(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("preflight_args", nargs="*", help="passed to preflight.py (e.g. -- --cuda 13.0)")
    args = parser.parse_args()
    rows = [("preflight.py", median_wall([sys.executable, str(PREFLIGHT), "--json", *args.preflight_args], args.runs), args.runs)]
    if importlib.util.find_spec("torch") is not None:
        runs = min(args.runs, 3)  # collect_env takes seconds
        rows.append(("torch.utils.collect_env", median_wall([sys.executable, "-m", "torch.utils.collect_env"], runs), runs))
    else:
        rows.append(("torch.utils.collect_env", float("nan"), 0))
    print(f"{'command':26} {'median wall (s)':>16} {'runs':>5}")
    for name, seconds, runs in rows:
        print(f"{name:26} {seconds:16.3f} {runs:5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
