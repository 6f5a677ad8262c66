"""Build a prebuilt module set with FlashInfer's own AOT tooling, for the acceptance run's `auto`
round on a GPU host that cannot reach the jit-cache's index.

  python3 tools/prebuilt_set.py BUILD_DIR OUT_DIR

What flashinfer/aot.py's `compile_and_package_modules` does at v0.6.3, restricted to the smoke
modules of the default tier for this GPU: point FlashInfer's JIT dirs at BUILD_DIR (its "Update
workdir" step), make the modules' JitSpecs, compile them with `build_jit_specs(...,
skip_prebuilt=False)` (flashinfer/jit/core.py), and copy each `<name>/<name>.so` into OUT_DIR with
`copy_built_kernels` (aot.py). OUT_DIR is then where FlashInfer looks for prebuilt
modules: the jit-cache package's jit_cache/, or, with no such package, the tree's
flashinfer/data/aot (flashinfer/jit/env.py, `_get_aot_dir`). It runs in the `vendored` mode, so
that nothing prebuilt stands in for what it compiles.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import argparse
import time

from fidev.builds import smoke_modules  # noqa: E402
from fidev.core import workspace  # noqa: E402
from fidev.core.failure import ArgumentParser, option, run_main  # noqa: E402
from fidev.core.files import output_folder  # noqa: E402
from fidev.jit import kernel_source  # noqa: E402
from fidev.jit.flashinfer_import import import_flashinfer  # noqa: E402


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # both checked before the build, which takes minutes: a folder, or a path where nothing is yet, that can be
    # written in
    parser.add_argument(
        "build_dir", type=option(output_folder), help="where FlashInfer's JIT dirs point while the modules compile"
    )
    parser.add_argument(
        "out_dir",
        type=option(output_folder),
        help="where each module's <name>/<name>.so is copied: the prebuilt module set",
    )
    args = parser.parse_args()
    os.environ[kernel_source.ENV] = kernel_source.VENDORED  # for what FlashInfer's own build starts too
    import_flashinfer(kernel_source.VENDORED)  # the mode applied first; two lines where flashinfer cannot be imported
    from flashinfer.aot import copy_built_kernels
    from flashinfer.jit import core
    from flashinfer.jit import env as jit_env

    build_dir = args.build_dir.resolve()
    jit_env.FLASHINFER_WORKSPACE_DIR = build_dir
    jit_env.FLASHINFER_JIT_DIR = build_dir / workspace.JIT_DIR_NAME
    jit_env.FLASHINFER_GEN_SRC_DIR = build_dir / workspace.GENERATED_DIR_NAME
    jit_env.FLASHINFER_JIT_DIR.mkdir(parents=True, exist_ok=True)
    jit_env.FLASHINFER_GEN_SRC_DIR.mkdir(parents=True, exist_ok=True)
    sm90 = any(major == 9 for major, _ in core.current_compilation_context.TARGET_CUDA_ARCHS)
    specs = [m.make() for m in smoke_modules.select(False, sm90)]
    started = time.perf_counter()
    core.build_jit_specs(specs, verbose=False, skip_prebuilt=False)
    copy_built_kernels(specs, args.out_dir.resolve())
    print(
        f"prebuilt-set: {len(specs)} modules ({', '.join(s.name for s in specs)}) built in "
        f"{time.perf_counter() - started:.1f} s and copied to {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
