"""Fixtures of abi-smoke: FlashInfer modules loaded the way the Rust bindings load them, with
libtvm_ffi.so opened RTLD_GLOBAL first, then the module's .so through apache-tvm-ffi. FlashInfer is
imported only to find each module where its own loader would (jit-cache or JIT dir)."""

import ctypes
import importlib.util
from contextlib import nullcontext
from pathlib import Path

import pytest

from fidev.bindings import elf
from fidev.builds import module_builds, smoke_modules


@pytest.fixture(scope="session")
def tvm_ffi(gpu):
    """apache-tvm-ffi, after its libtvm_ffi.so was opened RTLD_GLOBAL (the crate's first step)."""
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None:
        pytest.skip("apache-tvm-ffi is not installed")
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib" / "libtvm_ffi.so"
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    import tvm_ffi

    return tvm_ffi


@pytest.fixture(scope="session")
def abi_module(tvm_ffi, fi):
    """abi_module(key, exports) -> (module, spec, source). Fails, naming the fix, when the module
    is not built; checks its ELF exports the `__tvm_ffi_<name>` of each function the test calls."""
    loaded = {}

    def load(key, exports):
        if key not in loaded:
            spec = smoke_modules.BY_KEY[key].make()
            # a build under way (affected's rebuild) holds the module's lock: waited for, as FlashInfer's loader does
            with nullcontext() if spec.is_aot else module_builds.held_while_loading(spec):
                loaded[key] = load_built(tvm_ffi, spec)
        module, spec, source, dynamic = loaded[key]
        missing = [name for name in exports if elf.TVM_FFI_PREFIX + name not in dynamic.exports]
        assert not missing, f"{spec.name}.so does not export {missing}; it exports {list(dynamic.exports)}"
        return module, spec, source

    return load


def load_built(tvm_ffi, spec):
    """(module, spec, source, its ELF's dynamic section); a library not built fails, naming the fix."""
    path = spec.get_library_path()
    if not path.is_file():
        pytest.fail(
            f"{spec.name}.so is not built ({path}): run `pixi run -e flashinfer-dev build-abi` "
            "(python scripts/build.py --abi)",
            pytrace=False,
        )
    with open(path, "rb") as f:
        dynamic = elf.read_dynamic(f, str(path))
    return tvm_ffi.load_module(str(path)), spec, "prebuilt" if spec.is_aot else "compiled", dynamic
