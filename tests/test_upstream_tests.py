"""upstream-tests on the CPU: the family table, a tree without FlashInfer's runnable suite, the
kernel source mode applied before flashinfer is imported, the compile plan with its budget, and
that neither the plan nor the run compiles what is already built.

The tree is a stand-in, written after FlashInfer's files at v0.6.3:
- its tests/conftest.py turns a CUDA out-of-memory RuntimeError into a skip, "Skipping due to
  OOM" (tests/conftest.py, lines 136-147; torch.cuda.OutOfMemoryError is one), and records missing
  JIT modules as FlashInfer's does (lines 140-166: pytest_runtest_call turns MissingJITCacheError into a skip and keeps
  (nodeid, module, str(spec_info)); lines 170-191: with FLASHINFER_JIT_CACHE_REPORT_FILE set, it
  appends one JSON object per line. FlashInfer holds a filelock while appending; one process
  writes here, so the stand-in does not);
- its pytest.ini is the repository root's (norecursedirs = test_helpers, addopts = --import-mode=importlib);
- tests/utils/test_activation.py has a module-scoped `warmup_jit` fixture that calls
  flashinfer.jit.build_jit_specs (tests/utils/test_activation.py, lines 24-36);
- the stand-in `flashinfer` builds each module with a real ninja and c++ in its own folder, as
  JitSpec.build does (flashinfer/jit/core.py: FLASHINFER_DISABLE_JIT raises MissingJITCacheError,
  the ninja file is written when missing, then `ninja -C <jit dir>/<name>`), loads prebuilt modules
  when `aot_path` exists (JitSpec.build_and_load), and its combined `build_jit_specs` only records
  that it was called. Every object compiled is logged, to count recompiles."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from fidev import source_tree, upstream_suites
from fidev.failure import Failure
from fidev.manifest import ROOT, pins
from script_runs import require, two_line_failure

FAKE_FLASHINFER = """\
import importlib.util, json, os
from flashinfer.jit import core
with open(os.environ["FAKE_RECORD"], "a") as f:  # what the jit-cache looked like when flashinfer was imported
    f.write(json.dumps({"jit_cache_visible": importlib.util.find_spec("flashinfer_jit_cache") is not None}) + "\\n")
def gen(name, n):
    return core.JitSpec(name, n)
def load(name, n):
    return gen(name, n).build_and_load()
"""
FAKE_JIT_INIT = "from flashinfer.jit.core import JitSpec, MissingJITCacheError, build_jit_specs\n"
FAKE_JIT_ENV = """\
import os, pathlib
FLASHINFER_BASE_DIR = pathlib.Path(os.getenv("FLASHINFER_WORKSPACE_BASE", pathlib.Path.home().as_posix()))
FLASHINFER_WORKSPACE_DIR = FLASHINFER_BASE_DIR / ".cache" / "flashinfer" / "{version}" / "90"
FLASHINFER_JIT_DIR = FLASHINFER_WORKSPACE_DIR / "cached_ops"
FLASHINFER_AOT_DIR = pathlib.Path(os.environ["FAKE_AOT_DIR"])
"""
FAKE_JIT_CORE = """\
import json, os, subprocess
from flashinfer.jit import env as jit_env
class MissingJITCacheError(RuntimeError):
    def __init__(self, message, spec=None):
        self.spec = spec
        super().__init__(message)
def get_tmpdir():
    (jit_env.FLASHINFER_JIT_DIR / "tmp").mkdir(parents=True, exist_ok=True)
    return jit_env.FLASHINFER_JIT_DIR / "tmp"
class JitSpec:
    def __init__(self, name, n):
        self.name, self.needs_device_linking = name, False
        gen = jit_env.FLASHINFER_WORKSPACE_DIR / "generated" / name
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
    def write_ninja(self):
        log = os.environ["FAKE_COMPILES"]
        rules = ("rule cxx\\n  command = c++ -fPIC -MMD -MF $out.d -c $in -o $out && echo $out >> " + log + "\\n  depfile = $out.d\\n  deps = gcc\\n"
                 "rule link\\n  command = c++ -shared $in -o $out\\n")
        objs = [self.build_dir / (s.stem + ".o") for s in self.sources]
        body = "".join(f"build {o}: cxx {s}\\n" for o, s in zip(objs, self.sources))
        text = rules + body + f"build {self.jit_library_path}: link {' '.join(map(str, objs))}\\ndefault {self.jit_library_path}\\n"
        self.build_dir.mkdir(parents=True, exist_ok=True)
        if not self.ninja_path.exists() or self.ninja_path.read_text() != text:
            self.ninja_path.write_text(text)
    def build(self, verbose, need_lock=True):
        if os.environ.get("FLASHINFER_DISABLE_JIT"):
            raise MissingJITCacheError("JIT compilation is disabled", spec=self)
        if not self.ninja_path.exists():
            self.write_ninja()
        subprocess.run(["ninja", "-C", str(self.build_dir), "-f", str(self.ninja_path)], check=True, capture_output=True)
    def build_and_load(self):
        if self.is_aot:
            return "aot"
        self.build(False)
        return "jit"
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
        if "CUDA" in str(e) and "out of memory" in str(e):  # is_cuda_oom_error_str, lines 136-147
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
@pytest.fixture(autouse=True, scope="module")
def warmup_jit():
    flashinfer.jit.build_jit_specs([flashinfer.gen("silu_and_mul", 1), flashinfer.gen("gelu_and_mul", 1)], verbose=False)
    yield
def test_silu():
    flashinfer.load("silu_and_mul", 1)
"""
PYTEST_INI = "[pytest]\nnorecursedirs = test_helpers\naddopts = --import-mode=importlib\n"


@pytest.fixture
def ws(tmp_path):
    """A workspace copy whose source tree has FlashInfer's test layout for every family, and the
    environment that puts the stand-in flashinfer first."""
    root = tmp_path / "ws"
    shutil.copytree(ROOT / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
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
    site = tmp_path / "site"
    (site / "flashinfer/jit").mkdir(parents=True)
    (site / "flashinfer/__init__.py").write_text(FAKE_FLASHINFER)
    (site / "flashinfer/jit/__init__.py").write_text(FAKE_JIT_INIT)
    (site / "flashinfer/jit/env.py").write_text(FAKE_JIT_ENV.replace("{version}", pins().flashinfer))
    (site / "flashinfer/jit/core.py").write_text(FAKE_JIT_CORE)
    (site / "flashinfer_jit_cache").mkdir()
    (site / "flashinfer_jit_cache/__init__.py").write_text("")
    env = {"PYTHONPATH": str(site), "FAKE_RECORD": str(tmp_path / "record.jsonl"), "FAKE_COMPILES": str(tmp_path / "compiles.log"),
           "FAKE_AOT_DIR": str(tmp_path / "aot"), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base")}
    return root, tmp_path / "record.jsonl", env


def upstream(root, env, *args):
    return subprocess.run([sys.executable, str(root / "scripts/upstream_tests.py"), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def compiles(env):
    log = env["FAKE_COMPILES"]
    return open(log).read().splitlines() if os.path.exists(log) else []


needs_a_build = pytest.mark.skipif(not (shutil.which("ninja") and shutil.which("c++")), reason="needs ninja and a C++ compiler")


def test_every_family_names_existing_node_ids(ws):
    import upstream_tests

    root, _, _ = ws
    nodes = upstream_tests.resolve(["single_decode", "norm"], root / "extern/tracked/flashinfer/tests")
    assert nodes[0].endswith("tests/attention/test_logits_cap.py::test_single_decode_logits_soft_cap")
    assert nodes[-1].endswith("tests/utils/test_norm.py")
    with pytest.raises(Failure, match="neither a kernel family nor a path"):
        upstream_tests.resolve(["nrom"], root / "extern/tracked/flashinfer/tests")


def test_the_list_names_every_family():
    done = subprocess.run([sys.executable, str(ROOT / "scripts/upstream_tests.py"), "--list"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and all(f.name in done.stdout for f in upstream_suites.FAMILIES)
    assert {"norm", "activation", "sampling", "single_decode", "single_prefill", "decode", "prefill", "page", "rope", "gdn"} <= set(upstream_suites.BY_NAME)


def test_a_source_release_without_the_suite_fails_in_two_lines(ws):
    root, _, env = ws
    tree = root / "extern/tracked/flashinfer"
    shutil.rmtree(tree / "tests")
    (tree / "pytest.ini").unlink()
    (tree / "tests").mkdir()
    (tree / "tests/test_artifacts.py").write_text("")  # what the PyPI release's tests/ holds
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    done = upstream(root, env, "norm")
    two_line_failure(done, "no tests/conftest.py and no pytest.ini (the PyPI source release ships neither")
    assert "pytest.ini" in done.stderr.splitlines()[-1]


def test_a_suite_without_pytest_ini_fails_in_two_lines(ws):
    root, _, env = ws
    (root / "extern/tracked/flashinfer/pytest.ini").unlink()  # tests/ copied over, the root's pytest.ini not
    done = upstream(root, env, "norm", "--no-plan")
    two_line_failure(done, "has no runnable FlashInfer test suite: no pytest.ini")
    assert "Traceback" not in done.stdout + done.stderr


@needs_a_build
@pytest.mark.parametrize("mode, visible", [("vendored", False), ("prebuilt", True)])
def test_the_kernel_source_mode_is_applied_before_flashinfer_is_imported(ws, mode, visible):
    root, record, env = ws
    done = upstream(root, {**env, "FLASHINFER_DEV_KERNEL_SOURCE": mode}, "norm", "--no-plan")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"kernel source {mode}" in done.stdout.splitlines()[0]
    seen = [json.loads(line) for line in record.read_text().splitlines() if "jit_cache_visible" in line]
    assert seen and all(s["jit_cache_visible"] is visible for s in seen)


@needs_a_build
def test_the_plan_reads_flashinfers_report_compiles_nothing_and_holds_the_budget(ws):
    require("filelock", why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    root, record, env = ws
    done = upstream(root, env, "norm", "activation", "--budget", "0")
    two_line_failure(done, "past the 0 min budget")
    # norm from two tests' reports (two JSON lines), silu and gelu from the warmup fixture
    assert "needs 3 module(s); 3 to compile, 5 object(s)" in done.stdout, done.stdout
    assert "  norm  (3 objects)" in done.stdout and "  gelu_and_mul  (1 object)" in done.stdout
    assert compiles(env) == [], "the dry run compiled"
    done = upstream(root, env, "norm", "activation", "--budget", "0", "--yes")
    assert done.returncode == 0 and "upstream-tests: 3 passed" in done.stdout, done.stdout + done.stderr
    assert ": compiling norm (3 sources)" in done.stdout, "no live line when a test starts a compile"
    assert len(compiles(env)) == 5
    assert "combined_build" not in record.read_text(), "the warmup built through FlashInfer's combined ninja"
    # Built: a second plan has nothing to compile (so the budget holds), and the run recompiles nothing.
    done = upstream(root, env, "norm", "activation", "--budget", "0")
    assert done.returncode == 0 and "needs 3 module(s); 0 to compile, 0 object(s)" in done.stdout, done.stdout + done.stderr
    assert len(compiles(env)) == 5, "the plan or the run recompiled a module whose inputs did not change"


def test_a_slow_plan_is_dropped_and_the_run_goes_ahead(ws):
    root, _, env = ws
    tests = root / "extern/tracked/flashinfer/tests"
    (tests / "utils/test_slow.py").write_text("import time\ndef test_slow():\n    time.sleep(float(__import__('os').environ.get('SLOW_S', 0)))\n")
    # PLAN_LIMIT_S lowered to 1 s in a process of its own: the dry run (SLOW_S=5) runs past it
    code = ("import sys; sys.path.insert(0, 'scripts'); import upstream_tests; from fidev.failure import run_main; "
            "upstream_tests.PLAN_LIMIT_S = 1; sys.argv[0] = 'upstream_tests.py'; sys.exit(run_main(upstream_tests.main))")
    done = subprocess.run([sys.executable, "-c", code, "utils/test_slow.py", "--budget", "0"], cwd=root, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env, "SLOW_S": "5"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the plan's dry run took over 1 s: going ahead without it" in done.stdout
    assert "upstream-tests: 1 passed" in done.stdout


def test_nothing_named_is_refused(ws):
    root, _, env = ws
    two_line_failure(upstream(root, env), "no family or path was named")


@needs_a_build
def test_a_collection_error_is_counted_and_fails_the_task(ws):
    root, _, env = ws
    tests = root / "extern/tracked/flashinfer/tests"
    (tests / "utils/test_broken.py").write_text("import cutlass  # nvidia-cutlass-dsl, missing\n")  # as 6 files of v0.6.3 do
    done = upstream(root, env, "utils/test_broken.py", "utils/test_norm.py::test_norm", "--no-plan", "--continue-on-collection-errors")
    assert done.returncode != 0, done.stdout + done.stderr
    count = [line for line in done.stdout.splitlines() if line.startswith("upstream-tests: ") and " passed, " in line][-1]
    assert ", 1 errors;" in count, count
