"""The kernel source modes, per module (fidev.jit.module_choice): in `auto`, a module FlashInfer ships
prebuilt loads prebuilt until one of its inputs differs from the release (a header it includes, a
csrc/ source, the Python generator of its sources), and then compiles from the tree, alone; in
`vendored`, nothing loads prebuilt. Each case runs in its own process, as a task does: the mode
applied, then flashinfer imported.

The stand-in FlashInfer is the tree itself (installed editable), written after flashinfer/jit/core.py
at v0.6.3: `JitSpec.aot_path` is `FLASHINFER_AOT_DIR / name / f"{name}.so"` and `is_aot` is
`aot_path.exists()` (`JitSpec.aot_path`, `JitSpec.is_aot`); `gen_jit_spec` makes the spec and
registers it in the module's `jit_spec_registry` (`JitSpecRegistry.register`); with no jit-cache
package the AOT dir is the package's data/aot (flashinfer/jit/env.py, `_get_aot_dir`); the
activation generator renders its source into the JIT dir's generated/ from a string of
flashinfer/jit/activation.py (`silu_def_cu_str`), and the editable install links
flashinfer/data/csrc and include to the tree's."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from fidev.core.manifest import ROOT, pins
from fidev.tree import release_reference, source_tree
from script_runs import two_line_failure

CORE = """\
import pathlib
from flashinfer.jit import env as jit_env
class JitSpec:
    def __init__(self, name, sources, extra_include_dirs=None):
        self.name, self.sources, self.extra_include_dirs = name, sources, extra_include_dirs
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
BUILT = []
def build_jit_specs(specs, verbose=False, skip_prebuilt=True):  # core.py's build_jit_specs: one ninja for the \
specs not prebuilt
    BUILT.extend(spec.name for spec in specs if not (skip_prebuilt and spec.aot_path.exists()))
def gen_jit_spec(name, sources, extra_include_paths=None):
    spec = JitSpec(name=name, sources=[pathlib.Path(x) for x in sources],
                   extra_include_dirs=[pathlib.Path(x) for x in extra_include_paths] \
if extra_include_paths is not None else None)
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
    gen = jit_env.FLASHINFER_GEN_SRC_DIR
    gen.mkdir(parents=True, exist_ok=True)
    (gen / f"{act}_and_mul.cu").write_text("#include <flashinfer/activation.cuh>\\n" + silu_def_cu_str + "\\n")
    # a csrc/ file copied beside it, as the attention generators copy theirs
    (gen / "act_binding.cu").write_text((jit_env.FLASHINFER_CSRC_DIR / "act_binding.cu").read_text())
    return gen_jit_spec(f"{act}_and_mul", [gen / f"{act}_and_mul.cu", gen / "act_binding.cu"])
"""
QUANTIZATION = """\
from . import env as jit_env
from .core import gen_jit_spec
def gen_quantization_module():  # its headers found through its own include dir, as nv_internal's are
    return gen_jit_spec("quantization", [jit_env.FLASHINFER_CSRC_DIR / "quantization.cu"],
                        extra_include_paths=[jit_env.FLASHINFER_CSRC_DIR / "nv_internal"])
"""
WRAPPER = """\
from .jit.norm import gen_norm_module
def get_norm_module():  # an API wrapper above the generator, as flashinfer/norm.py's
    return gen_norm_module()
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
from fidev.jit import kernel_source, module_choice
from fidev.core.failure import run_main
def main():
    module_choice.apply(kernel_source.mode())
    from flashinfer.jit.activation import gen_act_and_mul_module
    from flashinfer.jit.quantization import gen_quantization_module
    from flashinfer.norm import get_norm_module
    from flashinfer.jit import core
    specs = [get_norm_module(), gen_act_and_mul_module("silu"), gen_quantization_module()]
    core.build_jit_specs(specs)  # FlashInfer's combined build (a test's warmup), which skips what it deems prebuilt
    print(json.dumps({"prebuilt": {s.name: s.is_aot for s in specs}, "built": core.BUILT, \
"report": module_choice.report("task")}))
sys.exit(run_main(main))
"""


ALL = ("norm", "silu_and_mul", "quantization")


def only(*compiled):
    """The driver's answer where the modules named compile from the tree and the rest load prebuilt."""
    return {name: name not in compiled for name in ALL}


@pytest.fixture
def ws(tmp_path):
    """A workspace copy whose manifest points at a stand-in tree, unpacked and recorded as the pinned
    release, with norm and silu_and_mul prebuilt in its data/aot."""
    tree = tmp_path / "tree"
    for rel, text in {
        "flashinfer/__init__.py": "",
        "flashinfer/jit/__init__.py": "",
        "flashinfer/jit/core.py": CORE,
        "flashinfer/jit/env.py": ENV,
        "flashinfer/jit/activation.py": ACTIVATION,
        "flashinfer/jit/norm.py": NORM,
        "flashinfer/jit/quantization.py": QUANTIZATION,
        "flashinfer/norm.py": WRAPPER,
        "csrc/act_binding.cu": "int bind();\n",
        "csrc/quantization.cu": '#include "tensorrt_llm/quant.cuh"\n',
        "csrc/nv_internal/tensorrt_llm/quant.cuh": "constexpr int Q = 1;\n",
        "include/flashinfer/norm.cuh": "constexpr float K = 1.0f;\n",
        "include/flashinfer/activation.cuh": '#include "flashinfer/math.cuh"\n',
        "include/flashinfer/math.cuh": "constexpr float E = 2.7f;\n",
        "include/flashinfer/pos_enc.cuh": "constexpr int R = 1;\n",
        "csrc/norm.cu": '#include "flashinfer/norm.cuh"\nint f();\n',
        "csrc/rope.cu": '#include "flashinfer/pos_enc.cuh"\n',
    }.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    release_reference.record_release(tree)
    data = tree / "flashinfer/data"
    data.mkdir()
    for name, target in (("csrc", "csrc"), ("include", "include")):  # the editable install's links
        (data / name).symlink_to(tree / target)
    for name in ALL:
        (data / "aot" / name).mkdir(parents=True)
        (data / "aot" / name / f"{name}.so").write_bytes(b"")
    root = tmp_path / "ws"
    shutil.copytree(ROOT / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    text = (
        (ROOT / "pyproject.toml")
        .read_text()
        .replace('source-dir = "extern/tracked/flashinfer"', f'source-dir = "{tree}"')
    )
    (root / "pyproject.toml").write_text(text)
    (root / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(tree), "FAKE_GEN_DIR": str(tmp_path / "generated")}
    env.pop("FLASHINFER_DEV_KERNEL_SOURCE", None)
    return tree, root, env


def task(root, env, **extra):
    return subprocess.run(
        [sys.executable, str(root / "driver.py"), str(root / "scripts")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, **extra},
    )


def chosen(done):
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def edit(path, old, new):
    path.write_text(path.read_text().replace(old, new))


def test_nothing_edited_loads_everything_prebuilt(ws):
    _, root, env = ws
    out = chosen(task(root, env))
    assert out["prebuilt"] == only()
    assert out["report"] == ["task: kernel source auto: 3 module(s) prebuilt, 0 compiled from the tree"]


@pytest.mark.parametrize(
    "rel, old, new, module",
    [
        ("include/flashinfer/norm.cuh", "1.0f", "1.005f", "norm"),  # a header norm's source includes
        (
            "flashinfer/jit/activation.py",
            "return val /",
            "return 1.01f * val /",
            "silu_and_mul",
        ),  # the generator of silu's source
        ("csrc/act_binding.cu", "bind", "bind2", "silu_and_mul"),  # a csrc/ file the generator copies into generated/
        (
            "csrc/nv_internal/tensorrt_llm/quant.cuh",
            "1",
            "2",
            "quantization",
        ),  # found through the module's own include dir
    ],
)
def test_an_edit_compiles_the_module_it_reaches_and_no_other(ws, rel, old, new, module):
    tree, root, env = ws
    edit(tree / rel, old, new)
    out = chosen(task(root, env))
    assert out["prebuilt"] == only(module) and out["built"] == [module]
    assert f"task: from edited source: {module} ({rel})" in out["report"]


def test_an_api_wrapper_above_the_generator_is_no_input(ws):
    """flashinfer/norm.py calls the generator in a test, not in build: what counts must not depend on the caller."""
    tree, root, env = ws
    edit(tree / "flashinfer/norm.py", "# an API wrapper", "# an API wrapper, edited")
    assert chosen(task(root, env))["prebuilt"] == only()


def test_a_header_included_through_another_reaches_the_generated_source(ws):
    tree, root, env = ws
    edit(
        tree / "include/flashinfer/math.cuh", "2.7f", "2.8f"
    )  # activation.cuh includes it; silu's generated source, activation.cuh
    assert chosen(task(root, env))["prebuilt"] == only("silu_and_mul")


def test_a_restored_copy_loads_prebuilt_again(ws, tmp_path):
    tree, root, env = ws
    header = tree / "include/flashinfer/norm.cuh"
    shutil.copy2(header, tmp_path / "norm.cuh.orig")
    edit(header, "1.0f", "1.005f")
    assert chosen(task(root, env))["prebuilt"] == only("norm")
    subprocess.run(["cp", "-p", str(tmp_path / "norm.cuh.orig"), str(header)], check=True)
    assert chosen(task(root, env))["prebuilt"] == only()


def test_vendored_loads_nothing_prebuilt_not_even_data_aot(ws):
    _, root, env = ws
    out = chosen(task(root, env, FLASHINFER_DEV_KERNEL_SOURCE="vendored"))
    assert out["prebuilt"] == only(*ALL)


def test_prebuilt_loads_what_ships_edited_or_not(ws):
    tree, root, env = ws
    edit(tree / "include/flashinfer/norm.cuh", "1.0f", "1.005f")
    out = chosen(task(root, env, FLASHINFER_DEV_KERNEL_SOURCE="prebuilt"))
    assert out["prebuilt"] == only() and out["report"] == []


def test_an_edit_no_module_of_the_run_compiles_is_two_lines_naming_the_families(ws):
    tree, root, env = ws
    edit(tree / "include/flashinfer/pos_enc.cuh", "1", "2")
    out = chosen(task(root, env))
    assert out["prebuilt"] == only()
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
    assert chosen(task(root, env))["prebuilt"] == only(*ALL)
