"""What affected counts as changed since its last verdict (fidev.affected.changes), in the test's process: the
edits a build recorded since (since_judged, unjudged), the kept not-covered edits (uncovered_edits), the verdicts
that are not a pass (standing_failures) and each file's content before its edit (before_edits); and the regeneration
after a Python edit (regenerate, regenerate_edits, regenerated_line), the modules compiling each input (compilers) and
find's order of these rules, each with its collaborators standing in."""

import itertools
import json
from types import SimpleNamespace

import pytest

from fidev.affected import changes, verdicts
from fidev.core.files import file_fact
from fidev.core.workspace import GENERATORS, INPUTS, TREE

WHEN = "2026-11-29 10:00:00"
OLD = [1, 2, "0" * 64]  # a file's fact before its edit: no file now has that hash


def tree_with(tmp_path, *files):
    """The vendored tree with each file (relative to it) written with its name as content."""
    tree = tmp_path / "tree"
    for rel in files:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(rel)
    return tree


def module(tmp_path, name, generated=True, generators=None):
    """A built module: its build folder with a content record, and its generators record where given."""
    build_dir = tmp_path / "jit" / "cached_ops" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / INPUTS).write_text("{}")
    if generators is not None:
        (build_dir / GENERATORS).write_text(json.dumps({str(p): fact for p, fact in generators.items()}))
    return SimpleNamespace(name=name, build_dir=build_dir, generated=generated)


def found_of(tree, modules=(), dirs=(), tier=None):
    return SimpleNamespace(tree=tree, modules=list(modules), dirs=list(dirs), tier=tier or {})


def kept_of(tmp_path, judged=None, gaps=None):
    kept = verdicts.Kept(tmp_path / "no kept verdicts.json")
    kept.judged, kept.gaps = judged, gaps or {}
    return kept


def compiled_by(tree, by_rel):
    """by_input as changes.find gives it: {resolved input: its modules}, asked for at most once here."""
    asked = []

    def by_input():
        asked.append(True)
        return {str((tree / rel).resolve()): names for rel, names in by_rel.items()}

    return by_input


@pytest.fixture
def no_release(monkeypatch):
    """The pinned release is never asked for where a verdict of affected's own is kept."""

    def refused(*_):
        raise AssertionError("the release was asked for though a verdict is kept")

    monkeypatch.setattr(changes.release_reference, "edited_files", refused)
    monkeypatch.setattr(changes.release_reference, "released_facts", refused)


def test_an_edit_built_since_the_verdict_runs_the_tests_of_the_modules_compiling_it(tmp_path, capsys, no_release):
    tree = tree_with(tmp_path, "include/a.cuh", "include/new.cuh", "include/alone.cuh", "csrc/same.cu")
    now = {rel: file_fact(tree / rel) for rel in ("include/a.cuh", "include/new.cuh", "include/alone.cuh")}
    now["csrc/same.cu"] = [5, 6, "s" * 64]
    judged = {"include/a.cuh": OLD, "csrc/same.cu": [7, 8, "s" * 64], "include/gone.cuh": OLD, "include/alone.cuh": OLD}
    ch = changes.Changes([], {}, now=now)
    by_input = compiled_by(tree, {"include/a.cuh": ["norm", "rope"], "include/new.cuh": ["gemm"]})
    changes.since_judged(found_of(tree), ch, kept_of(tmp_path, judged), by_input)
    a, new = str(tree / "include/a.cuh"), str(tree / "include/new.cuh")
    assert ch.changed == {"norm": {a: "built since"}, "rope": {a: "built since"}, "gemm": {new: "built since"}}
    assert ch.by_file == {"include/a.cuh": {"norm", "rope"}, "include/new.cuh": {"gemm"}, "include/alone.cuh": set()}
    assert ch.before == {"include/a.cuh": OLD, "include/alone.cuh": OLD}, "a file judged absent has no content before"
    assert ch.unjudged_generators == []
    assert capsys.readouterr().out == (
        "affected: include/a.cuh, include/alone.cuh, include/new.cuh changed since its last verdict, and a build "
        "recorded the edit since: its modules' tests and its kernel families' run\n"
    )


def test_an_edit_shown_otherwise_or_deleted_is_not_counted_again_as_built_since(tmp_path, capsys, no_release):
    files = ("include/shown.cuh", "include/reverted.cuh", "flashinfer/norm.py", "include/both.cuh")
    tree = tree_with(tmp_path, *files)
    now = {rel: file_fact(tree / rel) for rel in files}
    ch = changes.Changes([str(tree / "flashinfer/norm.py")], {}, now=now)
    ch.by_file = {"include/shown.cuh": {"norm"}, "include/both.cuh": set()}
    ch.reverted = {"include/reverted.cuh", "include/both.cuh"}
    judged = {**dict.fromkeys(files, OLD), "include/deleted.cuh": OLD}
    by_input = compiled_by(tree, dict.fromkeys(files, ["norm"]))
    changes.since_judged(found_of(tree), ch, kept_of(tmp_path, judged), by_input)
    assert ch.changed == {} and ch.before == {} and ch.unjudged_generators == []
    assert ch.by_file == {"include/shown.cuh": {"norm"}, "include/both.cuh": set()}
    assert capsys.readouterr().out == ""


def test_a_file_as_judged_differs_only_by_its_hash_and_where_one_side_lacks_it(tmp_path, no_release):
    tree = tree_with(tmp_path, "include/touched.cuh", "include/edited.cuh", "include/added.cuh", "include/same.cuh")
    now = {
        "include/touched.cuh": [3, 4, "t" * 64],
        "include/edited.cuh": [3, 4, "e" * 64],
        "include/added.cuh": None,
        "include/same.cuh": None,
    }
    judged = {
        "include/touched.cuh": [1, 2, "t" * 64],
        "include/edited.cuh": [3, 4, "x" * 64],
        "include/same.cuh": None,
        "include/removed.cuh": None,
    }
    ch = changes.Changes([], {}, now=now)
    edits, baseline = changes.unjudged(found_of(tree), ch, judged)
    assert edits == ["include/added.cuh", "include/edited.cuh", "include/removed.cuh"] and baseline is judged
    assert changes.unjudged(found_of(tree), changes.Changes([], {}, now={"include/a.cuh": [1, 2]}), {})[0] == [
        "include/a.cuh"
    ]
    two = changes.Changes([], {}, now={"include/a.cuh": [1, 2]})
    assert changes.unjudged(found_of(tree), two, {"include/a.cuh": [5, 6]}) == ([], {"include/a.cuh": [5, 6]})
    hashed = changes.Changes([], {}, now={"include/a.cuh": [1, 2, "a" * 64]})
    assert changes.unjudged(found_of(tree), hashed, {"include/a.cuh": [1, 2]})[0] == ["include/a.cuh"]
    assert changes.unjudged(found_of(tree), hashed, {"include/a.cuh": None})[0] == ["include/a.cuh"]


def released(monkeypatch, tree, edited):
    """The pinned release's answers for `tree`: its edited files, or a Failure to raise, and its facts."""
    pinned = object()
    monkeypatch.setattr(changes, "pins", lambda: pinned)

    def edited_files(at, pins):
        assert at == tree and pins is pinned
        if isinstance(edited, Exception):
            raise edited
        return edited

    def released_facts(at):
        assert at == tree
        return {"include/a.cuh": OLD}

    monkeypatch.setattr(changes.release_reference, "edited_files", edited_files)
    monkeypatch.setattr(changes.release_reference, "released_facts", released_facts)


def test_before_any_verdict_an_edit_is_told_from_the_pinned_release(tmp_path, capsys, monkeypatch):
    tree = tree_with(tmp_path, "include/a.cuh", "README.md")
    released(monkeypatch, tree, ["README.md", "include/a.cuh"])
    ch = changes.Changes([], {}, now={"include/a.cuh": file_fact(tree / "include/a.cuh")})
    assert changes.unjudged(found_of(tree), ch, None) == (["include/a.cuh"], {"include/a.cuh": OLD})
    by_input = compiled_by(tree, {"include/a.cuh": ["norm"]})
    changes.since_judged(found_of(tree), ch, kept_of(tmp_path), by_input)
    assert ch.changed == {"norm": {str(tree / "include/a.cuh"): "built since"}} and ch.before == {"include/a.cuh": OLD}
    assert capsys.readouterr().out == (
        "affected: include/a.cuh changed from the pinned release (it has given no verdict here yet), and a build "
        "recorded the edit since: its modules' tests and its kernel families' run\n"
    )


def test_without_a_verdict_or_a_release_to_tell_edits_by_none_is_seen_and_that_is_said(tmp_path, capsys, monkeypatch):
    tree = tree_with(tmp_path, "include/a.cuh")
    released(monkeypatch, tree, changes.Failure("the tree has no pinned commit", "fetch it"))
    assert changes.unjudged(found_of(tree), changes.Changes([], {}), None) == ([], {})
    assert capsys.readouterr().out == (
        "affected: no verdict of its own is kept here yet, and the tree has no pinned commit: an edit a build "
        "recorded before this run is not seen (every later one is)\n"
    )


def test_a_generator_edit_built_since_runs_the_tests_of_the_modules_generated_after_it(tmp_path, capsys, no_release):
    tree = tree_with(tmp_path, "flashinfer/jit/gen.py")
    gen = tree / "flashinfer/jit/gen.py"
    after, before = {gen: file_fact(gen)}, {gen: OLD}
    modules = [
        module(tmp_path, "generated_after", generators=after),
        module(tmp_path, "plain_after", generated=False, generators=after),
        module(tmp_path, "smoke_after", generated=False, generators=after),
        module(tmp_path, "generated_before", generators=before),
        module(tmp_path, "unrecorded"),
    ]
    ch = changes.Changes([], {}, now={"flashinfer/jit/gen.py": file_fact(gen)})
    kept = kept_of(tmp_path, {"flashinfer/jit/gen.py": OLD})
    by_input = compiled_by(tree, {"flashinfer/jit/gen.py": ["plain_after"]})
    changes.since_judged(found_of(tree, modules, tier={"smoke_after": "norm"}), ch, kept, by_input)
    assert ch.changed == {"generated_after": {str(gen): "built since"}, "smoke_after": {str(gen): "built since"}}
    assert ch.by_file == {"flashinfer/jit/gen.py": {"generated_after", "smoke_after"}}
    assert ch.unjudged_generators == [str(gen)] and ch.before == {"flashinfer/jit/gen.py": OLD}
    assert "flashinfer/jit/gen.py changed since its last verdict" in capsys.readouterr().out


def test_with_nothing_unjudged_since_judged_changes_nothing_and_says_nothing(tmp_path, capsys, no_release):
    tree = tree_with(tmp_path, "include/a.cuh")
    now = {"include/a.cuh": file_fact(tree / "include/a.cuh")}
    ch = changes.Changes([], {}, now=now)
    changes.since_judged(found_of(tree), ch, kept_of(tmp_path, dict(now)), compiled_by(tree, {}))
    assert (ch.changed, ch.by_file, ch.before, ch.unjudged_generators) == ({}, {}, {}, [])
    assert capsys.readouterr().out == ""


def gap(was, result="not covered", families=("norm", "rope")):
    return verdicts.Gap(was, list(families), WHEN, result)


def test_a_kept_gap_runs_its_compiling_modules_tests_again_until_reverted(tmp_path, capsys):
    tree = tree_with(tmp_path, "csrc/a.cu", "include/failed.cuh", "include/late.cuh", "include/nc.cuh")
    gaps = {
        "csrc/a.cu": gap(file_fact(tree / "csrc/a.cu")),
        "include/failed.cuh": gap(OLD, "failed"),
        "include/late.cuh": gap(OLD, "unfinished", ["gemm"]),
        "include/nc.cuh": gap(OLD),
        "include/new.cuh": gap(None),
    }
    ch = changes.Changes([], {})
    ch.changed = {"norm": {"csrc/x.cu": "edited"}}
    by_input = compiled_by(tree, {"include/failed.cuh": ["norm"], "include/nc.cuh": ["rope"], "csrc/a.cu": ["norm"]})
    changes.uncovered_edits(found_of(tree), ch, kept_of(tmp_path, gaps=gaps), by_input)
    failed, nc = str(tree / "include/failed.cuh"), str(tree / "include/nc.cuh")
    assert ch.reverted == {"csrc/a.cu", "include/new.cuh"}, "as before its edit: the same content, or no file"
    assert ch.changed == {"norm": {"csrc/x.cu": "edited", failed: "not covered"}, "rope": {nc: "not covered"}}
    assert ch.uncovered == {"include/late.cuh"}, "a gap no built module compiles"
    assert capsys.readouterr().out.splitlines() == [
        f"affected: include/failed.cuh: the tests of norm, rope it reaches failed at {WHEN} (kept): "
        "they run again until they pass, or it is reverted",
        f"affected: include/late.cuh: the tests of gemm it reaches did not finish at {WHEN} (kept): "
        "they run again until they pass, or it is reverted",
        f"affected: include/nc.cuh reached norm, rope untested at {WHEN} (kept): "
        "not covered until those tests run and pass, or it is reverted",
    ]


def verdicts_kept(tmp_path, results):
    """Kept verdicts of {module: (result, build dir)}, read back."""
    path = tmp_path / "fidev-affected.json"
    verdicts.Kept(path).record({name: (build_dir, result, [], []) for name, (result, build_dir) in results.items()})
    return verdicts.Kept(path)


def test_a_module_unchanged_since_a_verdict_not_a_pass_runs_its_tests_again(tmp_path):
    ms = {name: module(tmp_path, name) for name in ("edited", "failed", "unfinished", "passed", "rebuilt", "new")}
    kept = verdicts_kept(
        tmp_path, {name: ("passed" if name == "passed" else "failed", ms[name].build_dir) for name in list(ms)[:5]}
    )
    kept.modules["unfinished"].result = "unfinished"
    (ms["rebuilt"].build_dir / INPUTS).write_text('{"other": {}}')
    ch = changes.Changes([], {})
    ch.changed = {"edited": {"csrc/a.cu": "edited"}}
    changes.standing_failures(found_of(tmp_path, ms.values()), ch, kept)
    failed, unfinished = kept.modules["failed"], kept.modules["unfinished"]
    assert ch.changed == {
        "edited": {"csrc/a.cu": "edited"},
        "failed": {f"(the last run failed at {failed.when}: its tests run again)": "failed"},
        "unfinished": {f"(the last run unfinished at {unfinished.when}: its tests run again)": "unfinished"},
    }


def test_where_the_kept_verdicts_cannot_be_read_every_unchanged_module_runs_its_tests(tmp_path):
    ms = [module(tmp_path, name) for name in ("edited", "norm")]
    kept = kept_of(tmp_path)
    kept.problem = "affected's kept verdicts cannot be read"
    ch = changes.Changes([], {})
    ch.changed = {"edited": {"csrc/a.cu": "edited"}}
    changes.standing_failures(found_of(tmp_path, ms), ch, kept)
    assert ch.changed == {"edited": {"csrc/a.cu": "edited"}, "norm": {changes.UNKEPT: "unknown"}}


def test_a_files_content_before_its_edit_is_a_record_that_differs_from_it_now(tmp_path):
    tree = tree_with(tmp_path, "flashinfer/jit/gen.py", "include/a.cuh", "include/same.cuh", "csrc/b.cu")
    gen = tree / "flashinfer/jit/gen.py"
    now = {rel: file_fact(tree / rel) for rel in ("include/a.cuh", "include/same.cuh", "csrc/b.cu")}
    modules = [
        module(tmp_path, "rebuilt", generators={gen: file_fact(gen)}),
        module(tmp_path, "old", generators={gen: OLD}),
    ]
    jit_dir = tmp_path / "jit" / "cached_ops"
    (jit_dir.parent / TREE).write_text(json.dumps({**now, "include/a.cuh": OLD, "csrc/gone.cu": OLD}))
    other = tmp_path / "other" / "cached_ops"
    other.mkdir(parents=True)
    (other.parent / TREE).write_text(json.dumps({"csrc/b.cu": [9, 9, "b" * 64], "include/a.cuh": now["include/a.cuh"]}))
    before = changes.before_edits(found_of(tree, modules, [jit_dir, other]))
    assert before == {
        "flashinfer/jit/gen.py": OLD,
        "include/a.cuh": OLD,
        "csrc/b.cu": [9, 9, "b" * 64],
        "csrc/gone.cu": OLD,
    }


@pytest.fixture
def ninja(monkeypatch):
    """ninja_inputs' answers by module folder name: its content record's edits (none: {}; no record: None), ninja's
    dry run (what a build would compile, and its edges); each call's arguments are kept."""
    answers = SimpleNamespace(edits={}, dry={}, stats=[])

    def edited(build_dir, stats):
        answers.stats.append(stats)
        return answers.edits.get(build_dir.name, {})

    def dry_run(build_dir, ninja_path):
        assert ninja_path == build_dir / "build.ninja"
        return answers.dry[build_dir.name]

    monkeypatch.setattr(changes.ninja_inputs, "edited", edited)
    monkeypatch.setattr(changes.ninja_inputs, "dry_run", dry_run)
    return answers


def with_ninja(m):
    m.ninja_path = m.build_dir / "build.ninja"
    return m


def test_a_module_is_edited_by_its_content_record_else_by_what_ninja_would_compile(tmp_path, capsys, ninja):
    names = ("both_unreadable", "generators_unreadable", "recorded", "current", "no_ninja", "newer", "link_only")
    ms = [with_ninja(module(tmp_path, name)) for name in names]
    (ms[0].build_dir / INPUTS).write_text('{"truncated')
    (ms[0].build_dir / GENERATORS).write_text("[]")
    (ms[1].build_dir / GENERATORS).write_text('{"truncated')
    ninja.edits = {"recorded": {"csrc/a.cu": "edited"}, "no_ninja": None, "newer": None, "link_only": None}
    ninja.dry = {"no_ninja": None, "newer": ({"a.o"}, 2), "link_only": (set(), 1)}
    assert changes.edited(ms) == {
        "both_unreadable": {f"(its build record {INPUTS} cannot be read)": "edited"},
        "generators_unreadable": {f"(its build record {GENERATORS} cannot be read)": "edited"},
        "recorded": {"csrc/a.cu": "edited"},
        "no_ninja": {"no_ninja (no record: ninja finds newer inputs)": "edited"},
        "newer": {"newer (no record: ninja finds newer inputs)": "edited"},
    }
    assert len(ninja.stats) == 5 and all(stats is ninja.stats[0] == {} for stats in ninja.stats), "one stat cache"
    assert capsys.readouterr().out.splitlines() == [
        f"affected: {name}: its build record {record} cannot be read (truncated?): it is taken as edited, rebuilt, "
        "and its tests run"
        for name, record in (("both_unreadable", INPUTS), ("generators_unreadable", GENERATORS))
    ]


def test_a_module_left_unregenerated_is_changed_and_one_whose_input_is_deleted_is_refused(tmp_path, ninja):
    ms = [with_ninja(module(tmp_path, name)) for name in ("both", "unregenerated", "gone")]
    ninja.edits = {"both": {"csrc/a.cu": "edited"}}
    ch = changes.Changes([], dict.fromkeys(("both", "unregenerated", "gone"), []))
    ch.unregenerated = {"both", "unregenerated"}
    changes.changed_modules(found_of(tmp_path, ms), ch)
    assert ch.changed == {
        "both": {"csrc/a.cu": "edited", "(not regenerated)": "edited"},
        "unregenerated": {"(not regenerated)": "edited"},
    }
    ninja.edits["gone"] = {"csrc/kept.cu": "edited", "include/x.h": "deleted", "include/y.h": "deleted"}
    with pytest.raises(changes.Failure) as refused:
        changes.changed_modules(found_of(tmp_path, ms), changes.Changes([], dict.fromkeys(("both", "gone"), [])))
    assert refused.value.problem == "include/x.h, an input of gone, is gone (deleted since the build)"
    assert refused.value.fix == (
        "restore it (git checkout -- FILE in the tree), or regenerate it: pixi run -e flashinfer-dev build "
        "(smoke's modules), upstream-tests FAMILY (FlashInfer's tests' modules)"
    )


def test_a_generator_edit_that_changed_no_regenerated_source_is_recorded_as_built(tmp_path, ninja, monkeypatch):
    recorded = []
    monkeypatch.setattr(changes.build_records, "record_generators", lambda *args: recorded.append(args))
    gens = ["/tree/flashinfer/jit/gen.py"]
    kinds = {  # name: (generator edits, generated, in smoke's tier, has recorded tests, unregenerated, edited)
        "smoke": (gens, True, True, False, False, False),
        "plain": (gens, False, False, False, False, False),
        "theirs": (gens, True, False, True, False, False),
        "lost": (gens, True, False, False, False, False),
        "unregenerated": (gens, True, False, True, True, False),
        "edited": (gens, False, True, True, False, True),
        "no_generator_edit": ([], False, True, True, False, False),
    }
    ms = [with_ninja(module(tmp_path, name, generated=kind[1])) for name, kind in kinds.items()]
    ninja.edits = {name: {"csrc/a.cu": "edited"} for name, kind in kinds.items() if kind[5]}
    ch = changes.Changes(gens, {name: kind[0] for name, kind in kinds.items()})
    ch.unregenerated = {name for name, kind in kinds.items() if kind[4]}
    found = found_of(tmp_path / "tree", ms, tier={name: name for name, kind in kinds.items() if kind[2]})
    found.recorded = {name: ["tests/t.py::t"] for name, kind in kinds.items() if kind[3]}
    changes.changed_modules(found, ch)
    assert recorded == [(m.build_dir, tmp_path / "tree") for m in ms if m.name in ("smoke", "plain", "theirs")]


def test_a_changed_file_is_named_in_the_tree_and_a_generated_one_by_the_python_edit(tmp_path):
    tree = tree_with(tmp_path, "flashinfer/jit/gen.py", "flashinfer/norm.py", "include/a.cuh", "include/b.cuh")
    (tmp_path / "site" / "flashinfer").mkdir(parents=True)
    (tmp_path / "site" / "flashinfer" / "data").symlink_to(tree)  # the editable install's link to the tree
    outside = tmp_path / "other" / "x.h"
    ch = changes.Changes([str(tree / "flashinfer/jit/gen.py"), str(tree / "flashinfer/norm.py")], {})
    ch.changed = {
        "norm": {str(tmp_path / "jit/generated/norm/a.cu"): "edited", str(tree / "include/a.cuh"): "edited"},
        "rope": {"(not regenerated)": "edited", str(tmp_path / "site/flashinfer/data/include/b.cuh"): "edited"},
        "gemm": {str(outside): "edited", str(tree / "include/b.cuh"): "edited"},
    }
    changes.files_changed(found_of(tree), ch)
    assert ch.by_file == {
        "gen.py, norm.py -> a.cu": {"norm"},
        "gen.py, norm.py -> (not regenerated)": {"rope"},
        "include/a.cuh": {"norm"},
        "include/b.cuh": {"rope", "gemm"},
        str(outside): {"gemm"},
        "flashinfer/norm.py": set(),
    }, "of the Python edits, the one outside the generators only: the regeneration showed what the other changed"
    assert ch.pending == set()


def test_a_python_edit_that_changed_no_generated_source_is_named_itself(tmp_path):
    tree = tree_with(tmp_path, "flashinfer/jit/gen.py", "flashinfer/norm.py", "include/a.cuh")
    ch = changes.Changes([str(tree / "flashinfer/jit/gen.py"), str(tree / "flashinfer/norm.py")], {})
    ch.changed = {"norm": {str(tree / "include/a.cuh"): "edited"}}
    changes.files_changed(found_of(tree), ch)
    assert ch.by_file == {"include/a.cuh": {"norm"}, "flashinfer/jit/gen.py": set(), "flashinfer/norm.py": set()}
    plain = changes.Changes([], {})
    plain.changed = {"norm": {str(tmp_path / "jit/generated/norm/a.cu"): "edited", "(not regenerated)": "edited"}}
    changes.files_changed(found_of(tree), plain)
    assert plain.by_file == {str(tmp_path / "jit/generated/norm/a.cu"): {"norm"}, "(not regenerated)": {"norm"}}


def jit_dir_with_record(tmp_path, name, record):
    jit_dir = tmp_path / name / "cached_ops"
    jit_dir.mkdir(parents=True)
    (jit_dir.parent / TREE).write_text(record if isinstance(record, str) else json.dumps(record))
    return jit_dir


def test_an_edit_no_built_module_compiles_is_named_unless_reverted_and_any_module_may_compile_it_blind(tmp_path):
    files = ("include/unreached.cuh", "include/reverted.cuh", "include/shown.cuh", "csrc/kept.cu")
    tree = tree_with(tmp_path, *files)
    records = [
        jit_dir_with_record(tmp_path, "jit", dict.fromkeys(files[:3], OLD)),
        jit_dir_with_record(tmp_path, "none", {}),
    ]
    unreadable = f"({changes.UNREADABLE.format(INPUTS)})"
    for blind, expected in (({}, set()), ({"blind": {unreadable: "edited"}}, {"blind"})):
        ch = changes.Changes([], {}, reverted={"include/reverted.cuh", "include/other.cuh"}, uncovered={"csrc/kept.cu"})
        ch.changed = {"norm": {str(tree / "include/shown.cuh"): "edited"}, **blind}
        changes.files_changed(found_of(tree, dirs=records), ch)
        assert ch.pending == {"include/reverted.cuh"}, "a reverted gap a tree record still holds as edited"
        assert ch.by_file == {
            "include/shown.cuh": {"norm"},
            **({unreadable: {"blind"}} if blind else {}),
            "include/unreached.cuh": expected,
            "csrc/kept.cu": expected,
        }


def test_an_unreadable_tree_record_counts_as_an_edit_reaching_every_family(tmp_path, capsys):
    tree = tree_with(tmp_path, "include/a.cuh")
    as_built = {"include/a.cuh": file_fact(tree / "include/a.cuh")}
    dirs = [jit_dir_with_record(tmp_path, "jit", as_built), jit_dir_with_record(tmp_path, "bad", '{"truncated')]
    ch = changes.Changes([], {})
    changes.files_changed(found_of(tree, dirs=dirs), ch)
    assert ch.by_file == {changes.UNTOLD: set()}
    assert capsys.readouterr().out == (
        f"affected: {dirs[1].parent / TREE} cannot be read (truncated, or of another shape): an edit of include/ or "
        "csrc/ that no built module compiles cannot be told, so it counts as reaching every kernel family; the next "
        "build writes it again\n"
    )


def test_the_regeneration_line_counts_each_way_a_module_was_made_again_and_leaves_out_the_ways_none_took():
    assert changes.regenerated_line(2.04, 1, 0, 3, 0) == (
        "affected: regenerated in 2.0 s (1 by smoke's generators, 3 by a dry run of a recorded test)"
    )
    assert changes.regenerated_line(0.31, 0, 2, 0, 1) == (
        "affected: regenerated in 0.3 s (2 by recorded call, 1 of csrc/ files alone, as built)"
    )


class StartedThread:
    """threading.Thread as regenerate uses it, its target run at join(): a thread joined without a start raises
    as threading's does, and one started but not joined has not run when regenerate returns."""

    made: list = []

    def __init__(self, target=None, daemon=None):
        self.target, self.daemon, self.started = target, daemon, False
        StartedThread.made.append(self)

    def start(self):
        self.started = True

    def join(self):
        if not self.started:
            raise RuntimeError("cannot join thread before it is started")
        self.target()


@pytest.fixture
def regeneration(monkeypatch):
    """regenerate's collaborators, each recording what it was asked: flashinfer's import, smoke's generators
    (key -> a JitSpec named `spec of <key>`), the recorded calls (those of `makes` make their module) and the
    dry run (`plan`, None where it did not finish)."""
    from fidev.jit import flashinfer_import
    from fidev.upstream import plan as upstream_plan
    from fidev.upstream import suite as upstream_suite

    asked = SimpleNamespace(imported=[], made=[], called=[], planned=[], makes=set(), plan=object(), raises={})
    StartedThread.made = []
    monkeypatch.setattr(changes, "threading", SimpleNamespace(Thread=StartedThread))  # changes.py's threads only

    def imported(mode):
        asked.imported.append(mode)
        if "import" in asked.raises:
            raise asked.raises["import"]

    def generator(key):
        def make():
            asked.made.append(key)
            return SimpleNamespace(name=f"spec of {key}")

        return SimpleNamespace(make=make)

    def call_again(name, call):
        asked.called.append((name, call))
        return name in asked.makes

    def resolve(nodes, tests):
        if "dry run" in asked.raises:
            raise asked.raises["dry run"]
        return [f"{tests}/{node}" for node in nodes]

    def plan(nodes, pytest_args, tests):
        asked.planned.append((nodes, pytest_args, tests))
        return asked.plan

    monkeypatch.setattr(flashinfer_import, "import_flashinfer", imported)
    monkeypatch.setattr(changes.smoke_modules, "BY_KEY", {"a": generator("a"), "b": generator("b")})
    monkeypatch.setattr(changes.module_choice, "call_again", call_again)
    monkeypatch.setattr(upstream_suite, "tests_dir", lambda: "TESTS")
    monkeypatch.setattr(upstream_suite, "resolve", resolve)
    monkeypatch.setattr(upstream_plan, "plan", plan)
    return asked


def test_regenerate_makes_smokes_modules_and_the_recorded_calls_after_one_import_and_dry_runs_the_rest(regeneration):
    regeneration.makes = {"made"}
    calls = {"made": {"function": "gen_made"}, "other": {"function": "gen_other"}}
    specs, done, missed = changes.regenerate(["a", "b"], calls, ["test_x.py::t[1]"], "aot")
    assert set(specs) == {"spec of a", "spec of b"} and all(specs[name].name == name for name in specs)
    assert (done, missed) == (True, {"other"}), "a recorded call that made another module missed its own"
    assert regeneration.imported == ["aot"] and regeneration.made == ["a", "b"]
    assert regeneration.called == [("made", calls["made"]), ("other", calls["other"])]
    assert regeneration.planned == [(["TESTS/test_x.py::t[1]"], [], "TESTS")], "the recorded cases, dry run alone"
    assert [thread.daemon for thread in StartedThread.made] == [True], (
        "the import runs in a daemon thread: a Ctrl-C while a hung import holds it ends the process"
    )


def test_regenerate_starts_the_import_for_smokes_modules_alone_or_for_recorded_calls_alone(regeneration):
    regeneration.makes = {"made"}
    assert changes.regenerate(["a"], {}, [], "jit")[1:] == (True, set()), "no dry run asked for: nothing dropped"
    assert regeneration.made == ["a"]
    assert changes.regenerate([], {"made": {}}, [], "jit")[1:] == (True, set())
    assert regeneration.called == [("made", {})] and regeneration.imported == ["jit", "jit"]
    assert changes.regenerate([], {}, [], "jit") == ({}, True, set())
    assert regeneration.imported == ["jit", "jit"], "nothing to make: flashinfer is not imported"


def test_a_dry_run_that_did_not_finish_regenerated_nothing_for_sure(regeneration):
    regeneration.plan = None
    assert changes.regenerate([], {}, ["test_x.py"], "jit") == ({}, False, set())


def test_the_imports_failure_is_raised_before_the_dry_runs(regeneration):
    regeneration.raises = {"dry run": changes.Failure("the dry run failed", "fix it")}
    with pytest.raises(changes.Failure, match="the dry run failed"):
        changes.regenerate([], {}, ["test_x.py"], "jit")
    regeneration.raises["import"] = changes.Failure("flashinfer failed to import", "fix it")
    with pytest.raises(changes.Failure, match="flashinfer failed to import"):
        changes.regenerate(["a"], {}, ["test_x.py"], "jit")
    assert regeneration.made == [], "nothing is made once the import failed"


@pytest.fixture
def regenerating(tmp_path, monkeypatch):
    """regenerate_edits with its modules' generators edited (gen.py): `smoke` and `smoke_csrc` (of csrc/ files
    alone) of smoke's tier, `csrc` (csrc/ files alone), `called` (its build recorded the generator's call),
    `dried` (a recorded test only), `lost` (no test recorded) and `unedited`. The regeneration (`done`, `missed`),
    its 2.5 s, each module's recorded call and FlashInfer's tests started early are stand-ins recording what
    they are given."""
    kinds = {  # name: (generated, smoke's key, recorded tests, recorded call)
        "smoke": (True, "key_smoke", ["tests/s/test_s.py::s"], None),
        "smoke_csrc": (False, "key_smoke_csrc", [], None),
        "csrc": (False, None, ["tests/c/test_c.py::c"], None),
        "called": (True, None, ["tests/a/test_x.py::t[2]", "tests/a/test_x.py::t[1]"], {"function": "gen_called"}),
        "dried": (True, None, ["tests/b/test_y.py::u[2]", "tests/b/test_y.py::u[1]", "tests/b/test_z.py::v"], None),
        "lost": (True, None, [], None),
        "unedited": (True, "key_unedited", ["tests/u/test_u.py::u"], None),
    }
    modules = [SimpleNamespace(name=name, generated=kind[0], build_dir=tmp_path / name) for name, kind in kinds.items()]
    found = SimpleNamespace(
        modules=modules,
        tier={name: kind[1] for name, kind in kinds.items() if kind[1]},
        recorded={name: kind[2] for name, kind in kinds.items() if kind[2]},
        ws=SimpleNamespace(file_times=tmp_path / "file times.json"),
        mode="jit",
    )
    calls = {str(tmp_path / name): kind[3] for name, kind in kinds.items()}
    asked = SimpleNamespace(found=found, regenerated=[], early=[], done=True, missed=set())

    def regenerate(tier, calls, upstream_nodes, mode):
        asked.regenerated.append((tier, calls, upstream_nodes, mode))
        return {"spec": "made"}, asked.done, asked.missed

    def early(*args, **kwargs):
        asked.early.append((args, kwargs))
        return "started early"

    monkeypatch.setattr(changes, "regenerate", regenerate)
    monkeypatch.setattr(changes, "FlashInferTests", early)
    monkeypatch.setattr(changes.build_records, "recorded_call", lambda build_dir: calls[str(build_dir)])
    monkeypatch.setattr(changes, "time", SimpleNamespace(perf_counter=itertools.cycle([10.0, 12.5]).__next__))
    asked.changes = lambda: changes.Changes(
        [str(tmp_path / "tree/flashinfer/jit/gen.py")],
        {name: [] if name == "unedited" else [str(tmp_path / "tree/flashinfer/jit/gen.py")] for name in kinds},
    )
    return asked


def test_a_generator_edit_regenerates_each_module_its_own_way_after_starting_the_tests_of_those_it_may_change(
    regenerating, capsys
):
    ch = regenerating.changes()
    changes.regenerate_edits(regenerating.found, ch, False, stop_after=3)
    assert regenerating.regenerated == [
        (["key_smoke", "key_smoke_csrc"], {"called": {"function": "gen_called"}}, ["tests/b/test_y.py::u[1]"], "jit")
    ], "smoke's by their generators, a recorded call, and one recorded case of each of the rest"
    assert regenerating.early == [
        (
            (
                ["tests/a/test_x.py::t", "tests/b/test_y.py::u", "tests/b/test_z.py::v", "tests/s/test_s.py::s"],
                {"tests/s/test_s.py": 1, "tests/a/test_x.py": 2, "tests/b/test_y.py": 2, "tests/b/test_z.py": 1},
                regenerating.found.ws.file_times,
            ),
            {"deferred": True, "sample": ["called", "dried", "smoke"], "stop_after": 3},
        )
    ], "the tests of the generated modules the edit may change, sampled unless asked otherwise"
    assert ch.early == "started early" and ch.specs == {"spec": "made"}
    assert (ch.lost, ch.unregenerated) == (["lost"], set())
    assert capsys.readouterr().out == (
        "affected: gen.py changed: regenerating the sources of 4 module(s), compiling nothing; no test is recorded "
        "for lost, so it cannot be regenerated here\n"
        "affected: regenerated in 2.5 s (2 by smoke's generators, 1 by recorded call, 1 by a dry run of a recorded "
        "test, 1 of csrc/ files alone, as built)\n"
    )


def test_a_listing_starts_no_tests_and_a_whole_family_run_asks_for_no_sample(regenerating):
    changes.regenerate_edits(regenerating.found, regenerating.changes(), True)
    assert regenerating.early == []
    changes.regenerate_edits(regenerating.found, regenerating.changes(), False, sampled=False)
    assert regenerating.early[0][1]["sample"] is None


def test_a_regeneration_that_loses_no_module_says_only_how_many_it_regenerates(regenerating, capsys):
    regenerating.found.modules = [m for m in regenerating.found.modules if m.name != "lost"]
    changes.regenerate_edits(regenerating.found, regenerating.changes(), True)
    assert capsys.readouterr().out.splitlines()[0] == (
        "affected: gen.py changed: regenerating the sources of 4 module(s), compiling nothing"
    )


@pytest.mark.parametrize(
    ("done", "missed", "unregenerated", "why"),
    [
        (False, set(), {"dried"}, "the dry run did not finish"),
        (True, {"called"}, {"called"}, "its recorded call made no such module"),
        (False, {"called"}, {"called", "dried"}, "the dry run did not finish; its recorded call made no such module"),
    ],
)
def test_a_module_the_regeneration_did_not_make_again_is_said_and_left_to_its_tests(
    regenerating, capsys, done, missed, unregenerated, why
):
    regenerating.done, regenerating.missed = done, missed
    ch = regenerating.changes()
    changes.regenerate_edits(regenerating.found, ch, False)
    assert ch.unregenerated == unregenerated
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"affected: {', '.join(sorted(unregenerated))} could not be regenerated here ({why}), so it may hold the edit: "
        "its tests run, and regenerate it"
    )


def test_each_input_resolved_names_the_modules_compiling_it_once_each(tmp_path, monkeypatch):
    tree = tree_with(tmp_path, "include/a.cuh", "include/b.cuh")
    (tmp_path / "link").symlink_to(tree)
    inputs = {  # norm names a.cuh by the link and by the tree both
        "norm": {str(tmp_path / "link/include/a.cuh"), str(tree / "include/a.cuh"), str(tree / "include/b.cuh")},
        "rope": {str(tmp_path / "link/include/a.cuh")},
    }

    def recorded_inputs(build_dir, ninja_path):
        assert ninja_path == build_dir / "build.ninja"
        return inputs[build_dir.name]

    monkeypatch.setattr(changes.ninja_inputs, "inputs", recorded_inputs)
    modules = [
        SimpleNamespace(name=name, build_dir=tmp_path / name, ninja_path=tmp_path / name / "build.ninja")
        for name in inputs
    ]
    assert changes.compilers(found_of(tree, modules)) == {
        str(tree.resolve() / "include/a.cuh"): ["norm", "rope"],
        str(tree.resolve() / "include/b.cuh"): ["norm"],
    }


def test_find_hands_each_rule_the_changes_so_far_and_owns_each_changed_module_by_what_it_compiles(
    tmp_path, monkeypatch
):
    """find's order of the rules above, the Python edits of every module's generators regenerated first; the
    compilers asked for once; each changed module's families (families.owners) of its own inputs only."""
    tree = tmp_path / "tree"
    modules = [SimpleNamespace(name=name, build_dir=tmp_path / name) for name in ("norm", "rope", "gemm")]
    found, kept = found_of(tree, modules), kept_of(tmp_path, judged={"include/a.cuh": OLD})
    edits = {"norm": ["gen.py", "norm.py"], "rope": None, "gemm": ["gen.py"]}
    steps = []

    def step(name):
        def ran(*args):
            steps.append((name, args))
            if name == "changed_modules":
                args[1].changed = {"norm": {"a.cuh": "edited"}, "gemm": {"b.cuh": "edited"}}
            if name in ("uncovered_edits", "since_judged"):
                assert args[3]() == {"a.cuh": ["norm", "rope"], "b.cuh": ["gemm"], "c.cuh": ["rope"]}

        return ran

    rules = (
        "regenerate_edits",
        "changed_modules",
        "uncovered_edits",
        "standing_failures",
        "files_changed",
        "since_judged",
    )
    for name in rules:
        monkeypatch.setattr(changes, name, step(name))
    monkeypatch.setattr(changes, "before_edits", lambda found_: {"before": found_ is found})
    monkeypatch.setattr(changes.build_records, "changed_generators", lambda d, t: edits[d.name] if t == tree else None)
    monkeypatch.setattr(changes.build_records, "tree_snapshot", lambda t, judged: {"now of": (t, judged)})

    def compilers(found_):
        steps.append(("compilers", (found_,)))
        return {"a.cuh": ["norm", "rope"], "b.cuh": ["gemm"], "c.cuh": ["rope"]}

    monkeypatch.setattr(changes, "compilers", compilers)
    monkeypatch.setattr(changes.families, "owners", lambda t, inputs: {"owners of": (t, inputs)})
    ch = changes.find(found, True, kept, stop_after=4)
    assert (ch.python_edits, ch.generators) == (["gen.py", "norm.py"], {**edits, "rope": []})
    assert ch.now == {"now of": (tree, {"include/a.cuh": OLD})} and ch.before == {"before": True}
    assert [(name, args[:2]) for name, args in steps] == [
        ("regenerate_edits", (found, ch)),
        ("changed_modules", (found, ch)),
        ("uncovered_edits", (found, ch)),
        ("compilers", (found,)),
        ("standing_failures", (found, ch)),
        ("files_changed", (found, ch)),
        ("since_judged", (found, ch)),
    ]
    assert steps[0][1][2:] == (True, True, 4), "listing, sampled unless asked otherwise, and stop_after"
    assert steps[2][1][2] is kept and steps[4][1][2] is kept and steps[6][1][2] is kept
    assert ch.owners == {"owners of": (tree, {"norm": {"a.cuh"}, "gemm": {"b.cuh"}})}
