"""Edits a tool plants in the user's FlashInfer tree (a benchmark's one-line edit, the acceptance
run's planted bugs), under one lock per tree and restored on every way out.

`planted(tree, path, edit, who)` takes the tree's lock (`tree_lock`, which the source fetch takes
too: a file beside the tree, named by TREE_LOCK, so that nothing is added to the user's tree; fcntl.flock: the
kernel lets it go when the process ends, however it ends), refuses while another
process holds it, keeps the file's bytes and times, writes the edit, and restores the file as
`cp -p` would (its old bytes and mtime) when the block ends: normally, by an exception, by Ctrl-C,
SIGTERM or SIGHUP (turned into KeyboardInterrupt for the block's way out). `Planted.restore()`
restores it early, for a tool that runs its checks again on the restored tree while it still holds
the lock.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.files import exclusive, fits, read_record
from fidev.core.workspace import TREE_LOCK

# The record tools/planted_bugs.py writes of its bugs' verdicts (--record), which the acceptance run reads:
# each bug run (its id, whether affected caught it, and more), those --time-limit left, those it stopped midway
# (to run again), the survivors, and the bugs whose restored tree did not pass.
PLANTED_BUGS_SCHEMA = "fidev-planted-bugs/1"
PLANTED_BUG = {"id": str, "caught": bool}
PLANTED_BUGS = {
    "complete": bool,
    "bugs": list[PLANTED_BUG],
    "left": list[str],
    "unfinished": list[str],
    "survivors": list[str],
    "restored_failures": list[str],
}


def read_planted_bugs(path: Path, fix: str) -> dict:
    """tools/planted_bugs.py's record, less its schema; two lines where it is missing, cannot be read,
    or is of another schema or shape (PLANTED_BUGS): then no bug counts as caught."""
    data = read_record(path, PLANTED_BUGS_SCHEMA, "planted_bugs.py's record", fix)
    if not fits(data, PLANTED_BUGS):
        raise Failure(f"planted_bugs.py's record {path} is not of the shape {PLANTED_BUGS_SCHEMA} gives it", fix)
    return data


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
    """The tree's lock (fidev.core.files.exclusive: a file beside the tree, gone once let go), or two
    lines naming who holds it."""
    lock_path = tree.parent / f".{tree.name}{TREE_LOCK}"
    busy = Failure(
        f"{who}: another tool is writing {tree} ({{}}); two at once would undo each other's work",
        "wait for it to end (a tool that planted an edit restores it), then run this again",
    )

    def unwritable(e: OSError) -> Failure:
        return Failure(
            f"cannot write beside {tree}: its lock {lock_path.name} ({e.strerror or e})",
            "use a tree whose parent you can write (for the source fetch: point --dest at a folder whose "
            "parent you can write)",
        )

    with exclusive(lock_path, who, busy, unwritable):
        yield


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
                raise Failure(
                    f"{who}: the edit of {path} changes nothing (the line it replaces is not there)",
                    "restore the tree to the pinned release (git checkout -- FILE in the tree), then run this again",
                )
            path.write_text(new)
            yield state
        finally:
            state.restore()
