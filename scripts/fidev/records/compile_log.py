"""How many times each module's objects compiled during a run, from ninja's own log in the module's
build folder (`.ninja_log`: ninja appends a line per command it ran, `start end mtime output hash`
tab-separated under a `# ninja log v5` header, as ninja 1.11.1 writes it). Every build of a module,
whoever runs it (build, affected's rebuild, a warmup, a test's own JitSpec.build_and_load), is one
ninja in that folder, so the lines appended since the run began say what the run compiled, and an
object named twice was compiled twice. A log that is another file than it was, or shrank, was
rewritten meanwhile (ninja recompacts it now and then): its count is not known (None).
"""

from __future__ import annotations

from pathlib import Path

LOG = ".ninja_log"


def sizes(jit_dirs: list[Path]) -> dict[Path, tuple[int | None, int]]:
    """Each module folder's log now, (its inode, its size), (None, 0) where it has none, to read what
    a run appends."""
    return {folder: log_mark(folder) for jit_dir in jit_dirs for folder in jit_dir.iterdir() if folder.is_dir()}


def log_mark(folder: Path) -> tuple[int | None, int]:
    try:
        found = (folder / LOG).stat()
    except OSError:
        return None, 0
    return found.st_ino, found.st_size


def log_size(folder: Path) -> int:
    return log_mark(folder)[1]


def compiled_since(
    jit_dirs: list[Path], before: dict[Path, tuple[int | None, int]]
) -> dict[str, dict[str, int] | None]:
    """{module: {object: times compiled}} of the lines appended since `before` (sizes()), for the
    modules that compiled any object (a link alone is none); None for a module whose log is another
    file than it was, or shrank (rewritten, as ninja's recompaction does: not known)."""
    found: dict[str, dict[str, int] | None] = {}
    for folder, (inode, size) in sizes(jit_dirs).items():
        was_inode, start = before.get(folder, (None, 0))
        if (inode, size) == (was_inode, start) or size == start == 0:
            continue
        if size < start or (was_inode is not None and inode != was_inode):
            found[folder.name] = None
            continue
        with open(folder / LOG, "rb") as log:
            log.seek(start)
            appended = log.read(size - start).decode(errors="replace")
        counts: dict[str, int] = {}
        for line in appended.splitlines():
            fields = line.split("\t")
            if len(fields) >= 4 and not line.startswith("#") and fields[3].endswith(".o"):  # an object, not the link
                counts[fields[3]] = counts.get(fields[3], 0) + 1
        if counts:
            found[folder.name] = counts
    return found


def twice(compiled: dict[str, dict[str, int] | None]) -> list[str]:
    """The modules an object of which compiled more than once, or whose count is not known."""
    return sorted(name for name, objects in compiled.items() if objects is None or any(n > 1 for n in objects.values()))
