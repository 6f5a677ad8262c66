"""A pytest plugin for FlashInfer's own suite, run by upstream-tests: how its JIT modules get built,
and, in the plan's dry run, the record of which test needs which module.

Several of FlashInfer's test files build their modules up front in a `warmup_jit` fixture that
calls `flashinfer.jit.build_jit_specs` (tests/utils/test_activation.py's at v0.6.3).
That function builds through one combined ninja at the JIT dir's root, which would recompile what
`build` made and leave each module's own folder believing it must compile again
(fidev.builds.module_builds says why), and it ignores FLASHINFER_DISABLE_JIT, so a dry run would compile.
This plugin replaces it: in a run, with one ninja per module, as `build` and FlashInfer's loader
build, and it says when a test starts compiling a module and how long that took, past pytest's
capture. Where the process runs a subset of its file's cases (a sample, the gate's selection, or
pytest's own -k, -m or --deselect: not a part of a whole file), the warmup builds nothing up front:
the first case builds what it loads when it runs (FlashInfer's JitSpec.build_and_load), so it runs
after its own module's compile, not after every module of the file's parameter space; once it has
run, the warmup's other modules build side by side in a thread while the next cases run, each under
its own lock (fidev.builds.module_builds.build_beside), so a later case waits for its module at most;
the builds still running when the session ends are stopped; in the dry run, nothing is built and every module a test or a warmup asks for is
recorded, one JSON object per line in the format FlashInfer's tests/conftest.py writes its JIT
report in (`pytest_runtest_call` and `pytest_terminal_summary` at v0.6.3), one file per process, since the dry run may
spread over several pytest-xdist workers. A warmup's records carry one key FlashInfer's have not,
"warmup": the fixture builds every module of the file inside whichever test comes first, so they
say what the file needs (the plan), not what that test needs (`affected`'s map).

Every process loads this module with `-p fidev.upstream.plugin`: the dry run's with DRY_RUN_DIR in
the environment, a run's (one per test file, fidev.upstream.runs) with RUN_MODE. With GATE too,
a run's processes import and collect, then wait for the gate file to say "go": `affected` starts
FlashInfer's tests while it compiles their modules. The gate may name, on the lines after "go",
the tests to run of those collected (node ids, or test functions for all their cases): `affected`
starts the tests of every module a Python edit may change before it knows which ones it did.
With PART ("i/k"), a process runs every k-th of the file's collected cases from the i-th: the
parts of a long file run on several GPUs at once, and each collects the same list.
With SAMPLE (`upstream-tests --sample`), every process, the dry run's too, runs only the sample of
what it collected (fidev.upstream.sample), the same in each, before a part takes its share.

A run's processes also write their progress (PROGRESS_SCHEMA, written whole: cases to run, done,
failed) for the run to show, and with STOP_AFTER, each failing case's node id to one file the run's
processes share (STOP_FILE, a line appended each); before each case a process reads it, and once it
names STOP_AFTER or more it runs no more cases: it records "stopped" in its outcomes and ends as
`pytest -x` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from fidev.builds import module_builds
from fidev.core.files import write_whole
from fidev.jit import kernel_source, module_choice
from fidev.records import ninja_inputs
from fidev.upstream import sample as upstream_sample

DRY_RUN_DIR = "FIDEV_UPSTREAM_DRY_RUN_DIR"  # where each dry-run process writes its records
JIT_DIR_FILE = "jit-dir"  # the JIT dir the dry run's FlashInfer uses, for the plan's `ninja -n`
GATE, GATE_OWNER = "FIDEV_UPSTREAM_GATE", "FIDEV_UPSTREAM_GATE_OWNER"  # the gate file, and process_identity() of who opens it
GO = "go"
PART = "FIDEV_UPSTREAM_PART"  # "i/k" in a part of a file's run (fidev.upstream.runs): its cases are every k-th from the i-th
# the sample spec's path in a sampled run (`upstream-tests --sample`): each process runs the sample of the cases it
# collected (fidev.upstream.sample), and in a run writes what it covered beside its outcomes (RUN_MODE + sample.RECORD)
SAMPLE = "FIDEV_UPSTREAM_SAMPLE"
COLLECTED = "collected"  # a part's line in its outcomes: a digest of the node ids it collected, before taking its share
STOP_AFTER, STOP_FILE = "FIDEV_UPSTREAM_STOP_AFTER", "FIDEV_UPSTREAM_STOP_FILE"  # the run's failures to stop at, and their shared file
STOPPED = "stopped"  # a process's line in its outcomes: it ran no more cases, the run's failures having reached STOP_AFTER
PROGRESS_SCHEMA = "fidev-upstream-progress/1"  # "<outcomes file>.progress": {"total": cases to run or null, "done", "failed", "t"}
OOM, MISSING_JIT, FEATURE = "out of memory", "JIT module missing", "not supported here"


def skip_kind(message: str) -> str:
    """Why a test skipped, from FlashInfer's conftest messages (tests/conftest.py, `pytest_runtest_call` at v0.6.3)."""
    if "Skipping due to OOM" in message or "out of memory" in message:
        return OOM
    if "missing JIT cache" in message:
        return MISSING_JIT
    return FEATURE


def fails_the_run(outcome: str | None, message: str = "") -> bool:
    """Whether a case's outcome, as the outcomes lines say it, fails the run: a failure, an error,
    or a skip FlashInfer's conftest made of a failure (an out-of-memory or missing-module skip)."""
    return outcome in ("failed", "error") or (outcome == "skipped" and skip_kind(message) != FEATURE)


def progress_path(outcomes: str | Path) -> Path:
    """Where a process whose outcomes go to `outcomes` writes its progress."""
    return Path(f"{outcomes}.progress")


def failures_named(path: Path) -> set[str]:
    """The distinct failing cases the run's processes appended to STOP_FILE (none where it is missing);
    a last line without its newline is still being written, and not one yet."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return set()
    return {line for line in text[:text.rfind("\n") + 1].splitlines() if line}


def spec_record(test_name: str, spec, warmup: bool = False) -> str:
    """One line of FlashInfer's JIT report (tests/conftest.py at v0.6.3: the spec_info dict of
    `pytest_runtest_call`, the line of `pytest_terminal_summary`), marked when a warmup asked for the module."""
    info = {"name": spec.name, "sources": [str(s) for s in spec.sources], "needs_device_linking": spec.needs_device_linking,
            "aot_path": str(spec.aot_path)}
    return json.dumps({"test_name": test_name, "module_name": spec.name, "spec_info": str(info), **({"warmup": True} if warmup else {})}) + "\n"


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces and parentheses):
    [0] is field 3, the state; [19] is field 22, the start time. None without /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def process_identity(pid: int) -> str:
    """A process as the gate names its owner: its pid and, where /proc has it, its start time (in
    clock ticks since boot), so that a pid used again is not the owner."""
    fields = stat_fields(pid)
    return f"{pid}:{fields[19] if fields else ''}"


def owner_alive(owner: str) -> bool:
    """The gate's owner still runs: the same process (pid and start time), and not a zombie."""
    pid, _, started = owner.partition(":")
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    except ValueError:
        return False
    fields = stat_fields(int(pid))
    if fields is None:
        return True  # no /proc: the pid alone
    return fields[0] != "Z" and (not started or fields[19] == started)


def wait_for_gate(path: Path, owner: str, xdist_worker: bool) -> list[str] | None:
    """Until the gate file says go (the modules are built); then the tests it names, or None for
    all. A gate whose owner is gone never opens: the file's process ends, and under pytest-xdist its
    whole process group at once (the file's own session, fidev.upstream.runs), since a worker that
    exits is replaced by another."""
    import pytest  # in a pytest process: fidev itself imports only the standard library

    while True:
        lines = path.read_text().split("\n") if path.is_file() else []  # written whole, then renamed
        if lines and lines[0] == GO:
            return [line for line in lines[1:] if line] or None
        if not owner_alive(owner):
            if xdist_worker:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            pytest.exit(f"the process that started these tests ({owner}) is gone before they could run", returncode=pytest.ExitCode.INTERRUPTED)
        time.sleep(0.05)


def make_cuda_context() -> None:
    """The process's CUDA context, made while it waits at the gate instead of in its first test
    after it, where all of it would come past the build (its cost per process: docs/measurements.md,
    row "CUDA context in a process's first case").
    Only where the tests' imports brought torch and it sees a GPU: fidev imports nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.empty(1, device="cuda")


def open_gate(path: Path, selection: list[str] | None = None) -> None:
    """Let the gated tests run: all of them, or those `selection` names (written whole)."""
    write_whole(path, "\n".join([GO, *(selection or [])]) + "\n")


def in_part(value: str) -> tuple[int, int]:
    """PART's (i, k), 1 <= i <= k."""
    i, k = (int(v) for v in value.split("/"))
    if not 1 <= i <= k:
        raise ValueError(f"{PART}={value}: not a part i/k with 1 <= i <= k")
    return i, k


def take_sample(config, items) -> upstream_sample.Sample:
    """Deselect, as -k does, the cases outside the sample of those collected (fidev.upstream.sample),
    by the spec upstream-tests wrote (SAMPLE); the sample, for its record."""
    seed, modules, required = upstream_sample.read_spec(Path(os.environ[SAMPLE]))
    found = upstream_sample.select(upstream_sample.cases_of(items), modules, seed, required)
    keep = set(found.selected)
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in keep])
    items[:] = [item for item in items if item.nodeid in keep]
    return found


def selected(nodeid: str, selection: list[str]) -> bool:
    """A node id the gate's selection names: itself, or a case of a named function."""
    return any(nodeid == s or nodeid.startswith(s + "[") for s in selection)


def after_pytests_own(hook):
    """pytest's hookimpl(trylast=True), so that -k, -m and --deselect have deselected first and the
    sample, the parts and the gate's selection are of what they left. pytest is imported already
    wherever this module's hooks run (a pytest process loads it with -p); elsewhere (upstream-tests,
    affected, reading its constants) the hook is left as it is, and fidev imports only the standard library."""
    pytest = sys.modules.get("pytest")
    return pytest.hookimpl(trylast=True)(hook) if pytest is not None else hook


class FlashInferBuilds:
    def __init__(self, dry_dir: str | None = None):
        self.dry_dir = Path(dry_dir) if dry_dir else None
        self.config = None
        self.current = "unknown"
        self.narrowed = False  # a subset of the file's cases runs (not a part's share): the warmup builds nothing up front
        self.later: list = []  # the warmup's modules to build beside the tests once the first case has run
        self.beside: threading.Thread | None = None
        self.running: list = []  # the ninja processes of that build
        self.parting = False  # while this plugin deselects a part's share

    def pytest_configure(self, config):
        self.config = config

    def pytest_runtest_setup(self, item):
        self.current = item.nodeid

    def pytest_deselected(self, items):
        """Cases left out: by -k, -m, --deselect, the sample or the gate's selection (a narrowed
        run), or as another part's share (the file runs whole over its parts: not narrowed)."""
        if items and not self.parting:
            self.narrowed = True

    def pytest_runtest_logfinish(self, nodeid, location):
        """The first case has run: the warmup's other modules build beside the next ones."""
        if self.later and self.beside is None:
            self.beside = threading.Thread(target=module_builds.build_beside, args=(self.later, self.say, self.running), daemon=True)
            self.beside.start()

    def stop_beside(self) -> None:
        """The build beside the tests, stopped where it still runs: no case is left to load its modules."""
        if self.beside is None:
            return
        for proc in list(self.running):
            if proc.poll() is None:
                proc.terminate()
        self.beside.join(timeout=30)

    def pytest_sessionfinish(self, session):
        self.stop_beside()
        if self.dry_dir is None:  # a file's run: which of its modules ran from edited source
            for line in module_choice.report("upstream-tests"):
                self.say(line)
            relayed = Path(f"{os.environ[RUN_MODE]}.said")
            if relayed.is_file() and not hasattr(self.config, "workerinput"):  # the xdist workers', now that they are done
                self.say("")  # xdist's progress line has no end of its own
                for line in dict.fromkeys(relayed.read_text().splitlines()):
                    self.say(line)

    def say(self, line: str) -> None:
        capture = self.config.pluginmanager.getplugin("capturemanager")
        terminal = self.config.pluginmanager.getplugin("terminalreporter")
        if hasattr(self.config, "workerinput"):  # an xdist worker's terminal goes nowhere: the controller says its lines at the end
            if self.dry_dir is None and os.environ.get(RUN_MODE):
                with open(f"{os.environ[RUN_MODE]}.said", "a") as relayed:
                    relayed.write(line + "\n")
            return
        if terminal is None:
            return
        with capture.global_and_fixture_disabled():
            terminal.write_line(line)

    def record(self, specs, warmup: bool = False) -> None:
        with open(self.dry_dir / f"report-{os.getpid()}.jsonl", "a") as report:
            report.writelines(spec_record(self.current, spec, warmup) for spec in specs)

    @after_pytests_own
    def pytest_collection_modifyitems(self, session, config, items):
        if self.dry_dir is None and os.environ.get(PART):  # deselected as -k does: a part left with none ends "no tests ran" (5)
            # what this part collected, for fidev.upstream.runs to check that every part split the same list
            listed = hashlib.sha256("\n".join(item.nodeid for item in items).encode()).hexdigest()[:16]
            with open(os.environ[RUN_MODE], "a") as f:
                f.write(json.dumps({"nodeid": "", "outcome": COLLECTED, "message": listed}) + "\n")
        sampled = take_sample(config, items) if os.environ.get(SAMPLE) else None  # before the parts split: each takes its share of it
        kept = None  # the sample's functions the gate lets run; None: all
        if self.dry_dir is None and os.environ.get(PART):
            i, k = in_part(os.environ[PART])
            self.parting = True
            try:
                config.hook.pytest_deselected(items=[item for n, item in enumerate(items) if n % k != i - 1])
            finally:
                self.parting = False
            items[:] = items[i - 1::k]
        if self.dry_dir is None and os.environ.get(GATE):  # collected (an xdist worker too): now wait for the build
            make_cuda_context()
            selection = wait_for_gate(Path(os.environ[GATE]), os.environ.get(GATE_OWNER, ""), hasattr(config, "workerinput"))
            if selection is not None:
                config.hook.pytest_deselected(items=[item for item in items if not selected(item.nodeid, selection)])
                items[:] = [item for item in items if selected(item.nodeid, selection)]
                kept = sorted({n.split("[")[0] for n in sampled.selected if selected(n, selection)}) if sampled else None
        if sampled is not None and self.dry_dir is None:
            write_whole(Path(os.environ[RUN_MODE] + upstream_sample.RECORD), json.dumps(upstream_sample.sample_record(sampled, kept)))

    def pytest_collection_finish(self, session):
        import flashinfer.jit
        from flashinfer.jit import core
        from flashinfer.jit import env as jit_env

        flashinfer.jit.build_jit_specs = core.build_jit_specs = self.build_jit_specs
        original = core.JitSpec.build
        if self.dry_dir is not None:
            (self.dry_dir / JIT_DIR_FILE).write_text(str(jit_env.FLASHINFER_JIT_DIR))

            def build(spec, verbose, need_lock=True):
                self.record([spec])
                original(spec, verbose, need_lock)  # raises MissingJITCacheError under FLASHINFER_DISABLE_JIT
        else:
            build = module_builds.recording_build(original, lambda line: self.say(f"upstream-tests: {line}"))

        core.JitSpec.build = build

    @staticmethod
    def built_already(spec) -> bool:
        """Built and recorded, with nothing for ninja to do and no restored copy among its inputs:
        read without the JIT dir's lock, which every xdist worker of every part of a file would
        otherwise take in turn to find nothing to do, after the gate (what that cost: docs/measurements.md,
        row "warmups behind affected's gate")."""
        if hasattr(spec, "write_ninja"):
            spec.write_ninja()  # as module_builds.build_specs does first (FlashInfer's write_if_different)
        if not spec.jit_library_path.exists() or not (spec.build_dir / ninja_inputs.STAMP).is_file():
            return False
        pending = ninja_inputs.dry_run(spec.build_dir, spec.ninja_path)  # its objects include restored copies
        return pending is not None and not pending[0] and pending[1] == 0

    def build_jit_specs(self, specs, verbose=False, skip_prebuilt=True):
        todo = [spec for spec in specs if not (skip_prebuilt and spec.is_aot)]
        if self.dry_dir is not None:
            self.record(todo, warmup=True)
        elif self.narrowed:
            self.later = [spec for spec in todo if not self.built_already(spec)]
            if self.later:
                self.say(f"upstream-tests: {self.current}: its warmup_jit fixture asks for {len(self.later)} module(s); a subset of the "
                         "file's cases runs, so each case builds what it loads, and the rest build beside them after the first case")
        elif todo := [spec for spec in todo if not self.built_already(spec)]:
            self.say(f"upstream-tests: {self.current}: building {len(todo)} module(s) its warmup_jit fixture asks for")
            seconds, _ = module_builds.build_specs(todo, self.say)
            self.say(f"upstream-tests: warmup built in {seconds:.0f} s")


RUN_MODE = "FIDEV_UPSTREAM_RUN"  # set by fidev.upstream.runs in each test file's process: where to write its outcomes


class Outcomes:
    """Each test's outcome by its real node id, one JSON object per line (the file's process may
    die part way: what was written stays): the call's outcome, a skip with its message, and as
    errors a failed setup or teardown and a file that did not collect. Its progress beside it
    (progress_path, written whole: once collected, then by a thread every PROGRESS_EVERY_S where it
    moved, and at the end), and each failing case to the run's STOP_FILE where it has one."""

    PROGRESS_EVERY_S = 0.5

    def __init__(self, path: str):
        self.path = path
        self.stop_file = os.environ.get(STOP_FILE)
        self.total: int | None = None  # the cases this process runs, once collected (its part's and the gate's share)
        self.done, self.failed, self.written = 0, set(), None
        self.lock = threading.Lock()
        threading.Thread(target=self.keep_progress, daemon=True).start()

    def write(self, nodeid: str, outcome: str, message: str = "") -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"nodeid": nodeid, "outcome": outcome, "message": message[:300], "t": time.time()}) + "\n")

    def progress(self) -> None:
        """The progress file, where it moved since it was last written."""
        with self.lock:
            now = (self.total, self.done, len(self.failed))
            if now != self.written:
                self.written = now
                write_whole(progress_path(self.path), json.dumps({"schema": PROGRESS_SCHEMA, "total": self.total, "done": self.done,
                                                                  "failed": len(self.failed), "t": time.time()}))

    def keep_progress(self) -> None:
        while True:
            time.sleep(self.PROGRESS_EVERY_S)
            self.progress()

    def failing(self, nodeid: str) -> None:
        """A case that fails the run (failed, errored, or a skip FlashInfer's conftest made of a failure)."""
        if nodeid in self.failed:
            return
        self.failed.add(nodeid)
        if self.stop_file:
            with open(self.stop_file, "a") as f:  # one short line per write, appended: the run's processes share it
                f.write(nodeid.replace("\n", " ") + "\n")

    def pytest_collection_finish(self, session):
        self.total = len(session.items)
        self.progress()

    def pytest_runtest_logstart(self, nodeid, location):
        self.write(nodeid, "started")  # a process that dies in a test leaves it started, never finished

    def pytest_runtest_logfinish(self, nodeid, location):
        self.write(nodeid, "finished")
        self.done += 1

    def pytest_sessionfinish(self, session):
        self.progress()

    @staticmethod
    def skip_message(report) -> str:
        """A skip's reason: pytest keeps it as (path, line, message) in longrepr, for a test and for a
        file skipped whole (`pytest.skip(..., allow_module_level=True)`, _pytest/reports.py)."""
        return report.longrepr[2] if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3 else str(report.longrepr)

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            message = self.skip_message(report)
            self.write(report.nodeid, "skipped", message)
            if fails_the_run("skipped", message):
                self.failing(report.nodeid)
        elif report.when == "call":
            self.write(report.nodeid, report.outcome)
        elif report.failed:
            self.write(report.nodeid, "error")
        if report.failed:
            self.failing(report.nodeid)

    def pytest_collectreport(self, report):
        if report.failed:
            self.write(report.nodeid, "error", str(report.longrepr)[-300:])
            self.failing(report.nodeid)
        elif report.skipped:  # a file skipped whole: one skip, as pytest counts it
            self.write(report.nodeid, "skipped", self.skip_message(report))


class XdistTotal:
    """Under pytest-xdist the controller collects nothing: its cases to run are those a worker
    collected (each collects the same list, the part's and the gate's share taken)."""

    def __init__(self, outcomes: Outcomes):
        self.outcomes = outcomes

    def pytest_xdist_node_collection_finished(self, node, ids):
        self.outcomes.total = len(ids)
        self.outcomes.progress()


def early_stop(after: int, stop_file: Path, outcomes: str):
    """The plugin that runs no more cases once the run's processes have named `after` failing cases
    in `stop_file`: each case is checked before it starts (its file read again only where it grew);
    the first case not run records STOPPED in the outcomes, and the session ends as `pytest -x` ends
    it (an xdist worker skips the rest instead: its controller ends when they are done)."""
    import pytest  # in a pytest process: fidev itself imports only the standard library

    class EarlyStop:
        def __init__(self):
            self.size, self.reached = -1, False

        def check(self) -> bool:
            try:
                size = stop_file.stat().st_size
            except OSError:
                return False
            if size != self.size:
                self.size = size
                self.reached = len(failures_named(stop_file)) >= after
            return self.reached

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(self, item, nextitem):
            if not self.check():
                return None
            if not item.session.shouldstop:
                reason = f"stopped after {after} failing case(s) across the run (--stop-after {after})"
                with open(outcomes, "a") as f:
                    f.write(json.dumps({"nodeid": "", "outcome": STOPPED, "message": reason, "t": time.time()}) + "\n")
                if not hasattr(item.config, "workerinput"):
                    item.session.shouldstop = reason
            return True  # not run

    return EarlyStop()


def pytest_configure(config):
    """`-p fidev.upstream.plugin` in a dry-run process (the controller and each xdist worker), or
    in a test file's process of a run."""
    if os.environ.get(DRY_RUN_DIR):
        config.pluginmanager.register(FlashInferBuilds(os.environ[DRY_RUN_DIR]), "fidev-flashinfer-builds")
    elif os.environ.get(RUN_MODE):
        config.pluginmanager.register(FlashInferBuilds(), "fidev-flashinfer-builds")
        if not hasattr(config, "workerinput"):  # under pytest-xdist, the controller writes what its workers report, once
            outcomes = Outcomes(os.environ[RUN_MODE])
            config.pluginmanager.register(outcomes, "fidev-outcomes")
            if hasattr(config.hook, "pytest_xdist_node_collection_finished"):
                config.pluginmanager.register(XdistTotal(outcomes), "fidev-xdist-total")
        if os.environ.get(STOP_AFTER) and os.environ.get(STOP_FILE):
            config.pluginmanager.register(early_stop(int(os.environ[STOP_AFTER]), Path(os.environ[STOP_FILE]), os.environ[RUN_MODE]),
                                          "fidev-early-stop")


# Loaded with -p, this module is imported before FlashInfer's conftest imports flashinfer: the
# kernel source mode must be in force by then, in every process of the dry run or the run.
if os.environ.get(DRY_RUN_DIR) or os.environ.get(RUN_MODE):
    module_choice.apply(kernel_source.mode())  # a process of the run: the mode its parent ran in, from the environment it passed
