"""What affected prints, and nothing else: the table of changed files, modules, tests and results,
the hints under it, the lines that say a gap, and the final lines (what failed, the command that
reruns it alone). What is tested is fidev.affected.selection's; what it covered,
fidev.affected.coverage's; the verdict, fidev.affected.verdict's."""

from __future__ import annotations

from pathlib import Path

from fidev.affected.coverage import file_results
from fidev.affected.selection import GENERATOR_DIR, Selection
from fidev.tree import source_tree

HEADER = ("changed file", "modules", "tests", "result")


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [min(60, max(len(r[i]) for r in rows)) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]) for r in rows)


def short(items, n: int = 3) -> str:
    items = sorted(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "") if items else "-"


def rows(sel: Selection) -> list[tuple[str, ...]]:
    """The table's rows, its result column empty."""
    table_rows = [HEADER]
    for f, names in sel.files():
        tests = sel.file_tests(f, names)
        table_rows.append(
            (
                source_tree.shown(Path(f)) if f.startswith("/") else f,
                short(names, 2) if names else "no built module",
                f"{len(tests)} test(s)" if tests else "-",
                "",
            )
        )
    return table_rows


def changed_files(sel: Selection) -> dict[str, list[str]]:
    """{changed file, as the table shows it: its modules}, for the summary."""
    return {row[0]: sorted(names) for row, (_, names) in zip(rows(sel)[1:], sel.files(), strict=True)}


def hints(sel: Selection) -> None:
    if sel.families:
        print(
            f"affected: the edit reaches {', '.join(sorted(sel.families))}, whose modules no recorded test of "
            f"a changed module loads: their FlashInfer tests ({'a sample' if sel.sampled else 'every case'}) "
            "and smoke's tests of them run too, building what they load"
        )
    if sel.unmapped:
        print(
            f"affected: no test is recorded for {short(sel.unmapped)}: `upstream-tests FAMILY` (with its plan) "
            "records them"
        )
    for f, families in sorted(sel.reaching.items()):
        if families and all(fam in sel.families for fam in families):
            continue  # said above: their tests run
        print(
            f"affected: {f} reaches no built module; "
            + (
                f"the tests of {', '.join(families)} would build one: pixi run -e flashinfer-dev "
                f"upstream-tests {families[0]}"
                if families
                else "no kernel family's sources include it"
            )
        )


def build_failed(sel: Selection, result: str) -> str:
    """The table with `result` (the verdict's word for a failed build) on each file's row."""
    table_rows = rows(sel)
    return table([table_rows[0], *[(*r[:3], result) for r in table_rows[1:]]])


def results(sel: Selection, failed: set[str], broken: list[str], stopped: bool = False, covered: bool = True) -> str:
    """The table with each file's result, as coverage.file_results decides it."""
    decided = file_results(sel, failed, broken, stopped, covered)
    return table([HEADER, *[(*row[:3], result) for row, result in zip(rows(sel)[1:], decided, strict=True)]])


def also_untested(gaps: dict[str, list[str]]) -> None:
    """The families a failed run's edit reaches whose tests did not run: said beside its failure."""
    if gaps:
        print(
            f"affected: also untested: {', '.join(sorted({fam for fams in gaps.values() for fam in fams}))} "
            "(the edit reaches them)"
        )


def not_covered(gaps: dict[str, list[str]], untested: list[str] = (), untold: list[str] = ()) -> None:
    """The lines that make an edit's gaps its own status, with the command that covers them."""
    families = sorted({fam for fams in gaps.values() for fam in fams})
    if untested:
        print(
            f"affected: no test of {short(untested)} ran here (none of smoke's, and none of FlashInfer's "
            "recorded for them ran to a result): not a pass; `upstream-tests FAMILY` of their family runs and "
            "records them"
        )
    if not gaps:
        return
    for f, fams in gaps.items():
        if f in untold and f.startswith(GENERATOR_DIR):
            print(
                f"affected: {f} changed no module's generated sources; it may change a module's compile flags or "
                "how modules are built and loaded, which comparing sources does not see: which tests execute it "
                "cannot be told here"
            )
        elif f in untold:
            print(
                f"affected: {f} holds no kernel family's API (fidev.tree.families): which tests execute it "
                "cannot be told here"
            )
        else:
            print(f"affected: {f} reaches {', '.join(fams)}, whose FlashInfer tests did not run here")
    print(
        f"affected: not a pass: {len(families)} kernel family(ies) the edit reaches went untested; "
        f"cover them: pixi run -e flashinfer-dev upstream-tests {' '.join(families)}"
    )


def final(
    failed_run: bool,
    failed: set[str],
    broken: list[str],
    reruns: list[str],
    built: str,
    total: float,
    stopped: bool = False,
) -> None:
    """The last lines of a run whose tests ran (`failed_run`: fidev.affected.verdict.of_tests): what
    failed and how to rerun it, or that every selected test passed; where the first failure ended
    the run (`stopped`), that the rest did not run."""
    if failed_run:
        if stopped:
            print(
                "affected: the first failure ended the run: the other selected tests did not run, and are no pass "
                "(the next run runs them again; --keep-going runs every one)"
            )
        print(
            f"affected: {len(failed)} failed ({short(failed, 4)}){'; ' + '; '.join(broken) if broken else ''}; "
            f"{built}; {total:.1f} s in all\naffected: rerun alone: " + ("; ".join(reruns) or "see the output above")
        )
    else:
        print(f"affected: every selected test passed; {built}; {total:.1f} s in all")


def nothing_changed(modules: int, passed: dict, checked_s: float) -> None:
    """The line of a run that found nothing changed: the built modules it checked, and when affected's
    last verdict on them passed (`passed`: {module: its kept passing verdict}, fidev.affected.verdicts)."""
    last = max((v.when for v in passed.values()), default=None)
    said = (
        f"; affected's last verdict on {short(passed, 3)}: passed "
        f"({sum(len(v.tests) for v in passed.values())} test(s), {last})"
        if passed
        else "; no verdict of affected is kept on them (it judges edits: smoke tests the build)"
    )
    print(
        f"affected: nothing changed since the {modules} built modules were built (checked in {checked_s:.2f} s){said}"
    )


def compiled(counts: dict[str, int | None], twice: list[str]) -> str:
    """What the run compiled, per module, from ninja's logs (fidev.records.compile_log)."""
    if not counts:
        return "affected: no module compiled in this run"
    each = f"; more than once (or not known): {short(twice, 4)}" if twice else ", each once"
    return f"affected: {len(counts)} module(s) compiled in this run ({short(sorted(counts), 4)}){each}"
