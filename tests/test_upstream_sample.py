"""`upstream-tests FAMILY --sample` end to end on the CPU: its processes run only the sample of the
cases they collect (fidev.upstream.sample, through fidev.upstream.plugin), every value of every
parameter among them; it says its coverage line and records it in summary.json; the parts of a long
file share one sample; the plan's dry run is the sample's too, and a module it must exercise gets a
case the record names for it. `affected` runs the sample of an edited module's FlashInfer tests and
says so; --whole-family runs them all.

The tree is tests/support/upstream_standin.py's stand-in of FlashInfer's suite at v0.6.3."""

import json
import os
import subprocess
import sys
from pathlib import Path

from fidev.core import workspace
from fidev.core.manifest import pins
from fidev.upstream import sample as upstream_sample
from fidev.upstream import summary as upstream_summary
from script_runs import require, two_line_failure
from upstream_standin import needs_a_build, standin_ws, upstream  # noqa: F401 (standin_ws: the fixture `ws`)

TESTS = "extern/tracked/flashinfer/tests"
# test_rope: 4 * 3 * 2 = 24 cases, whose values a sample covers in 4; test_pos_ids: objects (keyed by
# their place in the list) and bools, 4 cases in 2; test_plain: one case, once
ROPE = """\
import json, os, pytest
import flashinfer
def seen(*case):
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps(case) + "\\n")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("batch", [1, 19, 99, 989])
def test_rope(batch, head_dim, dtype):
    seen("test_rope", batch, head_dim, dtype)
    if os.environ.get("LOAD"):
        flashinfer.load(f"rope_{dtype}_{head_dim}", 1)
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("obj", [object(), object()])
def test_pos_ids(obj, interleave):
    seen("test_pos_ids", interleave)
def test_plain():
    seen("test_plain")
"""


def standin(ws, tmp_path):
    root, _, env = ws
    (root / TESTS / "attention/test_rope.py").write_text(ROPE)
    return root, {**env, "SEEN": str(tmp_path / "seen.jsonl")}


def seen(env) -> list[list]:
    path = Path(env["SEEN"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def every_value_seen(cases: list[list]) -> bool:
    rope = [c for c in cases if c[0] == "test_rope"]
    return (
        {c[1] for c in rope} == {1, 19, 99, 989}
        and {c[2] for c in rope} == {64, 128, 256}
        and {c[3] for c in rope} == {"fp16", "bf16"}
        and {c[1] for c in cases if c[0] == "test_pos_ids"} == {True, False}
        and ["test_plain"] in cases
    )


def test_a_sampled_run_runs_only_the_sample_and_says_what_it_covers(ws, tmp_path):
    root, env = standin(ws, tmp_path)
    done = upstream(root, env, "rope", "--no-plan", "--sample", "--summary", str(tmp_path / "summary.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    ran = seen(env)
    assert len(ran) == 7 and len({json.dumps(c) for c in ran}) == 7 and every_value_seen(ran), (ran, done.stdout)
    assert "upstream-tests: 7 passed, 0 skipped, 0 failed, 0 errors" in done.stdout, done.stdout
    assert "upstream-tests: rope: 7 of 29 cases, every value of every parameter" in done.stdout, done.stdout
    said = upstream_summary.read(tmp_path / "summary.json")
    assert said.sample["selected"] == 7 and said.sample["total"] == 29 and said.sample["seed"] == upstream_sample.SEED
    assert said.selection == ["rope", "--sample"], "a sample's baseline is not the family's"
    # the same collection, the same sample
    Path(env["SEEN"]).unlink()
    assert upstream(root, env, "rope", "--no-plan", "--sample").returncode == 0
    assert sorted(map(json.dumps, seen(env))) == sorted(map(json.dumps, ran))
    # the whole family stays the default
    Path(env["SEEN"]).unlink()
    done = upstream(root, env, "rope", "--no-plan", "--summary", str(tmp_path / "summary.json"))
    assert done.returncode == 0 and len(seen(env)) == 29 and "every value of every parameter" not in done.stdout, (
        done.stdout
    )
    assert upstream_summary.read(tmp_path / "summary.json").sample is None
    two_line_failure(
        upstream(root, env, "rope", "--sample-seed", "x"), "--sample-seed 'x' is not a whole number", status=2
    )


def test_the_parts_of_a_long_file_share_one_sample(ws, tmp_path):
    root, env = standin(ws, tmp_path)
    times = workspace.Workspace(Path(env["FLASHINFER_WORKSPACE_BASE"]), pins().flashinfer).file_times
    times.parent.mkdir(parents=True)
    times.write_text('{"tests/attention/test_rope.py": 25.0}')  # long: a part per GPU
    done = upstream(root, {**env, "CUDA_VISIBLE_DEVICES": "3,5"}, "rope", "--no-plan", "--sample", "--sample-seed", "7")
    assert done.returncode == 0 and "(part 2 of 2)" in done.stdout, done.stdout + done.stderr
    ran = seen(env)
    assert len(ran) == 7 and len({json.dumps(c) for c in ran}) == 7 and every_value_seen(ran), ran
    assert "upstream-tests: rope: 7 of 29 cases, every value of every parameter" in done.stdout, done.stdout


def test_the_plan_is_the_samples_and_a_required_module_gets_its_case(ws, tmp_path):
    root, env = standin(ws, tmp_path)
    env = {**env, "LOAD": "1"}
    done = upstream(root, env, "rope", "--sample", "--budget", "0")  # the plan's dry run, then the budget stops it
    two_line_failure(done, "past the 0 min budget")
    dry = [c for c in seen(env) if c[0] == "test_rope"]
    assert len(dry) == 4, dry
    # the dry run recorded the modules of the sampled cases alone
    ws_ = workspace.read(pins().flashinfer, {"FLASHINFER_WORKSPACE_BASE": env["FLASHINFER_WORKSPACE_BASE"]})
    record = json.loads((ws_.jit_dirs()[0].parent / workspace.MODULE_TESTS).read_text())
    assert sum(len(cases) for cases in record.values()) == 4 and f"needs {len(record)} module(s)" in done.stdout, (
        done.stdout
    )
    # a module the record names for a case the sample left out: that case joins the sample
    custom = {**record, "rope_custom": ["tests/attention/test_rope.py::test_rope[989-256-bf16]"]}
    (ws_.jit_dirs()[0].parent / workspace.MODULE_TESTS).write_text(json.dumps(custom))
    done = upstream(root, {**env, "LOAD": ""}, "rope", "--no-plan", "--sample", "--sample-modules", "rope_custom")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ["test_rope", 989, 256, "bf16"] in seen(env)[-8:], seen(env)


NORM = """\
import json, os, pytest
import flashinfer
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_norm(n, dtype):
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps(["test_norm", n, dtype]) + "\\n")
    assert flashinfer.load("norm", 3) == "jit"
"""


@needs_a_build
def test_affected_runs_the_sample_of_an_edited_modules_tests_and_the_whole_family_on_request(ws, tmp_path):
    require(
        "filelock", why="modules build under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)"
    )
    root, env = standin(ws, tmp_path)
    (root / TESTS / "utils/test_norm.py").write_text(NORM)
    done = upstream(root, env, "norm", "--yes")  # its plan records which case needs norm; its run builds norm
    assert done.returncode == 0 and len(seen(env)) == 16, done.stdout + done.stderr  # the dry run's 8, the run's 8
    generated = (
        Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/generated/norm/s0.cpp"
    )
    for body, flags, cases in (
        ("int f0() { return 7; }\n", [], 4),
        ("int f0() { return 8; }\n", ["--whole-family"], 8),
    ):
        Path(env["SEEN"]).unlink()
        generated.write_text(body)
        done = subprocess.run(
            [sys.executable, str(root / "scripts/affected.py"), *flags],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **env},
        )
        assert done.returncode == 0 and "affected: every selected test passed" in done.stdout, done.stdout + done.stderr
        ran = seen(env)
        assert len(ran) == cases and {c[1] for c in ran} == {1, 2, 3, 4} and {c[2] for c in ran} == {"fp16", "bf16"}, (
            ran,
            done.stdout,
        )
        sampled = (
            "affected: FlashInfer's tests: 4 of 8 cases, every value of every parameter (a sample; --whole-family "
            "runs every case)"
        )
        assert (sampled in done.stdout) == (not flags), done.stdout


def test_the_sample_is_of_what_pytests_own_options_leave(ws, tmp_path):
    """-k (or -m) deselects first: the sample then covers every value among the cases left, and the
    coverage line counts those, not the file's."""
    root, env = standin(ws, tmp_path)
    done = upstream(root, env, "rope", "--no-plan", "--sample", "-k", "fp16")
    assert done.returncode == 0, done.stdout + done.stderr
    ran = seen(env)
    assert (
        {c[3] for c in ran} == {"fp16"}
        and {c[1] for c in ran} == {1, 19, 99, 989}
        and {c[2] for c in ran} == {64, 128, 256}
    ), ran
    assert f"upstream-tests: rope -k fp16: {len(ran)} of 12 cases, every value of every parameter" in done.stdout, (
        done.stdout
    )
