"""upstream-tests' sampled tier, the pure part (fidev.upstream.sample): every value of every
parameter of every test function in the sample, the same sample for the same cases and seed, the
fewest modules by the record, required modules exercised, and small or unparametrized functions whole."""

import itertools
import random

from fidev.upstream import sample


def product(function: str, **params) -> list[sample.Case]:
    """A test function's cases as stacked parametrize decorators make them: every combination."""
    names = sorted(params)
    cases = []
    for combo in itertools.product(*(params[n] for n in names)):
        values = {n: repr(v) for n, v in zip(names, combo, strict=True)}
        cases.append(sample.Case.of(f"{function}[{'-'.join(map(str, combo))}]", function, values))
    return cases


ROPE_LIKE = product(
    "tests/t.py::test_rope",
    batch=[1, 19, 99, 989],
    qkv_len=[1, 4, 19, 204],
    heads=[8, 16],
    offset=[0, 15, 99],
    head_dim=[64, 128, 256],
    llama=["llama", "llama31"],
    factor=[0.25, 0.5, 0.75, 1.0],
    inplace=[False, True],
) + product(
    "tests/t.py::test_pos_ids",
    batch=[1, 19],
    head_dim=[64, 128, 256],
    idtype=["int32", "int64"],
    interleave=[True, False],
)


def uncovered(cases: list[sample.Case], selected: list[str]) -> set[tuple[str, str, str]]:
    """(function, argument, value) of `cases` that no selected case has."""
    chosen = {c.nodeid for c in cases if c.nodeid in set(selected)}
    want = {(c.function, a, v) for c in cases for a, v in c.values}
    have = {(c.function, a, v) for c in cases if c.nodeid in chosen for a, v in c.values}
    return want - have


def test_every_value_of_every_parameter_is_in_the_sample():
    found = sample.select(ROPE_LIKE)
    assert uncovered(ROPE_LIKE, found.selected) == set()
    assert found.total == len(ROPE_LIKE) == 4 * 4 * 2 * 3 * 3 * 2 * 4 * 2 + 2 * 3 * 2 * 2
    assert len(found.selected) < 20, "a cover of the values, not the product"
    assert found.functions == 2 and found.values == 4 + 4 + 2 + 3 + 3 + 2 + 4 + 2 + 2 + 3 + 2 + 2
    assert found.per_function == {
        "tests/t.py::test_rope": [sum(1 for s in found.selected if "test_rope[" in s), 4608],
        "tests/t.py::test_pos_ids": [sum(1 for s in found.selected if "test_pos_ids[" in s), 24],
    }
    assert found.selected == [c.nodeid for c in ROPE_LIKE if c.nodeid in set(found.selected)], (
        "in the collection's order"
    )
    assert found.line("rope") == f"rope: {len(found.selected)} of 4,632 cases, every value of every parameter"


def test_random_families_are_covered_whatever_the_seed():
    rng = random.Random(7)
    for trial in range(20):
        cases = []
        for f in range(rng.randint(1, 4)):
            params = {f"a{i}": list(range(rng.randint(1, 5))) for i in range(rng.randint(0, 4))}
            cases += product(f"tests/x.py::test_{trial}_{f}", **params)
        modules = {c.nodeid: [f"m{rng.randint(0, 5)}"] for c in cases if rng.random() < 0.8}
        for mods in (None, modules):
            found = sample.select(cases, mods, seed=trial)
            assert uncovered(cases, found.selected) == set()
            shuffled = rng.sample(cases, len(cases))
            assert sorted(sample.select(shuffled, mods, seed=trial).selected) == sorted(found.selected), (
                "the order changed the sample"
            )
            assert {c.function for c in cases} == {s.split("[")[0] for s in found.selected}, (
                "every function once at least"
            )


def test_the_same_cases_and_seed_give_the_same_sample_and_the_seed_changes_ties():
    first = sample.select(ROPE_LIKE)
    assert sample.select(list(ROPE_LIKE)).selected == first.selected
    assert first.seed == sample.SEED
    for n in range(3):
        shuffled = list(ROPE_LIKE)
        random.Random(n).shuffle(shuffled)  # the same cases in another order: the same cases chosen, in the order given
        again = sample.select(shuffled)
        assert sorted(again.selected) == sorted(first.selected) and again.selected == [
            c.nodeid for c in shuffled if c.nodeid in set(first.selected)
        ]
    others = {tuple(sample.select(ROPE_LIKE, seed=s).selected) for s in range(5)}
    assert len(others) > 1, "the seed breaks the ties"
    assert all(uncovered(ROPE_LIKE, list(s)) == set() for s in others)


def modules_needed(selected: list[str], modules: dict[str, list[str]]) -> set[str]:
    return {m for s in selected for m in modules.get(s, [f"?{s}"])}


def test_the_record_of_modules_makes_the_cheaper_cover():
    # test_a's module is by dtype; test_b's by (dtype, kind), and only (fp16, a) and (bf16, b) are
    # test_a's modules. Without the record the greedy cover takes whatever pairs the values first;
    # with it, it takes the two cases whose modules test_a needs anyway.
    cases = product("tests/m.py::test_a", dtype=["fp16", "bf16"]) + product(
        "tests/m.py::test_b", dtype=["fp16", "bf16"], kind=["a", "b"]
    )
    modules = {c.nodeid: [f"m_{dict(c.values)['dtype'][1:-1]}"] for c in cases if c.function.endswith("test_a")}
    for c in cases[2:]:
        v = dict(c.values)
        modules[c.nodeid] = (
            [f"m_{v['dtype'][1:-1]}"]
            if (v["dtype"], v["kind"]) in (("'fp16'", "'a'"), ("'bf16'", "'b'"))
            else [f"odd_{c.nodeid}"]
        )
    naive = [s for s in range(10) if len(modules_needed(sample.select(cases, seed=s).selected, modules)) > 2]
    assert naive, "no seed where the cover without the record needs more modules: the case shows nothing"
    for seed in naive:
        found = sample.select(cases, modules, seed=seed)
        assert uncovered(cases, found.selected) == set()
        assert modules_needed(found.selected, modules) == {"m_fp16", "m_bf16"} and found.modules == 2


def test_with_a_record_the_sample_never_needs_more_modules_than_without():
    rng = random.Random(11)
    for trial in range(30):
        cases = []
        for f in range(3):
            cases += product(
                f"tests/y.py::test_{f}",
                dtype=["fp16", "bf16"],
                head_dim=[64, 128, 256],
                backend=["fa2", "fa3", "auto"][: rng.randint(1, 3)],
            )
        # a module per (dtype, head_dim), or per backend: as FlashInfer's generators name them
        key = rng.choice(["dtype", "head_dim", "backend"])
        modules = {
            c.nodeid: [f"{key}={dict(c.values)[key]}", f"{dict(c.values)['dtype']}-{dict(c.values)['head_dim']}"]
            for c in cases
        }
        plain = sample.select(cases, seed=trial)
        aware = sample.select(cases, modules, seed=trial)
        assert uncovered(cases, aware.selected) == set()
        assert len(modules_needed(aware.selected, modules)) <= len(modules_needed(plain.selected, modules))


def test_a_required_module_gets_a_case_of_its_own():
    cases = product("tests/r.py::test_r", dtype=["fp16", "bf16"], head_dim=[64, 128])
    modules = {c.nodeid: [f"m_{dict(c.values)['dtype'][1:-1]}_{dict(c.values)['head_dim']}"] for c in cases}
    for module in sorted({m for ms in modules.values() for m in ms}):
        found = sample.select(cases, modules, required=[module])
        assert module in modules_needed(found.selected, modules), f"{module} is not exercised"
        assert uncovered(cases, found.selected) == set()


def test_a_required_module_with_no_recorded_case_collected_takes_its_functions_whole():
    cases = product("tests/w.py::test_w", dtype=["fp16", "bf16"], n=[1, 2, 3]) + product("tests/w.py::test_v", n=[1, 2])
    modules = {"tests/w.py::test_w[renamed-id]": ["gone_module"]}  # the record's id is no longer collected
    found = sample.select(cases, modules, required=["gone_module", "unknown_module"])
    assert [s for s in found.selected if "test_w[" in s] == [c.nodeid for c in cases if c.function.endswith("test_w")]
    assert found.whole == ["gone_module"] and found.missed == ["unknown_module"]
    assert uncovered(cases, found.selected) == set()


def test_tiny_and_unparametrized_functions_are_whole():
    cases = [
        sample.Case.of("tests/s.py::test_plain", "tests/s.py::test_plain", {}),
        *product("tests/s.py::test_one", dtype=["fp16"]),
        sample.Case.of("tests/s.py::TestK::test_method", "tests/s.py::TestK::test_method", {}),
    ]
    found = sample.select(cases)
    assert found.selected == [c.nodeid for c in cases], "each function of one case is in the sample"
    assert found.per_function == {c.function: [1, 1] for c in cases}
    assert sample.select([]).selected == [] and sample.select([]).total == 0


def test_value_ids_name_a_value_the_same_way_everywhere():
    import enum
    from types import SimpleNamespace

    class Layout(enum.Enum):
        NHD = 0

    assert (
        sample.value_id(0.25) == "0.25"
        and sample.value_id("llama") == "'llama'"
        and sample.value_id((1, 2)) == "(1, 2)"
    )
    assert sample.value_id(Layout.NHD) == "Layout:Layout.NHD"
    assert sample.value_id(object()) is None, "an object's repr holds its address, which differs between processes"
    # objects by the order their function's cases first show them, as pytest passes one object to each case of an entry
    a, b = object(), object()

    def item(nodeid, **params):
        return SimpleNamespace(nodeid=nodeid, callspec=SimpleNamespace(params=params))

    items = [
        item("t.py::f[a-1]", obj=a, n=1),
        item("t.py::f[b-1]", obj=b, n=1),
        item("t.py::f[a-2]", obj=a, n=2),
        SimpleNamespace(nodeid="t.py::g"),
    ]
    assert [c.values for c in sample.cases_of(items)] == [
        (("n", "1"), ("obj", "#0")),
        (("n", "1"), ("obj", "#1")),
        (("n", "2"), ("obj", "#0")),
        (),
    ]
    assert [c.function for c in sample.cases_of(items)] == ["t.py::f"] * 3 + ["t.py::g"]


def test_the_records_of_a_files_processes_merge_by_function():
    found = sample.select(ROPE_LIKE)
    part = sample.sample_record(found)
    gated = sample.sample_record(found, ["tests/t.py::test_pos_ids"])
    merged = sample.merge_records([part, part])  # two parts of the same file: counted once
    assert merged["total"] == 4632 and merged["selected"] == len(found.selected) and merged["seed"] == sample.SEED
    assert sample.merge_records([gated])["total"] == 24
    assert sample.merge_records([]) is None


def test_the_spec_is_written_whole_and_read_back(tmp_path):
    path = tmp_path / "sample.json"
    sample.write_spec(path, 5, {"tests/a.py::test_a[1]": ["m"]}, ["m"])
    assert sample.read_spec(path) == (5, {"tests/a.py::test_a[1]": ["m"]}, ["m"])


def test_a_required_module_another_files_process_exercised_is_not_missed():
    """Every process of a sampled run is given every required module: one whose recorded cases are
    in another file is missed in this one's sample, but exercised in the run."""
    file_a = [sample.Case.of(f"tests/a.py::f[{n}]", "tests/a.py::f", {"n": str(n)}) for n in range(3)]
    file_b = [sample.Case.of(f"tests/b.py::g[{n}]", "tests/b.py::g", {"n": str(n)}) for n in range(3)]
    record = {"tests/a.py::f[2]": ["mod_a"], "tests/b.py::g[1]": ["mod_b"]}
    in_a = sample.select(
        file_a, {k: v for k, v in record.items() if k.startswith("tests/a.py")}, required=["mod_a", "mod_b"]
    )
    in_b = sample.select(
        file_b, {k: v for k, v in record.items() if k.startswith("tests/b.py")}, required=["mod_a", "mod_b"]
    )
    assert in_a.missed == ["mod_b"] and in_b.missed == ["mod_a"]  # each alone misses the other's
    assert "tests/a.py::f[2]" in in_a.selected and "tests/b.py::g[1]" in in_b.selected
    merged = sample.merge_records([sample.sample_record(in_a), sample.sample_record(in_b)])
    assert merged["missed"] == [] and merged["whole"] == []
    # a module no process had a case of stays missed
    lone = sample.merge_records([sample.sample_record(sample.select(file_a, {}, required=["mod_c"]))])
    assert lone["missed"] == ["mod_c"]


def test_whole_and_missed_over_a_runs_processes_are_what_no_process_covered_by_a_case():
    """covering's rules: a required module is whole where some process ran its functions whole and
    none exercised it by a recorded case; missed where no process exercised it at all. A record may
    lack `exercised`, `whole` and `missed` (RECORD_SHAPE)."""
    records = [
        {"seed": 1, "functions": {"f": [1, 4]}, "exercised": ["a", "b"], "whole": ["b"], "missed": ["c"]},
        {"seed": 1, "functions": {"g": [2, 2]}, "exercised": ["c"], "whole": [], "missed": []},
        {"seed": 1, "functions": {"h": [3, 9]}, "exercised": ["d"], "whole": ["d"], "missed": ["e"]},
        {"seed": 1, "functions": {"f": [1, 4]}},  # a part of f's file: the same function, counted once
    ]
    merged = sample.merge_records(records)
    assert merged == {
        "selected": 6,
        "total": 15,
        "seed": 1,
        "functions": 3,
        "whole": ["b", "d"],
        "missed": ["e"],
    }
    # b exercised by a case in another process: no longer whole
    with_b = [*records, {"seed": 1, "functions": {"k": [1, 1]}, "exercised": ["b"]}]
    assert sample.merge_records(with_b)["whole"] == ["d"]


def test_a_required_modules_case_is_never_dropped_as_redundant_and_is_the_one_adding_fewest_modules():
    """Q is recorded only for f[1-1], whose values the module-aware cover then finds again in two
    cheaper cases: pruned as redundant, Q would go unexercised. And of A's recorded cases the one
    adding the fewest modules is taken, not the first collected (f[1-1] adds X1 and X2)."""
    cases = product("tests/q.py::f", p=[1, 2], q=[1, 2])
    ids = {dict(c.values)["p"] + dict(c.values)["q"]: c.nodeid for c in cases}
    modules = {ids["11"]: ["M", "Q"], ids["12"]: ["M"], ids["21"]: ["M"], ids["22"]: ["N"]}
    found = sample.select(cases, modules, required=["Q"])
    assert ids["11"] in found.selected and found.exercised == ["Q"] and found.missed == []
    assert uncovered(cases, found.selected) == set()
    modules = {ids["11"]: ["A", "X1", "X2"], ids["12"]: ["A"], ids["21"]: ["A"], ids["22"]: ["A"]}
    assert cases[0].nodeid == ids["11"]  # collected first
    for seed in range(5):
        found = sample.select(cases, modules, seed=seed, required=["A"])
        assert ids["11"] not in found.selected and found.modules == 1 and found.exercised == ["A"], found.selected


def test_every_required_module_gets_its_case_after_one_that_a_case_covered_already():
    """A's case brings B too; C's case adds no value the cover lacks once A's and another are taken."""
    cases = product("tests/r.py::f", n=[1, 2], m=[1, 2])
    ids = {dict(c.values)["n"] + dict(c.values)["m"]: c.nodeid for c in cases}
    modules = {ids["11"]: ["A", "B"], ids["12"]: ["C"], ids["21"]: ["Y"], ids["22"]: ["Y"]}
    found = sample.select(cases, modules, required=["A", "B", "C"])
    assert found.exercised == ["A", "B", "C"] and found.missed == [] and found.whole == []
    assert ids["12"] in found.selected


def test_where_the_plain_cover_needs_fewer_modules_than_the_module_aware_one_it_is_taken():
    """The module-aware greedy cover is no optimum: on this 3x3 family (found by a search) the cover
    by values alone needs 2 modules and the module-aware one 3; select keeps the cheaper."""
    table = {"0-0": "m0", "0-1": "m1", "0-2": "m3", "1-0": "m2", "1-1": "m2", "1-2": "m0", "2-0": "m3"}
    table |= {"2-1": "m1", "2-2": "m3"}
    cases = [sample.Case.of(f"t.py::f[{key}]", "t.py::f", {"a0": key[0], "a1": key[2]}) for key in sorted(table)]
    modules = {f"t.py::f[{key}]": [m] for key, m in table.items()}
    order = sorted(c.nodeid for c in cases)
    random.Random(sample.SEED).shuffle(order)
    rank = {nodeid: i for i, nodeid in enumerate(order)}
    assert len(sample.greedy(cases, modules, rank, True, [])[0].modules) == 3
    assert len(sample.greedy(cases, modules, rank, False, [])[0].modules) == 2
    found = sample.select(cases, modules)
    assert found.modules == 2 and uncovered(cases, found.selected) == set()


def test_without_a_record_of_two_cases_adding_as_many_values_the_one_sharing_more_with_the_cover():
    """Cover.best by values: the same dtype in two test functions tends to be the same module."""
    shared = sample.Case.of("tests/s.py::g[a]", "tests/s.py::g", {"dtype": "fp16", "n": "1"})
    other = sample.Case.of("tests/s.py::g[b]", "tests/s.py::g", {"dtype": "bf16", "n": "2"})
    for rank in ({shared.nodeid: 0, other.nodeid: 1}, {shared.nodeid: 1, other.nodeid: 0}):
        cover = sample.Cover([shared, other], None, rank)
        cover.shared = {("dtype", "fp16")}  # another function's chosen case
        assert cover.best([shared, other], by_modules=False) is shared


def test_a_redundant_case_is_dropped_last_taken_first_and_each_drop_counts():
    def case(name: str, **values) -> sample.Case:
        return sample.Case.of(f"tests/p.py::f[{name}]", "tests/p.py::f", {k: str(v) for k, v in values.items()})

    a, b, c, d = case("a", x=1, y=1), case("b", x=1, y=2), case("c", x=2, y=2), case("d", x=1, y=2)
    cover = sample.Cover([a, b, c, d], None, {n.nodeid: i for i, n in enumerate([a, b, c, d])})
    for each in (a, b, c, d, d):  # d twice: taken once
        cover.take(each)
    assert cover.chosen == [a, b, c, d]
    cover.prune()  # d: both values twice more; then c: x=2 once; b: both twice, once d is gone; a: x=1 once
    assert cover.chosen == [a, c] and cover.picked == {a.nodeid, c.nodeid}
    twins = [case("p", x=1), case("q", x=1), case("r", x=1)]  # one value, three cases (another, unnamed parameter)
    cover = sample.Cover(twins, None, {n.nodeid: i for i, n in enumerate(twins)})
    for each in twins:
        cover.take(each)
    cover.prune()
    assert cover.chosen == twins[:1]


def test_the_module_aware_cover_takes_the_most_new_values_per_new_module():
    """Cover.best's key: new values over the modules a case adds. Of a case adding 3 values and 3
    modules and one adding 2 values and 1 module, the second."""
    wide = sample.Case.of("tests/b.py::f[w]", "tests/b.py::f", {"x": "1", "y": "1", "z": "1"})
    lean = sample.Case.of("tests/b.py::f[l]", "tests/b.py::f", {"x": "2", "y": "2", "z": "1"})
    modules = {wide.nodeid: ["W1", "W2", "W3"], lean.nodeid: ["L1"]}
    seeded = sample.Cover([wide, lean], modules, {wide.nodeid: 0, lean.nodeid: 1})
    seeded.lacking["tests/b.py::f"] = {("x", "1"), ("y", "1"), ("z", "1"), ("x", "2"), ("y", "2")}
    seeded.modules = {"L0"}
    assert seeded.best([wide, lean], by_modules=True) is lean
    assert seeded.best([wide, lean], by_modules=False) is wide  # without the record: the most new values
