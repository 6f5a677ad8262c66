"""upstream-tests' summary of a run, the file its readers take its result from (affected, the
acceptance run, the benchmarks): `summary.json` in the run folder, and a copy where the caller
asked (`upstream-tests --summary FILE`). Written whole or not at all (a temporary file renamed
into place); a reader refuses a file it cannot read, or of another schema, in two lines.

The fields (SCHEMA, version 1):
  schema        "fidev-upstream-summary/1"
  selection     the families and paths named, then pytest's arguments
  kernel_source the kernel-source mode the run was under
  run_dir       the run folder (each process's JUnit XML, log and outcomes)
  gpus          the GPUs used, by index; gpu_name their model
  started, ended  time.time() at the run's start and end
  status        the exit status upstream-tests returned
  counts        {"passed", "skipped", "failed", "error"}: the run's tests, each counted once
  skips         {kind: how many}: the skipped tests by reason
  failing       node ids that failed (an out-of-memory or missing-module skip fails too)
  erroring      node ids that errored, and "<file> (<how it ended>)" for each process that did not finish
  processes     one per pytest process: {"file", "part": [i, k], "gpu", "seconds", "ended", "counts"};
                "ended" is "stopped early" or "not started" for those a run stopped early stopped or never started
  last_case_end time.time() when the last test case finished; null where none did
  compared      against a baseline: {"newly failing": [...], ...}; null without one
  sample        with --sample (fidev.upstream.sample): {"selected", "total" (cases of the test functions
                run), "seed", "functions", "whole" and "missed" (required modules: their functions run
                whole, or nothing recorded for them)}; null for a run of every case
  first_failure_s  seconds from the run's start (`started`) to the end of its first failing case; null where none failed
  stop_after    --stop-after's count (0: the run was to run everything)
  stopped_early true where the run stopped at stop_after failing cases: a failing run (status 1), whatever its
                counts say
  not_run       the cases the processes stopped early had collected to run and did not run
  not_counted   the processes of a run stopped early whose cases are not in not_run: never started, or
                stopped before they had collected (their "ended" in processes says which)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.files import MayLack, fits, read_record, write_output

SCHEMA = "fidev-upstream-summary/1"
NAME = "summary.json"
COUNTS = ("passed", "skipped", "failed", "error")
# what readers take of `sample` (fidev.upstream.sample.merge_records)
SAMPLE = {"selected": int, "total": int, "missed": MayLack(list[str])}


@dataclass
class Process:
    file: str
    part: list[int]
    gpu: str | None
    seconds: float
    ended: str
    counts: dict[str, int]


@dataclass
class Summary:
    selection: list[str]
    kernel_source: str
    run_dir: str
    gpus: list[str]
    gpu_name: str
    started: float
    ended: float
    status: int
    counts: dict[str, int]
    skips: dict[str, int] = field(default_factory=dict)
    failing: list[str] = field(default_factory=list)
    erroring: list[str] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    last_case_end: float | None = None
    compared: dict[str, list[str]] | None = None
    sample: dict | None = None
    first_failure_s: float | None = None
    stop_after: int = 0
    stopped_early: bool = False
    not_run: int = 0
    not_counted: list[str] = field(default_factory=list)

    @property
    def failed_ids(self) -> set[str]:
        """What failed or errored: the ids a rerun names."""
        return set(self.failing) | set(self.erroring)


def write(summary: Summary, *paths: Path) -> None:
    """The summary into each path, whole or not at all; where a write fails, two lines that name the path,
    the OS error and the run's status, which it keeps (fidev.core.files.write_output)."""
    text = json.dumps({"schema": SCHEMA, **asdict(summary)}, indent=1)
    for path in paths:
        write_output(
            path, text, "upstream-tests' summary", f"the run itself ended with status {summary.status}", summary.status
        )


def read(path: Path) -> Summary:
    """The summary at `path`; two lines where it is missing, truncated or of another schema."""
    fix = "run upstream-tests again: it writes the summary whole at its end (a run stopped before then has none)"
    data = read_record(path, SCHEMA, "upstream-tests' summary", fix)
    if not fits(data, Summary):
        raise Failure(
            f"upstream-tests' summary {path} lacks a field, has an unknown one, or one of another type than "
            f"{SCHEMA} gives it",
            fix,
        )
    summary = Summary(**{**data, "processes": [Process(**p) for p in data.get("processes", [])]})
    if set(summary.counts) != set(COUNTS):
        raise Failure(f"upstream-tests' summary {path} counts {sorted(summary.counts)}, not {list(COUNTS)}", fix)
    if any(set(p.counts) != set(COUNTS) or len(p.part) != 2 for p in summary.processes):
        raise Failure(
            f"upstream-tests' summary {path} has a process whose counts are not {list(COUNTS)}, or whose "
            "part is no [i, k]",
            fix,
        )
    if summary.sample is not None and not fits(summary.sample, SAMPLE):
        raise Failure(
            f"upstream-tests' summary {path} has a sample of another shape than its selected, total and missed", fix
        )
    return summary
