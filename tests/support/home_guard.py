"""What the test session changed in the real HOME's caches (tests/conftest.py fails the session on it).

The caches are read as they stand while others may write them: under `affected`, smoke's session
runs while FlashInfer's tests build modules into the same JIT dir, whose files come and go (a
build's temporary files, a module's folder made and removed) between the walk's listing of a folder
and its reading of each file's time. A path gone by the time it is read is absent, as it would be
to a walk a moment later; a folder gone before it is listed has nothing in it. Nothing else the
walk meets is passed over: a file the session removed is still missing from the second listing,
and one it made or touched still shows."""

import os
from pathlib import Path

GONE = object()  # what _mtime gives for a path nothing is at now


def _mtime(path: Path):
    """The path's mtime (its target's, for a link); None for a link to nothing, as Path.exists says
    of it; GONE where nothing is there now."""
    try:
        return path.stat().st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):  # removed, or a folder on the way replaced by a file
        return None if path.is_symlink() else GONE


def _listed(cache: Path, left_out: str):
    """`cache` and what is under it, links not followed, less what is named `left_out` and what it
    holds: a folder gone before it was listed holds nothing (os.walk without onerror passes it by, as
    Path.rglob passes by one it may not read)."""
    yield cache
    for folder, dirs, files in os.walk(cache):
        dirs[:] = [d for d in dirs if d != left_out]
        yield from (Path(folder, name) for name in [*dirs, *files] if name != left_out)


def snapshot(caches: list[Path], left_out: str) -> dict[str, int | None]:
    """{path: mtime} of each cache and everything under it (None: a cache, or a link's target, that
    is not there); folders named `left_out` (upstream-tests' run folders) are not read."""
    found = {}
    for cache in caches:
        for path in _listed(cache, left_out) if left_out not in cache.parts else ():
            mtime = _mtime(path)
            if mtime is not GONE:
                found[str(path)] = mtime
            elif path == cache:
                found[str(path)] = None
    return found


def changed(before: dict, after: dict, guarded: list[Path]) -> list[tuple[str, int | None]]:
    """What differs between two snapshots, by path, for the paths still `guarded` (a cache the
    session gave up guarding is left out): a path made or removed pairs an mtime with None or
    with nothing, which do not compare."""
    still = {path: mtime for path, mtime in before.items() if any(Path(path).is_relative_to(c) for c in guarded)}
    return sorted(set(after.items()) ^ set(still.items()), key=lambda item: item[0])
