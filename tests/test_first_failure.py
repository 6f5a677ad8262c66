"""The first failing test ends `affected`'s run (fidev.affected.tests, .ours, .theirs): smoke's first failure stops
FlashInfer's tests, FlashInfer's first failing case stops smoke's (and upstream-tests stops at it,
--stop-after 1); what did not run is no pass (its modules' verdicts are `unfinished`, so the next run
runs them again); --keep-going runs every selected test. And a run of a subset of a test file's
cases builds only what its cases load: FlashInfer's `warmup_jit` fixture builds nothing then."""

import io
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fidev.affected import coverage, report, selection, verdict
from fidev.affected import ours as our_tests
from fidev.affected import tests as affected_tests
from fidev.affected import theirs as their_tests
from fidev.core.failure import Failure
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
    plugin = our_tests.collector(stop)
    status = pytest.main(
        [str(tmp_path / "test_three.py"), "-q", "-p", "no:cacheprovider", "--import-mode=importlib", *first],
        plugins=[plugin],
    )
    ran = (tmp_path / "ran").read_text().split() if (tmp_path / "ran").is_file() else []
    return int(status), plugin, ran


def test_smokes_tests_stop_once_flashinfers_failed(tmp_path, monkeypatch, capsys):
    """stop() turns true after the first test (FlashInfer's run ended failing): no other test runs,
    the session ends as -x ends it (not as Ctrl-C), saying why, and the plugin says tests were left unrun."""
    calls = []
    status, plugin, ran = ran_in_process(tmp_path, monkeypatch, stop=lambda: calls.append(1) or len(calls) > 1)
    assert ran == ["a"] and plugin.stopped and not plugin.interrupted and plugin.ids == set()
    assert status == pytest.ExitCode.TESTS_FAILED
    said = re.findall(r"^!+ (.*) !+$", capsys.readouterr().out, re.M)  # pytest's line for a session that shouldfail
    assert said == ["FlashInfer's tests failed: the first failure ends the run (--keep-going runs every test)"], said


def test_ctrl_c_in_smokes_tests_is_said_to_run_ours(tmp_path, monkeypatch):
    """pytest.main keeps a KeyboardInterrupt to itself (status 2): the plugin says it, so that run_ours
    raises it again and what runs beside smoke's tests is stopped too."""
    monkeypatch.setenv("RAN", str(tmp_path / "ran"))
    (tmp_path / "test_ctrl_c.py").write_text("def test_a():\n    raise KeyboardInterrupt\n")
    plugin = our_tests.collector(None)
    status = pytest.main(
        [str(tmp_path / "test_ctrl_c.py"), "-q", "-p", "no:cacheprovider", "--import-mode=importlib"], plugins=[plugin]
    )
    assert status == pytest.ExitCode.INTERRUPTED and plugin.interrupted is True


def test_smokes_first_failure_ends_them_and_without_stop_all_run(tmp_path, monkeypatch):
    status, plugin, ran = ran_in_process(tmp_path, monkeypatch, stop=lambda: False, fail_b=True, first=["-x"])
    # the node id as pytest names it from its rootdir: the test folder may lie outside the checkout
    assert ran == ["a", "b"] and {i.rsplit("::", 1)[-1] for i in plugin.ids} == {"test_b"} and not plugin.stopped, (
        ran,
        plugin.ids,
    )
    (tmp_path / "ran").unlink()
    status, plugin, ran = ran_in_process(tmp_path, monkeypatch, stop=None, fail_b=True)  # --keep-going
    assert ran == ["a", "b", "c"] and status == pytest.ExitCode.TESTS_FAILED


class FakeRun:
    """FlashInferTests as build_and_test uses it: what it was asked to do. `fails_first`: it has ended
    failing before smoke's tests (ended_failing), at its first failing case unless `stopped_early` says
    otherwise; `result`: finish()'s (status, failed) otherwise."""

    def __init__(self, fails_first=False, stopped_early=None, result=(0, set()), **attrs):
        self.fails_first, self.stops_early, self.result, self.said, self.selection = (
            fails_first,
            stopped_early,
            result,
            [],
            None,
        )
        self.opened, self.past, self.unread, self.missed, self.exercised_files = (
            None,
            None,
            None,
            [],
            {"tests/utils/test_norm.py"},
        )
        self.all_skipped, self.stopped_early = False, False
        self.__dict__.update(attrs)

    def begin(self, modules, selection, by_module=True):
        self.said.append("begin" if by_module else "begin, no module built before open")
        self.modules, self.selection = modules, selection

    def built(self, name):
        self.said.append(f"built {name}")

    def open(self):
        self.said.append("open")
        self.opened = 1.0

    def ended_failing(self):
        return self.fails_first

    def finish(self):
        self.said.append("finish")
        self.stopped_early = self.fails_first if self.stops_early is None else self.stops_early
        if self.fails_first:
            return 1, {"tests/utils/test_norm.py::test_norm[1]"}
        return self.result

    def stop(self):
        self.said.append("stop")


SMOKE = ["smoke/test_kernels.py::test_rmsnorm"]
THEIRS, RECORDED, CHANGED = (
    ["tests/utils/test_norm.py"],
    {"norm": ["tests/utils/test_norm.py::test_norm[1]"]},
    {"norm": {}},
)
FIRST_FILES = ["tests/utils/test_norm.py"]  # the test files of the family nearest the edit
TO_BUILD, VERSION_DIR, GATE_SELECTION = (
    [SimpleNamespace(name="norm")],
    Path("version-dir"),
    ["tests/utils/test_norm.py::test_norm[1]"],
)


def failed_table():
    return "table"


def build_and_test(monkeypatch, run, smoke_fails, keep_going=False, ours=SMOKE, all_held=True):
    """build_and_test with the rebuild, smoke's tests and FlashInfer's run stood in for (run None: no
    test of FlashInfer's selected): (outcome, what the run was asked, what the stand-ins were given:
    their_run's and rebuild's arguments, run_ours' and its stop callable, the import's steps).
    keep_going None: build_and_test's default; all_held: whether the rebuild took every module's lock."""
    given, all_held_ = {"imported": []}, all_held

    class Importing:
        def join(self, timeout=None):
            given["imported"].append("joined")

    def run_ours(tests, wide, mode, stop=None, order=None):
        given.update(run_ours=(tests, wide, mode), stop=stop, imported_first=list(given["imported"]), order=order)
        if stop is not None and stop():
            return 1, set(), True  # stopped before its first test
        return (
            (1, {"tests/smoke/test_kernels.py::test_rmsnorm"}, stop is not None) if smoke_fails else (0, set(), False)
        )

    class Rebuilding:  # module_builds.Rebuild, built at once
        failure, ended, started = None, 2.0, 1.0
        all_held = all_held_

        def __init__(self, to_build, then, say=None, first=frozenset(), rebuilt=None):
            given["rebuild"], given["rebuilding"] = to_build, self
            self.stopped = threading.Event()
            then(self)

        def pending(self):
            return set()

        def seconds(self):
            return 1.0

        def slowest(self):
            return []

        def wait(self, stop=None):
            given.setdefault("rebuild waited", True)
            given.setdefault("rebuild's stop", stop)

        def stop(self):
            self.stopped.set()

    def their_run(*args):
        given["their_run"] = args
        return run, GATE_SELECTION if run else None

    monkeypatch.setattr(our_tests, "run_ours", run_ours)
    monkeypatch.setattr(affected_tests, "start_rebuild", Rebuilding)
    monkeypatch.setattr(their_tests, "their_run", their_run)
    monkeypatch.setattr(our_tests, "import_meanwhile", lambda: given["imported"].append("started") or Importing())
    args = (
        TO_BUILD,
        "early",
        list(ours),
        THEIRS if run else [],
        RECORDED,
        CHANGED,
        VERSION_DIR,
        failed_table,
        lambda: None,
        True,
        "auto",
    )
    going = {} if keep_going is None else {"keep_going": keep_going}
    outcome = affected_tests.build_and_test(*args, **going, first_files=FIRST_FILES)
    return outcome, run.said if run else [], given


def test_smokes_first_failure_stops_flashinfers_tests(monkeypatch, capsys):
    outcome, said, _ = build_and_test(monkeypatch, FakeRun(), smoke_fails=True)
    assert "finish" not in said and "stop" in said, said
    assert outcome.stopped and outcome.failed == {"tests/smoke/test_kernels.py::test_rmsnorm"} and outcome.broken == []
    assert (
        "affected: FlashInfer's tests stopped: smoke's tests failed first (--keep-going runs every test)\n"
        in capsys.readouterr().out
    )


def test_flashinfers_first_failure_stops_smokes_tests(monkeypatch):
    outcome, said, given = build_and_test(monkeypatch, FakeRun(fails_first=True), smoke_fails=False)
    assert given["stop"] is not None and given["stop"]()
    assert "finish" in said and outcome.stopped and outcome.failed == {"tests/utils/test_norm.py::test_norm[1]"}
    assert outcome.broken == [], "smoke's stopped session is no broken run"


def test_keep_going_runs_every_test(monkeypatch):
    outcome, said, given = build_and_test(monkeypatch, FakeRun(), smoke_fails=True, keep_going=True)
    assert given["stop"] is None and "finish" in said and not outcome.stopped
    assert given["their_run"][6] == 0, "FlashInfer's tests run without --stop-after"
    assert given["rebuild's stop"] is None, "FlashInfer's failure stops no rebuild"


def test_with_keep_going_both_runs_failures_are_the_answer(monkeypatch):
    outcome, _, _ = build_and_test(monkeypatch, FakeRun(fails_first=True), smoke_fails=True, keep_going=True)
    assert outcome.failed == {"tests/smoke/test_kernels.py::test_rmsnorm", "tests/utils/test_norm.py::test_norm[1]"}
    assert len(outcome.reruns) == 2 and not outcome.broken


def test_a_run_stops_at_its_first_failure_by_default_and_hands_each_step_what_it_was_given(monkeypatch, capsys):
    """Without keep_going, FlashInfer's run is asked to stop at its first failing case (STOP_AFTER);
    it gets the edit's tests, records and modules, and its gate the selection their_run made; the
    rebuild gets the modules and the failed table; smoke's tests wait for the head-start import."""
    run = FakeRun()
    outcome, said, given = build_and_test(monkeypatch, run, smoke_fails=False, keep_going=None)
    given_run = ("early", THEIRS, RECORDED, CHANGED, VERSION_DIR, True, their_tests.STOP_AFTER, FIRST_FILES)
    assert given["their_run"] == given_run, "the files whose cases' modules build first too"
    assert given["rebuild"] == TO_BUILD and given["rebuild waited"]
    assert given["rebuilding"].stopped.is_set(), "the rebuild is stopped however the run ends"
    assert given["rebuild's stop"] == run.ended_failing, "FlashInfer's first failing case stops the rebuild"
    assert said == ["open", "begin", "finish", "stop"] and outcome.stopped is False
    assert given["run_ours"] == (SMOKE, [], "auto") and given["imported_first"] == ["started", "joined"]
    assert "affected: 1 module(s) rebuilt in 1.0 s\n" in capsys.readouterr().out


def test_the_gate_begins_on_their_runs_selection_and_the_rebuilds_modules(monkeypatch):
    run = FakeRun()
    build_and_test(monkeypatch, run, smoke_fails=False)
    assert run.selection == GATE_SELECTION and run.modules == ["norm"]


class Stepping:
    """module_builds.Rebuild as build_and_test drives it: started, it has taken its locks; wait(stop)
    builds `names` one by one (rebuilt(name) for each, as Rebuild.done_one), then says all built (then),
    unless stop() turned true first: then what still builds is stopped."""

    def __init__(self, names, said):
        self.names, self.said, self.failure = names, said, None
        self.stopped, self.all_held = threading.Event(), True

    def __call__(self, to_build, then, say=None, first=frozenset(), rebuilt=None):
        self.said.append("rebuild started")
        self.then, self.rebuilt = then, rebuilt
        return self

    def pending(self):
        return set(self.names)

    def seconds(self):
        return 2.0

    def slowest(self):
        return []

    def wait(self, stop=None):
        self.said.append(f"waited, stopping at a failure: {stop is not None}")
        while self.names and not (stop is not None and stop()):
            self.rebuilt(self.names.pop(0))
        if stop is not None and stop():
            self.said.append("rebuild stopped")
            self.stop()
            return
        self.then(self)

    def stop(self):
        self.stopped.set()


def build_and_test_stepping(monkeypatch, run, names, keep_going=False):
    """build_and_test of the modules `names`, no smoke test, FlashInfer's tests `run` (FakeRun), the
    rebuild Stepping: (outcome, what was said, in order: the run's steps and the verdicts kept)."""
    rebuilding = Stepping(list(names), run.said)
    monkeypatch.setattr(affected_tests, "start_rebuild", rebuilding)
    monkeypatch.setattr(their_tests, "their_run", lambda *args: (run, None))
    outcome = affected_tests.build_and_test(
        [SimpleNamespace(name=n) for n in names],
        None,
        [],
        THEIRS,
        RECORDED,
        CHANGED,
        VERSION_DIR,
        failed_table,
        lambda: run.said.append("kept all"),
        True,
        "auto",
        keep_going,
        frozenset(),
        lambda name: run.said.append(f"kept {name}"),
    )
    return outcome, run.said, rebuilding


def test_flashinfers_first_modules_are_those_of_one_recorded_case_of_each_test_function_chosen_to_be_few():
    """Rebuilt first beside smoke's (their_first): test_x's cheaper case by name first (prefill_128), which
    test_y's and test_z's cases need too, so they cost nothing more; test_merge adds cascade. page is
    built already (not rebuilt): it costs nothing; prefill_256 and decode (a file not selected) wait."""
    recorded = {
        "page": ["tests/a.py::test_x[1]", "tests/a.py::test_x[2]", "tests/a.py::test_y[1]"],
        "prefill_128": ["tests/a.py::test_x[1]", "tests/a.py::test_y[1]", "tests/b.py::test_z[1]"],
        "prefill_256": ["tests/a.py::test_x[2]", "tests/b.py::test_z[2]"],
        "cascade": ["tests/b.py::test_merge[1]"],
        "decode": ["tests/c.py::test_d[1]"],
    }
    rebuilt = ["prefill_128", "prefill_256", "cascade", "decode"]
    theirs = ["tests/a.py", "tests/b.py::test_z", "tests/b.py::test_merge"]
    assert their_tests.their_first(recorded, rebuilt, theirs) == ("prefill_128", "cascade"), "in the order chosen"
    assert their_tests.their_first(recorded, ["decode"], theirs) == (), "none of theirs waits for it"
    assert their_tests.their_first(recorded, rebuilt, ["tests/b.py::test_z[2]"]) == ("prefill_256",)
    assert their_tests.their_first({}, rebuilt, theirs) == ()


def test_the_rebuild_builds_first_what_smokes_tests_and_a_case_of_each_of_flashinfers_functions_wait_for(monkeypatch):
    given = {}

    def start_rebuild(to_build, then, say, first, rebuilt):
        given["first"] = first
        return Stepping([], [])(to_build, then, say, first, rebuilt)

    monkeypatch.setattr(affected_tests, "start_rebuild", start_rebuild)
    monkeypatch.setattr(their_tests, "their_run", lambda *args: (FakeRun(), None))
    recorded = {"norm": ["tests/utils/test_norm.py::test_norm[1]"], "other": ["tests/utils/test_x.py::test_x[1]"]}
    to_build = [SimpleNamespace(name=name) for name in ("norm", "other", "smokes")]
    args = (to_build, None, [], THEIRS, recorded, CHANGED)
    affected_tests.build_and_test(*args, VERSION_DIR, failed_table, lambda: None, True, "auto", False, {"smokes"})
    assert given["first"] == ("smokes", "norm"), "smoke's first, then a case of each of FlashInfer's functions'"


def test_flashinfers_gate_begins_once_the_rebuild_holds_its_locks_and_names_each_module_once_it_is_kept(monkeypatch):
    """The gate begins (their cases may start) once the rebuild took every module's lock; each module
    is said built after affected kept its verdict `unfinished`, so that a case that loads it and fails
    leaves a verdict to run again; the gate opens whole once all are kept."""
    outcome, said, rebuilding = build_and_test_stepping(monkeypatch, FakeRun(), ["fast", "slow"])
    assert said == [
        "rebuild started",
        "begin",
        "waited, stopping at a failure: True",
        "kept fast",
        "built fast",
        "kept slow",
        "built slow",
        "kept all",
        "open",
        "finish",
        "stop",
    ]
    assert outcome.built == "2 module(s) rebuilt in 2.0 s" and not outcome.stopped


def test_flashinfers_first_failing_case_beside_the_rebuild_stops_what_still_builds(monkeypatch, capsys):
    """A case of a module rebuilt first fails while others still build: its run ended failing, so the
    rebuild is stopped, the gate never opens, the run is `stopped` and its failure the answer; with
    --keep-going the rebuild goes on to its end."""

    class FailsOnceBuilt(FakeRun):  # fast's case fails as soon as the gate says fast is built
        def built(self, name):
            super().built(name)
            self.fails_first = True

    outcome, said, rebuilding = build_and_test_stepping(monkeypatch, FailsOnceBuilt(), ["fast", "slow"])
    assert said == [
        "rebuild started",
        "begin",
        "waited, stopping at a failure: True",
        "kept fast",
        "built fast",
        "rebuild stopped",
        "kept all",
        "finish",
        "stop",
    ], "slow is not built, the gate never opens, and the modules are kept unfinished"
    assert outcome.stopped and outcome.failed == {"tests/utils/test_norm.py::test_norm[1]"}
    assert outcome.built == "the rebuild stopped at the first failure, 2.0 s in"
    assert "affected: the rebuild stopped at the first failure, 2.0 s in\n" in capsys.readouterr().out
    outcome, said, rebuilding = build_and_test_stepping(monkeypatch, FakeRun(fails_first=True), ["a"], keep_going=True)
    assert "waited, stopping at a failure: False" in said and "open" in said and "rebuild stopped" not in said


def test_without_smokes_tests_nothing_is_imported_and_without_flashinfers_nothing_stops_smokes(monkeypatch):
    _, _, given = build_and_test(monkeypatch, FakeRun(), smoke_fails=False, ours=())
    assert given["imported"] == [] and "run_ours" not in given
    outcome, _, given = build_and_test(monkeypatch, None, smoke_fails=False)
    assert given["stop"] is not None and given["stop"]() is False, "no FlashInfer run: smoke's tests are not stopped"
    assert (outcome.failed, outcome.broken, outcome.stopped) == (set(), [], False)


def test_a_passing_run_is_no_broken_one_and_keeps_what_flashinfers_tests_exercised(monkeypatch):
    run = FakeRun(past={"ended_s": 1.0})
    outcome, _, _ = build_and_test(monkeypatch, run, smoke_fails=False)
    assert (outcome.failed, outcome.broken, outcome.stopped) == (set(), [], False)
    assert outcome.past == {"ended_s": 1.0} and outcome.exercised_files == {"tests/utils/test_norm.py"}


def test_flashinfers_run_that_names_no_failure_is_no_pass_unless_every_case_skipped(monkeypatch):
    """Every case skipped: no verdict of theirs (the coverage says the gap); a failing status with no
    failed test named, or a summary that could not be read, is broken."""
    skipped = FakeRun(result=(5, set()), all_skipped=True)
    assert build_and_test(monkeypatch, skipped, smoke_fails=False)[0].broken == []
    outcome = build_and_test(monkeypatch, FakeRun(result=(1, set())), smoke_fails=False)[0]
    assert outcome.broken == ["upstream-tests exited 1 with no failed test named (its last lines above say why)"]
    unread = FakeRun(result=(1, set()), unread=Failure("no summary", "run it again"))
    outcome = build_and_test(monkeypatch, unread, smoke_fails=False)[0]
    assert outcome.broken == ["upstream-tests exited 1, and its summary could not be read (the error above says why)"]


def test_a_changed_module_the_sample_did_not_exercise_is_no_pass(monkeypatch):
    outcome, _, _ = build_and_test(monkeypatch, FakeRun(missed=["norm", "not_changed"]), smoke_fails=False)
    assert outcome.broken == [
        "no collected FlashInfer test is recorded for norm, so the sample did not exercise it "
        "(upstream-tests FAMILY records them again)"
    ]


def test_smokes_tests_left_unrun_stay_unfinished_whatever_flashinfers_run_says(monkeypatch):
    """FlashInfer's run ended failing before smoke's tests (its last case failed: it did not stop
    early): smoke's tests did not run, so the run is stopped; and a run of theirs that stopped early
    after smoke's tests all ran is stopped too."""
    outcome, _, _ = build_and_test(monkeypatch, FakeRun(fails_first=True, stopped_early=False), smoke_fails=False)
    assert outcome.stopped
    outcome, _, _ = build_and_test(
        monkeypatch,
        FakeRun(stopped_early=True, result=(1, {"tests/utils/test_norm.py::test_norm[1]"})),
        smoke_fails=False,
    )
    assert outcome.stopped and outcome.failed == {"tests/utils/test_norm.py::test_norm[1]"}


def smokes_step(monkeypatch, ours, status, bad, unrun, stopped=False):
    """ours_step with run_ours stood in for: (outcome, run_ours' arguments)."""
    given = {}

    def run_ours(tests, wide, mode, stop=None, order=None):
        given["args"] = (tests, wide, mode, stop)
        return status, set(bad), unrun

    monkeypatch.setattr(our_tests, "run_ours", run_ours)
    monkeypatch.setattr(our_tests, "unbuilt_smoke_specs", lambda ours: [])  # every module built
    outcome = affected_tests.Outcome("built", 1.0, [], stopped=stopped)
    affected_tests.ours_step(ours, None, outcome, "auto", stop=never)
    return outcome, given["args"]


def never():
    return False


def test_smokes_failures_are_rerun_alone_with_the_wide_tier_where_they_need_it(monkeypatch):
    ours = ["smoke/test_wide.py::test_append_paged_kv_cache", "smoke/test_kernels.py::test_rmsnorm"]
    bad = ["tests/smoke/test_wide.py::test_append_paged_kv_cache", "tests/smoke/test_kernels.py::test_rmsnorm"]
    outcome, args = smokes_step(monkeypatch, ours, 1, bad, False, stopped=True)
    assert args == (ours, ["--wide"], "auto", never)
    assert outcome.failed == set(bad) and outcome.broken == [] and outcome.stopped, "an earlier stop stays"
    assert outcome.reruns == [
        "pixi run -e flashinfer-dev python -m pytest tests/smoke/test_kernels.py::test_rmsnorm "
        "tests/smoke/test_wide.py::test_append_paged_kv_cache --wide"
    ]
    outcome, args = smokes_step(monkeypatch, ours[1:], 1, bad[1:], False)
    assert args[1] == [] and outcome.reruns == [
        "pixi run -e flashinfer-dev python -m pytest tests/smoke/test_kernels.py::test_rmsnorm"
    ]


def test_smokes_tests_stopped_by_flashinfers_failure_leave_the_run_stopped(monkeypatch, capsys):
    outcome, _ = smokes_step(monkeypatch, SMOKE, 1, [], True)
    assert outcome.stopped and outcome.failed == set() and outcome.broken == [] and outcome.reruns == []
    assert (
        capsys.readouterr().out
        == "affected: smoke's tests stopped: FlashInfer's tests or the rebuild failed first (--keep-going runs "
        "every test)\n"
    )


def pipe_stdout(monkeypatch) -> io.BytesIO:
    """sys.stdout as on a pipe, block-buffered: what reached its descriptor so far."""
    reached = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(reached, encoding="utf-8"))
    return reached


def test_the_lines_that_say_a_step_stopped_reach_stdout_as_they_are_said(monkeypatch):
    """affected's stdout on a pipe (a CI log, `| tee`) is block-buffered: the line that says smoke's tests
    stopped, and the one that says the rebuild stopped, are out as they are said, not only once what comes
    after them (the rebuild's end, the modules kept, FlashInfer's run) has ended."""
    reached = pipe_stdout(monkeypatch)
    smokes_step(monkeypatch, SMOKE, 1, [], True)
    assert reached.getvalue().decode().startswith("affected: smoke's tests stopped: FlashInfer's tests or the rebuild")
    kept = []

    class Stopped:  # a rebuild the first failure stopped before every module was built
        failure = None

        def wait(self, stop=None):
            pass

        def seconds(self):
            return 2.0

    outcome = affected_tests.Outcome("", 0.0, ["norm"])
    affected_tests.finish_rebuild(Stopped(), outcome, failed_table, lambda: kept.append(reached.getvalue().decode()))
    assert len(kept) == 1 and kept[0].endswith("affected: the rebuild stopped at the first failure, 2.0 s in\n")


@pytest.mark.parametrize(
    ("status", "broken"),
    [
        (0, []),
        (2, ["tests/ exited 2 with no failed test named"]),
        (our_tests.NOTHING_PASSED, ["no smoke or abi-smoke test passed (skipped: reasons above)"]),
    ],
)
def test_smokes_tests_that_fail_with_no_test_named_are_broken(monkeypatch, status, broken):
    outcome, _ = smokes_step(monkeypatch, SMOKE, status, [], False)
    assert outcome.broken == broken and outcome.failed == set() and not outcome.stopped


@pytest.mark.parametrize("n", [5, 6, 7])
def test_flashinfers_failures_are_rerun_alone_the_first_five_of_them(n):
    outcome = affected_tests.Outcome("built", 1.0, [])
    bad = {f"tests/utils/test_norm.py::test_norm[{i}]" for i in range(n)}
    affected_tests.theirs_step(1, bad, None, outcome)
    first = " ".join(f"'tests/utils/test_norm.py::test_norm[{i}]'" for i in range(5))
    assert outcome.reruns == [
        f"pixi run -e flashinfer-dev upstream-tests --no-plan {first}" + (f" (the first 5 of {n})" if n > 5 else "")
    ]
    assert outcome.failed == bad and outcome.broken == []


def test_flashinfers_run_that_failed_with_no_test_named_is_broken():
    outcome = affected_tests.Outcome("built", 1.0, [])
    affected_tests.theirs_step(0, set(), None, outcome)
    assert outcome.broken == [] and outcome.reruns == []
    affected_tests.theirs_step(3, set(), None, outcome)
    assert outcome.broken == ["upstream-tests exited 3 with no failed test named (its last lines above say why)"]


class Proc:
    def __init__(self, status):
        self.status = status

    def poll(self):
        return self.status


@pytest.mark.parametrize(
    ("status", "named", "failing"),
    [(None, True, False), (0, True, False), (1, True, True), (-15, True, True), (1, False, False), (2, None, False)],
    ids=["running", "passed", "failed", "killed-after-failing", "error-none-named", "no-summary"],
)
def test_flashinfers_run_has_ended_failing_once_it_ended_naming_a_failing_case(tmp_path, status, named, failing):
    """smoke's tests stop for FlashInfer's only where their run ended and its summary names a failing
    or erroring case; a run that ended otherwise is no pass, but did not fail first."""
    from fidev.upstream import summary as upstream_summary

    run = object.__new__(their_tests.FlashInferTests)
    run.proc, run.summary = Proc(status), tmp_path / "summary.json"
    if named is not None:
        upstream_summary.write(
            upstream_summary.Summary(
                selection=["rope"],
                kernel_source="auto",
                run_dir=str(tmp_path),
                gpus=["0"],
                gpu_name="H200",
                started=1.0,
                ended=3.0,
                status=status or 0,
                counts=dict.fromkeys(upstream_summary.COUNTS, 0),
                failing=["tests/t.py::test_a"] if named else [],
            ),
            run.summary,
        )
    assert run.ended_failing() is failing


def test_a_module_whose_tests_a_stopped_run_left_unrun_is_no_pass():
    """Two modules changed; the first failure (norm's) ended the run before rope's tests ran: rope is
    `unfinished`, which the next run runs again (fidev.affected.changes.standing_failures), never `passed`."""
    recorded = {
        "norm": ["tests/utils/test_norm.py::test_norm[1]"],
        "rope": ["tests/attention/test_rope.py::test_rope[1]"],
    }
    sel = selection.Selection({"include/x.cuh": {"norm", "rope"}}, {"norm": {}, "rope": {}}, {}, recorded)
    failed = {"tests/utils/test_norm.py::test_norm[1]"}
    results = coverage.module_results(sel, failed, [], stopped=True)
    assert {name: r[0] for name, r in results.items()} == {"norm": "failed", "rope": "unfinished"}
    assert {name: r[0] for name, r in coverage.module_results(sel, failed, []).items()} == {
        "norm": "failed",
        "rope": "passed",
    }


def test_a_file_whose_tests_a_stopped_run_left_unrun_reads_unfinished_in_the_table_not_passed():
    """The table says what the kept verdicts keep (coverage.module_results): the first failure ended the
    run before rope's tests ran, so its row is `unfinished`; a run that was not stopped passed it."""
    recorded = {
        "norm": ["tests/utils/test_norm.py::test_norm[1]"],
        "rope": ["tests/attention/test_rope.py::test_rope[1]"],
    }
    by_file = {"include/norm.cuh": {"norm"}, "include/pos_enc.cuh": {"rope"}}
    sel = selection.Selection(by_file, {"norm": {}, "rope": {}}, {}, recorded)
    failed = {"tests/utils/test_norm.py::test_norm[1]"}
    stopped = [line.split()[-1] for line in report.results(sel, failed, [], stopped=True).splitlines()[1:]]
    assert stopped == ["failed", "unfinished"]
    assert [line.split()[-1] for line in report.results(sel, failed, []).splitlines()[1:]] == ["failed", "passed"]


def test_each_changed_files_result_in_the_table_is_decided_by_its_tests():
    """coverage.file_results, which the table prints (report.results): a file whose tests failed says how many;
    one with no test `-`; where a test file broke (no outcome of its own), `unknown`; else `unfinished` where the
    first failure stopped the run, `not covered` where the run is not covered, and `passed` only where it is."""
    recorded = {"norm": ["tests/utils/test_norm.py::test_norm[1]", "tests/utils/test_norm.py::test_norm[2]"]}
    by_file = {"include/norm.cuh": {"norm"}, "include/unused.cuh": set()}
    sel = selection.Selection(by_file, {"norm": {}}, {}, recorded)
    both = {"tests/utils/test_norm.py::test_norm[1]", "tests/utils/test_norm.py::test_norm[2]"}
    broken = ["tests/utils/test_norm.py"]
    assert coverage.file_results(sel, both, [], False, True) == ["2 failed", "-"]
    assert coverage.file_results(sel, set(), broken, False, True) == ["unknown", "-"]
    assert coverage.file_results(sel, set(), [], True, True) == ["unfinished", "-"]
    assert coverage.file_results(sel, set(), [], False, False) == ["not covered", "-"]
    assert coverage.file_results(sel, set(), [], False, True) == ["passed", "-"]
    rows = [line.split()[-1] for line in report.results(sel, set(), broken).splitlines()[1:]]
    assert rows == ["unknown", "-"]


def test_the_last_lines_say_what_failed_and_that_a_stopped_run_left_tests_unrun(capsys):
    """A failure, or a broken run alone, is `failed` (verdict.of_tests: exit 1); the last lines say what
    failed and the reruns, and for a run the first failure ended that the rest did not run; a pass is
    `passed` (exit 0), and the line says so."""
    failed = {f"tests/t.py::test_{c}" for c in "abcde"}
    assert verdict.of_tests(failed, []) is verdict.Verdict.FAILED and verdict.Verdict.FAILED.status == 1
    report.final(True, failed, [], ["rerun a", "rerun b"], "1 module(s) rebuilt", 2.0, stopped=True)
    assert capsys.readouterr().out.splitlines() == [
        "affected: the first failure ended the run: the other selected tests did not run, and are no pass "
        "(the next run runs them again; --keep-going runs every one)",
        "affected: 5 failed (tests/t.py::test_a, tests/t.py::test_b, tests/t.py::test_c, tests/t.py::test_d "
        "and 1 more); 1 module(s) rebuilt; 2.0 s in all",
        "affected: rerun alone: rerun a; rerun b",
    ]
    assert verdict.of_tests(set(), ["one broke", "two broke"]) is verdict.Verdict.FAILED
    report.final(True, set(), ["one broke", "two broke"], [], "built", 1.0)
    assert capsys.readouterr().out.splitlines() == [
        "affected: 0 failed (-); one broke; two broke; built; 1.0 s in all",
        "affected: rerun alone: see the output above",
    ]
    assert verdict.of_tests(set(), []) is verdict.Verdict.PASSED and verdict.Verdict.PASSED.status == 0
    report.final(False, set(), [], [], "built", 1.0)
    assert capsys.readouterr().out == "affected: every selected test passed; built; 1.0 s in all\n"


def test_affected_asks_flashinfers_run_to_stop_at_its_first_failing_case():
    assert their_tests.STOP_AFTER == 1
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
    (tests/utils/test_activation.py at v0.6.3); under -k (as under a sample or the gate's selection),
    with no record of which case needs which module, the warmup builds nothing up front: the first
    case builds its own module first, the rest build beside the next cases, and no module compiles
    twice; the whole file still builds what the warmup asks for, in one parallel step, before its first case."""
    require(
        "filelock",
        why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)",
    )
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
    assert done.returncode == 0 and "building 3 module(s) its warmup_jit fixture asks for" in done.stdout, (
        done.stdout + done.stderr
    )
    assert "upstream-tests: 3 passed" in done.stdout, done.stdout
    assert sorted(line.rsplit("/", 2)[-2] for line in compiles(env)) == [
        "gelu_and_mul",
        "gelu_tanh_and_mul",
        "silu_and_mul",
    ]


def test_each_verdict_has_the_exit_status_the_docs_table_gives_it():
    """fidev.affected.verdict.Verdict is the one place a verdict and its status are stated; the table
    of docs/affected-and-upstream-tests.md says the same of each (a row per status, its verdicts)."""
    import re

    from fidev.affected.verdict import Verdict

    text = (ROOT / "docs/affected-and-upstream-tests.md").read_text()
    rows = {
        verdict.strip(): int(status)
        for status, verdicts in re.findall(r"^  \| (\d+) \| ([^|]+) \|", text, re.M)
        for verdict in verdicts.split(",")
    }
    assert {v.value: v.status for v in Verdict} == {v.value: rows.get(v.value) for v in Verdict}, rows


ORDERED = (
    WARMUP.replace("import flashinfer\n", "import flashinfer, os\n")
    .replace("def test_silu():\n", "def test_silu():\n    open(os.environ['RAN'], 'a').write('silu\\n')\n")
    .replace("def test_gelu():\n", "def test_gelu():\n    open(os.environ['RAN'], 'a').write('gelu\\n')\n")
)


@needs_a_build
def test_a_recorded_subset_builds_only_its_cases_modules_and_runs_the_built_ones_first(ws, tmp_path):
    """Where the record names each selected case's modules (the plan's dry run wrote it; the sample
    spec carries it), the narrowed warmup builds exactly those, side by side at once, and none of the
    warmup's others; the cases whose modules are built run first (here gelu, built by an earlier run,
    before silu, collected first), and each module compiles once."""
    require(
        "filelock",
        why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)",
    )
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_activation.py").write_text(ORDERED)
    env = {**env, "RAN": str(tmp_path / "ran")}
    assert (
        upstream(root, env, "activation", "--yes", "-k", "test_silu or test_gelu").returncode == 0
    )  # the record (its dry run)
    cached = Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/cached_ops"
    for module in ("silu_and_mul", "gelu_tanh_and_mul"):  # gelu_and_mul alone stays built
        shutil.rmtree(cached / module)
    Path(env["FAKE_COMPILES"]).unlink()
    Path(env["RAN"]).unlink()
    done = upstream(root, env, "activation", "--no-plan", "--sample", "-k", "test_silu or test_gelu")
    assert done.returncode == 0 and "upstream-tests: 2 passed" in done.stdout, done.stdout + done.stderr
    assert "the 1 its cases need by the record build side by side now" in done.stdout, done.stdout
    assert "the 1 no case to run needs are not built" in done.stdout, done.stdout
    assert Path(env["RAN"]).read_text().split() == ["gelu", "silu"], "the case whose module was built did not run first"
    built = [line.rsplit("/", 2)[-2] for line in compiles(env)]
    assert built == ["silu_and_mul"], built  # gelu_and_mul was built; gelu_tanh_and_mul: no case to run needs it


@needs_a_build
def test_a_sampled_run_with_its_plan_first_builds_only_what_the_sample_needs(ws, tmp_path):
    """With no record yet, the plan's dry run (of the sample) writes it, and the run's sample is then
    taken with it: the sampled cases' modules build side by side ahead of them (the plan's, as the
    processes start), and no other module, each once. This is how affected runs FlashInfer's tests of
    a file the record names no case of (its plan first)."""
    require(
        "filelock",
        why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)",
    )
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_activation.py").write_text(ORDERED)
    env = {**env, "RAN": str(tmp_path / "ran")}
    done = upstream(root, env, "activation", "--yes", "--sample", "-k", "test_silu or test_gelu")
    assert done.returncode == 0 and "upstream-tests: 2 passed" in done.stdout, done.stdout + done.stderr
    assert (
        "building the 2 module(s) its tests will load and nothing built, side by side, from now: silu_and_mul, "
        "gelu_and_mul" in done.stdout  # test_silu's module first: it runs first
    ), done.stdout
    assert "the 1 no case to run needs are not built" in done.stdout, done.stdout
    assert ": compiling" not in done.stdout, "a case compiled a module built ahead of it"
    assert sorted(line.rsplit("/", 2)[-2] for line in compiles(env)) == ["gelu_and_mul", "silu_and_mul"], compiles(env)


def test_affected_plans_first_only_where_the_record_names_no_case_of_a_file():
    recorded = {"norm": ["tests/utils/test_norm.py::test_norm[1]"], "rope": []}
    assert their_tests.unrecorded(["tests/utils/test_norm.py", "tests/attention/test_rope.py::test_a"], recorded) == [
        "tests/attention/test_rope.py"
    ]
    assert their_tests.unrecorded(["tests/utils/test_norm.py::test_norm"], recorded) == []


def test_smokes_unbuilt_modules_are_named_by_the_tests_selected_and_a_host_that_cannot_name_them_says_so(
    monkeypatch, capsys
):
    """affected builds, side by side, the smoke modules its selected tests load and nothing built
    (our_tests.SmokeBuilds); a selected function selects its cases, a case its function's module.
    Where flashinfer cannot name them, one line says that each test builds its own, and nothing runs."""
    tests = ("tests/smoke/test_wide.py::test_batch_decode_paged[fp16]",)
    assert our_tests.loads("tests/smoke/test_wide.py::test_batch_decode_paged", tests)
    assert our_tests.loads("tests/smoke/test_wide.py::test_batch_decode_paged[fp16]", tests)
    assert not our_tests.loads("tests/smoke/test_wide.py::test_batch_decode", tests)

    def unnamed(ours):
        raise ImportError("No module named 'flashinfer'")

    monkeypatch.setattr(our_tests, "unbuilt_smoke_specs", unnamed)
    beside = our_tests.SmokeBuilds(["tests/smoke/test_kernels.py::test_rmsnorm"])
    beside.stop()
    assert beside.ahead is None and beside.pending() == set()
    assert capsys.readouterr().out == (
        "affected: smoke's modules not named up front (ImportError: No module named 'flashinfer'): "
        "each test builds its own\n"
    )
    monkeypatch.setattr(our_tests, "unbuilt_smoke_specs", lambda ours: [])
    assert our_tests.SmokeBuilds(["x"]).ahead is None and capsys.readouterr().out == ""


TWO_MODULES = """\
import pytest
import flashinfer
ACTS = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]
@pytest.fixture(autouse=True, scope="module")
def warmup_jit():
    flashinfer.jit.build_jit_specs([flashinfer.gen(a, 1) for a in ACTS], verbose=False)
    yield
@pytest.mark.parametrize("act", ACTS)
def test_act(act):
    flashinfer.load("page", 1)
    flashinfer.load(act, 1)
"""


@needs_a_build
def test_a_run_records_every_module_its_cases_load_where_the_dry_run_names_only_the_first(ws):
    """The plan's dry run ends each case at its first module (FlashInfer's MissingJITCacheError), so
    it names `page` for cases that load page first and their own module after; a run records every
    module its cases load (fidev.upstream.plugin.Builds.loaded), and the next sampled run's warmup
    builds the cases' own modules up front by that record."""
    require(
        "filelock",
        why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)",
    )
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_activation.py").write_text(TWO_MODULES)
    done = upstream(root, env, "activation", "--yes", "--sample", "-k", "silu or gelu_and_mul")
    assert done.returncode == 0 and "upstream-tests: 2 passed" in done.stdout, done.stdout + done.stderr
    version_dir = Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90"
    record = json.loads((version_dir / "fidev-module-tests.json").read_text())
    case = "tests/utils/test_activation.py::test_act[silu_and_mul]"
    assert case in record.get("page", []) and case in record.get("silu_and_mul", []), record
    for module in ("silu_and_mul", "gelu_and_mul"):
        shutil.rmtree(version_dir / "cached_ops" / module)
    done = upstream(root, env, "activation", "--no-plan", "--sample", "-k", "silu or gelu_and_mul")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the 2 its cases need by the record build side by side now" in done.stdout, done.stdout
    assert "the 1 no case to run needs are not built" in done.stdout, done.stdout


def test_smokes_step_builds_what_its_tests_load_beside_them_and_stops_what_still_builds(monkeypatch, capsys):
    """ours_step builds, side by side with smoke's tests and at the rebuild's priority, the unbuilt modules
    the selected tests load (our_tests.SmokeBuilds over the tests it was given: module_builds.Ahead,
    its locks taken before the tests start), tells the tests' order what still builds, and stops a build
    still running once they end."""
    loaded = {"smoke/test_kernels.py::test_rmsnorm": "rmsnorm", "smoke/test_wide.py::test_batch_decode": "decode"}
    given, aheads = {}, []

    class Spec:
        def __init__(self, name):
            self.name = name

    class Ahead:
        def __init__(self, specs, say, after=None, nice=10, env=None):
            given.update(built=[spec.name for spec in specs], nice=nice, after=after, env=env is not None)
            self.stopped, aheads[:] = False, [self]
            say("still building\n")

        def pending(self):
            return {"rmsnorm"} if not self.stopped else set()

        def stop(self):
            self.stopped = True

    def ready_first(pairs, pending, stop):
        given["order's stop"], given["pairs"] = stop, pairs
        return pending

    def run_ours(tests, wide, mode, stop=None, order=None):
        given["building while the tests ran"] = order()
        return 0, set(), False

    monkeypatch.setattr(our_tests, "unbuilt_smoke_specs", lambda ours: [Spec(loaded[t]) for t in ours])
    monkeypatch.setattr(our_tests, "loaded_modules", lambda ours: [(tuple(ours), "rmsnorm")])
    monkeypatch.setattr(our_tests.module_builds, "Ahead", Ahead)
    monkeypatch.setattr(our_tests, "ready_first", ready_first)
    monkeypatch.setattr(our_tests, "run_ours", run_ours)
    outcome = affected_tests.Outcome("built", 1.0, [])
    said = []
    affected_tests.ours_step(SMOKE, None, outcome, "auto", stop=never, building=lambda: {"norm"}, say=said.append)
    assert given == {
        "built": ["rmsnorm"],
        "nice": 0,
        "after": None,
        "env": True,
        "order's stop": never,
        "pairs": [(tuple(SMOKE), "rmsnorm")],
        "building while the tests ran": {"norm", "rmsnorm"},
    }
    assert aheads[0].stopped, "a build still running once the tests ended is stopped"
    assert capsys.readouterr().out == (
        "affected: 1 module(s) smoke's tests load and nothing built build side by side now: rmsnorm\n"
    )
    assert said == ["affected: smoke's modules: still building"], "said past smoke's capture, from its thread"
    assert outcome.failed == set() and outcome.broken == [] and not outcome.stopped


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_builds_ahead_of_a_gated_run_start_as_the_gate_opens_and_hold_their_locks_meanwhile(monkeypatch, tmp_path):
    """Behind affected's gate, the plan's builds ahead of the tests wait for it to open (affected's
    rebuild, which the first failure waits on, has the cores to itself), holding each module's lock
    meanwhile so that no test builds it in the meantime; stopped before the gate opens, they build
    nothing and let the locks go."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock, Timeout

    from fidev.builds import module_builds
    from fidev.upstream import gate as upstream_gate

    built = []

    def build_held(held, say, running, env=None, nice=0, stopped=None):  # as module_builds.build_held, less ninja
        built.append(sorted(held))
        for name in list(held):
            module_builds.release(held, name)

    monkeypatch.setattr(module_builds, "build_held", build_held)
    gate = tmp_path / "gate"
    folders = [module_builds.Folder(name, tmp_path / "cached_ops" / name, ("s.cu",)) for name in ("a", "b")]
    ahead = module_builds.Ahead(folders, print, lambda: upstream_gate.opened(gate))
    with pytest.raises(Timeout):  # held from the start
        FileLock(folders[0].lock_path, thread_local=False).acquire(timeout=0)
    ahead.thread.join(timeout=0.5)
    assert built == [], "built before the gate opened"
    upstream_gate.open_gate(gate)
    ahead.thread.join(timeout=10)
    assert built == [["a", "b"]]
    stopped = module_builds.Ahead(folders, print, lambda: False)
    stopped.stop()
    stopped.thread.join(timeout=10)
    assert built == [["a", "b"]], "a stopped build ahead built"
    FileLock(folders[1].lock_path, thread_local=False).acquire(timeout=0).lock.release()  # let go

    def unreadable() -> bool:
        raise ValueError("a gate file that is no text open_gate wrote")

    broken = module_builds.Ahead(folders, print, unreadable)
    broken.thread.join(timeout=10)
    for folder in folders:  # its thread ended: every lock let go, none left for a test to wait on
        FileLock(folder.lock_path, thread_local=False).acquire(timeout=0).lock.release()


class TouchSpec:
    """A JitSpec as build_specs takes one, whose build only makes its library (`touch`)."""

    def __init__(self, jit_dir: Path, name: str):
        self.name, self.sources = name, ["s.cu"]
        self.build_dir = jit_dir / name
        self.ninja_path = self.build_dir / "build.ninja"
        self.jit_library_path = self.build_dir / f"{name}.so"
        self.lock_path = jit_dir / "tmp" / f"{name}.lock"

    def write_ninja(self) -> None:
        self.build_dir.mkdir(parents=True, exist_ok=True)
        self.ninja_path.write_text(f"rule touch\n  command = touch $out\nbuild {self.jit_library_path}: touch\n")


@needs_a_build
def test_a_warmup_waits_for_a_module_another_holds_without_the_jit_dirs_lock_and_builds_what_it_left(tmp_path):
    """build_specs (a warmup's whole build) waits for a module whose lock another process holds (the
    builds ahead of affected's tests hold theirs until its gate opens, which waits for affected's
    rebuild, under the JIT dir's lock) with that lock let go; and where the other let it go unbuilt
    (its build failed, or it was stopped), builds it itself."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock, Timeout

    from fidev.builds import module_builds

    jit_dir = tmp_path / "cached_ops"
    held, free = TouchSpec(jit_dir, "held"), TouchSpec(jit_dir, "free")
    held.lock_path.parent.mkdir(parents=True)
    other = FileLock(held.lock_path, thread_local=False)
    other.acquire()
    errors = []

    def warmup():
        try:
            module_builds.build_specs([held, free], say=lambda line: None)
        except Exception as e:  # noqa: BLE001 (said by the assertion below)
            errors.append(e)

    thread = threading.Thread(target=warmup, daemon=True)
    thread.start()
    jit_lock = FileLock(jit_dir / "tmp" / "flashinfer_jit.lock", thread_local=False)
    deadline = time.monotonic() + 20
    while not free.jit_library_path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    try:
        jit_lock.acquire(timeout=0)  # affected's rebuild can take it while the warmup waits
        jit_lock.release()
    except Timeout:
        pytest.fail("the warmup waits for another's module while holding the JIT dir's lock")
    finally:
        other.release()  # let go with nothing built
    thread.join(timeout=20)
    assert not thread.is_alive() and errors == [], errors
    assert held.jit_library_path.exists() and free.jit_library_path.exists()


def test_where_the_rebuild_could_not_take_every_modules_lock_no_module_is_said_built_before_it_ends(monkeypatch):
    """A module another process held as the rebuild began is built after the others, its lock free
    meanwhile (build_or_wait): a case ready early, whose record names fewer modules than it loads, could
    load it before it is rebuilt. So the gate then says no module built before it opens whole."""
    for all_held, begun in ((True, "begin"), (False, "begin, no module built before open")):
        run = FakeRun()
        _, said, _ = build_and_test(monkeypatch, run, smoke_fails=False, all_held=all_held)
        assert begun in said, said


class LeftRunning:
    """A run of FlashInfer's tests that the run started and did not stop itself (one a Python edit starts before
    the regeneration, fidev.affected.changes.regenerate_edits): in FlashInferTests.started until stopped."""

    def __init__(self):
        self.stops = 0
        their_tests.FlashInferTests.started.add(self)

    def stop(self):
        self.stops += 1
        their_tests.FlashInferTests.started.discard(self)


@pytest.mark.parametrize("ending", ["returns", "fails", "interrupted"])
def test_flashinfers_tests_the_run_left_running_are_stopped_however_it_ends(monkeypatch, ending):
    """What the run started and left running (FlashInfer's tests a Python edit started early, its verdict then
    reached before their rebuild took them, or a Failure or Ctrl-C between) is stopped once the run ends, each
    once: no upstream-tests process outlives affected, held at its gate."""
    from fidev.affected import judge
    from fidev.affected import summary as affected_summary

    left = []

    def run_affected(args, record):
        left.append(LeftRunning())
        if ending == "fails":
            raise Failure("the regeneration failed", "fix it")
        if ending == "interrupted":
            raise KeyboardInterrupt
        return verdict.Verdict.NOTHING_CHANGED

    monkeypatch.setattr(judge, "run_affected", run_affected)
    monkeypatch.setattr(their_tests.FlashInferTests, "started", set())
    raised = {"returns": None, "fails": Failure, "interrupted": KeyboardInterrupt}[ending]
    if raised is None:
        assert judge.run(judge.Options(), affected_summary.Summary()) is verdict.Verdict.NOTHING_CHANGED
    else:
        with pytest.raises(raised):
            judge.run(judge.Options(), affected_summary.Summary())
    assert [run.stops for run in left] == [1] and not their_tests.FlashInferTests.started


def test_what_build_and_test_started_is_let_go_when_its_rebuild_cannot_start(monkeypatch):
    """The rebuild fails to start (a Failure before smoke's tests, which would join the head-start import):
    FlashInfer's run is stopped, the screen lets its copy of stdout go, and the import is waited for, not
    left importing torch while the interpreter exits."""
    done = []

    class Importing:
        def join(self, timeout=None):
            done.append("import joined")

    class Screen:
        def __call__(self, line):
            done.append(line)

        def close(self):
            done.append("screen closed")

    def cannot_start(to_build, then, say, first, rebuilt):
        raise Failure("norm's lock could not be taken", "free it")

    run = FakeRun()
    monkeypatch.setattr(their_tests, "their_run", lambda *args: (run, GATE_SELECTION))
    monkeypatch.setattr(our_tests, "import_meanwhile", Importing)
    monkeypatch.setattr(affected_tests, "screen", Screen)
    monkeypatch.setattr(affected_tests, "start_rebuild", cannot_start)
    args = (TO_BUILD, None, SMOKE, THEIRS, RECORDED, CHANGED, VERSION_DIR, failed_table, lambda: None, True, "auto")
    with pytest.raises(Failure, match="norm's lock could not be taken"):
        affected_tests.build_and_test(*args)
    assert run.said == ["stop"] and done == ["screen closed", "import joined"]
