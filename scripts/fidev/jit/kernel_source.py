"""Kernel source mode: where FlashInfer's JIT modules come from.

With flashinfer-jit-cache installed, FlashInfer 0.6.3 loads every module it ships instead of
compiling extern/tracked/flashinfer, so left alone, an edit to csrc/ or include/ would do nothing.

- `auto` (the default): per module, prebuilt where none of its inputs differ from the pinned
  release, compiled from the vendored tree where any does (fidev.jit.module_choice).
- `prebuilt`: FlashInfer's own behaviour: whatever the jit-cache ships loads, edited or not.
- `vendored`: every module compiles from the tree: the jit-cache is hidden from this interpreter,
  and the tree's flashinfer/data/aot is not used either.

This module names the modes and reads the one in force; fidev.jit.module_choice.apply applies it.
"""

from __future__ import annotations

import os

from fidev.core.failure import Failure

ENV = "FLASHINFER_DEV_KERNEL_SOURCE"
AUTO, PREBUILT, VENDORED = "auto", "prebuilt", "vendored"
MODES = (AUTO, PREBUILT, VENDORED)
SAID = {
    AUTO: "prebuilt where a module's inputs match the release, compiled from the tree where you edited them",
    PREBUILT: "the modules flashinfer-jit-cache ships load, edited or not",
    VENDORED: "every module compiles from the tree",
}


def mode() -> str:
    """The mode in force; an empty variable counts as unset, as for every variable here."""
    value = os.environ.get(ENV) or AUTO
    if value not in MODES:
        raise Failure(
            f"{ENV}={value!r} is not a kernel source mode",
            f"set {ENV} to '{AUTO}' (the default), '{PREBUILT}' or '{VENDORED}'",
        )
    return value
