"""FlashInfer's own suite run the way its CI runs it: one pytest process per test file, "to isolate
CUDA memory issues" (scripts/task_jit_run_tests_part1.sh at v0.6.3), the files spread over the
host's GPUs one worker per GPU pinned with CUDA_VISIBLE_DEVICES (its one-file-per-GPU scheme,
scripts/test_utils.sh at v0.6.17 with PARALLEL_TESTS=true, whose `run_pytest_with_file_timeout` also limits
a file to PYTEST_FILE_TIMEOUT_SECONDS, 7,200 by default),
longest files first, a JUnit XML and a log per file in a run folder.

A run takes at least its longest file (test_sampling.py is most of norm, activation and sampling:
docs/measurements.md, row "longest file: test_sampling.py"), so a file whose last run was long runs in parts,
up to one per GPU and each of PART_MIN_S or more by that time, a process each on a GPU of its own: every part
collects the whole file and runs every k-th case (fidev.upstream.settings.PART). A part is a file's
process as FlashInfer's CI has it, with its own JUnit XML, log and time limit; a file not run
before runs whole.

A file whose process crashes (a segfault, an illegal address) or runs past its limit is reported
for that file and the others go on. Outcomes are read by node id from what fidev.upstream.plugin
writes in each file's process (what a dying process wrote stays). Skips are split by reason, since
FlashInfer's tests/conftest.py turns two failures into skips (`pytest_runtest_call` at v0.6.3): "Skipping
due to OOM" and "Skipping due to missing JIT cache for module: ...". Those two fail the run; any
other skip is the hardware or the build lacking a feature.

A baseline (`--baseline`) keeps each test's outcome, the GPU and the tree's commit for a selection,
outside git, beside FlashInfer's JIT dirs; a later run of the same selection prints only what changed.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.files import MayLack, fits, load_json, parse_json, write_whole
from fidev.core.numbers import digits, whole
from fidev.upstream import outcomes as upstream_outcomes
from fidev.upstream import progress
from fidev.upstream.gate import owner_alive
from fidev.upstream.outcomes import COLLECTED, STOPPED, progress_path, skip_kind
from fidev.upstream.settings import Settings, child_env

FILE_LIMIT_S = 7200
NO_SETTINGS = Settings()  # a run with no sample and no gate
# pytest plugins FlashInfer's suite does not use (no file of tests/ at v0.6.3 names hypothesis), blocked in
# its processes: hypothesis's plugin imports hypothesis at every session's end (_hypothesis_pytestplugin's
# pytest_terminal_summary, hypothesis 6.x), a second or so of each process's end (docs/measurements.md,
# row "hypothesis's plugin at a pytest session's end").
UNUSED_PLUGINS = ["-p", "no:hypothesispytest"]
# pytest as `python -m pytest` runs it (its console_main), then the process's end without the
# interpreter's teardown of torch and flashinfer (fidev.core.failure.exit_now), which came after each
# file's last case and before upstream-tests could count it.
PYTEST = "import pytest\nfrom fidev.core.failure import exit_now\nexit_now(int(pytest.console_main()))"
PART_MIN_S = (
    10  # a part shorter would spend much of itself starting (torch and flashinfer imported, the file collected)
)
GPUS = Path("/proc/driver/nvidia/gpus")
# how run_files' line for each process as it ends begins; bench_upstream says a process's line the same way (from the
# run's summary), and tools/gpu_acceptance.py keeps bench_upstream's lines by it
FILE_LINE = re.compile(r"\s+\[\d+/\d+\] GPU ")
OOM, MISSING_JIT, FEATURE = (
    upstream_outcomes.OOM,
    upstream_outcomes.MISSING_JIT,
    upstream_outcomes.FEATURE,
)  # skip_kind's, FlashInfer's conftest's
SEVERITY = {
    "passed": 0,
    f"skipped: {FEATURE}": 1,
    f"skipped: {OOM}": 2,
    f"skipped: {MISSING_JIT}": 2,
    "failed": 3,
    "error": 4,
}
FAILING = {
    "failed",
    "error",
    f"skipped: {OOM}",
    f"skipped: {MISSING_JIT}",
}  # the two skips: failures FlashInfer's conftest hides


def host_gpus() -> list[str]:
    """The GPUs to pin workers to: CUDA_VISIBLE_DEVICES's entries when set, as CUDA reads them against
    the host's GPUs (cuda_visible: none when it is empty, or -1: the GPUs are hidden; a UUID checked against
    the host's, host_uuids, where it holds one), else one per GPU the host has (gpu_count); [] when none can
    be seen."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = gpu_count()
    if visible is not None:
        uuids = host_uuids() if any(e.strip().startswith(UUID_KINDS) for e in visible.split(",")) else None
        return cuda_visible(visible, count, uuids)
    return [str(i) for i in range(count or 0)]


def gpu_count() -> int | None:
    """How many GPUs the host has: one per GPU the driver lists (/proc, no CUDA context), else nvidia-smi's;
    None when neither can say (no driver's folder, no nvidia-smi, or one that fails)."""
    if GPUS.is_dir():
        return len(list(GPUS.iterdir()))
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU ")) if done.returncode == 0 else None


UUID_KINDS = ("GPU-", "MIG-")  # how CUDA_VISIBLE_DEVICES names a GPU, or a MIG device, by its UUID


def host_uuids() -> list[str] | None:
    """The UUIDs of the host's GPUs and MIG devices (GPU-..., MIG-...), as nvidia-smi -L lists them; None
    when it cannot say (no nvidia-smi, or one that fails): then a UUID is taken unchecked, as an index is
    where the GPU count is unknown."""
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return re.findall(r"\(UUID: ((?:GPU|MIG)-[^)\s]+)\)", done.stdout) if done.returncode == 0 else None


def names_one(entry: str, uuids: list[str] | None) -> bool:
    """Whether a UUID entry of CUDA_VISIBLE_DEVICES names one device of the host: as CUDA takes it, the start
    of exactly one of its UUIDs (GPU-8932f937 for GPU-8932f937-d72c-...), and the older MIG-GPU-<uuid>/<gi>/<ci>
    by its GPU's; any where the host's UUIDs are unknown (None)."""
    if uuids is None:
        return True
    if entry.startswith("MIG-GPU-"):
        entry = entry[len("MIG-") :].split("/")[0]
    return sum(1 for uuid in uuids if uuid.startswith(entry)) == 1


def cuda_visible(text: str, count: int | None, uuids: list[str] | None = None) -> list[str]:
    """CUDA_VISIBLE_DEVICES's GPUs as CUDA reads the list on a host of `count` GPUs whose UUIDs are `uuids`:
    each entry an index (the digits 0-9) below the count, or a UUID (GPU-..., MIG-...) that names one of the
    host's (names_one), up to the first entry that is neither (-1, a word, an empty one, an index at or past
    the count, a UUID of no GPU here or the start of two), which ends it, so that `-1` or `abc` hides every
    GPU, `0,-1,1` shows GPU 0 alone, and so does `0,7,1` on a host of 2 (a worker pinned to GPU 7 would find
    none). A count (uuids) of None, the host's unknown, ends the list at no index (UUID)."""
    seen = []
    for entry in text.split(","):
        entry = entry.strip()
        index = digits(entry)
        value = whole(entry)  # None past MOST_DIGITS digits: an index past any count, which int() may refuse
        if index and count is not None and (value is None or value >= count):
            break
        if not (index or (entry.startswith(UUID_KINDS) and len(entry) > 4 and names_one(entry, uuids))):
            break
        seen.append(entry)
    return seen


def gpus_seen(gpus: list[str]) -> str:
    """How many GPUs the host shows, said with CUDA_VISIBLE_DEVICES where it is set (and read as CUDA
    does: cuda_visible), for a message: "this host shows 2 GPU(s)"."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = f"{len(gpus)} GPU(s)" if gpus else "no GPU"
    if visible is None:
        return f"this host shows {count}"
    return (
        f"CUDA_VISIBLE_DEVICES={visible!r} shows {count}, as CUDA reads it (the list ends at its first entry "
        "that is no GPU index or UUID: -1, a word, an empty one, an index past the host's GPUs, a UUID of none "
        "of them)"
    )


def gpu_name(gpus: list[str]) -> str:
    """The model of the GPUs the workers are pinned to ("2x NVIDIA H200"), from the driver's /proc
    files in PCI order, as nvidia-smi numbers them (no CUDA context), else nvidia-smi."""
    models = [
        line.split(":", 1)[1].strip()
        for info in (sorted(GPUS.glob("*/information")) if GPUS.is_dir() else [])
        for line in info.read_text(errors="replace").splitlines()
        if line.startswith("Model:")
    ]
    if not models:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        models = [line.strip() for line in out.splitlines() if line.strip()]
    # A UUID or MIG entry of CUDA_VISIBLE_DEVICES names no index: the first model stands for it.
    pinned = (
        sorted({models[i] if (i := whole(g)) is not None and i < len(models) else models[0] for g in gpus})
        if models
        else []
    )
    if not pinned:
        return "no GPU seen"
    return ", ".join(pinned) if len(pinned) > 1 else (f"{len(gpus)}x {pinned[0]}" if len(gpus) > 1 else pinned[0])


def by_file(nodes: list[str]) -> dict[str, list[str]]:
    """Node ids (absolute) grouped by their test file; a folder becomes its test_*.py files (not
    under test_helpers, which FlashInfer's pytest.ini keeps out: norecursedirs)."""
    groups: dict[str, list[str]] = {}
    for node in nodes:
        path = Path(node.split("::")[0])
        if path.is_dir():
            for f in sorted(path.rglob("test_*.py")):
                if "test_helpers" not in f.relative_to(path).parts:
                    groups.setdefault(str(f), []).append(str(f))
        else:
            groups.setdefault(str(path), []).append(node)
    return groups


def say(line: str) -> None:
    """A line to the terminal, above the progress line where one is shown (fidev.upstream.progress)."""
    progress.BOARD.say(line)


def relative(file: str, tree: Path) -> str:
    """A test file as the tree names it; either may come through a symlink (a linked vendored tree)."""
    return str(Path(file).resolve().relative_to(tree.resolve()))


def run_folder(parent: Path) -> Path:
    """A new folder for one run's JUnit files and logs, named by its start time (unique)."""
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=parent))


STOPPED_EARLY, NOT_STARTED = "stopped early", "not started"  # how a process of a run stopped early (--stop-after) ended


@dataclass
class FileResult:
    file: str  # relative to the tree
    gpu: str | None
    seconds: float
    ended: str  # "exit 0", "exit 1", "signal 11", "timed out after N s", "stopped", STOPPED_EARLY, NOT_STARTED
    outcomes: dict[str, str] = field(default_factory=dict)  # node id -> passed, failed, error or "skipped: <kind>"
    junit: str = ""
    part: tuple[int, int] = (1, 1)  # (i, k): every k-th case from the i-th; (1, 1) is the whole file
    collected: set[str] = field(default_factory=set)  # a part's digests of the list it split (its xdist workers' too)
    not_run: int | None = (
        0  # of its cases to run, those it did not run (the run stopped early); None where it never counted them
    )

    @property
    def log(self) -> Path:
        return Path(self.junit).with_suffix(".log")

    @property
    def name(self) -> str:
        return self.file if self.part[1] == 1 else f"{self.file} (part {self.part[0]} of {self.part[1]})"

    @property
    def crashed(self) -> bool:
        """The file did not run to its end: a signal, the time limit, an interrupt, pytest's
        internal error (3), arguments it refused (4: a node id that no longer exists), or no report.
        Statuses 0, 1 and 5 (nothing selected) finish; so does 2 where collection errors stopped it
        (they are counted); a 2 from pytest.exit() or Ctrl-C in a test does not. A process the run's
        early stop ended, or never started, did not crash: what it did not run is counted as not run."""
        if self.ended in ("exit 0", "exit 1", "exit 5", STOPPED_EARLY, NOT_STARTED):
            return False
        collection_errors = any(
            o == "error" and "::" not in n for n, o in self.outcomes.items()
        )  # a file that did not collect
        return not (self.ended == "exit 2" and collection_errors)


# A line of a process's outcomes file, as fidev.upstream.plugin writes it (Outcomes.write)
ENTRY = {"nodeid": MayLack(str), "outcome": MayLack(str), "message": MayLack(str), "t": MayLack(float)}


def entries(path: Path) -> list[dict]:
    """fidev.upstream.plugin's lines in a process's outcomes file, each a JSON object (none where
    the file is missing; the last line of a process that died while writing it left out, and so is
    a line of another shape than ENTRY)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            entry = parse_json(line)
        except ValueError:
            continue
        if fits(entry, ENTRY):  # else no line of the plugin's: left out as a torn one is
            found.append(entry)
    return found


def read_outcomes(path: Path, stopped: bool = False) -> dict[str, str]:
    """{node id: outcome} from fidev.upstream.plugin's lines; a test reported more than once (a
    pass, then an error in teardown) keeps the worst, and one started but never finished (its
    process died in it) is an error, unless the run's early stop interrupted it (`stopped`): then
    it did not run."""
    found: dict[str, str] = {}
    running: set[str] = set()
    for entry in entries(path):
        outcome = entry.get("outcome")  # a line without one: an error, below
        if outcome in (COLLECTED, STOPPED):
            continue
        if outcome in ("started", "finished"):
            (running.add if outcome == "started" else running.discard)(entry.get("nodeid"))
            continue
        if outcome == "skipped":
            outcome = f"skipped: {skip_kind(entry.get('message', ''))}"
        elif outcome not in SEVERITY:  # no outcome the plugin writes: not a pass
            outcome = "error"
        node = entry.get("nodeid", "?")
        if node not in found or SEVERITY[outcome] >= SEVERITY[found[node]]:
            found[node] = outcome
    for node in running if not stopped else ():  # the test the process died in
        found[node] = "error"
    return found


def stopped_itself(path: Path) -> bool:
    """Whether a process's early stop ended it (fidev.upstream.outcomes' STOPPED line)."""
    return any(entry.get("outcome") == STOPPED for entry in entries(path))


def not_run(path: Path) -> int | None:
    """Of a process's cases to run (its progress file's total), how many did not finish; None
    where it never wrote its total (it had not collected yet)."""
    found = progress.read_progress(progress_path(path))
    if found is None or not isinstance(found.get("total"), int):
        return None
    done = {entry.get("nodeid") for entry in entries(path) if entry.get("outcome") == "finished"}
    return max(0, found["total"] - len(done))


def first_failure(run_dir: Path) -> float | None:
    """When the run's first failing case ended (time.time()), by its processes' outcomes files; None where none
    failed."""
    return min(
        (
            entry["t"]
            for f in run_dir.glob("*.jsonl")
            for entry in entries(f)
            if upstream_outcomes.fails_the_run(entry.get("outcome"), entry.get("message", ""))
            and isinstance(entry.get("t"), (int, float))
        ),
        default=None,
    )


def read_collected(path: Path) -> set[str]:
    """The digests a part's processes wrote of the node ids they collected (fidev.upstream.plugin)."""
    return {entry.get("message", "") for entry in entries(path) if entry.get("outcome") == COLLECTED}


def last_case_end(run_dir: Path) -> float | None:
    """When the run's last test case finished (time.time()), by its processes' outcomes files; None
    where none did. What follows it is the processes' exit and upstream-tests' summary."""
    ends = [
        entry["t"]
        for f in run_dir.glob("*.jsonl")
        for entry in entries(f)
        if entry.get("outcome") == "finished" and isinstance(entry.get("t"), (int, float))
    ]
    return max(ends, default=None)


def mismatched(results: list[FileResult]) -> list[str]:
    """The files whose parts collected different lists (a parametrization that changes from one
    collection to the next): their shares need not cover the file, so the file is an error."""
    digests: dict[str, set[str]] = {}
    for r in results:
        if r.part[1] > 1:
            digests.setdefault(r.file, set()).update(r.collected)
    return sorted(f for f, found in digests.items() if len(found) > 1)


class Stop:
    """The run's stop switch: the live processes, killed with their children on an interrupt; on
    the run's early stop (`early`), sent SIGINT, as Ctrl-C in pytest (its session ends, its JUnit
    XML written), then killed where they outlast fidev.upstream.progress.STOP_GRACE_S."""

    def __init__(self):
        self.flag = threading.Event()
        self.early = threading.Event()
        self.live: set = set()
        self.lock = threading.Lock()

    def signal_live(self, sig: int) -> None:
        with self.lock:
            for proc in self.live:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def kill_all(self) -> None:
        self.flag.set()
        self.signal_live(signal.SIGKILL)

    def stop_early(self) -> None:
        self.early.set()
        self.signal_live(signal.SIGINT)

    def kill_live(self) -> None:
        self.signal_live(signal.SIGKILL)


# --per-gpu's most: processes a GPU at once, each a pytest that imports torch and FlashInfer (a GPU's memory
# and the host's cores run out far below; affected asks for GATED_PER_GPU at most)
MOST_PER_GPU = 64
GATED_PER_GPU = 8  # behind affected's gate, processes a GPU at once at most (affected's --per-gpu too)


def at_once(processes: int, gpus: int, per_gpu: int, gated: bool) -> int:
    """Processes on each GPU at once: --per-gpu's N; behind affected's gate every process of the run,
    up to GATED_PER_GPU a GPU and half the cores shared by the GPUs: each waits there for the modules its
    cases load as they are rebuilt (fidev.upstream.gate), and a process not started yet could not run a
    case whose modules are built, a file that catches the edit perhaps. fidev.affected.theirs.processes
    shares the cores among their thread pools by the same count."""
    if not gated:
        return per_gpu
    gpus = max(1, gpus)
    cores = max(1, (os.cpu_count() or 1) // (2 * gpus))
    return max(per_gpu, min(GATED_PER_GPU, cores, -(-processes // gpus)))


def parts(seconds: float | None, gpus: int) -> int:
    """How many processes a file runs in: one per GPU, as far as each gets PART_MIN_S of the file's
    last time; one where that is not known."""
    return max(1, min(gpus, int((seconds or 0) // PART_MIN_S)))


def split(
    groups: dict[str, list[str]], gpus: int, tree: Path, times: dict[str, float], per_gpu: int = 1
) -> dict[str, int]:
    """{test file: its parts} for a run on `gpus` GPUs, `per_gpu` processes on each at once."""
    return {f: parts(times.get(relative(f, tree)), gpus) * per_gpu for f in groups}


def load_times(path: Path) -> dict[str, float]:
    """{test file (relative to the tree): seconds} of the files' last runs that finished."""
    try:
        data = load_json(path)
    except (OSError, ValueError):
        return {}
    # a time of another type is none
    return {f: float(s) for f, s in data.items() if fits(s, float)} if isinstance(data, dict) else {}


def save_times(path: Path, results: list[FileResult]) -> None:
    """Each file's time in this run, its parts summed, where none of them crashed (written whole)."""
    times, crashed, summed = load_times(path), {r.file for r in results if r.crashed}, {}
    for r in results:
        if r.file not in crashed:
            summed[r.file] = summed.get(r.file, 0.0) + r.seconds
    times.update({f: round(s, 1) for f, s in summed.items()})
    write_whole(path, json.dumps(times, indent=1, sort_keys=True))


def process_env(
    outcomes: Path, gpu: str | None, part: tuple[int, int], stop_after: int, base: Settings
) -> dict[str, str]:
    """A file's process's environment: its plugin's settings (fidev.upstream.settings: the run's
    `base`, with where it writes, its part and the run's early stop), its GPU, and our scripts' path."""
    from fidev.core.manifest import ROOT

    settings = base.but(
        outcomes=outcomes,
        part=part if part[1] > 1 else None,
        stop_after=stop_after,
        stop_file=outcomes.parent / progress.STOP_FILE if stop_after else None,
    )
    env = child_env(
        settings, PYTHONPATH=os.pathsep.join([str(ROOT / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])])
    )
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def how_it_ended(code: int, stop: Stop, outcomes: Path) -> str:
    """ "exit N", "signal N", "stopped" (an interrupt), or STOPPED_EARLY: its own early stop ended it,
    or the run's, where it did not end on its own (0, 1, 5)."""
    if stop.flag.is_set():
        return "stopped"
    if stopped_itself(outcomes) or (stop.early.is_set() and code not in (0, 1, 5)):
        return STOPPED_EARLY
    return f"signal {-code}" if code < 0 else f"exit {code}"


def pytest_command(nodes: list[str], junit: Path, argv: list[str]) -> list[str]:
    """The pytest command of one file's process (or one part's): its nodes, with the plugin and its JUnit XML."""
    return [
        sys.executable,
        "-c",
        PYTEST,
        *nodes,
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
        *UNUSED_PLUGINS,
        "-p",
        "fidev.upstream.plugin",
        f"--junitxml={junit}",
        *argv,
    ]


def start_process(cmd: list[str], env: dict[str, str], stop: Stop) -> subprocess.Popen:
    """Start a file's process in a session of its own, live to `stop`; killed or interrupted if the run stops."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
    )
    with stop.lock:
        stop.live.add(proc)
    if stop.flag.is_set():
        os.killpg(proc.pid, signal.SIGKILL)
    elif stop.early.is_set():
        os.killpg(proc.pid, signal.SIGINT)
    return proc


def wait_process(proc: subprocess.Popen, out, prefix: str, limit_s: float, stop: Stop, outcomes: Path) -> str:
    """Its output to the log `out` until it ends or times out (how_it_ended), then no longer live to `stop`."""

    def pump() -> None:  # the whole output to the log; the plugin's compile lines to the terminal too
        for line in proc.stdout:
            out.write(line)
            if line.startswith("upstream-tests: "):
                say(f"{prefix}{line[16:].rstrip()}")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        ended = how_it_ended(proc.wait(timeout=limit_s), stop, outcomes)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        ended = f"timed out after {limit_s:.0f} s"
    reader.join()
    with stop.lock:
        stop.live.discard(proc)
    return ended


def run_file(
    file: str,
    nodes: list[str],
    gpu: str | None,
    part: tuple[int, int],
    run_dir: Path,
    tree: Path,
    argv: list[str],
    limit_s: float,
    stop: Stop,
    stop_after: int = 0,
    base: Settings = NO_SETTINGS,
) -> FileResult:
    """One file's pytest process (or one part's), pinned to `gpu` (None: nothing to pin), its output in the run
    folder."""
    rel = relative(file, tree)
    junit, log, outcomes = (run_dir / f"{stem(rel, part)}{ext}" for ext in (".xml", ".log", ".jsonl"))
    env = process_env(outcomes, gpu, part, stop_after, base)
    cmd = pytest_command(nodes, junit, argv)
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = start_process(cmd, env, stop)
        ended = wait_process(proc, out, f"  GPU {gpu or '-'} {rel}: ", limit_s, stop, outcomes)
    early = ended == STOPPED_EARLY
    return FileResult(
        rel,
        gpu,
        time.perf_counter() - started,
        ended,
        read_outcomes(outcomes, early),
        str(junit),
        part,
        read_collected(outcomes),
        not_run(outcomes) if early else 0,
    )


def stem(rel: str, part: tuple[int, int]) -> str:
    """A process's files' name in the run folder (its JUnit XML, log, outcomes)."""
    return rel.replace("/", "__").removesuffix(".py") + (f".part{part[0]}of{part[1]}" if part[1] > 1 else "")


def process_order(
    groups: dict[str, list[str]], gpus: int, tree: Path, times: dict[str, float], per_gpu: int
) -> list[tuple[str, tuple[int, int]]]:
    """Every process of the run, (file, (i, k)), longest first: its file's last time over its parts, else its size."""
    k = split(groups, gpus, tree, times, per_gpu)
    return sorted(
        ((f, (i, k[f])) for f in groups for i in range(1, k[f] + 1)),
        key=lambda fp: (-times.get(relative(fp[0], tree), 0.0) / fp[1][1], -Path(fp[0]).stat().st_size, fp),
    )


def ended_line(result: FileResult, done: int, processes: int, gpu: str | None) -> str:
    """The line a process's end prints: the run's count so far, its counts and time, how it ended where not normally."""
    how = f", {result.ended}" if result.crashed or result.ended == STOPPED_EARLY else ""
    return (
        f"  [{done}/{processes}] GPU {gpu or '-'} {result.name}: {line_counts(result)} in {result.seconds:.0f} s{how}"
    )


def never_started(todo: queue.Queue, tree: Path, run_dir: Path) -> list[FileResult]:
    """The processes left in `todo` when the run stopped early, as results that never started (NOT_STARTED)."""
    results = []
    while not todo.empty():  # the run stopped early: what never started
        f, part = todo.get_nowait()
        rel = relative(f, tree)
        results.append(
            FileResult(
                rel, None, 0.0, NOT_STARTED, junit=str(run_dir / f"{stem(rel, part)}.xml"), part=part, not_run=None
            )
        )
    return results


def run_files(
    groups: dict[str, list[str]],
    gpus: list[str],
    run_dir: Path,
    tree: Path,
    argv: list[str],
    limit_s: float,
    times: dict[str, float],
    per_gpu: int = 1,
    stop_after: int = 0,
    every_s: float = progress.EVERY_S,
    base: Settings = NO_SETTINGS,
) -> list[FileResult]:
    """Every file once, in parts() by its last time, a worker per GPU (one unpinned worker where
    none can be seen) taking the longest process left (by its file's last time over its parts,
    else the file's size); a line per process as it ends, and the run's progress meanwhile
    (fidev.upstream.progress, a line every `every_s` in a log). With `per_gpu` N, each file in N
    times as many parts and N workers a GPU (behind a gate, more: at_once). With `stop_after` N, once the
    run's processes have named N failing cases no process starts and those running stop (STOPPED_EARLY);
    those never started are results too (NOT_STARTED). An interrupt (Ctrl-C, SIGTERM) kills the running
    processes and raises KeyboardInterrupt. `base`: every process's settings (the sample, the gate, whose
    owner gone stops it)."""
    order = process_order(groups, len(gpus), tree, times, per_gpu)
    todo: queue.Queue = queue.Queue()
    for f in order:
        todo.put(f)
    results, lock, stop = [], threading.Lock(), Stop()
    watch = progress.Watch(run_dir, len(order), stop_after, every_s, stop.stop_early, stop.kill_live)

    def worker(gpu: str | None) -> None:
        while not stop.flag.is_set() and not stop.early.is_set():
            watch.check_stop()
            if stop.early.is_set():
                return
            if base.gate is not None and not owner_alive(base.gate_owner):
                stop.flag.set()  # what started the run behind a gate is gone: the gate never opens
                return
            try:
                f, part = todo.get_nowait()
            except queue.Empty:
                return
            with lock:
                watch.started += 1
            result = run_file(f, groups[f], gpu, part, run_dir, tree, argv, limit_s, stop, stop_after, base)
            with lock:
                results.append(result)
                say(ended_line(result, len(results), len(order), gpu))

    workers = at_once(len(order), len(gpus or [None]), per_gpu, base.gate is not None)
    threads = [threading.Thread(target=worker, args=(g,), daemon=True) for g in gpus or [None] for _ in range(workers)]
    watch.start()
    try:
        run_workers(threads, stop)
    finally:
        watch.end()
    results += never_started(todo, tree, run_dir)
    results.sort(key=lambda r: (r.file, r.part))
    for f in mismatched(results):
        next(r for r in results if r.file == f).outcomes[f] = "error"
    return results


def run_workers(threads: list[threading.Thread], stop: Stop) -> None:
    """The workers to their end; SIGTERM and SIGHUP (a closed ssh session) stop the run as Ctrl-C
    does: the running processes killed, then KeyboardInterrupt."""
    main = threading.current_thread() is threading.main_thread()
    previous = (
        {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    )
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        stop.kill_all()
        for t in threads:
            join_started(t, 10)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def join_started(thread: threading.Thread, timeout_s: float) -> None:
    """Wait for a worker, where it started: Ctrl-C or SIGTERM may come while the workers start, and one not
    started yet never will (the stop is set, and a worker that starts sees it)."""
    if thread.ident is None:
        return
    try:
        thread.join(timeout=timeout_s)
    except RuntimeError:  # started, and not yet marked so: it sees the stop as it runs
        pass


def stopped_early(results: list[FileResult]) -> list[FileResult]:
    """The processes the run's early stop ended or never started (none: it did not stop early)."""
    return [r for r in results if r.ended in (STOPPED_EARLY, NOT_STARTED)]


def outcomes(results: list[FileResult]) -> dict[str, str]:
    """{node id: outcome} over the results, the worst where two parts report one node (a file that
    does not collect is an error in each of its parts: counted once)."""
    merged: dict[str, str] = {}
    for r in results:
        for node, outcome in r.outcomes.items():
            if node not in merged or SEVERITY[outcome] > SEVERITY[merged[node]]:
                merged[node] = outcome
    return merged


def counts(results: list[FileResult]) -> dict[str, int]:
    c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for outcome in outcomes(results).values():
        c["skipped" if outcome.startswith("skipped") else outcome] += 1
    # a process that did not finish, where no test of it took the blame (the one it died in)
    c["error"] += sum(1 for r in results if r.crashed and "error" not in r.outcomes.values())
    return c


def line_counts(result: FileResult) -> str:
    c = counts([result])
    return f"{c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped"


def skip_summary(results: list[FileResult]) -> dict[str, int]:
    total: dict[str, int] = {}
    for outcome in outcomes(results).values():
        if outcome.startswith("skipped: "):
            kind = outcome.removeprefix("skipped: ")
            total[kind] = total.get(kind, 0) + 1
    return total


def failing(results: list[FileResult]) -> list[tuple[str, str]]:
    """("FAILED" or "ERROR", what) for each test that failed or errored (an out-of-memory or
    missing-module skip fails), then each file that did not finish: the words of pytest's summary."""
    tests = sorted((("ERROR" if o == "error" else "FAILED"), n) for n, o in outcomes(results).items() if o in FAILING)
    return tests + [("ERROR", f"{r.name} ({r.ended})") for r in results if r.crashed]


# The baseline: a file per selection (fidev.core.workspace.Workspace.baseline), beside the JIT dirs of the FlashInfer
# version.
BASELINE = {
    "selection": MayLack(list[str]),
    "commit": str,
    "gpu": str,
    "outcomes": dict[str, str],
    "crashed": MayLack(list[str]),
}


def save_baseline(path: Path, selection: list[str], commit: str, gpu: str, results: list[FileResult]) -> None:
    data = {
        "selection": selection,
        "commit": commit,
        "gpu": gpu,
        "outcomes": outcomes(results),
        "crashed": sorted({r.file for r in results if r.crashed}),
    }
    write_whole(path, json.dumps(data, indent=1))


def load_baseline(path: Path) -> dict | None:
    """The baseline of a selection; None where none was recorded. One that is there but cannot be
    read is two lines: a compare run without it would pass off a plain run as a comparison."""
    if not path.exists():
        return None
    fix = "record it again: upstream-tests with the same selection and --baseline (on the tree before your edit)"
    try:
        data = load_json(path)
    except (OSError, ValueError) as e:
        raise Failure(f"the baseline {path} cannot be read ({e})", fix) from None
    if not fits(data, BASELINE):
        raise Failure(
            f"the baseline {path} is not of the shape upstream-tests writes (not a baseline it wrote: its "
            "outcomes, commit and GPU)",
            fix,
        )
    return data


def compare(baseline: dict, results: list[FileResult]) -> dict[str, list[str]]:
    """What changed since the baseline: newly failing (failed now, or skipped for out of memory or a
    missing JIT module, where it was not failing then), newly erroring, newly passing (was failing);
    a file that does not finish now and did then counts as newly erroring."""
    was = baseline["outcomes"]
    now = outcomes(results)
    changes = {
        "newly failing": sorted(n for n, o in now.items() if o in FAILING - {"error"} and was.get(n) not in FAILING),
        "newly erroring": sorted(n for n, o in now.items() if o == "error" and was.get(n) not in FAILING),
        "newly passing": sorted(n for n, o in now.items() if o == "passed" and was.get(n) in FAILING),
    }
    changes["newly erroring"] += sorted(
        f"{r.name} ({r.ended})" for r in results if r.crashed and r.file not in baseline.get("crashed", [])
    )
    ran = {r.file for r in results} - {r.file for r in results if r.crashed or r.ended in (STOPPED_EARLY, NOT_STARTED)}
    changes["not run since"] = sorted(
        n for n in was if n.split("::")[0] in ran and n not in now
    )  # renamed or removed: say so
    return changes
