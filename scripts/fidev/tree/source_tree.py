"""What the FlashInfer source folder holds, in one place for preflight and the materializer: the
pinned git submodule checkout, the pinned source release materialized by
fetch_flashinfer_source.py, or something else; and whether an editable install of it still has
the links FlashInfer's build backend made."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fidev.core.manifest import ROOT, Pins

# Written inside a materialized tree: which archive it came from and that archive's SHA-256, as
# checked against the pin before unpacking.
MARKER = ".materialized-from-sdist"
# What FlashInfer's JIT compiles from; a tree without them is partial.
REQUIRED = ("csrc", "include", "3rdparty/cutlass/include")
# flashinfer/data/<name> -> <tree>/<target>: the links FlashInfer 0.6.3's build_backend.py
# (`_create_data_dir(use_symlinks=True)`) makes inside the tree for an editable install. A tree
# re-created after the install lacks them, and the JIT then fails on its jinja templates.
EDITABLE_LINKS = {"csrc": "csrc", "include": "include", "cutlass": "3rdparty/cutlass", "spdlog": "3rdparty/spdlog"}
# How to get the tree, for every message that finds it missing.
GET = "git submodule update --init --recursive (no GitHub: python3 scripts/fetch_flashinfer_source.py)"
REINSTALL = (
    "pixi reinstall -e flashinfer-dev flashinfer-python (it re-creates them; outside pixi: reinstall it editable)"
)
GIT_TIMEOUT_S = 5


def marker_text(pins: Pins) -> str:
    return f"{pins.sdist_name} sha256={pins.sdist_sha256}\n"


def shown(path: Path) -> str:
    """The path as messages show it: relative to the workspace where it lies inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@dataclass(frozen=True)
class SourceTree:
    path: Path
    kind: str  # "missing", "not a folder", "empty", "submodule", "release" or "foreign"
    pinned: bool = False  # the submodule at the pinned commit, or the release the pin names
    found: str = ""  # the commit, or the marker's first line
    lacking: tuple[str, ...] = field(default=())  # of REQUIRED


def git_head(path: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def descends_from(path: Path, commit: str) -> bool:
    """Whether the checkout's HEAD has `commit` among its ancestors (a contributor's commits on top
    of the pin); False where git cannot tell."""
    try:
        done = subprocess.run(
            ["git", "-C", str(path), "merge-base", "--is-ancestor", commit, "HEAD"],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def inspect(path: Path, pins: Pins) -> SourceTree:
    if not path.exists() and not path.is_symlink():
        return SourceTree(path, "missing")
    if not path.is_dir():
        return SourceTree(path, "not a folder")
    if not any(path.iterdir()):
        return SourceTree(path, "empty")
    lacking = tuple(d for d in REQUIRED if not (path / d).is_dir() or not any((path / d).iterdir()))
    if (path / ".git").exists():
        commit = git_head(path) or ""
        return SourceTree(path, "submodule", commit == pins.source_commit, commit, lacking)
    marker = path / MARKER
    if marker.is_file():
        text = marker.read_text(errors="replace")
        return SourceTree(path, "release", text == marker_text(pins), text.splitlines()[0] if text else "", lacking)
    return SourceTree(path, "foreign", lacking=lacking)


def broken_editable_links(tree: Path) -> list[str]:
    """The flashinfer/data links an editable install of `tree` should have and does not."""
    data = tree / "flashinfer" / "data"
    return [
        name
        for name, target in EDITABLE_LINKS.items()
        if not (data / name).is_dir() or (data / name).resolve() != (tree / target).resolve()
    ]
