"""Compile the JIT modules the smoke suite needs, for this GPU, from the vendored FlashInfer.

FlashInfer's own per-module build files, built side by side by one ninja per module. Modules that
flashinfer-jit-cache provides are reported and skipped where the kernel source mode loads them
prebuilt: in `auto` (the default) where none of their inputs was edited, in `prebuilt` always, in
`vendored` never. A repeated build is a no-op, and so is one after an edit of a
header or csrc/ file as far as FlashInfer goes: while nothing that decides the modules' build
files changed (fidev.builds.build_stamp), ninja alone rebuilds what the edit touched, and neither torch
nor flashinfer is imported.
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import sys
import time
from pathlib import Path

from fidev.builds import build_stamp, smoke_modules
from fidev.builds.module_builds import build_specs
from fidev.core import workspace
from fidev.core.failure import ArgumentParser, Failure, run_main
from fidev.core.manifest import pins
from fidev.jit import kernel_source, module_choice
from fidev.jit.flashinfer_import import import_flashinfer


def target_archs(core):
    archs = core.current_compilation_context.TARGET_CUDA_ARCHS
    if not archs:
        raise Failure(
            "no CUDA GPU is visible to torch, so there is no architecture to build for",
            "run on the GPU host, or set FLASHINFER_CUDA_ARCH_LIST (e.g. '9.0a') to build for one",
        )
    return sorted(archs)


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide", action="store_true", help="also build the wider smoke tier")
    parser.add_argument(
        "--abi", action="store_true", help="also build what abi-smoke calls (adds gdn_prefill on sm_90)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    p = pins()
    ws, mode = workspace.read(p.flashinfer), kernel_source.mode()  # read once, here, and passed down
    options = {"wide": args.wide, "abi": args.abi}
    stamp = build_stamp.fingerprint(options, p.source_dir, mode)
    kept = build_stamp.load(ws, options, stamp)
    if kept is not None:
        return rebuild_kept(kept, started, mode)

    imported = import_flashinfer(mode)
    from flashinfer.jit import core

    env, import_s = imported.jit_env, imported.seconds
    archs = target_archs(core)
    sm90 = any(major == 9 for major, _ in archs)
    chosen = smoke_modules.select(args.wide, sm90, args.abi)
    arch_text = " ".join(f"sm_{major}{minor}" for major, minor in archs)
    print(f"build: kernel source {mode}, arch {arch_text}, JIT dir {env.FLASHINFER_JIT_DIR} (import {import_s:.1f} s)")
    skipped = [m.key for m in smoke_modules.select(args.wide, True, args.abi) if m not in chosen]
    if skipped:
        print(f"build: not for {arch_text}: {', '.join(skipped)} (sm_90 only)")

    specs, compiled = [], []
    for module in chosen:
        spec = module.make()
        if spec.is_aot:  # in `auto`, only where none of its inputs was edited (fidev.jit.module_choice)
            state = "prebuilt"
        else:
            state = "built before" if spec.jit_library_path.exists() else "to compile"
            specs.append(spec)
            compiled.append(build_stamp.Module(module.key, spec.name, spec.build_dir, spec.sources))
        print(f"  {module.key:20} {state:32} {spec.name}")

    build_s, slowest = build_specs(specs)
    show_slowest(slowest)
    for line in module_choice.report("build"):
        print(line)
    if stamp is not None:
        build_stamp.write(ws, options, stamp, compiled)
    print(f"build: {len(chosen)} modules ready, {len(specs)} checked or compiled in {build_s:.2f} s")
    return 0


def rebuild_kept(kept: list[build_stamp.Module], started: float, mode: str) -> int:
    """The stamp's modules, by ninja alone: nothing that decides their build files changed."""
    stale = [m for m in kept if build_stamp.has_work(m)]
    if not stale:
        print(
            f"build: {len(kept)} modules current, kernel source {mode} (checked in "
            f"{time.perf_counter() - started:.2f} s: nothing that decides them changed since the last build, "
            "so flashinfer was not imported)"
        )
        return 0
    print(
        f"build: kernel source {mode}: {', '.join(m.key for m in stale)} to rebuild (a source or header changed; "
        "their build files are current, so flashinfer is not imported)"
    )
    build_s, slowest = build_specs(stale)
    show_slowest(slowest)
    print(f"build: {len(kept)} modules ready, {len(stale)} rebuilt in {build_s:.2f} s")
    return 0


def show_slowest(slowest) -> None:
    if slowest:
        print(
            "build: slowest objects: "
            + ", ".join(f"{Path(o).parent.name}/{Path(o).name} {t:.1f} s" for t, o in slowest)
        )


if __name__ == "__main__":
    sys.exit(run_main(main))
