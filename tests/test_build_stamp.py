"""A repeated `build` knows its modules are current without importing torch or FlashInfer
(fidev.builds.build_stamp), rebuilds an edited header's objects by ninja alone, and takes the full path
(with the import) whenever something that decides the modules' build files changed."""

import os
import shutil
import subprocess
import sys

import pytest

from fidev.builds import build_stamp
from fidev.core import workspace
from fidev.core.manifest import ROOT, pins
from fidev.jit import kernel_source
from script_runs import BUILD_TOOLS, require, require_tools

require_tools(*BUILD_TOOLS, why="these tests build real ninja modules")

# A flashinfer that must never be imported: the fast path's promise.
TRAP = "raise ImportError('the fast path imported flashinfer')\n"


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A FlashInfer tree (one Python file), a module built the way FlashInfer lays one out (a
    build.ninja compiling a source that includes a header, linked into <name>.so), the stamp the
    last build wrote, and the environment build.py runs in."""
    tree = tmp_path / "tree"
    (tree / "flashinfer/jit").mkdir(parents=True)
    (tree / "flashinfer/jit/norm.py").write_text("# generator\n")
    (tree / "include").mkdir()
    (tree / "include/norm.cuh").write_text("constexpr int K = 1;\n")
    jit = tmp_path / "base/.cache/flashinfer" / pins().flashinfer / "90a/cached_ops/norm"
    jit.mkdir(parents=True)
    (jit / "norm.cpp").write_text(f'#include "{tree}/include/norm.cuh"\nint f() {{ return K; }}\n')
    (jit / "build.ninja").write_text(
        "rule cxx\n  command = c++ -fPIC -MMD -MF $out.d -c $in -o $out\n  depfile = $out.d\n  deps = gcc\n"
        "rule link\n  command = c++ -shared $in -o $out\n"
        f"build {jit}/norm.o: cxx {jit}/norm.cpp\nbuild {jit}/norm.so: link {jit}/norm.o\ndefault {jit}/norm.so\n"
    )
    subprocess.run(["ninja", "-C", str(jit)], check=True, capture_output=True)
    trap = tmp_path / "trap"
    (trap / "flashinfer").mkdir(parents=True)
    (trap / "flashinfer/__init__.py").write_text(TRAP)
    env = {
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base"),
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
        "PYTHONPATH": str(trap),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    options = {"wide": False, "abi": False}
    stamp = build_stamp.fingerprint(options, tree, kernel_source.mode())
    build_stamp.write(
        workspace.read(pins().flashinfer), options, stamp, [build_stamp.Module("norm", "norm", jit, [jit / "norm.cpp"])]
    )
    return tree, jit, env


def run_build(tree, env, *args):
    """build.py with the manifest's source dir pointed at `tree` (a workspace copy's pyproject.toml)."""
    root = tree.parent / "ws"
    if not root.exists():
        shutil.copytree(ROOT / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
        text = (
            (ROOT / "pyproject.toml")
            .read_text()
            .replace('source-dir = "extern/tracked/flashinfer"', f'source-dir = "{tree}"')
        )
        (root / "pyproject.toml").write_text(text)
    return subprocess.run(
        [sys.executable, str(root / "scripts/build.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_a_repeated_build_is_current_without_importing_flashinfer(ws):
    tree, _, env = ws
    done = run_build(tree, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 modules current" in done.stdout and "flashinfer was not imported" in done.stdout


def test_an_edited_header_rebuilds_by_ninja_alone(ws):
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, jit, env = ws
    before = (jit / "norm.o").stat().st_mtime_ns
    (tree / "include/norm.cuh").write_text("constexpr int K = 2;  // an edit\n")
    done = run_build(tree, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "norm to rebuild" in done.stdout and (jit / "norm.o").stat().st_mtime_ns != before
    assert "1 modules current" in run_build(tree, env).stdout


@pytest.mark.parametrize("change", ["generator", "environment", "mode", "options", "build files"])
def test_anything_that_decides_the_build_files_takes_the_full_path(ws, change):
    tree, jit, env = ws
    if change == "generator":
        (tree / "flashinfer/jit/norm.py").write_text("# an edited generator\n")
    elif change == "environment":
        env = {**env, "FLASHINFER_EXTRA_CFLAGS": "-DX"}
    elif change == "mode":
        env = {**env, "FLASHINFER_DEV_KERNEL_SOURCE": "vendored"}
    elif change == "build files":
        (jit / "build.ninja").unlink()
    done = run_build(tree, env, *(["--wide"] if change == "options" else []))
    # the full path imports flashinfer: here, the trap
    assert done.returncode == 1 and "import flashinfer failed" in done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '{"fingerprint": "x", "modules": {"norm": 1}}',
        '{"fingerprint": "x", "modules": [{"key": 1}]}',
        '{"fingerprint": "x", "modules": [["norm"]]}',
    ],
)
def test_a_stamp_of_another_shape_is_unreadable_and_never_a_traceback(ws, text):
    """Valid JSON that is no stamp (a list for a dict, a module of the wrong fields) is read as no
    stamp (the full build) and named by unreadable_stamps, as a truncated one is."""
    ws_ = workspace.read(pins().flashinfer)
    options = {"wide": False, "abi": False}
    build_stamp.path(ws_, options).write_text(text)
    assert build_stamp.load(ws_, options, "x") is None
    assert build_stamp.unreadable_stamps(ws_) == [build_stamp.path(ws_, options)]
    assert build_stamp.stamped_modules(ws_) == []
