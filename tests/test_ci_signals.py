"""A stopped CI stops its children: SIGTERM to .ci/run (a CI runner's timeout sends it) ends the test
run it started, and leaves no scratch folder behind. Against a workspace copy whose test task is a
stand-in that records its pid and sleeps; .ci/run makes its venvs from the package index as always."""

import os
import shutil
import signal
import subprocess
import time

import pytest

from fidev.core.manifest import ROOT

pytestmark = pytest.mark.integration
SLEEPER = """import os, pathlib, sys, time
pathlib.Path(os.environ["TMPDIR"], "fidev-tests-standin").mkdir()  # what the real conftest makes
pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def wait_for(condition, seconds: float, what: str, proc) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.communicate(timeout=5)[0] if proc.poll() is not None else "(still running)"
            pytest.fail(f"{what} did not happen within {seconds} s: {out}")
        time.sleep(0.2)


def test_sigterm_stops_the_tests_it_started_and_leaves_no_scratch(tmp_path):
    ws, tmp, pid_file = tmp_path / "ws", tmp_path / "tmp", tmp_path / "pid"
    shutil.copytree(ROOT / "scripts", ws / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    (ws / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", ws / ".ci" / "run")
    shutil.copy(ROOT / ".ci" / "requirements.txt", ws / ".ci" / "requirements.txt")
    (ws / "sleeper.py").write_text(SLEEPER)
    manifest = (ROOT / "pyproject.toml").read_text()
    manifest = manifest.replace('test = { cmd = "python -m pytest"', f'test = {{ cmd = "python sleeper.py {pid_file}"', 1)
    manifest = manifest.replace('lint = { cmd = "ruff check ."', 'lint = { cmd = "python -c pass"', 1)
    (ws / "pyproject.toml").write_text(manifest)
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PATH": "/usr/local/bin:/usr/bin:/bin"}  # no pixi
    env.pop("CI", None)
    proc = subprocess.Popen(["bash", str(ws / ".ci" / "run")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        wait_for(pid_file.exists, 600, "the test task's start", proc)
        wait_for(lambda: pid_file.read_text().strip().isdigit(), 10, "the test task's pid", proc)
        pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)  # to .ci/run alone, as a runner's timeout does
        out = proc.communicate(timeout=60)[0]
        wait_for(lambda: not alive(pid), 15, "the end of the test task", proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "stopped by SIGTERM" in out and "Traceback" not in out, out
    assert sorted(p.name for p in tmp.iterdir()) == [], "a scratch folder was left behind"
