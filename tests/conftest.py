"""Shared by every suite: the --wide option of the GPU smoke suite, the GPU fixtures of tests/smoke
and tests/abi_smoke, their closing tables, a local HTTP server for the download tests, a read-only
folder, and a guard that keeps the suite out of the real HOME's caches. Kept at the tests root so
that pytest registers them however it is started."""

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import home_guard
from checkout import checkout_state, guards_checkout, left_in_checkout
from fidev.core import workspace
from fidev.core.failure import Failure
from fidev.core.manifest import ROOT
from fidev.jit import flashinfer_import, kernel_source, module_choice

# The caches FlashInfer and the bindings crate write under HOME. The CPU suite runs FlashInfer
# (the integration test imports it) and the wheel-cache code; both go to a scratch folder instead,
# in this process and every one it starts, and the session fails if HOME's copies changed.
# The GPU suites are the exception: they must load what `build` compiled into the user's JIT dir
# (the `fi` fixture imports FlashInfer with the user's own settings).
_FLASHINFER_CACHE = Path.home() / ".cache" / "flashinfer"
_GUARDED = [_FLASHINFER_CACHE, Path.home() / ".cache" / "flashinfer-rs"]
_REDIRECTED = ("FLASHINFER_WORKSPACE_BASE", "FLASHINFER_RS_CACHE_DIR")
_USERS = {}  # the user's values of _REDIRECTED before the redirect; None: unset


def _snapshot(caches):
    # upstream-tests' run folders are left out: `affected` runs smoke's tests in this session while
    # FlashInfer's run beside them and write theirs (the CPU tests' go to the scratch base); and its
    # modules build meanwhile, so the walk takes a path removed while it reads as absent (home_guard)
    return home_guard.snapshot(caches, workspace.RUNS)


def pytest_configure(config):
    if not os.environ.get("FIDEV_TEST_SCRATCH"):
        config._fidev_checkout = checkout_state(ROOT) if guards_checkout(config.args) else None
        _USERS.update({name: os.environ.get(name) for name in _REDIRECTED})
        scratch = Path(tempfile.mkdtemp(prefix="fidev-tests-"))
        os.environ["FIDEV_TEST_SCRATCH"] = str(scratch)
        os.environ["FLASHINFER_WORKSPACE_BASE"] = str(scratch)
        os.environ["FLASHINFER_RS_CACHE_DIR"] = str(scratch / "flashinfer-rs")
        config._fidev_home_caches = _snapshot(_GUARDED)


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_fidev_home_caches", None)
    if before is None:
        return
    changed = home_guard.changed(before, _snapshot(_GUARDED), _GUARDED)
    shutil.rmtree(os.environ.pop("FIDEV_TEST_SCRATCH"), ignore_errors=True)
    if changed:
        print(
            f"\nerror: the test suite wrote into the real HOME: {changed[0][0]} (and {len(changed) - 1} more)",
            file=sys.stderr,
        )
        session.exitstatus = 1
    left = left_in_checkout(getattr(session.config, "_fidev_checkout", None), checkout_state(ROOT))
    if left:
        print(
            f"\nerror: the test suite left the checkout changed: {left[0]} (and {len(left) - 1} more); "
            "a test writes under tmp_path and puts back what it changes",
            file=sys.stderr,
        )
        session.exitstatus = 1


@contextlib.contextmanager
def _users_flashinfer_settings():
    """The user's FLASHINFER_WORKSPACE_BASE while FlashInfer is imported, then the scratch again.
    FlashInfer reads it once, at import, into its JIT dir (flashinfer/jit/env.py at v0.6.3,
    FLASHINFER_BASE_DIR and FLASHINFER_JIT_DIR), so the GPU suites share the JIT dir `build` compiled into, and what
    the CPU tests start still goes to the scratch folder."""
    name = "FLASHINFER_WORKSPACE_BASE"
    if name not in _USERS:  # no redirect in this session
        yield
        return
    scratch = os.environ.get(name)
    _set(name, _USERS[name])
    try:
        yield
    finally:
        _set(name, scratch)
    # FlashInfer's JIT dir is now the GPU suites' to write: HOME's copy is no longer guarded.
    if _FLASHINFER_CACHE in _GUARDED and not _USERS[name]:
        _GUARDED.remove(_FLASHINFER_CACHE)


def _set(name, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def pytest_addoption(parser):
    parser.addoption("--wide", action="store_true", help="also run the wider GPU smoke tier")


def pytest_collection_modifyitems(config, items):
    skip_wide = pytest.mark.skip(reason="wider smoke tier: run with --wide")
    for item in items:
        if "wide" in item.keywords and not config.getoption("--wide"):
            item.add_marker(skip_wide)


_IMPORT_CHECK = []  # the `fi` fixture's proof: (what, found) rows


def pytest_terminal_summary(terminalreporter):
    if _IMPORT_CHECK:
        terminalreporter.section("import-check (in this process)")
        for name, value in _IMPORT_CHECK:
            terminalreporter.write_line(f"  {name:21} {value}")
    checks = sys.modules.get("gpu_checks")  # imported only where a GPU suite ran
    if checks is not None:
        checks.write_results(terminalreporter)


@pytest.fixture(scope="session")
def gpu():
    """torch, with a CUDA GPU visible."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch.cuda.is_available() is False")
    return torch


@pytest.fixture(scope="session")
def fi(gpu):
    """The flashinfer package, imported in the workspace's kernel source mode, and proved to be the
    vendored tree at the pin (import-check's proof, made here so that the chain imports once)."""
    # the task's mode where a task runs the suite in its process (smoke, abi-smoke, affected), else read now
    mode = module_choice.in_force() or module_choice.apply(kernel_source.mode())
    with _users_flashinfer_settings():
        try:
            import flashinfer
            from flashinfer.jit import env as jit_env
        except ImportError as e:
            pytest.skip(f"flashinfer is not importable: {e}")
    scratch = os.environ.get("FIDEV_TEST_SCRATCH")
    if scratch and Path(jit_env.FLASHINFER_WORKSPACE_DIR).is_relative_to(scratch):
        pytest.fail(
            "flashinfer was imported before the GPU fixtures, so its JIT dir is the test scratch "
            f"{jit_env.FLASHINFER_WORKSPACE_DIR}, not the one `build` compiled into",
            pytrace=False,
        )
    try:
        _IMPORT_CHECK[:] = flashinfer_import.vendored_rows(flashinfer, jit_env, mode)
    except Failure as failure:
        pytest.fail(f"import-check: {failure.problem} (fix: {failure.fix})", pytrace=False)
    _record_jit_builds()
    return flashinfer


def _record_jit_builds() -> None:
    """A module a test compiles (one `build` did not: the wide tier without `build --wide`, a module
    of a family an edit reaches) is guarded against restored older inputs and recorded, as `build`'s
    and upstream-tests' are (fidev.builds.module_builds.recording_build): `affected` then sees a later
    edit of its inputs, or their restore, instead of taking the module for one no build made (a
    module built from a bug stayed loaded after a `cp -p` restore, which ninja's mtimes miss). The
    record of the tree it writes again hides no edit from `affected`, which keeps the tree it last
    judged (fidev.affected.changes.since_judged)."""
    from flashinfer.jit import core

    from fidev.builds import module_builds, smoke_modules

    if not getattr(core.JitSpec.build, "fidev_recording", False):  # smoke's modules marked as built here
        core.JitSpec.build = module_builds.recording_build(
            core.JitSpec.build, lambda line: print(f"smoke: {line}", flush=True), smoke_modules.mark_built
        )


@pytest.fixture(scope="session")
def arch(gpu):
    return gpu.cuda.get_device_capability()


@pytest.fixture
def sm90(arch):
    if arch != (9, 0):
        pytest.skip(f"needs sm_90 (Hopper); this GPU is sm_{arch[0]}{arch[1]}")


@pytest.fixture(params=["fa2", "fa3"])
def attention_backend(request):
    """The attention backends under test; fa3 runs on sm_90 only."""
    if request.param == "fa3":
        request.getfixturevalue("sm90")
    return request.param


class LocalServer:
    """A package index and file host on 127.0.0.1, so that download code runs without the network."""

    def __init__(self):
        import http.server
        import threading

        self.routes, self.hits = {}, {}
        self.release = threading.Event()  # ends the stalls when the test is over
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                if self.path not in server.routes:
                    self.send_error(404)
                    return
                kind, body, behaviour = server.routes[self.path]
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(1 << 40 if behaviour == "oversize" else len(body)))
                self.end_headers()
                if behaviour in ("whole", "oversize"):
                    self.wfile.write(body)
                    return
                self.wfile.write(body[: len(body) // 2])  # half, then...
                self.wfile.flush()
                if behaviour == "stall":  # ...nothing, with the connection open
                    server.release.wait(60)
                self.close_connection = True  # ("short": ...the connection closes)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def serve(self, path, body, kind="application/octet-stream", behaviour="whole"):
        """`behaviour`: "whole", "oversize" (the body, under a Content-Length of 1 TiB), or half the body then
        "stall" (until the test ends) or "short" (close)."""
        self.routes[path] = (kind, body, behaviour)

    def publish(self, project, files, style):
        """A PEP 503 (html) or PEP 691 (json) project page listing (filename, url, sha256)."""
        if style == "json":
            page = {"name": project, "files": [{"filename": f, "url": u, "hashes": {"sha256": s}} for f, u, s in files]}
            self.serve(f"/simple/{project}/", json.dumps(page).encode(), "application/vnd.pypi.simple.v1+json")
        else:
            links = "".join(f'<a href="{u}#sha256={s}">{f}</a><br>\n' for f, u, s in files)
            self.serve(f"/simple/{project}/", f"<html><body>{links}</body></html>".encode(), "text/html")


@pytest.fixture
def index_server():
    server = LocalServer()
    yield server
    server.release.set()
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder nobody can write, root included (root ignores permission bits)."""
    ro = tmp_path / "read-only"
    ro.mkdir()
    if os.geteuid() == 0:
        if (
            shutil.which("chattr") is None
            or subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode != 0
        ):
            pytest.skip("running as root on a filesystem without chattr +i: cannot make a read-only folder")
        yield ro
        subprocess.run(["chattr", "-i", str(ro)])
    else:
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        yield ro
        ro.chmod(stat.S_IRWXU)


@pytest.fixture(scope="session")
def norm_so(tmp_path_factory):
    """An ELF module exporting __tvm_ffi_rmsnorm and __tvm_ffi_gemma_rmsnorm (tests/support/module_fixtures.py)."""
    from module_fixtures import build_norm_so

    return build_norm_so(tmp_path_factory.mktemp("elf"))
