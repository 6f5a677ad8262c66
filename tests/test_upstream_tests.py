"""upstream-tests on the CPU: the family table, a tree without FlashInfer's runnable suite, the
kernel source mode applied before flashinfer is imported, the compile plan with its budget, and
that neither the plan nor the run compiles what is already built.

The tree is tests/support/upstream_standin.py's stand-in of FlashInfer's suite and JIT at v0.6.3."""

import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fidev.core import workspace
from fidev.core.failure import Failure, report
from fidev.core.manifest import ROOT, pins
from fidev.records import build_records
from fidev.tree import families as upstream_suites
from fidev.tree import source_tree
from fidev.upstream import plan as upstream_plan
from fidev.upstream import suite
from fidev.upstream import summary as upstream_summary
from script_runs import require, task_module, two_line_failure, wait_until
from upstream_standin import compiles, needs_a_build, standin_ws, upstream  # noqa: F401 (standin_ws: the fixture `ws`)


def test_every_family_names_existing_node_ids(ws):
    root, _, _ = ws
    nodes = suite.resolve(["single_decode", "norm"], root / "extern/tracked/flashinfer/tests")
    assert nodes[0].endswith("tests/attention/test_logits_cap.py::test_single_decode_logits_soft_cap")
    assert nodes[-1].endswith("tests/utils/test_norm.py")
    with pytest.raises(Failure, match="neither a kernel family nor a path"):
        suite.resolve(["nrom"], root / "extern/tracked/flashinfer/tests")


def test_the_list_names_every_family():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/upstream_tests.py"), "--list"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and all(f.name in done.stdout for f in upstream_suites.FAMILIES)
    assert {
        "norm",
        "activation",
        "sampling",
        "single_decode",
        "single_prefill",
        "decode",
        "prefill",
        "page",
        "rope",
        "gdn",
    } <= set(upstream_suites.BY_NAME)


def test_a_source_release_without_the_suite_fails_in_two_lines(ws):
    root, _, env = ws
    tree = root / "extern/tracked/flashinfer"
    shutil.rmtree(tree / "tests")
    (tree / "pytest.ini").unlink()
    (tree / "tests").mkdir()
    (tree / "tests/test_artifacts.py").write_text("")  # what the PyPI release's tests/ holds
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    done = upstream(root, env, "norm")
    two_line_failure(done, "no tests/conftest.py and no pytest.ini (the PyPI source release ships neither")
    assert "pytest.ini" in done.stderr.splitlines()[-1]


def test_a_suite_without_pytest_ini_fails_in_two_lines(ws):
    root, _, env = ws
    (root / "extern/tracked/flashinfer/pytest.ini").unlink()  # tests/ copied over, the root's pytest.ini not
    done = upstream(root, env, "norm", "--no-plan")
    two_line_failure(done, "has no runnable FlashInfer test suite: no pytest.ini")
    assert "Traceback" not in done.stdout + done.stderr


@needs_a_build
@pytest.mark.parametrize("mode, visible", [("vendored", False), ("prebuilt", True)])
def test_the_kernel_source_mode_is_applied_before_flashinfer_is_imported(ws, mode, visible):
    root, record, env = ws
    done = upstream(root, {**env, "FLASHINFER_DEV_KERNEL_SOURCE": mode}, "norm", "--no-plan")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"kernel source {mode}" in done.stdout.splitlines()[0]
    seen = [json.loads(line) for line in record.read_text().splitlines() if "jit_cache_visible" in line]
    assert seen and all(s["jit_cache_visible"] is visible for s in seen)


@needs_a_build
def test_the_plan_reads_flashinfers_report_compiles_nothing_and_holds_the_budget(ws):
    require(
        "filelock",
        why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)",
    )
    root, record, env = ws
    # a host without flashinfer-jit-cache (as the GPU host): test_activation.py's warmup_jit is
    # autouse=not has_flashinfer_jit_cache() (tests/utils/test_activation.py at v0.6.3), so it runs
    shutil.rmtree(Path(env["PYTHONPATH"]) / "flashinfer_jit_cache")
    done = upstream(root, env, "norm", "activation", "--budget", "0")
    two_line_failure(done, "past the 0 min budget")
    # norm from two tests' reports (two JSON lines), silu and gelu from the warmup fixture
    assert "needs 3 module(s); 3 to compile, 5 object(s)" in done.stdout, done.stdout
    assert "  norm  (3 objects)" in done.stdout and "  gelu_and_mul  (1 object)" in done.stdout
    assert compiles(env) == [], "the dry run compiled"
    done = upstream(root, env, "norm", "activation", "--budget", "0", "--yes")
    assert done.returncode == 0 and "upstream-tests: 3 passed" in done.stdout, done.stdout + done.stderr
    # norm and silu_and_mul, which the tests load, build ahead of them, side by side, each the first case's
    # of its file, the one of fewer sources first; the warmup builds gelu_and_mul
    assert (
        "building the 2 module(s) its tests will load and nothing built, side by side, from now: silu_and_mul, "
        "norm" in done.stdout
    ), done.stdout
    assert ": compiling norm" not in done.stdout, "a test compiled a module built ahead of it"
    assert len(compiles(env)) == 5
    assert "combined_build" not in record.read_text(), "the warmup built through FlashInfer's combined ninja"
    # Built: a second plan has nothing to compile (so the budget holds), and the run recompiles nothing.
    done = upstream(root, env, "norm", "activation", "--budget", "0")
    assert done.returncode == 0 and "needs 3 module(s); 0 to compile, 0 object(s)" in done.stdout, (
        done.stdout + done.stderr
    )
    assert len(compiles(env)) == 5, "the plan or the run recompiled a module whose inputs did not change"
    # the warmup finds its modules built without taking the JIT dir's lock, and says nothing
    assert "its warmup_jit fixture asks for" not in done.stdout, done.stdout
    # but a restored older copy of an input (`cp -p`: other content, an mtime not newer than the object) still rebuilds
    source = (
        Path(env["FLASHINFER_WORKSPACE_BASE"])
        / ".cache/flashinfer"
        / pins().flashinfer
        / "90/generated/gelu_and_mul/s0.cpp"
    )
    stat = source.stat()
    source.write_text(source.read_text() + "int restored() { return 1; }\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    done = upstream(root, env, "activation", "--no-plan")
    assert done.returncode == 0 and "building 1 module(s) its warmup_jit fixture asks for" in done.stdout, (
        done.stdout + done.stderr
    )
    assert len(compiles(env)) == 6, "the restored copy was not rebuilt"


def test_a_slow_plan_is_dropped_and_the_run_goes_ahead(ws):
    root, _, env = ws
    tests = root / "extern/tracked/flashinfer/tests"
    (tests / "utils/test_slow.py").write_text(
        "import time\ndef test_slow():\n    time.sleep(float(__import__('os').environ.get('SLOW_S', 0)))\n"
    )
    # PLAN_LIMIT_S lowered to 1 s in a process of its own: the dry run (SLOW_S=5) runs past it
    # the script run as a user runs it (runpy), its library's limit lowered first
    code = (
        "import runpy, sys; sys.path.insert(0, 'scripts'); from fidev.upstream import plan; plan.PLAN_LIMIT_S = 1; "
        "sys.argv[0] = 'scripts/upstream_tests.py'; runpy.run_path('scripts/upstream_tests.py', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "utils/test_slow.py", "--budget", "0"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env, "SLOW_S": "5"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the plan's dry run took over 1 s: going ahead without it" in done.stdout
    assert "upstream-tests: 1 passed" in done.stdout


def test_nothing_named_is_refused(ws):
    root, _, env = ws
    two_line_failure(upstream(root, env), "no family or path was named")


@needs_a_build
def test_a_collection_error_is_counted_and_fails_the_task(ws):
    root, _, env = ws
    tests = root / "extern/tracked/flashinfer/tests"
    (tests / "utils/test_broken.py").write_text(
        "import cutlass  # nvidia-cutlass-dsl, missing\n"
    )  # as 6 files of v0.6.3 do
    done = upstream(
        root,
        env,
        "utils/test_broken.py",
        "utils/test_norm.py::test_norm",
        "--no-plan",
        "--continue-on-collection-errors",
    )
    assert done.returncode != 0, done.stdout + done.stderr
    count = [line for line in done.stdout.splitlines() if line.startswith("upstream-tests: ") and " passed, " in line][
        -1
    ]
    assert ", 1 errors;" in count, count


def test_the_dry_run_takes_a_worker_per_case_asked_for_and_a_worker_per_core_for_files(monkeypatch):
    """affected regenerates FlashInfer's tests' modules by a dry run of one recorded case each: a
    process per case at most (each worker imports torch and flashinfer), while a family's files
    spread over a worker per core."""
    require(
        "xdist", why="the dry run's workers are pytest-xdist's (a flashinfer-dev package)"
    )  # skips in default, fails in CI's dev venv without it
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert upstream_plan.dry_run_workers(["tests/utils/test_norm.py::test_norm[dtype0-4096]"]) == []
    cases = [
        "tests/utils/test_norm.py::test_norm[dtype0-4096]",
        "tests/utils/test_quantization.py::test_packbits[big-128]",
    ]
    assert upstream_plan.dry_run_workers(cases) == ["-n", "2"]
    assert upstream_plan.dry_run_workers(["tests/utils/test_norm.py"]) == [
        "-n",
        str(min(16, upstream_plan.DRY_RUN_WORKERS)),
    ]


@pytest.mark.parametrize("stop", ["Ctrl-C", "the time limit"])
def test_a_dry_run_that_ended_just_as_it_was_stopped_is_no_traceback(monkeypatch, tmp_path, stop):
    """Ctrl-C (or the plan's time limit) just as the dry run ends: its process, reaped, has left no process
    group to kill, which is no error (never ProcessLookupError): Ctrl-C stays Ctrl-C, the limit drops the plan."""
    real_popen = subprocess.Popen

    class EndsAsStopped(real_popen):
        def __init__(self, cmd, **kwargs):
            super().__init__([sys.executable, "-c", "pass"], **kwargs)
            self.calls = 0

        def communicate(self, timeout=None):
            self.calls += 1
            if self.calls > 1:
                return "", None
            super().communicate()  # it ended and is reaped: its process group is gone
            if stop == "Ctrl-C":
                raise KeyboardInterrupt
            raise subprocess.TimeoutExpired(self.args, timeout)

    monkeypatch.setattr(subprocess, "Popen", EndsAsStopped)
    if stop == "Ctrl-C":
        with pytest.raises(KeyboardInterrupt):
            upstream_plan.dry_run(["tests/utils/test_norm.py"], [], tmp_path / "tests", str(tmp_path))
    else:
        assert upstream_plan.dry_run(["tests/utils/test_norm.py"], [], tmp_path / "tests", str(tmp_path)) is None


SLOW_DRY_RUN = """\
import os, pathlib, time
def test_slow():
    pathlib.Path(os.environ["DRY_RUN_MARK"]).touch()
    time.sleep(120)
"""


def test_ctrl_c_during_the_plans_dry_run_is_one_line_and_status_130(ws, tmp_path):
    """Ctrl-C while the plan's dry run runs: its processes are stopped, and upstream-tests ends as every
    script does on Ctrl-C, one line and status 130."""
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_slow.py").write_text(SLOW_DRY_RUN)
    mark = tmp_path / "dry-run-started"
    proc = subprocess.Popen(
        [sys.executable, str(root / "scripts/upstream_tests.py"), "utils/test_slow.py", "--yes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env, "DRY_RUN_MARK": str(mark)},
    )
    wait_until(mark.exists, 120, "the dry run's test", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines() == ["error: interrupted; nothing was left half-written"], err


def test_the_record_names_the_tests_that_ask_for_a_module_not_the_warmups_first(ws):
    """tests/utils/test_activation.py's `warmup_jit` fixture (module scope, at v0.6.3) builds
    every activation module inside whichever test comes first; `affected` must map silu_and_mul to
    the tests that load it, or an edit of it runs the gelu tests. A test the dry run sees again
    replaces what an earlier record said of it."""
    root, _, env = ws
    tests = root / "extern/tracked/flashinfer/tests"
    (tests / "utils/test_activation.py").write_text(
        "import pytest\nimport flashinfer\n@pytest.fixture(autouse=True, scope='module')\ndef warmup_jit():\n"
        "    flashinfer.jit.build_jit_specs([flashinfer.gen('silu_and_mul', 1), "
        "flashinfer.gen('gelu_and_mul', 1)], verbose=False)\n"
        "    yield\ndef test_gelu():\n    flashinfer.load('gelu_and_mul', 1)\ndef test_silu():\n"
        "    flashinfer.load('silu_and_mul', 1)\n"
    )
    record = (
        Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/fidev-module-tests.json"
    )
    record.parent.mkdir(parents=True)
    record.write_text(
        json.dumps({"silu_and_mul": ["tests/utils/test_activation.py::test_gelu"]})
    )  # a warmup's, from before
    done = upstream(root, env, "activation", "--budget", "0")
    assert "needs 2 module(s)" in done.stdout, done.stdout + done.stderr  # the plan still counts what the warmup builds
    assert json.loads(record.read_text()) == {
        "gelu_and_mul": ["tests/utils/test_activation.py::test_gelu"],
        "silu_and_mul": ["tests/utils/test_activation.py::test_silu"],
    }


TWO_MODULES = """\
import pytest
import flashinfer
@pytest.mark.parametrize("variant", ["a", "b"])
def test_prefill(variant):
    flashinfer.get_module("page", 1)
    flashinfer.get_module(f"prefill_{variant}", 2)
def test_prefill_again():
    flashinfer.get_module("page", 1)
    flashinfer.get_module("prefill_a", 2)
"""


def test_the_builds_ahead_start_with_the_modules_of_each_files_first_cases():
    """With many modules ahead and every process waiting on one of them, each file's first case gets its
    modules first, whatever their names; a warmup's asking counts for no case."""
    entries = [
        {"test_name": "tests/a.py::t[1]", "module_name": "z_decode"},
        {"test_name": "tests/a.py::t[1]", "module_name": "cascade", "warmup": True},
        {"test_name": "tests/a.py::t[2]", "module_name": "b_prefill"},
        {"test_name": "tests/b.py::u", "module_name": "y_page"},
        {"test_name": "tests/b.py::v", "module_name": "z_decode"},
        {"test_name": "tests/a.py::t[3]", "module_name": "a_cascade"},
    ]
    assert upstream_plan.first_cases_first([entries]) == {"z_decode": 0, "b_prefill": 1, "y_page": 0, "a_cascade": 2}
    # the dry run's processes each wrote a report: a file's cases split among them each start one
    split = [entries[:2], entries[2:]]
    assert upstream_plan.first_cases_first(split) == {"z_decode": 0, "b_prefill": 0, "y_page": 0, "a_cascade": 1}
    # pytest's order, as the dry run collected it, decides where it names the case
    order = ["tests/a.py::t[3]", "tests/a.py::t[2]", "tests/a.py::t[1]", "tests/b.py::v", "tests/b.py::u"]
    ranked = {"z_decode": 0, "b_prefill": 1, "y_page": 1, "a_cascade": 0}
    assert upstream_plan.first_cases_first(split, order) == ranked == upstream_plan.first_cases_first([entries], order)


def test_the_builds_ahead_start_with_the_modules_of_the_first_files_cases():
    """--first-files (affected: the test files of the family nearest its edit): the modules their cases load
    start first, in their cases' order, whatever the other files' first cases load; then those their warmups
    ask for; then the rest as before."""
    entries = [
        {"test_name": "tests/a.py::t[1]", "module_name": "z_decode"},
        {"test_name": "tests/a.py::t[2]", "module_name": "b_prefill"},
        {"test_name": "tests/b.py::u", "module_name": "y_page"},
        {"test_name": "tests/b.py::v", "module_name": "z_decode"},
        {"test_name": "tests/b.py::w", "module_name": "a_cascade"},
        {"test_name": "tests/c.py::x", "module_name": "c_rope"},
        {"test_name": "tests/c.py::y", "module_name": "d_single"},
    ]
    needed = {"z_decode": ["1", "2"], "b_prefill": ["1"], "y_page": ["1"], "a_cascade": ["1"], "c_rope": ["1"]}
    needed["d_single"] = ["1", "2", "3"]
    assert upstream_plan.ahead_order([entries], [], needed) == [
        "c_rope",
        "y_page",
        "z_decode",
        "b_prefill",
        "d_single",
        "a_cascade",
    ]
    first = frozenset({"tests/b.py"})
    near_first = ["y_page", "z_decode", "a_cascade", "c_rope", "b_prefill", "d_single"]
    assert upstream_plan.ahead_order([entries], [], needed, first) == near_first
    # what a first file's warmup asks for comes next (its cases may load it past where the dry run's stand-ins
    # stopped them), before the other files' cases' modules; another file's warmup moves nothing
    warmups = [
        {"test_name": "tests/b.py::u", "module_name": "d_single", "warmup": True},
        {"test_name": "tests/a.py::t[1]", "module_name": "b_prefill", "warmup": True},
    ]
    assert upstream_plan.ahead_order([entries + warmups], [], needed, first) == [
        "y_page",
        "z_decode",
        "a_cascade",
        "d_single",
        "c_rope",
        "b_prefill",
    ]
    # pytest's order (the dry run's collection) decides the place of a case, among the first files' and the rest
    order = ["tests/a.py::t[2]", "tests/a.py::t[1]", "tests/b.py::w", "tests/b.py::v", "tests/b.py::u"]
    assert upstream_plan.ahead_order([entries], order, needed, first) == [
        "a_cascade",
        "z_decode",
        "y_page",
        "b_prefill",
        "c_rope",
        "d_single",
    ]
    # a first file whose cases load nothing to build, or a file not run: the order as without
    nothing = frozenset({"tests/d.py"})
    assert upstream_plan.ahead_order([entries], [], needed, nothing) == upstream_plan.ahead_order([entries], [], needed)


def test_the_plan_reads_the_order_a_dry_run_process_collected_and_none_of_another_shape(tmp_path):
    assert upstream_plan.collected_order(tmp_path) == []
    (tmp_path / "collected-1.json").write_text('{"tests/a.py::t": 1}')
    (tmp_path / "collected-2.json").write_text("[1, 2")
    assert upstream_plan.collected_order(tmp_path) == []
    (tmp_path / "collected-3.json").write_text('["tests/a.py::t[2]", "tests/a.py::t[1]"]')
    assert upstream_plan.collected_order(tmp_path) == ["tests/a.py::t[2]", "tests/a.py::t[1]"]


@needs_a_build
def test_the_plan_builds_every_module_its_tests_load_ahead_and_maps_only_the_first(ws):
    """A dry run's test gets a stand-in for each module it loads, and goes on to ask for the next:
    every module the tests load is named, and those never built build side by side as the run's
    processes start, each once, none in a test. `affected`'s map takes only the first module each test
    asked for (what came after followed a stand-in's answers); the run's own records add the rest.
    FlashInfer's module getters are functools.cache'd: each test asks for its modules itself."""
    require(
        "filelock",
        why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)",
    )
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_two.py").write_text(TWO_MODULES)
    record = (
        Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/fidev-module-tests.json"
    )
    done = upstream(root, env, "utils/test_two.py", "--budget", "0")
    two_line_failure(done, "past the 0 min budget")
    for module in ("page  (1 object)", "prefill_a  (2 objects)", "prefill_b  (2 objects)"):
        assert f"  {module}" in done.stdout, done.stdout
    cases = ["test_prefill[a]", "test_prefill[b]", "test_prefill_again"]
    assert json.loads(record.read_text()) == {"page": [f"tests/utils/test_two.py::{c}" for c in cases]}
    assert compiles(env) == [], "the dry run compiled"
    done = upstream(root, env, "utils/test_two.py", "--yes")
    assert done.returncode == 0 and "upstream-tests: 3 passed" in done.stdout, done.stdout + done.stderr
    assert (
        "building the 3 module(s) its tests will load and nothing built, side by side, from now: page, prefill_a, "
        "prefill_b" in done.stdout
    ), done.stdout
    assert ": compiling" not in done.stdout, "a test compiled a module built ahead of it"
    assert (
        sorted(line.rsplit("/", 2)[-2] for line in compiles(env)) == ["page"] + ["prefill_a"] * 2 + ["prefill_b"] * 2
    ), compiles(env)
    assert json.loads(record.read_text())["prefill_b"] == ["tests/utils/test_two.py::test_prefill[b]"]


ONE_MODULE = """\
import flashinfer
def test_rope():
    flashinfer.get_module("rope", 3)
"""


@needs_a_build
def test_the_plan_builds_the_modules_of_the_first_files_cases_first(ws):
    """upstream-tests --first-files FILE: the builds ahead start with the modules FILE's cases load (a module
    of three sources, which would otherwise start after the other file's first case's), then the rest."""
    require(
        "filelock",
        why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)",
    )
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_two.py").write_text(TWO_MODULES)
    (root / "extern/tracked/flashinfer/tests/utils/test_one.py").write_text(ONE_MODULE)
    files = ("utils/test_two.py", "utils/test_one.py")
    done = upstream(root, env, *files, "--yes", "--first-files", "tests/utils/test_one.py")
    assert done.returncode == 0 and "upstream-tests: 4 passed" in done.stdout, done.stdout + done.stderr
    said = "building the 4 module(s) its tests will load and nothing built, side by side, from now, those of "
    assert said + "tests/utils/test_one.py's cases first: rope, page, prefill_a, prefill_b" in done.stdout, done.stdout
    # a first file with nothing left to build ahead is not named; a file given as the selection's paths are
    (root / "extern/tracked/flashinfer/tests/utils/test_three.py").write_text(ONE_MODULE.replace("rope", "topk"))
    three = "utils/test_three.py"
    done = upstream(root, env, *files, three, "--yes", "--first-files", "utils/test_one.py, tests/" + three)
    assert done.returncode == 0, done.stdout + done.stderr
    said = "building the 1 module(s) its tests will load and nothing built, side by side, from now, those of "
    assert said + "tests/utils/test_three.py's cases first: topk" in done.stdout, done.stdout


@pytest.mark.parametrize(
    "args, problem",
    [
        (
            ["utils/test_norm.py", "--no-plan", "--first-files", "tests/utils/test_norm.py"],
            "--first-files with --no-plan",
        ),
        (["utils/test_norm.py", "--first-files", "tests/utils/test_activation.py"], "not a test file this run selects"),
        (["utils/test_norm.py", "--first-files", "tests/utils/test_norm.py::test_norm"], "not a test file this run"),
        (["utils/test_norm.py", "--first-files", "utils/test_none.py"], "is neither a kernel family nor a path"),
        (["utils/test_norm.py", "--first-files", "--yes"], "--first-files needs a value"),
    ],
)
def test_first_files_that_are_no_file_of_the_selection_or_without_a_plan_are_two_lines(ws, args, problem):
    """--first-files takes the selection's test files, given as its paths are; anything else is bad usage,
    refused before anything runs: with --no-plan (nothing builds ahead), a file the run does not select, a
    node id, a path to nothing, an option where its value goes."""
    root, _, env = ws
    two_line_failure(upstream(root, env, *args), problem, status=2)


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--gpus=abc"], "--gpus "),
        (["--budget=0x"], "--budget "),
        (["--per-gpu="], "--per-gpu "),
        (["--stop-after=3", "--baseline"], "--stop-after with --baseline"),
        (["--yes=1"], "--yes takes no value"),
        (["--no-plan=", "--list"], "--no-plan takes no value"),
        (["--summary", "--yes=no"], "--summary needs a value"),
    ],
)
def test_our_options_given_as_opt_equals_value_are_read_and_checked_before_anything_runs(args, problem):
    """`--opt=value` is `--opt value` for every option of ours that takes a value, checked as it is before
    the tree is looked for (never handed to pytest after a dry run); a flag given a value is bad usage."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/upstream_tests.py"), "norm", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, problem, status=2)
    assert "dry run" not in done.stdout, done.stdout


def test_a_summary_given_as_opt_equals_value_is_checked_before_the_run(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/upstream_tests.py"), "norm", f"--summary={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, "--summary", status=2)
    assert str(tmp_path) in done.stderr.splitlines()[-2]


def test_split_argv_reads_opt_equals_value_as_ours_and_leaves_pytests_to_it():
    ours, selection, rest = upstream_tests_script().split_argv(
        ["norm", "--budget=3", "-k", "gemma", "--summary=/tmp/s.json", "--junitxml=x.xml", "--stop-after=0"]
    )
    assert ours == {"--budget": "3", "--summary": "/tmp/s.json", "--stop-after": "0"}
    assert selection == ["norm"] and rest == ["-k", "gemma", "--junitxml=x.xml"]


@pytest.mark.parametrize("args", [["--per-gpu", "10000"], ["--per-gpu=65"]], ids=" ".join)
def test_more_processes_a_gpu_than_the_most_are_refused_before_anything_runs(args):
    """--per-gpu N starts N pytest processes a GPU at once: past upstream_runs.MOST_PER_GPU (64) it is bad
    usage, two lines before the plan, never thousands of processes started."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/upstream_tests.py"), "norm", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, "--per-gpu ", status=2)
    assert "from 1 to 64" in done.stderr.splitlines()[-2]
    assert upstream_tests_script().parse(["norm", "--per-gpu", "64"])[0]["--per-gpu"] == 64


def upstream_tests_script():
    return task_module(ROOT / "scripts/upstream_tests.py", "upstream_tests_script")


INNER_CACHE = """\
import flashinfer
def test_a():
    flashinfer.get_inner("page", 1).strip()
    flashinfer.get_module("prefill_a", 2)
def test_b():
    flashinfer.get_inner("page", 1).strip()  # the cache no dry run clears hands test_b test_a's stand-in
    flashinfer.get_module("prefill_b", 2)
"""


@needs_a_build
def test_a_stand_in_a_cache_kept_makes_what_the_test_asks_for_next_foreseen(ws):
    """A cache the dry run cannot clear (an inner functools cache, as prefill.py's
    make_hashable_cache) hands test_b the stand-in test_a got: test_b's next module followed a
    stand-in's answers, so it is foreseen (built ahead, never in affected's map), not its first."""
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_inner.py").write_text(INNER_CACHE)
    record = (
        Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/fidev-module-tests.json"
    )
    # one dry-run process for the file, where pytest-xdist would spread it over a worker per core
    one_process = ["--dist", "loadfile"] if importlib.util.find_spec("xdist") else []
    done = upstream(root, env, "utils/test_inner.py", "--budget", "0", *one_process)
    two_line_failure(done, "past the 0 min budget")
    assert "  prefill_b  (2 objects)" in done.stdout, done.stdout
    assert json.loads(record.read_text()) == {"page": ["tests/utils/test_inner.py::test_a"]}


def test_the_summary_reads_back_what_the_run_printed(ws, tmp_path):
    """upstream-tests writes summary.json (fidev.upstream.summary.write) in its run folder and at
    --summary FILE; fidev.upstream.summary.read returns the counts, ids and status the run printed."""
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/attention/test_rope.py").write_text(
        "import pytest\ndef test_fine():\n    pass\ndef test_bad():\n    assert False\n"
        "def test_sm100():\n    pytest.skip('needs sm_100')\ndef test_oom():\n"
        "    raise RuntimeError('CUDA error: out of memory')\n"
    )
    asked = tmp_path / "asked/summary.json"
    done = upstream(root, env, "rope", "--no-plan", "--summary", str(asked))
    assert done.returncode == 1, done.stdout + done.stderr
    printed = re.search(r"^upstream-tests: (\d+) passed, (\d+) skipped, (\d+) failed, (\d+) errors;", done.stdout, re.M)
    assert printed, done.stdout
    said = upstream_summary.read(asked)
    passed, skipped, failed, errors = map(int, printed.groups())
    assert (
        said.counts
        == {"passed": passed, "skipped": skipped, "failed": failed, "error": errors}
        == {"passed": 1, "skipped": 2, "failed": 1, "error": 0}
    )
    assert said.status == done.returncode and said.kernel_source in done.stdout.splitlines()[0]
    named = sorted(line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR ")))
    assert (
        sorted(said.failing + said.erroring)
        == named
        == ["tests/attention/test_rope.py::test_bad", "tests/attention/test_rope.py::test_oom"]
    )
    assert said.skips == {"not supported here": 1, "out of memory": 1}
    assert [(p.file, p.part, p.ended) for p in said.processes] == [("tests/attention/test_rope.py", [1, 1], "exit 1")]
    run_dir = Path(re.search(r"JUnit XML and logs in (\S+)", done.stdout).group(1))
    assert said.run_dir == str(run_dir) and upstream_summary.read(run_dir / upstream_summary.NAME) == said


@pytest.mark.parametrize(
    "spoil, problem",
    [
        (lambda text: text[: len(text) // 2], "cannot be read"),
        (
            lambda text: text.replace(upstream_summary.SCHEMA, "fidev-upstream-summary/0"),
            "is not upstream-tests' summary of schema",
        ),
    ],
)
def test_a_truncated_summary_or_one_of_another_schema_is_refused_in_two_lines(tmp_path, spoil, problem):
    path = tmp_path / upstream_summary.NAME
    upstream_summary.write(
        upstream_summary.Summary(
            selection=["rope"],
            kernel_source="auto",
            run_dir=str(tmp_path),
            gpus=["0"],
            gpu_name="NVIDIA H100",
            started=1.0,
            ended=2.0,
            status=0,
            counts={"passed": 1, "skipped": 0, "failed": 0, "error": 0},
        ),
        path,
    )
    assert upstream_summary.read(path).counts["passed"] == 1
    path.write_text(spoil(path.read_text()))
    with pytest.raises(Failure) as refused:
        upstream_summary.read(path)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        report(refused.value)
    lines = stderr.getvalue().splitlines()
    assert (
        len(lines) == 2 and lines[0].startswith("error: ") and problem in lines[0] and lines[1].startswith("  fix: ")
    ), lines


STEERED = """\
import os
import pytest
import flashinfer
@pytest.mark.parametrize("pos_encoding_mode", ["NONE", "ALIBI"])
def test_custom_mask(pos_encoding_mode):
    # as tests/attention/test_batch_prefill_kernels.py's test_batch_prefill_with_ragged_kv_cache_custom_mask at
    # v0.6.3: plan() packs the custom mask first (flashinfer.quantization.segment_packbits loads `quantization`),
    # then loads the prefill module; here a loaded module's answer says ALiBi is not supported, so that case skips
    # before it loads its prefill module, where a dry run's stand-in answered otherwise
    quantization = flashinfer.get_module("quantization", 1)
    assert not (os.environ.get("FAKE_BUG") and quantization == "jit"), "a planted bug, where the kernels run"
    if pos_encoding_mode == "ALIBI" and quantization == "jit":
        pytest.skip("ALiBi is not supported here")
    flashinfer.get_module(f"prefill_{pos_encoding_mode}", 1)
"""


def ahead_setup(ws) -> tuple[Path, dict, Path]:
    """The stand-in suite with STEERED, its run's environment, and its JIT dir."""
    require(
        "filelock",
        why="the run builds modules under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)",
    )
    root, _, env = ws
    (root / "extern/tracked/flashinfer/tests/utils/test_steered.py").write_text(STEERED)
    return root, env, Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/cached_ops"


@needs_a_build
def test_a_module_built_ahead_that_no_case_loads_is_removed_at_the_runs_end(ws):
    """Seen on a GPU host: the plan built ahead a module a case asked for after a stand-in's answer
    (foreseen, so never in the record), and the real case skipped before it loaded it. Built, with no
    test recorded, it left every later edit that reaches it `not covered`. The run removes what its
    build ahead made that no case loaded and no record names, in one line; what a case loaded, and what
    the record names, stays."""
    root, env, jit_dir = ahead_setup(ws)
    done = upstream(root, env, "utils/test_steered.py", "--yes")
    assert done.returncode == 0 and "upstream-tests: 1 passed, 1 skipped" in done.stdout, done.stdout + done.stderr
    assert (
        "building the 3 module(s) its tests will load and nothing built, side by side, from now: prefill_NONE, "
        "quantization, prefill_ALIBI" in done.stdout
    ), done.stdout  # the first case's modules first: it asks for prefill_NONE and quantization
    removed = [line for line in done.stdout.splitlines() if "built ahead that no test loaded" in line]
    assert len(removed) == 1 and removed[0].startswith("upstream-tests: 1 module(s)"), done.stdout
    assert removed[0].endswith(": prefill_ALIBI"), removed
    assert not (jit_dir / "prefill_ALIBI").exists()
    for name in ("prefill_NONE", "quantization"):  # a case loaded it; the record names it
        assert (jit_dir / name / f"{name}.so").is_file() and not (jit_dir / name / workspace.AHEAD).exists(), name
    record = build_records.module_tests(jit_dir)
    assert "prefill_ALIBI" not in record and record["prefill_NONE"] == [
        "tests/utils/test_steered.py::test_custom_mask[NONE]"
    ]


@needs_a_build
def test_a_run_stopped_at_its_first_failure_removes_what_it_built_ahead_and_no_case_loaded(ws):
    """The first failure stops the run (--stop-after 1: affected stops it so too): the modules built ahead
    for the cases that never ran go again, and quantization, which the record names, stays."""
    root, env, jit_dir = ahead_setup(ws)
    done = upstream(root, {**env, "FAKE_BUG": "1"}, "utils/test_steered.py", "--yes", "--stop-after", "1")
    assert done.returncode == 1 and "stopped early" in done.stdout, done.stdout + done.stderr
    removed = [line for line in done.stdout.splitlines() if "built ahead that no test loaded" in line]
    assert len(removed) == 1 and removed[0].endswith(": prefill_ALIBI, prefill_NONE"), done.stdout
    assert sorted(p.name for p in jit_dir.iterdir() if p.name != "tmp") == ["quantization"], list(jit_dir.iterdir())
