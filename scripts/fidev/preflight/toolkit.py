"""The CUDA toolkit and the host compiler FlashInfer's JIT would use, and conda's CUDA layout as the JIT sees it."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from fidev.jit import activation, compile_cache, jit_toolchain
from fidev.preflight.context import Context
from fidev.preflight.results import ENV_FIX, Result, fail, ok, run, warn

# Newest host compiler majors each nvcc accepts: (gcc, clang). Both need C++17: >= 7.
HOST_COMPILER_MAX = {"12.8": (14, 19), "12.9": (14, 19), "13.0": (15, 20)}


def check_nvcc(ctx: Context) -> Result:
    tc, target = ctx.toolchain, ctx.target
    nvcc = tc.nvcc
    if not nvcc.is_file():
        return fail(f"nvcc not found: {nvcc} ({tc.nvcc_from}, cuda_home from {tc.cuda_home_from})", ENV_FIX)
    probe = run([str(nvcc), "--version"])
    release = re.search(r"release (\d+\.\d+)", probe.stdout) if probe and probe.returncode == 0 else None
    if not release:
        return fail(f"{nvcc} --version failed or did not name a release", ENV_FIX)
    if release.group(1) != target:
        return fail(
            f"{nvcc} is CUDA {release.group(1)}; the workspace pins {target}",
            f"{ENV_FIX}; to diagnose this host on purpose: --cuda {release.group(1)}",
        )
    return ok(f"{nvcc} is CUDA {target}")


def check_toolkit_origin(ctx: Context) -> Result:
    tc = ctx.toolchain
    nvcc, origin = tc.nvcc, tc.cuda_home_from
    named = tc.nvcc_from != "$cuda_home/bin/nvcc"  # FLASHINFER_NVCC names the compiler, not CUDA_HOME
    origin = tc.nvcc_from if named else origin
    on_path = shutil.which("nvcc")
    if origin != "nvcc on PATH" and on_path and Path(on_path).resolve() != nvcc.resolve():
        fix = (
            f"make {tc.nvcc_from} name the nvcc of PATH's toolkit, or unset it inside the environment"
            if named
            else "make CUDA_HOME and PATH name the same toolkit (unset CUDA_HOME inside the environment)"
        )
        return fail(f"{origin} compiles with {nvcc} but PATH runs {on_path}", fix)
    prefix = os.environ.get("CONDA_PREFIX")
    if not prefix:
        return warn(f"no active pixi environment (CONDA_PREFIX unset); using {nvcc}", ENV_FIX)
    if not inside(nvcc, prefix):
        return fail(
            f"{nvcc} (cuda_home from {origin}) is outside the environment {prefix}",
            "take the host toolkit off PATH and unset CUDA_HOME; the environment sets CUDA_HOME=$CONDA_PREFIX",
        )
    return ok(f"nvcc comes from the environment {prefix}")


def inside(path: Path, prefix: str) -> bool:
    return path.resolve().is_relative_to(Path(prefix).resolve())


def activation_fix(*names: str) -> str:
    """The fix for a toolchain path FlashInfer cannot see. Where the manifest's activation is
    already in force, the file is missing from the environment itself."""
    wanted = activation.manifest_env(names)
    prefix = os.environ.get("CONDA_PREFIX")
    if prefix and all(os.environ.get(k) == v for k, v in activation.apply({}, prefix).items() if k in wanted):
        return (
            "the activation is in force, so the environment lacks the file: pixi install -e flashinfer-dev "
            "(cuda-toolkit brings cuda-cudart-dev, cuda-driver-dev, cuda-cccl and libcublas-dev)"
        )
    return "run it inside the environment (`pixi run -e flashinfer-dev preflight`), whose activation sets " + ", ".join(
        f"{k}={v!r}" for k, v in wanted.items()
    )


def check_nvcc_profile(ctx: Context) -> Result:
    tc = ctx.toolchain
    if not tc.nvcc.is_file():
        return fail(f"no nvcc at {tc.nvcc} to check", "fix the nvcc check first")
    if not tc.profile.is_file():
        where = "CUDA_HOME" if tc.nvcc_from == "$cuda_home/bin/nvcc" else tc.nvcc_from
        return fail(
            f"{tc.profile} is missing: nvcc started as {tc.nvcc} ({tc.nvcc_from}) finds no include or library paths",
            f"point {where} at the environment's nvcc (its bin/, where conda keeps bin/nvcc.profile), "
            "not at targets/x86_64-linux: " + activation_fix(*dict.fromkeys(["CUDA_HOME", where])),
        )
    return ok(str(tc.profile))


def check_cuda_headers(ctx: Context) -> Result:
    tc = ctx.toolchain
    missing, split, found = [], [], set()
    for header in jit_toolchain.HEADERS:
        cxx = jit_toolchain.find_header(header, tc.cxx_includes)
        nvcc = jit_toolchain.find_header(header, tc.nvcc_includes)
        if cxx:
            found.add(str(cxx.path))
        missing += [f"{header} (by {who})" for who, found in (("g++", cxx), ("nvcc", nvcc)) if found is None]
        if cxx and nvcc and (cxx.path / header).resolve() != (nvcc.path / header).resolve():
            split.append(f"{header}: g++ takes {cxx.path}, nvcc {nvcc.path}")
    if missing:
        searched = ", ".join(str(d.path) for d in tc.cxx_includes)
        return fail(
            f"not reachable: {', '.join(missing)}; g++ searches {searched or 'no CUDA dir'}",
            activation_fix("FLASHINFER_EXTRA_CFLAGS"),
        )
    if split:
        return warn(
            "g++ and nvcc see different copies: " + "; ".join(split),
            "give both compilers one include dir first: " + activation_fix("FLASHINFER_EXTRA_CFLAGS"),
        )
    return ok(f"{', '.join(jit_toolchain.HEADERS)} from {', '.join(sorted(found))} (g++ and nvcc)")


def check_cuda_libs(ctx: Context) -> Result:
    tc = ctx.toolchain
    found, missing = [], []
    for lib in jit_toolchain.LIBRARIES:
        hit = jit_toolchain.find_library(lib, tc.link_dirs)
        if hit is None:
            missing.append(f"lib{lib}.so (-l{lib})")
        else:
            found.append(f"{hit[1]}")
    if missing:
        searched = ", ".join(str(d.path) for d in tc.link_dirs)
        return fail(
            f"every module's link will fail: {', '.join(missing)} on none of the -L dirs ({searched})",
            activation_fix("FLASHINFER_EXTRA_LDFLAGS"),
        )
    return ok(", ".join(found))


def check_host_cuda(ctx: Context) -> Result:
    """What a toolkit outside the environment (the host's /usr/local/cuda) must never give a
    module: headers, link libraries, or the CUDA runtime FlashInfer preloads."""
    tc = ctx.toolchain
    prefix = os.environ.get("CONDA_PREFIX")
    if not prefix:
        return ok("no active environment: the toolkit found is the one in use (see toolkit-origin)")
    leaks, origins = [], set()
    for header in jit_toolchain.HEADERS:
        for who, dirs in (("g++", tc.cxx_includes), ("nvcc", tc.nvcc_includes)):
            hit = jit_toolchain.find_header(header, dirs)
            if hit and not inside(hit.path, prefix):
                leaks.append(f"{who} takes {header} from {hit.path} ({hit.origin})")
                origins.add(hit.origin)
    for lib in jit_toolchain.LIBRARIES:
        hit = jit_toolchain.find_library(lib, tc.link_dirs)
        if hit and not inside(hit[0].path, prefix):
            leaks.append(f"-l{lib} links {hit[1]} ({hit[0].origin})")
            origins.add(hit[0].origin)
    fixes = [f"unset {name}" for name in sorted(origins & {"LIBRARY_PATH", "CPATH", "CPLUS_INCLUDE_PATH"})]
    if origins - set(fixes):
        fixes.append("take the host toolkit out of CUDA_HOME and FLASHINFER_EXTRA_* (see toolkit-origin)")
    if tc.preload.is_file() and not inside(tc.preload, prefix):
        leaks.append(f"FlashInfer preloads {tc.preload} (CUDA_LIB_PATH)")
        wanted = activation.manifest_env(["CUDA_LIB_PATH"])["CUDA_LIB_PATH"]
        fixes.append(f"set CUDA_LIB_PATH={wanted!r}, as the manifest's activation does")
    if leaks:
        return fail("a toolkit outside the environment leaks in: " + "; ".join(leaks), "; ".join(fixes))
    return ok(f"headers, link libraries and the preloaded runtime all come from {prefix} or nowhere")


def _ccbin_flag():
    flags = (os.environ.get("NVCC_PREPEND_FLAGS", "") + " " + os.environ.get("NVCC_APPEND_FLAGS", "")).split()
    for i, flag in enumerate(flags):
        for name in ("-ccbin", "--compiler-bindir"):
            if flag == name and i + 1 < len(flags):
                return flags[i + 1]
            if flag.startswith(name + "="):
                return flag.split("=", 1)[1]
    return None


def check_host_compiler(ctx: Context) -> Result:
    target = ctx.target
    # FlashInfer passes `-ccbin $CC` when CC is set; otherwise nvcc takes -ccbin from
    # NVCC_PREPEND/APPEND_FLAGS, else gcc on PATH.
    compiler = os.environ.get("CC") or _ccbin_flag() or "gcc"
    probe = run([compiler, "--version"])
    if probe is None or probe.returncode != 0:
        return fail(f"host compiler {compiler!r} does not run", "install GCC, or set CC to a supported compiler")
    first = probe.stdout.splitlines()[0] if probe.stdout else ""
    versions = re.findall(r"(\d+)\.(\d+)(?:\.\d+)?", first)
    if not versions:
        return warn(
            f"cannot read the version of {compiler}: {first!r}", "check it against NVIDIA's supported compilers"
        )
    major = int(versions[-1][0])
    family = "clang" if "clang" in first else "gcc"
    limits = HOST_COMPILER_MAX.get(target)
    if limits is None:
        return warn(f"{family} {major} ({compiler}); no table for CUDA {target}", "check NVIDIA's supported compilers")
    newest = limits[family == "clang"]
    if not 7 <= major <= newest:
        return fail(
            f"{family} {major} ({compiler}): nvcc {target} accepts {family} 7 to {newest}",
            f"set CC to a {family} <= {newest} (the environment ships gxx_linux-64 13)",
        )
    return ok(f"{family} {major} ({compiler})")


def check_compile_cache(ctx: Context) -> Result:
    """Whether nvcc goes through the compile cache, where it is, how large, and whether it is on
    (fidev.jit.compile_cache)."""
    return Result(*compile_cache.check(os.environ))
