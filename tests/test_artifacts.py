"""artifacts: modules, exported TVM-FFI functions and needed libraries of folders, wheels and the
installed jit-cache, read from small ELF objects gcc builds here; and --pin's Cargo.toml blocks."""

import hashlib
import json
import shutil
import subprocess
import zipfile

import pytest
from script_runs import require, run, two_line_failure

from fidev.manifest import pins, tomllib

require("elftools", why="artifacts reads ELF files with pyelftools (a flashinfer-dev dependency)")

JIT_CACHE_WHEEL = f"flashinfer_jit_cache-{pins().jit_cache}-cp39-abi3-manylinux_2_28_x86_64.whl"
OTHER_CUDA = "cu999"  # a CUDA key the pinned jit-cache is not built for
NORM_EXPORTS = ["__tvm_ffi_gemma_rmsnorm", "__tvm_ffi_rmsnorm"]

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


@pytest.fixture(scope="module")
def norm_so(tmp_path_factory):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the ELF fixtures")
    tmp = tmp_path_factory.mktemp("elf")
    (tmp / "dep.c").write_text("int __tvm_ffi_from_dependency(void) { return 2; }\n")
    (tmp / "module.c").write_text(MODULE_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", tmp / "libdep.so", tmp / "dep.c"], check=True, timeout=60)
    out = tmp / "norm.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", out, tmp / "module.c", "-Wl,--no-as-needed", f"-L{tmp}", "-ldep", "-lm"],
                   check=True, timeout=60)
    return out


@pytest.fixture
def jit_dir(tmp_path, norm_so):
    """A folder laid out like FlashInfer's JIT cache, with one thing that is not a module."""
    for uri in ("norm", "gdn_prefill_sm90"):
        (tmp_path / "cached_ops" / uri).mkdir(parents=True)
        shutil.copy(norm_so, tmp_path / "cached_ops" / uri / f"{uri}.so")
    (tmp_path / "cached_ops" / "norm" / "helper.so").write_bytes(norm_so.read_bytes())  # not <uri>/<uri>.so
    return tmp_path / "cached_ops"


def make_wheel(path, norm_so, modules=("norm", "gdn_prefill_sm90")):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        whl.writestr("flashinfer_jit_cache/__init__.py", "")
        for uri in modules:
            whl.write(norm_so, f"flashinfer_jit_cache/jit_cache/{uri}/{uri}.so")
    return path


def as_json(done):
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_folder_lists_modules_with_exports_and_needed_libraries(jit_dir):
    [report] = as_json(run("artifacts.py", jit_dir, "--json"))
    assert report["source"]["kind"] == "folder"
    modules = {m["uri"]: m for m in report["modules"]}
    assert sorted(modules) == ["gdn_prefill_sm90", "norm"]  # helper.so is not a module
    norm = modules["norm"]
    assert norm["path"] == "norm/norm.so"
    assert norm["exports"] == NORM_EXPORTS  # not hidden, static, data or imported symbols
    assert norm["needed"][:2] == ["libdep.so", "libm.so.6"] and "libc.so.6" in norm["needed"]  # link order
    assert norm["machine"] and norm["size"] > 0


def test_human_output_names_path_exports_and_needs(jit_dir):
    done = run("artifacts.py", jit_dir, "--match", "norm")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "1 module matching 'norm'" in lines[0]
    assert lines[1].startswith("norm/norm.so")
    assert [line.split()[1] for line in lines if line.strip().startswith("export")] == NORM_EXPORTS
    assert "libm.so.6" in next(line for line in lines if line.strip().startswith("needs"))


def test_wheel_lists_member_paths_and_filters(tmp_path, norm_so):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    [report] = as_json(run("artifacts.py", wheel, "--json", "--match", "gdn_*"))
    assert report["source"] == {"kind": "wheel", "path": str(wheel), "version": pins().jit_cache}
    [module] = report["modules"]
    assert module["path"] == "flashinfer_jit_cache/jit_cache/gdn_prefill_sm90/gdn_prefill_sm90.so"
    assert module["exports"] == NORM_EXPORTS and "libm.so.6" in module["needed"]


def test_installed_jit_cache_is_the_default_source(tmp_path, norm_so):
    site = tmp_path / "site"
    make_wheel(tmp_path / "w.whl", norm_so, modules=("norm",))
    zipfile.ZipFile(tmp_path / "w.whl").extractall(site)
    dist = site / f"flashinfer_jit_cache-{pins().jit_cache}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-jit-cache\nVersion: {pins().jit_cache}\n")
    done = run("artifacts.py", env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    assert f"installed flashinfer-jit-cache {pins().jit_cache}" in done.stdout
    assert "flashinfer_jit_cache/jit_cache/norm/norm.so" in done.stdout


def test_no_jit_cache_installed_fails_in_two_lines():
    two_line_failure(run("artifacts.py", flags=["-S"]), "flashinfer-jit-cache is not installed")


def test_missing_pyelftools_fails_in_two_lines(jit_dir):
    two_line_failure(run("artifacts.py", jit_dir, flags=["-S"]), "pyelftools is not installed")


def test_a_module_that_is_not_elf_fails_in_two_lines(tmp_path):
    (tmp_path / "norm").mkdir()
    (tmp_path / "norm" / "norm.so").write_text("not an ELF file")
    two_line_failure(run("artifacts.py", tmp_path), "is not a readable ELF shared object")


def test_nothing_matching_fails_in_two_lines(jit_dir):
    two_line_failure(run("artifacts.py", jit_dir, "--match", "batch_decode"), "no module matches 'batch_decode'")


def test_a_wheel_that_is_not_a_zip_fails_in_two_lines(tmp_path):
    (tmp_path / JIT_CACHE_WHEEL).write_text("truncated")
    two_line_failure(run("artifacts.py", tmp_path / JIT_CACHE_WHEEL), "is not a readable wheel")


# ---------------------------------------------------------------- --pin


def pinned(done):
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)["package"]["metadata"]["flashinfer_rs"]["pinned_wheels"]


def test_pin_prints_the_cargo_metadata_block(tmp_path, norm_so):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    url = f"https://example.invalid/v{pins().flashinfer}/{JIT_CACHE_WHEEL}"
    table = pinned(run("artifacts.py", "--pin", wheel, "--url", url))
    assert table == {"flashinfer_jit_cache": {pins().cuda_tag: {"x86_64": {
        "filename": JIT_CACHE_WHEEL, "url": url, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}}}}


def test_pin_of_a_pure_wheel_serves_every_arch_under_the_manifest_cuda(tmp_path):
    wheel = tmp_path / "apache_tvm_ffi-0.1.7-py3-none-any.whl"
    wheel.write_bytes(b"PK fixture")
    table = pinned(run("artifacts.py", "--pin", wheel, "--url", "https://example.invalid/x.whl"))
    assert set(table["apache_tvm_ffi"][pins().cuda_tag]) == {"x86_64", "aarch64"}
    assert set(pinned(run("artifacts.py", "--pin", wheel, "--url", "u", "--cuda", OTHER_CUDA))["apache_tvm_ffi"]) == {OTHER_CUDA}


def test_pin_refuses_a_cuda_key_the_wheel_is_not_built_for(tmp_path, norm_so):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    two_line_failure(run("artifacts.py", "--pin", wheel, "--url", "u", "--cuda", OTHER_CUDA), f"is built for {pins().cuda_tag}, not {OTHER_CUDA}")


def test_pin_needs_wheel_files(tmp_path):
    two_line_failure(run("artifacts.py", "--pin"), "--pin needs the wheel files")
    two_line_failure(run("artifacts.py", "--pin", tmp_path), "is not one")


@pytest.mark.parametrize("style", ["html", "json"])
def test_pin_takes_the_url_from_the_index_and_checks_its_sha256(tmp_path, norm_so, index_server, style):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    download = f"{index_server.url}/releases/v{pins().flashinfer}/{JIT_CACHE_WHEEL}"
    index_server.publish("flashinfer-jit-cache", [(JIT_CACHE_WHEEL, download, sha)], style)
    table = pinned(run("artifacts.py", "--pin", wheel, "--index", f"{index_server.url}/simple"))
    assert table["flashinfer_jit_cache"][pins().cuda_tag]["x86_64"] == {"filename": JIT_CACHE_WHEEL, "url": download, "sha256": sha}


def test_pin_refuses_a_file_that_is_not_the_published_wheel(tmp_path, norm_so, index_server):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    index_server.publish("flashinfer-jit-cache", [(JIT_CACHE_WHEEL, f"{index_server.url}/x.whl", "0" * 64)], "html")
    two_line_failure(run("artifacts.py", "--pin", wheel, "--index", f"{index_server.url}/simple"), "the index publishes sha256 " + "0" * 64)


def test_pin_says_when_the_index_lacks_the_wheel(tmp_path, norm_so, index_server):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    index_server.publish("flashinfer-jit-cache", [], "html")
    two_line_failure(run("artifacts.py", "--pin", wheel, "--index", f"{index_server.url}/simple"), f"does not list {JIT_CACHE_WHEEL}")


def test_pin_says_when_the_index_is_unreachable(tmp_path, norm_so, index_server):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    two_line_failure(run("artifacts.py", "--pin", wheel, "--index", f"{index_server.url}/missing"), "cannot read the index page")
