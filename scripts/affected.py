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

from fidev.affected import judge
from fidev.core.failure import ArgumentParser, exit_now, option, run_main, stop_as_ctrl_c
from fidev.core.files import output_file


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
    stop_as_ctrl_c(signal.SIGHUP)  # as Ctrl-C and SIGTERM: what runs is stopped, no traceback (judge.answer)
    return judge.answer(judge.Options(args.list, args.whole_family, args.keep_going, args.summary))


if __name__ == "__main__":
    status = run_main(main)
    if "torch" in sys.modules:  # smoke's tests or the regeneration imported it: its teardown is no part of the answer
        exit_now(status)
    sys.exit(status)
