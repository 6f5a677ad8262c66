"""Measure the GPU suites' numerical noise: run tests/smoke (or tests/abi_smoke) N times in one
process, each run with fresh random inputs, and print per kernel and dtype the largest share of its
allowance (tests/support/gpu_checks.py, TOLERANCE: |out - ref| <= atol + rtol |ref|, element by
element) that any element took, and the margin, its inverse.

  python tools/smoke_noise.py [--runs 20] [--suite smoke|abi_smoke] [PYTEST_ARGS ...]

Exit 1 when a run failed or a margin is under 1.5x: an fp16 output's own rounding alone takes up to
1/2.05 of FlashInfer's fp16 allowance, so about 2x is the most an fp16 check can keep. Run it on the
GPU host after `build` (and `build --abi` for abi_smoke): it compiles nothing itself.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import argparse

from fidev.core import numbers  # noqa: E402
from fidev.core.failure import ArgumentParser, Failure, option  # noqa: E402
from fidev.jit import kernel_source  # noqa: E402
from fidev.smoke import gpu_suite  # noqa: E402

MIN_MARGIN = 1.5


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--runs",
        type=option(numbers.whole_number(example="--runs 20")),
        default=20,
        help="runs of the suite, each with fresh random inputs (default 20)",
    )
    parser.add_argument(
        "--suite", choices=["smoke", "abi_smoke"], default="smoke", help="the suite to run: %(choices)s (default smoke)"
    )
    args, pytest_args = parser.parse_known_args()
    failed_runs, mode = 0, kernel_source.mode()
    for _ in range(args.runs):
        failed_runs += gpu_suite.run(f"{args.suite} (noise)", args.suite, ["-q", *pytest_args], mode) != 0
        if "gpu_checks" in sys.modules:
            sys.modules["gpu_checks"].RESULTS.clear()  # each run prints its own table, not all runs' so far
    checks = sys.modules.get("gpu_checks")
    if checks is None or not checks.MEASURED:
        raise Failure("no check measured an error", "run it on the GPU host, after `build`")
    used: dict[tuple[str, str], list[float]] = {}
    for kernel, dtype, share in checks.MEASURED:
        used.setdefault((kernel, dtype), []).append(share)
    rows, short = [("kernel", "dtype", "checks", "median share", "worst share", "rtol, atol", "margin")], []
    for (kernel, dtype), shares in sorted(used.items()):
        rtol, atol = next(
            rule for d, rule in checks.TOLERANCE[kernel].items() if str(d).removeprefix("torch.") == dtype
        )
        margin = 1 / max(max(shares), 1e-30)
        if margin < MIN_MARGIN:
            short.append(f"{kernel} {dtype}")
        rows.append(
            (
                kernel,
                dtype,
                str(len(shares)),
                f"{sorted(shares)[len(shares) // 2]:.2f}",
                f"{max(shares):.2f}",
                f"{rtol:g}, {atol:g}",
                f"{margin:.1f}x",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    print(
        f"smoke-noise: {args.runs} runs of {args.suite}, {failed_runs} failed; margins under {MIN_MARGIN:g}x: "
        f"{', '.join(short) or 'none'}"
    )
    return 1 if failed_runs or short else 0


if __name__ == "__main__":
    gpu_suite.exit_task(main)
