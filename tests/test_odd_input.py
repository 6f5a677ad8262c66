"""Every script and tool, driven with odd values of each kind its arguments take: never a
traceback, always the two lines (`error: ...`, then `fix: ...`) and the documented status: 2 for a
value its argument can never take (bad usage), 1 for a path or file that is wrong at run time.

The table is by kind of value; each script names which of its arguments take which kind. A script
or tool added to scripts/ or tools/ must appear in COVERED (test_every_script_and_tool_is_covered)."""

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fidev.core.manifest import ROOT, pins
from script_runs import task_path, two_line_failure

NUMBERS = {
    "superscript two": "²",
    "arabic-indic one": "١",
    "inf": "inf",
    "nan": "nan",
    "zero": "0",
    "negative": "-1",
    "huge": "1e999",
    "empty": "",
}
WHOLE_NUMBERS = {**NUMBERS, "fraction": "1.5", "past a C long": str(2**70)}

# (script, the arguments before the value, the option that takes it or None for a positional, the arguments after)
NUMBER_OPTIONS = [
    ("upstream_tests.py", ["norm"], "--gpus", []),
    ("upstream_tests.py", ["norm"], "--per-gpu", []),
    ("upstream_tests.py", ["norm"], "--file-timeout", []),
    ("upstream_tests.py", ["norm"], "--budget", []),
    ("upstream_tests.py", ["norm"], "--sample-seed", []),
    ("upstream_tests.py", ["norm"], "--stop-after", []),
    ("upstream_tests.py", ["norm"], "--progress", []),
    ("prefetch.py", ["Cargo.toml"], "--timeout", []),
    ("bench_chain.py", [], "--runs", []),
    ("bench_preflight.py", [], "--runs", []),
    ("bench_upstream.py", [], "--runs", []),
    ("bench_upstream.py", [], "--gpus", []),
    ("gpu_acceptance.py", ["--work", "{tmp}/work"], "--time-limit", []),
    ("planted_bugs.py", [], "--time-limit", []),
    ("smoke_noise.py", [], "--runs", []),
    ("module_uri.py", ["decode"], "--head-dim", []),
    ("module_uri.py", ["prefill"], "--head-dim-qk", []),
]
# values a number may take: a positive whole number or a positive number of seconds or minutes
ACCEPTS = {"--budget": {"0"}, "--sample-seed": {"0"}, "--stop-after": {"0"}, "--progress": {"0"}}


def long_path(tmp):
    return str(tmp / ("x" * 300) / "y")


def loop(tmp):
    (tmp / "loop").symlink_to(tmp / "loop")
    return str(tmp / "loop" / "z")


def dangling(tmp):
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    return str(tmp / "dangling")


def unreadable(tmp):
    path = tmp / "unreadable"
    path.write_text("x")
    path.chmod(0)
    return str(path)


def not_a_zip(tmp):
    path = tmp / "flashinfer_jit_cache-0.6.3+cu129-cp39-abi3-manylinux_2_28_x86_64.whl"
    path.write_text("not a zip")
    return str(path)


def truncated_zip(tmp):
    path = tmp / "flashinfer_jit_cache-0.6.3+cu129-cp39-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("flashinfer_jit_cache/jit_cache/norm/norm.so", os.urandom(4096))
    path.write_bytes(path.read_bytes()[:-200])
    return str(path)


def corrupt_member(tmp):
    path = tmp / "flashinfer_jit_cache-0.6.3+cu129-cp39-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("flashinfer_jit_cache/jit_cache/norm/norm.so", b"\x7fELF" + os.urandom(8192))
    data = bytearray(path.read_bytes())
    data[60:80] = b"\0" * 20  # inside the member's compressed data; the central directory stays intact
    path.write_bytes(bytes(data))
    return str(path)


PATHS = {
    "too long": long_path,
    "a symlink loop": loop,
    "dangling": dangling,
    "unreadable": unreadable,
    "empty": lambda tmp: "",
}
UNUSUAL = {
    "with spaces and non-ASCII": lambda tmp: str(tmp / "a dir ü" / "fi"),
    "a name of 255 bytes": lambda tmp: str(tmp / ("é" * 127)),
}
ARCHIVES = {"not a zip": not_a_zip, "truncated": truncated_zip, "a corrupt member": corrupt_member}

PATH_OPTIONS = [
    ("fetch_flashinfer_source.py", ["--archive", "{tmp}/" + pins().sdist_name], "--dest", []),
    ("fetch_flashinfer_source.py", ["--dest", "{tmp}/fi"], "--archive", []),
    ("abi.py", [], None, []),
    ("artifacts.py", [], None, []),
    ("pin.py", ["--cuda", "cu129"], None, []),
    ("prefetch.py", [], None, []),
    ("prefetch.py", ["{tmp}/Cargo.toml", "--from"], None, []),
    ("upstream_tests.py", [], None, []),
    ("bench_chain.py", [], "--workspace", []),
    ("stage_gpu_host.py", ["{tmp}/stage", "--flashinfer-git"], None, []),
    ("gpu_acceptance.py", ["--work", "{tmp}/work", "--steps", "setup"], "--staged", []),
    ("conda_layout.py", ["--print-env"], None, []),
]
ARCHIVE_OPTIONS = [
    ("artifacts.py", [], None, []),
    ("pin.py", ["--cuda", "cu129"], None, []),
]
COVERED = {case[0] for table in (NUMBER_OPTIONS, PATH_OPTIONS, ARCHIVE_OPTIONS) for case in table} | {
    # no argument that takes a number, a path or an archive (flags only; the GPU tasks run on the GPU host)
    "preflight.py",
    "build.py",
    "import_check.py",
    "smoke.py",
    "abi_smoke.py",
    "affected.py",
    "prebuilt_set.py",
}


def run(script, argv, tmp):
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    (tmp / "Cargo.toml").write_text("[package]\nname = 'x'\n")
    (tmp / pins().sdist_name).write_bytes(b"not the release")  # its hash check fails: nothing is downloaded
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp / "base"), "FLASHINFER_RS_CACHE_DIR": str(tmp / "rs")}
    return subprocess.run(
        [sys.executable, str(task_path(ROOT, script)), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp,
        stdin=subprocess.DEVNULL,
    )


def two_lines(done, statuses):
    two_line_failure(done, "", set(statuses))


def argv_for(before, option, value, after):
    return [*before, *([option] if option else []), value, *after]


@pytest.mark.parametrize("value", list(WHOLE_NUMBERS.values()), ids=list(WHOLE_NUMBERS))
@pytest.mark.parametrize(
    "script, before, option, after", NUMBER_OPTIONS, ids=[f"{c[0]} {c[2]}" for c in NUMBER_OPTIONS]
)
def test_odd_numbers_are_bad_usage(tmp_path, script, before, option, after, value):
    if value in ACCEPTS.get(option, set()) or (
        value == "1.5" and option in ("--budget", "--timeout", "--time-limit", "--progress")
    ):
        pytest.skip(f"{option} takes {value!r}")
    two_lines(run(script, argv_for(before, option, value, after), tmp_path), {2})


@pytest.mark.parametrize("make", list(PATHS.values()), ids=list(PATHS))
@pytest.mark.parametrize(
    "script, before, option, after",
    PATH_OPTIONS,
    ids=[f"{c[0]} {c[2] or ' '.join(c[1][-1:]) or 'arg'}" for c in PATH_OPTIONS],
)
def test_odd_paths_fail_in_two_lines(tmp_path, script, before, option, after, make):
    two_lines(run(script, argv_for(before, option, make(tmp_path), after), tmp_path), {1, 2})


@pytest.mark.parametrize("make", list(UNUSUAL.values()), ids=list(UNUSUAL))
@pytest.mark.parametrize(
    "script, before, option, after",
    PATH_OPTIONS,
    ids=[f"{c[0]} {c[2] or ' '.join(c[1][-1:]) or 'arg'}" for c in PATH_OPTIONS],
)
def test_unusual_but_valid_paths_are_taken_as_they_are(tmp_path, script, before, option, after, make):
    """Spaces and any Unicode are a path like any other: what the script does with it may fail (it
    does not exist), but in two lines, never a traceback, and never because of its characters."""
    done = run(script, argv_for(before, option, make(tmp_path), after), tmp_path)
    if done.returncode != 0:
        two_lines(done, {1, 2})
        assert "path" not in done.stderr.strip().splitlines()[-2].split(":")[0], done.stderr


@pytest.mark.parametrize("make", list(ARCHIVES.values()), ids=list(ARCHIVES))
@pytest.mark.parametrize("script, before, option, after", ARCHIVE_OPTIONS, ids=[c[0] for c in ARCHIVE_OPTIONS])
def test_odd_archives_fail_in_two_lines(tmp_path, script, before, option, after, make):
    two_lines(run(script, argv_for(before, option, make(tmp_path), after), tmp_path), {1})


def test_every_script_and_tool_is_covered():
    every = {p.name for folder in ("scripts", "tools") for p in (ROOT / folder).glob("*.py")}
    assert every - COVERED == set(), "add the new script's arguments to the tables above"
    assert COVERED - every == set(), "the tables name a script that is gone"


TOML_TYPES = {
    "integer": "5",
    "float": "1.5",
    "boolean": "true",
    "array": '["a", "b"]',
    "inline table": '{ path = "x" }',
    "date": "2026-11-25",
    "empty string": '""',
}
MANIFEST_VALUES = [
    ('source-dir = "extern/tracked/flashinfer"', "source-dir = {}"),
    ('source-commit = "', "source-commit = {} # "),
    ('cuda-version = "12.9.*"', "cuda-version = {}"),
    ('apache-tvm-ffi = ">=0.1.6', "apache-tvm-ffi = {} # "),
]


@pytest.mark.parametrize("kind", list(TOML_TYPES), ids=list(TOML_TYPES))
@pytest.mark.parametrize("where, template", MANIFEST_VALUES, ids=[w.split()[0] for w, _ in MANIFEST_VALUES])
def test_a_manifest_value_of_the_wrong_type_fails_in_two_lines(tmp_path, where, template, kind):
    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "scripts", ws / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    text = (ROOT / "pyproject.toml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(where))
    (ws / "pyproject.toml").write_text(text.replace(line, template.format(TOML_TYPES[kind]), 1))
    done = subprocess.run(
        [sys.executable, str(ws / "scripts/fetch_flashinfer_source.py"), "--archive", str(tmp_path / "none.tar.gz")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    two_lines(done, {1})
    assert "pyproject.toml" in done.stderr.strip().splitlines()[-2], done.stderr


@pytest.mark.parametrize(
    "script, argv, problem",
    [
        (
            "pin.py",
            ["--url", "https://example.invalid/w.whl", "{tmp}/a.whl", "{tmp}/b.whl"],
            "--url names one wheel's URL, but several",
        ),
        ("bench_chain.py", ["--task", "bogus"], "--task 'bogus' is not a task of flashinfer-dev"),
        (
            "pin.py",
            ["--cuda", "cu1210", "{tmp}/a.whl"],
            "'cu1210' is not a CUDA release",
        ),  # not CUDA 121.0, nor a guess at 12.10
        ("prefetch.py", ["{tmp}/Cargo.toml", "--cuda", "١٢.٩"], "is not a CUDA release"),
    ],
)
def test_usage_errors_exit_2(tmp_path, script, argv, problem):
    done = run(script, argv, tmp_path)
    two_lines(done, {2})
    assert problem in done.stderr.strip().splitlines()[-2], done.stderr


def fifo(tmp):
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


def device_link(tmp):
    """A link to /dev/full, a character device: a rename into place would replace the link (a
    test never names the device itself, which a tool that regressed would replace)."""
    (tmp / "full").symlink_to("/dev/full")
    return str(tmp / "full")


def a_folder(tmp):
    (tmp / "folder").mkdir()
    return str(tmp / "folder")


def under_a_file(tmp):
    (tmp / "file").write_text("the user's")
    return str(tmp / "file" / "out")


def in_a_read_only_folder(tmp):
    (tmp / "read-only").mkdir()
    (tmp / "read-only").chmod(0o555)
    return str(tmp / "read-only" / "out")


ODD_OUTPUTS = {
    "a FIFO": fifo,
    "a link to a character device": device_link,
    "a folder": a_folder,
    "under a file": under_a_file,
    "in a read-only folder": in_a_read_only_folder,
}
# the files a long run writes at its end, and the folders a tool writes in: each checked before the work
OUTPUT_FILES = [
    ("affected.py", [], "--summary", []),
    ("upstream_tests.py", ["norm"], "--summary", []),
    ("planted_bugs.py", [], "--record", []),
]
OUTPUT_FOLDERS = [
    ("stage_gpu_host.py", [], None, []),
    ("gpu_acceptance.py", ["--steps", "setup"], "--work", []),
    ("prebuilt_set.py", [], None, ["{tmp}/out"]),
    ("prebuilt_set.py", ["{tmp}/build"], None, []),
]


def odd_output(tmp, make):
    if make is in_a_read_only_folder and os.geteuid() == 0:
        pytest.skip("root writes in a folder of mode 0555")
    value = make(tmp)
    return value, (os.lstat(value).st_mode if os.path.lexists(value) else None)


@pytest.mark.parametrize("make", list(ODD_OUTPUTS.values()), ids=list(ODD_OUTPUTS))
@pytest.mark.parametrize("script, before, option, after", OUTPUT_FILES, ids=[f"{c[0]} {c[2]}" for c in OUTPUT_FILES])
def test_an_output_file_that_cannot_be_written_whole_is_refused_before_the_work(
    tmp_path, script, before, option, after, make
):
    """A FIFO, a device or a folder at the path is refused in two lines, and left as it was (a
    write by rename would replace it); so is a path whose folder is none or read-only."""
    value, mode = odd_output(tmp_path, make)
    done = run(script, argv_for(before, option, value, after), tmp_path)
    two_lines(done, {2})
    assert option in done.stderr.strip().splitlines()[-2] and value in done.stderr.strip().splitlines()[-2], done.stderr
    assert (os.lstat(value).st_mode if os.path.lexists(value) else None) == mode


@pytest.mark.parametrize(
    "make", [fifo, device_link, under_a_file, in_a_read_only_folder], ids=lambda make: make.__name__
)
@pytest.mark.parametrize(
    "script, before, option, after", OUTPUT_FOLDERS, ids=["stage DEST", "--work", "BUILD_DIR", "OUT_DIR"]
)
def test_an_output_folder_that_is_none_or_read_only_is_refused_before_the_work(
    tmp_path, script, before, option, after, make
):
    value, mode = odd_output(tmp_path, make)
    done = run(script, argv_for(before, option, value, after), tmp_path)
    two_lines(done, {2})
    assert value in done.stderr.strip().splitlines()[-2], done.stderr
    assert (os.lstat(value).st_mode if os.path.lexists(value) else None) == mode


def test_a_file_is_written_whole_only_where_it_is_a_regular_file_or_nothing(tmp_path):
    """fidev.core.files: /dev/full is refused as an output; a write onto a FIFO is refused and
    leaves it; one through a link writes the file it leads to and keeps the link."""
    from fidev.core.failure import Failure
    from fidev.core.files import output_file, write_whole

    with pytest.raises(Failure, match="is a character device"):
        output_file("/dev/full")
    with pytest.raises(Failure, match="is a named pipe"):
        write_whole(Path(fifo(tmp_path)), "x")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    (tmp_path / "target").write_text("old")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    write_whole(tmp_path / "link", "new")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "target").read_text() == "new"


@pytest.mark.parametrize("value", ["--output={tmp}/out.tar", "-o{tmp}/out.tar", "no-such-revision", " "])
def test_stage_gpu_host_takes_only_a_commit_of_the_checkout_for_bench_before(tmp_path, value):
    """What --bench-before names goes to git archive only as the commit git resolved it to: a value
    that reads as an option, or names no commit, is refused in two lines before anything is
    staged (no DEST, no file the value names)."""
    done = run("stage_gpu_host.py", ["{tmp}/stage", f"--bench-before={value}"], tmp_path)
    two_lines(done, {2})
    assert "--bench-before" in done.stderr.strip().splitlines()[-2], done.stderr
    assert not (tmp_path / "out.tar").exists() and not (tmp_path / "stage").exists()


@pytest.mark.parametrize("commit", ["--output=x", "HEAD", "d0886ce", "D0886CE2B67761A5B4F9396B4C3741F7860791B0"])
def test_a_source_commit_that_is_no_full_hash_fails_in_two_lines(tmp_path, commit):
    """source-commit goes to git (archive, diff, merge-base): a full hash only, never what git could take as an
    option."""
    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "scripts", ws / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    text = (ROOT / "pyproject.toml").read_text()
    (ws / "pyproject.toml").write_text(
        text.replace(f'source-commit = "{pins().source_commit}"', f'source-commit = "{commit}"', 1)
    )
    done = subprocess.run(
        [sys.executable, str(ws / "scripts/fetch_flashinfer_source.py"), "--archive", str(tmp_path / "none.tar.gz")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    two_lines(done, {1})
    assert "source-commit must be a commit's full hash" in done.stderr.strip().splitlines()[-2], done.stderr


def test_an_output_in_a_folder_the_user_cannot_write_is_refused(tmp_path, monkeypatch):
    """The read-only cases above skip as root, who writes in a folder of mode 0555: here the folder's
    access is what os.access says for a user who cannot write it (a read-only mount answers so for root too)."""
    from fidev.core import files
    from fidev.core.failure import Failure

    monkeypatch.setattr(files.os, "access", lambda path, mode: os.path.abspath(path) != str(tmp_path))
    with pytest.raises(Failure, match="is read-only here"):
        files.output_file(str(tmp_path / "summary.json"))
    with pytest.raises(Failure, match="is read-only here"):
        files.output_folder(str(tmp_path / "new" / "deeper"))  # the nearest folder that exists is the one written in
    (tmp_path / "writable").mkdir()
    assert files.output_file(str(tmp_path / "writable" / "summary.json")) == tmp_path / "writable" / "summary.json"


DEEP_JSON = "[" * 10_000 + "]" * 10_000


def odd_input(tmp_path, kind: str) -> Path:
    """An input no reader of ours may hang on, run out of memory on, or raise a traceback for."""
    path = tmp_path / f"input-{kind}"
    if kind == "deep JSON":
        path.write_text(DEEP_JSON)
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        return Path("/dev/zero")
    return path


@pytest.mark.parametrize("kind", ["deep JSON", "FIFO", "/dev/zero", "folder"])
def test_every_json_reader_refuses_an_odd_record_and_never_hangs(tmp_path, kind):
    """Each record reader of the library (the build stamp, the build records, the kept verdicts and
    other read_record readers, the file times, the baseline, the suite map, the sample's records, the
    release record) takes a record nested 10,000 deep, a FIFO, /dev/zero or a folder as unreadable:
    its documented answer (None, {}, or two lines), never a RecursionError, a MemoryError or a wait."""
    from fidev.builds import build_stamp
    from fidev.core.failure import Failure
    from fidev.core.files import load_json, read_record
    from fidev.records import build_records
    from fidev.upstream import runs, suite

    path = odd_input(tmp_path, kind)
    with pytest.raises(ValueError):
        load_json(path)
    with pytest.raises(Failure):
        read_record(path, "fidev-affected-verdicts/1", "affected's kept verdicts", "run it again")
    assert build_stamp._read(path) is None
    assert build_records._read(path, lambda data: True) is None
    assert runs.load_times(path) == {}
    assert suite.known_map(path, "key") is None
    outcomes = (
        tmp_path / "outcomes.jsonl"
    )  # a process's outcomes, one JSON object a line: a deep line is skipped as a torn one is
    outcomes.write_text(DEEP_JSON + '\n{"nodeid": "a", "outcome": "passed"}\n')
    assert runs.entries(outcomes) == [{"nodeid": "a", "outcome": "passed"}]


@pytest.mark.parametrize("kind", ["deep TOML", "BOM", "FIFO", "/dev/zero"])
def test_an_odd_manifest_fails_in_two_lines(tmp_path, kind):
    """The manifest reader (fidev.core.manifest.load_manifest): a TOML nested 10,000 deep, one that starts
    with a byte-order mark (named), a FIFO (which would hang it) or /dev/zero (which never ends)."""
    from fidev.core.failure import Failure
    from fidev.core.manifest import load_manifest

    path = tmp_path / "pyproject.toml"
    if kind == "deep TOML":
        path.write_text("a = " + "[" * 10_000 + "]" * 10_000 + "\n")
    elif kind == "BOM":
        path.write_bytes(b"\xef\xbb\xbf" + (ROOT / "pyproject.toml").read_bytes())
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    with pytest.raises(Failure) as refused:
        load_manifest(path)
    assert refused.value.fix and ("byte-order mark" in refused.value.problem) == (kind == "BOM"), refused.value.problem


@pytest.mark.parametrize("kind", ["deep TOML", "FIFO"])
def test_prefetch_refuses_an_odd_pins_file_in_two_lines(tmp_path, kind):
    path = tmp_path / "Cargo.toml"
    if kind == "deep TOML":
        path.write_text("a = " + "[" * 10_000 + "]" * 10_000 + "\n")
    else:
        os.mkfifo(path)
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, "prefetch.py")), str(path)], capture_output=True, text=True, timeout=60
    )
    two_line_failure(done, f"cannot read {path}")


def test_a_depends_on_cycle_fails_in_two_lines_and_a_single_name_is_one_dependency(tmp_path):
    """fidev.core.manifest.task_chain, which bench_chain and the acceptance run read the chain by: a cycle
    among the tasks' depends-on (which pixi refuses too) is two lines naming it, not a loop until memory
    runs out; `depends-on = "build"` (pixi takes one name as a string) is the task build, not "b"."""
    from fidev.core.failure import Failure
    from fidev.core.manifest import task_chain

    text = (ROOT / "pyproject.toml").read_text()
    chain = [name for name, _ in task_chain("smoke")]
    first = chain[0]
    looped = tmp_path / "pyproject.toml"
    head, sep, tail = text.partition(f"\n{first} = {{")
    assert sep, f"no table for the chain's first task {first} in the manifest"
    looped.write_text(f"{head}{sep} depends-on = [\"smoke\"],{tail}")
    with pytest.raises(Failure) as refused:
        task_chain("smoke", looped)
    assert "cycle (smoke -> " in refused.value.problem and refused.value.fix.startswith("make the chain end"), (
        refused.value.problem
    )
    single = tmp_path / "single.toml"
    single.write_text(text.replace('depends-on = ["build"]', 'depends-on = "build"'))
    assert [name for name, _ in task_chain("smoke", single)] == chain


@pytest.mark.parametrize("what", ["missing", "not executable"])
def test_conda_layout_with_a_command_it_cannot_run_fails_in_two_lines(tmp_path, what):
    program = tmp_path / "prog"
    if what == "not executable":
        program.write_text("#!/bin/sh\nexit 0\n")
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, "conda_layout.py")), str(tmp_path / "prefix"), "--", str(program)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    two_line_failure(done, "cannot run")


def test_prebuilt_set_without_an_importable_flashinfer_fails_in_two_lines(tmp_path):
    """A flashinfer that cannot be imported (here a stand-in that raises, first on the path): two lines
    before any build, not the import's traceback."""
    (tmp_path / "site/flashinfer").mkdir(parents=True)
    (tmp_path / "site/flashinfer/__init__.py").write_text("raise ImportError('a half-installed flashinfer')\n")
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, "prebuilt_set.py")), str(tmp_path / "build"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )
    two_line_failure(done, "import flashinfer failed")
