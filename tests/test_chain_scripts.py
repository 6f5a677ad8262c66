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


def test_job_budgets_keep_a_job_per_source_for_the_modules_built_first_and_the_others_share_the_rest(monkeypatch):
    """affected's rebuild builds first the modules its first tests wait for (Rebuild's `first`): shared in
    proportion, each of 46 attention modules would get a job of 32 on 16 cores, and compile its objects
    one by one; they keep one per source, and the others share what is left, a job each at least."""
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    named = [SimpleNamespace(name=f"m{i}", sources=[None] * n) for i, n in enumerate((4, 4, 10, 10, 10, 10))]
    jobs = job_budgets(named, frozenset({"m0", "m1"}))
    assert jobs[:2] == [4, 4] and sum(jobs[2:]) <= 32 - 8 and all(j >= 1 for j in jobs[2:]), jobs
    assert job_budgets(named) == [2, 2, 6, 6, 6, 6] == job_budgets(named, frozenset({"not", "there"}))
    assert job_budgets(named, frozenset(f"m{i}" for i in range(6))) == [2, 2, 6, 6, 6, 6], "all first: none is"
    assert job_budgets(named[:3], frozenset({"m2"})) == [4, 4, 10], "within the budget: a job per source each"


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
