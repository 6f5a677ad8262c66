"""The wheel cache the Rust bindings crate reads: `<cache>/wheels/<sha256>-<filename>`, under
FLASHINFER_RS_CACHE_DIR (default ~/.cache/flashinfer-rs). Filled here the way the crate fills it,
so either may find the other's work: one lock file per wheel (`<sha256>-<stem>.lock`, flock),
a temporary `<sha256>-<filename>.tmp-<pid>` renamed into place only once its SHA-256 matches."""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import stat
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fidev.bindings.cargo_pins import Pin
from fidev.core import package_index
from fidev.core.failure import Failure
from fidev.core.files import kind_of, not_a_file, read_chunks, sha256_file, write_verified

ENV = "FLASHINFER_RS_CACHE_DIR"
CACHE_FIX = f"set {ENV} to a folder you can write (default ~/.cache/flashinfer-rs)"
_CACHED_NAME = re.compile(r"([0-9a-f]{64})-(.+)")
# The most a download may bring: the pins record no size, and the largest wheel pinned (a jit-cache wheel) is far
# smaller; a URL that sends on and on (a wrong link, file:///dev/zero through a link) fails here, not the disk.
MAX_WHEEL_BYTES = 8 << 30


def cache_dir() -> Path:
    """FLASHINFER_RS_CACHE_DIR; empty or unset means the default, as for every variable here. One of only
    spaces (or tabs) is refused in two lines: it would be a folder of that name in the current folder,
    which no one means and the crate, run elsewhere, would not find."""
    value = os.environ.get(ENV, "")
    if value and not value.strip():
        raise Failure(
            f"{ENV} is {value!r}: it holds only spaces, and names no folder",
            "unset it (the default is ~/.cache/flashinfer-rs), or set it to a folder you can write",
        )
    return Path(value or Path.home() / ".cache" / "flashinfer-rs")


def cached_path(pin: Pin, root: Path) -> Path:
    return root / "wheels" / pin.cache_name


def split_cached_name(name: str) -> tuple[str | None, str]:
    """'<sha256>-<filename>' (how the cache names a wheel) -> (sha256, filename); other names -> (None, name)."""
    match = _CACHED_NAME.fullmatch(name)
    return (match.group(1), match.group(2)) if match else (None, name)


def _in_the_way(path: Path, what: str, mode: int) -> Failure:
    """Two lines for a cache entry that is no regular file where the cache keeps one."""
    kind = kind_of(mode, "no regular file")
    remove = "rm -r" if stat.S_ISDIR(mode) else "rm"
    return Failure(
        f"{what} {path} is {kind}, not a regular file",
        f"remove it ({remove} {shlex.quote(str(path))}), then run prefetch again",
    )


def _open_lock(lock_path: Path) -> int:
    """The lock file's descriptor, made where missing (as the crate makes it); two lines naming it where it is
    a folder, a named pipe or a device (opened without waiting, and checked as opened)."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except IsADirectoryError:
        raise _in_the_way(lock_path, "the lock file", stat.S_IFDIR) from None
    except OSError as e:
        raise Failure(f"cannot write the wheel cache {lock_path.parent}: {e.strerror or e}", CACHE_FIX) from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _in_the_way(lock_path, "the lock file", mode)
    return fd


@contextmanager
def locked(path: Path, waiting: Callable[[], None]):
    """Hold the crate-compatible lock of one cached wheel; call `waiting` if someone else has it."""
    lock = _open_lock(path.with_suffix(".lock"))
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)


def _check_entries(target: Path) -> None:
    """Two lines, before anything is fetched, where the wheel's own cache entry or its lock file is a folder (which
    no unlink removes) or, for the lock, anything but a regular file."""
    for path, what in ((target, "the cached wheel"), (target.with_suffix(".lock"), "the lock file")):
        try:
            mode = os.stat(path).st_mode
        except OSError:  # missing (made later), or a way there that is no folder: the writes say which
            continue
        if stat.S_ISDIR(mode) or (what == "the lock file" and not stat.S_ISREG(mode)):
            raise _in_the_way(path, what, mode)


def _remove(path: Path, what: str) -> None:
    """Remove a cache entry the cache no longer wants (a damaged wheel, a killed run's temporary file)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise Failure(f"cannot remove {what} {path}: {e.strerror or e}", CACHE_FIX) from e
    if stat.S_ISDIR(mode):
        raise _in_the_way(path, what, mode)
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise Failure(f"cannot remove {what} {path}: {e.strerror or e}", CACHE_FIX) from e


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
        try:
            actual = sha256_file(seed)
        except OSError as e:  # a disk error, a special file behind a link (/proc/self/mem)
            raise Failure(
                f"{seed} cannot be read: {e.strerror or e}",
                f"copy the published {pin.filename} into {seed_dir} again, or drop --from to download it",
            ) from None
        if actual != pin.sha256:  # a local file: check it before anything is written
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
        chunks = package_index.read_chunks(response, pin.url, timeout, progress, limit=MAX_WHEEL_BYTES)
        state, what = "downloaded", pin.url
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
    _check_entries(target)
    if _verified(pin, target):
        return Outcome("cached", target.stat().st_size, time.monotonic() - started)
    response, chunks, state, what = _opened(pin, seed_dir, timeout, progress)
    try:
        return _fill(pin, target, started, chunks, state, what, waiting)
    finally:
        if response is not None:  # read to its end, or not at all (another process filled it, the lock failed)
            response.close()


def _fill(pin: Pin, target: Path, started: float, chunks, state: str, what: str, waiting) -> Outcome:
    """ensure's part under the wheel's lock: the killed runs' temporary files go, then the wheel is kept
    (another process verified it meanwhile) or written whole from `chunks`."""
    with locked(target, waiting):
        for stale in target.parent.glob(f"{target.name}.tmp-*"):  # left by a killed run; we hold the lock
            _remove(stale, "the temporary file")
        if target.exists():
            if _verified(pin, target):  # another process finished it while we waited
                return Outcome("cached", target.stat().st_size, time.monotonic() - started)
            _remove(target, "the cached wheel")
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
