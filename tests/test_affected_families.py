"""`affected` runs FlashInfer's tests of every kernel family an edit reaches, not only those of the
modules already built: an edit of a header that only a family no module was built for compiles (a
RoPE header, the rope family) runs that family's sample, which builds what it loads, and fails
where it fails; a rerun fails again; without the family's tests in the tree it is not covered (3).

The tree is tests/support/upstream_standin.py's stand-in of FlashInfer's suite at v0.6.3, with
a csrc/rope.cu that includes the header, as FlashInfer's does include/flashinfer/pos_enc.cuh."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from fidev.affected import coverage, report, selection
from fidev.core.manifest import pins
from fidev.tree import release_reference
from script_runs import require
from upstream_standin import needs_a_build, standin_ws, upstream  # noqa: F401 (standin_ws: the fixture `ws`)

TREE = "extern/tracked/flashinfer"
HEADER = "include/flashinfer/pos_enc.cuh"
# The stand-in of FlashInfer's rope tests: 4 * 2 = 8 cases; each builds the rope module (which records
# the tree as it was built from: the edited one), and fails where the header has the planted bug.
ROPE = """\
import json, os, pathlib, pytest
import flashinfer
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("batch", [1, 19, 99, 989])
def test_rope(batch, dtype):
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps(["test_rope", batch, dtype]) + "\\n")
    flashinfer.load("rope", 1)
    header = pathlib.Path(__file__).parents[2] / "include/flashinfer/pos_enc.cuh"
    assert "1.01f" not in header.read_text(), "rotary frequency off by 1%"
"""
NORM = """\
import flashinfer
def test_norm():
    assert flashinfer.load("norm", 3) == "jit"
"""


def affected(root, env, *args):
    done = subprocess.run(
        [sys.executable, str(root / "scripts/affected.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    return done, done.stdout + done.stderr


def seen(env) -> list[list]:
    path = Path(env["SEEN"])
    cases = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    path.unlink(missing_ok=True)
    return cases


def rope_tree(ws, tmp_path, rope_tests: str):
    """The stand-in workspace with a header only csrc/rope.cu includes, `rope_tests` as the rope
    family's tests, and norm built (which records the tree as built)."""
    require(
        "filelock", why="modules build under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)"
    )
    root, _, env = ws
    env = {**env, "SEEN": str(tmp_path / "seen.jsonl")}
    tree = root / TREE
    (tree / "include/flashinfer").mkdir(parents=True)
    (tree / HEADER).write_text("inline float rope_freq(float x) { return x; }\n")
    (tree / "csrc").mkdir(exist_ok=True)
    (tree / "csrc/rope.cu").write_text('#include "flashinfer/pos_enc.cuh"\n')
    (tree / "tests/attention/test_rope.py").write_text(rope_tests)
    (tree / "tests/utils/test_norm.py").write_text(NORM)
    release_reference.record_release(tree)  # the pinned release, with these files in it
    done = upstream(root, env, "norm", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    return root, env, tree


@needs_a_build
def test_an_edit_only_an_unbuilt_family_compiles_runs_that_familys_sample(ws, tmp_path):
    root, env, tree = rope_tree(ws, tmp_path, ROPE)
    saved = tmp_path / "pos_enc.cuh"
    shutil.copy2(tree / HEADER, saved)

    (tree / HEADER).write_text("inline float rope_freq(float x) { return x * 1.01f; }\n")
    # what runs of the family reached: a sample of its cases, every case with --whole-family
    for args, which in (([], "a sample"), (["--whole-family"], "every case")):
        done, out = affected(root, env, "--list", *args)
        assert done.returncode == 0 and "the edit reaches rope, whose modules" in out, out
        assert f"their FlashInfer tests ({which}) and smoke's tests of them run too" in out, out
    for attempt in (
        "edit",
        "rerun",
        "rerun again",
    ):  # the failed run's rope build recorded the edited tree: kept all the same
        done, out = affected(root, env)
        assert done.returncode == 1, f"{attempt}: {out}"
        assert "the edit reaches rope" in out and "tests/attention/test_rope.py::test_rope[" in out, out
        assert (attempt == "edit") != ("the tests of rope it reaches failed at" in out), out
        # rope, the family nearest the edit, has its cases' modules built first by its plan (a plan past its time
        # limit on a loaded host is dropped: nothing builds ahead); the rerun finds rope built
        planned = "the plan's dry run took over" not in out
        assert (attempt == "edit" and planned) == (
            "those of tests/attention/test_rope.py's cases first: rope" in out
        ), out
        ran = seen(env)
        assert 0 < len(ran) < 8, (attempt, ran)  # a sample, stopped at its first failures
    shutil.copy2(saved, tree / HEADER)  # cp -p: the old bytes and mtime
    done, out = affected(root, env)
    assert done.returncode == 0, out

    # the family's tests absent (a tree from the source fetch has none): not a pass, and said
    (tree / "tests/attention/test_rope.py").unlink()
    (tree / HEADER).write_text("inline float rope_freq(float x) { return x * 1.01f; }\n")
    done, out = affected(root, env)
    assert done.returncode == 3 and "reaches rope, whose FlashInfer tests did not run here" in out, out
    assert seen(env) == []


def test_a_generator_edit_reaches_its_family_and_a_family_recorded_for_a_changed_module_is_not_run_twice(tmp_path):
    """flashinfer/jit/activation.py generates the activation modules' sources: an edit of it reaches
    the activation family, whose tests run; where a changed module's recorded tests are that
    family's, they are the run, not the family's sample besides."""
    tree = tmp_path / "flashinfer"
    for rel in (
        "flashinfer/jit/activation.py",
        "tests/utils/test_activation.py",
        "csrc/norm.cu",
        "tests/utils/test_norm.py",
    ):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("")
    # a generator's edit shows in by_file as the generated sources it changed
    edit = {"activation.py -> silu_and_mul.cu": {"silu_and_mul"}, "csrc/norm.cu": {"norm"}}
    generators = [str(tree / "flashinfer/jit/activation.py")]
    recorded = {"norm": ["tests/utils/test_norm.py::test_norm[1-fp16]"]}
    sel = selection.selection(edit, {"silu_and_mul": {}, "norm": {}}, {}, recorded, tree, generators)
    assert sel.families == {"activation": ("utils/test_activation.py",)}
    assert sel.theirs == ["tests/utils/test_activation.py", "tests/utils/test_norm.py::test_norm"]
    assert coverage.coverage_gaps(sel, sel.theirs) == {}
    assert sel.file_tests("activation.py -> silu_and_mul.cu", {"silu_and_mul"}) >= {
        "tests/utils/test_activation.py"
    }  # its row's result
    (tree / "tests/utils/test_activation.py").unlink()  # not in the tree: a gap, not a run
    sel = selection.selection(edit, {"silu_and_mul": {}, "norm": {}}, {}, recorded, tree, generators)
    assert sel.families == {} and coverage.coverage_gaps(sel, sel.theirs) == {
        "flashinfer/jit/activation.py": ["activation"]
    }


def written(tree: Path, files: dict[str, str]) -> Path:
    """`tree` with each of `files` ({path relative to it: its text}) written."""
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return tree


def test_the_test_files_of_the_family_nearest_an_edit_are_the_first_whose_modules_build(tmp_path):
    """An edit several families compile: cascade's own source includes attention/cascade.cuh (csrc/cascade.cu,
    as at v0.6.3), batch prefill's through attention/prefill.cuh; cascade's test file is the first whose
    cases' modules the plan builds ahead (upstream-tests --first-files). With a family's own source edited
    too, both edits' nearest families' files are; a family whose tests do not run is passed over."""
    tree = written(
        tmp_path / "flashinfer",
        {
            "include/flashinfer/attention/cascade.cuh": "",
            "include/flashinfer/attention/prefill.cuh": '#include "cascade.cuh"\n',
            "csrc/cascade.cu": '#include "flashinfer/attention/cascade.cuh"\n',
            "csrc/batch_prefill.cu": '#include "flashinfer/attention/prefill.cuh"\n',
            "csrc/rope.cu": "",
            "tests/attention/test_shared_prefix_kernels.py": "",
            "tests/attention/test_batch_prefill_kernels.py": "",
            "tests/attention/test_non_contiguous_prefill.py": "",
            "tests/attention/test_rope.py": "",
        },
    )
    header = "include/flashinfer/attention/cascade.cuh"
    sel = selection.selection({header: set()}, {}, {}, {}, tree, [])
    assert sel.steps == {header: {"prefill": 2, "cascade": 1}}
    assert set(sel.families) == {"prefill", "cascade"}
    assert sel.first_files == ["tests/attention/test_shared_prefix_kernels.py"]
    sel = selection.selection({header: set(), "csrc/rope.cu": set()}, {}, {}, {}, tree, [])
    assert sel.first_files == ["tests/attention/test_rope.py", "tests/attention/test_shared_prefix_kernels.py"]
    (tree / "tests/attention/test_shared_prefix_kernels.py").unlink()  # cascade's tests not in the tree: not run
    sel = selection.selection({header: set()}, {}, {}, {}, tree, [])
    assert set(sel.families) == {"prefill"}
    assert sel.first_files == [
        "tests/attention/test_batch_prefill_kernels.py",
        "tests/attention/test_non_contiguous_prefill.py",
    ]


def test_a_wrapper_is_its_familys_nearest_file_and_a_modules_own_include_dirs_count_a_step(tmp_path):
    """family_steps: a Python file that holds a family's API is 0 steps from it (its tests call it), as a
    family's own source is; include_steps follows a module's extra include dirs (csrc/nv_internal's
    headers, found only there), a step each."""
    from fidev.tree import families

    tree = written(
        tmp_path / "flashinfer",
        {
            "flashinfer/cascade.py": "",
            "csrc/cascade.cu": '#include "flashinfer/attention/cascade.cuh"\n',
            "include/flashinfer/attention/cascade.cuh": '#include "own.h"\n',
            "csrc/nv_internal/own.h": "",
        },
    )
    steps = families.family_steps(tree, ["flashinfer/cascade.py", "include/flashinfer/attention/cascade.cuh"])
    assert steps == {
        "flashinfer/cascade.py": {"cascade": 0},
        "include/flashinfer/attention/cascade.cuh": {"cascade": 1},
    }
    assert families.nearest(steps) == ["cascade"]
    found = families.include_steps([tree / "csrc/cascade.cu"], tree, [tree / "csrc/nv_internal"])
    assert found[(tree / "csrc/nv_internal/own.h").resolve()] == 2
    assert (tree / "csrc/nv_internal/own.h").resolve() not in families.include_steps([tree / "csrc/cascade.cu"], tree)


def test_a_reached_family_runs_smokes_tests_of_it_too(tmp_path):
    """FlashInfer's page test appends and checks nothing (tests/attention/test_page.py at v0.6.3):
    an edit of csrc/page.cu runs smoke's exact check of append_paged_kv_cache (wide tier) too,
    which builds the page module where no build did."""
    tree = tmp_path / "flashinfer"
    for rel in ("csrc/page.cu", "tests/attention/test_page.py"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("")
    sel = selection.selection({"csrc/page.cu": set()}, {}, {}, {}, tree, [])
    assert sel.families == {"page": ("attention/test_page.py",)}
    assert sel.ours == ["smoke/test_wide.py::test_append_paged_kv_cache"]
    assert sel.file_tests("csrc/page.cu", set()) == {
        "tests/attention/test_page.py",
        "tests/smoke/test_wide.py::test_append_paged_kv_cache",
    }


def test_a_kept_edit_of_a_generator_ends_when_the_generator_is_reverted(tmp_path):
    """A generator's content before the edit comes from the modules' generators record (the tree's
    record holds include/ and csrc/ only): reverting it ends a kept gap, as reverting a header does."""
    import json as json_

    from fidev.affected import verdicts
    from fidev.core.files import file_fact
    from fidev.core.workspace import GENERATORS
    from fidev.records import build_records

    tree = tmp_path / "flashinfer"
    generator = tree / "flashinfer/jit/activation.py"
    generator.parent.mkdir(parents=True)
    generator.write_text("silu = 'val / (1 + exp(-val))'\n")
    build_dir = tmp_path / "cached_ops/silu_and_mul"
    build_dir.mkdir(parents=True)
    (build_dir / GENERATORS).write_text(json_.dumps({str(generator): file_fact(generator)}))
    before = build_records.generators_before(build_dir, tree)
    assert list(before) == ["flashinfer/jit/activation.py"]
    saved = tmp_path / "activation.py"
    shutil.copy2(generator, saved)
    generator.write_text("silu = '1.02 * val / (1 + exp(-val))'\n")
    kept = verdicts.Kept(tmp_path / "verdicts.json")
    kept.keep_gaps({"flashinfer/jit/activation.py": ["activation"]}, before, set())
    gap = kept.gaps["flashinfer/jit/activation.py"]
    assert not gap.reverted(generator)
    shutil.copy2(saved, generator)  # cp -p
    assert gap.reverted(generator)


@needs_a_build
def test_a_reached_family_whose_every_case_skips_here_is_not_covered(ws, tmp_path):
    """Selected is not covered: where every case of the family skips on this host (an architecture
    it lacks), the edit went untested, whatever passed beside it."""
    skipping = (
        "import pytest\n@pytest.mark.parametrize('n', [1, 2])\ndef test_rope(n):\n"
        "    pytest.skip('not supported here')\n"
    )
    root, env, tree = rope_tree(ws, tmp_path, skipping)
    (tree / HEADER).write_text("inline float rope_freq(float x) { return x * 1.01f; }\n")
    done, out = affected(root, env)
    assert done.returncode == 3 and "reaches rope, whose FlashInfer tests did not run here" in out, out
    rows = [line for line in out.splitlines() if line.startswith(HEADER)]
    assert rows and all(row.endswith("  not covered") for row in rows), f"a row read passed: {out}"


@needs_a_build
def test_a_kept_not_covered_verdict_runs_its_tests_again_when_asked_again(ws, tmp_path):
    """A module-only edit (norm's generated source) whose recorded test now loads the module and then
    skips here: not covered (3), and that verdict is kept; asking again with nothing changed since runs
    it again and is not covered again, never "nothing changed" on a verdict that was no pass."""
    root, env, tree = rope_tree(ws, tmp_path, ROPE)
    skipping = NORM.replace(
        'assert flashinfer.load("norm", 3) == "jit"', 'flashinfer.load("norm", 3)\n    skip("here")'
    )
    assert skipping != NORM
    (tree / "tests/utils/test_norm.py").write_text("from pytest import skip\n" + skipping)
    (generated,) = Path(env["FLASHINFER_WORKSPACE_BASE"]).glob(".cache/flashinfer/*/*/generated/norm/s0.cpp")
    generated.write_text("int f0() { return 7; }\n")
    for attempt in ("the edit", "asked again", "asked once more"):
        done, out = affected(root, env)
        assert done.returncode == 3 and "nothing changed" not in out, f"{attempt}: {out}"
        assert "tests/utils/test_norm.py::test_norm" in out, f"{attempt}: {out}"
        assert not [line for line in out.splitlines() if line.endswith("  passed")], f"{attempt}: a row read passed"
        assert (attempt == "the edit") != ("(the last run not covered at" in out), f"{attempt}: {out}"


@needs_a_build
def test_a_run_stopped_in_a_reached_familys_tests_runs_them_again(ws, tmp_path):
    """The family's tests built their module from the edited tree, which its build recorded: a run
    stopped in them (SIGTERM, as a closed terminal or a CI's timeout sends) leaves the edit kept as
    unfinished, so asking again runs them again instead of finding nothing changed."""
    from script_runs import wait_until

    loaded = '    flashinfer.load("rope", 1)\n'
    waiting = ROPE.replace(
        loaded, loaded + "    while os.path.exists(os.environ['HOLD']):\n        import time; time.sleep(0.05)\n"
    )
    assert waiting != ROPE
    root, env, tree = rope_tree(ws, tmp_path, waiting)
    hold = tmp_path / "hold"
    hold.write_text("")
    env = {**env, "HOLD": str(hold)}
    (tree / HEADER).write_text("inline float rope_freq(float x) { return x * 1.01f; }\n")
    proc = subprocess.Popen(
        [sys.executable, str(root / "scripts/affected.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
    )
    try:
        wait_until(lambda: Path(env["SEEN"]).is_file(), 120, "the rope tests started", proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        hold.unlink()
    assert proc.returncode == 130, out
    seen(env)
    done, out = affected(root, env)
    assert done.returncode == 1 and "the tests of rope it reaches did not finish at" in out, out
    assert seen(env), "the rope tests did not run again"


def test_a_changed_module_no_test_of_which_ran_to_a_result_is_untested(tmp_path):
    """Selected is not run: a module of FlashInfer's tests whose recorded file's cases all skipped
    (or were never collected) is untested, and so is a module a generator edit may have changed with
    no test to regenerate it by, unless a reached family's tests ran: not a pass (3)."""
    tree = tmp_path / "flashinfer"
    tree.mkdir()
    recorded = {
        "rope_a": ["tests/attention/test_rope.py::test_rope[1]"],
        "topk_b": ["tests/utils/test_topk.py::test_top_k[1]"],
    }
    sel = selection.selection(
        {"(generated)": {"rope_a", "topk_b"}}, {"rope_a": {}, "topk_b": {}}, {}, recorded, tree, []
    )
    ran = ["tests/utils/test_topk.py::test_top_k"]  # test_rope.py: every case skipped
    assert coverage.modules_untested(sel, ran, []) == ["rope_a"]
    assert coverage.modules_untested(sel, [*ran, "tests/attention/test_rope.py::test_rope"], ["gen_only"]) == [
        "gen_only"
    ]
    sel.families = {"activation": ("utils/test_activation.py",)}
    assert coverage.modules_untested(sel, [*ran, "tests/attention/test_rope.py::test_rope"], ["gen_only"]) == []


@needs_a_build
def test_an_edit_a_build_recorded_before_affected_judged_it_runs_its_familys_tests(ws, tmp_path):
    """The rope bug, then a build that records the tree with it (as `build`, `smoke` and
    upstream-tests do, fidev.builds.module_builds.record_build): no build record shows the edit.
    affected's first verdict tells it against the pinned release; reverted, it passes; edited and
    built again, rope's tests run and fail again, never "nothing changed"."""
    from fidev.builds import module_builds

    root, env, tree = rope_tree(ws, tmp_path, ROPE)
    (build_dir,) = [
        p.parent for p in Path(env["FLASHINFER_WORKSPACE_BASE"]).glob(".cache/flashinfer/*/*/cached_ops/*/build.ninja")
    ]
    saved = tmp_path / "pos_enc.cuh"
    shutil.copy2(tree / HEADER, saved)

    def edit_then_build() -> None:
        (tree / HEADER).write_text("inline float rope_freq(float x) { return x * 1.01f; }\n")
        module_builds.record_build(build_dir, build_dir / "build.ninja", tree=tree)

    edit_then_build()  # before any verdict of affected
    done, out = affected(root, env)
    assert done.returncode == 1 and "nothing changed" not in out, out
    assert (
        "include/flashinfer/pos_enc.cuh changed from the pinned release (it has given no verdict here yet), "
        "and a build recorded the edit since" in out
    ), out
    assert "tests/attention/test_rope.py::test_rope[" in out and seen(env), out
    shutil.copy2(saved, tree / HEADER)  # cp -p: reverted, and passing
    done, out = affected(root, env)
    assert done.returncode == 0, out
    seen(env)
    edit_then_build()  # after a passing verdict
    done, out = affected(root, env)
    assert done.returncode == 1 and "nothing changed" not in out and seen(env), out


def test_a_module_built_from_a_familys_sources_is_tested_by_a_run_of_that_familys_tests(tmp_path):
    """The rope module a run of rope's tests built (with no plan, so no record of which test needs
    it) compiles csrc/rope.cu, one of the family's sources: once rope's tests run to a result it is
    tested, so reverting the edit passes; a module that compiles only the header is no family's,
    and a run of norm's tests tests neither."""
    from fidev.tree import families

    tree = tmp_path / "flashinfer"
    for rel in ("csrc/rope.cu", "csrc/norm.cu", HEADER):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("")
    header = str((tree / HEADER).resolve())
    owners = families.owners(tree, {"rope": {str((tree / "csrc/rope.cu").resolve()), header}, "other": {header}})
    assert owners == {"rope": ["rope"]}
    sel = selection.Selection({HEADER: {"rope", "other"}}, {"rope": {}, "other": {}}, {}, {})
    assert coverage.modules_untested(sel, ["tests/attention/test_rope.py::test_rope"], [], owners) == ["other"]
    assert coverage.modules_untested(sel, ["tests/utils/test_norm.py::test_norm"], [], owners) == ["other", "rope"]
    # a module with a test recorded is judged by that test alone: another file of its family is no run of it
    recorded = selection.Selection(
        {HEADER: {"rope"}}, {"rope": {}}, {}, {"rope": ["tests/attention/test_rope.py::test_rope_pos_ids[1]"]}
    )
    assert coverage.modules_untested(recorded, ["tests/attention/test_rope.py::test_rope"], [], owners) == []
    assert coverage.modules_untested(recorded, ["tests/utils/test_norm.py::test_norm"], [], owners) == ["rope"]


ROPE_WRAPPER = """\
import pathlib
import flashinfer
def test_rope():
    flashinfer.load("rope", 1)
    wrapper = pathlib.Path(__file__).parents[2] / "flashinfer/rope.py"
    assert "theta * 1.05" not in wrapper.read_text(), "the wrapper passes a wrong rope_theta"
"""


@needs_a_build
def test_a_wrapper_edit_runs_its_familys_tests_and_untold_python_is_not_covered(ws, tmp_path):
    """flashinfer/rope.py holds the rope family's API (families' `api`): an edit of it that changes no
    module's generated sources still runs rope's tests, and fails where they fail, again on a rerun,
    until it is reverted (cp -p), which passes. An edited Python file of the package that holds no
    family's API (flashinfer/utils.py) is not covered (3): which tests execute it cannot be told."""
    root = ws[0]
    package = root / TREE / "flashinfer"
    package.mkdir(parents=True)
    (package / "rope.py").write_text("def apply_rope(x, theta=1e4):\n    return x\n")
    (package / "utils.py").write_text("def helper():\n    return 1\n")
    root, env, tree = rope_tree(ws, tmp_path, ROPE_WRAPPER)
    done = upstream(root, env, "rope", "--yes")  # rope built, and its test recorded
    assert done.returncode == 0, done.stdout + done.stderr
    saved = tmp_path / "rope.py"
    shutil.copy2(package / "rope.py", saved)

    (package / "rope.py").write_text("def apply_rope(x, theta=1e4):\n    theta = theta * 1.05\n    return x\n")
    for attempt in ("edit", "rerun"):
        done, out = affected(root, env)
        assert done.returncode == 1, f"{attempt}: {out}"
        assert (
            "affected: 1 failed (tests/attention/test_rope.py::test_rope)" in out and "no module changed" not in out
        ), out
    shutil.copy2(saved, package / "rope.py")  # cp -p: reverted
    done, out = affected(root, env)
    assert done.returncode == 0 and "every selected test passed" in out, out

    (package / "utils.py").write_text("def helper():\n    return 2\n")
    done, out = affected(root, env)
    assert done.returncode == 3, out
    assert (
        "flashinfer/utils.py holds no kernel family's API" in out and "which tests execute it cannot be told" in out
    ), out
    done, out = affected(root, env)
    assert done.returncode == 3, f"asked again: {out}"


def jit_env_edited(ws, tmp_path):
    """The stand-in workspace built with a flashinfer/jit/env.py, which no module's sources show, then that file
    edited: (root, env, the jit folder, a cp -p copy of env.py as built)."""
    jit = ws[0] / TREE / "flashinfer" / "jit"
    jit.mkdir(parents=True)
    (jit / "env.py").write_text("JIT_DIR_NAME = 'cached_ops'\n")
    root, env, _ = rope_tree(ws, tmp_path, ROPE_WRAPPER)
    saved = tmp_path / "env.py"
    shutil.copy2(jit / "env.py", saved)
    (jit / "env.py").write_text("JIT_DIR_NAME = 'cached_ops_2'\n")
    return root, env, jit, saved


@needs_a_build
def test_a_jit_edit_that_changes_no_generated_source_is_not_covered_until_reverted(ws, tmp_path):
    """A Python file under flashinfer/jit/ counts as a generator, and every module is regenerated after its edit.
    Where no module's sources change (flashinfer/jit/env.py, or a flag in a generator), the edit may still change
    compile flags or how modules are built and loaded: which tests execute it cannot be told, so it is not
    covered (3), not "no module changed" (0), and again when asked again, until it is reverted (cp -p)."""
    root, env, jit, saved = jit_env_edited(ws, tmp_path)
    for attempt in ("edit", "asked again"):
        done, out = affected(root, env)
        assert done.returncode == 3, f"{attempt}: {out}"
        assert "flashinfer/jit/env.py changed no module's generated sources" in out, out
        assert "which tests execute it cannot be told" in out and "no module changed" not in out, out
    shutil.copy2(saved, jit / "env.py")  # cp -p: reverted
    done, out = affected(root, env)
    assert done.returncode == 0, out


@needs_a_build
def test_a_jit_edit_listed_then_reverted_leaves_nothing_changed(ws, tmp_path):
    """`--list` judges nothing and keeps nothing: a flashinfer/jit/ edit listed, then reverted (cp -p), is no
    change, not a Python edit that changed no source (which would be not covered)."""
    root, env, jit, saved = jit_env_edited(ws, tmp_path)
    done, out = affected(root, env, "--list")
    assert done.returncode == 0, out
    shutil.copy2(saved, jit / "env.py")  # cp -p: reverted
    done, out = affected(root, env)
    assert done.returncode == 0, out


def test_an_edit_whose_tests_cannot_be_told_leaves_every_family_a_gap_until_its_tests_ran():
    """An unreadable tree record (UNTOLD) and an edited Python file of the package that is no
    generator and holds no family's API (Selection.untold) may reach any kernel family: each is a
    gap of every family whose FlashInfer tests did not run, beside the families a header reaches."""
    from fidev.tree import families

    every = [fam.name for fam in families.FAMILIES]
    sel = selection.Selection({selection.UNTOLD: set(), "flashinfer/utils.py": set(), HEADER: set()}, {}, {}, {})
    sel.reach = {
        "flashinfer/utils.py": [],
        "flashinfer/jit/norm.py": [],
        "flashinfer/rope.py": ["rope"],
        "include/flashinfer/other.cuh": [],
        HEADER: ["rope"],
    }
    assert sel.untold == ["flashinfer/utils.py"], "a generator, a family's API and a header are told"
    assert coverage.coverage_gaps(sel, []) == {
        selection.UNTOLD: every,
        "flashinfer/rope.py": ["rope"],
        "flashinfer/utils.py": every,
        HEADER: ["rope"],
    }
    ran = ["tests/attention/test_rope.py", "tests/utils/test_norm.py"]
    rest = [fam for fam in every if fam not in ("rope", "norm")]
    assert coverage.coverage_gaps(sel, ran) == {selection.UNTOLD: rest, "flashinfer/utils.py": rest}


def test_a_test_file_two_families_share_covers_both():
    """A family is covered by a case of any of its test files that passed or failed (the files
    FlashInfer's run exercised): test_alibi.py holds both single_decode's and single_prefill's tests."""
    assert selection.families_covered(["tests/attention/test_alibi.py"]) == {"single_decode", "single_prefill"}
    assert selection.families_covered(["tests/attention/test_alibi_x.py", "tests/utils/test_norm.py::test_norm"]) == {
        "norm"
    }


def test_a_function_of_a_file_two_families_share_covers_its_own_family_only():
    """single_prefill's alibi test is no test of single_decode: a decode edit whose recorded tests are
    in test_alibi.py's prefill function still runs single_decode's tests, and stays a gap without them."""
    prefill = "tests/attention/test_alibi.py::test_single_prefill_alibi"
    assert selection.families_covered([prefill]) == {"single_prefill"}
    assert selection.families_covered([f"{prefill}[fp16-128]"]) == {"single_prefill"}
    assert selection.families_covered([prefill + "_other"]) == set()
    assert selection.families_covered(["tests/utils/test_norm.py::test_norm[1-fp16]"]) == {"norm"}
    assert selection.families_covered(["tests/utils"]) == set(), "a folder is no test file"
    sel = selection.Selection({"include/flashinfer/attention/decode.cuh": set()}, {}, {}, {})
    sel.reach = {"include/flashinfer/attention/decode.cuh": ["single_decode"]}
    assert coverage.coverage_gaps(sel, [prefill]) == {"include/flashinfer/attention/decode.cuh": ["single_decode"]}


def test_a_module_with_a_recorded_test_is_untested_when_only_another_file_of_its_family_ran():
    sel = selection.Selection(
        {"csrc/single_prefill.cu": {"p"}}, {"p": {}}, {}, {"p": ["tests/attention/test_single_prefill.py::test_p[1]"]}
    )
    owners = {"p": ["single_prefill"]}
    assert coverage.modules_untested(sel, ["tests/attention/test_alibi.py"], [], owners) == ["p"]
    assert coverage.modules_untested(sel, ["tests/attention/test_single_prefill.py"], [], owners) == []


DECODE_TEST = """\
import os, pytest
import flashinfer
def test_{module}():
    flashinfer.load("{module}", 1)
    if os.environ.get("SKIP_{module}"):
        pytest.skip("needs sm_100")
"""


@needs_a_build
def test_a_changed_module_whose_recorded_test_skipped_is_not_covered_though_another_file_of_its_family_ran(
    ws, tmp_path
):
    """Two modules whose generated sources include csrc/batch_decode.cu (the decode family's source),
    each with its test recorded in a file of its own of that family. An edit of both generated sources;
    dec_a's test loads it and skips here, dec_b's passes: a file of dec_a's family ran, but dec_a has a
    recorded test, and it alone judges dec_a: not a pass (3), naming dec_a, no row read passed."""
    require(
        "filelock", why="modules build under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)"
    )
    root, _, env = ws
    tree = root / TREE
    (tree / "csrc").mkdir(exist_ok=True)
    (tree / "csrc/batch_decode.cu").write_text("inline int batch_decode() { return 1; }\n")
    release_reference.record_release(tree)  # the pinned release, with the source in it
    generated = Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/generated"
    files = {"dec_a": "test_batch_decode_kernels.py", "dec_b": "test_tensor_cores_decode.py"}
    for module, test_file in files.items():
        (generated / module).mkdir(parents=True)  # each module compiles the family's source
        (generated / module / "s0.cpp").write_text(f'#include "{tree / "csrc/batch_decode.cu"}"\n')
        (tree / "tests/attention" / test_file).write_text(DECODE_TEST.format(module=module))
    done = upstream(root, env, "decode", "--yes")  # builds both, and records which test loads which
    assert done.returncode == 0 and "upstream-tests: 3 passed" in done.stdout, done.stdout + done.stderr

    for module in files:  # an edit of both modules' generated sources (no edit of the tree: smoke's tests stay out)
        (generated / module / "s0.cpp").write_text(
            f'#include "{tree / "csrc/batch_decode.cu"}"\nint edited() {{ return 2; }}\n'
        )
    done, out = affected(root, {**env, "SKIP_dec_a": "1"})
    assert done.returncode == 3, out
    assert "affected: no test of dec_a ran here" in out, out
    # the family's other file ran to a result, dec_a's skipped
    assert "tests/attention/test_tensor_cores_decode.py: 1 passed, 0 failed, 0 errors, 0 skipped" in out, out
    assert "tests/attention/test_batch_decode_kernels.py: 0 passed, 0 failed, 0 errors, 1 skipped" in out, out
    assert not [line for line in out.splitlines() if line.endswith("  passed")], f"a row read passed: {out}"


def test_a_module_whose_tests_passed_in_a_run_that_was_not_covered_is_not_covered():
    """Its tests passed, but the run left a reached family untested (NOT_COVERED): the module's
    verdict is `not covered`, no pass; a module with no test is left out, not the end of the list."""
    sel = selection.Selection(
        {"include/x.cuh": {"a_untested", "norm"}},
        {"a_untested": {}, "norm": {}},
        {},
        {"norm": ["tests/utils/test_norm.py::test_norm[1]"]},
    )
    assert {name: r[0] for name, r in coverage.module_results(sel, set(), [], covered=False).items()} == {
        "norm": "not covered"
    }
    assert {name: r[0] for name, r in coverage.module_results(sel, set(), []).items()} == {"norm": "passed"}


def test_the_lines_of_a_run_that_is_not_covered_name_each_gap_and_the_command_that_covers_them(capsys):
    gaps = {"flashinfer/utils.py": ["norm", "rope"], HEADER: ["norm", "rope"]}
    report.not_covered(gaps, ["norm_mod", "rope_mod"], ["flashinfer/utils.py"])
    assert capsys.readouterr().out.splitlines() == [
        "affected: no test of norm_mod, rope_mod ran here (none of smoke's, and none of FlashInfer's recorded "
        "for them ran to a result): not a pass; `upstream-tests FAMILY` of their family runs and records them",
        "affected: flashinfer/utils.py holds no kernel family's API (fidev.tree.families): which tests "
        "execute it cannot be told here",
        f"affected: {HEADER} reaches norm, rope, whose FlashInfer tests did not run here",
        "affected: not a pass: 2 kernel family(ies) the edit reaches went untested; cover them: pixi run -e "
        "flashinfer-dev upstream-tests norm rope",
    ]
    report.not_covered({}, ["norm_mod"])
    assert capsys.readouterr().out.splitlines() == [
        "affected: no test of norm_mod ran here (none of smoke's, and none of FlashInfer's recorded for them "
        "ran to a result): not a pass; `upstream-tests FAMILY` of their family runs and records them"
    ]
    report.not_covered({})
    assert capsys.readouterr().out == ""


def judged(tmp_path, reach=None, changed_modules=None, reverted=(), reached=None, recorded=None):
    """What fidev.affected.verdict's rules are handed: a selection with `reach` ({edited file: the
    families it reaches}), affected's findings (fidev.affected.changes.Changes' fields they read) and
    a kept-verdicts file of its own."""
    from types import SimpleNamespace

    from fidev.affected import verdicts

    sel = selection.Selection({}, dict.fromkeys(changed_modules or [], {}), {}, recorded or {})
    sel.reach, sel.reached = dict(reach or {}), dict(reached or {})
    changed = SimpleNamespace(
        reverted=set(reverted), lost=[], owners={}, before={}, pending=set(), now={"include/x.cuh": [1, 2, "h"]}
    )
    return sel, changed, verdicts.Kept(tmp_path / "verdicts.json")


def test_a_family_is_covered_by_its_tests_of_a_file_where_a_case_passed_or_failed():
    """verdict.ran_to_a_result: of the selected tests, those of a file where a case ran to a result (a
    file whose every case skipped, or that did not run, is no test of its family that ran)."""
    from fidev.affected.verdict import ran_to_a_result

    sel = selection.Selection({}, {"norm": {}}, {}, {"norm": ["tests/utils/test_norm.py::test_norm[1]"]})
    sel.families = {"rope": ("attention/test_rope.py::test_rope",)}
    assert sel.theirs == ["tests/attention/test_rope.py::test_rope", "tests/utils/test_norm.py::test_norm"]
    assert ran_to_a_result(sel, {"tests/utils/test_norm.py"}) == ["tests/utils/test_norm.py::test_norm"]
    assert ran_to_a_result(sel, set()) == []


def test_the_verdict_is_the_tests_unless_a_reached_family_or_a_changed_module_went_untested(tmp_path, capsys):
    """fidev.affected.verdict.covered_or_not: a pass with a reached family whose tests did not run to a
    result, or a changed module none of whose tests did, is not covered (3), the gap kept; a failure
    stays a failure (the family's run kept as failed, to run again) and names what also went untested;
    a reverted edit's gap is none; the UNTOLD gap is no file to keep; without a gap the pass is the
    caller's (no module changed, for edits that reach none)."""
    from fidev.affected.verdict import Verdict, covered_or_not

    sel, changed, kept = judged(tmp_path, reach={"include/x.cuh": ["rope"]})
    assert covered_or_not(Verdict.PASSED, sel, changed, kept, []) is Verdict.NOT_COVERED
    assert kept.gaps["include/x.cuh"].result == "not covered" and kept.gaps["include/x.cuh"].families == ["rope"]
    assert "include/x.cuh reaches rope, whose FlashInfer tests did not run here" in capsys.readouterr().out
    sel, changed, kept = judged(tmp_path, reach={"include/x.cuh": ["rope"]})
    assert (
        covered_or_not(Verdict.PASSED, sel, changed, kept, ["tests/attention/test_rope.py::test_rope"])
        is Verdict.PASSED
    )
    assert kept.gaps == {}
    sel, changed, kept = judged(tmp_path, reach={"include/x.cuh": ["rope"]}, reverted={"include/x.cuh"})
    assert (
        covered_or_not(Verdict.PASSED, sel, changed, kept, [], Verdict.NO_MODULE_CHANGED) is Verdict.NO_MODULE_CHANGED
    )
    sel, changed, kept = judged(
        tmp_path, reach={"include/x.cuh": ["rope"], "include/y.cuh": ["norm"]}, reached={"include/y.cuh": ["norm"]}
    )
    capsys.readouterr()
    assert covered_or_not(Verdict.FAILED, sel, changed, kept, ["tests/utils/test_norm.py"]) is Verdict.FAILED
    assert (kept.gaps["include/x.cuh"].result, kept.gaps["include/y.cuh"].result) == ("not covered", "failed")
    assert capsys.readouterr().out == "affected: also untested: rope (the edit reaches them)\n"
    sel, changed, kept = judged(tmp_path, changed_modules=["rope_mod"])  # a changed module none of whose tests ran
    assert covered_or_not(Verdict.PASSED, sel, changed, kept, []) is Verdict.NOT_COVERED
    assert covered_or_not(Verdict.FAILED, sel, changed, kept, []) is Verdict.FAILED
    sel, changed, kept = judged(tmp_path)
    sel.by_file = {selection.UNTOLD: set()}
    assert (
        covered_or_not(Verdict.PASSED, sel, changed, kept, []) is Verdict.NOT_COVERED
        and selection.UNTOLD not in kept.gaps
    )
    sel, changed, kept = judged(tmp_path, reached={"include/y.cuh": ["norm"]})  # a pass keeps no family's run as failed
    assert covered_or_not(Verdict.PASSED, sel, changed, kept, []) is Verdict.PASSED and kept.gaps == {}


def test_edits_that_reach_no_built_module_are_listed_or_no_module_changed_or_not_covered(tmp_path):
    """fidev.affected.verdict.no_module_changed: --list is `listed` and keeps nothing; otherwise the
    tree is judged (kept with the verdicts) and the edit is `no module changed`, or `not covered` where
    it reaches a family whose tests did not run."""
    from fidev.affected.verdict import Verdict, no_module_changed

    sel, changed, kept = judged(tmp_path)
    assert (
        no_module_changed(True, sel, changed, kept) is Verdict.LISTED and not kept.path.exists() and kept.judged is None
    )
    assert no_module_changed(False, sel, changed, kept) is Verdict.NO_MODULE_CHANGED
    assert kept.judged == changed.now and json.loads(kept.path.read_text())["judged"] == changed.now
    sel, changed, kept = judged(tmp_path, reach={"include/x.cuh": ["rope"]})
    assert no_module_changed(False, sel, changed, kept) is Verdict.NOT_COVERED and "include/x.cuh" in kept.gaps


def test_the_verdict_reads_what_a_generator_edit_lost_and_which_family_owns_a_module(tmp_path, capsys):
    """covered_or_not hands the coverage rule the modules a generator edit may have changed that
    nothing here regenerated (`lost`: untested unless a reached family ran) and the families whose
    sources a module compiles (`owners`: a run of that family tests a module with no test recorded);
    and it says every gap it keeps: the untested modules, a Python file whose callers cannot be told,
    and each family a failed run's edit also reached."""
    from fidev.affected.verdict import Verdict, covered_or_not

    sel, changed, kept = judged(tmp_path)
    changed.lost = ["gen_only"]
    assert covered_or_not(Verdict.PASSED, sel, changed, kept, []) is Verdict.NOT_COVERED
    assert "no test of gen_only ran here" in capsys.readouterr().out
    sel, changed, kept = judged(tmp_path, changed_modules=["rope_mod"])
    changed.owners = {"rope_mod": ["rope"]}
    assert (
        covered_or_not(Verdict.PASSED, sel, changed, kept, ["tests/attention/test_rope.py::test_rope"])
        is Verdict.PASSED
    )
    sel, changed, kept = judged(tmp_path, reach={"flashinfer/utils.py": []})
    capsys.readouterr()
    assert covered_or_not(Verdict.PASSED, sel, changed, kept, []) is Verdict.NOT_COVERED
    assert (
        "flashinfer/utils.py holds no kernel family's API (fidev.tree.families): which tests execute it cannot be told"
        in capsys.readouterr().out
    )
    sel, changed, kept = judged(tmp_path, reach={"include/x.cuh": ["rope", "norm"]})
    assert covered_or_not(Verdict.FAILED, sel, changed, kept, []) is Verdict.FAILED
    assert capsys.readouterr().out == "affected: also untested: norm, rope (the edit reaches them)\n"


def test_an_edit_of_the_cascade_merge_runs_smokes_exact_merge_checks(tmp_path):
    """FlashInfer's merge test checks the kernel against itself (tests/attention/test_shared_prefix_kernels.py's
    test_merge_state_in_place_with_mask at v0.6.3: a mask of ones against no mask), and its shared-prefix cases
    load fa3 prefill modules on sm_90: an edit of attention/cascade.cuh runs smoke's float64 checks of the merge
    (wide tier), whose cascade module is one small build, and builds it where no build did."""
    tree = written(
        tmp_path / "flashinfer",
        {
            "include/flashinfer/attention/cascade.cuh": "",
            "csrc/cascade.cu": '#include "flashinfer/attention/cascade.cuh"\n',
            "tests/attention/test_shared_prefix_kernels.py": "",
        },
    )
    header = "include/flashinfer/attention/cascade.cuh"
    merge = {f"smoke/test_wide.py::test_merge_{name}" for name in ("two", "in_place", "many")}
    sel = selection.selection({header: set()}, {}, {}, {}, tree, [])
    assert set(sel.families) == {"cascade"} and set(sel.ours) == merge
    # a built module of the header, whose recorded tests are the shared-prefix cases: the family is covered by
    # them (its sample does not run), and smoke's merge checks still do, the nearest of all
    shared = "tests/attention/test_shared_prefix_kernels.py::test_batch_attention_with_shared_prefix_paged_kv_cache"
    changed = {"batch_prefill": {header: "changed"}}
    sel = selection.selection({header: {"batch_prefill"}}, changed, {}, {"batch_prefill": [f"{shared}[1]"]}, tree, [])
    assert sel.families == {} and merge <= set(sel.ours)
    # a tree without FlashInfer's tests (the package index's release): no family runs, smoke's checks do
    (tree / "tests/attention/test_shared_prefix_kernels.py").unlink()
    sel = selection.selection({header: set()}, {}, {}, {}, tree, [])
    assert sel.families == {} and set(sel.ours) == merge


def test_the_tree_edits_are_its_include_csrc_and_jit_files_and_the_packages_python():
    """Selection.tree_edits (tree_files): the changed files of the tree's include/, csrc/ and flashinfer/jit/,
    built or not, and the package's Python of the generators; neither an absolute path (a generated source
    outside the tree) nor UNTOLD nor Python outside the package is one."""
    sel = selection.Selection(
        {
            "include/flashinfer/norm.cuh": {"norm"},
            "csrc/page.cu": set(),
            "flashinfer/jit/activation.py": set(),
            "/jit/cache/silu.cu": {"silu_and_mul"},
            selection.UNTOLD: set(),
        },
        {},
        {},
        {},
        generators=["flashinfer/rope.py", "scripts/x.py"],
    )
    assert sel.tree_edits() == [
        "csrc/page.cu",
        "flashinfer/jit/activation.py",
        "flashinfer/rope.py",
        "include/flashinfer/norm.cuh",
    ]


def test_a_modules_tests_are_its_recorded_test_functions_not_their_cases():
    """Selection.selectors: the recorded tests of a module, each cut to its function (pytest's failure lines
    name cases of it), with smoke's tests of its tier."""
    sel = selection.Selection(
        {}, {"norm": {}}, {}, {"norm": ["tests/utils/test_norm.py::test_norm[1-fp16]", "tests/utils/test_x.py"]}
    )
    assert sel.selectors(["norm"]) == {"tests/utils/test_norm.py::test_norm", "tests/utils/test_x.py"}
    assert sel.selectors(["rope"]) == set(), "nothing recorded: no tests"


def test_a_generated_sources_tests_are_those_of_the_families_its_generators_reach():
    """Selection.file_tests of a generated source (`generator -> source`): the tests of the reached families of
    each edited generator; a generator that reaches no family adds none."""
    sel = selection.Selection(
        {"activation.py -> silu.cu": set()},
        {},
        {},
        {},
        families={"page": ("attention/test_page.py",)},
        reached={"flashinfer/jit/page.py": ["page"]},
        generators=["flashinfer/jit/activation.py", "flashinfer/jit/page.py"],
    )
    assert sel.file_tests("activation.py -> silu.cu", set()) == {
        "tests/attention/test_page.py",
        "tests/smoke/test_wide.py::test_append_paged_kv_cache",
    }


def test_the_selection_lists_the_edits_no_built_module_compiles_and_keeps_sampled_as_given(tmp_path):
    """selection(): `reaching` is each edited file no module was built from, with the families it reaches
    (affected names those whose tests do not run), never a built one, a path outside the tree or UNTOLD;
    the selection is a sample unless told (--whole-family)."""
    tree = written(
        tmp_path / "flashinfer",
        {
            "csrc/page.cu": "",
            "csrc/rope.cu": "",
            "tests/attention/test_page.py": "",
            "tests/attention/test_rope.py": "",
        },
    )
    by_file = {"csrc/page.cu": set(), "csrc/rope.cu": {"rope"}, "/elsewhere/x.cu": set(), selection.UNTOLD: set()}
    sel = selection.selection(by_file, {"rope": {}}, {}, {}, tree, [])
    assert sel.reaching == {"csrc/page.cu": ["page"]}, "only the unbuilt file of the tree"
    assert sel.sampled is True, "a sample by default"
    assert selection.selection(by_file, {"rope": {}}, {}, {}, tree, [], sampled=False).sampled is False


def test_a_generator_outside_the_tree_is_kept_as_given_and_one_inside_is_made_relative(tmp_path):
    """under(): an edited generator's path is relative to the tree where it lies inside it (resolved), else as
    given, not an error."""
    tree = written(tmp_path / "flashinfer", {"flashinfer/jit/page.py": ""})
    outside = str(written(tmp_path / "other", {"gen.py": ""}) / "gen.py")
    sel = selection.selection({}, {}, {}, {}, tree, [str(tree / "flashinfer/jit/page.py"), outside])
    assert sel.generators == ["flashinfer/jit/page.py", outside]


def test_a_family_whose_nodes_are_test_functions_runs_where_their_files_are_in_the_tree(tmp_path):
    """families_to_run: a family's node `file::function` is in the tree where its file is (single_decode's
    are functions of files other families share)."""
    files = ["attention/test_logits_cap.py", "attention/test_sliding_window.py", "attention/test_alibi.py"]
    tree = written(tmp_path / "flashinfer", {"csrc/single_decode.cu": "", **{f"tests/{f}": "" for f in files}})
    sel = selection.selection({"csrc/single_decode.cu": set()}, {}, {}, {}, tree, [])
    assert set(sel.families) == {"single_decode"}, sel.families
    (tree / "tests" / files[2]).unlink()
    assert selection.selection({"csrc/single_decode.cu": set()}, {}, {}, {}, tree, []).families == {}


def test_a_changed_module_with_smokes_tests_or_a_recorded_test_is_not_unmapped():
    """Selection.unmapped: a changed module is unmapped only where neither smoke's tiers test it nor a test
    is recorded for it."""
    sel = selection.Selection(
        {},
        {"norm": {}, "rope": {}, "other": {}},
        {"norm": "norm"},
        {"rope": ["tests/attention/test_rope.py::test_rope[1]"], "other": []},
    )
    assert sel.unmapped == ["other"], "norm has smoke's tests, rope a recorded one"


def test_the_first_files_of_a_family_of_test_functions_are_the_files_that_hold_them(tmp_path):
    """Selection.first_files: a family whose nodes are `file::function` (single_decode's) has its run tests'
    files first, as a family of whole files does."""
    files = ["attention/test_alibi.py", "attention/test_logits_cap.py", "attention/test_sliding_window.py"]
    tree = written(tmp_path / "flashinfer", {"csrc/single_decode.cu": "", **{f"tests/{f}": "" for f in files}})
    sel = selection.selection({"csrc/single_decode.cu": set()}, {}, {}, {}, tree, [])
    assert sel.first_files == [f"tests/{f}" for f in files]
