"""Find FlashInfer JIT modules (`<uri>/<uri>.so`) in an installed flashinfer-jit-cache, a wheel
file or a folder (a local JIT cache), and read what each exports through TVM-FFI."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fidev.bindings.cargo_pins import parse_wheel_filename
from fidev.bindings.elf import DynamicInfo, read_dynamic
from fidev.bindings.wheel_cache import split_cached_name
from fidev.core.failure import Failure
from fidev.core.files import not_a_file
from fidev.jit import uris


@dataclass(frozen=True)
class Module:
    uri: str
    path: str  # wheel member path, or the path relative to the folder searched
    size: int
    dynamic: DynamicInfo


@dataclass(frozen=True)
class Source:
    kind: str  # "installed", "wheel" or "folder"
    location: Path
    version: str | None  # the jit-cache's version where known


def is_module_path(path: PurePosixPath) -> bool:
    """FlashInfer puts each module at `<uri>/<uri>.so`; other .so files are not modules."""
    return path.suffix == ".so" and len(path.parts) >= 2 and path.parent.name == path.stem


def matches(uri: str, pattern: str | None) -> bool:
    if not pattern:
        return True
    return fnmatch.fnmatchcase(uri, pattern if any(c in pattern for c in "*?[") else f"*{pattern}*")


def installed_jit_cache() -> Source:
    spec = importlib.util.find_spec(uris.JIT_CACHE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise Failure(
            "flashinfer-jit-cache is not installed in this environment",
            "run it in the environment (`pixi run -e flashinfer-dev artifacts`), or name a wheel or a folder: "
            "artifacts PATH",
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = importlib.metadata.version("flashinfer-jit-cache")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return Source("installed", package.parent, version)


def open_source(arg: str | None) -> Source:
    if arg is None:
        return installed_jit_cache()
    path = Path(arg).expanduser()
    if path.is_dir():
        return Source("folder", path, None)
    if path.is_file() and path.suffix == ".whl":
        _, name = split_cached_name(path.name)  # a wheel from the crate's cache, too
        try:
            version = parse_wheel_filename(name).version
        except Failure:  # a renamed wheel still lists; only its version is unknown
            version = None
        return Source("wheel", path, version)
    what = not_a_file(path) or "is neither a .whl file nor a folder"  # missing, a FIFO or a device: said for what it is
    raise Failure(
        f"{arg} {what}",
        "name a flashinfer-jit-cache wheel, a folder of built modules (the JIT dir `build` prints), or "
        "nothing (installed)",
    )


def modules(source: Source, pattern: str | None = None) -> Iterator[Module]:
    """The modules of `source` whose URI matches `pattern` (a substring, or a glob), sorted."""
    if source.kind == "wheel":
        yield from _wheel_modules(source.location, pattern)
        return
    root = (
        source.location / uris.JIT_CACHE_PACKAGE / uris.MODULES_IN_PACKAGE
        if source.kind == "installed"
        else source.location
    )
    for so in sorted(root.rglob("*.so")):
        rel = PurePosixPath(so.relative_to(source.location).as_posix())
        if is_module_path(rel) and matches(so.stem, pattern):
            yield _folder_module(so, rel)


def _folder_module(so: Path, rel: PurePosixPath) -> Module:
    """The module file `so` found in a folder; two lines where it is no regular file (opening a FIFO would
    wait for a writer forever; a symbolic link loop, a folder named `<uri>.so`) or cannot be read."""
    what = not_a_file(so)
    if what:
        raise Failure(
            f"{so} {what}",
            "a module is a regular file `<uri>/<uri>.so`: remove or rename what is there, or name another folder",
        )
    try:
        with open(so, "rb") as f:
            return Module(so.stem, str(rel), os.fstat(f.fileno()).st_size, read_dynamic(f, str(so)))
    except OSError as e:
        raise Failure(
            f"{so} cannot be read: {e.strerror or e}",
            "make it readable (its permissions), or name another folder",
        ) from None


def room_for(wheel: Path, member: PurePosixPath, size: int) -> None:
    """Two lines where the member unpacks to more than the temporary folder has free: zipfile unpacks no
    more than the size the archive declares (ZipExtFile reads up to ZipInfo.file_size), so a member that
    declares a size past what the disk holds would fill it, not fit it."""
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free
    if size > free:
        raise Failure(
            f"{wheel}: its member {member} unpacks to {size} bytes, more than the {free} free in {folder}",
            "free space there, or set TMPDIR to a folder with room",
        )


def _wheel_modules(wheel: Path, pattern: str | None) -> Iterator[Module]:
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise Failure(
            f"{wheel} is not a readable wheel (zip): {e}",
            "download it again; `prefetch` verifies the SHA-256 of pinned wheels",
        ) from e
    with archive:
        members = [(PurePosixPath(i.filename), i) for i in archive.infolist()]
        for member, info in sorted(members, key=lambda m: m[0]):
            if not (is_module_path(member) and matches(member.stem, pattern)):
                continue
            # pyelftools seeks back and forth: give it a real file, not a compressed stream.
            room_for(wheel, member, info.file_size)
            try:
                with archive.open(info) as packed, tempfile.TemporaryFile() as unpacked:
                    shutil.copyfileobj(packed, unpacked, 1 << 20)
                    module = Module(
                        member.stem, str(member), info.file_size, read_dynamic(unpacked, f"{wheel.name}:{member}")
                    )
            except (zipfile.BadZipFile, zlib.error, EOFError) as e:  # the member damaged, the central directory intact
                raise Failure(
                    f"{wheel}: its member {member} cannot be unpacked ({e})",
                    "download it again; `prefetch` verifies the SHA-256 of pinned wheels",
                ) from None
            yield module
