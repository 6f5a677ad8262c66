"""The pytest plugin of FlashInfer's own suite, run by upstream-tests: loaded in every process with
`-p fidev.upstream.plugin`, it reads its settings once (fidev.upstream.settings.Settings, from the
environment the parent gave the process) and registers one plugin per concern:

- DryRunRecords, in the plan's dry run: nothing is built, and every module a test or a warmup asks
  for is recorded, one JSON object per line in the format FlashInfer's tests/conftest.py writes its
  JIT report in (`pytest_runtest_call` and `pytest_terminal_summary` at v0.6.3), one file per
  process, since the dry run may spread over several pytest-xdist workers. A warmup's records carry
  one key FlashInfer's have not, "warmup": the fixture builds every module of the file inside
  whichever test comes first, so they say what the file needs (the plan), not what that test needs
  (`affected`'s map). A module a test asks to load is not built and not loaded: the test gets a
  stand-in (Unbuilt) and goes on, so that the modules it asks for next are recorded too, marked
  "foreseen": the stand-in's answers may have steered the test, so they are what the plan builds
  ahead of the run (fidev.upstream.plan), never what `affected`'s map says a test exercises. Its
  first is the module FlashInfer's own dry run names (its MissingJITCacheError ends the test there).
- Sampling (`upstream-tests --sample`): every process, the dry run's too, runs only the sample of
  what it collected (fidev.upstream.sample), the same in each, before a part takes its share.
- Parts ("i/k"): a process runs every k-th of the file's collected cases from the i-th: the parts of
  a long file run on several GPUs at once, and each collects the same list.
- Gate (fidev.upstream.gate): a run's processes import and collect, then wait for affected's gate
  to begin, and run what it names, each case once the gate says the modules the record names for it
  are built (a case the record does not name: once the whole rebuild is done).
- Builds, in a run: how the modules get built (below).
- Outcomes and the early stop (fidev.upstream.outcomes): what each case did, the progress, and the
  stop at the run's first failing cases.

The narrowing steps act in one hook, in this order: pytest's own -k, -m and --deselect first (the
hook is trylast), then the sample, the part, the gate's selection, and last the order of what is
left (Builds.order).

Builds: several of FlashInfer's test files build their modules up front in a `warmup_jit` fixture
that calls `flashinfer.jit.build_jit_specs` (tests/utils/test_activation.py's at v0.6.3). That
function builds through one combined ninja at the JIT dir's root, which would recompile what `build`
made and leave each module's own folder believing it must compile again (fidev.builds.module_builds
says why), and it ignores FLASHINFER_DISABLE_JIT, so a dry run would compile. Builds replaces it,
with one ninja per module, as `build` and FlashInfer's loader build, and says when a test starts
compiling a module and how long that took, past pytest's capture. Where the process runs a subset
of its file's cases (a sample, the gate's selection, or pytest's own -k, -m or --deselect: not a
part of a whole file), the warmup builds only what the selected cases need:
- where the record (the sample spec's, fidev.records.build_records.module_tests) names the modules
  of the selected cases, those build side by side at once, each under its own lock
  (fidev.builds.module_builds.build_beside), and the cases run in the meantime, first those whose
  modules are built already, then those with the fewest left to build (a case waits for its own
  module at most); no other module of the warmup is built;
- a selected case the record does not name builds what it loads when it runs (FlashInfer's
  JitSpec.build_and_load);
- with no record at all, each case builds what it loads, and once the first case has run, the
  warmup's other modules build beside the next cases.
Behind affected's gate these builds beside the cases start once the whole rebuild is done (the gate is
open), as the plan's builds ahead do: the rebuild, which the first verdict waits on, keeps the cores; and
so does a whole file's warmup that runs before then (its first case ran early), instead of waiting in
the fixture for the JIT dir's lock, which the rebuild holds. The builds still running when the session
ends are stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from fidev.builds import module_builds
from fidev.core import workspace
from fidev.core.files import write_whole
from fidev.jit import kernel_source, module_choice
from fidev.records import build_records, ninja_inputs
from fidev.upstream import gate as upstream_gate
from fidev.upstream import sample as upstream_sample
from fidev.upstream.outcomes import COLLECTED, Outcomes, XdistTotal, early_stop
from fidev.upstream.settings import Settings

JIT_DIR_FILE = "jit-dir"  # the JIT dir the dry run's FlashInfer uses, for the plan's `ninja -n`
# the dry run's cases in pytest's order, as each of its processes collected them (a JSON list of node ids)
COLLECTED_PREFIX = "collected-"
# beside a run's outcomes file: every module each case loaded (Builds.loaded), a JIT-report line each, with its JIT dir
LOADED_SUFFIX, JIT_DIR_KEY = ".loaded.jsonl", "jit_dir"
FORESEEN = "foreseen"  # a dry run's record of a module a test asked for after a stand-in's answers


def spec_record(test_name: str, spec, warmup: bool = False, foreseen: bool = False) -> str:
    """One line of FlashInfer's JIT report (tests/conftest.py at v0.6.3: the spec_info dict of
    `pytest_runtest_call`, the line of `pytest_terminal_summary`), marked when a warmup asked for the
    module, or when a test asked for it after a stand-in's answers (DryRunRecords)."""
    info = {
        "name": spec.name,
        "sources": [str(s) for s in spec.sources],
        "needs_device_linking": spec.needs_device_linking,
        "aot_path": str(spec.aot_path),
    }
    return (
        json.dumps(
            {
                "test_name": test_name,
                "module_name": spec.name,
                "spec_info": str(info),
                **({"warmup": True} if warmup else {}),
                **({FORESEEN: True} if foreseen else {}),
            }
        )
        + "\n"
    )


def after_pytests_own(hook):
    """pytest's hookimpl(trylast=True), so that -k, -m and --deselect have deselected first and the
    sample, the parts and the gate's selection are of what they left. pytest is imported already
    wherever this module's hooks run (a pytest process loads it with -p); elsewhere (upstream-tests,
    affected, reading its constants) the hook is left as it is, and fidev imports only the standard library."""
    pytest = sys.modules.get("pytest")
    return pytest.hookimpl(trylast=True)(hook) if pytest is not None else hook


def module_built(name: str) -> bool:
    """A module FlashInfer would load without compiling: its library in the JIT dir or the AOT dir
    (JitSpec.jit_library_path and aot_path, flashinfer/jit/core.py at v0.6.3); False where FlashInfer's
    env module is not imported yet."""
    jit_env = sys.modules.get("flashinfer.jit.env")
    if jit_env is None:
        return False
    return any(
        workspace.module_files(Path(folder) / name)[1].exists()
        for folder in (jit_env.FLASHINFER_JIT_DIR, jit_env.FLASHINFER_AOT_DIR)
    )


class Sampling:
    """The sample of the cases collected (fidev.upstream.sample), by the spec upstream-tests wrote;
    in a run, its record beside the process's outcomes. `modules`: {node id: the modules the record
    names for it}, read once."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.seed, self.modules, self.required = upstream_sample.read_spec(settings.sample)
        self.found: upstream_sample.Sample | None = None

    def narrow(self, config, items) -> None:
        """Deselect, as -k does, the cases outside the sample."""
        self.found = upstream_sample.select(upstream_sample.cases_of(items), self.modules, self.seed, self.required)
        keep = set(self.found.selected)
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in keep])
        items[:] = [item for item in items if item.nodeid in keep]

    def record(self, gate_selection: list[str] | None) -> None:
        """What the sample covered, of what the gate let run (None: all of it), beside the outcomes."""
        if not self.settings.in_run or self.found is None:
            return
        chosen = self.found.selected
        kept = (
            sorted({n.split("[")[0] for n in chosen if upstream_gate.selected(n, gate_selection)})
            if gate_selection is not None
            else None
        )
        write_whole(
            Path(f"{self.settings.outcomes}{upstream_sample.RECORD}"),
            json.dumps(upstream_sample.sample_record(self.found, kept)),
        )


class Parts:
    """A part's share of the file's collected cases, deselected as -k does: a part left with none
    ends "no tests ran" (5). First a digest of what it collected, in its outcomes, for
    fidev.upstream.runs to check that every part split the same list."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.splitting = False  # while it deselects another part's share (not a narrowed run)

    def narrow(self, config, items) -> None:
        listed = hashlib.sha256("\n".join(item.nodeid for item in items).encode()).hexdigest()[:16]
        with open(self.settings.outcomes, "a") as f:
            f.write(json.dumps({"nodeid": "", "outcome": COLLECTED, "message": listed}) + "\n")
        i, k = self.settings.part
        self.splitting = True
        try:
            config.hook.pytest_deselected(items=[item for n, item in enumerate(items) if n % k != i - 1])
        finally:
            self.splitting = False
        items[:] = items[i - 1 :: k]


class Narrowing:
    """The one hook that narrows what the process runs, its steps in order (the module's docstring)."""

    def __init__(
        self, sampling: Sampling | None, parts: Parts | None, gate_: upstream_gate.Gate | None, builds: Builds | None
    ):
        self.sampling, self.parts, self.gate, self.builds = sampling, parts, gate_, builds

    @after_pytests_own
    def pytest_collection_modifyitems(self, session, config, items):
        if self.sampling is not None:
            self.sampling.narrow(config, items)
        if self.parts is not None:
            self.parts.narrow(config, items)
        if self.gate is not None:
            self.gate.narrow(config, items)
        if self.sampling is not None:
            self.sampling.record(self.gate.selection if self.gate is not None else None)
        if self.builds is not None:
            self.builds.order(items)


class Unbuilt:
    """What a dry run's test gets for a module it asks to load (DryRunRecords): each function of it
    does nothing and returns None, so that the test goes on to ask for its next modules. `used()` is
    called as a function of it is looked up: from then on the test's control flow may be the
    stand-in's, whichever test it was handed to (a cache of FlashInfer's may keep it)."""

    def __init__(self, name: str, used: Callable[[], None]):
        self.name, self.used = name, used

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self.used()
        return lambda *args, **kwargs: None


def forget_loaded_modules() -> None:
    """Clear the functools caches of FlashInfer's module-level getters (get_batch_prefill_module and
    the like, flashinfer/prefill.py at v0.6.3), so that each test of a dry run asks for its modules
    itself, as it would first in a process, and its records name them. A cache this cannot reach (an
    inner one, such as prefill.py's make_hashable_cache) hands a later test the stand-in it keeps;
    the stand-in says so when used (Unbuilt.used), and what that test asks for after is foreseen."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "flashinfer" or name.startswith("flashinfer.")):
            continue
        for value in list(vars(module).values()):
            clear = getattr(value, "cache_clear", None)
            if callable(clear) and getattr(value, "__module__", None) == name:
                clear()


def ready_to_build(spec) -> None:
    """A module never built, ready for another process to build (the plan's build ahead): its ninja
    file as the spec says now (JitSpec.write_ninja writes where it differs; JitSpec.build, which
    writes one only where it is missing, flashinfer/jit/core.py at v0.6.3, would keep an older one),
    and the generator call that made its spec, which a build in this process would record
    (fidev.builds.module_builds.record_build), so that `affected` can make it again."""
    spec.write_ninja()
    if spec.name in module_choice.GENERATORS:
        build_records.record_call(spec.build_dir, module_choice.CALLS.get(spec.name))


class DryRunRecords:
    """The plan's dry run: every module a test or a warmup asks for, recorded in `dry_dir`, none built;
    a test gets stand-ins (Unbuilt) for what it loads, and a module never built is made ready for the
    plan to build ahead (ready_to_build)."""

    def __init__(self, dry_dir: Path):
        self.dry_dir = dry_dir
        self.current = "unknown"
        self.asked = 0  # the modules the current test asked to load so far

    def pytest_runtest_setup(self, item):
        self.current, self.asked = item.nodeid, 0
        forget_loaded_modules()

    def stand_in_used(self) -> None:
        """The test's control flow may be a stand-in's from here: what it asks for next is foreseen."""
        self.asked = max(self.asked, 1)

    def record(self, specs, warmup: bool = False, foreseen: bool = False) -> None:
        with open(self.dry_dir / f"report-{os.getpid()}.jsonl", "a") as report:
            report.writelines(spec_record(self.current, spec, warmup, foreseen) for spec in specs)

    def pytest_collection_finish(self, session):
        import flashinfer.jit
        from flashinfer.jit import core
        from flashinfer.jit import env as jit_env

        (self.dry_dir / JIT_DIR_FILE).write_text(str(jit_env.FLASHINFER_JIT_DIR))
        collected = self.dry_dir / f"{COLLECTED_PREFIX}{os.getpid()}.json"
        write_whole(collected, json.dumps([item.nodeid for item in session.items]))
        original = core.JitSpec.build
        original_load = core.JitSpec.build_and_load

        def build(spec, verbose, need_lock=True):
            self.record([spec])
            original(spec, verbose, need_lock)  # raises MissingJITCacheError under FLASHINFER_DISABLE_JIT

        def build_and_load(spec):
            if spec.is_aot:  # prebuilt: loaded, as the run will
                return original_load(spec)
            self.record([spec], foreseen=self.asked > 0)
            self.asked += 1
            if not spec.jit_library_path.exists():
                ready_to_build(spec)
            return Unbuilt(spec.name, self.stand_in_used)

        def build_jit_specs(specs, verbose=False, skip_prebuilt=True):
            self.record([spec for spec in specs if not (skip_prebuilt and spec.is_aot)], warmup=True)

        flashinfer.jit.build_jit_specs = core.build_jit_specs = build_jit_specs
        core.JitSpec.build = build
        core.JitSpec.build_and_load = build_and_load


class Builds:
    """A run's builds: FlashInfer's build recorded (module_builds.recording_build), and its warmup's
    build_jit_specs replaced (the module's docstring). `needs`: {node id: its modules} by the
    record, where the run has one; `parts`: whose deselections do not narrow the run."""

    def __init__(
        self,
        settings: Settings,
        needs: dict[str, list[str]] | None = None,
        parts: Parts | None = None,
        after: Callable[[], bool] | None = None,
    ):
        """`after`: the builds beside the cases start once after() is true (affected's gate open)."""
        self.settings, self.needs, self.parts, self.after = settings, needs, parts, after
        self.ending = threading.Event()  # the session ends: a build beside that waits for after() starts not
        self.config = None
        self.current = "unknown"
        # a subset of the file's cases runs (not a part's share): the warmup builds what they need
        self.narrowed = False
        self.kept: list[str] = []  # the node ids to run, once narrowed
        self.later: list = []  # the warmup's modules to build beside the tests once the first case has run
        self.beside: list[threading.Thread] = []
        self.running: list = []  # the ninja processes of those builds
        self.loads: list[str] = []  # the running case's loads (loaded), written once it has run

    def pytest_configure(self, config):
        self.config = config

    def pytest_runtest_setup(self, item):
        self.current = item.nodeid

    def pytest_deselected(self, items):
        """Cases left out: by -k, -m, --deselect, the sample or the gate's selection (a narrowed
        run), or as another part's share (the file runs whole over its parts: not narrowed)."""
        if items and not (self.parts is not None and self.parts.splitting):
            self.narrowed = True

    def order(self, items) -> None:
        """Where the record names the cases' modules: those whose modules are built first, then by
        how many are left to build (a case the record does not name: one); else as collected. Not in
        a pytest-xdist worker: its workers must collect one list, and each would look at the JIT dir
        at another moment."""
        self.kept = [item.nodeid for item in items]
        if not self.needs or hasattr(self.config, "workerinput"):
            return
        left = {}
        for item in items:
            named = self.needs.get(item.nodeid)
            left[item.nodeid] = sum(1 for m in named if not module_built(m)) if named else 1
        items.sort(key=lambda item: left[item.nodeid])  # stable: as collected among equals

    def pytest_runtest_logfinish(self, nodeid, location):
        """A case has run: what it loaded is written (loaded). The first: the warmup's other
        modules build beside the next ones."""
        if self.loads:
            with open(f"{self.settings.outcomes}{LOADED_SUFFIX}", "a") as f:
                f.writelines(self.loads)
            self.loads = []
        if self.later:
            self.start_beside(self.later)
            self.later = []

    def start_beside(self, specs) -> None:
        thread = threading.Thread(target=self.build_beside, args=(specs,), daemon=True)
        self.beside.append(thread)
        thread.start()

    def build_beside(self, specs) -> None:
        """module_builds.build_beside, once after() is true; none where the session ended first."""
        while self.after is not None and not self.after():
            if self.ending.wait(0.1):
                return
        module_builds.build_beside(specs, self.say, self.running)

    def stop_beside(self) -> None:
        """The builds beside the tests, stopped where they still run: no case is left to load their modules."""
        self.ending.set()
        for proc in list(self.running):
            if proc.poll() is None:
                proc.terminate()
        for thread in self.beside:
            thread.join(timeout=30)

    def pytest_sessionfinish(self, session):
        self.stop_beside()
        for line in module_choice.report("upstream-tests"):  # which of its modules ran from edited source
            self.say(line)
        relayed = self.relay_file()
        if relayed.is_file() and not hasattr(self.config, "workerinput"):  # the xdist workers', now that they are done
            self.say("")  # xdist's progress line has no end of its own
            for line in dict.fromkeys(relayed.read_text().splitlines()):
                self.say(line)

    def relay_file(self) -> Path:
        return Path(f"{self.settings.outcomes}.said")

    def say(self, line: str) -> None:
        capture = self.config.pluginmanager.getplugin("capturemanager")
        terminal = self.config.pluginmanager.getplugin("terminalreporter")
        if hasattr(
            self.config, "workerinput"
        ):  # an xdist worker's terminal goes nowhere: the controller says its lines at the end
            with open(self.relay_file(), "a") as relayed:
                relayed.write(line + "\n")
            return
        if terminal is None:
            return
        with capture.global_and_fixture_disabled():
            terminal.write_line(line)

    def pytest_collection_finish(self, session):
        import flashinfer.jit
        from flashinfer.jit import core

        flashinfer.jit.build_jit_specs = core.build_jit_specs = self.build_jit_specs
        recording = module_builds.recording_build(core.JitSpec.build, lambda line: self.say(f"upstream-tests: {line}"))

        def build(spec, verbose, need_lock=True):
            self.loaded(spec)
            recording(spec, verbose, need_lock)

        core.JitSpec.build = build

    def loaded(self, spec) -> None:
        """A module the running case loads (JitSpec.build_and_load builds before every load, a no-op
        where it is built), one line of FlashInfer's JIT-report format, with the JIT dir, written
        beside the outcomes (LOADED_SUFFIX) once the case has run, so that a case stopped half-way
        records nothing: upstream-tests adds them to the record of which tests need each module, every
        module a case loads, where the dry run names only its first."""
        line = json.loads(spec_record(self.current, spec))
        self.loads.append(json.dumps({**line, JIT_DIR_KEY: str(spec.build_dir.parent)}) + "\n")

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

    def needed(self) -> tuple[set[str] | None, bool]:
        """(the modules the cases to run need by the record, or None without one; whether a case to
        run is one the record does not name)."""
        if not self.needs:
            return None, True
        named = [self.needs.get(nodeid) for nodeid in self.kept]
        return {m for modules in named if modules for m in modules}, any(not modules for modules in named)

    def build_jit_specs(self, specs, verbose=False, skip_prebuilt=True):
        todo = [spec for spec in specs if not (skip_prebuilt and spec.is_aot) and not self.built_already(spec)]
        if not todo:
            return
        if not self.narrowed and self.after is not None and not self.after():
            # behind affected's gate, not open: the rebuild holds the JIT dir's lock, which build_specs would wait on
            self.say(
                f"upstream-tests: {self.current}: its warmup_jit fixture asks for {len(todo)} module(s), which "
                "build beside the cases once affected's rebuild is done"
            )
            self.start_beside(todo)
            return
        if not self.narrowed:
            self.say(f"upstream-tests: {self.current}: building {len(todo)} module(s) its warmup_jit fixture asks for")
            seconds, _ = module_builds.build_specs(todo, self.say)
            self.say(f"upstream-tests: warmup built in {seconds:.0f} s")
            return
        needed, unnamed = self.needed()
        now = [spec for spec in todo if needed is not None and spec.name in needed]
        # with no record at all, the rest build beside the cases after the first; with one, a case it does not
        # name builds its own, and no module no case needs by the record is built
        self.later = [spec for spec in todo if spec not in now] if needed is None else []
        self.say(
            f"upstream-tests: {self.current}: its warmup_jit fixture asks for {len(todo)} module(s); "
            "a subset of the file's cases "
            f"runs, so {self.warmup_plan(needed is not None, len(now), len(todo), unnamed)}"
        )
        if now:
            self.start_beside(now)

    @staticmethod
    def warmup_plan(recorded: bool, now: int, asked: int, unnamed: bool) -> str:
        """What the narrowed warmup builds, said."""
        if not recorded:
            return "each case builds what it loads, and the rest build beside them after the first case"
        said = (
            [
                f"the {now} its cases need by the record build side by side now, "
                "the cases with their modules built running first"
            ]
            if now
            else []
        )
        if unnamed:
            said.append("a case the record does not name builds what it loads")
        if asked - now:  # with a record, nothing builds beside the cases after the first
            said.append(f"the {asked - now} no case to run needs are not built")
        return "; ".join(said)


def register(config, settings: Settings) -> None:
    """Each concern's plugin, for a process of the dry run or of a run."""
    manager = config.pluginmanager
    sampling = Sampling(settings) if settings.sample else None
    parts = Parts(settings) if settings.in_run and settings.part else None
    gate_, builds = None, None
    if settings.dry_dir is not None:
        manager.register(DryRunRecords(settings.dry_dir), "fidev-dry-run-records")
    else:
        stop = register_outcomes(config, settings)
        if settings.gate:
            gate_ = gated(settings, sampling.modules if sampling else None, stop)
            manager.register(upstream_gate.run_in_turn(gate_), "fidev-gate-in-turn")
        builds = Builds(settings, sampling.modules if sampling else None, parts, gate_.is_open if gate_ else None)
        manager.register(builds, "fidev-builds")
    manager.register(Narrowing(sampling, parts, gate_, builds), "fidev-narrowing")


def gated(settings: Settings, needs: dict[str, list[str]] | None, stop) -> upstream_gate.Gate:
    """The run's gate (fidev.upstream.gate): the modules the record names for each case, whether a
    module is built, and the run's early stop (`stop`: its plugin, None without one)."""
    return upstream_gate.Gate(
        settings.gate, settings.gate_owner, needs, module_built, stop.check if stop is not None else lambda: False
    )


def register_outcomes(config, settings: Settings):
    """A run's outcomes and its early stop (fidev.upstream.outcomes): under pytest-xdist, the
    controller writes what its workers report, once. Returns the early stop's plugin, None without one."""
    manager = config.pluginmanager
    if not hasattr(config, "workerinput"):
        outcomes = Outcomes(settings.outcomes, settings.stop_file)
        manager.register(outcomes, "fidev-outcomes")
        if hasattr(config.hook, "pytest_xdist_node_collection_finished"):
            manager.register(XdistTotal(outcomes), "fidev-xdist-total")
    if not (settings.stop_after and settings.stop_file):
        return None
    stop = early_stop(settings.stop_after, settings.stop_file, settings.outcomes)
    manager.register(stop, "fidev-early-stop")
    return stop


SETTINGS = Settings.read()  # once, as this module is loaded (-p): what the parent gave this process


def pytest_configure(config):
    """`-p fidev.upstream.plugin` in a dry-run process (the controller and each xdist worker), or
    in a test file's process of a run."""
    if SETTINGS.dry_dir is not None or SETTINGS.outcomes is not None:
        register(config, SETTINGS)


# Loaded with -p, this module is imported before FlashInfer's conftest imports flashinfer: the
# kernel source mode must be in force by then, in every process of the dry run or the run.
if SETTINGS.dry_dir is not None or SETTINGS.outcomes is not None:
    module_choice.apply(
        kernel_source.mode()
    )  # a process of the run: the mode its parent ran in, from the environment it passed
