"""affected's run, from the workspace to its verdict: what changed, the tests that selection picks, the
rebuild and the tests (fidev.affected.tests), what they covered (coverage), the verdict (verdict) and what is
kept of it (verdicts), printed through report. One run at a time on a workspace (its lock). A run stopped
midway is no pass: each module with tests is kept `unfinished` before the rebuild starts (guarded_build_and_test).
scripts/affected.py parses its options and calls `answer`, which writes the summary (fidev.affected.summary)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fidev.affected import built, changes, coverage, ours, report, tests, theirs, verdict, verdicts
from fidev.affected import summary as affected_summary
from fidev.affected.selection import selection as select
from fidev.affected.verdict import Verdict
from fidev.core import files, workspace
from fidev.core.failure import Failure
from fidev.core.manifest import pins
from fidev.jit import kernel_source
from fidev.records import compile_log

# --list builds and runs no test: what an interrupt stops is its look at what changed (the regeneration of a
# generator edit's sources included, which compiles nothing)
LIST_STOPPED = "interrupted while listing what changed (--list builds and runs nothing: only that look was stopped)"


@dataclass(frozen=True)
class Options:
    """affected's options, as scripts/affected.py parsed them."""

    list: bool = False
    whole_family: bool = False
    keep_going: bool = False
    summary: Path | None = None


def answer(args: Options) -> int:
    """The run's exit status, its verdict's (Verdict.status); a refusal, a failed build or an interrupt is a
    Failure in two lines with its own status. With args.summary the result goes to that file however the run
    ends (fidev.affected.summary)."""
    record, started = affected_summary.Summary(), time.perf_counter()
    try:
        record.verdict = run(args, record)
        record.status = record.verdict.status
        return record.status
    except KeyboardInterrupt:
        record.verdict, record.status = Verdict.INTERRUPTED, Verdict.INTERRUPTED.status
        raise Failure(
            LIST_STOPPED if args.list else "interrupted (the builds and tests it started were stopped)",
            f"run it again: pixi run -e flashinfer-dev affected{' --list' if args.list else ''}",
            exit_status=Verdict.INTERRUPTED.status,
        ) from None
    except Failure as failure:
        record.verdict = verdict.of_failure(isinstance(failure, tests.BuildFailed))
        record.status, record.problem = failure.exit_status, failure.problem
        raise
    finally:
        record.seconds = round(time.perf_counter() - started, 1)
        if args.summary:
            affected_summary.write(record, args.summary)


def run(args: Options, record: affected_summary.Summary) -> Verdict:
    try:
        return run_affected(args, record)
    finally:  # what a failure, Ctrl-C or an early return left running (stop() is idempotent)
        for their_tests in list(theirs.FlashInferTests.started):
            their_tests.stop()


def run_affected(args: Options, record: affected_summary.Summary) -> Verdict:
    """What changed, its modules and their tests; then rebuild them, run the tests and say the result:
    one run at a time on a workspace (its lock), so that two never rebuild the same modules at once nor
    write over each other's kept verdicts."""
    started = time.perf_counter()
    ws = workspace.read(pins().flashinfer)  # read once, here
    found = built.find(ws, kernel_source.mode(), args.list)
    busy = Failure(
        f"another affected run is judging the builds in {ws.version_dir} ({{}}): two at once would rebuild the "
        "same modules and keep each other's verdicts",
        "wait for it to end, then run this again",
    )

    def unwritable(e: OSError) -> Failure:
        return Failure(
            f"cannot write affected's lock in {ws.version_dir} ({e.strerror or e})",
            "make the JIT dir's folder writable (FLASHINFER_WORKSPACE_BASE names where it is)",
        )

    with files.exclusive(ws.affected_lock, "affected", busy, unwritable):
        return judge(args, record, ws, found, started)


def judge(
    args: Options, record: affected_summary.Summary, ws: workspace.Workspace, found: built.Found, started: float
) -> Verdict:
    """The run itself, under the workspace's lock."""
    kept = kept_verdicts(ws)
    stop_after = 0 if args.keep_going else theirs.STOP_AFTER
    changed = changes.find(found, args.list, kept, not args.whole_family, stop_after)
    if not changed.by_file:  # said over passing verdicts only (any other reruns its tests, in changes.find)
        passed = {m.name: v for m in found.modules if (v := kept.standing(m.name, m.build_dir)) is not None}
        report.nothing_changed(len(found.modules), passed, time.perf_counter() - started)
        if not args.list:
            kept.judged = changed.now
            kept.record({})
        return Verdict.NOTHING_CHANGED
    selection = select(
        changed.by_file,
        changed.changed,
        found.tier,
        found.recorded,
        found.tree,
        [*changed.python_edits, *changed.unjudged_generators],
        not args.whole_family,
    )
    record.changed, record.tests = report.changed_files(selection), [*selection.ours, *selection.theirs]
    if args.list or not (changed.changed or selection.families):
        print(report.table(report.rows(selection)))
        report.hints(selection)
        return verdict.no_module_changed(args.list, selection, changed, kept)
    dirs = {m.name: m.build_dir for m in found.modules}
    outcome = recorded_run(args, record, found, changed, selection, kept, dirs)
    coverage_found = verdict.coverage_of(
        selection, changed, verdict.ran_to_a_result(selection, outcome.exercised_files)
    )
    print(report.results(selection, outcome.failed, outcome.broken, outcome.stopped, not any(coverage_found)))
    print(report.compiled(record.compiled, record.compiled_twice))
    report.hints(selection)
    tested = verdict.of_tests(outcome.failed, outcome.broken)
    report.final(
        tested is Verdict.FAILED,
        outcome.failed,
        outcome.broken,
        outcome.reruns,
        outcome.built,
        time.perf_counter() - started,
        outcome.stopped,
    )
    judged = verdict.verdict_of(tested, selection, changed, kept, coverage_found)
    results = coverage.module_results(
        selection, outcome.failed, outcome.broken, covered=judged is not Verdict.NOT_COVERED, stopped=outcome.stopped
    )
    kept.judged = changed.now  # judged: what it did not pass is kept above, per module and per file
    kept.record({name: (dirs[name], *result) for name, result in results.items() if name in dirs})
    return judged


def recorded_run(
    args: Options, record: affected_summary.Summary, found: built.Found, changed, selection, kept, dirs: dict
) -> tests.Outcome:
    """guarded_build_and_test, and what it did in the summary: what failed, what was rebuilt and compiled
    (per module, from ninja's logs: fidev.records.compile_log), and FlashInfer's tests' times."""
    logs = compile_log.sizes(found.ws.jit_dirs())
    outcome = guarded_build_and_test(args, found, changed, selection, kept, dirs)
    compiled = compile_log.compiled_since(found.ws.jit_dirs(), logs)
    record.compiled = {name: None if objs is None else sum(objs.values()) for name, objs in sorted(compiled.items())}
    record.compiled_twice = compile_log.twice(compiled)
    record.failed, record.rebuilt, record.past_build = sorted(outcome.failed), outcome.rebuilt, outcome.past
    record.build_s = round(outcome.build_s, 1)
    return outcome


def guarded_build_and_test(
    args: Options, found: built.Found, changed: changes.Changes, selection, kept: verdicts.Kept, dirs: dict
) -> tests.Outcome:
    """Rebuild the changed modules and run their tests (fidev.affected.tests); a run stopped mid-way is
    no pass: each module with tests is kept `unfinished`, and so are the reached families' edits, before
    the rebuild starts, again as each module is rebuilt (with the inputs its rebuild recorded, before any
    test can load it: smoke's tests run beside the rebuild), and as the build ends, fails or is stopped."""
    to_build = [changed.specs.get(m.name, m) for m in found.modules if m.name in changed.changed]
    unfinished = {
        name: (dirs[name], coverage.Result.UNFINISHED, sorted(chosen), [])
        for name in changed.changed
        if name in dirs and (chosen := selection.selectors({name}))
    }
    writing = threading.Lock()  # the rebuild's threads keep each module as it is built

    def keep_unfinished() -> None:  # the reached families' tests build from the edited tree, and record it: kept too
        with writing:
            kept.keep_gaps(
                {},
                changed.before,
                set(kept.gaps),
                verdict.reached_edits(selection, changed),
                coverage.Result.UNFINISHED,
            )
            kept.record(unfinished)

    def keep_rebuilt(name: str) -> None:
        if name in unfinished:
            with writing:
                kept.record({name: unfinished[name]})

    keep_unfinished()
    try:
        return tests.build_and_test(
            to_build,
            changed.early,
            selection.ours,
            selection.theirs,
            found.recorded,
            changed.changed,
            found.ws.file_times,
            lambda: report.build_failed(selection, Verdict.BUILD_FAILED.value),
            keep_unfinished,
            not args.whole_family,
            found.mode,
            args.keep_going,
            ours.smoke_loaded(changed.changed, found.tier, selection.ours),
            keep_rebuilt,
            selection.first_files,
        )
    except (Failure, KeyboardInterrupt):
        keep_unfinished()
        raise


def kept_verdicts(ws: workspace.Workspace) -> verdicts.Kept:
    kept = verdicts.Kept(ws.verdicts)
    if kept.problem:
        print(
            f"affected: {kept.problem}: a verdict it kept may be a failure, so every built module is taken as "
            "changed: rebuilt, and its tests run"
        )
    return kept
