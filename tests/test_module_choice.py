"""The kernel source modes, per module (fidev.module_choice): in `auto`, a module FlashInfer ships
prebuilt loads prebuilt until one of its inputs differs from the release (a header it includes, a
csrc/ source, the Python generator of its sources), and then compiles from the tree, alone; in
`vendored`, nothing loads prebuilt. Each case runs in its own process, as a task does: the mode
applied, then flashinfer imported.

The stand-in FlashInfer is the tree itself (installed editable), written after flashinfer/jit/core.py
at v0.6.3: `JitSpec.aot_path` is `FLASHINFER_AOT_DIR / name / f"{name}.so"` and `is_aot` is
`aot_path.exists()` (lines 254-260); `gen_jit_spec` makes the spec and registers it in the module's
`jit_spec_registry` (lines 159-170, 213 and 482); with no jit-cache package the AOT dir is the
package's data/aot (flashinfer/jit/env.py, `_get_aot_dir`, lines 97-127); the activation generator
renders its source into the JIT dir's generated/ from a string of flashinfer/jit/activation.py
(`silu_def_cu_str`, line 79), and the editable install links flashinfer/data/csrc and include to
the tree's."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from fidev import release_reference, source_tree
from fidev.manifest import ROOT, pins
from script_runs import two_line_failure

CORE = """\
import pathlib
from flashinfer.jit import env as jit_env
class JitSpec:
    def __init__(self, name, sources):
        self.name, self.sources = name, [pathlib.Path(s) for s in sources]
    @property
    def aot_path(self):
        return jit_env.FLASHINFER_AOT_DIR / self.name / f"{self.name}.so"
    @property
    def is_aot(self):
        return self.aot_path.exists()
class JitSpecRegistry:
    def __init__(self):
        self._specs = {}
    def register(self, spec):
        if spec.name not in self._specs:
            self._specs[spec.name] = spec
jit_spec_registry = JitSpecRegistry()
def gen_jit_spec(name, sources):
    spec = JitSpec(name=name, sources=[pathlib.Path(x) for x in sources])
    jit_spec_registry.register(spec)
    return spec
"""
ENV = """\
import os, pathlib
_package_root = pathlib.Path(__file__).resolve().parents[1]
FLASHINFER_AOT_DIR = _package_root / "data" / "aot"
FLASHINFER_CSRC_DIR = _package_root / "data" / "csrc"
FLASHINFER_GEN_SRC_DIR = pathlib.Path(os.environ["FAKE_GEN_DIR"])
"""
ACTIVATION = """\
from . import env as jit_env
from .core import gen_jit_spec
silu_def_cu_str = "return val / (1.0f + __expf(-val));"
def gen_act_and_mul_module(act):
    path = jit_env.FLASHINFER_GEN_SRC_DIR / f"{act}_and_mul.cu"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#include <flashinfer/activation.cuh>\\n" + silu_def_cu_str + "\\n")
    return gen_jit_spec(f"{act}_and_mul", [path])
"""
NORM = """\
from . import env as jit_env
from .core import gen_jit_spec
def gen_norm_module():
    return gen_jit_spec("norm", [jit_env.FLASHINFER_CSRC_DIR / "norm.cu"])
"""
# A task's process: the mode applied before flashinfer is imported, then two modules asked for.
DRIVER = """\
import json, sys
sys.path.insert(0, sys.argv[1])
from fidev import kernel_source, module_choice
from fidev.failure import run_main
def main():
    kernel_source.apply()
    from flashinfer.jit.activation import gen_act_and_mul_module
    from flashinfer.jit.norm import gen_norm_module
    norm, silu = gen_norm_module(), gen_act_and_mul_module("silu")
    print(json.dumps({"prebuilt": {"norm": norm.is_aot, "silu_and_mul": silu.is_aot}, "report": module_choice.report("task")}))
sys.exit(run_main(main))
"""


@pytest.fixture
def ws(tmp_path):
    """A workspace copy whose manifest points at a stand-in tree, unpacked and recorded as the pinned
    release, with norm and silu_and_mul prebuilt in its data/aot."""
    tree = tmp_path / "tree"
    for rel, text in {"flashinfer/__init__.py": "", "flashinfer/jit/__init__.py": "", "flashinfer/jit/core.py": CORE,
                      "flashinfer/jit/env.py": ENV, "flashinfer/jit/activation.py": ACTIVATION, "flashinfer/jit/norm.py": NORM,
                      "include/flashinfer/norm.cuh": "constexpr float K = 1.0f;\n",
                      "include/flashinfer/activation.cuh": '#include "flashinfer/math.cuh"\n',
                      "include/flashinfer/math.cuh": "constexpr float E = 2.7f;\n",
                      "include/flashinfer/pos_enc.cuh": "constexpr int R = 1;\n",
                      "csrc/norm.cu": '#include "flashinfer/norm.cuh"\nint f();\n',
                      "csrc/rope.cu": '#include "flashinfer/pos_enc.cuh"\n'}.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    release_reference.record_release(tree)
    data = tree / "flashinfer/data"
    data.mkdir()
    for name, target in (("csrc", "csrc"), ("include", "include")):  # the editable install's links
        (data / name).symlink_to(tree / target)
    for name in ("norm", "silu_and_mul"):
        (data / "aot" / name).mkdir(parents=True)
        (data / "aot" / name / f"{name}.so").write_bytes(b"")
    root = tmp_path / "ws"
    shutil.copytree(ROOT / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    text = (ROOT / "pyproject.toml").read_text().replace('source-dir = "extern/tracked/flashinfer"', f'source-dir = "{tree}"')
    (root / "pyproject.toml").write_text(text)
    (root / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(tree), "FAKE_GEN_DIR": str(tmp_path / "generated")}
    env.pop("FLASHINFER_DEV_KERNEL_SOURCE", None)
    return tree, root, env


def task(root, env, **extra):
    return subprocess.run([sys.executable, str(root / "driver.py"), str(root / "scripts")], capture_output=True, text=True, timeout=60,
                          env={**env, **extra})


def chosen(done):
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def edit(path, old, new):
    path.write_text(path.read_text().replace(old, new))


def test_nothing_edited_loads_everything_prebuilt(ws):
    _, root, env = ws
    out = chosen(task(root, env))
    assert out["prebuilt"] == {"norm": True, "silu_and_mul": True}
    assert out["report"] == ["task: kernel source auto: 2 module(s) prebuilt, 0 compiled from the tree"]


@pytest.mark.parametrize("rel, old, new, module", [
    ("include/flashinfer/norm.cuh", "1.0f", "1.005f", "norm"),  # a header norm's source includes
    ("flashinfer/jit/activation.py", "return val /", "return 1.01f * val /", "silu_and_mul"),  # the generator of silu's source
])
def test_an_edit_compiles_the_module_it_reaches_and_no_other(ws, rel, old, new, module):
    tree, root, env = ws
    edit(tree / rel, old, new)
    out = chosen(task(root, env))
    assert out["prebuilt"] == {"norm": module != "norm", "silu_and_mul": module != "silu_and_mul"}
    assert f"task: from edited source: {module} ({rel})" in out["report"]


def test_a_header_included_through_another_reaches_the_generated_source(ws):
    tree, root, env = ws
    edit(tree / "include/flashinfer/math.cuh", "2.7f", "2.8f")  # activation.cuh includes it; silu's generated source, activation.cuh
    assert chosen(task(root, env))["prebuilt"] == {"norm": True, "silu_and_mul": False}


def test_a_restored_copy_loads_prebuilt_again(ws, tmp_path):
    tree, root, env = ws
    header = tree / "include/flashinfer/norm.cuh"
    shutil.copy2(header, tmp_path / "norm.cuh.orig")
    edit(header, "1.0f", "1.005f")
    assert chosen(task(root, env))["prebuilt"]["norm"] is False
    subprocess.run(["cp", "-p", str(tmp_path / "norm.cuh.orig"), str(header)], check=True)
    assert chosen(task(root, env))["prebuilt"] == {"norm": True, "silu_and_mul": True}


def test_vendored_loads_nothing_prebuilt_not_even_data_aot(ws):
    _, root, env = ws
    out = chosen(task(root, env, FLASHINFER_DEV_KERNEL_SOURCE="vendored"))
    assert out["prebuilt"] == {"norm": False, "silu_and_mul": False}


def test_prebuilt_loads_what_ships_edited_or_not(ws):
    tree, root, env = ws
    edit(tree / "include/flashinfer/norm.cuh", "1.0f", "1.005f")
    out = chosen(task(root, env, FLASHINFER_DEV_KERNEL_SOURCE="prebuilt"))
    assert out["prebuilt"] == {"norm": True, "silu_and_mul": True} and out["report"] == []


def test_an_edit_no_module_of_the_run_compiles_is_two_lines_naming_the_families(ws):
    tree, root, env = ws
    edit(tree / "include/flashinfer/pos_enc.cuh", "1", "2")
    out = chosen(task(root, env))
    assert out["prebuilt"] == {"norm": True, "silu_and_mul": True}
    assert out["report"][-2] == "task: edited, and compiled by no module of this run: include/flashinfer/pos_enc.cuh"
    assert out["report"][-1].startswith("task: fix: ")


def test_a_deleted_header_is_two_lines(ws):
    tree, root, env = ws
    (tree / "include/flashinfer/norm.cuh").unlink()
    two_line_failure(task(root, env), "include/flashinfer/norm.cuh of the FlashInfer release is deleted from")


def test_a_tree_with_no_release_to_tell_edits_by_is_two_lines(ws):
    tree, root, env = ws
    (tree / release_reference.RELEASE_FILES).unlink()
    two_line_failure(task(root, env), "the pinned release without its file record")
    # with nothing prebuilt to choose, there is nothing to tell: every module compiles from the tree
    shutil.rmtree(tree / "flashinfer/data/aot")
    assert chosen(task(root, env))["prebuilt"] == {"norm": False, "silu_and_mul": False}
