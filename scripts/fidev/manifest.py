"""Read the workspace's pins from pyproject.toml, the one place they are stated."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli that pip vendors reads the same TOML
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "pyproject.toml"
FEATURE = "flashinfer-dev"


@dataclass(frozen=True)
class Pins:
    cuda: str  # "12.9"
    flashinfer: str  # "0.6.3", the source release every artifact must match
    jit_cache: str  # "0.6.3+cu129"
    tvm_ffi_range: str  # PEP 440 specifier set
    source_dir: Path
    source_commit: str
    sdist_sha256: str

    @property
    def cuda_tag(self) -> str:
        return cuda_tag(self.cuda)

    @property
    def sdist_name(self) -> str:
        return f"flashinfer_python-{self.flashinfer}.tar.gz"


def cuda_tag(cuda: str) -> str:
    """The wheel tag of a CUDA release: 12.9 -> cu129."""
    return "cu" + cuda.replace(".", "")


def load_manifest(path: Path = MANIFEST) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def feature(manifest: dict) -> dict:
    return manifest["tool"]["pixi"]["feature"][FEATURE]


def _exact(spec: object, name: str) -> str:
    """'==0.6.3' or {version = '==0.6.3+cu129'} -> the pinned version."""
    version = spec["version"] if isinstance(spec, dict) else spec
    match = re.fullmatch(r"==\s*([^,*\s]+)", str(version))
    if not match:
        raise ValueError(f"{MANIFEST.name}: {name} must be pinned exactly (==X), found {version!r}")
    return match.group(1)


@cache
def pins(path: Path = MANIFEST) -> Pins:
    manifest = load_manifest(path)
    feat = feature(manifest)
    cuda = re.fullmatch(r"(\d+\.\d+)\.\*", feat["dependencies"]["cuda-version"])
    if not cuda:
        raise ValueError(f"{path.name}: cuda-version must read 'X.Y.*'")
    pypi = feat["pypi-dependencies"]
    tvm = pypi["apache-tvm-ffi"]
    facts = manifest["tool"][FEATURE]
    return Pins(
        cuda=cuda.group(1),
        flashinfer=_exact(pypi["flashinfer-cubin"], "flashinfer-cubin"),
        jit_cache=_exact(pypi["flashinfer-jit-cache"], "flashinfer-jit-cache"),
        tvm_ffi_range=tvm["version"] if isinstance(tvm, dict) else tvm,
        source_dir=path.parent / facts["source-dir"],
        source_commit=facts["source-commit"],
        sdist_sha256=facts["source-sdist-sha256"],
    )
