"""Run FlashInfer's own test suites (the source tree's tests/) against the editable install.

  upstream_tests.py FAMILY|PATH [FAMILY|PATH ...] [PYTEST_ARGS ...]
  upstream_tests.py --list

A FAMILY is a kernel family (--list names them and their files); a PATH is a file or node id
under the tree's tests/. From the first argument that starts with '-', the rest go to pytest
(e.g. `norm -k gemma -x`). The kernel source mode (FLASHINFER_DEV_KERNEL_SOURCE) is applied before
anything imports flashinfer, and printed: in the default mode, `prebuilt`, the modules
flashinfer-jit-cache ships load, and an edit to csrc/ or include/ is not what the tests run.

Before running it plans: a dry run with FLASHINFER_DISABLE_JIT=1 (FlashInfer then refuses to
build, and its tests/conftest.py records which module each test needed) names the modules the
selection needs, how many objects of them must compile, and estimates the time. Past --budget
minutes (default 10) it stops, unless given --yes. A dry run that takes over 30 s is dropped, and
the run shows each module's compile as it starts and ends instead.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fidev import gpu_suite, kernel_source, module_builds, source_tree, upstream_suites
from fidev.failure import USAGE, Failure, report, run_main
from fidev.manifest import pins

OURS = {"--list": 0, "--yes": 0, "--budget": 1, "--no-plan": 0, "--dry-run-plan": 1, "-h": 0, "--help": 0}
# A rough cost model, from the H100 host (16 cores): one object of an attention or norm module
# takes 10 to 30 s to compile; a module's objects build side by side, modules one after another
# as the tests first load them. The figures in docs/flashinfer-dev.md say how it held.
SECONDS_PER_OBJECT = 25
# The plan must cost little next to the run it plans; past this it is dropped.
PLAN_LIMIT_S = 30


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
    """The tree's tests/, when the tree has FlashInfer's runnable suite: tests/conftest.py and the
    repository root's pytest.ini (`norecursedirs = test_helpers`, `addopts = --import-mode=importlib`
    at v0.6.3; without the importlib mode, tests/gdn/test_prefill_delta_rule.py's relative import fails)."""
    p = pins()
    tests = p.source_dir / "tests"
    missing = [name for name, path in (("tests/conftest.py", tests / "conftest.py"), ("pytest.ini", p.source_dir / "pytest.ini"))
               if not path.is_file()]
    if missing:
        tree = source_tree.inspect(p.source_dir, p)
        why = ("the PyPI source release ships neither (its tests/ holds one file)" if tree.kind == "release"
               else "the submodule is not initialized" if tree.kind in ("missing", "empty") else "it is not a FlashInfer checkout")
        raise Failure(f"{source_tree.shown(p.source_dir)} has no runnable FlashInfer test suite: no {' and no '.join(missing)} ({why})",
                      "get the git checkout, which has both: git submodule update --init --recursive (a host without GitHub: copy "
                      "tests/ and pytest.ini of the pinned tag from a checkout, `git archive <commit> tests pytest.ini`)")
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


class FlashInferBuilds:
    """A pytest plugin for FlashInfer's own suite: how its modules get built.

    Several test files build their modules up front in a `warmup_jit` fixture that calls
    `flashinfer.jit.build_jit_specs` (tests/utils/test_activation.py, lines 24-36 at v0.6.3). That
    function builds through one combined ninja at the JIT dir's root, which would recompile what
    `build` made and leave each module's own folder believing it must compile again (see
    fidev.module_builds). It also ignores FLASHINFER_DISABLE_JIT, so a dry run would compile. This
    plugin replaces it: in a run, with one ninja per module, as `build` and FlashInfer's loader
    build; in the dry run, with a record in the JIT report (the format FlashInfer's
    tests/conftest.py writes, lines 148-166 and 182-191 at v0.6.3) and no build. In a run it also
    says when a test starts compiling a module and how long that took, past pytest's capture."""

    def __init__(self, dry_report: str | None = None):
        self.dry_report = dry_report
        self.config = None
        self.current = "unknown"

    def pytest_configure(self, config):
        self.config = config

    def pytest_runtest_setup(self, item):
        self.current = item.nodeid

    def say(self, line: str) -> None:
        capture = self.config.pluginmanager.getplugin("capturemanager")
        terminal = self.config.pluginmanager.getplugin("terminalreporter")
        with capture.global_and_fixture_disabled():
            terminal.write_line(line)

    def pytest_collection_finish(self, session):
        import flashinfer.jit
        from flashinfer.jit import core

        flashinfer.jit.build_jit_specs = core.build_jit_specs = self.build_jit_specs
        if self.dry_report is None:
            original = core.JitSpec.build

            def build(spec, verbose, need_lock=True):
                fresh = not spec.jit_library_path.exists()
                if fresh:
                    self.say(f"upstream-tests: compiling {spec.name} ({len(spec.sources)} sources)")
                started = time.perf_counter()
                original(spec, verbose, need_lock)
                took = time.perf_counter() - started
                if fresh or took > 1:
                    self.say(f"upstream-tests: {spec.name} built in {took:.0f} s")

            core.JitSpec.build = build

    def build_jit_specs(self, specs, verbose=False, skip_prebuilt=True):
        todo = [spec for spec in specs if not (skip_prebuilt and spec.is_aot)]
        if self.dry_report is not None:
            with open(self.dry_report, "a") as report:
                for spec in todo:
                    info = {"name": spec.name, "sources": [str(s) for s in spec.sources], "needs_device_linking": spec.needs_device_linking,
                            "aot_path": str(spec.aot_path)}
                    report.write(json.dumps({"test_name": self.current, "module_name": spec.name, "spec_info": str(info)}) + "\n")
            return
        if todo:
            self.say(f"upstream-tests: {self.current}: building {len(todo)} module(s) its warmup_jit fixture asks for")
            seconds, _ = module_builds.build_specs(todo, self.say)
            self.say(f"upstream-tests: warmup built in {seconds:.0f} s")


def read_jit_report(path: Path) -> dict[str, list[str]]:
    """{module: its sources} from a JIT report: one JSON object per line, as FlashInfer's
    tests/conftest.py appends them (lines 182-191 at v0.6.3), each `spec_info` the str() of a
    dict (lines 156-163), or "None" when the error carried no spec."""
    needed = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.strip():
            entry = json.loads(line)
            info = ast.literal_eval(entry["spec_info"]) if entry.get("spec_info") not in (None, "None") else {}
            needed[entry["module_name"]] = info.get("sources", [])
    return needed


def objects_to_compile(build_dir: Path, sources: list[str]) -> int:
    """How many objects of a module a build would compile: every source when the module was never
    built, else what `ninja -n` would compile (0 when it is current)."""
    if not (build_dir / f"{build_dir.name}.so").exists() or not (build_dir / "build.ninja").exists():
        return len(sources) or 1
    try:
        out = subprocess.run(["ninja", "-C", str(build_dir), "-n", "-v"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return len(sources) or 1
    return sum(1 for line in out.splitlines() if re.search(r"\s-c\s", line))


def plan(nodes: list[str], pytest_args: list[str]) -> tuple[dict[str, int], float] | None:
    """{module the selection needs: objects to compile}, and the dry run's time; None when the dry
    run took longer than PLAN_LIMIT_S (or did not finish), so that the run goes ahead without."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "plan.json"
        cmd = [sys.executable, __file__, "--dry-run-plan", str(out), *nodes, *pytest_args]
        started = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PLAN_LIMIT_S)
        except subprocess.TimeoutExpired:
            print(f"upstream-tests: the plan's dry run took over {PLAN_LIMIT_S} s: going ahead without it; each module's compile shows as it runs")
            return None
        seconds = time.perf_counter() - started
        if not out.is_file():
            said = (done.stdout + done.stderr).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            print(f"upstream-tests: the plan's dry run did not finish ({said[0][:200]}): going ahead without it")
            return None
        return json.loads(out.read_text()), seconds


def estimate_s(needed: dict[str, int]) -> float:
    cores = os.cpu_count() or 1
    return sum(math.ceil(objects / cores) * SECONDS_PER_OBJECT for objects in needed.values())


def dry_run(plan_file: str, nodes: list[str], pytest_args: list[str], tests: Path) -> int:
    """The plan's subprocess: the tests, with FlashInfer forbidden to compile; writes the plan."""
    import pytest

    kernel_source.apply()
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "jit-report.jsonl"
        os.environ["FLASHINFER_DISABLE_JIT"] = "1"
        os.environ["FLASHINFER_JIT_CACHE_REPORT_FILE"] = str(report)
        pytest.main([*nodes, "-q", "-p", "no:cacheprovider", *pytest_options(tests), *pytest_args], plugins=[FlashInferBuilds(str(report))])
        needed = read_jit_report(report)
    jit_dir = Path(sys.modules["flashinfer.jit.env"].FLASHINFER_JIT_DIR) if "flashinfer.jit.env" in sys.modules else None
    todo = {name: objects_to_compile(jit_dir / name, sources) if jit_dir else len(sources) or 1 for name, sources in needed.items()}
    tmp = Path(f"{plan_file}.tmp")
    tmp.write_text(json.dumps(todo))
    os.replace(tmp, plan_file)
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
    if "--dry-run-plan" in ours:
        return dry_run(ours["--dry-run-plan"], nodes, pytest_args, tests)
    mode = kernel_source.mode()
    print(f"upstream-tests: kernel source {mode}: " + ("every module compiles from the vendored csrc/ and include/" if mode == kernel_source.VENDORED
          else f"modules flashinfer-jit-cache ships load instead of your edits ({kernel_source.ENV}=vendored tests them)"))
    if "--no-plan" not in ours and (planned := plan(nodes, pytest_args)) is not None:
        needed, seconds = planned
        todo = {name: objects for name, objects in needed.items() if objects}
        guess = estimate_s(todo)
        print(f"upstream-tests: the selection needs {len(needed)} module(s); {len(todo)} to compile, {sum(todo.values())} object(s), "
              f"about {guess / 60:.0f} min on {os.cpu_count()} cores (plan {seconds:.0f} s)")
        for name, objects in sorted(todo.items()):
            print(f"  {name}  ({objects} object{'s' * (objects != 1)})")
        if guess > budget_s and "--yes" not in ours:
            raise Failure(f"compiling them would take about {guess / 60:.0f} min, past the {budget_s / 60:.0f} min budget",
                          "narrow the selection (-k, a node id), or start it anyway with --yes (or a larger --budget MINUTES)")
    return gpu_suite.run_paths("upstream-tests", nodes, pytest_args, pytest_options(tests), plugins=[FlashInferBuilds()])


if __name__ == "__main__":
    sys.exit(run_main(main))
