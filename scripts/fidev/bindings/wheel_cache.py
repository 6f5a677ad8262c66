"""The wheel cache the Rust bindings crate reads: `<cache>/wheels/<sha256>-<filename>`, under
FLASHINFER_RS_CACHE_DIR (default ~/.cache/flashinfer-rs). Filled here the way the crate fills it,
so either may find the other's work: one lock file per wheel (`<sha256>-<stem>.lock`, flock),
a temporary `<sha256>-<filename>.tmp-<pid>` renamed into place only once its SHA-256 matches."""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fidev.bindings.cargo_pins import Pin
from fidev.core import package_index
from fidev.core.failure import Failure
from fidev.core.files import not_a_file, read_chunks, sha256_file, write_verified

ENV = "FLASHINFER_RS_CACHE_DIR"
CACHE_FIX = f"set {ENV} to a folder you can write (default ~/.cache/flashinfer-rs)"
_CACHED_NAME = re.compile(r"([0-9a-f]{64})-(.+)")


def cache_dir() -> Path:
    """FLASHINFER_RS_CACHE_DIR; empty or unset means the default, as for every variable here."""
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "flashinfer-rs")


def cached_path(pin: Pin, root: Path) -> Path:
    return root / "wheels" / f"{pin.sha256}-{pin.filename}"


def split_cached_name(name: str) -> tuple[str | None, str]:
    """'<sha256>-<filename>' (how the cache names a wheel) -> (sha256, filename); other names -> (None, name)."""
    match = _CACHED_NAME.fullmatch(name)
    return (match.group(1), match.group(2)) if match else (None, name)


@contextmanager
def locked(path: Path, waiting: Callable[[], None]):
    """Hold the crate-compatible lock of one cached wheel; call `waiting` if someone else has it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a+")
    except OSError as e:
        raise Failure(f"cannot write the wheel cache {path.parent}: {e.strerror or e}", CACHE_FIX) from e
    with lock:
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


def _verified(pin: Pin, target: Path) -> bool:
    return target.is_file() and sha256_file(target) == pin.sha256


def _opened(pin: Pin, seed_dir: Path | None, timeout: float, progress: Callable[[int, int | None], None]):
    """The wheel's source, opened and checked before anything is written: (response or None, chunks, state, what)."""
    response = None
    if seed_dir is not None:
        seed = seed_dir / pin.filename
        if why := not_a_file(seed):
            raise Failure(f"{seed} {why}", f"copy {pin.filename} into {seed_dir}, or drop --from to download it")
        if (actual := sha256_file(seed)) != pin.sha256:  # a local file: check it before anything is written
            raise Failure(
                f"{seed} has sha256 {actual}, the pin says {pin.sha256}",
                f"the carried file is not the pinned wheel: copy the published {pin.filename} into {seed_dir} again",
            )
        chunks, state, what = read_chunks(seed), "copied", str(seed)
    else:
        response = package_index.open_url(
            pin.url,
            timeout=timeout,
            fix="check the pin's url (regenerate it with the `pin` task), the network or proxy; "
            "on an offline host copy the wheels over and run prefetch --from DIR",
        )
        chunks, state, what = package_index.read_chunks(response, pin.url, timeout, progress), "downloaded", pin.url
    return response, chunks, state, what


def ensure(
    pin: Pin,
    root: Path,
    seed_dir: Path | None = None,
    timeout: float = 60,
    waiting: Callable[[], None] = lambda: None,
    progress: Callable[[int, int | None], None] = lambda done, total: None,
) -> Outcome:
    """Make `cached_path(pin)` hold the pinned wheel: keep a verified copy, else fetch it (from
    `seed_dir/<filename>` when given, else from its URL). What can fail before a byte arrives (a
    missing seed, an unreachable URL, an HTTP error) fails before anything is written; later
    failures leave no wheel and no temporary file, only the crate's empty lock file."""
    target = cached_path(pin, root)
    started = time.monotonic()
    if root.exists() and not root.is_dir():
        raise Failure(f"the wheel cache {root} is a file, not a folder", CACHE_FIX)
    if _verified(pin, target):
        return Outcome("cached", target.stat().st_size, time.monotonic() - started)
    response, chunks, state, what = _opened(pin, seed_dir, timeout, progress)
    with locked(target, waiting):
        for stale in target.parent.glob(f"{target.name}.tmp-*"):  # left by a killed run; we hold the lock
            stale.unlink(missing_ok=True)
        if target.exists():
            if _verified(pin, target):  # another process finished it while we waited
                if response is not None:
                    response.close()
                return Outcome("cached", target.stat().st_size, time.monotonic() - started)
            target.unlink()
            state = "rewritten (the cached file's sha256 did not match)"
        try:
            size = write_verified(
                target,
                chunks,
                pin.sha256,
                lambda actual: Failure(
                    f"{what} has sha256 {actual}, the pin says {pin.sha256}",
                    "the pin or its URL is wrong: regenerate the pin with the `pin` task from the published wheel",
                ),
            )
        except OSError as e:
            raise Failure(f"cannot write {target}: {e.strerror or e}", CACHE_FIX) from e
    return Outcome(state, size, time.monotonic() - started)
