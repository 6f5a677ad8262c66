"""FlashInfer's own suite run the way its CI runs it: one pytest process per test file, "to isolate
CUDA memory issues" (scripts/task_jit_run_tests_part1.sh at v0.6.3), the files spread over the
host's GPUs one worker per GPU pinned with CUDA_VISIBLE_DEVICES (its one-file-per-GPU scheme,
scripts/test_utils.sh with PARALLEL_TESTS=true at v0.6.17, which also limits a file to 7,200 s),
longest files first, one JUnit XML per file in a run folder.

A file whose process crashes (a segfault, an illegal address) or runs past its limit is reported
for that file and the others go on. Counts come from the JUnit files; skips are split by reason,
since FlashInfer's tests/conftest.py turns two failures into skips (lines 140-168 at v0.6.3):
"Skipping due to OOM" and "Skipping due to missing JIT cache for module: ...". Those two fail the
run; any other skip is the hardware or the build lacking a feature.

A baseline (`--baseline`) keeps each test's outcome on this GPU at this commit of the vendored tree,
outside git, beside FlashInfer's JIT dir; a later run of the same selection prints only what changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from fidev.upstream_plugin import RUN_MODE

FILE_LIMIT_S = 7200
GPUS = Path("/proc/driver/nvidia/gpus")
OOM, MISSING_JIT, FEATURE = "out of memory", "JIT module missing", "not supported here"


def skip_kind(message: str) -> str:
    """Why a test skipped, from FlashInfer's conftest messages (tests/conftest.py, lines 147 and 165 at v0.6.3)."""
    if "Skipping due to OOM" in message or "out of memory" in message:
        return OOM
    if "missing JIT cache" in message:
        return MISSING_JIT
    return FEATURE


def host_gpus() -> list[str]:
    """The GPUs to pin workers to: CUDA_VISIBLE_DEVICES's entries when set, else one per GPU the
    driver lists (/proc, no CUDA context), else nvidia-smi's; ["0"] when none can be seen."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()] or ["0"]
    if GPUS.is_dir():
        count = len(list(GPUS.iterdir()))
    else:
        try:
            count = sum(1 for line in subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout.splitlines()
                        if line.startswith("GPU "))
        except (OSError, subprocess.TimeoutExpired):
            count = 0
    return [str(i) for i in range(count)] or ["0"]


def gpu_name() -> str:
    """The first GPU's model, from the driver's /proc files (no CUDA context), else nvidia-smi."""
    for info in sorted(GPUS.glob("*/information")) if GPUS.is_dir() else []:
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown GPU"
    return out.splitlines()[0].strip() if out.strip() else "unknown GPU"


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


@dataclass
class FileResult:
    file: str  # relative to the tree
    gpu: str
    seconds: float
    ended: str  # "exit 0", "exit 1", "signal 11", "timed out after N s"
    outcomes: dict[str, str] = field(default_factory=dict)  # node id -> passed / failed / error / skipped
    skips: dict[str, int] = field(default_factory=dict)  # skip_kind -> count
    junit: str = ""

    @property
    def crashed(self) -> bool:
        """The process ended in a way pytest does not: a signal or the time limit, or no report."""
        return not self.ended.startswith("exit ") or not self.outcomes and self.ended not in ("exit 0", "exit 5")


def read_junit(path: Path, tree: Path) -> tuple[dict[str, str], dict[str, int]]:
    """Outcomes by node id and skips by kind, from pytest's JUnit XML in the xunit1 family, whose
    testcase elements carry `file` (relative to the rootdir), `classname` and `name`."""
    outcomes, skips = {}, {}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return outcomes, skips
    for case in root.iter("testcase"):
        file = case.get("file") or ""
        module = file.removesuffix(".py").replace("/", ".")
        cls = (case.get("classname") or "")[len(module) + 1:] if (case.get("classname") or "").startswith(module + ".") else ""
        node = "::".join(p for p in (file, cls, case.get("name") or "") if p)
        tags = {child.tag: child for child in case}
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
            kind = skip_kind(tags["skipped"].get("message") or "")
            skips[kind] = skips.get(kind, 0) + 1
        else:
            outcome = "passed"
        outcomes[node] = outcome
    return outcomes, skips


def run_file(file: str, nodes: list[str], gpu: str, run_dir: Path, tree: Path, argv: list[str], limit_s: float) -> FileResult:
    """One file's pytest process, pinned to `gpu`, its output in the run folder."""
    rel = str(Path(file).relative_to(tree))
    stem = rel.replace("/", "__").removesuffix(".py")
    junit, log = run_dir / f"{stem}.xml", run_dir / f"{stem}.log"
    from fidev.manifest import ROOT

    env = {**os.environ, RUN_MODE: "1", "CUDA_VISIBLE_DEVICES": gpu,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "pytest", *nodes, "-q", "-rfE", "-p", "no:cacheprovider", "-p", "fidev.upstream_plugin",
           f"--junitxml={junit}", "-o", "junit_family=xunit1", *argv]
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)

        def pump() -> None:  # the whole output to the log; the plugin's compile lines to the terminal too
            for line in proc.stdout:
                out.write(line)
                if line.startswith("upstream-tests: "):
                    print(f"  GPU {gpu} {rel}: {line[16:].rstrip()}", flush=True)

        reader = threading.Thread(target=pump)
        reader.start()
        try:
            code = proc.wait(timeout=limit_s)
            ended = f"signal {-code}" if code < 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            ended = f"timed out after {limit_s:.0f} s"
        reader.join()
    outcomes, skips = read_junit(junit, tree)
    return FileResult(rel, gpu, time.perf_counter() - started, ended, outcomes, skips, str(junit))


def run_files(groups: dict[str, list[str]], gpus: list[str], run_dir: Path, tree: Path, argv: list[str], limit_s: float,
              durations: dict[str, float]) -> list[FileResult]:
    """Every file once, a worker per GPU taking the longest file left (by its last run's time, else
    its size); a line per file as it ends."""
    order = sorted(groups, key=lambda f: (-durations.get(str(Path(f).relative_to(tree)), 0.0), -Path(f).stat().st_size))
    todo: queue.Queue = queue.Queue()
    for f in order:
        todo.put(f)
    results, lock = [], threading.Lock()

    def worker(gpu: str) -> None:
        while True:
            try:
                f = todo.get_nowait()
            except queue.Empty:
                return
            result = run_file(f, groups[f], gpu, run_dir, tree, argv, limit_s)
            with lock:
                results.append(result)
                print(f"  [{len(results)}/{len(order)}] GPU {gpu} {result.file}: {line_counts(result)} in {result.seconds:.0f} s"
                      + (f", {result.ended}" if result.crashed else ""), flush=True)

    threads = [threading.Thread(target=worker, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r.file)


def counts(results: list[FileResult]) -> dict[str, int]:
    c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for r in results:
        for outcome in r.outcomes.values():
            c[outcome] += 1
        if r.crashed:
            c["error"] += 1  # the file itself: its process ended without a full report
    return c


def line_counts(result: FileResult) -> str:
    c = counts([result])
    return f"{c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped"


def skip_summary(results: list[FileResult]) -> dict[str, int]:
    total: dict[str, int] = {}
    for r in results:
        for kind, n in r.skips.items():
            total[kind] = total.get(kind, 0) + n
    return total


# The baseline: a file per selection, beside the JIT dir's version and architecture folders.
def baseline_path(cache: Path, selection: list[str]) -> Path:
    key = hashlib.sha256(json.dumps(sorted(selection)).encode()).hexdigest()[:16]
    return cache / "fidev-upstream-baselines" / f"{key}.json"


def save_baseline(path: Path, selection: list[str], commit: str, gpu: str, results: list[FileResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"selection": selection, "commit": commit, "gpu": gpu, "outcomes": {n: o for r in results for n, o in r.outcomes.items()},
            "crashed": sorted(r.file for r in results if r.crashed), "durations": {r.file: round(r.seconds, 1) for r in results}}
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def load_baseline(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("outcomes"), dict) else None


def compare(baseline: dict, results: list[FileResult]) -> dict[str, list[str]]:
    """What changed since the baseline: newly failing (was passed or skipped, or absent), newly
    erroring, newly passing; a file that crashes now and did not then counts as newly erroring."""
    was = baseline["outcomes"]
    now = {n: o for r in results for n, o in r.outcomes.items()}
    bad = ("failed", "error")
    changes = {
        "newly failing": sorted(n for n, o in now.items() if o == "failed" and was.get(n) not in bad),
        "newly erroring": sorted(n for n, o in now.items() if o == "error" and was.get(n) not in bad),
        "newly passing": sorted(n for n, o in now.items() if o == "passed" and was.get(n) in bad),
    }
    changes["newly erroring"] += sorted(f"{r.file} ({r.ended})" for r in results if r.crashed and r.file not in baseline.get("crashed", []))
    return changes
