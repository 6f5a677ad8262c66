"""What is built: the JIT dirs of the pinned version, the modules in them, and the check that they
were compiled from the vendored tree, before anything is compared."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fidev.builds import build_stamp, module_builds, smoke_modules
from fidev.core import workspace
from fidev.core.failure import Failure
from fidev.core.manifest import pins
from fidev.jit import kernel_source, module_choice, uris
from fidev.records import build_records, ninja_inputs
from fidev.tree import source_tree

BUILD_FIX = "pixi run -e flashinfer-dev build (python scripts/build.py), then edit and run affected"


def build_fix(mode: str) -> str:
    """How to get modules built: in `auto` with a prebuilt set, build compiles only the modules
    you edited, so a first build for affected is `vendored`. `mode` is the task's kernel source
    mode, read at its start."""
    if mode == kernel_source.AUTO and module_choice.prebuilt_available():
        return (
            f"{kernel_source.ENV}={kernel_source.VENDORED} pixi run -e flashinfer-dev build, then affected "
            "with the same setting (in auto, a module flashinfer-jit-cache ships is built here only once you "
            "edit it)"
        )
    return BUILD_FIX


def jit_dirs(ws: workspace.Workspace, mode: str) -> list[Path]:
    """The JIT dirs of the pinned version, each arch set's (fidev.core.workspace)."""
    found = ws.jit_dirs()
    if found:
        return found
    others = ws.other_versions()
    if others:
        raise Failure(
            f"the JIT dir {ws.cache} holds builds of FlashInfer {', '.join(others)}, none of {ws.version}, the "
            "pinned one",
            build_fix(mode),
        )
    raise Failure(f"nothing is built yet: no JIT dir under {ws.cache}", build_fix(mode))


class Built:
    """A module built in a JIT dir, in the shape fidev.builds.module_builds builds."""

    def __init__(self, build_dir: Path):
        self.name, self.build_dir = build_dir.name, build_dir
        self.ninja_path, self.jit_library_path = workspace.module_files(build_dir)

    @property
    def sources(self) -> list[str]:
        """Its sources, from the build.ninja FlashInfer wrote (`build <obj>: [cuda_]compile <source>`,
        flashinfer/jit/cpp_ext.py, `generate_ninja_build_for_op`, at v0.6.3): fidev.builds.module_builds
        shares the cores by them."""
        return re.findall(r"^build \S+: (?:cuda_)?compile (\S+)", self.ninja_path.read_text(), re.M)

    @property
    def generated(self) -> bool:
        """Some of its sources are written by a generator, in the workspace's `generated` folder beside
        the JIT dir (FLASHINFER_GEN_SRC_DIR, flashinfer/jit/env.py at v0.6.3). A module of the tree's
        csrc/ files alone (such as the one tests/utils/test_norm.py's `test_norm_compilation_without_fp8`
        builds with gen_jit_spec) has nothing a Python edit could regenerate."""
        # generate_ninja_build_for_op (flashinfer/jit/cpp_ext.py) writes sources resolved
        gen_dir = workspace.generated_dir(self.build_dir.parent).resolve()
        return any(Path(src).is_relative_to(gen_dir) for src in self.sources)


def built_modules(jit_dir: Path) -> list[Built]:
    return [Built(d) for d in sorted(jit_dir.iterdir()) if all(p.is_file() for p in workspace.module_files(d))]


def tier_keys(ws: workspace.Workspace, jit_dir: Path) -> dict[str, str]:
    """{module name: smoke module key} for smoke's modules built in `jit_dir` (no import): those `build`
    made, from its stamps, and those smoke's tests built (the wide tier's, where `build --wide` did not:
    fidev.records.build_records.smoke_module), whose smoke tests are their tests too."""
    marked = {
        name: key
        for name, m in smoke_modules.BY_NAME.items()
        if (key := build_records.smoke_module(jit_dir / name)) == m.key
    }
    return marked | {m.name: m.key for m in build_stamp.stamped_modules(ws) if m.build_dir.parent == jit_dir}


class Resolver:
    """Paths resolved as a build's inputs name them: each folder once (the inputs of 10 modules are
    some 20,000 paths in a few hundred folders; the editable install's flashinfer/data links are
    folders), then the file itself where it is one of a FlashInfer tree's."""

    def __init__(self):
        self.folders: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        folder, name = os.path.split(path)
        if folder not in self.folders:
            self.folders[folder] = os.path.realpath(folder)
        at = os.path.join(self.folders[folder], name)
        return os.path.realpath(at) if "/include/flashinfer/" in at or "/csrc/" in at else at


def check_tree(tree: Path, modules: list[Built]) -> None:
    """The vendored tree is there, and the built modules were compiled from it."""
    found = source_tree.inspect(tree, pins())
    if found.kind in ("missing", "not a folder", "empty"):
        raise Failure(
            f"there is no vendored FlashInfer tree at {source_tree.shown(tree)} ({found.kind})",
            "get it first (README: First, the FlashInfer source), then build",
        )
    real = str(tree.resolve())
    resolved = Resolver()
    checked: set[str] = set()
    for module in modules:
        for path in sorted(ninja_inputs.inputs(module.build_dir, module.ninja_path) - checked):
            checked.add(path)
            at = resolved(path)
            if ("/include/flashinfer/" in at or "/csrc/" in at) and not (at == real or at.startswith(real + os.sep)):
                raise Failure(
                    f"{module.name} was built from {at.split('/include/flashinfer/')[0].split('/csrc/')[0]}, "
                    f"not the vendored tree {source_tree.shown(tree)}",
                    "rebuild it from the vendored tree: pixi run -e flashinfer-dev build, or upstream-tests FAMILY for "
                    "FlashInfer's own tests' modules",
                )


def drop_unrecorded_ahead(dirs: list[Path], smoke: set[str], listing: bool = False) -> set[Path]:
    """The modules upstream-tests' plan built ahead that no case then loaded and no record names
    (fidev.builds.module_builds.drop_unrecorded_ahead: a run that ended before its own clean-up left
    them), removed before anything is judged, in one line; returns their folders. Such a module has
    no test to run, so every edit that reaches it would end `not covered`, though nothing but a build
    ahead made it. smoke's modules (`smoke`, by name) are kept: they have smoke's tests. `listing`
    (--list, which changes nothing): they are left out of what is judged, and left where they are."""
    folders = [f for d in dirs for f in sorted(d.iterdir()) if f.is_dir() and f.name not in smoke]
    if listing:
        left = {f for f in folders if build_records.unrecorded_ahead(f)}
        if left:
            print(
                f"affected: {len(left)} module(s) built ahead that no test loaded and no record names, left out "
                f"(a run without --list removes them): {', '.join(sorted(f.name for f in left))}",
                flush=True,
            )
        return left
    removed = module_builds.drop_unrecorded_ahead(folders, lambda line: print(f"affected: {line}", flush=True))
    return {f for f in folders if f.name in removed}  # drop_unrecorded_ahead names only what is gone


@dataclass
class Found:
    """What affected starts from: the vendored tree, the JIT dirs, their modules, smoke's module
    keys by name (tier), the tests the upstream-tests plan recorded for each module, and the
    task's workspace and kernel source mode (read at its start, the mode applied)."""

    tree: Path
    dirs: list[Path]
    modules: list[Built]
    tier: dict[str, str]
    recorded: dict[str, list[str]]
    ws: workspace.Workspace
    mode: str


def some_built(ws: workspace.Workspace, mode: str) -> tuple[list[Path], list[Built]]:
    """The JIT dirs of the pinned version and the modules built in them, at least one, or two lines: with none
    built, affected has nothing to judge an edit against (tools/planted_bugs.py asks before it plants)."""
    dirs = jit_dirs(ws, mode)
    modules = [m for d in dirs for m in built_modules(d)]
    if not modules:
        raise Failure(f"nothing is built yet in {', '.join(map(str, dirs))}", build_fix(mode))
    return dirs, modules


def find(ws: workspace.Workspace, mode: str, listing: bool = False) -> Found:
    """The built modules, checked against the tree, with the kernel source mode applied; `listing`
    (--list): nothing in the JIT dirs is changed (drop_unrecorded_ahead)."""
    p = pins()
    tree = p.source_dir
    dirs, modules = some_built(ws, mode)
    check_tree(tree, modules)
    module_choice.apply(mode)
    if mode == kernel_source.PREBUILT and importlib.util.find_spec(uris.JIT_CACHE_PACKAGE) is not None:
        # FlashInfer would load the jit-cache's copy of any module it ships, whatever was rebuilt here
        raise Failure(
            f"kernel source {mode}: flashinfer-jit-cache is installed, so the tests would run its prebuilt "
            "kernels, not your edits",
            f"{kernel_source.ENV}={kernel_source.VENDORED} pixi run -e flashinfer-dev affected",
        )
    for stamp in build_stamp.unreadable_stamps(
        ws
    ):  # without it smoke's modules would pass for FlashInfer's tests' ones
        raise Failure(
            f"the build stamp {stamp} cannot be read (truncated?), so affected cannot tell which built modules "
            "are smoke's",
            "run the build again, which rewrites it: pixi run -e flashinfer-dev build (and build-abi for "
            "abi-smoke's modules)",
        )
    tier = {name: key for d in dirs for name, key in tier_keys(ws, d).items()}
    dropped = drop_unrecorded_ahead(dirs, set(tier), listing)
    modules = [m for m in modules if m.build_dir not in dropped]
    if not modules:
        raise Failure(f"nothing is built yet in {', '.join(map(str, dirs))}", build_fix(mode))
    recorded = {name: tests for d in dirs for name, tests in build_records.module_tests(d).items()}
    return Found(tree, dirs, modules, tier, recorded, ws, mode)
