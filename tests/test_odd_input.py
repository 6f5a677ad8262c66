"""Every script and tool, driven with odd values of each kind its arguments take: never a
traceback, always the two lines (`error: ...`, then `fix: ...`) and the documented status: 2 for a
value its argument can never take (bad usage), 1 for a path or file that is wrong at run time.

The table is by kind of value; each script names which of its arguments take which kind. A script
or tool added to scripts/ or tools/ must appear in COVERED (test_every_script_and_tool_is_covered)."""

import copy
import datetime
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from fidev.core.manifest import ROOT, pins
from script_runs import acceptance_digest, acceptance_tool, require, task_path, two_line_failure, wait_until, within

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
    ("module_uri.py", ["single_decode"], "--head-dim", []),
    ("module_uri.py", ["single_prefill"], "--head-dim-qk", []),
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


@pytest.mark.parametrize("value", ["9" * 5001, "0" * 5000 + "1"], ids=["5001 nines", "5000 zeros then 1"])
@pytest.mark.parametrize(
    "script, before, option, after", NUMBER_OPTIONS, ids=[f"{c[0]} {c[2]}" for c in NUMBER_OPTIONS]
)
def test_a_number_of_thousands_of_digits_is_bad_usage_said_short(tmp_path, script, before, option, after, value):
    """Past 4,300 digits int() raises a ValueError of its own (a traceback, argparse's "invalid ... value", or
    Python's words as the error line): the option's own two lines, status 2, the value quoted short."""
    done = run(script, argv_for(before, option, value, after), tmp_path)
    two_lines(done, {2})
    problem = done.stderr.strip().splitlines()[-2]
    assert len(problem) < 200 and "Exceeds the limit" not in problem and "invalid" not in problem, problem


@pytest.mark.parametrize("value", ["١٢٨", "+128", "1_28", " 128", "128 "])
@pytest.mark.parametrize("option", ["--head-dim", "--head-dim-qk"])
def test_a_head_dim_that_int_takes_but_is_not_in_the_digits_0_9_is_bad_usage(tmp_path, option, value):
    """int() takes other scripts' digits, a sign, underscores and spaces: the rule is the digits 0-9."""
    done = run("module_uri.py", ["single_prefill", option, value], tmp_path)
    two_lines(done, {2})
    assert "is not a whole number" in done.stderr and "digits 0-9" in done.stderr, done.stderr
    assert done.stdout == "", done.stdout


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
        # a lower bound as well as an upper one (99999.9 was refused, 0.0 taken)
        ("preflight.py", ["--cuda", "0.0"], "'0.0' is not a CUDA release (from 11.0 on)"),
        ("pin.py", ["--cuda", "cu90", "{tmp}/a.whl"], "'cu90' is not a CUDA release (from 11.0 on)"),
        ("prefetch.py", ["{tmp}/Cargo.toml", "--cuda", "10.2"], "'10.2' is not a CUDA release (from 11.0 on)"),
        # the families checked as upstream-tests checks them, before the GPUs are looked for (none here)
        ("bench_upstream.py", ["nosuchfamily"], "'nosuchfamily' is neither a kernel family nor a path under"),
        ("bench_upstream.py", ["norm", ""], "'' names no kernel family and no path"),
        ("bench_upstream.py", ["/etc"], "/etc is outside the tree's tests/"),
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


@pytest.mark.parametrize("script, before, option, after", OUTPUT_FILES, ids=[f"{c[0]} {c[2]}" for c in OUTPUT_FILES])
def test_a_dash_for_an_output_file_is_refused_not_a_file_named_dash(tmp_path, script, before, option, after):
    """`-` names standard output to a user; a file named `-` written in the current folder is refused, with ./-
    for one who means that file."""
    done = run(script, argv_for(before, option, "-", after), tmp_path)
    two_lines(done, {2})
    problem = done.stderr.strip().splitlines()[-2]
    assert option in problem and "- names standard output" in problem, done.stderr
    assert not (tmp_path / "-").exists()


def test_an_empty_command_after_the_double_dash_is_bad_usage_before_the_prefix_is_laid_out(tmp_path):
    """tools/conda_layout.py PREFIX -- '': said as an empty command, not as a program it could not run."""
    done = run("conda_layout.py", [str(tmp_path / "prefix"), "--", ""], tmp_path)
    two_lines(done, {2})
    assert "the command after -- is empty" in done.stderr.strip().splitlines()[-2], done.stderr
    assert not (tmp_path / "prefix").exists()


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


# A file or folder a script reads, named by a path that exists and is something else: said for what it
# is, never "does not exist". /dev/null only where the path is read (a folder a tool writes in gets the FIFO).
READ_PATHS = [
    ("fetch_flashinfer_source.py", ["--dest", "{tmp}/fi"], "--archive", [], True),
    ("prefetch.py", ["{tmp}/Cargo.toml", "--from"], None, [], True),
    ("bench_chain.py", [], "--workspace", [], True),
    ("gpu_acceptance.py", ["--work", "{tmp}/work", "--steps", "setup"], "--staged", [], True),
    ("fetch_flashinfer_source.py", ["--archive", "{tmp}/" + pins().sdist_name], "--dest", [], False),
    ("conda_layout.py", [], None, ["--print-env"], False),
]
READ_CASES = [(*case[:4], value) for case in READ_PATHS for value in (["FIFO", "/dev/null"] if case[4] else ["FIFO"])]


@pytest.mark.parametrize(
    "script, before, option, after, value",
    READ_CASES,
    ids=[f"{c[0]} {c[2] or (c[1][-1] if c[1] else 'PREFIX')} {c[4]}" for c in READ_CASES],
)
def test_a_fifo_or_a_device_is_said_for_what_it_is(tmp_path, script, before, option, after, value):
    named = fifo(tmp_path) if value == "FIFO" else value
    done = run(script, argv_for(before, option, named, after), tmp_path)
    two_lines(done, {1})
    problem = done.stderr.strip().splitlines()[-2]
    kind = "a named pipe (FIFO)" if value == "FIFO" else "a character device"
    assert f"{named} is {kind}, not a " in problem and "does not exist" not in problem, problem


@pytest.mark.parametrize("kind", ["FIFO", "folder", "missing"])
def test_a_workspace_whose_manifest_is_no_regular_file_is_said_for_what_it_is(tmp_path, kind):
    """bench_chain --workspace DIR whose pyproject.toml is a FIFO or a folder: said so, not "holds no
    pyproject.toml"; one that lacks it: said missing."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    manifest = workspace / "pyproject.toml"
    said = {"FIFO": "is a named pipe (FIFO), not a regular file", "folder": "is a folder", "missing": "does not exist"}
    if kind == "FIFO":
        os.mkfifo(manifest)
    elif kind == "folder":
        manifest.mkdir()
    done = run("bench_chain.py", ["--workspace", str(workspace)], tmp_path)
    two_line_failure(done, f"{manifest} {said[kind]}")


def test_a_fifo_among_the_carried_wheels_or_the_staged_files_is_said_for_what_it_is(tmp_path):
    """prefetch --from DIR whose wheel is a FIFO; the acceptance run's --staged DIR whose source release is one."""
    from fidev.bindings import cargo_pins

    wheel = "flashinfer_python-0.6.3-py3-none-any.whl"
    pinned = cargo_pins.Pin("flashinfer_python", "cu129", "x86_64", wheel, f"https://x.invalid/{wheel}", "ab" * 32)
    (tmp_path / "pins.toml").write_text(cargo_pins.pin_toml([pinned]))
    (tmp_path / "carried").mkdir()
    os.mkfifo(tmp_path / "carried" / wheel)
    done = run("prefetch.py", [str(tmp_path / "pins.toml"), "--from", str(tmp_path / "carried")], tmp_path)
    two_line_failure(done, f"{tmp_path / 'carried' / wheel} is a named pipe (FIFO), not a regular file")
    tests = tmp_path / "tests-staged"
    tests.mkdir()
    os.mkfifo(tests / "flashinfer-tests.tar")  # FlashInfer's tests, which setup skipped, the steps running without
    done = run("gpu_acceptance.py", ["--work", "{tmp}/work", "--staged", str(tests), "--steps", "setup"], tmp_path)
    two_line_failure(done, f"--staged {tests}: flashinfer-tests.tar is a named pipe (FIFO)")
    if (pins().source_dir / "csrc").is_dir():
        return  # the acceptance run's copy of this checkout has its tree: it takes no staged release
    staged = tmp_path / "staged"
    staged.mkdir()
    os.mkfifo(staged / pins().sdist_name)
    done = run("gpu_acceptance.py", ["--work", "{tmp}/work", "--staged", str(staged), "--steps", "setup"], tmp_path)
    two_line_failure(done, f"the staged source release {staged / pins().sdist_name} is a named pipe (FIFO)")


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


# final names near NAME_MAX (255 bytes, the most user_path takes), whose temporary name would pass it with the
# 30-odd bytes a write adds: 250 bytes of ASCII, the whole 255, and 245 to 250 of two-, three- and four-byte characters
LONG_NAMES = {
    "250 bytes": "s" * 245 + ".json",
    "255 bytes": "s" * 250 + ".json",
    "two-byte characters": "é" * 120 + ".json",
    "three-byte characters": "名" * 81 + ".json",
    "four-byte characters": "🙂" * 61 + ".json",
}


@pytest.mark.parametrize("name", list(LONG_NAMES.values()), ids=list(LONG_NAMES))
def test_an_output_whose_name_is_near_the_file_systems_limit_is_written_whole(tmp_path, monkeypatch, name):
    """A --summary or --record of a name up to NAME_MAX bytes passes the check before the run (output_file), and its
    write at the run's end (write_output) succeeds, through a temporary file beside it whose name fits, cut by
    whole characters (temporary_beside); nothing else is left beside it, and one that is a FIFO is still refused."""
    from fidev.core import files
    from fidev.core.failure import Failure

    assert len(os.fsencode(name)) > files.NAME_MAX - 30, name
    renamed = []
    replace = os.replace
    monkeypatch.setattr(files.os, "replace", lambda src, dst: renamed.append(Path(src)) or replace(src, dst))
    path = files.output_file(str(tmp_path / name))
    files.write_output(path, '{"verdict": "passed"}', "the summary")
    assert path.read_text() == '{"verdict": "passed"}' and os.listdir(tmp_path) == [name]
    (tmp,) = renamed
    assert tmp.parent == tmp_path and tmp.name.startswith(".") and len(os.fsencode(tmp.name)) <= files.NAME_MAX, tmp
    assert os.fsencode(tmp.name).decode() == tmp.name and tmp.name.endswith(
        f".tmp-{os.getpid()}-{threading.get_ident()}"
    )
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(Failure, match="is a named pipe"):
        files.write_output(path, "x", "the summary")
    assert stat.S_ISFIFO(os.lstat(path).st_mode) and os.listdir(tmp_path) == [name]


def test_an_output_whose_temporary_file_would_pass_the_path_limit_is_refused_before_the_work(tmp_path):
    """A --summary whose whole path is within PATH_MAX (4096 bytes) but the temporary file's beside it, 30-odd bytes
    longer, is not: two lines from the check before the run (output_file), not a write that fails at the run's end;
    one 40 bytes shorter is written whole."""
    from fidev.core import files
    from fidev.core.failure import Failure

    folder = tmp_path
    while len(os.fsencode(folder)) < files.PATH_MAX - 200:
        folder = folder / ("d" * 100)
    folder.mkdir(parents=True)
    near = folder / ("x" * (files.PATH_MAX - 11 - len(os.fsencode(folder))))  # 4084 bytes in all
    with pytest.raises(Failure, match=f"would be [0-9]+ bytes long, past the system's limit of {files.PATH_MAX}") as e:
        files.output_file(str(near))
    assert e.value.fix == "name a shorter path, or one in a folder nearer /" and os.listdir(folder) == []
    shorter = folder / ("x" * (files.PATH_MAX - 41 - len(os.fsencode(folder))))
    files.write_output(files.output_file(str(shorter)), "{}", "the summary")
    assert shorter.read_text() == "{}" and os.listdir(folder) == [shorter.name]


@pytest.mark.parametrize("value", ["--output={tmp}/out.tar", "-o{tmp}/out.tar", "no-such-revision", " "])
def test_stage_gpu_host_takes_only_a_commit_of_the_checkout_for_bench_before(tmp_path, value):
    """What --bench-before names goes to git archive only as the commit git resolved it to: a value
    that reads as an option, or names no commit, is refused in two lines before anything is
    staged (no DEST, no file the value names)."""
    done = run("stage_gpu_host.py", ["{tmp}/stage", f"--bench-before={value}"], tmp_path)
    two_lines(done, {2})
    assert "--bench-before" in done.stderr.strip().splitlines()[-2], done.stderr
    assert not (tmp_path / "out.tar").exists() and not (tmp_path / "stage").exists()


# git's stand-in for stage_gpu_host: any revision is a commit, `archive` writes half an archive, marks that it
# did (STANDIN_RUN.half), and writes the rest once a line comes on its stdin; anything else finds no checkout.
STAGE_GIT = """\
import os, sys
args = sys.argv[sys.argv.index("-C") + 2 :] if "-C" in sys.argv else sys.argv[1:]
if args[0] == "rev-parse":
    print("0" * 40)
elif args[0] == "archive":
    run = os.environ["STANDIN_RUN"]
    sys.stdout.buffer.write(f"the first half of {os.path.basename(run)}\\n".encode())
    sys.stdout.buffer.flush()
    open(run + ".half", "w").close()
    sys.stdin.readline()
    sys.stdout.buffer.write(b"the rest\\n")
else:
    sys.exit("fatal: not a git repository")
"""


def stage_midway(tmp_path, dest, name):
    """stage_gpu_host DEST --bench-before HEAD, in a session of its own, once its git archive wrote half."""
    git = tmp_path / "bin/git"
    if not git.exists():
        git.parent.mkdir()
        git.write_text(f"#!{sys.executable}\n{STAGE_GIT}")
        git.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, str(task_path(ROOT, "stage_gpu_host.py")), str(dest), "--bench-before", "HEAD"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PATH": f"{git.parent}{os.pathsep}{os.environ['PATH']}",
            "STANDIN_RUN": str(tmp_path / name),
        },
        start_new_session=True,
    )
    wait_until(lambda: (tmp_path / f"{name}.half").exists(), 60, f"{name}'s git archive writing", proc)
    return proc


def test_two_stage_runs_into_one_folder_each_write_their_archive_whole_and_a_killed_one_none(tmp_path):
    """Two stage_gpu_host runs into one DEST, both in the middle of git archive at once: each writes a
    temporary file of its own, so both go on (to the two lines of the FlashInfer checkout the stand-in
    lacks), and the one that ends last leaves its archive whole, with no temporary file beside it. A run
    killed midway leaves no bench-before.tar, only its temporary file. (The file's mode is the umask's.)"""
    dest = tmp_path / "stage"
    first, second = stage_midway(tmp_path, dest, "first"), stage_midway(tmp_path, dest, "second")
    for proc in (second, first):
        out, err = proc.communicate("go\n", timeout=60)
        two_line_failure(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "FlashInfer git checkout")
    assert os.listdir(dest) == ["bench-before.tar"], os.listdir(dest)
    assert (dest / "bench-before.tar").read_text() == "the first half of first\nthe rest\n"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE((dest / "bench-before.tar").stat().st_mode) == 0o666 & ~umask  # as any file written is
    killed = stage_midway(tmp_path, tmp_path / "killed", "killed")
    os.killpg(killed.pid, signal.SIGKILL)  # the run and its git
    killed.communicate(timeout=60)
    left = os.listdir(tmp_path / "killed")
    assert len(left) == 1 and left[0].startswith(".bench-before.tar.tmp-"), left


# git's and pip's stand-ins for a stage interrupted in its pip download: git holds any commit and archives it;
# pip writes half a wheel where it is told to and its own line, marks that it did, and waits for Ctrl-C, whose
# traceback it prints as pip's own would reach the terminal.
STAGE_TOOLS = {
    "bin/git": f"#!{sys.executable}\nimport sys\nif 'archive' in sys.argv:\n    sys.stdout.write('tests')\n",
    "standin/pip/__init__.py": "",
    "standin/pip/__main__.py": """\
import os, sys, time
into = sys.argv[sys.argv.index("-d") + 1]
os.makedirs(into, exist_ok=True)
open(os.path.join(into, "tree_sitter-0.25.0-cp312-abi3-manylinux_2_17_x86_64.whl"), "wb").write(b"PK half")
print("pip's own line: Downloading tree_sitter", file=sys.stderr, flush=True)
open(os.environ["STANDIN_PIP_STARTED"], "w").close()
time.sleep(60)
""",
}


def test_ctrl_c_during_the_stages_pip_download_is_our_line_alone_and_leaves_no_wheel(tmp_path):
    """Ctrl-C reaches the whole foreground group, pip too: what pip prints then (its traceback) is not shown,
    the run says its one line and ends 130, and DEST holds no wheel pip had half-written, nor pip's own files."""
    for name, text in STAGE_TOOLS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "bin/git").chmod(0o755)
    dest, started = tmp_path / "stage", tmp_path / "pip-started"
    proc = subprocess.Popen(
        [sys.executable, str(task_path(ROOT, "stage_gpu_host.py")), str(dest), "--flashinfer-git", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(tmp_path / "standin"),
            "STANDIN_PIP_STARTED": str(started),
        },
        start_new_session=True,
    )
    wait_until(started.exists, 60, "the stage's pip download", proc)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the run and its pip
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (130, "error: interrupted; nothing was left half-written\n"), out + err
    assert sorted(os.listdir(dest)) == ["flashinfer-tests.tar"], os.listdir(dest)


def test_the_staged_size_counts_what_stayed_and_not_a_file_gone_since_the_listing(tmp_path, monkeypatch):
    """stage_gpu_host's last line (fidev.core.files.folder_size): another staging's temporary file, renamed
    between the listing and its size, is not counted, and no traceback."""
    from fidev.core.files import folder_size

    (tmp_path / "a.whl").write_bytes(b"x" * 10)
    gone = tmp_path / ".bench-before.tar.tmp-1"
    gone.write_bytes(b"y" * 5)
    listing = list(tmp_path.iterdir())
    gone.unlink()  # renamed by the other staging after the listing
    monkeypatch.setattr(type(tmp_path), "iterdir", lambda self: iter(listing))
    assert folder_size(tmp_path) == (1, 10)


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
    elif kind == "not UTF-8":
        path.write_bytes(b"\xff\xfe{}")  # UTF-16's BOM: what a writer of ours never writes
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        return Path("/dev/zero")
    return path


@pytest.mark.parametrize("kind", ["deep JSON", "not UTF-8", "FIFO", "/dev/zero", "folder"])
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
    with within(30, "the readers of an odd record"):
        with pytest.raises(ValueError, match="not UTF-8 text" if kind == "not UTF-8" else None):
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


def test_a_manifest_holding_a_whole_number_of_thousands_of_digits_is_said_as_such(tmp_path):
    """tomllib lets int()'s ValueError past its limit of digits by: not valid TOML (its integers are 64-bit),
    the number's line named, not Python's words with a fix that blames the file's type."""
    from fidev.core.failure import Failure
    from fidev.core.manifest import load_manifest

    path = tmp_path / "pyproject.toml"
    path.write_text("[a]\nb = 1\nc = " + "9" * 5001 + "\n")
    with pytest.raises(Failure) as refused:
        load_manifest(path)
    assert refused.value.problem.startswith("pyproject.toml is not valid TOML: line 3 holds a whole number of"), (
        refused.value.problem
    )
    assert "regular file" not in refused.value.fix and "fix the line it names" in refused.value.fix


@pytest.mark.parametrize("kind", ["deep TOML", "FIFO", "thousands of digits"])
def test_prefetch_refuses_an_odd_pins_file_in_two_lines(tmp_path, kind):
    path = tmp_path / "Cargo.toml"
    if kind == "deep TOML":
        path.write_text("a = " + "[" * 10_000 + "]" * 10_000 + "\n")
    elif kind == "FIFO":
        os.mkfifo(path)
    else:  # tomllib hands the number to int() past its limit: the line is named, as the manifest's reader says
        path.write_text("[package]\nname = 'x'\nb = " + "9" * 5001 + "\n")
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, "prefetch.py")), str(path)], capture_output=True, text=True, timeout=60
    )
    said = "line 3 holds a whole number of thousands of digits" if kind == "thousands of digits" else ""
    two_line_failure(done, f"cannot read {path}: {said}")


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
    with within(30, "reading a chain with a cycle"), pytest.raises(Failure) as refused:
        task_chain("smoke", looped)
    assert "cycle (smoke -> " in refused.value.problem and refused.value.fix.startswith("make the chain end"), (
        refused.value.problem
    )
    single = tmp_path / "single.toml"
    single.write_text(text.replace('depends-on = ["build"]', 'depends-on = "build"'))
    assert [name for name, _ in task_chain("smoke", single)] == chain


def test_every_depends_on_entry_is_walked_in_order_each_task_once_and_pixis_table_form_is_a_name(tmp_path):
    """task_chain, as pixi runs a task (its manifest schema: a depends-on is a name, a table `{ task = ... }`, or a
    list of those): every entry's tasks first, in their order, a task reached twice run once."""
    from fidev.core.manifest import task_chain

    text = (ROOT / "pyproject.toml").read_text()
    build, smoke = 'depends-on = ["preflight"], description = "Compile', 'depends-on = ["build"], description = "Prove'
    assert build in text and smoke in text
    tables = tmp_path / "tables.toml"
    tables.write_text(text.replace(build, build.replace('["preflight"]', '[{ task = "preflight" }]')))
    assert [name for name, _ in task_chain("smoke", tables)] == ["preflight", "build", "smoke"]
    diamond = tmp_path / "diamond.toml"
    diamond.write_text(text.replace(smoke, smoke.replace('["build"]', '["import-check", { task = "build" }]')))
    assert [name for name, _ in task_chain("smoke", diamond)] == ["preflight", "build", "import-check", "smoke"]


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


def no_toolkit(tmp):
    """A folder with bin/nvcc and include/, but no libraries."""
    (tmp / "toolkit" / "bin").mkdir(parents=True)
    (tmp / "toolkit" / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.86'\n")
    (tmp / "toolkit" / "include").mkdir()
    return str(tmp / "toolkit")


TOOLKITS = {
    "missing": lambda tmp: str(tmp / "nowhere"),
    "a FIFO": fifo,
    "/dev/null": lambda tmp: "/dev/null",
    "a folder without libraries": no_toolkit,
}


@pytest.mark.parametrize("make", list(TOOLKITS.values()), ids=list(TOOLKITS))
def test_a_toolkit_that_is_none_is_named_not_the_prefix(tmp_path, make):
    """conda_layout and the acceptance run's steps that read --toolkit: two lines naming the toolkit,
    before the prefix is made (it was blamed: "cannot lay out PREFIX")."""
    toolkit = make(tmp_path)
    done = run("conda_layout.py", ["{tmp}/prefix", "--toolkit", toolkit, "--print-env"], tmp_path)
    two_line_failure(done, f"--toolkit {toolkit} ")
    assert "prefix" not in done.stderr.strip().splitlines()[-2] and not (tmp_path / "prefix").exists(), done.stderr
    (tmp_path / "work" / "ws").mkdir(parents=True)  # the run's copy of the checkout, taken as set up
    (tmp_path / "work" / "checkout.sha256").write_text(acceptance_digest())
    done = run("gpu_acceptance.py", ["--work", "{tmp}/work", "--steps", "preflight", "--toolkit", toolkit], tmp_path)
    two_line_failure(done, f"--toolkit {toolkit} ")


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


# ---------------------------------------------------------------- records of the wrong JSON type
#
# Every JSON record a script or tool reads back, and the input files it reads that our processes or
# FlashInfer's write, with the whole record, and each field and list entry in it at any depth, replaced
# by a value of each JSON type it is not. A reader takes it as its documented answer for an unreadable
# record (absent: None, {} or [], and the work it stands for done again; or two lines), never a
# traceback, and never as a pass.

WRONG_TYPES = {"null": None, "bool": True, "number": 7, "string": "x", "list": [], "object": {}}


def json_type(value) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else "bool"
    return {int: "number", float: "number", str: "string", list: "list", dict: "object"}[type(value)]


def put(record, where: list, value):
    """`record` with the value at `where` (keys and indices) replaced."""
    if not where:
        return value
    record = copy.deepcopy(record)
    node = record
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return record


def wrong_typed(record, kind: str, values=WRONG_TYPES, type_of=json_type) -> list[tuple[str, object]]:
    """(where, record) for the record whole and for each field and list entry in it whose type
    (JSON's, or another `type_of`) is not `kind`, replaced by a value of that type."""
    found = []

    def walk(node, where):
        if type_of(node) != kind:
            said = "/".join(map(str, where)) or "the whole record"
            found.append((said, put(record, where, copy.deepcopy(values[kind]))))
        for key, child in node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ():
            walk(child, [*where, key])

    walk(record, [])
    return found


FACT = [1_700_000_000_000_000_000, 3, "0" * 64]  # a file fact (fidev.core.files.file_fact) of a file no test has


def written(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def lines(path: Path, data) -> Path:
    """A file of a JSON value a line: each of `data`'s, or `data` itself where it is no list."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in (data if isinstance(data, list) else [data])))
    return path


def a_workspace(tmp):
    from fidev.core import workspace

    return workspace.Workspace(tmp / "base", pins().flashinfer)


def build_stamp_read(tmp, data):
    from fidev.builds import build_stamp

    ws = a_workspace(tmp)
    written(ws.build_stamp({}), data)
    return build_stamp.unreadable_stamps(ws), build_stamp.stamped_modules(ws)


def module_build_records_read(tmp, name: str, data):
    """A module's records in its build folder: its inputs, its generators, the call that made it."""
    from fidev.records import build_records, ninja_inputs

    build_dir, tree = tmp / "jit" / "norm", tmp / "tree"
    (tree / "flashinfer").mkdir(parents=True, exist_ok=True)
    written(build_dir / name, data)
    ninja_inputs._READ.clear()
    return (
        ninja_inputs.unreadable(build_dir),
        ninja_inputs.edited(build_dir),
        ninja_inputs.restored(build_dir),
        ninja_inputs.inputs(build_dir, build_dir / "build.ninja"),
        build_records.unreadable_generators(build_dir),
        build_records.changed_generators(build_dir, tree),
        build_records.generators_before(build_dir, tree),
        build_records.recorded_call(build_dir),
        build_records.smoke_module(build_dir),
    )


def jit_dir_records_read(tmp, name: str, data):
    """A JIT dir's records beside it: the tree as last built, and which of FlashInfer's tests need which module."""
    from fidev.records import build_records

    jit_dir, tree = tmp / "0.6.3" / "90" / "cached_ops", tmp / "tree"
    (tree / "include").mkdir(parents=True, exist_ok=True)
    written(jit_dir.parent / name, data)
    found = (
        build_records.tree_record(jit_dir),
        build_records.unreadable_tree(jit_dir),
        build_records.changed_tree_files(jit_dir, tree),
        build_records.module_tests(jit_dir),
        build_records.tests_ran(jit_dir),
    )
    build_records.record_tree(jit_dir, tree)
    build_records.add_module_tests(jit_dir, [{"test_name": "tests/utils/test_norm.py::test_t", "module_name": "norm"}])
    return found


def gate_read(tmp, data):
    """affected's gate file, as a test process behind it reads it: one of another schema or shape is none of
    affected's gates (ValueError: the process ends, saying so: fidev.upstream.gate.checked)."""
    from fidev.upstream import gate

    try:
        return gate.read_state(written(tmp / "gate.json", data)), gate.opened(tmp / "gate.json")
    except ValueError:
        return None


def release_record_read(tmp, data):
    """The source release's record of its files: unreadable, no file has a released fact, and edits
    cannot be told by it (two lines)."""
    from fidev.tree import release_reference

    tree = tmp / "tree"
    written(tree / "csrc" / "norm.cu", "x")
    written(tree / ".fidev-release-files.json", data)
    return release_reference.released_facts(tree), release_reference._against_record(tree)


def kept_verdicts_read(tmp, data):
    """affected's kept verdicts: unreadable, every built module is taken as changed (`problem`); a
    module's verdict is given only from a record of the shape Kept.record writes."""
    from fidev.affected import verdicts

    kept = verdicts.Kept(written(tmp / "fidev-affected.json", data))
    if not kept.problem:
        assert kept.modules["norm"].result == "failed", "a failure read as another verdict"
    kept.standing("norm", tmp / "norm")
    kept.record({})
    return kept.problem


def file_times_read(tmp, data):
    """The files' last times: one of another type is unknown (the file runs in one part)."""
    from fidev.upstream import runs

    times = runs.load_times(written(tmp / "file-times.json", data))
    assert times.items() <= {"tests/a.py": 61.5, "tests/b.py": 3.0}.items(), times
    assert all(type(s) is float for s in times.values()), times
    return runs.split({"/tree/tests/a.py": []}, 2, Path("/tree"), times)


@pytest.mark.parametrize("where", ["total", "files", "not_collected", "families/norm"])
@pytest.mark.parametrize("value", [-5, 10**400, 10**10], ids=["-5", "10**400", "10**10"])
def test_a_suite_map_count_no_suite_has_is_counted_again_never_listed(tmp_path, monkeypatch, capsys, where, value):
    """A count of the suite map that is below 0 or past any suite (-5 cases, 10**400): the map is of another
    shape, counted again (here: cannot be, so --list shows no counts), never printed as `-5 cases`."""
    data = suite_map_valid(tmp_path)
    suite_map_read(tmp_path, put(data, where.split("/"), value), monkeypatch)
    out = capsys.readouterr().out
    assert str(value) not in out and "left out" not in out, out


@pytest.mark.parametrize("field", ["total", "done", "failed"])
@pytest.mark.parametrize("value", [-5, 10**400], ids=["-5", "10**400"])
def test_a_progress_count_no_process_has_leaves_the_progress_unwritten(tmp_path, field, value):
    """A process's progress whose count of cases is below 0 or past any suite's: of another shape, taken
    as not written yet, never summed into the run's line."""
    from fidev.upstream import progress

    valid = {"schema": progress.PROGRESS_SCHEMA, "total": 3, "done": 1, "failed": 1, "t": 2.0}
    assert progress.read_progress(written(tmp_path / "valid.progress", valid)) is not None
    assert progress.read_progress(written(tmp_path / "odd.progress", {**valid, field: value})) is None


def suite_map_read(tmp, data, monkeypatch):
    """The suite's counts: another suite's, or unreadable, are counted again (here: cannot be)."""
    from fidev.upstream import suite

    ws = a_workspace(tmp)
    written(ws.suite_map, data)
    monkeypatch.setattr(suite, "tests_dir", lambda: tmp / "tests")
    monkeypatch.setattr(suite, "suite_key", lambda tests: "key")
    monkeypatch.setattr(suite, "collect", lambda tests, mode: None)
    return suite.list_families(ws, "auto")


def baseline_read(tmp, data):
    """A baseline that cannot be read is two lines (a compare run without it would pass off a plain run)."""
    from fidev.upstream import runs, verdict

    baseline = runs.load_baseline(written(tmp / "baseline.json", data))
    now = [runs.FileResult("tests/a.py", None, 1.0, "exit 1", {"tests/a.py::t": "failed", "tests/a.py::u": "passed"})]
    changes = runs.compare(baseline, now)
    (tmp / "run").mkdir(exist_ok=True)
    status = verdict.say_compared(baseline, tmp / "baseline.json", changes, tmp / "run")
    assert status == 1 and changes["newly failing"] == ["tests/a.py::t"], "a newly failing test went unsaid"
    return status


def sample_spec_read(tmp, data):
    """The spec upstream-tests writes for its processes: refused in two lines, as one of another schema is."""
    from fidev.upstream import sample

    seed, modules, required = sample.read_spec(written(tmp / "sample.json", data))
    cases = [sample.Case.of(f"tests/a.py::f[{x}]", "tests/a.py::f", {"x": x}) for x in ("1", "2")]
    return sample.select(cases, modules, seed, required)


def sample_records_read(tmp, data):
    """A process's record of its sample: one that cannot be read is left out, as a process that wrote none."""
    from fidev.upstream import sample

    run_dir = tmp / "run"
    written(run_dir / f"a.jsonl{sample.RECORD}", data)
    other = {"seed": 1, "functions": {"tests/b.py::g": [1, 1]}, "whole": [], "missed": [], "exercised": []}
    written(run_dir / f"b.jsonl{sample.RECORD}", other)
    merged = sample.merge_records(sample.read_records(run_dir))
    return sample.coverage_lines("upstream-tests", merged)


def progress_read(tmp, data):
    """A process's progress: unreadable, it is taken as not written yet."""
    from fidev.upstream import progress, runs

    run_dir = tmp / "run"
    written(run_dir / "a.jsonl.progress", data)
    lines(run_dir / "a.jsonl", {"nodeid": "tests/a.py::t", "outcome": "finished", "message": "", "t": 1.0})
    return progress.tally(run_dir, 1, 1), runs.not_run(run_dir / "a.jsonl")


OUTCOME_LINES = [
    {"nodeid": "", "outcome": "collected", "message": "0123456789abcdef", "t": 1.0},
    {"nodeid": "tests/a.py::t", "outcome": "started", "message": "", "t": 1.5},
    {"nodeid": "tests/a.py::t", "outcome": "failed", "message": "assert 1 == 2", "t": 2.0},
    {"nodeid": "tests/a.py::t", "outcome": "finished", "message": "", "t": 2.0},
    {"nodeid": "tests/a.py::u", "outcome": "skipped", "message": "Skipped: no GPU", "t": 2.5},
]


def outcome_lines_read(tmp, data):
    """A process's outcomes, a JSON object a line: a line that is none is left out, as a torn last line is."""
    from fidev.upstream import runs, verdict

    run_dir = tmp / "run"
    outcomes_file = lines(run_dir / "a.jsonl", data)
    outcomes = runs.read_outcomes(outcomes_file)
    assert outcomes.get("tests/a.py::t") in (None, "failed", "error"), f"a failure read as {outcomes['tests/a.py::t']}"
    return (
        outcomes,
        runs.read_outcomes(outcomes_file, stopped=True),
        runs.stopped_itself(outcomes_file),
        runs.first_failure(run_dir),
        runs.read_collected(outcomes_file),
        runs.last_case_end(run_dir),
        verdict.passed_in(run_dir),
    )


JIT_REPORT = [
    {
        "test_name": "tests/utils/test_norm.py::test_norm[1]",
        "module_name": "norm",
        "spec_info": repr({"name": "norm", "sources": ["/tree/csrc/norm.cu"]}),
    },
    {
        "test_name": "tests/utils/test_norm.py::test_norm[2]",
        "module_name": "norm",
        "spec_info": "None",
        "warmup": False,
    },
]


def jit_report_read(tmp, data):
    """A JIT report (FlashInfer's conftest, or the plan's dry run): a line that is no such object is
    left out, as a torn one."""
    from fidev.records import build_records
    from fidev.upstream import plan

    entries = plan.read_jit_report(lines(tmp / "report.jsonl", data))
    build_records.add_module_tests(tmp / "0.6.3" / "90" / "cached_ops", entries)
    return plan.module_sources(entries)


COUNTED = {"passed": 1, "skipped": 0, "failed": 1, "error": 0}


def upstream_summary_valid(tmp):
    from dataclasses import asdict

    from fidev.upstream import summary

    process = summary.Process("tests/a.py", [1, 1], "0", 1.5, "exit 1", COUNTED)
    sample = {"selected": 2, "total": 4, "seed": 1, "functions": 1, "whole": [], "missed": ["norm"]}
    compared = {"newly failing": ["tests/a.py::t"], "newly erroring": []}
    done = summary.Summary(
        ["norm"],
        "auto",
        str(tmp / "run"),
        ["0"],
        "H100",
        1.0,
        3.0,
        1,
        COUNTED,
        {"no GPU": 0},
        ["tests/a.py::t"],
        [],
        [process],
        2.5,
        compared,
        sample,
        1.0,
        1,
        True,
        0,
        [],
    )
    return {"schema": summary.SCHEMA, **asdict(done)}


def upstream_summary_read(tmp, data):
    """upstream-tests' summary, as affected, the acceptance run and the benchmark read it: two lines
    where it cannot be read, and then no pass (affected: status 1)."""
    from fidev.upstream import summary

    done = summary.read(written(tmp / "summary.json", data))
    c = done.counts
    said = [
        f"{c['passed']} {c['skipped']} {c['failed']} {c['error']} {done.kernel_source} {len(done.gpus)}",
        f"{done.ended - done.started:.1f}",
    ]
    for p in done.processes:  # bench_upstream's lines, affected's files exercised
        said.append(f"{p.file} {p.part[0]} {p.part[1]} {p.gpu or '-'} {p.seconds:.0f} {p.ended}")
        said.append(f"{p.counts['passed']} {p.counts['error']} {p.counts.get('failed')}")
        said.append(str(f"{p.file} ({p.ended})" in done.erroring))
    compared = done.compared or {}  # the acceptance run's upstream-compare
    said.append(", ".join((compared.get("newly failing") or [])[:2]) + str(len(compared.get("newly erroring") or [])))
    said.append(str({what.split()[0] for what in done.failed_ids if what.split()}))  # affected's FlashInfer tests
    if done.sample:
        said.append(f"{done.sample['selected']} {done.sample['total']} {done.sample.get('missed', [])}")
    if done.first_failure_s is not None and done.last_case_end is not None:
        said.append(f"{done.started + done.first_failure_s - done.last_case_end:.1f}")
    assert done.status != 0 and done.failed_ids, "a failing run read as a pass"
    return said


def affected_summary_valid(tmp):
    from dataclasses import asdict

    from fidev.affected import summary

    test = "tests/smoke/test_kernels.py::test_rmsnorm"
    done = summary.Summary(
        "failed",
        1,
        {"include/flashinfer/norm.cuh": ["norm"]},
        [test],
        [test],
        ["norm"],
        12.5,
        {"ended_s": 3.0, "last_case_s": 2.5, "first_failure_s": 1.0},
        20.0,
        None,
    )
    return {"schema": summary.SCHEMA, **asdict(done)}


def affected_summary_read(tmp, data):
    """affected's summary, as the acceptance run and planted_bugs read it: two lines where it cannot
    be read (a bug is then not caught: no summary), and a failed run never read as another verdict."""
    from fidev.affected import summary
    from fidev.affected.verdict import Verdict

    done = summary.read(written(tmp / "affected.json", data))
    said = [f"{len(done.rebuilt)} {done.build_s:.1f}" if done.build_s is not None else "nothing rebuilt"]
    if done.past_build:
        past = done.past_build
        said.append(f"{past['ended_s']:.1f} {past['last_case_s']:.1f} {past.get('first_failure_s')}")
    said += [t.removeprefix("tests/") for t in [*done.failed, *done.tests]] + sorted(done.modules)
    said.append(f"{done.status} {done.verdict} {round(done.seconds, 1)} {done.problem or ''}")
    failed = done.verdict == Verdict.FAILED and done.status == Verdict.FAILED.status and done.failed
    assert failed, "a failed run read as another verdict"
    return said


def planted_bugs_valid(tmp):
    from fidev.tree import edits

    bug = {
        "id": "norm-offset",
        "family": "norm",
        "file": "include/flashinfer/norm.cuh",
        "symbol": "RMSNormKernel",
        "line": "a;",
        "bug": "b;",
        "size": "1%",
        "kind": "header",
        "caught": False,
        "survived_because": "exit 0: 2 test(s) of norm ran and passed",
        "planted": {"verdict": "passed", "status": 0},
        "restored": {"verdict": "passed", "status": 0, "passes": True},
    }
    caught = {**bug, "id": "silu-offset", "caught": True, "survived_because": None}
    return {
        "schema": edits.PLANTED_BUGS_SCHEMA,
        "complete": True,
        "bugs": [caught, bug],
        "left": [],
        "unfinished": [],
        "survivors": ["norm-offset"],
        "restored_failures": [],
    }


def planted_bugs_read(tmp, data):
    """planted_bugs.py's record, as the acceptance run reads it: two lines where it cannot be read (the
    step fails), and a bug that survived never counted as caught."""
    from fidev.tree import edits

    done = edits.read_planted_bugs(written(tmp / "planted-bugs.json", data), "see logs/planted-bugs.log")
    caught = [b["id"] for b in done["bugs"] if b["caught"]]
    assert "norm-offset" not in caught, "a survivor counted as caught"
    return [f"{len(caught)} of {len(done['bugs'])}", *done["survivors"], *done["restored_failures"], *done["left"]]


PREFLIGHT_RECORD = {
    "cuda_target": "12.8",
    "pinned": False,
    "checks": [
        {"id": "host", "status": "pass", "finding": "Linux x86_64", "fix": ""},
        {"id": "cubin", "status": "fail", "finding": "flashinfer-cubin is not installed", "fix": "pixi install"},
        {"id": "cuda-libs", "status": "fail", "finding": "no libcudart.so", "fix": "CUDA_HOME=$CONDA_PREFIX/targets"},
    ],
    "summary": {"pass": 1, "warn": 0, "fail": 2},
    "seconds": 0.5,
}


def preflight_record_read(tmp, data):
    """preflight --json's record, as the acceptance run's preflight step reads it from the output (a warning
    printed before it included): a step that fails, its note naming the record where it cannot be read,
    and a check that failed (cuda-libs) never read as a pass."""
    out = "a warning printed first\n" + json.dumps(data, indent=1) + "\n"
    passed, note = acceptance_tool().preflight_verdict(out, tmp / "logs/preflight.log")
    assert not passed, f"a failed check read as a pass: {note}"
    return [note]


PYPI_PAGE = {
    "meta": {"api-version": "1.1"},
    "name": "flashinfer-python",
    "files": [
        {
            "filename": "flashinfer_python-0.6.3.tar.gz",
            "url": "https://files.example/flashinfer_python-0.6.3.tar.gz",
            "hashes": {"sha256": "ab" * 32},
        },
        {"filename": "flashinfer_python-0.6.2.tar.gz", "url": "flashinfer_python-0.6.2.tar.gz", "hashes": {}},
    ],
}


def index_page_read(tmp, data, server):
    """A package index's JSON project page (PEP 691), as pin and fetch_flashinfer_source read it: two
    lines where it is not one."""
    from fidev.core import package_index

    server.serve("/simple/flashinfer-python/", json.dumps(data).encode(), "application/vnd.pypi.simple.v1+json")
    base, files = package_index.listed_files(f"{server.url}/simple/flashinfer-python/")
    return package_index.file_in(files, base, "flashinfer_python-0.6.3.tar.gz")


def kept_verdicts_valid(tmp):
    when = "2026-11-28 10:00:00"
    test = "tests/smoke/test_kernels.py::test_rmsnorm"
    verdict = {"inputs": "i" * 64, "result": "failed", "when": when, "tests": [test], "failed": [test]}
    gap = {"was": FACT, "families": ["norm"], "when": when, "result": "failed"}
    return {
        "schema": "fidev-affected-verdicts/1",
        "modules": {"norm": verdict},
        "uncovered": {"include/flashinfer/norm.cuh": gap},
        "judged": {"include/flashinfer/norm.cuh": FACT, "csrc/gone.cu": None},
    }


def suite_map_valid(tmp):
    from fidev.tree import families

    counts = {f.name: 1 for f in families.FAMILIES}
    return {"suite": "key", "total": 10, "files": 2, "not_collected": 1, "families": counts}


def in_build_dir(name):
    return lambda tmp, data: module_build_records_read(tmp, name, data)


def beside_jit_dir(name):
    return lambda tmp, data: jit_dir_records_read(tmp, name, data)


# record -> (its valid content, or a function of the test's folder that makes it; its reader, as the scripts use it)
RECORDS = {
    "build stamp": (
        {
            "fingerprint": "f" * 64,
            "modules": [{"key": "norm", "name": "norm", "build_dir": "/jit/norm", "sources": ["/tree/csrc/norm.cu"]}],
        },
        build_stamp_read,
    ),
    "module inputs": (
        {"norm.cuda.o": {"/tree/csrc/norm.cu": FACT, "/tree/include/norm.cuh": [*FACT[:2], None]}},
        in_build_dir(".fidev-inputs.json"),
    ),
    "module generators": (
        {"/tree/flashinfer/norm.py": FACT, "/tree/flashinfer/gone.py": None},
        in_build_dir(".fidev-generators.json"),
    ),
    "module generator call": (
        {"module": "flashinfer.norm", "function": "gen_norm_module", "kwargs": {"dtype": "float16"}},
        in_build_dir(".fidev-generator-call.json"),
    ),
    "JIT dir's tree": ({"include/norm.cuh": FACT, "csrc/norm.cu": None}, beside_jit_dir("fidev-tree.json")),
    "JIT dir's module tests": (
        {"norm": ["tests/utils/test_norm.py::test_norm"]},
        beside_jit_dir("fidev-module-tests.json"),
    ),
    "JIT dir's tests that ran": (
        ["tests/utils/test_norm.py::test_norm"],
        beside_jit_dir("fidev-module-tests-ran.json"),
    ),
    "module's smoke key": ("norm", in_build_dir(".fidev-smoke-module.json")),
    "affected's gate": (
        {
            "schema": "fidev-affected-gate/2",
            "selection": None,
            "modules": ["norm"],
            "built": [],
            "held": True,
            "open": False,
        },
        gate_read,
    ),
    "source release's files": ({"csrc/norm.cu": FACT, "csrc/gone.cu": FACT}, release_record_read),
    "kept verdicts": (kept_verdicts_valid, kept_verdicts_read),
    "file times": ({"tests/a.py": 61.5, "tests/b.py": 3}, file_times_read),
    "suite map": (suite_map_valid, suite_map_read),
    "baseline": (
        {
            "selection": ["norm"],
            "commit": "0" * 40,
            "gpu": "H100",
            "crashed": ["tests/b.py"],
            "outcomes": {"tests/a.py::t": "passed", "tests/a.py::u": "failed"},
        },
        baseline_read,
    ),
    "sample spec": (
        {
            "schema": "fidev-upstream-sample/1",
            "seed": 3,
            "modules": {"tests/a.py::f[1]": ["norm"]},
            "required": ["norm"],
        },
        sample_spec_read,
    ),
    "sample record": (
        {
            "seed": 1,
            "functions": {"tests/a.py::f": [1, 2]},
            "whole": ["norm"],
            "missed": ["silu"],
            "exercised": ["norm"],
        },
        sample_records_read,
    ),
    "progress": ({"schema": "fidev-upstream-progress/1", "total": 3, "done": 1, "failed": 1, "t": 2.0}, progress_read),
    "outcomes": (OUTCOME_LINES, outcome_lines_read),
    "JIT report": (JIT_REPORT, jit_report_read),
    "upstream-tests' summary": (upstream_summary_valid, upstream_summary_read),
    "affected's summary": (affected_summary_valid, affected_summary_read),
    "planted bugs' record": (planted_bugs_valid, planted_bugs_read),
    "preflight's record": (PREFLIGHT_RECORD, preflight_record_read),
    "index page": (PYPI_PAGE, index_page_read),
}


def read_as_scripts_do(name, tmp, data, request):
    reader = RECORDS[name][1]
    fixtures = {"suite map": ["monkeypatch"], "index page": ["index_server"]}.get(name, [])
    return reader(tmp, data, *(request.getfixturevalue(f) for f in fixtures))


@pytest.mark.parametrize("kind", list(WRONG_TYPES))
@pytest.mark.parametrize("name", list(RECORDS))
def test_a_record_of_the_wrong_json_type_is_unreadable_never_a_traceback(tmp_path, request, name, kind):
    """Each record whole, and each of its fields and list entries, of each JSON type it is not: the
    reader's answer for an unreadable record (absent, or two lines), never a traceback nor a pass."""
    from fidev.core.failure import Failure

    valid = RECORDS[name][0]
    valid = valid(tmp_path) if callable(valid) else valid
    read_as_scripts_do(name, tmp_path / "valid", valid, request)  # the valid record reads, and says what it holds
    crashed = []
    for n, (where, data) in enumerate(wrong_typed(valid, kind)):
        try:
            read_as_scripts_do(name, tmp_path / str(n), data, request)
        except Failure as failure:
            assert failure.problem and failure.fix, where
        except Exception as e:  # noqa: BLE001 (what the reader let through, said with where)
            crashed.append(f"{where} = {WRONG_TYPES[kind]!r}: {type(e).__name__}: {e}")
    assert crashed == [], "\n".join(crashed)


# numbers json reads that no writer of ours writes: float() refuses 10**400 (OverflowError), int() NaN and Infinity
ODD_NUMBERS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf"), "10**400": 10**400}


def numbers_in(record, where=()) -> list[list]:
    """Where `record` holds a number (keys and indices), as put takes it."""
    if isinstance(record, (int, float)) and not isinstance(record, bool):
        return [list(where)]
    children = record.items() if isinstance(record, dict) else enumerate(record) if isinstance(record, list) else ()
    return [found for key, child in children for found in numbers_in(child, (*where, key))]


@pytest.mark.parametrize("odd", list(ODD_NUMBERS))
@pytest.mark.parametrize("name", [n for n, (valid, _) in RECORDS.items() if callable(valid) or numbers_in(valid)])
def test_a_record_holding_a_number_no_float_holds_is_unreadable_never_a_traceback(tmp_path, request, name, odd):
    """Each number of each record, NaN, (-)Infinity or a whole number past float's range (json reads them all,
    and 10**400 compares below infinity): the reader's answer for an unreadable record (the number's entry left
    out, the record absent, or two lines), never a traceback."""
    from fidev.core.failure import Failure

    valid = RECORDS[name][0]
    valid = valid(tmp_path) if callable(valid) else valid
    crashed = []
    for n, where in enumerate(numbers_in(valid)):
        try:
            read_as_scripts_do(name, tmp_path / str(n), put(valid, where, ODD_NUMBERS[odd]), request)
        except Failure as failure:
            assert failure.problem and failure.fix, where
        except Exception as e:  # noqa: BLE001 (what the reader let through, said with where)
            crashed.append(f"{'/'.join(map(str, where))} = {odd}: {type(e).__name__}: {e}")
    assert crashed == [], "\n".join(crashed)


ACCEPTANCE_RESULTS = {"smoke": {"result": "FAIL", "seconds": 9, "note": "exit 1; 0 objects compiled"}}


@pytest.mark.parametrize("kind", list(WRONG_TYPES))
def test_the_acceptance_runs_results_of_the_wrong_json_type_fail_in_two_lines(tmp_path, kind):
    """tools/gpu_acceptance.py's WORK/results.json, whole and each row and field of each JSON type it is
    not: two lines naming it, never a traceback, and never a part that passes (its smoke row failed)."""

    def resumed(results) -> subprocess.CompletedProcess:
        work = tmp_path / f"work-{len(list(tmp_path.iterdir()))}"
        written(work / "results.json", results)
        (work / "checkout.sha256").write_text(acceptance_digest())  # of this checkout: its results are read
        tool = task_path(ROOT, "gpu_acceptance.py")
        return subprocess.run(
            [sys.executable, str(tool), "--work", str(work), "--resume", "--steps", "smoke"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = resumed(ACCEPTANCE_RESULTS)
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1 and last.endswith("has a result for): smoke"), done.stdout + done.stderr
    for _, results in wrong_typed(ACCEPTANCE_RESULTS, kind):
        two_line_failure(resumed(results), "results.json is not of the shape this tool writes")


# what the preflight step reads of a check (its fix, the summary and the times are not read): each field of it
# of another JSON type leaves nothing the step could pass on
PREFLIGHT_READ = {
    "checks": [
        {"id": "host", "status": "pass", "finding": "Linux x86_64"},
        {"id": "cubin", "status": "fail", "finding": "flashinfer-cubin is not installed"},
    ]
}
PREFLIGHT_UNREADABLE = "preflight --json's record of its checks is unreadable"


@pytest.mark.parametrize("kind", list(WRONG_TYPES))
def test_the_acceptance_runs_preflight_record_of_the_wrong_json_type_fails_the_step_naming_it(tmp_path, kind):
    """The acceptance run's preflight step on a record whose checks pass (but one of HOST_LACKS not
    installed), whole and each of the fields it reads of each JSON type it is not: the step fails, its note
    naming the unreadable record and its log, never a traceback and never a pass."""
    log = tmp_path / "logs/preflight.log"
    verdict = acceptance_tool().preflight_verdict
    assert verdict(json.dumps(PREFLIGHT_READ), log) == (
        True,
        "1 of 2 pass or warn; no other FAIL; the host lacks flashinfer-cubin",
    )
    for where, data in wrong_typed(PREFLIGHT_READ, kind):
        passed, note = verdict(json.dumps(data), log)
        assert not passed and note.startswith(PREFLIGHT_UNREADABLE) and note.endswith(f"see {log}"), (where, note)


def test_the_acceptance_runs_preflight_step_records_its_verdict_and_seconds_in_the_results_file(tmp_path, monkeypatch):
    """The preflight step itself, its command's output given: results.json gets a row of the shape every
    step writes (result, seconds a number, note), as --resume and the table read it; once on the record
    that passes, once on one that cannot be read."""
    tool = acceptance_tool()
    run = tool.Run(tmp_path / "work", None, tmp_path / "cuda")
    monkeypatch.setattr(tool, "host_cuda", lambda: "13.0")
    for out, result in ((json.dumps(PREFLIGHT_READ), tool.PASSED), ("Traceback ...", tool.FAILED)):
        monkeypatch.setattr(run, "sh", lambda name, argv, env=None, out=out: (0, out, 0.25))
        tool.preflight(run)
        row = json.loads((tmp_path / "work/results.json").read_text())["preflight"]
        assert row["result"] == result and row["seconds"] == 0.2 and isinstance(row["note"], str), row


@pytest.mark.parametrize(
    ("out", "said"),
    [
        ("", "not JSON: substring not found"),
        ("Traceback (most recent call last):\n  ...\nImportError: no torch\n", "not JSON"),
        ('{"checks": [{"id": "host", "status": "pass"', "not JSON"),
        ('{"a": ' * 100_000, "not JSON: it is nested too deeply"),
        ('{"error": "pixi.toml is missing", "fix": "run from the checkout"}', "it says 'pixi.toml is missing'"),
        ('{"checks": []}', "not of the shape preflight writes"),
        ('{"checks": [{"id": "host", "status": "passed", "finding": "Linux"}]}', "not of the shape"),
    ],
)
def test_an_acceptance_preflight_output_without_its_record_fails_the_step_naming_it(tmp_path, out, said):
    """No JSON object in preflight's output (it crashed), one cut short or nested past the parser,
    preflight's own two lines, a record with no check or a status preflight never writes: the step fails,
    its note saying why, never a traceback and never a pass on nothing."""
    passed, note = acceptance_tool().preflight_verdict(out, tmp_path / "preflight.log")
    assert not passed and note.startswith(f"{PREFLIGHT_UNREADABLE} ({said}"), note


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("result", "MAYBE", "has result 'MAYBE', not pass or FAIL"),
        ("result", "PASS", "has result 'PASS', not pass or FAIL"),
        ("seconds", -5, "took -5 seconds"),
        ("seconds", float("nan"), "took nan seconds"),
        ("seconds", float("inf"), "took inf seconds"),
        ("seconds", 10**400, "took 100000000000000000000000... (401 characters) seconds"),
    ],
    ids=["MAYBE", "PASS", "negative", "NaN", "1e999", "10**400"],
)
def test_an_acceptance_result_no_run_writes_fails_in_two_lines(tmp_path, field, value, problem):
    """A row of the right shape whose result is none the tool writes, or whose time is below 0 or not
    finite (10**400 compares below infinity, and float() refuses it): two lines naming results.json and the row,
    never printed as `-5.0 s` or `nan s`, never an OverflowError."""
    work = tmp_path / "work"
    row = {**ACCEPTANCE_RESULTS["smoke"], field: value}
    work.mkdir()
    text = json.dumps({"smoke": row}).replace("Infinity", "1e999")
    (work / "results.json").write_text(text)
    done = subprocess.run(
        [
            sys.executable,
            str(task_path(ROOT, "gpu_acceptance.py")),
            "--work",
            str(work),
            "--resume",
            "--steps",
            "smoke",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, f"results.json's smoke {problem}")


TOML_VALUES = {
    "string": "x",
    "integer": 5,
    "float": 1.5,
    "boolean": True,
    "date": datetime.date(2026, 11, 25),
    "array": ["a"],
    "inline table": {"path": "x"},
}


def toml_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "float", str: "string", list: "array", dict: "inline table"}.get(type(value), "date")


WHEEL = "flashinfer_python-0.6.3-py3-none-any.whl"
PIN = {"filename": WHEEL, "url": f"https://example.invalid/{WHEEL}", "sha256": "ab" * 32}
PINNED = {"flashinfer_python": {"cu129": {"x86_64": PIN}}}
PINS_TOML = {"package": {"name": "flashinfer-rs", "metadata": {"flashinfer_rs": {"pinned_wheels": PINNED}}}}


@pytest.mark.parametrize("kind", list(TOML_VALUES))
def test_a_pins_file_of_the_wrong_toml_type_fails_in_two_lines(kind):
    """prefetch's PINS (fidev.bindings.cargo_pins.read_pins): each table and value of the pinned wheels,
    of each TOML type it is not, is two lines naming where, never a traceback."""
    from fidev.bindings import cargo_pins
    from fidev.core.failure import Failure

    assert len(cargo_pins.read_pins(PINS_TOML, "Cargo.toml")) == 1
    crashed = []
    for where, document in wrong_typed(PINS_TOML, kind, TOML_VALUES, toml_type):
        try:
            cargo_pins.read_pins(document, "Cargo.toml")
        except Failure as failure:
            assert failure.problem.startswith("Cargo.toml") and failure.fix, failure.problem
        except Exception as e:  # noqa: BLE001 (what the reader let through, said with where)
            crashed.append(f"{where}: {type(e).__name__}: {e}")
    assert crashed == [], "\n".join(crashed)


@pytest.mark.parametrize("depth", range(1, 5))
def test_a_table_of_the_pins_path_of_another_type_is_named_with_its_type_not_as_missing(depth):
    """package, package.metadata, ... pinned_wheels there but no table (an integer): said as such, with the fix that
    regenerates the block, not "has no [...] table", which sends the user to look for another file."""
    from fidev.bindings import cargo_pins
    from fidev.core.failure import Failure

    keys = cargo_pins.METADATA_PATH[:depth]
    document: dict = {}
    level = document
    for key in keys[:-1]:
        level = level.setdefault(key, {})
    level[keys[-1]] = 5
    with pytest.raises(Failure) as refused:
        cargo_pins.read_pins(document, "Cargo.toml")
    assert refused.value.problem == f"Cargo.toml: {'.'.join(keys)} is int 5, not a table", refused.value.problem
    assert "pin WHEEL" in refused.value.fix


def test_prefetch_refuses_a_pinned_wheel_that_is_no_table_in_two_lines(tmp_path):
    pins_file = tmp_path / "Cargo.toml"
    pins_file.write_text("[package.metadata.flashinfer_rs.pinned_wheels]\nflashinfer_python = \"0.6.3\"\n")
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, "prefetch.py")), str(pins_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, "pinned_wheels.flashinfer_python is str '0.6.3', not a table of tables")


def read_the_manifest_as_scripts_do(manifest: dict, monkeypatch) -> None:
    """Every reader of the manifest's tables and values (fidev.core.manifest, fidev.jit.activation) on `manifest`."""
    from fidev.core import manifest as fidev_manifest
    from fidev.jit import activation

    for module in (fidev_manifest, activation):
        monkeypatch.setattr(module, "load_manifest", lambda path=None: copy.deepcopy(manifest))
    fidev_manifest.pins.cache_clear()
    fidev_manifest.package_indexes.cache_clear()
    try:
        fidev_manifest.pins()
        fidev_manifest.package_indexes()
        for environment in fidev_manifest.ENVIRONMENTS:
            fidev_manifest.pypi_requirements(environment)
        fidev_manifest.default_python()
        for task in ("test", "lint"):
            fidev_manifest.task_command(task)
        for task in fidev_manifest.task_names():
            fidev_manifest.task_chain(task)
        activation.apply({"PATH": "/usr/bin"}, "/prefix")
    finally:
        fidev_manifest.pins.cache_clear()
        fidev_manifest.package_indexes.cache_clear()


@pytest.mark.parametrize("kind", list(TOML_VALUES))
def test_every_manifest_table_and_value_of_the_wrong_toml_type_fails_in_two_lines(monkeypatch, kind):
    """The manifest (pyproject.toml), each table and value of it of each TOML type it is not, as every
    reader of it reads it: two lines or what it holds, never a traceback."""
    from fidev.core.failure import Failure
    from fidev.core.manifest import load_manifest

    manifest = load_manifest()
    read_the_manifest_as_scripts_do(manifest, monkeypatch)
    crashed = []
    for where, document in wrong_typed(manifest, kind, TOML_VALUES, toml_type):
        try:
            read_the_manifest_as_scripts_do(document, monkeypatch)
        except Failure as failure:
            assert failure.problem and failure.fix, where
        except Exception as e:  # noqa: BLE001 (what a reader let through, said with where)
            crashed.append(f"{where}: {type(e).__name__}: {e}")
    assert crashed == [], "\n".join(crashed)


@pytest.mark.parametrize(
    "args",
    [["abi.py", "{fifo}"], ["artifacts.py", "{fifo}"], ["pin.py", "{fifo}"]],
    ids=["abi", "artifacts", "pin"],
)
def test_a_fifo_named_as_a_release_or_a_wheel_is_said_for_what_it_is(tmp_path, args):
    """A named pipe given where a source release or a wheel goes is said to be one, in two lines:
    not "does not exist", and not read (reading a FIFO would wait for a writer)."""
    fifo = tmp_path / "flashinfer_jit_cache-0.6.3-py3-none-any.whl"
    os.mkfifo(fifo)
    script, *rest = args
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *(a.format(fifo=fifo) for a in rest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    two_line_failure(done, f"{fifo} is a named pipe (FIFO), not a regular file")


@pytest.mark.parametrize("script", ["affected.py", "upstream_tests.py"])
def test_a_path_with_a_line_break_keeps_the_problem_and_its_fix_two_lines(tmp_path, script):
    """A --summary path that holds a line break, and is a FIFO: the problem quotes it with `\\n`, so stderr
    is exactly the problem's line and the fix's, as a reader of the two lines takes them."""
    fifo = tmp_path / "out\nput.json"
    os.mkfifo(fifo)
    argv = ["--list"] if script == "affected.py" else ["norm"]
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, script)), *argv, "--summary", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base")},
    )
    two_line_failure(done, f"{tmp_path}/out\\nput.json exists and is a named pipe", status=2)
    assert len(done.stderr.strip().splitlines()) == 2, done.stderr


@pytest.mark.parametrize(
    ("script", "argv", "problem"),
    [
        (
            "fetch_flashinfer_source.py",
            ["--archive", "{tmp}/" + pins().sdist_name, "--dest", "{tmp}/typo/deeper/flashinfer"],
            "the manifest pins",
        ),
        ("stage_gpu_host.py", ["{tmp}/typo/deeper", "--flashinfer-git", "{tmp}/no-checkout"], "is not a FlashInfer"),
    ],
    ids=["fetch: the hash check fails", "stage: no checkout"],
)
def test_a_run_that_fails_leaves_no_folder_it_made(tmp_path, script, argv, problem):
    """A destination whose folders do not exist yet, then a failure (the archive is not the release; no
    FlashInfer checkout to stage tests from): the two lines, and none of the folders made for it is left."""
    (tmp_path / "no-checkout").mkdir()  # a folder, and no git checkout
    done = run(script, argv, tmp_path)
    two_line_failure(done, problem)
    assert not (tmp_path / "typo").exists(), sorted(p.name for p in (tmp_path / "typo").rglob("*"))


@pytest.mark.parametrize(
    ("program", "said"),
    [
        ("no-such-cmd-xyz", "it is no program on the PATH"),
        ("{tmp}/notes.txt", "it is not executable"),
        ("{tmp}", "it is a folder"),
        ("nvcc", "Exec format error"),  # found in the layout's bin/ (an empty file): fails only once laid out
    ],
)
@pytest.mark.parametrize("where", ["new", "an empty folder"])
def test_conda_layout_with_a_command_it_cannot_run_leaves_no_prefix(tmp_path, program, said, where):
    """A command that cannot run: the two lines, and no prefix left laid out (nor the folders made for it); an
    empty folder named as the prefix is left empty. What can be told before is told before the layout."""
    (tmp_path / "notes.txt").write_text("")
    prefix = tmp_path / "made" / "pfx" if where == "new" else tmp_path / "pfx"
    if where != "new":
        prefix.mkdir()
    done = run("conda_layout.py", [str(prefix), "--", program], tmp_path)
    two_line_failure(done, f"cannot run {program.format(tmp=tmp_path)!r} in the prefix: {said}")
    assert not (tmp_path / "made").exists() and not [name for name in os.listdir(tmp_path) if ".pfx" in name]
    assert where == "new" or os.listdir(prefix) == []


def test_conda_layout_into_a_folder_of_the_users_names_what_it_holds_and_changes_nothing(tmp_path):
    """A prefix that holds a file of the user's and no replica: two lines saying that it lays a replica out
    only into an empty or new folder, not a write error with an unrelated fix; the file stays as it was."""
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    (prefix / "notes.txt").write_text("mine")
    done = run("conda_layout.py", [str(prefix), "--print-env"], tmp_path)
    two_line_failure(done, f"{prefix} holds files and is no replica this tool laid out")
    assert sorted(p.name for p in prefix.iterdir()) == ["notes.txt"] and (prefix / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("script", ["affected.py", "upstream_tests.py"])
def test_an_option_value_that_reads_as_an_option_is_refused_and_no_file_is_written(tmp_path, script):
    """`--summary=--x` (the = form hands argparse any value): refused in two lines as `--summary --x` is, and
    no file named --x is written where it runs; ./--x names such a file."""
    argv = ["--list"] if script == "affected.py" else ["norm"]
    done = run(script, [*argv, "--summary=--x"], tmp_path)
    two_line_failure(done, "the path --x starts with -, as an option does", status=2)
    assert not (tmp_path / "--x").exists()


def test_a_stats_value_that_is_no_ascii_digits_is_left_out_not_a_traceback(tmp_path):
    """ccache --print-stats read counter by counter: a value of '²' (str.isdigit takes it, int() does not) or
    '٣' is no counter value; the others are read."""
    ccache = tmp_path / "ccache"
    ccache.write_text(
        "#!/bin/sh\nprintf 'cache_miss\\t\\302\\262\\ndirect_cache_hit\\t3\\nfiles_in_cache\\t\\331\\243\\n'\n"
    )
    ccache.chmod(0o755)
    from fidev.jit import compile_cache

    assert compile_cache.stats(ccache, dict(os.environ)) == {"direct_cache_hit": 3}


@pytest.mark.parametrize(
    ("script", "argv", "env", "problem"),
    [
        ("upstream_tests.py", ["norm"], {"FLASHINFER_WORKSPACE_BASE": "/proc/fidev-x"}, "is under /proc, which is not"),
        ("affected.py", ["--list"], {"FLASHINFER_WORKSPACE_BASE": "/proc/fidev-x"}, "is under /proc, which is not"),
        ("gpu_acceptance.py", ["--work", "/proc/fidev-x", "--steps", "preflight"], {}, "nothing can be made in"),
        ("stage_gpu_host.py", ["/proc/fidev-x"], {}, "nothing can be made in the folder /proc"),
        ("affected.py", ["--list", "--summary", "/proc/fidev-x.json"], {}, "nothing can be made in the folder /proc"),
    ],
    ids=["upstream-tests base", "affected base", "acceptance --work", "stage dest", "affected --summary"],
)
def test_a_place_where_nothing_can_be_made_is_refused_before_the_work(tmp_path, script, argv, env, problem):
    """/proc, where access() says root may write and no file can be made: a JIT base, a work folder, a stage's
    destination and a summary there are refused in two lines before any work (the dry run, the run), tried by
    making a file there, not by access()."""
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, script)), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base"), **env},
        cwd=tmp_path,
    )
    two_line_failure(done, problem, status={1, 2})
    assert "dry run" not in done.stdout + done.stderr


@pytest.mark.parametrize("length", ["²", "9" * 5001], ids=["superscript two", "5001 nines"])
def test_a_content_length_of_no_ascii_digits_is_no_length_not_a_traceback(length):
    """A download whose Content-Length header is '²' (str.isdigit takes it, int() does not), or thousands of
    digits (past int()'s limit): read as no length given, the body read as it comes."""
    import io

    from fidev.core import package_index

    class Response(io.BytesIO):
        headers = {"Content-Length": length}

    body = b"x" * 10
    assert b"".join(package_index.read_chunks(Response(body), "http://index/x.whl", 30.0)) == body


def test_a_base_that_takes_no_file_is_no_refusal_where_the_way_to_the_version_folder_does(tmp_path, monkeypatch):
    """A read-only base (a home folder) whose .cache is a writable mount: FlashInfer writes only there, so the
    workspace is read without a refusal; the probe is made in the deepest folder on the way, not in the base."""
    from fidev.core import files, workspace

    base = tmp_path / "home"
    (base / ".cache").mkdir(parents=True)
    probed = []
    real = files.cannot_write_in
    monkeypatch.setattr(
        files,
        "cannot_write_in",
        lambda folder: probed.append(folder) or (None if folder != base else "Read-only file system"),
    )
    ws = workspace.read(pins().flashinfer, {workspace.BASE_VARIABLE: str(base)})
    assert ws.base == base and probed == [base / ".cache"], probed
    assert real(tmp_path) is None


@pytest.mark.parametrize(
    ("script", "argv", "problem"),
    [
        ("gpu_acceptance.py", ["--steps", "planted-bugs", "--planted-bugs", "rope\nx"], "names no bug rope\\nx"),
        ("prefetch.py", ["{tmp}/Cargo.toml", "x\nfix: all good"], "unrecognized arguments: x\\nfix: all good"),
        ("planted_bugs.py", ["--list", "--bugs", "a\nb"], "--list runs no bug: it takes no --bugs"),
    ],
    ids=["our own usage error", "argparse's own", "a tool's"],
)
def test_a_line_break_in_a_usage_error_keeps_it_two_lines(tmp_path, script, argv, problem):
    """A value with a line break in a usage error, ours or argparse's own: quoted as \\n in the problem's line,
    never read as the start of the fix (a fix line that says what the user typed)."""
    done = run(script, argv, tmp_path)
    two_line_failure(done, problem, status=2)
    assert len(done.stderr.strip().splitlines()) == 2, done.stderr


def test_conda_layouts_exports_are_shell_words_that_run_nothing(tmp_path):
    """A prefix whose path holds a quote and a $(...): --print-env's exports, eval'd by bash, set CONDA_PREFIX to
    that path and run nothing of it (Python's repr was no shell quoting)."""
    prefix = tmp_path / "x'$(touch PWNED)'y"
    done = run("conda_layout.py", [str(prefix), "--print-env"], tmp_path)
    assert done.returncode == 0, done.stderr
    shown = subprocess.run(
        ["bash", "-c", 'eval "$1"; printf %s "$CONDA_PREFIX"', "bash", done.stdout],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert shown.stdout == str(prefix.resolve()) and not (tmp_path / "PWNED").exists(), shown


@pytest.mark.parametrize("kind", ["fifo", "file", "missing"])
def test_a_flashinfer_checkout_that_is_no_folder_is_said_for_what_it_is_before_anything_is_staged(tmp_path, kind):
    """--flashinfer-git naming a named pipe, a file or nothing: a usage error naming it for what it is, not
    "not a FlashInfer git checkout" once the stage folder was made."""
    checkout = tmp_path / "checkout"
    if kind == "fifo":
        os.mkfifo(checkout)
    elif kind == "file":
        checkout.write_text("")
    said = {"fifo": "is a named pipe (FIFO), not a folder", "file": "is a file, not a folder"}.get(
        kind, "does not exist"
    )
    done = run("stage_gpu_host.py", ["{tmp}/stage", "--flashinfer-git", str(checkout)], tmp_path)
    two_line_failure(done, f"--flashinfer-git: {checkout} {said}", status=2)
    assert not (tmp_path / "stage").exists()


def test_a_staged_source_release_cut_short_is_refused_not_said_staged(tmp_path):
    """A stage folder holding a source release of the pinned name that is not the pinned release (a copy cut
    short): two lines naming its sha256 against the manifest's, before anything is staged, and it is kept as
    it was (the user's to remove); never `staged ... into`."""
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / pins().sdist_name).write_bytes(b"cut short")
    (tmp_path / "no-checkout").mkdir()
    done = run("stage_gpu_host.py", [str(stage), "--flashinfer-git", "{tmp}/no-checkout"], tmp_path)
    two_line_failure(done, f"{stage / pins().sdist_name} has sha256")
    assert "staged" not in done.stdout and (stage / pins().sdist_name).read_bytes() == b"cut short"


@pytest.mark.skipif(
    not os.path.exists("/proc/self/mem"), reason="no /proc/self/mem here: a regular-looking file that cannot be read"
)
def test_a_carried_wheel_that_cannot_be_read_is_two_lines(tmp_path):
    """prefetch --from DIR whose wheel is a link to a file that stat calls regular but no read succeeds on
    (/proc/self/mem: an input/output error, as a failing disk gives): two lines naming it, not a traceback."""
    from fidev.bindings import cargo_pins

    wheel = "flashinfer_python-0.6.3-py3-none-any.whl"
    pinned = cargo_pins.Pin("flashinfer_python", "cu129", "x86_64", wheel, f"https://x.invalid/{wheel}", "ab" * 32)
    (tmp_path / "pins.toml").write_text(cargo_pins.pin_toml([pinned]))
    (tmp_path / "carried").mkdir()
    (tmp_path / "carried" / wheel).symlink_to("/proc/self/mem")
    done = run("prefetch.py", [str(tmp_path / "pins.toml"), "--from", str(tmp_path / "carried")], tmp_path)
    two_line_failure(done, f"{tmp_path / 'carried' / wheel} cannot be read")


@pytest.mark.skipif(
    not os.path.exists("/proc/self/mem"), reason="no /proc/self/mem here: a regular-looking file that cannot be read"
)
def test_an_archive_that_cannot_be_read_is_said_as_such_not_blamed_on_dest(tmp_path):
    """fetch_flashinfer_source --archive that stat calls regular and no read succeeds on: two lines naming the
    archive (an input/output error), not `cannot write --dest`; nothing is left where --dest points."""
    (tmp_path / "carried").mkdir()
    archive = tmp_path / "carried" / pins().sdist_name
    archive.symlink_to("/proc/self/mem")
    done = run("fetch_flashinfer_source.py", ["--archive", str(archive), "--dest", "{tmp}/fi"], tmp_path)
    two_line_failure(done, f"cannot read --archive {archive}")
    assert not (tmp_path / "fi").exists()


NOT_UTF8 = os.fsdecode(b"\xff")  # the byte as Python holds a path's that is no UTF-8: the surrogate U+DCFF


@pytest.mark.parametrize(
    "script, argv",
    [
        ("abi.py", ["{tmp}/{byte}/x.tar.gz"]),
        ("artifacts.py", ["{tmp}/{byte}.whl"]),
        ("fetch_flashinfer_source.py", ["--dest", "{tmp}/fi", "--archive", "{tmp}/{byte}.tar.gz"]),
        ("fetch_flashinfer_source.py", ["--dest", "{tmp}/{byte}" + "x" * 300]),
        ("gpu_acceptance.py", ["--work", "{tmp}/work", "--steps", "setup", "--staged", "{tmp}/{byte}"]),
    ],
    ids=["abi", "artifacts", "fetch --archive", "fetch --dest's part too long", "gpu_acceptance --staged"],
)
def test_a_path_that_is_not_utf8_is_shown_with_its_bytes(tmp_path, script, argv):
    """A path named with a byte that is no UTF-8 (b'\\xff') is shown in our two lines with that byte, `\\xff`,
    never as the surrogate Python holds it by (`\\udcff`)."""
    done = run(script, [a.replace("{byte}", NOT_UTF8) for a in argv], tmp_path)
    two_lines(done, {1, 2})
    assert "\\xff" in done.stderr.strip().splitlines()[-2] and "\\udc" not in done.stderr, done.stderr


def test_a_report_naming_a_path_that_is_not_utf8_is_printed_under_a_strict_stdout(tmp_path):
    """A UTF-8 locale's stdout refuses a surrogate (errors strict): abi's report of a tree whose folder holds
    such a byte is printed with it shown as `\\xff`, never a traceback."""
    require("tree_sitter", "tree_sitter_cpp", why="abi parses C++ with tree-sitter (a flashinfer-dev dependency)")
    tree = Path(os.fsdecode(os.fsencode(tmp_path) + b"/tree\xff"))
    (tree / "csrc").mkdir(parents=True)
    (tree / "csrc" / "a.cu").write_text("void f(int x) {}\nTVM_FFI_DLL_EXPORT_TYPED_FUNC(f, f);\n")
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, "abi.py")), str(tree)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines()[0].startswith(f"abi: {tmp_path}/tree\\xff (FlashInfer"), done.stdout


def test_a_report_file_naming_a_path_that_is_not_utf8_is_written_with_its_bytes_shown(tmp_path):
    """A --summary or --record (write_whole) that names such a path is written, as UTF-8, the byte shown as
    `\\xff`, never a UnicodeEncodeError at the run's end."""
    from fidev.core.files import write_whole

    write_whole(tmp_path / "summary.txt", f"tests of {tmp_path}/{NOT_UTF8}.py\n")
    assert (tmp_path / "summary.txt").read_bytes() == f"tests of {tmp_path}/\\xff.py\n".encode()


# pytest's options that name a path, as smoke, abi-smoke and upstream-tests hand them on: (arguments, {fifo},
# what the problem says). pytest would wait on a FIFO it is to write or read, and fail on /dev/full with its
# traceback.
PYTEST_PATHS = {
    "--junitxml=FIFO": (["--junitxml={fifo}"], "pytest's --junitxml {fifo} is a named pipe (FIFO)"),
    "--junit-xml FIFO": (["--junit-xml", "{fifo}"], "pytest's --junit-xml {fifo} is a named pipe (FIFO)"),
    "--junitxml=/dev/full": (["--junitxml=/dev/full"], "pytest's --junitxml /dev/full is a character device"),
    "--log-file=FIFO": (["--log-file={fifo}"], "pytest's --log-file {fifo} is a named pipe (FIFO)"),
    "-o log_file=FIFO": (["-o", "log_file={fifo}"], "pytest's -o log_file {fifo} is a named pipe (FIFO)"),
    "--debug=FIFO": (["--debug={fifo}"], "pytest's --debug {fifo} is a named pipe (FIFO)"),
    "-c=FIFO": (["-c={fifo}"], "pytest's -c {fifo} is a named pipe (FIFO), not a regular file"),
    "--config-file FIFO": (["--config-file", "{fifo}"], "pytest's --config-file {fifo} is a named pipe (FIFO)"),
    "--rootdir=FIFO": (["--rootdir={fifo}"], "pytest's --rootdir {fifo} is a named pipe (FIFO), not a folder"),
    "--basetemp=FIFO": (["--basetemp={fifo}"], "pytest's --basetemp {fifo} is a named pipe (FIFO), not a folder"),
}
PYTEST_PATH_CASES = [
    *[("smoke.py", [], case) for case in PYTEST_PATHS],
    *[
        (script, before, case)
        for script, before in (("abi_smoke.py", []), ("upstream_tests.py", ["norm", "--yes"]))
        for case in ("--junitxml=FIFO", "--junitxml=/dev/full", "-c=FIFO")
    ],
]


@pytest.mark.parametrize("script, before, case", PYTEST_PATH_CASES, ids=[f"{c[0]} {c[2]}" for c in PYTEST_PATH_CASES])
def test_a_path_handed_to_pytest_that_is_no_file_of_its_kind_is_bad_usage_before_pytest_starts(
    tmp_path, script, before, case
):
    named = fifo(tmp_path)
    args, problem = PYTEST_PATHS[case]
    done = run(script, [*before, *(a.replace("{fifo}", named) for a in args)], tmp_path)
    two_lines(done, {2})
    assert problem.replace("{fifo}", named) in done.stderr.strip().splitlines()[-2], done.stderr
    assert stat.S_ISFIFO(os.lstat(named).st_mode)


def test_pytests_addopts_are_checked_as_its_arguments_are(tmp_path):
    env = {**os.environ, "PYTEST_ADDOPTS": "-q --junitxml=/dev/full"}
    done = subprocess.run(
        [sys.executable, str(task_path(ROOT, "smoke.py"))], capture_output=True, text=True, timeout=120, env=env
    )
    two_line_failure(done, "smoke: PYTEST_ADDOPTS: pytest's --junitxml /dev/full is a character device", status=2)


@pytest.mark.parametrize(
    "args, found",
    [
        (["-k", "x", "--junitxml", "a.xml"], [("--junitxml", "a.xml")]),
        (["-cconf.ini", "-c=b.ini", "-c", "c.ini"], [("-c", "conf.ini"), ("-c", "b.ini"), ("-c", "c.ini")]),
        (["--debug", "-x"], [("--debug", "pytestdebug.log")]),
        (["--debug"], [("--debug", "pytestdebug.log")]),
        (["--debug", "d.log"], [("--debug", "d.log")]),
        (
            ["-o", "junit_family=xunit1", "-olog_file=l.log", "--override-ini=log_file=m.log"],
            [("-o log_file", "l.log"), ("-o log_file", "m.log")],
        ),
        (["--", "--junitxml=a.xml"], []),
        (["--junitxml"], []),  # pytest says the value is missing
        (["--junit-prefix=x", "-k", "-c"], []),
    ],
)
def test_the_paths_handed_to_pytest_are_read_as_pytest_reads_them(args, found):
    from fidev.smoke.pytest_usage import path_options

    assert list(path_options(args)) == found


def test_a_problem_quoting_control_characters_is_one_line_with_each_shown_escaped():
    """fidev.core.failure.one_line, which every error: and fix: line (and preflight's lines) go through."""
    from fidev.core.failure import one_line

    assert one_line("a\nb\r\x00\x1b\t\u2028\udcff é z") == "a\\nb\\r\\x00\\x1b\\t\\u2028\\xff é z"


@pytest.mark.parametrize(
    "args",
    [
        ["--junitxml=/dev/null"],
        ["--log-file", "/dev/null"],
        ["-o", "log_file=/dev/null"],
        ["-c", "/dev/null"],
        ["--confcutdir=/no/such/folder"],
    ],
)
def test_what_pytest_itself_takes_is_handed_on(args):
    """os.devnull is pytest's own default log file, and an empty configuration; a --confcutdir past which there
    is nothing bounds nothing: none is refused."""
    from fidev.smoke.pytest_usage import refuse_odd_paths

    refuse_odd_paths("smoke", args)
