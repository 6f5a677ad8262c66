"""Building FlashInfer JIT modules the way FlashInfer's own loader does: each module with its own
ninja in its own folder (`JitSpec.build` runs `ninja -C <jit dir>/<module>`, flashinfer/jit/core.py at
v0.6.3), several side by side, with one progress line per object and the first compiler error.

Why never one combined build: ninja keeps its build and deps logs per build folder. FlashInfer's
`build_jit_specs` (core.py) runs one ninja over a `subninja` of every module from the JIT dir's root,
so its logs sit there; the module's own folder keeps the old ones, and ninja finds their deps records
older than the objects it just rebuilt ("stored deps info out of date"), so the next per-module
build (the loader's, or `build`'s) compiles everything again. Both build.py and upstream-tests
(for the `warmup_jit` fixtures of FlashInfer's tests) build through here instead.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fidev.core import numbers, workspace
from fidev.core.failure import Failure
from fidev.jit import module_choice
from fidev.records import build_records, compile_log, ninja_inputs

SLOWEST_SHOWN = 5
# A line of compiler or linker output that names a cause. ninja's `FAILED:` line, collect2's
# summary and ninja's own epilogue only restate it.
ERROR_LINE = re.compile(r"\berror\b|cannot find -l|undefined reference to|No such file or directory", re.IGNORECASE)
NOT_THE_CAUSE = re.compile(r"(FAILED:|collect2:|ninja: build stopped)")
BUILD_FAILED_FIX = "read the compiler output above; `pixi run -e flashinfer-dev preflight` checks the toolchain"
NINJA_FIX = "check that ninja is on the PATH and the host has memory to spare: `pixi run -e flashinfer-dev preflight`"
BUG_FIX = "run it again; if it raises again, report the error above with the command that ran"


def first_error(lines: list[str]) -> str:
    """The first line of a failed build's output that names a cause, else its last line."""
    return next(
        (line.strip() for line in lines if ERROR_LINE.search(line) and not NOT_THE_CAUSE.match(line.strip())),
        lines[-1].strip() if lines else "no output",
    )


_JOBS_WARNED: set[str] = set()  # the MAX_JOBS values job_budget has warned of in this process: once each
_JOBS_WARNING = threading.Lock()  # the builds' threads read it too

# The memory one compile job is given. FlashInfer's heaviest objects (gdn_prefill_sm90's, CUTLASS for sm_90a)
# take several GiB each in cicc: twice the cores of them at once were killed for memory on a GPU host
# (docs/measurements.md, row "compile memory per job").
JOB_MEMORY = 7 * 2**30
MEMINFO = Path("/proc/meminfo")
PROC_CGROUP = Path("/proc/self/cgroup")  # this process's cgroups: `0::/path` (v2), `4:memory:/path` (v1)
CGROUP = Path("/sys/fs/cgroup")  # where the cgroup hierarchies are mounted
DEFAULT_JOBS = "twice the cores, and no more than the memory free holds at 7 GiB a job"
# A memory cgroup's files: its limit, its use, and memory.stat's line of the page cache the kernel reclaims
# before it kills (counted free, as MemAvailable counts it). v1 writes a limit of about 2**63 for none.
V2_FILES = ("memory.max", "memory.current", "inactive_file")
V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
NO_LIMIT = 2**60


def job_budget() -> int:
    """The jobs one build's modules run at once, all of them together (each build reads it as it starts: two
    builds side by side, in one process or two, take it each): MAX_JOBS where it is a whole number
    from 1 (ASCII digits alone: str.isdigit takes '²', which int() refuses), else DEFAULT_JOBS (a CUDA
    compile waits on its files part of the time; memory_jobs). Any other value is ignored, with one warning
    line naming it, as FlashInfer 0.6.3 ignores what is no digits (`_get_num_workers`,
    flashinfer/jit/cpp_ext.py); an empty one counts as unset. Not refused: this is read in the middle of a
    run, by the builds' threads."""
    max_jobs = os.environ.get("MAX_JOBS", "")
    # ASCII digits, 9 at most once leading zeros go (int() refuses thousands of digits, and no host runs more jobs)
    if numbers.digits(max_jobs) and 0 < len(max_jobs.lstrip("0")) <= 9:
        return int(max_jobs)
    default = 2 * (os.cpu_count() or 1)
    if (held := memory_jobs()) is not None:
        default = min(default, held)
    with _JOBS_WARNING:
        first_time = bool(max_jobs) and max_jobs not in _JOBS_WARNED
        _JOBS_WARNED.add(max_jobs)
    if first_time:
        print(
            f"warning: MAX_JOBS={max_jobs!r} is not a whole number from 1 to 999999999: ignored, the modules' "
            f"builds run up to {default} jobs at once ({DEFAULT_JOBS})",
            file=sys.stderr,
            flush=True,
        )
    return default


def memory_jobs() -> int | None:
    """The compile jobs, at JOB_MEMORY each and at least one, that the memory free now holds: the kernel's
    MemAvailable (MEMINFO), or less where a memory cgroup this process is in has a limit (cgroup_free); None
    where MemAvailable cannot be read. Read as each build starts: a build started beside others counts the
    memory theirs take by then, not what their compiles will take at their peak."""
    free = meminfo_available()
    if free is None:
        return None
    if (limited := cgroup_free()) is not None:
        free = min(free, limited)
    return max(1, free // JOB_MEMORY)


def cgroup_free() -> int | None:
    """The least memory free under a limit, among this process's memory cgroup and its ancestors (cgroup_folders):
    the limit less the use, whose reclaimable page cache counts free; None where none has a limit."""
    frees = []
    for folder, (limit_file, used_file, cache_line) in cgroup_folders():
        limit, used = read_whole(folder / limit_file), read_whole(folder / used_file)
        if limit is not None and used is not None and limit < NO_LIMIT:
            frees.append(max(0, limit - used + min(used, stat_value(folder / "memory.stat", cache_line))))
    return min(frees, default=None)


def cgroup_folders() -> list[tuple[Path, tuple[str, str, str]]]:
    """The folders of this process's memory cgroup and its ancestors, up to the mount's root (the root too: in a
    container with no cgroup namespace of its own, the mount's root is the container's cgroup and the path
    below it is absent), each with its files: from PROC_CGROUP's lines, v2's `0::/path` under CGROUP (or
    CGROUP/unified, a hybrid host's), v1's memory line under CGROUP/memory. Where PROC_CGROUP cannot be read:
    CGROUP itself, as v2."""
    if (text := kernel_text(PROC_CGROUP)) is None:
        return [(CGROUP, V2_FILES)]
    found = []
    for line in text.splitlines():
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and not controllers:
            roots, files = (CGROUP, CGROUP / "unified"), V2_FILES
        elif "memory" in controllers.split(","):
            roots, files = (CGROUP / "memory",), V1_FILES
        else:
            continue
        below = PurePosixPath(path.lstrip("/"))
        if not path.startswith("/") or ".." in below.parts:
            below = PurePosixPath()
        for root in roots:
            chain = dict.fromkeys([root / below, *(root / up for up in below.parents)])
            found += [(folder, files) for folder in chain if folder.is_dir()]
    return found


def meminfo_available() -> int | None:
    """MemAvailable of MEMINFO in bytes (the kernel writes `MemAvailable:   131072000 kB`); None where the file
    cannot be read or has no such line."""
    for line in (kernel_text(MEMINFO) or "").splitlines():
        name, _, value = line.partition(":")
        fields = value.split()
        if name == "MemAvailable" and len(fields) == 2 and fields[1] == "kB" and numbers.digits(fields[0]):
            return int(fields[0]) * 1024
    return None


def stat_value(path: Path, name: str) -> int:
    """A memory.stat line's bytes (the kernel writes `inactive_file 1048576`); 0 where it cannot be read."""
    for line in (kernel_text(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and numbers.digits(value) and len(value) <= 30:
            return int(value)
    return 0


def read_whole(path: Path) -> int | None:
    """A cgroup file's one whole number (memory.max says `max` where there is no limit); None where it holds
    none or cannot be read."""
    text = (kernel_text(path) or "").strip()
    return int(text) if numbers.digits(text) and len(text) <= 30 else None


def kernel_text(path: Path) -> str | None:
    """A file the kernel writes (/proc's, a cgroup's), a byte of no UTF-8 in it replaced; None where it cannot be
    read."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def in_order(specs, first: Sequence[str]) -> list:
    """The modules in the order they start: those of `first` in its order, then the others in the order
    given."""
    rank = {name: place for place, name in enumerate(first)}
    return sorted(specs, key=lambda spec: rank.get(spec.name, len(rank)))


def leading(specs, first: Sequence[str]) -> frozenset[str]:
    """Of `first`'s modules in their order, those at its head whose jobs (module_jobs) fit the host's
    cores together, the head always: they build at the usual priority and the rest at AHEAD_NICE beside
    them, so that the module the first test waits for ends about as soon as it would alone, not as late
    as every module side by side. None where `first` names none: no test waits on one before another."""
    budget, cores, ahead, taken = job_budget(), os.cpu_count() or 1, set(), 0
    for spec in in_order([spec for spec in specs if spec.name in first], first):
        taken += module_jobs(spec, budget)
        if ahead and taken > cores:
            break
        ahead.add(spec.name)
    return frozenset(ahead)


def module_jobs(spec, budget: int) -> int:
    """ninja -j for one module's build: a job per source, within the budget (the whole budget where its
    sources are not known)."""
    return min(len(spec.sources), budget) if spec.sources else budget


class Admission:
    """Modules start in the order given, each once its jobs (module_jobs) fit beside those of the modules
    running, and a module alone always starts: the first modules build with a job per source and end
    early, where all at once every module would end near the end of all, and a test waits for the end of
    each module it loads. `stopped` set: no module starts any more."""

    def __init__(self, budget: int, stopped: threading.Event | None = None):
        self.budget, self.free, self.turn = budget, budget, 0
        self.stopped = stopped
        self.changed = threading.Condition()

    def enter(self, turn: int, jobs: int) -> bool:
        """Once it is the module's turn (its place in the order) and its jobs fit; False where the builds
        were stopped first."""
        with self.changed:
            while True:
                if self.stopped is not None and self.stopped.is_set():
                    return False
                if self.may_start(turn, jobs):
                    break
                self.changed.wait(timeout=0.1)
            self.turn += 1
            self.free -= jobs
            self.changed.notify_all()
            return True

    def may_start(self, turn: int, jobs: int) -> bool:
        return self.turn == turn and (jobs <= self.free or self.free == self.budget)

    def leave(self, jobs: int) -> None:
        with self.changed:
            self.free += jobs
            self.changed.notify_all()


def record_build(build_dir: Path, ninja_file: Path, generators: dict | None = None, tree: Path | None = None) -> None:
    """After a module built: what it was built from, for the restored-copy guard and `affected`
    (fidev.records.ninja_inputs, fidev.records.build_records). `generators` shares one read of the tree's Python
    files among the modules of one build; `tree` is the manifest's vendored tree unless given."""
    from fidev.core.manifest import pins

    tree = tree or pins().source_dir
    ninja_inputs.record(build_dir, ninja_file)
    build_records.record_generators(build_dir, tree, generators)
    if (
        build_dir.name in module_choice.GENERATORS
    ):  # this process made its JitSpec (a rebuild of build.ninja alone keeps the record)
        build_records.record_call(build_dir, module_choice.CALLS.get(build_dir.name))
    build_records.record_tree(build_dir.parent, tree)


def recording_build(original: Callable, say: Callable[[str], None], mark: Callable | None = None) -> Callable:
    """FlashInfer's `JitSpec.build` (`original`, flashinfer/jit/core.py at v0.6.3) for a test process
    whose tests compile the modules they load: each build guarded against a restored older copy of an
    input (`cp -p`, which ninja's mtimes miss: fidev.records.ninja_inputs) and, where it compiled,
    recorded (record_build), so that `affected` and the next build know what it was built from; the
    compile said through `say`. The guard, the build and the record hold the module's own lock
    (`JitSpec.lock_path`, which `JitSpec.build` takes; `JitSpec.build_and_load` holds it already and
    passes need_lock=False): another process that took the lock between the build and its record
    would take the fresh objects for a restored copy and build them again under a loading process.
    `mark(spec)`: after each record (smoke's session marks smoke's modules: build_records.record_smoke_module)."""

    def build(spec, verbose, need_lock=True):
        if need_lock:
            from filelock import FileLock

            with FileLock(spec.lock_path, thread_local=False):
                locked_build(spec, verbose)
        else:
            locked_build(spec, verbose)

    def locked_build(spec, verbose):
        ninja_inputs.invalidate(spec.build_dir, ninja_inputs.stale(spec.build_dir))
        fresh = not spec.jit_library_path.exists()
        if fresh and hasattr(spec, "write_ninja"):
            # FlashInfer's build writes the ninja file only where it is missing; one a plan's dry run wrote
            # (fidev.upstream.plugin.ready_to_build) may be older than the spec
            spec.write_ninja()
        if fresh:
            say(f"compiling {spec.name} ({len(spec.sources)} sources)")
        started, logged = time.perf_counter(), compile_log.log_size(spec.build_dir)
        ninja_inputs.begin(spec.build_dir)
        original(spec, verbose, need_lock=False)  # raising, it leaves the mark: the next build compiles again
        took = time.perf_counter() - started
        # it compiled (ninja ran a command, a compile-cache hit in a fraction of a second too): keep what from
        if fresh or compile_log.log_size(spec.build_dir) != logged:
            record_build(spec.build_dir, spec.ninja_path)
            if mark is not None:
                mark(spec)
            say(f"{spec.name} built in {took:.0f} s")
        ninja_inputs.finished(spec.build_dir)

    build.fidev_recording = True  # installed once per process
    return build


PROGRESS_EVERY_S = 10  # while a build of several modules runs longer, a line says how many are done


def keep_saying_progress(total: int, done: list, ended: threading.Event, say: Callable[[str], None], printing) -> None:
    """Every PROGRESS_EVERY_S until `ended`: "building: N of M module(s) done, S s" (`done`: the
    modules finished so far)."""
    started = time.perf_counter()
    while not ended.wait(PROGRESS_EVERY_S):
        with printing:
            say(f"  building: {len(done)} of {total} module(s) done, {time.perf_counter() - started:.0f} s")


def start_ninja(spec, jobs: int, running: list | None, env: dict | None = None, nice: int = 0) -> subprocess.Popen:
    """The module's own ninja, its status lines as run_module_builds reads them; appended to `running`.
    `env`: its environment (default: this process's now); `nice`: started through `nice -n`, so that
    every compiler it starts runs at that niceness."""
    cmd = ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-j", str(jobs)]
    env = dict(os.environ if env is None else env, NINJA_STATUS="[%f/%t %es] ")
    proc = subprocess.Popen(
        ["nice", "-n", str(nice), *cmd] if nice and shutil.which("nice") else cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    if running is not None:
        running.append(proc)
    return proc


def run_module_builds(
    specs,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
    running: list | None = None,
    on_done: Callable | None = None,
    env: dict | None = None,
    nice: int | Callable = 0,
    on_failed: Callable | None = None,
    first: Sequence[str] = (),
    stopped: threading.Event | None = None,
) -> None:
    """One ninja per module, those of `first` in its order before the rest in the order given (in_order),
    each started once its
    jobs fit the budget (Admission); one line per started object, with its module's [done/total elapsed],
    handed to `say`, and past PROGRESS_EVERY_S a line of the modules done out of all; each ninja process
    appended to `running` (to be stopped); `on_done(spec)` as each module ends, built or not, after
    `on_failed(spec, its failure)` where it failed (its first error, its folder not writable, its ninja not
    started, not started because `stopped` was set, or its thread raised: raised); `env`: ninja's
    environment (default: this process's); `nice`: start_ninja's, or nice(spec) for each module's.
    `on_done` runs in this thread (each_in_this_thread)."""
    printing = threading.Lock()
    failures = []
    generators: dict = {}
    done: list = []
    specs = in_order(specs, first)
    budget = job_budget()
    admission = Admission(budget, stopped)
    # here, not in the threads: one that raised before its turn came would hold up every module after it
    jobs_of = [module_jobs(spec, budget) for spec in specs]

    def failed(spec, failure: Failure) -> None:
        failures.append(failure)
        if on_failed is not None:
            on_failed(spec, failure)

    def build(spec, turn):
        jobs = jobs_of[turn]
        if not admission.enter(turn, jobs):
            failure = Failure(f"the JIT build of {spec.name} did not start: the builds were stopped", BUG_FIX)
        else:
            try:
                failure = build_one(spec, jobs, say, printing, (running, env, nice), generators)
            finally:
                admission.leave(jobs)
        if failure is not None:
            failed(spec, failure)
        done.append(spec.name)

    ended = threading.Event()
    ticker = threading.Thread(target=keep_saying_progress, args=(len(specs), done, ended, say, printing), daemon=True)
    ticker.start()
    try:
        each_in_this_thread(build, [(spec, turn) for turn, spec in enumerate(specs)], on_done)
    finally:
        ended.set()
    for spec, failure in raised(specs, done):
        failed(spec, failure)
    if failures:
        raise failures[0]


def build_one(spec, jobs: int, say: Callable[[str], None], printing, ninja: tuple, generators: dict) -> Failure | None:
    """One module's build, in its turn: its folder prepared, its ninja run (`ninja`: ninja_started's
    running, env and nice), what it was built from recorded; its failure, else None."""
    started = prepare_folder(spec, say, printing) or ninja_started(spec, jobs, *ninja)
    if isinstance(started, Failure):
        return started
    if (error := ninja_error(started, spec, say, printing)) is not None:
        return Failure(f"the JIT build failed: {spec.name}: {error[:300]}", BUILD_FAILED_FIX)
    with printing:  # one read of the tree's Python files, shared
        record_build(spec.build_dir, spec.ninja_path, generators)
    return None


def ninja_started(spec, jobs: int, running: list | None, env: dict | None, nice) -> subprocess.Popen | Failure:
    """The module's ninja (start_ninja; `nice`: a niceness, or nice(spec)), or the failure where it could
    not start (not on the PATH given, or no memory to fork on a loaded host)."""
    try:
        return start_ninja(spec, jobs, running, env, nice(spec) if callable(nice) else nice)
    except OSError as e:
        return Failure(f"ninja could not start for {spec.name}: {e.strerror or e}", NINJA_FIX)


def ninja_error(proc: subprocess.Popen, spec, say: Callable[[str], None], printing) -> str | None:
    """Each line of the module's ninja said as it comes (a started object with its [done/total elapsed]);
    once it ends, its first error where it failed, else None."""
    output = []
    for line in proc.stdout:
        status = re.match(r"(\[\d+/\d+ [\d.]+s\]) .* -o (\S+)", line)
        with printing:
            if status:
                say(f"  {status.group(1)} {spec.name[:48]}/{Path(status.group(2)).name}")
            elif line.strip() and not line.startswith("ninja: Entering"):
                output.append(line.rstrip())
                say("  " + line.rstrip())
    return first_error(output) if proc.wait() != 0 else None


def raised(specs, done: list[str]) -> list[tuple]:
    """(module, its failure) of each module whose build thread raised (not in `done`; threading's hook
    said what): its old library is no build of what the tree holds."""
    return [
        (spec, Failure(f"the JIT build of {spec.name} raised before it ended (the error above)", BUG_FIX))
        for spec in specs
        if spec.name not in done
    ]


def prepare_folder(spec, say: Callable[[str], None], printing) -> Failure | None:
    """Before the module's ninja starts: the objects a stale input or an unfinished build left go, and
    the mark of a build begun is written (cleared where it finishes: record_build); the failure where
    its folder cannot be written."""
    try:
        stale = ninja_inputs.stale(spec.build_dir)
        for obj, why in stale.items():
            with printing:
                say(f"  {spec.name[:48]}/{Path(obj).name}: {why}: rebuilding it")
        ninja_inputs.invalidate(spec.build_dir, stale)
        ninja_inputs.begin(spec.build_dir)
    except Failure as failure:  # the mark's place is taken by what is not a regular file (write_whole)
        return failure
    except OSError as e:
        return Failure(
            f"the JIT build of {spec.name} cannot write in its folder {spec.build_dir}: {e.strerror or e}",
            "make the folder writable by you, or set FLASHINFER_WORKSPACE_BASE to a folder you can write "
            "(the JIT dir is under it)",
        )
    return None


def each_in_this_thread(build: Callable, jobs: list[tuple], on_done: Callable | None) -> None:
    """build(spec, its turn) for each pair, each in its own thread, and `on_done(spec)` in this thread
    as each ends (not where its thread raised: threading's hook says that). on_done lets go the module's
    lock, and a lock is let go in the thread that took it: filelock 3.32.5 keeps each thread's holds and
    forgets one only in the thread that lets it go (filelock/_api.py, `_commit_acquire`,
    `_drop_registry_entry`). A hold left behind makes that thread's next blocking take of the path, by
    another instance, a "Deadlock" RuntimeError (`_raise_if_would_deadlock`): FlashInfer's
    `JitSpec.build_and_load` in a test, after a warmup this thread built."""
    ended_ones: queue.SimpleQueue = queue.SimpleQueue()

    def run(spec, turn) -> None:
        ended = None
        try:
            build(spec, turn)
            ended = spec
        finally:
            ended_ones.put(ended)

    threads = [threading.Thread(target=run, args=pair) for pair in jobs]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            if (spec := ended_ones.get()) is not None and on_done is not None:
                on_done(spec)
    finally:
        for thread in threads:
            thread.join()


def lock_path(spec) -> Path:
    """The module's own lock: its JitSpec's `lock_path`, else the same file by its folder (build_stamp's
    modules, fidev.core.workspace.module_lock)."""
    return getattr(spec, "lock_path", None) or workspace.module_lock(spec.build_dir)


@contextmanager
def held_while_loading(spec):
    """The module's own lock, held while its library is read and loaded by its path (abi-smoke, as the
    Rust bindings load it), as FlashInfer's `JitSpec.build_and_load` holds it: a build under way
    (affected's rebuild) is waited for, so that no test loads the library it is about to replace."""
    from filelock import FileLock

    lock_path(spec).parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock_path(spec), thread_local=False):
        yield


def take_locks(specs) -> dict:
    """{name: (spec, its lock)} for the modules whose own lock (`JitSpec.lock_path`, which
    `JitSpec.build` takes) was free, now held; a module whose lock another process holds is that
    one's to build. A module never built has no folder yet: its ninja file is written
    (FlashInfer's write_if_different), where the spec can."""
    from filelock import FileLock, Timeout

    held = {}
    try:
        for spec in specs:
            lock_path(spec).parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(lock_path(spec), thread_local=False)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            held[spec.name] = (spec, lock)
            if hasattr(spec, "write_ninja"):
                spec.write_ninja()
    except BaseException:
        for name in list(held):
            release(held, name)
        raise
    return held


def build_held(
    held: dict,
    say: Callable[[str], None],
    running: list,
    env: dict | None = None,
    nice: int = 0,
    stopped: threading.Event | None = None,
) -> None:
    """The modules take_locks holds, built side by side (run_module_builds), each lock let go as
    its module ends: a test waiting for one module waits for it alone. A failure is said, not
    raised: the test that loads the module builds it again, and fails where it fails. `stopped`: once
    set, no module starts."""
    try:
        if held:
            run_module_builds(
                [spec for spec, _ in held.values()],
                say,
                running,
                on_done=lambda spec: release(held, spec.name),
                env=env,
                nice=nice,
                stopped=stopped,
            )
    except Failure as failure:
        say(f"the build beside the tests failed ({failure.problem}); the test that loads the module builds it again")
    finally:
        for name in list(held):
            release(held, name)


def build_beside(specs, say: Callable[[str], None], running: list, env: dict | None = None) -> None:
    """The modules whose lock is free built side by side while holding it (take_locks, build_held):
    a test that loads one of them meanwhile waits for the lock and then finds it built. `env`:
    ninja's environment, taken before tests in this process change it."""
    build_held(take_locks(specs), say, running, env)


@dataclass(frozen=True)
class Folder(workspace.ModuleFiles):
    """A module by its folder in the JIT dir, its ninja file written (by FlashInfer's JitSpec.build,
    or by the plan's dry run as that would): what run_module_builds and take_locks need of it."""

    name: str
    build_dir: Path
    sources: tuple[str, ...]

    @property
    def lock_path(self) -> Path:
        return workspace.module_lock(self.build_dir)


AHEAD_NICE = 10  # the builds ahead of the tests yield to a rebuild the tests wait for (affected's)


def start_holding(take: Callable[[], None], work: Callable, *args) -> threading.Thread:
    """A daemon thread that takes a build's locks (take()), then does work(*args); started, and returned
    once the locks are taken (what take() raised, raised here). The locks are taken in that thread, not
    the caller's: filelock 4 keeps each thread's holds, and refuses as a deadlock a blocking acquire, in
    the thread that holds a lock, of another instance of it (filelock/_core/_acquire.py,
    `_raise_if_would_deadlock`, at 4.3.1), which is what a test of smoke's does in affected's thread
    when it loads a module a build holds (FlashInfer's `JitSpec.build_and_load`)."""
    taken, failed = threading.Event(), []

    def run() -> None:
        try:
            take()
        except BaseException as e:  # noqa: BLE001 (raised again below, in the caller's thread)
            failed.append(e)
            return
        finally:
            taken.set()
        work(*args)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    taken.wait()
    if failed:
        raise failed[0]
    return thread


class Ahead:
    """Modules that the tests about to run will load, none built yet, built side by side in a thread
    of this process, each under its own lock (take_locks, taken in that thread before this returns:
    start_holding), so that a test that loads one waits for that one alone and then finds it built; at
    AHEAD_NICE by default. With `after`, they
    start once after() is true (affected's gate opened: its rebuild, which the first verdict waits on,
    has the cores to itself). `stop()` ends the builds still running, or never started. With `mark`,
    each module it holds is marked built ahead (fidev.records.build_records.mark_built_ahead) before
    any build starts, its folder kept in `marked` (drop_unrecorded_ahead)."""

    def __init__(
        self,
        specs,
        say: Callable[[str], None],
        after: Callable[[], bool] | None = None,
        nice: int = AHEAD_NICE,
        env: dict | None = None,
        mark: bool = False,
    ):
        """`nice`: start_ninja's; `env`: ninja's environment (default: this process's as each starts)."""
        self.held: dict = {}
        self.running: list = []
        self.marked: list[Path] = []
        self.stopped = threading.Event()  # once set, the builds it ended say nothing (no failure of theirs)
        self.thread = start_holding(lambda: self.take(specs, mark), self.build, say, after, nice, env)

    def take(self, specs, mark: bool) -> None:
        """The modules' locks (take_locks), and with `mark`, the marks of those it holds."""
        self.held.update(take_locks(specs))
        for spec, _ in self.held.values() if mark else ():
            build_records.mark_built_ahead(spec.build_dir)
            self.marked.append(spec.build_dir)

    def pending(self) -> set[str]:
        """The modules it holds still: not built yet (set() of a dict is one step under CPython's GIL)."""
        return set(self.held)

    def build(self, say: Callable[[str], None], after: Callable[[], bool] | None, nice: int, env: dict | None) -> None:
        try:
            while after is not None and not after():
                if self.stopped.wait(0.1):
                    return
            if not self.stopped.is_set():
                quiet = lambda line: None if self.stopped.is_set() else say(line)  # noqa: E731
                build_held(self.held, quiet, self.running, env=env, nice=nice, stopped=self.stopped)
        finally:  # every way out, an error of after() included: no test waits on a lock nobody builds
            for name in list(self.held):
                release(self.held, name)

    def stop(self) -> None:
        """The builds ended: those running, and one that started as this stopped them."""
        self.stopped.set()
        end_builds(self.running, self.thread)


def drop_unrecorded_ahead(build_dirs: list[Path], say: Callable[[str], None]) -> list[str]:
    """The folders of `build_dirs` that carry the plan's built-ahead mark and no recorded test
    (fidev.records.build_records.unrecorded_ahead), removed, each under its own lock (one another
    process holds, a test loading it or a build, is left as it is), said in one line; returns their
    names. A module no test of which is recorded would leave every edit that reaches it `not covered`:
    one that only a build ahead made is as if never built. A folder without the mark (what `build`, a
    test, smoke or anyone else built) is never removed. Without filelock, nothing is removed."""
    try:
        from filelock import FileLock, Timeout
    except ImportError:
        return []
    removed = []
    for build_dir in build_dirs:
        if not build_records.unrecorded_ahead(build_dir):
            continue
        lock = FileLock(workspace.module_lock(build_dir), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except (Timeout, OSError):
            continue
        try:
            if build_records.unrecorded_ahead(build_dir):  # again, under the lock
                shutil.rmtree(build_dir, ignore_errors=True)
            if not build_dir.exists():
                removed.append(build_dir.name)
        finally:
            lock.release()
    if removed:
        say(
            f"{len(removed)} module(s) built ahead that no test loaded and no record names, removed again (as if "
            f"never built: an edit that reaches them is no gap in their tests): {', '.join(sorted(removed))}"
        )
    return removed


STOP_S = 30  # how long end_builds waits for a build's thread to end
STOP_POLL_S = 0.1  # how often Rebuild.wait asks whether to stop


def end_builds(running: list, thread: threading.Thread) -> None:
    """Each ninja in `running` ended (SIGTERM: ninja ends its compilers), again as others start, until
    `thread`, whose stop flag is set, has ended or STOP_S have passed."""
    ends = time.monotonic() + STOP_S
    while thread.is_alive() and time.monotonic() < ends:
        for proc in list(running):
            if proc.poll() is None:
                proc.terminate()
        thread.join(timeout=0.1)


def release(held: dict, name: str) -> None:
    """The lock build_beside holds for module `name`, let go once (it may end before the others)."""
    entry = held.pop(name, None)
    if entry is not None:
        entry[1].release()


def ninja_log_lines(spec) -> list[str]:
    log = spec.build_dir / ".ninja_log"
    return log.read_text().splitlines() if log.exists() else []


def log_lengths(specs) -> dict[str, int]:
    """{module: the lines of its ninja log now}, to read what a build appends (slowest_since)."""
    return {spec.name: len(ninja_log_lines(spec)) for spec in specs}


def slowest_since(specs, lengths: dict[str, int]) -> list[tuple[float, str]]:
    """The slowest objects of the lines the modules' logs gained since log_lengths gave `lengths`."""
    return slowest_objects([line for spec in specs for line in ninja_log_lines(spec)[lengths[spec.name] :]])


def write_ninja_files(specs) -> None:
    """Each JitSpec's ninja file as the spec says now (FlashInfer's write_if_different); build_stamp's
    modules have theirs already."""
    for spec in specs:
        if hasattr(spec, "write_ninja"):
            spec.write_ninja()


def slowest_objects(new_lines: list[str]) -> list[tuple[float, str]]:
    """Compile times of this run's objects: the lines ninja appended to the modules' logs."""
    rows = [line.split("\t") for line in new_lines if not line.startswith("#")]
    return sorted(((int(r[1]) - int(r[0])) / 1000, r[3]) for r in rows if len(r) >= 4)[::-1][:SLOWEST_SHOWN]


ROUNDS = 3  # build_or_wait's: a module another builder left unbuilt is taken up again, this many times at most


def build_or_wait(
    specs,
    say: Callable[[str], None],
    jit_lock,
    env: dict | None = None,
    running: list | None = None,
    stopped: threading.Event | None = None,
    built: Callable[[str], None] | None = None,
) -> None:
    """FlashInfer JitSpecs built side by side, each under its own lock as FlashInfer builds it, the
    builds under the JIT dir's lock (`jit_lock`, FlashInfer's build_jit_specs takes it); those whose
    lock another process holds (a build ahead of the tests, a test loading it) are that one's to build,
    waited for after the JIT dir's lock is let go (the build ahead of affected's tests holds its locks
    until affected's rebuild, under that lock, is done), and then built here too: ninja, under the
    module's lock, has nothing to do where the other built it from what the tree holds now, and builds
    what it left unbuilt or built from older sources. Two ninjas never run in one module's folder.
    `env`: ninja's environment (default: this process's as each starts); `running`: run_module_builds';
    `stopped`: once set, no build starts and no wait goes on; `built(name)`: as each module it built ends
    built, before its lock is let go (affected keeps it `unfinished` with the inputs its build recorded)."""
    left = list(specs)
    failed: set[str] = set()
    for _ in range(ROUNDS):
        with jit_lock:
            held = take_locks(left)
            ours = set(held)
            try:
                run_module_builds(
                    [spec for spec, _ in held.values()],
                    say,
                    running,
                    on_done=lambda spec, held=held: built_then_release(spec.name, held, built, failed),
                    env=env,
                    stopped=stopped,
                    on_failed=lambda spec, _: failed.add(spec.name),
                )
            finally:
                for name in list(held):
                    release(held, name)
        left = [spec for spec in left if spec.name not in ours]
        for spec in left:
            if not wait_for_lock(spec, stopped):
                return
        if not left:
            return


def built_then_release(name: str, held: dict, built: Callable[[str], None] | None, failed: set[str]) -> None:
    """build_or_wait's end of one module: `built(name)` where it built, then its lock let go, whatever built raised."""
    try:
        if built is not None and name not in failed:
            built(name)
    finally:
        release(held, name)


def wait_for_lock(spec, stopped: threading.Event | None) -> bool:
    """Until the module's lock is free (another builder let it go); False where `stopped` was set first."""
    from filelock import FileLock, Timeout

    lock = FileLock(lock_path(spec), thread_local=False)
    while stopped is None or not stopped.is_set():
        try:
            lock.acquire(timeout=0.2)
        except Timeout:
            continue
        lock.release()
        return True
    return False


def jit_dir_lock(spec, file_lock):
    """FlashInfer's lock of the JIT dir `spec` builds in (`<jit dir>/tmp/flashinfer_jit.lock`,
    flashinfer/jit/core.py: get_tmpdir, build_jit_specs), a `file_lock` (filelock's FileLock)."""
    path = workspace.jit_dir_lock(spec.build_dir.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(path, thread_local=False)


def build_specs(
    specs, say: Callable[[str], None] = lambda line: print(line, flush=True)
) -> tuple[float, list[tuple[float, str]]]:
    """Build `specs` (FlashInfer JitSpecs, none prebuilt, or fidev.builds.build_stamp's modules, whose build
    files exist) each in its own folder, under the JIT dir's lock as FlashInfer's own builds are
    (`<jit dir>/tmp/flashinfer_jit.lock`, flashinfer/jit/core.py: get_tmpdir, build_jit_specs).
    Returns the wall time and this run's slowest objects."""
    try:
        from filelock import FileLock  # what FlashInfer itself locks its JIT dir with
    except ModuleNotFoundError as e:
        raise Failure(
            "filelock is not installed in this interpreter: builds take FlashInfer's JIT-dir lock with it",
            "run it in the environment: `pixi run -e flashinfer-dev ...` (filelock comes with torch there)",
        ) from e

    started = time.time()
    logs_before = log_lengths(specs)
    if specs:
        write_ninja_files(specs)
        jit_lock = jit_dir_lock(specs[0], FileLock)
        if all(hasattr(spec, "lock_path") for spec in specs):
            build_or_wait(specs, say, jit_lock)
        else:  # build's modules: no test runs beside it
            with jit_lock:
                run_module_builds(specs, say)
    seconds = time.time() - started
    if (missing := missing_after(specs)) is not None:
        raise missing
    return seconds, slowest_since(specs, logs_before)


def missing_after(specs) -> Failure | None:
    missing = [s.name for s in specs if not s.jit_library_path.exists()]
    if not missing:
        return None
    return Failure(
        f"the build finished without {', '.join(missing)}",
        "run it again with FLASHINFER_JIT_VERBOSE=1 and read ninja's output",
    )


class Rebuild:
    """affected's rebuild: the changed modules built side by side in a thread of this process, under the
    JIT dir's lock as build_specs builds them, each also under its own lock (`JitSpec.lock_path`), all
    taken in that thread before this returns (start_holding). So the tests may start at once: a test
    that loads a module (`JitSpec.build_and_load` takes its lock) waits for that one alone and runs as
    soon as it is built, while the others still build. A module whose lock another process holds is
    waited for once the JIT dir's lock is let go, then built again under its lock (build_or_wait).
    `then(self)` runs in the thread once every module is built (not after a failure or a stop);
    `pending()` names the modules still building; `wait(stop)` waits for the thread's end (raising what
    then() raised; stopping it once stop() is true) and `failure` is the build's; `stop()` ends the
    builds still running (the first failing test ends the run)."""

    def __init__(
        self,
        specs,
        then: Callable,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        first: Sequence[str] = (),
        rebuilt: Callable[[str], None] = lambda name: None,
    ):
        """`first`: the modules the first tests wait for (smoke's, then those of a case of each of
        FlashInfer's test functions), in the order they start (run_module_builds); where it names any,
        those at its head that fit the cores build at the usual priority and the others at AHEAD_NICE
        (leading), so that those have the cores first. `rebuilt(name)`: as each
        module built, before its lock is let go (what a test that loads it may act on is kept first)."""
        from filelock import FileLock  # what FlashInfer itself locks with (build_specs says where it is missing)

        self.specs, self.started, self.ended = list(specs), time.time(), None
        self.env = dict(os.environ)  # ninja's: the tests that run meanwhile in this process change this one's
        self.first, self.rebuilt, self.failed = first, rebuilt, set()
        self.logs_before = log_lengths(self.specs)
        self.running: list = []
        self.stopped = threading.Event()
        self.failure: Failure | None = None  # the build's
        self.error: BaseException | None = None  # then()'s, or the thread's own
        self.left = {spec.name for spec in self.specs}
        self.held: dict = {}
        # every module's lock taken at the start: where another process held one, it is built only after
        # the others (build_or_wait), its lock free meanwhile, so a test may load it before it is rebuilt
        self.all_held = True
        self.jit_lock = jit_dir_lock(self.specs[0], FileLock) if self.specs else None
        write_ninja_files(self.specs)
        self.thread = start_holding(self.take, self.build, then, say)

    def take(self) -> None:
        """The JIT dir's lock, then each module's (in the rebuild's thread: start_holding)."""
        if self.jit_lock is None:
            return
        self.jit_lock.acquire()
        try:
            self.held.update(take_locks(self.specs))
        except BaseException:
            self.jit_lock.release()
            raise
        self.all_held = len(self.held) == len(self.specs)

    def pending(self) -> set[str]:
        """The modules still building (set() of a set is one step under CPython's GIL)."""
        return set(self.left)

    def failed_one(self, spec, error: Failure) -> None:
        """A module's build failed: the rebuild's failure from now (the run's stop reads it), and the
        module stays pending, its lock held until the rebuild ends, so that no test loads its old library."""
        self.failed.add(spec.name)
        if self.failure is None and not self.stopped.is_set():
            self.failure = error

    def done_one(self, spec) -> None:
        if spec.name in self.failed:
            return
        self.kept(spec.name)
        release(self.held, spec.name)
        self.left.discard(spec.name)

    def kept(self, name: str) -> None:
        """rebuilt(name), what it raises kept for wait() to raise in the run's own thread."""
        try:
            self.rebuilt(name)
        except BaseException as e:  # noqa: BLE001 (raised again by wait(), in the run's own thread)
            self.error = self.error or e

    def build(self, then: Callable, say: Callable[[str], None]) -> None:
        try:
            ours = set(self.held)
            ahead = leading([spec for spec, _ in self.held.values()], self.first)  # what this rebuild builds
            try:
                run_module_builds(
                    [spec for spec, _ in self.held.values()],
                    say,
                    self.running,
                    on_done=self.done_one,
                    on_failed=self.failed_one,
                    env=self.env,
                    nice=lambda spec: AHEAD_NICE if ahead and spec.name not in ahead else 0,
                    first=self.first,
                    stopped=self.stopped,
                )
            finally:
                for name in list(self.held):
                    release(self.held, name)
                if self.jit_lock is not None:
                    self.jit_lock.release()
            others = [spec for spec in self.specs if spec.name not in ours]
            if others and not self.stopped.is_set():
                build_or_wait(others, say, self.jit_lock, self.env, self.running, self.stopped, self.kept)
            if not self.stopped.is_set():
                self.failure = missing_after(self.specs)
            self.ended = time.time()
            self.left.clear()
            if self.failure is None and not self.stopped.is_set():
                then(self)
        except Failure as failure:  # a compile failed (said as it failed); one stopped (the run ended) is no failure
            if self.failure is None and not self.stopped.is_set():
                self.failure = failure
        except BaseException as e:  # noqa: BLE001 (raised again by wait(), in the run's own thread)
            self.error = e
        finally:
            self.ended = self.ended or time.time()
            self.left.clear()

    def seconds(self) -> float:
        return (self.ended or time.time()) - self.started

    def slowest(self) -> list[tuple[float, str]]:
        """This rebuild's slowest objects (slowest_objects)."""
        return slowest_since(self.specs, self.logs_before)

    def wait(self, stop: Callable[[], bool] | None = None) -> None:
        """Until the thread ends; with `stop`, the builds still running are stopped once stop() is true
        (a failure elsewhere ends the run: what still builds is no part of its answer). What then()
        raised, raised again here."""
        while self.thread.is_alive():
            if stop is not None and not self.stopped.is_set() and stop():
                self.stop()
            self.thread.join(timeout=STOP_POLL_S)
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """The builds still running ended, and the thread with them."""
        self.stopped.set()
        end_builds(self.running, self.thread)
