"""The pinned FlashInfer source release, materialized into a folder: looked up where pip would,
downloaded, hash-checked before anything is unpacked, unpacked beside the destination and renamed
into place, so that an interrupted run leaves nothing half-written."""

from __future__ import annotations

import errno
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

from fidev.core import package_index
from fidev.core.failure import Failure
from fidev.core.files import (
    NAME_MAX,
    PATH_MAX,
    missing_folders,
    not_a_file,
    not_a_folder,
    remove_empty,
    sha256_file,
    write_verified,
)
from fidev.core.manifest import ROOT, Pins
from fidev.core.workspace import RELEASE_FILES, TREE_LOCK
from fidev.tree import edits, release_reference, source_tree

PROJECT = "flashinfer-python"
PARTIAL, REPLACED = ".partial-", ".replaced-"  # what the folders made beside --dest add to its name
NETWORK_FIX = (
    "check the network and your index settings (`pip config list`), or pass --archive PATH to a copy of the release"
)


def download(p: Pins, into: Path) -> Path:
    """The source release, from where pip would take it, written only once its SHA-256 is the pin's."""
    settings = package_index.pip_settings()
    try:
        url, published = package_index.find_file(PROJECT, p.sdist_name, settings)
    except Failure as e:
        raise Failure(f"cannot download the {PROJECT}=={p.flashinfer} source release: {e.problem}", NETWORK_FIX) from e
    if published and published.lower() != p.sdist_sha256:
        raise Failure(
            f"{url}: the index publishes sha256 {published}, the manifest pins {p.sdist_sha256}",
            "the index or mirror does not serve the pinned release: fix the mirror, or pass --archive PATH",
        )
    response = package_index.open_url(url, settings, settings.timeout, fix=NETWORK_FIX)
    target = into / p.sdist_name
    write_verified(
        target,
        package_index.read_chunks(response, url, settings.timeout),
        p.sdist_sha256,
        lambda actual: Failure(
            f"{url} has sha256 {actual}, the manifest pins {p.sdist_sha256}",
            "the file is not the pinned release: check the index or mirror serving it",
        ),
    )
    return target


def _safe_members(tar: tarfile.TarFile, name: str) -> list[tarfile.TarInfo]:
    """What tarfile's `data` filter checks, for Pythons before 3.10.12 that lack it: no absolute
    paths, nothing outside the archive's folder, no device files."""
    members = tar.getmembers()
    for m in members:
        path = PurePosixPath(m.name)
        link = PurePosixPath(m.linkname) if m.issym() or m.islnk() else None
        if (
            path.is_absolute()
            or ".." in path.parts
            or (link and (link.is_absolute() or ".." in (path.parent / link).parts))
            or m.isdev()
        ):
            raise Failure(
                f"{name} holds {m.name!r}, which would land outside the tree",
                "use the unmodified source release from PyPI",
            )
    return members


def unpack(archive: Path, scratch: Path, marker: str, where: str) -> Path:
    """The archive's one top folder, unpacked under `scratch` (beside --dest, `where`), with the marker written
    in it. A path of the release too long there is --dest's fault (the release is the pinned one), not the
    archive's."""
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(scratch / "tree", filter="data")
            else:
                tar.extractall(scratch / "tree", members=_safe_members(tar, archive.name))  # noqa: S202 (checked above)
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:
            raise Failure(
                f"cannot unpack {archive.name}: {e}", "re-download it; the copy is damaged or incomplete"
            ) from e
        deepest = len(os.fsencode(e.filename or ""))
        raise Failure(
            f"--dest {where} is too deep for the release: a file of it unpacked beside it would pass the system's "
            f"limit of {PATH_MAX} bytes on a path ({e.strerror}, {deepest} bytes)",
            f"point --dest at a folder nearer /, its path at least {max(1, deepest - PATH_MAX + 1)} bytes shorter",
        ) from None
    except (tarfile.TarError, EOFError) as e:
        raise Failure(f"cannot unpack {archive.name}: {e}", "re-download it; the copy is damaged or incomplete") from e
    tops = list((scratch / "tree").iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        raise Failure(
            f"{archive.name} does not hold one top-level folder", "use the unmodified source release from PyPI"
        )
    (tops[0] / source_tree.MARKER).write_text(marker)
    release_reference.record_release(tops[0])  # what each file holds as released: edits are told by it
    return tops[0]


def materialize(dest: Path, p: Pins, archive: Path | None = None, replace: bool = False) -> str:
    """Return what was done; raise Failure when it cannot be done safely."""
    where = source_tree.shown(dest)
    if archive is not None and archive.is_dir():
        raise Failure(f"--archive {archive} is a folder", f"pass the {p.sdist_name} file itself")
    if archive is not None and (why := not_a_file(archive)):  # a FIFO or /dev/null exists: it is said for what it is
        raise Failure(f"--archive {archive} {why}", f"pass the path of a downloaded {p.sdist_name}")
    elsewhere = (
        f"point --dest at the source folder ({source_tree.shown(p.source_dir)}, the default) or at an empty folder"
    )
    if ROOT.resolve().is_relative_to(dest.resolve()) or ".git" in dest.resolve().parts:
        raise Failure(f"--dest {where} holds this workspace or its .git", elsewhere)
    if any(parent.exists() and not parent.is_dir() for parent in dest.parents):
        raise Failure(
            f"--dest {where}: {next(q for q in dest.parents if q.exists() and not q.is_dir())} is a file, not a folder",
            elsewhere,
        )
    tree = source_tree.inspect(dest, p)
    if tree.kind == "not a folder":
        raise Failure(f"{where} {not_a_folder(dest)}", "point --dest at a folder (or move the file away)")
    if tree.kind == "submodule" and dest.resolve() == p.source_dir.resolve():
        raise Failure(
            f"{where} is the initialized git submodule; refusing to overwrite it",
            "update it with git: git submodule update --init --recursive (or `git submodule deinit -f "
            f"{where}` first to replace it)",
        )
    if tree.kind == "submodule":
        raise Failure(f"{where} is a git checkout; refusing to overwrite it", elsewhere)
    unrecorded = tree.kind == "release" and release_reference.unreadable_record(dest)
    if tree.kind == "release" and tree.pinned and not tree.lacking and not unrecorded:
        return f"{where} already holds {p.sdist_name}; nothing to do"
    if tree.kind == "foreign" and not any((dest / d).is_dir() for d in ("csrc", "include/flashinfer", "flashinfer")):
        raise Failure(
            f"{where} holds files that are not a FlashInfer tree",
            f"{elsewhere}; --replace only ever replaces a FlashInfer tree",
        )
    if tree.kind in ("release", "foreign") and not replace:
        what = (
            f"another release ({tree.found})"
            if tree.kind == "release" and not tree.pinned
            else f"the pinned release, whose record of its files ({RELEASE_FILES}) cannot be read: {unrecorded}"
            if tree.kind == "release" and not tree.lacking
            else f"a partial release (no {', '.join(tree.lacking)})"
            if tree.kind == "release"
            else "a FlashInfer tree that is not the pinned release"
        )
        raise Failure(
            f"{where} holds {what}", f"run it with --replace, which keeps the old tree as {where}.replaced-<time>"
        )
    made = _parent_made(dest, where, replacing=tree.kind in ("release", "foreign"))
    try:
        # a second fetch into it is refused: it would remove this one's scratch
        with edits.tree_lock(dest, "fetch_flashinfer_source"):
            return _write(dest, p, archive, tree.kind, where)
    except BaseException:  # raised again: the folders made for it go (a failed hash check leaves none)
        remove_empty(made)
        raise


def _parent_made(dest: Path, where: str, replacing: bool) -> list[Path]:
    """--dest's folder, made where missing (the folders made, to remove on failure), once the names the
    fetch makes beside --dest fit the file system (_names_fit)."""
    _names_fit(dest, where, replacing)
    made = missing_folders(dest.parent)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Failure(
            f"cannot write beside {where}: {e.strerror or e}", "point --dest at a folder whose parent you can write"
        ) from e
    return made


def _names_fit(dest: Path, where: str, replacing: bool) -> None:
    """Two lines, naming --dest, where a name the fetch makes beside it (its lock, the folder it unpacks into,
    the old tree it keeps where it replaces one: --dest's name and a suffix) would pass NAME_MAX, which --dest's
    own name does not."""
    beside = [f".{dest.name}{TREE_LOCK}", f".{dest.name}{PARTIAL}XXXXXXXX"]
    beside += [f"{dest.name}{REPLACED}YYYYmmdd-HHMMSS"] if replacing else []
    longest = max(beside, key=lambda name: len(os.fsencode(name)))
    if len(os.fsencode(longest)) > NAME_MAX:
        raise Failure(
            f"--dest {where}: the name {longest[:24]}...{longest[-24:]} made beside it while it is written would be "
            f"{len(os.fsencode(longest))} bytes long, past the file system's limit of {NAME_MAX}",
            f"name a path whose every folder and file name is shorter: --dest's own name at most "
            f"{NAME_MAX - len(os.fsencode(longest)) + len(os.fsencode(dest.name))} bytes",
        )


def archive_sha256(archive: Path, p: Pins) -> str:
    """--archive's sha256, or two lines naming it where it cannot be read (not --dest's fault)."""
    try:
        return sha256_file(archive)
    except OSError as e:
        raise Failure(
            f"cannot read --archive {archive}: {e.strerror or e}",
            f"pass a readable copy of {p.sdist_name}, or drop --archive to download it",
        ) from None


def _write(dest: Path, p: Pins, archive: Path | None, kind: str, where: str) -> str:
    """The release unpacked beside `dest` and renamed into place, under the tree's lock."""
    try:
        for stale in dest.parent.glob(f".{dest.name}{PARTIAL}*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a run that was killed
        scratch = Path(tempfile.mkdtemp(prefix=f".{dest.name}{PARTIAL}", dir=dest.parent))
    except OSError as e:
        raise Failure(
            f"cannot write beside {where}: {e.strerror or e}", "point --dest at a folder whose parent you can write"
        ) from e
    try:
        if archive is None:
            archive = download(p, scratch)
        elif (actual := archive_sha256(archive, p)) != p.sdist_sha256:
            raise Failure(
                f"{archive.name} has sha256 {actual}, the manifest pins {p.sdist_sha256}",
                "the file is not the pinned release: check the index or mirror serving it, or re-download",
            )
        new = unpack(archive, scratch, source_tree.marker_text(p), where)
        kept = None
        if kind in ("release", "foreign"):
            kept = dest.with_name(f"{dest.name}{REPLACED}{time.strftime('%Y%m%d-%H%M%S')}")
            dest.rename(kept)
        elif dest.exists():
            dest.rmdir()  # the empty folder git leaves for an uninitialized submodule
        try:
            new.rename(dest)
        except OSError:
            if kept:
                kept.rename(dest)
            raise
    except OSError as e:
        raise Failure(f"cannot write {where}: {e.strerror or e}", "point --dest at a folder you can write") from e
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return f"materialized {p.sdist_name} into {where}" + (
        f"; the old tree is {source_tree.shown(kept)}" if kept else ""
    )
