"""The workspace's run-time paths, each named once: FlashInfer's JIT workspace as FlashInfer
computes it, and every state file and folder the tasks keep in it or beside it.

FlashInfer 0.6.3 (flashinfer/jit/env.py, `FLASHINFER_BASE_DIR`, `FLASHINFER_CACHE_DIR` and
`_get_workspace_dir_name`):
    base  = Path(os.getenv("FLASHINFER_WORKSPACE_BASE", Path.home().as_posix()))
    cache = base / ".cache" / "flashinfer"
    JIT dir of one version and arch set = cache / <version> / <archs> / "cached_ops"
`os.getenv` with a default: an empty FLASHINFER_WORKSPACE_BASE is the empty path, the current
folder, not the home folder. `read` does the same, so that FlashInfer and the tasks agree.

A task reads its Workspace once, at its start (`read`), and passes it down; `read` refuses, in two
lines that name the variable, a base FlashInfer could make no folder in (a file, a FIFO, a symlink
loop, a path under a file), before any work that would end in an OS error there.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fidev.core import files
from fidev.core.failure import Failure

BASE_VARIABLE = "FLASHINFER_WORKSPACE_BASE"
JIT_DIR_NAME = "cached_ops"  # FLASHINFER_JIT_DIR = FLASHINFER_WORKSPACE_DIR / "cached_ops"
GENERATED_DIR_NAME = "generated"  # FLASHINFER_GEN_SRC_DIR = FLASHINFER_WORKSPACE_DIR / "generated"
NINJA_FILE = (
    "build.ninja"  # each module's, in its build folder <JIT dir>/<name>/ (JitSpec.ninja_path, flashinfer/jit/core.py)
)

# The state files and folders, by where they live.
# In the cache folder (<base>/.cache/flashinfer): one per set of build options (fidev.builds.build_stamp).
BUILD_STAMP = "fidev-build.json"
# In the version folder (<cache>/<version>):
SUITE_MAP = "fidev-suite-map.json"  # the suite's test cases counted, while its files stay as they are
RUNS = "fidev-upstream-runs"  # upstream-tests' run folders
FILE_TIMES = "file-times.json"  # in RUNS: each test file's time in its last run that finished, its parts summed
BASELINES = "fidev-upstream-baselines"  # upstream-tests' baselines, one per selection
VERDICTS = "fidev-affected.json"  # affected's kept verdicts
AFFECTED_LOCK = (
    "fidev-affected.lock"  # held while an affected run judges this version's builds (fidev.core.files.exclusive)
)
# In a JIT dir (<version>/<archs>/cached_ops):
MODULE_TESTS = "fidev-module-tests.json"  # which of FlashInfer's tests asked for which module
MODULE_TESTS_RAN = "fidev-module-tests-ran.json"  # the tests whose entries there a run wrote (not a dry run)
TREE = "fidev-tree.json"  # the tree's include/ and csrc/ files as last built
# In a module's build folder:
GENERATORS = ".fidev-generators.json"  # the tree's Python files that generated its sources
CALL = ".fidev-generator-call.json"  # the call that made its JitSpec
SMOKE_MODULE = ".fidev-smoke-module.json"  # its smoke module key, where smoke's tests built it (not `build`)
INPUTS = ".fidev-inputs.json"  # its inputs' contents as built
BUILDING = ".fidev-building.json"  # a build of it began and has not finished: when (fidev.records.ninja_inputs)
AHEAD = ".fidev-built-ahead.json"  # the plan built it ahead of its tests, and no record has named a test of it since
# In the vendored tree:
RELEASE_FILES = ".fidev-release-files.json"  # what each file of the source release held
TREE_LOCK = ".fidev-tree.lock"  # beside the tree, as .<tree name>.fidev-tree.lock: held while a tool writes the tree
# A temporary folder's prefix: affected's gate for FlashInfer's tests.
AFFECTED_SCRATCH = "fidev-affected-"


@dataclass(frozen=True)
class Workspace:
    """Where FlashInfer's builds and the tasks' state live, for one FlashInfer version."""

    base: Path
    version: str

    @property
    def cache(self) -> Path:
        return cache_of(self.base)

    @property
    def version_dir(self) -> Path:
        return self.cache / self.version

    @property
    def runs(self) -> Path:
        return self.version_dir / RUNS

    @property
    def baselines(self) -> Path:
        return self.version_dir / BASELINES

    @property
    def file_times(self) -> Path:
        return self.runs / FILE_TIMES

    def baseline(self, selection: list[str]) -> Path:
        """The baseline of one selection (its test nodes, pytest's options, the sample's), a file per selection."""
        return self.baselines / f"{hashlib.sha256(json.dumps(sorted(selection)).encode()).hexdigest()[:16]}.json"

    @property
    def suite_map(self) -> Path:
        return self.version_dir / SUITE_MAP

    @property
    def verdicts(self) -> Path:
        return self.version_dir / VERDICTS

    @property
    def affected_lock(self) -> Path:
        return self.version_dir / AFFECTED_LOCK

    def build_stamp(self, options: Mapping[str, bool]) -> Path:
        """One stamp per set of build options, so that `build` and `build --abi` each keep theirs."""
        tag = "".join(f"-{name}" for name, on in sorted(options.items()) if on)
        return self.cache / BUILD_STAMP.replace(".json", f"{tag}.json")

    def jit_dirs(self) -> list[Path]:
        """This version's JIT dirs, one per arch set that has one."""
        return sorted(p for p in self.version_dir.glob(f"*/{JIT_DIR_NAME}") if p.is_dir())

    def other_versions(self) -> list[str]:
        """The versions other than this one that have a JIT dir in the cache."""
        return sorted({p.parent.parent.name for p in self.cache.glob(f"*/*/{JIT_DIR_NAME}")} - {self.version})


def module_files(build_dir: Path) -> tuple[Path, Path]:
    """A module's ninja file and library in its build folder (JitSpec.ninja_path and jit_library_path,
    flashinfer/jit/core.py: <JIT dir>/<name>/build.ninja and <name>.so)."""
    return build_dir / NINJA_FILE, build_dir / f"{build_dir.name}.so"


class ModuleFiles:
    """A module's files by its `build_dir` (module_files), for a dataclass that has one."""

    build_dir: Path

    @property
    def ninja_path(self) -> Path:
        return module_files(self.build_dir)[0]

    @property
    def jit_library_path(self) -> Path:
        return module_files(self.build_dir)[1]


def module_lock(build_dir: Path) -> Path:
    """The lock FlashInfer builds and loads a module under (JitSpec.lock_path, flashinfer/jit/core.py at
    v0.6.3: get_tmpdir() / f"{name}.lock", get_tmpdir being <JIT dir>/tmp)."""
    return jit_dir_lock(build_dir.parent).parent / f"{build_dir.name}.lock"


def jit_dir_lock(jit_dir: Path) -> Path:
    """FlashInfer's lock of a whole JIT dir (flashinfer/jit/core.py at v0.6.3: build_jit_specs takes
    get_tmpdir() / "flashinfer_jit.lock", get_tmpdir being <JIT dir>/tmp)."""
    return jit_dir / "tmp" / "flashinfer_jit.lock"


def generated_dir(jit_dir: Path) -> Path:
    """FlashInfer's folder of generated sources beside a JIT dir (FLASHINFER_GEN_SRC_DIR)."""
    return jit_dir.parent / GENERATED_DIR_NAME


def base(env: Mapping[str, str] = os.environ) -> Path:
    """FlashInfer's FLASHINFER_BASE_DIR: the variable's value, even empty, else the home folder."""
    return Path(env.get(BASE_VARIABLE, Path.home().as_posix()))


def cache_of(base_dir: Path) -> Path:
    """FlashInfer's FLASHINFER_CACHE_DIR under a base folder."""
    return base_dir / ".cache" / "flashinfer"


def read(version: str, env: Mapping[str, str] = os.environ, check: bool = True) -> Workspace:
    """The workspace of FlashInfer `version`, as the environment names it now; with `check`, two lines where
    its base, or a folder between it and the version's, is no folder FlashInfer could make its own in
    (preflight reads it unchecked: its JIT-dir check reports that among the others)."""
    ws = Workspace(base(env), version)
    if check:
        named = f"{BASE_VARIABLE}={env[BASE_VARIABLE]}" if BASE_VARIABLE in env else f"{BASE_VARIABLE} (unset)"
        for path in (
            ws.base,
            ws.version_dir,
        ):  # the base's kind alone: FlashInfer writes only on the way to the version's
            why = unusable(path, probe=path == ws.version_dir)
            if why:
                where = "the base " if path == ws.base else ""
                raise Failure(
                    f"{named}: {where}{path} {why}: FlashInfer keeps its JIT builds there",
                    f"set {BASE_VARIABLE} to a folder you can write, or a path where nothing is yet, "
                    "or move what is in the way",
                )
    return ws


def unusable(path: Path, probe: bool = True) -> str | None:
    """Why FlashInfer could not make its folders at `path` (mkdir with parents), as said after its name:
    it, or a path above it, is a file, a FIFO, a dangling link, a symlink loop...; None where it can: a
    folder, or nothing yet below folders, where (with `probe`) the deepest folder that exists takes a new file."""
    path = Path(os.path.abspath(path))
    deepest = path
    for step in (*reversed(path.parents), path):  # from the root down: the first that is no folder
        said = "is" if step == path else f"is under {step}, which is"
        try:
            mode = os.stat(step).st_mode
        except FileNotFoundError:
            if os.path.islink(step):
                return f"{said} a dangling symlink"
            break
        except OSError as e:
            return f"{said} a symlink loop" if e.errno == errno.ELOOP else f"{said} unreachable ({e.strerror or e})"
        if not stat.S_ISDIR(mode):
            return f"{said} {files.kind_of(mode, 'a file')}, not a folder"
        deepest = step
    why = files.cannot_write_in(deepest) if probe else None
    return (
        None if why is None else f"{'is' if deepest == path else f'is under {deepest}, which is'} not writable ({why})"
    )
