"""affected's kept verdicts (fidev.affected.verdicts), read and written in the test's process: a module's
fingerprint, a verdict that stands only over the inputs it was given on, the file Kept.record writes and
reads back, a kept gap's content before its edit and when it was said, and the files it refuses."""

import hashlib
import json
import re

import pytest

from fidev.affected import verdicts
from fidev.core.files import file_fact
from fidev.core.workspace import GENERATORS, INPUTS

WHEN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
TEST = "tests/smoke/test_kernels.py::test_rmsnorm"


def built(tmp_path, name="norm", inputs="{}", generators=None):
    """A module's build folder with its content record, and its generators record where given."""
    build_dir = tmp_path / name
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / INPUTS).write_text(inputs)
    if generators is not None:
        (build_dir / GENERATORS).write_text(generators)
    return build_dir


def test_a_modules_fingerprint_is_its_content_record_then_its_generators_record(tmp_path):
    assert verdicts.fingerprint(tmp_path / "never built") is None
    build_dir = built(tmp_path, inputs='{"a.o": {}}')
    assert verdicts.fingerprint(build_dir) == hashlib.sha256(b'{"a.o": {}}').hexdigest()
    (build_dir / GENERATORS).write_text('{"gen.py": null}')
    assert verdicts.fingerprint(build_dir) == hashlib.sha256(b'{"a.o": {}}{"gen.py": null}').hexdigest()


def test_a_verdict_stands_only_over_the_inputs_it_was_given_on(tmp_path):
    path = tmp_path / "fidev-affected.json"
    norm, rope = built(tmp_path, "norm"), built(tmp_path, "rope")
    verdicts.Kept(path).record({"norm": (norm, "failed", [TEST], [TEST]), "rope": (rope, "passed", [], [])})
    kept = verdicts.Kept(path)
    assert kept.standing("norm", norm) == kept.modules["norm"] and kept.modules["norm"].result == "failed"
    assert kept.standing("rope", rope).result == "passed"
    assert kept.standing("gemm", norm) is None, "a module without a verdict has none standing"
    (norm / INPUTS).write_text('{"edited": {}}')
    assert kept.standing("norm", norm) is None, "a verdict given on other inputs stands"
    assert kept.standing("rope", rope) is not None


def test_record_keeps_each_modules_verdict_whole_and_none_of_one_without_a_content_record(tmp_path):
    path = tmp_path / "fidev-affected.json"
    norm, rope = built(tmp_path, "norm", generators="{}"), built(tmp_path, "rope")
    kept = verdicts.Kept(path)
    kept.record({"norm": (norm, "failed", ["t/b", "t/a"], ["t/b", "t/a"]), "rope": (rope, "passed", ["t/c"], [])})
    (rope / INPUTS).unlink()
    kept.record({"rope": (rope, "unfinished", ["t/c"], []), "gemm": (tmp_path / "gemm", "failed", ["t/d"], ["t/d"])})
    data = json.loads(path.read_text())
    assert data["schema"] == verdicts.SCHEMA and set(data["modules"]) == {"norm"}, data
    norm_kept = data["modules"]["norm"]
    assert WHEN.fullmatch(norm_kept.pop("when")), data
    assert norm_kept == {
        "inputs": verdicts.fingerprint(norm),
        "result": "failed",
        "tests": ["t/a", "t/b"],
        "failed": ["t/a", "t/b"],
    }
    again = verdicts.Kept(path)
    assert again.problem is None and again.modules == kept.modules and again.judged is None


def test_the_tree_as_judged_is_kept_beside_the_verdicts_and_read_back(tmp_path):
    path = tmp_path / "fidev-affected.json"
    kept = verdicts.Kept(path)
    kept.judged = {"include/b.cuh": None, "csrc/a.cu": [1, 2, "a0"]}
    kept.record({})
    assert list(json.loads(path.read_text())["judged"]) == ["csrc/a.cu", "include/b.cuh"]
    assert verdicts.Kept(path).judged == kept.judged
    assert verdicts.Kept(path).problem is None


def test_a_gap_of_a_file_the_tree_did_not_have_is_reverted_once_the_file_is_gone_again(tmp_path):
    new = tmp_path / "include/new.cuh"
    new.parent.mkdir()
    new.write_text("x")
    gap = verdicts.Gap(None, ["norm"], "2026-11-28 10:00:00")
    assert not gap.reverted(new)
    new.unlink()
    assert gap.reverted(new)
    old = tmp_path / "include/old.cuh"
    old.write_text("before")
    before = verdicts.Gap(file_fact(old), ["norm"], "2026-11-28 10:00:00")
    old.write_text("edited")
    assert not before.reverted(old)


def test_kept_gaps_say_when_and_keep_each_files_content_before_its_edit(tmp_path):
    """keep_gaps: a file whose families' tests ran in a run that failed keeps its first content
    before the edit, as a not-covered one does, and the result it is kept as."""
    path = tmp_path / "fidev-affected.json"
    kept = verdicts.Kept(path)
    kept.keep_gaps({"include/a.cuh": ["page"]}, {"include/a.cuh": [1, 2, "a0"], "include/b.cuh": [3, 4, "b0"]}, set())
    kept.keep_gaps(
        {}, {"include/a.cuh": [5, 6, "a1"], "include/b.cuh": [3, 4, "b0"]}, set(), ran={"include/a.cuh": ["page"]}
    )
    gap = kept.gaps["include/a.cuh"]
    assert (gap.was, gap.result) == ([1, 2, "a0"], "failed") and WHEN.fullmatch(gap.when), gap
    kept.keep_gaps({}, {"include/b.cuh": [3, 4, "b0"]}, set(), ran={"include/b.cuh": ["rope"]}, ran_result="unfinished")
    gap = kept.gaps["include/b.cuh"]
    assert (gap.was, gap.families, gap.result) == ([3, 4, "b0"], ["rope"], "unfinished") and WHEN.fullmatch(gap.when)


def test_a_gap_kept_without_its_result_is_read_as_not_covered(tmp_path):
    path = tmp_path / "fidev-affected.json"
    gap = {"was": [1, 2, "a0"], "families": ["norm"], "when": "2026-11-28 10:00:00"}
    path.write_text(json.dumps({"schema": verdicts.SCHEMA, "modules": {}, "uncovered": {"include/a.cuh": gap}}))
    kept = verdicts.Kept(path)
    assert kept.problem is None and kept.gaps["include/a.cuh"] == verdicts.Gap(**gap, result="not covered")
    path.write_text(json.dumps({"schema": verdicts.SCHEMA, "modules": {}}))
    kept = verdicts.Kept(path)
    assert (kept.problem, kept.gaps, kept.judged) == (None, {}, None)


@pytest.mark.parametrize(
    "odd",
    [
        {"uncovered": {"include/a.cuh": {"was": 5, "families": ["norm"], "when": "w"}}},
        {"uncovered": {"include/a.cuh": {"was": None, "families": ["norm"], "when": "w", "result": "passed"}}},
        {"judged": {"include/a.cuh": 5}},
        {"judged": {"include/a.cuh": [1, 2, "a0"], "csrc/b.cu": "b0"}},
    ],
)
def test_a_gap_or_a_judged_file_of_another_shape_makes_the_kept_verdicts_unreadable(tmp_path, odd):
    path = tmp_path / "fidev-affected.json"
    path.write_text(json.dumps({"schema": verdicts.SCHEMA, "modules": {}, **odd}))
    kept = verdicts.Kept(path)
    assert kept.problem == (
        f"affected's kept verdicts {path} cannot be read (they are not of the shape {verdicts.SCHEMA} gives them)"
    )
    assert (kept.modules, kept.gaps, kept.judged) == ({}, {}, None)


def test_kept_verdicts_that_cannot_be_read_are_named_so(tmp_path):
    path = tmp_path / "fidev-affected.json"
    path.write_text("[]")
    assert verdicts.Kept(path).problem == (
        f"{path} is not affected's kept verdicts of schema {verdicts.SCHEMA} (it says 'list')"
    )
    path.write_text('{"schema": "fidev-affected-verdicts/1", "modu')
    assert verdicts.Kept(path).problem.startswith(f"affected's kept verdicts {path} cannot be read (")
