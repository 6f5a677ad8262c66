"""Compile the JIT modules the smoke suite needs, for this GPU, from the vendored FlashInfer.

One parallel ninja run over FlashInfer's own per-module build files. Modules that
flashinfer-jit-cache provides are reported and skipped, unless the kernel source mode is
`vendored` (FLASHINFER_DEV_KERNEL_SOURCE=vendored), which compiles them from
extern/tracked/flashinfer/csrc. A repeated build is a no-op.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fidev import kernels, smoke_modules
from fidev.ui import Failure, run_main

SLOWEST_SHOWN = 5


def import_flashinfer():
    mode = kernels.apply()
    started = time.perf_counter()
    try:
        import flashinfer  # noqa: F401
        import torch
        from flashinfer.jit import core, env
    except Exception as e:  # a missing package or FlashInfer's own version check
        raise Failure(f"cannot import flashinfer: {e}", "run `pixi run -e flashinfer-dev import-check` for the details") from e
    return mode, torch, core, env, time.perf_counter() - started


def target_archs(torch, core):
    archs = core.current_compilation_context.TARGET_CUDA_ARCHS
    if not archs:
        raise Failure("no CUDA GPU is visible to torch, so there is no architecture to build for",
                      "run on the GPU host, or set FLASHINFER_CUDA_ARCH_LIST (e.g. '9.0a') to build for one")
    return sorted(archs)


def run_ninja(jit_dir: Path, top: Path) -> None:
    """Stream one line per finished object: ninja's [done/total elapsed] and the output file."""
    cmd = ["ninja", "-C", str(jit_dir), "-f", str(top)]
    if os.environ.get("MAX_JOBS", "").isdigit():
        cmd += ["-j", os.environ["MAX_JOBS"]]
    env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    tail = []
    for line in proc.stdout:
        status = re.match(r"(\[\d+/\d+ [\d.]+s\]) .* -o (\S+)", line)
        if status:
            out = Path(status.group(2))
            print(f"  {status.group(1)} {out.parent.name}/{out.name}", flush=True)
        elif line.strip() and not line.startswith("ninja: Entering"):
            tail.append(line.rstrip())
            print("  " + line.rstrip(), flush=True)
    if proc.wait() != 0:
        first_error = next((t for t in tail if "error" in t.lower()), tail[-1] if tail else "no output")
        raise Failure(f"the JIT build failed: {first_error[:300]}",
                      "read the compiler output above; `pixi run -e flashinfer-dev preflight` checks the toolchain")


def ninja_log_lines(jit_dir: Path) -> list[str]:
    log = jit_dir / ".ninja_log"
    return log.read_text().splitlines() if log.exists() else []


def slowest_objects(new_lines: list[str]) -> list[tuple[float, str]]:
    """Compile times of this run's objects: the lines ninja appended to its log."""
    rows = [line.split("\t") for line in new_lines if not line.startswith("#")]
    return sorted(((int(r[1]) - int(r[0])) / 1000, r[3]) for r in rows if len(r) >= 4)[::-1][:SLOWEST_SHOWN]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide", action="store_true", help="also build the wider smoke tier")
    args = parser.parse_args()

    mode, torch, core, env, import_s = import_flashinfer()
    archs = target_archs(torch, core)
    sm90 = any(major == 9 for major, _ in archs)
    chosen = smoke_modules.select(args.wide, sm90)
    arch_text = " ".join(f"sm_{major}{minor}" for major, minor in archs)
    print(f"build: kernel source {mode}, arch {arch_text}, JIT dir {env.FLASHINFER_JIT_DIR} (import {import_s:.1f} s)")
    skipped = [m.key for m in smoke_modules.select(args.wide, True) if m not in chosen]
    if skipped:
        print(f"build: not for {arch_text}: {', '.join(skipped)} (sm_90 only)")

    specs = []
    for module in chosen:
        spec = module.make()
        if spec.is_aot:
            state = "prebuilt (flashinfer-jit-cache)"
        else:
            state = "built before" if spec.jit_library_path.exists() else "to compile"
            specs.append(spec)
        print(f"  {module.key:20} {state:32} {spec.name}")

    started = time.time()
    log_before = len(ninja_log_lines(env.FLASHINFER_JIT_DIR))
    if specs:
        from filelock import FileLock  # what FlashInfer itself locks its JIT dir with

        for spec in specs:
            spec.write_ninja()
        top = core.get_tmpdir() / "flashinfer_dev_smoke.ninja"
        text = "\n".join(["ninja_required_version = 1.3", *(f"subninja {s.ninja_path}" for s in specs), ""])
        tmp = top.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(top)
        with FileLock(core.get_tmpdir() / "flashinfer_jit.lock", thread_local=False):
            run_ninja(env.FLASHINFER_JIT_DIR, top)
    build_s = time.time() - started
    missing = [s.name for s in specs if not s.jit_library_path.exists()]
    if missing:
        raise Failure(f"the build finished without {', '.join(missing)}", "run it again with FLASHINFER_JIT_VERBOSE=1 and read ninja's output")
    slowest = slowest_objects(ninja_log_lines(env.FLASHINFER_JIT_DIR)[log_before:])
    if slowest:
        print("build: slowest objects: " + ", ".join(f"{Path(o).parent.name}/{Path(o).name} {t:.0f} s" for t, o in slowest))
    print(f"build: {len(chosen)} modules ready, {len(specs)} checked or compiled in {build_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
