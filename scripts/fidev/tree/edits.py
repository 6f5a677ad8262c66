"""Edits a tool plants in the user's FlashInfer tree (a benchmark's one-line edit, the acceptance
run's planted bugs), under one lock per tree and restored on every way out.

`planted(tree, path, edit, who)` takes the tree's edit lock (a file beside the tree, named by
EDIT_LOCK, so that nothing is added to the user's tree; fcntl.flock: the kernel lets it go when the
process ends, however it ends), refuses while another
process holds it, keeps the file's bytes and times, writes the edit, and restores the file as
`cp -p` would (its old bytes and mtime) when the block ends: normally, by an exception, by Ctrl-C,
SIGTERM or SIGHUP (turned into KeyboardInterrupt for the block's way out). `Planted.restore()`
restores it early, for a tool that runs its checks again on the restored tree while it still holds
the lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.workspace import EDIT_LOCK


class Planted:
    def __init__(self, path: Path, saved: Path):
        self.path, self.saved, self.restored = path, saved, False

    def restore(self) -> None:
        """The file as it was, bytes and mtime (cp -p): a build that trusts mtimes must rebuild."""
        if not self.restored:
            shutil.copy2(self.saved, self.path)
            self.restored = True


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def _signals_unwind() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind the block as Ctrl-C does (main thread only: elsewhere Python has none)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def tree_lock(tree: Path, who: str) -> Iterator[None]:
    """The tree's edit lock, or two lines naming who holds it."""
    lock_path = tree.parent / f".{tree.name}{EDIT_LOCK}"
    try:
        handle = open(lock_path, "a+")
    except OSError as e:
        raise Failure(f"cannot open the edit lock {lock_path} ({e.strerror or e})", "check that you can write the FlashInfer tree") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise Failure(f"{who}: another tool is editing {tree} ({holder}); two at once would restore each other's edits",
                          "wait for it to end (it restores what it planted), then run this again") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{who}, pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def planted(tree: Path, path: Path, edit: Callable[[str], str], who: str) -> Iterator[Planted]:
    """`path` (a file of `tree`) edited by `edit(text)` for the block, under the tree's lock."""
    with _signals_unwind(), tree_lock(tree, who), tempfile.TemporaryDirectory(prefix="fidev-edit-") as scratch:
        saved = Path(scratch) / path.name
        shutil.copy2(path, saved)
        state = Planted(path, saved)
        try:
            text = path.read_text()
            new = edit(text)
            if new == text:
                raise Failure(f"{who}: the edit of {path} changes nothing (the line it replaces is not there)",
                              "restore the tree to the pinned release (git checkout -- FILE in the tree), then run this again")
            path.write_text(new)
            yield state
        finally:
            state.restore()
