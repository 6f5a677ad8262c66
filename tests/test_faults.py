"""The fault table of docs/faults.md ("When a step fails: the fault table"), row by row.

Each test carries its row's id (`@fault("...")`), runs the script as a user would (a fresh
interpreter, or a copy of the workspace with a broken manifest), and checks the row's `error:` and
`fix:` text, as the docs state it, against what the script printed: no traceback, the exit
status, and that nothing was left half-written. The first test holds the table and the tests to
the same list.
"""

import dataclasses
import hashlib
import importlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

from fidev.core.manifest import ROOT, pins
from fidev.tree import source_tree
from module_fixtures import JIT_CACHE_WHEEL, make_wheel
from script_runs import (
    BUILD_TOOLS,
    expect_unwritten,
    final_write_fails,
    missing_tools,
    require,
    run,
    signal_held,
    start_held,
    task_path,
    wait_until,
)

P = pins()
DOC = ROOT / "docs" / "faults.md"
SECTION = "## When a step fails: the fault table"


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    error: str | None  # what the `error:` line must contain; None: the row prints no error line
    fix: str | None  # likewise for the `fix:` line; None with an error: one line only


def _code(cell: str) -> str | None:
    match = re.search(r"`([^`]*)`", cell)
    return match.group(1) if match else None


def table() -> dict[str, Row]:
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ")]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            rows[_code(cells[0])] = Row(_code(cells[0]), _code(cells[3]), _code(cells[4]))
    return rows


ROWS = table()


def fault(row_id):
    return pytest.mark.fault(row_id)


def expect(done, row_id, status=1, said_as=None):
    """The script failed the way the row says: status, the row's text, no traceback. `said_as`
    maps the row's wording to a sibling script's (smoke -> abi-smoke)."""
    row = ROWS[row_id]
    if said_as:
        row = Row(row.id, row.error.replace(*said_as), row.fix and row.fix.replace(*said_as))
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    assert done.returncode == status, out
    lines = done.stderr.strip().splitlines()
    if row.fix is None:
        assert lines and lines[-1].startswith("error: ") and row.error in lines[-1], lines
        assert len([x for x in lines if x.startswith("error: ")]) == 1 and not any(
            x.lstrip().startswith("fix:") for x in lines
        ), lines
        return
    assert len(lines) >= 2 and lines[-2].startswith("error: ") and row.error in lines[-2], lines
    assert lines[-1].lstrip().startswith("fix: ") and row.fix in lines[-1], lines


def test_every_row_has_a_test_and_every_test_a_row():
    marks = [m for obj in list(globals().values()) for m in getattr(obj, "pytestmark", [])]
    marks += [pm for m in marks if m.name == "parametrize" for value in m.args[1] for pm in getattr(value, "marks", ())]
    marked = [m.args[0] for m in marks if m.name == "fault"]
    assert sorted(set(marked)) == sorted(ROWS), set(marked) ^ set(ROWS)
    assert len(marked) == len(set(marked)), "a row has two tests"
    assert all(r.error or r.id in ("broken-pipe", "help-runs-nothing", "help-whole-sentences") for r in ROWS.values())


# ---------------------------------------------------------------- shared set-ups


def workspace(tmp_path):
    """A copy of the scripts and the manifest, to break the manifest without touching this one."""
    ws = tmp_path / "ws"
    for d in ("scripts", "tools"):
        shutil.copytree(ROOT / d, ws / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", ws)
    return ws


def run_in(ws, script, *args, env=None):
    if script == ".ci/run":
        return run_ci(ws)
    return subprocess.run(
        [sys.executable, str(task_path(ws, script)), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def run_ci(ws):
    """.ci/run of a workspace copy on a PATH without pixi: its pixi-less branch, which reads the
    manifest before it builds anything."""
    (ws / ".ci").mkdir(exist_ok=True)
    shutil.copy(ROOT / ".ci/run", ws / ".ci/run")
    path = os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(d, "pixi"))
    )
    return subprocess.run(
        ["bash", str(ws / ".ci/run")], capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": path}
    )


def sdist(files, top=f"flashinfer_python-{P.flashinfer}"):
    """A .tar.gz shaped like the source release, with `files` in it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def index_env(server, timeout_s=5):
    """pip's configuration pointing at the local server alone; its timeout is the scripts' stall limit."""
    return {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": f"{server.url}/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_DEFAULT_TIMEOUT": str(timeout_s),
    }


def publish_sdist(server, body, sha="", behaviour="whole"):
    """The release on the local index's project page, with a published hash or none."""
    url = f"{server.url}/files/{P.sdist_name}"
    server.serve(f"/files/{P.sdist_name}", body, behaviour=behaviour)
    server.publish("flashinfer-python", [(P.sdist_name, url, sha)], "html")


def fake_flashinfer(tmp_path, *, where=None, data=True, archs="{(9, 0)}"):
    """A `flashinfer` package standing in for the real one, for the chain's failure paths:
    imported from `where` (default: a folder outside the vendored tree), its JIT source folders
    present or not, and the GPU architectures it would build for."""
    pkg = (where or tmp_path / "elsewhere") / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {P.flashinfer!r}\n")
    (pkg / "jit" / "__init__.py").write_text("")
    data_dir = pkg / "data"
    if data:
        for sub in ("csrc", "include", "cutlass/include", "spdlog/include"):
            (data_dir / sub).mkdir(parents=True)
    (pkg / "jit" / "env.py").write_text(
        "import pathlib\n"
        f"d = pathlib.Path({str(data_dir)!r})\n"
        "FLASHINFER_CSRC_DIR, FLASHINFER_INCLUDE_DIR = d / 'csrc', d / 'include'\n"
        "CUTLASS_INCLUDE_DIRS, SPDLOG_INCLUDE_DIR = [d / 'cutlass' / 'include'], d / 'spdlog' / 'include'\n"
        "FLASHINFER_JIT_DIR = pathlib.Path('/nonexistent/jit')\nFLASHINFER_AOT_DIR = pathlib.Path('/nonexistent/aot')\n"
    )
    (pkg / "jit" / "core.py").write_text(
        f"class _Ctx:\n    TARGET_CUDA_ARCHS = {archs}\ncurrent_compilation_context = _Ctx()\n"
    )
    return {"PYTHONPATH": f"{pkg.parent}{os.pathsep}{ROOT / 'scripts'}"}


def as_a_terminal_starts_it() -> None:
    """In the child, before it runs: Ctrl-C's default action, as a process a terminal starts has. A
    runner that starts the suite in the background (a non-interactive shell's `&` ignores SIGINT,
    and an ignored signal stays ignored across exec) would pass that on: Python then raises no
    KeyboardInterrupt, and the interrupted script would run on to its own stall limit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_when(proc, ready, within=30, late=0.0):
    """SIGINT to `proc` (as Ctrl-C sends it) once ready() holds, `late` seconds after (a busy host's
    delay: the signal must still be what ends the run, not a timeout of the script's own)."""
    deadline = time.monotonic() + within
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready(), "the download never started"
    time.sleep(late)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ---------------------------------------------------------------- the manifest

MANIFEST_BREAKS = {
    "manifest-toml": lambda text: text.replace("[tool.flashinfer-dev]", "[tool.flashinfer-dev"),
    "manifest-utf8": lambda text: text.replace("Reproducible", "Reproducible (café)").encode(
        "latin-1"
    ),  # an editor's Latin-1
    "manifest-pin": lambda text: text.replace(f'flashinfer-cubin = "=={P.flashinfer}"', 'flashinfer-cubin = ">=0.6.3"'),
    "manifest-table": lambda text: re.sub(r"\n\[tool\.flashinfer-dev\]\n(.+\n)+", "\n", text),
}


def broken_manifest(tmp_path, row_id):
    ws = workspace(tmp_path)
    text = (ws / "pyproject.toml").read_text()
    broken = MANIFEST_BREAKS[row_id](text)
    assert broken not in (text, text.encode())
    if isinstance(broken, bytes):
        (ws / "pyproject.toml").write_bytes(broken)
    else:
        (ws / "pyproject.toml").write_text(broken)
    return ws


@pytest.mark.parametrize("row_id", [pytest.param(r, marks=fault(r)) for r in MANIFEST_BREAKS])
@pytest.mark.parametrize(
    "script, args",
    [
        ("preflight.py", []),
        ("import_check.py", []),
        ("fetch_flashinfer_source.py", []),
        ("pin.py", ["x.whl"]),
        ("abi.py", []),
        ("smoke.py", []),
        ("abi_smoke.py", []),
        ("bench_preflight.py", ["--runs", "1"]),
        (".ci/run", []),
    ],
)
def test_a_broken_manifest_fails_every_script_in_two_lines(tmp_path, row_id, script, args):
    ws = broken_manifest(tmp_path, row_id)
    done = run_in(ws, script, *args)
    if script == "bench_preflight.py":  # it reports preflight's two lines as its own first
        assert done.returncode == 1 and ROWS[row_id].error in done.stderr and "Traceback" not in done.stderr, (
            done.stderr
        )
    else:
        expect(done, row_id)


@fault("manifest-cuda-version")
@pytest.mark.parametrize("release", ["999.0", "0.1"])
@pytest.mark.parametrize("script", ["preflight.py", "fetch_flashinfer_source.py"])
def test_a_cuda_version_no_cuda_release_has_is_refused(tmp_path, script, release):
    ws = workspace(tmp_path)
    text = (ws / "pyproject.toml").read_text()
    broken = text.replace(f'cuda-version = "{P.cuda}.*"', f'cuda-version = "{release}.*"', 1)
    assert broken != text
    (ws / "pyproject.toml").write_text(broken)
    expect(run_in(ws, script), "manifest-cuda-version", said_as=("999.0", release))


@fault("manifest-json")
def test_preflight_json_still_prints_json(tmp_path):
    done = run_in(broken_manifest(tmp_path, "manifest-table"), "preflight.py", "--json")
    expect(done, "manifest-json")
    assert json.loads(done.stdout) == {
        "error": done.stderr.splitlines()[-2][len("error: ") :],
        "fix": done.stderr.splitlines()[-1].split("fix: ", 1)[1],
    }


@pytest.mark.parametrize("args", [["--json", "--cuda", "bad"], ["--cuda", "13", "--json"], ["--json", "--bogus"]])
def test_preflight_json_with_a_bad_command_line_still_prints_json(tmp_path, args):
    """A machine reading --json gets one JSON object for a bad command line too, beside the two lines."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/preflight.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert json.loads(done.stdout) == {
        "error": lines[-2][len("error: ") :],
        "fix": lines[-1].split("fix: ", 1)[1],
    }


@fault("ci-unknown-package")
@pytest.mark.parametrize(
    "table, package",
    [("[tool.pixi.dependencies]", "c-compiler"), ("[tool.pixi.feature.flashinfer-dev.dependencies]", "cuda-cudart")],
)
def test_ci_refuses_a_package_it_has_no_pypi_name_for(tmp_path, table, package):
    ws = workspace(tmp_path)
    text = (ws / "pyproject.toml").read_text()
    (ws / "pyproject.toml").write_text(text.replace(f"{table}\n", f'{table}\n{package} = "*"\n', 1))
    done = run_ci(ws)
    expect(done, "ci-unknown-package")
    assert package in done.stderr and not (ws / ".ci/venv-default").exists()


# ---------------------------------------------------------------- the source materializer


@fault("fetch-tampered")
def test_a_tampered_release_is_refused_before_anything_in_it_runs(tmp_path, index_server):
    pwned = tmp_path / "PWNED"
    backend = f"open({str(pwned)!r}, 'w').write('ran')\n"  # what pip's metadata step would have imported and run
    body = sdist(
        {
            "build_backend.py": backend,
            "setup.py": backend,
            "pyproject.toml": '[build-system]\nbuild-backend = "build_backend"\nbackend-path = ["."]\nrequires = []\n',
            "PKG-INFO": f"Name: flashinfer-python\nVersion: {P.flashinfer}\n",
        }
    )
    publish_sdist(index_server, body)
    dest = tmp_path / "extern" / "flashinfer"
    done = run("fetch_flashinfer_source.py", "--dest", dest, env=index_env(index_server))
    expect(done, "fetch-tampered")
    assert not pwned.exists(), "code from the unverified download ran"
    assert not dest.exists() and not list(dest.parent.glob(".*partial*"))


@fault("fetch-index-sha")
def test_an_index_publishing_another_hash_is_refused(tmp_path, index_server):
    publish_sdist(index_server, b"whatever", sha="0" * 64)
    expect(run("fetch_flashinfer_source.py", "--dest", tmp_path / "fi", env=index_env(index_server)), "fetch-index-sha")


@fault("fetch-offline")
def test_no_reachable_index(tmp_path):
    env = {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": "",
        "PIP_EXTRA_INDEX_URL": "",
    }
    expect(run("fetch_flashinfer_source.py", "--dest", tmp_path / "fi", env=env), "fetch-offline")
    assert not (tmp_path / "fi").exists()


@fault("fetch-missing")
def test_an_index_without_the_release(tmp_path, index_server):
    index_server.serve("/simple/flashinfer-python/", b"<html><body></body></html>", "text/html")
    expect(run("fetch_flashinfer_source.py", "--dest", tmp_path / "fi", env=index_env(index_server)), "fetch-missing")


@fault("fetch-interrupted")
def test_ctrl_c_during_the_download_leaves_no_temporary_folder(tmp_path, index_server):
    publish_sdist(index_server, os.urandom(4 << 20), behaviour="stall")
    dest = tmp_path / "extern" / "fi"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/fetch_flashinfer_source.py"), "--dest", str(dest)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **index_env(index_server, timeout_s=120)},
        preexec_fn=as_a_terminal_starts_it,
    )
    # the stall limit far past the signal, which comes 6 s late: it, not the limit, ends the download
    done = interrupt_when(proc, lambda: index_server.hits.get(f"/files/{P.sdist_name}"), late=6)
    expect(done, "fetch-interrupted", status=130)
    assert not dest.parent.exists(), "the folder made for the fetch, left"  # so no .fi.partial-*, no fi either


@fault("fetch-archive-fifo")
@pytest.mark.parametrize("named", ["a FIFO", "/dev/null"])
def test_an_archive_that_is_a_fifo_or_a_device_is_said_for_what_it_is(tmp_path, named):
    if named == "a FIFO":
        os.mkfifo(tmp_path / P.sdist_name)
    archive = tmp_path / P.sdist_name if named == "a FIFO" else "/dev/null"
    done = run("fetch_flashinfer_source.py", "--dest", tmp_path / "fi", "--archive", archive)
    if named == "a FIFO":
        expect(done, "fetch-archive-fifo")
    else:
        expect(done, "fetch-archive-fifo", said_as=("a named pipe (FIFO)", "a character device"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ([P.sdist_name] if named == "a FIFO" else [])


@fault("fetch-dest-file")
def test_dest_is_a_file(tmp_path):
    (tmp_path / "fi").write_text("mine")
    expect(
        run("fetch_flashinfer_source.py", "--dest", tmp_path / "fi", "--archive", tmp_path / "fi"), "fetch-dest-file"
    )
    assert (tmp_path / "fi").read_text() == "mine"


@fault("fetch-dest-unwritable")
def test_dest_under_a_read_only_folder(read_only_dir, tmp_path):
    archive = tmp_path / P.sdist_name
    archive.write_bytes(b"x")
    done = run("fetch_flashinfer_source.py", "--dest", read_only_dir / "fi", "--archive", archive)
    expect(done, "fetch-dest-unwritable")


@fault("fetch-dest-too-deep")
def test_a_dest_too_deep_for_the_releases_files_is_blamed_not_the_archive(tmp_path):
    """--dest itself within the system's limit on a path, the release's files unpacked there past it: --dest
    is named (the archive is the pinned one, hash-checked), and nothing is left beside it."""
    ws = workspace(tmp_path)
    archive = tmp_path / P.sdist_name
    deep_file = f"flashinfer_python-{P.flashinfer}/csrc/{'d' * 200}/{'n' * 200}.cu"
    with tarfile.open(archive, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo(deep_file), io.BytesIO(b""))
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    (ws / "pyproject.toml").write_text((ws / "pyproject.toml").read_text().replace(P.sdist_sha256, sha))
    folder = tmp_path / "deep"
    while len(os.fsencode(str(folder))) < 3800:
        folder /= "p" * 200
    folder.mkdir(parents=True)
    expect(
        run_in(ws, "fetch_flashinfer_source.py", "--dest", folder / "fi", "--archive", archive), "fetch-dest-too-deep"
    )
    assert list(folder.iterdir()) == []


@fault("fetch-archive-folder")
def test_archive_is_a_folder(tmp_path):
    expect(run("fetch_flashinfer_source.py", "--dest", tmp_path / "fi", "--archive", tmp_path), "fetch-archive-folder")


@fault("fetch-dest-workspace")
@pytest.mark.parametrize("dest", [".", ".git"])
def test_the_workspace_is_never_a_destination(dest, tmp_path):
    """On a copy of the workspace with a .git of its own, never on this checkout."""
    ws = workspace(tmp_path)
    subprocess.run(["git", "init", "-q", str(ws)], check=True)

    def git():
        return (ws / ".git").stat().st_ino, sorted(p.name for p in (ws / ".git").iterdir())

    before = git()
    done = subprocess.run(
        [sys.executable, str(ws / "scripts/fetch_flashinfer_source.py"), "--dest", dest, "--replace"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ws,
    )
    expect(done, "fetch-dest-workspace")
    assert git() == before and not list(ws.parent.glob(f"{ws.name}.replaced-*"))


@fault("fetch-other-tree")
def test_another_tree_is_kept_unless_replace_is_asked_for(tmp_path):
    body = sdist({"csrc/norm.cu": "", "include/flashinfer/norm.cuh": "", "3rdparty/cutlass/include/c.h": ""})
    archive = tmp_path / P.sdist_name
    archive.write_bytes(body)
    dest = tmp_path / "fi"
    (dest / "csrc").mkdir(parents=True)
    (dest / "csrc" / "mine.cu").write_text("// my edit")
    env_pins = dataclasses.replace(P, sdist_sha256=hashlib.sha256(body).hexdigest())
    from fidev.core.failure import Failure
    from fidev.tree.source_release import materialize

    with pytest.raises(Failure) as caught:
        materialize(dest, env_pins, archive)
    assert ROWS["fetch-other-tree"].error in caught.value.problem and ROWS["fetch-other-tree"].fix in caught.value.fix
    assert (dest / "csrc" / "mine.cu").read_text() == "// my edit"
    said = materialize(dest, env_pins, archive, replace=True)
    kept = next(tmp_path.glob("fi.replaced-*"))
    assert str(kept.name) in said and (kept / "csrc" / "mine.cu").read_text() == "// my edit"
    assert (dest / source_tree.MARKER).read_text() == source_tree.marker_text(env_pins)


# ---------------------------------------------------------------- preflight


class Preflight:
    """preflight.py in a copy of the workspace with a fake site-packages: one fault at a time."""

    def __init__(self, tmp_path):
        self.ws = workspace(tmp_path)
        self.site = tmp_path / "site"
        self.src = self.ws / "extern/tracked/flashinfer"
        self.env = {"PYTHONPATH": str(self.site), "FLASHINFER_DEV_KERNEL_SOURCE": ""}

    def dist(self, name, version, files=None):
        info = self.site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        for rel, text in (files or {}).items():
            (info / rel).write_text(text)

    def release(self, lacking=()):
        for sub in (
            "csrc/norm.cu",
            "include/flashinfer/norm.cuh",
            "3rdparty/cutlass/include/c.h",
            "3rdparty/spdlog/include/s.h",
        ):
            if not any(sub.startswith(x) for x in lacking):
                (self.src / sub).parent.mkdir(parents=True, exist_ok=True)
                (self.src / sub).write_text("")
        (self.src / source_tree.MARKER).write_text(source_tree.marker_text(P))

    def check(self, check_id, *args):
        done = subprocess.run(
            [sys.executable, "-S", str(self.ws / "scripts/preflight.py"), "--json", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **self.env},
        )
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
        checks = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
        return checks, checks[check_id]


def expect_check(result, row_id):
    """A preflight FAIL carrying the row's text in its finding and fix."""
    row = ROWS[row_id]
    assert result["status"] == "fail" and row.error in result["finding"] and row.fix in result["fix"], result


@fault("check-crash")
def test_a_check_that_crashes_is_a_fail_and_the_rest_still_run(tmp_path):
    host = Preflight(tmp_path)
    host.dist("apache-tvm-ffi", "not-a-version")
    checks, tvm = host.check("tvm-ffi")
    expect_check(tvm, "check-crash")
    assert len(checks) > 10 and all(c["finding"] for c in checks.values())


@fault("tvm-ffi-prerelease")
def test_a_prerelease_is_read_not_crashed_on(tmp_path):
    host = Preflight(tmp_path)
    host.dist("apache-tvm-ffi", "0.2.0rc1")
    expect_check(host.check("tvm-ffi")[1], "tvm-ffi-prerelease")
    host = Preflight(tmp_path / "b")
    host.dist("apache-tvm-ffi", "0.1.9rc1")
    assert host.check("tvm-ffi")[1]["status"] == "pass"


@fault("source-missing")
def test_source_folder_missing(tmp_path):
    host = Preflight(tmp_path)
    shutil.rmtree(host.src, ignore_errors=True)
    expect_check(host.check("flashinfer-source")[1], "source-missing")


@fault("source-not-a-folder")
def test_a_file_where_the_source_folder_goes(tmp_path):
    host = Preflight(tmp_path)
    shutil.rmtree(host.src, ignore_errors=True)
    host.src.parent.mkdir(parents=True, exist_ok=True)
    host.src.write_text("oops")
    expect_check(host.check("flashinfer-source")[1], "source-not-a-folder")


@fault("source-partial")
def test_a_partial_release_is_replaced_not_refetched(tmp_path):
    host = Preflight(tmp_path)
    host.release(lacking=("3rdparty/cutlass",))
    expect_check(host.check("flashinfer-source")[1], "source-partial")


@fault("source-other-marker")
def test_a_marker_that_merely_mentions_the_sha_is_not_the_release(tmp_path):
    host = Preflight(tmp_path)
    host.release()
    (host.src / source_tree.MARKER).write_text(f"flashinfer_python-0.6.2.tar.gz sha256={P.sdist_sha256}\n")
    expect_check(host.check("flashinfer-source")[1], "source-other-marker")


@fault("kernel-source-bogus")
def test_a_bogus_kernel_source_mode_is_reported_without_the_jit_cache(tmp_path):
    host = Preflight(tmp_path)
    host.env["FLASHINFER_DEV_KERNEL_SOURCE"] = "bogus"
    checks, mode = host.check("kernel-source")
    expect_check(mode, "kernel-source-bogus")
    assert checks["jit-cache"]["finding"] == "flashinfer-jit-cache is not installed"
    host.env["FLASHINFER_DEV_KERNEL_SOURCE"] = ""  # empty counts as unset, as FLASHINFER_RS_CACHE_DIR does
    assert host.check("kernel-source")[1]["status"] == "pass"
    expect(run("import_check.py", env={"FLASHINFER_DEV_KERNEL_SOURCE": "bogus"}), "kernel-source-bogus")


@fault("editable-dangling")
def test_an_editable_install_whose_tree_was_recreated(tmp_path):
    host = Preflight(tmp_path)
    host.release()  # re-created: no flashinfer/data links
    host.dist(
        "flashinfer-python",
        P.flashinfer,
        {"direct_url.json": json.dumps({"url": host.src.as_uri(), "dir_info": {"editable": True}})},
    )
    expect_check(host.check("flashinfer-install")[1], "editable-dangling")


@fault("editable-dangling-import")
@pytest.mark.parametrize("script", ["import_check.py", "build.py"])
def test_import_check_and_build_catch_the_dangling_install(tmp_path, script):
    expect(run(script, env=fake_flashinfer(tmp_path, data=False)), "editable-dangling-import")


@fault("cuda-spelling")
@pytest.mark.parametrize("script, args", [("preflight.py", []), ("pin.py", ["x.whl"]), ("prefetch.py", ["Cargo.toml"])])
def test_every_cuda_option_takes_both_spellings_and_refuses_others(script, args):
    expect(run(script, *args, "--cuda", "13"), "cuda-spelling", status=2)


# ---------------------------------------------------------------- prefetch


def crate(tmp_path, server, behaviour="whole", body=None, sha=None):
    body = body if body is not None else os.urandom(1 << 20)
    server.serve(f"/files/{JIT_CACHE_WHEEL}", body, behaviour=behaviour)
    cargo = tmp_path / "Cargo.toml"
    cargo.write_text(
        f'[package.metadata.flashinfer_rs.pinned_wheels.flashinfer_jit_cache.{P.cuda_tag}.x86_64]\n'
        f'filename = "{JIT_CACHE_WHEEL}"\nurl = "{server.url}/files/{JIT_CACHE_WHEEL}"\n'
        f'sha256 = "{sha or hashlib.sha256(body).hexdigest()}"\n'
    )
    return cargo


def prefetch(cargo, cache, *args, env=None):
    return run(
        "prefetch.py", cargo, "--arch", "x86_64", *args, env={"FLASHINFER_RS_CACHE_DIR": str(cache), **(env or {})}
    )


def leftovers(cache):
    return (
        sorted(p.name for p in (cache / "wheels").iterdir() if not p.name.endswith(".lock"))
        if (cache / "wheels").exists()
        else []
    )


@fault("cache-unwritable")
def test_cache_folder_nobody_can_write(tmp_path, index_server, read_only_dir):
    expect(prefetch(crate(tmp_path, index_server), read_only_dir / "cache"), "cache-unwritable")


@fault("cache-is-a-file")
def test_cache_folder_is_a_file(tmp_path, index_server):
    (tmp_path / "cache").write_text("")
    expect(prefetch(crate(tmp_path, index_server), tmp_path / "cache"), "cache-is-a-file")


@fault("cache-home-read-only")
def test_read_only_home(tmp_path, index_server, read_only_dir):
    done = run(
        "prefetch.py",
        crate(tmp_path, index_server),
        "--arch",
        "x86_64",
        env={"HOME": str(read_only_dir), "FLASHINFER_RS_CACHE_DIR": ""},
    )
    expect(done, "cache-home-read-only")
    assert str(read_only_dir / ".cache" / "flashinfer-rs") in done.stderr


@fault("cache-unusable")
@pytest.mark.parametrize("where", ["/proc/x", "under-a-file"])
def test_a_cache_folder_that_cannot_be_made_is_never_announced(tmp_path, index_server, where):
    if where == "under-a-file":
        (tmp_path / "file").write_text("")
        where = tmp_path / "file" / "cache"
    done = prefetch(crate(tmp_path, index_server), where)
    expect(done, "cache-unusable")
    assert done.stdout == "", "it said wheels go into a folder it could not make"


@fault("cache-blank")
@pytest.mark.parametrize("blank", [" ", "\t "])
def test_a_cache_variable_of_only_spaces_is_refused(tmp_path, index_server, blank):
    """Not a folder named by spaces made in the current folder, filled and said as the cache: two lines first."""
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, ROOT / "scripts" / "prefetch.py", crate(tmp_path, index_server), "--arch", "x86_64"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
        env={**os.environ, "FLASHINFER_RS_CACHE_DIR": blank},
    )
    expect(done, "cache-blank")
    assert os.listdir(work) == [] and done.stdout == ""


@fault("download-stall")
def test_a_download_that_stalls(tmp_path, index_server):
    cache = tmp_path / "cache"
    # a prefetch that waited on past its --timeout would be stopped by prefetch()'s own deadline, and fail here
    expect(prefetch(crate(tmp_path, index_server, "stall"), cache, "--timeout", "1"), "download-stall")
    assert leftovers(cache) == []


@fault("download-short")
def test_a_download_cut_short(tmp_path, index_server):
    cache = tmp_path / "cache"
    expect(prefetch(crate(tmp_path, index_server, "short"), cache), "download-short")
    assert leftovers(cache) == []


@fault("download-404")
def test_a_pin_url_that_answers_404(tmp_path, index_server):
    cargo = crate(tmp_path, index_server)
    cargo.write_text(cargo.read_text().replace(f"/files/{JIT_CACHE_WHEEL}", f"/gone/{JIT_CACHE_WHEEL}"))
    cache = tmp_path / "cache"
    expect(prefetch(cargo, cache), "download-404")
    assert not cache.exists()


@fault("download-hash")
def test_a_download_with_the_wrong_hash(tmp_path, index_server):
    cache = tmp_path / "cache"
    expect(prefetch(crate(tmp_path, index_server, sha="1" * 64), cache), "download-hash")
    assert leftovers(cache) == []


@fault("download-interrupted")
def test_ctrl_c_during_a_download(tmp_path, index_server):
    cache = tmp_path / "cache"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts/prefetch.py"),
            str(crate(tmp_path, index_server, "stall", os.urandom(8 << 20))),
            "--arch",
            "x86_64",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FLASHINFER_RS_CACHE_DIR": str(cache)},
        preexec_fn=as_a_terminal_starts_it,
    )
    done = interrupt_when(
        proc, lambda: (cache / "wheels").exists() and any(".tmp-" in p.name for p in (cache / "wheels").iterdir())
    )
    expect(done, "download-interrupted", status=130)
    assert leftovers(cache) == []


@fault("prefetch-from-damaged")
def test_a_damaged_carried_wheel_is_blamed_not_the_pin(tmp_path, index_server):
    carried = tmp_path / "carried"
    carried.mkdir()
    (carried / JIT_CACHE_WHEEL).write_bytes(b"damaged on the way")
    cache = tmp_path / "cache"
    expect(prefetch(crate(tmp_path, index_server), cache, "--from", carried), "prefetch-from-damaged")
    assert not cache.exists()


@fault("prefetch-from-fifo")
def test_a_carried_folder_that_is_a_fifo_is_said_for_what_it_is(tmp_path, index_server):
    os.mkfifo(tmp_path / "carried")
    cache = tmp_path / "cache"
    expect(prefetch(crate(tmp_path, index_server), cache, "--from", tmp_path / "carried"), "prefetch-from-fifo")
    assert not cache.exists()


@fault("download-file-url-odd")
@pytest.mark.parametrize("named", ["fifo", "/dev/zero"])
def test_a_file_url_of_a_fifo_or_a_device_is_refused_unread(tmp_path, index_server, named):
    served = tmp_path / "served" / JIT_CACHE_WHEEL  # the URL ends in the wheel's name, as pin's rules want
    served.parent.mkdir()
    if named == "fifo":
        os.mkfifo(served)
    else:
        served.symlink_to(named)
    cargo = crate(tmp_path, index_server)
    cargo.write_text(cargo.read_text().replace(f"{index_server.url}/files/{JIT_CACHE_WHEEL}", f"file://{served}"))
    cache = tmp_path / "cache"
    expect(prefetch(cargo, cache, "--timeout", "3"), "download-file-url-odd")
    assert not cache.exists()


@fault("download-too-large")
def test_a_download_larger_than_any_wheel(tmp_path, index_server):
    cache = tmp_path / "cache"
    done = prefetch(crate(tmp_path, index_server, "oversize"), cache)
    expect(done, "download-too-large")
    assert "it is 1099511627776 bytes" in done.stderr
    assert leftovers(cache) == []


@fault("cache-entry-odd")
@pytest.mark.parametrize("suffix", [".whl", ".whl.tmp-123", ".lock"])
def test_a_folder_in_the_cache_where_a_file_goes_is_named(tmp_path, index_server, suffix):
    body = os.urandom(1 << 10)
    cargo = crate(tmp_path, index_server, body=body)
    cache = tmp_path / "cache"
    entry = cache / "wheels" / f"{hashlib.sha256(body).hexdigest()}-{JIT_CACHE_WHEEL[:-4]}{suffix}"
    entry.mkdir(parents=True)
    done = prefetch(cargo, cache)
    expect(done, "cache-entry-odd")
    assert str(entry) in done.stderr
    # the wheel's own entry and its lock are looked at before the download opens; the temporary files under the lock
    assert index_server.hits.get(f"/files/{JIT_CACHE_WHEEL}", 0) == (1 if suffix == ".whl.tmp-123" else 0)


@fault("url-no-scheme")
def test_a_url_without_its_scheme(tmp_path, index_server, norm_so):
    expect(
        run("pin.py", make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so), "--index", "pypi.org/simple"),
        "url-no-scheme",
        status=2,
    )
    cargo = crate(tmp_path, index_server)
    cargo.write_text(cargo.read_text().replace(f'url = "{index_server.url}', 'url = "example.com'))
    expect(prefetch(cargo, tmp_path / "cache"), "url-no-scheme")  # pin's check, pin's lines


# ---------------------------------------------------------------- pin and artifacts


@fault("pin-url-unusable")
def test_a_pin_url_that_cannot_download_the_wheel(tmp_path, norm_so, index_server):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    done = run("pin.py", wheel, "--url", "https://example.invalid/x.whl")
    expect(done, "pin-url-unusable")
    assert done.stdout == ""
    cargo = crate(tmp_path, index_server)  # the same pin written by hand: prefetch holds it to pin's rules
    cargo.write_text(
        cargo.read_text().replace(f"{index_server.url}/files/{JIT_CACHE_WHEEL}", "https://example.invalid/x.whl")
    )
    done = prefetch(cargo, tmp_path / "cache")
    expect(done, "pin-url-unusable")
    assert f"{cargo}: package.metadata.flashinfer_rs.pinned_wheels.flashinfer_jit_cache." in done.stderr


@fault("pin-cached-name")
def test_a_wheel_from_the_crate_cache(tmp_path, norm_so):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    cached = tmp_path / f"{sha}-{JIT_CACHE_WHEEL}"
    shutil.copy(wheel, cached)
    done = run(
        "pin.py", cached, "--url", f"https://example.invalid/{JIT_CACHE_WHEEL}", "--cuda", P.cuda
    )  # 12.9, the spelling preflight takes
    assert done.returncode == 0, done.stderr
    assert (
        f"pinned_wheels.flashinfer_jit_cache.{P.cuda_tag}.x86_64]" in done.stdout
        and f'filename = "{JIT_CACHE_WHEEL}"' in done.stdout
    )
    damaged = tmp_path / f"{'0' * 64}-{JIT_CACHE_WHEEL}"
    shutil.copy(wheel, damaged)
    expect(run("pin.py", damaged, "--url", f"https://example.invalid/{JIT_CACHE_WHEEL}"), "pin-cached-name")


@fault("pin-index-sha")
def test_pin_refuses_a_file_that_is_not_the_published_wheel(tmp_path, norm_so, index_server):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    index_server.publish("flashinfer-jit-cache", [(JIT_CACHE_WHEEL, f"{index_server.url}/x.whl", "0" * 64)], "html")
    expect(run("pin.py", wheel, "--index", f"{index_server.url}/simple"), "pin-index-sha")


@fault("artifacts-no-jit-cache")
def test_artifacts_without_a_source_or_a_jit_cache():
    require("elftools", why="artifacts reads ELF files with pyelftools")
    expect(run("artifacts.py", flags=["-S"]), "artifacts-no-jit-cache")


# ---------------------------------------------------------------- the chain


@fault("build-import")
def test_build_without_flashinfer_names_preflight_not_import_check():
    done = run("build.py", flags=["-S"])
    expect(done, "build-import")
    assert "import-check" not in done.stderr.splitlines()[-1]


@fault("build-no-gpu")
def test_build_without_a_gpu(tmp_path):
    expect(run("build.py", env=fake_flashinfer(tmp_path, archs="set()")), "build-no-gpu")


@fault("build-first-error")
def test_build_names_the_first_cause_of_a_failed_link(tmp_path):
    # A real ninja and linker failing the way a module's link fails, read by build's summary.
    if missing_tools(*BUILD_TOOLS, why="a real ninja build's failure is what build's summary reads"):
        pytest.skip("needs ninja and a C++ compiler")
    from fidev.builds import module_builds as build

    (tmp_path / "m.cpp").write_text("int f() { return 1; }\n")
    (tmp_path / "build.ninja").write_text(
        "rule cxx\n  command = c++ -fPIC -c $in -o $out\nrule link\n"
        "  command = c++ -shared $in -lcudart_not_here -o $out\n"
        "build m.o: cxx m.cpp\nbuild m.so: link m.o\ndefault m.so\n"
    )
    out = subprocess.run(["ninja", "-C", str(tmp_path)], capture_output=True, text=True).stdout.splitlines()
    assert any(line.startswith("collect2") for line in out), out
    assert ROWS["build-first-error"].error in build.first_error(out) and not build.first_error(out).startswith(
        "collect2"
    )
    assert ROWS["build-first-error"].fix in build.BUILD_FAILED_FIX


@fault("import-elsewhere")
def test_import_check_refuses_a_flashinfer_outside_the_vendored_tree(tmp_path):
    expect(run("import_check.py", env=fake_flashinfer(tmp_path)), "import-elsewhere")


@fault("import-no-torch")
def test_import_check_without_torch(tmp_path):
    ws = workspace(tmp_path)
    env = fake_flashinfer(
        tmp_path, where=ws / "extern/tracked/flashinfer"
    )  # the vendored tree's own, at the pinned version
    missing = ws / "extern/tracked/flashinfer/torch"  # ahead of any installed torch: one that is not there
    missing.mkdir()
    (missing / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    expect(run_in(ws, "import_check.py", env=env), "import-no-torch")


# ---------------------------------------------------------------- module-uri


@fault("uri-head-dim")
@pytest.mark.parametrize("head_dim", ["0", "-16", "7", "100"])
def test_head_dims_flashinfer_cannot_build(head_dim):
    expect(run("module_uri.py", "single_prefill", f"--head-dim={head_dim}"), "uri-head-dim", status=2)


@fault("uri-dtype")
@pytest.mark.parametrize("option", ["--dtype", "--dtype-o", "--dtype-idx"])
def test_a_dtype_flashinfer_does_not_name(option):
    expect(run("module_uri.py", "batch_prefill", option, "fp16"), "uri-dtype", status=2)


@fault("uri-fp8-fa2")
def test_fp8_queries_on_fa2():
    expect(run("module_uri.py", "single_prefill", "--dtype", "e4m3", "--dtype-o", "f16"), "uri-fp8-fa2", status=2)


@fault("uri-fp8-output")
@pytest.mark.parametrize(
    "args",
    [
        ["single_prefill", "--dtype", "float8_e4m3fn"],  # fa2: the output is said first, not fp8 queries
        ["single_prefill", "--backend", "fa3", "--dtype", "e4m3"],
        ["single_decode", "--dtype", "e4m3"],
        ["batch_prefill", "--dtype-o", "e4m3"],
    ],
)
def test_an_fp8_output(args):
    expect(run("module_uri.py", *args), "uri-fp8-output", status=2)


@fault("uri-fp8-fa3-kv")
@pytest.mark.parametrize("kind", ["single_prefill", "batch_prefill"])
def test_fp8_queries_on_fa3_with_16_bit_kv(kind):
    args = ["--backend", "fa3", "--dtype-q", "e4m3", "--dtype-kv", "f16"]
    expect(run("module_uri.py", kind, *args), "uri-fp8-fa3-kv", status=2)


@fault("uri-dtype-idx")
def test_an_index_dtype_that_is_not_one():
    expect(run("module_uri.py", "batch_prefill", "--dtype-idx", "bf16"), "uri-dtype-idx", status=2)


@fault("uri-option-not-applicable")
@pytest.mark.parametrize("args", [["single_prefill", "--dtype-idx", "i32"], ["single_decode", "--backend", "fa2"]])
def test_options_that_do_not_apply_are_refused(args):
    expect(run("module_uri.py", *args), "uri-option-not-applicable", status=2)


# ---------------------------------------------------------------- everywhere

# The positional arguments each script needs before an unknown option can be its only fault.
# smoke and abi-smoke hand the options they do not know to pytest, which refuses them for them.
# upstream-tests is not here: it looks for the tree's test suite before pytest sees any option.
POSITIONALS = {"module_uri.py": ["single_prefill"], "pin.py": ["x.whl"], "prefetch.py": ["Cargo.toml"]}
SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("*.py") if p.name != "upstream_tests.py")


@fault("usage")
@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_option(script):
    expect(run(script, *POSITIONALS.get(script, []), "--no-such-option"), "usage", status=2)


@fault("broken-pipe")
@pytest.mark.parametrize(
    "script, args", [("module_uri.py", ["single_prefill"]), ("preflight.py", []), ("preflight.py", ["--json"])]
)
def test_a_reader_that_goes_away(script, args):
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # `| head` that has read its fill
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err and "BrokenPipeError" not in err, err


TASKS = sorted(p.relative_to(ROOT).as_posix() for folder in ("scripts", "tools") for p in (ROOT / folder).glob("*.py"))
STOPS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}


@pytest.mark.parametrize("module", ["fidev.core.failure", "fidev.core.workspace", "fidev.builds.smoke_modules"])
def test_importing_the_library_leaves_the_processs_signal_handlers_as_they_were(module):
    """Only a task's first import (fidev.core.task_start) installs its handlers: a process that imports the library
    (pytest's, whose conftest imports fidev.core.workspace, running the CPU tests or the GPU suites) keeps its own,
    so Ctrl-C there is still pytest's, with its teardown, never our immediate exit 130."""
    probe = (
        f"import signal, {module}\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
        "signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "scripts")},
    )
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stdout + done.stderr


def test_a_task_loaded_into_a_test_process_leaves_its_signal_handlers_as_they_were():
    """A test that loads a script or tool to call its parts (script_runs.task_module) runs its first import,
    fidev.core.task_start, which installs our handlers: they are put back, so Ctrl-C in pytest stays pytest's."""
    probe = (
        "import signal, sys\n"
        f"sys.path[:0] = [{str(ROOT / 'scripts')!r}, {str(ROOT / 'tests' / 'support')!r}]\n"
        "from script_runs import tool_module\n"
        "tool_module('smoke_noise')\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
        "signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, 'fidev.core.task_start' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True", "True"], done.stdout + done.stderr


@fault("interrupted-at-start")
@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("task", TASKS)
def test_an_interrupt_while_the_task_imports(tmp_path, task, stop):
    """Ctrl-C or SIGTERM at the first import the task's code makes after its first one (fidev.core.task_start),
    before run_main: our line and 130, not Python's KeyboardInterrupt traceback nor a death by SIGTERM without
    a word. The task is held there (script_runs.HOLD), and the signal comes once it is."""
    proc, met = start_held(tmp_path, "start", task.split("/")[1], "--help")
    done = signal_held(proc, met, STOPS[stop], f"{task} held at its first import")
    expect(done, "interrupted-at-start", status=130)
    assert done.stderr.splitlines() == ["error: interrupted; nothing was left half-written"] and not done.stdout, (
        done.stdout + done.stderr
    )


ANSWERS = [("module_uri.py", ["single_prefill"], 0), ("pin.py", [], 2), ("bench_preflight.py", ["--runs", "0"], 2)]


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("task, args, status", ANSWERS, ids=[a[0] for a in ANSWERS])
def test_an_interrupt_once_the_answer_is_out_changes_nothing(tmp_path, task, args, status, stop):
    """Ctrl-C or SIGTERM as the process ends, once run_main has the answer and it is out (an answer, a usage
    error): its status stands and nothing is added to what it said, no traceback of an interrupted teardown,
    nor a death by the signal without a line (fidev.core.failure.run_main). The task is held at its end."""
    said = run(task, *args)
    assert said.returncode == status, said.stdout + said.stderr
    proc, met = start_held(tmp_path, "end", task, *args)
    done = signal_held(proc, met, STOPS[stop], f"{task} held at its end", go=tmp_path / "go")
    assert (done.returncode, done.stdout, done.stderr) == (status, said.stdout, said.stderr), done.stderr


@fault("help-runs-nothing")
def test_import_check_help_runs_no_check():
    done = run("import_check.py", "--help", flags=["-S"])
    assert done.returncode == 0 and done.stdout.startswith("usage:") and not done.stderr


@fault("help-whole-sentences")
def test_help_texts():
    description = run("prefetch.py", "--help").stdout.split("\n\n")[1]
    assert description.rstrip().endswith("needs no network."), description
    for script in ("smoke.py", "abi_smoke.py"):
        text = run(script, "--help").stdout
        assert "PYTEST_ARGS" in text and "go to pytest" in " ".join(text.split()), text
        named = re.findall(r"\btests/\w+", text)
        assert named and all((ROOT / path).is_dir() for path in named), f"{script} --help names {named}"


@fault("layout-toolkit")
def test_a_folder_that_is_no_toolkit_is_named_not_the_prefix(tmp_path):
    (tmp_path / "toolkit").mkdir()
    done = run("conda_layout.py", tmp_path / "prefix", "--toolkit", tmp_path / "toolkit", "--print-env")
    expect(done, "layout-toolkit")
    assert not (tmp_path / "prefix").exists()


@fault("bench-runs")
def test_bench_preflight_needs_a_run():
    expect(run("bench_preflight.py", "--runs", "0"), "bench-runs", status=2)


@fault("bench-preflight-fails")
def test_bench_preflight_reports_a_preflight_that_cannot_run():
    expect(run("bench_preflight.py", "--runs", "1", "--", "--cuda", "13"), "bench-preflight-fails")


@fault("bench-command-fails")
def test_bench_preflight_reports_a_failed_command_not_its_time(tmp_path):
    """A torch that is there but cannot import: collect_env fails, and its time is no figure."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch/__init__.py").write_text(
        'raise ImportError("libtorch_cuda.so: cannot open shared object file")\n'
    )
    done = run("bench_preflight.py", "--runs", "1", env={"PYTHONPATH": str(tmp_path)})
    expect(done, "bench-command-fails")
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["command", "preflight.py"], done.stdout


@fault("upstream-budget")
@pytest.mark.parametrize("budget", ["abc", "-1", "inf"])
@pytest.mark.parametrize("joined", [False, True], ids=["--budget VALUE", "--budget=VALUE"])
def test_upstream_tests_budget_that_is_not_minutes(budget, joined):
    # Checked before the tree or the dry run: the same two lines whatever the host holds, in either form.
    args = [f"--budget={budget}"] if joined else ["--budget", budget]
    expect(run("upstream_tests.py", "norm", *args), "upstream-budget", status=2)


@fault("upstream-option-value")
def test_upstream_tests_option_without_its_value():
    expect(run("upstream_tests.py", "norm", "--budget"), "upstream-option-value", status=2)


@fault("upstream-stop-after-baseline")
@pytest.mark.parametrize("stop_after", [["--stop-after", "3"], ["--stop-after=3"]], ids=" ".join)
def test_upstream_tests_stop_after_with_a_baseline(stop_after):
    expect(run("upstream_tests.py", "norm", *stop_after, "--baseline"), "upstream-stop-after-baseline", status=2)


def _fifo(tmp):
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _looping_link(tmp):
    (tmp / "loop").symlink_to(tmp / "loop")
    return tmp / "loop"


def _regular_file(tmp):
    (tmp / "file").write_text("")
    return tmp / "file"


def _cache_a_file(tmp):
    (tmp / "base").mkdir()
    (tmp / "base" / ".cache").write_text("")
    return tmp / "base"


BAD_BASES = {
    "a file": (_regular_file, "is a file, not a folder"),
    "a FIFO": (_fifo, "is a named pipe (FIFO), not a folder"),
    "a symlink loop": (_looping_link, "is a symlink loop"),
    "under a file": (lambda tmp: _regular_file(tmp) / "base", "which is a file, not a folder"),
    "its cache a file": (_cache_a_file, "is under"),
}


@fault("workspace-base-unusable")
@pytest.mark.parametrize("script", [["upstream_tests.py", "norm"], ["affected.py"]], ids=lambda s: s[0])
@pytest.mark.parametrize("bad", list(BAD_BASES), ids=list(BAD_BASES))
def test_a_workspace_base_that_holds_no_folder_is_two_lines_before_any_work(tmp_path, script, bad):
    """A FLASHINFER_WORKSPACE_BASE FlashInfer could make no folder in is refused where the task reads its
    workspace, naming the variable and what the path is: never a dry run and then an OS error's traceback
    (upstream-tests), nor "nothing is built yet" (affected)."""
    make, said = BAD_BASES[bad]
    base = make(tmp_path)
    done = run(*script, env={"FLASHINFER_WORKSPACE_BASE": str(base)})
    expect(done, "workspace-base-unusable")
    assert f"FLASHINFER_WORKSPACE_BASE={base}" in done.stderr and said in done.stderr, done.stderr
    assert "dry run" not in done.stdout and "nothing is built yet" not in done.stderr, done.stdout + done.stderr


@fault("output-write-fails")
def test_a_summary_whose_final_write_fails_is_two_lines_naming_it_and_how_the_run_ended(tmp_path):
    """affected --summary passes the check before the run, and its write at the run's end fails (the file
    system read-only since): two lines that name the path, the OS error and the run's own end, with the
    run's status; never a traceback (upstream-tests' --summary and planted_bugs' --record: in
    test_upstream_runs.py and test_planted_bugs.py, which have their stand-ins)."""
    (tmp_path / "out").mkdir()
    summary = tmp_path / "out" / "affected.json"
    env = final_write_fails(tmp_path, summary, {"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base")})
    done = run("affected.py", "--summary", summary, env=env)
    expect(done, "output-write-fails")
    expect_unwritten(done, summary, ended="affected itself ended error, status 1: nothing is built yet")


@fault("pytest-path-odd")
@pytest.mark.parametrize("script, args", [("smoke.py", []), ("abi_smoke.py", []), ("upstream_tests.py", ["norm"])])
def test_a_path_handed_to_pytest_that_is_a_device(script, args):
    expect(run(script, *args, "--junitxml=/dev/full"), "pytest-path-odd", status=2)


@fault("output-names-folder")
@pytest.mark.parametrize(
    "script, option",
    [(["upstream_tests.py", "norm"], "--summary"), (["affected.py"], "--summary"), (["planted_bugs.py"], "--record")],
    ids=lambda v: v[0] if isinstance(v, list) else v,
)
@pytest.mark.parametrize("tail", ["/", "/.", "/.."])
def test_an_output_file_named_as_a_folder_is_refused_and_nothing_is_written(tmp_path, script, option, tail):
    """`--summary /tmp/x/nodir/` (a folder's name: Path() reads it as the file nodir): bad usage, 2, before the
    run, and no file named nodir is written."""
    env = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base")}
    done = run(*script, f"{option}={tmp_path / 'nodir'}{tail}", env=env)
    expect(done, "output-names-folder", status=2)
    assert not (tmp_path / "nodir").exists() and sorted(p.name for p in tmp_path.iterdir()) == [], done.stdout


@fault("smoke-nothing-selected")
def test_smoke_with_a_selection_that_matches_nothing():
    require("torch", why="pytest collects tests/smoke only where torch imports")
    expect(run("smoke.py", "-k", "nomatch"), "smoke-nothing-selected")


@fault("smoke-no-gpu")
@pytest.mark.parametrize("script, task", [("smoke.py", "smoke"), ("abi_smoke.py", "abi-smoke")])
def test_gpu_suites_fail_when_nothing_ran(script, task):
    torch = importlib.util.find_spec("torch") and importlib.import_module("torch")
    if torch and torch.cuda.is_available():
        pytest.skip("this host has a GPU: the no-GPU path cannot be shown here")
    expect(run(script), "smoke-no-gpu", said_as=("smoke", task))


@fault("smoke-torch-broken")
@pytest.mark.parametrize(
    "script, task", [("smoke.py", "smoke"), ("abi_smoke.py", "abi-smoke"), ("smoke_noise.py", "smoke (noise)")]
)
@pytest.mark.parametrize(
    "raised, said",
    [
        ('ImportError("libtorch_cuda.so: cannot open")', "ImportError: libtorch_cuda.so: cannot open"),
        ('RuntimeError("CUDA driver failed\\nsecond line")', "RuntimeError: CUDA driver failed"),
        (  # one of torch's own imports
            "ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')",
            "ModuleNotFoundError: No module named 'numpy'",
        ),
    ],
)
def test_smoke_with_a_torch_that_raises_on_import(tmp_path, script, task, raised, said):
    """A torch that is there and raises: two lines naming the exception's first line, not pytest's
    collection errors (status 2, no fix) nor "torch is not installed"."""
    stand_in = tmp_path / "torch"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text(f"raise {raised}\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    done = run(script, env={"PYTHONPATH": path})
    expect(done, "smoke-torch-broken")
    assert done.stderr.strip().splitlines()[-2] == f"error: {task} cannot run: import torch failed: {said}"
    assert "collection" not in done.stdout + done.stderr, done.stdout


# A pytest plugin that stands in for a GPU suite's run at one moment (FIDEV_TEST_MEET): it writes the
# file FIDEV_TEST_MET (its pid), the test's sign to send Ctrl-C, and waits there for it, once.
RENDEZVOUS = """import os, pathlib, time

MEET, MET = os.environ["FIDEV_TEST_MEET"], pathlib.Path(os.environ["FIDEV_TEST_MET"])


def meet(moment):
    if moment == MEET and not MET.exists():
        MET.write_text(str(os.getpid()))
        time.sleep(60)


class Finalized:
    def __del__(self):
        meet("a finalizer")  # what a finalizer raises, Python prints and goes on


meet("pytest's start")


def pytest_collectstart(collector):
    meet("collection")


def pytest_runtest_setup(item):
    meet("a test")
    try:
        meet("a bare except")
    except BaseException:  # a library that swallows everything
        pass
    Finalized()


def pytest_sessionfinish(session):
    meet("the session's end")


def pytest_unconfigure(config):
    meet("after the session")
"""
MOMENTS = [
    "pytest's start",
    "collection",
    "a test",
    "a bare except",
    "a finalizer",
    "the session's end",
    "after the session",
]
# smoke at every moment; abi-smoke and smoke_noise, which share its code (fidev.smoke.gpu_suite), at three
SUITE_MOMENTS = [("smoke.py", [], moment) for moment in MOMENTS] + [
    (script, args, moment)
    for script, args in (("abi_smoke.py", []), ("smoke_noise.py", ["--runs", "2"]))
    for moment in ("collection", "a test", "a bare except")
]


@fault("smoke-interrupted")
@pytest.mark.parametrize("script, args, moment", SUITE_MOMENTS, ids=[f"{s} at {m}" for s, _, m in SUITE_MOMENTS])
def test_ctrl_c_ends_a_gpu_suite_at_any_moment_in_one_line(tmp_path, script, args, moment):
    """smoke, abi-smoke and smoke_noise, Ctrl-C as pytest starts, collects, runs a test, where
    something swallows it, or as the session ends: status 130 and the one line, no report of pytest's,
    no traceback, and no run after it (the CPU host's suites skip every test, so a stand-in plugin
    holds each moment; the signal goes once the plugin says it is there)."""
    require("torch", why="pytest collects the GPU suites only where torch imports")
    (tmp_path / "fidev_rendezvous.py").write_text(RENDEZVOUS)
    met = tmp_path / "met"
    env = {
        **os.environ,
        "FIDEV_TEST_MEET": moment,
        "FIDEV_TEST_MET": str(met),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, str(task_path(ROOT, script)), *args, "-p", "fidev_rendezvous"],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        preexec_fn=as_a_terminal_starts_it,
    )
    try:
        wait_until(lambda: met.is_file() and met.read_text().strip().isdigit(), 60, f"{script} at {moment}", proc)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    expect(done, "smoke-interrupted", status=130)
    assert not re.search(r"KeyboardInterrupt|Fatal Python error", out + err), out[-2000:] + err[-2000:]
    assert out.count("test session starts") <= 1, "a run started after the interrupted one"


@pytest.mark.parametrize("stop", STOPS)
def test_ctrl_c_in_torchs_cpp_start_up_ends_smoke_before_pytest(tmp_path, stop):
    """Ctrl-C or SIGTERM as torch's C++ start-up imports numpy (held there): torch would swallow the
    KeyboardInterrupt (numpy taken for missing) and smoke go on into pytest's session, or pybind11 abort the
    process; the interrupt waits for torch's import to end (failure.interrupts_held), then ends smoke."""
    require("torch", why="the interrupt comes in torch's own import")
    proc, met = start_held(tmp_path, "import numpy", "smoke.py")
    done = signal_held(proc, met, STOPS[stop], "torch importing numpy", go=tmp_path / "go")
    expect(done, "smoke-interrupted", status=130)
    assert "test session starts" not in done.stdout, done.stdout[-2000:]


def test_a_session_pytest_stops_itself_is_no_ctrl_c(tmp_path):
    """pytest ends a session it stops itself (session.Interrupted: errors in collection, a plugin's
    shouldstop) through the hook Ctrl-C takes too: smoke says it as before (pytest's status 2), not
    as interrupted."""
    require("torch", why="pytest collects tests/smoke only where torch imports")
    (tmp_path / "fidev_stops.py").write_text(
        "def pytest_runtest_setup(item):\n    item.session.shouldstop = 'a stop of its own'\n"
    )
    done = run(
        "smoke.py",
        "-p",
        "fidev_stops",
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))},
    )
    assert done.returncode == 2 and "Interrupted: a stop of its own" in done.stdout, done.stdout[-1000:] + done.stderr
    assert "interrupted;" not in done.stderr, done.stderr


# ---------------------------------------------------------------- odd input, and two tools at once


@fault("tree-busy")
def test_a_second_tool_writing_the_tree_is_refused(tmp_path):
    from fidev.tree import edits

    dest, archive = tmp_path / "fi", tmp_path / P.sdist_name
    archive.write_bytes(b"x")
    with edits.tree_lock(dest, "a test holding the tree"):
        done = run("fetch_flashinfer_source.py", "--dest", dest, "--archive", archive)
    expect(done, "tree-busy")
    assert "a test holding the tree" in done.stderr and sorted(p.name for p in tmp_path.iterdir()) == [archive.name]


@fault("path-part-too-long")
def test_a_path_part_too_long(tmp_path):
    expect(run("fetch_flashinfer_source.py", "--dest", tmp_path / ("x" * 300) / "fi"), "path-part-too-long", status=2)


@fault("path-loop")
def test_a_path_through_a_looping_link(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    expect(run("artifacts.py", tmp_path / "loop" / "x.whl"), "path-loop", status=2)


@fault("number-digits")
@pytest.mark.parametrize("value", ["²", "١", "1e999", str(2**70)])
def test_a_count_in_other_digits_or_past_its_bound(value):
    expect(run("bench_preflight.py", "--runs", value), "number-digits", status=2)


@fault("manifest-type")
def test_a_manifest_value_of_another_type(tmp_path):
    ws = workspace(tmp_path)
    text = (ws / "pyproject.toml").read_text().replace('source-dir = "extern/tracked/flashinfer"', "source-dir = 5", 1)
    (ws / "pyproject.toml").write_text(text)
    expect(run_in(ws, "fetch_flashinfer_source.py", "--archive", tmp_path / "none.tar.gz"), "manifest-type")


@fault("wheel-member")
def test_a_wheel_with_a_damaged_member(tmp_path):
    require("elftools", why="artifacts reads ELF files with pyelftools (a flashinfer-dev dependency)")
    wheel = tmp_path / "flashinfer_jit_cache-0.6.3+cu129-cp39-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("flashinfer_jit_cache/jit_cache/norm/norm.so", b"\x7fELF" + os.urandom(8192))
    data = bytearray(wheel.read_bytes())
    data[200:240] = b"\0" * 40  # inside the member's compressed bytes; the zip directory at the end stays whole
    wheel.write_bytes(bytes(data))
    expect(run("artifacts.py", wheel), "wheel-member")


@fault("pin-unreadable")
@pytest.mark.parametrize(
    "url", [[], ["--url", f"https://example.invalid/{JIT_CACHE_WHEEL}"]], ids=["looked up", "--url"]
)
def test_a_truncated_wheel_is_not_pinned(tmp_path, url):
    wheel = tmp_path / JIT_CACHE_WHEEL
    wheel.write_bytes(b"PK\x03\x04" + os.urandom(512))  # a zip's first bytes, and no directory: a download cut short
    expect(run("pin.py", *url, "--cuda", "cu129", wheel), "pin-unreadable")


@fault("abi-release-cut-short")
@pytest.mark.parametrize("damage", ["trailer cut", "length cut", "CRC changed"])
def test_a_source_release_cut_short_before_its_gzip_trailer_is_refused(tmp_path, damage):
    """tar's end-of-archive blocks come before gzip's trailer: a copy cut within the trailer's 8 bytes (its CRC
    and length), or one whose CRC is not what it holds, read as whole where the read stopped at tar's end."""
    source = b"void f(int x) {}\nTVM_FFI_DLL_EXPORT_TYPED_FUNC(f, f);\n"
    archive = tmp_path / P.sdist_name
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo(f"flashinfer_python-{P.flashinfer}/csrc/a.cu")
        info.size = len(source)
        tar.addfile(info, io.BytesIO(source))
    data = bytearray(archive.read_bytes())
    if damage == "CRC changed":
        data[-8] ^= 0xFF
    archive.write_bytes(bytes(data[: {"trailer cut": -8, "length cut": -3, "CRC changed": len(data)}[damage]]))
    expect(run("abi.py", archive), "abi-release-cut-short")


def upstream_ws(tmp_path):
    """A workspace copy whose tree has what upstream-tests looks for first: tests/conftest.py and pytest.ini."""
    ws = workspace(tmp_path)
    tests = ws / P.source_dir.relative_to(ROOT) / "tests"
    tests.mkdir(parents=True)
    (tests / "conftest.py").write_text("")
    (tests.parent / "pytest.ini").write_text("[pytest]\n")
    return ws


@fault("upstream-outside")
def test_upstream_tests_refuses_a_path_outside_its_tests(tmp_path):
    outside = tmp_path / "elsewhere" / "test_x.py"
    outside.parent.mkdir()
    outside.write_text("def test_x():\n    pass\n")
    expect(run_in(upstream_ws(tmp_path), "upstream_tests.py", outside), "upstream-outside", status=2)
    # a usage error before the tree is looked for: the same, where there is no tree
    expect(run_in(workspace(tmp_path / "no-tree"), "upstream_tests.py", outside), "upstream-outside", status=2)


@fault("upstream-empty")
def test_upstream_tests_refuses_the_empty_name(tmp_path):
    expect(run_in(upstream_ws(tmp_path), "upstream_tests.py", ""), "upstream-empty", status=2)
    # a usage error before the tree is looked for: the same, where there is no tree
    expect(run_in(workspace(tmp_path / "no-tree"), "upstream_tests.py", ""), "upstream-empty", status=2)


# .ci/run stopped: a workspace copy whose test task is a stand-in that records its pid and sleeps
SLEEPER = """import os, pathlib, sys, time
pathlib.Path(os.environ["TMPDIR"], "fidev-tests-standin").mkdir()  # what the real conftest makes
pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


@fault("ci-stopped")
@pytest.mark.integration  # .ci/run makes its venvs from the package index, as always
def test_sigterm_stops_the_tests_it_started_and_leaves_no_scratch(tmp_path):
    ws, tmp, pid_file = tmp_path / "ws", tmp_path / "tmp", tmp_path / "pid"
    shutil.copytree(ROOT / "scripts", ws / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    (ws / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", ws / ".ci" / "run")
    shutil.copy(ROOT / ".ci" / "requirements.txt", ws / ".ci" / "requirements.txt")
    (ws / "sleeper.py").write_text(SLEEPER)
    manifest = (ROOT / "pyproject.toml").read_text()
    manifest = manifest.replace(
        'test = { cmd = "python -m pytest"', f'test = {{ cmd = "python sleeper.py {pid_file}"', 1
    )
    manifest = manifest.replace('lint = { cmd = "ruff check ."', 'lint = { cmd = "python -c pass"', 1)
    (ws / "pyproject.toml").write_text(manifest)
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PATH": "/usr/local/bin:/usr/bin:/bin"}  # no pixi
    env.pop("CI", None)
    proc = subprocess.Popen(
        ["bash", str(ws / ".ci" / "run")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until(pid_file.exists, 600, "the test task's start", proc)
        wait_until(lambda: pid_file.read_text().strip().isdigit(), 10, "the test task's pid", proc)
        pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)  # to .ci/run alone, as a runner's timeout does
        out = proc.communicate(timeout=60)[0]
        wait_until(lambda: not alive(pid), 15, "the end of the test task", proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    expect(subprocess.CompletedProcess(proc.args, proc.returncode, "", out), "ci-stopped", status=128 + signal.SIGTERM)
    assert sorted(p.name for p in tmp.iterdir()) == [], "a scratch folder was left behind"
