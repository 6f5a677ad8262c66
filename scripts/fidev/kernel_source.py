"""Kernel source mode: where FlashInfer's JIT modules come from.

With flashinfer-jit-cache installed, FlashInfer loads any module it ships instead of compiling
extern/tracked/flashinfer/csrc, so an edit to those kernels silently does nothing. The mode
`vendored` hides the jit-cache from this interpreter so that every module is compiled from the
vendored source; `prebuilt` (the default) leaves FlashInfer's own behaviour alone.
"""

from __future__ import annotations

import os
import sys

from fidev import uris
from fidev.failure import Failure

ENV = "FLASHINFER_DEV_KERNEL_SOURCE"
PREBUILT, VENDORED = "prebuilt", "vendored"


def mode() -> str:
    """The mode in force; an empty variable counts as unset, as for every variable here."""
    value = os.environ.get(ENV) or PREBUILT
    if value not in (PREBUILT, VENDORED):
        raise Failure(f"{ENV}={value!r} is not a kernel source mode",
                      f"set {ENV} to '{PREBUILT}' (default) or '{VENDORED}'")
    return value


def apply() -> str:
    """Call before importing flashinfer. Returns the mode in force."""
    current = mode()
    if current == VENDORED:
        # importlib.util.find_spec() answers None for a name mapped to None in sys.modules,
        # which is how FlashInfer asks whether the jit-cache is there; imports of it fail.
        sys.modules[uris.JIT_CACHE_PACKAGE] = None
    return current
