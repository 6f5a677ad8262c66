"""artifacts: modules, exported TVM-FFI functions and needed libraries of folders, wheels and the
installed jit-cache, read from small ELF objects gcc builds here."""

import json
import os
import shutil
import zipfile

import pytest

from fidev.core.manifest import pins
from module_fixtures import JIT_CACHE_WHEEL, make_wheel
from script_runs import require, run, two_line_failure

require("elftools", why="artifacts reads ELF files with pyelftools (a flashinfer-dev dependency)")

NORM_EXPORTS = ["__tvm_ffi_gemma_rmsnorm", "__tvm_ffi_rmsnorm"]


@pytest.fixture
def jit_dir(tmp_path, norm_so):
    """A folder laid out like FlashInfer's JIT cache, with one thing that is not a module."""
    for uri in ("norm", "gdn_prefill_sm90"):
        (tmp_path / "cached_ops" / uri).mkdir(parents=True)
        shutil.copy(norm_so, tmp_path / "cached_ops" / uri / f"{uri}.so")
    (tmp_path / "cached_ops" / "norm" / "helper.so").write_bytes(norm_so.read_bytes())  # not <uri>/<uri>.so
    return tmp_path / "cached_ops"


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


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda so: os.mkfifo(so), "is a named pipe (FIFO), not a regular file"),  # opening it would wait forever
        (lambda so: os.symlink(so.name, so), "cannot be reached (Too many levels of symbolic links)"),
        (lambda so: so.mkdir(), "is a folder"),
    ],
    ids=["fifo", "symlink-loop", "folder"],
)
def test_a_module_path_in_a_folder_that_is_no_regular_file_fails_in_two_lines(tmp_path, make, what):
    (tmp_path / "norm").mkdir()
    make(tmp_path / "norm" / "norm.so")
    two_line_failure(run("artifacts.py", tmp_path, timeout=30), f"{tmp_path / 'norm' / 'norm.so'} {what}")


def test_a_wheel_member_that_unpacks_past_the_free_space_is_refused_before_it_is_unpacked(
    tmp_path, norm_so, monkeypatch
):
    """A member whose declared size is more than the temporary folder has free (a zip bomb's, or a disk nearly
    full): two lines naming the member and the room, before a byte is unpacked, not a disk filled."""
    from types import SimpleNamespace

    from fidev.bindings import jit_modules
    from fidev.core.failure import Failure

    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so, modules=("norm",))
    monkeypatch.setattr(jit_modules.shutil, "disk_usage", lambda folder: SimpleNamespace(free=10))
    unpacked = []
    monkeypatch.setattr(jit_modules.shutil, "copyfileobj", lambda *args: unpacked.append(args))
    with pytest.raises(
        Failure,
        match=r"its member flashinfer_jit_cache/jit_cache/norm/norm.so unpacks to \d+ bytes, more than the 10 free",
    ):
        list(jit_modules._wheel_modules(wheel, None))
    assert unpacked == []
