"""What the checks share, each read once."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from fidev.core import workspace
from fidev.core.failure import Failure
from fidev.core.manifest import Pins
from fidev.jit import jit_toolchain, kernel_source
from fidev.jit.jit_toolchain import JitToolchain
from fidev.preflight.driver import Driver, read_driver


@dataclass
class Context:
    """What the checks share, each read once: the CUDA release checked against, the pins, the
    workspace and the kernel source mode (read at the start: the mode, or the Failure that names a
    bogus one), the driver, and the toolchain FlashInfer's JIT would use."""

    target: str
    pins: Pins
    workspace: workspace.Workspace
    mode: str | Failure

    @cached_property
    def driver(self) -> tuple[Driver | None, str | None]:
        return read_driver()

    @cached_property
    def toolchain(self) -> JitToolchain:
        return jit_toolchain.from_env(os.environ)


def read_mode() -> str | Failure:
    """The kernel source mode in force, or the Failure that names a bogus one (the kernel-source check's FAIL)."""
    try:
        return kernel_source.mode()
    except Failure as e:
        return e
