"""A stand-in of FlashInfer's test suite and JIT for upstream-tests' CPU tests (test_upstream_tests,
test_upstream_runs), written after FlashInfer's files at v0.6.3:
- its tests/conftest.py turns a CUDA out-of-memory RuntimeError into a skip, "Skipping due to
  OOM" (tests/conftest.py, `pytest_runtest_call` and `is_cuda_oom_error_str`; torch.cuda.OutOfMemoryError
  is one), and records missing JIT modules as FlashInfer's does (`pytest_runtest_call` turns
  MissingJITCacheError into a skip and keeps (nodeid, module, str(spec_info));
  `pytest_terminal_summary`: with FLASHINFER_JIT_CACHE_REPORT_FILE set, it
  appends one JSON object per line. FlashInfer holds a filelock while appending; one process
  writes here, so the stand-in does not);
- its pytest.ini is the repository root's (norecursedirs = test_helpers, addopts = --import-mode=importlib);
- tests/utils/test_activation.py has a module-scoped `warmup_jit` fixture that calls
  flashinfer.jit.build_jit_specs, autouse=not has_flashinfer_jit_cache() (flashinfer.utils, which
  re-exports flashinfer/jit/env.py's);
- the stand-in `flashinfer` builds each module with a real ninja and c++ in its own folder (where
  FAKE_HOLD="<module>:<file>", that module's compiles wait until the file exists: a compile the tests
  hold, as a slow module's), as
  JitSpec.build does (flashinfer/jit/core.py: FLASHINFER_DISABLE_JIT raises MissingJITCacheError;
  with need_lock=True it takes the module's FileLock; the ninja file is written when missing, then
  `ninja -C <jit dir>/<name>`, whose failure is cpp_ext.py run_ninja's RuntimeError("Ninja build
  failed. Ninja output: ...")), loads prebuilt modules
  when `aot_path` exists and otherwise builds and loads under the module's lock, `<jit dir>/tmp/<name>.lock`,
  with need_lock=False (`JitSpec.build_and_load`, its lines word for word, and `JitSpec.lock_path`; a loaded
  module is the str "aot" or "jit"), and its combined `build_jit_specs`
  only records that it was called. Every object compiled is logged, to count recompiles.
What it copies of FlashInfer's text is cited in tests/test_source_release_integration.py (STANDIN_COPIES),
which checks that the text is FlashInfer's at the pinned release and still the stand-in's.
"""

import os
import shutil

import pytest

from fidev.core.manifest import ROOT, pins
from fidev.tree import families as upstream_suites
from fidev.tree import release_reference, source_tree
from script_runs import BUILD_TOOLS, missing_tools, run

FAKE_FLASHINFER = """\
import functools, importlib.util, json, os
from flashinfer.jit import core
with open(os.environ["FAKE_RECORD"], "a") as f:  # what the jit-cache looked like when flashinfer was imported
    f.write(json.dumps({"jit_cache_visible": importlib.util.find_spec("flashinfer_jit_cache") is not None}) + "\\n")
def gen(name, n):
    return core.gen_jit_spec(name, n)
def load(name, n):
    return gen(name, n).build_and_load()
@functools.cache  # as flashinfer/prefill.py's get_batch_prefill_module: a module loads once a process
def get_module(name, n):
    module = load(name, n)
    module.strip()  # a function of it called, as the wrappers call module.plan (a loaded stand-in is a str)
    return module
def _inner_cache():  # as prefill.py's make_hashable_cache: a functools cache no module attribute names
    once = functools.cache(load)
    return lambda name, n: once(name, n)
get_inner = _inner_cache()
"""
FAKE_JIT_INIT = "from flashinfer.jit.core import JitSpec, MissingJITCacheError, build_jit_specs\n"
FAKE_JIT_ENV = """\
import importlib.util, os, pathlib
def has_flashinfer_jit_cache():  # env.py's: whether the jit-cache package can be found
    return importlib.util.find_spec("flashinfer_jit_cache") is not None
FLASHINFER_BASE_DIR = pathlib.Path(os.getenv("FLASHINFER_WORKSPACE_BASE", pathlib.Path.home().as_posix()))
FLASHINFER_WORKSPACE_DIR = FLASHINFER_BASE_DIR / ".cache" / "flashinfer" / "{version}" / "90"
FLASHINFER_JIT_DIR = FLASHINFER_WORKSPACE_DIR / "cached_ops"
FLASHINFER_AOT_DIR = pathlib.Path(os.environ["FAKE_AOT_DIR"])
"""
FAKE_JIT_CORE = """\
import json, os, subprocess
from contextlib import nullcontext
try:
    from filelock import FileLock
except ImportError:  # the default environment's replica has no filelock: one process takes no lock
    FileLock = lambda path, thread_local=True: nullcontext()
from flashinfer.jit import env as jit_env
class MissingJITCacheError(RuntimeError):
    def __init__(self, message, spec=None):
        self.spec = spec
        super().__init__(message)
def get_tmpdir():
    (jit_env.FLASHINFER_JIT_DIR / "tmp").mkdir(parents=True, exist_ok=True)
    return jit_env.FLASHINFER_JIT_DIR / "tmp"
class JitSpec:
    def __init__(self, name, n, plain=False):
        self.name, self.needs_device_linking = name, False
        self.extra_include_dirs = None  # a field of FlashInfer's JitSpec (flashinfer/jit/core.py)
        # generated sources, or (plain) the tree's csrc/ files, as the gen_jit_spec call of tests/utils/test_norm.py's
        # test_norm_compilation_without_fp8 names them
        gen = jit_env.FLASHINFER_CSRC_DIR / name if plain else jit_env.FLASHINFER_WORKSPACE_DIR / "generated" / name
        gen.mkdir(parents=True, exist_ok=True)
        self.sources = [gen / f"s{i}.cpp" for i in range(n)]
        for i, src in enumerate(self.sources):
            if not src.exists():
                src.write_text(f"int f{i}() {{ return {i}; }}\\n")
    build_dir = property(lambda self: jit_env.FLASHINFER_JIT_DIR / self.name)
    ninja_path = property(lambda self: self.build_dir / "build.ninja")
    jit_library_path = property(lambda self: self.build_dir / f"{self.name}.so")
    aot_path = property(lambda self: jit_env.FLASHINFER_AOT_DIR / self.name / f"{self.name}.so")
    is_aot = property(lambda self: self.aot_path.exists())
    def write_ninja(self):  # FlashInfer's rule names and resolved sources (flashinfer/jit/cpp_ext.py, \
generate_ninja_build_for_op)
        log = os.environ["FAKE_COMPILES"]
        held, _, release = os.environ.get("FAKE_HOLD", "").partition(":")  # the tests' "<module>:<file>"
        hold = f"while [ ! -e {release} ]; do sleep 0.05; done && " if held == self.name else ""
        rules = ("rule compile\\n  command = " + hold + "c++ -fPIC -MMD -MF $out.d -c $in -o $out && echo $out >> " \
+ log + "\\n  depfile = $out.d\\n  deps = gcc\\n"
                 "rule link\\n  command = c++ -shared $in -o $out\\n")
        objs = [self.build_dir / (s.stem + ".o") for s in self.sources]
        body = "".join(f"build {o}: compile {s.resolve()}\\n" for o, s in zip(objs, self.sources))
        text = rules + body + f"build {self.jit_library_path}: link {' '.join(map(str, objs))}\\n\
default {self.jit_library_path}\\n"
        self.build_dir.mkdir(parents=True, exist_ok=True)
        if not self.ninja_path.exists() or self.ninja_path.read_text() != text:
            self.ninja_path.write_text(text)
    def build(self, verbose, need_lock=True):
        if os.environ.get("FLASHINFER_DISABLE_JIT"):
            raise MissingJITCacheError("JIT compilation is disabled", spec=self)
        with FileLock(self.lock_path, thread_local=False) if need_lock else nullcontext():
            if not self.ninja_path.exists():
                self.write_ninja()
            done = subprocess.run(["ninja", "-C", str(self.build_dir), "-f", str(self.ninja_path)], \
capture_output=True, text=True)
            if done.returncode:  # cpp_ext.run_ninja's error
                raise RuntimeError("Ninja build failed." + (" Ninja output:\\n" + done.stdout + done.stderr \
if done.stdout + done.stderr else ""))
    lock_path = property(lambda self: get_tmpdir() / f"{self.name}.lock")
    def load(self, so_path):  # a loaded stand-in module is a str: where it was loaded from
        return "aot" if so_path == self.aot_path else "jit"
    def build_and_load(self):  # core.py's, word for word: build and load under the module's lock
        if self.is_aot:
            return self.load(self.aot_path)
        with FileLock(self.lock_path, thread_local=False):
            so_path = self.jit_library_path
            verbose = os.environ.get("FLASHINFER_JIT_VERBOSE", "0") == "1"
            self.build(verbose, need_lock=False)
            result = self.load(so_path)
        return result
class JitSpecRegistry:  # core.py's JitSpecRegistry: gen_jit_spec registers every spec it makes
    def __init__(self):
        self._specs = {}
    def register(self, spec):
        self._specs.setdefault(spec.name, spec)
jit_spec_registry = JitSpecRegistry()
def gen_jit_spec(name, n, plain=False):
    spec = JitSpec(name, n, plain)
    jit_spec_registry.register(spec)
    return spec
def build_jit_specs(specs, verbose=False, skip_prebuilt=True):
    with open(os.environ["FAKE_RECORD"], "a") as f:  # the combined build must never run
        f.write(json.dumps({"combined_build": [s.name for s in specs]}) + "\\n")
"""
CONFTEST = """\
import json, os
import pytest
import flashinfer
from flashinfer.jit import MissingJITCacheError
_MISSING_JIT_CACHE_MODULES = set()
_JIT_CACHE_REPORT_FILE = os.environ.get("FLASHINFER_JIT_CACHE_REPORT_FILE", None)
@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        yield
    except RuntimeError as e:
        if "CUDA" in str(e) and "out of memory" in str(e):  # conftest.py's is_cuda_oom_error_str
            pytest.skip("Skipping due to OOM")
        elif isinstance(e, MissingJITCacheError):
            spec = e.spec
            module_name = spec.name if spec else "unknown"
            spec_info = None
            if spec:
                spec_info = {"name": spec.name, "sources": [str(s) for s in spec.sources],
                             "needs_device_linking": spec.needs_device_linking, "aot_path": str(spec.aot_path)}
            _MISSING_JIT_CACHE_MODULES.add((item.nodeid, module_name, str(spec_info)))
            pytest.skip(f"Skipping due to missing JIT cache for module: {module_name}")
        else:
            raise
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _MISSING_JIT_CACHE_MODULES:
        return
    if _JIT_CACHE_REPORT_FILE:
        data = [{"test_name": t, "module_name": m, "spec_info": s} for t, m, s in _MISSING_JIT_CACHE_MODULES]
        with open(_JIT_CACHE_REPORT_FILE, "a") as f:
            for entry in data:
                f.write(json.dumps(entry) + "\\n")
"""
TEST_NORM = """\
import flashinfer
def test_norm():
    assert flashinfer.load("norm", 3) == "jit"
def test_gemma_norm():
    assert flashinfer.load("norm", 3) == "jit"
"""
TEST_ACTIVATION = """\
import pytest
import flashinfer
from flashinfer.utils import has_flashinfer_jit_cache
@pytest.fixture(autouse=not has_flashinfer_jit_cache(), scope="module")
def warmup_jit():
    flashinfer.jit.build_jit_specs([flashinfer.gen("silu_and_mul", 1), flashinfer.gen("gelu_and_mul", 1)], \
verbose=False)
    yield
def test_silu():
    flashinfer.load("silu_and_mul", 1)
"""
PYTEST_INI = "[pytest]\nnorecursedirs = test_helpers\naddopts = --import-mode=importlib\n"


@pytest.fixture(name="ws")
def standin_ws(tmp_path):
    """A workspace copy whose source tree has FlashInfer's test layout for every family, and the
    environment that puts the stand-in flashinfer first."""
    root = tmp_path / "ws"
    for d in ("scripts", "tools"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    tests = root / "extern/tracked/flashinfer/tests"
    for family in upstream_suites.FAMILIES:
        for node in family.nodes:
            path = tests / node.split("::")[0]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("def test_placeholder():\n    pass\n")
    (tests / "utils/test_norm.py").write_text(TEST_NORM)
    (tests / "utils/test_activation.py").write_text(TEST_ACTIVATION)
    (tests / "conftest.py").write_text(CONFTEST)
    (tests.parent / "pytest.ini").write_text(PYTEST_INI)
    # the pinned source release as fetch_flashinfer_source.py leaves it: its marker and its files'
    # record, the reference the default kernel source mode (auto) tells edits by
    (tests.parent / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    release_reference.record_release(tests.parent)
    site = tmp_path / "site"
    (site / "flashinfer/jit").mkdir(parents=True)
    (site / "flashinfer/__init__.py").write_text(FAKE_FLASHINFER)
    (site / "flashinfer/jit/__init__.py").write_text(FAKE_JIT_INIT)
    (site / "flashinfer/jit/env.py").write_text(FAKE_JIT_ENV.replace("{version}", pins().flashinfer))
    (site / "flashinfer/jit/core.py").write_text(FAKE_JIT_CORE)
    (site / "flashinfer/utils.py").write_text(
        "from flashinfer.jit.env import has_flashinfer_jit_cache  # noqa: F401 (utils.py's import)\n"
    )
    (site / "flashinfer_jit_cache").mkdir()
    (site / "flashinfer_jit_cache/__init__.py").write_text("")
    env = {
        "PYTHONPATH": str(site),
        "FAKE_RECORD": str(tmp_path / "record.jsonl"),
        "FAKE_COMPILES": str(tmp_path / "compiles.log"),
        "FAKE_AOT_DIR": str(tmp_path / "aot"),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base"),
    }
    return root, tmp_path / "record.jsonl", env


def upstream(root, env, *args):
    return run("upstream_tests.py", *args, env=env, timeout=300, root=root)


def compiles(env):
    log = env["FAKE_COMPILES"]
    return open(log).read().splitlines() if os.path.exists(log) else []


needs_a_build = pytest.mark.skipif(
    bool(missing_tools(*BUILD_TOOLS, why="the stand-in's modules build with ninja")),
    reason="needs ninja and a C++ compiler",
)
