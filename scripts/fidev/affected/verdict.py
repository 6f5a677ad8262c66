"""affected's verdict: one enum, each value with its exit status, and the rules that decide it from
what a run found and did. A run's tests decide `failed` or `passed` (of_tests); then a pass is no pass
where the edit reaches a kernel family none of whose FlashInfer tests ran to a result, or a changed
module none of whose tests did (`not covered`, covered_or_not: fidev.affected.coverage says which).
The kept verdicts (fidev.affected.verdicts) carry the gaps, so that asking again says them again."""

from __future__ import annotations

from enum import Enum

from fidev.affected import changes, coverage, report, verdicts
from fidev.affected.selection import UNTOLD, Selection
from fidev.core.failure import INTERRUPTED


class Verdict(str, Enum):
    """What affected says of an edit, as its summary's `verdict` names it (fidev.affected.summary)."""

    PASSED = "passed"
    NOTHING_CHANGED = "nothing changed"
    NO_MODULE_CHANGED = "no module changed"
    LISTED = "listed"
    FAILED = "failed"
    BUILD_FAILED = "build failed"
    ERROR = "error"  # a refusal in two lines: its own status (1, or 2 for bad usage)
    NOT_COVERED = "not covered"
    INTERRUPTED = "interrupted"

    @property
    def status(self) -> int:
        """The exit status that goes with it."""
        return STATUS[self]

    def __str__(self) -> str:
        return self.value


STATUS = {
    Verdict.PASSED: 0,
    Verdict.NOTHING_CHANGED: 0,
    Verdict.NO_MODULE_CHANGED: 0,
    Verdict.LISTED: 0,
    Verdict.FAILED: 1,
    Verdict.BUILD_FAILED: 1,
    Verdict.ERROR: 1,
    Verdict.NOT_COVERED: 3,
    Verdict.INTERRUPTED: INTERRUPTED,
}


def of_tests(failed: set[str], broken: list[str]) -> Verdict:
    """What the run's tests say: failed where a test failed, or broke without a failed test named."""
    return Verdict.FAILED if failed or broken else Verdict.PASSED


def of_failure(a_build: bool) -> Verdict:
    """What a run that ended in a Failure says: `build failed` where a build failed, else `error` (a refusal)."""
    return Verdict.BUILD_FAILED if a_build else Verdict.ERROR


def reached_edits(selection: Selection, changed: changes.Changes) -> dict[str, list[str]]:
    """{edited file, not reverted since: the families whose tests it made run}."""
    return {f: fams for f, fams in selection.reached.items() if f not in changed.reverted}


def ran_to_a_result(selection: Selection, exercised_files: set[str]) -> list[str]:
    """FlashInfer's selected tests of the files where a case passed or failed (`exercised_files`): a family
    is covered by its tests that ran to a result, not by those selected (every case may skip here)."""
    return [t for t in selection.theirs if t.split("::")[0] in exercised_files]


def coverage_of(
    selection: Selection, changed: changes.Changes, ran: list[str]
) -> tuple[dict[str, list[str]], list[str]]:
    """The edit's gaps ({changed file: the families it reaches whose tests did not run}, less an edit
    reverted to what it was before its gap went untested) and the changed modules none of whose tests
    ran to a result: where either is not empty, no row and no verdict of the run reads passed."""
    gaps = {f: fams for f, fams in coverage.coverage_gaps(selection, ran).items() if f not in changed.reverted}
    return gaps, coverage.modules_untested(selection, ran, changed.lost, changed.owners)


def covered_or_not(
    tested: Verdict,
    selection: Selection,
    changed: changes.Changes,
    kept: verdicts.Kept,
    ran: list[str],
    passed: Verdict = Verdict.PASSED,
) -> Verdict:
    """The verdict: failed as the tests said (`tested`); else not covered where the edit reaches a
    kernel family none of whose FlashInfer tests ran to a result (`ran`: those of a file where a case
    passed or failed, not skipped alone) or a changed module none of whose tests did; else `passed`.
    The gaps are kept (written with the modules' verdicts), so that asking again says them again; an
    edit reverted to what it was before its gap went untested is none."""
    return verdict_of(tested, selection, changed, kept, coverage_of(selection, changed, ran), passed)


def verdict_of(
    tested: Verdict,
    selection: Selection,
    changed: changes.Changes,
    kept: verdicts.Kept,
    found: tuple[dict[str, list[str]], list[str]],
    passed: Verdict = Verdict.PASSED,
) -> Verdict:
    """covered_or_not, of the coverage found (coverage_of's gaps and untested modules) once for the run."""
    gaps, untested = found
    # a failed run's reached families built their modules from the edited tree, which their build
    # recorded: kept, or asking again would find nothing changed
    ran_and_failed = reached_edits(selection, changed) if tested is Verdict.FAILED else {}
    kept.keep_gaps(
        {f: fams for f, fams in gaps.items() if f != UNTOLD}, changed.before, changed.pending, ran_and_failed
    )
    if (gaps or untested) and tested is not Verdict.FAILED:
        report.not_covered(gaps, untested, selection.untold)
        return Verdict.NOT_COVERED
    report.also_untested(gaps)
    return tested if tested is Verdict.FAILED else passed


def no_module_changed(listing: bool, selection: Selection, changed: changes.Changes, kept: verdicts.Kept) -> Verdict:
    """--list, or edits that reach no built module and no family whose tests could run: listed, or not
    covered where a family they reach went untested, else no module changed."""
    if listing:
        return Verdict.LISTED
    found = covered_or_not(Verdict.PASSED, selection, changed, kept, [], Verdict.NO_MODULE_CHANGED)
    kept.judged = changed.now
    kept.record({})
    return found
