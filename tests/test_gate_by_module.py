"""affected's gate opens module by module (fidev.upstream.gate): affected writes, whole each time, which
of the rebuild's modules are built (GateWriter), and each of FlashInfer's test processes behind it runs a
case as soon as the modules the record names for it are built, the others waiting; a case the record
does not name runs where none named is ready and the rebuild holds its locks, else waits for the whole
rebuild; the first failing case, before the gate is open, ends the run, and affected stops what still
builds. The tree is tests/support/upstream_standin.py's stand-in of
FlashInfer's suite at v0.6.3."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fidev.affected import summary as affected_summary
from fidev.core.manifest import pins
from fidev.upstream import gate as upstream_gate
from fidev.upstream.settings import Settings
from script_runs import require, wait_until
from upstream_standin import compiles, needs_a_build, standin_ws, upstream  # noqa: F401 (standin_ws: the fixture `ws`)

TESTS = "extern/tracked/flashinfer/tests"


def state(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_gate_is_written_once_the_rebuild_began_with_what_came_before_and_never_after_its_close(tmp_path):
    """The rebuild's thread may say a module built, or all of them, before the run's thread says it
    began: the first text holds them. Each text is whole, of the schema the processes read."""
    gate = tmp_path / "gate"
    writer = upstream_gate.GateWriter(gate)
    writer.built("fast")
    assert not gate.exists(), "a gate written before the rebuild began names no tests to run"
    writer.begin(["fast", "slow"], ["tests/t.py::test_a"])
    assert state(gate) == {
        "schema": upstream_gate.SCHEMA,
        "selection": ["tests/t.py::test_a"],
        "modules": ["fast", "slow"],
        "built": ["fast"],
        "held": True,
        "open": False,
    }
    assert upstream_gate.read_state(gate) == upstream_gate.State(
        ["tests/t.py::test_a"], frozenset({"slow"}), False, True
    )
    assert not upstream_gate.opened(gate)
    writer.built("slow")
    assert upstream_gate.read_state(gate).waiting == frozenset() and not upstream_gate.opened(gate)
    writer.open()
    assert upstream_gate.opened(gate)
    writer.close()
    gate.unlink()
    writer.built("late")
    writer.open()
    assert not gate.exists(), "written after its close: its folder would come back"
    opened_first = upstream_gate.GateWriter(gate)
    opened_first.open()
    opened_first.begin(["m"], None)
    assert upstream_gate.read_state(gate) == upstream_gate.State(None, frozenset({"m"}), True, True)


def test_a_gate_file_of_another_schema_or_shape_is_none_of_ours(tmp_path):
    gate = tmp_path / "gate"
    assert upstream_gate.read_state(gate) is None and not upstream_gate.opened(gate), "no file: not begun"
    first = {"schema": "fidev-affected-gate/1", "selection": None, "modules": [], "built": [], "open": True}
    for text in ("go\n", json.dumps({"schema": "fidev-affected-gate/0", "open": True}), "[]", json.dumps(first)):
        gate.write_text(text)
        with pytest.raises(ValueError, match="is not affected's gate of schema fidev-affected-gate/2"):
            upstream_gate.read_state(gate)
        assert not upstream_gate.opened(gate)
    for held in ("yes", None):
        whole = {"schema": upstream_gate.SCHEMA, "selection": None, "modules": [], "built": [], "open": False}
        gate.write_text(json.dumps({**whole, "held": held}))
        with pytest.raises(ValueError):
            upstream_gate.read_state(gate)
    gate.write_text(json.dumps({"schema": upstream_gate.SCHEMA, "selection": None, "modules": [], "built": []}))
    with pytest.raises(ValueError):
        upstream_gate.read_state(gate)
    upstream_gate.open_gate(gate, ["tests/t.py::test_a"])
    assert upstream_gate.read_state(gate) == upstream_gate.State(["tests/t.py::test_a"], frozenset(), True)


def case(nodeid: str, parent="file"):
    return SimpleNamespace(nodeid=nodeid, parent=parent)


def test_before_the_gate_opens_a_case_runs_only_where_every_module_the_record_names_is_built_and_none_rebuilding(
    tmp_path, monkeypatch
):
    """A case waits while a module the record names for it still rebuilds, or is built by nothing yet
    (the builds ahead compile that once the gate is open, side by side); a case the record names none
    of the modules of runs where no named case is ready, the rebuild holding its locks (a module of it
    that case loads waits for its build there); once the gate is open, a case whose modules are built
    runs first, then the rest in order."""
    monkeypatch.setattr(upstream_gate, "owner_alive", lambda owner: True)
    gate_file = tmp_path / "gate"
    built = {"fast", "slow", "page"}
    needs = {"t.py::slow": ["page", "slow"], "t.py::never_built": ["page", "new"], "t.py::fast": ["fast", "page"]}
    gate = upstream_gate.Gate(gate_file, "owner", needs, lambda name: name in built)
    writer = upstream_gate.GateWriter(gate_file)
    writer.begin(["fast", "slow"], None)
    left = [case("t.py::unnamed"), case("t.py::slow"), case("t.py::never_built"), case("t.py::fast")]
    assert gate.ready(left[1:]) is None, "each named case waits: a module rebuilding, or built by nothing"
    assert gate.ready(left).nodeid == "t.py::unnamed", "none named is ready: the unnamed case"
    writer.built("fast")
    assert gate.ready(left).nodeid == "t.py::fast", "a named case ready first, before an unnamed one"
    writer.built("slow")
    assert gate.ready(left).nodeid == "t.py::slow", "the first ready in pytest's order"
    assert gate.ready(left[2:3]) is None, "the case of a module nothing built waits"
    assert gate.ready(left[:1] + left[2:3]).nodeid == "t.py::unnamed"
    writer.open()
    assert gate.ready(left).nodeid == "t.py::slow", "open: the cases whose modules are built first"
    assert gate.ready(left[:1] + left[2:3]).nodeid == "t.py::unnamed", "open: then every case, in order"
    gate_file.unlink()  # the run's folder went at its end: what the gate said last stands
    assert gate.ready(left[:1]).nodeid == "t.py::unnamed"


def test_a_case_the_record_does_not_name_waits_for_the_whole_rebuild_where_its_locks_are_not_all_held_or_no_record(
    tmp_path, monkeypatch
):
    """Where the rebuild could not take every module's lock (another process held one: built last, its lock
    free meanwhile), an unnamed case could load that module before its rebuild: it waits for the gate to
    open. A run with no record (--whole-family) has every case unnamed: they wait too, leaving the cores
    to the rebuild."""
    monkeypatch.setattr(upstream_gate, "owner_alive", lambda owner: True)
    gate_file, left = tmp_path / "gate", [case("t.py::unnamed")]
    writer = upstream_gate.GateWriter(gate_file)
    writer.begin(["slow"], None, by_module=False)
    assert state(gate_file)["held"] is False
    assert upstream_gate.Gate(gate_file, "owner", {"t.py::named": ["slow"]}, lambda name: True).ready(left) is None
    writer.begin(["slow"], None)
    assert upstream_gate.Gate(gate_file, "owner", {}, lambda name: True).ready(left) is None
    named = upstream_gate.Gate(gate_file, "owner", {"t.py::named": ["slow"], "t.py::unnamed": []}, lambda name: True)
    assert named.ready(left).nodeid == "t.py::unnamed", "a record that names no module of it: unnamed"
    writer.open()
    assert upstream_gate.Gate(gate_file, "owner", {}, lambda name: True).ready(left).nodeid == "t.py::unnamed"


def test_with_no_case_ready_the_early_stop_hands_the_loop_the_first_case_left(tmp_path, monkeypatch):
    """The early stop (fidev.upstream.outcomes.early_stop) does not run the case it is handed: a process
    waiting for its modules when another case of the run failed ends instead of waiting on."""
    monkeypatch.setattr(upstream_gate, "owner_alive", lambda owner: True)
    upstream_gate.GateWriter(tmp_path / "gate").begin(["slow"], None)
    stops = iter([False, False, True])
    needs = {"t.py::a": ["slow"], "t.py::b": ["slow"]}
    gate = upstream_gate.Gate(tmp_path / "gate", "owner", needs, lambda name: True, lambda: next(stops))
    monkeypatch.setattr(upstream_gate, "WAIT_S", 0)
    gate.state()
    left = [case("t.py::a"), case("t.py::b")]
    assert gate.next_case(left) is left[0]


def test_a_waiting_case_keeps_the_fixtures_of_the_parent_every_case_left_shares():
    """pytest's nextitem where none is ready yet: a case of the same parent keeps the module's fixtures (a
    warmup_jit's, set up once) whichever case then runs; cases of other parents tear everything down."""
    item = case("a.py::x", parent="a.py")
    assert upstream_gate.kept_for(item, [case("a.py::y", "a.py"), case("a.py::z", "a.py")]).nodeid == "a.py::y"
    assert upstream_gate.kept_for(item, [case("a.py::y", "a.py"), case("b.py::z", "b.py")]) is None
    assert upstream_gate.kept_for(item, []) is None


ACTIVATION = """\
import os, sys
import pytest
import flashinfer
gate = sys.modules["fidev.upstream.gate"]
EVENTS = os.environ["EVENTS"]
asked = {"n": 0, "last": "nothing"}
def note(what):
    asked.update(n=0, last=what)
    open(EVENTS, "a").write(what + "\\n")
# the rendezvous: the gate asks whether its owner lives each time it reads itself not open, so a second
# asking after a case ran is a process that found no case ready, waited, and found none again
def owner_alive(owner, alive=gate.owner_alive):
    asked["n"] += 1
    if asked["n"] == 2:
        open(EVENTS, "a").write(f"waiting after {asked['last']}\\n")
    return alive(owner)
gate.owner_alive = owner_alive
@pytest.fixture(autouse=True, scope="module")
def warmup_jit():  # as tests/utils/test_activation.py's at v0.6.3: every module of the file's parameter space
    open(EVENTS, "a").write("warmup\\n")
    flashinfer.jit.build_jit_specs([flashinfer.gen(a, 1) for a in ("silu_and_mul", "gelu_and_mul", "gelu_tanh")])
    yield
@pytest.mark.parametrize("act", ["silu_and_mul", "gelu_and_mul"])
def test_act(act):
    flashinfer.load(act, 1)
    note(act)
    assert os.environ.get("FAIL") != act
def test_unnamed():
    note("unnamed")
def test_other():
    note("other")
"""
REBUILT = ["gelu_and_mul", "silu_and_mul"]


def behind_the_gate(root, env, tmp_path, *args, fail="") -> tuple[subprocess.Popen, upstream_gate.GateWriter, Path]:
    """The activation file's sample run behind a gate this process writes, as affected does, once a first
    run built silu_and_mul and gelu_and_mul and recorded which case loads which (test_unnamed and
    test_other load nothing: the record does not name them); gelu_tanh, which the warmup asks for too, is
    built by nothing. `fail`: the case of that module fails behind the gate."""
    (root / TESTS / "utils/test_activation.py").write_text(ACTIVATION)
    events = tmp_path / "events"
    env = {**env, "EVENTS": str(events)}
    done = upstream(root, env, "activation", "--no-plan")
    assert done.returncode == 0 and "upstream-tests: 4 passed" in done.stdout, done.stdout + done.stderr
    shutil.rmtree(jit_dir(env) / "gelu_tanh")
    events.unlink()
    Path(env["FAKE_COMPILES"]).unlink()
    gate = tmp_path / "gate"
    settings = Settings(gate=gate, gate_owner=upstream_gate.process_identity(os.getpid()))
    proc = subprocess.Popen(
        [sys.executable, str(root / "scripts/upstream_tests.py"), "activation", "--no-plan", "--sample", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env, **settings.env(), "FAIL": fail},
    )
    return proc, upstream_gate.GateWriter(gate), events


def jit_dir(env) -> Path:
    return Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/cached_ops"


def rebuilding(env, *modules):
    """The locks affected's rebuild holds while it builds `modules`: the JIT dir's and each module's."""
    from filelock import FileLock

    locks = [FileLock(jit_dir(env) / "tmp" / name, thread_local=False) for name in ("flashinfer_jit.lock", *modules)]
    for lock in locks:
        lock.acquire()
    return locks


def said(events: Path) -> list[str]:
    return events.read_text().splitlines() if events.is_file() else []


def ran(events: Path) -> list[str]:
    return [e for e in said(events) if e in ("silu_and_mul", "gelu_and_mul", "unnamed", "other")]


@needs_a_build
@pytest.mark.parametrize("narrowed", [True, False], ids=["a subset of the file", "the whole file"])
def test_a_gated_process_runs_each_case_once_the_modules_it_loads_are_built_and_an_unnamed_one_while_none_is_ready(
    ws, tmp_path, narrowed
):
    """While the rebuild holds the JIT dir's lock and gelu's: silu's case runs once silu is said built,
    gelu's waits; with no named case ready, the cases the record names no module of run (the rebuild
    holds its locks: one that loaded gelu would wait for it); gelu's runs once gelu is. The warmup is
    set up once (the waits keep its module's fixtures) and compiles nothing before the rebuild is done:
    narrowed (-k), no case to run needs gelu_tanh; whole, gelu_tanh builds beside the cases once the gate
    is open, not in the fixture, which would wait there for the JIT dir's lock."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    root, _, env = ws
    proc, writer, events = behind_the_gate(root, env, tmp_path, *(["-k", "not other"] if narrowed else []))
    unnamed = ["unnamed", *([] if narrowed else ["other"])]
    held = rebuilding(env, "gelu_and_mul.lock")
    try:
        writer.built("silu_and_mul")
        writer.begin(REBUILT, None)  # its first text: silu built
        wait_until(lambda: f"waiting after {unnamed[-1]}" in said(events), 120, "the cases ran, then waited", proc)
        assert ran(events) == ["silu_and_mul", *unnamed], "gelu's case ran while gelu still rebuilt"
        assert compiles(env) == [], "the warmup, or a case, compiled beside the rebuild"
        held.pop().release()
        writer.built("gelu_and_mul")
        held.pop().release()
        writer.open()
        out, _ = proc.communicate(timeout=120)
    finally:
        for lock in held:
            lock.release()
        proc.kill()
        proc.communicate()
    cases = ["silu_and_mul", *unnamed, "gelu_and_mul"]
    assert proc.returncode == 0 and f"upstream-tests: {len(cases)} passed" in out, out
    assert ran(events) == cases and said(events).count("warmup") == 1, said(events)
    assert {line.rsplit("/", 2)[-2] for line in compiles(env)} <= {"gelu_tanh"}


@needs_a_build
def test_a_failing_case_before_the_gate_opens_ends_the_run_and_the_waiting_cases_do_not_run(ws, tmp_path):
    """--stop-after 1, as affected asks: silu's case fails while gelu still rebuilds; the process ends
    without waiting for the gate, the cases left unrun, and the run fails naming silu's case."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    root, _, env = ws
    proc, writer, events = behind_the_gate(
        root, env, tmp_path, "-k", "not other", "--stop-after", "1", fail="silu_and_mul"
    )
    try:
        writer.built("silu_and_mul")
        writer.begin(REBUILT, None)  # its first text: silu built (else the unnamed case could run first)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 1 and "FAILED tests/utils/test_activation.py::test_act[silu_and_mul]" in out, out
    assert ran(events) == ["silu_and_mul"] and not upstream_gate.opened(writer.path)


TWO_MODULES = """\
import os
import flashinfer
def test_fast():
    flashinfer.load("fast_mod", 1)
    open(os.environ["RAN"], "a").write("fast\\n")
    assert os.environ.get("FAIL_FAST") != "1"
def test_slow():
    flashinfer.load("slow_mod", 1)
    open(os.environ["RAN"], "a").write("slow\\n")
"""


@needs_a_build
def test_affecteds_verdict_comes_from_a_case_of_a_module_rebuilt_first_while_another_still_builds(ws, tmp_path):
    """An edit of two modules only FlashInfer's tests use: the fast one is rebuilt, its case runs and
    fails while the slow one's compile is held; the failure ends the run, and affected stops the
    rebuild: `failed` (1), the slow module's case unrun, the slow compile never let go."""
    require("filelock", why="modules build under FlashInfer's locks (filelock comes with torch in flashinfer-dev)")
    root, _, env = ws
    (root / TESTS / "utils/test_norm.py").write_text(TWO_MODULES)
    release, summary = tmp_path / "release", tmp_path / "affected.json"
    release.touch()  # the slow module's ninja file holds its compile until this file is there: there, for now
    env = {**env, "RAN": str(tmp_path / "ran"), "FAKE_HOLD": f"slow_mod:{release}"}
    done = upstream(root, env, "norm", "--yes")  # its plan records which case loads which; its run builds both
    assert done.returncode == 0 and "upstream-tests: 2 passed" in done.stdout, done.stdout + done.stderr
    generated = Path(env["FLASHINFER_WORKSPACE_BASE"]) / ".cache/flashinfer" / pins().flashinfer / "90/generated"
    for module in ("fast_mod", "slow_mod"):
        (generated / module / "s0.cpp").write_text("int f0() { return 7; }\n")
    (tmp_path / "ran").unlink()
    release.unlink()
    held = {**env, "FAIL_FAST": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, str(root / "scripts/affected.py"), "--summary", str(summary)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **held},
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        release.touch()  # a run that waits for the slow module ends, failing the asserts below
        proc.kill()
        proc.communicate()
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "affected: the rebuild stopped at the first failure" in out, out
    rows = {line.split()[1]: line.split(maxsplit=2)[2] for line in out.splitlines() if "/generated/" in line}
    assert rows == {"fast_mod": "1 test(s)  1 failed", "slow_mod": "1 test(s)  unfinished"}, out
    assert (tmp_path / "ran").read_text().split() == ["fast"], out
    done = affected_summary.read(summary)
    assert (done.verdict, done.status, done.failed) == ("failed", 1, ["tests/utils/test_norm.py::test_fast"]), done
    assert done.rebuilt == ["fast_mod", "slow_mod"] and done.past_build is None, done


def test_behind_the_gate_more_processes_a_gpu_start_at_once_as_far_as_the_gpus_and_cores_allow(monkeypatch):
    """A process not started could not run a case whose modules are built: behind the gate every process
    of the run starts at once, up to GATED_PER_GPU a GPU and half the cores shared by the GPUs; outside
    it, --per-gpu's N."""
    from fidev.upstream import runs as upstream_runs

    monkeypatch.setattr(upstream_runs.os, "cpu_count", lambda: 16)
    assert upstream_runs.at_once(12, 1, 1, gated=False) == 1 and upstream_runs.at_once(12, 1, 2, gated=False) == 2
    assert upstream_runs.at_once(12, 1, 1, gated=True) == upstream_runs.GATED_PER_GPU == 8, "16 cores: 8 a GPU"
    assert upstream_runs.at_once(12, 4, 1, gated=True) == 2, "16 cores over 4 GPUs: 2 a GPU"
    assert upstream_runs.at_once(5, 2, 1, gated=True) == 3 and upstream_runs.at_once(1, 0, 1, gated=True) == 1
    monkeypatch.setattr(upstream_runs.os, "cpu_count", lambda: 64)
    assert upstream_runs.at_once(12, 4, 1, gated=True) == 3 and upstream_runs.at_once(40, 1, 1, gated=True) == 8
    assert upstream_runs.at_once(3, 1, 4, gated=True) == 4, "never fewer than --per-gpu's"


def test_a_gated_run_starts_its_files_processes_at_once(tmp_path, monkeypatch):
    """Three files on one GPU behind the gate: their processes run at once (the rendezvous: each waits
    for the other two to start); without the gate, one after another."""
    import threading

    from fidev.upstream import runs as upstream_runs

    monkeypatch.setattr(upstream_runs.os, "cpu_count", lambda: 16)
    tree = tmp_path / "flashinfer"
    files = [tree / "tests" / f"test_{name}.py" for name in "abc"]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("def test_x():\n    pass\n")
    meeting, running, most = threading.Barrier(3, timeout=60), [], []

    def run_file(f, nodes, gpu, part, run_dir, tree_, argv, limit_s, stop, stop_after=0, base=None):
        running.append(f)
        most.append(len(running))
        if base.gate is not None:
            meeting.wait()
        running.remove(f)
        return upstream_runs.FileResult(upstream_runs.relative(f, tree), gpu, 0.0, "exit 0", part=part)

    monkeypatch.setattr(upstream_runs, "run_file", run_file)
    groups = {str(f): [str(f)] for f in files}
    gate = Settings(gate=tmp_path / "gate", gate_owner=upstream_gate.process_identity(os.getpid()))
    results = upstream_runs.run_files(groups, ["0"], tmp_path, tree, [], 60, {}, every_s=0, base=gate)
    assert len(results) == 3 and max(most) == 3, most
    most.clear()
    results = upstream_runs.run_files(groups, ["0"], tmp_path, tree, [], 60, {}, every_s=0)
    assert len(results) == 3 and max(most) == 1, most


def test_a_gate_begun_not_by_module_says_no_module_built_until_it_opens(tmp_path):
    """The rebuild did not take every module's lock: each module said built stays out of the file, so no
    case runs before the whole rebuild is done; open() opens it as before."""
    gate = tmp_path / "gate"
    writer = upstream_gate.GateWriter(gate)
    writer.begin(["fast", "slow"], None, by_module=False)
    writer.built("fast")
    assert state(gate)["built"] == [] and upstream_gate.read_state(gate).waiting == frozenset({"fast", "slow"})
    writer.open()
    assert upstream_gate.opened(gate) and upstream_gate.read_state(gate).open


def test_an_xdist_worker_starts_only_once_the_gate_is_open_and_any_other_process_once_it_began():
    """An xdist worker runs the cases its controller hands it, in the controller's order: it cannot wait
    for the ready ones, so it starts only once the whole rebuild is done. A process on its own starts
    once the rebuild began, and picks its ready cases (run_in_turn)."""
    began = upstream_gate.State(None, frozenset({"slow"}), False)
    opened = upstream_gate.State(None, frozenset(), True)
    assert not upstream_gate.starts_once(True)(began) and upstream_gate.starts_once(True)(opened)
    assert upstream_gate.starts_once(False)(began) and upstream_gate.starts_once(False)(opened)
