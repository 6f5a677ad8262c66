"""What makes a module rebuild: a real ninja and C++ compiler, a module shaped like FlashInfer's
(an object from a source that includes a header, linked into a .so), and fidev.records.ninja_inputs,
which catches the restored copy that ninja's mtime check misses."""

import os
import shutil
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from fidev.core import workspace
from fidev.records import ninja_inputs
from script_runs import BUILD_TOOLS, require_tools

require_tools(*BUILD_TOOLS, why="these tests build real ninja modules")


def write_module(root, sources: dict[str, str], relative: bool = False) -> None:
    """A module shaped like FlashInfer's: k.h, each source (name: text) compiled to its object with a
    depfile, the objects linked into m.so. `relative`: the objects named relative to the module's
    folder, where ninja runs, in objs/ (FlashInfer names them by absolute paths; a build.ninja may not)."""
    (root / "k.h").write_text("constexpr int K = 1;\n")
    for name, text in sources.items():
        (root / name).write_text(text)
    objects = [f"{'objs' if relative else root}/{Path(name).stem}.o" for name in sources]
    (root / "build.ninja").write_text(
        "rule cxx\n  command = c++ -fPIC -MMD -MF $out.d -c $in -o $out\n  depfile = $out.d\n  deps = gcc\n"
        "rule link\n  command = c++ -shared $in -o $out\n"
        + "".join(f"build {obj}: cxx {root}/{name}\n" for obj, name in zip(objects, sources, strict=True))
        + f"build {root}/m.so: link {' '.join(objects)}\ndefault {root}/m.so\n"
    )


@pytest.fixture
def module(tmp_path):
    write_module(tmp_path, {"m.cpp": '#include "k.h"\nint f() { return K; }\n'})
    return tmp_path


def build(root):
    """What build.py does around each module's ninja: invalidate the stale objects, mark the start,
    build, record (which clears the mark)."""
    ninja_inputs.invalidate(root, ninja_inputs.stale(root))
    ninja_inputs.begin(root)
    out = subprocess.run(["ninja", "-C", str(root)], capture_output=True, text=True, check=True).stdout
    ninja_inputs.record(root, root / "build.ninja")
    return "no work to do" not in out  # whether anything was compiled


def test_an_edit_rebuilds_and_a_repeat_does_not(module):
    assert build(module)
    assert not build(module)  # nothing changed: ninja has no work
    (module / "k.h").write_text("constexpr int K = 2;\n")  # an edit: newer than the object
    assert build(module)


def test_a_restored_older_header_rebuilds_only_with_the_guard(module):
    header = module / "k.h"
    build(module)
    old = header.read_bytes(), header.stat().st_mtime_ns
    header.write_text("constexpr int K = 2;  // the edit\n")
    build(module)  # built from the edit
    header.write_bytes(old[0])
    os.utime(header, ns=(old[1], old[1]))  # what `cp -p` or `mv` of the saved copy leaves: the old mtime
    plain = subprocess.run(["ninja", "-C", str(module), "-n"], capture_output=True, text=True).stdout
    assert "no work to do" in plain  # ninja alone would keep the module built from the edit
    assert ninja_inputs.restored(module) == {f"{module}/m.o": [str(header)]}
    assert build(module)
    assert ninja_inputs.restored(module) == {}


def test_objects_of_a_build_that_did_not_finish_compile_again_after_a_restored_copy(module):
    """A build stopped after some objects compiled (affected's first failure stops its rebuild) leaves
    them compiled from the edit, newer than the inputs, with the record still the last finished
    build's: restore the older copy with `cp -p` and neither ninja nor `restored` sees that the object
    holds the edit (seen on a GPU host: a restored tree failing smoke). The mark `begin` left does."""
    header = module / "k.h"
    build(module)
    old = header.read_bytes(), header.stat().st_mtime_ns
    header.write_text("constexpr int K = 2;  // the edit\n")
    ninja_inputs.invalidate(module, ninja_inputs.stale(module))
    ninja_inputs.begin(module)
    subprocess.run(["ninja", "-C", str(module), f"{module}/m.o"], capture_output=True, check=True)  # then stopped
    compiled_from_the_edit = (module / "m.o").stat().st_mtime_ns
    header.write_bytes(old[0])
    os.utime(header, ns=(old[1], old[1]))  # the saved copy back, its old mtime
    plain = subprocess.run(["ninja", "-C", str(module), "-n", "-v"], capture_output=True, text=True).stdout
    assert " -c " not in plain  # ninja alone would only link the object compiled from the edit again
    assert ninja_inputs.restored(module) == {}  # the record is the finished build's, which the copy matches
    assert ninja_inputs.unfinished(module) == [f"{module}/m.o"]
    assert ninja_inputs.stale(module) == {f"{module}/m.o": "compiled by a build that did not finish"}
    assert ninja_inputs.edited(module) == {"(objects of a build of it that did not finish)": "edited"}
    assert ninja_inputs.dry_run(module, module / "build.ninja")[0] == {f"{module}/m.o"}
    assert build(module)
    assert (module / "m.o").stat().st_mtime_ns > compiled_from_the_edit
    assert not (module / ninja_inputs.BUILDING).exists()
    assert ninja_inputs.unfinished(module) == [] and ninja_inputs.edited(module) == {}
    assert not build(module)


def test_a_build_that_never_finished_one_has_its_objects_found_without_a_record(module):
    """The first build of a module stopped midway: no record names its objects, which are found in
    its folder; one written in the mark's own clock tick counts, one older than the mark does not."""
    ninja_inputs.begin(module)
    subprocess.run(["ninja", "-C", str(module), f"{module}/m.o"], capture_output=True, check=True)
    assert not (module / ninja_inputs.STAMP).exists()
    assert ninja_inputs.unfinished(module) == [f"{module}/m.o"]
    mark = (module / ninja_inputs.BUILDING).stat().st_mtime_ns
    os.utime(module / "m.o", ns=(mark, mark))
    assert ninja_inputs.unfinished(module) == [f"{module}/m.o"]
    os.utime(module / "m.o", ns=(mark - 1, mark - 1))
    assert ninja_inputs.unfinished(module) == []


def test_a_first_build_marks_a_folder_not_made_yet_and_a_mark_whose_time_cannot_be_read_counts_every_object(
    tmp_path,
):
    """begin makes the module's folder where there is none yet (the first build in a JIT dir no build made
    yet); a mark there whose time cannot be read (a link to itself here) leaves what every object was
    compiled from unknown, however old the object (one dated 1970, as an archive without times leaves it)."""
    module = tmp_path / "90" / "cached_ops" / "m"
    ninja_inputs.begin(module)
    assert (module / ninja_inputs.BUILDING).is_file()
    for name in ("old.o", "new.o"):
        (module / name).write_text("")
    os.utime(module / "old.o", ns=(0, 0))
    (module / ninja_inputs.BUILDING).unlink()
    (module / ninja_inputs.BUILDING).symlink_to(ninja_inputs.BUILDING)
    assert ninja_inputs.unfinished(module) == [f"{module}/new.o", f"{module}/old.o"]


def test_objects_named_relative_to_the_module_are_found_in_its_folder(tmp_path):
    """A build.ninja may name its objects relative to the module's folder (ninja's deps log names them
    so): those of a build that did not finish are found there, below its top too, and compile again; an
    input saved while its object compiled (newer than it) is recorded as not known, an edit."""
    write_module(tmp_path, {"m.cpp": '#include "k.h"\nint f() { return K; }\n'}, relative=True)
    obj, header = tmp_path / "objs/m.o", tmp_path / "k.h"
    assert build(tmp_path)
    ninja_inputs.begin(tmp_path)
    mark = (tmp_path / ninja_inputs.BUILDING).stat().st_mtime_ns
    os.utime(obj, ns=(mark, mark))  # compiled by the build begun, which then stopped
    assert ninja_inputs.unfinished(tmp_path) == [str(obj)]
    assert ninja_inputs.stale(tmp_path) == {str(obj): "compiled by a build that did not finish"}
    assert build(tmp_path) and not (tmp_path / ninja_inputs.BUILDING).exists()
    header.write_text("constexpr int K = 2;  // saved as m.o compiled\n")
    later = obj.stat().st_mtime_ns + 10**9
    os.utime(header, ns=(later, later))
    ninja_inputs.record(tmp_path, tmp_path / "build.ninja")
    assert ninja_inputs.edited(tmp_path) == {str(header): "edited"}


def test_a_header_saved_while_its_build_ran_is_compiled_again_though_older_than_its_object(module):
    """A header saved after the build began, once the compiler had read it, is older than the object it
    went into: ninja 1.11 sees nothing newer, and a hash taken now is not what was compiled. The record
    leaves its hash out, `affected` takes it as edited, and the next build compiles the object again, then
    records it whole. One saved in the mark's own clock tick, before any compiler started, is known."""
    assert build(module)
    obj, header = module / "m.o", module / "k.h"
    for saved_after_start_ns, known in ((0, True), (10**6, False)):
        ninja_inputs.begin(module)
        mark = (module / ninja_inputs.BUILDING).stat().st_mtime_ns
        header.write_text(f"constexpr int K = {3 + known};  // saved as m.o compiled\n")
        os.utime(header, ns=(mark + saved_after_start_ns,) * 2)
        os.utime(obj, ns=(mark + 10**9,) * 2)  # the object written after the save
        ninja_inputs.record(module, module / "build.ninja")
        if known:
            assert ninja_inputs.edited(module) == {} and ninja_inputs.stale(module) == {}
            continue
        assert ninja_inputs.edited(module) == {str(header): "edited"}
        assert ninja_inputs.stale(module) == {str(obj): "k.h was saved while it compiled"}
        assert build(module)  # compiled again, though no input is newer than the object
        assert ninja_inputs.edited(module) == {} and ninja_inputs.stale(module) == {}
        assert not build(module)


def test_a_build_whose_inputs_ninja_cannot_list_is_left_without_a_record_and_finished(module, monkeypatch):
    """Where ninja cannot list the objects' inputs (not on the PATH a test in this process left), a
    finished build leaves no record, the first build of the module as a later one, and clears its mark."""
    for built_before in (False, True):
        if built_before:
            assert build(module) and (module / ninja_inputs.STAMP).is_file()
        ninja_inputs.begin(module)
        with monkeypatch.context() as patched:
            patched.setenv("PATH", str(module / "no-tools"))
            ninja_inputs.record(module, module / "build.ninja")
        assert not (module / ninja_inputs.STAMP).exists() and not (module / ninja_inputs.BUILDING).exists()


def test_a_combined_build_makes_the_modules_own_folder_compile_again(module):
    """Why build and upstream-tests never build through FlashInfer's `build_jit_specs`, which runs
    one ninja over a `subninja` of each module's build.ninja from the JIT dir's root
    (flashinfer/jit/core.py at v0.6.3): that ninja keeps its logs at the root, so it compiles the
    module again, and the module's own folder then finds its deps records older than the object
    ("stored deps info out of date") and compiles it a third time (seen with ninja 1.11.1)."""
    assert build(module)
    combined = module.parent / "combined.ninja"
    combined.write_text(f"ninja_required_version = 1.3\nsubninja {module}/build.ninja\n")
    again = subprocess.run(
        ["ninja", "-C", str(module.parent), "-f", str(combined)], capture_output=True, text=True, check=True
    ).stdout
    assert "no work to do" not in again  # the combined build compiled what was built
    explain = subprocess.run(
        ["ninja", "-C", str(module), "-n", "-d", "explain"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ).stdout
    assert "stored deps info out of date" in explain and "no work to do" not in explain


def test_dry_run_names_what_a_build_would_compile(module):
    """fidev.records.ninja_inputs.dry_run, which build's no-op check (build_stamp.has_work) and the
    upstream-tests plan's estimate share: the objects, and the edges with the link."""
    never = ninja_inputs.dry_run(module, module / "build.ninja")
    assert never == ({f"{module}/m.o"}, 2)  # compile and link
    build(module)
    assert ninja_inputs.dry_run(module, module / "build.ninja") == (set(), 0)
    header = module / "k.h"
    old = header.read_bytes(), header.stat().st_mtime_ns
    header.write_text("constexpr int K = 2;\n")
    assert ninja_inputs.dry_run(module, module / "build.ninja") == ({f"{module}/m.o"}, 2)
    build(module)
    header.write_bytes(old[0])
    os.utime(header, ns=(old[1], old[1]))  # `cp -p` of the saved copy: ninja alone sees nothing
    assert ninja_inputs.dry_run(module, module / "build.ninja") == ({f"{module}/m.o"}, 0)
    (module / "build.ninja").write_text("this is not ninja\n")
    assert ninja_inputs.dry_run(module, module / "build.ninja") is None


def test_the_compile_log_counts_each_object_a_run_compiled_and_names_one_compiled_twice(tmp_path):
    """fidev.records.compile_log reads what ninja appended to each module's .ninja_log since the run
    began: an object counted once per compile, a link not counted, and a log rewritten meanwhile (it
    shrank, or is another file) not known."""
    from fidev.records import compile_log

    if shutil.which("ninja") is None:
        pytest.skip("needs ninja")
    module = tmp_path / "cached_ops" / "norm"
    module.mkdir(parents=True)
    (module / "build.ninja").write_text(
        "rule cc\n  command = cp $in $out\nrule link\n  command = cp $in $out\n"
        "build norm.o: cc norm.cu\nbuild norm.so: link norm.o\n"
    )
    (module / "norm.cu").write_text("1\n")
    (tmp_path / "cached_ops" / "empty").mkdir()
    jit_dirs = [tmp_path / "cached_ops"]
    before = compile_log.sizes(jit_dirs)
    ninja = ["ninja", "-C", str(module)]
    subprocess.run(ninja, check=True, capture_output=True)
    assert compile_log.compiled_since(jit_dirs, before) == {"norm": {"norm.o": 1}}
    (module / "norm.cu").write_text("2\n")
    subprocess.run(ninja, check=True, capture_output=True)
    found = compile_log.compiled_since(jit_dirs, before)
    assert found == {"norm": {"norm.o": 2}} and compile_log.twice(found) == ["norm"]
    later = compile_log.sizes(jit_dirs)
    (module / ".ninja_log").write_text("# ninja log v5\n")  # recompacted
    assert compile_log.compiled_since(jit_dirs, later) == {"norm": None} and compile_log.twice({"norm": None}) == [
        "norm"
    ]
    later = compile_log.sizes(jit_dirs)
    rewritten = module / "log.new"  # another file, written whole and renamed over the log, grown past its size
    rewritten.write_text("# ninja log v5\n" + "0\t1\t0\tnorm.o\tabc\n" * 3)
    rewritten.replace(module / ".ninja_log")
    assert compile_log.compiled_since(jit_dirs, later) == {"norm": None}


def test_a_dry_runs_records_add_to_what_is_known_and_a_runs_say_what_a_test_needs_now(tmp_path):
    """fidev.records.build_records.add_module_tests: the plan's dry run names only the first module a
    test loads, so where the record names it already, what it knows beyond stays; of a test a run
    recorded it only adds. A run's name every module its tests loaded (whole): they say what those
    tests need."""
    from fidev.records import build_records

    jit_dir = tmp_path / "90" / "cached_ops"
    case, other = "tests/t.py::test_a[1]", "tests/t.py::test_b"

    def line(test, module):
        return {"test_name": test, "module_name": module, "spec_info": "None"}

    build_records.add_module_tests(jit_dir, [line(case, "page"), line(case, "silu"), line(other, "rope")], whole=True)
    build_records.add_module_tests(jit_dir, [line(case, "page")])  # a dry run: the first module alone
    assert build_records.module_tests(jit_dir) == {"page": [case], "rope": [other], "silu": [case]}
    build_records.add_module_tests(jit_dir, [line(other, "norm")])  # a dry run: a module the run found loaded
    assert build_records.module_tests(jit_dir) == {"norm": [other], "page": [case], "rope": [other], "silu": [case]}
    build_records.add_module_tests(jit_dir, [line(case, "norm")], whole=True)  # a run: what it needs now
    assert build_records.module_tests(jit_dir) == {"norm": [case, other], "rope": [other]}


def test_a_dry_run_only_adds_to_what_a_run_recorded_of_a_test(tmp_path):
    """A run records no module a case found loaded already (an earlier case of its process loaded
    `page`, FlashInfer's functools cache kept it), so a later dry run, whose first module is `page`,
    must not take `page` for all the test needs: the test stays recorded for its own module, which
    affected's sample must exercise. (On the H200 a restore failed where the dry run had dropped them.)"""
    from fidev.records import build_records

    jit_dir = tmp_path / "90" / "cached_ops"
    first, second = "tests/t.py::test_a[1]", "tests/t.py::test_a[2]"

    def line(test, module):
        return {"test_name": test, "module_name": module, "spec_info": "None"}

    run = [line(first, "page"), line(first, "prefill_alibi"), line(second, "prefill_rope")]  # page cached for second
    build_records.add_module_tests(jit_dir, run, whole=True)
    build_records.add_module_tests(jit_dir, [line(first, "page"), line(second, "page")])  # the dry run's firsts
    assert build_records.module_tests(jit_dir) == {
        "page": [first, second],
        "prefill_alibi": [first],
        "prefill_rope": [second],
    }
    unrun = "tests/t.py::test_b"  # no run recorded it: a dry run's first module that differs replaces it
    build_records.add_module_tests(jit_dir, [line(unrun, "rope")])
    build_records.add_module_tests(jit_dir, [line(unrun, "norm")])
    assert build_records.module_tests(jit_dir)["norm"] == [unrun] and "rope" not in build_records.module_tests(jit_dir)
    assert build_records.tests_ran(jit_dir) == {first, second}
    (jit_dir.parent / "fidev-module-tests-ran.json").write_text("{not json")
    assert build_records.tests_ran(jit_dir) == set(), "unreadable: every test as one no run recorded"


def test_a_record_leaves_out_warmups_unknown_modules_and_entries_that_name_no_test_or_module(tmp_path):
    """Of a run's JIT report, only the entries that name a test and a module FlashInfer knows are recorded:
    a warmup's (fidev.upstream.plugin marks it: it names the test that came first, not one that needs the
    module), a module FlashInfer could not name (its conftest says "unknown"), and an entry without its
    test or its module add nothing, and no test of theirs counts as one a run recorded."""
    from fidev.records import build_records

    jit_dir = tmp_path / "90" / "cached_ops"
    test = "tests/t.py::test_a"
    entries = [
        {"test_name": test, "module_name": "page"},
        {"test_name": "tests/t.py::test_first", "module_name": "rope", "warmup": True},
        {"test_name": "tests/t.py::test_b", "module_name": "unknown"},
        {"test_name": "tests/t.py::test_c"},
        {"module_name": "norm"},
    ]
    build_records.add_module_tests(jit_dir, entries, whole=True)
    assert build_records.module_tests(jit_dir) == {"page": [test]}
    assert build_records.tests_ran(jit_dir) == {test}


def test_what_a_record_knows_of_a_test_is_replaced_by_a_run_and_kept_where_a_dry_run_cannot_tell(tmp_path):
    """A run says every module a test needs now, those it needed before too; a dry run's first module,
    known already, keeps what the record knows beyond it, though no run is known to have recorded the test
    (the list of those is gone); and where the record cannot be read, a dry run's module of a test a run
    recorded starts it again."""
    from fidev.core import workspace
    from fidev.records import build_records

    jit_dir = tmp_path / "90" / "cached_ops"
    case = "tests/t.py::test_a[1]"

    def line(module):
        return {"test_name": case, "module_name": module, "spec_info": "None"}

    build_records.add_module_tests(jit_dir, [line("page"), line("prefill"), line("rope")], whole=True)
    build_records.add_module_tests(jit_dir, [line("page"), line("prefill")], whole=True)  # it needs rope no more
    assert build_records.module_tests(jit_dir) == {"page": [case], "prefill": [case]}
    (jit_dir.parent / workspace.MODULE_TESTS_RAN).unlink()
    build_records.add_module_tests(jit_dir, [line("page")])  # a dry run: the first module alone
    assert build_records.module_tests(jit_dir) == {"page": [case], "prefill": [case]}
    build_records.add_module_tests(jit_dir, [line("page")], whole=True)
    (jit_dir.parent / workspace.MODULE_TESTS).write_text("{not json")
    build_records.add_module_tests(jit_dir, [line("norm")])
    assert build_records.module_tests(jit_dir) == {"norm": [case]}


def test_a_build_that_ran_any_command_is_recorded_however_fast(tmp_path, monkeypatch):
    """recording_build keeps what a module was built from whenever ninja ran a command (its log in the
    module's folder grew), not by the build's time: a compile-cache hit takes a fraction of a second,
    and a build left unrecorded would read as an edit, or a restored copy, to the next run."""
    from types import SimpleNamespace

    from fidev.builds import module_builds

    build_dir = tmp_path / "norm"
    build_dir.mkdir()
    (build_dir / "norm.so").write_text("")
    spec = SimpleNamespace(
        name="norm",
        build_dir=build_dir,
        ninja_path=build_dir / "build.ninja",
        jit_library_path=build_dir / "norm.so",
        sources=[],
        lock_path=tmp_path / "norm.lock",
    )
    recorded = []
    monkeypatch.setattr(module_builds, "record_build", lambda build_dir, ninja_file: recorded.append(build_dir))
    monkeypatch.setattr(module_builds.ninja_inputs, "stale", lambda build_dir: {})

    def ran_a_command(spec, verbose, need_lock=True):
        with open(spec.build_dir / ".ninja_log", "a") as log:
            log.write("0\t1\t0\tnorm.cuda.o\tabc\n")

    module_builds.recording_build(ran_a_command, lambda line: None)(spec, False, need_lock=False)
    assert recorded == [build_dir]
    assert not (build_dir / ninja_inputs.BUILDING).exists(), "a finished build clears its mark"
    module_builds.recording_build(lambda spec, verbose, need_lock=True: None, lambda line: None)(
        spec, False, need_lock=False
    )
    assert recorded == [build_dir], "a build with nothing to do is no compile"
    assert not (build_dir / ninja_inputs.BUILDING).exists()

    def failed(spec, verbose, need_lock=True):
        raise RuntimeError("Ninja build failed.")  # flashinfer/jit/cpp_ext.py, run_ninja, at v0.6.3

    with pytest.raises(RuntimeError):
        module_builds.recording_build(failed, lambda line: None)(spec, False, need_lock=False)
    assert (build_dir / ninja_inputs.BUILDING).exists(), "a build that did not finish leaves its mark"


def test_run_module_builds_marks_a_failed_build_and_compiles_its_objects_again_after_a_restore(tmp_path, monkeypatch):
    """run_module_builds (build's, affected's rebuild, the builds ahead of the tests) marks each build's
    start before its ninja runs and leaves the mark where the build fails: the object the failed
    build compiled from the edit is compiled again once the older copy is back, though its record
    and its mtime both say it is current."""
    from types import SimpleNamespace

    from fidev.builds import module_builds
    from fidev.core.failure import Failure

    root = tmp_path
    header = root / "k.h"
    write_module(
        root,
        {
            "a.cpp": '#include "k.h"\nint a() { return K; }\n',
            "b.cpp": '#include "k.h"\nstatic_assert(K == 1, "the edit breaks b");\n',
        },
    )
    spec = SimpleNamespace(name="m", build_dir=root, ninja_path=root / "build.ninja", sources=["a.cpp", "b.cpp"])
    monkeypatch.setattr(
        module_builds,
        "record_build",
        lambda build_dir, ninja_file, generators=None: ninja_inputs.record(build_dir, ninja_file),
    )
    said = []
    module_builds.run_module_builds([spec], said.append)
    assert not (root / ninja_inputs.BUILDING).exists()
    old = header.read_bytes(), header.stat().st_mtime_ns
    header.write_text("constexpr int K = 2;  // the edit\n")
    with pytest.raises(Failure):
        module_builds.run_module_builds([spec], said.append)  # b fails; a compiles from the edit (ninja -j 2)
    assert (root / ninja_inputs.BUILDING).exists()
    from_the_edit = (root / "a.o").stat().st_mtime_ns
    header.write_bytes(old[0])
    os.utime(header, ns=(old[1], old[1]))
    said.clear()
    module_builds.run_module_builds([spec], said.append)
    assert any("m/a.o: compiled by a build that did not finish: rebuilding it" in line for line in said), said
    assert (root / "a.o").stat().st_mtime_ns > from_the_edit
    assert not (root / ninja_inputs.BUILDING).exists()


@pytest.mark.parametrize("why", ["a folder where the mark goes", "permission denied"])
def test_a_module_folder_that_cannot_be_written_is_a_failure_in_two_lines(tmp_path, monkeypatch, why):
    """The mark of a build begun cannot be written (a folder stands where it goes; or the user cannot
    write the folder, as root here cannot be refused: the OS error made): the build fails in two lines
    naming the folder's problem, its ninja never starts, and its thread raises nothing (threading's
    hook would print a traceback)."""
    from fidev.builds import module_builds
    from fidev.core.failure import Failure

    write_module(tmp_path, {"m.cpp": '#include "k.h"\nint f() { return K; }\n'})
    if why == "permission denied":
        monkeypatch.setattr(
            ninja_inputs, "begin", lambda folder: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
        )
    else:
        (tmp_path / workspace.BUILDING).mkdir()
    spec = SimpleNamespace(name="m", build_dir=tmp_path, ninja_path=tmp_path / "build.ninja", sources=["m.cpp"])
    raised, failed = [], []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    with pytest.raises(Failure) as caught:
        module_builds.run_module_builds([spec], say=lambda line: None, on_failed=lambda s, f: failed.append(f))
    said = caught.value.problem + "\n" + caught.value.fix
    expected = (
        [f"cannot write in its folder {tmp_path}: Permission denied", "FLASHINFER_WORKSPACE_BASE"]
        if why == "permission denied"
        else ["is a folder, not a regular file"]
    )
    assert all(part in said for part in expected), said
    assert failed == [caught.value] and raised == []
    assert not (tmp_path / "m.o").exists(), "ninja ran in a folder whose build could not be marked"
