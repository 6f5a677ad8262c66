"""affected's rebuild beside smoke's tests (fidev.builds.module_builds.Rebuild, fidev.affected.tests, .ours):
each changed module rebuilt under its own lock, taken before any test starts, so that a test waits for
the modules it loads alone and runs as soon as they are built (ready_first), while the others still
build; smoke's first failure stops what still builds; abi-smoke waits for a module's lock before it
loads the module's library, as FlashInfer's own loader does."""

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fidev.affected import ours as our_tests
from fidev.affected import tests as affected_tests
from fidev.affected import theirs as their_tests
from fidev.builds import module_builds
from script_runs import require
from upstream_standin import needs_a_build

FILE_A = """\
import os
import pytest

def note(what):
    open(os.environ["EVENTS"], "a").write(what + "\\n")

@pytest.fixture(scope="module")
def per_file():
    note("setup a")
    yield
    note("teardown a")

def test_slow(per_file):
    note("slow")

def test_plain(per_file):
    note("plain")
    assert os.environ.get("FAIL_PLAIN") != "1"
"""
FILE_B = """\
import os

def test_fast(per_file_b):
    open(os.environ["EVENTS"], "a").write("fast\\n")

import pytest

@pytest.fixture(scope="module")
def per_file_b():
    open(os.environ["EVENTS"], "a").write("setup b\\n")
    yield
    open(os.environ["EVENTS"], "a").write("teardown b\\n")
"""
LOADED = [(("test_a.py::test_slow",), "slow"), (("test_b.py::test_fast",), "fast")]


def run_in_order(tmp_path, monkeypatch, pending, stop=None, fail_plain=False, files=("test_a.py", "test_b.py")):
    """pytest.main here over tests/test_a.py (test_slow loads `slow`, test_plain nothing) and tests/test_b.py
    (test_fast loads `fast`), with ready_first's loop and the collector: (status, the events written). The
    loaded pairs name tests as smoke_modules does, relative to tests/."""
    (tmp_path / "tests").mkdir(exist_ok=True)  # node ids "tests/test_a.py::...", as under the checkout's root
    (tmp_path / "tests/test_a.py").write_text(FILE_A)
    (tmp_path / "tests/test_b.py").write_text(FILE_B)
    events = tmp_path / "events"
    monkeypatch.setenv("EVENTS", str(events))
    monkeypatch.setenv("FAIL_PLAIN", "1" if fail_plain else "0")
    monkeypatch.setattr(our_tests, "WAIT_S", 0.01)
    plugins = [our_tests.collector(stop), our_tests.ready_first(LOADED, pending, stop)]
    args = [*(str(tmp_path / "tests" / f) for f in files), "-q", "-p", "no:cacheprovider"]
    status = pytest.main(
        [*args, "--import-mode=importlib", "--rootdir", str(tmp_path), *(["-x"] if stop else [])], plugins=plugins
    )
    return int(status), events.read_text().split("\n")[:-1] if events.is_file() else []


def building(*states):
    """pending() that names each of `states` in turn, one call each, then the last one for good."""
    left = list(states)

    def pending():
        return left.pop(0) if len(left) > 1 else left[0]

    return pending


def test_each_test_runs_once_its_modules_are_built_and_each_files_fixture_is_set_up_and_torn_down_once_a_run(
    tmp_path, monkeypatch
):
    """pytest's order is slow, plain, fast. While `slow` and `fast` build, plain (no module) runs; then
    fast once `fast` is built, slow last: the fixtures of each file are torn down before another file's
    test where pytest's guessed next test was not the one that ran."""
    status, events = run_in_order(
        tmp_path, monkeypatch, building({"slow", "fast"}, {"slow", "fast"}, {"slow", "fast"}, {"slow"}, {"slow"}, set())
    )
    assert status == 0
    ran = [e for e in events if e in ("slow", "plain", "fast")]
    assert ran == ["plain", "fast", "slow"], events
    for name in ("a", "b"):
        assert events.count(f"setup {name}") == events.count(f"teardown {name}"), events
    for i, event in enumerate(events):  # no file's test runs while another file's fixture is still set up
        if event in ("slow", "plain"):
            assert events[:i].count("setup a") == events[:i].count("teardown a") + 1, events
            assert events[:i].count("setup b") == events[:i].count("teardown b"), events
        if event == "fast":
            assert events[:i].count("setup b") == events[:i].count("teardown b") + 1, events
            assert events[:i].count("setup a") == events[:i].count("teardown a"), events


def test_with_nothing_building_the_order_is_pytests_and_the_first_failure_ends_the_run(tmp_path, monkeypatch):
    status, events = run_in_order(tmp_path, monkeypatch, set, stop=lambda: False, fail_plain=True)
    assert [e for e in events if e in ("slow", "plain", "fast")] == ["slow", "plain"], events
    assert status == pytest.ExitCode.TESTS_FAILED


def test_a_stop_while_every_test_waits_runs_none_of_them(tmp_path, monkeypatch):
    """FlashInfer's tests failed while every test left waited for its modules: ready_first waits no
    longer, and none of them runs (the collector ends the session)."""
    started = time.perf_counter()
    status, events = run_in_order(tmp_path, monkeypatch, lambda: {"slow", "fast"}, stop=lambda: True)
    assert time.perf_counter() - started < 30
    assert [e for e in events if e in ("slow", "plain", "fast")] == [], events
    assert status == pytest.ExitCode.TESTS_FAILED
    started = time.perf_counter()  # every test waits (none loads nothing): the stop still ends the wait
    status, events = run_in_order(tmp_path, monkeypatch, lambda: {"fast"}, stop=lambda: True, files=("test_b.py",))
    assert time.perf_counter() - started < 30 and "fast" not in events and status == pytest.ExitCode.TESTS_FAILED


class SleepSpec:
    """A module as Rebuild takes one (build_stamp's: a folder with its ninja file, no lock_path of its
    own), whose build sleeps `seconds` and then makes its library; `fails`: its build fails."""

    def __init__(self, jit_dir: Path, name: str, seconds: float, fails: bool = False):
        self.name, self.sources = name, ["s.cu"]
        self.build_dir = jit_dir / name
        self.ninja_path = self.build_dir / "build.ninja"
        self.jit_library_path = self.build_dir / f"{name}.so"
        self.build_dir.mkdir(parents=True, exist_ok=True)
        command = "false" if fails else f"sleep {seconds} && touch $out"
        self.ninja_path.write_text(f"rule make\n  command = {command}\nbuild {self.jit_library_path}: make\n")


def lock_is_held(spec) -> bool:
    from filelock import FileLock, Timeout

    try:
        FileLock(module_builds.lock_path(spec), thread_local=False).acquire(timeout=0).lock.release()
    except Timeout:
        return True
    return False


def wait_until(condition, seconds=30.0) -> bool:
    ends = time.perf_counter() + seconds
    while not condition():
        if time.perf_counter() > ends:
            return False
        time.sleep(0.02)
    return True


@needs_a_build
def test_the_rebuild_holds_every_modules_lock_from_its_start_and_lets_each_go_as_it_is_built(tmp_path):
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    fast, slow = SleepSpec(tmp_path, "fast", 0), SleepSpec(tmp_path, "slow", 3)
    done = []
    rebuild = module_builds.Rebuild([fast, slow], done.append, say=lambda line: None)
    assert lock_is_held(slow), "a test may load the old library before the rebuild"
    assert wait_until(lambda: not lock_is_held(fast) and fast.jit_library_path.exists())
    assert rebuild.pending() == {"slow"} and lock_is_held(slow) and done == []
    rebuild.wait()
    assert done == [rebuild] and rebuild.failure is None and rebuild.pending() == set()
    assert slow.jit_library_path.exists() and not lock_is_held(slow) and rebuild.seconds() >= 3
    jit_lock = SimpleNamespace(lock_path=tmp_path / "tmp" / "flashinfer_jit.lock")
    assert jit_lock.lock_path.exists() and not lock_is_held(jit_lock), "the JIT dir's lock is let go"


@needs_a_build
def test_a_stopped_rebuild_is_no_failure_and_a_failed_one_is_one_and_neither_says_it_is_built(tmp_path):
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    done = []
    stopped = module_builds.Rebuild([SleepSpec(tmp_path, "slow", 30)], done.append, say=lambda line: None)
    started = time.perf_counter()
    stopped.stop()
    stopped.wait()
    assert time.perf_counter() - started < 20 and stopped.failure is None and done == []
    assert stopped.pending() == set()
    failed = module_builds.Rebuild([SleepSpec(tmp_path, "broken", 0, fails=True)], done.append, say=lambda line: None)
    failed.wait()
    assert failed.failure is not None and "broken" in failed.failure.problem and done == []


@needs_a_build
def test_a_rebuild_waited_for_is_stopped_as_soon_as_a_failure_elsewhere_is_said(tmp_path):
    """Rebuild.wait(stop): once stop() is true (FlashInfer's case of the module rebuilt first failed,
    beside the rebuild), what still builds is stopped, not waited for: no failure of its own, never said
    all built. Without a stop it waits for every module, as before."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    fast, held, release = SleepSpec(tmp_path, "fast", 0), SleepSpec(tmp_path, "held", 0), tmp_path / "release"
    held.ninja_path.write_text(
        f"rule make\n  command = while [ ! -e {release} ]; do sleep 0.05; done && touch $out\n"
        f"build {held.jit_library_path}: make\n"
    )
    done = []
    rebuild = module_builds.Rebuild([fast, held], done.append, say=lambda line: None)
    waiting = threading.Thread(target=rebuild.wait, args=(lambda: "fast" not in rebuild.pending(),), daemon=True)
    waiting.start()
    waiting.join(timeout=60)
    stopped_in_time = not waiting.is_alive()
    release.touch()  # a wait that went on ends
    assert stopped_in_time, "the rebuild was waited for past the failure"
    assert fast.jit_library_path.exists() and not held.jit_library_path.exists()
    assert done == [] and rebuild.failure is None and rebuild.pending() == set()
    module_builds.Rebuild([held], done.append, say=lambda line: None).wait(lambda: False)
    assert held.jit_library_path.exists() and len(done) == 1


@needs_a_build
def test_a_module_another_holds_as_the_rebuild_starts_has_its_ninja_file_written_at_once(tmp_path):
    """A module's ninja file may be older than its spec (one a plan's dry run wrote). Where another holds the
    module's lock as the rebuild starts, the rebuild writes the spec's at once, not only once it takes the
    lock: whoever builds it next, a test's FlashInfer loader too (it writes one only where none is), builds
    what the spec says now; and once let go, the rebuild builds it from that."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock

    class Written(SleepSpec):
        def write_ninja(self):  # FlashInfer's write_if_different, as the spec says now
            self.ninja_path.write_text(f"rule make\n  command = echo now > $out\nbuild {self.jit_library_path}: make\n")

    spec = Written(tmp_path, "held", 0)  # its folder's ninja file: SleepSpec's, which makes an empty library
    lock = FileLock(module_builds.lock_path(spec), thread_local=False)
    module_builds.lock_path(spec).parent.mkdir(parents=True, exist_ok=True)
    lock.acquire()
    try:
        rebuild = module_builds.Rebuild([spec], lambda rebuilt: None, say=lambda line: None)
        assert "echo now" in spec.ninja_path.read_text() and rebuild.pending() == {"held"}
    finally:
        lock.release()
    rebuild.wait()
    assert rebuild.failure is None and spec.jit_library_path.read_text() == "now\n"


class Rebuilding:
    """module_builds.Rebuild still building when smoke's first test fails: it says it is built only if
    not stopped first."""

    def __init__(self, to_build, then, say=None, first=frozenset(), rebuilt=None):
        self.then, self.stopped, self.failure, self.ended = then, threading.Event(), None, None

    def pending(self):
        return {"norm"}

    def seconds(self):
        return 2.5

    def slowest(self):
        return [(1.5, "norm.cuda.o")]

    def wait(self, stop=None):
        self.ended, self.stopped_before_wait = 3.0, self.stopped.is_set()

    def stop(self):
        self.stopped.set()


def norm_run(ours: list[str], built, *rest):
    """build_and_test of one changed module, norm, with no test of FlashInfer's selected."""
    return affected_tests.build_and_test(
        [SimpleNamespace(name="norm")],
        None,
        ours,
        [],
        {},
        {"norm": {}},
        Path("times"),
        lambda: "table",
        built,
        True,
        "auto",
        *rest,
    )


def test_smokes_first_failure_stops_the_rebuild_still_running_and_keeps_its_modules_unfinished(monkeypatch, capsys):
    given, kept = {}, []

    def run_ours(tests, wide, mode, stop=None, order=None):
        given["order"] = order
        return 1, {"tests/smoke/test_kernels.py::test_rmsnorm"}, True

    monkeypatch.setattr(
        affected_tests,
        "start_rebuild",
        lambda to_build, then, say, first, rebuilt: given.setdefault("rebuild", Rebuilding(to_build, then)),
    )
    monkeypatch.setattr(their_tests, "their_run", lambda *args: (None, None))
    monkeypatch.setattr(our_tests, "import_meanwhile", lambda: None)
    monkeypatch.setattr(our_tests, "run_ours", run_ours)
    monkeypatch.setattr(our_tests, "unbuilt_smoke_specs", lambda ours: [])
    monkeypatch.setattr(our_tests, "loaded_modules", lambda ours: [])
    outcome = norm_run(["smoke/test_kernels.py::test_rmsnorm"], lambda: kept.append("unfinished"))
    assert given["rebuild"].stopped_before_wait and kept == ["unfinished"], "it would wait for every module"
    assert outcome.built == "the rebuild stopped at the first failure, 2.5 s in" and outcome.build_s == 2.5
    assert outcome.stopped and outcome.failed == {"tests/smoke/test_kernels.py::test_rmsnorm"}
    assert "affected: the rebuild stopped at the first failure, 2.5 s in\n" in capsys.readouterr().out


def test_a_failed_rebuild_is_build_failed_after_smokes_tests(monkeypatch, capsys):
    class Failed(Rebuilding):
        def wait(self, stop=None):
            self.failure = affected_tests.Failure("the JIT build failed: norm: error: x", "read it")

    monkeypatch.setattr(affected_tests, "start_rebuild", Failed)
    monkeypatch.setattr(their_tests, "their_run", lambda *args: (None, None))
    with pytest.raises(affected_tests.BuildFailed, match="the build of norm failed: the JIT build failed") as failed:
        norm_run([], lambda: None)
    assert capsys.readouterr().out == "table\n" and failed.value.fix == "read it"


@needs_a_build
def test_a_module_is_loaded_only_once_the_build_holding_its_lock_let_it_go(tmp_path):
    """abi-smoke loads a module's library the way the Rust bindings do, by its path; it holds the
    module's lock meanwhile (module_builds.held_while_loading), as FlashInfer's JitSpec.build_and_load
    does, so that a rebuild under way is waited for, never loaded before it is done."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    spec = SleepSpec(tmp_path, "slow", 2)
    rebuild = module_builds.Rebuild([spec], lambda rebuilt: None, say=lambda line: None)
    with module_builds.held_while_loading(spec):
        assert spec.jit_library_path.exists(), "loaded before the rebuild let the module go"
    rebuild.wait()


def test_the_modules_smokes_selected_tests_load_are_named_from_builds_stamps():
    tier = {"norm_module": "norm", "silu_module": "silu", "upstream_only": "not-a-smoke-key"}
    names = ["norm_module", "silu_module", "upstream_only", "unstamped"]
    assert our_tests.smoke_loaded(names, tier, ["smoke/test_kernels.py::test_rmsnorm"]) == {"norm_module"}
    assert our_tests.smoke_loaded(names, tier, ["smoke/test_kernels.py::test_rmsnorm[fp16]"]) == {"norm_module"}
    assert our_tests.smoke_loaded(names, tier, []) == frozenset()


@needs_a_build
def test_the_modules_smokes_tests_load_rebuild_first_and_the_others_yield_to_them(tmp_path, monkeypatch):
    """The modules the first tests wait for start first, at the usual priority, with a job per source; the
    others yield (AHEAD_NICE) and start once their jobs fit (one core: two jobs, four sources: one module
    at a time, the first tests' first)."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    niceness, given, original, started = {}, {}, module_builds.start_ninja, []

    def start_ninja(spec, jobs, running, env=None, nice=0):
        niceness[spec.name], given[spec.name] = nice, jobs
        assert all(proc.poll() is not None for _, proc in started), "started beside a module its jobs do not fit"
        started.append((spec.name, original(spec, jobs, running, env, nice)))
        return started[-1][1]

    monkeypatch.setattr(module_builds, "start_ninja", start_ninja)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(module_builds.os, "cpu_count", lambda: 1)
    monkeypatch.setattr(module_builds, "memory_jobs", lambda: None)  # the cores bound the jobs, not the memory
    specs = [SleepSpec(tmp_path, "theirs", 0), SleepSpec(tmp_path, "smokes", 0)]
    for spec in specs:
        spec.sources = ["a.cu", "b.cu"]
    module_builds.Rebuild(specs, lambda rebuilt: None, lambda line: None, frozenset({"smokes"})).wait()
    assert niceness == {"smokes": 0, "theirs": module_builds.AHEAD_NICE} and given == {"smokes": 2, "theirs": 2}
    assert [name for name, _ in started] == ["smokes", "theirs"]
    for spec in specs:
        spec.jit_library_path.unlink()
    started.clear()
    module_builds.Rebuild(specs, lambda rebuilt: None, lambda line: None).wait()
    assert niceness == {"smokes": 0, "theirs": 0}, "with no smoke module among them, none yields"
    assert [name for name, _ in started] == ["theirs", "smokes"], "the order given"
    assert given == {"smokes": 2, "theirs": 2}, "one at a time, each with a job per source"


def test_the_head_of_first_that_fits_the_cores_leads_and_every_other_module_yields(monkeypatch):
    """module_builds.leading: of `first` in its order, the modules whose jobs fit the cores together (the
    head always, even one larger than all the cores) build at the usual priority; a module of `first`
    past them, and any module not in it, yields; with no `first`, none leads and none yields."""
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(module_builds.os, "cpu_count", lambda: 4)  # a job budget of 8
    monkeypatch.setattr(module_builds, "memory_jobs", lambda: None)  # the cores bound the jobs, not the memory
    spec = lambda name, n: SimpleNamespace(name=name, sources=[f"{i}.cu" for i in range(n)])  # noqa: E731
    specs = [spec("other", 1), spec("b", 2), spec("a", 2), spec("c", 1)]
    assert module_builds.leading(specs, ("a", "b", "c")) == {"a", "b"}, "2 + 2 jobs fit 4 cores; c's fifth does not"
    assert module_builds.leading(specs, ("c", "a")) == {"c", "a"}
    assert module_builds.leading([spec("big", 12), *specs], ("big", "a")) == {"big"}, "the head alone, 8 jobs"
    assert module_builds.leading(specs, ("not built", "b")) == {"b"}
    assert module_builds.leading(specs, ()) == frozenset()
    assert [s.name for s in module_builds.in_order(specs, ("c", "a"))] == ["c", "a", "other", "b"]
    monkeypatch.setattr(module_builds.os, "cpu_count", lambda: None)  # the count unknown: one core
    assert module_builds.leading(specs, ("c", "other")) == {"c"}, "1 job fits the one core; other's second does not"


@needs_a_build
def test_the_first_tests_module_builds_at_the_usual_priority_and_those_of_later_tests_yield(tmp_path, monkeypatch):
    """A rebuild of three modules, each of the first tests': the first two fit the two cores and build at the
    usual priority, the third yields to them (AHEAD_NICE), as every module not in `first` does."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    niceness, original = {}, module_builds.start_ninja

    def start_ninja(spec, jobs, running, env=None, nice=0):
        niceness[spec.name] = nice
        return original(spec, jobs, running, env, nice)

    monkeypatch.setattr(module_builds, "start_ninja", start_ninja)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(module_builds.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(module_builds, "memory_jobs", lambda: None)  # the cores bound the jobs, not the memory
    specs = [SleepSpec(tmp_path, name, 0) for name in ("later", "second", "head", "not_first")]
    module_builds.Rebuild(specs, lambda rebuilt: None, lambda line: None, ("head", "second", "later")).wait()
    assert niceness == {
        "head": 0,
        "second": 0,
        "later": module_builds.AHEAD_NICE,
        "not_first": module_builds.AHEAD_NICE,
    }


def test_a_module_smokes_tests_built_is_smokes_as_one_build_made_is(tmp_path, monkeypatch):
    """affected tells smoke's modules from build's stamps and from the mark smoke's tests leave on a
    module they built (the wide tier's batch prefill, which `build` leaves out): its smoke tests are its
    tests, so a run in which they passed covers it. A module of the same name that FlashInfer's tests
    built carries no mark: its recorded FlashInfer tests are its tests, as before."""
    from fidev.affected import built
    from fidev.builds import build_stamp, smoke_modules
    from fidev.records import build_records

    monkeypatch.setattr(build_stamp, "stamped_modules", lambda ws: [])
    wide, page = smoke_modules.BY_KEY["batch_prefill_fa2"], smoke_modules.BY_KEY["page"]
    build_records.record_smoke_module(tmp_path / wide.name, wide.key)
    (tmp_path / page.name).mkdir()
    build_records.record_smoke_module(tmp_path / "another_module", "page")  # a key of another module's name
    assert built.tier_keys(None, tmp_path) == {wide.name: "batch_prefill_fa2"}
    assert all(m.name and smoke_modules.BY_NAME[m.name] is m for m in smoke_modules.MODULES)


def test_a_module_builds_stamp_names_is_smokes_in_the_jit_dir_it_was_built_in(tmp_path):
    """affected's smoke module keys of a JIT dir (tier_keys) take build's stamps of the task's workspace
    for the modules built there, and not for those of another JIT dir (another arch set's)."""
    from fidev.affected import built
    from fidev.builds import build_stamp
    from fidev.core import workspace
    from fidev.core.manifest import pins

    ws = workspace.read(pins().flashinfer, {"FLASHINFER_WORKSPACE_BASE": str(tmp_path)})
    jit_dir, other = (ws.version_dir / arch / "cached_ops" for arch in ("90a", "100a"))
    build_stamp.write(
        ws, {"wide": False, "abi": False}, "stamp", [build_stamp.Module("norm", "norm", jit_dir / "norm", [])]
    )
    assert built.tier_keys(ws, jit_dir) == {"norm": "norm"} and built.tier_keys(ws, other) == {}


def test_smokes_session_and_affecteds_builds_beside_it_mark_the_smoke_modules_they_build(tmp_path, monkeypatch):
    """The two ways smoke's tests build a module `build` did not: their own loader (the conftest's
    recording build) and affected's builds beside them (SmokeBuilds)."""
    from fidev.builds import smoke_modules
    from fidev.records import build_records

    page = smoke_modules.BY_KEY["page"]
    spec = SimpleNamespace(name=page.name, build_dir=tmp_path / page.name, sources=["s.cu"])
    other = SimpleNamespace(name="not_smokes", build_dir=tmp_path / "not_smokes", sources=["s.cu"])

    class Ahead:
        def __init__(self, specs, say, after=None, nice=10, env=None):
            pass

    monkeypatch.setattr(our_tests, "unbuilt_smoke_specs", lambda ours: [spec, other])
    monkeypatch.setattr(our_tests.module_builds, "Ahead", Ahead)
    our_tests.SmokeBuilds(["smoke/test_wide.py::test_append_paged_kv_cache"], lambda line: None)
    assert build_records.smoke_module(spec.build_dir) == "page" and build_records.smoke_module(other.build_dir) is None

    marked = []
    built = module_builds.recording_build(lambda spec, verbose, need_lock=False: None, lambda line: None, marked.append)
    monkeypatch.setattr(module_builds, "record_build", lambda build_dir, ninja_file: None)
    fresh = SimpleNamespace(
        name="fresh",
        build_dir=tmp_path / "fresh",
        sources=[],
        jit_library_path=tmp_path / "fresh/fresh.so",
        ninja_path=tmp_path / "fresh/build.ninja",
    )
    built(fresh, False, need_lock=False)
    assert marked == [fresh]


def test_a_passing_run_waits_for_the_whole_rebuild_and_hands_each_step_its_part(monkeypatch):
    """smoke's tests passed: the rebuild is not stopped before it ends (FlashInfer's tests wait for it);
    the rebuild gets the screen's `say` and the modules smoke's tests load (`first`), smoke's order what the
    rebuild still builds, and the rebuild's line names its slowest object."""
    given, lines = {}, []

    class Done(Rebuilding):
        def __init__(self, to_build, then, say=None, first=frozenset(), rebuilt=None):
            super().__init__(to_build, then)
            given.update(say=say, first=first, rebuild=self, rebuilt=rebuilt)
            then(self)

    class Ahead:  # the builds beside smoke's tests: what they say goes to the screen too
        def __init__(self, specs, say, after=None, nice=10, env=None):
            say("building beside")

        def pending(self):
            return set()

        def stop(self):
            pass

    def run_ours(tests, wide, mode, stop=None, order=None):
        given["order"] = order
        return 0, set(), False

    monkeypatch.setattr(affected_tests, "start_rebuild", Done)
    monkeypatch.setattr(their_tests, "their_run", lambda *args: (None, None))
    monkeypatch.setattr(our_tests, "import_meanwhile", lambda: None)
    monkeypatch.setattr(affected_tests, "screen", lambda: lines.append)
    monkeypatch.setattr(our_tests, "run_ours", run_ours)
    monkeypatch.setattr(our_tests, "unbuilt_smoke_specs", lambda ours: [SimpleNamespace(name="wide")])
    monkeypatch.setattr(our_tests.module_builds, "Ahead", Ahead)
    monkeypatch.setattr(our_tests, "loaded_modules", lambda ours: [(tuple(ours), "norm")])
    monkeypatch.setattr(our_tests, "ready_first", lambda loaded, pending, stop: (loaded, pending))
    ours = ["smoke/test_kernels.py::test_rmsnorm"]
    keep = []
    outcome = norm_run(ours, lambda: None, False, frozenset({"norm"}), keep.append)
    assert not given["rebuild"].stopped_before_wait
    assert given["say"] == lines.append and given["first"] == ("norm",)
    loaded, pending = given["order"]
    assert loaded == [(tuple(ours), "norm")] and pending() == {"norm"}, "the rebuild's modules still building"
    assert outcome.built == "1 module(s) rebuilt in 2.5 s (slowest object 1.5 s)"
    assert lines == [
        "affected: 1 module(s) rebuilt in 2.5 s (slowest object 1.5 s)",
        "affected: smoke's modules: building beside",
    ]
    assert given["rebuilt"] == keep.append, "each module kept as it is rebuilt"


@needs_a_build
def test_each_module_is_kept_before_its_lock_is_let_go_and_a_failed_one_is_never_let_go_early(tmp_path):
    """affected keeps each module `unfinished` as it is rebuilt, before a test can load it (a run killed
    during smoke's tests then reruns it); a module whose build failed is the rebuild's failure at once,
    stays pending and locked while the others build (no test loads its old library), and a stop after
    that leaves the failure said."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    fast, broken, slow = (
        SleepSpec(tmp_path, "fast", 0),
        SleepSpec(tmp_path, "broken", 0, True),
        SleepSpec(tmp_path, "slow", 4),
    )
    kept = []
    rebuild = module_builds.Rebuild(
        [fast, broken, slow],
        lambda rebuilt: kept.append("all"),
        lambda line: None,
        rebuilt=lambda name: kept.append(
            (name, lock_is_held(SimpleNamespace(lock_path=tmp_path / "tmp" / f"{name}.lock")))
        ),
    )
    # fast and broken build side by side: either may end first (seen failing under load when this waited
    # for the failure alone)
    assert wait_until(lambda: rebuild.failure is not None and any(k[0] == "fast" for k in kept if k != "all"))
    assert "broken" in rebuild.failure.problem and ("fast", True) in kept, kept
    assert {"broken", "slow"} <= rebuild.pending() and lock_is_held(broken), "no test may load broken's old library"
    rebuild.stop()
    rebuild.wait()
    assert rebuild.failure is not None and "all" not in kept and not lock_is_held(broken)


@needs_a_build
def test_a_module_another_builder_held_is_built_again_under_its_lock_and_a_stop_ends_the_wait(tmp_path):
    """build_or_wait waits for a module whose lock another builder holds, then runs ninja on it under the
    lock: the other may have built it from older sources, so a library that exists is not taken as
    current. Stopped meanwhile, it waits no longer and builds nothing."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    import os
    import threading as th

    from filelock import FileLock

    spec = SleepSpec(tmp_path, "held", 0)
    source = tmp_path / "held" / "s.cu"
    source.write_text("new")
    spec.ninja_path.write_text(
        f"rule make\n  command = echo ran >> {tmp_path}/ran && touch $out\n"
        f"build {spec.jit_library_path}: make {source}\n"
    )
    spec.jit_library_path.write_text("built by the other, from the older source")
    os.utime(spec.jit_library_path, (1, 1))
    spec.lock_path = tmp_path / "tmp" / "held.lock"
    spec.lock_path.parent.mkdir(parents=True, exist_ok=True)
    other = FileLock(spec.lock_path, thread_local=False)
    taken = th.Event()

    def hold(seconds):
        other.acquire()
        taken.set()
        time.sleep(seconds)
        other.release()

    th.Thread(target=hold, args=(1.0,)).start()
    taken.wait()
    jit_lock = FileLock(tmp_path / "tmp" / "flashinfer_jit.lock", thread_local=False)
    module_builds.build_or_wait([spec], lambda line: None, jit_lock)
    assert (tmp_path / "ran").read_text() == "ran\n", "the library the other left was taken as current"
    taken.clear()
    th.Thread(target=hold, args=(5.0,)).start()
    taken.wait()
    stopped = th.Event()
    th.Timer(0.3, stopped.set).start()
    started = time.perf_counter()
    module_builds.build_or_wait([spec], lambda line: None, jit_lock, stopped=stopped)
    assert time.perf_counter() - started < 3, "the wait went on past the stop"


def test_a_build_whose_inputs_ninja_cannot_list_is_left_with_no_record_not_an_empty_one(tmp_path, monkeypatch):
    """An empty record would hide every later edit of the module's inputs from affected; ninja's deps
    tool that could not run (PATH changed under it by tests in this process) leaves no record instead,
    and the module's edits are told from ninja's mtimes."""
    from fidev.records import ninja_inputs

    module = tmp_path / "norm"
    module.mkdir()
    (module / ninja_inputs.STAMP).write_text('{"norm.o": {}}')

    def no_ninja(*args, **kwargs):
        raise FileNotFoundError("ninja")

    monkeypatch.setattr(ninja_inputs.subprocess, "run", no_ninja)
    ninja_inputs.record(module, module / "build.ninja")
    assert not (module / ninja_inputs.STAMP).exists() and ninja_inputs.edited(module) is None
    monkeypatch.setattr(ninja_inputs.subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=1, stdout=""))
    assert ninja_inputs.deps(module, module / "build.ninja") is None


def made_by(spec: "SleepSpec", command: str) -> "SleepSpec":
    """`spec`, its library made by a shell `command` (ninja's `$out` the library), under its module's lock."""
    spec.ninja_path.write_text(f"rule make\n  command = {command}\nbuild {spec.jit_library_path}: make\n")
    spec.lock_path = module_builds.lock_path(spec)
    spec.lock_path.parent.mkdir(parents=True, exist_ok=True)
    return spec


class JitLock:
    """The JIT dir's lock (filelock's, as FlashInfer's) as build_or_wait takes it, once a round: counted,
    `on_take(n)` before the n-th take, `let_go` set as it is let go."""

    def __init__(self, path: Path, on_take=lambda n: None):
        from filelock import FileLock

        self.lock, self.on_take, self.taken, self.let_go = (
            FileLock(path, thread_local=False),
            on_take,
            0,
            threading.Event(),
        )

    def __enter__(self):
        self.taken += 1
        self.on_take(self.taken)
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()
        self.let_go.set()


@needs_a_build
def test_build_or_wait_lets_each_module_go_as_it_ends_and_runs_ninja_in_the_env_given_said_and_listed(tmp_path):
    """A test that loads one module waits for that one alone, not for a slower one built beside it; ninja
    runs in the environment given (taken before tests in this process change theirs), its lines are said,
    and each ninja is listed in `running`, for a stop to end."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock

    gate, started = tmp_path / "go", tmp_path / "slow started"
    fast = made_by(SleepSpec(tmp_path, "fast", 0), 'printf %s "$$FIDEV_MARK" > $out')
    slow = made_by(
        SleepSpec(tmp_path, "slow", 0),
        f"touch '{started}' && while [ ! -e '{gate}' ]; do sleep 0.05; done && touch $out",
    )
    lines, running = [], []
    env = dict(os.environ, FIDEV_MARK="given")
    builds = threading.Thread(
        target=module_builds.build_or_wait,
        args=([fast, slow], lines.append, JitLock(tmp_path / "tmp" / "flashinfer_jit.lock")),
        kwargs={"env": env, "running": running},
    )
    builds.start()
    try:
        assert wait_until(started.exists), "slow's build never started"
        loading = FileLock(fast.lock_path, thread_local=False)
        loading.acquire(timeout=20)  # Timeout: fast's lock is held until slow, still building, ends
        loading.release()
        assert fast.jit_library_path.read_text() == "given", "ninja ran in this process's environment"
    finally:
        gate.touch()
        builds.join(60)
    assert not builds.is_alive() and slow.jit_library_path.exists()
    assert len(running) == 2 and all(proc.poll() == 0 for proc in running), running
    assert any("slow" in line for line in lines) and any("fast" in line for line in lines), lines


@needs_a_build
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_build_or_wait_lets_a_modules_lock_go_when_its_build_thread_raised(tmp_path):
    """ninja not found on the PATH of the environment given (tests in this process change PATH): the
    module's build thread raises before the module ends, and its lock is let go all the same, or every
    test that loads it would wait for ever."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    spec = made_by(SleepSpec(tmp_path, "orphan", 0), "touch $out")
    jit_lock = JitLock(tmp_path / "tmp" / "flashinfer_jit.lock")
    with pytest.raises(module_builds.Failure, match="ninja could not start for orphan"):
        module_builds.build_or_wait([spec], lambda line: None, jit_lock, env={"PATH": str(tmp_path / "no ninja here")})
    assert not spec.jit_library_path.exists() and not lock_is_held(spec)


@needs_a_build
def test_build_or_wait_builds_a_module_freed_after_its_first_round_and_nothing_once_stopped(tmp_path):
    """A module another builder holds is waited for while `stopped` is not set, then built here; once
    `stopped` is set, no wait goes on and no round starts again, though the other let the module go
    meanwhile."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock

    ran = tmp_path / "ran"
    spec = made_by(SleepSpec(tmp_path, "held", 0), f"echo ran >> '{ran}' && touch $out")
    other = FileLock(spec.lock_path, thread_local=False)
    other.acquire()
    jit_lock = JitLock(tmp_path / "tmp" / "flashinfer_jit.lock")
    builds = threading.Thread(
        target=module_builds.build_or_wait,
        args=([spec], lambda line: None, jit_lock),
        kwargs={"stopped": threading.Event()},
    )
    builds.start()
    assert jit_lock.let_go.wait(30), "the first round never ended"
    other.release()  # the other builder is done, after build_or_wait's first round passed the module by
    builds.join(60)
    assert not builds.is_alive() and ran.read_text() == "ran\n", "not built once the other let it go"
    ran.unlink()
    other.acquire()
    stopped = threading.Event()
    stopped.set()
    jit_lock = JitLock(tmp_path / "tmp" / "flashinfer_jit.lock", on_take=lambda n: n == 2 and other.release())
    try:
        module_builds.build_or_wait([spec], lambda line: None, jit_lock, stopped=stopped)
    finally:
        if jit_lock.taken < 2:
            other.release()
    assert jit_lock.taken == 1 and not ran.exists(), "a round after the stop"


def test_start_holding_returns_once_taken_does_the_work_in_a_daemon_thread_and_raises_takes_error(tmp_path):
    """start_holding returns once take() is done, the work going on in its thread; what take() raised is
    raised in the caller's thread; and a process whose build thread still works ends (a daemon thread)."""
    import subprocess
    import sys

    worked, returned = threading.Event(), []
    caller = threading.Thread(
        target=lambda: returned.append(module_builds.start_holding(lambda: None, worked.set)), daemon=True
    )
    caller.start()
    caller.join(30)
    assert returned and worked.wait(30), "start_holding never returned, or never did the work"

    def refused():
        raise RuntimeError("the lock is another's")

    with pytest.raises(RuntimeError, match="the lock is another's"):
        module_builds.start_holding(refused, worked.set)
    ends = (
        "import threading; from fidev.builds import module_builds; "
        "module_builds.start_holding(lambda: None, threading.Event().wait)"
    )
    scripts = str(Path(module_builds.__file__).parents[2])
    done = subprocess.run([sys.executable, "-c", ends], env=dict(os.environ, PYTHONPATH=scripts), timeout=60)
    assert done.returncode == 0


@needs_a_build
def test_a_rebuild_of_no_module_is_done_at_once_and_its_ninja_runs_in_the_env_it_started_in(tmp_path, monkeypatch):
    """Rebuild with nothing to build calls then() and ends; its ninja runs in this process's environment as
    the Rebuild began, not as a test in this process changed it meanwhile (here, as the build said its
    first line, before ninja started)."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    done = []
    nothing = module_builds.Rebuild([], done.append, say=lambda line: None)
    nothing.wait()
    assert done == [nothing] and nothing.failure is None
    from fidev.core.workspace import BUILDING

    spec = made_by(SleepSpec(tmp_path, "norm", 0), 'printf %s "$$FIDEV_MARK" > $out')
    (spec.build_dir / BUILDING).write_text("{}")  # a build that did not finish, and an object it compiled
    (spec.build_dir / "norm.o").write_text("")
    monkeypatch.setenv("FIDEV_MARK", "as it began")

    def say(line):
        if "did not finish" in line:  # in the rebuild's thread, before its ninja starts
            os.environ["FIDEV_MARK"] = "changed by a test"

    rebuild = module_builds.Rebuild([spec], done.append, say=say)
    rebuild.wait()
    assert rebuild.failure is None and spec.jit_library_path.read_text() == "as it began"


@needs_a_build
@pytest.mark.parametrize("builder", ["build_or_wait", "build_beside", "Rebuild"])
def test_each_modules_lock_is_let_go_in_the_thread_that_took_it(tmp_path, monkeypatch, builder):
    """filelock 3.32.5 forgets a hold only in the thread that lets it go (filelock/_api.py,
    `_drop_registry_entry`). A module's lock taken in one thread and let go in its build thread left
    that hold behind, and the first thread's next blocking take of the path by another instance,
    FlashInfer's `JitSpec.build_and_load` in the next test after a warmup, raised "Deadlock"
    (`_raise_if_would_deadlock`): every gelu case of test_activation.py on a GPU host (docs/measurements.md,
    row "upstream-tests activation"). So each lock is let go in the thread that took it, whichever builds
    the modules."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    import filelock

    threads_of: dict = {}  # id(lock) -> ([threads that took it], [threads that let it go])

    class Recording(filelock.FileLock):
        """The thread of each take of a free lock, and of each let-go that frees it."""

        def acquire(self, *args, **kwargs):
            free = not self.is_locked
            proxy = super().acquire(*args, **kwargs)
            if free:
                threads_of.setdefault(id(self), ([], []))[0].append(threading.get_ident())
            return proxy

        def release(self, *args, **kwargs):
            held = self.is_locked
            super().release(*args, **kwargs)
            if held and not self.is_locked:
                threads_of.setdefault(id(self), ([], []))[1].append(threading.get_ident())

    monkeypatch.setattr(filelock, "FileLock", Recording)
    specs = [made_by(SleepSpec(tmp_path, name, 0), "touch $out") for name in ("one", "two", "three")]
    if builder == "build_or_wait":
        module_builds.build_or_wait(specs, lambda line: None, Recording(tmp_path / "tmp" / "jit.lock"))
    elif builder == "build_beside":
        module_builds.build_beside(specs, lambda line: None, [])
    else:
        module_builds.Rebuild(specs, then=lambda rebuild: None, say=lambda line: None).wait()
    assert all(spec.jit_library_path.exists() for spec in specs)
    assert len(threads_of) >= len(specs), threads_of
    for took, let_go in threads_of.values():
        assert sorted(took) == sorted(let_go), "a lock let go in another thread than the one that took it"


@needs_a_build
@pytest.mark.parametrize("where", ["ninja's start", "the record after it"])
def test_a_module_whose_build_thread_raised_is_a_failed_rebuild_not_a_built_one(tmp_path, monkeypatch, where):
    """A module's ninja that could not start (fork's ENOMEM on a loaded host, ninja gone; said in two
    lines), or a build thread that raised anywhere else (threading's hook says what), leaves its old
    library in place: the rebuild fails, never says it built (then()), and keeps its lock until it ends,
    so that no test loads the old library as the edit's."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    fast, old = SleepSpec(tmp_path, "fast", 0), SleepSpec(tmp_path, "old", 0)
    old.jit_library_path.touch()  # the library built before the edit
    start_ninja, record_build = module_builds.start_ninja, module_builds.record_build

    def no_fork(spec, *args, **kwargs):
        if spec.name == "old":
            raise OSError(12, "Cannot allocate memory")
        return start_ninja(spec, *args, **kwargs)

    def no_record(build_dir, *args):
        if build_dir.name == "old":
            raise RuntimeError("a bug of ours")
        return record_build(build_dir, *args)

    if where == "ninja's start":
        monkeypatch.setattr(module_builds, "start_ninja", no_fork)
    else:
        monkeypatch.setattr(module_builds, "record_build", no_record)
    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    done, said_built = [], []
    rebuild = module_builds.Rebuild([fast, old], done.append, say=lambda line: None, rebuilt=said_built.append)
    rebuild.wait()
    assert said_built == ["fast"], "the old module said rebuilt: the gate would let its cases load the old library"
    assert done == [] and rebuild.failure is not None and "old" in rebuild.failure.problem, (done, rebuild.failure)
    expected = "ninja could not start for old: Cannot allocate memory" if where == "ninja's start" else "raised"
    assert expected in rebuild.failure.problem and len(raised) == (where != "ninja's start"), rebuild.failure


@needs_a_build
def test_a_rebuild_says_whether_it_took_every_modules_lock_as_it_began(tmp_path):
    """A module whose lock another process held as the rebuild began is rebuilt only once every other
    module is (build_or_wait), its lock free meanwhile once that process lets it go: a case ready early
    behind FlashInfer's gate could load it before it is rebuilt. The rebuild says so (all_held False),
    and affected's gate then names no module built before the whole rebuild is done."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock

    fast, other = SleepSpec(tmp_path, "fast", 0), SleepSpec(tmp_path, "other", 0)
    rebuild = module_builds.Rebuild([fast, other], lambda rebuilt: None, say=lambda line: None)
    rebuild.wait()
    assert rebuild.all_held and rebuild.failure is None
    elsewhere = FileLock(module_builds.lock_path(other), thread_local=False)
    elsewhere.acquire()  # another process builds or loads it as the rebuild begins
    try:
        rebuild = module_builds.Rebuild([fast, other], lambda rebuilt: None, say=lambda line: None)
        assert not rebuild.all_held
    finally:
        elsewhere.release()
    rebuild.wait()
    assert rebuild.failure is None and other.jit_library_path.exists()
