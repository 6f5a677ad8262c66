"""The wheel cache the Rust bindings crate reads: `<cache>/wheels/<sha256>-<filename>`, under
FLASHINFER_RS_CACHE_DIR (default ~/.cache/flashinfer-rs). Filled here the way the crate fills it,
so either may find the other's work: one lock file per wheel (`<sha256>-<stem>.lock`, flock),
a temporary `<sha256>-<filename>.tmp-<pid>` renamed into place only once its SHA-256 matches."""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fidev.files import CHUNK, read_chunks, sha256_file
from fidev.ui import Failure
from fidev.wheels import METADATA_PATH, Pin

ENV = "FLASHINFER_RS_CACHE_DIR"
PROGRESS_EVERY_S = 10


def cache_dir() -> Path:
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "flashinfer-rs")


def cached_path(pin: Pin, root: Path) -> Path:
    return root / "wheels" / f"{pin.sha256}-{pin.filename}"


def read_pins(toml: dict, source: str) -> list[Pin]:
    """Every `<name>.<cuda>.<arch>` entry under [package.metadata.flashinfer_rs.pinned_wheels]."""
    table = toml
    for key in METADATA_PATH:
        table = table.get(key) if isinstance(table, dict) else None
    if not isinstance(table, dict):
        raise Failure(f"{source} has no [{'.'.join(METADATA_PATH)}] table",
                      "name the bindings crate's Cargo.toml, or a file holding the blocks `artifacts --pin` prints")
    found = []
    for name, by_cuda in table.items():
        for cuda, by_arch in (by_cuda or {}).items():
            for arch, entry in (by_arch or {}).items():
                where = f"{'.'.join(METADATA_PATH)}.{name}.{cuda}.{arch}"
                if not isinstance(entry, dict):
                    raise Failure(f"{source}: {where} is not a table", "each entry needs filename, url and sha256")
                filename, url, sha = (str(entry.get(k, "")).strip() for k in ("filename", "url", "sha256"))
                if not filename.endswith(".whl") or "/" in filename or not url or len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
                    raise Failure(f"{source}: {where} needs a wheel filename, a url and a 64-hex-digit lowercase sha256",
                                  "regenerate the block with `pixi run -e flashinfer-dev artifacts --pin WHEEL`")
                found.append(Pin(name, cuda, arch, filename, url, sha))
    return found


@contextmanager
def locked(path: Path, waiting: Callable[[], None]):
    """Hold the crate-compatible lock of one cached wheel; call `waiting` if someone else has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Outcome:
    state: str  # "cached", "downloaded", "copied", or "rewritten (...)" when a cached copy had the wrong hash
    size: int
    seconds: float


def _stream_into(target: Path, chunks, expected: str, what: str) -> int:
    """Write chunks to a temporary sibling, hashing on the way; rename it to `target` only if the
    SHA-256 is `expected`. Never leaves a partial `target`."""
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        if digest.hexdigest() != expected:
            raise Failure(f"{what} has sha256 {digest.hexdigest()}, the pin says {expected}",
                          "the pin or the URL is wrong: regenerate the pin with `artifacts --pin` from the published wheel")
        os.replace(tmp, target)
        return size
    finally:
        tmp.unlink(missing_ok=True)


def _download(url: str, progress: Callable[[int, int | None], None], timeout: float):
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except (urllib.error.URLError, OSError) as e:
        raise Failure(f"cannot download {url}: {getattr(e, 'reason', e)}",
                      "check the network (or proxy); on an offline host copy the wheels over and run prefetch --from DIR") from e
    total = response.headers.get("Content-Length")
    total = int(total) if total and total.isdigit() else None
    done, last = 0, time.monotonic()
    with response:
        while chunk := response.read(CHUNK):
            done += len(chunk)
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                progress(done, total)
                last = time.monotonic()
            yield chunk


def ensure(pin: Pin, root: Path, seed_dir: Path | None = None, timeout: float = 60,
           waiting: Callable[[], None] = lambda: None, progress: Callable[[int, int | None], None] = lambda done, total: None) -> Outcome:
    """Make `cached_path(pin)` hold the pinned wheel: keep a verified copy, else fetch it (from
    `seed_dir/<filename>` when given, else from its URL)."""
    target = cached_path(pin, root)
    started = time.monotonic()
    with locked(target, waiting):
        for stale in target.parent.glob(f"{target.name}.tmp-*"):  # left by a killed run; we hold the lock
            stale.unlink(missing_ok=True)
        state = "copied" if seed_dir is not None else "downloaded"
        if target.exists():
            if sha256_file(target) == pin.sha256:
                return Outcome("cached", target.stat().st_size, time.monotonic() - started)
            target.unlink()
            state = "rewritten (the cached file's sha256 did not match)"
        if seed_dir is not None:
            seed = seed_dir / pin.filename
            if not seed.is_file():
                raise Failure(f"{seed} does not exist", f"copy {pin.filename} into {seed_dir}, or drop --from to download it")
            size = _stream_into(target, read_chunks(seed), pin.sha256, str(seed))
        else:
            size = _stream_into(target, _download(pin.url, progress, timeout), pin.sha256, pin.url)
    return Outcome(state, size, time.monotonic() - started)

