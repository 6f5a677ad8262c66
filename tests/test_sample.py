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
