"""Import FlashInfer the one way build, import-check and the GPU suites share: the kernel source
mode applied first, every failure the same two lines, and a dangling editable install caught
before FlashInfer's JIT trips over it with a traceback from its jinja templates."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType

from fidev import kernel_source, source_tree
from fidev.failure import Failure

REINSTALL = "pixi install -e flashinfer-dev, then `pixi run -e flashinfer-dev preflight` names what is off"


@dataclass(frozen=True)
class Imported:
    flashinfer: ModuleType
    jit_env: ModuleType  # flashinfer.jit.env: the JIT dir, the prebuilt-module dir, the source dirs
    mode: str  # the kernel source mode in force
    seconds: float


def import_flashinfer() -> Imported:
    mode = kernel_source.apply()
    started = time.perf_counter()
    try:
        import flashinfer
        from flashinfer.jit import env as jit_env
    except Exception as e:  # ImportError, or FlashInfer refusing a cubin/jit-cache of another version
        first = str(e).splitlines()[0] if str(e) else ""
        raise Failure(f"import flashinfer failed: {type(e).__name__}: {first}", REINSTALL) from e
    # FlashInfer compiles from flashinfer/data/{csrc,include,cutlass,spdlog}, links its editable
    # install made in the tree; re-creating the tree removes them.
    needed = [jit_env.FLASHINFER_CSRC_DIR, jit_env.FLASHINFER_INCLUDE_DIR, *jit_env.CUTLASS_INCLUDE_DIRS[:1], jit_env.SPDLOG_INCLUDE_DIR]
    missing = [str(path) for path in needed if not path.is_dir()]
    if missing:
        raise Failure(f"FlashInfer's JIT sources are gone ({missing[0]} does not exist): the tree was re-created after the editable install",
                      source_tree.REINSTALL)
    return Imported(flashinfer, jit_env, mode, time.perf_counter() - started)
