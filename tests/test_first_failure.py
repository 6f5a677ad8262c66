"""The first failing test ends `affected`'s run (fidev.affected.tests): smoke's first failure stops
FlashInfer's tests, FlashInfer's first failing case stops smoke's (and upstream-tests stops at it,
--stop-after 1); what did not run is no pass (its modules' verdicts are `unfinished`, so the next run
runs them again); --keep-going runs every selected test. And a run of a subset of a test file's
cases builds only what its cases load: FlashInfer's `warmup_jit` fixture builds nothing then."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fidev.affected import coverage, selection
from fidev.affected import tests as affected_tests
from fidev.core.manifest import ROOT, pins
from script_runs import require
from upstream_standin import compiles, needs_a_build, standin_ws, upstream  # noqa: F401 (standin_ws: the fixture `ws`)

THREE = """\
import os
def test_a():
    open(os.environ["RAN"], "a").write("a\\n")
def test_b():
    open(os.environ["RAN"], "a").write("b\\n")
    assert os.environ.get("FAIL_B") != "1"
def test_c():
    open(os.environ["RAN"], "a").write("c\\n")
"""


def ran_in_process(tmp_path, monkeypatch, stop=None, fail_b=False, first=()):
    """pytest.main over three tests in this process with run_ours' plugin: (status, plugin, the tests that ran)."""
    (tmp_path / "test_three.py").write_text(THREE)
    monkeypatch.setenv("RAN", str(tmp_path / "ran"))
    monkeypatch.setenv("FAIL_B", "1" if fail_b else "0")
    plugin = affected_tests.collector(stop)
    status = pytest.main([str(tmp_path / "test_three.py"), "-q", "-p", "no:cacheprovider", "--import-mode=importlib", *first], plugins=[plugin])
    ran = (tmp_path / "ran").read_text().split() if (tmp_path / "ran").is_file() else []
    return int(status), plugin, ran


def test_smokes_tests_stop_once_flashinfers_failed(tmp_path, monkeypatch):
    """stop() turns true after the first test (FlashInfer's run ended failing): no other test runs,
    the session ends as -x ends it (not as Ctrl-C), and the plugin says tests were left unrun."""
    calls = []
    status, plugin, ran = ran_in_process(tmp_path, monkeypatch, stop=lambda: calls.append(1) or len(calls) > 1)
    assert ran == ["a"] and plugin.stopped and not plugin.interrupted and plugin.ids == set()
    assert status == pytest.ExitCode.TESTS_FAILED


def test_smokes_first_failure_ends_them_and_without_stop_all_run(tmp_path, monkeypatch):
    status, plugin, ran = ran_in_process(tmp_path, monkeypatch, stop=lambda: False, fail_b=True, first=["-x"])
    # the node id as pytest names it from its rootdir: the test folder may lie outside the checkout
    assert ran == ["a", "b"] and {i.rsplit("::", 1)[-1] for i in plugin.ids} == {"test_b"} and not plugin.stopped, (ran, plugin.ids)
    (tmp_path / "ran").unlink()
    status, plugin, ran = ran_in_process(tmp_path, monkeypatch, stop=None, fail_b=True)  # --keep-going
    assert ran == ["a", "b", "c"] and status == pytest.ExitCode.TESTS_FAILED


class FakeRun:
    """FlashInferTests as build_and_test uses it: what it was asked to do."""

    def __init__(self, fails_first=False):
        self.fails_first, self.said = fails_first, []
        self.opened, self.past, self.unread, self.missed, self.exercised_files = None, None, None, [], {"tests/utils/test_norm.py"}
        self.all_skipped, self.stopped_early = False, False

    def open(self, selection):
        self.said.append("open")
        self.opened = 1.0

    def ended_failing(self):
        return self.fails_first

    def finish(self):
        self.said.append("finish")
        if self.fails_first:
            self.stopped_early = True
            return 1, {"tests/utils/test_norm.py::test_norm[1]"}
        return 0, set()

    def stop(self):
        self.said.append("stop")


def build_and_test(monkeypatch, run, smoke_fails, keep_going=False):
    """build_and_test with the rebuild, smoke's tests and FlashInfer's run stood in for: (outcome,
    what the run was asked, the stop callable smoke's tests were given)."""
    given = {}

    def run_ours(tests, wide, mode, stop=None):
        given["stop"] = stop
        if stop is not None and stop():
            return 1, set(), True  # stopped before its first test
        return (1, {"tests/smoke/test_kernels.py::test_rmsnorm"}, stop is not None) if smoke_fails else (0, set(), False)

    monkeypatch.setattr(affected_tests, "run_ours", run_ours)
    monkeypatch.setattr(affected_tests, "rebuild", lambda to_build, failed_table: affected_tests.Outcome("1 module(s) rebuilt", 1.0, ["norm"]))
    monkeypatch.setattr(affected_tests, "their_run", lambda *args: (run, None))
    monkeypatch.setattr(affected_tests, "import_meanwhile", lambda: None)
    outcome = affected_tests.build_and_test([], None, ["smoke/test_kernels.py::test_rmsnorm"], ["tests/utils/test_norm.py"], {}, {"norm": {}},
                                            None, lambda: "", lambda: None, True, "auto", keep_going)
    return outcome, run.said, given["stop"]


def test_smokes_first_failure_stops_flashinfers_tests(monkeypatch):
    outcome, said, stop = build_and_test(monkeypatch, FakeRun(), smoke_fails=True)
    assert "finish" not in said and "stop" in said, said
    assert outcome.stopped and outcome.failed == {"tests/smoke/test_kernels.py::test_rmsnorm"} and outcome.broken == []


def test_flashinfers_first_failure_stops_smokes_tests(monkeypatch):
    outcome, said, stop = build_and_test(monkeypatch, FakeRun(fails_first=True), smoke_fails=False)
    assert stop is not None and stop()
    assert "finish" in said and outcome.stopped and outcome.failed == {"tests/utils/test_norm.py::test_norm[1]"}
    assert outcome.broken == [], "smoke's stopped session is no broken run"


def test_keep_going_runs_every_test(monkeypatch):
    outcome, said, stop = build_and_test(monkeypatch, FakeRun(), smoke_fails=True, keep_going=True)
    assert stop is None and "finish" in said and not outcome.stopped


def test_a_module_whose_tests_a_stopped_run_left_unrun_is_no_pass():
    """Two modules changed; the first failure (norm's) ended the run before rope's tests ran: rope is
    `unfinished`, which the next run runs again (fidev.affected.changes.standing_failures), never `passed`."""
    recorded = {"norm": ["tests/utils/test_norm.py::test_norm[1]"], "rope": ["tests/attention/test_rope.py::test_rope[1]"]}
    sel = selection.Selection({"include/x.cuh": {"norm", "rope"}}, {"norm": {}, "rope": {}}, {}, recorded)
    failed = {"tests/utils/test_norm.py::test_norm[1]"}
    results = coverage.module_results(sel, failed, [], stopped=True)
    assert {name: r[0] for name, r in results.items()} == {"norm": "failed", "rope": "unfinished"}
    assert {name: r[0] for name, r in coverage.module_results(sel, failed, []).items()} == {"norm": "failed", "rope": "passed"}


def test_affected_asks_flashinfers_run_to_stop_at_its_first_failing_case():
    assert affected_tests.STOP_AFTER == 1
    done = subprocess.run([sys.executable, "scripts/affected.py", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert "--keep-going" in done.stdout and "run every selected test" in done.stdout, done.stdout + done.stderr


WARMUP = """\
import pytest
import flashinfer
@pytest.fixture(autouse=True, scope="module")
def warmup_jit():
    flashinfer.jit.build_jit_specs([flashinfer.gen("silu_and_mul", 1), flashinfer.gen("gelu_and_mul", 1),
                                    flashinfer.gen("gelu_tanh_and_mul", 1)], verbose=False)
    yield
def test_silu():
    flashinfer.load("silu_and_mul", 1)
def test_gelu():
    flashinfer.load("gelu_and_mul", 1)
def test_tanh():
    flashinfer.load("gelu_tanh_and_mul", 1)
"""


@needs_a_build
def test_a_subset_of_a_files_cases_builds_first_what_its_first_case_loads(ws):
    """FlashInfer's warmup_jit asks for every module of its file's parameter space
    (tests/utils/test_activation.py at v0.6.3); under -k (as under a sample or the gate's selection)
    the warmup builds nothing up front: the first case builds its own module first, the rest build
    beside the next cases, and no module compiles twice; the whole file still builds what the warmup
    asks for, in one parallel step, before its first case."""
    require("filelock", why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_activation.py").write_text(WARMUP)
    done = upstream(root, env, "activation", "--no-plan", "-k", "test_silu or test_gelu")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a subset of the file's cases runs, so each case builds what it loads" in done.stdout, done.stdout
    built = [line.rsplit("/", 2)[-2] for line in compiles(env)]
    assert built[0] == "silu_and_mul" and built.count("gelu_and_mul") == 1 and len(built) == len(set(built)), built
    shutil.rmtree(Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/cached_ops")
    Path(env["FAKE_COMPILES"]).unlink()
    done = upstream(root, env, "activation", "--no-plan")
    assert done.returncode == 0 and "building 3 module(s) its warmup_jit fixture asks for" in done.stdout, done.stdout + done.stderr
    assert "upstream-tests: 3 passed" in done.stdout, done.stdout
    assert sorted(line.rsplit("/", 2)[-2] for line in compiles(env)) == ["gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul"]


def test_each_verdict_has_the_exit_status_the_docs_table_gives_it():
    """fidev.affected.verdict.Verdict is the one place a verdict and its status are stated; the table
    of docs/affected-and-upstream-tests.md says the same of each (a row per status, its verdicts)."""
    import re

    from fidev.affected.verdict import Verdict

    text = (ROOT / "docs/affected-and-upstream-tests.md").read_text()
    rows = {verdict.strip(): int(status) for status, verdicts in re.findall(r"^  \| (\d+) \| ([^|]+) \|", text, re.M)
            for verdict in verdicts.split(",")}
    assert {v.value: v.status for v in Verdict} == {v.value: rows.get(v.value) for v in Verdict}, rows
