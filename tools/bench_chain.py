"""Time the warm chain (`pixi run -e flashinfer-dev smoke` after a build) the way a user runs it,
and one edit-loop round; print each step's median, minimum and maximum and the chain's total.

Through pixi where it is on PATH (the chain, then each step with --skip-deps); elsewhere through
the tasks' own commands in the chain's order, read from the manifest (`python` is this interpreter).
The chain stops at a failing step, as pixi's does, unless --keep-going (a GPU host that is not the
pinned environment fails preflight); without it, a chain that stops (the warm-up, a timed run, an
edit round) ends the tool in two lines, since a failed command's time is no figure. --edit-loop then \
appends a comment line to
include/flashinfer/norm.cuh, runs the chain once, restores the file with `cp -p` (its old mtime:
build's restored-copy guard must rebuild), runs it again, and prints both rounds with the compile
time build reports: its ninja time for the changed modules (their objects side by side, then the
link), its slowest object, and what the chain spent beyond that ninja time. The targets (chain
<= 10 s, a no-op build <= 1 s, an edit round <= compile + 8 s) are judged from these figures,
not asserted in a test.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import argparse
import re
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from fidev.core import numbers  # noqa: E402
from fidev.core.failure import USAGE, ArgumentParser, Failure, option, run_main  # noqa: E402
from fidev.core.files import not_a_file, not_a_folder, user_path  # noqa: E402
from fidev.core.manifest import FEATURE, MANIFEST, ROOT, pins, task_chain, task_names  # noqa: E402
from fidev.tree import edits  # noqa: E402

TIMEOUT_S = 1800
EDITED = "include/flashinfer/norm.cuh"
SLOWEST = re.compile(r"build: slowest objects: \S+ ([\d.]+) s")
NINJA = re.compile(r"build: \d+ modules ready, \d+ (?:rebuilt|checked or compiled) in ([\d.]+) s")  # scripts/build.py
WORKSPACE = ROOT  # --workspace: another checkout's chain (e.g. an older commit's), run in that checkout


def argv(command: str) -> list[str]:
    words = shlex.split(command)
    return [sys.executable, *words[1:]] if words[0] == "python" else words


def steps(last: str, pixi: bool, workspace: Path) -> list[tuple[str, list[str]]]:
    chain = task_chain(last, workspace / MANIFEST.name)
    if pixi:
        return [(name, ["pixi", "run", "-e", FEATURE, "--skip-deps", name]) for name, _ in chain]
    return [(name, argv(command)) for name, command in chain]


def run_chain(chain: list[tuple[str, list[str]]], keep_going: bool) -> list[tuple[str, float, int, str]]:
    """(step, seconds, exit status, output) of each step run; stops at a failure unless keep_going."""
    done = []
    for name, cmd in chain:
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=WORKSPACE, capture_output=True, text=True, timeout=TIMEOUT_S)
        done.append((name, time.perf_counter() - started, proc.returncode, proc.stdout + proc.stderr))
        if proc.returncode != 0 and not keep_going:
            break
    return done


def stopped(run: list[tuple[str, float, int, str]], keep_going: bool, where: str) -> list[tuple[str, float, int, str]]:
    """The chain's run, or two lines where it stopped at a failing step (without --keep-going, which
    times failing steps): a failed command's time is no result."""
    if keep_going or run[-1][2] == 0:
        return run
    name, _, code, out = run[-1]
    said = next(
        (line for line in out.splitlines() if line.startswith("error: ")), (out.strip().splitlines() or [""])[-1][:200]
    )
    raise Failure(
        f"the chain stopped at {name} (exit {code}){where}: {said}",
        f"run `{name}` alone; or time past it with --keep-going",
    )


def table(runs: list[list[tuple[str, float, int, str]]]) -> list[str]:
    names = list(dict.fromkeys(step for run in runs for step, *_ in run))
    lines = [f"{'step':14} {'median':>8} {'min':>8} {'max':>8} {'exit':>5} {'runs':>5}"]
    for name in [*names, "chain"]:
        if name == "chain":
            times = [sum(s for _, s, _, _ in run) for run in runs]
            codes = [max(c for _, _, c, _ in run) for run in runs]
        else:
            times = [s for run in runs for step, s, _, _ in run if step == name]
            codes = [c for run in runs for step, _, c, _ in run if step == name]
        lines.append(
            f"{name:14} {statistics.median(times):8.2f} {min(times):8.2f} {max(times):8.2f} {codes[-1]:5} "
            f"{len(times):5}"
        )
    return lines


def edit_round(chain, keep_going: bool) -> list[str]:
    header = pins(WORKSPACE / MANIFEST.name).source_dir / EDITED
    if not header.is_file():
        raise Failure(
            f"{header} does not exist", "get the FlashInfer source first (README: First, the FlashInfer source)"
        )
    lines = []
    tree = pins(WORKSPACE / MANIFEST.name).source_dir
    with edits.planted(
        tree, header, lambda text: text + "// bench_chain: a one-line edit\n", "bench_chain --edit-loop"
    ) as edit:
        rounds = [("edit", run_chain(chain, keep_going))]
        edit.restore()  # the old copy, with its old mtime (cp -p): build's restored-copy guard must rebuild
        rounds.append(("restore (cp -p)", run_chain(chain, keep_going)))
    for label, run in rounds:
        stopped(run, keep_going, f" in the edit loop's {label} round")  # said once the tree is restored
        build_out = next((out for step, _, _, out in run if step.startswith("build")), "")
        slowest, ninja = SLOWEST.search(build_out), NINJA.search(build_out)
        total = sum(s for _, s, _, _ in run)
        per_step = ", ".join(f"{step} {s:.1f} s" + (f" (exit {c})" if c else "") for step, s, c, _ in run)
        compiled = "nothing compiled"
        if slowest and ninja:
            compiled = (
                f"compile {float(ninja.group(1)):.1f} s (slowest object {float(slowest.group(1)):.1f} s), "
                f"{total - float(ninja.group(1)):.1f} s beyond it"
            )
        lines.append(f"{label:16} chain {total:6.1f} s; {compiled}; {per_step}")
    return lines


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--runs",
        type=option(numbers.whole_number(example="--runs 5")),
        default=5,
        help="warm chains to time (default 5)",
    )
    parser.add_argument("--task", help="the chain's last task (default smoke)")
    parser.add_argument("--keep-going", action="store_true", help="time every step even after one fails")
    parser.add_argument(
        "--edit-loop", action="store_true", help="also time one edit of include/flashinfer/norm.cuh and its restore"
    )
    parser.add_argument(
        "--workspace", type=option(user_path), default=ROOT, help="the checkout whose chain to time (default: this one)"
    )
    args = parser.parse_args()
    global WORKSPACE
    WORKSPACE = args.workspace.resolve()
    if why := not_a_folder(WORKSPACE):
        raise Failure(f"--workspace {args.workspace} {why}", "point --workspace at a checkout of this workspace")
    if why := not_a_file(WORKSPACE / MANIFEST.name):  # a FIFO or a folder of that name is said for what it is
        raise Failure(f"{WORKSPACE / MANIFEST.name} {why}", "point --workspace at a checkout of this workspace")
    names = task_names(WORKSPACE / MANIFEST.name)
    if args.task is None and "smoke" not in names:
        raise Failure(
            f"{WORKSPACE / MANIFEST.name} has no task smoke, the chain's last task unless --task names one",
            "restore the task from the checkout (git checkout pyproject.toml), or name another with --task",
        )
    args.task = args.task or "smoke"
    if args.task not in names:
        raise Failure(
            f"--task {args.task!r} is not a task of {FEATURE}", f"name one of {', '.join(names)}", exit_status=USAGE
        )
    pixi = shutil.which("pixi") is not None
    chain = steps(args.task, pixi, WORKSPACE)
    stopped(
        run_chain(chain, args.keep_going), args.keep_going, ""
    )  # warms the build, so the timed runs are the warm chain
    runs = [
        stopped(run_chain(chain, args.keep_going), args.keep_going, f" in timed run {i}")
        for i in range(1, args.runs + 1)
    ]
    print(f"warm chain ({'pixi run' if pixi else 'the tasks commands, no pixi'}): {' -> '.join(n for n, _ in chain)}")
    for line in table(runs):
        print(line)
    if args.edit_loop:
        for line in edit_round(chain, args.keep_going):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
