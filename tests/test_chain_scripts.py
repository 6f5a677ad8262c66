"""CPU behaviour of the chain's scripts: how they fail without FlashInfer or a GPU, the kernel
source mode, and how build shares the cores between module builds."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from fidev.builds.module_builds import job_budgets
from fidev.core.manifest import ROOT, pins
from script_runs import run, two_line_failure


@pytest.mark.parametrize(
    "script, problem", [("import_check.py", "import flashinfer failed"), ("build.py", "import flashinfer failed")]
)
def test_steps_fail_in_two_lines_without_flashinfer(script, problem):
    # -S: no site-packages, so no flashinfer whatever this host has installed
    two_line_failure(run(script, flags=["-S"]), problem)


@pytest.mark.parametrize("mode, visible", [("prebuilt", True), ("vendored", False)])
def test_vendored_mode_hides_the_jit_cache(tmp_path, mode, visible):
    (tmp_path / "flashinfer_jit_cache").mkdir()
    (tmp_path / "flashinfer_jit_cache" / "__init__.py").write_text("")
    probe = (
        "import importlib.util; from fidev.jit import kernel_source, module_choice; "
        "module_choice.apply(kernel_source.mode());print(importlib.util.find_spec('flashinfer_jit_cache') is "
        "not None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT / 'scripts'}",
            "FLASHINFER_DEV_KERNEL_SOURCE": mode,
        },
    )
    assert done.stdout.strip() == str(visible), done.stderr


def specs(*sources):
    return [SimpleNamespace(sources=[None] * n) for n in sources]


def test_job_budgets_give_each_source_a_job_while_cores_last(monkeypatch):
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert job_budgets(specs(3, 2, 7)) == [3, 2, 7]
    shared = job_budgets(specs(33, 7, 6, 3))  # 49 sources > 32
    assert sum(shared) <= 32 and all(j >= 1 for j in shared) and shared[0] > shared[1] > shared[3]


def test_job_budgets_honour_max_jobs(monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "4")
    assert sum(job_budgets(specs(6, 6))) <= 4


def test_a_jit_cache_of_another_version_is_two_lines(tmp_path):
    """FlashInfer refuses to import next to a jit-cache of another version: flashinfer/jit/env.py,
    _get_aot_dir's RuntimeError at v0.6.3, whose message the stand-in raises as the real one does."""
    pkg = tmp_path / "flashinfer"
    pkg.mkdir()
    pin = pins().flashinfer
    (pkg / "__init__.py").write_text(
        f'raise RuntimeError("flashinfer-jit-cache version (0.0.1+cu129) does not match flashinfer version ({pin}). "\n'
        '                   "Please install the same version of both packages. "\n'
        '                   "Set FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check.")\n'
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/import_check.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT / 'scripts'}",
            "FLASHINFER_DEV_KERNEL_SOURCE": "prebuilt",
        },
    )
    two_line_failure(
        done, f"flashinfer-jit-cache 0.0.1+cu129 does not match FlashInfer {pin}: FlashInfer refuses to import"
    )
    assert "FLASHINFER_DEV_KERNEL_SOURCE=vendored" in done.stderr
