"""tools/gpu_acceptance.py's planted bugs, on the CPU: a step that plants one holds the tree's lock
(fidev.tree.edits.planted) from the plant to the restore, so another tool that would edit the tree
is refused in two lines, and a run stopped mid-step (SIGTERM, as a host that ends the command sends)
stops what it started and leaves the tree as it was, bytes and mtime. The steps run stand-ins of
the scripts they start (build, smoke, upstream-tests, affected) in the acceptance run's workspace
copy (WORK/ws, which the run takes as set up)."""

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fidev.core.manifest import ROOT, pins, task_chain
from script_runs import (
    acceptance_digest,
    acceptance_run,
    acceptance_tool,
    task_module,
    two_line_failure,
    wait_until,
)

TOOL = ROOT / "tools/gpu_acceptance.py"
HEADER = "include/flashinfer/norm.cuh"
EDIT_LOOP_ROWS = [
    "edit-build",
    "edit-smoke",
    "restore-build",
    "restore-smoke",
]  # the table's rows of the step edit-loop
OLD = 1_000_000_000_000_000_000  # the header's mtime (ns): a restore that loses it shows
# A chain script's stand-in: it notes its pid, waits while the gate file (STANDIN_GATE, where set) is
# there, and, as smoke, fails while the header holds the planted bug (the tool's NORM_BUG).
STANDIN = """\
import os, sys, time
with open({pids!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
gate = os.environ.get("STANDIN_GATE")
while gate and os.path.exists(gate):
    time.sleep(0.05)
sys.exit(int({smoke} and {bug!r} in open({header!r}).read()))
"""


def tool_constant(name: str):
    """A constant of the tool, read from its source."""
    module = ast.parse(TOOL.read_text())
    return next(
        node.value
        for node in module.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets)
    )


def tool_text(name: str) -> str:
    return ast.literal_eval(tool_constant(name))


def generator_edit() -> tuple[str, str]:
    """The silu generator's file and the line its bug replaces (the tool's AFFECTED_EDITS)."""
    edits = tool_constant("AFFECTED_EDITS")
    value = next(
        v for k, v in zip(edits.keys, edits.values, strict=True) if ast.literal_eval(k) == "affected-generator"
    )
    return ast.literal_eval(value.elts[0]), ast.literal_eval(value.elts[1])


def tree(work):
    """The FlashInfer tree of the acceptance run's workspace copy."""
    return work / "ws" / pins().source_dir.relative_to(ROOT)


def made_everything(work):
    """WORK as a run that made every step's state leaves it: each step another needs (NEEDS) marked made."""
    (work / "made").mkdir(parents=True, exist_ok=True)
    for step in {needed for needs in acceptance_tool().NEEDS.values() for needed in needs}:
        (work / "made" / step).touch()


def acceptance_work(tmp_path):
    """WORK with its workspace copy: the chain's scripts stand-ins, and a tree whose norm.cuh has the
    line the edit loop plants its bug in. (work, header, the stand-ins' pid file, the gate)."""
    work, pids, gate = tmp_path / "work", tmp_path / "pids", tmp_path / "gate"
    ws = work / "ws"
    for d in ("scripts", "tools"):
        shutil.copytree(ROOT / d, ws / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", ws)
    header = tree(work) / HEADER
    header.parent.mkdir(parents=True)
    header.write_text(f"// the user's header\n    {tool_text('NORM_LINE')}\n")
    os.utime(header, ns=(OLD, OLD))
    generator, line = generator_edit()
    silu = tree(work) / generator
    silu.parent.mkdir(parents=True)
    silu.write_text(f"    {line}\n")
    os.utime(silu, ns=(OLD, OLD))
    scripts = [command.split()[1] for _, command in task_chain("smoke")] + [
        "scripts/upstream_tests.py",
        "scripts/affected.py",
    ]
    for script in scripts:
        (ws / script).write_text(
            STANDIN.format(
                pids=str(pids), smoke=script == "scripts/smoke.py", bug=tool_text("NORM_BUG"), header=str(header)
            )
        )
    gate.write_text("")
    (work / "checkout.sha256").write_text(acceptance_digest())  # as setup's copy of this checkout writes it
    made_everything(work)
    return work, header, pids, gate


def acceptance(work, *args, gate=None):
    env = {**os.environ, **({"STANDIN_GATE": str(gate)} if gate else {})}
    return subprocess.Popen(
        [sys.executable, str(TOOL), "--work", str(work), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def planted(header) -> bool:
    return tool_text("NORM_BUG") in header.read_text()


def test_a_second_tool_is_refused_while_the_edit_loop_holds_the_tree(tmp_path):
    work, header, pids, gate = acceptance_work(tmp_path)
    before = (header.read_bytes(), header.stat().st_mtime_ns)
    proc = acceptance(work, "--steps", "edit-loop", gate=gate)
    try:
        wait_until(
            lambda: planted(header) and pids.is_file() and pids.read_text(),
            60,
            "the edit loop planted its bug and started build",
            proc,
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PATH", "STANDIN_GATE")} | {
            "PATH": "/usr/bin:/bin"
        }  # no pixi on PATH
        bench = subprocess.run(
            [sys.executable, str(work / "ws/tools/bench_chain.py"), "--runs", "1", "--keep-going", "--edit-loop"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        two_line_failure(bench, "another tool is writing")
        again = acceptance(work, "--steps", "upstream-compare-bug")
        out, err = again.communicate(timeout=120)
        two_line_failure(subprocess.CompletedProcess(again.args, again.returncode, out, err), "another tool is writing")
        assert planted(header), "a refused tool changed the planted file"
    finally:
        gate.unlink()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    results = json.loads((work / "results.json").read_text())
    assert {name: r["result"] for name, r in results.items()} == dict.fromkeys(EDIT_LOOP_ROWS, "pass")
    table = out.split("\nstep ")[-1].splitlines()
    assert [line.split()[0] for line in table[1:]] == EDIT_LOOP_ROWS, out
    assert (header.read_bytes(), header.stat().st_mtime_ns) == before


# every step that plants a bug, and the file it plants it in
PLANTING = [
    ("edit-loop", HEADER),
    ("upstream-compare-bug", HEADER),
    ("affected-header", HEADER),
    ("auto-header", HEADER),
    ("auto-generator", generator_edit()[0]),
]


@pytest.mark.parametrize(("step", "edited"), PLANTING)
def test_sigterm_mid_step_stops_its_command_and_restores_the_tree(tmp_path, step, edited):
    work, header, pids, gate = acceptance_work(tmp_path)
    path = tree(work) / edited
    earlier = {
        "result": "pass",
        "seconds": 1.0,
        "note": "an earlier run's",
    }  # its rows: the edit loop's must go when it starts again
    (work / "results.json").write_text(json.dumps(dict.fromkeys(EDIT_LOOP_ROWS, earlier)))
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    proc = acceptance(work, "--steps", step, gate=gate)
    try:
        wait_until(
            lambda: path.read_bytes() != before[0] and pids.is_file() and pids.read_text(),
            60,
            f"{step} planted its bug and started its command",
            proc,
        )
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert (path.read_bytes(), path.stat().st_mtime_ns) == before
        build = int(pids.read_text().split()[0])
        # stopped (the gate still there) and reaped before the restore, not left compiling the bug into an object newer
        # than the restored file
        try:
            os.kill(build, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive, f"the build it started (pid {build}) outlived it"
    finally:
        gate.unlink()
        if proc.poll() is None:
            proc.kill()
    # nothing recorded for the stopped step (the edit loop's earlier rows forgotten): --resume runs it again, whole
    resumed = acceptance(work, "--resume", "--time-limit", "25", "--steps", step)
    out, err = resumed.communicate(timeout=60)
    assert (
        resumed.returncode == 3
        and out.strip().splitlines()[-1] == f"not started, past --time-limit 25 s: --steps {step}"
    ), out + err


def test_resume_reruns_a_step_whose_rows_are_not_all_recorded(tmp_path):
    """The edit loop records four rows: a run stopped after two has not done it, and its time
    (--time-limit's guess) is STEP_S's until all four are there."""
    work = tmp_path / "work"
    work.mkdir()
    row = {"result": "pass", "seconds": 1.0, "note": "exit 0"}
    (work / "results.json").write_text(json.dumps({"edit-build": row, "edit-smoke": row, "smoke": row}))
    (work / "checkout.sha256").write_text(acceptance_digest())
    done = acceptance_run(work, "--time-limit", "25", "--resume", "--steps", "smoke,edit-loop")
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "not started, past --time-limit 25 s: --steps edit-loop", done.stdout
    assert "edit-smoke  pass" in done.stdout, done.stdout


def test_a_part_on_a_fresh_host_makes_again_the_state_its_steps_need_before_them(tmp_path):
    """Results carried from an earlier part into a WORK that has not made their state (a fresh host: no
    `made` marks): --resume leaves out the steps recorded, but runs again first the steps whose state the
    next one needs (build-noop needs build-cold's builds), recording their results anew; then marks them made."""
    work, _, pids, _ = acceptance_work(tmp_path)
    shutil.rmtree(work / "made")
    carried = {"result": "pass", "seconds": 1.0, "note": "an earlier part's"}
    (work / "results.json").write_text(json.dumps({"setup": carried, "build-cold": carried}))
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(work), "--resume", "--steps", "setup,build-cold,build-noop"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    results = json.loads((work / "results.json").read_text())
    assert results["build-cold"]["note"] != "an earlier part's" and results["build-noop"]["result"] == "pass"
    assert results["setup"]["note"] == "an earlier part's", "setup's copy was there: not run again"
    assert len(pids.read_text().split()) == 2, "build.py twice: build-cold again, then build-noop"
    assert sorted(p.name for p in (work / "made").iterdir()) == ["build-cold", "build-noop"]
    shutil.rmtree(work / "made")  # build-cold failed here: not run again before the next step
    failed = {**carried, "result": "FAIL"}
    (work / "results.json").write_text(json.dumps({"setup": carried, "build-cold": failed}))
    pids.unlink()
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(work), "--resume", "--steps", "build-cold,build-noop"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and len(pids.read_text().split()) == 1, done.stdout + done.stderr


@pytest.mark.parametrize("digest", ["0" * 64, None], ids=["another checkout's", "none"])
def test_a_work_of_another_checkout_is_refused_before_any_step(tmp_path, digest):
    """WORK's copy and results of another checkout (its files changed since setup copied them), or of none
    the tool named: two lines before any step runs, since the steps would run that copy and the results
    would be said of this tree."""
    work, _, pids, _ = acceptance_work(tmp_path)
    (work / "results.json").write_text("{}")
    if digest is None:
        (work / "checkout.sha256").unlink()
    else:
        (work / "checkout.sha256").write_text(digest)
    done = acceptance_run(work, "--steps", "smoke")
    why = "another checkout's" if digest else "of no checkout this tool named (no checkout.sha256)"
    two_line_failure(done, f"its ws and results.json are {why}")
    assert not pids.exists(), "a step ran"


# tools/planted_bugs.py's stand-in: it notes its arguments and writes the record RECORD_CASE names
# (fidev.tree.edits.PLANTED_BUGS_SCHEMA, the fields the acceptance run reads), then exits as the tool would.
PLANTED_STANDIN = """\
import json, os, sys
args = sys.argv[1:]
with open({argv!r}, "w") as f:
    json.dump(args, f)
bug = lambda i, caught: {{"id": i, "caught": caught}}
case = os.environ["RECORD_CASE"]
bugs = {{"caught": [bug("a", True), bug("b", True)], "survivor": [bug("a", True), bug("b", False)], "none started": [],
        "partly": [bug("a", True)], "stopped": [bug("a", True)], "too long": [], "broke": []}}[case]
left = {{"none started": ["a", "b"], "partly": ["b"], "stopped": ["c"], "too long": ["b"]}}.get(case, [])
unfinished = {{"stopped": ["b"], "too long": ["a"]}}.get(case, [])
record = {{"schema": {schema!r}, "complete": True, "bugs": bugs, "left": left, "unfinished": unfinished,
          "survivors": [b["id"] for b in bugs if not b["caught"]], "restored_failures": []}}
with open(args[args.index("--record") + 1], "w") as f:
    json.dump(record, f)
sys.exit({{"caught": 0, "survivor": 1, "none started": 3, "partly": 3, "stopped": 3, "too long": 3, "broke": 1}}[case])
"""


def planted_bugs_part(tmp_path, case: str, *args: str, first: str = "", results: dict | None = None):
    """A part of --steps planted-bugs whose tools/planted_bugs.py is PLANTED_STANDIN writing RECORD_CASE's record,
    after the lines `first`, in a WORK holding `results`. (the run, WORK, the stand-in's arguments' file)"""
    from fidev.tree import edits

    work, _, _, _ = acceptance_work(tmp_path)
    if results is not None:
        (work / "results.json").write_text(json.dumps(results))
    argv = tmp_path / "argv.json"
    standin = PLANTED_STANDIN.format(argv=str(argv), schema=edits.PLANTED_BUGS_SCHEMA)
    (work / "ws/tools/planted_bugs.py").write_text(first + standin)
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(work), "--steps", "planted-bugs", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RECORD_CASE": case},
    )
    return done, work, argv


@pytest.mark.parametrize(
    ("case", "result"),
    [
        ("caught", "pass"),
        ("survivor", "FAIL"),
        ("none started", None),
        ("partly", None),
        ("stopped", None),
        ("too long", "FAIL"),
        ("broke", "FAIL"),
    ],
)
def test_the_planted_bugs_step_passes_only_where_every_bug_it_ran_was_caught(tmp_path, case, result):
    """Within what is left of the part's --time-limit, on --planted-bugs, each bug from the state the step
    found (--each-from-start); a part that ran out of
    time with no failure keeps no result and names the bugs left for the next part; one whose tool
    broke before any bug ran fails."""
    done, work, argv = planted_bugs_part(
        tmp_path,
        case,
        "--planted-bugs",
        "rope-theta,softmax-scale",  # ids of the real table: they are checked before setup
        "--time-limit",
        "300",
    )
    given, tool = json.loads(argv.read_text()), acceptance_tool()
    assert (
        given[given.index("--bugs") + 1] == "rope-theta,softmax-scale"
        # it ends before the step would be cut: STOP_BEFORE_S, and SPARE_S for its record, taken off the part
        and 0 < float(given[given.index("--time-limit") + 1]) <= 300 - tool.STOP_BEFORE_S - tool.SPARE_S
        and "--each-from-start" in given  # every bug from the state the step found (after build-cold: build's alone)
    ), given
    results = json.loads((work / "results.json").read_text()) if (work / "results.json").is_file() else {}
    assert results.get("planted-bugs", {}).get("result") == result, done.stdout + done.stderr
    assert done.returncode == {"pass": 0, "FAIL": 1, None: 3}[result] and "Traceback" not in done.stderr, (
        done.stdout + done.stderr
    )
    if result is None:
        assert done.stdout.strip().splitlines()[-1] == "not started, past --time-limit 300 s: --steps planted-bugs", (
            done.stdout
        )
    if case == "stopped":  # the bug the time limit stopped midway runs again first, whole
        assert "left for the next part: --steps planted-bugs --planted-bugs b,c" in done.stdout, done.stdout
    if case == "too long":  # stopped though it had the whole part: another part would stop it again
        assert "a did not end within a whole part" in results["planted-bugs"]["note"], results["planted-bugs"]


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--steps", "planted-bugs", "--planted-bugs", "nosuch"], "--planted-bugs names no bug nosuch"),
        (["--steps", "planted-bugs", "--planted-bugs", ","], "--planted-bugs names no bug (empty)"),
        (["--steps", "smoke", "--planted-bugs", "rope-theta"], "which this part does not run (--steps names smoke)"),
        (["--planted-bugs", "rope-theta"], "which this part does not run (runs only when --steps names it)"),
        (["--steps="], "unknown step(s) ['']"),
        (["--steps", "preflight,preflight", "--resume"], "step(s) named more than once in --steps: preflight"),
    ],
    ids=["unknown bug", "no bug", "another step", "the default steps", "empty steps", "a step twice"],
)
def test_planted_bugs_and_steps_are_checked_before_anything_runs(tmp_path, argv, problem):
    """An unknown bug id, --planted-bugs without the planted-bugs step, an empty --steps and one that names a
    step twice: usage errors, before setup makes WORK (not a step failed after setup and the builds, or silently
    ignored, or listed twice)."""
    work = tmp_path / "work"
    done = acceptance_run(work, *argv)
    two_line_failure(done, problem, status=2)
    assert not work.exists(), done.stdout + done.stderr


def test_the_bug_ids_it_checks_are_the_planted_bugs_tables():

    tool = task_module(TOOL, "gpu_acceptance_tool")
    listed = subprocess.run(
        [sys.executable, str(ROOT / "tools/planted_bugs.py"), "--list"], capture_output=True, text=True, timeout=60
    )
    assert tool.planted_bug_ids() == [bug["id"] for bug in json.loads(listed.stdout)], listed.stderr


def made(work) -> set[str]:
    """What WORK holds, by name."""
    return {p.name for p in work.iterdir()}


def staged_release(tmp_path):
    """A folder holding a file of the source release's name: what --fresh checks for before it removes anything."""
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / pins().sdist_name).write_bytes(b"not the release")
    return staged


def made_by_the_tool(tmp_path, staged) -> Path:
    """A WORK a run made (it was absent): the run starts no step (--time-limit 1) and leaves only its mark."""
    work = tmp_path / "work"
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(work), "--staged", str(staged), "--time-limit", "25"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert made(work) == {".fidev-acceptance"}, made(work)
    return work


def test_fresh_refuses_a_work_folder_holding_what_the_tool_did_not_make(tmp_path):
    """A user's file in a WORK the tool made: refused in two lines, and nothing in WORK removed, the tool's own
    included."""
    work = made_by_the_tool(tmp_path, staged_release(tmp_path))
    (work / "logs").mkdir(parents=True)
    (work / "results.json").write_text("{}")
    (work / "notes.txt").write_text("the user's")
    done = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--work",
            str(work),
            "--staged",
            str(tmp_path / "staged"),
            "--fresh",
            "--steps",
            "setup",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    two_line_failure(done, "notes.txt")
    assert made(work) == {".fidev-acceptance", "logs", "results.json", "notes.txt"}
    assert (work / "notes.txt").read_text() == "the user's"


def test_fresh_refuses_a_work_folder_without_its_mark_though_its_names_are_the_tools(tmp_path):
    """WORK/logs/my-notes.txt in a folder the tool did not make: the name `logs` is one the tool uses,
    but without the mark the tool writes in a WORK it makes, --fresh refuses in two lines and removes
    nothing; a run without --fresh that uses the folder does not mark it either."""
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "logs/my-notes.txt").write_text("the user's")
    staged = staged_release(tmp_path)
    part = [sys.executable, str(TOOL), "--work", str(work), "--staged", str(staged), "--time-limit", "25"]
    used = subprocess.run([*part, "--steps", "build-cold"], capture_output=True, text=True, timeout=120)
    assert used.returncode == 3 and "Traceback" not in used.stderr, used.stdout + used.stderr
    assert made(work) == {"logs"}, made(work)
    done = subprocess.run([*part, "--fresh", "--steps", "setup"], capture_output=True, text=True, timeout=120)
    two_line_failure(done, "logs")
    assert "did not make" in done.stderr, done.stderr
    assert made(work) == {"logs"} and (work / "logs/my-notes.txt").read_text() == "the user's"


def test_fresh_takes_a_fifo_in_place_of_the_mark_for_no_mark_and_never_waits_on_it(tmp_path):
    """A named pipe where the mark lies is no mark: --fresh refuses the folder in two lines, at once (reading it
    would wait for a writer), and removes nothing."""
    work = tmp_path / "work"
    work.mkdir()
    os.mkfifo(work / ".fidev-acceptance")
    (work / "results.json").write_text("{}")
    argv = ["--work", str(work), "--staged", str(staged_release(tmp_path)), "--fresh", "--steps", "setup"]
    done = subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True, text=True, timeout=60)
    two_line_failure(done, "did not make")
    assert made(work) == {".fidev-acceptance", "results.json"}


def test_fresh_removes_nothing_where_no_source_release_was_staged(tmp_path):
    if (pins().source_dir / "csrc").is_dir():
        pytest.skip("this checkout has FlashInfer's tree: the workspace copy needs no staged release")
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "results.json").write_text("{}")
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(work), "--fresh", "--steps", "setup"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    two_line_failure(done, "no source release was staged")
    assert made(work) == {"logs", "results.json"}


def test_fresh_removes_what_the_tool_made_and_only_that(tmp_path):
    """Every name the tool makes in WORK is one --fresh removes (MADE), and it leaves WORK itself, with its mark."""
    made_names = ast.literal_eval(tool_constant("MADE"))
    assert set(re.findall(r'work / "([^"]+)"', TOOL.read_text())) <= set(made_names)
    staged = staged_release(tmp_path)
    work = made_by_the_tool(tmp_path, staged)
    for name in made_names:
        (work / name / "inside").mkdir(parents=True) if "." not in name else (work / name).write_text("made")
    (work / ".results.json.tmp-1-2").write_text("{")
    done = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--work",
            str(work),
            "--staged",
            str(staged),
            "--fresh",
            "--time-limit",
            "25",
            "--steps",
            "build-cold",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert made(work) == {".fidev-acceptance"}, made(work)


@pytest.mark.parametrize(("failed", "status"), [(None, 0), ("setup", 1), ("restore-smoke", 1)])
@pytest.mark.parametrize("steps", [[], ["--steps", "setup,edit-loop"]], ids=["every step", "named"])
def test_a_resumed_part_fails_where_a_step_it_left_out_failed(tmp_path, steps, failed, status):
    """--resume leaves out every step WORK has a result for; a part that so runs nothing still ends
    with their results: 1 where one failed (a failed setup recorded earlier included), 0 where all passed."""
    work = tmp_path / "work"
    work.mkdir()
    every = [
        row
        for step in ast.literal_eval(tool_constant("STEPS"))
        for row in (EDIT_LOOP_ROWS if step == "edit-loop" else [step])
    ]
    results = {
        row: {"result": "FAIL" if row == failed else "pass", "seconds": 1.0, "note": "an earlier part's"}
        for row in every
    }
    (work / "results.json").write_text(json.dumps(results))
    (work / "checkout.sha256").write_text(acceptance_digest())
    done = acceptance_run(work, "--resume", *steps)
    assert done.returncode == status and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert not (work / "ws").exists() and not (work / "logs").exists(), "a resumed part ran a step"
    if failed:
        assert done.stdout.strip().splitlines()[-1].endswith(f"WORK has a result for): {failed}"), done.stdout


def test_results_that_cannot_be_written_end_the_run_in_two_lines(tmp_path, monkeypatch):
    """results.json is written after each step: a file system that refuses it since the run began (read-only,
    full) is a failure naming the file and the OS error (fidev.core.files.write_output), not a traceback."""
    import errno
    from types import SimpleNamespace

    from fidev.core.failure import Failure

    tool = task_module(TOOL, "gpu_acceptance_tool")

    def refused(src, dst, **kw):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(dst))

    monkeypatch.setattr(os, "replace", refused)
    run = SimpleNamespace(results_file=tmp_path / "results.json", results={"setup": {"result": "pass"}})
    with pytest.raises(Failure, match="results.json could not be written: Read-only file system"):
        tool.Run.save(run)
    assert os.listdir(tmp_path) == [], "a temporary file left beside it"


def test_a_staged_folder_holding_nothing_staged_is_refused_before_setup(tmp_path):
    """--staged naming an empty folder (a wrong path, a stage not run): two lines before anything runs, so
    that setup installs nothing into this Python's environment from a stage that is not there."""
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(tmp_path / "work"), "--staged", str(tmp_path / "empty")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, "holds nothing tools/stage_gpu_host.py stages")
    assert not (tmp_path / "work").exists(), "WORK made for a run that never starts"


def test_a_needed_step_that_fits_runs_though_the_step_after_it_does_not(tmp_path):
    """A fresh host's part whose --time-limit has room for build-cold (its carried time) but not for the step
    that needs it: build-cold runs and is marked made, and the part ends naming the step, so that the next
    part, with the same limit, starts the step itself (it never could beside build-cold)."""
    work, _, pids, _ = acceptance_work(tmp_path)
    shutil.rmtree(work / "made")
    carried = {"result": "pass", "seconds": 1.0, "note": "an earlier part's"}
    (work / "results.json").write_text(json.dumps({"setup": carried, "build-cold": carried}))
    argv = [sys.executable, str(TOOL), "--work", str(work), "--resume", "--time-limit", "100"]
    done = subprocess.run(
        [*argv, "--steps", "build-cold,affected-attention"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "not started, past --time-limit 100 s: --steps affected-attention"
    assert (work / "made" / "build-cold").is_file() and len(pids.read_text().split()) == 1


def test_a_step_that_would_not_end_stop_before_s_before_the_time_limit_is_not_started(tmp_path):
    """A step whose time here fits --time-limit but not the limit less STOP_BEFORE_S would be stopped midway:
    the part does not start it, and names it for the next part."""
    work, _, pids, _ = acceptance_work(tmp_path)
    stop_before = acceptance_tool().STOP_BEFORE_S
    (work / "results.json").write_text(json.dumps({"smoke": {"result": "pass", "seconds": 10.0, "note": "earlier"}}))
    argv = [sys.executable, str(TOOL), "--work", str(work), "--time-limit", str(stop_before + 5), "--steps", "smoke"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"not started, past --time-limit {stop_before + 5} s: --steps smoke"
    assert not pids.exists(), "smoke started though it would not end STOP_BEFORE_S before the limit"


def cut_part(tmp_path, budget: float, steps: str, first_takes: float = 0.0):
    """A part whose steps may take `budget` s (--time-limit STOP_BEFORE_S more), each expected to take 1 s (its
    earlier result), whose smoke stand-in waits for good (the gate stays), and whose import-check takes
    `first_takes` s. (the run, WORK, the stand-ins' pid file, STOP_BEFORE_S)"""
    work, _, pids, gate = acceptance_work(tmp_path)
    stop_before = acceptance_tool().STOP_BEFORE_S
    earlier = {"result": "pass", "seconds": 1.0, "note": "an earlier run's"}
    (work / "results.json").write_text(json.dumps({"import-check": earlier, "smoke": earlier}))
    (work / "ws/scripts/import_check.py").write_text(f"import time\ntime.sleep({first_takes})\n")
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(work), "--time-limit", str(stop_before + budget), "--steps", steps],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "STANDIN_GATE": str(gate)},
    )
    assert "Traceback" not in done.stderr, done.stdout + done.stderr
    return done, work, pids, stop_before


def test_a_step_still_running_near_the_end_of_the_time_limit_is_stopped_and_runs_again_in_the_next_part(tmp_path):
    """A step that takes longer than its time here (a cold build short of memory, which went on past the host's
    limit on a command, so that nothing of the part came back): STOP_BEFORE_S before --time-limit ends its
    command is stopped, the step keeps no result (its earlier one forgotten too), and the part ends with its
    table, status 3 and the steps left, the stopped one first. Here smoke starts after import-check took
    more than a tenth of the part: another part, smoke first, may give it the time it needs."""
    done, work, pids, stop_before = cut_part(tmp_path, 6, "import-check,smoke,abi-smoke", first_takes=2.5)
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert f"stopped {stop_before} s before --time-limit ended: smoke, which the next part runs again" in lines
    assert lines[-1] == f"not started, past --time-limit {stop_before + 6} s: --steps smoke,abi-smoke", done.stdout
    results = json.loads((work / "results.json").read_text())
    assert sorted(results) == ["import-check"], "a result of a step stopped midway"
    smoke = int(pids.read_text().split()[0])
    with pytest.raises(ProcessLookupError):  # stopped and reaped, not left running
        os.kill(smoke, 0)


def test_a_step_stopped_though_it_had_a_whole_part_fails_there_and_the_part_goes_on(tmp_path):
    """A step stopped that began with (nearly) all the time a part gives a step would be stopped again in every
    part, the same --resume command repeating for good: it fails instead, in each of its rows, saying so."""
    done, work, _, stop_before = cut_part(tmp_path, 3, "smoke,abi-smoke")
    assert done.returncode == 3, done.stdout + done.stderr  # abi-smoke did not fit after it
    results = json.loads((work / "results.json").read_text())
    assert results["smoke"]["result"] == "FAIL" and results["smoke"]["note"].startswith(
        "did not end within a whole part"
    ), results
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == f"not started, past --time-limit {stop_before + 3} s: --steps abi-smoke", done.stdout
    resumed = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(work), "--resume", "--time-limit", "600", "--steps", "smoke"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 1 and "failed in an earlier part" in resumed.stdout, resumed.stdout


def test_the_planted_bugs_step_is_not_stopped_near_the_end_of_the_time_limit(tmp_path):
    """planted_bugs stops itself within the time it is given (an affected run still going is stopped, its bug to
    run again) and restores the planted file on SIGTERM after affected has ended, which may take longer than
    the 30 s a cut gives before SIGKILL: its command is not cut, and its record is read."""
    limit = str(acceptance_tool().STOP_BEFORE_S + 2)  # 2 s for the part's steps; planted_bugs takes 4
    earlier = {"planted-bugs": {"result": "pass", "seconds": 1.0, "note": "an earlier run's"}}  # 1 s: it starts
    done, work, _ = planted_bugs_part(
        tmp_path, "caught", "--time-limit", limit, first="import time\ntime.sleep(4)\n", results=earlier
    )
    assert done.returncode == 0 and "stopped" not in done.stdout, done.stdout + done.stderr
    assert json.loads((work / "results.json").read_text())["planted-bugs"]["result"] == "pass"


@pytest.mark.parametrize("limit", ["20", "10", "0.5"])
def test_a_time_limit_within_the_stop_before_its_end_is_bad_usage(tmp_path, limit):
    """A part stops its steps STOP_BEFORE_S before --time-limit ends: a limit no longer than that could start no
    step, each part the same 'not started' for good. Two lines, status 2, before anything is made."""
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(tmp_path / "work"), "--time-limit", limit, "--steps", "smoke"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, f"--time-limit {limit}: a part stops its steps 20 s before its limit ends", status=2)
    assert not (tmp_path / "work").exists()


def test_build_cold_takes_every_made_mark_with_it_and_auto_restore_the_prebuilt_sets(tmp_path):
    """build-cold empties the JIT base and the compile cache: every state marked made goes with them (a later
    step needing build-abi's builds makes them again); the step's own mark follows its pass."""
    work, _, _, _ = acceptance_work(tmp_path)
    assert (work / "made" / "build-abi").is_file() and (work / "made" / "prebuilt-set").is_file()
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(work), "--steps", "build-cold"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (work / "made").iterdir()) == ["build-cold"]
    assert acceptance_tool().WIPES["auto-restore"] == ("prebuilt-set",)


def test_the_checkout_digest_holds_what_setup_copies_and_no_tools_cache(tmp_path, monkeypatch):
    """checkout_digest: an edit of a script or of the vendored tree (extern/, which setup takes as it is) is
    another checkout; a tool's cache (.pytest_cache, .ruff_cache) or __pycache__ is none; a file it cannot read
    is two lines, not a traceback."""
    from fidev.core.failure import Failure

    digest = acceptance_tool().checkout_digest
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/a.py").write_text("1")
    (tmp_path / "extern/tracked/flashinfer/include").mkdir(parents=True)
    (tmp_path / "extern/tracked/flashinfer/include/norm.cuh").write_text("x")
    before = digest(tmp_path)
    for cache in (".pytest_cache", ".ruff_cache", "scripts/__pycache__"):
        (tmp_path / cache).mkdir()
        (tmp_path / cache / "f").write_text("y")
    assert digest(tmp_path) == before
    (tmp_path / "extern/tracked/flashinfer/include/norm.cuh").write_text("z")
    assert digest(tmp_path) != before
    real = Path.read_bytes
    monkeypatch.setattr(
        Path,
        "read_bytes",
        lambda p: (_ for _ in ()).throw(PermissionError(13, "Permission denied")) if p.name == "a.py" else real(p),
    )
    with pytest.raises(Failure, match="a.py cannot be read \\(Permission denied\\)"):
        digest(tmp_path)


def test_every_steps_expected_time_fits_a_part_of_the_time_limit_the_docs_give():
    """docs/testing.md's parts: --time-limit 580 on a host that limits each command to 10 minutes. A step must
    end STOP_BEFORE_S before the limit: one whose expected time (STEP_S) is not below that could never start in
    any part, its own included."""
    tool = acceptance_tool()
    too_long = {name: s for name, s in tool.STEP_S.items() if s >= 580 - tool.STOP_BEFORE_S}
    assert too_long == {}, too_long


@pytest.mark.parametrize("work", ["{tmp}/work", "{tmp}/a-file/work"], ids=["a folder to be", "under a file"])
def test_list_steps_prints_its_json_and_touches_no_work_folder(tmp_path, work):
    """--list-steps runs nothing: --work (the default /tmp/fidev-acceptance too) is not checked, so no probe
    file is made in its folder (whose mtime a made and removed file moves), and one no run could take is
    no refusal of a listing."""
    (tmp_path / "a-file").write_text("x")
    before = tmp_path.stat().st_mtime_ns, sorted(p.name for p in tmp_path.iterdir())
    done = subprocess.run(
        [sys.executable, str(TOOL), "--list-steps", "--work", work.format(tmp=tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "setup" in [step["name"] for step in json.loads(done.stdout)["steps"]]
    assert (tmp_path.stat().st_mtime_ns, sorted(p.name for p in tmp_path.iterdir())) == before


def test_a_work_folder_no_run_can_take_is_still_bad_usage_naming_work(tmp_path):
    (tmp_path / "a-file").write_text("x")
    done = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(tmp_path / "a-file" / "work"), "--steps", "setup"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, "argument --work: ", status=2)
