"""Check every GPU, driver and toolchain precondition of flashinfer-dev, before any compile.

Each check prints one line (PASS / WARN / FAIL and what it found) and, unless it passed, one
line with the fix. Exit 0 when nothing failed, 1 when a check failed, 2 on bad usage.
Standard library only; no network, no torch or flashinfer import, no CUDA context; every
subprocess has a timeout. The checks live in fidev.preflight.
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import json
import sys
import time
from dataclasses import asdict

from fidev.core.failure import ArgumentParser, Failure, one_line, option, run_main, split_usage
from fidev.core.manifest import cuda_release, pins
from fidev.preflight.checks import counts, run_all


def print_lines(checks, said: dict[str, int], target: str, p, elapsed: float) -> None:
    note = "" if target == p.cuda else f" (override; the pin is {p.cuda})"
    print(f"preflight: FlashInfer {p.flashinfer}, CUDA {target}{note}")
    for c in checks:
        print(f"  {c.status.upper():4}  {c.id:18} {one_line(c.finding)}")  # one line each, whatever they quote
        if c.fix:
            print(f"  {'':4}  {'':18} fix: {one_line(c.fix)}")
    warnings = f"{said['warn']} warning{'s' * (said['warn'] != 1)}"
    print(f"preflight: {said['pass']} passed, {warnings}, {said['fail']} failed in {elapsed:.2f} s")


class Parser(ArgumentParser):
    """A bad command line with --json on it: its two lines, and one JSON object on stdout for the machine
    reading --json, as every other failure gives it."""

    def error(self, message: str):
        if "--json" in sys.argv[1:]:
            problem, fix = split_usage(message)
            print(json.dumps({"error": problem, "fix": fix or f"see `{self.prog} --help`"}))
        super().error(message)


def main() -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    parser.add_argument(
        "--cuda",
        metavar="X.Y",
        type=option(cuda_release),
        help="CUDA release to check against, 13.0 or cu130 (default: the manifest's pin); "
        "only to diagnose another host",
    )
    args = parser.parse_args()
    try:
        p = pins()
        target = args.cuda or p.cuda
    except Failure as failure:
        if args.json:  # a machine reading --json still gets JSON
            print(json.dumps({"error": failure.problem, "fix": failure.fix}))
        raise

    started = time.perf_counter()
    checks = run_all(target, p)
    said = counts(checks)
    elapsed = time.perf_counter() - started
    if args.json:
        print(
            json.dumps(
                {
                    "cuda_target": target,
                    "pinned": target == p.cuda,
                    "checks": [asdict(c) for c in checks],
                    "summary": said,
                    "seconds": round(elapsed, 3),
                },
                indent=1,
            )
        )
    else:
        print_lines(checks, said, target, p, elapsed)
    return 1 if said["fail"] else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
