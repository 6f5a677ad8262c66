"""Call FlashInfer's exported TVM-FFI functions directly, with the argument order the Rust
bindings use, against float64 references (tests/abi); fail unless it really ran.

It loads the modules `build --abi` compiled, or those flashinfer-jit-cache ships (kernel source
mode `prebuilt`). Extra arguments go to pytest (e.g. -k gemma).
"""

from __future__ import annotations

import argparse
import sys

from fidev import gpu_suite
from fidev.ui import run_main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _, pytest_args = parser.parse_known_args()
    return gpu_suite.run("abi-smoke", "abi", pytest_args)


if __name__ == "__main__":
    sys.exit(run_main(main))
