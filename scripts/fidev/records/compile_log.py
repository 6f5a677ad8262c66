"""How many times each module's objects compiled during a run, from ninja's own log in the module's
build folder (`.ninja_log`: ninja appends a line per command it ran, `start end mtime output hash`
tab-separated under a `# ninja log v5` header, as ninja 1.11.1 writes it). Every build of a module,
whoever runs it (build, affected's rebuild, a warmup, a test's own JitSpec.build_and_load), is one
ninja in that folder, so the lines appended since the run began say what the run compiled, and an
object named twice was compiled twice. A log that shrank meanwhile was recompacted by ninja: its
count is not known (None).
"""

from __future__ import annotations

from pathlib import Path

LOG = ".ninja_log"


def sizes(jit_dirs: list[Path]) -> dict[Path, int]:
    """Each module folder's log size now (0 where it has none), to read what a run appends."""
    return {folder: log_size(folder) for jit_dir in jit_dirs for folder in jit_dir.iterdir() if folder.is_dir()}


def log_size(folder: Path) -> int:
    try:
        return (folder / LOG).stat().st_size
    except OSError:
        return 0


def compiled_since(jit_dirs: list[Path], before: dict[Path, int]) -> dict[str, dict[str, int] | None]:
    """{module: {object: times compiled}} of the lines appended since `before` (sizes()), for the
    modules that compiled any object (a link alone is none); None for a module whose log shrank
    (recompacted: not known)."""
    found: dict[str, dict[str, int] | None] = {}
    for folder, size in sizes(jit_dirs).items():
        start = before.get(folder, 0)
        if size == start:
            continue
        if size < start:
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
