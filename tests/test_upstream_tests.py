"""upstream-tests on the CPU: the family table, a tree without FlashInfer's tests/, the kernel
source mode applied before flashinfer is imported, and the compile plan with its budget. The
tree is a stand-in: a fake `flashinfer` that records what it saw when imported, and a conftest
that reports missing JIT modules the way FlashInfer 0.6.3's tests/conftest.py does under
FLASHINFER_DISABLE_JIT=1 (pytest_runtest_call, FLASHINFER_JIT_CACHE_REPORT_FILE)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from fidev import source_tree, upstream_suites
from fidev.failure import Failure
from fidev.manifest import ROOT, pins
from script_runs import two_line_failure

FAKE_FLASHINFER = """\
import importlib.util, json, os
class MissingJITCacheError(RuntimeError):
    def __init__(self, spec):
        super().__init__(spec["name"]); self.spec = spec
with open(os.environ["FAKE_RECORD"], "a") as f:  # what the jit-cache looked like when flashinfer was imported
    f.write(json.dumps({"jit_cache_visible": importlib.util.find_spec("flashinfer_jit_cache") is not None}) + "\\n")
def load(name, sources):
    if os.environ.get("FLASHINFER_DISABLE_JIT"):
        raise MissingJITCacheError({"name": name, "sources": sources})
"""
CONFTEST = """\
import json, os
import flashinfer
MISSING = set()
def pytest_runtest_call(item):
    try:
        item.runtest()
    except flashinfer.MissingJITCacheError as e:
        MISSING.add((item.name, e.spec["name"], str(e.spec)))
        raise
def pytest_terminal_summary(terminalreporter):
    report = os.environ.get("FLASHINFER_JIT_CACHE_REPORT_FILE")
    if report and MISSING:
        json.dump([{"test_name": t, "module_name": m, "spec_info": s} for t, m, s in MISSING], open(report, "w"))
"""
TEST_NORM = """\
import flashinfer
def test_norm():
    flashinfer.load("norm", ["norm.cu", "flashinfer_norm_binding.cu", "x.cu"])
"""


@pytest.fixture
def ws(tmp_path):
    """A workspace copy whose source tree has FlashInfer's test layout for every family."""
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
    (tests / "conftest.py").write_text(CONFTEST)
    (tests.parent / "pytest.ini").write_text("[pytest]\naddopts = --import-mode=importlib\n")
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer/__init__.py").write_text(FAKE_FLASHINFER)
    (site / "flashinfer_jit_cache").mkdir()
    (site / "flashinfer_jit_cache/__init__.py").write_text("")
    return root, tmp_path / "record.jsonl", {"PYTHONPATH": str(site), "FAKE_RECORD": str(tmp_path / "record.jsonl")}


def upstream(root, env, *args):
    return subprocess.run([sys.executable, str(root / "scripts/upstream_tests.py"), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


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


def test_a_source_release_without_tests_fails_in_two_lines(ws):
    root, _, env = ws
    tree = root / "extern/tracked/flashinfer"
    shutil.rmtree(tree / "tests")
    (tree / "tests").mkdir()
    (tree / "tests/test_artifacts.py").write_text("")  # what the PyPI release's tests/ holds
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    two_line_failure(upstream(root, env, "norm"), "the PyPI source release ships no test suite")


@pytest.mark.parametrize("mode, visible", [("vendored", False), ("prebuilt", True)])
def test_the_kernel_source_mode_is_applied_before_flashinfer_is_imported(ws, mode, visible):
    root, record, env = ws
    done = upstream(root, {**env, "FLASHINFER_DEV_KERNEL_SOURCE": mode}, "norm", "--no-plan")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"kernel source {mode}" in done.stdout.splitlines()[0]
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert seen and all(s["jit_cache_visible"] is visible for s in seen)


def test_the_plan_names_what_would_compile_and_holds_the_budget(ws):
    root, _, env = ws
    done = upstream(root, env, "norm", "--budget", "0")
    two_line_failure(done, "past the 0 min budget")
    assert "compiles 1 module(s) not built yet, 3 object(s)" in done.stdout and "  norm  (3 objects)" in done.stdout
    done = upstream(root, env, "norm", "--budget", "0", "--yes")
    assert done.returncode == 0 and "upstream-tests: 1 passed" in done.stdout, done.stdout + done.stderr


def test_nothing_named_is_refused(ws):
    root, _, env = ws
    two_line_failure(upstream(root, env), "no family or path was named")
