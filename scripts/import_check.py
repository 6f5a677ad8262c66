"""Import FlashInfer and prove it is the editable vendored tree; print what it runs with.

No network: it never calls `flashinfer show-config`, which offline retries a download for
about 35 s and then crashes. The chain does not run this task: smoke (and abi-smoke) make the same
check in their own process, on the import their tests need anyway (fidev.jit.flashinfer_import).
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import sys
import time

from fidev.core.failure import ArgumentParser, run_main
from fidev.core.manifest import pins
from fidev.jit import kernel_source
from fidev.jit.flashinfer_import import import_flashinfer, vendored_rows


def main() -> int:
    ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1]).parse_args()
    pins()  # a broken manifest is its own two lines, before the import
    started = time.perf_counter()
    imported = import_flashinfer(kernel_source.mode())
    for name, value in vendored_rows(imported.flashinfer, imported.jit_env, imported.mode):
        print(f"  {name:21} {value}")
    print(f"import-check: ok in {time.perf_counter() - started:.1f} s (import {imported.seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
