"""Fixture modules for the artifacts and pin tests: an ELF shared object that exports TVM-FFI
functions the way a FlashInfer module does (gcc builds it; see `norm_so` in conftest.py), and
wheels laid out like flashinfer-jit-cache's."""

import shutil
import subprocess
import zipfile

import pytest

from fidev.core.manifest import pins
from script_runs import missing_tools

JIT_CACHE_WHEEL = f"flashinfer_jit_cache-{pins().jit_cache}-cp39-abi3-manylinux_2_28_x86_64.whl"
OTHER_CUDA = "cu999"  # a CUDA key the pinned jit-cache is not built for

# What a TVM-FFI module looks like to the dynamic linker, plus what must not count as an export.
MODULE_C = r"""
#include <math.h>
int __tvm_ffi_rmsnorm(void *self, const void *args, int n, void *ret) { return 0; }
int __tvm_ffi_gemma_rmsnorm(void *self, const void *args, int n, void *ret) { return 0; }
__attribute__((visibility("hidden"))) int __tvm_ffi_hidden(void) { return 0; }
static int __tvm_ffi_static(void) { return 1; }
int __tvm_ffi_not_a_function = 3;
int __tvm_ffi_from_dependency(void);  /* defined in libdep.so: an import (FUNC, undefined) here */
int helper(void) { return __tvm_ffi_static() + __tvm_ffi_from_dependency(); }
double needs_libm(double x) { return cos(x); }
"""


def build_norm_so(tmp):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        missing_tools("cc", why="the ELF fixtures are built with a C compiler")  # fails in CI's flashinfer-dev venv
        pytest.skip("no C compiler (gcc or cc) to build the ELF fixtures")
    (tmp / "dep.c").write_text("int __tvm_ffi_from_dependency(void) { return 2; }\n")
    (tmp / "module.c").write_text(MODULE_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", tmp / "libdep.so", tmp / "dep.c"], check=True, timeout=60)
    out = tmp / "norm.so"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", "-o", out, tmp / "module.c", "-Wl,--no-as-needed", f"-L{tmp}", "-ldep", "-lm"],
        check=True,
        timeout=60,
    )
    return out


def make_wheel(path, norm_so, modules=("norm", "gdn_prefill_sm90")):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        whl.writestr("flashinfer_jit_cache/__init__.py", "")
        for uri in modules:
            whl.write(norm_so, f"flashinfer_jit_cache/jit_cache/{uri}/{uri}.so")
    return path
