"""Check every GPU, driver and toolchain precondition of flashinfer-dev, before any compile.

Each check prints one line (PASS / WARN / FAIL and what it found) and, unless it passed, one
line with the fix. Exit 0 when nothing failed, 1 when a check failed, 2 on bad usage.
Standard library only; no network, no torch or flashinfer import, no CUDA context; every
subprocess has a timeout.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

from fidev.builds import smoke_modules
from fidev.core import workspace
from fidev.core.failure import ArgumentParser, Failure, option, run_main
from fidev.core.manifest import Pins, cuda_release, cuda_tag, pins
from fidev.core.versions import in_range, major_minor, version_key
from fidev.jit import activation, jit_toolchain, kernel_source, module_choice
from fidev.jit.jit_toolchain import JitToolchain
from fidev.tree import source_tree

SUBPROCESS_TIMEOUT_S = 5
# Minimum Linux driver of each CUDA release (NVIDIA's CUDA release notes, table 3).
MIN_DRIVER = {"12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06"}
# Newest host compiler majors each nvcc accepts: (gcc, clang). Both need C++17: >= 7.
HOST_COMPILER_MAX = {"12.8": (14, 19), "12.9": (14, 19), "13.0": (15, 20)}
MIN_COMPUTE_CAPABILITY = (7, 5)  # FlashInfer refuses anything older
# About ten times what the smoke tiers leave in the JIT cache for one architecture (docs/measurements.md,
# row "JIT cache size, one architecture"):
# room for other head dims and dtypes, a second architecture, and the larger GEMM/MoE modules a binding may add.
MIN_FREE_GIB = 1
ENV_FIX = "run it inside the environment: `pixi run -e flashinfer-dev preflight`, or `pixi shell -e flashinfer-dev`"


@dataclass(frozen=True)
class Result:
    status: str  # pass | warn | fail
    finding: str
    fix: str = ""


@dataclass
class Check:
    id: str
    status: str
    finding: str
    fix: str = ""


def ok(finding: str) -> Result:
    return Result("pass", finding)


def warn(finding: str, fix: str) -> Result:
    return Result("warn", finding, fix)


def fail(finding: str, fix: str) -> Result:
    return Result("fail", finding, fix)


def run(cmd) -> subprocess.CompletedProcess | None:
    """Run a probe; None when it cannot start or outlives SUBPROCESS_TIMEOUT_S."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def distribution(name: str):
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- driver and GPUs


@dataclass
class Driver:
    version: str
    cuda: str  # the newest CUDA the driver supports
    gpus: list  # [(name, (major, minor))]
    via: str


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_from_nvml() -> Driver:
    import pynvml  # nvidia-ml-py; a missing driver raises NVMLError at nvmlInit

    pynvml.nvmlInit()
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                (_text(pynvml.nvmlDeviceGetName(handle)), tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)))
            )
        return Driver(_text(pynvml.nvmlSystemGetDriverVersion()), f"{cuda // 1000}.{cuda % 1000 // 10}", gpus, "NVML")
    finally:
        pynvml.nvmlShutdown()


def driver_from_smi() -> Driver:
    smi = shutil.which("nvidia-smi")
    if not smi:
        raise RuntimeError("nvidia-smi is not on PATH")
    header = run([smi])
    query = run([smi, "--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"])
    for probe in (header, query):
        if probe is None or probe.returncode != 0:
            raise RuntimeError(
                "nvidia-smi failed: " + (probe.stdout + probe.stderr).strip()[:120] if probe else "nvidia-smi timed out"
            )
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", header.stdout)
    rows = [[f.strip() for f in line.split(",")] for line in query.stdout.strip().splitlines()]
    if not cuda or not rows:
        raise RuntimeError("cannot read nvidia-smi's output")
    gpus = [(name, tuple(int(x) for x in cap.split("."))) for _, name, cap in rows]
    return Driver(rows[0][0], cuda.group(1), gpus, "nvidia-smi")


def read_driver():
    """(Driver, None) or (None, why)."""
    reasons = []
    for label, probe in (("NVML", driver_from_nvml), ("nvidia-smi", driver_from_smi)):
        try:
            return probe(), None
        except Exception as e:  # NVMLError, ImportError, RuntimeError: each says why
            reasons.append(f"{label}: {e}")
    return None, "; ".join(reasons)


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


# ---------------------------------------------------------------- CUDA toolkit and host compiler


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
    on_path = shutil.which("nvcc")
    if origin != "nvcc on PATH" and on_path and Path(on_path).resolve() != nvcc.resolve():
        return fail(
            f"{origin} compiles with {nvcc} but PATH runs {on_path}",
            "make CUDA_HOME and PATH name the same toolkit (unset CUDA_HOME inside the environment)",
        )
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


# ---------------------------------------------------------------- conda's CUDA layout, as FlashInfer's JIT sees it


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
        return fail(
            f"{tc.profile} is missing: nvcc started as {tc.nvcc} ({tc.nvcc_from}) finds no include or library paths",
            "point CUDA_HOME at the environment root, where conda keeps bin/nvcc.profile, not at targets/x86_64-linux: "
            + activation_fix("CUDA_HOME"),
        )
    return ok(str(tc.profile))


def check_cuda_headers(ctx: Context) -> Result:
    tc = ctx.toolchain
    missing, split, found = [], [], set()
    for header in jit_toolchain.HEADERS:
        cxx, nvcc = (
            jit_toolchain.find_header(header, tc.cxx_includes),
            jit_toolchain.find_header(header, tc.nvcc_includes),
        )
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
        fixes.append(
            "set CUDA_LIB_PATH={!r}, as the manifest's activation does".format(
                activation.manifest_env(["CUDA_LIB_PATH"])["CUDA_LIB_PATH"]
            )
        )
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


# ---------------------------------------------------------------- Python packages (metadata only)


def check_torch(ctx: Context) -> Result:
    target = ctx.target
    dist = distribution("torch")
    if dist is None:
        return fail("PyTorch is not installed", ENV_FIX)
    version_py = Path(dist.locate_file("torch/version.py"))
    text = version_py.read_text() if version_py.is_file() else ""
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]", text, flags=re.M)
    if not cuda:
        return fail(f"torch {dist.version} is not a CUDA build", f"install torch built for CUDA {target}: {ENV_FIX}")
    if major_minor(cuda.group(1)) != target:
        return fail(
            f"torch {dist.version} is built for CUDA {cuda.group(1)}, not {target}",
            f"install torch built for CUDA {target}: {ENV_FIX}",
        )
    return ok(f"torch {dist.version} (CUDA {cuda.group(1)})")


def check_source(ctx: Context) -> Result:
    p = ctx.pins
    tree = source_tree.inspect(p.source_dir, p)
    where = source_tree.shown(tree.path)
    get = source_tree.GET
    replace = f"python3 scripts/fetch_flashinfer_source.py --replace (it keeps the old tree as {where}.replaced-<time>)"
    if tree.kind == "missing":
        return fail(f"{where} does not exist", get)
    if tree.kind == "not a folder":
        return fail(f"{where} is a file, not a folder", f"move it away, then {get}")
    if tree.kind == "empty":
        return fail(f"{where} is empty: the submodule is not initialized", get)
    if tree.kind == "submodule":
        if not tree.found:
            return warn(f"cannot read the commit of {where}", f"check `git -C {where} status`")
        if not tree.pinned and not source_tree.descends_from(tree.path, p.source_commit):
            return fail(
                f"{where} is at {tree.found[:12]}, the manifest pins {p.source_commit[:12]} (v{p.flashinfer})",
                "git submodule update --init --recursive",
            )
        if not tree.pinned:  # edits committed on top of the pin: the kernel source mode auto compiles what they reach
            return warn(
                f"{where} is at {tree.found[:12]}: your commits on top of the pinned {p.source_commit[:12]} "
                f"(v{p.flashinfer})",
                "fine for kernel work (the modules they reach compile from the tree); to move the pin itself, see "
                "docs/bindings.md, \"Bumping the FlashInfer pin\"",
            )
        if tree.lacking:
            return fail(
                f"{where} lacks {', '.join(tree.lacking)}: its own submodules are not initialized",
                "git submodule update --init --recursive",
            )
        return ok(f"{where} at v{p.flashinfer} ({tree.found[:12]})")
    if tree.kind == "release":
        if not tree.pinned:
            return fail(f"{where} holds another release ({tree.found})", replace)
        if tree.lacking:
            return fail(f"{where} is a partial release: no {', '.join(tree.lacking)}", replace)
        # The marker records the archive whose SHA-256 matched the pin before it was unpacked.
        return ok(
            f"{where} holds the v{p.flashinfer} source release (sha256 {p.sdist_sha256[:12]}... matched before "
            "unpacking)"
        )
    return fail(
        f"{where} is neither a git checkout nor a materialized release", f"{replace}; or move it away, then {get}"
    )


def check_flashinfer_install(ctx: Context) -> Result:
    p = ctx.pins
    where = source_tree.shown(p.source_dir)
    dist = distribution("flashinfer-python")
    fix = f"pixi install -e flashinfer-dev (the manifest installs it editable from {where})"
    if dist is None:
        return fail("flashinfer-python is not installed", fix)
    raw = dist.read_text("direct_url.json")
    info = json.loads(raw) if raw else {}
    url = info.get("url", "")
    editable_from = Path(unquote(urlparse(url).path)) if url.startswith("file://") else None
    if not info.get("dir_info", {}).get("editable") or editable_from is None:
        return fail(f"flashinfer-python {dist.version} is not an editable install ({url or 'from a wheel'})", fix)
    if editable_from.resolve() != p.source_dir.resolve():
        return fail(f"flashinfer-python is editable from {editable_from}, not {where}", fix)
    if dist.version != p.flashinfer:
        return fail(f"flashinfer-python {dist.version} installed, the pin is {p.flashinfer}", fix)
    broken = source_tree.broken_editable_links(p.source_dir)
    if broken:
        return fail(
            f"the editable install's links {where}/flashinfer/data/{{{','.join(broken)}}} are gone: "
            "the tree was re-created after the install, and the JIT would fail on them",
            source_tree.REINSTALL,
        )
    return ok(f"flashinfer-python {dist.version} editable from {where}")


def check_cubin(ctx: Context) -> Result:
    p = ctx.pins
    dist = distribution("flashinfer-cubin")
    if dist is None:
        return fail("flashinfer-cubin is not installed", "pixi install -e flashinfer-dev")
    if dist.version != p.flashinfer:
        return fail(
            f"flashinfer-cubin {dist.version} != FlashInfer {p.flashinfer}: FlashInfer refuses to run",
            f"install flashinfer-cubin=={p.flashinfer} (pixi install -e flashinfer-dev)",
        )
    return ok(f"flashinfer-cubin {dist.version}")


def check_kernel_source(ctx: Context) -> Result:
    mode = ctx.mode
    if isinstance(mode, Failure):  # a bogus mode: this check says so, the others run on
        return fail(mode.problem, mode.fix)
    try:
        if mode == kernel_source.AUTO:
            module_choice.check(mode)  # reads the tree's edits where prebuilt modules could load instead
    except Failure as e:
        return fail(e.problem, e.fix)
    edits = f"; edited vs the release: {module_choice.edited_summary()}" if mode == kernel_source.AUTO else ""
    return ok(
        f"{mode} ({kernel_source.ENV}{'' if os.environ.get(kernel_source.ENV) else ' unset: the default'}): "
        f"{kernel_source.SAID[mode]}{edits}"
    )


def check_jit_cache(ctx: Context) -> Result:
    p, tag = ctx.pins, cuda_tag(ctx.target)
    dist = distribution("flashinfer-jit-cache")
    if dist is None:
        return fail("flashinfer-jit-cache is not installed", "pixi install -e flashinfer-dev")
    base, _, local = dist.version.partition("+")
    if base != p.flashinfer:
        return fail(
            f"flashinfer-jit-cache {dist.version} != FlashInfer {p.flashinfer}: FlashInfer refuses to run",
            f"install flashinfer-jit-cache=={p.flashinfer}+{tag}",
        )
    if local != tag:
        return fail(
            f"flashinfer-jit-cache {dist.version} is built for {local or 'no CUDA tag'}, the toolkit is {tag}",
            f"install flashinfer-jit-cache=={p.flashinfer}+{tag}",
        )
    mode = ctx.mode  # a bogus one is the kernel-source check's FAIL; here it counts as neither vendored nor prebuilt
    if mode == kernel_source.VENDORED:
        return ok(f"flashinfer-jit-cache {dist.version}, hidden: kernels compile from the vendored source")
    if mode == kernel_source.PREBUILT:
        return warn(
            f"flashinfer-jit-cache {dist.version}: modules it ships load instead of compiling "
            f"{source_tree.shown(p.source_dir)}, edited or not ({kernel_source.ENV}={kernel_source.PREBUILT})",
            f"to build and test your kernel edits, unset {kernel_source.ENV} (auto: an edited module compiles "
            "from the tree)",
        )
    return ok(
        f"flashinfer-jit-cache {dist.version}: a module it ships loads prebuilt where none of its inputs was edited"
    )


def check_tvm_ffi(ctx: Context) -> Result:
    p = ctx.pins
    dist = distribution("apache-tvm-ffi")
    fix = f"install apache-tvm-ffi{p.tvm_ffi_range} (pixi install -e flashinfer-dev)"
    if dist is None:
        return fail("apache-tvm-ffi is not installed", fix)
    if not in_range(dist.version, p.tvm_ffi_range):
        return fail(
            f"apache-tvm-ffi {dist.version} is outside FlashInfer {p.flashinfer}'s range {p.tvm_ffi_range}", fix
        )
    return ok(f"apache-tvm-ffi {dist.version}")


def check_ninja(ctx: Context) -> Result:
    found = shutil.which("ninja")
    return ok(found) if found else fail("ninja is not on PATH: FlashInfer's JIT builds with it", ENV_FIX)


def check_jit_dir(ctx: Context) -> Result:
    """The JIT cache can be written, checked without making any folder of it (the nearest folder
    that exists takes a temporary file): a base that does not exist yet is created by FlashInfer at
    its first build, so it is a warning that names it, never a folder preflight made."""
    cache, base = ctx.workspace.cache, ctx.workspace.base  # where FlashInfer keeps its JIT builds
    fix = f"set {workspace.BASE_VARIABLE} to a writable folder with >= {MIN_FREE_GIB} GiB free"
    existing = next(p for p in (cache, *cache.parents) if p.exists())  # the cache or the nearest folder above it
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        return fail(f"JIT cache {cache} is not writable ({existing}: {e.strerror or e})", fix)
    free = shutil.disk_usage(existing).free / 2**30
    if free < MIN_FREE_GIB:
        return fail(f"JIT cache {cache} has {free:.1f} GiB free, a build needs {MIN_FREE_GIB}", fix)
    if not base.is_dir():
        return warn(
            f"{workspace.BASE_VARIABLE} (or the home folder) {base} does not exist yet: FlashInfer creates it "
            f"at its first build ({free:.0f} GiB free there)",
            f"check its spelling; nothing was created (mkdir -p {base} to make it yourself)",
        )
    return ok(f"JIT cache {cache} ({free:.0f} GiB free)")


def check_host(ctx: Context) -> Result:
    system, machine = platform.system(), platform.machine()
    if (system, machine) != ("Linux", "x86_64"):
        return fail(
            f"{system} {machine}: the workspace is solved for linux-64 only",
            "use a Linux x86_64 host with an NVIDIA GPU",
        )
    return ok("Linux x86_64")


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
]


def read_mode() -> str | Failure:
    """The kernel source mode in force, or the Failure that names a bogus one (the kernel-source check's FAIL)."""
    try:
        return kernel_source.mode()
    except Failure as e:
        return e


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


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    parser.add_argument(
        "--cuda",
        metavar="X.Y",
        type=option(cuda_release),
        help="CUDA release to check against, 13.0 or cu130 (default: the manifest's pin); only to diagnose another "
        "host",
    )
    args = parser.parse_args()
    try:
        p = pins()
        target = args.cuda or p.cuda
    except Failure as failure:
        if args.json:  # a machine reading --json still gets JSON
            print(json.dumps({"error": failure.problem, "fix": failure.fix}))
        raise

    started = time.perf_counter()
    checks = run_checks(Context(target, p, workspace.read(p.flashinfer), read_mode()))
    counts = {s: sum(c.status == s for c in checks) for s in ("pass", "warn", "fail")}
    elapsed = time.perf_counter() - started
    if args.json:
        print(
            json.dumps(
                {
                    "cuda_target": target,
                    "pinned": target == p.cuda,
                    "checks": [asdict(c) for c in checks],
                    "summary": counts,
                    "seconds": round(elapsed, 3),
                },
                indent=1,
            )
        )
    else:
        note = "" if target == p.cuda else f" (override; the pin is {p.cuda})"
        print(f"preflight: FlashInfer {p.flashinfer}, CUDA {target}{note}")
        for c in checks:
            print(f"  {c.status.upper():4}  {c.id:18} {c.finding}")
            if c.fix:
                print(f"  {'':4}  {'':18} fix: {c.fix}")
        warnings = f"{counts['warn']} warning{'s' * (counts['warn'] != 1)}"
        print(f"preflight: {counts['pass']} passed, {warnings}, {counts['fail']} failed in {elapsed:.2f} s")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
