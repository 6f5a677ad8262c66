"""upstream-tests' run of a selection: a process per test file over the host's GPUs
(fidev.upstream.runs), then its counts and verdict (fidev.upstream.verdict), and its summary
(fidev.upstream.summary) written at its end, whatever the end."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from fidev.core import workspace
from fidev.core.failure import INTERRUPTED, USAGE, Failure
from fidev.core.files import not_a_file
from fidev.core.manifest import pins
from fidev.records import build_records
from fidev.tree import source_tree
from fidev.upstream import plan as upstream_plan
from fidev.upstream import plugin as upstream_plugin
from fidev.upstream import progress as upstream_progress
from fidev.upstream import runs as upstream_runs
from fidev.upstream import sample as upstream_sample
from fidev.upstream import summary as upstream_summary
from fidev.upstream import verdict
from fidev.upstream.settings import Settings
from fidev.upstream.suite import pytest_options


@dataclass
class Options:
    """upstream-tests' options for the run itself."""

    gpus: int | None = None  # --gpus N: the host's first N; None: all of them
    file_timeout: float = upstream_runs.FILE_LIMIT_S  # --file-timeout SECONDS, per process
    per_gpu: int = 1  # --per-gpu N
    baseline: bool = False  # --baseline: record, not compare
    summary: str | None = None  # --summary FILE: a copy of summary.json
    sample: int | None = None  # --sample: its seed (the processes read the spec base.sample names); None: every case
    stop_after: int = 0  # --stop-after N: stop once the run's processes have N failing cases; 0: run everything
    progress_s: float = (
        upstream_progress.EVERY_S
    )  # --progress SECONDS: a progress line this often where the output is no terminal
    # what every process's plugin is told (fidev.upstream.settings): the sample spec, and the gate of affected's run
    base: Settings = field(default_factory=Settings)


@dataclass
class Run:
    """A run of a selection: what was asked, what it runs on, and, once its files ran, their results."""

    selection: list[str]
    nodes: list[str]
    pytest_args: list[str]
    tests: Path
    mode: str
    options: Options
    ws: workspace.Workspace
    groups: dict[str, list[str]] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    gpu: str = ""
    run_dir: Path = Path()
    key: list[str] = field(default_factory=list)
    baseline_file: Path = Path()
    baseline: dict | None = None
    times_file: Path = Path()
    times: dict[str, float] = field(default_factory=dict)
    started: float = 0.0  # time.time() at the files' start
    clock: float = 0.0  # time.perf_counter() then
    results: list | None = None
    compared: dict[str, list[str]] | None = None


def run(
    selection: list[str],
    nodes: list[str],
    pytest_args: list[str],
    tests: Path,
    options: Options,
    mode: str,
    ws: workspace.Workspace,
) -> int:
    """The selection a process per file over the host's GPUs (fidev.upstream.runs), then its counts,
    and with a baseline of the same selection, what changed since; its summary written at its end,
    whatever the end. `mode` and `ws`: the kernel source mode and the workspace the task read."""
    record = Run(selection, nodes, pytest_args, tests, mode, options, ws)
    status = 1  # where it raises: what its Failure says, else not a pass
    try:
        status = run_selection(record)
        return status
    except Failure as failure:
        status = failure.exit_status
        raise
    finally:
        if record.results is not None:  # the files ran: their result is kept, whatever came after
            write_summary(record, status, options.summary)


def write_summary(record: Run, status: int, extra: str | None) -> None:
    """summary.json in the run folder, and at --summary FILE where asked (fidev.upstream.summary)."""
    results = record.results
    failed = upstream_runs.failing(results)
    processes = [
        upstream_summary.Process(r.file, list(r.part), r.gpu, round(r.seconds, 3), r.ended, upstream_runs.counts([r]))
        for r in results
    ]
    first = upstream_runs.first_failure(record.run_dir)
    stopped = upstream_runs.stopped_early(results)
    done = upstream_summary.Summary(
        selection=record.key,
        kernel_source=record.mode,
        run_dir=str(record.run_dir),
        gpus=record.gpus,
        gpu_name=record.gpu,
        started=record.started,
        ended=time.time(),
        status=status,
        counts=upstream_runs.counts(results),
        skips=upstream_runs.skip_summary(results),
        failing=[what for word, what in failed if word == "FAILED"],
        erroring=[what for word, what in failed if word == "ERROR"],
        processes=processes,
        last_case_end=upstream_runs.last_case_end(record.run_dir),
        compared=record.compared,
        sample=sampled(record),
        first_failure_s=None if first is None else round(max(0.0, first - record.started), 3),
        stop_after=record.options.stop_after,
        stopped_early=bool(stopped),
        not_run=sum(r.not_run or 0 for r in stopped),
        not_counted=[r.name for r in stopped if r.not_run is None],
    )
    upstream_summary.write(done, record.run_dir / upstream_summary.NAME, *([Path(extra)] if extra else []))


def sampled(record: Run) -> dict | None:
    """With --sample, what its processes' samples covered together (fidev.upstream.sample); None without."""
    return (
        upstream_sample.merge_records(upstream_sample.read_records(record.run_dir))
        if record.options.sample is not None
        else None
    )


def run_selection(record: Run) -> int:
    """The run's steps: where it runs, its header, the files, then what they say."""
    prepare(record)
    say_header(record)
    run_all(record)
    results = record.results
    verdict.refused(results, record.pytest_args, record.nodes)
    keep_times(record)
    verdict.name_failing(results, record.run_dir)
    verdict.say_counts(results, record.mode, len(record.groups), len(record.gpus), time.perf_counter() - record.clock)
    if record.options.sample is not None:
        for line in upstream_sample.coverage_lines(" ".join([*record.selection, *record.pytest_args]), sampled(record)):
            print(f"upstream-tests: {line}")
    verdict.say_stopped(results, record.options.stop_after, record.mode)
    return judge(record)


def prepare(record: Run) -> None:
    """The files, the GPUs (--gpus checked against the host's), the run folder, the baseline of the
    same selection (unless recording one), and the files' last times."""
    record.groups = upstream_runs.by_file(record.nodes)
    host = upstream_runs.host_gpus()
    wanted = record.options.gpus
    if wanted and wanted > max(len(host), 1):
        unset = "CUDA_VISIBLE_DEVICES" not in os.environ
        raise Failure(
            f"--gpus {wanted}: {upstream_runs.gpus_seen(host)}",
            f"ask for at most {len(host)}, or leave --gpus out to use them all"
            if host
            else "run it where GPUs are, or leave --gpus out"
            if unset
            else "set CUDA_VISIBLE_DEVICES to the GPUs to use (0,1), or unset it to use them all",
            exit_status=USAGE,
        )
    record.gpus = host[:wanted] if wanted else host
    # a sample's baseline is its own: another selection than every case
    record.key = [*record.selection, *record.pytest_args, *sample_key(record.options.sample)]
    record.baseline_file = record.ws.baseline(record.key)
    refuse_odd_state(record.ws, record.baseline_file, record.options.baseline)
    record.run_dir = upstream_runs.run_folder(record.ws.runs)
    record.baseline = None if record.options.baseline else upstream_runs.load_baseline(record.baseline_file)
    record.gpu = upstream_runs.gpu_name(record.gpus)
    record.times_file = record.ws.file_times
    record.times = upstream_runs.load_times(record.times_file)


def refuse_odd_state(ws: workspace.Workspace, baseline: Path | None = None, recording: bool = False) -> None:
    """Two lines, before the run, where a state file it keeps beside FlashInfer's JIT dirs (fidev.core.workspace)
    exists and is no regular file (a folder, a FIFO, a symlink loop), or a folder of them is none: the run
    would pass every test, then fail to keep it. They name the file, and that removing it clears it."""
    folders = [ws.runs, *([ws.baselines] if recording else [])]
    for folder in folders:
        why = workspace.unusable(folder)
        if why:
            raise Failure(
                f"upstream-tests' state folder {folder} {why}",
                f"remove what is at {folder}: upstream-tests makes the folder anew",
            )
    kept = {ws.file_times: "each test file's last time", **({baseline: "the selection's baseline"} if baseline else {})}
    for jit_dir in ws.jit_dirs():
        kept[jit_dir.parent / workspace.MODULE_TESTS] = "which tests need each module"
        kept[jit_dir.parent / workspace.MODULE_TESTS_RAN] = "the tests a run recorded"
    for path, what in kept.items():
        why = not_a_file(path)
        if why and why != "does not exist":
            raise Failure(
                f"upstream-tests' state file {path} {why}: it keeps {what} there",
                f"remove it (rm -r '{path}') or make it a regular file: upstream-tests writes it anew",
            )


def sample_key(seed: int | None) -> list[str]:
    """How a sampled run's selection names its sample: --sample, and its seed where not the default."""
    if seed is None:
        return []
    return ["--sample"] if seed == upstream_sample.SEED else ["--sample", "--sample-seed", str(seed)]


def say_header(record: Run) -> None:
    """The run's first line: its files, how they are split, its GPUs, its time limit, its folder."""
    per_gpu = record.options.per_gpu
    in_parts = sum(
        k > 1 for k in upstream_runs.split(record.groups, len(record.gpus), record.tests.parent, record.times).values()
    )
    in_parts = (
        f" ({in_parts} long enough by their last run to go in parts over the GPUs, a process per part)"
        if in_parts
        else ""
    )
    each = (
        f"in {per_gpu} parts a GPU, {per_gpu} processes on each GPU at once"
        if per_gpu > 1
        else f"a pytest process each{in_parts}"
    )
    processes = sum(
        upstream_runs.split(record.groups, len(record.gpus), record.tests.parent, record.times, per_gpu).values()
    )
    gated = upstream_runs.at_once(processes, len(record.gpus), per_gpu, record.options.base.gate is not None)
    if gated > per_gpu:
        each += f"; behind affected's gate, {gated} processes on each GPU at once"
    print(
        f"upstream-tests: {len(record.groups)} file(s), {each}, on {len(record.gpus) or 'no'} GPU(s) ({record.gpu}), "
        f"{record.options.file_timeout:.0f} s per process at most; JUnit XML and logs in {record.run_dir}"
    )
    if not record.gpus and "CUDA_VISIBLE_DEVICES" in os.environ:  # said, where it hides them: -1, a word
        print(f"upstream-tests: {upstream_runs.gpus_seen([])}: FlashInfer's tests run with no GPU")


def record_loaded(run_dir: Path) -> None:
    """Every module each case of the run loaded (fidev.upstream.plugin.Builds.loaded), into the record
    of which tests need each module beside its JIT dir (build_records.add_module_tests, whole), so
    that the next sample's warmups build what its cases load, where the plan's dry run names only the
    first module of each."""
    by_dir: dict[str, list[dict]] = {}
    for path in sorted(run_dir.glob(f"*{upstream_plugin.LOADED_SUFFIX}")):
        for entry in upstream_plan.read_jit_report(path):
            if isinstance(entry.get(upstream_plugin.JIT_DIR_KEY), str):
                by_dir.setdefault(entry[upstream_plugin.JIT_DIR_KEY], []).append(entry)
    for jit_dir, entries in sorted(by_dir.items()):
        build_records.add_module_tests(Path(jit_dir), entries, whole=True)


def run_all(record: Run) -> None:
    """Every file's processes (fidev.upstream.runs.run_files); an interrupt is a Failure (130)."""
    record.clock = time.perf_counter()
    record.started = time.time()
    try:
        record.results = upstream_runs.run_files(
            record.groups,
            record.gpus,
            record.run_dir,
            record.tests.parent,
            [*pytest_options(record.tests), *record.pytest_args],
            record.options.file_timeout,
            record.times,
            record.options.per_gpu,
            record.options.stop_after,
            record.options.progress_s,
            record.options.base,
        )
    except KeyboardInterrupt:
        raise Failure(
            f"interrupted: the running test files were stopped; what finished is in {record.run_dir}",
            "run it again (a narrower selection, or --file-timeout SECONDS, to make it shorter)",
            exit_status=INTERRUPTED,
        ) from None
    finally:  # what the cases loaded, however the run ended (affected stops it at smoke's first failure)
        record_loaded(record.run_dir)


def keep_times(record: Run) -> None:
    """Each file's time for the next run's parts, where it is the file's own."""
    # behind affected's gate a file's time includes the wait for the build; with parts sharing a GPU, their sum is not
    # its time
    # a run stopped early has files whose processes did not all run to their end
    if (
        record.options.base.gate is None
        and record.options.per_gpu == 1
        and not upstream_runs.stopped_early(record.results)
    ):
        upstream_runs.save_times(record.times_file, record.results)


def judge(record: Run) -> int:
    """The exit status: a baseline recorded, a comparison with the baseline, or the run's own counts;
    1 for a run stopped early, whatever the comparison says (its cases did not all run)."""
    p = pins()
    commit = source_tree.inspect(p.source_dir, p).found or "unknown"
    if record.options.baseline:
        return verdict.record_baseline(record.results, record.key, record.baseline_file, commit, record.gpu)
    if record.baseline is not None:
        record.compared = upstream_runs.compare(record.baseline, record.results)
        status = verdict.say_compared(record.baseline, record.baseline_file, record.compared, record.run_dir)
        return 1 if upstream_runs.stopped_early(record.results) else status
    return 1 if upstream_runs.stopped_early(record.results) else verdict.passed(record.results)


def sample_spec(
    folder: Path, seed: int, required: list[str], nodes: list[str], tests: Path, ws: workspace.Workspace
) -> Path:
    """The spec every process of a sampled run reads (fidev.upstream.sample), written in `folder`:
    the seed, the modules the JIT dirs' record names for the selection's files' cases, and the
    modules it must exercise. Returns its path, for the processes' settings
    (fidev.upstream.settings.Settings.sample)."""
    recorded: dict[str, list[str]] = {}
    for jit_dir in ws.jit_dirs():
        for module, cases in build_records.module_tests(jit_dir).items():
            recorded.setdefault(module, []).extend(cases)
    files = {upstream_runs.relative(f, tests.parent) for f in upstream_runs.by_file(nodes)}
    path = folder / "sample.json"
    upstream_sample.write_spec(path, seed, upstream_sample.recorded_modules(recorded, files), required)
    return path
