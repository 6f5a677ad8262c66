"""Run the workspace's scripts as users do (a fresh interpreter) and check how they fail."""

import importlib.util
import os
import subprocess
import sys

import pytest

from fidev.manifest import ROOT


def run(script, *args, flags=(), env=None, timeout=120):
    return subprocess.run([sys.executable, *flags, str(ROOT / "scripts" / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def two_line_failure(done, problem):
    """Exit status 1, and the last two lines of stderr: the problem, then the fix."""
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-2].startswith("error: ") and problem in lines[-2], lines
    assert lines[-1].lstrip().startswith("fix: ")


def require(module, why):
    """Skip where `module` is missing, except under CI, which must provide it."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide {module} (.ci/requirements.txt): {why}", pytrace=False)
        pytest.skip(f"{module} is not installed here: {why}", allow_module_level=True)
