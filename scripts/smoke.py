"""Run the GPU smoke suite (tests/smoke) and fail unless it really ran.

Extra arguments go to pytest (e.g. -k rmsnorm).
"""

from __future__ import annotations

import argparse
import sys

from fidev import gpu_suite
from fidev.ui import run_main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide", action="store_true", help="also run the wider tier (batch prefill/decode, paged KV append, top-k)")
    args, pytest_args = parser.parse_known_args()
    return gpu_suite.run("smoke", "smoke", [*(["--wide"] if args.wide else []), *pytest_args])


if __name__ == "__main__":
    sys.exit(run_main(main))
