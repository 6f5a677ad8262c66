"""Which tests an edit gets: the changed files with their modules, the tests of those modules
(smoke's and abi-smoke's, FlashInfer's recorded ones) and the kernel families the edited files reach
(fidev.tree.families: by #include lines, and by the package's Python that holds a family's API),
whose FlashInfer tests run too. It decides no verdict (fidev.affected.verdict) and prints nothing
(fidev.affected.report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fidev.builds import smoke_modules
from fidev.tree import families as upstream_suites

UNTOLD = "(its tree record cannot be read: any edit)"  # a changed "file" that may be any include/ or csrc/ file
PACKAGE, GENERATOR_DIR = (
    "flashinfer/",
    "flashinfer/jit/",
)  # the package's Python files, and its module generators, in the tree


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
    reach: dict[str, list[str]] = field(
        default_factory=dict
    )  # {edited file of the tree: every kernel family it reaches}
    # {edited file of the tree: {each family it reaches: the fewest #include lines from its sources to the file}}
    steps: dict[str, dict[str, int]] = field(default_factory=dict)
    generators: list[str] = field(default_factory=list)  # the edited Python files of the tree, relative to it
    sampled: bool = True  # FlashInfer's tests run as a sample (else --whole-family: every case)

    def tree_edits(self) -> list[str]:
        """The edited include/ and csrc/ files and the package's Python files (generators, and the
        wrappers that hold a family's API), relative to the tree: a generator's edit shows in by_file
        as the generated sources it changed, not as itself."""
        return sorted({*tree_files(self.by_file), *(g for g in self.generators if g.startswith(PACKAGE))})

    @property
    def untold(self) -> list[str]:
        """The edited Python files of the package that hold no kernel family's API (fidev.tree.families'
        `api`) and show in no module's sources: outside flashinfer/jit/, and under it those named as
        themselves (no module's regenerated sources changed: fidev.affected.changes.files_changed), which may
        still change a module's compile flags or how modules are built and loaded. Which tests execute them
        cannot be told."""
        return sorted(
            f
            for f, fams in self.reach.items()
            if f.startswith(PACKAGE) and not fams and (not f.startswith(GENERATOR_DIR) or f in self.by_file)
        )

    def selectors(self, names) -> set[str]:
        """What a module's tests are, as node ids or function prefixes of pytest's failure lines."""
        return {f"tests/{t}" for n in names if n in self.tier for t in smoke_modules.BY_KEY[self.tier[n]].tests} | {
            t.split("[")[0] for n in names for t in self.recorded.get(n, [])
        }

    @property
    def ours(self) -> list[str]:
        """smoke's and abi-smoke's tests of the changed modules, and of every family an edited file reaches (they
        build what they load), whether or not that family's FlashInfer tests run: where a recorded test of a
        changed module covers the family, or its test files are not in the tree, smoke's exact checks are still
        the nearest (the cascade merge's: one small module, where FlashInfer's shared-prefix cases load three fa3
        prefill modules)."""
        reached = {fam for fams in self.reach.values() for fam in fams}
        return sorted(
            {t for name in self.changed if name in self.tier for t in smoke_modules.BY_KEY[self.tier[name]].tests}
            | {t for fam in reached for t in family_smoke_tests(fam)}
        )

    @property
    def recorded_tests(self) -> list[str]:
        """FlashInfer's tests recorded for the changed modules, by test function."""
        return sorted({t.split("[")[0] for name in self.changed for t in self.recorded.get(name, [])})

    @property
    def theirs(self) -> list[str]:
        """FlashInfer's tests to run: the changed modules' recorded ones and the reached families'."""
        return sorted({*self.recorded_tests, *(f"tests/{node}" for nodes in self.families.values() for node in nodes)})

    @property
    def first_files(self) -> list[str]:
        """The test files to run (tests/...) of the kernel families nearest an edited file among those whose
        tests run (fidev.tree.families.nearest): upstream-tests' plan builds the modules of their cases ahead first."""
        run = {t.split("::")[0] for t in self.theirs}
        files = {
            fam.name: {f"tests/{node}".split("::")[0] for node in fam.nodes} & run for fam in upstream_suites.FAMILIES
        }
        steps = {f: {fam: n for fam, n in fams.items() if files[fam]} for f, fams in self.steps.items()}
        return sorted({f for fam in upstream_suites.nearest(steps) for f in files[fam]})

    @property
    def unmapped(self) -> list[str]:
        return sorted(name for name in self.changed if name not in self.tier and not self.recorded.get(name))

    def file_tests(self, f: str, names) -> set[str]:
        """The tests of an edited file: its modules' (selectors), and the reached families' it is compiled by."""
        families = (
            self.reached.get(f, [])
            if " -> " not in f
            else {fam for g in self.generators for fam in self.reached.get(g, [])}
        )
        return (
            self.selectors(names)
            | {f"tests/{node}" for fam in families for node in self.families[fam]}
            | {f"tests/{t}" for fam in families for t in family_smoke_tests(fam)}
        )

    def files(self) -> list[tuple[str, set[str]]]:
        return sorted(self.by_file.items())


def selection(
    by_file: dict[str, set[str]],
    changed: dict[str, dict[str, str]],
    tier: dict[str, str],
    recorded: dict[str, list[str]],
    tree: Path,
    generators: list[str],
    sampled: bool = True,
) -> Selection:
    """The selection, with the kernel families that compile each file no built module does;
    `generators`: the edited Python files of the tree (paths)."""
    sel = Selection(by_file, changed, tier, recorded, generators=[under(tree, g) for g in generators], sampled=sampled)
    unbuilt = [f for f, names in by_file.items() if not names and not f.startswith(("/", "("))]
    # one walk of the tree's #include lines for every edited file (it reads the families' sources and headers)
    sel.steps = upstream_suites.family_steps(tree, sorted({*sel.tree_edits(), *unbuilt}))
    sel.reach = {f: list(fams) for f, fams in sel.steps.items()}
    sel.reaching = {f: sel.reach[f] for f in unbuilt}
    sel.families = families_to_run(sel, tree)
    sel.reached = {
        f: [fam for fam in fams if fam in sel.families]
        for f, fams in sel.reach.items()
        if any(fam in sel.families for fam in fams)
    }
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
    tree (sel.reach: fidev.tree.families.family_steps) and whose tests no recorded test of a
    changed module is, where its test files are in the tree (the source fetch's tree has none: such
    a family stays a gap, said)."""
    wanted = {fam for fams in sel.reach.values() for fam in fams}
    covered = families_covered(sel.recorded_tests)
    return {
        fam.name: fam.nodes
        for fam in upstream_suites.FAMILIES
        if fam.name in wanted
        and fam.name not in covered
        and all((tree / "tests" / node.split("::")[0]).is_file() for node in fam.nodes)
    }


def families_covered(ran: list[str]) -> set[str]:
    """The kernel families some test of `ran` (ids under tests/: a file, a function, a case) is a test
    of: one of the family's nodes, a case or a part of one, or what holds one (its file). A function
    of a file two families share (attention/test_alibi.py: single_decode's and single_prefill's) is a
    test of its own family only."""

    def of(t: str, node: str) -> bool:
        whole = f"tests/{node}"
        return t == whole or t.startswith((whole + "[", whole + "::")) or whole.startswith(t + "::")

    return {fam.name for fam in upstream_suites.FAMILIES if any(of(t, node) for node in fam.nodes for t in ran)}


def tree_files(by_file: dict[str, set[str]]) -> list[str]:
    """The changed files that are the tree's own include/ and csrc/ files, and its generators
    (flashinfer/jit/: the activation family's sources name its generator), relative to it, as by_file has them."""
    return [f for f in by_file if f.startswith(("include/", "csrc/", "flashinfer/jit/"))]
