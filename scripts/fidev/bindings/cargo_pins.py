"""Wheel pins in the shape the Rust bindings crate keeps in its Cargo.toml,
`[package.metadata.flashinfer_rs.pinned_wheels.<name>.<cuda>.<arch>]` with filename, url and
sha256: what a wheel's file name says about those keys, the pins of a local wheel (its URL from
its package index), and the TOML's writer and reader."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fidev.core import package_index
from fidev.core.failure import Failure
from fidev.core.files import NAME_MAX, not_a_file, sha256_file

METADATA_PATH = ("package", "metadata", "flashinfer_rs", "pinned_wheels")
ARCHES = ("x86_64", "aarch64")  # the crate's arch keys


@dataclass(frozen=True)
class WheelName:
    filename: str
    name: str  # the distribution as the wheel spells it (underscores): the crate's key
    version: str
    platforms: tuple[str, ...]

    @property
    def cuda(self) -> str | None:
        """cu129 for a `+cu129` local version (flashinfer-jit-cache), else None."""
        match = re.search(r"\+(cu\d+)", self.version)
        return match.group(1) if match else None

    @property
    def arches(self) -> tuple[str, ...]:
        """The crate arch keys this wheel serves: from its platform tags; a pure wheel serves all."""
        if "any" in self.platforms:
            return ARCHES
        return tuple(a for a in ARCHES if any(tag.endswith(a) for tag in self.platforms))


def parse_wheel_filename(filename: str) -> WheelName:
    """The wheel's name, version and platforms, read by `packaging` (PEP 427)."""
    try:
        from packaging.utils import InvalidWheelFilename
        from packaging.utils import parse_wheel_filename as parse
    except ModuleNotFoundError as e:
        raise Failure(
            "packaging is not installed in this interpreter",
            "run it in the environment: `pixi run -e flashinfer-dev ...`",
        ) from e
    try:
        _, version, _, tags = parse(filename)
    except InvalidWheelFilename as e:
        raise Failure(
            f"{filename} is not a wheel file name: {e}", "pass the wheel as downloaded, without renaming it"
        ) from e
    return WheelName(filename, filename.split("-")[0], str(version), tuple(sorted({t.platform for t in tags})))


@dataclass(frozen=True)
class Pin:
    name: str
    cuda: str
    arch: str
    filename: str
    url: str
    sha256: str

    @property
    def cache_name(self) -> str:
        """Its file's name in the wheel cache the crate reads: `<sha256>-<filename>` (fidev.bindings.wheel_cache)."""
        return f"{self.sha256}-{self.filename}"


# A write of the cache's file goes through `<cache_name>.tmp-<pid>` (files.write_verified): room for a pid of 7 digits
CACHE_TEMPORARY = len(".tmp-") + 7


def pin_toml(pins_: list[Pin]) -> str:
    """TOML tables for Cargo.toml, one per `<name>.<cuda>.<arch>` (TOML refuses a table defined
    twice): a pin given twice is written once; two different pins of one table are refused in two
    lines. json.dumps writes a valid TOML basic string."""
    blocks, seen = [], {}
    for p in pins_:
        header = ".".join((*METADATA_PATH, p.name, p.cuda, p.arch))
        if seen.setdefault(header, p) != p:
            raise Failure(
                f"{seen[header].filename} and {p.filename} both pin {p.name} for {p.cuda} on {p.arch}",
                "pin one wheel of each package for each CUDA key and arch",
            )
        if seen[header] is not p:
            continue
        blocks.append(
            f"[{header}]\nfilename = {json.dumps(p.filename)}\nurl = {json.dumps(p.url)}\n"
            f"sha256 = {json.dumps(p.sha256)}\n"
        )
    return "\n".join(blocks)


def _subtables(value, source: str, keys: tuple[str, ...]) -> dict:
    """A level of the pins' tables (<name>, then <name>.<cuda>): a table of tables, or two lines."""
    if not isinstance(value, dict):
        raise Failure(
            f"{source}: {'.'.join(keys)} is {type(value).__name__} {value!r:.40}, not a table of tables",
            "regenerate the block with `pixi run -e flashinfer-dev pin WHEEL`: [<name>.<cuda>.<arch>] tables "
            "of filename, url and sha256",
        )
    return value


def read_pins(toml: dict, source: str) -> list[Pin]:
    """Every `<name>.<cuda>.<arch>` entry under [package.metadata.flashinfer_rs.pinned_wheels]."""
    table = toml
    for depth, key in enumerate(METADATA_PATH):
        table = table.get(key) if isinstance(table, dict) else None
        if table is not None and not isinstance(table, dict):  # there, but of another TOML type
            raise Failure(
                f"{source}: {'.'.join(METADATA_PATH[: depth + 1])} is {type(table).__name__} {table!r:.40}, "
                "not a table",
                "regenerate the block with `pixi run -e flashinfer-dev pin WHEEL`: [<name>.<cuda>.<arch>] tables "
                "of filename, url and sha256",
            )
    if table is None:
        raise Failure(
            f"{source} has no [{'.'.join(METADATA_PATH)}] table",
            "name the bindings crate's Cargo.toml, or a file holding the blocks the `pin` task prints",
        )
    found = []
    for name, by_cuda in table.items():
        for cuda, by_arch in _subtables(by_cuda, source, (*METADATA_PATH, name)).items():
            for arch, entry in _subtables(by_arch, source, (*METADATA_PATH, name, cuda)).items():
                where = f"{'.'.join(METADATA_PATH)}.{name}.{cuda}.{arch}"
                if not isinstance(entry, dict):
                    raise Failure(f"{source}: {where} is not a table", "each entry needs filename, url and sha256")
                values = [entry.get(k, "") for k in ("filename", "url", "sha256")]
                filename, url, sha = (v if isinstance(v, str) else "" for v in values)  # another type: none
                # the url as written: downloadable holds it to pin's rules, which refuse a space
                filename, sha = filename.strip(), sha.strip()
                if (
                    not filename.endswith(".whl")
                    or "/" in filename
                    or not url
                    or len(sha) != 64
                    or not all(c in "0123456789abcdef" for c in sha)
                ):
                    raise Failure(
                        f"{source}: {where} needs a wheel filename, an http(s) or file url and a 64-hex-digit "
                        "lowercase sha256",
                        "regenerate the block with `pixi run -e flashinfer-dev pin WHEEL`",
                    )
                found.append(Pin(name, cuda, arch, filename, url, sha))
    return found


def index_for(wheel: WheelName, indexes: dict[str, str]) -> str:
    """The index `indexes` (normalized distribution -> index URL, the manifest's per-package
    `index`) names for this wheel, PyPI otherwise; a jit-cache wheel of another CUDA is looked up in
    that CUDA's index."""
    index = indexes.get(package_index.normalize(wheel.name))
    if index is None:
        return package_index.PYPI_SIMPLE
    return re.sub(r"cu\d+", wheel.cuda, index) if wheel.cuda else index


def find_in_index(index: str, wheel: WheelName, timeout: float = 30) -> tuple[str, str | None]:
    """(download URL, the index's sha256 or None) of `wheel` on a PEP 691 / PEP 503 index page."""
    page = f"{index.rstrip('/')}/{package_index.normalize(wheel.name)}/"
    try:
        base, files = package_index.listed_files(page, timeout=timeout)
    except Failure as e:
        fix = (
            f"{index} has no project {wheel.name}: check the wheel and --index, or give the download URL "
            "yourself: --url URL"
            if isinstance(e, package_index.HttpStatus) and e.status == 404
            else "run it where the index is reachable, or give the download URL yourself: --url URL"
        )
        raise Failure(f"cannot read the index page: {e.problem}", fix) from e
    found = package_index.file_in(files, base, wheel.filename)
    if found is None:
        raise Failure(
            f"{page} does not list {wheel.filename}",
            "check the file name (and the CUDA tag in it), or give the download URL yourself: --url URL",
        )
    return found


def readable(path: Path) -> None:
    """The file opens as a zip (its central directory is whole): a truncated download is refused
    before it is pinned, also where --url leaves no published hash to compare with."""
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise Failure(f"{path.name} is not a readable wheel (zip): {e}", "download it again, then pin it") from None


def given_url(url: str, filename: str, said: str = "--url") -> None:
    """Two lines where a URL given for `filename` (pin --url, already a URL by package_index.url; `said`
    names where it was given) cannot download it: its last path part is not the file name (percent-encoded
    or not), or, a file:// URL, it names something that is there and is no regular file (a FIFO, a device,
    a folder)."""
    parts = urllib.parse.urlparse(url)
    last = urllib.parse.unquote(parts.path.rsplit("/", 1)[-1])
    if last != filename:
        raise Failure(
            f"{said} {url} ends in {last!r}, not the wheel's file name {filename}",
            f"give the URL the wheel is published at, ending in /{filename}",
        )
    if parts.scheme == "file":
        path = package_index.local_path(url)
        why = not_a_file(path)
        if why and why != "does not exist":  # a file:// URL may name the file on the host that will fetch it
            raise Failure(f"{said} {url}: {path} {why}", "name the wheel file itself: file:///path/to/" + filename)


def downloadable(pin: Pin, source: str) -> None:
    """Two lines, naming `source` (the pins' file) and the pin's entry, where its filename is no wheel's
    (PEP 427) or too long for the cache's name of it (cache_name), or its URL can never download its wheel
    by the rules pin holds a --url to (package_index.url, given_url): a pin written or edited by hand is
    refused before prefetch downloads anything, not at its download with a vaguer message (a host that does
    not resolve, a cache blamed for a name too long), nor after the wheels before it were downloaded."""
    entry = f"{source}: {'.'.join(METADATA_PATH)}.{pin.name}.{pin.cuda}.{pin.arch}"
    try:
        parse_wheel_filename(pin.filename)
    except Failure as e:
        raise Failure(
            f"{entry}: filename {e.problem}", "give the wheel's file name as published (pin writes it)"
        ) from None
    if (size := len(os.fsencode(pin.cache_name)) + CACHE_TEMPORARY) > NAME_MAX:
        raise Failure(
            f"{entry}: filename is {len(os.fsencode(pin.filename))} bytes: the cache's name of the wheel "
            f"(<sha256>-<filename>, its temporary suffix too) would be {size}, past the file system's {NAME_MAX}",
            "give the wheel's file name as published (pin writes it)",
        )
    said = f"{entry}: url"
    try:
        package_index.url(pin.url)
    except Failure as e:
        raise Failure(f"{said} {e.problem}", e.fix) from None
    given_url(pin.url, pin.filename, said)


def pins_for(path: Path, filename: str, cuda: str, index: str | None = None, url: str | None = None) -> list[Pin]:
    """The pins of one local wheel file, named `filename` where it was published: one per crate
    arch it serves. `cuda` is the key (cu129) for a wheel whose version names none. The URL is
    `url`, or looked up on `index`, whose published sha256 must then equal the file's."""
    wheel = parse_wheel_filename(filename)
    if url is not None:
        given_url(url, filename)
    readable(path)
    sha = sha256_file(path)
    if url is None:
        url, published = find_in_index(index or package_index.PYPI_SIMPLE, wheel)
        if published and published.lower() != sha:
            raise Failure(
                f"{filename}: the index publishes sha256 {published}, the file has {sha}",
                "the file is not the published wheel: download it again",
            )
    if not wheel.arches:
        raise Failure(
            f"{filename}: platform {', '.join(wheel.platforms)} is none of the crate's arches ({', '.join(ARCHES)})",
            "pin a manylinux x86_64 or aarch64 wheel",
        )
    return [Pin(wheel.name, wheel.cuda or cuda, arch, filename, url, sha) for arch in wheel.arches]
