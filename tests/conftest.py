"""Shared by every suite: the --wide option of the GPU smoke suite, the GPU fixtures of tests/smoke
and tests/abi, their closing tables, and a local HTTP server for the download tests. Kept at the
tests root so that pytest registers them however it is started."""

import json
import sys

import pytest

from fidev import kernels


def pytest_addoption(parser):
    parser.addoption("--wide", action="store_true", help="also run the wider GPU smoke tier")


def pytest_collection_modifyitems(config, items):
    skip_wide = pytest.mark.skip(reason="wider smoke tier: run with --wide")
    for item in items:
        if "wide" in item.keywords and not config.getoption("--wide"):
            item.add_marker(skip_wide)


def pytest_terminal_summary(terminalreporter):
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
    """The flashinfer package, imported in the workspace's kernel source mode."""
    kernels.apply()
    try:
        import flashinfer
    except ImportError as e:
        pytest.skip(f"flashinfer is not importable: {e}")
    return flashinfer


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
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                if self.path not in server.routes:
                    self.send_error(404)
                    return
                kind, body = server.routes[self.path]
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def serve(self, path, body, kind="application/octet-stream"):
        self.routes[path] = (kind, body)

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
    server.httpd.shutdown()
    server.httpd.server_close()
