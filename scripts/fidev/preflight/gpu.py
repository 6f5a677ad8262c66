"""The driver against the CUDA release checked, and the GPUs it sees against FlashInfer's and smoke's needs."""

from __future__ import annotations

from fidev.builds import smoke_modules
from fidev.core.versions import version_key
from fidev.preflight.context import Context
from fidev.preflight.results import Result, fail, ok, warn

# Minimum Linux driver of each CUDA release (NVIDIA's CUDA release notes, table 3).
MIN_DRIVER = {"12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06"}
MIN_COMPUTE_CAPABILITY = (7, 5)  # FlashInfer refuses anything older


def check_driver(ctx: Context) -> Result:
    (driver, why), target = ctx.driver, ctx.target
    min_driver = MIN_DRIVER.get(target, f"the one for CUDA {target}")
    fix = f"install an NVIDIA driver >= {min_driver} (CUDA {target})"
    if driver is None:
        return fail(f"no NVIDIA driver found ({why})", fix + ", or run on a GPU host")
    finding = f"driver {driver.version} supports CUDA {driver.cuda} (via {driver.via})"
    if version_key(driver.cuda) < version_key(target):
        # Minor-version compatibility would run prebuilt SASS of a newer 12.x on this driver,
        # but not PTX JIT nor the features that need the newer driver: not a supported setup.
        return fail(f"{finding} < CUDA {target} pinned", fix + "; minor-version compatibility does not cover PTX JIT")
    return ok(finding)


def check_gpus(ctx: Context) -> Result:
    driver = ctx.driver[0]
    if driver is None:
        return fail("cannot list GPUs without a driver", "fix the driver check first")
    if not driver.gpus:
        return fail("the driver sees no GPU", "check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
    listed = ", ".join(f"{name} sm_{major}{minor}" for name, (major, minor) in driver.gpus)
    supported = [cap for _, cap in driver.gpus if cap >= MIN_COMPUTE_CAPABILITY]
    if not supported:
        return fail(f"{listed}: FlashInfer 0.6 needs sm_75 or newer", "use a Turing (sm_75) or newer GPU")
    if not any(cap == (9, 0) for cap in supported):
        sm90_only = ", ".join(m.key for m in smoke_modules.MODULES if m.sm90)
        return warn(
            f"{listed}; {sm90_only} need sm_90 and will be skipped",
            "run on an H100/H200 (sm_90) to smoke-test every kernel",
        )
    return ok(f"{listed}; every smoke kernel runs here")
