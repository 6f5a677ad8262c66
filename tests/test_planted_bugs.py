"""tools/planted_bugs.py on the CPU: its bug table (--list) covers the kernel families and kinds of
file it must, and each bug's line is FlashInfer v0.6.3's; in a workspace copy whose `affected` is a
stand-in (it compares the tree with a pristine copy, fails the tests of what differs, and writes its
summary with fidev.affected.summary, as affected does), every bug is planted, judged from the summary
and restored byte for byte, mtime too, also when the run is stopped with SIGTERM; a bug the stand-in
does not see is a survivor, and the tool exits 1."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fidev.core.manifest import ROOT, pins
from fidev.core.workspace import TREE_LOCK
from fidev.tree import families, release_reference, source_tree
from script_runs import expect_unwritten, final_write_fails, tool_module, two_line_failure, wait_until

TOOL = "tools/planted_bugs.py"
OLD_NS = 1_000_000_000_000_000_000  # the tree's files' mtime: restored as it was, or the test sees it
# The stand-in of scripts/affected.py: what differs from the pristine copy is the edit; a file in
# "blind" is not seen (the bug survives); "sleep" holds it while the bug is planted. "gives" {file: the
# summary's fields} overrides what the planted run of that file writes (another verdict of
# fidev.affected.verdict, its status, problem, failures), and its "exit" alone writes no summary.
STANDIN = """\
import json, os, sys, time
from pathlib import Path
from fidev.affected import summary
config = json.loads(os.environ["STANDIN_AFFECTED"])
out = Path(sys.argv[sys.argv.index("--summary") + 1])
tree, pristine = Path(config["tree"]), Path(config["pristine"])
with open(config["pids"], "a") as pids:
    pids.write(f"{os.getpid()}\\n")
changed = [rel for rel in config["tests"] if (tree / rel).read_bytes() != (pristine / rel).read_bytes()]
if config.get("state"):  # what it finds in the workspace (a line per earlier run that left one), then its own line
    state = Path(config["state"])
    with open(config["state_log"], "a") as log:
        log.write(f"{len(state.read_text().splitlines()) if state.exists() else 0}\\n")
    state.parent.mkdir(parents=True, exist_ok=True)
    with open(state, "a") as kept:
        kept.write("run\\n")
if changed:
    time.sleep(config.get("sleep", 0))
seen = [rel for rel in changed if rel not in config.get("blind", [])]
record = summary.Summary(verdict="passed", status=0, seconds=0.1)
record.changed = {rel: ["module_" + Path(rel).stem] for rel in changed}
record.tests = [config["tests"][rel] for rel in seen]
if changed:
    record.rebuilt, record.build_s = ["module_" + Path(rel).stem for rel in changed], 1.5
    record.past_build = {"ended_s": 2.0, "last_case_s": 1.9}
if any(rel in config.get("build_fails", []) for rel in changed):
    record.verdict, record.status, record.problem = "build failed", 1, "the build of module_x failed: nvcc exited 1"
elif seen:
    record.verdict, record.status, record.failed = "failed", 1, list(record.tests)
elif not changed and config.get("restored_unchanged"):
    record.verdict = "nothing changed"
elif not changed and config.get("restored_fails"):
    record.verdict, record.status, record.failed = "failed", 1, ["tests/smoke/test_norm.py::test_rmsnorm"]
for given in [config.get("gives", {})[rel] for rel in changed if rel in config.get("gives", {})]:
    if "exit" in given:
        sys.exit(given["exit"])
    for name, value in given.items():
        setattr(record, name, value)
if record.past_build and record.failed and not any(rel in config.get("no_first_failure", []) for rel in changed):
    record.past_build["first_failure_s"] = 0.7
summary.write(record, out)
sys.exit(record.status)
"""


def listed(root=ROOT):
    done = subprocess.run([sys.executable, str(root / TOOL), "--list"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_bug_table_covers_families_kinds_and_sizes():
    bugs = listed()
    names = {b["family"] for b in bugs}
    assert len(bugs) >= 12 and len({b["id"] for b in bugs}) == len(bugs)
    assert len(names) >= 6 and names <= set(families.BY_NAME), names
    assert names & {"decode", "prefill"}, "an attention family"
    assert {b["kind"] for b in bugs} == {"header", "csrc", "generator", "wrapper"}
    for b in bugs:
        prefix = {
            "header": "include/flashinfer/",
            "csrc": "csrc/",
            "generator": "flashinfer/jit/",
            "wrapper": "flashinfer/",
        }[b["kind"]]
        assert b["file"].startswith(prefix) and b["symbol"] and b["bug"] != b["line"], b
        assert b["kind"] != "wrapper" or not b["file"].startswith("flashinfer/jit/"), (
            f"{b['id']}: a generator is no wrapper"
        )
        assert "fp16" in b["size"] or "rounding" in b["size"], (
            f"{b['id']}: its size is not stated against fp16's rounding"
        )
    nonuniform = ("only", "offset", "as 0", "tail", "dropped", "grow")
    assert sum(any(word in b["size"] for word in nonuniform) for b in bugs) >= 4, "non-uniform bugs, not only scales"


def release_tree():
    """The pinned release's tree: the vendored one where it is the pinned release or commit, else an
    unpacked source release named by FIDEV_RELEASE_TREE or left in /tmp/fi063 (the GPU host's staging)."""
    p = pins()
    if source_tree.inspect(p.source_dir, p).pinned:
        return p.source_dir
    for candidate in (os.environ.get("FIDEV_RELEASE_TREE"), f"/tmp/fi063/flashinfer_python-{p.flashinfer}"):
        info = Path(candidate or "/nonexistent") / "PKG-INFO"
        if info.is_file() and f"\nVersion: {p.flashinfer}\n" in info.read_text(errors="replace"):
            return info.parent
    pytest.skip(
        f"no FlashInfer {p.flashinfer} tree here (the vendored tree is not the pinned release; set FIDEV_RELEASE_TREE)"
    )


def test_every_bugs_line_is_the_releases_once_and_the_bug_changes_it():
    tree = release_tree()
    for b in listed():
        text = (tree / b["file"]).read_text()
        assert text.count(b["line"]) == 1, f"{b['id']}: {b['file']} has its line {text.count(b['line'])} times"
        assert text.replace(b["line"], b["bug"], 1) != text


def failing_test_of(b):
    node = families.BY_NAME[b["family"]].nodes[0]
    return f"tests/{node}[case]" if "::" in node else f"tests/{node}::test_case[case]"


def built_one(base: Path | None = None) -> Path:
    """A module as `build` leaves one in the workspace's JIT dir (its ninja file and library; FLASHINFER_WORKSPACE_BASE
    or `base`): what affected judges an edit against, and what planted_bugs asks for before it plants."""
    from fidev.core import workspace as fidev_workspace

    ws = fidev_workspace.Workspace(base, pins().flashinfer) if base else fidev_workspace.read(pins().flashinfer)
    module = ws.version_dir / "90a" / fidev_workspace.JIT_DIR_NAME / "norm"
    module.mkdir(parents=True, exist_ok=True)
    for path in fidev_workspace.module_files(module):
        path.write_text("")
    return module


def workspace(tmp_path, **config):
    """A workspace copy with a tree of the bugs' files (each holds its lines), recorded as the pinned
    release, and the stand-in affected."""
    root = tmp_path / "ws"
    for d in ("scripts", "tools"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    (root / "scripts/affected.py").write_text(STANDIN)
    tree, pristine = root / pins().source_dir.relative_to(ROOT), tmp_path / "pristine"
    bugs = listed(root)
    texts = {}
    for b in bugs:
        texts[b["file"]] = texts.get(b["file"], "// FlashInfer's file\n") + b["line"] + "\n// more\n"
    for rel, text in texts.items():
        for base in (tree, pristine):
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text)
        os.utime(tree / rel, ns=(OLD_NS, OLD_NS))
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))  # the pinned release, its files recorded
    release_reference.record_release(tree)
    built_one()
    tests = {b["file"]: failing_test_of(b) for b in bugs}
    env = {
        **os.environ,
        "STANDIN_AFFECTED": json.dumps(
            {"tree": str(tree), "pristine": str(pristine), "tests": tests, "pids": str(tmp_path / "pids"), **config}
        ),
    }
    return root, tree, env, bugs


def state(tree):
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(tree.rglob("*")) if p.is_file()}


def tool(root, env, *args, timeout=300):
    return subprocess.run(
        [sys.executable, str(root / TOOL), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=root.parent,
    )


def test_every_bug_is_planted_judged_from_the_summary_and_restored(tmp_path):
    root, tree, env, bugs = workspace(tmp_path, no_first_failure=["csrc/page.cu"])
    before = state(tree)
    done = tool(root, env, "--record", str(tmp_path / "record.json"))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert state(tree) == before
    assert not (tree.parent / f".{tree.name}{TREE_LOCK}").exists()
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + len(bugs) and rows[0].split(" | ")[1:3] == ["family", "file kind"]
    row = {r.split(" | ")[0].removeprefix("| "): [c.strip() for c in r.strip("| ").split(" | ")] for r in rows[2:]}
    assert row["page-last-token-dropped"][7] == "not recorded" and row["rope-theta"][7] == "0.7"
    assert (
        row["rope-theta"][5:7] == ["failed", "1"]
        and row["rope-theta"][10] == "rope (1 test); modules module_rope"
        and row["rope-theta"][11] == "yes"
    )
    assert "SURVIVORS: 0 of" in done.stdout
    rec = json.loads((tmp_path / "record.json").read_text())
    assert rec["schema"] == "fidev-planted-bugs/1" and rec["complete"] and rec["left"] == [] and rec["survivors"] == []
    assert [b["id"] for b in rec["bugs"]] == [b["id"] for b in bugs] and rec["restored_failures"] == []
    one = rec["bugs"][0]
    assert {
        "id",
        "family",
        "kind",
        "file",
        "symbol",
        "line",
        "bug",
        "size",
        "planted",
        "caught",
        "survived_because",
        "restored",
    } <= set(one)
    assert {"verdict", "status", "first_failure_s", "build_s", "seconds", "failed", "caught_by"} <= set(one["planted"])
    assert one["planted"]["build_s"] == 1.5 and one["restored"]["passes"] and one["restored"]["status"] == 0


@pytest.mark.parametrize("each_from_start", [False, True])
def test_each_from_start_puts_the_workspace_back_before_each_later_bug_and_at_the_end(tmp_path, each_from_start):
    """--each-from-start: each bug's planted run finds the workspace's state (the version's folder under
    FLASHINFER_WORKSPACE_BASE) as the run found it, not what the earlier bugs' runs left, its restore
    run what its planted run left; at the end the folder is as it was. Without it, each run finds every
    earlier run's state."""
    from fidev.core import workspace as fidev_workspace

    base = tmp_path / "base"
    version_dir = fidev_workspace.Workspace(base, pins().flashinfer).version_dir
    root, tree, env, _ = workspace(
        tmp_path, state=str(version_dir / "state.txt"), state_log=str(tmp_path / "state.log")
    )
    version_dir.mkdir(parents=True)
    (version_dir / "state.txt").write_text("found\n")
    built_one(base)
    env = {**env, "FLASHINFER_WORKSPACE_BASE": str(base)}
    args = ["--bugs", "rope-theta,norm-fused-add-offset", *(["--each-from-start"] if each_from_start else [])]
    done = tool(root, env, *args)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    found = (tmp_path / "state.log").read_text().split()
    if each_from_start:
        assert found == ["1", "2", "1", "2"], found
        assert (version_dir / "state.txt").read_text() == "found\n", "the workspace as the run found it"
        assert sorted(p.name for p in version_dir.parent.iterdir()) == [version_dir.name], "no copy left beside it"
    else:
        assert found == ["1", "2", "3", "4"], found
        assert len((version_dir / "state.txt").read_text().splitlines()) == 5


def test_a_bug_affected_passes_is_a_survivor_and_the_tool_exits_1(tmp_path):
    root, tree, env, bugs = workspace(tmp_path, blind=["csrc/rope.cu"])
    before = state(tree)
    done = tool(root, env, "--bugs", "rope-theta,norm-fused-add-offset", "--record", str(tmp_path / "record.json"))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert state(tree) == before
    assert "SURVIVORS: 1 of 2" in done.stdout
    assert "- rope-theta (rope, csrc/rope.cu): exit 0: no test of rope ran" in done.stdout
    assert "NOT CAUGHT" in next(line for line in done.stdout.splitlines() if line.startswith("| rope-theta "))
    assert json.loads((tmp_path / "record.json").read_text())["survivors"] == ["rope-theta"]


def test_a_record_whose_final_write_fails_is_two_lines_after_the_report(tmp_path):
    """--record checked before the run, its write at the end failing (the file system read-only since):
    the report is said first, then two lines naming the record and the OS error; a run that passed ends 1,
    no traceback, the tree restored."""
    root, tree, env, _ = workspace(tmp_path)
    before = state(tree)
    (tmp_path / "out").mkdir()
    rec = tmp_path / "out" / "record.json"
    done = tool(root, final_write_fails(tmp_path, rec, env), "--bugs", "rope-theta", "--record", str(rec))
    expect_unwritten(done, rec, ended="the run itself ended with status 0, as said above")
    assert "SURVIVORS: 0 of 1" in done.stdout and state(tree) == before


ROPE = "csrc/rope.cu"  # rope-theta's file: the planted run of it gives each verdict below
BUSY = "another affected run is judging the builds in /ws/jit (pid 12): two at once would rebuild the same modules"
STOPPED = "interrupted (the builds and tests it started were stopped)"
UNREACHED = "the edit reached no built module and no kernel family's tests (run `build`)"
# {case: (what affected's summary of the planted run gives, the reason planted_bugs must give for its survival)}
SURVIVALS = {
    "not covered": (
        {"verdict": "not covered", "status": 3, "failed": []},
        "exit 3, not covered: the edit reaches rope, whose FlashInfer tests did not run (are they in the tree?)",
    ),
    "no module changed": (
        {"verdict": "no module changed", "status": 0, "changed": {ROPE: []}, "failed": [], "rebuilt": []},
        f"exit 0, no module changed: {UNREACHED}",
    ),
    "nothing changed": (
        {"verdict": "nothing changed", "status": 0, "changed": {}, "tests": [], "failed": [], "rebuilt": []},
        f"exit 0, nothing changed: {UNREACHED}",
    ),
    "error": ({"verdict": "error", "status": 1, "failed": [], "problem": BUSY}, f"exit 1, error: {BUSY}"),
    "failed with no failing test": (
        {"verdict": "failed", "status": 1, "failed": []},
        "exit 1, failed, but no test failed: what broke is in its output",
    ),
    "interrupted after a test failed": (
        {"verdict": "interrupted", "status": 130, "problem": STOPPED},
        f"exit 130, interrupted: {STOPPED}",
    ),
    "passed": (
        {"verdict": "passed", "status": 0, "failed": []},
        "exit 0: 1 test(s) of rope ran and passed: the bug is within their tolerance or outside their cases",
    ),
    "no summary": ({"exit": 1}, "exit 1, no summary: affected's summary is missing: "),
}


@pytest.mark.parametrize("case", SURVIVALS)
def test_each_verdict_affected_can_give_but_a_failed_test_is_a_survival_with_its_own_reason(tmp_path, case):
    """Only exit 1 with a failing test is a catch: every other verdict of affected's summary (fidev.affected.verdict)
    leaves the bug a survivor, its reason the verdict's own, and the tool exits 1; the record keeps the verdict."""
    gives, reason = SURVIVALS[case]
    root, tree, env, _ = workspace(tmp_path, gives={ROPE: gives})
    before = state(tree)
    done = tool(root, env, "--bugs", "rope-theta", "--record", str(tmp_path / "record.json"))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert state(tree) == before and "SURVIVORS: 1 of 1" in done.stdout, done.stdout
    said = next(line for line in done.stdout.splitlines() if line.startswith("- rope-theta "))
    assert said.startswith(f"- rope-theta (rope, {ROPE}): {reason}"), said
    row = next(line for line in done.stdout.splitlines() if line.startswith("| rope-theta "))
    cells = [c.strip() for c in row.strip("| ").split(" | ")]
    assert cells[5] == gives.get("verdict", "no summary") and cells[10:12] == ["NOT CAUGHT", "yes"], cells
    rec = json.loads((tmp_path / "record.json").read_text())
    assert rec["survivors"] == ["rope-theta"] and rec["restored_failures"] == [], rec
    bug = rec["bugs"][0]
    assert bug["caught"] is False and bug["survived_because"].startswith(reason), bug
    assert bug["planted"]["verdict"] == gives.get("verdict", "no summary"), bug["planted"]
    assert bug["planted"]["status"] == gives.get("status"), bug["planted"]
    assert bug["planted"].get("failed", []) == gives.get("failed", [] if "exit" in gives else [failing_test_of(bug)])


@pytest.mark.parametrize("case, passes", [("not covered", True), ("failed with no failing test", False)])
def test_a_restore_that_affected_calls_no_change_passes_only_where_the_planted_run_did_not_fail(tmp_path, case, passes):
    """A not-covered edit, reverted, is "nothing changed", a pass; after a run that failed, even with no
    failing test named, the tests must run again on the restored file, and "nothing changed" is no pass."""
    root, tree, env, _ = workspace(tmp_path, gives={ROPE: SURVIVALS[case][0]}, restored_unchanged=True)
    done = tool(root, env, "--bugs", "rope-theta", "--record", str(tmp_path / "record.json"))
    assert done.returncode == 1 and "SURVIVORS: 1 of 1" in done.stdout, done.stdout + done.stderr[-3000:]
    rec = json.loads((tmp_path / "record.json").read_text())
    restored = rec["bugs"][0]["restored"]
    assert restored["verdict"] == "nothing changed" and restored["status"] == 0, restored
    assert restored["passes"] is passes and rec["restored_failures"] == ([] if passes else ["rope-theta"]), rec
    assert ("restored tree did not pass after rope-theta" in done.stdout) is not passes, done.stdout


def test_a_bug_that_does_not_compile_is_no_catch(tmp_path):
    root, tree, env, _ = workspace(tmp_path, build_fails=["csrc/topk.cu"])
    done = tool(root, env, "--bugs", "topk-last-unwritten")
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert (
        "- topk-last-unwritten (topk, csrc/topk.cu): exit 1, build failed: the planted line does not compile"
        in done.stdout
    )


def test_a_restored_tree_that_fails_is_said_and_the_tool_exits_1(tmp_path):
    root, tree, env, _ = workspace(tmp_path, restored_fails=True)
    done = tool(root, env, "--bugs", "softmax-scale")
    assert done.returncode == 1 and "SURVIVORS: 0 of 1" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "NO (exit 1, failed)" in done.stdout and "restored tree did not pass after softmax-scale" in done.stdout


def test_a_restore_after_a_failure_that_affected_calls_no_change_is_no_pass(tmp_path):
    # the tests that failed must run again on the restored file (a stale module built from the bug
    # would fail them); "nothing changed" there ran nothing
    root, tree, env, _ = workspace(tmp_path, restored_unchanged=True)
    done = tool(root, env, "--bugs", "page-last-token-dropped")
    assert done.returncode == 1 and "SURVIVORS: 0 of 1" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "NO (exit 0, nothing changed)" in done.stdout
    assert (
        "restored tree did not pass after page-last-token-dropped: exit 0, nothing changed: the restore of a "
        "file whose tests failed" in done.stdout
    )


def test_a_missing_line_is_two_lines_and_nothing_is_planted(tmp_path):
    root, tree, env, _ = workspace(tmp_path)
    header = tree / "include/flashinfer/quantization.cuh"
    header.write_text("// FlashInfer's file, edited away from the release\n")
    os.utime(header, ns=(OLD_NS, OLD_NS))
    before = state(tree)
    done = tool(root, env)
    two_line_failure(done, "packbits-last-byte: include/flashinfer/quantization.cuh lacks the line its bug replaces")
    assert state(tree) == before and not (tmp_path / "pids").exists()


def test_an_edit_of_the_trees_own_is_refused_before_anything_is_planted(tmp_path):
    root, tree, env, _ = workspace(tmp_path)
    header = tree / "include/flashinfer/norm.cuh"
    header.write_text(header.read_text() + "// a contributor's edit\n")
    before = state(tree)
    done = tool(root, env, "--bugs", "softmax-scale")
    two_line_failure(
        done, "the tree has edits of its own in what the bugs' modules compile: include/flashinfer/norm.cuh"
    )
    assert state(tree) == before and not (tmp_path / "pids").exists()


def planting(root, env, tmp_path, tree, before, *args) -> subprocess.Popen:
    """The tool started on softmax-scale's bug, once the bug is in sampling.cuh and its affected runs."""
    header = tree / "include/flashinfer/sampling.cuh"
    proc = subprocess.Popen(
        [sys.executable, str(root / TOOL), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    wait_until(
        lambda: header.read_bytes() != before[str(header)][0] and (tmp_path / "pids").is_file(),
        60,
        "the bug planted, its affected started",
        proc,
    )
    return proc


def test_a_second_run_while_the_first_holds_its_bug_is_told_so_not_that_the_tree_lacks_a_line(tmp_path):
    """The first run's bug is in the tree while its affected runs: a second run is refused in two lines
    naming the run that holds the tree (its lock, fidev.tree.edits.tree_lock), not told to restore a
    tree that lacks a line; the first run goes on, and restores the tree."""
    root, tree, env, _ = workspace(tmp_path, sleep=10)
    before = state(tree)
    first = planting(root, env, tmp_path, tree, before, "--bugs", "softmax-scale")
    second = tool(root, env, "--bugs", "softmax-scale,rope-theta")
    out, err = first.communicate(timeout=120)
    two_line_failure(second, "planted_bugs: another tool is writing")
    assert "planted_bugs softmax-scale, pid" in second.stderr and "lacks the line" not in second.stderr, second.stderr
    assert first.returncode == 0, out + err[-3000:]
    assert state(tree) == before
    assert len((tmp_path / "pids").read_text().split()) == 2  # the first run's affected, planted and restored


def test_a_kernel_source_mode_affected_refuses_is_refused_before_anything_is_planted(tmp_path):
    root, tree, env, _ = workspace(tmp_path)
    before = state(tree)
    done = tool(root, {**env, "FLASHINFER_DEV_KERNEL_SOURCE": "bogus"}, "--bugs", "softmax-scale")
    two_line_failure(done, "FLASHINFER_DEV_KERNEL_SOURCE='bogus' is not a kernel source mode")
    assert state(tree) == before and not (tmp_path / "pids").exists()


def test_unknown_bugs_are_bad_usage():
    done = tool(ROOT, dict(os.environ), "--bugs", "norm-fused-add-offset,no-such-bug")
    two_line_failure(done, "--bugs names no bug no-such-bug", status=2)
    two_line_failure(tool(ROOT, dict(os.environ), "--bugs", ""), "--bugs names no bug (empty)", status=2)


def test_the_time_limit_starts_no_bug_that_would_not_fit(tmp_path):
    root, tree, env, bugs = workspace(tmp_path)
    done = tool(root, env, "--bugs", "rope-theta,softmax-scale", "--time-limit", "1")
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "not started, past --time-limit 1 s: --bugs rope-theta,softmax-scale"
    assert not (tmp_path / "pids").exists()


def test_sigterm_mid_run_restores_the_tree_and_stops_affected(tmp_path):
    root, tree, env, _ = workspace(tmp_path, sleep=60)
    before = state(tree)
    proc = planting(
        root, env, tmp_path, tree, before, "--bugs", "softmax-scale", "--record", str(tmp_path / "record.json")
    )
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert state(tree) == before
    assert not (tree.parent / f".{tree.name}{TREE_LOCK}").exists()
    pid = int((tmp_path / "pids").read_text().split()[0])
    with pytest.raises(ProcessLookupError):  # affected was stopped (and reaped), not left running
        os.kill(pid, 0)
    rec = json.loads((tmp_path / "record.json").read_text())
    assert rec["complete"] is False and rec["bugs"] == []


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--record", "{tmp}/record.json"], "--record"),
        (["--bugs", "nosuch"], "--bugs"),
        (["--bugs", "rope-theta"], "--bugs"),
        (["--time-limit", "60"], "--time-limit"),
        (["--each-from-start"], "--each-from-start"),
    ],
    ids=["record", "an unknown bug", "a bug", "time limit", "each from start"],
)
def test_list_refuses_the_options_of_a_run_it_does_not_make(tmp_path, extra, named):
    """--list runs nothing: a --record it would not write, --bugs it would not run (known or not) and a
    --time-limit are usage errors in two lines, not silently dropped with status 0."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    done = subprocess.run(
        [sys.executable, str(ROOT / TOOL), "--list", *argv], capture_output=True, text=True, timeout=60
    )
    two_line_failure(done, f"--list runs no bug: it takes no {named}", status=2)
    assert done.stdout == "" and not (tmp_path / "record.json").exists(), done.stdout


def test_each_from_start_on_a_linked_version_folder_puts_back_its_target_and_keeps_the_link(tmp_path):
    """The version folder a link to another disk's folder: every bug starts from the state found, the link stays
    a link, and nothing is left beside either folder (the kept copy is renamed back at the end)."""
    from fidev.core import workspace as fidev_workspace

    base = tmp_path / "base"
    version_dir = fidev_workspace.Workspace(base, pins().flashinfer).version_dir
    target = tmp_path / "bigger-disk" / "0.6.3"
    target.mkdir(parents=True)
    (target / "state.txt").write_text("found\n")
    version_dir.parent.mkdir(parents=True)
    version_dir.symlink_to(target)
    root, tree, env, _ = workspace(tmp_path, state=str(version_dir / "state.txt"), state_log=str(tmp_path / "log"))
    built_one(base)
    env = {**env, "FLASHINFER_WORKSPACE_BASE": str(base)}
    done = tool(root, env, "--bugs", "rope-theta,norm-fused-add-offset", "--each-from-start")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr[-3000:]
    assert (tmp_path / "log").read_text().split() == ["1", "2", "1", "2"]
    assert version_dir.is_symlink() and (target / "state.txt").read_text() == "found\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["0.6.3"]
    assert sorted(p.name for p in version_dir.parent.iterdir()) == [version_dir.name]


def test_an_affected_run_still_going_at_the_deadline_is_stopped_and_said_as_time_up(tmp_path, monkeypatch):
    """--time-limit's end stops the affected run then going (SIGTERM, as Ctrl-C stops it), within the limit."""
    tool = tool_module("planted_bugs")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/affected.py").write_text(
        f"import os, time\nopen({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    began = time.perf_counter()
    with pytest.raises(tool.TimeUp):
        tool.affected(tmp_path / "summary.json", began + 2.0)
    assert time.perf_counter() - began < 30
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(int((tmp_path / "pid").read_text()), 0)


def ended(pid: int) -> bool:
    """Whether the process is gone, or dead and not yet reaped (a zombie: its parent was killed too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_an_affected_that_will_not_stop_is_killed_with_every_build_it_started(tmp_path, monkeypatch):
    """At the deadline affected gets SIGTERM and a short while, then its whole process group gets SIGKILL: a ninja
    or nvcc it started would otherwise go on compiling the planted line after the file is restored."""
    tool = tool_module("planted_bugs")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/affected.py").write_text(
        "import os, signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '120'])\n"
        f"open({str(tmp_path / 'pids')!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(120)\n"
    )
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setattr(tool, "DEADLINE_STOP_S", 0.5)
    began = time.perf_counter()
    with pytest.raises(tool.TimeUp):
        tool.affected(tmp_path / "summary.json", began + 2.0)
    assert time.perf_counter() - began < 30
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    wait_until(lambda: all(ended(pid) for pid in pids), 10, f"affected and its child {pids} ended")


def fake_bug(tool, name: str):
    return tool.Bug(name, "norm", f"include/{name}.cuh", "K", "x = 1;", "x = 2;", "small")


def test_a_restore_the_time_limit_stops_keeps_the_planted_verdict_and_restores_the_file(tmp_path, monkeypatch):
    from fidev.affected import summary

    tool = tool_module("planted_bugs")
    tree, bug = tmp_path / "flashinfer", fake_bug(tool, "a")
    (tree / "include").mkdir(parents=True)
    (tree / bug.file).write_text("x = 1;\n")
    os.utime(tree / bug.file, ns=(OLD_NS, OLD_NS))
    failed = summary.Summary(verdict="failed", status=1, seconds=0.5)
    failed.failed = failed.tests = ["tests/smoke/test_kernels.py::test_rmsnorm"]
    runs = iter([(failed, None, 0.5)])

    def affected(path, deadline):
        assert deadline == 99.0
        return next(runs) if (tree / bug.file).read_text() == "x = 2;\n" else (_ for _ in ()).throw(tool.TimeUp())

    monkeypatch.setattr(tool, "affected", affected)
    result = tool.run_bug(tree, bug, tmp_path, 99.0)
    assert result["caught"] is True and result["planted"]["verdict"] == "failed"
    assert {k: result["restored"][k] for k in ("verdict", "status", "passes")} == {
        "verdict": tool.STOPPED,
        "status": None,
        "passes": None,
    }
    assert (tree / bug.file).read_text() == "x = 1;\n" and (tree / bug.file).stat().st_mtime_ns == OLD_NS


@pytest.mark.parametrize("stopped", ["planted", "restore"])
def test_a_bug_the_time_limit_stops_midway_is_run_again_whole_with_those_after_it(tmp_path, monkeypatch, stopped):
    """A bug whose run the limit ended is `unfinished`, neither caught nor survived, and its restore neither passes
    nor fails: the tool exits 3, as where it left bugs unstarted, naming it to run again before those it left."""
    tool = tool_module("planted_bugs")
    bugs = [fake_bug(tool, name) for name in ("a", "b", "c")]
    back = {"verdict": "passed", "status": 0, "passes": True, "seconds": 1.0}
    done = {"caught": True, "planted": {"seconds": 1.0, "verdict": "failed", "status": 1}, "restored": back}

    def run_bug(tree, bug, scratch, deadline):
        assert deadline is not None and deadline - time.perf_counter() <= 100
        if bug.id != "b":
            return {**tool.asdict(bug), "kind": bug.kind, **done}
        if stopped == "planted":
            return None
        return {
            **tool.asdict(bug),
            "kind": bug.kind,
            **done,
            "restored": {**back, "verdict": tool.STOPPED, "passes": None},
        }

    monkeypatch.setattr(tool, "run_bug", run_bug)
    monkeypatch.setattr(tool, "BUG_S", 0.0)
    progress = tool.Progress()
    tool.run_bugs(tmp_path, bugs, 100.0, None, progress)
    assert [r["id"] for r in progress.results] == (["a"] if stopped == "planted" else ["a", "b"])
    assert (progress.unfinished, progress.left) == (["b"], ["c"])
    assert tool.report(progress, 100.0) == 3
    tool.record(tmp_path / "record.json", progress, True, 3)
    rec = json.loads((tmp_path / "record.json").read_text())
    assert (rec["unfinished"], rec["left"], rec["survivors"], rec["restored_failures"]) == (["b"], ["c"], [], [])


def test_a_workspace_with_nothing_built_is_refused_before_anything_is_planted(tmp_path):
    """affected judges an edit against what `build` built: with nothing built every run would be its refusal,
    which the table would show as a survivor; planted_bugs says so first, in two lines, and plants nothing."""
    root, tree, env, _ = workspace(tmp_path)
    shutil.rmtree(built_one())
    before = state(tree)
    done = tool(root, env, "--bugs", "rope-theta", "--record", str(tmp_path / "record.json"))
    two_line_failure(done, "nothing is built yet in ")
    assert state(tree) == before and not (tmp_path / "pids").exists() and not (tmp_path / "record.json").exists()


def test_a_bugs_file_that_is_a_named_pipe_is_said_for_what_it_is_never_waited_on(tmp_path):
    root, tree, env, bugs = workspace(tmp_path)
    path = tree / next(b["file"] for b in bugs if b["id"] == "rope-theta")
    path.unlink()
    os.mkfifo(path)
    done = tool(root, env, "--bugs", "rope-theta", timeout=60)
    two_line_failure(done, f"rope-theta: {path} is a named pipe (FIFO), not a regular file")
    assert not (tmp_path / "pids").exists()
