"""What a test file's process of a run writes for upstream-tests to read (fidev.upstream.runs,
fidev.upstream.progress): each case's outcome, one JSON object per line; its progress beside them
(PROGRESS_SCHEMA, written whole: cases to run, done, failed); and, with the run's early stop, each
failing case's node id appended to the file the run's processes share (the run's stop file). Before
each case a process reads that file, and once it names the run's stop-after count or more it runs
no more cases: it records STOPPED in its outcomes and ends as `pytest -x` does.

Skips are told apart by FlashInfer's conftest messages (tests/conftest.py, `pytest_runtest_call` at
v0.6.3), which turn an out-of-memory and a missing module into skips: those two fail the run.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from fidev.core.files import write_whole

COLLECTED = "collected"  # a part's line in its outcomes: a digest of the node ids it collected, before taking its share
STOPPED = (
    "stopped"  # a process's line in its outcomes: it ran no more cases, the run's failures having reached its stop
)
PROGRESS_SCHEMA = (
    "fidev-upstream-progress/1"  # "<outcomes file>.progress": {"total": cases to run or null, "done", "failed", "t"}
)
OOM, MISSING_JIT, FEATURE = "out of memory", "JIT module missing", "not supported here"


def skip_kind(message: str) -> str:
    """Why a test skipped, from FlashInfer's conftest messages (tests/conftest.py, `pytest_runtest_call` at v0.6.3)."""
    if "Skipping due to OOM" in message or "out of memory" in message:
        return OOM
    if "missing JIT cache" in message:
        return MISSING_JIT
    return FEATURE


def fails_the_run(outcome: str | None, message: str = "") -> bool:
    """Whether a case's outcome, as the outcomes lines say it, fails the run: a failure, an error,
    or a skip FlashInfer's conftest made of a failure (an out-of-memory or missing-module skip)."""
    return outcome in ("failed", "error") or (outcome == "skipped" and skip_kind(message) != FEATURE)


def progress_path(outcomes: str | Path) -> Path:
    """Where a process whose outcomes go to `outcomes` writes its progress."""
    return Path(f"{outcomes}.progress")


def failures_named(path: Path) -> set[str]:
    """The distinct failing cases the run's processes appended to its stop file (none where it is missing);
    a last line without its newline is still being written, and not one yet."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return set()
    return {line for line in text[: text.rfind("\n") + 1].splitlines() if line}


class Outcomes:
    """Each test's outcome by its real node id, one JSON object per line (the file's process may
    die part way: what was written stays): the call's outcome, a skip with its message, and as
    errors a failed setup or teardown and a file that did not collect. Its progress beside it
    (progress_path, written whole: once collected, then by a thread every PROGRESS_EVERY_S where it
    moved, and at the end), and each failing case to the run's stop file where it has one."""

    PROGRESS_EVERY_S = 0.5

    def __init__(self, path: Path, stop_file: Path | None = None):
        self.path = path
        self.stop_file = stop_file
        self.total: int | None = None  # the cases this process runs, once collected (its part's and the gate's share)
        self.done, self.failed, self.written = 0, set(), None
        self.lock = threading.Lock()
        threading.Thread(target=self.keep_progress, daemon=True).start()

    def write(self, nodeid: str, outcome: str, message: str = "") -> None:
        with open(self.path, "a") as f:
            f.write(
                json.dumps({"nodeid": nodeid, "outcome": outcome, "message": message[:300], "t": time.time()}) + "\n"
            )

    def progress(self) -> None:
        """The progress file, where it moved since it was last written."""
        with self.lock:
            now = (self.total, self.done, len(self.failed))
            if now != self.written:
                self.written = now
                write_whole(
                    progress_path(self.path),
                    json.dumps(
                        {
                            "schema": PROGRESS_SCHEMA,
                            "total": self.total,
                            "done": self.done,
                            "failed": len(self.failed),
                            "t": time.time(),
                        }
                    ),
                )

    def keep_progress(self) -> None:
        while True:
            time.sleep(self.PROGRESS_EVERY_S)
            self.progress()

    def failing(self, nodeid: str) -> None:
        """A case that fails the run (failed, errored, or a skip FlashInfer's conftest made of a failure)."""
        if nodeid in self.failed:
            return
        self.failed.add(nodeid)
        if self.stop_file:
            with open(self.stop_file, "a") as f:  # one short line per write, appended: the run's processes share it
                f.write(nodeid.replace("\n", " ") + "\n")

    def pytest_collection_finish(self, session):
        self.total = len(session.items)
        self.progress()

    def pytest_runtest_logstart(self, nodeid, location):
        self.write(nodeid, "started")  # a process that dies in a test leaves it started, never finished

    def pytest_runtest_logfinish(self, nodeid, location):
        self.write(nodeid, "finished")
        self.done += 1

    def pytest_sessionfinish(self, session):
        self.progress()

    @staticmethod
    def skip_message(report) -> str:
        """A skip's reason: pytest keeps it as (path, line, message) in longrepr, for a test and for a
        file skipped whole (`pytest.skip(..., allow_module_level=True)`, _pytest/reports.py)."""
        return (
            report.longrepr[2]
            if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3
            else str(report.longrepr)
        )

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            message = self.skip_message(report)
            self.write(report.nodeid, "skipped", message)
            if fails_the_run("skipped", message):
                self.failing(report.nodeid)
        elif report.when == "call":
            self.write(report.nodeid, report.outcome)
        elif report.failed:
            self.write(report.nodeid, "error")
        if report.failed:
            self.failing(report.nodeid)

    def pytest_collectreport(self, report):
        if report.failed:
            self.write(report.nodeid, "error", str(report.longrepr)[-300:])
            self.failing(report.nodeid)
        elif report.skipped:  # a file skipped whole: one skip, as pytest counts it
            self.write(report.nodeid, "skipped", self.skip_message(report))


class XdistTotal:
    """Under pytest-xdist the controller collects nothing: its cases to run are those a worker
    collected (each collects the same list, the part's and the gate's share taken)."""

    def __init__(self, outcomes: Outcomes):
        self.outcomes = outcomes

    def pytest_xdist_node_collection_finished(self, node, ids):
        self.outcomes.total = len(ids)
        self.outcomes.progress()


def early_stop(after: int, stop_file: Path, outcomes: str):
    """The plugin that runs no more cases once the run's processes have named `after` failing cases
    in `stop_file`: each case is checked before it starts (its file read again only where it grew);
    the first case not run records STOPPED in the outcomes, and the session ends as `pytest -x` ends
    it (an xdist worker skips the rest instead: its controller ends when they are done)."""
    import pytest  # in a pytest process: fidev itself imports only the standard library

    class EarlyStop:
        def __init__(self):
            self.size, self.reached, self.said = -1, False, False

        def check(self) -> bool:
            try:
                size = stop_file.stat().st_size
            except OSError:
                return False
            if size != self.size:
                self.size = size
                self.reached = len(failures_named(stop_file)) >= after
            return self.reached

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(self, item, nextitem):
            if not self.check():
                return None
            if not self.said:  # once: an xdist worker goes on skipping the rest, its session not stopped
                self.said = True
                reason = f"stopped after {after} failing case(s) across the run (--stop-after {after})"
                with open(outcomes, "a") as f:
                    f.write(json.dumps({"nodeid": "", "outcome": STOPPED, "message": reason, "t": time.time()}) + "\n")
                if not hasattr(item.config, "workerinput"):
                    item.session.shouldstop = reason
            return True  # not run

    return EarlyStop()
