"""The CUDA toolchain FlashInfer's JIT will compile and link with, derived from an environment the
way FlashInfer 0.6.3 does it, so preflight can check paths instead of waiting for a link error.

Followed from flashinfer/jit/cpp_ext.py at v0.6.3:
- `get_cuda_path`: CUDA_HOME, else CUDA_PATH, else the folder above the folder of `which nvcc`,
  else /usr/local/cuda.
- `generate_ninja_build_for_op`: nvcc is FLASHINFER_NVCC, else `$cuda_home/bin/nvcc`, pasted into the
  ninja rule as a command (the compile cache puts ccache in front: fidev.jit.compile_cache); C++ sources
  compile with `$CXX` (default c++); modules link with `$cxx $in $ldflags`, where ldflags are
  `-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda` then FLASHINFER_EXTRA_LDFLAGS.
- `get_system_includes` / `build_common_cflags`: `-isystem $cuda_home/include` and
  `-isystem $cuda_home/include/cccl` (the former dropped when cuda_home is /usr), for g++ and nvcc
  alike; `build_cflags` appends FLASHINFER_EXTRA_CFLAGS, `build_cuda_cflags`
  FLASHINFER_EXTRA_CUDAFLAGS (each split with shlex, as `parse_env_flags` does).
And from flashinfer/jit/__init__.py: at import, FlashInfer opens `$CUDA_LIB_PATH/libcudart.so.12`
(default /usr/local/cuda/targets/x86_64-linux/lib) with RTLD_GLOBAL when that file exists.

nvcc adds the INCLUDES of the nvcc.profile beside it. Search orders follow GCC's manual
("Directory Options", "Environment Variables"): -I, then CPATH, then -isystem, then
CPLUS_INCLUDE_PATH; command-line -L, then LIBRARY_PATH. Paths only: nothing here runs a compiler.
Standard library only.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fidev.jit import compile_cache

CUDA_TARGET = "targets/x86_64-linux"  # where conda's CUDA 12 packages keep headers and libraries
DEFAULT_CUDA_HOME = "/usr/local/cuda"
DEFAULT_CUDA_LIB_PATH = "/usr/local/cuda/targets/x86_64-linux/lib/"
PRELOADED_RUNTIME = "libcudart.so.12"  # the file name FlashInfer 0.6.3's preload asks for
# What the smoke modules include from the toolkit: the runtime and driver APIs, cuBLASLt (norm.cu
# reaches it through FlashInfer's headers) and CCCL (libcu++).
HEADERS = ("cuda_runtime.h", "cuda.h", "cublasLt.h", "cuda/std/type_traits")
LIBRARIES = ("cudart", "cuda")  # FlashInfer links every module with -lcudart -lcuda


@dataclass(frozen=True)
class SearchDir:
    path: Path
    origin: str  # which flag or variable put it there, for messages


@dataclass(frozen=True)
class JitToolchain:
    cuda_home: Path
    cuda_home_from: str  # CUDA_HOME, CUDA_PATH, "nvcc on PATH" or "default"
    nvcc: Path  # what compiles .cu files
    nvcc_from: str  # FLASHINFER_NVCC or $cuda_home/bin/nvcc
    cxx_includes: tuple[SearchDir, ...]  # g++'s search order for <...> includes
    nvcc_includes: tuple[SearchDir, ...]
    link_dirs: tuple[SearchDir, ...]  # the linker's order for -lcudart -lcuda
    preload: Path  # the libcudart FlashInfer opens RTLD_GLOBAL, if it exists

    @property
    def profile(self) -> Path:
        return profile_of(self.nvcc)


def profile_of(nvcc: Path) -> Path:
    """nvcc reads nvcc.profile from the folder it was started from (a symlink is not followed)."""
    return nvcc.parent / "nvcc.profile"


def cuda_home(env: Mapping[str, str]) -> tuple[Path, str]:
    """FlashInfer's get_cuda_path(): note that an empty CUDA_HOME falls through to CUDA_PATH."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(name):
            return Path(env[name]), name
    nvcc = shutil.which("nvcc", path=env.get("PATH", ""))
    if nvcc:
        return Path(nvcc).parent.parent, "nvcc on PATH"
    return Path(DEFAULT_CUDA_HOME), "default"


def split_flags(value: str | None) -> list[str]:
    """FlashInfer's parse_env_flags(): shlex, or plain whitespace when shlex cannot parse it."""
    if not value:
        return []
    try:
        return shlex.split(value)
    except ValueError:
        return value.split()


def flag_dirs(tokens: list[str], options: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(option, dir) for each `-Xdir`, `-X dir` or `--long=dir` among tokens."""
    found, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        for option in options:
            if token == option and i + 1 < len(tokens):
                found.append((option, Path(tokens[i + 1])))
                i += 1
                break
            rest = token[len(option) :]
            if token.startswith(option) and rest:
                found.append((option, Path(rest[1:] if rest.startswith("=") else rest)))
                break
        i += 1
    return found


def _path_list(env: Mapping[str, str], name: str) -> list[SearchDir]:
    return [SearchDir(Path(p), name) for p in env.get(name, "").split(os.pathsep) if p]


def read_profile(profile: Path) -> dict[str, str]:
    """The variables of an nvcc.profile: `NAME = v`, `NAME += v` (append), `NAME =+ v`
    (prepend), with $(NAME) references and nvcc's built-ins _HERE_, _SPACE_, _TARGET_DIR_,
    _TARGET_SIZE_ as nvcc sets them on x86_64 Linux."""
    values = {"_HERE_": str(profile.parent), "_SPACE_": " ", "_TARGET_DIR_": CUDA_TARGET, "_TARGET_SIZE_": ""}

    def expand(text: str) -> str:
        return re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), os.environ.get(m.group(1), "")), text)

    for line in profile.read_text(errors="replace").splitlines():
        match = re.match(r"\s*(\w+)\s*(\+=|=\+|=)\s*(.*)$", line)
        if not match:
            continue
        name, op, value = match.group(1), match.group(2), expand(match.group(3).strip())
        old = values.get(name, "")
        values[name] = old + " " + value if op == "+=" else value + " " + old if op == "=+" else value
    return values


def profile_includes(profile: Path) -> tuple[list[SearchDir], list[SearchDir]]:
    """(-I dirs, -isystem dirs) nvcc adds from its profile: INCLUDES, and SYSTEM_INCLUDES, where
    CUDA 13's profile puts include/cccl."""
    if not profile.is_file():
        return [], []
    values = read_profile(profile)
    quoted = flag_dirs(split_flags(values.get("INCLUDES", "")), ("-I", "--include-path"))
    system = flag_dirs(split_flags(values.get("SYSTEM_INCLUDES", "")), ("-isystem",))
    return (
        [SearchDir(d, f"{profile} INCLUDES") for _, d in quoted],
        [SearchDir(d, f"{profile} SYSTEM_INCLUDES") for _, d in system],
    )


def from_env(env: Mapping[str, str]) -> JitToolchain:
    home, home_from = cuda_home(env)
    route = compile_cache.route(env.get(compile_cache.VARIABLE, ""))  # ccache and its settings, then nvcc
    nvcc = route.compiler or home / "bin" / "nvcc"
    if route.compiler is not None and "/" not in str(route.compiler):  # a bare name: ninja's shell finds it on PATH
        nvcc = Path(shutil.which(str(route.compiler), path=env.get("PATH", "")) or route.compiler)
    nvcc_from = compile_cache.VARIABLE if route.compiler else "$cuda_home/bin/nvcc"

    flashinfer_isystem = [
        SearchDir(home / "include", "-isystem $cuda_home/include"),
        SearchDir(home / "include" / "cccl", "-isystem $cuda_home/include/cccl"),
    ]
    if str(home) == "/usr":
        flashinfer_isystem = flashinfer_isystem[1:]

    def includes(extra_var: str, profile: tuple[list[SearchDir], list[SearchDir]]) -> tuple[SearchDir, ...]:
        extra = flag_dirs(split_flags(env.get(extra_var)), ("-isystem", "-idirafter", "-I", "--include-path"))
        quoted = [SearchDir(d, extra_var) for option, d in extra if option in ("-I", "--include-path")]
        system = [SearchDir(d, extra_var) for option, d in extra if option == "-isystem"]
        after = [SearchDir(d, extra_var) for option, d in extra if option == "-idirafter"]
        return tuple(
            quoted
            + profile[0]
            + _path_list(env, "CPATH")
            + flashinfer_isystem
            + system
            + profile[1]
            + _path_list(env, "CPLUS_INCLUDE_PATH")
            + after
        )

    links = [
        SearchDir(home / "lib64", "-L$cuda_home/lib64"),
        SearchDir(home / "lib64" / "stubs", "-L$cuda_home/lib64/stubs"),
    ]
    links += [
        SearchDir(d, "FLASHINFER_EXTRA_LDFLAGS")
        for _, d in flag_dirs(split_flags(env.get("FLASHINFER_EXTRA_LDFLAGS")), ("-L",))
    ]
    links += _path_list(env, "LIBRARY_PATH")
    preload = Path(env.get("CUDA_LIB_PATH") or DEFAULT_CUDA_LIB_PATH) / PRELOADED_RUNTIME
    return JitToolchain(
        home,
        home_from,
        nvcc,
        nvcc_from,
        includes("FLASHINFER_EXTRA_CFLAGS", ([], [])),
        includes("FLASHINFER_EXTRA_CUDAFLAGS", profile_includes(profile_of(nvcc))),
        tuple(links),
        preload,
    )


def find_header(name: str, dirs: tuple[SearchDir, ...]) -> SearchDir | None:
    """The first search dir that holds `name`, as the preprocessor would pick it."""
    return next((d for d in dirs if (d.path / name).is_file()), None)


def find_library(name: str, dirs: tuple[SearchDir, ...]) -> tuple[SearchDir, Path] | None:
    """The dir and file `-l<name>` resolves to: lib<name>.so, else lib<name>.a, per dir in order."""
    for d in dirs:
        for candidate in (d.path / f"lib{name}.so", d.path / f"lib{name}.a"):
            if candidate.exists():
                return d, candidate
    return None
