"""The host itself: its platform, ninja on PATH, and room for FlashInfer's JIT cache."""

from __future__ import annotations

import os
import platform
import shutil

from fidev.core import files, workspace
from fidev.preflight.context import Context
from fidev.preflight.results import ENV_FIX, Result, fail, ok, warn

# About ten times what the smoke tiers leave in the JIT cache for one architecture (docs/measurements.md,
# row "JIT cache size, one architecture"):
# room for other head dims and dtypes, a second architecture, and the larger GEMM/MoE modules a binding may add.
MIN_FREE_GIB = 1


def check_host(ctx: Context) -> Result:
    system, machine = platform.system(), platform.machine()
    if (system, machine) != ("Linux", "x86_64"):
        return fail(
            f"{system} {machine}: the workspace is solved for linux-64 only",
            "use a Linux x86_64 host with an NVIDIA GPU",
        )
    return ok("Linux x86_64")


def check_ninja(ctx: Context) -> Result:
    """ninja on PATH, and MAX_JOBS (its -j) one FlashInfer can read: `_get_num_workers` (flashinfer/jit/cpp_ext.py
    at v0.6.3) takes what str.isdigit() takes and int()s it, so a '²' would raise in every JIT build."""
    found = shutil.which("ninja")
    if not found:
        return fail("ninja is not on PATH: FlashInfer's JIT builds with it", ENV_FIX)
    jobs = os.environ.get("MAX_JOBS", "")
    if jobs.isdigit():
        try:
            int(jobs)
        except ValueError:
            return fail(
                f"MAX_JOBS={jobs!r} passes FlashInfer's digit test but is no number: every JIT build would raise",
                "set MAX_JOBS to a whole number in the digits 0-9, or unset it",
            )
    return ok(found)


def check_jit_dir(ctx: Context) -> Result:
    """The JIT cache can be written, checked without making any folder of it (the nearest folder
    that exists takes a temporary file): a base that does not exist yet is created by FlashInfer at
    its first build, so it is a warning that names it, never a folder preflight made."""
    cache, base = ctx.workspace.cache, ctx.workspace.base  # where FlashInfer keeps its JIT builds
    fix = f"set {workspace.BASE_VARIABLE} to a writable folder with >= {MIN_FREE_GIB} GiB free"
    existing = next(p for p in (cache, *cache.parents) if p.exists())  # the cache or the nearest folder above it
    if why := files.cannot_write_in(existing):  # a file made there and removed: access() says yes to root
        return fail(f"JIT cache {cache} is not writable ({existing}: {why})", fix)
    free = shutil.disk_usage(existing).free / 2**30
    if free < MIN_FREE_GIB:
        return fail(f"JIT cache {cache} has {free:.1f} GiB free, a build needs {MIN_FREE_GIB}", fix)
    if not base.is_dir():
        return warn(
            f"{workspace.BASE_VARIABLE} (or the home folder) {base} does not exist yet: "
            f"FlashInfer creates it at its first build ({free:.0f} GiB free there)",
            f"check its spelling; nothing was created (mkdir -p {base} to make it yourself)",
        )
    return ok(f"JIT cache {cache} ({free:.0f} GiB free)")
