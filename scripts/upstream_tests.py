"""Run FlashInfer's own test suites (the source tree's tests/) against the editable install.

  upstream_tests.py FAMILY|PATH [FAMILY|PATH ...] [PYTEST_ARGS ...]
  upstream_tests.py --list

A FAMILY is a kernel family (--list names them and their files); a PATH is a file or node id
under the tree's tests/. From the first argument that starts with '-', the rest go to pytest
(e.g. `norm -k gemma -x`). The kernel source mode (FLASHINFER_DEV_KERNEL_SOURCE) is applied before
anything imports flashinfer, and printed: in the default mode, `prebuilt`, the modules
flashinfer-jit-cache ships load, and an edit to csrc/ or include/ is not what the tests run.

Before running it names the JIT modules the selection will compile that are not built yet, from a
dry run with FLASHINFER_DISABLE_JIT=1 (FlashInfer then refuses to build and its conftest records
which module each test needed), and estimates the compile time. Past --budget minutes (default 10)
it stops, unless given --yes.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fidev import gpu_suite, kernel_source, source_tree, upstream_suites
from fidev.failure import USAGE, Failure, report, run_main
from fidev.manifest import pins

OURS = {"--list": 0, "--yes": 0, "--budget": 1, "--no-plan": 0, "--dry-run-report": 1, "-h": 0, "--help": 0}
# A rough cost model, from the H100 host (16 cores): one object of an attention or norm module
# takes 10 to 30 s to compile; a module's objects build side by side, modules one after another
# as the tests first load them. The figures in docs/flashinfer-dev.md say how it held.
SECONDS_PER_OBJECT = 25
PLAN_TIMEOUT_S = 1800


def split_argv(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """(our options, the selection, pytest's arguments)."""
    ours, selection, rest, i = {}, [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in OURS:
            if OURS[arg] and i + 1 >= len(argv):
                raise Failure(f"{arg} needs a value", "see `upstream_tests.py --help`")
            ours[arg] = argv[i + 1] if OURS[arg] else True
            i += 1 + OURS[arg]
        elif arg.startswith("-") or rest:
            rest.append(arg)
            i += 1
        else:
            selection.append(arg)
            i += 1
    return ours, selection, rest


def minutes(text: str) -> float:
    """--budget: minutes of compiling the plan may cost, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not 0 <= value < math.inf:
        raise Failure(f"--budget {text!r} is not a number of minutes", "give it in minutes, 0 or more: --budget 30")
    return value


def tests_dir() -> Path:
    p = pins()
    tests = p.source_dir / "tests"
    if not (tests / "conftest.py").is_file():
        tree = source_tree.inspect(p.source_dir, p)
        why = ("the PyPI source release ships no test suite (its tests/ holds one file)" if tree.kind == "release"
               else "the submodule is not initialized" if tree.kind in ("missing", "empty") else "it is not a FlashInfer checkout")
        raise Failure(f"{source_tree.shown(tests)} has no FlashInfer test suite: {why}",
                      "get the git checkout, which has tests/: git submodule update --init --recursive (a host without GitHub "
                      "cannot get them; copy a checkout's tests/ over)")
    return tests


def resolve(selection: list[str], tests: Path) -> list[str]:
    """Families and paths -> node ids under `tests`, each checked to exist."""
    nodes = []
    for item in selection:
        if item in upstream_suites.BY_NAME:
            nodes += [str(tests / node) for node in upstream_suites.BY_NAME[item].nodes]
            continue
        path = Path(item.split("::")[0])
        for base in (Path.cwd(), tests, tests.parent):
            if (base / path).exists():
                nodes.append(str((base / path).resolve()) + item[len(item.split("::")[0]):])
                break
        else:
            raise Failure(f"{item!r} is neither a kernel family nor a path under {source_tree.shown(tests)}",
                          "`upstream-tests --list` names the families; paths are relative to the tree's tests/")
    for node in nodes:
        if not Path(node.split("::")[0]).exists():
            raise Failure(f"{node.split('::')[0]} does not exist in this tree", "the family table is the pinned release's; update it with the pin")
    return nodes


def pytest_options(tests: Path) -> tuple[str, ...]:
    """FlashInfer's own pytest.ini (importlib imports, test_helpers not collected)."""
    return ("--rootdir", str(tests.parent), "-c", str(tests.parent / "pytest.ini"))


def plan(nodes: list[str], pytest_args: list[str], tests: Path) -> tuple[dict[str, int], float]:
    """{module: objects} the selection would compile, and the run time of the dry run."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "missing.json"
        cmd = [sys.executable, __file__, "--dry-run-report", str(report), *nodes, *pytest_args]
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PLAN_TIMEOUT_S)
        seconds = time.perf_counter() - started
        if not report.is_file():
            said = (done.stdout + done.stderr).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            raise Failure(f"the dry run of the selection did not finish: {said[0]}", "run it with --no-plan to see pytest's own output")
        needed = {}
        for entry in json.loads(report.read_text()):
            info = ast.literal_eval(entry["spec_info"]) if entry.get("spec_info") not in (None, "None") else {}
            needed[entry["module_name"]] = len(info.get("sources", [])) or 1
    return needed, seconds


def estimate_s(needed: dict[str, int]) -> float:
    cores = os.cpu_count() or 1
    return sum(math.ceil(objects / cores) * SECONDS_PER_OBJECT for objects in needed.values())


def dry_run(report_file: str, nodes: list[str], pytest_args: list[str], tests: Path) -> int:
    """The plan's subprocess: the tests, with FlashInfer forbidden to compile."""
    import pytest

    kernel_source.apply()
    os.environ["FLASHINFER_DISABLE_JIT"] = "1"
    os.environ["FLASHINFER_JIT_CACHE_REPORT_FILE"] = report_file
    pytest.main([*nodes, "-q", "-p", "no:cacheprovider", *pytest_options(tests), *pytest_args])
    if not Path(report_file).exists():
        Path(report_file).write_text("[]")  # nothing was missing
    return 0


def main() -> int:
    try:  # usage errors: checked before anything runs, and status 2, as argparse's are
        ours, selection, pytest_args = split_argv(sys.argv[1:])
        budget_s = minutes(ours.get("--budget", "10")) * 60
    except Failure as failure:
        report(failure)
        return USAGE
    if "-h" in ours or "--help" in ours:
        print(__doc__)
        return 0
    if "--list" in ours:
        for family in upstream_suites.FAMILIES:
            print(f"{family.name:15} {family.what}")
            for node in family.nodes:
                print(f"{'':15}   tests/{node}")
        return 0
    tests = tests_dir()
    if not selection:
        raise Failure("no family or path was named (the whole suite takes hours to compile)",
                      "name one: `upstream-tests norm`, or a path under tests/; `upstream-tests --list` names the families")
    nodes = resolve(selection, tests)
    if "--dry-run-report" in ours:
        return dry_run(ours["--dry-run-report"], nodes, pytest_args, tests)
    mode = kernel_source.mode()
    print(f"upstream-tests: kernel source {mode}: " + ("every module compiles from the vendored csrc/ and include/" if mode == kernel_source.VENDORED
          else f"modules flashinfer-jit-cache ships load instead of your edits ({kernel_source.ENV}=vendored tests them)"))
    if "--no-plan" not in ours:
        needed, seconds = plan(nodes, pytest_args, tests)
        guess = estimate_s(needed)
        print(f"upstream-tests: the selection compiles {len(needed)} module(s) not built yet, {sum(needed.values())} object(s), "
              f"about {guess / 60:.0f} min on {os.cpu_count()} cores (dry run {seconds:.0f} s)")
        for name, objects in sorted(needed.items()):
            print(f"  {name}  ({objects} object{'s' * (objects != 1)})")
        if guess > budget_s and "--yes" not in ours:
            raise Failure(f"compiling them would take about {guess / 60:.0f} min, past the {budget_s / 60:.0f} min budget",
                          "narrow the selection (-k, a node id), or start it anyway with --yes (or a larger --budget MINUTES)")
    return gpu_suite.run_paths("upstream-tests", nodes, pytest_args, pytest_options(tests))


if __name__ == "__main__":
    sys.exit(run_main(main))
