"""FlashInfer's test suite in the tree, as upstream-tests and `affected` name it: its tests/ (where
the tree has the runnable suite), the families and paths of a selection as node ids, the pytest
options its own pytest.ini asks for, and the suite's test cases counted once while it stays as it is
(`upstream-tests --list`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from fidev.core import workspace
from fidev.core.failure import USAGE, Failure
from fidev.core.files import count, fits, load_json, write_whole
from fidev.core.manifest import ROOT, pins
from fidev.jit import module_choice
from fidev.tree import families as upstream_suites
from fidev.tree import source_tree


def tests_dir() -> Path:
    """The tree's tests/, when the tree has FlashInfer's runnable suite: tests/conftest.py and the
    repository root's pytest.ini (`norecursedirs = test_helpers`, `addopts = --import-mode=importlib`
    at v0.6.3; without the importlib mode, tests/gdn/test_prefill_delta_rule.py's relative import fails)."""
    p = pins()
    tests = p.source_dir / "tests"
    missing = [
        name
        for name, path in (("tests/conftest.py", tests / "conftest.py"), ("pytest.ini", p.source_dir / "pytest.ini"))
        if not path.is_file()
    ]
    if missing:
        tree = source_tree.inspect(p.source_dir, p)
        why = (
            "the PyPI source release ships neither (its tests/ holds one file)"
            if tree.kind == "release"
            else "the submodule is not initialized"
            if tree.kind in ("missing", "empty")
            else "it is not a FlashInfer checkout"
        )
        raise Failure(
            f"{source_tree.shown(p.source_dir)} has no runnable FlashInfer test suite: no "
            f"{' and no '.join(missing)} ({why})",
            "get the git checkout, which has both: git submodule update --init --recursive (a host without "
            "GitHub: copy tests/ and pytest.ini of the pinned tag from a checkout, `git archive <commit> "
            "tests pytest.ini`)",
        )
    return tests


def resolve(selection: list[str], tests: Path) -> list[str]:
    """Families and paths -> node ids under `tests`, each checked to exist. A name that is neither
    a family nor a file or folder of the tree's tests/ is bad usage (status 2)."""
    nodes = []
    for item in selection:
        if item in upstream_suites.BY_NAME:
            nodes += [str(tests / node) for node in upstream_suites.BY_NAME[item].nodes]
        else:
            nodes.append(path_node(item, tests))
    for node in nodes:
        if not Path(node.split("::")[0]).exists():
            raise Failure(
                f"{node.split('::')[0]} does not exist in this tree",
                "the family table is the pinned release's; update it with the pin",
            )
    return nodes


def _exists(path: Path) -> bool:
    """Whether the path names something; a name too long or a symlink loop names nothing."""
    try:
        return path.exists()
    except OSError:
        return False


NAMES_FIX = "`upstream-tests --list` names the families; paths are relative to the tree's tests/"


def refuse_blank(selection: list[str]) -> None:
    """A usage error for a name of nothing (`upstream-tests ''`, which would be the current folder)."""
    for item in selection:
        if not item.split("::")[0].strip():
            raise Failure(f"{item!r} names no kernel family and no path", NAMES_FIX, exit_status=USAGE)


def _found(file: str, tests: Path) -> Path | None:
    """What a path names, relative to the current folder, `tests` or the tree (the first where it
    names something), resolved; None where it names nothing."""
    for base in (Path.cwd(), tests, tests.parent):
        if _exists(base / file):
            return (base / file).resolve()
    return None


def _refuse_outside(item: str, found: Path, tests: Path) -> None:
    if not found.is_relative_to(tests.resolve()):
        raise Failure(
            f"{item} is outside the tree's tests/ ({source_tree.shown(tests)}): upstream-tests runs "
            "FlashInfer's own tests",
            "name a family, or a file or node id under the tree's tests/",
            exit_status=USAGE,
        )


def refuse_outside(selection: list[str], tests: Path) -> None:
    """A usage error for a path that names something outside `tests`, the tree's tests/ (there or
    not): checked before the tree is looked for, so that it shows whether or not the tree has the suite."""
    for item in selection:
        if item not in upstream_suites.BY_NAME:
            found = _found(item.split("::")[0], tests)
            if found is not None:
                _refuse_outside(item, found, tests)


def path_node(item: str, tests: Path) -> str:
    """A path (with its ::test part, if any), relative to the current folder, tests/ or the tree, as
    a node id under `tests`."""
    file = item.split("::")[0]
    refuse_blank([item])
    found = _found(file, tests)
    if found is None:
        raise Failure(
            f"{item!r} is neither a kernel family nor a path under {source_tree.shown(tests)}",
            NAMES_FIX,
            exit_status=USAGE,
        )
    _refuse_outside(item, found, tests)
    return str(found) + item[len(file) :]


def pytest_options(tests: Path) -> tuple[str, ...]:
    """FlashInfer's own pytest.ini (importlib imports, test_helpers not collected)."""
    return ("--rootdir", str(tests.parent), "-c", str(tests.parent / "pytest.ini"))


def scripts_path() -> str:
    """PYTHONPATH for a pytest process that loads fidev's plugin: scripts/ first, then what was set."""
    return os.pathsep.join([str(ROOT / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])])


def suite_key(tests: Path) -> str:
    """The suite as it is: each test file and pytest.ini, by size and mtime (an edited test recounts)."""
    files = sorted(f for f in [*tests.rglob("*.py"), tests.parent / "pytest.ini"] if f.is_file())
    return hashlib.sha256(
        json.dumps([(str(f.relative_to(tests.parent)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]).encode()
    ).hexdigest()


def _per_family(counts) -> bool:
    """{family: its test cases} for every family of fidev.tree.families."""
    return fits(counts, dict[str, count]) and all(f.name in counts for f in upstream_suites.FAMILIES)


MAP = {"suite": str, "total": count, "files": count, "not_collected": count, "families": _per_family}  # suite_map's


def known_map(cache: Path, key: str) -> dict | None:
    """The counts kept for the suite as it is; None where there are none, or of another suite, or
    of another shape (MAP): then they are counted again."""
    try:
        known = load_json(cache)
    except (OSError, ValueError):
        return None
    return known if fits(known, MAP) and known["suite"] == key else None


def collect(tests: Path, mode: str) -> tuple[list[str], int] | None:
    """(node ids, files that did not collect) of `pytest --collect-only` of the whole tests/, under
    the kernel source `mode` the task read; None when it cannot collect here (no pytest, no FlashInfer)."""
    env = {**os.environ, "PYTHONPATH": scripts_path()}
    module_choice.apply(mode)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(tests),
                "--collect-only",
                "-q",
                "--continue-on-collection-errors",
                "-p",
                "no:cacheprovider",
                *pytest_options(tests),
            ],
            capture_output=True,
            text=True,
            timeout=1200,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    nodes = [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    errors = re.search(r"(\d+) errors?", done.stdout.splitlines()[-1] if done.stdout.strip() else "")
    return (nodes, int(errors.group(1)) if errors else 0) if nodes else None


def family_counts(nodes: list[str]) -> dict[str, int]:
    """{family: its test cases among `nodes`}."""
    return {
        f.name: sum(
            1
            for n in nodes
            if any(n == f"tests/{x}" or n.startswith(f"tests/{x}::") or n.startswith(f"tests/{x}[") for x in f.nodes)
        )
        for f in upstream_suites.FAMILIES
    }


def suite_map(tests: Path, ws: workspace.Workspace, mode: str) -> dict | None:
    """The suite's test cases, counted once while its files stay as they are: `pytest --collect-only`
    of the whole tests/ (over half a minute for v0.6.3's, a figure docs/measurements-log.md does not keep),
    kept beside the JIT dirs of `ws` (the task's workspace). None when it cannot collect here (no pytest, no
    FlashInfer)."""
    key = suite_key(tests)
    cache = ws.suite_map
    known = known_map(cache, key)
    if known is not None:
        return known
    print(
        "upstream-tests: counting the suite's test cases (pytest --collect-only of "
        f"{source_tree.shown(tests)}, once until it changes) ...",
        flush=True,
    )
    collected = collect(tests, mode)
    if collected is None:
        return None
    nodes, not_collected = collected
    known = {
        "suite": key,
        "total": len(nodes),
        "files": len({n.split("::")[0] for n in nodes}),
        "not_collected": not_collected,
        "families": family_counts(nodes),
    }
    write_whole(cache, json.dumps(known))
    return known


def list_families(ws: workspace.Workspace, mode: str) -> int:
    """The families, each with its test cases where the suite can be counted here (under the task's
    workspace and kernel source mode), and what they leave out."""
    try:
        counted = suite_map(tests_dir(), ws, mode)
    except Failure as failure:  # no runnable suite: the families alone, and why no counts
        counted = None
        print(f"upstream-tests: no counts: {failure.problem}")
    for family in upstream_suites.FAMILIES:
        cases = f"{counted['families'][family.name]:>7} cases" if counted else ""
        print(f"{family.name:15} {cases:13} {family.what}")
        for node in family.nodes:
            print(f"{'':15}   tests/{node}")
    if counted:
        covered = sum(counted["families"].values())
        print(
            f"{'left out':15} {counted['total'] - covered:>7} cases of {counted['total']} in {counted['files']} files "
            f"({counted['not_collected']} more files did not collect here): mostly Blackwell-only kernels "
            "(trtllm-gen, xqa, fp4 GEMM); name their files as paths"
        )
    return 0
