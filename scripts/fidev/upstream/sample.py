"""A sample of a selection's test cases in which every value of every parameter appears: for each
test function, each (argument, value) pair of its parametrization is in at least one selected
case. FlashInfer's families are products of many parameters (attention/test_rope.py's test_rope_pos_ids
stacks eleven `pytest.mark.parametrize` at v0.6.3, 18,432 cases); a cover of their values is a few
dozen cases.

Among such covers it prefers the one that needs the fewest JIT modules: where the record of which
test case asked for which module exists (fidev.records.build_records.module_tests, what the plan's
dry run and FlashInfer's JIT report say), a greedy cover takes first the cases whose modules are
already chosen, then the most new values per new module; a case the record does not name counts
as one module of its own. Without a record (and as a second candidate with one), a greedy cover
takes the case with the most new values, and among those the one sharing the most values with the
cases already chosen (the same dtype, head_dim or backend in two test functions tends to be the
same module). Redundant cases are then dropped, the cover that needs fewer modules kept. Modules
the caller requires (`affected`: the modules an edit changed) each get a case the record names for
them, so that the sample exercises them; where no collected case is recorded for one, every case of
the test functions recorded for it is taken.

Deterministic: functions go by name and ties by a shuffle of the sorted node ids seeded with SEED
(or the caller's seed), and nothing iterates a set of strings (whose order changes between
processes), so every process that collects the same cases (the parts of a file, pytest-xdist's
workers) selects the same ones, whatever their order.

`select` is pure; the functions after it run in a pytest process (fidev.upstream.plugin), where a
case's values come from pytest's collection (item.callspec).
"""

from __future__ import annotations

import enum
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.files import MayLack, fits, load_json, read_record, write_whole

SEED = 20251126
SCHEMA = "fidev-upstream-sample/1"  # the spec upstream-tests writes for its processes
RECORD = ".sample.json"  # beside each process's outcomes file: what its sample covered (sample_record)


@dataclass(frozen=True)
class Case:
    """A collected test case: its node id, its test function (the node id before "["), and each
    parametrized argument's value, as a string that names it (value_id)."""

    nodeid: str
    function: str
    values: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(nodeid: str, function: str, values: dict[str, str]) -> Case:
        return Case(nodeid, function, tuple(sorted(values.items())))


@dataclass
class Sample:
    """The selected node ids (in the cases' order), and what they cover."""

    selected: list[str]
    total: int
    functions: int
    values: int  # (function, argument, value) pairs of the cases, every one covered
    seed: int
    modules: int | None = (
        None  # modules the selected cases need by the record (one each for a case it does not name); None without one
    )
    whole: list[str] = field(
        default_factory=list
    )  # required modules without a collected recorded case: their functions run whole
    missed: list[str] = field(
        default_factory=list
    )  # required modules no collected case is recorded for, nor a function
    per_function: dict[str, list[int]] = field(default_factory=dict)  # {test function: [selected, collected]}
    exercised: list[str] = field(
        default_factory=list
    )  # the required modules a selected case needs (by the record), or taken whole

    def line(self, label: str) -> str:
        """Such as "rope: N of M cases, every value of every parameter"."""
        return describe(label, len(self.selected), self.total, self.modules)


def describe(label: str, selected: int, total: int, modules: int | None = None) -> str:
    by_record = f"; {modules} JIT module(s) by the record" if modules is not None else ""
    return f"{label}: {selected:,} of {total:,} cases, every value of every parameter{by_record}"


class Cover:
    """One greedy cover in progress: the chosen cases, the modules and values they bring, and what
    each function still lacks."""

    def __init__(self, cases: list[Case], modules: dict[str, list[str]] | None, rank: dict[str, int]):
        self.cases, self.rank = cases, rank
        self.mods = {
            c.nodeid: tuple(modules[c.nodeid]) if modules and c.nodeid in modules else (f"?{c.nodeid}",) for c in cases
        }
        self.chosen: list[Case] = []
        self.picked: set[str] = set()
        self.kept: set[str] = set()  # required: never dropped as redundant
        self.modules: set[str] = set()
        self.shared: set[tuple[str, str]] = set()  # (argument, value) of every chosen case, across functions
        self.lacking = {c.function: set() for c in cases}
        for c in cases:
            self.lacking[c.function].update(c.values)

    def take(self, case: Case, keep: bool = False) -> None:
        if case.nodeid in self.picked:
            return
        self.chosen.append(case)
        self.picked.add(case.nodeid)
        if keep:
            self.kept.add(case.nodeid)
        self.modules.update(self.mods[case.nodeid])
        self.shared.update(case.values)
        self.lacking[case.function].difference_update(case.values)

    def extra(self, case: Case) -> int:
        return sum(1 for m in self.mods[case.nodeid] if m not in self.modules)

    def best(self, cases: list[Case], by_modules: bool) -> Case | None:
        """The case to take next among `cases` (one function's), or None when none adds a value
        (a function without parameters: the first case still comes once, as its one value)."""
        function = cases[0].function
        lacking = self.lacking[function]
        needs_one = not any(c.nodeid in self.picked for c in cases)
        top, top_key = None, None
        for c in cases:
            if c.nodeid in self.picked:
                continue
            new = sum(1 for v in c.values if v in lacking)
            if not new and not needs_one:
                continue
            if by_modules:
                extra = self.extra(c)
                key = (new / extra if extra else math.inf, new, -extra, -self.rank[c.nodeid])
            else:
                key = (new, sum(1 for v in c.values if v in self.shared), -self.rank[c.nodeid])
            if top_key is None or key > top_key:
                top, top_key = c, key
        return top

    def prune(self) -> None:
        """Drop, last taken first, each case whose values other chosen cases of its function cover."""
        counts: dict[tuple[str, tuple[str, str]], int] = {}
        per_function: dict[str, int] = {}
        for c in self.chosen:
            per_function[c.function] = per_function.get(c.function, 0) + 1
            for v in c.values:
                counts[(c.function, v)] = counts.get((c.function, v), 0) + 1
        for c in reversed(list(self.chosen)):
            if (
                c.nodeid in self.kept
                or per_function[c.function] < 2
                or any(counts[(c.function, v)] < 2 for v in c.values)
            ):
                continue
            self.chosen.remove(c)
            per_function[c.function] -= 1
            for v in c.values:
                counts[(c.function, v)] -= 1
        self.picked = {c.nodeid for c in self.chosen}
        self.modules = {m for c in self.chosen for m in self.mods[c.nodeid]}


def by_function(cases: list[Case]) -> dict[str, list[Case]]:
    """The cases grouped by test function, the functions in the order they were collected."""
    groups: dict[str, list[Case]] = {}
    for c in cases:
        groups.setdefault(c.function, []).append(c)
    return groups


def required_cases(
    cover: Cover, groups: dict[str, list[Case]], modules: dict[str, list[str]], required: list[str]
) -> tuple[list[str], list[str]]:
    """Take a case of each required module: one the record names for it, the fewest new modules
    first; where none was collected, every case of the functions recorded for it. Returns (the
    modules whose functions were taken whole, the modules with nothing collected at all)."""
    whole, missed = [], []
    for module in sorted(set(required)):
        if module in cover.modules:
            continue
        named = [c for c in cover.cases if module in modules.get(c.nodeid, ())]
        if named:
            cover.take(min(named, key=lambda c: (cover.extra(c), cover.rank[c.nodeid])), keep=True)
            continue
        functions = sorted({nodeid.split("[")[0] for nodeid, mods in modules.items() if module in mods} & set(groups))
        for function in functions:
            for c in groups[function]:
                cover.take(c, keep=True)
        (whole if functions else missed).append(module)
    return whole, missed


def greedy(
    cases: list[Case], modules: dict[str, list[str]] | None, rank: dict[str, int], by_modules: bool, required: list[str]
) -> tuple[Cover, list[str], list[str]]:
    """One cover: the required modules' cases, then each function's values, then redundant cases dropped."""
    cover = Cover(cases, modules, rank)
    groups = by_function(cases)
    whole, missed = required_cases(cover, groups, modules or {}, required) if required else ([], [])
    for function in sorted(groups):  # by name, as ties go by rank: the collection's order changes nothing
        group = groups[function]
        while (c := cover.best(group, by_modules)) is not None:
            cover.take(c)
    cover.prune()
    return cover, whole, missed


def select(
    cases: list[Case], modules: dict[str, list[str]] | None = None, seed: int = SEED, required: list[str] = ()
) -> Sample:
    """The sample of `cases` (see the module's docstring); `modules`: {node id: the modules the
    record says it needs}; `required`: modules the sample must exercise (by that record)."""
    order = sorted(c.nodeid for c in cases)
    random.Random(seed).shuffle(order)
    rank = {nodeid: i for i, nodeid in enumerate(order)}
    candidates = [greedy(cases, modules, rank, False, list(required))]
    if modules:
        candidates.insert(0, greedy(cases, modules, rank, True, list(required)))  # a tie keeps the module-aware one
    cover, whole, missed = min(candidates, key=lambda found: (len(found[0].modules), len(found[0].chosen)))
    groups = by_function(cases)
    values = sum(len({v for c in group for v in c.values}) for group in groups.values())
    per_function = {f: [sum(1 for c in group if c.nodeid in cover.picked), len(group)] for f, group in groups.items()}
    exercised = sorted(m for m in set(required) if m in cover.modules or m in whole)
    return Sample(
        [c.nodeid for c in cases if c.nodeid in cover.picked],
        len(cases),
        len(groups),
        values,
        seed,
        len(cover.modules) if modules else None,
        whole,
        missed,
        per_function,
        exercised,
    )


# In a pytest process (fidev.upstream.plugin): the cases from pytest's items, the spec upstream-tests
# wrote, and what the sample covered, for upstream-tests' summary.


def plain(value) -> bool:
    """A value whose repr names it the same in every process: a number, a string, a bool, None, or
    a tuple or list of those."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (tuple, list)) and all(plain(v) for v in value)


def value_id(value) -> str | None:
    """A parameter's value as a string the same in every process and every test function: its
    repr for a plain value, its str for an enum member or a torch dtype or device (torch.float16 in
    two functions is one value); None for another object (a tensor, whose repr may hold its data, or
    an object, whose repr holds its address)."""
    kind = type(value)
    if plain(value):
        return repr(value)
    if isinstance(value, enum.Enum) or (kind.__module__ == "torch" and kind.__name__ in ("dtype", "device")):
        return f"{kind.__name__}:{value}"
    return None


def cases_of(items) -> list[Case]:
    """pytest's items as Cases, each parameter's value from item.callspec.params (none for a test
    without), by value_id; another object by the order in which its function's cases first show it
    ("#0", "#1"): pytest passes each case of a parametrize entry the same object, and every process
    collects the same cases in the same order. (callspec.indices is no help: pytest renumbers a
    direct parametrization's indices case by case, `Metafunc._recompute_direct_params_indices`.)"""
    seen: dict[tuple[str, str], dict[int, str]] = {}
    cases = []
    for item in items:
        function = item.nodeid.split("[")[0]
        callspec = getattr(item, "callspec", None)
        values = {}
        for arg, value in callspec.params.items() if callspec else ():
            named = value_id(value)
            if named is None:
                order = seen.setdefault((function, arg), {})
                named = order.setdefault(id(value), f"#{len(order)}")
            values[arg] = named
        cases.append(Case.of(item.nodeid, function, values))
    return cases


def write_spec(path: Path, seed: int, modules: dict[str, list[str]], required: list[str]) -> None:
    """The spec every process of a sampled run reads (SAMPLE, fidev.upstream.plugin), written whole."""
    write_whole(path, json.dumps({"schema": SCHEMA, "seed": seed, "modules": modules, "required": sorted(required)}))


# write_spec's, less its schema
SPEC = {"seed": int, "modules": MayLack(dict[str, list[str]] | None), "required": MayLack(list[str] | None)}


def read_spec(path: Path) -> tuple[int, dict[str, list[str]], list[str]]:
    """(seed, {node id: modules}, required modules) from the spec; a spec of another schema, or shape, is refused."""
    fix = "run upstream-tests again: it writes the spec before its tests start"
    data = read_record(path, SCHEMA, "upstream-tests' sample spec", fix)
    if not fits(data, SPEC):
        raise Failure(
            f"upstream-tests' sample spec {path} is not of the shape it writes (a seed, the modules of each "
            "test, those required)",
            fix,
        )
    return data["seed"], data.get("modules") or {}, data.get("required") or []


def sample_record(sample: Sample, kept: list[str] | None = None) -> dict:
    """What a process's sample covered: {function: [selected, collected]} for the functions still
    selected (`kept`: a gate may narrow them; None: all), the seed, and the required modules taken
    whole, missed or exercised. The parts of a file and xdist's workers write the same, merged by function."""
    functions = {f: counts for f, counts in sample.per_function.items() if kept is None or f in kept}
    return {
        "seed": sample.seed,
        "functions": functions,
        "whole": sample.whole,
        "missed": sample.missed,
        "exercised": sample.exercised,
    }


def merge_records(records: list[dict]) -> dict | None:
    """upstream-tests' `sample` field from its processes' records (sample_record): {selected,
    total, seed, functions, whole, missed}; None where no process sampled. Each process (a test file,
    or a part of one) is given every required module: one that another process's file exercised is
    not missed, and one another process took a recorded case of is not whole."""
    if not records:
        return None
    functions: dict[str, list[int]] = {}
    for r in records:
        functions.update({f: list(counts) for f, counts in r.get("functions", {}).items()})
    return {
        "selected": sum(s for s, _ in functions.values()),
        "total": sum(t for _, t in functions.values()),
        "seed": records[0].get("seed"),
        "functions": len(functions),
        **covering(records),
    }


def covering(records: list[dict]) -> dict[str, list[str]]:
    """{whole, missed} over the run's processes (merge_records)."""
    exercised = {m for r in records for m in r.get("exercised", [])}
    by_a_case = {m for r in records for m in r.get("exercised", []) if m not in r.get("whole", [])}
    return {
        "whole": sorted({m for r in records for m in r.get("whole", [])} - by_a_case),
        "missed": sorted({m for r in records for m in r.get("missed", [])} - exercised),
    }


# upstream-tests' side: the record it passes down, and the coverage its processes wrote.


def recorded_modules(module_tests: dict[str, list[str]], files: set[str]) -> dict[str, list[str]]:
    """{node id: the modules the record names for it} from {module: node ids}
    (fidev.records.build_records.module_tests), for the node ids of `files` (relative to the tree)."""
    found: dict[str, list[str]] = {}
    for module, nodeids in sorted(module_tests.items()):
        for nodeid in nodeids:
            if nodeid.split("::")[0] in files:
                found.setdefault(nodeid, []).append(module)
    return found


def _counts(value) -> bool:
    """[selected, collected] of a test function, as a sample record holds them."""
    return fits(value, list[int]) and len(value) == 2


# sample_record's: {function: [selected, collected]}, the seed and the required modules
RECORD_SHAPE = {
    "seed": MayLack(int | None),
    "functions": dict[str, _counts],
    "whole": MayLack(list[str]),
    "missed": MayLack(list[str]),
    "exercised": MayLack(list[str]),
}


def read_records(run_dir: Path) -> list[dict]:
    """The sample records the run's processes wrote (sample_record), each whole (fidev.core.files.write_whole);
    one that cannot be read, or is of another shape (RECORD_SHAPE), is left out."""
    records = []
    for path in sorted(run_dir.glob(f"*{RECORD}")):
        try:
            data = load_json(path)
        except (OSError, ValueError):
            continue
        if fits(data, RECORD_SHAPE):  # else left out, as an unreadable one
            records.append(data)
    return records


def coverage_lines(label: str, merged: dict | None) -> list[str]:
    """What upstream-tests says of its sample: the coverage line, then the required modules whose
    functions ran whole or that no collected case is recorded for."""
    if merged is None:
        return [f"{label}: no process recorded its sample (none collected its cases)"]
    lines = [describe(label, merged["selected"], merged["total"]) + " (the sample; without --sample, all of them)"]
    if merged["whole"]:
        lines.append(
            f"no collected case is recorded for {', '.join(merged['whole'])}: every case of its test functions ran"
        )
    if merged["missed"]:
        lines.append(
            f"no collected case or test function is recorded for {', '.join(merged['missed'])}: the sample may "
            "not exercise it"
        )
    return lines
