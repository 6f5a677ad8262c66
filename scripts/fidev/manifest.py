"""Read the workspace's pins from pyproject.toml, the one place they are stated."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, or the copy pip vendors, reads the same TOML
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        try:
            from pip._vendor import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            tomllib = None  # load_manifest says so in two lines

from fidev.failure import Failure

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


def cuda_release(text: str) -> str:
    """A CUDA release as every script's --cuda takes it, X.Y (12.9) or the wheel tag (cu129),
    as X.Y. Anything else is refused, so that no script turns it into a broken key."""
    match = re.fullmatch(r"(\d+)\.(\d)", text.strip()) or re.fullmatch(r"cu(\d{2,})(\d)", text.strip().lower())
    if not match:
        raise Failure(f"{text!r} is not a CUDA release", "write it as X.Y (12.9) or as its wheel tag (cu129)")
    return f"{int(match.group(1))}.{match.group(2)}"


def load_manifest(path: Path = MANIFEST) -> dict:
    if tomllib is None:
        raise Failure("this Python 3.10 has no TOML reader (no tomli, no pip) to read the manifest",
                      "run it with Python >= 3.11 (the environments have 3.12), or with a Python 3.10 that has pip")
    try:
        with open(path, "rb") as f:
            data = f.read()
        return tomllib.loads(data.decode("utf-8"))
    except OSError as e:
        raise Failure(f"cannot read the manifest {path}: {e.strerror or e}", "run it from a checkout of the workspace") from e
    except UnicodeDecodeError as e:  # TOML is UTF-8; an editor that saved it as Latin-1, say
        line = data[:e.start].count(b"\n") + 1
        raise Failure(f"{path.name} is not valid UTF-8: byte 0x{data[e.start]:02x} on line {line}",
                      f"save it as UTF-8, which TOML requires (`git diff {path.name}` shows what changed)") from e
    except tomllib.TOMLDecodeError as e:
        raise Failure(f"{path.name} is not valid TOML: {e}", f"fix the line it names (`git diff {path.name}` shows what changed)") from e


def _table(manifest: dict, *keys: str) -> dict:
    table = manifest
    for key in keys:
        table = table.get(key) if isinstance(table, dict) else None
    if not isinstance(table, dict):
        raise Failure(f"{MANIFEST.name} has no [{'.'.join(keys)}] table",
                      f"restore it (`git diff {MANIFEST.name}` shows what changed)")
    return table


def feature(manifest: dict) -> dict:
    return _table(manifest, "tool", "pixi", "feature", FEATURE)


def _entry(table: dict, key: str, where: str):
    if key not in table:
        raise Failure(f"{MANIFEST.name}: [{where}] has no {key}", f"restore it (`git diff {MANIFEST.name}` shows what changed)")
    return table[key]


def _exact(spec: object, name: str) -> str:
    """'==0.6.3' or {version = '==0.6.3+cu129'} -> the pinned version."""
    version = spec.get("version") if isinstance(spec, dict) else spec
    match = re.fullmatch(r"==\s*([^,*\s]+)", str(version))
    if not match:
        raise Failure(f"{MANIFEST.name}: {name} must be pinned exactly (==X), found {version!r}",
                      f"pin it with == ({name} must match FlashInfer's release exactly)")
    return match.group(1)


@cache
def pins(path: Path = MANIFEST) -> Pins:
    manifest = load_manifest(path)
    feat = feature(manifest)
    where = f"tool.pixi.feature.{FEATURE}"
    deps, pypi = _table(feat, "dependencies"), _table(feat, "pypi-dependencies")
    cuda = re.fullmatch(r"(\d+\.\d+)\.\*", str(_entry(deps, "cuda-version", f"{where}.dependencies")))
    if not cuda:
        raise Failure(f"{path.name}: cuda-version must read 'X.Y.*', found {deps['cuda-version']!r}", "pin the CUDA release as X.Y.*")
    tvm = _entry(pypi, "apache-tvm-ffi", f"{where}.pypi-dependencies")
    facts = _table(manifest, "tool", FEATURE)
    return Pins(
        cuda=cuda.group(1),
        flashinfer=_exact(_entry(pypi, "flashinfer-cubin", f"{where}.pypi-dependencies"), "flashinfer-cubin"),
        jit_cache=_exact(_entry(pypi, "flashinfer-jit-cache", f"{where}.pypi-dependencies"), "flashinfer-jit-cache"),
        tvm_ffi_range=tvm["version"] if isinstance(tvm, dict) else tvm,
        source_dir=path.parent / _entry(facts, "source-dir", f"tool.{FEATURE}"),
        source_commit=_entry(facts, "source-commit", f"tool.{FEATURE}"),
        sdist_sha256=_entry(facts, "source-sdist-sha256", f"tool.{FEATURE}"),
    )


@cache
def package_indexes(path: Path = MANIFEST) -> dict[str, str]:
    """Normalized distribution name -> the `index` the manifest installs it from (torch, the jit-cache)."""
    from fidev import package_index  # here, not at the top: preflight imports this module and needs no urllib/ssl

    specs = _table(feature(load_manifest(path)), "pypi-dependencies")
    return {package_index.normalize(name): spec["index"] for name, spec in specs.items() if isinstance(spec, dict) and "index" in spec}


def requirement(name: str, path: Path = MANIFEST) -> str:
    """`name<range>` as flashinfer-dev declares it (PyPI, else conda, whose simple ranges pip
    reads the same), for tooling outside Pixi that must install the same range (.ci/run)."""
    feat = feature(load_manifest(path))
    for table in ("pypi-dependencies", "dependencies"):
        spec = feat.get(table, {}).get(name)
        if spec is not None:
            version = spec.get("version", "*") if isinstance(spec, dict) else spec
            return name if version.strip() == "*" else f"{name}{version.strip()}"
    raise Failure(f"{MANIFEST.name} declares no {name} in flashinfer-dev", f"restore it (`git diff {MANIFEST.name}` shows what changed)")
