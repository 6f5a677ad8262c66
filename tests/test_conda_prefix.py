"""The conda-layout replica (tests/support/conda_prefix.py) built from a host toolkit is self-consistent:
whatever nvcc it carries finds the CCCL headers where the code it compiles looks for them."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import conda_prefix
from fidev.jit.jit_toolchain import CUDA_TARGET
from script_runs import CI_VENV

# What CUTLASS does at FlashInfer v0.6.3 (3rdparty/cutlass/include/cutlass/cutlass.h, its CCCL include choice):
# the CCCL path depends on the compiler's version.
CUTLASS_STYLE = """\
#if (__CUDACC_VER_MAJOR__ >= 13)
  #define CUDA_STD_HEADER(header) <cccl/cuda/std/header>
#else
  #define CUDA_STD_HEADER(header) <cuda/std/header>
#endif
#include CUDA_STD_HEADER(utility)
#include <cuda_runtime.h>
__global__ void k(int *x) { *x = cuda::std::move(*x); }
"""


def fake_toolkit(root: Path) -> Path:
    """A CUDA 13 runfile layout: CCCL nested in include/cccl."""
    for folder in ("bin", "nvvm/bin", f"{CUDA_TARGET}/include/cccl/cuda/std", f"{CUDA_TARGET}/lib/stubs"):
        (root / folder).mkdir(parents=True)
    (root / "bin/nvcc").write_text("")
    (root / f"{CUDA_TARGET}/include/cuda_runtime.h").write_text("")
    (root / f"{CUDA_TARGET}/include/cccl/cuda/std/utility").write_text("")
    (root / f"{CUDA_TARGET}/lib/libcudart.so.13").write_text("")
    (root / f"{CUDA_TARGET}/lib/stubs/libcuda.so").write_text("")
    return root


def test_cccl_is_where_both_compiler_generations_look(tmp_path):
    prefix = conda_prefix.build(tmp_path / "env", fake_toolkit(tmp_path / "cuda"))
    include = prefix / CUDA_TARGET / "include"
    assert (include / "cuda/std/utility").is_file(), "the 12.x place (conda's cuda-cccl 12.9)"
    assert (include / "cccl/cuda/std/utility").is_file(), "the 13.x place, where CUTLASS looks when nvcc is 13"


HOST_TOOLKIT = Path("/usr/local/cuda")


def missing_host_compilers() -> list[str]:
    """What the compile below needs and this host lacks: the host toolkit's nvcc (a path, not a
    PATH program) and g++. Skipped where missing, except in .ci/run's flashinfer-dev venv, which
    must run every test it can: there a missing one fails, naming it (as script_runs.missing_tools)."""
    missing = [
        what
        for what, there in (
            (str(HOST_TOOLKIT / "bin/nvcc"), (HOST_TOOLKIT / "bin/nvcc").is_file()),
            ("g++ on PATH", shutil.which("g++") is not None),
        )
        if not there
    ]
    if missing and os.environ.get(CI_VENV):
        pytest.fail(
            f"the CI host lacks {', '.join(missing)}: the replica's nvcc compiles a CUTLASS-style include with them",
            pytrace=False,
        )
    return missing


def test_a_cutlass_style_include_compiles_in_a_prefix_from_the_host_toolkit(tmp_path):
    missing = missing_host_compilers()
    if missing:
        pytest.skip(f"not on this host: {', '.join(missing)}")
    prefix = conda_prefix.build(tmp_path / "env", HOST_TOOLKIT)
    source = tmp_path / "k.cu"
    source.write_text(CUTLASS_STYLE)
    env = conda_prefix.environment(prefix, {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    done = subprocess.run(
        [str(prefix / "bin/nvcc"), "-c", str(source), "-o", str(tmp_path / "k.o")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
