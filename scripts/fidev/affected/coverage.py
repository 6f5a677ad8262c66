"""Whether an edit's tests covered it: the failures that are a module's tests, the kernel families an
edit reaches whose FlashInfer tests did not run to a result, the changed modules none of whose tests
did, and each module's result to keep. A gap is its own status (fidev.affected.verdict), never a pass."""

from __future__ import annotations

from enum import Enum

from fidev.affected.selection import UNTOLD, Selection, families_covered
from fidev.tree import families as upstream_suites


class Result(str, Enum):
    """A changed module's result as a run decides it (module_results), and an edit's or a module's as
    fidev.affected.verdicts keeps it: no value but PASSED is a pass."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_COVERED = "not covered"
    UNFINISHED = "unfinished"

    def __str__(self) -> str:
        return self.value


def failures_of(failed: set[str], chosen: set[str]) -> list[str]:
    """The failures that are the tests `chosen` (Selection.selectors) names: a test id (a case of a
    selected function, or the node id itself), or a file that did not collect or finish."""
    return sorted(
        f
        for f in failed
        if any(f == x or f.startswith(x + "[") or f.startswith(x + "::") or f == x.split("::")[0] for x in chosen)
    )


def coverage_gaps(sel: Selection, ran: list[str]) -> dict[str, list[str]]:
    """{changed file: the kernel families whose sources compile it (sel.reach) and whose FlashInfer
    tests did not run}: smoke's tests are a verdict on what they call, not on a family."""
    reach = dict(sel.reach)
    every = [fam.name for fam in upstream_suites.FAMILIES]
    if UNTOLD in sel.by_file:  # an edit no built module compiles cannot be told: it may reach any family
        reach[UNTOLD] = every
    reach.update((f, every) for f in sel.untold)  # Python whose callers cannot be told: any family's tests may run it
    covered = families_covered(ran)
    return {
        f: [fam for fam in families if fam not in covered]
        for f, families in sorted(reach.items())
        if any(fam not in covered for fam in families)
    }


def modules_untested(
    sel: Selection, ran: list[str], lost: list[str], owners: dict[str, list[str]] | None = None
) -> list[str]:
    """The changed modules no test of which ran to a result: none of smoke's (not in its tier), none
    of FlashInfer's recorded for them in a file where a case passed or failed (`ran`), and, for a
    module with no test recorded (one the family's tests built without a plan), none of the family
    whose sources it compiles (`owners`, fidev.tree.families.owners); and those a generator edit may
    have changed that nothing here could regenerate (`lost`), unless a reached family's tests ran."""
    files, covered = {t.split("::")[0] for t in ran}, families_covered(ran)
    untested = {
        name
        for name in sel.changed
        if name not in sel.tier
        and not any(t.split("::")[0] in files for t in sel.recorded.get(name, []))
        and not (not sel.recorded.get(name) and any(fam in covered for fam in (owners or {}).get(name, [])))
    }
    return sorted(untested | (set() if sel.families and files else set(lost)))


def file_results(sel: Selection, failed: set[str], broken: list[str], stopped: bool, covered: bool) -> list[str]:
    """Each changed file's result (Selection.files' order): how many of its tests failed, or passed; where the
    first failure ended the run (`stopped`), a file none of whose tests failed is `unfinished`, not passed: some
    of its tests may not have run (module_results keeps its modules so); where the run is not covered (a reached
    family's tests, or a changed module's, did not run to a result: every case skipped here), `not covered`, as
    its verdict and its kept results say; `-` for a file with no tests, `unknown` where a test file broke."""
    found = []
    for f, names in sel.files():
        chosen = sel.file_tests(f, names)
        mine = failures_of(failed, chosen)
        if not chosen:
            found.append("-")
        elif mine:
            found.append(f"{len(mine)} failed")
        elif broken:
            found.append("unknown")
        else:
            found.append(Result.UNFINISHED if stopped else Result.PASSED if covered else Result.NOT_COVERED)
    return found


def module_results(
    sel: Selection, failed: set[str], broken: list[str], covered: bool = True, stopped: bool = False
) -> dict[str, tuple[str, list[str], list[str]]]:
    """{module: (result, its tests, those that failed)} for each changed module that had tests; one
    whose tests passed in a run that was not covered (NOT_COVERED) is `not covered`, and one none of
    whose tests failed in a run the first failure ended (`stopped`: some did not run) `unfinished`:
    no pass either way, so the next run runs its tests again."""
    found = {}
    for name in sel.changed:
        chosen = sel.selectors({name})
        if not chosen:
            continue
        mine = failures_of(failed, chosen)
        result = (
            Result.FAILED
            if mine or broken
            else Result.UNFINISHED
            if stopped
            else Result.PASSED
            if covered
            else Result.NOT_COVERED
        )
        found[name] = (result, sorted(chosen), mine)
    return found
