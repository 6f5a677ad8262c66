"""The checks in the order preflight prints them, each run behind one crash guard."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fidev.core import workspace
from fidev.core.manifest import Pins
from fidev.preflight.context import Context, read_mode
from fidev.preflight.gpu import check_driver, check_gpus
from fidev.preflight.host import check_host, check_jit_dir, check_ninja
from fidev.preflight.packages import (
    check_cubin,
    check_flashinfer_install,
    check_jit_cache,
    check_kernel_source,
    check_source,
    check_torch,
    check_tvm_ffi,
)
from fidev.preflight.results import Result, fail
from fidev.preflight.tasks import check_tasks
from fidev.preflight.toolkit import (
    check_compile_cache,
    check_cuda_headers,
    check_cuda_libs,
    check_host_compiler,
    check_host_cuda,
    check_nvcc,
    check_nvcc_profile,
    check_toolkit_origin,
)

STATUSES = ("pass", "warn", "fail")


@dataclass
class Check:
    id: str
    status: str
    finding: str
    fix: str = ""


CHECKS: list[tuple[str, Callable[[Context], Result]]] = [
    ("host", check_host),
    ("driver", check_driver),
    ("gpu", check_gpus),
    ("nvcc", check_nvcc),
    ("toolkit-origin", check_toolkit_origin),
    ("nvcc-profile", check_nvcc_profile),
    ("cuda-headers", check_cuda_headers),
    ("cuda-libs", check_cuda_libs),
    ("host-cuda", check_host_cuda),
    ("host-compiler", check_host_compiler),
    ("torch", check_torch),
    ("flashinfer-source", check_source),
    ("flashinfer-install", check_flashinfer_install),
    ("cubin", check_cubin),
    ("kernel-source", check_kernel_source),
    ("jit-cache", check_jit_cache),
    ("tvm-ffi", check_tvm_ffi),
    ("ninja", check_ninja),
    ("jit-dir", check_jit_dir),
    ("compile-cache", check_compile_cache),
    ("manifest-tasks", check_tasks),
]


def run_checks(ctx: Context) -> list[Check]:
    """Every check, each behind the one crash guard: a check that raises is a FAIL carrying the
    exception, and the others still run."""
    checks = []
    for check_id, check in CHECKS:
        try:
            result = check(ctx)
        except Exception as e:  # noqa: BLE001 (the guard is the point)
            result = fail(
                f"the check crashed: {type(e).__name__}: {e}",
                "the other checks still ran; report this line with `python scripts/preflight.py --json`",
            )
        checks.append(Check(check_id, result.status, result.finding, result.fix))
    return checks


def run_all(target: str, p: Pins) -> list[Check]:
    """Every check against the CUDA release `target`, with the workspace and the kernel source mode read first."""
    return run_checks(Context(target, p, workspace.read(p.flashinfer, check=False), read_mode()))


def counts(checks: list[Check]) -> dict[str, int]:
    """{status: how many checks ended in it}, for pass, warn and fail."""
    return {s: sum(c.status == s for c in checks) for s in STATUSES}
