"""What affected prints: the table of changed files, modules, tests and results, the hints under
it, and the final lines (what failed, the command that reruns it alone)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fidev.builds import smoke_modules
from fidev.tree import families as upstream_suites
from fidev.tree import source_tree

HEADER = ("changed file", "modules", "tests", "result")


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [min(60, max(len(r[i]) for r in rows)) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]) for r in rows)


def short(items, n: int = 3) -> str:
    items = sorted(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "") if items else "-"


@dataclass
class Selection:
    """The changed files with their modules (by_file), and the tests of those modules: smoke's and
    abi-smoke's (ours) and FlashInfer's own, by test function, each with all its cases (theirs:
    the record names each case, thousands for a family)."""
    by_file: dict[str, set[str]]
    changed: dict[str, dict[str, str]]
    tier: dict[str, str]
    recorded: dict[str, list[str]]
    reaching: dict[str, list[str]] = field(default_factory=dict)
    # {kernel family: its FlashInfer test nodes} that the edited files reach and no recorded test of a
    # changed module covers, whose tests are in the tree: they run too (a sample), building what they load
    families: dict[str, tuple[str, ...]] = field(default_factory=dict)
    reached: dict[str, list[str]] = field(default_factory=dict)  # {edited file: those of `families` it reaches}
    reach: dict[str, list[str]] = field(default_factory=dict)  # {edited file of the tree: every kernel family it reaches}
    generators: list[str] = field(default_factory=list)  # the edited Python files of the tree, relative to it
    sampled: bool = True  # FlashInfer's tests run as a sample (else --whole-family: every case)

    def tree_edits(self) -> list[str]:
        """The edited include/ and csrc/ files and the package's Python files (generators, and the
        wrappers that hold a family's API), relative to the tree: a generator's edit shows in by_file
        as the generated sources it changed, not as itself."""
        return sorted({*tree_files(self.by_file), *(g for g in self.generators if g.startswith(PACKAGE))})

    @property
    def untold(self) -> list[str]:
        """The edited Python files of the package, not generators (outside flashinfer/jit/), that hold no
        kernel family's API (fidev.tree.families' `api`): which tests execute them cannot be told."""
        return sorted(f for f, fams in self.reach.items() if f.startswith(PACKAGE) and not f.startswith(GENERATOR_DIR) and not fams)

    def selectors(self, names) -> set[str]:
        """What a module's tests are, as node ids or function prefixes of pytest's failure lines."""
        return {f"tests/{t}" for n in names if n in self.tier for t in smoke_modules.BY_KEY[self.tier[n]].tests} | \
            {t.split("[")[0] for n in names for t in self.recorded.get(n, [])}

    @property
    def ours(self) -> list[str]:
        """smoke's and abi-smoke's tests of the changed modules, and of the reached families' (they build what they load)."""
        return sorted({t for name in self.changed if name in self.tier for t in smoke_modules.BY_KEY[self.tier[name]].tests}
                      | {t for fam in self.families for t in family_smoke_tests(fam)})

    @property
    def recorded_tests(self) -> list[str]:
        """FlashInfer's tests recorded for the changed modules, by test function."""
        return sorted({t.split("[")[0] for name in self.changed for t in self.recorded.get(name, [])})

    @property
    def theirs(self) -> list[str]:
        """FlashInfer's tests to run: the changed modules' recorded ones and the reached families'."""
        return sorted({*self.recorded_tests, *(f"tests/{node}" for nodes in self.families.values() for node in nodes)})

    @property
    def unmapped(self) -> list[str]:
        return sorted(name for name in self.changed if name not in self.tier and not self.recorded.get(name))

    def file_tests(self, f: str, names) -> set[str]:
        """The tests of an edited file: its modules' (selectors), and the reached families' it is compiled by."""
        families = self.reached.get(f, []) if " -> " not in f else {fam for g in self.generators for fam in self.reached.get(g, [])}
        return self.selectors(names) | {f"tests/{node}" for fam in families for node in self.families[fam]} | \
            {f"tests/{t}" for fam in families for t in family_smoke_tests(fam)}

    def files(self) -> list[tuple[str, set[str]]]:
        return sorted(self.by_file.items())

    def rows(self) -> list[tuple[str, ...]]:
        """The table's rows, its result column empty."""
        rows = [HEADER]
        for f, names in self.files():
            tests = self.file_tests(f, names)
            rows.append((source_tree.shown(Path(f)) if f.startswith("/") else f, short(names, 2) if names else "no built module",
                         f"{len(tests)} test(s)" if tests else "-", ""))
        return rows

    def changed_files(self) -> dict[str, list[str]]:
        """{changed file, as the table shows it: its modules}, for the summary."""
        return {row[0]: sorted(names) for row, (_, names) in zip(self.rows()[1:], self.files(), strict=True)}


def selection(by_file: dict[str, set[str]], changed: dict[str, dict[str, str]], tier: dict[str, str], recorded: dict[str, list[str]],
              tree: Path, generators: list[str], sampled: bool = True) -> Selection:
    """The selection, with the kernel families that compile each file no built module does;
    `generators`: the edited Python files of the tree (paths)."""
    sel = Selection(by_file, changed, tier, recorded, generators=[under(tree, g) for g in generators], sampled=sampled)
    unbuilt = [f for f, names in by_file.items() if not names and not f.startswith(("/", "("))]
    # one walk of the tree's #include lines for every edited file (it reads the families' sources and headers)
    sel.reach = upstream_suites.families_compiling(tree, sorted({*sel.tree_edits(), *unbuilt}))
    sel.reaching = {f: sel.reach[f] for f in unbuilt}
    sel.families = families_to_run(sel, tree)
    sel.reached = {f: [fam for fam in fams if fam in sel.families] for f, fams in sel.reach.items() if any(fam in sel.families for fam in fams)}
    return sel


def family_smoke_tests(family: str) -> set[str]:
    """smoke's and abi-smoke's tests of the modules whose sources are the family's (under tests/)."""
    return {t for m in smoke_modules.MODULES if m.family == family for t in m.tests}


def under(tree: Path, path: str) -> str:
    """`path` relative to the tree where it lies inside (resolved: the editable install's links), else as given."""
    resolved, real = (tree / path).resolve(), tree.resolve()
    return str(resolved.relative_to(real)) if resolved.is_relative_to(real) else path


def families_to_run(sel: Selection, tree: Path) -> dict[str, tuple[str, ...]]:
    """{family: its test nodes} for each kernel family whose sources compile an edited file of the
    tree (sel.reach: fidev.tree.families.families_compiling) and whose tests no recorded test of a
    changed module is, where its test files are in the tree (the source fetch's tree has none: such
    a family stays a gap, said)."""
    wanted = {fam for fams in sel.reach.values() for fam in fams}
    covered = families_covered(sel.recorded_tests)
    return {fam.name: fam.nodes for fam in upstream_suites.FAMILIES
            if fam.name in wanted and fam.name not in covered and all((tree / "tests" / node.split("::")[0]).is_file() for node in fam.nodes)}


def families_covered(ran: list[str]) -> set[str]:
    """The kernel families some test of `ran` (ids under tests/, or their function prefixes) is a test of."""
    return {fam.name for fam in upstream_suites.FAMILIES
            if any(t.startswith(f"tests/{node.split('::')[0]}") for node in fam.nodes for t in ran)}


def hints(sel: Selection) -> None:
    if sel.families:
        print(f"affected: the edit reaches {', '.join(sorted(sel.families))}, whose modules no recorded test of a changed module "
              f"loads: their FlashInfer tests ({'a sample' if sel.sampled else 'every case'}) and smoke's tests of them run too, "
              "building what they load")
    if sel.unmapped:
        print(f"affected: no test is recorded for {short(sel.unmapped)}: `upstream-tests FAMILY` (with its plan) records them")
    for f, families in sorted(sel.reaching.items()):
        if families and all(fam in sel.families for fam in families):
            continue  # said above: their tests run
        print(f"affected: {f} reaches no built module; " + (
            f"the tests of {', '.join(families)} would build one: pixi run -e flashinfer-dev upstream-tests {families[0]}" if families
            else "no kernel family's sources include it"))


def failures_of(failed: set[str], chosen: set[str]) -> list[str]:
    """The failures that are the tests `chosen` (Selection.selectors) names: a test id (a case of a
    selected function, or the node id itself), or a file that did not collect or finish."""
    return sorted(f for f in failed if any(f == x or f.startswith(x + "[") or f.startswith(x + "::") or f == x.split("::")[0]
                                           for x in chosen))


def build_failed(sel: Selection) -> str:
    rows = sel.rows()
    return table([rows[0], *[(*r[:3], "build failed") for r in rows[1:]]])


def results(sel: Selection, failed: set[str], broken: list[str]) -> str:
    """The table with each file's result: how many of its tests failed, or passed."""
    result = []
    for row, (f, names) in zip(sel.rows()[1:], sel.files(), strict=True):
        chosen = sel.file_tests(f, names)
        mine = failures_of(failed, chosen)
        result.append((*row[:3], f"{len(mine)} failed" if mine else "passed" if chosen and not broken else "-" if not chosen else "unknown"))
    return table([HEADER, *result])


NOT_COVERED = 3  # the exit status of an edit that reaches a kernel family whose tests did not run: not a pass
UNTOLD = "(its tree record cannot be read: any edit)"  # a changed "file" that may be any include/ or csrc/ file
PACKAGE, GENERATOR_DIR = "flashinfer/", "flashinfer/jit/"  # the package's Python files, and its module generators, in the tree


def tree_files(by_file: dict[str, set[str]]) -> list[str]:
    """The changed files that are the tree's own include/ and csrc/ files, and its generators
    (flashinfer/jit/: the activation family's sources name its generator), relative to it, as by_file has them."""
    return [f for f in by_file if f.startswith(("include/", "csrc/", "flashinfer/jit/"))]


def coverage_gaps(sel: Selection, ran: list[str]) -> dict[str, list[str]]:
    """{changed file: the kernel families whose sources compile it (sel.reach) and whose FlashInfer
    tests did not run}: smoke's tests are a verdict on what they call, not on a family."""
    reach = dict(sel.reach)
    every = [fam.name for fam in upstream_suites.FAMILIES]
    if UNTOLD in sel.by_file:  # an edit no built module compiles cannot be told: it may reach any family
        reach[UNTOLD] = every
    reach.update((f, every) for f in sel.untold)  # Python whose callers cannot be told: any family's tests may run it
    covered = families_covered(ran)
    return {f: [fam for fam in families if fam not in covered] for f, families in sorted(reach.items())
            if any(fam not in covered for fam in families)}


def modules_untested(sel: Selection, ran: list[str], lost: list[str], owners: dict[str, list[str]] | None = None) -> list[str]:
    """The changed modules no test of which ran to a result: none of smoke's (not in its tier), none
    of FlashInfer's recorded for them in a file where a case passed or failed (`ran`), and, for a
    module with no test recorded (one the family's tests built without a plan), none of the family
    whose sources it compiles (`owners`, fidev.tree.families.owners); and those a generator edit may
    have changed that nothing here could regenerate (`lost`), unless a reached family's tests ran."""
    files, covered = {t.split("::")[0] for t in ran}, families_covered(ran)
    untested = {name for name in sel.changed if name not in sel.tier
                and not any(t.split("::")[0] in files for t in sel.recorded.get(name, []))
                and not (not sel.recorded.get(name) and any(fam in covered for fam in (owners or {}).get(name, [])))}
    return sorted(untested | (set() if sel.families and files else set(lost)))


def not_covered(gaps: dict[str, list[str]], untested: list[str] = (), untold: list[str] = ()) -> None:
    """The lines that make an edit's gaps its own status, with the command that covers them."""
    families = sorted({fam for fams in gaps.values() for fam in fams})
    if untested:
        print(f"affected: no test of {short(untested)} ran here (none of smoke's, and none of FlashInfer's recorded for them ran "
              "to a result): not a pass; `upstream-tests FAMILY` of their family runs and records them")
    if not gaps:
        return
    for f, fams in gaps.items():
        if f in untold:
            print(f"affected: {f} holds no kernel family's API (fidev.tree.families): which tests execute it cannot be told here")
        else:
            print(f"affected: {f} reaches {', '.join(fams)}, whose FlashInfer tests did not run here")
    print(f"affected: not a pass: {len(families)} kernel family(ies) the edit reaches went untested; "
          f"cover them: pixi run -e flashinfer-dev upstream-tests {' '.join(families)}")


def module_results(sel: Selection, failed: set[str], broken: list[str], covered: bool = True,
                   stopped: bool = False) -> dict[str, tuple[str, list[str], list[str]]]:
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


def final(failed: set[str], broken: list[str], reruns: list[str], built: str, total: float, stopped: bool = False) -> int:
    """The last lines: what failed and how to rerun it, or that every selected test passed; where the
    first failure ended the run (`stopped`), that the rest did not run."""
    if failed or broken:
        if stopped:
            print("affected: the first failure ended the run: the other selected tests did not run, and are no pass "
                  "(the next run runs them again; --keep-going runs every one)")
        print(f"affected: {len(failed)} failed ({short(failed, 4)}){'; ' + '; '.join(broken) if broken else ''}; {built}; {total:.1f} s "
              f"in all\naffected: rerun alone: " + ("; ".join(reruns) or "see the output above"))
        return 1
    print(f"affected: every selected test passed; {built}; {total:.1f} s in all")
    return 0
