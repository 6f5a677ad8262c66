"""Call FlashInfer's exported TVM-FFI functions directly, with the argument order the Rust
bindings use, against float64 references (tests/abi_smoke); fail unless it really ran.

It loads the modules `build --abi` compiled, and those flashinfer-jit-cache ships where the kernel
source mode loads them prebuilt (fidev.jit.kernel_source): in `auto`, the default, a module none of
whose inputs differ from the pinned release; in `prebuilt`, every one it ships; in `vendored`, none.
Arguments it does not know go to pytest, e.g. `abi_smoke.py -k gemma`.
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import argparse

from fidev.core.failure import ArgumentParser
from fidev.jit import kernel_source
from fidev.smoke import gpu_suite


def main() -> int:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, usage="%(prog)s [PYTEST_ARGS ...]"
    )
    _, pytest_args = parser.parse_known_args()
    return gpu_suite.run("abi-smoke", "abi_smoke", pytest_args, kernel_source.mode())


if __name__ == "__main__":
    gpu_suite.exit_task(main)
