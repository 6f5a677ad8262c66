"""Rebuild and test what your edits of the vendored FlashInfer touch: changed file, then modules, then tests, then result.

  affected.py [--list]

1. What changed, since each built module of FlashInfer's JIT dir was built (smoke's and
   abi-smoke's, and any upstream-tests built): its sources and headers, by content against the
   hashes `build` recorded (fidev.records.ninja_inputs: a touched file with the same content is no edit),
   and the tree's Python files, which generate modules' sources (fidev.records.build_records). When a
   Python file changed, the modules with generated sources are regenerated without compiling
   (smoke's through fidev.builds.smoke_modules; FlashInfer's tests' by the generator call their build
   recorded, else a dry run of a test recorded for them, FLASHINFER_DISABLE_JIT=1) and their
   generated sources compared by content.
2. The modules' tests: smoke's and abi-smoke's from fidev.builds.smoke_modules; FlashInfer's own from the
   record the upstream-tests plan keeps beside the JIT dir (which test asked for which module).
3. It rebuilds just those modules and runs just those tests, then prints one table and a line
   naming what failed and the command that reruns it alone. --list stops after the table's first
   three columns. Exit status 1 when a build or a test failed.

What costs time besides the compile is paid during it: FlashInfer's tests start with the build
(upstream-tests --no-plan), import and collect, and wait at a gate until the modules are built
(fidev.upstream.plugin.GATE); for a Python edit they start before the regeneration, for every
module it may change, and the gate names those it did; many cases spread over several pytest
processes on each GPU (upstream-tests --per-gpu); this process imports flashinfer for smoke's
tests meanwhile, and runs them while FlashInfer's run.
"""

from __future__ import annotations

import importlib.util
import math
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fidev.builds import build_stamp, module_builds, smoke_modules
from fidev.core import workspace
from fidev.core.failure import ArgumentParser, Failure, exit_now, run_main
from fidev.core.manifest import ROOT, pins
from fidev.jit import kernel_source, module_choice, uris
from fidev.records import build_records, ninja_inputs
from fidev.smoke import gpu_suite
from fidev.tree import families as upstream_suites
from fidev.tree import source_tree
from fidev.upstream import plugin as upstream_plugin

NOTHING_PASSED = -1  # pytest's status 0 with every test skipped: not a pass
BUILD_FIX = "pixi run -e flashinfer-dev build (python scripts/build.py), then edit and run affected"
# FlashInfer's small cases run about 110 a second in one process on the H100 host (test_norm.py's
# 2705 in 24 s): past this many a case, another pytest process on the GPU pays for its start
# (torch's import and the file's collection, and its CUDA context: all before the gate). With 8
# processes test_activation.py's 630 silu cases ran in 6.4 to 6.8 s on the H100 host, with 4 in 7.0
# to 9.0 s (docs/flashinfer-dev.md, "affected").
CASES_PER_PROCESS, MAX_PROCESSES = 80, 8
THREADS = "OMP_NUM_THREADS"  # torch's CPU thread pool in each process; the user's own value is kept
PAST_BUILD = re.compile(r"affected: FlashInfer's tests ended (\d+\.\d) s after the build \(their last case (\d+\.\d) s after it\)")


def build_fix() -> str:
    """How to get modules built: in `auto` with a prebuilt set, build compiles only the modules
    you edited, so a first build for affected is `vendored`."""
    if kernel_source.mode() == kernel_source.AUTO and module_choice.prebuilt_available():
        return (f"{kernel_source.ENV}={kernel_source.VENDORED} pixi run -e flashinfer-dev build, then affected with the same setting "
                "(in auto, a module flashinfer-jit-cache ships is built here only once you edit it)")
    return BUILD_FIX


def jit_dirs(ws: workspace.Workspace) -> list[Path]:
    """The JIT dirs of the pinned version, each arch set's (fidev.core.workspace)."""
    found = ws.jit_dirs()
    if found:
        return found
    others = ws.other_versions()
    if others:
        raise Failure(f"the JIT dir {ws.cache} holds builds of FlashInfer {', '.join(others)}, none of {ws.version}, the pinned one",
                      build_fix())
    raise Failure(f"nothing is built yet: no JIT dir under {ws.cache}", build_fix())


class Built:
    """A module built in a JIT dir, in the shape fidev.builds.module_builds builds."""

    def __init__(self, build_dir: Path):
        self.name, self.build_dir = build_dir.name, build_dir
        self.ninja_path, self.jit_library_path = build_dir / "build.ninja", build_dir / f"{build_dir.name}.so"

    @property
    def sources(self) -> list[str]:
        """Its sources, from the build.ninja FlashInfer wrote (`build <obj>: [cuda_]compile <source>`,
        flashinfer/jit/cpp_ext.py, lines 281-290 at v0.6.3): fidev.builds.module_builds shares the cores by them."""
        return re.findall(r"^build \S+: (?:cuda_)?compile (\S+)", self.ninja_path.read_text(), re.M)

    @property
    def generated(self) -> bool:
        """Some of its sources are written by a generator, in the workspace's `generated` folder beside
        the JIT dir (FLASHINFER_GEN_SRC_DIR, flashinfer/jit/env.py lines 144-145 at v0.6.3). A module
        of the tree's csrc/ files alone (such as the one tests/utils/test_norm.py builds with
        gen_jit_spec, lines 342-366) has nothing a Python edit could regenerate."""
        gen_dir = (self.build_dir.parent.parent / "generated").resolve()  # cpp_ext.py writes sources resolved (line 292)
        return any(Path(src).is_relative_to(gen_dir) for src in self.sources)


def built_modules(jit_dir: Path) -> list[Built]:
    return [Built(d) for d in sorted(jit_dir.iterdir()) if (d / "build.ninja").is_file() and (d / f"{d.name}.so").is_file()]


def tier_keys(jit_dir: Path) -> dict[str, str]:
    """{module name: smoke module key} for the modules `build` made, from its stamps (no import)."""
    return {m.name: m.key for m in build_stamp.stamped_modules() if m.build_dir.parent == jit_dir}


def check_tree(tree: Path, modules: list[Built]) -> None:
    """The vendored tree is there, and the built modules were compiled from it."""
    found = source_tree.inspect(tree, pins())
    if found.kind in ("missing", "not a folder", "empty"):
        raise Failure(f"there is no vendored FlashInfer tree at {source_tree.shown(tree)} ({found.kind})",
                      "get it first (README: First, the FlashInfer source), then build")
    real = str(tree.resolve())
    folders: dict[str, str] = {}

    def resolved(path: str) -> str:
        """Each folder resolved once (the inputs of 10 modules are some 20,000 paths in a few hundred
        folders; the editable install's flashinfer/data links are folders), then the file itself
        where it is one of a FlashInfer tree's."""
        folder, name = os.path.split(path)
        if folder not in folders:
            folders[folder] = os.path.realpath(folder)
        at = os.path.join(folders[folder], name)
        return os.path.realpath(at) if "/include/flashinfer/" in at or "/csrc/" in at else at

    checked: set[str] = set()
    for module in modules:
        for path in sorted(ninja_inputs.inputs(module.build_dir, module.ninja_path) - checked):
            checked.add(path)
            at = resolved(path)
            if ("/include/flashinfer/" in at or "/csrc/" in at) and not (at == real or at.startswith(real + os.sep)):
                raise Failure(f"{module.name} was built from {at.split('/include/flashinfer/')[0].split('/csrc/')[0]}, "
                              f"not the vendored tree {source_tree.shown(tree)}",
                              "rebuild it from the vendored tree: pixi run -e flashinfer-dev build, or upstream-tests FAMILY for "
                              "FlashInfer's own tests' modules")


def regenerate(tier: list[str], calls: dict[str, dict], upstream_nodes: list[str]) -> tuple[dict, bool, set[str]]:
    """Write the generated sources of the modules again, compiling nothing: smoke's by their
    generators, FlashInfer's tests' by the call that made each one's JitSpec where its build recorded
    one (fidev.jit.module_choice.call_again), both after one import of flashinfer, in a thread; the rest
    meanwhile by a dry run of their tests (a process of its own). Returns smoke's modules' new
    JitSpecs by name (a build of them rewrites build.ninja too), whether the dry run finished (a
    dropped or failed one regenerated nothing for sure), and the modules whose call did not make them."""
    specs, dry_run_done, raised, missed = {}, True, [], set()

    def ours() -> None:
        try:
            from fidev.jit.flashinfer_import import import_flashinfer

            import_flashinfer()
            for key in tier:
                spec = smoke_modules.BY_KEY[key].make()  # the generator writes its sources (write_if_different)
                specs[spec.name] = spec
            missed.update(name for name, call in calls.items() if not module_choice.call_again(name, call))
        except BaseException as error:  # noqa: BLE001 (raised again in the main thread)
            raised.append(error)

    thread = threading.Thread(target=ours, daemon=True)
    if tier or calls:
        thread.start()
    dry_run_failure = None
    if upstream_nodes:
        import upstream_tests

        try:
            tests = upstream_tests.tests_dir()
            dry_run_done = upstream_tests.plan(upstream_tests.resolve(upstream_nodes, tests), [], tests) is not None
        except Failure as failure:  # said after the import's own failure, which comes first
            dry_run_failure = failure
    if tier or calls:
        thread.join()
    for failure in [*raised, dry_run_failure]:
        if failure is not None:
            raise failure
    return specs, dry_run_done, missed


def run_ours(tests: list[str], wide: list[str]) -> tuple[int, set[str]]:
    """smoke's and abi-smoke's tests, in this process as smoke runs them (fidev.smoke.gpu_suite: no
    third-party plugin), so that a flashinfer the regeneration imported is not imported again:
    (status, the node ids that failed or errored). Our conftest redirects FlashInfer's variables
    for the session; the environment is restored after it, for FlashInfer's own tests."""
    class Failed:
        def __init__(self):
            self.ids, self.interrupted = set(), False

        def pytest_runtest_logreport(self, report):
            if report.failed:
                self.ids.add(report.nodeid)

        def pytest_keyboard_interrupt(self, excinfo):  # pytest.main keeps Ctrl-C (SIGTERM, here) to itself: status 2
            self.interrupted = True

    print(f"affected: smoke and abi-smoke tests: {short(tests, 4)}", flush=True)
    collector, saved = Failed(), dict(os.environ)
    os.environ[gpu_suite.NO_AUTOLOAD] = "1"
    try:
        status = gpu_suite.run_paths("affected", [str(ROOT / "tests" / t) for t in tests], ["-q", *wide], plugins=(collector,))
    except Failure as failure:  # nothing passed: every test skipped, or none selected
        print(f"affected: {failure.problem}")
        status = NOTHING_PASSED
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if collector.interrupted:
        raise KeyboardInterrupt  # so that what runs beside them is stopped too
    return status, collector.ids


def cases_by_file(recorded: dict[str, list[str]], modules) -> dict[str, int]:
    """{test file: how many recorded cases of these modules it has}."""
    found: dict[str, int] = {}
    for case in {t for name in modules for t in recorded.get(name, [])}:
        found[case.split("::")[0]] = found.get(case.split("::")[0], 0) + 1
    return found


def processes(cases_per_file: dict[str, int]) -> tuple[list[str], dict[str, str]]:
    """upstream-tests' option for FlashInfer's tests of an edit, how many processes run each file
    on each GPU at once (`--per-gpu`, fidev.upstream.runs: a part each; a long file is in a part
    per GPU already, fidev.upstream.runs.parts), and the environment of those processes: a process
    per CASES_PER_PROCESS cases of the largest part, up to MAX_PROCESSES and half the cores shared
    by the GPUs in use; one for a few cases. The cores are shared among their torch thread pools
    too (THREADS), unless the user set it. Separate processes, not pytest-xdist's workers: those
    start only once xdist's controller has imported torch and flashinfer (FlashInfer's conftest
    imports both), and on the H100 host the last of 8 was ready 1.0 to 1.4 s after the gate."""
    from fidev.upstream import runs as upstream_runs

    gpus = len(upstream_runs.host_gpus())
    times = upstream_runs.load_times(upstream_runs.times_file(workspace.read(pins().flashinfer).version_dir))
    split = {f: upstream_runs.parts(times.get(f), gpus) for f in cases_per_file}
    at_once = max(1, min(sum(split.values()), gpus))
    cpus = os.cpu_count() or 1
    largest = max((math.ceil(n / split[f]) for f, n in cases_per_file.items()), default=0)
    n = max(1, min(MAX_PROCESSES, cpus // (2 * at_once), math.ceil(largest / CASES_PER_PROCESS)))
    env = {} if THREADS in os.environ else {THREADS: str(max(1, cpus // (at_once * n)))}
    return (["--per-gpu", str(n)] if n > 1 else []), env


def past_build(ended: float, last: float | None) -> str:
    """The PAST_BUILD line: how long FlashInfer's tests ran after the gate opened, to their end and
    to their last case's (the rest is their processes' exit and upstream-tests' own summary)."""
    last_s = max(0.0, last if last is not None else ended)
    return f"affected: FlashInfer's tests ended {max(0.0, ended):.1f} s after the build (their last case {last_s:.1f} s after it)"


class FlashInferTests:
    """FlashInfer's tests of the edited modules, through upstream-tests in a process of its own,
    started before the build so that its processes import and collect while the modules compile;
    they wait at a gate (fidev.upstream.plugin.GATE) until `open()`, which may name the ones to run
    (`deferred`: started for every module a Python edit may change). Its output is held until
    `finish()`, so that it does not cut into smoke's tests, which run meanwhile in this process."""

    started: set[FlashInferTests] = set()  # stopped by run() however it ends

    def __init__(self, tests: list[str], cases_per_file: dict[str, int], deferred: bool = False):
        self.tests = tests
        self.opened: float | None = None  # when the gate opened (time.time())
        workers, threads = processes(cases_per_file)
        cmd = [sys.executable, str(ROOT / "scripts/upstream_tests.py"), "--no-plan", *tests, *workers]
        which = "of the modules the edit may change" if deferred else ""
        then = "; those of the modules it changed run once the build is done" if deferred else " and run once the build is done"
        print(f"affected: FlashInfer's tests {which}{' ' if which else ''}({sum(cases_per_file.values())} recorded case(s)"
              f"{f', {workers[1]} processes a GPU' if workers else ''}) start now{then}: "
              f"{' '.join(cmd[:5])}{' ...' if len(cmd) > 5 else ''}", flush=True)
        self.folder = Path(tempfile.mkdtemp(prefix=workspace.AFFECTED_SCRATCH))
        self.gate = self.folder / "gate"
        env = {**os.environ, **threads, upstream_plugin.GATE: str(self.gate), upstream_plugin.GATE_OWNER: upstream_plugin.process_identity(os.getpid())}
        try:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        except OSError:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        FlashInferTests.started.add(self)
        self.lines: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self.pump, daemon=True)
        self.reader.start()

    def pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def open(self, selection: list[str] | None = None) -> None:
        """The modules are built: the tests may load them; all, or those `selection` names."""
        upstream_plugin.open_gate(self.gate, selection)
        self.opened = time.time()

    def finish(self) -> tuple[int, set[str]]:
        """Its output, then (status, what failed or errored): the FAILED and ERROR lines it prints,
        and all of them from its run folder's list (upstream_tests.FAILING_LIST) where it printed
        only the first."""
        failed, folder = set(), None
        while (line := self.lines.get()) is not None:
            sys.stdout.write(line)
            if m := re.match(r"(?:FAILED|ERROR) (\S+)", line):
                failed.add(m.group(1))
            elif m := re.search(r"JUnit XML and logs in (\S+)", line):
                folder = Path(m.group(1))
        status = self.proc.wait()
        ended = time.time()
        sys.stdout.flush()
        import upstream_tests

        if folder is not None and (folder / upstream_tests.FAILING_LIST).is_file():
            failed |= {line.split()[1] for line in (folder / upstream_tests.FAILING_LIST).read_text().splitlines() if len(line.split()) > 1}
        if self.opened is not None:
            from fidev.upstream import runs as upstream_runs

            last = upstream_runs.last_case_end(folder) if folder is not None else None
            print(past_build(ended - self.opened, None if last is None else last - self.opened), flush=True)
        return status, failed

    def stop(self) -> None:
        """Stop it, if it runs (a failed build, Ctrl-C): upstream-tests stops its test files'
        processes on SIGTERM. Then the gate's folder goes."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        FlashInferTests.started.discard(self)


def import_meanwhile() -> threading.Thread | None:
    """flashinfer imported in a thread while the build runs, since smoke's tests run in this
    process and would pay for it after. Only a head start: where it fails, the tests' own import
    fails again and says why, as smoke does (a host without torch: they skip)."""
    if "flashinfer" in sys.modules:
        return None

    def work() -> None:
        try:
            import flashinfer  # noqa: F401
        except BaseException:  # noqa: BLE001, S110 (said by the tests' own import)
            pass

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [min(60, max(len(r[i]) for r in rows)) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]) for r in rows)


def short(items, n: int = 3) -> str:
    items = sorted(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "") if items else "-"


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--list", action="store_true", help="name the changed files, modules and tests; build and run nothing")
    args = parser.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):  # as Ctrl-C: what runs is stopped (run_tests), no traceback (run)
        signal.signal(sig, signal.default_int_handler)
    try:
        return run(args)
    except KeyboardInterrupt:
        raise Failure("interrupted (the builds and tests it started were stopped)", "run it again: pixi run -e flashinfer-dev affected",
                      exit_status=130) from None


def run(args) -> int:
    try:
        return run_affected(args)
    finally:  # what a failure, Ctrl-C or an early return left running (stop() is idempotent)
        for tests in list(FlashInferTests.started):
            tests.stop()


def run_affected(args) -> int:
    started = time.perf_counter()
    p = pins()
    tree = p.source_dir
    dirs = jit_dirs(workspace.read(p.flashinfer))
    modules = [m for d in dirs for m in built_modules(d)]
    if not modules:
        raise Failure(f"nothing is built yet in {', '.join(map(str, dirs))}", build_fix())
    check_tree(tree, modules)
    mode = kernel_source.apply()
    if mode == kernel_source.PREBUILT and importlib.util.find_spec(uris.JIT_CACHE_PACKAGE) is not None:
        # FlashInfer would load the jit-cache's copy of any module it ships, whatever was rebuilt here
        raise Failure(f"kernel source {mode}: flashinfer-jit-cache is installed, so the tests would run its prebuilt kernels, not your edits",
                      f"{kernel_source.ENV}={kernel_source.VENDORED} pixi run -e flashinfer-dev affected")

    def changes() -> dict[str, dict[str, str]]:
        """{module name: {changed file: how}} by content, sources and headers."""
        found, stats = {}, {}
        for m in modules:
            edits = ninja_inputs.edited(m.build_dir, stats)
            if edits is None:  # built without a content record: ninja's mtimes decide
                pending = ninja_inputs.dry_run(m.build_dir, m.ninja_path)
                edits = {f"{m.name} (no record: ninja finds newer inputs)": "edited"} if pending is None or pending[0] else {}
            if edits:
                found[m.name] = edits
        return found

    tier = {name: key for d in dirs for name, key in tier_keys(d).items()}
    recorded = {name: tests for d in dirs for name, tests in build_records.module_tests(d).items()}
    generators = {m.name: build_records.changed_generators(m.build_dir, tree) or [] for m in modules}
    python_edits = sorted({f for files in generators.values() for f in files})
    specs, unregenerated, early = {}, set(), None
    if python_edits:  # regenerate, compiling nothing, so that generated sources show what changed
        stale = [m for m in modules if generators[m.name]]
        # a module of csrc/ files alone is as built (smoke's are made again all the same: cheaply, and build needs their JitSpecs)
        plain = [m.name for m in stale if m.name not in tier and not m.generated]
        stale = [m for m in stale if m.name not in plain]
        lost = [m.name for m in stale if m.name not in tier and not recorded.get(m.name)]
        print(f"affected: {short(Path(f).name for f in python_edits)} changed: regenerating the sources of {len(stale) - len(lost)} "
              f"module(s), compiling nothing" + (f"; no test is recorded for {short(lost)}, so it cannot be regenerated here" if lost else ""))
        theirs_stale = [m for m in stale if m.name not in tier and recorded.get(m.name)]
        calls = {m.name: call for m in theirs_stale if (call := build_records.recorded_call(m.build_dir))}
        # the rest, by one recorded test per module: any test that asks for a module makes all of its JitSpec
        dry = [m.name for m in theirs_stale if m.name not in calls]
        may_change = [m.name for m in stale if m.generated]  # what the regeneration may show changed
        if not args.list and (early_tests := sorted({t.split("[")[0] for n in may_change for t in recorded.get(n, [])})):
            early = FlashInferTests(early_tests, cases_by_file(recorded, may_change), deferred=True)
        regenerating = time.perf_counter()
        specs, dry_run_done, missed = regenerate([tier[m.name] for m in stale if m.name in tier], calls, sorted({min(recorded[n]) for n in dry}))
        print(f"affected: regenerated in {time.perf_counter() - regenerating:.1f} s (" + ", ".join(
            f"{n} {how}" for n, how in ((sum(m.name in tier for m in stale), "by smoke's generators"), (len(calls), "by recorded call"),
                                        (len(dry), "by a dry run of a recorded test"), (len(plain), "of csrc/ files alone, as built")) if n)
              + ")", flush=True)
        # their tests regenerate them when they run: run those, and keep the edit unrecorded
        unregenerated = missed | (set(dry) if not dry_run_done else set())
        if unregenerated:
            why = "; ".join(w for w, applies in (("the dry run did not finish", not dry_run_done),
                                                  ("its recorded call made no such module", missed)) if applies)
            print(f"affected: {short(unregenerated)} could not be regenerated here ({why}), so it may hold the edit: its tests run, and regenerate it")
    changed = changes()
    for name in unregenerated:
        changed.setdefault(name, {})["(not regenerated)"] = "edited"
    for name, edits in changed.items():
        gone = [f for f, how in edits.items() if how == "deleted"]
        if gone:
            raise Failure(f"{gone[0]}, an input of {name}, is gone (deleted since the build)",
                          "restore it (git checkout -- FILE in the tree), or regenerate it: pixi run -e flashinfer-dev build "
                          "(smoke's modules), upstream-tests FAMILY (FlashInfer's tests' modules)")
    for m in modules:  # regenerated to the same sources, or none to regenerate: current as built, for the next run too
        if generators[m.name] and m.name not in changed and (m.name in tier or not m.generated
                                                             or recorded.get(m.name) and m.name not in unregenerated):
            build_records.record_generators(m.build_dir, tree)
    real = tree.resolve()

    def in_tree(f: str) -> str:
        """A changed input as the user knows it: relative to the tree (ninja's deps may name it
        through the editable install's flashinfer/data links), else as given."""
        resolved = Path(f).resolve()
        return str(resolved.relative_to(real)) if resolved.is_relative_to(real) else f

    by_file: dict[str, set[str]] = {}
    for name, edits in changed.items():
        for f in edits:
            via_generator = python_edits and ("/generated/" in f or f == "(not regenerated)")
            shown = f"{short(Path(g).name for g in python_edits)} -> {Path(f).name}" if via_generator else in_tree(f)
            by_file.setdefault(shown, set()).add(name)
    if python_edits and not any(" -> " in k for k in by_file):  # regenerated, and no module's sources changed
        for f in python_edits:
            by_file.setdefault(in_tree(f), set())
    # include/ and csrc/ files no built module compiles: named with the families that would
    unreached = sorted({f for d in dirs for f in build_records.changed_tree_files(d, tree) or []} - set(by_file))
    for f in unreached:
        by_file[f] = set()
    checked_s = time.perf_counter() - started
    if not by_file:
        print(f"affected: nothing changed since the {len(modules)} built modules were built (checked in {checked_s:.2f} s)")
        return 0
    reaching = upstream_suites.families_compiling(tree, [f for f, names in by_file.items() if not names and not f.startswith("/")])

    def selectors(names) -> set[str]:
        """What a module's tests are, as node ids or function prefixes of pytest's failure lines."""
        return {f"tests/{t}" for n in names if n in tier for t in smoke_modules.BY_KEY[tier[n]].tests} | \
            {t.split("[")[0] for n in names for t in recorded.get(n, [])}

    ours = sorted({t for name in changed if name in tier for t in smoke_modules.BY_KEY[tier[name]].tests})
    # by test function, each with all its cases: the record names each case, thousands for a family
    theirs = sorted({t.split("[")[0] for name in changed for t in recorded.get(name, [])})
    unmapped = sorted(name for name in changed if name not in tier and not recorded.get(name))
    rows = [("changed file", "modules", "tests", "result")]
    for f, names in sorted(by_file.items()):
        tests = selectors(names)
        rows.append((source_tree.shown(Path(f)) if f.startswith("/") else f, short(names, 2) if names else "no built module",
                     f"{len(tests)} test(s)" if tests else "-", ""))

    def hints() -> None:
        if unmapped:
            print(f"affected: no test is recorded for {short(unmapped)}: `upstream-tests FAMILY` (with its plan) records them")
        for f, families in sorted(reaching.items()):
            print(f"affected: {f} reaches no built module; " + (
                f"the tests of {', '.join(families)} would build one: pixi run -e flashinfer-dev upstream-tests {families[0]}" if families
                else "no kernel family's sources include it"))

    if args.list or not changed:
        print(table(rows))
        hints()
        return 0

    to_build = [specs.get(m.name, m) for m in modules if m.name in changed]
    if early and theirs and set(theirs) <= set(early.tests):  # started before the regeneration: the gate will name these
        their_run, selection = early, theirs
    else:  # imports and collects while the modules compile
        if early:
            early.stop()
        their_run, selection = (FlashInferTests(theirs, cases_by_file(recorded, changed)) if theirs else None), None
    importing = None
    try:
        importing = import_meanwhile() if ours else None
        try:
            build_s, slowest = module_builds.build_specs(to_build)
        except Failure as failure:
            print(table([rows[0], *[(*r[:3], "build failed") for r in rows[1:]]]))
            raise Failure(f"the build of {short(m.name for m in to_build)} failed: {failure.problem}", failure.fix) from None
        if their_run:
            their_run.open(selection)
        built = f"{len(to_build)} module(s) rebuilt in {build_s:.1f} s" + (f" (slowest object {slowest[0][0]:.1f} s)" if slowest else "")
        print(f"affected: {built}")
        failed: set[str] = set()
        broken, reruns = [], []
        if ours:
            if importing:
                importing.join()
            wide = ["--wide"] if any("/test_wide.py::" in t for t in ours) else []
            status, bad = run_ours(ours, wide)
            failed |= bad
            if bad:
                reruns.append("pixi run -e flashinfer-dev python -m pytest " + " ".join(map(shlex.quote, sorted(bad))) + "".join(f" {w}" for w in wide))
            elif status != 0:
                broken.append("no smoke or abi-smoke test passed (skipped: reasons above)" if status == NOTHING_PASSED
                              else f"tests/ exited {status} with no failed test named")
        if their_run:
            their_status, their_failed = their_run.finish()
    finally:
        if their_run:
            their_run.stop()
        if importing:  # not left importing torch while the interpreter exits (a failed build)
            importing.join(timeout=60)
    if theirs:
        status, bad = their_status, their_failed
        failed |= bad
        if bad:
            first = " ".join(map(shlex.quote, sorted(bad)[:5]))
            reruns.append(f"pixi run -e flashinfer-dev upstream-tests --no-plan {first}" + (f" (the first 5 of {len(bad)})" if len(bad) > 5 else ""))
        elif status != 0:
            broken.append(f"upstream-tests exited {status} with no failed test named (its last lines above say why)")
    result = []
    for row, names in zip(rows[1:], [names for _, names in sorted(by_file.items())], strict=True):
        sel = selectors(names)
        # a test id (a case of a selected function), or a file that did not collect or finish
        mine = [f for f in failed if any(f == x or f.startswith(x + "[") or f.startswith(x + "::") or f == x.split("::")[0] for x in sel)]
        result.append((*row[:3], f"{len(mine)} failed" if mine else "passed" if sel and not broken else "-" if not sel else "unknown"))
    print(table([rows[0], *result]))
    hints()
    total = time.perf_counter() - started
    if failed or broken:
        print(f"affected: {len(failed)} failed ({short(failed, 4)}){'; ' + '; '.join(broken) if broken else ''}; {built}; {total:.1f} s "
              f"in all\naffected: rerun alone: " + ("; ".join(reruns) or "see the output above"))
        return 1
    print(f"affected: every selected test passed; {built}; {total:.1f} s in all")
    return 0


if __name__ == "__main__":
    status = run_main(main)
    if "torch" in sys.modules:  # smoke's tests or the regeneration imported it: its teardown is no part of the answer
        exit_now(status)
    sys.exit(status)
