"""What `build` last built, and everything that decided it, so that a repeated build knows its
modules are current without importing torch or FlashInfer (5 s of the warm chain).

A module's JitSpec comes out of FlashInfer's Python generators (flashinfer/jit/*.py, jinja
templates rendered into generated sources, a build.ninja with the flags of the environment), for
the GPUs torch sees, in the kernel source mode in force. The stamp keeps a fingerprint of all of
that: the build's options, the mode and whether flashinfer-jit-cache is importable (and its
version), the Python files of the FlashInfer tree (size and mtime), the environment variables the
JIT reads, the toolkit's nvcc, the installed torch and apache-tvm-ffi, and the GPUs (their UUIDs,
from the driver's /proc files, which need no CUDA context). When the fingerprint is unchanged,
each module's build.ninja and generated sources are still what the generators would write, so
ninja alone decides what to compile (an edited header or csrc/ file), and fidev.records.ninja_inputs
catches a restored older copy. Anything else changed, or no stamp: the full build, with the import.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path

from fidev.core import workspace
from fidev.core.files import load_json, write_whole
from fidev.jit import kernel_source, module_choice, uris
from fidev.records import build_records, ninja_inputs

# Read by FlashInfer's JIT (flashinfer/jit/cpp_ext.py, env.py, compilation_context.py) or by the
# compilers it starts; every FLASHINFER_* variable counts too.
JIT_VARIABLES = (
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_LIB_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CXX",
    "CC",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "CPATH",
    "LIBRARY_PATH",
    "MAX_JOBS",
)
GPUS = Path("/proc/driver/nvidia/gpus")


@dataclass(frozen=True)
class Module(workspace.ModuleFiles):
    """What the stamp keeps of a module: enough for ninja, and for fidev.builds.module_builds."""

    key: str
    name: str
    build_dir: Path
    sources: list[Path]


def path(ws: workspace.Workspace, options: dict) -> Path:
    """Beside FlashInfer's per-version caches (flashinfer/jit/env.py: <base>/.cache/flashinfer), one
    per set of build options, so that `build` and `build --abi` each keep theirs; `ws` is the task's
    workspace, read at its start."""
    return ws.build_stamp(options)


def _gpu_uuids() -> list[str] | None:
    """The GPUs' UUIDs, from the driver's /proc files, else nvidia-smi (slower); None without either."""
    try:
        found = [
            line.split(":", 1)[1].strip()
            for info in sorted(GPUS.glob("*/information"))
            for line in info.read_text().splitlines()
            if line.startswith("GPU UUID")
        ]
    except OSError:
        found = []
    if found:
        return found
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sorted(done.stdout.split()) if done.returncode == 0 and done.stdout.strip() else None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _nvcc() -> tuple | None:
    """The nvcc FlashInfer runs ($CUDA_HOME/bin/nvcc, else the one on PATH: cpp_ext.py, get_cuda_path), and its stat."""
    home = os.environ.get("CUDA_HOME")
    nvcc = Path(home, "bin", "nvcc") if home else Path(shutil.which("nvcc") or "nvcc")
    try:
        st = nvcc.stat()
    except OSError:
        return None
    return str(nvcc), st.st_mtime_ns, st.st_size


def fingerprint(options: dict, tree: Path, mode: str) -> str | None:
    """The hash of what decides the modules' specs, in kernel source `mode` (the task's, read at its
    start); None where it cannot be known without CUDA (no driver files), so that the build takes
    the full path."""
    gpus = _gpu_uuids()
    if gpus is None and "FLASHINFER_CUDA_ARCH_LIST" not in os.environ:
        return None
    python_files = [(str(f), (st := f.stat()).st_mtime_ns, st.st_size) for f in build_records.python_sources(tree)]
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("FLASHINFER_") or k in JIT_VARIABLES)
    facts = {
        "options": options,
        "mode": mode,
        # in `auto`, which modules load prebuilt follows the tree's edits to include/ and csrc/ too
        "edited": module_choice.edited() if mode == kernel_source.AUTO and module_choice.prebuilt_available() else None,
        "jit_cache": (util.find_spec(uris.JIT_CACHE_PACKAGE) is not None, _version("flashinfer-jit-cache")),
        "tree": str(tree.resolve()),
        "python_files": sorted(python_files),
        "env": env,
        "nvcc": _nvcc(),
        "versions": [_version(d) for d in ("torch", "apache-tvm-ffi", "flashinfer-python")],
        "gpus": gpus,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def write(ws: workspace.Workspace, options: dict, stamp: str, modules: list[Module]) -> None:
    write_whole(
        path(ws, options),
        json.dumps(
            {
                "fingerprint": stamp,
                "modules": [
                    {
                        "key": m.key,
                        "name": m.name,
                        "build_dir": str(m.build_dir),
                        "sources": [str(s) for s in m.sources],
                    }
                    for m in modules
                ],
            }
        ),
    )


def load(ws: workspace.Workspace, options: dict, stamp: str | None) -> list[Module] | None:
    """The modules the last build made, when its fingerprint is `stamp` and their build files and
    generated sources are all still there; else None."""
    if stamp is None:
        return None
    data = _read(path(ws, options))
    if data is None or data["fingerprint"] != stamp:
        return None
    modules = _modules(data)
    if not all(m.ninja_path.is_file() and all(s.is_file() for s in m.sources) for m in modules):
        return None
    return modules


def has_work(module: Module) -> bool:
    """Whether a build of `module` would compile or link anything (fidev.records.ninja_inputs.dry_run:
    ninja's own dry run, and any object built from a since-restored input)."""
    if not module.jit_library_path.is_file():
        return True
    pending = ninja_inputs.dry_run(module.build_dir, module.ninja_path)
    return pending is None or bool(pending[0]) or pending[1] > 0


def _well_formed(data) -> bool:
    """Whether a stamp read back has the shape `write` gives it."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("fingerprint"), str)
        and isinstance(data.get("modules"), list)
        and all(
            isinstance(m, dict)
            and all(isinstance(m.get(k), str) for k in ("key", "name", "build_dir"))
            and isinstance(m.get("sources"), list)
            and all(isinstance(s, str) for s in m["sources"])
            for m in data["modules"]
        )
    )


def _read(stamp: Path) -> dict | None:
    """The stamp at `stamp`; None where it is missing, cannot be read, or is of another shape."""
    try:
        data = load_json(stamp)
    except (OSError, ValueError):
        return None
    return data if _well_formed(data) else None


def _modules(data: dict) -> list[Module]:
    return [Module(m["key"], m["name"], Path(m["build_dir"]), [Path(s) for s in m["sources"]]) for m in data["modules"]]


def _stamps(ws: workspace.Workspace) -> list[Path]:
    return sorted(path(ws, {}).parent.glob(workspace.BUILD_STAMP.replace(".json", "*.json")))


def unreadable_stamps(ws: workspace.Workspace) -> list[Path]:
    """The stamps of `ws` that are there but cannot be read (truncated, not JSON, not a stamp)."""
    return [stamp for stamp in _stamps(ws) if _read(stamp) is None]


def stamped_modules(ws: workspace.Workspace) -> list[Module]:
    """The modules every readable stamp of `ws` names (each option set's last build), whatever their fingerprint."""
    return [m for stamp in _stamps(ws) if (data := _read(stamp)) is not None for m in _modules(data)]
