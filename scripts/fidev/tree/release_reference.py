"""Which files of the vendored tree differ from the pinned FlashInfer release, without the network:
the reference for the per-module choice between prebuilt kernels and the vendored source
(fidev.jit.module_choice).

- A git checkout (the submodule): against the pinned commit, wherever HEAD is (a contributor's own
  commits are edits too), `git diff --name-only <commit>` for tracked files and
  `git ls-files --others --exclude-standard` for new ones.
- The PyPI source release: against the per-file hashes that scripts/fetch_flashinfer_source.py
  writes into the tree (RELEASE_FILES) after the archive's own hash check, before anything in it
  runs. A file is hashed again only when its size or mtime moved.
- Any other tree matches neither: two lines.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.files import differs, file_fact, fits, is_fact, load_json, write_whole
from fidev.core.manifest import Pins
from fidev.core.workspace import RELEASE_FILES
from fidev.tree import source_tree

SKIPPED = {source_tree.MARKER, RELEASE_FILES}
GIT_TIMEOUT_S = 60


def _files(tree: Path) -> list[Path]:
    """The tree's files, without the editable install's flashinfer/data links (they point back
    into the tree), build leftovers (__pycache__, *.egg-info) and the workspace's own markers."""
    found = []
    for root, dirs, files in os.walk(tree):
        here = Path(root)
        dirs[:] = sorted(
            d
            for d in dirs
            if d != "__pycache__" and not d.endswith(".egg-info") and not (here == tree / "flashinfer" and d == "data")
        )
        found += [
            here / f for f in sorted(files) if not (here == tree and f in SKIPPED) and not (here / f).is_symlink()
        ]
    return found


def record_release(tree: Path) -> None:
    """Right after the hash-checked archive is unpacked: each file's mtime, size and sha256."""
    facts = {str(path.relative_to(tree)): file_fact(path) for path in _files(tree)}
    write_whole(tree / RELEASE_FILES, json.dumps(facts))


def edited_files(tree: Path, pins: Pins) -> list[str]:
    """The tree's files (relative to it) that differ from the pinned release: changed, added or removed."""
    found = source_tree.inspect(tree, pins)
    if found.kind == "submodule":
        # committed edits too: the working tree against the pinned commit, wherever HEAD is
        if not _git(tree, "rev-parse", "--verify", "--quiet", f"{pins.source_commit}^{{commit}}", may_fail=True):
            raise Failure(
                f"{source_tree.shown(tree)} (at {found.found[:12] or 'no commit'}) does not have the pinned commit "
                f"{pins.source_commit[:12]}: there is nothing to tell its edits by",
                "git -C extern/tracked/flashinfer fetch origin, or git submodule update --init --recursive",
            )
        # --no-renames: a renamed file is its old name deleted and its new one added, not the new name alone
        return sorted(
            set(_git(tree, "diff", "--name-only", "--no-renames", pins.source_commit))
            | set(_git(tree, "ls-files", "--others", "--exclude-standard"))
        )
    if found.kind == "release" and found.pinned and (tree / RELEASE_FILES).is_file():
        return _against_record(tree)
    if found.kind == "release":
        what = (
            "the pinned release without its file record (unpacked before records were kept)"
            if found.pinned
            else f"another release ({found.found})"
        )
    else:
        what = f"neither the pinned commit's checkout nor the pinned release ({found.kind})"
    raise Failure(
        f"{source_tree.shown(tree)} is {what}: there is nothing to tell its edits by",
        "python scripts/fetch_flashinfer_source.py --replace (the pinned release, recorded), or the git "
        "submodule at the pinned commit",
    )


def _git(tree: Path, *args: str, may_fail: bool = False) -> list[str]:
    """git's output lines; two lines where git cannot run, or (unless `may_fail`: then []) fails."""
    try:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Failure(
            f"git could not answer for {source_tree.shown(tree)}: {e}",
            "check that git is installed and the checkout is readable",
        ) from e
    if done.returncode != 0 and may_fail:
        return []
    if done.returncode != 0:
        raise Failure(
            f"git {args[0]} failed in {source_tree.shown(tree)}: {done.stderr.strip()[:200]}",
            "git submodule update --init --recursive, then try again",
        )
    return [line for line in done.stdout.splitlines() if line]


RECORD = dict[str, is_fact]  # the release's record (record_release): {file relative to the tree: its fact}


REWRITE = (
    "python scripts/fetch_flashinfer_source.py --replace unpacks the release again, with its record (the tree as it "
    "is kept beside it as <tree>.replaced-<time>: copy your edits back from there)"
)


def unreadable_record(tree: Path) -> str | None:
    """Why the release's record in `tree` (record_release) cannot be read, or None where it can."""
    try:
        recorded = load_json(tree / RELEASE_FILES)
    except (OSError, ValueError) as e:
        return str(e)
    return (
        None
        if fits(recorded, RECORD)
        else "it is not the record of the release's files (file: its mtime, size, sha256)"
    )


def _against_record(tree: Path) -> list[str]:
    if (why := unreadable_record(tree)) is not None:
        raise Failure(f"{tree / RELEASE_FILES} cannot be read: {why}", REWRITE)
    recorded = load_json(tree / RELEASE_FILES)
    now = {str(p.relative_to(tree)): p for p in _files(tree)}
    changed = sorted(set(recorded) ^ set(now))
    return sorted(changed + [rel for rel in set(recorded) & set(now) if differs(now[rel], recorded[rel])])


def released_facts(tree: Path) -> dict[str, list]:
    """{file relative to the tree: its fact as released}, from the source release's record; empty
    for a git checkout (its released content is a commit's, with no file fact) or without a
    readable record."""
    try:
        recorded = load_json(tree / RELEASE_FILES)
    except (OSError, ValueError):
        return {}
    return recorded if fits(recorded, RECORD) else {}
