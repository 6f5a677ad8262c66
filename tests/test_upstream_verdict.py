"""upstream-tests' verdict rules, in this process: what its processes' outcomes lines say (written
by the plugin's own writer, fidev.upstream.outcomes.Outcomes.write), how a run's counts, failing
tests, comparison with a baseline and exit status follow from them. The script runs them in its own
process (tests/test_upstream_runs.py runs it whole); here each rule is held by a test that fails
without it (the mutation run of docs/testing.md)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fidev.core.failure import USAGE, Failure
from fidev.upstream import outcomes as upstream_outcomes
from fidev.upstream import progress as upstream_progress
from fidev.upstream import runs as upstream_runs
from fidev.upstream import verdict as upstream_verdict
from fidev.upstream.runs import NOT_STARTED, STOPPED_EARLY, FileResult

OOM_MESSAGE = "Skipping due to OOM"  # FlashInfer's conftest (tests/conftest.py, pytest_runtest_call at v0.6.3)
MISSING_MESSAGE = "Skipping due to missing JIT cache for module: norm"  # the same hook's
FEATURE_MESSAGE = "needs sm_100a"


def written(path: Path, *lines: tuple) -> Path:
    """A process's outcomes file, each (node id, outcome[, message]) written as the plugin writes it."""
    writer = SimpleNamespace(path=path)
    for line in lines:
        upstream_outcomes.Outcomes.write(writer, *line)
    return path


def result(outcomes: dict[str, str], ended: str = "exit 0", file: str = "tests/t.py", **kw) -> FileResult:
    return FileResult(file, "0", 1.0, ended, outcomes, **kw)


def test_an_outcomes_file_keeps_each_cases_worst_and_a_case_its_process_died_in_is_an_error(tmp_path):
    path = written(
        tmp_path / "p.jsonl",
        ("", upstream_outcomes.COLLECTED, "digest"),
        ("t.py::a", "started"),
        ("t.py::a", "passed"),
        ("t.py::a", "error"),  # its teardown failed after the call passed
        ("t.py::a", "finished"),
        ("t.py::b", "started"),
        ("t.py::b", "skipped", OOM_MESSAGE),
        ("t.py::b", "finished"),
        ("t.py::c", "started"),
        ("t.py::c", "skipped", MISSING_MESSAGE),
        ("t.py::c", "finished"),
        ("t.py::d", "started"),
        ("t.py::d", "skipped", FEATURE_MESSAGE),
        ("t.py::d", "finished"),
        ("t.py::e", "started"),
        ("t.py::e", "failed"),
        ("t.py::e", "passed"),  # a second report never hides the first failure
        ("t.py::e", "finished"),
        ("t.py::f", "started"),  # the process died in it
    )
    with open(path, "a") as f:
        f.write('{"nodeid": "t.py::g", "outc')  # torn: the process died writing it
    found = upstream_runs.read_outcomes(path)
    assert found == {
        "t.py::a": "error",
        "t.py::b": f"skipped: {upstream_runs.OOM}",
        "t.py::c": f"skipped: {upstream_runs.MISSING_JIT}",
        "t.py::d": f"skipped: {upstream_runs.FEATURE}",
        "t.py::e": "failed",
        "t.py::f": "error",
    }
    # the run's early stop interrupted f: it did not run, it did not error
    assert "t.py::f" not in upstream_runs.read_outcomes(path, stopped=True)
    written(tmp_path / "q.jsonl", ("", upstream_outcomes.STOPPED, "stopped after 1 failing case(s)"))
    assert upstream_runs.stopped_itself(tmp_path / "q.jsonl") and not upstream_runs.stopped_itself(path)
    assert upstream_runs.read_outcomes(tmp_path / "q.jsonl") == {}
    assert upstream_runs.read_outcomes(tmp_path / "missing.jsonl") == {}


def test_counts_merge_the_parts_worst_first_and_a_crash_no_case_took_the_blame_for_is_an_error():
    parts = [
        result({"f::a": "passed", "f::b": "failed", "f": "error"}, part=(1, 2)),
        result({"f::a": "error", "f::c": f"skipped: {upstream_runs.OOM}", "f": "error"}, part=(2, 2)),
    ]
    assert upstream_runs.outcomes(parts) == {
        "f::a": "error",
        "f::b": "failed",
        "f": "error",
        "f::c": f"skipped: {upstream_runs.OOM}",
    }
    assert upstream_runs.counts(parts) == {"passed": 0, "failed": 1, "error": 2, "skipped": 1}
    crashed = result({"g::a": "passed"}, ended="signal 11", file="tests/g.py")
    assert upstream_runs.counts([crashed]) == {"passed": 1, "failed": 0, "error": 1, "skipped": 0}
    blamed = result({"g::a": "passed", "g::b": "error"}, ended="signal 11", file="tests/g.py")
    assert upstream_runs.counts([blamed])["error"] == 1  # the case it died in took the blame: not twice
    assert upstream_runs.skip_summary(parts) == {upstream_runs.OOM: 1}
    assert upstream_runs.line_counts(crashed) == "1 passed, 0 failed, 1 errors, 0 skipped"


@pytest.mark.parametrize(
    ("ended", "outcomes", "crashed"),
    [
        ("exit 0", {}, False),
        ("exit 1", {}, False),
        ("exit 5", {}, False),
        (STOPPED_EARLY, {}, False),
        (NOT_STARTED, {}, False),
        ("exit 2", {"tests/t.py": "error"}, False),  # collection errors stopped it: counted
        ("exit 2", {"tests/t.py::a": "error"}, True),  # pytest.exit() or Ctrl-C in a test
        ("exit 3", {}, True),
        ("exit 4", {}, True),
        ("signal 9", {}, True),
        ("timed out after 7200 s", {}, True),
        ("stopped", {}, True),
    ],
)
def test_a_process_crashed_where_it_did_not_run_to_its_end(ended, outcomes, crashed):
    assert result(outcomes, ended).crashed is crashed


def test_the_failing_list_names_failures_errors_and_the_two_skips_that_hide_one_then_unfinished_files():
    results = [
        result(
            {
                "f::a": "passed",
                "f::b": "failed",
                "f::c": "error",
                "f::d": f"skipped: {upstream_runs.OOM}",
                "f::e": f"skipped: {upstream_runs.MISSING_JIT}",
                "f::f": f"skipped: {upstream_runs.FEATURE}",
            }
        ),
        result({}, ended="signal 11", file="tests/g.py", part=(2, 3)),
        result({}, ended=STOPPED_EARLY, file="tests/h.py"),
    ]
    assert upstream_runs.failing(results) == [
        ("ERROR", "f::c"),
        ("FAILED", "f::b"),
        ("FAILED", "f::d"),
        ("FAILED", "f::e"),
        ("ERROR", "tests/g.py (part 2 of 3) (signal 11)"),
    ]
    assert upstream_runs.stopped_early(results) == [results[2]]


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        ("failed", 1),
        ("error", 1),
        (f"skipped: {upstream_runs.OOM}", 1),
        (f"skipped: {upstream_runs.MISSING_JIT}", 1),
        (f"skipped: {upstream_runs.FEATURE}", 0),
        ("passed", 0),
    ],
)
def test_a_plain_runs_status_is_1_where_a_case_fails_errors_or_hides_a_failure_in_a_skip(outcome, status):
    assert upstream_verdict.passed([result({"f::ok": "passed", "f::x": outcome})]) == status


def test_a_plain_run_where_nothing_passed_is_refused_whatever_else_it_did():
    for outcomes in ({}, {"f::a": f"skipped: {upstream_runs.FEATURE}"}, {"f::a": "failed"}):
        with pytest.raises(Failure, match="no upstream-tests test passed"):
            upstream_verdict.passed([result(outcomes)])


def test_a_comparison_names_what_newly_fails_errors_passes_or_no_longer_runs():
    baseline = {
        "commit": "a" * 40,
        "gpu": "H200",
        "outcomes": {
            "f::fine": "passed",
            "f::broke": "passed",
            "f::oom": "passed",
            "f::was_failing": "failed",
            "f::fixed": "failed",
            "f::gone": "passed",
            "f::erroring": "passed",
            "g::gone_with_its_file": "passed",
            "h::gone_with_its_stop": "passed",
        },
        "crashed": ["tests/k.py"],
    }
    results = [
        result(
            {
                "f::fine": "passed",
                "f::broke": "failed",
                "f::oom": f"skipped: {upstream_runs.OOM}",
                "f::was_failing": "failed",
                "f::fixed": "passed",
                "f::erroring": "error",
                "f::new": "failed",
            },
            file="f",
        ),
        result({}, ended="signal 6", file="g"),
        result({}, ended=STOPPED_EARLY, file="h"),
        result({}, ended="signal 6", file="tests/k.py"),
    ]
    assert upstream_runs.compare(baseline, results) == {
        "newly failing": ["f::broke", "f::new", "f::oom"],
        "newly erroring": ["f::erroring", "g (signal 6)"],
        "newly passing": ["f::fixed"],
        "not run since": ["f::gone"],
    }


def test_a_comparisons_status_is_1_only_where_something_newly_fails_or_errors(tmp_path, capsys):
    written(tmp_path / "p.jsonl", ("f::a", "passed"))
    baseline = {"commit": "b" * 40, "gpu": "H200"}
    nothing = {"newly failing": [], "newly erroring": [], "newly passing": ["f::x"], "not run since": ["f::y"]}
    assert upstream_verdict.say_compared(baseline, tmp_path / "base.json", nothing, tmp_path) == 0
    for kind in ("newly failing", "newly erroring"):
        assert (
            upstream_verdict.say_compared(baseline, tmp_path / "base.json", {**nothing, kind: ["f::z"]}, tmp_path) == 1
        )
    assert (tmp_path / upstream_verdict.COMPARED_LIST).read_text().splitlines() == [
        "newly erroring: f::z",
        "newly passing: f::x",
        "not run since: f::y",
    ]
    assert f"against the baseline of tree {'b' * 12} on H200" in capsys.readouterr().out


def test_a_comparison_where_nothing_passed_and_nothing_newly_failed_is_refused(tmp_path):
    written(tmp_path / "p.jsonl", ("f::a", "skipped", FEATURE_MESSAGE), ("f::b", "passed"), ("f::b", "error"))
    baseline = {"commit": "c" * 40, "gpu": "H200"}
    nothing = {"newly failing": [], "newly erroring": [], "newly passing": [], "not run since": []}
    assert upstream_verdict.passed_in(tmp_path) == 0
    with pytest.raises(Failure, match="a comparison with the baseline of nothing"):
        upstream_verdict.say_compared(baseline, tmp_path / "base.json", nothing, tmp_path)
    # one that newly fails is the answer: 1, not refused
    assert upstream_verdict.say_compared(
        baseline, tmp_path / "b.json", {**nothing, "newly failing": ["f::b"]}, tmp_path
    )


def test_a_baseline_of_nothing_is_refused_and_one_that_passed_is_kept(tmp_path):
    with pytest.raises(Failure, match="a baseline of nothing"):
        upstream_verdict.record_baseline([result({"f::a": "failed"})], ["norm"], tmp_path / "b.json", "d" * 40, "H200")
    assert not (tmp_path / "b.json").exists()
    crashed = result({}, ended="signal 9", file="tests/g.py")
    assert (
        upstream_verdict.record_baseline(
            [result({"f::a": "passed", "f::b": "failed"}), crashed], ["norm"], tmp_path / "b.json", "d" * 40, "H200"
        )
        == 0
    )
    kept = upstream_runs.load_baseline(tmp_path / "b.json")
    assert kept["outcomes"] == {"f::a": "passed", "f::b": "failed"} and kept["crashed"] == ["tests/g.py"]


def test_pytest_refusing_every_files_arguments_is_a_usage_error_and_selecting_nothing_is_two_lines(tmp_path):
    log = tmp_path / "t.log"
    # pytest's own lines for an option it does not take (pytest 8)
    log.write_text(
        "ERROR: usage: python -m pytest [options] [file_or_dir] [file_or_dir] [...]\n"
        "python -m pytest: error: unrecognized arguments: --bogus\n  inifile: None\n"
    )
    refusing = [result({}, ended="exit 4", junit=str(tmp_path / "t.xml"))] * 2
    with pytest.raises(Failure) as refused:
        upstream_verdict.refused(refusing, ["--bogus"])
    assert refused.value.exit_status == USAGE and "unrecognized arguments: --bogus" in refused.value.problem
    upstream_verdict.refused([*refusing[:1], result({"f::a": "passed"})], ["--bogus"])  # one file ran: no refusal
    with pytest.raises(Failure, match="no upstream-tests test was selected") as nothing:
        upstream_verdict.refused([result({}, ended="exit 5")] * 2, ["-k", "nothing"])
    assert nothing.value.exit_status != USAGE
    upstream_verdict.refused([result({}, ended="exit 5"), result({"f::a": "passed"})], ["-k", "a"])
    log.write_text(  # pytest's lines where the conftest does not import
        "ImportError while loading conftest '/t/tests/conftest.py'.\n"
        "tests/conftest.py:1: in <module>\n    import torch\n"
        "E   ModuleNotFoundError: No module named 'torch'\n"
    )
    with pytest.raises(
        Failure, match="conftest.py could not be imported: ModuleNotFoundError: No module named .torch. .log: "
    ):
        upstream_verdict.refused(refusing, [])


def test_the_first_failure_is_the_earliest_case_that_fails_the_run_and_unfinished_cases_are_counted(tmp_path):
    path = written(
        tmp_path / "p.jsonl",
        ("t.py::a", "passed"),
        ("t.py::b", "skipped", FEATURE_MESSAGE),
        ("t.py::c", "skipped", OOM_MESSAGE),
        ("t.py::d", "failed"),
    )
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    written(tmp_path / "q.jsonl", ("u.py::e", "error"))
    assert upstream_runs.first_failure(tmp_path) == lines[2]["t"]  # the OOM skip hides a failure
    assert upstream_runs.first_failure(tmp_path / "none") is None
    assert upstream_runs.not_run(path) is None  # no total written yet
    progress = upstream_outcomes.progress_path(path)
    progress.write_text(
        json.dumps({"schema": upstream_outcomes.PROGRESS_SCHEMA, "total": 6, "done": 2, "failed": 0, "t": 0.0})
    )
    written(path, ("t.py::a", "finished"), ("t.py::b", "finished"), ("t.py::b", "finished"))
    assert upstream_runs.not_run(path) == 4
    assert upstream_progress.read_progress(progress) is not None


def test_how_a_process_ended(tmp_path):
    stop = upstream_runs.Stop()
    quiet = written(tmp_path / "p.jsonl", ("t.py::a", "passed"))
    assert upstream_runs.how_it_ended(1, stop, quiet) == "exit 1"
    assert upstream_runs.how_it_ended(-11, stop, quiet) == "signal 11"
    stop.early.set()  # the run's early stop: a process it ended, not one that ended by itself
    assert upstream_runs.how_it_ended(-2, stop, quiet) == STOPPED_EARLY
    assert upstream_runs.how_it_ended(2, stop, quiet) == STOPPED_EARLY
    for code in (0, 1, 5):
        assert upstream_runs.how_it_ended(code, stop, quiet) == f"exit {code}"
    itself = written(tmp_path / "q.jsonl", ("", upstream_outcomes.STOPPED, "stopped"))
    assert upstream_runs.how_it_ended(2, upstream_runs.Stop(), itself) == STOPPED_EARLY
    stop.flag.set()  # an interrupt: whatever else
    assert upstream_runs.how_it_ended(0, stop, itself) == "stopped"


def test_parts_that_collected_different_lists_are_named():
    same = [result({}, part=(1, 2), collected={"x"}), result({}, part=(2, 2), collected={"x"})]
    other = [
        result({}, file="g", part=(1, 2), collected={"x"}),
        result({}, file="g", part=(2, 2), collected={"y"}),
    ]
    whole = [result({}, file="h", collected={"x"}), result({}, file="h", collected={"y"})]
    assert upstream_runs.mismatched([*same, *other, *whole]) == ["g"]


def test_a_line_lacking_what_the_reader_may_do_without_is_read_and_an_outcome_it_does_not_know_is_an_error(tmp_path):
    """ENTRY lets a line lack its nodeid, outcome or message (fidev.upstream.runs): a line without an
    outcome, or with one the plugin never writes, is an error (not a pass); a skip without its
    message is one the hardware lacks; a line without a node id is counted under "?"."""
    path = tmp_path / "p.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(line)
            for line in (
                {"nodeid": "t.py::a"},
                {"nodeid": "t.py::b", "outcome": "xpassed-somehow"},
                {"nodeid": "t.py::c", "outcome": "skipped"},
                {"outcome": "passed"},
                {"nodeid": "t.py::d", "outcome": "skipped", "t": 5.0},
                {"nodeid": "t.py::d", "outcome": "passed"},  # a later pass does not hide the skip
            )
        )
        + "\n"
    )
    assert upstream_runs.read_outcomes(path) == {
        "t.py::a": "error",
        "t.py::b": "error",
        "t.py::c": f"skipped: {upstream_runs.FEATURE}",
        "?": "passed",
        "t.py::d": f"skipped: {upstream_runs.FEATURE}",
    }
    assert upstream_runs.counts([result(upstream_runs.read_outcomes(path))]) == {
        "passed": 1,
        "failed": 0,
        "error": 2,
        "skipped": 2,
    }
    assert upstream_runs.first_failure(tmp_path) is None  # a skip without its message fails nothing
    assert upstream_runs.skip_summary([result(upstream_runs.read_outcomes(path))]) == {upstream_runs.FEATURE: 2}


def test_a_process_that_finished_every_case_left_none_unrun(tmp_path):
    path = written(tmp_path / "p.jsonl", ("t.py::a", "passed"), ("t.py::a", "finished"))
    upstream_outcomes.progress_path(path).write_text(
        json.dumps({"schema": upstream_outcomes.PROGRESS_SCHEMA, "total": 1, "done": 1, "failed": 0, "t": 0.0})
    )
    assert upstream_runs.not_run(path) == 0


def test_both_skips_that_hide_a_failure_count_together():
    hidden = {
        "f::a": "passed",
        "f::b": f"skipped: {upstream_runs.OOM}",
        "f::c": f"skipped: {upstream_runs.MISSING_JIT}",
    }
    assert upstream_verdict.passed([result(hidden)]) == 1


def test_a_comparison_counts_an_error_that_was_a_failure_as_no_new_one_and_reads_a_baseline_without_crashes():
    baseline = {"commit": "e" * 40, "gpu": "H200", "outcomes": {"f::a": "failed", "f::b": "error", "f::c": "passed"}}
    now = [result({"f::a": "error", "f::b": "error", "f::c": "error"}, file="f")]
    assert upstream_runs.compare(baseline, now)["newly erroring"] == ["f::c"]
    crashed = [result({"f::c": "passed"}, ended="signal 9", file="f")]
    assert upstream_runs.compare(baseline, crashed)["newly erroring"] == ["f (signal 9)"]


def test_a_comparison_names_its_first_fifty_of_a_kind_and_where_the_rest_are(tmp_path, capsys):
    written(tmp_path / "p.jsonl", ("f::a", "passed"))
    baseline = {"commit": "f" * 40, "gpu": "H200"}
    for n, more in ((upstream_verdict.COMPARED_SHOWN, False), (upstream_verdict.COMPARED_SHOWN + 3, True)):
        ids = [f"f::t{i:03d}" for i in range(n)]
        changes = {"newly failing": ids, "newly erroring": [], "newly passing": [], "not run since": []}
        upstream_verdict.say_compared(baseline, tmp_path / "base.json", changes, tmp_path)
        out = capsys.readouterr().out
        assert f"  newly failing: {n}\n" + "".join(f"    {i}\n" for i in ids[: upstream_verdict.COMPARED_SHOWN]) in out
        listed = tmp_path / upstream_verdict.COMPARED_LIST
        assert (f"    ... and 3 more: {listed}\n" in out) is more and ("more:" in out) is more, out
        assert "  newly erroring: 0\n  newly passing: 0\n" in out


NO_GPU_FIX = "run it on a host with an NVIDIA GPU, inside the flashinfer-dev environment"


def test_each_refusal_of_a_run_that_passed_nothing_is_its_problem_and_its_fix(tmp_path):
    with pytest.raises(Failure) as plain:
        upstream_verdict.passed([result({})])
    assert (plain.value.problem, plain.value.fix) == (
        "no upstream-tests test passed (counts above; each file's log is in the run folder)",
        NO_GPU_FIX,
    )
    with pytest.raises(Failure) as baseline:
        upstream_verdict.record_baseline([result({})], ["norm"], tmp_path / "b.json", "0" * 40, "H200")
    assert (baseline.value.problem, baseline.value.fix) == (
        "no test passed: a baseline of nothing (counts above; each file's log is in the run folder)",
        NO_GPU_FIX,
    )
    nothing = {"newly failing": [], "newly erroring": [], "newly passing": [], "not run since": []}
    with pytest.raises(Failure) as compared:
        upstream_verdict.say_compared({"commit": "1" * 40, "gpu": "H200"}, tmp_path / "b.json", nothing, tmp_path)
    assert (compared.value.problem, compared.value.fix) == (
        f"no test passed: a comparison with the baseline of nothing (counts above; each file's log is in {tmp_path})",
        NO_GPU_FIX,
    )


def test_a_recorded_baseline_says_what_it_kept(tmp_path, capsys):
    results = [result({"f::a": "passed", "f::b": "failed"})]
    upstream_verdict.record_baseline(results, ["norm", "rope"], tmp_path / "b.json", "2" * 40, "H200")
    assert capsys.readouterr().out == (
        f"upstream-tests: baseline of 2 tests recorded for norm rope (tree {'2' * 12}, H200): {tmp_path / 'b.json'}\n"
    )


def test_each_refusal_of_pytests_arguments_is_its_problem_and_its_fix_from_the_first_files_log(tmp_path):
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_bytes(b"ERROR: usage: python -m pytest [options]\npytest: error: unrecognized arguments: -Z \xff\n")
    second.write_text("python -m pytest: error: something else\n")
    refusing = [
        result({}, ended="exit 4", junit=str(tmp_path / "a.xml")),
        result({}, ended="exit 4", junit=str(tmp_path / "b.xml")),
    ]
    with pytest.raises(Failure) as usage:  # a log that is not UTF-8 is read all the same
        upstream_verdict.refused(refusing, ["-Z"])
    assert (usage.value.problem, usage.value.fix) == (
        "upstream-tests: pytest refused the arguments: pytest: error: unrecognized arguments: -Z \ufffd",
        "see `upstream_tests.py --help`; what it does not take goes to pytest (`python -m pytest --help` lists its "
        "options)",
    )
    first.write_text("ERROR: usage: python -m pytest [options]\n")
    with pytest.raises(Failure, match="refused the arguments: ERROR: usage: python -m pytest"):
        upstream_verdict.refused(refusing, ["-Z"])
    first.write_text("no line of pytest's own\n")
    with pytest.raises(Failure, match="refused the arguments: pytest's usage error, in the file's log$"):
        upstream_verdict.refused(refusing, ["-Z"])
    first.write_text("ImportError while loading conftest '/t/tests/conftest.py'.\n")
    with pytest.raises(Failure) as conftest:
        upstream_verdict.refused(refusing, [])
    assert (conftest.value.problem, conftest.value.fix) == (
        f"FlashInfer's tests/conftest.py could not be imported: see its log (log: {first})",
        "`python -c 'import flashinfer'` shows why; `pixi run -e flashinfer-dev preflight` names what is off",
    )
    for args, said in ((["-k", "nothing"], "-k nothing"), ([], "none collected")):
        with pytest.raises(Failure) as nothing:
            upstream_verdict.refused([result({}, ended="exit 5")] * 2, args)
        assert (nothing.value.problem, nothing.value.fix) == (
            f"no upstream-tests test was selected ({said})",
            "check the -k/-m expression; `upstream-tests FAMILY --collect-only -q` lists the tests",
        )
