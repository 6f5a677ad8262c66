"""Compile the JIT modules the smoke suite needs, for this GPU, from the vendored FlashInfer.

FlashInfer's own per-module build files, built side by side by one ninja per module. Modules that
flashinfer-jit-cache provides are reported and skipped, unless the kernel source mode is
`vendored` (FLASHINFER_DEV_KERNEL_SOURCE=vendored), which compiles them from
extern/tracked/flashinfer/csrc. A repeated build is a no-op.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from fidev import ninja_inputs, smoke_modules
from fidev.failure import ArgumentParser, Failure, run_main
from fidev.flashinfer_import import import_flashinfer

SLOWEST_SHOWN = 5
# A line of compiler or linker output that names a cause. ninja's `FAILED:` line, collect2's
# summary and ninja's own epilogue only restate it.
ERROR_LINE = re.compile(r"\berror\b|cannot find -l|undefined reference to|No such file or directory", re.IGNORECASE)
NOT_THE_CAUSE = re.compile(r"(FAILED:|collect2:|ninja: build stopped)")
BUILD_FAILED_FIX = "read the compiler output above; `pixi run -e flashinfer-dev preflight` checks the toolchain"


def first_error(lines: list[str]) -> str:
    """The first line of a failed build's output that names a cause, else its last line."""
    return next((line.strip() for line in lines if ERROR_LINE.search(line) and not NOT_THE_CAUSE.match(line.strip())),
                lines[-1].strip() if lines else "no output")


def target_archs(core):
    archs = core.current_compilation_context.TARGET_CUDA_ARCHS
    if not archs:
        raise Failure("no CUDA GPU is visible to torch, so there is no architecture to build for",
                      "run on the GPU host, or set FLASHINFER_CUDA_ARCH_LIST (e.g. '9.0a') to build for one")
    return sorted(archs)


def job_budgets(specs) -> list[int]:
    """ninja -j for each module's build, run side by side. Each module builds in its own
    folder, as FlashInfer's loader does later: ninja keeps its dependency log per build folder,
    and one combined build would leave the loader a log without entries, so it would rebuild
    everything. A module gets a job per source until the sources outnumber twice the cores
    (MAX_JOBS when set), then shares in proportion."""
    max_jobs = os.environ.get("MAX_JOBS", "")
    budget = int(max_jobs) if max_jobs.isdigit() else 2 * (os.cpu_count() or 1)
    sources = [len(spec.sources) for spec in specs]
    if sum(sources) <= budget:
        return sources
    return [max(1, budget * n // sum(sources)) for n in sources]


def run_module_builds(specs) -> None:
    """One ninja per module, concurrently; one line per started object, with its module's
    [done/total elapsed]."""
    printing = threading.Lock()
    failures = []

    def build(spec, jobs):
        stale = ninja_inputs.restored(spec.build_dir)
        for obj, inputs in stale.items():
            with printing:
                print(f"  {spec.name[:48]}/{Path(obj).name}: {Path(inputs[0]).name} changed but is not newer than it "
                      f"(a restored copy?): rebuilding it", flush=True)
        ninja_inputs.invalidate(spec.build_dir, stale)
        cmd = ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-j", str(jobs)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, NINJA_STATUS="[%f/%t %es] "))
        output = []
        for line in proc.stdout:
            status = re.match(r"(\[\d+/\d+ [\d.]+s\]) .* -o (\S+)", line)
            with printing:
                if status:
                    print(f"  {status.group(1)} {spec.name[:48]}/{Path(status.group(2)).name}", flush=True)
                elif line.strip() and not line.startswith("ninja: Entering"):
                    output.append(line.rstrip())
                    print("  " + line.rstrip(), flush=True)
        if proc.wait() != 0:
            failures.append(f"{spec.name}: {first_error(output)}")
        else:
            ninja_inputs.record(spec.build_dir, spec.ninja_path)

    threads = [threading.Thread(target=build, args=pair) for pair in zip(specs, job_budgets(specs), strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise Failure(f"the JIT build failed: {failures[0][:300]}", BUILD_FAILED_FIX)


def ninja_log_lines(spec) -> list[str]:
    log = spec.build_dir / ".ninja_log"
    return log.read_text().splitlines() if log.exists() else []


def slowest_objects(new_lines: list[str]) -> list[tuple[float, str]]:
    """Compile times of this run's objects: the lines ninja appended to the modules' logs."""
    rows = [line.split("\t") for line in new_lines if not line.startswith("#")]
    return sorted(((int(r[1]) - int(r[0])) / 1000, r[3]) for r in rows if len(r) >= 4)[::-1][:SLOWEST_SHOWN]


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide", action="store_true", help="also build the wider smoke tier")
    parser.add_argument("--abi", action="store_true", help="also build what abi-smoke calls (adds gdn_prefill on sm_90)")
    args = parser.parse_args()

    imported = import_flashinfer()
    from flashinfer.jit import core

    mode, env, import_s = imported.mode, imported.jit_env, imported.seconds
    archs = target_archs(core)
    sm90 = any(major == 9 for major, _ in archs)
    chosen = smoke_modules.select(args.wide, sm90, args.abi)
    arch_text = " ".join(f"sm_{major}{minor}" for major, minor in archs)
    print(f"build: kernel source {mode}, arch {arch_text}, JIT dir {env.FLASHINFER_JIT_DIR} (import {import_s:.1f} s)")
    skipped = [m.key for m in smoke_modules.select(args.wide, True, args.abi) if m not in chosen]
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
    logs_before = {spec.name: len(ninja_log_lines(spec)) for spec in specs}
    if specs:
        from filelock import FileLock  # what FlashInfer itself locks its JIT dir with

        for spec in specs:
            spec.write_ninja()
        with FileLock(core.get_tmpdir() / "flashinfer_jit.lock", thread_local=False):
            run_module_builds(specs)
    build_s = time.time() - started
    missing = [s.name for s in specs if not s.jit_library_path.exists()]
    if missing:
        raise Failure(f"the build finished without {', '.join(missing)}", "run it again with FLASHINFER_JIT_VERBOSE=1 and read ninja's output")
    slowest = slowest_objects([line for spec in specs for line in ninja_log_lines(spec)[logs_before[spec.name]:]])
    if slowest:
        print("build: slowest objects: " + ", ".join(f"{Path(o).parent.name}/{Path(o).name} {t:.0f} s" for t, o in slowest))
    print(f"build: {len(chosen)} modules ready, {len(specs)} checked or compiled in {build_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
