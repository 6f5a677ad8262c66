"""prefetch: pinned wheels into the bindings crate's cache, <cache>/wheels/<sha256>-<filename>,
downloaded from a local server: verified, never half-written, behind the crate's lock file."""

import fcntl
import hashlib
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from fidev.core.manifest import ROOT
from script_runs import run, two_line_failure

TVM_WHEEL = "apache_tvm_ffi-0.1.7-cp312-abi3-manylinux_2_28_x86_64.whl"
JIT_WHEEL = "flashinfer_jit_cache-0.6.3+cu129-cp39-abi3-manylinux_2_28_x86_64.whl"


def entry(name, cuda, arch, filename, url, sha):
    return (
        f'[package.metadata.flashinfer_rs.pinned_wheels.{name}.{cuda}.{arch}]\nfilename = "{filename}"\n'
        f'url = "{url}"\nsha256 = "{sha}"\n\n'
    )


@pytest.fixture
def crate(tmp_path, index_server):
    """A Cargo.toml pinning a jit-cache wheel (x86_64) and a tvm-ffi wheel that serves two CUDA keys."""
    wheels = {JIT_WHEEL: os.urandom(3 << 20), TVM_WHEEL: os.urandom(1 << 16)}
    for name, body in wheels.items():
        index_server.serve(f"/files/{name}", body)
    sha = {name: hashlib.sha256(body).hexdigest() for name, body in wheels.items()}
    url = {name: f"{index_server.url}/files/{name}" for name in wheels}
    manifest = tmp_path / "Cargo.toml"
    manifest.write_text(
        '[package]\nname = "flashinfer-rs"\nversion = "0.1.0"\n\n'
        + entry("flashinfer_jit_cache", "cu129", "x86_64", JIT_WHEEL, url[JIT_WHEEL], sha[JIT_WHEEL])
        + entry(
            "flashinfer_jit_cache",
            "cu129",
            "aarch64",
            "other-1-py3-none-linux_aarch64.whl",
            f"{index_server.url}/nope",
            "1" * 64,
        )
        + entry("apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, url[TVM_WHEEL], sha[TVM_WHEEL])
        + entry("apache_tvm_ffi", "cu130", "x86_64", TVM_WHEEL, url[TVM_WHEEL], sha[TVM_WHEEL])
    )
    cache = tmp_path / "cache"
    return manifest, cache, wheels, sha


def prefetch(manifest, cache, *args):
    return run("prefetch.py", manifest, "--arch", "x86_64", *args, env={"FLASHINFER_RS_CACHE_DIR": str(cache)})


def cached(cache, sha, name):
    return cache / "wheels" / f"{sha[name]}-{name}"


def test_downloads_each_pinned_wheel_once_into_the_crate_layout(crate, index_server):
    manifest, cache, wheels, sha = crate
    done = prefetch(manifest, cache)
    assert done.returncode == 0, done.stderr
    for name, body in wheels.items():
        assert cached(cache, sha, name).read_bytes() == body
    assert index_server.hits == {
        f"/files/{JIT_WHEEL}": 1,
        f"/files/{TVM_WHEEL}": 1,
    }  # tvm-ffi serves cu129 and cu130: one download
    assert "apache_tvm_ffi.cu129.x86_64, apache_tvm_ffi.cu130.x86_64" in done.stdout
    assert sorted(p.name for p in (cache / "wheels").iterdir() if ".tmp-" in p.name) == []
    assert (cache / "wheels" / f"{sha[JIT_WHEEL]}-{JIT_WHEEL[:-4]}.lock").exists()  # the crate's lock file name


def test_a_second_run_keeps_the_verified_copies(crate, index_server):
    manifest, cache, _, _ = crate
    assert prefetch(manifest, cache).returncode == 0
    done = prefetch(manifest, cache)
    assert done.returncode == 0 and done.stdout.count("cached") == 2, done.stdout
    assert set(index_server.hits.values()) == {1}


def test_a_cached_file_with_the_wrong_hash_is_rewritten(crate):
    manifest, cache, wheels, sha = crate
    target = cached(cache, sha, JIT_WHEEL)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"corrupt")
    stale = target.with_name(target.name + ".tmp-4242")  # what a killed run leaves behind
    stale.write_bytes(b"partial")
    done = prefetch(manifest, cache, "--cuda", "cu129")
    assert done.returncode == 0, done.stderr
    assert "rewritten" in done.stdout and target.read_bytes() == wheels[JIT_WHEEL]
    assert not stale.exists()


def test_from_a_folder_needs_no_network(crate, tmp_path, index_server):
    manifest, cache, wheels, sha = crate
    seed = tmp_path / "carried"
    seed.mkdir()
    for name, body in wheels.items():
        (seed / name).write_bytes(body)
    done = prefetch(manifest, cache, "--from", seed)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("copied") == 2 and index_server.hits == {}
    assert cached(cache, sha, TVM_WHEEL).read_bytes() == wheels[TVM_WHEEL]


def test_waits_for_the_lock_another_process_holds(crate):
    manifest, cache, wheels, sha = crate
    target = cached(cache, sha, JIT_WHEEL)
    target.parent.mkdir(parents=True)
    with open(target.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "scripts" / "prefetch.py"),
                str(manifest),
                "--arch",
                "x86_64",
                "--cuda",
                "cu129",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "FLASHINFER_RS_CACHE_DIR": str(cache)},
        )
        try:
            said = queue.Queue()

            def read():  # the one reader of its stdout, to its end (communicate below reads stderr only)
                for line in proc.stdout:
                    said.put(line)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            deadline = time.monotonic() + 60
            while True:  # its lines, each waited for until the deadline (a silent prefetch fails, never hangs)
                try:
                    line = said.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    pytest.fail("prefetch did not say it waits for the lock within 60 s")
                if "waiting for another process" in line:
                    break
            time.sleep(0.5)
            assert proc.poll() is None and not target.exists(), "prefetch went on while the lock was held"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        proc.wait(timeout=60)
        reader.join(timeout=60)
        err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert target.read_bytes() == wheels[JIT_WHEEL]


@pytest.mark.parametrize(
    "text, problem",
    [
        ('[package]\nname = "x"\n', "has no [package.metadata.flashinfer_rs.pinned_wheels] table"),
        (
            entry("apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, "https://example.invalid/u.whl", "abc"),
            "a 64-hex-digit lowercase sha256",
        ),
        (
            entry("apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, "https://example.invalid/u.whl", "2" * 64),
            "pins nothing for cuda cu131",
        ),
        ("not toml [", "cannot read"),
    ],
)
def test_bad_pins_fail_in_two_lines(tmp_path, text, problem):
    (tmp_path / "Cargo.toml").write_text(text)
    two_line_failure(prefetch(tmp_path / "Cargo.toml", tmp_path / "cache", "--cuda", "cu131"), problem)


ENTRY = "package.metadata.flashinfer_rs.pinned_wheels.apache_tvm_ffi.cu129.x86_64"


@pytest.mark.parametrize(
    "url, problem",
    [
        ("https://", "'https://' names no host"),
        ("https:///x/{name}", "names no host"),
        ("https://example.invalid/a b/{name}", "holds a space or a control character"),
        ("https://example.invalid/a\\nb/{name}", "holds a space or a control character"),  # TOML's \n: a newline
        ("https://example.invalid/é/{name}", "holds characters that are not ASCII"),
        ("file://elsewhere/tmp/{name}", "names a file on another host"),
        ("https://example.invalid/x.whl", "ends in 'x.whl', not the wheel's file name {name}"),
        ("https://example.invalid/{name}/", "ends in '', not the wheel's file name"),
        ("file:///dev/zero", "ends in 'zero', not the wheel's file name"),
        ("file://{fifo}/{name}", "{fifo}/{name} is a named pipe (FIFO), not a regular file"),
        ("file://{device}/{name}", "{device}/{name} is a character device, not a regular file"),
        ("file://{folder}/{name}", "{folder}/{name} is a folder"),
        ("file:///tmp/%00/{name}", "names a path holding a NUL byte (%00)"),
        ("file:/tmp/{name}", "is a file URL without //"),
        ("https://example.invalid:abc/{name}", "names no port from 1 to 65535"),
        ("https://example.invalid:99999/{name}", "names no port from 1 to 65535"),
        (" https://example.invalid/{name}", "holds a space or a control character"),
        ("HTTPS://example.invalid:0/{name}", "names no port from 1 to 65535"),
    ],
)
def test_a_hand_written_pin_whose_url_pin_refuses_fails_before_any_download(tmp_path, index_server, url, problem):
    """A pin's URL that pin refuses as --url (cargo_pins.downloadable: the same rules) is two lines naming
    the pins' file and the entry, before prefetch downloads anything: the good pin above it is not fetched."""
    body = os.urandom(1 << 10)
    index_server.serve(f"/files/{JIT_WHEEL}", body)
    values = {"name": TVM_WHEEL, "fifo": tmp_path / "fifo", "device": tmp_path / "device", "folder": tmp_path / "dir"}
    for folder in values.values():
        if folder != TVM_WHEEL:
            folder.mkdir()
    os.mkfifo(values["fifo"] / TVM_WHEEL)
    (values["device"] / TVM_WHEEL).symlink_to("/dev/zero")
    (values["folder"] / TVM_WHEEL).mkdir()
    pins_file = tmp_path / "pins.toml"
    pins_file.write_text(
        entry(
            "flashinfer_jit_cache",
            "cu129",
            "x86_64",
            JIT_WHEEL,
            f"{index_server.url}/files/{JIT_WHEEL}",
            hashlib.sha256(body).hexdigest(),
        )
        + entry("apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, url.format(**values), "2" * 64)
    )
    cache = tmp_path / "cache"
    done = prefetch(pins_file, cache, "--timeout", "3")
    two_line_failure(done, f"{pins_file}: {ENTRY}: url ")
    two_line_failure(done, problem.format(**values))
    assert index_server.hits == {} and not cache.exists() and done.stdout == ""


@pytest.mark.parametrize(
    "filename, problem",
    [
        ("a\\nb.whl", "filename a\\nb.whl is not a wheel file name"),  # TOML's \n: a line break
        ("renamed.whl", "filename renamed.whl is not a wheel file name"),
        ("a" * 190 + "-1.0-py3-none-any.whl", "filename is 211 bytes: the cache's name of the wheel"),
    ],
    ids=["a newline", "no wheel name", "too long for the cache"],
)
def test_a_hand_written_pins_filename_that_is_no_wheels_fails_before_any_download(tmp_path, filename, problem):
    """A pin's filename that no published wheel has (a line break, no PEP 427 name), or one whose name in the
    cache (<sha256>-<filename>) would pass the file system's 255 bytes: two lines naming the pins' file and the
    entry, before anything is downloaded or a cache made."""
    pins_file = tmp_path / "pins.toml"
    pins_file.write_text(
        entry("apache_tvm_ffi", "cu129", "x86_64", filename, f"https://example.invalid/{filename}", "2" * 64)
    )
    done = prefetch(pins_file, tmp_path / "cache", "--timeout", "3")
    two_line_failure(done, f"{pins_file}: {ENTRY}: {problem}")
    assert not (tmp_path / "cache").exists() and done.stdout == ""


def test_a_pins_file_that_starts_with_a_bom_is_said_as_such(tmp_path):
    """A Cargo.toml saved with a byte-order mark: named, as preflight names one in the manifest, not tomllib's
    "Invalid statement (at line 1, column 1)"."""
    pins_file = tmp_path / "Cargo.toml"
    pins_file.write_bytes(
        b"\xef\xbb\xbf" + entry("apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, "https://x/y", "2" * 64).encode()
    )
    two_line_failure(prefetch(pins_file, tmp_path / "cache"), f"{pins_file} starts with a byte-order mark (BOM)")


def one_pin(tmp_path, url, sha="2" * 64):
    pins_file = tmp_path / "pins.toml"
    pins_file.write_text(entry("apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, url, sha))
    return pins_file


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_file_url_of_no_regular_file_fails_in_two_lines_without_reading_it(tmp_path, kind):
    """A FIFO would wait for a writer past --timeout, /dev/zero would fill the disk: both are refused unread
    where the download opens them (prefetch refuses such a pin before, by pin's rules; this is the download's
    own guard, for a file that turned into one since)."""
    from fidev.bindings import cargo_pins, wheel_cache
    from fidev.core.failure import Failure

    source = {"fifo": tmp_path / "fifo", "device": "/dev/zero", "folder": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(source)
    cache = tmp_path / "cache"
    pin = cargo_pins.Pin("apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, f"file://{source}", "2" * 64)
    said = {"fifo": "a named pipe", "device": "a character device"}.get(kind, "a folder")
    with pytest.raises(Failure, match=f"{source} is {said}") as failure:
        wheel_cache.ensure(pin, cache, timeout=3)
    assert failure.value.fix and not cache.exists()


def test_a_file_urls_byte_that_is_no_utf8_is_the_byte_of_its_path(tmp_path):
    """%ff in a file URL is the path's byte 0xff, as the file system names it, shown as `\\xff`: not U+FFFD, which
    would name another path (one that does not exist, taken by pin's rules) and show as `\\ufffd`."""
    folder = os.fsencode(tmp_path) + b"/\xff"
    os.mkdir(folder)
    os.mkfifo(folder + b"/" + TVM_WHEEL.encode())
    done = prefetch(one_pin(tmp_path, f"file://{tmp_path}/%ff/{TVM_WHEEL}"), tmp_path / "cache", "--timeout", "3")
    two_line_failure(done, f"{tmp_path}/\\xff/{TVM_WHEEL} is a named pipe (FIFO), not a regular file")


def test_a_file_url_of_a_regular_file_is_copied(tmp_path):
    body = os.urandom(1 << 12)
    (tmp_path / TVM_WHEEL).write_bytes(body)
    cache = tmp_path / "cache"
    pins_file = one_pin(tmp_path, f"file://{tmp_path / TVM_WHEEL}", hashlib.sha256(body).hexdigest())
    done = prefetch(pins_file, cache)
    assert done.returncode == 0, done.stderr
    assert cached(cache, {TVM_WHEEL: hashlib.sha256(body).hexdigest()}, TVM_WHEEL).read_bytes() == body


def test_a_download_larger_than_any_wheel_fails_in_two_lines_and_leaves_nothing(tmp_path, index_server, monkeypatch):
    from fidev.bindings import cargo_pins, wheel_cache
    from fidev.core.failure import Failure

    monkeypatch.setattr(wheel_cache, "MAX_WHEEL_BYTES", 1 << 20)
    index_server.serve("/big.whl", b"\0" * (2 << 20))
    pin = cargo_pins.Pin("apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, f"{index_server.url}/big.whl", "2" * 64)
    with pytest.raises(Failure, match="is larger than the 1 MiB it may be: it is 2097152 bytes"):
        wheel_cache.ensure(pin, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache" / "wheels").iterdir() if not p.name.endswith(".lock")] == []


def test_a_body_that_never_ends_is_cut_at_the_limit(monkeypatch):
    """No Content-Length, and data on and on (what file:///dev/zero would send through a link)."""
    from fidev.core import package_index
    from fidev.core.failure import Failure

    class Endless:
        headers = {}

        def read(self, n):
            return b"\0" * n

        def close(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    taken = 0
    with pytest.raises(Failure, match="more than 4194304 bytes came"):
        for chunk in package_index.read_chunks(Endless(), "http://x/y.whl", 5, limit=4 << 20):
            taken += len(chunk)
    assert taken <= 4 << 20


@pytest.mark.parametrize(
    "entry_name, make, said",
    [
        ("{stem}.whl", os.mkdir, "the cached wheel {path} is a folder"),
        ("{stem}.whl.tmp-123", os.mkdir, "the temporary file {path} is a folder"),
        ("{stem}.lock", os.mkdir, "the lock file {path} is a folder"),
        ("{stem}.lock", os.mkfifo, "the lock file {path} is a named pipe (FIFO)"),
    ],
    ids=["wheel-folder", "tmp-folder", "lock-folder", "lock-fifo"],
)
def test_a_cache_entry_that_is_no_regular_file_is_named_in_two_lines(crate, entry_name, make, said):
    manifest, cache, _, sha = crate
    path = cache / "wheels" / entry_name.format(stem=f"{sha[JIT_WHEEL]}-{JIT_WHEEL[:-4]}")
    path.parent.mkdir(parents=True)
    make(path)
    done = prefetch(manifest, cache, "--cuda", "cu129")
    two_line_failure(done, said.format(path=path))
    assert str(path) in done.stderr.splitlines()[-1]  # the fix names it too


@pytest.mark.parametrize("make", [os.mkdir, os.mkfifo], ids=["folder", "fifo"])
def test_a_lock_file_gone_odd_after_the_first_look_is_named_and_the_download_closed(
    tmp_path, index_server, monkeypatch, make
):
    """The lock file turns into a folder or a FIFO between prefetch's first look and its lock (another process):
    opening it neither waits nor throws a traceback, and the download already opened is closed, not leaked."""
    from fidev.bindings import cargo_pins, wheel_cache
    from fidev.core import package_index
    from fidev.core.failure import Failure

    index_server.serve(f"/files/{TVM_WHEEL}", b"wheel")
    pin = cargo_pins.Pin(
        "apache_tvm_ffi", "cu129", "x86_64", TVM_WHEEL, f"{index_server.url}/files/{TVM_WHEEL}", "2" * 64
    )
    lock = wheel_cache.cached_path(pin, tmp_path).with_suffix(".lock")
    opened, open_url = [], package_index.open_url

    def open_then_odd(*args, **kwargs):
        opened.append(open_url(*args, **kwargs))
        lock.parent.mkdir(parents=True, exist_ok=True)
        make(lock)
        return opened[-1]

    monkeypatch.setattr(package_index, "open_url", open_then_odd)
    with pytest.raises(Failure, match=f"the lock file {lock} is a (folder|named pipe)"):
        wheel_cache.ensure(pin, tmp_path)
    assert opened and opened[0].closed


def test_a_control_character_a_failure_quotes_is_shown_escaped(tmp_path):
    """A path with ESC in it (--from), a pin's filename with a NUL (TOML's \\u0000): each shown as `\\x1b`, `\\x00`
    (fidev.core.failure.one_line), never sent to the terminal raw, the two lines kept two."""
    pins_file = one_pin(tmp_path, f"https://example.invalid/{TVM_WHEEL}")
    done = prefetch(pins_file, tmp_path / "cache", "--from", tmp_path / "a\x1b[2Jb\x07\x85c\u2028d")
    two_line_failure(done, f"--from {tmp_path}/a\\x1b[2Jb\\x07\\x85c\\u2028d does not exist")
    pins_file.write_text(
        entry(
            "apache_tvm_ffi", "cu129", "x86_64", "x\\u0000-1.0-py3-none-any.whl", "https://example.invalid/x", "2" * 64
        )
    )
    done = prefetch(pins_file, tmp_path / "cache")
    two_line_failure(done, f"{pins_file}: {ENTRY}: filename x\\x00-1.0-py3-none-any.whl is not a wheel file name")
    assert not any(c in done.stderr for c in "\x00\x07\x1b\x85\u2028")
