"""Run the GPU smoke suite (tests/smoke) and fail unless it really ran.

pytest skips every smoke test on a host without a GPU, which keeps CPU CI green; run as the
smoke task, "nothing ran" is a failure. Extra arguments go to pytest (e.g. -k rmsnorm).
"""

from __future__ import annotations

import argparse
import sys
import time

import pytest

from fidev import kernels
from fidev.manifest import ROOT
from fidev.ui import Failure, run_main


class Outcomes:
    """A pytest plugin that counts what the call phase of each test did."""

    def __init__(self):
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.counts[report.outcome] += 1

    def pytest_collectreport(self, report):
        if report.skipped:  # a whole module skipped, e.g. no torch
            self.counts["skipped"] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide", action="store_true", help="also run the wider tier (batch prefill/decode, paged KV append, top-k)")
    args, pytest_args = parser.parse_known_args()
    mode = kernels.mode()
    outcomes = Outcomes()
    started = time.perf_counter()
    code = pytest.main([str(ROOT / "tests" / "smoke"), "-ra", "-p", "no:cacheprovider", *(["--wide"] if args.wide else []), *pytest_args],
                       plugins=[outcomes])
    c = outcomes.counts
    print(f"smoke: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed; kernel source {mode}; "
          f"{time.perf_counter() - started:.1f} s")
    if code in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and c["passed"] == 0:
        raise Failure("no smoke test passed: every one was skipped (reasons above)",
                      "run it on a host with an NVIDIA GPU, inside the flashinfer-dev environment")
    return int(code)


if __name__ == "__main__":
    sys.exit(run_main(main))
