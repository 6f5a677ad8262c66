"""affected's summary of a run, the file its readers take its result from (the acceptance run,
tools/gpu_acceptance.py): written where the caller asked (`affected --summary FILE`), whole or not
at all (a temporary file renamed into place), whatever the run's end; a reader refuses a file it
cannot read, or of another schema, in two lines.

The fields (SCHEMA, version 1):
  schema      "fidev-affected-summary/1"
  verdict     one of VERDICTS: passed, failed, not covered (status 3: a kernel family the edit
              reaches went untested), nothing changed, no module changed (the changed files reach
              no built module), listed (--list), build failed, error (a refusal: problem says it),
              interrupted
  status      the exit status affected returned
  changed     {changed file, as the table shows it: the modules it reaches}
  tests       the tests selected: smoke's and abi-smoke's node ids, then FlashInfer's test functions
  failed      the ids that failed or errored
  rebuilt     the modules rebuilt; build_s the rebuild's seconds (null where nothing was built)
  past_build  {"ended_s", "last_case_s", "first_failure_s"}: FlashInfer's tests after the build, to
              their end, to their last case (the PAST_BUILD line) and to their first failing case
              (null where none failed); null where none ran behind the gate
  seconds     the run's time in all
  problem     the error's first line, where the run ended in one; else null
  compiled    {module: its objects compiled during the run, or null where ninja's log cannot tell}
              (fidev.records.compile_log), for every module that compiled any
  compiled_twice  the modules an object of which compiled more than once (or null above)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from fidev.affected.verdict import Verdict
from fidev.core.failure import Failure
from fidev.core.files import MayLack, fits, read_record, write_output
from fidev.core.numbers import short

SCHEMA = "fidev-affected-summary/1"
VERDICTS = tuple(v.value for v in Verdict)
LATER = ("compiled", "compiled_twice")  # fields added within version 1: a summary written before them reads with none
# past_build's figures (fidev.affected.theirs.past_figures)
PAST_BUILD = {"ended_s": float, "last_case_s": float, "first_failure_s": MayLack(float | None)}


@dataclass
class Summary:
    verdict: str = Verdict.ERROR.value
    status: int = Verdict.ERROR.status
    changed: dict[str, list[str]] = field(default_factory=dict)
    tests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rebuilt: list[str] = field(default_factory=list)
    build_s: float | None = None
    past_build: dict[str, float | None] | None = None
    seconds: float = 0.0
    problem: str | None = None
    compiled: dict[str, int | None] = field(default_factory=dict)
    compiled_twice: list[str] = field(default_factory=list)

    @property
    def modules(self) -> set[str]:
        """Every module a changed file reaches."""
        return {name for names in self.changed.values() for name in names}


def write(summary: Summary, path: Path) -> None:
    """The summary into `path`, whole or not at all; where the write fails, two lines that name the path, the
    OS error and how the run ended, with its status (fidev.core.files.write_output)."""
    verdict = getattr(summary.verdict, "value", summary.verdict)
    ended = f"affected itself ended {verdict}, status {summary.status}" + (
        f": {summary.problem}" if summary.problem else ""
    )
    text = json.dumps({"schema": SCHEMA, **asdict(summary)}, indent=1)
    write_output(path, text, "affected's summary", ended, summary.status)


def read(path: Path) -> Summary:
    """The summary at `path`; two lines where it is missing, truncated or of another schema."""
    fix = "run affected again with --summary FILE: it writes the summary whole at its end"
    data = read_record(path, SCHEMA, "affected's summary", fix)
    missing = [f.name for f in fields(Summary) if f.name not in data and f.name not in LATER]
    if missing:
        raise Failure(f"affected's summary {path} lacks {', '.join(missing)}", fix)
    if not fits(data, Summary) or (data["past_build"] is not None and not fits(data["past_build"], PAST_BUILD)):
        raise Failure(
            f"affected's summary {path} has an unknown field, or one of another type than {SCHEMA} gives it", fix
        )
    summary = Summary(**data)
    if summary.verdict not in VERDICTS:
        raise Failure(
            f"affected's summary {path} has the verdict {summary.verdict!r}, not one of {', '.join(VERDICTS)}", fix
        )
    if not 0 <= summary.status <= 255:  # no process ends so: neither its verdict's status nor any other
        raise Failure(
            f"affected's summary {path} has the status {short(str(summary.status))}, not one from 0 to 255", fix
        )
    return summary
