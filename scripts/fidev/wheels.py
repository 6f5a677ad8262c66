"""Wheel pins in the shape the Rust bindings crate keeps in its Cargo.toml:
`[package.metadata.flashinfer_rs.pinned_wheels.<name>.<cuda>.<arch>]` with filename, url, sha256."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from fidev.files import sha256_file
from fidev.manifest import feature, load_manifest, pins
from fidev.ui import Failure

METADATA_PATH = ("package", "metadata", "flashinfer_rs", "pinned_wheels")
ARCHES = ("x86_64", "aarch64")  # the crate's arch keys
PYPI_SIMPLE = "https://pypi.org/simple"


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


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def index_for(wheel: WheelName) -> str:
    """The index the manifest installs this distribution from (PyPI when it names none); a
    jit-cache wheel of another CUDA is looked up in that CUDA's index."""
    for dist, spec in feature(load_manifest()).get("pypi-dependencies", {}).items():
        if normalize(dist) == normalize(wheel.name) and isinstance(spec, dict) and "index" in spec:
            return re.sub(r"cu\d+", wheel.cuda, spec["index"]) if wheel.cuda else spec["index"]
    return PYPI_SIMPLE


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (href, text)
        self._href = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None:
            self.links.append((self._href, data.strip()))
            self._href = None


def find_in_index(index: str, wheel: WheelName, timeout: float = 30) -> tuple[str, str | None]:
    """(download URL, the index's sha256 or None) of `wheel` on a PEP 691 / PEP 503 index page."""
    page = f"{index.rstrip('/')}/{normalize(wheel.name)}/"
    request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            base, kind, body = response.geturl(), response.headers.get_content_type(), response.read().decode()
    except (urllib.error.URLError, OSError) as e:
        raise Failure(f"cannot read the index page {page}: {getattr(e, 'reason', e)}",
                      "run it where the index is reachable, or give the download URL yourself: --url URL") from e
    if kind.endswith("json"):
        files = [(f["url"], f["filename"], f.get("hashes", {}).get("sha256")) for f in json.loads(body).get("files", [])]
    else:
        parser = _Links()
        parser.feed(body)
        files = []
        for href, text in parser.links:
            url, _, fragment = href.partition("#")
            sha = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
            files.append((url, text or urllib.parse.unquote(url.rsplit("/", 1)[-1]), sha))
    for url, filename, sha in files:
        if filename == wheel.filename or urllib.parse.unquote(url.rsplit("/", 1)[-1]) == wheel.filename:
            return urllib.parse.urljoin(base, url), sha
    raise Failure(f"{page} does not list {wheel.filename}",
                  "check the file name (and the CUDA tag in it), or give the download URL yourself: --url URL")


def pins_for(path: Path, url: str | None = None, index: str | None = None, cuda: str | None = None) -> list[Pin]:
    """The pins of one local wheel file: one per crate arch it serves. The URL comes from `url`,
    or from the index, whose published sha256 must then equal the file's."""
    wheel = parse_wheel_filename(path.name)
    sha = sha256_file(path)
    if url is None:
        url, published = find_in_index(index or index_for(wheel), wheel)
        if published and published.lower() != sha:
            raise Failure(f"{path.name}: the index publishes sha256 {published}, the file has {sha}",
                          "the file is not the published wheel: download it again")
    if wheel.cuda and cuda and cuda != wheel.cuda:
        raise Failure(f"{path.name} is built for {wheel.cuda}, not {cuda}", f"drop --cuda, or pin the {cuda} wheel")
    cuda_key = wheel.cuda or cuda or pins().cuda_tag
    if not wheel.arches:
        raise Failure(f"{path.name}: platform {wheel.platform} is none of the crate's arches ({', '.join(ARCHES)})",
                      "pin a manylinux x86_64 or aarch64 wheel")
    return [Pin(wheel.name, cuda_key, arch, path.name, url, sha) for arch in wheel.arches]
