"""The pytest plugin's rules of what a run's process runs and in which order (fidev.upstream.plugin),
in this process: a part's share, the sample, the order of the built cases first, and what the
narrowed warmup builds. upstream-tests loads the plugin into pytest processes of its own
(tests/test_upstream_tests.py and tests/test_first_failure.py run it there); here each rule is held
by a test that fails without it (the mutation run of docs/testing.md)."""

import json
from types import SimpleNamespace

import pytest

from fidev.upstream import plugin
from fidev.upstream import sample as upstream_sample
from fidev.upstream.outcomes import COLLECTED
from fidev.upstream.settings import Settings


class Hooks:
    """A pytest config's hooks, as much as the plugin calls: the deselected items, as pytest_deselected gets them."""

    def __init__(self):
        self.deselected: list[list[str]] = []
        self.hook = SimpleNamespace(pytest_deselected=self.record)

    def record(self, items) -> None:
        self.deselected.append([item.nodeid for item in items])


def items(*nodeids: str, **params) -> list:
    return [
        SimpleNamespace(nodeid=n, callspec=SimpleNamespace(params=dict(params, n=i))) for i, n in enumerate(nodeids)
    ]


def test_a_part_takes_every_kth_case_from_its_ith_and_notes_a_digest_of_what_it_split(tmp_path):
    outcomes = tmp_path / "o.jsonl"
    collected = items(*(f"t.py::f[{i}]" for i in range(7)))
    config = Hooks()
    parts = plugin.Parts(Settings(outcomes=outcomes, part=(2, 3)))
    kept = list(collected)
    parts.narrow(config, kept)
    assert [i.nodeid for i in kept] == ["t.py::f[1]", "t.py::f[4]"]
    assert config.deselected == [[f"t.py::f[{i}]" for i in (0, 2, 3, 5, 6)]]
    assert not parts.splitting
    line = json.loads(outcomes.read_text())
    assert line["outcome"] == COLLECTED and line["nodeid"] == ""
    other = tmp_path / "p.jsonl"
    plugin.Parts(Settings(outcomes=other, part=(1, 3))).narrow(Hooks(), list(collected))
    assert json.loads(other.read_text())["message"] == line["message"], "two parts of one list: one digest"
    plugin.Parts(Settings(outcomes=other, part=(1, 3))).narrow(Hooks(), list(collected[:6]))
    assert json.loads(other.read_text().splitlines()[1])["message"] != line["message"]


def test_a_parts_deselections_do_not_narrow_the_run_and_any_other_does(tmp_path):
    parts = plugin.Parts(Settings(outcomes=tmp_path / "o.jsonl", part=(1, 2)))
    before = plugin.Builds(Settings(), parts=parts)
    before.pytest_deselected(items("t.py::d"))  # pytest's own -k, before any part took its share
    assert before.narrowed
    builds = plugin.Builds(Settings(), parts=parts)
    config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=builds.pytest_deselected))
    parts.narrow(config, items("t.py::a", "t.py::b", "t.py::c"))  # pytest calls the hook of every plugin
    assert not builds.narrowed, "a part's share of a whole file is no subset of its cases"
    builds.pytest_deselected(items("t.py::d"))  # pytest's own -k, before the plugin's hook
    assert builds.narrowed
    builds = plugin.Builds(Settings(), parts=parts)
    parts.splitting = True
    builds.pytest_deselected(items("t.py::a"))
    assert not builds.narrowed, "a part's share of a whole file is no subset of its cases"
    parts.splitting = False
    builds.pytest_deselected([])
    assert not builds.narrowed
    builds.pytest_deselected(items("t.py::a"))
    assert builds.narrowed


def test_the_built_cases_run_first_then_those_with_fewest_modules_left(monkeypatch):
    built = {"m_built"}
    monkeypatch.setattr(plugin, "module_built", lambda name: name in built)
    needs = {
        "t.py::two_left": ["m_a", "m_b"],
        "t.py::one_left": ["m_built", "m_c"],
        "t.py::built": ["m_built"],
        # t.py::unnamed: the record does not name it, one module of its own
    }
    builds = plugin.Builds(Settings(), needs)
    builds.config = SimpleNamespace()
    collected = items("t.py::two_left", "t.py::one_left", "t.py::unnamed", "t.py::built")
    builds.order(collected)  # one module left to build each, one_left and unnamed keep their order
    assert [i.nodeid for i in collected] == ["t.py::built", "t.py::one_left", "t.py::unnamed", "t.py::two_left"]
    assert builds.kept == ["t.py::two_left", "t.py::one_left", "t.py::unnamed", "t.py::built"]
    worker = plugin.Builds(Settings(), needs)
    worker.config = SimpleNamespace(workerinput={})  # an xdist worker: every worker collects one list, unsorted
    collected = items("t.py::two_left", "t.py::built")
    worker.order(collected)
    assert [i.nodeid for i in collected] == ["t.py::two_left", "t.py::built"]
    unrecorded = plugin.Builds(Settings(), {})
    unrecorded.config = SimpleNamespace()
    collected = items("t.py::two_left", "t.py::built")
    unrecorded.order(collected)
    assert [i.nodeid for i in collected] == ["t.py::two_left", "t.py::built"]


def test_the_cases_to_run_need_the_modules_the_record_names_and_say_where_it_names_none():
    builds = plugin.Builds(Settings(), {"t.py::a": ["m1", "m2"], "t.py::b": ["m2", "m3"], "t.py::c": ["m4"]})
    builds.kept = ["t.py::a", "t.py::b"]
    assert builds.needed() == ({"m1", "m2", "m3"}, False)
    builds.kept = ["t.py::a", "t.py::new"]
    assert builds.needed() == ({"m1", "m2"}, True)
    assert plugin.Builds(Settings(), None).needed() == (None, True)


@pytest.mark.parametrize(
    ("recorded", "now", "asked", "unnamed", "said"),
    [
        (
            False,
            0,
            5,
            True,
            "each case builds what it loads, and the rest build beside them after the first case",
        ),
        (
            True,
            2,
            5,
            False,
            "the 2 its cases need by the record build side by side now, the cases with their modules built running "
            "first; the 3 no case to run needs are not built",
        ),
        (
            True,
            2,
            2,
            False,
            "the 2 its cases need by the record build side by side now, the cases with their "
            "modules built running first",
        ),
        (
            True,
            0,
            3,
            True,
            "a case the record does not name builds what it loads; the 3 no case to run needs are not built",
        ),
    ],
)
def test_what_the_narrowed_warmup_builds_is_said(recorded, now, asked, unnamed, said):
    assert plugin.Builds.warmup_plan(recorded, now, asked, unnamed) == said


def test_the_sample_narrows_what_was_collected_and_records_what_the_gate_let_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a record written where no outcomes are would land here
    spec = tmp_path / "sample.json"
    upstream_sample.write_spec(spec, upstream_sample.SEED, {}, [])
    outcomes = tmp_path / "o.jsonl"
    sampling = plugin.Sampling(Settings(sample=spec, outcomes=outcomes, gate=tmp_path / "gate"))
    sampling.record(None)  # nothing sampled yet: nothing to record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sample.json"]
    collected = [
        SimpleNamespace(nodeid=f"t.py::f[{d}-{n}]", callspec=SimpleNamespace(params={"d": d, "n": n}))
        for d in ("fp16", "bf16")
        for n in (1, 2, 3)
    ] + [SimpleNamespace(nodeid="t.py::g")]
    config = Hooks()
    kept = list(collected)
    sampling.narrow(config, kept)
    chosen = [i.nodeid for i in kept]
    assert len(chosen) < len(collected) and "t.py::g" in chosen
    assert sorted(config.deselected[0] + chosen) == sorted(i.nodeid for i in collected)
    sampling.record(["t.py::g"])  # the gate named g alone
    record = json.loads((tmp_path / f"o.jsonl{upstream_sample.RECORD}").read_text())
    assert list(record["functions"]) == ["t.py::g"]
    sampling.record(["t.py::f"])  # a function named: all its cases
    assert list(json.loads((tmp_path / f"o.jsonl{upstream_sample.RECORD}").read_text())["functions"]) == ["t.py::f"]
    sampling.record(None)
    assert set(json.loads((tmp_path / f"o.jsonl{upstream_sample.RECORD}").read_text())["functions"]) == {
        "t.py::f",
        "t.py::g",
    }
    dry = plugin.Sampling(Settings(sample=spec))  # the plan's dry run: no outcomes, no record
    dry.narrow(Hooks(), list(collected))
    (tmp_path / f"o.jsonl{upstream_sample.RECORD}").unlink()
    dry.record(None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sample.json"]


def test_the_sample_is_the_one_its_spec_names_its_seed_record_and_required_modules(tmp_path):
    collected = [
        SimpleNamespace(nodeid=f"t.py::f[{d}-{h}-{n}]", callspec=SimpleNamespace(params={"d": d, "h": h, "n": n}))
        for d in ("fp16", "bf16")
        for h in (64, 128, 256)
        for n in (1, 2, 3, 4)
    ]
    record = {"t.py::f[bf16-128-4]": ["m_x"], "t.py::f[fp16-64-1]": ["m_y"]}
    spec = tmp_path / "sample.json"
    upstream_sample.write_spec(spec, 7, record, ["m_x"])
    sampling = plugin.Sampling(Settings(sample=spec))
    kept = list(collected)
    sampling.narrow(Hooks(), kept)
    assert sampling.found == upstream_sample.select(upstream_sample.cases_of(collected), record, 7, ["m_x"])
    assert "t.py::f[bf16-128-4]" in [i.nodeid for i in kept] and sampling.found.exercised == ["m_x"]
