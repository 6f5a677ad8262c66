"""tools/bench_chain.py on the CPU: it runs the chain the manifest declares, in its order, with
this interpreter for `python`, stops where pixi would (or times past a failure with --keep-going),
and tables each step and the chain."""

import os
import shutil
import subprocess
import sys

from fidev.core.manifest import ROOT, task_chain

STEP = "import sys, time; time.sleep(0.05); sys.exit({code})\n"


def workspace(tmp_path, failing=None):
    """A workspace copy whose chain's scripts are stand-ins that sleep briefly and exit 0 (or 1)."""
    root = tmp_path / "ws"
    for d in ("scripts", "tools"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    for name, command in task_chain("smoke"):
        (root / command.split()[1]).write_text(STEP.format(code=int(name == failing)))
    return root


def bench(root, *args):
    env = {k: v for k, v in os.environ.items() if k != "PATH"} | {"PATH": "/usr/bin:/bin"}  # no pixi on PATH
    return subprocess.run([sys.executable, str(root / "tools/bench_chain.py"), *args], capture_output=True, text=True, timeout=120, env=env)


def test_the_chain_is_timed_in_the_manifests_order(tmp_path):
    done = bench(workspace(tmp_path), "--runs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    names = ["preflight", "build", "smoke"]  # the product's chain, stated here, not read from the manifest the tool reads
    assert [name for name, _ in task_chain("smoke")] == names
    assert f"warm chain (the tasks commands, no pixi): {' -> '.join(names)}" in done.stdout
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[2:]}
    assert list(rows) == [*names, "chain"] and all(row[-1] == "2" for row in rows.values())


def test_a_failing_step_stops_the_chain_unless_keep_going(tmp_path):
    root = workspace(tmp_path, failing="build")
    done = bench(root, "--runs", "1")
    assert done.returncode == 1 and "error: the chain stopped at build (exit 1)" in done.stderr
    done = bench(root, "--runs", "1", "--keep-going")
    assert done.returncode == 0 and any(line.startswith("build") and line.split()[4] == "1" for line in done.stdout.splitlines())
