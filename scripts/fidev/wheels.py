"""Wheel pins in the shape the Rust bindings crate keeps in its Cargo.toml:
`[package.metadata.flashinfer_rs.pinned_wheels.<name>.<cuda>.<arch>]` with filename, url, sha256."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from fidev import package_index
from fidev.files import sha256_file
from fidev.ui import Failure

METADATA_PATH = ("package", "metadata", "flashinfer_rs", "pinned_wheels")
ARCHES = ("x86_64", "aarch64")  # the crate's arch keys


@dataclass(frozen=True)
class WheelName:
    filename: str
    name: str  # distribution, as the wheel spells it (underscores): the crate's key
    version: str
    platform: str

    @property
    def cuda(self) -> str | None:
        """cu129 for a `+cu129` local version (flashinfer-jit-cache), else None."""
        match = re.search(r"\+(cu\d+)", self.version)
        return match.group(1) if match else None

    @property
    def arches(self) -> tuple[str, ...]:
        """The crate arch keys this wheel serves: from its platform tag; a pure wheel serves all."""
        if self.platform == "any":
            return ARCHES
        return tuple(a for a in ARCHES if any(tag.endswith(a) for tag in self.platform.split(".")))


def parse_wheel_filename(filename: str) -> WheelName:
    parts = filename[:-len(".whl")].split("-") if filename.endswith(".whl") else []
    if len(parts) not in (5, 6):  # name-version[-build]-python-abi-platform
        raise Failure(f"{filename} is not a wheel file name (name-version-python-abi-platform.whl)",
                      "pass the wheel as downloaded, without renaming it")
    return WheelName(filename, parts[0], parts[1], parts[-1])


@dataclass(frozen=True)
class Pin:
    name: str
    cuda: str
    arch: str
    filename: str
    url: str
    sha256: str


def pin_toml(pins_: list[Pin]) -> str:
    """TOML tables for Cargo.toml. json.dumps writes a valid TOML basic string."""
    blocks = []
    for p in pins_:
        header = ".".join((*METADATA_PATH, p.name, p.cuda, p.arch))
        blocks.append(f"[{header}]\nfilename = {json.dumps(p.filename)}\nurl = {json.dumps(p.url)}\nsha256 = {json.dumps(p.sha256)}\n")
    return "\n".join(blocks)


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
        raise Failure(f"cannot read the index page: {e.problem}", "run it where the index is reachable, or give the download URL yourself: --url URL") from e
    found = package_index.file_in(files, base, wheel.filename)
    if found is None:
        raise Failure(f"{page} does not list {wheel.filename}",
                      "check the file name (and the CUDA tag in it), or give the download URL yourself: --url URL")
    return found


def pins_for(path: Path, filename: str, cuda: str, index: str | None = None, url: str | None = None) -> list[Pin]:
    """The pins of one local wheel file, named `filename` where it was published: one per crate
    arch it serves. `cuda` is the key (cu129) for a wheel whose version names none. The URL is
    `url`, or looked up on `index`, whose published sha256 must then equal the file's."""
    wheel = parse_wheel_filename(filename)
    sha = sha256_file(path)
    if url is None:
        url, published = find_in_index(index or package_index.PYPI_SIMPLE, wheel)
        if published and published.lower() != sha:
            raise Failure(f"{filename}: the index publishes sha256 {published}, the file has {sha}",
                          "the file is not the published wheel: download it again")
    if not wheel.arches:
        raise Failure(f"{filename}: platform {wheel.platform} is none of the crate's arches ({', '.join(ARCHES)})",
                      "pin a manylinux x86_64 or aarch64 wheel")
    return [Pin(wheel.name, wheel.cuda or cuda, arch, filename, url, sha) for arch in wheel.arches]
