"""The GPU suites' plumbing, on the CPU: smoke and abi-smoke import FlashInfer with the user's own
JIT dir (so they load what `build` compiled), while the CPU suite keeps what it starts out of HOME;
and they make import-check's proof in their own process (the chain does not run import-check).

The stand-in `flashinfer` computes its JIT dir the way FlashInfer 0.6.3 does, once, at import
(flashinfer/jit/env.py at v0.6.3: FLASHINFER_BASE_DIR, FLASHINFER_WORKSPACE_BASE else HOME; FLASHINFER_JIT_DIR,
`<base>/.cache/flashinfer/<version>/<arch>/cached_ops`), and records it. The stand-in `torch`
says a GPU is there, which is all the `gpu` fixture asks of it."""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

from fidev.core.manifest import ROOT, pins
from script_runs import acceptance_digest, acceptance_run, require, two_line_failure

FAKE_TORCH = """\
__version__ = "2.8.0+fake"
float16, bfloat16, float32 = "float16", "bfloat16", "float32"
class version:
    cuda = "12.9"
class cuda:
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def get_device_capability():
        return (9, 0)
"""
FAKE_FLASHINFER_ENV = """\
import json, os, pathlib
# flashinfer/jit/env.py at v0.6.3: FLASHINFER_BASE_DIR, FLASHINFER_WORKSPACE_DIR, FLASHINFER_JIT_DIR (version \
and arch folders as there)
FLASHINFER_BASE_DIR = pathlib.Path(os.getenv("FLASHINFER_WORKSPACE_BASE", pathlib.Path.home().as_posix()))
FLASHINFER_WORKSPACE_DIR = FLASHINFER_BASE_DIR / ".cache" / "flashinfer" / "{version}" / "90"
FLASHINFER_JIT_DIR = FLASHINFER_WORKSPACE_DIR / "cached_ops"
FLASHINFER_AOT_DIR = pathlib.Path(__file__).resolve().parents[1] / "data" / "aot"
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"jit_dir": str(FLASHINFER_JIT_DIR)}) + "\\n")
"""
# flashinfer/jit/core.py at v0.6.3, what the suites touch: the registry gen_jit_spec registers each spec
# with, JitSpec's is_aot property (fidev.jit.module_choice patches both) and JitSpec.build(self,
# verbose, need_lock=True), which the fi fixture wraps; no module is built here.
FAKE_JIT_CORE = """\
class JitSpecRegistry:
    def register(self, spec):
        pass
jit_spec_registry = JitSpecRegistry()
class JitSpec:
    is_aot = property(lambda self: False)
    def build(self, verbose, need_lock=True):
        pass
def build_jit_specs(specs, verbose=False, skip_prebuilt=True):
    pass
"""
PROBE = """\
import os, json
def test_probe(fi):
    with open(os.environ["FAKE_RECORD"], "a") as f:  # what a CPU test started after it would inherit
        f.write(json.dumps({"later_base": os.environ.get("FLASHINFER_WORKSPACE_BASE")}) + "\\n")
        from flashinfer.jit import core  # what a module a test compiles goes through
        f.write(json.dumps({"recording": getattr(core.JitSpec.build, "fidev_recording", False)}) + "\\n")
"""


@pytest.fixture
def ws(tmp_path):
    """A workspace copy whose smoke and abi-smoke suites hold one probe test using `fi`, a stand-in
    torch and flashinfer, and a HOME of its own."""
    root = tmp_path / "ws"
    shutil.copytree(ROOT / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    for suite in ("smoke", "abi_smoke"):
        (root / "tests" / suite).mkdir(parents=True)
        shutil.copy(ROOT / "tests" / suite / "conftest.py", root / "tests" / suite)
        (root / "tests" / suite / "test_probe.py").write_text(PROBE)
    shutil.copy(ROOT / "tests" / "conftest.py", root / "tests")
    (root / "tests" / "support").mkdir()
    for support in (
        "gpu_checks.py",
        "checkout.py",
        "home_guard.py",
    ):  # what the suites and tests/conftest.py import of tests/support
        shutil.copy(ROOT / "tests" / "support" / support, root / "tests" / "support")
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch/__init__.py").write_text(FAKE_TORCH)
    tree = root / pins().source_dir.relative_to(ROOT)  # the stand-in lives where the editable install points
    fake_flashinfer(tree)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("FIDEV_TEST_SCRATCH", "FLASHINFER_WORKSPACE_BASE")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), str(tree)]), HOME=str(home), FAKE_RECORD=str(tmp_path / "record.jsonl")
    )
    return root, env, tmp_path / "record.jsonl", home


def fake_flashinfer(tree):
    (tree / "flashinfer/jit").mkdir(parents=True)
    (tree / "flashinfer/__init__.py").write_text(
        f"__version__ = {pins().flashinfer!r}\nfrom flashinfer.jit import env as _env\n"
    )
    (tree / "flashinfer/jit/__init__.py").write_text("")
    (tree / "flashinfer/jit/env.py").write_text(FAKE_FLASHINFER_ENV.replace("{version}", pins().flashinfer))
    (tree / "flashinfer/jit/core.py").write_text(FAKE_JIT_CORE)


def seen(record):
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return [line["jit_dir"] for line in lines if "jit_dir" in line], [
        line["later_base"] for line in lines if "later_base" in line
    ]


@pytest.mark.parametrize("script", ["smoke.py", "abi_smoke.py"])
@pytest.mark.parametrize("users_base", [None, "custom"])
def test_the_gpu_suites_use_the_users_jit_dir(ws, script, users_base):
    root, env, record, home = ws
    if users_base:
        env["FLASHINFER_WORKSPACE_BASE"] = users_base = str(home.parent / users_base)
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / script), "-k", "probe"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jit_dirs, later = seen(record)
    assert jit_dirs == [f"{users_base or home}/.cache/flashinfer/{pins().flashinfer}/90/cached_ops"], (
        "the GPU suite compiled into another JIT dir than build's"
    )
    # what the suite starts afterwards is back in the scratch folder (and the guard did not fire on the JIT dir)
    assert later and later[0] != users_base and "fidev-tests-" in later[0]
    # a module a test compiles is recorded, as build's are: affected sees its inputs' later edit or cp -p restore
    assert [json.loads(line)["recording"] for line in record.read_text().splitlines() if "recording" in line] == [True]


def test_the_cpu_suite_keeps_what_it_starts_out_of_home(ws):
    root, env, record, home = ws
    (root / "tests" / "test_cpu.py").write_text(
        "import subprocess, sys\n"
        "def test_starts_flashinfer():\n"
        "    subprocess.run([sys.executable, '-c', 'import flashinfer'], check=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_cpu.py"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jit_dirs, _ = seen(record)
    assert len(jit_dirs) == 1 and "fidev-tests-" in jit_dirs[0] and not jit_dirs[0].startswith(str(home))


@pytest.mark.parametrize("script", ["smoke.py", "abi_smoke.py"])
def test_an_expression_pytest_cannot_read_is_bad_usage(ws, script):
    # Found once the session runs, not while pytest parses its options (the fault table's `usage`
    # row): the same two lines and status 2, and pytest's own ERROR line is not printed besides.
    root, env, record, _ = ws
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / script), "-m", "gpu and ("],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    two_line_failure(done, "pytest refused the arguments: Wrong expression passed to '-m'", status=2)
    assert "ERROR:" not in done.stdout + done.stderr and not record.exists(), done.stdout + done.stderr


@pytest.mark.parametrize("script", ["smoke.py", "abi_smoke.py"])
def test_the_gpu_suites_prove_flashinfer_is_the_vendored_tree(ws, tmp_path, script):
    root, env, record, _ = ws
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / script), "-k", "probe"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert (
        done.returncode == 0 and "import-check (in this process)" in done.stdout and "kernel source" in done.stdout
    ), done.stdout
    elsewhere = tmp_path / "elsewhere"
    fake_flashinfer(elsewhere)  # another flashinfer first on the path: what import-check refuses
    env["PYTHONPATH"] = os.pathsep.join([str(elsewhere), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / script), "-k", "probe"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1 and "import-check: flashinfer was imported from" in done.stdout + done.stderr, (
        done.stdout + done.stderr
    )


def test_each_modules_tests_are_what_pytest_collects_and_every_test_is_some_modules():
    """fidev.builds.smoke_modules names, per module, the smoke and abi-smoke tests `affected` runs for it: a
    function, or one case of a function whose other cases load another module. Each must be a node
    id pytest collects (a stale name would run nothing), and every collected test must be some
    module's (or an edit of its module would not run it), and one module's only."""
    require(
        "torch", why="collecting tests/abi_smoke needs torch (flashinfer-dev)"
    )  # skips in default, fails in CI's dev venv without it
    from fidev.builds import smoke_modules

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/smoke",
            "tests/abi_smoke",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    collected = {line.strip() for line in done.stdout.splitlines() if "::" in line}
    assert collected, done.stdout + done.stderr

    def covers(selector: str, node: str) -> bool:
        return node == selector or ("[" not in selector and node.startswith(selector + "["))

    named = {f"tests/{t}" for m in smoke_modules.MODULES for t in m.tests}
    assert [s for s in named if not any(covers(s, n) for n in collected)] == []
    # one module each: a function named whole by two modules would run the other's cases, which may
    # need a module not built (an edit of norm ran gdn_prefill's signature case on the H100)
    owners = {
        n: [m.key for m in smoke_modules.MODULES if any(covers(f"tests/{t}", n) for t in m.tests)] for n in collected
    }
    assert {n: keys for n, keys in owners.items() if len(keys) != 1} == {}


def test_the_acceptance_run_starts_no_step_past_its_time_limit(tmp_path):
    """A GPU host that limits each command to 10 minutes ends a command at its limit, mid-step (the
    H100's third part lost affected-source that way): with --time-limit a part stops before a step
    that would not end in time, says which steps are left, and exits 3. Every step has a time to go
    by (--list-steps), and no time is kept for a step that is not one."""
    listed = subprocess.run(
        [sys.executable, str(ROOT / "tools/gpu_acceptance.py"), "--list-steps"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    steps = json.loads(listed.stdout)
    assert [s["name"] for s in steps["steps"] if s["seconds"] is None] == [] and steps["times_of_no_step"] == [], steps
    assert {"affected-header", "bench-2-gpus"} <= {s["name"] for s in steps["steps"]}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools/gpu_acceptance.py"),
            "--work",
            str(tmp_path / "work"),
            "--time-limit",
            "25",
            "--steps",
            "build-cold,smoke",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "not started, past --time-limit 25 s: --steps build-cold,smoke", (
        done.stdout
    )
    assert not (tmp_path / "work/ws").exists(), "it set up a workspace for steps it did not start"


def test_the_benchmark_and_the_acceptance_run_time_the_same_families():
    """tools/bench_upstream.py's default selection is fidev.upstream.bench's, which the acceptance
    run's bench-warm-up builds (read from the tool's source, not imported: no test imports a tool)."""
    tree = ast.parse((ROOT / "tools/bench_upstream.py").read_text())
    default = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DEFAULT" for t in node.targets)
    )
    assert ast.unparse(default) == "list(upstream_bench.FAMILIES)", ast.unparse(default)


def test_a_resumed_acceptance_run_leaves_out_the_steps_it_has_results_for(tmp_path):
    """Every part after the first is one command, `--resume`: a step WORK has a result for (pass or
    FAIL) is not run again, the others are, in order, and the table shows the earlier results."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "results.json").write_text(
        json.dumps({"build-cold": {"result": "pass", "seconds": 104.4, "note": "exit 0; 21 objects compiled"}})
    )
    (work / "checkout.sha256").write_text(acceptance_digest())  # of this checkout: its results are read
    done = acceptance_run(work, "--time-limit", "25", "--resume", "--steps", "build-cold,smoke,bench-1-gpu")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "build-cold  pass    104.4 s  exit 0; 21 objects compiled" in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1] == "not started, past --time-limit 25 s: --steps smoke,bench-1-gpu", (
        done.stdout
    )


def test_each_smoke_module_names_a_kernel_family_whose_sources_are_its():
    """affected runs a smoke module's tests when an edit reaches its family (fidev.tree.families):
    each names one, and that family's sources are what the module compiles (by its name's stem)."""
    from fidev.builds import smoke_modules
    from fidev.tree import families as upstream_suites

    families = {fam.name: fam for fam in upstream_suites.FAMILIES}
    assert {m.key: m.family for m in smoke_modules.MODULES if m.family not in families} == {}
    stems = {
        "norm": "norm",
        "silu": "activation",
        "sampling": "sampling",
        "single_decode": "single_decode",
        "single_prefill_fa2": "single_prefill",
        "single_prefill_fa3": "single_prefill_sm90",
        "gdn_prefill": "gdn_prefill",
        "batch_prefill_fa2": "batch_prefill",
        "batch_prefill_fa3": "batch_prefill_sm90",
        "batch_decode": "batch_decode",
        "page": "page",
        "cascade": "cascade",
        "topk": "topk",
    }
    assert set(stems) == set(smoke_modules.BY_KEY)
    wrong = {
        m.key: m.family
        for m in smoke_modules.MODULES
        if not any(stems[m.key] in source for source in families[m.family].sources)
    }
    assert wrong == {}


@pytest.mark.parametrize(
    "status, torch_loaded, teardown",
    [(130, True, False), (130, False, True), (0, True, True), (1, True, True)],
    ids=["interrupted with torch", "interrupted without torch", "passed", "failed"],
)
def test_a_suite_interrupted_after_torch_loaded_ends_without_the_interpreters_teardown(
    monkeypatch, status, torch_loaded, teardown
):
    """Ctrl-C during a CUDA call may leave torch in a state its teardown crashes on (smoke_noise ended in
    "Fatal Python error: Segmentation fault" on a GPU host): a suite interrupted once torch is loaded ends through
    exit_now, every other end through sys.exit, the interpreter's whole teardown."""
    from fidev.smoke import gpu_suite

    ended = []

    def exit_now(code):
        ended.append(("exit_now", code))
        raise SystemExit(code)

    monkeypatch.setattr(gpu_suite, "run_main", lambda main: status)
    monkeypatch.setattr(gpu_suite, "exit_now", exit_now)
    if torch_loaded:
        monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    else:
        monkeypatch.delitem(sys.modules, "torch", raising=False)
    with pytest.raises(SystemExit) as ended_with:
        gpu_suite.exit_task(lambda: status)
    assert ended_with.value.code == status
    assert ended == ([] if teardown else [("exit_now", status)])
