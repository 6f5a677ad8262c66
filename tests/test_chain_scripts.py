"""CPU behaviour of the chain's scripts: how they fail without FlashInfer or a GPU, the kernel
source mode, and how build shares the cores between module builds."""

import os
import shutil
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from fidev.builds import module_builds
from fidev.core.failure import Failure
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
    return [SimpleNamespace(name=f"m{i}", sources=[None] * n) for i, n in enumerate(sources)]


@pytest.fixture
def memory(tmp_path, monkeypatch):
    """A host whose /proc/meminfo and cgroup files the test writes (in the kernel's formats), none at first."""
    monkeypatch.setattr(module_builds, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(module_builds, "CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(module_builds, "PROC_CGROUP", tmp_path / "proc-self-cgroup")
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "proc-self-cgroup").write_text("0::/\n")  # v2, in a cgroup namespace of its own: the mount's root
    return tmp_path


def meminfo(gib: float) -> str:
    """/proc/meminfo as Linux writes it, with MemAvailable of `gib` GiB."""
    kib = int(gib * 2**20)
    return (
        f"MemTotal:       {kib + 4096} kB\nMemFree:        {kib - 4096} kB\nMemAvailable:   {kib} kB\nBuffers:  0 kB\n"
    )


def test_a_module_builds_with_a_job_per_source_within_the_budget_of_twice_the_cores_or_max_jobs(monkeypatch, memory):
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert module_builds.job_budget() == 32
    for max_jobs, budget in (("4", 4), ("1", 1), ("0", 32), ("many", 32)):
        monkeypatch.setenv("MAX_JOBS", max_jobs)
        assert module_builds.job_budget() == budget, max_jobs
    monkeypatch.delenv("MAX_JOBS")
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert module_builds.job_budget() == 2, "cores not known: one"
    assert [module_builds.module_jobs(spec, 8) for spec in specs(3, 8, 33, 0)] == [3, 8, 8, 8], "none known: all"


@pytest.mark.parametrize(
    "max_jobs",
    ["²", "abc", "0", "-1", "1.5", " 4", "٣", "1" * 5000],
    ids=lambda v: v if len(v) < 9 else f"{len(v)} digits",
)
def test_a_max_jobs_that_is_no_whole_number_from_1_is_ignored_with_one_warning_naming_it(
    monkeypatch, capsys, memory, max_jobs
):
    """'²' and '٣' are str.isdigit, which int() refuses or reads; 5000 digits are more than int() reads:
    each ignored (as FlashInfer ignores what is no digits), said once in the process, never a traceback."""
    monkeypatch.setattr(module_builds, "_JOBS_WARNED", set())
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("MAX_JOBS", max_jobs)
    assert [module_builds.job_budget() for _ in range(3)] == [32] * 3
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: MAX_JOBS={max_jobs!r} is not a whole number from 1") and "ignored" in line


def limit(folder, files, gib_limit, gib_used, gib_cache=0):
    """A memory cgroup's folder as the kernel writes it (V2_FILES or V1_FILES): its limit, its use, memory.stat."""
    folder.mkdir(parents=True, exist_ok=True)
    limit_file, used_file, cache_line = files
    (folder / limit_file).write_text(f"{int(gib_limit * 2**30)}\n")
    (folder / used_file).write_text(f"{int(gib_used * 2**30)}\n")
    (folder / "memory.stat").write_text(f"cache 0\n{cache_line} {int(gib_cache * 2**30)}\nrss 0\n")


def test_the_memory_free_is_the_least_under_any_limit_of_the_processs_memory_cgroup_and_its_ancestors(
    monkeypatch, memory
):
    """The cgroup's folder is /proc/self/cgroup's path under the mount, not another's; an ancestor's limit
    bounds it too; v1's memory line and files
    count as v2's do, v1's 'no limit' (2**63 less a page) is none; a path absent under the mount leaves the
    mount's root (a container's own cgroup, bind-mounted there)."""
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    (memory / "meminfo").write_text(meminfo(500))
    cgroup, proc = memory / "cgroup", memory / "proc-self-cgroup"
    assert module_builds.job_budget() == 71, "no limit anywhere: MemAvailable's 500 GiB"
    proc.write_text("0::/user.slice/job-7\n")
    limit(cgroup / "user.slice/job-7", module_builds.V2_FILES, 100, 30, gib_cache=7)
    limit(cgroup / "user.slice/job-8", module_builds.V2_FILES, 20, 10)  # another job's: not this process's
    assert module_builds.job_budget() == 11, "job-7's 100 GiB less 30 in use, 7 of them page cache: 77 GiB"
    limit(cgroup / "user.slice", module_builds.V2_FILES, 64, 50)
    assert module_builds.job_budget() == 2, "the slice's 64 GiB, 50 in use, bounds job-7 in it: 14 GiB"
    (cgroup / "user.slice/memory.max").write_text("max\n")
    proc.write_text("4:memory:/docker/abc\n0::/\n")  # v1's memory controller; v2's unified tree has none here
    limit(cgroup / "memory/docker/abc", module_builds.V1_FILES, 40, 12)
    assert module_builds.job_budget() == 4, "v1: 40 GiB less 12"
    (cgroup / "memory/docker/abc/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert module_builds.job_budget() == 71, "v1's no limit"
    shutil.rmtree(cgroup / "memory/docker")
    limit(cgroup / "memory", module_builds.V1_FILES, 24, 3)
    assert module_builds.job_budget() == 3, "/docker/abc absent under the mount: its root, the container's"
    proc.write_text("4:memory:/../../etc\n")
    assert module_builds.job_budget() == 3, "a path that climbs is none: the mount's root"
    proc.unlink()
    assert module_builds.job_budget() == 71, "no /proc/self/cgroup: v2 at the mount's root, which has no limit here"


def test_proc_self_cgroup_is_read_as_the_kernel_writes_it(monkeypatch, memory):
    """/proc/self/cgroup as a hybrid host writes it: a line per v1 hierarchy (controllers comma-separated, memory
    among them, after others), then v2's `0::` line, whose files sit under CGROUP/unified there; a cgroup
    name may hold a colon. A path that is not absolute or climbs out of the mount is none (the mount's root).
    Bytes of no UTF-8 in it or in memory.stat are no traceback."""
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    (memory / "meminfo").write_text(meminfo(500))
    cgroup, proc = memory / "cgroup", memory / "proc-self-cgroup"
    proc.write_text("9:name=systemd:/\n5:devices:/\n4:cpu,memory:/Xjobs/a:b\n1:cpuset:/\n0::/\n")
    limit(cgroup / "memory/Xjobs/a:b", module_builds.V1_FILES, 30, 2)
    assert module_builds.job_budget() == 4, "v1's memory line, after others and beside cpu: 28 GiB"
    proc.write_text("0::/Xjobs/a:b\n")
    limit(cgroup / "unified/Xjobs/a:b", module_builds.V2_FILES, 16, 1)
    assert module_builds.job_budget() == 2, "a hybrid host's v2 files under unified/: 15 GiB"
    limit(cgroup / "unified/Xjobs/a:b", module_builds.V2_FILES, 2**60 / 2**30, 1)
    assert module_builds.job_budget() == 71, "2**60 and more is no limit"
    limit(cgroup / "limited", module_builds.V2_FILES, 8, 1)  # what a path climbing out of the mount would name
    for path in ("relative/limited", "/../limited", "/Xjobs/../../limited"):
        proc.write_text(f"0::{path}\n")
        assert module_builds.job_budget() == 71, f"{path}: the mount's root alone, which has no limit here"
    proc.write_bytes(b"0::/Xjobs/a:b\xff\n")
    assert module_builds.job_budget() == 71, "a name of no UTF-8: not the folder, and no traceback"
    proc.write_text("0::/Xjobs/a:b\n")
    limit(cgroup / "unified/Xjobs/a:b", module_builds.V2_FILES, 16, 15, gib_cache=14)
    stat = cgroup / "unified/Xjobs/a:b/memory.stat"
    stat.write_bytes(b"\xfe\xff 1\n" + stat.read_bytes())
    assert module_builds.job_budget() == 2, "memory.stat with bytes of no UTF-8 still read: 15 GiB free, 2 jobs"


def test_a_max_jobs_of_ascii_digits_is_taken_without_a_word(monkeypatch, capsys, memory):
    for max_jobs, budget in (("007", 7), ("999999999", 999999999)):
        monkeypatch.setenv("MAX_JOBS", max_jobs)
        assert module_builds.job_budget() == budget
    monkeypatch.setenv("MAX_JOBS", "")  # counts as unset
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert module_builds.job_budget() == 32
    assert capsys.readouterr().err == ""


def test_without_max_jobs_the_builds_take_no_more_jobs_than_the_memory_free_holds(monkeypatch, capsys, memory):
    """Twice the cores of FlashInfer's heaviest objects at once were killed for memory on a GPU host
    (docs/measurements.md, row "compile memory per job"): without MAX_JOBS the budget is
    also at most the memory free at JOB_MEMORY a job (MemAvailable, or the cgroup's limit less its use where
    that is less), at least one; MAX_JOBS is the user's word and is taken as it is."""
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(module_builds, "_JOBS_WARNED", set())
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert module_builds.job_budget() == 32, "no /proc/meminfo: twice the cores"
    (memory / "meminfo").write_text(meminfo(125))
    assert module_builds.JOB_MEMORY == 7 * 2**30
    assert module_builds.job_budget() == 17, "125 GiB holds 17 jobs of 7 GiB"
    (memory / "meminfo").write_text(meminfo(1000))
    assert module_builds.job_budget() == 32, "the cores bound it"
    (memory / "meminfo").write_text(meminfo(2))
    assert module_builds.job_budget() == 1, "too little for one: one all the same"
    (memory / "meminfo").write_text(meminfo(125))
    (memory / "cgroup" / "memory.max").write_text(f"{64 * 2**30}\n")
    (memory / "cgroup" / "memory.current").write_text(f"{22 * 2**30}\n")
    assert module_builds.job_budget() == 6, "the container's 64 GiB, 22 of them in use: 42 GiB, 6 jobs"
    (memory / "cgroup" / "memory.current").write_text(f"{60 * 2**30}\n")
    (memory / "cgroup" / "memory.stat").write_text(
        f"anon {21 * 2**30}\nfile {39 * 2**30}\ninactive_file {37 * 2**30}\n"
    )
    assert module_builds.job_budget() == 5, "60 GiB in use, 37 of them page cache the kernel reclaims: 41 GiB, 5 jobs"
    (memory / "cgroup" / "memory.stat").write_text("inactive_file lots\n")
    assert module_builds.job_budget() == 1, "no inactive_file read: 4 GiB free, one"
    (memory / "cgroup" / "memory.stat").unlink()
    (memory / "cgroup" / "memory.current").write_text(f"{80 * 2**30}\n")
    assert module_builds.job_budget() == 1, "the container over its limit: one"
    (memory / "cgroup" / "memory.max").write_text("max\n")
    assert module_builds.job_budget() == 17, "no limit: MemAvailable's"
    for odd in ("MemAvailable: lots kB\n", "MemAvailable:   1234\n", "MemTotal: 1 kB\n", "\xff\xfe"):
        (memory / "meminfo").write_text(odd)
        assert module_builds.job_budget() == 32, f"no MemAvailable in kB read from {odd!r}: twice the cores"
    (memory / "meminfo").write_text(meminfo(14))
    monkeypatch.setenv("MAX_JOBS", "12")
    assert module_builds.job_budget() == 12, "MAX_JOBS as it is"
    monkeypatch.setenv("MAX_JOBS", "many")
    assert module_builds.job_budget() == 2, "an ignored MAX_JOBS: the memory's"
    assert "up to 2 jobs at once (twice the cores, and no more than the memory free holds" in capsys.readouterr().err


def test_modules_start_in_order_each_once_its_jobs_fit_beside_those_running():
    """All at once, many modules each got about a job and every module ended near the end of all
    (docs/measurements.md, row "planted attention bug cascade-other-lse-head0 from a build-only JIT dir"):
    a test waits for the end of each module it loads. In order, the first modules keep a job per
    source and end first; a module that alone outgrows the budget starts once nothing else runs, and
    none starts past a module still waiting for its jobs (the order holds)."""
    admission = module_builds.Admission(8)
    assert admission.may_start(0, 4) and admission.enter(0, 4)
    assert admission.may_start(1, 4) and admission.enter(1, 4)
    assert not admission.may_start(2, 6), "6 jobs do not fit beside 8 running"
    admission.leave(4)
    assert not admission.may_start(2, 6), "4 free: still no fit"
    assert not admission.may_start(3, 2), "m3's 2 jobs fit, but its turn comes after m2's"
    admission.leave(4)
    assert admission.may_start(2, 6) and admission.enter(2, 6)
    assert admission.may_start(3, 2) and admission.enter(3, 2)
    admission.leave(6)
    assert not admission.may_start(4, 9), "outgrowing the budget: it waits until nothing runs"
    admission.leave(2)
    assert admission.may_start(4, 9) and admission.enter(4, 9)


def waiting(admission, turn: int, jobs: int) -> tuple[list[bool], threading.Thread]:
    """A module waiting at `admission` in its own thread: what enter() returned, once it returned."""
    said: list[bool] = []
    thread = threading.Thread(target=lambda: said.append(admission.enter(turn, jobs)), daemon=True)
    thread.start()
    return said, thread


def test_a_module_waiting_for_its_jobs_starts_as_the_module_before_it_leaves():
    admission = module_builds.Admission(8)
    assert admission.enter(0, 8)
    said, thread = waiting(admission, 1, 8)
    admission.leave(8)
    thread.join(timeout=10)
    assert said == [True]


def test_once_the_builds_are_stopped_no_module_starts_and_each_not_started_is_a_failed_build(tmp_path):
    """affected's first failure stops its rebuild: the modules still waiting for their turn never start a
    ninja, and each ends as a build that failed (no test loads its old library as rebuilt)."""
    stopped = threading.Event()
    admission = module_builds.Admission(4, stopped)
    assert admission.enter(0, 4)
    said, thread = waiting(admission, 1, 2)
    stopped.set()
    thread.join(timeout=10)
    assert said == [False]
    folders = [SimpleNamespace(name=f"m{i}", sources=["s.cu"], build_dir=tmp_path / f"m{i}") for i in range(2)]
    running, failed, done = [], [], []
    with pytest.raises(Failure, match="the JIT build of m0 did not start: the builds were stopped"):
        module_builds.run_module_builds(
            folders,
            lambda line: None,
            running,
            on_done=lambda spec: done.append(spec.name),
            on_failed=lambda spec, failure: failed.append(spec.name),
            stopped=stopped,
        )
    assert running == [] and sorted(failed) == sorted(done) == ["m0", "m1"]
    assert not any(folder.build_dir.exists() for folder in folders), "nothing prepared for a build not started"


def test_the_modules_the_first_tests_wait_for_start_first_then_the_rest_in_the_order_given(tmp_path, monkeypatch):
    """Rebuild's `first` (smoke's modules, one case of each of FlashInfer's functions) come first in its
    order, the others after them in the order given, with MAX_JOBS 1 one module at a time."""
    monkeypatch.setenv("MAX_JOBS", "1")
    order = []

    def prepared(spec, say, printing):
        order.append(spec.name)
        return Failure(f"{spec.name} prepared", "none")

    monkeypatch.setattr(module_builds, "prepare_folder", prepared)
    folders = [SimpleNamespace(name=name, sources=["s.cu"]) for name in ("a", "b", "c", "d")]
    with pytest.raises(Failure):
        module_builds.run_module_builds(folders, lambda line: None, first=("c", "not built", "b"))
    assert order == ["c", "b", "a", "d"]


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


def test_an_unset_max_jobs_is_said_nothing_of_and_more_than_9_digits_past_leading_zeros_is_ignored(
    monkeypatch, capsys, memory
):
    """job_budget: MAX_JOBS unset is the default without a word (only a value given and ignored is warned of);
    a whole number is at most 9 digits once its leading zeros go, however many zeros lead it; 10 digits are
    ignored with the warning."""
    monkeypatch.setattr(module_builds, "_JOBS_WARNED", set())
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    assert module_builds.job_budget() == 32
    assert capsys.readouterr().err == "", "MAX_JOBS unset: nothing to warn of"
    monkeypatch.setenv("MAX_JOBS", "0000000000012")
    assert module_builds.job_budget() == 12, "leading zeros do not count toward the 9 digits"
    monkeypatch.setenv("MAX_JOBS", "1000000000")
    assert module_builds.job_budget() == 32, "10 digits: more than any host runs, ignored"
    assert "MAX_JOBS='1000000000' is not a whole number" in capsys.readouterr().err


def test_memavailable_is_read_in_kib_of_1024_bytes_and_a_job_needs_the_whole_job_memory(monkeypatch, memory):
    """meminfo_available: the kernel's kB are KiB; memory_jobs counts whole jobs of JOB_MEMORY, so one KiB
    short of two jobs' memory is one job."""
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    (memory / "meminfo").write_text(f"MemAvailable:   {14 * 2**20 - 1} kB\n")
    assert module_builds.meminfo_available() == 14 * 2**30 - 1024
    assert module_builds.job_budget() == 1, "a KiB short of 14 GiB: one job of 7 GiB"
    (memory / "meminfo").write_text(f"MemAvailable:   {14 * 2**20} kB\n")
    assert module_builds.job_budget() == 2, "14 GiB: two jobs"


def test_bytes_that_are_no_utf8_in_meminfo_or_a_cgroup_file_are_no_traceback(monkeypatch, memory):
    """meminfo_available and read_whole read with errors replaced: a byte that is no UTF-8 makes a line or a
    file unreadable as a number, never a UnicodeDecodeError in the builds' threads; the other lines still count."""
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    (memory / "meminfo").write_bytes(b"\xff\xfe\n")
    assert module_builds.job_budget() == 32, "no MemAvailable readable: twice the cores"
    (memory / "meminfo").write_bytes(b"Odd:   \xff kB\n" + meminfo(125).encode())
    assert module_builds.job_budget() == 17, "MemAvailable read past a line of bad bytes"
    (memory / "cgroup" / "memory.max").write_bytes(b"\xff\n")
    (memory / "cgroup" / "memory.current").write_text(f"{22 * 2**30}\n")
    assert module_builds.job_budget() == 17, "a memory.max of no number: no limit"
    (memory / "cgroup" / "memory.max").write_text(f"{64 * 2**30}\n")
    (memory / "cgroup" / "memory.current").write_bytes(b"\xfe")
    assert module_builds.job_budget() == 17, "a memory.current of no number: the limit is not used"


def test_a_cgroup_file_of_more_than_30_digits_is_no_number(monkeypatch, memory):
    """read_whole: a cgroup file's number is 30 digits at most (more is no byte count a kernel writes)."""
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    (memory / "meminfo").write_text(meminfo(125))
    for name, digits in (("memory.max", "6" + "0" * 29), ("memory.current", "1" * 30)):
        (memory / "cgroup" / name).write_text(digits + "\n")
        assert module_builds.read_whole(memory / "cgroup" / name) == int(digits), "30 digits: a number"
        (memory / "cgroup" / name).write_text(digits + "0\n")
        assert module_builds.read_whole(memory / "cgroup" / name) is None, "31 digits: none"
    (memory / "cgroup" / "memory.max").write_text(f"{64 * 2**30}\n")
    (memory / "cgroup" / "memory.current").write_text("1" * 31 + "\n")
    assert module_builds.job_budget() == 17, "a use of 31 digits is no number: MemAvailable's"
    (memory / "cgroup" / "memory.current").write_text("1" * 30 + "\n")
    assert module_builds.job_budget() == 1, "a use of 30 digits is read: over the limit, one job"
