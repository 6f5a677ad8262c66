"""What a test file's process writes for upstream-tests (fidev.upstream.outcomes.Outcomes), in this process:
each case's outcome line from pytest's reports, the cases that fail the run in the run's stop file, and its
progress beside the outcomes. upstream-tests loads it into pytest processes of its own
(tests/test_upstream_runs.py runs it there); here each rule is held by a test that fails without it."""

import json
import time
from types import SimpleNamespace

from fidev.upstream import outcomes as upstream_outcomes

FEATURE_SKIP = ("tests/a.py", 3, "Skipped: not supported here")


def report(nodeid, when="call", outcome="passed", longrepr=None):
    """A pytest test or collect report, as much of it as Outcomes reads."""
    return SimpleNamespace(
        nodeid=nodeid,
        when=when,
        outcome=outcome,
        passed=outcome == "passed",
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        longrepr=longrepr,
    )


def lines(path):
    written = map(json.loads, path.read_text().splitlines())
    return [(line["nodeid"], line["outcome"], line["message"]) for line in written]


def test_each_reports_outcome_is_one_line_and_a_failed_setup_or_teardown_is_an_error(tmp_path):
    path, stop = tmp_path / "o.jsonl", tmp_path / "stop"
    writer = upstream_outcomes.Outcomes(path, stop)
    writer.pytest_runtest_logstart("a::t", ("a.py", 1, "t"))
    for r in (
        report("a::t", "setup"),
        report("a::t", "call"),
        report("a::t", "teardown"),
        report("a::u", "call", "failed", "assert 0"),
        report("a::v", "setup", "failed", "fixture"),
        report("a::w", "teardown", "failed", "cleanup"),
        report("a::x", "setup", "skipped", FEATURE_SKIP),
        report("a::y", "call", "skipped", "a skip without its place"),
        report("a::z", "call", "skipped", ("a.py", "its place")),
    ):
        writer.pytest_runtest_logreport(r)
    writer.pytest_runtest_logfinish("a::t", ("a.py", 1, "t"))
    assert lines(path) == [
        ("a::t", "started", ""),
        ("a::t", "passed", ""),
        ("a::u", "failed", ""),
        ("a::v", "error", ""),
        ("a::w", "error", ""),
        ("a::x", "skipped", "Skipped: not supported here"),
        ("a::y", "skipped", "a skip without its place"),
        ("a::z", "skipped", "('a.py', 'its place')"),
        ("a::t", "finished", ""),
    ]
    assert writer.done == 1 and writer.failed == {"a::u", "a::v", "a::w"}
    assert stop.read_text() == "a::u\na::v\na::w\n"


def test_a_message_is_cut_to_its_first_300_characters(tmp_path):
    path = tmp_path / "o.jsonl"
    upstream_outcomes.Outcomes(path).write("a::t", "skipped", "m" * 299 + "!" + "cut")
    assert lines(path) == [("a::t", "skipped", "m" * 299 + "!")]


def test_a_file_that_did_not_collect_is_an_error_and_one_skipped_whole_is_one_skip(tmp_path):
    path, stop = tmp_path / "o.jsonl", tmp_path / "stop"
    writer = upstream_outcomes.Outcomes(path, stop)
    writer.pytest_collectreport(report("tests/a.py", "collect", "failed", "x" * 10 + "ImportError: " + "y" * 300))
    writer.pytest_collectreport(report("tests/b.py", "collect", "skipped", ("tests/b.py", 1, "Skipped: no sm90")))
    writer.pytest_collectreport(report("tests/c.py", "collect", "passed"))
    assert lines(path) == [("tests/a.py", "error", "y" * 300), ("tests/b.py", "skipped", "Skipped: no sm90")]
    assert writer.failed == {"tests/a.py"} and stop.read_text() == "tests/a.py\n"


def test_a_failing_case_is_named_once_on_one_line_of_the_stop_file(tmp_path):
    stop = tmp_path / "stop"
    writer = upstream_outcomes.Outcomes(tmp_path / "o.jsonl", stop)
    writer.failing("a.py::t[x\ny]")
    writer.failing("a.py::t[x\ny]")
    writer.failing("a.py::u")
    assert stop.read_text() == "a.py::t[x y]\na.py::u\n"
    assert upstream_outcomes.failures_named(stop) == {"a.py::t[x y]", "a.py::u"}
    alone = upstream_outcomes.Outcomes(tmp_path / "p.jsonl")
    alone.failing("a.py::t")
    assert alone.failed == {"a.py::t"}


def progress(path):
    record = json.loads(upstream_outcomes.progress_path(path).read_text())
    assert record.pop("schema") == upstream_outcomes.PROGRESS_SCHEMA and record.pop("t") > 0, record
    return record


def test_the_progress_says_no_total_until_collected_and_is_written_again_only_where_it_moved(tmp_path):
    path = tmp_path / "o.jsonl"
    writer = upstream_outcomes.Outcomes(path)
    writer.PROGRESS_EVERY_S = 3600.0  # its thread's next look, after the one it is sleeping: none in this test
    writer.progress()
    assert progress(path) == {"total": None, "done": 0, "failed": 0}, "cases to run said before they were collected"
    writer.pytest_collection_finish(SimpleNamespace(items=[1, 2, 3]))
    assert progress(path) == {"total": 3, "done": 0, "failed": 0}
    upstream_outcomes.progress_path(path).unlink()
    writer.progress()
    assert not upstream_outcomes.progress_path(path).exists(), "the progress was written again, though it had not moved"
    writer.pytest_runtest_logfinish("a::t", None)
    writer.pytest_runtest_logfinish("a::u", None)
    writer.failing("a::t")
    writer.pytest_sessionfinish(None)
    assert progress(path) == {"total": 3, "done": 2, "failed": 1}


def test_the_progress_of_a_running_process_is_written_by_its_thread(tmp_path):
    path = tmp_path / "o.jsonl"
    writer = upstream_outcomes.Outcomes(path)
    writer.total, writer.done = 4, 2
    deadline = time.monotonic() + 10
    while not upstream_outcomes.progress_path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert progress(path) == {"total": 4, "done": 2, "failed": 0}
