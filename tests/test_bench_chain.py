"""tools/bench_chain.py on the CPU: it runs the chain the manifest declares, in its order, with
this interpreter for `python`, stops where pixi would (or times past a failure with --keep-going),
and tables each step and the chain."""

import os
import shutil
import signal
import subprocess
import sys
import time

from fidev.core.manifest import ROOT, pins, task_chain
from script_runs import two_line_failure

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
    return subprocess.run(
        [sys.executable, str(root / "tools/bench_chain.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_chain_is_timed_in_the_manifests_order(tmp_path):
    done = bench(workspace(tmp_path), "--runs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    names = [
        "preflight",
        "build",
        "smoke",
    ]  # the product's chain, stated here, not read from the manifest the tool reads
    assert [name for name, _ in task_chain("smoke")] == names
    assert f"warm chain (the tasks commands, no pixi): {' -> '.join(names)}" in done.stdout
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[2:]}
    assert list(rows) == [*names, "chain"] and all(row[-1] == "2" for row in rows.values())


def test_a_failing_step_stops_the_chain_unless_keep_going(tmp_path):
    root = workspace(tmp_path, failing="build")
    done = bench(root, "--runs", "1")
    assert done.returncode == 1 and "error: the chain stopped at build (exit 1)" in done.stderr
    done = bench(root, "--runs", "1", "--keep-going")
    assert done.returncode == 0 and any(
        line.startswith("build") and line.split()[4] == "1" for line in done.stdout.splitlines()
    )


HEADER = "include/flashinfer/norm.cuh"
SLOW_STEP = "import sys, time; time.sleep({seconds}); sys.exit(0)\n"


def edit_loop_workspace(tmp_path, seconds):
    """A workspace copy whose chain steps each take `seconds`, and a tree with the header the edit loop edits."""
    root = workspace(tmp_path)
    for _, command in task_chain("smoke"):
        (root / command.split()[1]).write_text(SLOW_STEP.format(seconds=seconds))
    header = root / pins().source_dir.relative_to(ROOT) / HEADER
    header.parent.mkdir(parents=True)
    header.write_text("// the user's header\n")
    os.utime(header, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    return root, header


def test_two_edit_loops_at_once_leave_the_tree_as_it_was(tmp_path):
    root, header = edit_loop_workspace(tmp_path, seconds=1.0)
    before = (header.read_bytes(), header.stat().st_mtime_ns)
    env = {k: v for k, v in os.environ.items() if k != "PATH"} | {"PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, str(root / "tools/bench_chain.py"), "--runs", "1", "--keep-going", "--edit-loop"]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    done = [(p.returncode, out, err) for p in procs for out, err in [p.communicate(timeout=120)]]
    statuses = sorted(rc for rc, _, _ in done)
    assert statuses == [0, 1], done  # one edits; the other refuses while the first holds the tree
    refused = next(err for rc, _, err in done if rc == 1)
    assert "another tool is writing" in refused.splitlines()[-2] and refused.splitlines()[-1].lstrip().startswith(
        "fix:"
    ), refused
    assert (header.read_bytes(), header.stat().st_mtime_ns) == before


def test_sigterm_mid_edit_restores_the_tree(tmp_path):
    root, header = edit_loop_workspace(tmp_path, seconds=3.0)
    before = (header.read_bytes(), header.stat().st_mtime_ns)
    env = {k: v for k, v in os.environ.items() if k != "PATH"} | {"PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, str(root / "tools/bench_chain.py"), "--runs", "1", "--keep-going", "--edit-loop"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    while header.read_bytes() == before[0]:  # the warm chain first (3 steps of 3 s), then the edit
        assert proc.poll() is None and time.monotonic() < deadline, "the edit was never planted"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert (header.read_bytes(), header.stat().st_mtime_ns) == before


# A stand-in step that passes on its first run and fails on every later one (its count beside it)
FAILS_LATER = (
    "import pathlib, sys\ncount = pathlib.Path(__file__).with_suffix('.count')\n"
    "n = int(count.read_text()) + 1 if count.exists() else 1\ncount.write_text(str(n))\nsys.exit(int(n > 1))\n"
)


def test_a_timed_run_that_fails_is_no_figure_unless_keep_going(tmp_path):
    """The warm-up passed, a timed run's smoke failed: two lines and status 1, no table of its time."""
    root = workspace(tmp_path)
    smoke = next(command.split()[1] for name, command in task_chain("smoke") if name == "smoke")
    (root / smoke).write_text(FAILS_LATER)
    done = bench(root, "--runs", "2")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-2].startswith("error: the chain stopped at smoke (exit 1) in timed run 1") and lines[
        -1
    ].lstrip().startswith("fix: ")
    assert "median" not in done.stdout, done.stdout
    (root / smoke).with_suffix(".count").unlink()
    done = bench(root, "--runs", "2", "--keep-going")  # times it all the same, its exit in the table
    assert done.returncode == 0 and any(
        line.startswith("smoke") and line.split()[4] == "1" for line in done.stdout.splitlines()
    ), done.stdout


def test_a_manifest_without_the_smoke_task_is_said_for_what_it_is_when_no_task_was_named(tmp_path):
    """No --task given and the manifest lacks smoke (the default last task): two lines naming the manifest and
    the missing task, not a --task the user never gave; a --task named that the manifest lacks is a usage error."""
    root = workspace(tmp_path)
    manifest = root / "pyproject.toml"
    lines = manifest.read_text().splitlines(keepends=True)
    manifest.write_text("".join(line for line in lines if not line.startswith("smoke = { cmd")))
    two_line_failure(bench(root, "--runs", "1"), f"{manifest} has no task smoke, the chain's last task unless --task")
    two_line_failure(bench(root, "--runs", "1", "--task", "smoke"), "--task 'smoke' is not a task of", status=2)
