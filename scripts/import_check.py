"""Import FlashInfer and prove it is the editable vendored tree; print what it runs with.

No network: it never calls `flashinfer show-config`, which offline retries a download for
about 35 s and then crashes.
"""

from __future__ import annotations

import sys
import time
from importlib import metadata
from pathlib import Path

from fidev import kernel_source, source_tree
from fidev.failure import ArgumentParser, Failure, run_main
from fidev.flashinfer_import import REINSTALL, import_flashinfer
from fidev.manifest import pins


def installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1]).parse_args()
    p = pins()
    started = time.perf_counter()
    imported = import_flashinfer()
    flashinfer, jit_env, mode = imported.flashinfer, imported.jit_env, imported.mode
    # Where it came from first: that needs nothing but the import, and is what this step proves.
    where = Path(flashinfer.__file__).resolve()
    source = p.source_dir.resolve()
    if not where.is_relative_to(source):
        raise Failure(f"flashinfer was imported from {where.parent}, not the vendored tree {source_tree.shown(p.source_dir)}", REINSTALL)
    if flashinfer.__version__ != p.flashinfer:
        raise Failure(f"flashinfer {flashinfer.__version__} imported, the pin is {p.flashinfer}", REINSTALL)
    try:
        import torch
    except Exception as e:  # not installed, or a build that cannot load its libraries
        first = str(e).splitlines()[0] if str(e) else ""
        raise Failure(f"import torch failed: {type(e).__name__}: {first}", REINSTALL) from e

    jit_cache = installed("flashinfer-jit-cache")
    if mode == kernel_source.VENDORED:
        jit_cache += " (hidden)"
    rows = [
        ("flashinfer", f"{flashinfer.__version__} from {where.parent}"),
        ("flashinfer-cubin", installed("flashinfer-cubin")),
        ("flashinfer-jit-cache", jit_cache),
        ("apache-tvm-ffi", installed("apache-tvm-ffi")),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda})"),
        ("JIT cache", str(jit_env.FLASHINFER_JIT_DIR)),
        ("prebuilt modules", str(jit_env.FLASHINFER_AOT_DIR) if jit_env.FLASHINFER_AOT_DIR.exists() else "none"),
        ("kernel source", f"{mode} ({kernel_source.ENV})"),
    ]
    for name, value in rows:
        print(f"  {name:21} {value}")
    print(f"import-check: ok in {time.perf_counter() - started:.1f} s (import {imported.seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
