"""Rebuild and test what your edits of the vendored FlashInfer touch: changed file, then modules, then tests, \
then result.

  affected.py [--list] [--whole-family] [--keep-going] [--summary FILE]

1. What changed, since each built module of FlashInfer's JIT dir was built (smoke's and
   abi-smoke's, and any upstream-tests built): its sources and headers, by content against the
   hashes `build` recorded (fidev.records.ninja_inputs: a touched file with the same content is no edit),
   and the tree's Python files, which generate modules' sources (fidev.records.build_records). When a
   Python file changed, the modules with generated sources are regenerated without compiling
   (smoke's through fidev.builds.smoke_modules; FlashInfer's tests' by the generator call their build
   recorded, else a dry run of a test recorded for them, FLASHINFER_DISABLE_JIT=1) and their
   generated sources compared by content. And what changed since affected's own last verdict,
   where build, smoke or upstream-tests built the edit first, so no build record shows it
   (fidev.affected.changes.since_judged; before any verdict, against the pinned release).
2. The modules' tests: smoke's and abi-smoke's from fidev.builds.smoke_modules; FlashInfer's own from the
   record the upstream-tests plan keeps beside the JIT dir (which test asked for which module), as
   a sample of their cases (upstream-tests --sample: every value of every parameter of each test
   function, and a recorded case of each changed module; it says what the sample covered);
   --whole-family runs every case. Each kernel family an edited include/ or csrc/ file reaches
   (fidev.tree.families: the tree's #include lines from the family's sources) and no recorded
   test covers runs its FlashInfer tests too, as a sample, building what they load; so does each
   family whose API an edited Python file of the package holds (a wrapper such as flashinfer/norm.py:
   the family's `api`), with smoke's tests of it. An edited Python file of the package that is no
   generator and holds no family's API is not covered (3): which tests execute it cannot be told.
3. It rebuilds just those modules and runs just those tests, then prints one table and a line
   naming what failed and the command that reruns it alone. The first failing test ends the run:
   smoke's or abi-smoke's first failure stops FlashInfer's tests, and FlashInfer's first failing case
   (upstream-tests --stop-after 1) ends theirs and smoke's; the tests left unrun are no pass (their
   modules' verdicts are kept as unfinished, so the next run runs them again). --keep-going runs every
   selected test instead. --list stops after the table's first three columns. Exit status 0: passed, or \
nothing changed; 1: a build or a test failed; 3: not
   covered, nothing failed but the edit reaches a kernel family whose FlashInfer tests could not run
   (the last line names the upstream-tests command that covers it; kept, so asking again says it
   again until the edit is reverted or covered); 130 (fidev.core.failure.INTERRUPTED): interrupted. \
A verdict that is not a pass
   is kept per module (fidev.affected.verdicts): asking again reruns its tests.

With --summary FILE it writes its result to FILE as JSON, whatever the end (fidev.affected.summary):
the verdict, the exit status, the changed files with their modules, the tests selected, what
failed, the rebuild's time, and FlashInfer's tests' time after the build. Other tools read that
file, not this output.

What costs time besides the compile is paid during it: FlashInfer's tests start with the build
(upstream-tests --no-plan), import and collect, and wait at a gate that says which modules are built
(fidev.upstream.gate): each case runs once the modules the record names for it are, a case the record
names none of once the whole rebuild is done; for a Python edit they start before the regeneration,
for every module it may change, and the gate names those it did; many cases spread over several pytest
processes on each GPU (upstream-tests --per-gpu); this process imports flashinfer for smoke's
tests meanwhile, and runs each of them as soon as the modules it loads are rebuilt, while the others
still build (the rebuild holds each module's lock until it is built: fidev.builds.module_builds.Rebuild),
those of smoke's tests and of a case of each of FlashInfer's test functions first. A failing test of
either, beside the rebuild, stops what still builds.
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import argparse
import signal
import sys
import threading
import time

from fidev.affected import built, changes, coverage, ours, report, tests, theirs, verdict, verdicts
from fidev.affected import summary as affected_summary
from fidev.affected.selection import selection as select
from fidev.affected.verdict import Verdict
from fidev.core import files, workspace
from fidev.core.failure import ArgumentParser, Failure, exit_now, option, run_main, stop_as_ctrl_c
from fidev.core.files import output_file
from fidev.core.manifest import pins
from fidev.jit import kernel_source
from fidev.records import compile_log

# --list builds and runs no test: what an interrupt stops is its look at what changed (the regeneration of a
# generator edit's sources included, which compiles nothing)
LIST_STOPPED = "interrupted while listing what changed (--list builds and runs nothing: only that look was stopped)"


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--list", action="store_true", help="name the changed files, modules and tests; build and run nothing"
    )
    parser.add_argument(
        "--whole-family",
        action="store_true",
        help="run every case of FlashInfer's tests of the changed modules, not the sample (upstream-tests --sample)",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="run every selected test: the first failure does not end the run (by default it does, and what did "
        "not run is no pass)",
    )
    parser.add_argument(
        "--summary",
        type=option(output_file),
        metavar="FILE",
        help="write the result to FILE as JSON (fidev.affected.summary: verdict, status, modules, tests, failures, "
        "times)",
    )
    args = parser.parse_args()
    stop_as_ctrl_c(signal.SIGHUP)  # as Ctrl-C and SIGTERM: what runs is stopped (run_tests), no traceback (run)
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
        record.verdict = Verdict.BUILD_FAILED if isinstance(failure, tests.BuildFailed) else Verdict.ERROR
        record.status, record.problem = failure.exit_status, failure.problem
        raise
    finally:
        record.seconds = round(time.perf_counter() - started, 1)
        if args.summary:
            affected_summary.write(record, args.summary)


def run(args, record: affected_summary.Summary) -> Verdict:
    try:
        return run_affected(args, record)
    finally:  # what a failure, Ctrl-C or an early return left running (stop() is idempotent)
        for their_tests in list(theirs.FlashInferTests.started):
            their_tests.stop()


def run_affected(args, record: affected_summary.Summary) -> Verdict:
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
    args, record: affected_summary.Summary, ws: workspace.Workspace, found: built.Found, started: float
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
    args, record: affected_summary.Summary, found: built.Found, changed, selection, kept, dirs: dict
) -> tests.Outcome:
    """build_and_test, and what it did in the summary: what failed, what was rebuilt and compiled
    (per module, from ninja's logs: fidev.records.compile_log), and FlashInfer's tests' times."""
    logs = compile_log.sizes(found.ws.jit_dirs())
    outcome = build_and_test(args, found, changed, selection, kept, dirs)
    compiled = compile_log.compiled_since(found.ws.jit_dirs(), logs)
    record.compiled = {name: None if objs is None else sum(objs.values()) for name, objs in sorted(compiled.items())}
    record.compiled_twice = compile_log.twice(compiled)
    record.failed, record.rebuilt, record.past_build = sorted(outcome.failed), outcome.rebuilt, outcome.past
    record.build_s = round(outcome.build_s, 1)
    return outcome


def build_and_test(
    args, found: built.Found, changed: changes.Changes, selection, kept: verdicts.Kept, dirs: dict
) -> tests.Outcome:
    """Rebuild the changed modules and run their tests (fidev.affected.tests); a run stopped mid-way is
    no pass: each module with tests is kept `unfinished`, and so are the reached families' edits, before
    the rebuild starts, again as each module is rebuilt (with the inputs its rebuild recorded, before any
    test can load it: smoke's tests run beside the rebuild), and as the build ends, fails or is stopped."""
    to_build = [changed.specs.get(m.name, m) for m in found.modules if m.name in changed.changed]
    unfinished = {
        name: (dirs[name], "unfinished", sorted(chosen), [])
        for name in changed.changed
        if name in dirs and (chosen := selection.selectors({name}))
    }
    writing = threading.Lock()  # the rebuild's threads keep each module as it is built

    def keep_unfinished() -> None:  # the reached families' tests build from the edited tree, and record it: kept too
        with writing:
            kept.keep_gaps({}, changed.before, set(kept.gaps), verdict.reached_edits(selection, changed), "unfinished")
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


if __name__ == "__main__":
    status = run_main(main)
    if "torch" in sys.modules:  # smoke's tests or the regeneration imported it: its teardown is no part of the answer
        exit_now(status)
    sys.exit(status)
