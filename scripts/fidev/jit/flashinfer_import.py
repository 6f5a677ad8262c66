"""Import FlashInfer the one way build, import-check and the GPU suites share: the kernel source
mode applied first, every failure the same two lines, and a dangling editable install caught
before FlashInfer's JIT trips over it with a traceback from its jinja templates. And the import
check's proof (`vendored_rows`), which import-check runs alone and the GPU suites run in their own
process, where the chain's import already is."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType

from fidev.core.failure import Failure, interrupts_held
from fidev.core.manifest import pins
from fidev.jit import kernel_source, module_choice
from fidev.tree import source_tree

REINSTALL = "pixi install -e flashinfer-dev, then `pixi run -e flashinfer-dev preflight` names what is off"


@dataclass(frozen=True)
class Imported:
    flashinfer: ModuleType
    jit_env: ModuleType  # flashinfer.jit.env: the JIT dir, the prebuilt-module dir, the source dirs
    mode: str  # the kernel source mode in force
    seconds: float


def import_flashinfer(mode: str) -> Imported:
    """flashinfer imported in `mode` (the task's, read at its start)."""
    mode = module_choice.apply(mode)
    started = time.perf_counter()
    try:
        with interrupts_held():  # it imports torch: Ctrl-C in torch's C++ start-up is swallowed or aborts the process
            import flashinfer
            from flashinfer.jit import env as jit_env
    except module_choice.Unpatchable as e:
        raise Failure(
            str(e), f"{kernel_source.ENV}={kernel_source.PREBUILT} leaves FlashInfer's own choice alone"
        ) from e
    except Exception as e:  # ImportError, or FlashInfer refusing a cubin/jit-cache of another version
        first = str(e).splitlines()[0] if str(e) else ""
        other = re.match(
            r"flashinfer-jit-cache version \(([^)]*)\)", first
        )  # flashinfer/jit/env.py, _get_aot_dir's RuntimeError at v0.6.3
        if other:
            raise Failure(
                f"flashinfer-jit-cache {other.group(1)} does not match FlashInfer {pins().flashinfer}: "
                "FlashInfer refuses to import",
                f"pixi install -e flashinfer-dev (the manifest pins both), or "
                f"{kernel_source.ENV}={kernel_source.VENDORED}, which hides the jit-cache and compiles every module",
            ) from e
        raise Failure(f"import flashinfer failed: {type(e).__name__}: {first}", REINSTALL) from e
    # FlashInfer compiles from flashinfer/data/{csrc,include,cutlass,spdlog}, links its editable
    # install made in the tree; re-creating the tree removes them.
    needed = [
        jit_env.FLASHINFER_CSRC_DIR,
        jit_env.FLASHINFER_INCLUDE_DIR,
        *jit_env.CUTLASS_INCLUDE_DIRS[:1],
        jit_env.SPDLOG_INCLUDE_DIR,
    ]
    missing = [str(path) for path in needed if not path.is_dir()]
    if missing:
        raise Failure(
            f"FlashInfer's JIT sources are gone ({missing[0]} does not exist): the tree was re-created after "
            "the editable install",
            source_tree.REINSTALL,
        )
    return Imported(flashinfer, jit_env, mode, time.perf_counter() - started)


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def vendored_rows(flashinfer: ModuleType, jit_env: ModuleType, mode: str) -> list[tuple[str, str]]:
    """The import check's proof: FlashInfer came from the vendored tree at the pinned version
    (else a Failure); then what it runs with, as (name, value) rows."""
    p = pins()
    # Where it came from first: that needs nothing but the import, and is what the check proves.
    where = Path(flashinfer.__file__).resolve()
    if not where.is_relative_to(p.source_dir.resolve()):
        raise Failure(
            f"flashinfer was imported from {where.parent}, not the vendored tree {source_tree.shown(p.source_dir)}",
            REINSTALL,
        )
    if flashinfer.__version__ != p.flashinfer:
        raise Failure(f"flashinfer {flashinfer.__version__} imported, the pin is {p.flashinfer}", REINSTALL)
    try:
        import torch
    except Exception as e:  # not installed, or a build that cannot load its libraries
        first = str(e).splitlines()[0] if str(e) else ""
        raise Failure(f"import torch failed: {type(e).__name__}: {first}", REINSTALL) from e
    jit_cache = _installed("flashinfer-jit-cache") + (" (hidden)" if mode == kernel_source.VENDORED else "")
    return [
        ("flashinfer", f"{flashinfer.__version__} from {where.parent}"),
        ("flashinfer-cubin", _installed("flashinfer-cubin")),
        ("flashinfer-jit-cache", jit_cache),
        ("apache-tvm-ffi", _installed("apache-tvm-ffi")),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda})"),
        ("JIT cache", str(jit_env.FLASHINFER_JIT_DIR)),
        (
            "prebuilt modules",
            "not used"
            if mode == kernel_source.VENDORED
            else str(jit_env.FLASHINFER_AOT_DIR)
            if jit_env.FLASHINFER_AOT_DIR.exists()
            else "none",
        ),
        ("kernel source", f"{mode} ({kernel_source.ENV}): {kernel_source.SAID[mode]}"),
        *([("edited vs the release", module_choice.edited_summary())] if mode == kernel_source.AUTO else []),
    ]
