"""Run the GPU smoke suite (tests/smoke) and fail unless it really ran.

Arguments it does not know go to pytest, e.g. `smoke.py -k rmsnorm` or `smoke.py --wide -x`.
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
from fidev.core.failure import ArgumentParser
from fidev.jit import kernel_source
from fidev.smoke import gpu_suite


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        usage="%(prog)s [--wide] [PYTEST_ARGS ...]",
    )
    parser.add_argument(
        "--wide", action="store_true", help="also run the wider tier (batch prefill/decode, paged KV append, top-k)"
    )
    args, pytest_args = parser.parse_known_args()
    return gpu_suite.run("smoke", "smoke", [*(["--wide"] if args.wide else []), *pytest_args], kernel_source.mode())


if __name__ == "__main__":
    gpu_suite.exit_task(main)
