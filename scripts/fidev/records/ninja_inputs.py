"""What each object of a JIT module was last built from, so that `build` catches what ninja's
mtime check misses.

ninja rebuilds an object when one of its inputs (the source and every header its depfile
listed) is newer than the object. An edit makes the file newer, so it rebuilds. But restoring an
older copy of a file (`mv`, `cp -p`, `rsync -a`, a `git stash` that keeps times) gives it an
older mtime: ninja sees nothing newer than the object, and the module stays built from the edit.
After every successful build this records the mtime, size and content hash of each object's
inputs (ninja's own deps log, `ninja -t deps`); before the next build, an input whose mtime or size
moved while staying older than its object means that object is removed, so ninja rebuilds it. The
hashes tell `affected` which inputs truly changed since the build (content, not a touched mtime).

A build that never finishes (stopped at the first failure, a failed compile, Ctrl-C) leaves objects
compiled from what the tree held then, newer than its inputs, while the record still says what the
last finished build compiled from: restore an older copy then, and neither ninja nor the record sees
that those objects hold the edit. So each build marks its start in the module's folder (`begin`), and
only a finished one clears the mark (`record`, `finished`); the next build compiles again every object
newer than a mark left behind (`unfinished`), and `affected` takes such a module as edited.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from fidev.core.files import differs, file_fact, is_fact, load_json, write_whole
from fidev.core.workspace import BUILDING, INPUTS

STAMP = INPUTS
TIMEOUT_S = 60


def deps(build_dir: Path, ninja_file: Path) -> dict[str, list[str]] | None:
    """object -> its inputs, from ninja's deps log; None where ninja could not say (not started, timed
    out, failed)."""
    try:
        done = subprocess.run(
            ["ninja", "-C", str(build_dir), "-f", str(ninja_file), "-t", "deps"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    out = done.stdout
    found, current = {}, None
    for line in out.splitlines():
        if line and not line.startswith(" ") and ": #deps" in line:
            current = line.split(": #deps")[0]
            found[current] = []
        elif line.strip() and current is not None:
            found[current].append(line.strip())
    return found


def inputs(build_dir: Path, ninja_file: Path) -> set[str]:
    """Every input of the module's objects: as the last build recorded them (read without starting
    ninja), else from ninja's deps log."""
    stamp = _recorded(build_dir)
    if stamp is not None:
        return {path for recorded in stamp.values() for path in recorded}
    return {path for paths in (deps(build_dir, ninja_file) or {}).values() for path in paths}


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def record(build_dir: Path, ninja_file: Path) -> None:
    """After a successful build: [mtime, size, sha256] of every input of every object, written
    atomically (an input many objects share is read once); the hash left out (None) of an input saved
    after the build began (`begin`'s mark; the object's own time where there is no mark), which the
    next build compiles again (`stale`) and `affected` takes as edited. Where ninja cannot list them (its deps
    tool did not run: a PATH changed under it by tests in this process), the module is left with no
    record, which `affected` reads as built without one (its inputs from ninja's deps log then)."""
    seen: dict[str, list] = {}
    started = _stat(str(build_dir / BUILDING))  # the mark of this build's start (begin), where it left one

    def fact(path: str) -> list | None:
        if path not in seen:
            seen[path] = file_fact(path)
        return seen[path]

    def facts(obj: str, inputs: list[str]) -> dict[str, list | None]:
        built = started if started is not None else _stat(obj if os.path.isabs(obj) else str(build_dir / obj))
        # an input newer than the build's start was saved while it ran, perhaps after the compiler read it:
        # its hash is not known to be what was built
        return {
            path: (f[:2] + [None] if f and built and f[0] > built[0] else f) for path in inputs for f in [fact(path)]
        }

    found = deps(build_dir, ninja_file)
    if found is None:  # no record rather than an empty one, which would hide every later edit of its inputs
        (build_dir / STAMP).unlink(missing_ok=True)
    else:
        write_whole(build_dir / STAMP, json.dumps({obj: facts(obj, inputs) for obj, inputs in found.items()}))
    finished(build_dir)


def begin(build_dir: Path) -> None:
    """Before ninja starts in the module's folder (after `stale`'s objects are gone): the mark of a
    build begun, kept until it finishes (record, finished). Its own mtime is the start: the file
    system's clock, which the objects' mtimes come from too."""
    build_dir.mkdir(parents=True, exist_ok=True)
    write_whole(build_dir / BUILDING, json.dumps({"pid": os.getpid(), "started": time.time()}))


def finished(build_dir: Path) -> None:
    """The build finished: every object is what ninja made of the inputs it saw."""
    (build_dir / BUILDING).unlink(missing_ok=True)


def unfinished(build_dir: Path) -> list[str]:
    """The objects a build that never finished compiled (no older than its mark, `begin`): what they
    were compiled from is not known. An object of the mark's own clock tick counts."""
    try:
        started = os.stat(build_dir / BUILDING).st_mtime_ns
    except FileNotFoundError:
        return []
    except OSError:  # there, but its time cannot be read: every object counts
        started = 0
    objects = {str(p) for p in build_dir.glob("*.o")} | {
        obj if os.path.isabs(obj) else str(build_dir / obj) for obj in _recorded(build_dir) or {}
    }
    return sorted(obj for obj in objects if (st := _stat(obj)) is not None and st[0] >= started)


def stale(build_dir: Path) -> dict[str, str]:
    """object -> why a build must compile it again though ninja sees nothing newer: an input restored
    to an older copy (`restored`), an unfinished build compiled it (`unfinished`), or an input was saved
    while it compiled (`saved_while_built`)."""
    found = {
        obj: f"{Path(inputs[0]).name} changed but is not newer than it (a restored copy?)"
        for obj, inputs in restored(build_dir).items()
    }
    for obj in unfinished(build_dir):
        found.setdefault(obj, "compiled by a build that did not finish")
    for obj, saved in saved_while_built(build_dir).items():
        found.setdefault(obj, f"{Path(saved).name} was saved while it compiled")
    return found


def saved_while_built(build_dir: Path) -> dict[str, str]:
    """object -> an input the record holds no hash of (saved while its build ran, `record`): what the
    object was compiled from is not known."""
    found = {}
    for obj, inputs in (_recorded(build_dir) or {}).items():
        path = obj if os.path.isabs(obj) else str(build_dir / obj)
        unknown = [name for name, was in inputs.items() if was and len(was) >= 3 and was[2] is None]
        if unknown:
            found[path] = unknown[0]
    return found


_READ: dict[tuple, dict] = {}  # the records read, by file and stat: `affected` reads each one twice


def well_formed(stamp) -> bool:
    """Whether a record read back has the shape `record` writes: {object: {input: file fact}}."""
    return isinstance(stamp, dict) and all(
        isinstance(inputs, dict) and all(isinstance(path, str) and is_fact(fact) for path, fact in inputs.items())
        for inputs in stamp.values()
    )


def _recorded(build_dir: Path) -> dict[str, dict[str, list | None]] | None:
    """The module's content record; None where there is none, or it cannot be read or is of
    another shape (`unreadable` tells these apart)."""
    try:
        st = os.stat(build_dir / STAMP)
        key = (str(build_dir), st.st_mtime_ns, st.st_size, st.st_ino)
        if key not in _READ:
            data = load_json(build_dir / STAMP)
            _READ[key] = data if well_formed(data) else None
        return _READ[key]
    except (OSError, ValueError):
        return None


def unreadable(build_dir: Path) -> bool:
    """The module's content record is there but cannot be read (truncated, not JSON, another shape)."""
    return (build_dir / STAMP).exists() and _recorded(build_dir) is None


def edited(build_dir: Path, stats: dict[str, list[int] | None] | None = None) -> dict[str, str] | None:
    """The inputs of a module whose content differs from the last build's: {path: "edited" or
    "deleted"}. A moved mtime with the same content is no edit. None when the build left no
    record (a module FlashInfer's own loader built, or one built before records had hashes).
    `stats` keeps each input's stat for the next module's call (modules share most headers)."""
    stamp = _recorded(build_dir)
    if stamp is None:
        return None
    if unfinished(build_dir):
        return {"(objects of a build of it that did not finish)": "edited"}
    stats = {} if stats is None else stats
    found: dict[str, str] = {}
    seen = set()  # a header many objects include is checked once against each record of it
    for recorded in stamp.values():
        for path, was in recorded.items():
            if path in found or was is None or (key := (path, *was)) in seen:
                continue
            seen.add(key)
            if path not in stats:
                stats[path] = _stat(path)
            if stats[path] is None:
                found[path] = "deleted"
            elif len(was) >= 3 and was[2] is None:
                found[path] = "edited"  # saved while its object compiled: what was compiled is not known
            elif stats[path] != list(was[:2]) and differs(path, was):
                found[path] = "edited"
    return found


def restored(build_dir: Path) -> dict[str, list[str]]:
    """object -> the inputs that changed since the last build without becoming newer than it."""
    stamp = _recorded(build_dir) or {}
    found = {}
    for obj, inputs in stamp.items():
        built = _stat(obj if os.path.isabs(obj) else str(build_dir / obj))
        if built is None:
            continue  # gone: ninja rebuilds it anyway
        moved = [
            path
            for path, was in inputs.items()
            if was and (now := _stat(path)) is not None and now != was[:2] and now[0] <= built[0]
        ]
        if moved:
            found[obj] = moved
    return found


def dry_run(build_dir: Path, ninja_file: Path) -> tuple[set[str], int] | None:
    """What a build would do, from ninja's own dry run: the objects it would compile (those
    `restored` finds included: the build removes them first) and how many edges ninja would run,
    the link included. None when ninja cannot tell (no ninja, a broken build.ninja)."""
    try:
        done = subprocess.run(
            ["ninja", "-C", str(build_dir), "-f", str(ninja_file), "-n", "-v"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    edges = [line for line in done.stdout.splitlines() if line.startswith("[")]  # "[1/3] <command>" with -v
    # FlashInfer's compile rules end `-c $in -o $out` (flashinfer/jit/cpp_ext.py at v0.6.3,
    # generate_ninja_build_for_op: the rules `compile` and `cuda_compile`)
    compiled = {m.group(1) for line in edges if " -c " in line and (m := re.search(r"\s-o\s+(\S+)", line))}
    objects = {obj if os.path.isabs(obj) else str(build_dir / obj) for obj in [*compiled, *stale(build_dir)]}
    return objects, len(edges)


def invalidate(build_dir: Path, objects) -> None:
    """The objects removed (`stale`'s, `restored`'s): ninja compiles them again."""
    for obj in objects:
        Path(obj if os.path.isabs(obj) else build_dir / obj).unlink(missing_ok=True)
