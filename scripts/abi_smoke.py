"""Call FlashInfer's exported TVM-FFI functions directly, with the argument order the Rust
bindings use, against float64 references (tests/abi); fail unless it really ran.

It loads the modules `build --abi` compiled, or those flashinfer-jit-cache ships (kernel source
mode `prebuilt`). Extra arguments go to pytest (e.g. -k gemma).
"""

from __future__ import annotations

import sys

from fidev import gpu_suite
from fidev.ui import run_main


def main() -> int:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return 0
    return gpu_suite.run("abi-smoke", "abi", sys.argv[1:])


if __name__ == "__main__":
    sys.exit(run_main(main))
