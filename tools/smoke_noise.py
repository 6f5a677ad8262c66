"""Measure the GPU suites' numerical noise: run tests/smoke (or tests/abi_smoke) N times in one
process, each run with fresh random inputs, and print per kernel and dtype the worst max-relative
error seen, the tolerance (tests/support/gpu_checks.py, TOLERANCE) and the margin between them.

  python tools/smoke_noise.py [--runs 20] [--suite smoke|abi_smoke] [PYTEST_ARGS ...]

Exit 1 when a margin is under 3x (the rule the tolerances are set by) or a run failed. Run it on
the GPU host after `build` (and `build --abi` for abi_smoke): it compiles nothing itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # fidev
from fidev.core import numbers  # noqa: E402
from fidev.core.failure import ArgumentParser, Failure, option, run_main  # noqa: E402
from fidev.smoke import gpu_suite  # noqa: E402

MIN_MARGIN = 3.0


def main() -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=option(numbers.whole_number(example="--runs 20")), default=20,
                        help="runs of the suite, each with fresh random inputs (default 20)")
    parser.add_argument("--suite", choices=["smoke", "abi_smoke"], default="smoke", help="the suite to run: %(choices)s (default smoke)")
    args, pytest_args = parser.parse_known_args()
    failed_runs = 0
    for _ in range(args.runs):
        failed_runs += gpu_suite.run(f"{args.suite} (noise)", args.suite, ["-q", *pytest_args]) != 0
        if "gpu_checks" in sys.modules:
            sys.modules["gpu_checks"].RESULTS.clear()  # each run prints its own table, not all runs' so far
    checks = sys.modules.get("gpu_checks")
    if checks is None or not checks.MEASURED:
        raise Failure("no check measured an error", "run it on the GPU host, after `build`")
    worst: dict[tuple[str, str], list[float]] = {}
    for kernel, dtype, err in checks.MEASURED:
        worst.setdefault((kernel, dtype), []).append(err)
    rows, short = [("kernel", "dtype", "checks", "median", "worst", "tolerance", "margin")], []
    for (kernel, dtype), errs in sorted(worst.items()):
        bound = next(b for d, b in checks.TOLERANCE[kernel].items() if str(d).removeprefix("torch.") == dtype)
        margin = bound / max(max(errs), 1e-30)
        if margin < MIN_MARGIN:
            short.append(f"{kernel} {dtype}")
        rows.append((kernel, dtype, str(len(errs)), f"{sorted(errs)[len(errs) // 2]:.2e}", f"{max(errs):.2e}", f"{bound:.2g}", f"{margin:.1f}x"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    print(f"smoke-noise: {args.runs} runs of {args.suite}, {failed_runs} failed; margins under {MIN_MARGIN:.0f}x: {', '.join(short) or 'none'}")
    return 1 if failed_runs or short else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
