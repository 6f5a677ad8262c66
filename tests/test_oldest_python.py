"""The standard-library-only scripts (preflight, the source materializer) and the manifest reader
.ci/run uses run on the oldest Python the workspace allows (`requires-python`), where tomllib is
missing and tarfile may lack its extraction filters."""

import glob
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fidev.core.manifest import ROOT, load_manifest

OLDEST = re.fullmatch(r">=\s*(\d+\.\d+)", load_manifest()["project"]["requires-python"]).group(1)


def oldest_python():
    """An interpreter of that release that runs (a pyenv shim may name one it cannot start)."""
    candidates = [
        *sorted(glob.glob(f"{Path.home()}/.pyenv/versions/{OLDEST}.*/bin/python3")),
        shutil.which(f"python{OLDEST}"),
    ]
    for python in filter(None, candidates):
        probe = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode == 0 and probe.stdout.strip() == OLDEST:
            return python
    pytest.skip(f"no Python {OLDEST} on this host to run them with")


def test_manifest_reader_and_preflight_run_on_the_oldest_python():
    python = oldest_python()
    pins = subprocess.run(
        [python, "-c", "from fidev.core.manifest import pins; print(pins().flashinfer)"],
        cwd=ROOT / "scripts",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pins.returncode == 0 and pins.stdout.strip(), pins.stderr
    done = subprocess.run(
        [python, str(ROOT / "scripts/preflight.py"), "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode in (0, 1) and json.loads(done.stdout)["checks"], done.stderr
    bare = subprocess.run(
        [python, "-S", str(ROOT / "scripts/preflight.py"), "--json"], capture_output=True, text=True, timeout=60
    )
    assert bare.returncode == 1 and "Traceback" not in bare.stderr, bare.stderr  # no pip, no tomli: two lines, and JSON
    assert "has no TOML reader" in json.loads(bare.stdout)["error"]


def test_materializer_runs_on_the_oldest_python(tmp_path):
    done = subprocess.run(
        [
            oldest_python(),
            str(ROOT / "scripts/fetch_flashinfer_source.py"),
            "--dest",
            str(tmp_path / "fi"),
            "--archive",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stderr.startswith("error: --archive ") and "Traceback" not in done.stderr, (
        done.stderr
    )
