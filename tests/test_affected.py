"""`affected` on the CPU: from an edit of the vendored tree to the modules it touches and their
tests, against a stand-in JIT dir built by a real ninja and C++ compiler.

The stand-ins follow FlashInfer's files at v0.6.3:
- each module's build.ninja: flashinfer/jit/cpp_ext.py, lines 249-252 (rule `compile`:
  `$cxx -MMD -MF $out.d $cflags -c $in -o $out`, `depfile = $out.d`, `deps = gcc`), lines 276-279
  (rule `link`) and 281-297 (absolute object and .so paths under `<jit dir>/<name>/`, `default` the
  .so); so ninja's deps log, which fidev.records.ninja_inputs reads, is the one a real build leaves;
- the JIT dir's place: flashinfer/jit/env.py, `<base>/.cache/flashinfer/<version>/<arch>/cached_ops`;
- the record of which test needs which module: the entries of FlashInfer's JIT report,
  tests/conftest.py lines 148-166 (test_name is the item's node id, module_name the spec's name,
  spec_info the str() of a dict) as the upstream-tests plan stores them (fidev.records.build_records).
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fidev.affected import summary as affected_summary
from fidev.builds import build_stamp, module_builds
from fidev.core import workspace
from fidev.core.failure import Failure
from fidev.core.manifest import ROOT, pins
from fidev.records import build_records, ninja_inputs
from fidev.tree import release_reference, source_tree
from script_runs import require, run, signal_held, start_held, two_line_failure, wait_until

pytestmark = pytest.mark.skipif(
    not (shutil.which("ninja") and shutil.which("c++")), reason="needs ninja and a C++ compiler"
)

TRAP = "raise ImportError('affected imported flashinfer')\n"  # no generator changed: no import


def build_module(jit_dir, name, sources, tree):
    """A module laid out and built as FlashInfer's cpp_ext.py writes it, then recorded as `build` does."""
    out = jit_dir / name
    out.mkdir(parents=True, exist_ok=True)
    objects = [f"{out}/{src.stem}.o" for src in sources]
    lines = [
        "cxx = c++",
        f"cflags = -fPIC -I{tree}/include",
        "",
        "rule compile",
        "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",
        "  depfile = $out.d",
        "  deps = gcc",
        "",
        "rule link",
        "  command = $cxx $in -shared -o $out",
        "",
    ]
    lines += [f"build {obj}: compile {src.resolve()}" for obj, src in zip(objects, sources, strict=True)]
    lines += ["", f"build {out}/{name}.so: link " + " ".join(objects), f"default {out}/{name}.so", ""]
    (out / "build.ninja").write_text("\n".join(lines))
    subprocess.run(["ninja", "-C", str(out)], check=True, capture_output=True)
    module_builds.record_build(out, out / "build.ninja", tree=tree)
    return out


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A vendored tree (a header, a csrc/ source, a Python generator), a JIT dir with `norm`
    (smoke's, named in build's stamp) and `norm_upstream` (built for FlashInfer's own tests, with
    their record), and a workspace copy whose manifest points at the tree."""
    tree = tmp_path / "tree"
    for d in ("flashinfer/jit", "include/flashinfer", "csrc", "tests"):
        (tree / d).mkdir(parents=True)
    (tree / "flashinfer/__init__.py").write_text(TRAP)
    (tree / "flashinfer/jit/activation.py").write_text("# a generator\n")
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 1;\n")
    (tree / "include/flashinfer/other.cuh").write_text("constexpr int J = 1;\n")
    (tree / "csrc/norm.cu.cc").write_text('#include "flashinfer/norm.cuh"\nint f() { return K; }\n')
    (tree / "csrc/other.cc").write_text('#include "flashinfer/other.cuh"\nint g() { return J; }\n')
    root = tmp_path / "ws"
    for d in ("scripts", "tests"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    text = (
        (ROOT / "pyproject.toml")
        .read_text()
        .replace('source-dir = "extern/tracked/flashinfer"', f'source-dir = "{tree}"')
    )
    (root / "pyproject.toml").write_text(text)
    env = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base"), "PYTHONPATH": str(tree)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    jit_dir = tmp_path / "base/.cache/flashinfer" / pins().flashinfer / "90a/cached_ops"
    norm = build_module(jit_dir, "norm", [tree / "csrc/norm.cu.cc"], tree)
    build_module(jit_dir, "norm_upstream", [tree / "csrc/other.cc"], tree)
    build_stamp.write(
        workspace.read(pins().flashinfer),
        {"wide": False, "abi": False},
        "stamp",
        [build_stamp.Module("norm", "norm", norm, [tree / "csrc/norm.cu.cc"])],
    )
    node = "tests/utils/test_norm.py::test_norm[dtype0-4096]"
    build_records.add_module_tests(
        jit_dir, [{"test_name": node, "module_name": "norm_upstream", "spec_info": str({"name": "norm_upstream"})}]
    )
    return tree, root, jit_dir, env


def affected(root, env, *args):
    return run("affected.py", *args, env=env, root=root)


def test_nothing_changed_is_said_without_importing_flashinfer(ws, tmp_path):
    _, root, _, env = ws
    done = affected(root, env, "--summary", str(tmp_path / "affected.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing changed since the 2 built modules were built" in done.stdout
    record = affected_summary.read(tmp_path / "affected.json")
    assert (record.verdict, record.status, record.changed, record.past_build) == ("nothing changed", 0, {}, None)
    # the look took part of the run's own time (the summary's seconds, to a tenth), never a clock's reading
    checked = float(done.stdout.split("(checked in ", 1)[1].split(" s)", 1)[0])
    assert checked <= record.seconds + 0.05, done.stdout


def test_nothing_changed_keeps_the_tree_it_judged_and_list_keeps_nothing(ws):
    """A run that found nothing changed keeps the tree as it judged it (its later edits are told from it,
    fidev.affected.changes.since_judged); --list keeps no verdict at all."""
    _, root, _, env = ws
    kept = workspace.read(pins().flashinfer).verdicts
    listed = affected(root, env, "--list")
    assert listed.returncode == 0 and "nothing changed" in listed.stdout, listed.stdout + listed.stderr
    assert not kept.exists()
    done = affected(root, env)
    assert done.returncode == 0 and "nothing changed" in done.stdout, done.stdout + done.stderr
    assert "include/flashinfer/norm.cuh" in json.loads(kept.read_text())["judged"], kept.read_text()


def test_a_summary_whose_name_is_near_the_file_systems_limit_is_written_whole(ws, tmp_path):
    """--summary of a 250-byte name (NAME_MAX is 255): checked before the run and written at its end, whole,
    nothing else left beside it (its temporary file's name is cut to fit: fidev.core.files.temporary_beside)."""
    _, root, _, env = ws
    out = tmp_path / "out"
    out.mkdir()
    summary = out / ("s" * 245 + ".json")
    done = affected(root, env, "--summary", str(summary))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert affected_summary.read(summary).verdict == "nothing changed" and os.listdir(out) == [summary.name]


def test_a_touched_header_with_the_same_content_is_no_edit(ws):
    tree, root, _, env = ws
    header = tree / "include/flashinfer/norm.cuh"
    os.utime(header, ns=(header.stat().st_mtime_ns + 10**9,) * 2)
    assert "nothing changed" in affected(root, env).stdout


def test_a_header_edit_names_its_module_and_smoke_tests(ws, tmp_path):
    tree, root, _, env = ws
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    done = affected(root, env, "--list", "--summary", str(tmp_path / "affected.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if "norm.cuh" in line)
    tests = len(__import__("fidev.builds.smoke_modules", fromlist=["BY_KEY"]).BY_KEY["norm"].tests)
    assert row.split()[1] == "norm" and f"{tests} test(s)" in row, done.stdout
    assert "other" not in done.stdout
    record = affected_summary.read(tmp_path / "affected.json")  # the same modules and tests, from the file
    assert record.verdict == "listed" and record.changed == {row.split()[0]: ["norm"]} and len(record.tests) == tests, (
        record
    )


def test_the_summary_is_read_back_whole_and_a_foreign_or_truncated_one_is_refused(tmp_path):
    path = tmp_path / "affected.json"
    record = affected_summary.Summary(
        "failed",
        1,
        {"include/flashinfer/norm.cuh": ["norm"]},
        ["tests/smoke/test_norm.py::test_rmsnorm"],
        ["tests/smoke/test_norm.py::test_rmsnorm"],
        ["norm"],
        12.3,
        {"ended_s": 4.0, "last_case_s": 3.5},
        20.1,
    )
    affected_summary.write(record, path)
    assert affected_summary.read(path) == record and record.modules == {"norm"}
    assert [p.name for p in tmp_path.iterdir()] == ["affected.json"], "the temporary file was left behind"
    path.write_text(path.read_text()[:40])
    with pytest.raises(Failure, match="cannot be read"):
        affected_summary.read(path)
    path.write_text('{"schema": "fidev-upstream-summary/1"}')
    with pytest.raises(Failure, match="is not affected's summary"):
        affected_summary.read(path)
    with pytest.raises(Failure, match="summary is missing"):
        affected_summary.read(tmp_path / "none.json")


def test_a_source_edit_reaches_the_module_flashinfers_tests_built(ws):
    tree, root, _, env = ws
    (tree / "csrc/other.cc").write_text('#include "flashinfer/other.cuh"\nint g() { return J + 1; }\n')
    done = affected(root, env, "--list")
    row = next(line for line in done.stdout.splitlines() if "other.cc" in line)
    assert "norm_upstream" in row and "1 test(s)" in row, done.stdout


def test_a_restored_copy_of_an_edit_that_was_built_is_a_change(ws):
    """cp -p of the original after a build of the edit: the module holds the edit, so it is affected."""
    tree, root, jit_dir, env = ws
    header = tree / "include/flashinfer/norm.cuh"
    saved = tree / "norm.cuh.orig"
    shutil.copy2(header, saved)
    header.write_text("constexpr int K = 2;\n")
    subprocess.run(["ninja", "-C", str(jit_dir / "norm")], check=True, capture_output=True)
    module_builds.record_build(jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree)
    subprocess.run(["cp", "-p", str(saved), str(header)], check=True)
    done = affected(root, env, "--list")
    assert any("norm.cuh" in line and " norm " in f" {line} " for line in done.stdout.splitlines()), done.stdout


def test_a_generator_edit_regenerates_through_flashinfer(ws):
    """A Python edit is the one change that imports FlashInfer: smoke's modules are regenerated by
    their generators (here the stand-in tree's flashinfer refuses the import: two lines). norm_upstream,
    of csrc/ files alone, has nothing to regenerate: it is not counted."""
    tree, root, _, env = ws
    (tree / "flashinfer/jit/activation.py").write_text("# a generator, edited\n")
    done = affected(root, env, "--list")
    assert "affected: activation.py changed: regenerating the sources of 1 module(s), compiling nothing" in done.stdout
    two_line_failure(done, "import flashinfer failed: ImportError: affected imported flashinfer")


def test_bad_input_gets_two_lines(ws, tmp_path):
    tree, root, jit_dir, env = ws
    two_line_failure(
        affected(root, {**env, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "nothing")}), "nothing is built yet"
    )
    # with a prebuilt set, auto builds only edited modules: the first build for affected is vendored
    (tree / "flashinfer/data/aot/norm").mkdir(parents=True)
    done = affected(root, {**env, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "nothing")})
    two_line_failure(done, "nothing is built yet")
    assert "FLASHINFER_DEV_KERNEL_SOURCE=vendored pixi run -e flashinfer-dev build" in done.stderr
    shutil.rmtree(tree / "flashinfer/data")
    other = tmp_path / "old/.cache/flashinfer/0.5.0/90a/cached_ops/norm"
    other.mkdir(parents=True)
    two_line_failure(
        affected(root, {**env, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "old")}), "holds builds of FlashInfer 0.5.0"
    )
    (tree / "csrc/other.cc").unlink()
    two_line_failure(affected(root, env), "an input of norm_upstream, is gone")


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["--list"],
            "interrupted while listing what changed (--list builds and runs nothing: only that look was stopped)",
        ),
        ([], "interrupted (the builds and tests it started were stopped)"),
    ],
)
def test_an_interrupted_run_says_what_was_stopped(tmp_path, args, said):
    """Ctrl-C as affected reads the workspace (held there: script_runs.HOLD): --list builds and runs nothing,
    so it says that only its look at what changed was stopped, and reruns --list; a run says its builds and
    tests were stopped."""
    proc, met = start_held(tmp_path, "fidev.core.workspace:read", "affected.py", *args)
    done = signal_held(proc, met, signal.SIGINT, "affected held as it reads the workspace")
    two_line_failure(done, said, status=130)
    fix = f"  fix: run it again: pixi run -e flashinfer-dev affected{' --list' if args else ''}"
    assert done.stderr.splitlines()[-2:] == [f"error: {said}", fix], done.stderr  # the two lines, word for word


def test_modules_built_from_another_tree_are_refused(ws, tmp_path):
    tree, root, jit_dir, env = ws
    elsewhere = tmp_path / "site-packages/flashinfer/data"
    shutil.copytree(tree / "include", elsewhere / "include")
    (tree / "csrc/third.cc").write_text(
        f'#include "{elsewhere}/include/flashinfer/norm.cuh"\nint h() {{ return K; }}\n'
    )
    foreign = build_module(jit_dir, "foreign", [tree / "csrc/third.cc"], tree)
    two_line_failure(affected(root, env), "foreign was built from")
    (foreign / ninja_inputs.STAMP).unlink()  # built without a record (FlashInfer's own loader): ninja's deps log tells
    two_line_failure(affected(root, env), "foreign was built from")


def test_a_run_rebuilds_the_edited_module_and_runs_its_tests(ws):
    """Past --list: the edited module is rebuilt (fidev.builds.module_builds), the other is not, and smoke's
    tests run, in the task's kernel source mode; on a host without a GPU they skip, which is no pass."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, jit_dir, env = ws
    objects = {
        name: (jit_dir / name / f"{stem}.o").stat().st_mtime_ns
        for name, stem in (("norm", "norm.cu"), ("norm_upstream", "other"))
    }
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    done = affected(root, env, "--summary", str(jit_dir.parent / "affected.json"))
    assert "affected: 1 module(s) rebuilt in" in done.stdout, done.stdout + done.stderr
    # what the run compiled, per module, from ninja's log in the module's folder (fidev.records.compile_log)
    record = affected_summary.read(jit_dir.parent / "affected.json")
    assert (record.compiled, record.compiled_twice) == ({"norm": 1}, []), record
    # the rebuild's seconds and the run's, to a tenth (the lines' figures), a rebuild's never null; the run's is its
    # own time in all, within the 120 s that affected() allows it
    assert all(isinstance(s, float) and round(s, 1) == s for s in (record.build_s, record.seconds)), record
    assert record.build_s <= record.seconds < 120, record
    assert "affected: 1 module(s) compiled in this run (norm), each once" in done.stdout, done.stdout
    assert (jit_dir / "norm/norm.cu.o").stat().st_mtime_ns != objects["norm"]
    assert (jit_dir / "norm_upstream/other.o").stat().st_mtime_ns == objects["norm_upstream"]
    assert "Traceback" not in done.stdout + done.stderr
    assert done.returncode == 1 and "no smoke or abi-smoke test passed" in done.stdout, done.stdout
    # in the task's kernel source mode (the default, auto), as the tests' count line says
    assert any(
        line.startswith("affected: 0 passed, ") and "; kernel source auto; " in line
        for line in done.stdout.splitlines()
    ), done.stdout
    # the rebuild recorded the edit as built, and the verdict was kept: asking again reruns the tests, never
    # "nothing changed"
    again = affected(root, env)
    assert again.returncode == 1 and "nothing changed" not in again.stdout and "ninja: no work to do" in again.stdout, (
        again.stdout
    )
    assert any(
        line.startswith("(the last run failed at ") and "its tests run again" in line
        for line in again.stdout.splitlines()
    ), again.stdout


def test_a_module_whose_ninja_log_was_recompacted_in_the_run_is_compiled_an_unknown_number_of_times(ws):
    """ninja rewrites a log of many stale entries as it starts (recompaction: more than 100 outputs, each logged
    over 3 times on average): what the run compiled in that module cannot be counted from it, and the summary
    says so (None), the run going on to its verdict."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, jit_dir, env = ws
    log = jit_dir / "norm/.ninja_log"
    header = log.read_text().splitlines(keepends=True)[0]
    log.write_text(header + "".join(f"0\t1\t0\tgone_{i}.o\t{i:016x}\n" for i in range(120) for _ in range(4)))
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    done = affected(root, env, "--summary", str(jit_dir.parent / "affected.json"))
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "affected: 1 module(s) compiled in this run (norm); more than once (or not known): norm" in done.stdout
    assert affected_summary.read(jit_dir.parent / "affected.json").compiled == {"norm": None}


def test_a_run_killed_during_its_tests_is_unfinished_and_its_tests_run_again(ws):
    """The `unfinished` verdict is kept after the rebuild, with the inputs the rebuild recorded, and
    before the tests start: a run killed in its tests (here smoke's test file ends the process as
    it is collected) is seen as unfinished next time, never as "nothing changed"."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, _, env = ws
    smoke = root / "tests/smoke/test_kernels.py"
    smoke.write_text("import os\nos._exit(9)\n" + smoke.read_text())
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    done = affected(root, env)
    assert done.returncode == 9 and "affected: 1 module(s) rebuilt in" in done.stdout, done.stdout + done.stderr
    again = affected(root, env, "--list")
    assert "nothing changed" not in again.stdout, again.stdout
    assert any(
        line.startswith("(the last run unfinished at ") and " norm " in f" {line} "
        for line in again.stdout.splitlines()
    ), again.stdout


def test_a_module_built_in_a_run_whose_other_build_failed_is_unfinished(ws):
    """norm builds while norm_upstream's build fails: norm's edit is built and recorded, its tests
    never ran, so once norm_upstream's source is restored, norm is unfinished, not "nothing changed"."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, _, env = ws
    other, saved = norm_edit_with_a_failing_build(tree)
    done = affected(root, env, "--summary", str(root / "build-failed.json"))
    assert done.returncode == 1 and "build failed" in done.stdout, done.stdout + done.stderr
    assert affected_summary.read(root / "build-failed.json").verdict == "build failed"  # not a refusal's `error`
    other.write_text(saved)
    again = affected(root, env, "--list")
    assert "nothing changed" not in again.stdout, again.stdout
    assert any(
        line.startswith("(the last run unfinished at ") and "norm" in line.replace(",", " ").split()
        for line in again.stdout.splitlines()
    ), again.stdout


def compiling(session: int, source: str) -> bool:
    """Whether a process of the session `session` (its leader's pid) compiles `source`: its command line names it."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if os.getsid(int(pid)) == session and source.encode() in f.read():
                    return True
        except OSError:  # ended meanwhile
            continue
    return False


def said_unfinished(stdout: str, name: str) -> bool:
    """Whether affected --list says module `name`'s last run was unfinished (its tests run again)."""
    return any(
        line.startswith("(the last run unfinished at ") and name in line.replace(",", " ").split()
        for line in stdout.splitlines()
    )


def norm_edit_with_a_failing_build(tree):
    """norm.cuh edited, and norm_upstream's csrc/other.cc made no C++: (other.cc, its text before)."""
    other = tree / "csrc/other.cc"
    saved = other.read_text()
    other.write_text(saved + "this is no C++\n")
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    return other, saved


def norm_edit_with_a_blocked_compile(tree, tmp_path):
    """norm.cuh edited, and norm_upstream's csrc/other.cc including a FIFO outside the tree (affected reads no
    include that is not a regular file), so that its compile blocks until the run is killed: (other.cc, its text)."""
    blocker, other = tmp_path / "blocker.h", tree / "csrc/other.cc"
    os.mkfifo(blocker)
    saved = other.read_text()
    other.write_text(f'#include "{blocker}"\n' + saved)
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    return other, saved


def affected_in_its_session(root, env, **more_env) -> subprocess.Popen:
    """`affected --keep-going` in a session of its own: its ninja, compilers and FlashInfer's tests die with it."""
    return subprocess.Popen(
        [sys.executable, str(root / "scripts/affected.py"), "--keep-going"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env, **more_env},
        start_new_session=True,
    )


def test_a_run_killed_in_its_rebuild_leaves_each_module_unfinished_the_rebuilt_one_with_its_new_inputs(ws, tmp_path):
    """A run killed (SIGKILL: no handler runs) while norm_upstream compiles, norm rebuilt already: each module was
    kept `unfinished` before the rebuild started, and norm again as soon as it was rebuilt, with the inputs its
    rebuild recorded. So, norm_upstream's edit reverted, the next run runs both modules' tests again: neither is
    "nothing changed", though norm's record holds its edit and norm_upstream's its old inputs. The compile blocks
    on a FIFO it includes (outside the tree: affected reads no file it includes that is not a regular file)."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    from fidev.affected import verdicts as kept_verdicts

    tree, root, jit_dir, env = ws
    other, saved = norm_edit_with_a_blocked_compile(tree, tmp_path)
    kept = workspace.read(pins().flashinfer).verdicts
    norm_inputs = kept_verdicts.fingerprint(jit_dir / "norm")
    proc = affected_in_its_session(root, env)
    try:
        wait_until(lambda: compiling(proc.pid, str(other)), 120, "norm_upstream's compile started", proc)
        with contextlib.suppress(AssertionError):  # wait for norm's rebuild, if it comes
            wait_until(lambda: kept_verdicts.fingerprint(jit_dir / "norm") != norm_inputs, 60, "norm rebuilt", proc)
            wait_until(lambda: kept_verdicts.Kept(kept).standing("norm", jit_dir / "norm"), 10, "norm kept rebuilt")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        said = proc.communicate(timeout=30)[0]
    assert kept_verdicts.fingerprint(jit_dir / "norm") != norm_inputs, said  # norm's rebuild recorded its edit
    other.write_text(saved)
    again = affected(root, env, "--list")
    assert "nothing changed" not in again.stdout, said + again.stdout
    assert said_unfinished(again.stdout, "norm") and said_unfinished(again.stdout, "norm_upstream"), again.stdout


def gate_held_back(scratch) -> bool:
    """Whether FlashInfer's gate of a run whose scratch folders are under `scratch` says its rebuild could not take
    every module's lock (`held` false: fidev.upstream.gate.state_text): the rebuild has taken what it could."""
    gates = [json.loads(gate.read_text() or "{}") for gate in scratch.glob(f"{workspace.AFFECTED_SCRATCH}*/gate")]
    return any(state.get("modules") and state.get("held") is False for state in gates)


def test_a_module_rebuilt_after_another_process_let_its_lock_go_is_unfinished_when_the_build_fails(ws, tmp_path):
    """Both modules' locks are held elsewhere as the rebuild starts (a test loading them), so it builds them once
    they are let go (module_builds.build_or_wait), where no module is kept as it is rebuilt: norm builds, and
    norm_upstream's build fails. The failed run keeps each module `unfinished` again as it ends, norm with the
    inputs its rebuild recorded: once norm_upstream's source is restored, norm's tests run again, though its
    record holds its edit (never "nothing changed" over tests that did not run)."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock

    tree, root, jit_dir, env = ws
    other, saved = norm_edit_with_a_failing_build(tree)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    locks = [FileLock(workspace.module_lock(jit_dir / name), thread_local=False) for name in ("norm", "norm_upstream")]
    for lock in locks:
        lock.acquire()
    proc = subprocess.Popen(
        [sys.executable, str(root / "scripts/affected.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env, "TMPDIR": str(scratch)},
    )
    try:
        wait_until(lambda: gate_held_back(scratch), 120, "the rebuild found both modules' locks held", proc)
    finally:
        for lock in locks:
            lock.release()
        said = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1 and any(  # the table, each file's row `build failed`
        line.startswith("csrc/other.cc ") and line.rstrip().endswith(" build failed") for line in said.splitlines()
    ), said
    other.write_text(saved)
    again = affected(root, env, "--list")
    assert "nothing changed" not in again.stdout and said_unfinished(again.stdout, "norm"), said + again.stdout


def lock_free(path) -> bool:
    """Whether the FileLock at `path` can be taken now (it is let go again at once)."""
    from filelock import FileLock, Timeout

    lock = FileLock(path, thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    lock.release()
    return True


def test_a_module_built_once_another_process_let_its_lock_go_is_kept_as_it_is_built(ws, tmp_path):
    """Both modules' locks are held elsewhere as the rebuild starts, so it builds them once they are let go
    (module_builds.build_or_wait). norm builds while norm_upstream's compile blocks (a FIFO it includes), and the
    run is killed (SIGKILL: no end of the rebuild, no Failure) once norm's build recorded its edit: norm was kept
    `unfinished` with its new inputs as it was built, so its tests run again, never "nothing changed"."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock

    from fidev.affected import verdicts as kept_verdicts

    tree, root, jit_dir, env = ws
    other, saved = norm_edit_with_a_blocked_compile(tree, tmp_path)
    before = kept_verdicts.fingerprint(jit_dir / "norm")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    locks = [FileLock(workspace.module_lock(jit_dir / name), thread_local=False) for name in ("norm", "norm_upstream")]
    for lock in locks:
        lock.acquire()
    proc = affected_in_its_session(root, env, TMPDIR=str(scratch))
    try:
        wait_until(lambda: gate_held_back(scratch), 120, "the rebuild found both modules' locks held", proc)
        for lock in locks:
            lock.release()
        wait_until(lambda: compiling(proc.pid, str(other)), 60, "norm_upstream's compile blocked", proc)
        wait_until(lambda: kept_verdicts.fingerprint(jit_dir / "norm") != before, 60, "norm rebuilt", proc)
        # built, then kept, then its lock let go: free now, norm's end in the rebuild is past
        wait_until(lambda: lock_free(workspace.module_lock(jit_dir / "norm")), 60, "norm's lock let go", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        said = proc.communicate(timeout=30)[0]
    other.write_text(saved)
    again = affected(root, env, "--list")
    assert "nothing changed" not in again.stdout and said_unfinished(again.stdout, "norm"), said + again.stdout


def test_an_edit_no_built_module_compiles_names_the_families_that_would(ws):
    """include/flashinfer/page.cuh is compiled by the `page` family's csrc/page.cu (flashinfer/jit/page.py,
    lines 25-26 at v0.6.3): no module of this JIT dir includes it."""
    tree, root, _, env = ws
    (tree / "csrc/page.cu").write_text('#include "flashinfer/page.cuh"\n')
    (tree / "include/flashinfer/page.cuh").write_text("constexpr int P = 1;\n")
    module_builds.record_build(ws[2] / "norm", ws[2] / "norm/build.ninja", tree=tree)  # the tree as of a build
    (tree / "include/flashinfer/page.cuh").write_text("constexpr int P = 2;\n")
    done = affected(root, env)
    assert done.returncode == 3, done.stdout + done.stderr  # not a pass: the page family's tests did not run
    assert (
        "affected: not a pass: 1 kernel family(ies) the edit reaches went untested; cover them: "
        "pixi run -e flashinfer-dev upstream-tests page" in done.stdout
    )
    assert any(
        line.startswith("include/flashinfer/page.cuh") and "no built module" in line
        for line in done.stdout.splitlines()
    ), done.stdout
    assert (
        "include/flashinfer/page.cuh reaches no built module; the tests of page would build one: "
        "pixi run -e flashinfer-dev upstream-tests page" in done.stdout
    )
    assert "rebuilt" not in done.stdout


def test_a_not_covered_edit_stays_not_covered_after_a_later_build_until_it_is_reverted(ws):
    """The page edit above, then a build of another module (which records the tree with the edit):
    affected says not covered again (3), never "nothing changed"; once page.cuh holds what it held
    before the edit again, nothing changed."""
    tree, root, jit_dir, env = ws
    (tree / "csrc/page.cu").write_text('#include "flashinfer/page.cuh"\n')
    page = tree / "include/flashinfer/page.cuh"
    page.write_text("constexpr int P = 1;\n")
    module_builds.record_build(jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree)
    page.write_text("constexpr int P = 2;\n")
    assert affected(root, env).returncode == 3
    module_builds.record_build(
        jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree
    )  # a later build records the tree as edited
    again = affected(root, env)
    assert again.returncode == 3 and "nothing changed" not in again.stdout, again.stdout + again.stderr
    assert "pixi run -e flashinfer-dev upstream-tests page" in again.stdout
    page.write_text("constexpr int P = 1;\n")  # reverted
    back = affected(root, env)
    assert back.returncode == 0 and "nothing changed" in back.stdout, back.stdout + back.stderr


def smoke_fails_on_the_norm_edit(tree, root):
    """smoke's tests, their test_rmsnorm failing once norm.cuh holds the edit `K = 2`: norm.cuh's path."""
    header = tree / "include/flashinfer/norm.cuh"
    smoke = PASSING_SMOKE["smoke/test_kernels.py"].replace(
        "def test_rmsnorm():\n    pass", f"def test_rmsnorm():\n    assert 'K = 2' not in open({str(header)!r}).read()"
    )
    for rel, text in {**PASSING_SMOKE, "smoke/test_kernels.py": smoke}.items():
        (root / "tests" / rel).write_text(text)
    return header


def test_keep_going_runs_every_smoke_test_past_the_first_failure_which_otherwise_ends_them(ws):
    """smoke's test_rmsnorm fails on the edit (it runs last): with --keep-going no failure ends smoke's tests (pytest
    without -x) and the run is not said stopped; without it, the first failure ends them (-x: the kept failure runs
    them again) and the run says that what did not run is no pass."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, _, env = ws
    header = smoke_fails_on_the_norm_edit(tree, root)
    header.write_text("constexpr int K = 2;\n")
    ended = "affected: the first failure ended the run: the other selected tests did not run, and are no pass"
    every = affected(root, env, "--keep-going")
    assert every.returncode == 1 and "5 passed, 0 skipped, 1 failed" in every.stdout, every.stdout + every.stderr
    assert ended not in every.stdout and "stopping after 1 failures" not in every.stdout, every.stdout
    first = affected(root, env)  # the failure kept: its tests run again, and the first failure ends them
    assert first.returncode == 1 and ended in first.stdout and "stopping after 1 failures" in first.stdout, (
        first.stdout + first.stderr
    )


def test_a_file_none_of_whose_tests_failed_in_a_run_the_first_failure_ended_is_unfinished_and_kept_so(ws):
    """smoke's test_rmsnorm fails on norm.cuh's edit and ends the run; other.cuh's edit reaches norm_upstream, none
    of whose tests failed: its row reads unfinished and its module is kept `unfinished`, not passed (its tests may
    not have run), so the next run runs them again."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    from fidev.affected import verdicts as kept_verdicts

    tree, root, _, env = ws
    smoke_fails_on_the_norm_edit(tree, root).write_text("constexpr int K = 2;\n")
    (tree / "include/flashinfer/other.cuh").write_text("constexpr int J = 2;\n")
    done = affected(root, env)
    assert done.returncode == 1 and "the first failure ended the run" in done.stdout, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("include/")}
    assert rows["include/flashinfer/norm.cuh"].endswith("  1 failed"), done.stdout
    assert rows["include/flashinfer/other.cuh"].endswith("  unfinished"), done.stdout
    kept = kept_verdicts.Kept(workspace.read(pins().flashinfer).verdicts).modules
    assert (kept["norm"].result, kept["norm_upstream"].result) == ("failed", "unfinished"), kept


def test_a_file_whose_flashinfer_tests_left_no_summary_reads_unknown(ws):
    """other.cuh's edit reaches norm_upstream, whose FlashInfer test ends without a summary (the stand-in tree has
    no test suite): nothing of theirs is known, so its row reads unknown, never passed, and the run fails."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, _, env = ws
    (tree / "include/flashinfer/other.cuh").write_text("constexpr int J = 2;\n")
    done = affected(root, env)
    assert done.returncode == 1 and "its summary could not be read" in done.stdout, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("include/flashinfer/other.cuh "))
    assert row.endswith("  unknown"), done.stdout


PASSING_SMOKE = {  # smoke's and abi-smoke's tests of the norm module, as stand-ins that pass on any host
    "smoke/test_kernels.py": "def test_rmsnorm():\n    pass\n\n\ndef test_fused_add_rmsnorm():\n    pass\n",
    "abi_smoke/test_abi.py": "import pytest\n\n\ndef test_norm():\n    pass\n\n\n"
    "def test_bad_norm_call_is_a_decoded_error():\n    pass\n\n\n"
    "@pytest.mark.parametrize('op', ['norm.rmsnorm', 'norm.gemma_rmsnorm'])\n"
    "def test_runtime_signature_equals_the_source(op):\n    pass\n",
}


def test_a_module_whose_tests_passed_in_a_not_covered_run_is_not_covered_until_the_edit_is_reverted(ws):
    """norm.cuh reaches the norm module (smoke's tests pass) and the norm family (csrc/norm.cu
    includes it), whose FlashInfer tests did not run: status 3, kept as `not covered`, so asking
    again says it again (its tests run again); reverted, it passes."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, jit_dir, env = ws
    for rel, text in PASSING_SMOKE.items():
        (root / "tests" / rel).write_text(text)
    (tree / "csrc/norm.cu").write_text('#include "flashinfer/norm.cuh"\n')
    module_builds.record_build(
        jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree
    )  # the tree with it, as of a build
    header = tree / "include/flashinfer/norm.cuh"
    header.write_text("constexpr int K = 2;\n")
    done = affected(root, env)
    assert done.returncode == 3 and "affected: 1 module(s) rebuilt in" in done.stdout, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("include/flashinfer/norm.cuh "))
    assert row.endswith("  not covered"), done.stdout  # its tests passed, in a run that was not covered
    again = affected(root, env)
    assert again.returncode == 3 and "nothing changed" not in again.stdout, again.stdout + again.stderr
    assert "include/flashinfer/norm.cuh reaches norm, whose FlashInfer tests did not run here" in again.stdout
    # norm's verdict is kept `not covered`, not passed, though its tests passed
    from fidev.affected import verdicts as kept_verdicts

    assert kept_verdicts.Kept(workspace.read(pins().flashinfer).verdicts).modules["norm"].result == "not covered"
    header.write_text("constexpr int K = 1;\n")  # reverted: rebuilt, its tests pass, and no family went untested
    back = affected(root, env, "--summary", str(jit_dir.parent / "back.json"))
    assert back.returncode == 0 and "every selected test passed" in back.stdout, back.stdout + back.stderr
    # its row reads passed; the last line says the rebuild and the run's own seconds (the summary's, to a tenth)
    row = next(line for line in back.stdout.splitlines() if line.startswith("include/flashinfer/norm.cuh "))
    assert row.split()[-1] == "passed", back.stdout
    last_line = next(line for line in back.stdout.splitlines() if line.startswith("affected: every selected test"))
    assert "; 1 module(s) rebuilt in " in last_line and last_line.endswith(" s in all"), last_line
    in_all = float(last_line.rsplit("; ", 1)[1].split()[0])
    assert in_all <= affected_summary.read(jit_dir.parent / "back.json").seconds + 0.05, last_line
    # the tree as it judged it is kept with the verdict: later edits are told from it (changes.since_judged)
    judged = json.loads(workspace.read(pins().flashinfer).verdicts.read_text()).get("judged", {})
    assert "include/flashinfer/norm.cuh" in judged and "csrc/norm.cu" in judged, judged
    last = affected(root, env)
    assert last.returncode == 0 and "nothing changed" in last.stdout and ": passed (" in last.stdout, last.stdout


def rebuild(jit_dir, name, tree):
    """A module built again as `build` does (ninja, then its records, the tree's among them)."""
    subprocess.run(["ninja", "-C", str(jit_dir / name)], check=True, capture_output=True)
    module_builds.record_build(jit_dir / name, jit_dir / name / "build.ninja", tree=tree)


def test_an_edit_built_by_build_before_affected_ran_is_judged_and_a_failure_stays(ws):
    """affected judges the tree, not only the builds: an edit that `build` (or smoke, through it)
    compiled and recorded before affected ran shows in no build record, yet it differs from the
    tree as affected's last verdict judged it. Its module's tests run and fail (exit 1), asking
    again fails again; the header reverted, it passes, then nothing changed."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, jit_dir, env = ws
    header = smoke_fails_on_the_norm_edit(tree, root)
    first = affected(root, env)
    assert first.returncode == 0 and "nothing changed" in first.stdout, first.stdout + first.stderr
    header.write_text("constexpr int K = 2;\n")
    rebuild(jit_dir, "norm", tree)
    listed = affected(root, env, "--list").stdout
    assert (
        "include/flashinfer/norm.cuh changed since its last verdict, and a build recorded the edit since" in listed
    ), listed
    for attempt in ("edit", "again"):  # again: the failure kept (fidev.affected.verdicts)
        done = affected(root, env)
        assert done.returncode == 1 and "nothing changed" not in done.stdout, (attempt, done.stdout + done.stderr)
        assert "test_rmsnorm" in done.stdout, done.stdout
    header.write_text("constexpr int K = 1;\n")
    rebuild(jit_dir, "norm", tree)  # reverted, and built before affected ran: judged all the same
    back = affected(root, env)
    assert back.returncode == 0 and "every selected test passed" in back.stdout, back.stdout + back.stderr
    last = affected(root, env)
    assert last.returncode == 0 and "nothing changed" in last.stdout, last.stdout


def test_a_family_only_edit_built_before_affected_ran_is_not_covered(ws):
    """An edit only the page family compiles, then a build of another module that records the tree
    with it: not covered (3), as if no build had run between, not "nothing changed"."""
    tree, root, jit_dir, env = ws
    (tree / "csrc/page.cu").write_text('#include "flashinfer/page.cuh"\n')
    page = tree / "include/flashinfer/page.cuh"
    page.write_text("constexpr int P = 1;\n")
    module_builds.record_build(jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree)
    assert "nothing changed" in affected(root, env).stdout  # the verdict that judges P = 1
    page.write_text("constexpr int P = 2;\n")
    module_builds.record_build(jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree)  # the edit recorded as built
    done = affected(root, env)
    assert done.returncode == 3 and "nothing changed" not in done.stdout, done.stdout + done.stderr
    assert "pixi run -e flashinfer-dev upstream-tests page" in done.stdout


def test_a_not_covered_edit_a_build_recorded_first_ends_once_it_is_reverted(ws):
    """No build record holds page.cuh as it was before the edit (a build recorded the edit first):
    its content as affected's last verdict judged it is its content before the edit, so reverting
    it ends the kept not-covered verdict."""
    tree, root, jit_dir, env = ws
    (tree / "csrc/page.cu").write_text('#include "flashinfer/page.cuh"\n')
    page = tree / "include/flashinfer/page.cuh"
    page.write_text("constexpr int P = 1;\n")
    module_builds.record_build(jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree)
    assert "nothing changed" in affected(root, env).stdout
    page.write_text("constexpr int P = 2;\n")
    module_builds.record_build(jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree)
    assert affected(root, env).returncode == 3
    page.write_text("constexpr int P = 1;\n")  # reverted
    back = affected(root, env)
    assert back.returncode == 0 and "nothing changed" in back.stdout, back.stdout + back.stderr


@pytest.mark.parametrize("rel", ["flashinfer/jit/activation.py", "flashinfer/fp4_quantization.py"])
def test_a_python_edit_a_build_recorded_first_is_judged_wherever_in_the_package(ws, rel):
    """A generator may be any of the package's Python files (flashinfer/fp4_quantization.py's
    gen_fp4_quantization_module at v0.6.3): edited, then built, it is an edit to affected, with the
    modules generated after it (smoke's norm here)."""
    tree, root, jit_dir, env = ws
    generator = tree / rel
    generator.write_text("# a generator\n")
    for name in ("norm", "norm_upstream"):
        module_builds.record_build(jit_dir / name, jit_dir / name / "build.ninja", tree=tree)
    assert "nothing changed" in affected(root, env).stdout
    generator.write_text("# a generator, edited\n")
    for name in ("norm", "norm_upstream"):
        module_builds.record_build(jit_dir / name, jit_dir / name / "build.ninja", tree=tree)
    done = affected(root, env, "--list")
    assert "nothing changed" not in done.stdout and f"{rel} changed since its last verdict" in done.stdout, done.stdout
    assert any(line.startswith(rel) and line.split()[1] == "norm" for line in done.stdout.splitlines()), done.stdout


def test_the_prebuilt_mode_with_a_jit_cache_is_refused_and_auto_needs_the_release(ws, tmp_path):
    """With flashinfer-jit-cache importable, FlashInfer loads its copy of a module instead of the
    rebuilt one (flashinfer/jit/core.py, JitSpec.build_and_load, at v0.6.3): affected would test nothing."""
    tree, root, _, env = ws
    fake = tmp_path / "site"
    (fake / "flashinfer_jit_cache").mkdir(parents=True)
    (fake / "flashinfer_jit_cache/__init__.py").write_text("")
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    pythonpath = f"{tree}{os.pathsep}{fake}"
    done = affected(root, {**env, "PYTHONPATH": pythonpath, "FLASHINFER_DEV_KERNEL_SOURCE": "prebuilt"}, "--list")
    two_line_failure(
        done,
        "kernel source prebuilt: flashinfer-jit-cache is installed, so the tests would run its prebuilt kernels, "
        "not your edits",
    )
    assert done.stderr.strip().endswith(
        "fix: FLASHINFER_DEV_KERNEL_SOURCE=vendored pixi run -e flashinfer-dev affected"
    )
    done = affected(root, {**env, "PYTHONPATH": pythonpath, "FLASHINFER_DEV_KERNEL_SOURCE": "vendored"}, "--list")
    assert done.returncode == 0 and "norm.cuh" in done.stdout, done.stdout + done.stderr
    # the default, auto, chooses per module by the tree's edits: a tree with no release to tell them by is two lines
    two_line_failure(
        affected(root, {**env, "PYTHONPATH": pythonpath}, "--list"),
        "neither the pinned commit's checkout nor the pinned release",
    )
    # the pinned release, whose files tell its edits by: auto runs (the jit-cache's copy of what no edit reaches)
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    release_reference.record_release(tree)
    done = affected(root, {**env, "PYTHONPATH": pythonpath}, "--list")
    assert done.returncode == 0 and "norm.cuh" in done.stdout, done.stdout + done.stderr


def test_an_edit_saved_while_the_module_compiled_stays_an_edit(ws):
    """The record is written after ninja ends: an input newer than its object then is not what was built."""
    tree, root, jit_dir, env = ws
    header = tree / "include/flashinfer/norm.cuh"
    header.write_text("constexpr int K = 3;  // saved during the compile\n")
    obj = jit_dir / "norm/norm.cu.o"
    os.utime(header, ns=(obj.stat().st_mtime_ns + 10**9,) * 2)
    module_builds.record_build(
        jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree
    )  # the record, after the build ended
    done = affected(root, env, "--list")
    assert any("norm.cuh" in line and " norm " in f" {line} " for line in done.stdout.splitlines()), done.stdout


def test_flashinfers_tests_take_a_process_per_80_cases_of_the_largest_file_with_the_cores_shared_per_gpu(
    monkeypatch, tmp_path
):
    from fidev.affected.theirs import processes

    file_times = workspace.Workspace(
        tmp_path, pins().flashinfer
    ).file_times  # the task's workspace's, passed down: no file's time kept yet
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    # the cores shared among the processes' torch thread pools too
    assert processes({"tests/utils/test_norm.py": 2705, "tests/utils/test_quantization.py": 28}, file_times) == (
        ["--per-gpu", "8"],
        {"OMP_NUM_THREADS": "2"},
    )
    assert processes({"tests/utils/test_activation.py": 630}, file_times) == (
        ["--per-gpu", "8"],
        {"OMP_NUM_THREADS": "2"},
    )
    assert processes({"tests/utils/test_activation.py": 200}, file_times) == (
        ["--per-gpu", "3"],
        {"OMP_NUM_THREADS": "5"},
    )
    # one process: not worth a second's start
    assert processes({"tests/utils/test_quantization.py": 28}, file_times) == ([], {"OMP_NUM_THREADS": "16"})
    # five small files: a process each, all five at once behind the gate (upstream_runs.at_once), the cores shared
    five = {f"tests/attention/test_{i}.py": 28 for i in range(5)}
    assert processes(five, file_times) == ([], {"OMP_NUM_THREADS": "3"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # two files at once, one per GPU: the cores shared
    assert processes({"tests/utils/test_norm.py": 2705, "tests/utils/test_activation.py": 630}, file_times) == (
        ["--per-gpu", "4"],
        {"OMP_NUM_THREADS": "2"},
    )
    assert processes({"tests/utils/test_activation.py": 1890}, file_times) == (
        ["--per-gpu", "8"],
        {"OMP_NUM_THREADS": "2"},
    )
    # a file whose last run took 99 s runs in a part per GPU (upstream_runs.parts): two processes at once, half the
    # cases each
    times = file_times
    times.parent.mkdir(parents=True)
    times.write_text('{"tests/utils/test_activation.py": 99.0}')
    assert processes({"tests/utils/test_activation.py": 1890}, file_times) == (
        ["--per-gpu", "4"],
        {"OMP_NUM_THREADS": "2"},
    )
    monkeypatch.setattr(os, "cpu_count", lambda: 32)  # the 2-GPU H200 host
    assert processes({"tests/utils/test_activation.py": 630}, file_times) == (
        ["--per-gpu", "4"],
        {"OMP_NUM_THREADS": "4"},
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own: kept
    assert processes({"tests/utils/test_norm.py": 2705}, file_times) == (["--per-gpu", "8"], {})
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # empty counts as unset (docs/faults.md): the cores are shared
    assert processes({"tests/utils/test_norm.py": 2705}, file_times) == (["--per-gpu", "8"], {"OMP_NUM_THREADS": "4"})


def test_a_build_keeps_the_generator_call_of_the_process_that_made_the_jitspec(ws, monkeypatch):
    """The call that made a module's JitSpec is kept with its build for `affected` to make again; a
    rebuild from build.ninja alone (affected's own, after a header edit) keeps it; a build whose
    process made the JitSpec by no call that can be made again drops it."""
    from fidev.jit import module_choice

    tree, _, jit_dir, _ = ws
    norm = jit_dir / "norm"
    call = {"module": "flashinfer.jit.norm", "function": "gen_norm_module", "kwargs": {}}
    monkeypatch.setitem(module_choice.GENERATORS, "norm", set())
    monkeypatch.setitem(module_choice.CALLS, "norm", call)
    module_builds.record_build(norm, norm / "build.ninja", tree=tree)
    assert build_records.recorded_call(norm) == call
    monkeypatch.delitem(module_choice.GENERATORS, "norm")
    monkeypatch.delitem(module_choice.CALLS, "norm")
    module_builds.record_build(norm, norm / "build.ninja", tree=tree)
    assert build_records.recorded_call(norm) == call, "a rebuild that made no JitSpec dropped the call"
    monkeypatch.setitem(module_choice.GENERATORS, "norm", set())
    module_builds.record_build(norm, norm / "build.ninja", tree=tree)
    assert build_records.recorded_call(norm) is None


def test_flashinfers_tests_are_judged_by_their_summary_and_an_unreadable_one_is_no_pass(tmp_path, capsys):
    """affected reads upstream-tests' result from the summary it asked for (fidev.upstream.summary),
    not from its output: the failing and erroring ids (a file that did not finish, by its path), and
    where it left none, the two lines of why and status 1, although upstream-tests exited 0."""
    import queue

    from fidev.affected import tests as affected_tests
    from fidev.affected import theirs as their_tests
    from fidev.upstream import summary as upstream_summary

    def finished(said: str, summary_path):
        run = their_tests.FlashInferTests.__new__(their_tests.FlashInferTests)
        run.lines, run.proc, run.summary = queue.Queue(), subprocess.Popen([sys.executable, "-c", ""]), summary_path
        run.opened, run.past, run.unread = None, None, None
        for line in (said, None):
            run.lines.put(line)
        return run, run.finish()

    done = upstream_summary.Summary(
        ["norm"],
        "vendored",
        str(tmp_path),
        ["0"],
        "H100",
        1.0,
        2.0,
        1,
        dict.fromkeys(upstream_summary.COUNTS, 1),
        failing=["tests/utils/test_norm.py::test_norm[1]"],
        erroring=["tests/utils/test_page.py (exit -11)"],
    )
    upstream_summary.write(done, tmp_path / "summary.json")
    run, (status, failed) = finished("FAILED not/read/from/here.py::x\n", tmp_path / "summary.json")
    assert (status, failed, run.unread) == (
        0,
        {"tests/utils/test_norm.py::test_norm[1]", "tests/utils/test_page.py"},
        None,
    )
    assert "FAILED not/read/from/here.py::x" in capsys.readouterr().out  # its output still shown
    run, (status, failed) = finished("upstream-tests: 2 passed\n", tmp_path / "none.json")
    assert (status, failed) == (1, set()) and "summary is missing" in capsys.readouterr().err
    outcome = affected_tests.Outcome("1 module(s) rebuilt in 1.0 s", 1.0, ["norm"])
    affected_tests.theirs_step(status, failed, run.unread, outcome)
    assert outcome.broken == ["upstream-tests exited 1, and its summary could not be read (the error above says why)"]


def test_a_build_without_filelock_fails_in_two_lines(monkeypatch):
    monkeypatch.setitem(sys.modules, "filelock", None)  # as in a Python without it: the import fails
    with pytest.raises(Failure, match="filelock is not installed") as raised:
        module_builds.build_specs([])
    assert raised.value.fix.startswith("run it in the environment")


def test_an_unreadable_inputs_record_is_said_and_its_module_rebuilt(ws):
    """A truncated .fidev-inputs.json: the module is named with its record, taken as edited and
    rebuilt; the table never says of an edit that it reaches no built module and also maps it."""
    tree, root, jit_dir, env = ws
    record = jit_dir / "norm" / ninja_inputs.STAMP
    record.write_text(record.read_text()[:40])
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    done = affected(root, env, "--list")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"affected: norm: its build record {ninja_inputs.STAMP} cannot be read (truncated?): it is taken as edited"
        in done.stdout
    )
    assert "reaches no built module" not in done.stdout, done.stdout
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith(("include/", "("))}
    assert (
        "norm" in rows["include/flashinfer/norm.cuh"]
        and "norm" in rows[f"(its build record {ninja_inputs.STAMP} cannot be read)".split()[0]]
    )


@pytest.mark.parametrize("record", [ninja_inputs.STAMP, workspace.GENERATORS])
@pytest.mark.parametrize(
    "text", ["[]", '{"obj": ["a"]}', '{"obj": {"/x.h": "x"}}', '{"obj": {"/x.h": [1, "2", "h"]}}', '{"/x.py": 5}']
)
def test_a_build_record_of_another_shape_is_said_and_its_module_rebuilt(ws, record, text):
    """Valid JSON of the wrong shape (a list for a dict, a string for a fact) is as unreadable as a
    truncated record: named, the module taken as edited, never a traceback."""
    _, root, jit_dir, env = ws
    (jit_dir / "norm" / record).write_text(text)
    done = affected(root, env, "--list")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert (
        f"affected: norm: its build record {record} cannot be read (truncated?): it is taken as edited" in done.stdout
    ), done.stdout
    assert "nothing changed" not in done.stdout


AUTO_FIX = (
    "fix: FLASHINFER_DEV_KERNEL_SOURCE=vendored pixi run -e flashinfer-dev build, then affected with the same setting"
)


def test_jit_dirs_with_no_module_built_are_two_lines_naming_them(ws, tmp_path):
    """JIT dirs of the pinned version in which no module was built whole (a build that never made its
    library) are nothing built: two lines naming each, with the first build affected needs (with a prebuilt
    set in the tree, auto builds only what was edited: vendored)."""
    tree, root, _, env = ws
    base = tmp_path / "unbuilt"
    dirs = [base / ".cache/flashinfer" / pins().flashinfer / arch / "cached_ops" for arch in ("100a", "90a")]
    for jit_dir in dirs:
        (jit_dir / "norm").mkdir(parents=True)
        (jit_dir / "norm/build.ninja").write_text("")
    (tree / "flashinfer/data/aot/norm").mkdir(parents=True)
    done = affected(root, {**env, "FLASHINFER_WORKSPACE_BASE": str(base)})
    two_line_failure(done, f"nothing is built yet in {dirs[0]}, {dirs[1]}")
    assert done.stderr.strip().splitlines()[-1].strip().startswith(AUTO_FIX), done.stderr


def test_jit_dirs_whose_every_module_only_a_build_ahead_made_are_nothing_built(ws, tmp_path):
    """Where every module of the JIT dirs is one a build ahead made that no record names, affected removes
    them (one line) and has nothing built to judge: two lines naming the JIT dirs, with the first build it
    needs (auto, with the pinned release and a prebuilt set in the tree: vendored)."""
    require("filelock", why="a module is removed under its own lock (filelock comes with torch in flashinfer-dev)")
    tree, root, _, env = ws
    base = tmp_path / "ahead"
    dirs = [base / ".cache/flashinfer" / pins().flashinfer / arch / "cached_ops" for arch in ("100a", "90a")]
    for jit_dir in dirs:
        build_module(jit_dir, "ahead_only", [tree / "csrc/other.cc"], tree)
        build_records.mark_built_ahead(jit_dir / "ahead_only")
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    release_reference.record_release(tree)
    (tree / "flashinfer/data/aot/norm").mkdir(parents=True)
    done = affected(root, {**env, "FLASHINFER_WORKSPACE_BASE": str(base)})
    assert "affected: 2 module(s) built ahead that no test loaded" in done.stdout, done.stdout + done.stderr
    two_line_failure(done, f"nothing is built yet in {dirs[0]}, {dirs[1]}")
    assert done.stderr.strip().splitlines()[-1].strip().startswith(AUTO_FIX), done.stderr
    assert not any((jit_dir / "ahead_only").exists() for jit_dir in dirs)


def test_an_unreadable_build_stamp_is_two_lines(ws):
    _, root, _, env = ws
    stamp = workspace.read(pins().flashinfer).build_stamp({"wide": False, "abi": False})
    stamp.write_text(stamp.read_text()[:30])
    done = affected(root, env)
    two_line_failure(done, "cannot be read (truncated?), so affected cannot tell which built modules are smoke's")
    assert done.stderr.strip().endswith(
        "fix: run the build again, which rewrites it: pixi run -e flashinfer-dev build (and build-abi for abi-smoke's "
        "modules)"
    )


@pytest.mark.parametrize(
    "text",
    [
        '{"schema": "fidev-affected-verdicts/1", "modu',
        "[]",
        '{"schema": "fidev-affected-verdicts/1", "modules": []}',
        '{"schema": "fidev-affected-verdicts/1", "modules": {"norm": {"inputs": 1}}}',
        '{"schema": "fidev-affected-verdicts/1", "modules": {"norm": {"inputs": "x", "result": "maybe", '
        '"when": "t", "tests": [], "failed": []}}}',
        '{"schema": "fidev-affected-verdicts/1", "modules": {}, "uncovered": {"csrc/x.cu": {"was": 5}}}',
    ],
)
def test_unreadable_kept_verdicts_are_said_and_every_module_is_tested_again(ws, text):
    """A kept verdict that cannot be read may have been a failure: it is named, with what affected
    does instead, and every built module is taken as changed (rebuilt, its tests run), never
    "nothing changed"."""
    _, root, _, env = ws
    verdicts = workspace.read(pins().flashinfer).verdicts
    verdicts.parent.mkdir(parents=True, exist_ok=True)
    verdicts.write_text(text)
    done = affected(root, env, "--list")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    said = next(
        (line for line in done.stdout.splitlines() if line.startswith("affected: ") and str(verdicts) in line), ""
    )
    assert "cannot be read" in said or "is not affected's kept verdicts" in said, done.stdout
    assert said.endswith("every built module is taken as changed: rebuilt, and its tests run"), said
    assert "nothing changed" not in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("(affected's kept verdicts cannot be read"))
    assert "norm, norm_upstream" in row, done.stdout


def test_unreadable_kept_verdicts_leave_an_edit_no_module_compiles_with_no_module(ws):
    """Every module is tested again, and still an edit no built module compiles is said as one (its
    families named), not mapped to every module as where a module's own record cannot be read."""
    tree, root, jit_dir, env = ws
    (tree / "csrc/page.cu").write_text('#include "flashinfer/page.cuh"\n')
    (tree / "include/flashinfer/page.cuh").write_text("constexpr int P = 1;\n")
    module_builds.record_build(jit_dir / "norm", jit_dir / "norm/build.ninja", tree=tree)
    (tree / "include/flashinfer/page.cuh").write_text("constexpr int P = 2;\n")
    verdicts = workspace.read(pins().flashinfer).verdicts
    verdicts.parent.mkdir(parents=True, exist_ok=True)
    verdicts.write_text("[]")
    done = affected(root, env, "--list")
    assert any(
        line.startswith("include/flashinfer/page.cuh") and "no built module" in line
        for line in done.stdout.splitlines()
    ), done.stdout


def test_a_run_over_unreadable_kept_verdicts_tests_every_module_and_writes_them_whole(ws):
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    from fidev.affected import verdicts as kept_verdicts

    _, root, _, env = ws
    verdicts = workspace.read(pins().flashinfer).verdicts
    verdicts.parent.mkdir(parents=True, exist_ok=True)
    verdicts.write_text('{"schema": "fidev-affected-verdicts/1", "modu')
    done = affected(root, env)
    assert done.returncode == 1 and "affected: 2 module(s) rebuilt in" in done.stdout, done.stdout + done.stderr
    kept = kept_verdicts.Kept(verdicts)
    assert kept.problem is None and {v.result for v in kept.modules.values()} == {"failed"}, (
        kept.modules
    )  # the tests skipped: no pass


def test_a_kept_gap_keeps_its_content_before_the_edit_until_it_is_covered(tmp_path):
    """keep_gaps: a file still untested keeps the content it had before its first untested edit
    (not the tree's record as of a later run); one the run covered goes; a reverted one that a tree
    record still holds as edited stays, so that it is not taken as a new edit."""
    from fidev.affected import verdicts as kept_verdicts

    path = tmp_path / "fidev-affected.json"
    kept = kept_verdicts.Kept(path)
    kept.keep_gaps(
        {"include/a.cuh": ["page"], "include/b.cuh": ["rope"]},
        {"include/a.cuh": [1, 2, "a0"], "include/b.cuh": None},
        set(),
    )
    kept.record({})
    kept = kept_verdicts.Kept(path)
    assert kept.problem is None and {rel: (g.was, g.families) for rel, g in kept.gaps.items()} == {
        "include/a.cuh": ([1, 2, "a0"], ["page"]),
        "include/b.cuh": (None, ["rope"]),
    }
    kept.keep_gaps({"include/a.cuh": ["page"]}, {"include/a.cuh": [3, 4, "a1"]}, set())  # b covered
    assert {rel: g.was for rel, g in kept.gaps.items()} == {"include/a.cuh": [1, 2, "a0"]}
    kept.keep_gaps({}, {}, {"include/a.cuh"})  # reverted, and a tree record still holds the edit
    assert set(kept.gaps) == {"include/a.cuh"}
    kept.keep_gaps({}, {}, set())
    assert kept.gaps == {}


def test_a_failure_is_matched_to_the_tests_that_select_it():
    """One match for the table and the kept verdicts: a case of a selected function, the node id
    itself, or its file when that did not collect or finish; never a function that merely shares a
    prefix."""
    from fidev.affected.coverage import failures_of

    chosen = {"tests/utils/test_norm.py::test_norm", "tests/smoke/test_kernels.py::test_rmsnorm"}
    failed = {
        "tests/utils/test_norm.py::test_norm[dtype0-4096]",
        "tests/smoke/test_kernels.py::test_rmsnorm",
        "tests/utils/test_norm.py",
        "tests/utils/test_norm.py::test_norm_fused[1]",
        "tests/utils/test_page.py::test_page",
    }
    assert failures_of(failed, chosen) == [
        "tests/smoke/test_kernels.py::test_rmsnorm",
        "tests/utils/test_norm.py",
        "tests/utils/test_norm.py::test_norm[dtype0-4096]",
    ]
    # a reached family's test file, selected whole: each failing case of it is its failure
    assert failures_of(
        {"tests/attention/test_rope.py::test_rope[1]", "tests/attention/test_rope_x.py::test_rope[1]"},
        {"tests/attention/test_rope.py"},
    ) == ["tests/attention/test_rope.py::test_rope[1]"]


@pytest.mark.parametrize("text", ['{"include/flashinfer/norm.cuh": [1, 2', '["include/flashinfer/norm.cuh"]'])
def test_an_unreadable_tree_record_is_said_and_no_pass(ws, text):
    """The JIT dir's record of include/ and csrc/ is what tells an edit no built module compiles:
    where it cannot be read, such an edit may reach any kernel family, so the run is not covered
    (3), never "nothing changed"."""
    _, root, jit_dir, env = ws
    record = jit_dir.parent / workspace.TREE
    record.write_text(text)
    done = affected(root, env)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert (
        f"affected: {record} cannot be read (truncated, or of another shape): an edit of include/ or csrc/ "
        "that no built module compiles cannot be told" in done.stdout
    ), done.stdout
    assert "nothing changed" not in done.stdout and "affected: not a pass: " in done.stdout


def test_a_second_affected_run_on_one_workspace_is_refused_in_two_lines_and_loses_no_kept_verdict(ws, tmp_path):
    """Two affected runs at once on one workspace would rebuild the same modules and write over each
    other's kept verdicts: while one holds the workspace's lock (fidev.core.files.exclusive, the
    version folder's AFFECTED_LOCK), the other is refused in two lines naming it, and the kept
    verdicts stay as the first leaves them; a run that ends leaves no lock file behind."""
    from fidev.core import files

    tree, root, _, env = ws
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    assert affected(root, env, "--list").returncode == 0
    here = workspace.read(pins().flashinfer)
    verdicts_before = here.verdicts.read_bytes() if here.verdicts.exists() else None
    busy = Failure("held by the test ({})", "wait")
    with files.exclusive(here.affected_lock, "the first affected run", busy, lambda e: Failure(str(e), "fix")):
        done = affected(root, env, "--summary", str(tmp_path / "second.json"))
        two_line_failure(done, "another affected run is judging the builds in")
        problem, fix = done.stderr.splitlines()[-2:]  # word for word
        assert problem.startswith(f"error: another affected run is judging the builds in {here.version_dir} (the ")
        assert "(the first affected run, pid" in problem and problem.endswith(
            "): two at once would rebuild the same modules and keep each other's verdicts"
        ), problem
        assert fix == "  fix: wait for it to end, then run this again", fix
        assert (here.verdicts.read_bytes() if here.verdicts.exists() else None) == verdicts_before
    assert affected_summary.read(tmp_path / "second.json").verdict == "error"
    done = affected(root, env, "--list")
    assert done.returncode == 0 and not here.affected_lock.exists(), done.stdout + done.stderr


def test_a_run_refused_while_another_affected_run_rebuilds_names_it_by_its_pid(ws, tmp_path):
    """The lock says who holds it: a run (--list too) while another rebuilds (its compile blocked on a FIFO) is
    refused naming affected and that run's pid."""
    require("filelock", why="the build takes FlashInfer's JIT-dir lock (filelock comes with torch in flashinfer-dev)")
    tree, root, _, env = ws
    other, _ = norm_edit_with_a_blocked_compile(tree, tmp_path)
    proc = affected_in_its_session(root, env)
    try:
        wait_until(lambda: compiling(proc.pid, str(other)), 120, "norm_upstream's compile started", proc)
        second = affected(root, env, "--list")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        said = proc.communicate(timeout=30)[0]
    two_line_failure(second, "another affected run is judging the builds in")
    assert f"(affected, pid {proc.pid}): two at once" in second.stderr, said + second.stderr


def test_a_lock_affected_cannot_write_is_refused_in_two_lines(ws):
    """The workspace's lock cannot be opened (here a folder holds its name; a read-only version folder alike):
    two lines, word for word, naming the folder and why, and where the JIT dir's folder is set."""
    _, root, _, env = ws
    here = workspace.read(pins().flashinfer)
    here.affected_lock.mkdir(parents=True)
    done = affected(root, env, "--list")
    two_line_failure(done, "cannot write affected's lock in")
    assert done.stderr.splitlines()[-2:] == [
        f"error: cannot write affected's lock in {here.version_dir} (Is a directory)",
        "  fix: make the JIT dir's folder writable (FLASHINFER_WORKSPACE_BASE names where it is)",
    ], done.stderr


def test_a_summary_written_before_the_compile_counts_reads_back_with_none(tmp_path):
    """compiled and compiled_twice came within the summary's version 1: a summary without them is read
    with none, every other field still required."""
    path = tmp_path / "affected.json"
    affected_summary.write(affected_summary.Summary(verdict="passed", status=0, compiled={"norm": 2}), path)
    data = json.loads(path.read_text())
    del data["compiled"], data["compiled_twice"]
    path.write_text(json.dumps(data))
    record = affected_summary.read(path)
    assert (record.verdict, record.compiled, record.compiled_twice) == ("passed", {}, [])
    del data["seconds"]
    path.write_text(json.dumps(data))
    with pytest.raises(Failure, match="lacks seconds"):
        affected_summary.read(path)


def test_a_module_only_a_build_ahead_made_and_no_record_names_is_removed_not_judged(ws):
    """Seen on a GPU host: upstream-tests' plan built a module ahead for a case that then never loaded it,
    and no record names a test of it, so every edit that reached it ended `not covered`. affected removes
    such a module (it carries the plan's mark: fidev.records.build_records.mark_built_ahead) in one line,
    `--list` only leaves it out, and both judge what is left; a module with the mark that the record
    names, and one without the mark (built by anyone else) with no test recorded, stay, the latter still
    a gap."""
    require("filelock", why="a module is removed under its own lock (filelock comes with torch in flashinfer-dev)")
    tree, root, jit_dir, env = ws
    for name in ("ahead_only", "user_built"):  # both compile other.cc, as norm_upstream does
        build_module(jit_dir, name, [tree / "csrc/other.cc"], tree)
    build_records.mark_built_ahead(jit_dir / "ahead_only")
    build_records.mark_built_ahead(jit_dir / "norm_upstream")  # recorded: its test runs for an edit
    (tree / "csrc/other.cc").write_text('#include "flashinfer/other.cuh"\nint g() { return J + 1; }\n')
    for args, what in ((["--list"], "left out"), ([], "removed again")):  # --list changes nothing
        done = affected(root, env, *args)
        said = [line for line in done.stdout.splitlines() if "built ahead that no test loaded" in line]
        assert len(said) == 1 and said[0].startswith("affected: 1 module(s)") and what in said[0], done.stdout
        assert said[0].endswith(": ahead_only"), said
        assert (jit_dir / "ahead_only").exists() == (what == "left out")
        assert (jit_dir / "user_built/user_built.so").is_file() and (
            jit_dir / "norm_upstream/norm_upstream.so"
        ).is_file()
        row = next(line for line in done.stdout.splitlines() if "other.cc" in line)
        assert "ahead_only" not in done.stdout.replace(said[0], ""), done.stdout
        assert "norm_upstream" in row and "user_built" in row, done.stdout
        assert "affected: no test is recorded for user_built:" in done.stdout, done.stdout


def test_a_record_that_names_a_module_built_ahead_clears_its_mark_for_good(tmp_path):
    """A module built ahead that a run's record names is a module a test loaded: its mark goes, so that a
    later record that no longer names it leaves a real gap (not covered), never a removal; and a module
    whose lock another holds (a test loading it, a build) is left as it is."""
    require("filelock", why="a module is removed under its own lock (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock

    jit_dir = tmp_path / "cached_ops"
    for name in ("loaded", "locked"):
        (jit_dir / name).mkdir(parents=True)
        (jit_dir / name / f"{name}.so").write_text("")
        build_records.mark_built_ahead(jit_dir / name)
    test = "tests/attention/test_batch_prefill_kernels.py::test_case[ALIBI-30.0]"
    build_records.add_module_tests(jit_dir, [{"test_name": test, "module_name": "loaded"}], whole=True)
    assert not (jit_dir / "loaded" / workspace.AHEAD).exists()
    build_records.add_module_tests(jit_dir, [{"test_name": test, "module_name": "other"}], whole=True)
    assert "loaded" not in build_records.module_tests(jit_dir)  # the test loads something else now
    said = []
    lock = FileLock(workspace.module_lock(jit_dir / "locked"), thread_local=False)
    workspace.module_lock(jit_dir / "locked").parent.mkdir(parents=True, exist_ok=True)
    with lock:
        held = module_builds.drop_unrecorded_ahead([jit_dir / "loaded", jit_dir / "locked"], said.append)
    assert held == [] and said == [] and (jit_dir / "loaded").is_dir() and (jit_dir / "locked").is_dir()
    assert module_builds.drop_unrecorded_ahead([jit_dir / "loaded", jit_dir / "locked"], said.append) == ["locked"]
    assert len(said) == 1 and (jit_dir / "loaded/loaded.so").is_file() and not (jit_dir / "locked").exists()


def test_a_module_the_record_names_is_kept_though_a_build_ahead_made_it_again(tmp_path):
    """The plan marks what it builds ahead before the build starts, the JIT dir made with it where no build
    made one yet; a module the record names a test of already (built ahead again, its folder removed since)
    has a test to run for an edit: it is kept, and only the one no record names goes."""
    require("filelock", why="a module is removed under its own lock (filelock comes with torch in flashinfer-dev)")
    jit_dir = tmp_path / "90" / "cached_ops"
    build_records.mark_built_ahead(jit_dir / "ahead_only")
    test = "tests/utils/test_norm.py::test_norm[dtype0-4096]"
    build_records.add_module_tests(jit_dir, [{"test_name": test, "module_name": "norm"}], whole=True)
    build_records.mark_built_ahead(jit_dir / "norm")
    removed = module_builds.drop_unrecorded_ahead([jit_dir / "norm", jit_dir / "ahead_only"], lambda line: None)
    assert removed == ["ahead_only"] and (jit_dir / "norm").is_dir() and not (jit_dir / "ahead_only").exists()


def test_removing_what_was_built_ahead_leaves_held_modules_at_once_and_goes_on_past_one_it_cannot_remove(tmp_path):
    """drop_unrecorded_ahead leaves a module whose lock another holds at once, without waiting for its holder
    (a test may load it for minutes), and goes on to the next; a folder it cannot remove (here a link to one
    elsewhere, which rmtree refuses) is left and not named, the folder linked to untouched; its one line
    names what went."""
    require("filelock", why="a module is removed under its own lock (filelock comes with torch in flashinfer-dev)")
    from filelock import FileLock

    jit_dir = tmp_path / "cached_ops"
    held = [jit_dir / f"held_{i}" for i in range(3)]
    elsewhere = tmp_path / "elsewhere" / "linked"
    for folder in [*held, jit_dir / "alpha", jit_dir / "beta", elsewhere]:
        build_records.mark_built_ahead(folder)
    (jit_dir / "linked").symlink_to(elsewhere, target_is_directory=True)
    workspace.module_lock(held[0]).parent.mkdir(parents=True, exist_ok=True)
    locks = [FileLock(workspace.module_lock(folder), thread_local=False) for folder in held]
    said = []
    for lock in locks:
        lock.acquire()
    try:
        started = time.perf_counter()
        removed = module_builds.drop_unrecorded_ahead(
            [*held, jit_dir / "linked", jit_dir / "alpha", jit_dir / "beta"], said.append
        )
        took = time.perf_counter() - started
    finally:
        for lock in locks:
            lock.release()
    assert removed == ["alpha", "beta"] and took < 2, (removed, took)
    assert all(folder.is_dir() for folder in held) and (jit_dir / "linked").is_symlink()
    assert (elsewhere / workspace.AHEAD).is_file()
    assert len(said) == 1 and said[0].startswith("2 module(s) built ahead that no test loaded"), said
    assert said[0].endswith(": alpha, beta"), said


def test_affected_removes_what_only_a_build_ahead_made_in_each_jit_dir_but_smokes_modules(tmp_path, capsys):
    """fidev.affected.built.drop_unrecorded_ahead, before anything is judged, over each JIT dir's folders:
    returns those removed, said in one line of affected's; smoke's modules (by name) are kept though they
    carry the mark, as smoke's tests are their tests, and a folder without the mark is kept."""
    require("filelock", why="a module is removed under its own lock (filelock comes with torch in flashinfer-dev)")
    from fidev.affected import built

    dirs = [tmp_path / "90" / "cached_ops", tmp_path / "100" / "cached_ops"]
    for folder in (dirs[0] / "norm", dirs[0] / "ahead_only", dirs[1] / "also_ahead"):
        build_records.mark_built_ahead(folder)
    (dirs[1] / "user_built").mkdir()
    assert built.drop_unrecorded_ahead(dirs, {"norm"}) == {dirs[0] / "ahead_only", dirs[1] / "also_ahead"}
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("affected: 2 module(s) built ahead that no test loaded"), lines
    assert lines[0].endswith(": ahead_only, also_ahead"), lines
    assert (dirs[0] / "norm").is_dir() and (dirs[1] / "user_built").is_dir()
