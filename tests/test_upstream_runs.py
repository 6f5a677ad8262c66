"""upstream-tests as FlashInfer's CI runs its suite (fidev.upstream.runs): a pytest process per test
file, a crash or a timeout reported for its file alone, a JUnit XML per file, skips by reason, the
files spread over the GPUs with CUDA_VISIBLE_DEVICES, and a baseline to compare a run against.

The tree is tests/support/upstream_standin.py's stand-in of FlashInfer's suite at v0.6.3 (its conftest, its
pytest.ini), with test files added per case."""

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fidev.affected import summary as affected_summary
from fidev.builds import build_stamp, module_builds
from fidev.core import workspace
from fidev.core.manifest import ROOT, pins
from fidev.tree import families as upstream_suites
from fidev.tree import release_reference
from fidev.upstream import runs as upstream_runs
from fidev.upstream import summary as upstream_summary
from script_runs import expect_unwritten, final_write_fails, require, run, two_line_failure, wait_until
from upstream_standin import needs_a_build, standin_ws, upstream  # noqa: F401 (standin_ws: the fixture `ws`)

TESTS = "extern/tracked/flashinfer/tests"


def test_a_stop_while_the_workers_start_stops_those_started_and_joins_no_other():
    """Ctrl-C, SIGTERM or SIGHUP while run_workers starts its threads: those started are stopped and waited
    for, those not started are left (never `cannot join thread before it is started`), and the stop stays
    Ctrl-C's KeyboardInterrupt."""
    stop = upstream_runs.Stop()
    ran = []

    class InterruptedAtStart(threading.Thread):
        def start(self):
            raise KeyboardInterrupt  # the signal arrives as the second worker starts

    first = threading.Thread(target=lambda: ran.append(stop.flag.wait(5)))
    with pytest.raises(KeyboardInterrupt):
        upstream_runs.run_workers([first, InterruptedAtStart(target=ran.append), threading.Thread()], stop)
    assert stop.flag.is_set() and not first.is_alive() and ran == [True]


@pytest.mark.parametrize(
    "visible, seen",
    [
        ("", []),
        ("-1", []),
        ("abc", []),
        (" , ", []),
        ("0,-1,1", ["0"]),
        ("1,abc,0", ["1"]),
        ("3, 5", ["3", "5"]),
        ("GPU-8e3c1b2a,MIG-1f2e", ["GPU-8e3c1b2a", "MIG-1f2e"]),
        ("0,,1", ["0"]),
        ("١", []),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(monkeypatch, visible, seen):
    """CUDA's list ends at its first entry that is no GPU index or UUID: -1 (or a word) hides every GPU,
    never one GPU named "-1" to pin a worker to. The host has 8 GPUs here, so that no index ends it."""
    monkeypatch.setattr(upstream_runs, "gpu_count", lambda: 8)
    monkeypatch.setattr(upstream_runs, "host_uuids", lambda: HOST_UUIDS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert upstream_runs.host_gpus() == seen


@pytest.mark.parametrize(
    "visible, count, seen",
    [
        ("0,7,1", 2, ["0"]),
        ("7,0", 2, []),
        ("2", 2, []),
        ("1, 0", 2, ["1", "0"]),
        ("0,GPU-8e3c1b2a,5,1", 2, ["0", "GPU-8e3c1b2a"]),
        ("0", 0, []),
        ("7,0", None, ["7", "0"]),
        ("0," + "9" * 5001, 2, ["0"]),
    ],
    ids=lambda v: None if not isinstance(v, str) or len(v) < 20 else f"{v[:8]}... ({len(v)} characters)",
)
def test_an_index_past_the_hosts_gpus_ends_cuda_visible_devices(monkeypatch, visible, count, seen):
    """An index at or past the host's GPU count is no GPU to CUDA, so it ends the list as -1 does: `0,7,1`
    on a host of 2 shows GPU 0 alone, never a worker pinned to a GPU 7 that it cannot find; so does an index of
    thousands of digits (which int() refuses), never a traceback. Where the count is unknown (no driver's
    folder, no nvidia-smi), no index ends it."""
    monkeypatch.setattr(upstream_runs, "gpu_count", lambda: count)
    monkeypatch.setattr(upstream_runs, "host_uuids", lambda: HOST_UUIDS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert upstream_runs.host_gpus() == seen


# nvidia-smi -L of a host of two GPUs, the second split into MIG devices
SMI_L = """\
GPU 0: NVIDIA H200 (UUID: GPU-8e3c1b2a-5f3e-4d1c-9a2b-0123456789ab)
GPU 1: NVIDIA H200 (UUID: GPU-8e3c9d00-1111-2222-3333-444455556666)
  MIG 1g.18gb     Device  0: (UUID: MIG-1f2e3d4c-aaaa-bbbb-cccc-ddddeeeeffff)
"""
HOST_UUIDS = re.findall(r"UUID: (\S+)\)", SMI_L)


@pytest.mark.parametrize(
    "visible, uuids, seen",
    [
        ("GPU-8e3c1b2a", HOST_UUIDS, ["GPU-8e3c1b2a"]),
        (HOST_UUIDS[1], HOST_UUIDS, [HOST_UUIDS[1]]),
        ("GPU-5f3e0000-dead-beef-0000-000000000000,0", HOST_UUIDS, []),
        ("0,GPU-8e3c,1", HOST_UUIDS, ["0"]),
        ("MIG-1f2e,GPU-8e3c9,MIG-9", HOST_UUIDS, ["MIG-1f2e", "GPU-8e3c9"]),
        ("MIG-GPU-8e3c1b2a/1/0,MIG-GPU-0000/1/0", HOST_UUIDS, ["MIG-GPU-8e3c1b2a/1/0"]),
        ("GPU-5f3e", None, ["GPU-5f3e"]),
    ],
    ids=["a unique start", "whole", "of no GPU here", "the start of two", "MIG", "MIG-GPU-", "host unknown"],
)
def test_a_uuid_ends_cuda_visible_devices_where_it_names_no_device_of_the_host(monkeypatch, visible, uuids, seen):
    """As an index past the host's GPUs does: CUDA takes a UUID, or its start, that names exactly one of the
    host's devices (nvidia-smi -L's), and ends the list at one that names none, or two; a worker is never
    pinned to a GPU-5f3e... no GPU here has. Where nvidia-smi cannot say, a UUID is taken unchecked."""
    monkeypatch.setattr(upstream_runs, "gpu_count", lambda: 2)
    monkeypatch.setattr(upstream_runs, "host_uuids", lambda: uuids)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert upstream_runs.host_gpus() == seen


def test_the_hosts_uuids_are_nvidia_smis_gpus_and_mig_devices(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert upstream_runs.host_uuids() is None  # no nvidia-smi
    smi.write_text(f"#!{sys.executable}\nprint({SMI_L!r}, end='')\n")
    smi.chmod(0o755)
    assert upstream_runs.host_uuids() == HOST_UUIDS
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'\nexit 9\n")
    assert upstream_runs.host_uuids() is None


def test_gpus_asked_for_where_cuda_visible_devices_names_a_uuid_of_no_gpu_here_is_said_so(ws, tmp_path):
    root, _, env = ws
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text(f"#!{sys.executable}\nprint({SMI_L!r}, end='')\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    visible = "GPU-5f3e0000-dead-beef-0000-000000000000"
    path = f"{tmp_path / 'bin'}{os.pathsep}{env.get('PATH', os.environ['PATH'])}"
    done = upstream(root, {**env, "PATH": path, "CUDA_VISIBLE_DEVICES": visible}, "norm", "--no-plan", "--gpus", "2")
    two_line_failure(done, f"CUDA_VISIBLE_DEVICES={visible!r} shows no GPU, as CUDA reads it", status=2)


def test_with_cuda_visible_devices_unset_each_gpu_of_the_host_is_seen(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(upstream_runs, "gpu_count", lambda: 2)
    assert upstream_runs.host_gpus() == ["0", "1"]
    monkeypatch.setattr(upstream_runs, "gpu_count", lambda: None)
    assert upstream_runs.host_gpus() == []


def test_the_hosts_gpu_count_is_the_drivers_else_nvidia_smis(tmp_path, monkeypatch):
    """gpu_count: the driver's folders (one per GPU), else nvidia-smi -L's "GPU n:" lines, else None."""
    for bus in ("0000:19:00.0", "0000:3b:00.0"):
        (tmp_path / "gpus" / bus).mkdir(parents=True)
    monkeypatch.setattr(upstream_runs, "GPUS", tmp_path / "gpus")
    assert upstream_runs.gpu_count() == 2
    monkeypatch.setattr(upstream_runs, "GPUS", tmp_path / "absent")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    monkeypatch.setenv("PATH", str(smi.parent))
    assert upstream_runs.gpu_count() is None  # no nvidia-smi
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\necho '  MIG 1g.18gb Device 0:'\n")
    smi.chmod(0o755)
    assert upstream_runs.gpu_count() == 1
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'\nexit 9\n")
    assert upstream_runs.gpu_count() is None


@pytest.mark.parametrize("visible", [" , ", "-1", "abc"])
def test_gpus_asked_for_where_cuda_visible_devices_shows_none_is_said_so(ws, visible):
    """--gpus 2 where CUDA_VISIBLE_DEVICES hides every GPU: two lines that say it shows none, as CUDA reads
    it, and how to set it, never "ask for at most 0"."""
    root, _, env = ws
    done = upstream(root, {**env, "CUDA_VISIBLE_DEVICES": visible}, "norm", "--no-plan", "--gpus", "2")
    two_line_failure(done, f"CUDA_VISIBLE_DEVICES={visible!r} shows no GPU, as CUDA reads it", status=2)
    assert "at most 0" not in done.stderr and "set CUDA_VISIBLE_DEVICES" in done.stderr.splitlines()[-1]


def test_a_run_where_cuda_visible_devices_hides_every_gpu_says_so(ws):
    root, _, env = ws
    write(root, "utils/test_quantization.py", "def test_fine():\n    pass\n")
    done = upstream(root, {**env, "CUDA_VISIBLE_DEVICES": "-1"}, "utils/test_quantization.py", "--no-plan")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on no GPU(s)" in done.stdout and "CUDA_VISIBLE_DEVICES='-1' shows no GPU, as CUDA reads it" in done.stdout


def affected(root, env, *args):
    """scripts/affected.py run to its end, with the stand-in's environment."""
    return run("affected.py", *args, env=env, timeout=300, root=root)


def write(root, rel, text):
    path = root / TESTS / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def run_probe(probe, root, env):
    """A Python file run against the stand-in flashinfer, with the workspace's library importable."""
    return subprocess.run(
        [sys.executable, str(probe)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join([env["PYTHONPATH"], str(root / "scripts")])},
    )


def run_folder(stdout):
    return Path(re.search(r"JUnit XML and logs in (\S+)", stdout).group(1))


def test_a_crash_and_a_timeout_are_their_files_alone(ws):
    root, _, env = ws
    write(
        root,
        "utils/test_quantization.py",
        "import os, signal\ndef test_crash():\n    os.kill(os.getpid(), signal.SIGSEGV)\n",
    )
    write(root, "attention/test_page.py", "import time\ndef test_slow():\n    time.sleep(60)\n")
    write(root, "attention/test_rope.py", "def test_fine():\n    pass\ndef test_also():\n    pass\n")
    done = upstream(root, env, "quantization", "page", "rope", "--no-plan", "--file-timeout", "5")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tests/utils/test_quantization.py did not finish: signal 11" in done.stdout, done.stdout
    assert "tests/attention/test_page.py did not finish: timed out after 5 s" in done.stdout
    assert "upstream-tests: 2 passed, 0 skipped, 0 failed, 2 errors" in done.stdout
    folder = run_folder(done.stdout)
    assert sorted(p.name for p in folder.glob("*.xml")) == [
        "tests__attention__test_rope.xml"
    ]  # the others died before writing one
    logs = {"tests__attention__test_rope.log", "tests__attention__test_page.log", "tests__utils__test_quantization.log"}
    assert {p.name for p in folder.glob("*.log")} == logs


def test_skips_are_split_by_reason_and_the_conftests_two_fail_the_run(ws):
    root, _, env = ws
    write(
        root,
        "attention/test_rope.py",
        "import pytest\ndef test_oom():\n    raise RuntimeError('CUDA error: out of memory')\n"
        "def test_sm100():\n    pytest.skip('needs sm_100')\ndef test_fine():\n    pass\n",
    )
    done = upstream(root, env, "rope", "--no-plan")
    assert "upstream-tests: 1 passed, 2 skipped, 0 failed, 0 errors" in done.stdout, done.stdout + done.stderr
    assert "upstream-tests: skipped: 1 not supported here, 1 out of memory" in done.stdout
    assert done.returncode == 1  # an out-of-memory skip hides a failure
    write(
        root,
        "attention/test_rope.py",
        "import pytest\ndef test_sm100():\n    pytest.skip('needs sm_100')\ndef test_fine():\n    pass\n",
    )
    # a file skipped whole is one skip, as pytest counts it, with its reason
    write(root, "attention/test_page.py", "import pytest\npytest.skip('needs sm_100a', allow_module_level=True)\n")
    done = upstream(root, env, "rope", "page", "--no-plan")
    assert "upstream-tests: 1 passed, 2 skipped, 0 failed, 0 errors" in done.stdout, done.stdout + done.stderr
    assert "upstream-tests: skipped: 2 not supported here" in done.stdout
    assert done.returncode == 0


def test_files_spread_over_the_gpus_one_each(ws, tmp_path):
    root, _, env = ws
    seen = tmp_path / "seen"
    seen.mkdir()
    for i, rel in enumerate(
        ["attention/test_rope.py", "attention/test_page.py", "utils/test_quantization.py", "utils/test_topk.py"]
    ):
        write(
            root,
            rel,
            f"import os, time\ndef test_where():\n"
            f"    open('{seen}/{i}', 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])\n"
            # each of the first two waits for the other: two processes at once, as a process per GPU runs them
            f"    end = time.monotonic() + 60\n"
            f"    while len(os.listdir('{seen}')) < 2 and time.monotonic() < end:\n"
            f"        time.sleep(0.01)\n",
        )
    done = upstream(root, {**env, "CUDA_VISIBLE_DEVICES": "3,5"}, "rope", "page", "quantization", "topk", "--no-plan")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 file(s), a pytest process each, on 2 GPU(s)" in done.stdout
    assert sorted({p.read_text() for p in seen.iterdir()}) == ["3", "5"]
    done = upstream(root, {**env, "CUDA_VISIBLE_DEVICES": "3,5"}, "rope", "page", "--no-plan", "--gpus", "1")
    assert "on 1 GPU(s)" in done.stdout


@needs_a_build
def test_a_baseline_then_a_new_failure_lists_exactly_it(ws):
    root, _, env = ws
    write(
        root,
        "utils/test_norm.py",
        "import os\ndef test_norm():\n    pass\ndef test_gemma_norm():\n    assert not os.environ.get('FAKE_BUG')\n"
        "def test_known_broken():\n    assert False\n",
    )
    done = upstream(root, env, "norm", "--no-plan", "--baseline")
    assert done.returncode == 0 and "baseline of 3 tests recorded for norm" in done.stdout, done.stdout + done.stderr
    done = upstream(root, {**env, "FAKE_BUG": "1"}, "norm", "--no-plan")
    assert done.returncode == 1, done.stdout
    assert (
        "  newly failing: 1\n    tests/utils/test_norm.py::test_gemma_norm\n  newly erroring: 0\n  newly passing: 0"
        in done.stdout
    ), done.stdout
    compared = upstream_summary.read(
        run_folder(done.stdout) / upstream_summary.NAME
    ).compared  # what the acceptance run reads
    assert (compared["newly failing"], compared["newly erroring"]) == (
        ["tests/utils/test_norm.py::test_gemma_norm"],
        [],
    ), compared
    done = upstream(root, env, "norm", "--no-plan")
    assert done.returncode == 0, done.stdout  # the known failure is in the baseline: no new failure
    assert "  newly failing: 0\n" in done.stdout
    # past the 50 the terminal shows, every newly failing id is in the run folder's compared.txt
    write(
        root,
        "utils/test_norm.py",
        "import os, pytest\ndef test_norm():\n    pass\ndef test_gemma_norm():\n"
        "    assert not os.environ.get('FAKE_BUG')\n"
        "def test_known_broken():\n    assert False\n@pytest.mark.parametrize('i', range(60))\n"
        "def test_many(i):\n    assert not os.environ.get('FAKE_BUG')\n",
    )
    done = upstream(root, env, "norm", "--no-plan", "--baseline")
    assert done.returncode == 0 and "baseline of 63 tests recorded for norm" in done.stdout, done.stdout + done.stderr
    done = upstream(root, {**env, "FAKE_BUG": "1"}, "norm", "--no-plan")
    listed = run_folder(done.stdout) / "compared.txt"
    assert "  newly failing: 61\n" in done.stdout and f"    ... and 11 more: {listed}\n" in done.stdout, done.stdout
    expected = {
        "tests/utils/test_norm.py::test_gemma_norm",
        *(f"tests/utils/test_norm.py::test_many[{i}]" for i in range(60)),
    }
    assert {line.removeprefix("newly failing: ") for line in listed.read_text().splitlines()} == expected


def test_bad_counts_are_usage_errors(ws):
    root, _, env = ws
    done = upstream(root, env, "norm", "--gpus", "0")
    assert done.returncode == 2 and "--gpus '0' is not a whole number from 1" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_the_benchmark_times_one_and_two_gpus(ws):
    root, _, env = ws
    for rel in ("attention/test_rope.py", "attention/test_page.py"):
        write(root, rel, "import time\ndef test_slow():\n    time.sleep(2)\n")
    done = subprocess.run(
        [sys.executable, str(root / "tools/bench_upstream.py"), "rope", "page"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        line.split()[0]: line.split()
        for line in done.stdout.splitlines()
        if line.strip() and line.split()[0] in ("1", "2")
    }
    assert set(rows) == {"1", "2"} and rows["1"][2] == "1.00x", done.stdout
    assert re.fullmatch(r"\d+\.\d\dx", rows["2"][2]), done.stdout  # a figure to judge, not a target asserted here
    # each run names its files' GPU and time: what bounds a run on several GPUs is its longest file
    files = r"\n    \[1/2\] GPU ([01]) tests/attention/test_\w+\.py: 1 passed.* in \d+ s\n    \[2/2\] GPU ([01]) "
    on_two = re.search(r"^  2 GPU\(s\): .*" + files, done.stdout, re.M)
    assert on_two and on_two.group(1) != on_two.group(2), done.stdout  # the two files side by side, a GPU each
    # the counts, from each run's summary.json (upstream-tests --summary FILE), as upstream-tests' count line says them
    assert re.search(
        r"^  1 GPU\(s\): [\d.]+ s, exit 0: upstream-tests: 2 passed, 0 skipped, 0 failed, 0 errors; kernel source \w+; "
        r"2 file\(s\) on 1 GPU\(s\) in [\d.]+ s$",
        done.stdout,
        re.M,
    ), done.stdout
    # one count per command (a GPU host that limits each command to 10 minutes), the modules built by an earlier one
    done = subprocess.run(
        [sys.executable, str(root / "tools/bench_upstream.py"), "--no-warm-up", "--gpus", "2", "rope", "page"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert (
        done.returncode == 0
        and "warm-up" not in done.stdout
        and re.search(r"^  2 GPU\(s\): .*" + files, done.stdout, re.M)
    ), done.stdout
    done = subprocess.run(
        [sys.executable, str(root / "tools/bench_upstream.py"), "--gpus", "1,4", "rope"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert done.returncode == 1 and "--gpus asks for 4 GPUs and this host shows 2" in done.stderr


def test_the_list_counts_each_familys_cases_and_what_they_leave_out(ws):
    root, _, env = ws
    write(root, "gemm/test_fp4.py", "def test_a():\n    pass\ndef test_b():\n    pass\n")  # in no family
    write(root, "utils/test_broken.py", "import cutlass\n")  # does not collect without nvidia-cutlass-dsl
    done = upstream(root, env, "--list")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line and not line.startswith(" ")}
    assert rows["norm"].split()[1:3] == ["2", "cases"] and rows["activation"].split()[1:3] == ["1", "cases"], (
        done.stdout
    )
    assert rows["single_decode"].split()[1:3] == ["0", "cases"]  # the stand-in's file holds none of its test functions
    assert "left out" in done.stdout and "1 more files did not collect here" in done.stdout
    left = next(line for line in done.stdout.splitlines() if line.startswith("left out"))
    # test_fp4's 2, and the 3 placeholders of files the families name by test function; the total is
    # the families' cases and those, as the rows above count them (no number copied from a run)
    families = sum(int(rows[f.name].split()[1]) for f in upstream_suites.FAMILIES)
    assert left.split()[2:6] == ["5", "cases", "of", str(families + 5)], left
    again = upstream(root, env, "--list")
    assert "counting the suite's test cases" not in again.stdout  # counted once while the files stay as they are


def test_failing_tests_are_named_as_pytest_names_them(ws):
    root, _, env = ws
    write(root, "attention/test_rope.py", "def test_bad():\n    assert False\ndef test_fine():\n    pass\n")
    done = upstream(root, env, "rope", "--no-plan")
    assert done.returncode == 1 and "\nFAILED tests/attention/test_rope.py::test_bad\n" in done.stdout, done.stdout


def test_a_files_process_ends_without_the_interpreters_teardown_but_runs_its_exit_handlers(ws, tmp_path):
    """fidev.upstream.runs.PYTEST: what was registered with atexit still runs, an object's finalizer
    at the interpreter's teardown does not (the cost skipped), and the last lines still arrive."""
    root, _, env = ws
    handler, finalizer = tmp_path / "atexit-ran", tmp_path / "finalizer-ran"
    write(
        root,
        "attention/test_rope.py",
        "import atexit\n"
        f"atexit.register(lambda: open('{handler}', 'w').close())\n"
        f"class Kept:\n    def __del__(self):\n        open('{finalizer}', 'w').close()\n"
        "KEPT = Kept()\ndef test_bad():\n    assert False\n",
    )
    done = upstream(root, env, "rope", "--no-plan")
    assert done.returncode == 1 and "\nFAILED tests/attention/test_rope.py::test_bad\n" in done.stdout, done.stdout
    log = next(run_folder(done.stdout).glob("*test_rope*.log")).read_text()
    assert "1 failed" in log.splitlines()[-1], log
    assert handler.exists() and not finalizer.exists()


def test_arguments_pytest_refuses_are_one_usage_error(ws):
    root, _, env = ws
    write(root, "attention/test_rope.py", "def test_fine():\n    pass\n")
    two_line_failure(
        upstream(root, env, "rope", "--no-plan", "--bogus-option"), "pytest refused the arguments", status=2
    )
    two_line_failure(upstream(root, env, "rope", "--no-plan", "-k", "nomatch"), "no upstream-tests test was selected")


@pytest.mark.parametrize(
    "node, plan", [("nosuch", "--no-plan"), ("test_norm[nosuch]", "--no-plan"), ("Nosuch::test_x", "--yes")]
)
def test_a_node_id_its_file_lacks_is_said_so_not_a_refusal_of_pytests_options(ws, node, plan):
    """A node id whose file has no test of that name (pytest's `ERROR: not found:`, status 4) is bad usage
    that names the node id and its file, and how to list the file's tests: not "pytest refused the
    arguments" with a fix about pytest's options. A parametrized id is named whole (pytest drops its [...])."""
    root, _, env = ws
    done = upstream(root, env, f"utils/test_norm.py::{node}", plan)
    two_line_failure(done, f"no such test: tests/utils/test_norm.py::{node}: its file has no test", status=2)
    assert "pytest refused" not in done.stderr and "--collect-only" in done.stderr.splitlines()[-1]


def odd_state(path, kind):
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "a folder" and not path.suffix:  # a folder of its own: a file in its place
        path.write_text("")
    elif kind == "a folder":
        path.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(path)
    else:
        path.symlink_to(path)


@pytest.mark.parametrize("kind", ["a folder", "a FIFO", "a symlink loop"])
@pytest.mark.parametrize(
    "state, args",
    [
        ("fidev-upstream-runs/file-times.json", []),
        ("90/fidev-module-tests.json", []),
        ("90/fidev-module-tests-ran.json", ["--no-plan"]),
        ("fidev-upstream-baselines", ["--baseline"]),
        ("fidev-upstream-runs", ["--no-plan"]),
    ],
)
def test_a_state_file_of_its_own_that_is_no_regular_file_is_refused_before_the_run(ws, kind, state, args):
    """A state file upstream-tests keeps (each file's last time, the record of which tests need each module,
    the baselines and run folders) made a folder, a FIFO or a symlink loop: two lines before the plan or the
    run, naming it and that removing it clears it; never a run that passes every test and then fails with
    a fix about a file the user never named."""
    root, _, env = ws
    write(root, "utils/test_quantization.py", "def test_fine():\n    pass\n")
    version = Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer
    (version / "90/cached_ops").mkdir(parents=True)  # a JIT dir, its records beside it
    odd_state(version / state, kind)
    done = upstream(root, env, "utils/test_quantization.py", *args)
    two_line_failure(done, str(version / state))
    error, fix = done.stderr.strip().splitlines()[-2:]
    assert "upstream-tests' state" in error and "regular file" not in fix.replace("make it a regular file", "")
    assert "remove" in fix and str(version / state) in fix, fix
    assert "passed" not in done.stdout and "the selection needs" not in done.stdout, done.stdout


@pytest.mark.parametrize("args", [["--no-plan"], ["--no-plan", "--baseline"]], ids=["compare", "record"])
def test_a_baseline_that_is_a_folder_is_refused_before_the_run_naming_it(ws, args):
    """The selection's baseline file made a folder: whether the run would compare with it or record it, two
    lines before the run that name it and that removing it clears it (never "record it again", which then
    fails at the run's end)."""
    root, _, env = ws
    write(root, "utils/test_quantization.py", "def test_fine():\n    pass\n")
    ws_ = workspace.read(pins().flashinfer, {"FLASHINFER_WORKSPACE_BASE": env["FLASHINFER_WORKSPACE_BASE"]})
    baseline = ws_.baseline(["utils/test_quantization.py"])
    baseline.mkdir(parents=True)
    done = upstream(root, env, "utils/test_quantization.py", *args)
    two_line_failure(done, f"upstream-tests' state file {baseline} is a folder")
    assert f"remove it (rm -r '{baseline}')" in done.stderr and "passed" not in done.stdout, done.stdout


def test_a_compare_run_counts_an_out_of_memory_skip_as_newly_failing(ws):
    root, _, env = ws
    write(
        root,
        "attention/test_rope.py",
        "import os\ndef test_big():\n    if os.environ.get('FAKE_OOM'):\n"
        "        raise RuntimeError('CUDA out of memory')\ndef test_fine():\n    pass\n",
    )
    assert upstream(root, env, "rope", "--no-plan", "--baseline").returncode == 0
    done = upstream(root, {**env, "FAKE_OOM": "1"}, "rope", "--no-plan")
    assert done.returncode == 1 and "  newly failing: 1\n    tests/attention/test_rope.py::test_big\n" in done.stdout, (
        done.stdout
    )


def test_a_baseline_of_nothing_passed_is_refused(ws):
    root, _, env = ws
    write(root, "attention/test_rope.py", "def test_bad():\n    assert False\n")
    two_line_failure(upstream(root, env, "rope", "--no-plan", "--baseline"), "no test passed: a baseline of nothing")


def test_a_comparison_where_nothing_passed_is_refused(ws):
    """Every test skipped (no GPU) against a baseline that passed: no test newly fails, and still
    nothing was exercised, so the comparison is refused, never a pass."""
    root, _, env = ws
    write(
        root,
        "attention/test_rope.py",
        "import os, pytest\ndef test_fine():\n    if os.environ.get('NO_GPU'):\n        pytest.skip('no GPU')\n",
    )
    assert upstream(root, env, "rope", "--no-plan", "--baseline").returncode == 0
    two_line_failure(
        upstream(root, {**env, "NO_GPU": "1"}, "rope", "--no-plan"),
        "no test passed: a comparison with the baseline of nothing",
    )


def test_an_interrupt_stops_the_running_files(ws, tmp_path):
    root, _, env = ws
    pid_file = tmp_path / "child.pid"
    write(
        root,
        "attention/test_rope.py",
        f"import os, time\ndef test_slow():\n    open('{pid_file}', 'w').write(str(os.getpid()))\n"
        "    time.sleep(120)\n",
    )
    proc = subprocess.Popen(
        [sys.executable, str(root / "scripts/upstream_tests.py"), "rope", "--no-plan"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60, "the test file's process started")
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "error: interrupted: the running test files were stopped" in err, out + err
    child = int(pid_file.read_text())

    def ended() -> bool:  # gone, or a zombie (killed, not yet reaped by init)
        stat = Path(f"/proc/{child}/stat")
        return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"

    wait_until(ended, 10, "the test file's process ended with the run")


def test_the_benchmark_fails_when_its_runs_fail(ws):
    root, _, env = ws
    write(root, "attention/test_rope.py", "def test_bad():\n    assert False\n")
    done = subprocess.run(
        [sys.executable, str(root / "tools/bench_upstream.py"), "rope"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": "0,1"},
    )
    two_line_failure(done, "runs failed (exit 1): the figures above time failing runs")
    hidden = subprocess.run(
        [sys.executable, str(root / "tools/bench_upstream.py"), "rope"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": ""},
    )
    two_line_failure(hidden, "no GPU is visible here")


def test_a_crash_names_the_test_it_died_in_and_a_stale_node_id_is_an_error(ws):
    root, _, env = ws
    write(
        root,
        "utils/test_quantization.py",
        "import os, signal\ndef test_fine():\n    pass\ndef test_crash():\n    os.kill(os.getpid(), signal.SIGSEGV)\n",
    )
    write(
        root,
        "attention/test_rope.py",
        "import pytest\ndef test_a():\n    pass\ndef test_b():\n    pytest.exit('stop')\ndef test_c():\n    pass\n",
    )
    write(root, "attention/test_page.py", "def test_fine():\n    pass\n")
    done = upstream(
        root,
        env,
        "quantization",
        "rope",
        "attention/test_page.py::test_gone",
        "attention/test_page.py::test_fine",
        "--no-plan",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "\nERROR tests/utils/test_quantization.py::test_crash\n" in done.stdout, (
        done.stdout
    )  # the test the process died in
    assert "tests/attention/test_rope.py did not finish: exit 2" in done.stdout  # pytest.exit: test_c never ran
    assert "tests/attention/test_page.py did not finish: exit 4" in done.stdout  # a node id that no longer exists


def test_a_conftest_that_cannot_import_is_said_so(ws):
    root, _, env = ws
    conftest = root / TESTS / "conftest.py"
    conftest.write_text("import flashinfer_is_not_here\n" + conftest.read_text())
    two_line_failure(upstream(root, env, "norm", "--no-plan"), "FlashInfer's tests/conftest.py could not be imported")


def test_a_symlinked_tree_runs(ws, tmp_path):
    root, _, env = ws
    real = tmp_path / "elsewhere"
    (root / "extern/tracked/flashinfer").rename(real)
    (root / "extern/tracked/flashinfer").symlink_to(real)
    write(root, "attention/test_rope.py", "def test_fine():\n    pass\n")
    done = upstream(root, env, "rope", "--no-plan")
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr


def test_a_compare_run_names_tests_no_longer_run(ws):
    root, _, env = ws
    write(root, "attention/test_rope.py", "def test_a():\n    pass\ndef test_b():\n    pass\n")
    assert upstream(root, env, "rope", "--no-plan", "--baseline").returncode == 0
    write(root, "attention/test_rope.py", "def test_a():\n    pass\ndef test_b_renamed():\n    pass\n")
    done = upstream(root, env, "rope", "--no-plan")
    assert done.returncode == 0 and "  not run since: 1\n    tests/attention/test_rope.py::test_b\n" in done.stdout, (
        done.stdout
    )


def test_the_header_names_the_gpus_the_workers_are_pinned_to(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from fidev.upstream import runs as upstream_runs

    # /proc/driver/nvidia/gpus/<PCI bus id>/information, a "Model:" line each, as the driver writes it
    for bus, model in [("0000:19:00.0", "NVIDIA H100 80GB HBM3"), ("0000:3b:00.0", "NVIDIA L40S")]:
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 1\n")
    monkeypatch.setattr(upstream_runs, "GPUS", tmp_path)
    assert upstream_runs.gpu_name(["1"]) == "NVIDIA L40S"
    assert upstream_runs.gpu_name(["0", "1"]) == "NVIDIA H100 80GB HBM3, NVIDIA L40S"
    assert upstream_runs.gpu_name(["0", "0"]) == "2x NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_gated_run_collects_then_waits_until_the_gate_says_go(ws, tmp_path, workers):
    """`affected` starts FlashInfer's tests while it builds their modules (fidev.upstream.gate):
    each file's process (each xdist worker) imports and collects, then runs nothing until the gate
    file says go, having made its CUDA context while it waited. A gate whose owner is gone ends the
    run instead of leaving it waiting."""
    from fidev.upstream import gate as upstream_gate
    from fidev.upstream.settings import Settings

    if workers:
        require(
            "xdist", why="affected spreads many cases over pytest-xdist processes (pytest-xdist is in flashinfer-dev)"
        )
    root, _, env = ws
    collected, ran, gate, context = tmp_path / "collected", tmp_path / "ran", tmp_path / "gate", tmp_path / "context"
    waiting = tmp_path / "waiting"
    # torch as the file's imports bring it, a stand-in for the two calls the plugin makes, which says when the context
    # was made
    torch = (
        f"import sys, types\ntorch = sys.modules['torch'] = types.ModuleType('torch')\n"
        f"torch.cuda = types.SimpleNamespace(is_available=lambda: True)\n"
        f"torch.empty = lambda *shape, device=None: open('{context}', 'w').write(str(device))\n"
    )
    # the rendezvous: the gate asks whether its owner lives each time it finds itself closed, so a second
    # asking is a process that read the gate closed, waited, and read it closed again; it says so in `waiting`
    rendezvous = (
        f"gate = sys.modules[{upstream_gate.__name__!r}]\nasked = []\n"
        f"def owner_alive(owner, alive=gate.owner_alive):\n"
        f"    asked.append(owner)\n"
        f"    if len(asked) == 2:\n"
        f"        open('{waiting}', 'w').close()\n"
        f"    return alive(owner)\n"
        f"gate.owner_alive = owner_alive\n"
    )
    write(
        root,
        "attention/test_rope.py",
        f"{torch}{rendezvous}open('{collected}', 'w').close()\ndef test_fine():\n    open('{ran}', 'w').close()\n",
    )
    gated = {**os.environ, **env, **Settings(gate=gate, gate_owner=upstream_gate.process_identity(os.getpid())).env()}

    def waiting_at_the_gate() -> subprocess.Popen:
        """upstream-tests behind the gate, once its file's process has collected (imported the file) and
        waits at the gate: it found it closed twice. A process that does not wait there ends first, or
        never says so: either fails here, within the deadline."""
        proc = subprocess.Popen(
            [sys.executable, str(root / "scripts/upstream_tests.py"), "rope", "--no-plan", *workers],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=gated,
        )
        wait_until(waiting.exists, 60, "the file's process waits at the gate", proc=proc)
        return proc

    proc = waiting_at_the_gate()
    assert collected.exists() and not ran.exists() and proc.poll() is None, "the test ran before the gate opened"
    assert context.is_file() and context.read_text() == "cuda", "the CUDA context was not made before the gate"
    opened = time.time()
    upstream_gate.open_gate(gate)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "upstream-tests: 1 passed" in out and ran.exists(), out
    # when the last case ended, for affected's PAST_BUILD line: after the gate opened, before the run ended
    assert opened <= upstream_runs.last_case_end(run_folder(out)) <= time.time(), out
    for made in (gate, context, ran, collected, waiting):
        made.unlink()
    # the owner dies while they wait; unreaped, it is a zombie, which must not count as alive
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    gated.update(Settings(gate=gate, gate_owner=upstream_gate.process_identity(owner.pid)).env())
    proc = waiting_at_the_gate()
    owner.kill()
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        owner.wait()
    assert proc.returncode != 0 and not ran.exists(), out
    log = next(run_folder(out).glob("*.log")).read_text()
    # under xdist the worker takes its file's process group down at once (signal 9), before xdist replaces it
    assert "is gone before they could run" in log if not workers else "did not finish: signal 9" in out, out + log


@pytest.mark.parametrize(
    ("workers", "in_parts"),
    [([], False), (["-n", "2"], False), (["-n", "2"], True), (["--per-gpu", "2"], False)],
    ids=["one process", "xdist", "xdist, in parts", "two processes a GPU"],
)
def test_a_gate_that_names_tests_runs_only_those(ws, tmp_path, workers, in_parts):
    """A Python edit: affected starts the tests of every module it may change, then names at the
    gate those of the modules it did (a function for all its cases, or a node id). The rest are
    deselected; a file left with none ends "no tests ran", which counts as finished, not failed.
    A long file's parts (one per GPU) each take their share of the file first, then the gate's."""
    from fidev.upstream import gate as upstream_gate
    from fidev.upstream.settings import Settings

    if "-n" in workers:
        require("xdist", why="upstream-tests passes -n on to pytest-xdist (pytest-xdist is in flashinfer-dev)")
    root, _, env = ws
    if in_parts:
        times = workspace.Workspace(Path(env["FLASHINFER_WORKSPACE_BASE"]), pins().flashinfer).file_times
        times.parent.mkdir(parents=True)
        times.write_text('{"tests/attention/test_rope.py": 25.0}')
        env = {**env, "CUDA_VISIBLE_DEVICES": "3,5"}
    write(
        root,
        "attention/test_rope.py",
        "import pytest\n@pytest.mark.parametrize('i', range(3))\ndef test_a(i):\n    pass\n"
        "def test_ab():\n    pass\ndef test_b():\n    assert False\n",
    )
    write(root, "attention/test_pos.py", "def test_other():\n    assert False\n")
    gate = tmp_path / "gate"
    upstream_gate.open_gate(gate, ["tests/attention/test_rope.py::test_a", "tests/attention/test_rope.py::test_b"])
    gated = {**env, **Settings(gate=gate, gate_owner=upstream_gate.process_identity(os.getpid())).env()}
    done = upstream(root, gated, "tests/attention/test_rope.py", "tests/attention/test_pos.py", "--no-plan", *workers)
    assert "upstream-tests: 3 passed, 0 skipped, 1 failed, 0 errors" in done.stdout, done.stdout + done.stderr
    assert "FAILED tests/attention/test_rope.py::test_b" in done.stdout and "test_other" not in done.stdout, done.stdout
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert ("(part 2 of 2)" in done.stdout) == (in_parts or "--per-gpu" in workers), done.stdout


def test_per_gpu_runs_each_file_in_as_many_parts_on_each_gpu_at_once(ws, tmp_path):
    """`--per-gpu N` (affected's, for many cases): N processes on each GPU at once, each a part of
    the file; a long file's part per GPU is split N ways again. Each case runs once, and no time is
    kept (parts that share a GPU do not sum to the file's time)."""
    root, _, env = ws
    seen = tmp_path / "seen"
    seen.mkdir()
    # each case waits, up to 60 s, until the other process on its GPU has started a case: they get
    # through only where both run at once (no clock compared)
    write(
        root,
        "attention/test_rope.py",
        "import os, pathlib, time, pytest\n@pytest.mark.parametrize('i', range(8))\ndef test_case(i):\n"
        "    gpu = os.environ['CUDA_VISIBLE_DEVICES']\n"
        f"    pathlib.Path('{seen}', f'start-{{gpu}}-{{os.getpid()}}').touch()\n"
        "    deadline = time.monotonic() + 60\n"
        f"    while len(list(pathlib.Path('{seen}').glob(f'start-{{gpu}}-*'))) < 2:\n"
        "        assert time.monotonic() < deadline, 'the other process on this GPU never started a case'\n"
        "        time.sleep(0.05)\n"
        f"    pathlib.Path('{seen}', str(i)).write_text(f'{{gpu}} {{os.getpid()}}')\n",
    )
    times = workspace.Workspace(Path(env["FLASHINFER_WORKSPACE_BASE"]), pins().flashinfer).file_times
    times.parent.mkdir(parents=True)
    times.write_text('{"tests/attention/test_rope.py": 25.0}')  # long: a part per GPU, then 2 a GPU
    done = upstream(root, {**env, "CUDA_VISIBLE_DEVICES": "3,5"}, "rope", "--no-plan", "--per-gpu", "2")
    assert done.returncode == 0 and "upstream-tests: 8 passed, 0 skipped, 0 failed, 0 errors" in done.stdout, (
        done.stdout + done.stderr
    )
    assert "1 file(s), in 2 parts a GPU, 2 processes on each GPU at once, on 2 GPU(s)" in done.stdout, done.stdout
    assert "(part 4 of 4)" in done.stdout
    ran = [p.read_text().split() for p in seen.iterdir() if not p.name.startswith("start-")]
    assert len(ran) == 8 and len({pid for _, pid in ran}) == 4
    assert sorted(len({pid for g, pid in ran if g == gpu}) for gpu in ("3", "5")) == [
        2,
        2,
    ]  # two processes a GPU, at once (above)
    assert upstream_runs.load_times(times) == {"tests/attention/test_rope.py": 25.0}
    two_line_failure(
        upstream(root, env, "rope", "--no-plan", "--per-gpu", "0"),
        "--per-gpu '0' is not a whole number from 1",
        status=2,
    )


def test_the_suites_processes_leave_out_hypothesiss_plugin(ws, tmp_path):
    """FlashInfer's suite does not use hypothesis; its pytest plugin imports hypothesis at every
    session's end where it is installed (upstream_runs.UNUSED_PLUGINS), so both the plan's dry run
    and the run's processes block it."""
    from fidev.upstream import settings as upstream_settings

    root, _, env = ws
    seen = tmp_path / "seen"
    seen.mkdir()
    write(
        root,
        "attention/test_rope.py",
        "import os\ndef test_blocked(pytestconfig):\n"
        f"    where = 'dry' if os.environ.get('{upstream_settings.DRY_RUN_DIR}') else 'run'\n"
        f"    open('{seen}/' + where, 'w').write(str(pytestconfig.pluginmanager.is_blocked('hypothesispytest')))\n",
    )
    done = upstream(root, env, "rope", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name: p.read_text() for p in seen.iterdir()} == {"dry": "True", "run": "True"}


def test_a_file_over_xdist_processes_counts_each_test_once(ws):
    """affected passes `-n N` for many cases: the file's tests spread over pytest-xdist processes and
    are still counted and named once each (the controller is told of each worker's tests,
    xdist/dsession.py worker_logstart and worker_testreport, and writes their outcomes)."""
    require("xdist", why="affected spreads many cases over pytest-xdist processes (pytest-xdist is in flashinfer-dev)")
    root, _, env = ws
    write(
        root,
        "attention/test_rope.py",
        "import pytest\n@pytest.mark.parametrize('i', range(6))\ndef test_case(i):\n    assert i != 4\n",
    )
    done = upstream(root, env, "rope", "--no-plan", "-n", "2")
    assert "upstream-tests: 5 passed, 0 skipped, 1 failed, 0 errors" in done.stdout, done.stdout + done.stderr
    assert "FAILED tests/attention/test_rope.py::test_case[4]" in done.stdout


@needs_a_build
def test_affected_starts_flashinfers_tests_with_the_build_and_runs_them_on_what_it_built(ws, tmp_path):
    """An edit of a module only FlashInfer's tests use: affected starts their run before it compiles
    (they wait at the gate), opens the gate once the module is built, and counts what they did."""
    require(
        "filelock", why="modules build under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)"
    )
    root, _, env = ws
    done = upstream(root, env, "norm", "--yes")  # its plan records which test needs norm; its run builds norm
    assert done.returncode == 0, done.stdout + done.stderr
    generated = (
        Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/generated/norm/s0.cpp"
    )
    generated.write_text("int f0() { return 7; }\n")
    threads = tmp_path / "threads"  # what the tests' process was given for torch's thread pool
    with open(root / TESTS / "utils/test_norm.py", "a") as test_file:
        test_file.write(f"import os\nopen('{threads}', 'w').write(os.environ.get('OMP_NUM_THREADS', 'unset'))\n")
    scratch = tmp_path / "scratch"  # where affected keeps its gate
    scratch.mkdir()
    user = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    record = tmp_path / "affected.json"
    done = subprocess.run(
        [sys.executable, str(root / "scripts/affected.py"), "--summary", str(record)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**user, **env, "TMPDIR": str(scratch)},
    )
    out = done.stdout
    assert done.returncode == 0 and "Traceback" not in out + done.stderr, out + done.stderr
    assert (
        "affected: FlashInfer's tests (2 recorded case(s)) start now and run, each case once the modules it loads "
        "are rebuilt" in out
    )
    assert (
        out.index("affected: FlashInfer's tests")
        < out.index("affected: 1 module(s) rebuilt")
        < out.index("upstream-tests: 2 passed")
    )
    assert "affected: every selected test passed" in out
    # one process for 2 cases: every core for its thread pool (fidev.affected.theirs.processes)
    assert threads.read_text() == str(os.cpu_count())
    from fidev.affected import summary as affected_summary
    from fidev.affected.theirs import PAST_BUILD

    past = PAST_BUILD.search(out)
    assert past and float(past[2]) <= float(past[1]), out
    done = affected_summary.read(record)  # the same result, from the file the acceptance run reads
    assert (done.verdict, done.status, done.modules, done.rebuilt, done.failed) == (
        "passed",
        0,
        {"norm"},
        ["norm"],
        [],
    ), done
    assert done.past_build == {"ended_s": float(past[1]), "last_case_s": float(past[2]), "first_failure_s": None}, done
    assert list(scratch.iterdir()) == [], "the gate's folder was left behind"
    assert "nothing changed" in affected(root, env).stdout


@needs_a_build
def test_under_xdist_the_workers_lines_are_said_by_the_file_at_its_end(ws):
    """An xdist worker has no terminal: its compile lines, and which modules ran from edited source,
    come out through the controller when the file is done."""
    require(
        "xdist", "filelock", why="affected spreads many cases over pytest-xdist processes (both are in flashinfer-dev)"
    )
    root, _, env = ws
    done = upstream(root, env, "norm", "--no-plan", "-n", "2")
    assert done.returncode == 0 and "upstream-tests: 2 passed" in done.stdout, done.stdout + done.stderr
    assert "tests/utils/test_norm.py: compiling norm (3 sources)" in done.stdout, done.stdout


GENS = """\
from flashinfer.jit import core
BODY = {"norm": "int f{i}() {{ return {i}; }}\\n"}
def gen_module(name, n):  # a generator that renders its sources from strings of its own, as \
flashinfer/jit/activation.py does
    spec = core.gen_jit_spec(name, n)
    for i, src in enumerate(spec.sources):
        body = BODY.get(name, "int g{i}() {{ return -{i}; }}\\n").format(i=i)
        if src.read_text() != body:
            src.write_text(body)
    return spec
"""
# norm and rope by the generator; `plain` by a test's own gen_jit_spec of csrc/ files, as
# tests/utils/test_norm.py builds norm_without_fp8_test (lines 342-366 at v0.6.3)
TEST_NORM_GENERATED = """\
import flashinfer
from flashinfer.jit import core
def test_norm():
    assert flashinfer.load("norm", 3) == "jit"
def test_gemma_norm():
    assert flashinfer.load("norm", 3) == "jit"
def test_rope():
    assert flashinfer.load("rope", 1) == "jit"
def test_plain():
    assert core.gen_jit_spec("plain", 1, plain=True).build_and_load() == "jit"
"""


def generated_by_the_tree(ws, *more: tuple[str, str]):
    """The stand-in package moved into the tree, its modules' sources rendered by the tree's generator gens.py
    (GENS), test_norm.py's tests TEST_NORM_GENERATED, and `more` ((path in the tree, text), ...) written, all as
    the release's: (root, record, env, tree), env putting the tree's package first."""
    require(
        "filelock", why="modules build under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)"
    )
    root, record, env = ws
    tree = root / "extern/tracked/flashinfer"
    site = Path(env["PYTHONPATH"])
    shutil.move(site / "flashinfer", tree / "flashinfer")
    (tree / "flashinfer/jit/gens.py").write_text(GENS)
    # the JIT source dirs an import checks for (flashinfer/jit/env.py, lines 146-153 at v0.6.3), as the editable
    # install's data/ links
    with open(tree / "flashinfer/jit/env.py", "a") as jit_env:
        jit_env.write(
            "FLASHINFER_INCLUDE_DIR = FLASHINFER_CSRC_DIR = SPDLOG_INCLUDE_DIR = pathlib.Path(__file__).parent\n"
            "CUTLASS_INCLUDE_DIRS = [pathlib.Path(__file__).parent]\n"
        )
    init = tree / "flashinfer/__init__.py"
    by_generator = "    from flashinfer.jit import gens\n    return gens.gen_module(name, n)"
    init.write_text(init.read_text().replace("    return core.gen_jit_spec(name, n)", by_generator))
    (tree / "tests/utils/test_norm.py").write_text(TEST_NORM_GENERATED)
    for rel, text in more:
        (tree / rel).write_text(text)
    release_reference.record_release(tree)  # the stand-in package is the release's: an edit after this is the edit
    return root, record, {**env, "PYTHONPATH": os.pathsep.join([str(tree), str(site)])}, tree


@needs_a_build
def test_affected_regenerates_by_the_recorded_generator_call_without_a_dry_run(ws):
    """A generator's edit: affected makes each module's recorded call again (no dry run of a test,
    which would import flashinfer in a process of its own), finds the module whose sources changed,
    rebuilds it and runs its tests. FlashInfer's tests of every module with generated sources start
    before the regeneration, and the gate lets only the changed module's run. A module of csrc/
    files alone is left as built: no dry run for it. The stand-in package is the tree's own here,
    so that its generator is one of the tree's Python files."""
    root, record, env, tree = generated_by_the_tree(ws)
    done = upstream(
        root, env, "norm", "--yes"
    )  # the plan records which test needs which module; the run builds them, and keeps calls
    assert done.returncode == 0 and "upstream-tests: 4 passed" in done.stdout, done.stdout + done.stderr
    gens = tree / "flashinfer/jit/gens.py"
    gens.write_text(GENS.replace("return {i}; }}", "return {i} + 1; }}"))  # norm's body alone
    imports = len(record.read_text().splitlines())
    done = affected(root, env)
    out = done.stdout
    assert done.returncode == 0 and "Traceback" not in out + done.stderr, out + done.stderr
    assert "affected: FlashInfer's tests of the modules the edit may change (3 recorded case(s)) start now" in out, out
    assert "(2 by recorded call, 1 of csrc/ files alone, as built)" in out, out
    assert out.index("start now") < out.index("affected: regenerated in")
    assert (
        "gens.py -> s0.cpp" in out and "affected: 1 module(s) rebuilt" in out and "upstream-tests: 2 passed" in out
    ), out
    assert "could not be regenerated" not in out and "dry run" not in out
    from fidev.affected.theirs import PAST_BUILD

    assert PAST_BUILD.search(out), out
    # flashinfer imported twice: affected itself, and the run of the tests it started before the regeneration; a
    # dry run would be a third, and so would a second run of the tests, where the rebuild is not handed those
    assert len(record.read_text().splitlines()) - imports == 2, record.read_text()
    assert "nothing changed" in affected(root, env).stdout


# norm's two tests fail once gens.py holds the edit of the test below (norm's body + 1), and pass before it
TEST_NORM_FAILING_ON_THE_EDIT = """\
import flashinfer
from flashinfer.jit import core, gens
def edited():
    return "+ 1" in open(gens.__file__).read()
def test_norm():
    assert flashinfer.load("norm", 3) == "jit" and not edited()
def test_gemma_norm():
    assert flashinfer.load("norm", 3) == "jit" and not edited()
def test_rope():
    assert flashinfer.load("rope", 1) == "jit"
def test_plain():
    assert core.gen_jit_spec("plain", 1, plain=True).build_and_load() == "jit"
"""


@needs_a_build
@pytest.mark.parametrize("keep_going", [False, True])
def test_flashinfers_tests_a_generator_edit_started_stop_at_their_first_failing_case_unless_keep_going(ws, keep_going):
    """FlashInfer's tests a generator's edit starts before the regeneration, a sample of their cases, end at their
    first failing case (upstream-tests --stop-after 1), as those of any other edit do; with --keep-going every case
    of the sample runs."""
    root, _, env, tree = generated_by_the_tree(ws, ("tests/utils/test_norm.py", TEST_NORM_FAILING_ON_THE_EDIT))
    done = upstream(root, env, "norm", "--yes")  # builds norm, rope and plain, and keeps their calls
    assert done.returncode == 0 and "upstream-tests: 4 passed" in done.stdout, done.stdout + done.stderr
    (tree / "flashinfer/jit/gens.py").write_text(GENS.replace("return {i}; }}", "return {i} + 1; }}"))
    done = affected(root, env, *(["--keep-going"] if keep_going else []))
    out = done.stdout
    assert done.returncode == 1 and "Traceback" not in out + done.stderr, out + done.stderr
    assert "FlashInfer's tests of the modules the edit may change" in out, out
    assert ("the first failure ended the run" in out) is not keep_going, out
    assert ("0 skipped, 2 failed, 0 errors" in out) is keep_going, out
    # a sample of their cases, as of any edit but --whole-family's
    assert "(a sample; --whole-family runs every case)" in out, out


@needs_a_build
def test_affected_list_regenerates_a_generator_edit_and_starts_none_of_flashinfers_tests(ws):
    """--list over a generator's edit regenerates (compiling nothing) to name the changed module, and starts
    no FlashInfer test: those of the modules the edit may change start early only for a run that tests."""
    root, _, env, tree = generated_by_the_tree(ws)
    done = upstream(root, env, "norm", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    (tree / "flashinfer/jit/gens.py").write_text(GENS.replace("return {i}; }}", "return {i} + 1; }}"))
    done = affected(root, env, "--list")
    out = done.stdout
    assert done.returncode == 0 and "Traceback" not in out + done.stderr, out + done.stderr
    assert "affected: regenerated in" in out and "gens.py -> s0.cpp" in out, out
    assert "FlashInfer's tests" not in out and "upstream-tests:" not in out, out


@needs_a_build
def test_a_generator_edit_listed_then_reverted_leaves_nothing_changed(ws, tmp_path):
    """--list regenerates to name what an edit changes, compiling nothing; reverted (cp -p) after it, the
    tree is as built: a pass (0), and no module holds what --list regenerated."""
    root, _, env, tree = generated_by_the_tree(ws)
    done = upstream(root, env, "norm", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    saved = tmp_path / "gens.py"
    shutil.copy2(tree / "flashinfer/jit/gens.py", saved)
    (tree / "flashinfer/jit/gens.py").write_text(GENS.replace("return {i}; }}", "return {i} + 1; }}"))
    done = affected(root, env, "--list")
    assert done.returncode == 0 and "gens.py -> s0.cpp" in done.stdout, done.stdout + done.stderr
    shutil.copy2(saved, tree / "flashinfer/jit/gens.py")  # cp -p: reverted
    done = affected(root, env)
    assert done.returncode == 0, done.stdout + done.stderr
    sources = list(Path(env["FLASHINFER_WORKSPACE_BASE"]).rglob("generated/norm/s*.cpp"))
    assert sources and all("+ 1" not in p.read_text() for p in sources), "a regenerated edit is left"


SMOKE_NORM = {  # smoke's and abi-smoke's tests of smoke's norm module (smoke_modules.BY_KEY["norm"].tests), passing
    "smoke/test_kernels.py": "def test_rmsnorm():\n    pass\n\n\ndef test_fused_add_rmsnorm():\n    pass\n",
    "abi_smoke/test_abi.py": "import pytest\n\n\ndef test_norm():\n    pass\n\n\n"
    "def test_bad_norm_call_is_a_decoded_error():\n    pass\n\n\n"
    "@pytest.mark.parametrize('op', ['norm.rmsnorm', 'norm.gemma_rmsnorm'])\n"
    "def test_runtime_signature_equals_the_source(op):\n    pass\n",
}


@needs_a_build
def test_a_generator_edit_rebuilds_smokes_module_by_its_regenerated_jitspec(ws):
    """smoke's norm (named in build's stamp) made by its generator, flashinfer/jit/norm.py's gen_norm_module, as
    smoke_modules makes it: an edit of the generator that changes its source and adds three is rebuilt by the
    JitSpec the regeneration made (its ninja file written again: four objects compiled), not by the module as
    built, whose ninja file names one source only."""
    norm_py = "from flashinfer.jit import gens\ndef gen_norm_module():\n    return gens.gen_module('norm', 1)\n"
    root, _, env, tree = generated_by_the_tree(ws, ("flashinfer/jit/norm.py", norm_py))
    shutil.copytree(ROOT / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in SMOKE_NORM.items():
        (root / "tests" / rel).write_text(text)
    probe = root / "build_norm.py"
    probe.write_text("from flashinfer.jit.norm import gen_norm_module\ngen_norm_module().build(False)\n")
    built = run_probe(probe, root, env)  # built as build builds it, then named in its stamp
    assert built.returncode == 0, built.stdout + built.stderr
    ws_now = workspace.Workspace(Path(env["FLASHINFER_WORKSPACE_BASE"]), pins().flashinfer)
    (jit_dir,) = ws_now.jit_dirs()
    norm = jit_dir / "norm"
    module_builds.record_build(norm, norm / "build.ninja", tree=tree)
    sources = [ws_now.version_dir / "90/generated/norm/s0.cpp"]
    stamped = [build_stamp.Module("norm", "norm", norm, sources)]
    build_stamp.write(ws_now, {"wide": False, "abi": False}, "stamp", stamped)
    gens = tree / "flashinfer/jit/gens.py"
    four = "    n = 4 if name == 'norm' else n\n    spec = "  # norm's body edited, and four sources where it had one
    gens.write_text(GENS.replace("return {i}; }}", "return {i} + 1; }}").replace("    spec = ", four))
    done = affected(root, env, "--summary", str(root / "affected.json"))
    out = done.stdout
    assert done.returncode == 0 and "Traceback" not in out + done.stderr, out + done.stderr
    assert "1 by smoke's generators" in out and "affected: 1 module(s) rebuilt" in out, out
    assert affected_summary.read(root / "affected.json").compiled == {"norm": 4}, out
    assert all(f"s{i}.cpp" in (norm / "build.ninja").read_text() for i in range(4))


def test_a_file_runs_in_parts_over_the_gpus_once_its_last_run_was_long(ws, tmp_path):
    root, _, env = ws
    seen = tmp_path / "seen"
    seen.mkdir()
    write(
        root,
        "attention/test_rope.py",
        "import os, pytest\n@pytest.mark.parametrize('i', range(6))\ndef test_case(i):\n"
        f"    open(f'{seen}/{{i}}', 'w').write(f\"{{os.environ['CUDA_VISIBLE_DEVICES']}} {{os.getpid()}}\")\n"
        "    assert i != 4\n",
    )
    gpus = {**env, "CUDA_VISIBLE_DEVICES": "3,5"}
    done = upstream(root, gpus, "rope", "--no-plan")  # no time kept for it: the file whole, in one process
    assert "1 file(s), a pytest process each, on 2 GPU(s)" in done.stdout and "(part " not in done.stdout, done.stdout
    assert len({p.read_text().split()[1] for p in seen.iterdir()}) == 1
    times = workspace.Workspace(Path(env["FLASHINFER_WORKSPACE_BASE"]), pins().flashinfer).file_times
    assert set(upstream_runs.load_times(times)) == {"tests/attention/test_rope.py"}
    # its last run took 25 s: a part per GPU, every second case each, each case once
    times.write_text('{"tests/attention/test_rope.py": 25.0}')
    shutil.rmtree(seen)
    seen.mkdir()
    done = upstream(root, gpus, "rope", "--no-plan")
    assert (
        "1 file(s), a pytest process each (1 long enough by their last run to go in parts over the GPUs, a "
        "process per part)" in done.stdout
    )
    assert "upstream-tests: 5 passed, 0 skipped, 1 failed, 0 errors" in done.stdout, done.stdout
    assert re.search(
        r"\[\d/2\] GPU [35] tests/attention/test_rope\.py \(part 1 of 2\): 2 passed, 1 failed", done.stdout
    ), done.stdout
    assert re.search(
        r"\[\d/2\] GPU [35] tests/attention/test_rope\.py \(part 2 of 2\): 3 passed, 0 failed", done.stdout
    ), done.stdout
    ran = {int(p.name): p.read_text().split() for p in seen.iterdir()}
    assert sorted(ran) == list(range(6))
    assert {ran[i][1] for i in (0, 2, 4)} != {ran[i][1] for i in (1, 3, 5)}  # two processes: cases 0, 2, 4 and 1, 3, 5
    assert {gpu for gpu, _ in ran.values()} == {"3", "5"}
    folder = run_folder(done.stdout)
    assert sorted(p.name for p in folder.glob("*.xml")) == [
        "tests__attention__test_rope.part1of2.xml",
        "tests__attention__test_rope.part2of2.xml",
    ]
    parts = upstream_summary.read(folder / upstream_summary.NAME).processes  # the run's own record of each part's time
    kept = upstream_runs.load_times(times)["tests/attention/test_rope.py"]
    assert abs(kept - sum(r.seconds for r in parts)) <= 0.051, (kept, parts)  # both parts' time, summed (kept to 0.1 s)
    # a file that does not collect is one error, not one per part
    times.write_text('{"tests/attention/test_rope.py": 25.0}')
    write(root, "attention/test_rope.py", "def test_case(:\n")
    done = upstream(root, gpus, "rope", "--no-plan")
    assert "upstream-tests: 0 passed, 0 skipped, 0 failed, 1 errors" in done.stdout, done.stdout
    assert done.returncode == 1
    # parts that collect different lists (a parametrization that changes from one collection to the next) may miss
    # cases: an error
    times.write_text('{"tests/attention/test_rope.py": 25.0}')
    write(
        root,
        "attention/test_rope.py",
        "import os, pytest\n@pytest.mark.parametrize('i', range(3 + int(os.environ['FIDEV_UPSTREAM_PART'][0])))\n"
        "def test_case(i):\n    pass\n",
    )
    done = upstream(root, gpus, "rope", "--no-plan")
    assert done.returncode == 1 and ", 0 failed, 1 errors" in done.stdout, done.stdout
    assert "tests/attention/test_rope.py: its parts collected different lists of tests" in done.stdout
    assert (
        "upstream-tests: fix: run it alone, whole: upstream-tests tests/attention/test_rope.py --gpus 1" in done.stdout
    )


def test_a_file_takes_a_part_per_gpu_as_far_as_each_gets_ten_seconds():
    assert [upstream_runs.parts(s, 2) for s in (None, 0, 9.9, 19.9, 20, 317)] == [1, 1, 1, 1, 2, 2]
    assert [upstream_runs.parts(s, 8) for s in (25, 79, 80, 3600)] == [2, 7, 8, 8]
    assert upstream_runs.parts(3600, 1) == upstream_runs.parts(3600, 0) == 1


@needs_a_build
def test_a_build_is_recorded_before_its_module_lock_is_let_go(ws, tmp_path):
    """The plugin's JitSpec.build keeps the module's lock (FlashInfer's JitSpec.lock_path) from its
    guard against a `cp -p` restore to the record of what it built: a part of the same file on
    another GPU that took the lock in between would take the fresh objects for a restored copy,
    delete them and build the module again while this process loads it."""
    require(
        "filelock", why="modules build under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)"
    )
    root, _, env = ws
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from filelock import FileLock, Timeout\n"
        "from fidev.builds import module_builds; from fidev.upstream import plugin as upstream_plugin\n"
        "import flashinfer\n"
        "held, record = [], module_builds.record_build\n"
        "def recording(build_dir, *args, **kwargs):\n"
        "    try:\n"
        "        FileLock(spec.lock_path, thread_local=False).acquire(timeout=0).lock.release()\n"
        "        held.append(False)\n"
        "    except Timeout:\n"
        "        held.append(True)\n"
        "    return record(build_dir, *args, **kwargs)\n"
        "module_builds.record_build = recording\n"
        "from fidev.upstream.settings import Settings\n"
        f"plugin = upstream_plugin.Builds(Settings(outcomes={str(tmp_path / 'outcomes.jsonl')!r}))\n"
        "plugin.say = lambda line: None\n"
        "plugin.pytest_collection_finish(None)\n"
        "spec = flashinfer.gen('norm', 1)\n"
        "spec.build(False)  # need_lock=True: the plugin takes the lock itself\n"
        "plugin.pytest_runtest_logfinish('probe', None)  # the case has run: what it loaded is written\n"
        "print('held' if held == [True] else f'let go: {held}')\n"
    )
    done = run_probe(probe, root, env)
    assert done.stdout.strip() == "held", done.stdout + done.stderr
    assert (tmp_path / "outcomes.jsonl.loaded.jsonl").is_file(), "the module the probe loaded was not noted"


def test_a_baseline_that_cannot_be_read_is_two_lines(ws):
    """A truncated baseline is never read as none: the run would pass for a comparison it is not."""
    root, _, env = ws
    write(root, "utils/test_norm.py", "def test_fine():\n    pass\n")
    done = upstream(root, env, "norm", "--no-plan", "--baseline")
    assert done.returncode == 0, done.stdout + done.stderr
    baseline = next(
        (
            Path(env["FLASHINFER_WORKSPACE_BASE"])
            / ".cache/flashinfer"
            / pins().flashinfer
            / "fidev-upstream-baselines"
        ).glob("*.json")
    )
    baseline.write_text(baseline.read_text()[:50])
    two_line_failure(upstream(root, env, "norm", "--no-plan"), f"the baseline {baseline} cannot be read")


# a part's cases: case 0 (part 1) fails at once; case 1 (part 2) fails once part 1's failure is in
# the run's shared file; case 2 (part 1) passes once both are: each part's own count stays at 1, so
# only the count across both parts stops them at --stop-after 2 (the file is the plugin's STOP_FILE)
ACROSS_PARTS = """\
import os, pathlib, time, pytest
def failures(n):
    shared = pathlib.Path(os.environ['FIDEV_UPSTREAM_STOP_FILE'])
    deadline = time.monotonic() + 60
    while len(set(shared.read_text().split()) if shared.exists() else ()) < n:
        assert time.monotonic() < deadline, f'the run never named {n} failing case(s)'
        time.sleep(0.05)
@pytest.mark.parametrize('i', range(20))
def test_case(i):
    if i == 0:
        assert False, 'the first failure'
    if i == 1:
        failures(1)
        assert False, 'the second failure'
    if i == 2:
        failures(2)
"""


def test_stop_after_counts_failures_across_parts_and_stops_them_all(ws, tmp_path):
    """--stop-after N: the run's failing cases are counted over all its processes (two parts of one
    file, on two GPUs); at N both parts stop, the file after them never starts, each failure is named
    with the command that reruns it alone, and the run fails, its summary saying it stopped early."""
    root, _, env = ws
    write(root, "attention/test_rope.py", ACROSS_PARTS)
    write(root, "attention/test_page.py", "def test_never():\n    pass\n")
    times = workspace.Workspace(Path(env["FLASHINFER_WORKSPACE_BASE"]), pins().flashinfer).file_times
    times.parent.mkdir(parents=True)
    times.write_text('{"tests/attention/test_rope.py": 25.0}')  # long: a part per GPU
    summary = tmp_path / "summary.json"
    done = upstream(
        root,
        {**env, "CUDA_VISIBLE_DEVICES": "3,5"},
        "rope",
        "page",
        "--no-plan",
        "--stop-after",
        "2",
        "--summary",
        str(summary),
    )
    out = done.stdout
    assert done.returncode == 1 and "Traceback" not in out + done.stderr, out + done.stderr
    assert "upstream-tests: stopped early: the run's failing cases reached --stop-after 2" in out, out
    for i in (0, 1):
        node = f"tests/attention/test_rope.py::test_case[{i}]"
        assert (
            f"upstream-tests: FAILED {node}: rerun: pixi run -e flashinfer-dev upstream-tests --no-plan '{node}'" in out
        ), out
    record = upstream_summary.read(summary)
    assert record.stopped_early and record.stop_after == 2 and record.status == 1, record
    assert record.failing == [
        "tests/attention/test_rope.py::test_case[0]",
        "tests/attention/test_rope.py::test_case[1]",
    ], record
    assert record.counts["failed"] == 2 and record.counts["error"] == 0, record
    # case 2 passed, or the stop interrupted it: either way the other 17 of rope's 20 did not run
    assert record.counts["passed"] + record.not_run == 18 and record.not_run >= 17, record
    ended = {(p.file, tuple(p.part)): p.ended for p in record.processes}
    assert ended == {
        ("tests/attention/test_rope.py", (1, 2)): "stopped early",
        ("tests/attention/test_rope.py", (2, 2)): "stopped early",
        ("tests/attention/test_page.py", (1, 1)): "not started",
    }, ended
    assert record.not_counted == ["tests/attention/test_page.py"], record
    assert record.first_failure_s is not None and 0 <= record.first_failure_s <= record.ended - record.started, record
    assert "test_never" not in (run_folder(out) / "failing.txt").read_text()
    # a baseline keeps every case's outcome: no early stop for it
    two_line_failure(
        upstream(root, env, "rope", "--no-plan", "--stop-after", "2", "--baseline"),
        "--stop-after with --baseline",
        status=2,
    )


def test_a_run_without_failures_is_not_stopped_and_has_no_first_failure(ws, tmp_path):
    root, _, env = ws
    write(root, "attention/test_rope.py", "def test_fine():\n    pass\n")
    summary = tmp_path / "summary.json"
    done = upstream(root, env, "rope", "--no-plan", "--stop-after", "1", "--summary", str(summary))
    assert done.returncode == 0 and "stopped early" not in done.stdout, done.stdout + done.stderr
    record = upstream_summary.read(summary)
    assert (record.stopped_early, record.not_run, record.not_counted, record.first_failure_s) == (False, 0, [], None), (
        record
    )


FIRST_CASE = {  # how the file's first case ends: the first three fail the run, the last does not
    "a failure": "    assert False\n",
    "an out-of-memory skip": "    raise RuntimeError('CUDA error: out of memory')\n",  # the conftest's OOM skip
    "a missing-JIT skip": "    from flashinfer.jit.core import MissingJITCacheError\n"
    "    raise MissingJITCacheError('JIT compilation is disabled')\n",  # the conftest's missing-module skip
    "an ordinary skip": "    pytest.skip('needs sm_100')\n",
}


SKIPPED_AS = {"an out-of-memory skip": {"out of memory": 1}, "a missing-JIT skip": {"JIT module missing": 1}}


@pytest.mark.parametrize("first", FIRST_CASE)
def test_a_skip_that_fails_the_run_counts_toward_stop_after_as_a_failure_does_and_an_ordinary_skip_does_not(
    ws, tmp_path, first
):
    """--stop-after 1 and a file whose first case fails, or skips as FlashInfer's conftest turns an
    out-of-memory error or a missing JIT module into a skip: the run stops there, the three cases after
    it not run, and it names that case as failing. A skip for a feature the GPU lacks fails nothing:
    the cases after it run."""
    root, _, env = ws
    write(
        root,
        "attention/test_rope.py",
        f"import pytest\ndef test_first():\n{FIRST_CASE[first]}"
        "@pytest.mark.parametrize('i', range(3))\ndef test_after(i):\n    pass\n",
    )
    summary = tmp_path / "summary.json"
    done = upstream(root, env, "rope", "--no-plan", "--stop-after", "1", "--summary", str(summary))
    out, record = done.stdout, upstream_summary.read(summary)
    if first == "an ordinary skip":
        assert done.returncode == 0 and "stopped early" not in out, out + done.stderr
        assert not record.stopped_early and record.not_run == 0 and record.counts["passed"] == 3, record
        return
    assert done.returncode == 1 and "Traceback" not in out + done.stderr, out + done.stderr
    assert "upstream-tests: stopped early: the run's failing cases reached --stop-after 1" in out, out
    assert record.stopped_early and record.failing == ["tests/attention/test_rope.py::test_first"], record
    assert record.not_run == 3 and record.counts["passed"] == 0, record
    assert record.skips == SKIPPED_AS.get(first, {}), record  # each skip as the conftest made it


def test_a_summary_whose_final_write_fails_is_two_lines_and_keeps_the_runs_status(ws, tmp_path):
    """--summary FILE checked before the run, its write at the end failing (the file system read-only
    since): two lines naming it and the OS error, the run's status (1: a case failed), no traceback."""
    root, _, env = ws
    write(root, "attention/test_rope.py", "def test_fine():\n    pass\n\ndef test_off():\n    assert False\n")
    (tmp_path / "out").mkdir()
    summary = tmp_path / "out" / "summary.json"
    done = upstream(root, final_write_fails(tmp_path, summary, env), "rope", "--no-plan", "--summary", str(summary))
    expect_unwritten(done, summary, ended="the run itself ended with status 1")
    assert "1 failed" in done.stdout, done.stdout


def test_a_long_run_says_its_progress_in_a_log(ws, tmp_path):
    """Where the output is not a terminal, a progress line every --progress seconds: the cases done
    of those to run, the failures so far, the time spent and left, from the processes' files."""
    root, _, env = ws
    release = tmp_path / "release"
    write(
        root,
        "attention/test_rope.py",
        "import pathlib, time\ndef test_first():\n    assert False\ndef test_held():\n"
        "    deadline = time.monotonic() + 60\n"
        f"    while not pathlib.Path('{release}').exists():\n"
        "        assert time.monotonic() < deadline, 'never released'\n        time.sleep(0.05)\n",
    )
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(root / "scripts/upstream_tests.py"), "rope", "--no-plan", "--progress", "0.2"],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env},
        )
    try:
        said = "upstream-tests: progress: 1 of 2 cases done, 1 failed, "
        wait_until(lambda: said in log.read_text(), 120, "a progress line with the first case done", proc)
    finally:
        release.touch()
        proc.wait(timeout=120)
    text = log.read_text()
    line = next(line for line in text.splitlines() if line.startswith(said))
    assert re.fullmatch(r".* spent, (about \d+( min \d\d)? s left|time left not known yet)", line), line
    assert "\r" not in text and proc.returncode == 1, text


def test_the_progress_line_says_the_cases_left_and_estimates_the_time():
    from fidev.upstream import progress

    half = progress.Tally(done=50, total=100, failed=2, counted=2, started=2, processes=2)
    assert (
        progress.line(half, 30)
        == "upstream-tests: progress: 50 of 100 cases done, 2 failed, 30 s spent, about 30 s left"
    )
    # two of four processes counted: the others taken to hold as many on average
    some = progress.Tally(done=50, total=100, failed=0, counted=2, started=2, processes=4)
    assert progress.line(some, 60) == (
        "upstream-tests: progress: 50 of 100+ cases done, 0 failed, 1 min 00 s spent, about 3 min 00 s left"
        " (2 of 4 processes started)"
    )
    assert progress.left_s(progress.Tally(total=10, counted=1, processes=1), 5) is None  # nothing done yet: no rate


def test_on_a_terminal_the_progress_line_stays_below_the_other_lines(monkeypatch):
    """fidev.upstream.progress.Board: the line rewritten in place is cleared before a plain line and
    drawn again after it, so that a process's line never lands inside it."""
    import io

    from fidev.upstream import progress

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    board = progress.Board()
    board.say("first")
    board.show("upstream-tests: progress: 1 of 4 cases done")
    board.say("  [1/2] GPU 0 tests/x.py: 1 passed")
    board.show("upstream-tests: progress: 2 of 4 cases done")
    board.clear()
    assert out.getvalue() == (
        "first\n\r\033[Kupstream-tests: progress: 1 of 4 cases done"
        "\r\033[K  [1/2] GPU 0 tests/x.py: 1 passed\nupstream-tests: progress: 1 of 4 cases done"
        "\r\033[Kupstream-tests: progress: 2 of 4 cases done\r\033[K"
    )


def test_a_compare_run_stopped_early_fails_though_nothing_newly_fails(ws):
    """The baseline knows the failure the run stopped at: the comparison finds nothing new, yet the
    cases after it did not run, so the run is no pass, and they are not "not run since"."""
    root, _, env = ws
    write(
        root,
        "attention/test_rope.py",
        "def test_known_broken():\n    assert False\ndef test_fine():\n    pass\ndef test_also():\n    pass\n",
    )
    assert upstream(root, env, "rope", "--no-plan", "--baseline").returncode == 0
    done = upstream(root, env, "rope", "--no-plan", "--stop-after", "1")
    assert done.returncode == 1 and "  newly failing: 0\n" in done.stdout, done.stdout + done.stderr
    assert "  not run since: 0\n" in done.stdout and "upstream-tests: stopped early" in done.stdout, done.stdout


def test_each_process_of_a_run_applies_the_kernel_source_mode_it_was_started_in(tmp_path):
    """The plugin, loaded in a process of the run (FIDEV_UPSTREAM_RUN names its outcomes file, not a
    mode), applies the mode of the environment its parent passed, before flashinfer is imported."""
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); from fidev.upstream import plugin; from fidev.jit "
        "import module_choice;print(module_choice.in_force())"
    )
    for mode in ("vendored", "auto", "prebuilt"):
        done = subprocess.run(
            [sys.executable, "-c", probe, str(ROOT / "scripts")],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "FIDEV_UPSTREAM_RUN": str(tmp_path / "x.jsonl"), "FLASHINFER_DEV_KERNEL_SOURCE": mode},
        )
        assert done.returncode == 0 and done.stdout.strip() == mode, done.stdout + done.stderr


def test_a_failing_case_still_being_written_is_not_counted_yet(tmp_path):
    from fidev.upstream import outcomes as plugin

    shared = tmp_path / "failing-cases"
    shared.write_text("tests/a.py::test_x[1]\ntests/a.py::test_x[2]\ntests/a.py::test_")
    assert plugin.failures_named(shared) == {"tests/a.py::test_x[1]", "tests/a.py::test_x[2]"}


SKIPS = [
    ("Skipping due to OOM", "out of memory", True),  # FlashInfer's conftest's skip of an out-of-memory failure
    ("CUDA out of memory. Tried to allocate 2.00 GiB", "out of memory", True),
    ("Skipping due to missing JIT cache for module: rope", "JIT module missing", True),
    ("sm90 is required", "not supported here", False),
    ("", "not supported here", False),
]


@pytest.mark.parametrize(
    ("message", "kind", "fails"), SKIPS, ids=["oom", "cuda-oom", "missing-jit", "feature", "no-message"]
)
def test_a_skip_fails_the_run_only_where_the_conftest_made_it_of_a_failure(message, kind, fails):
    """skip_kind tells a skip by FlashInfer's conftest's messages, each alone (tests/conftest.py at v0.6.3);
    fails_the_run counts its out-of-memory and missing-module skips as failures, a feature's skip not."""
    from fidev.upstream import outcomes as plugin

    assert plugin.skip_kind(message) == kind
    assert plugin.fails_the_run("skipped", message) is fails
    assert plugin.fails_the_run("passed", message) is False, "only a skip is told by its message"


def test_failures_and_errors_fail_the_run_and_nothing_else_does():
    from fidev.upstream import outcomes as plugin

    assert plugin.fails_the_run("failed") and plugin.fails_the_run("error")
    assert not any(plugin.fails_the_run(outcome) for outcome in ("passed", "skipped", "xfailed", None))


@needs_a_build
def test_a_module_never_built_builds_beside_the_tests(ws, tmp_path):
    """module_builds.build_beside writes a module's ninja file first, as build_specs does: a module
    nothing built before has no folder (affected's smoke modules of the wide tier)."""
    require(
        "filelock", why="modules build under FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)"
    )
    root, _, env = ws
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from fidev.builds import module_builds\n"
        "import flashinfer\n"
        "spec = flashinfer.gen('norm', 1)\n"
        "assert not spec.build_dir.exists()\n"
        "module_builds.build_beside([spec], print, [])\n"
        "print('built' if spec.jit_library_path.exists() else 'not built')\n"
    )
    done = run_probe(probe, root, env)
    assert done.stdout.strip().splitlines()[-1:] == ["built"], done.stdout + done.stderr


def test_an_xdist_worker_that_stops_early_says_so_once(ws):
    """Under pytest-xdist a worker that reached the run's --stop-after skips its remaining cases (its
    session is not stopped): its STOPPED line is written once, not once per case left."""
    require("xdist", why="upstream-tests passes -n on to pytest-xdist (pytest-xdist is in flashinfer-dev)")
    root, _, env = ws
    write(
        root,
        "attention/test_rope.py",
        "import pytest\n@pytest.mark.parametrize('i', range(40))\ndef test_case(i):\n    assert i != 0\n",
    )
    done = upstream(root, env, "rope", "--no-plan", "--stop-after", "1", "-n", "2")
    assert done.returncode == 1 and "stopped early" in done.stdout, done.stdout + done.stderr
    outcomes = next(run_folder(done.stdout).glob("*.jsonl")).read_text().splitlines()
    stopped = [line for line in outcomes if '"outcome": "stopped"' in line]
    assert 1 <= len(stopped) <= 2, stopped  # one line a worker at most
