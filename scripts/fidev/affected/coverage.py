"""Whether an edit's tests covered it: the failures that are a module's tests, the kernel families an
edit reaches whose FlashInfer tests did not run to a result, the changed modules none of whose tests
did, and each module's result to keep. A gap is its own status (fidev.affected.verdict), never a pass."""

from __future__ import annotations

from fidev.affected.selection import UNTOLD, Selection, families_covered
from fidev.tree import families as upstream_suites


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
        result = "failed" if mine or broken else "unfinished" if stopped else "passed" if covered else "not covered"
        found[name] = (result, sorted(chosen), mine)
    return found
