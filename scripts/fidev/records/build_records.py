"""What the workspace records of its builds beside FlashInfer's JIT dir, for `affected`.

- Per module, in its build folder (`.fidev-generators.json`): the content of the FlashInfer
  tree's Python files when the module was last built. Those files generate a module's sources
  (jinja templates rendered by flashinfer/jit/*.py), so an edit to one may change what the module
  compiles. fidev.records.ninja_inputs keeps the module's other inputs (sources, headers).
- Per JIT dir, in its parent (`<base>/.cache/flashinfer/<version>/<arch>/`): the content of the
  tree's include/ and csrc/ at the last build there (`fidev-tree.json`), so that an edit no built
  module compiles is still seen; and (`fidev-module-tests.json`,
  so it goes stale with the FlashInfer version and the architecture): which of FlashInfer's own
  tests need each module, from the upstream-tests plan's dry run, whose records follow FlashInfer's
  JIT report (tests/conftest.py at v0.6.3, `pytest_runtest_call`: the test's node id, the module's name).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fidev.core.files import differs, file_fact, is_fact, load_json, write_whole
from fidev.core.workspace import AHEAD, CALL, GENERATORS, MODULE_TESTS, MODULE_TESTS_RAN, SMOKE_MODULE, TREE

TREE_PARTS = ("include", "csrc")  # what FlashInfer's modules compile, besides 3rdparty/ and generated sources


def python_sources(tree: Path) -> list[Path]:
    """The Python files of the FlashInfer package in `tree`, without the editable install's
    flashinfer/data links (to csrc/, include/, 3rdparty/)."""
    package = tree / "flashinfer"
    found = []
    for root, dirs, files in os.walk(package):
        if Path(root) == package:
            dirs[:] = [d for d in dirs if d != "data"]
        dirs.sort()
        found += [Path(root, name) for name in sorted(files) if name.endswith(".py")]
    return found


def _write(path: Path, data) -> None:
    write_whole(path, json.dumps(data))


def _read(path: Path, shape):
    """The record at `path` where `shape(data)` accepts it; else None (missing, truncated, not
    JSON, or of another shape: a list for a dict, a string for a file's fact)."""
    try:
        data = load_json(path)
    except (OSError, ValueError):
        return None
    return data if shape(data) else None


def facts(data) -> bool:
    """{path: file fact}: a module's generators record, and a JIT dir's tree record."""
    return isinstance(data, dict) and all(is_fact(fact) for fact in data.values())


def tests_by_module(data) -> bool:
    """{module name: [test node id]}: a JIT dir's record of FlashInfer's tests."""
    return isinstance(data, dict) and all(
        isinstance(tests, list) and all(isinstance(t, str) for t in tests) for tests in data.values()
    )


def a_call(data) -> bool:
    """The call that made a module's JitSpec: its module, function and keyword arguments."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("module"), str)
        and isinstance(data.get("function"), str)
        and isinstance(data.get("kwargs"), dict)
    )


def unreadable_generators(build_dir: Path) -> bool:
    """The module's generators record is there but cannot be read (truncated, not JSON, another shape)."""
    return (build_dir / GENERATORS).exists() and _read(build_dir / GENERATORS, facts) is None


def record_generators(build_dir: Path, tree: Path, cache: dict[Path, list | None] | None = None) -> None:
    """After a module was built from `tree`: the tree's Python files as they were (`cache` spares
    re-reading them for each module of one build)."""
    cache = {} if cache is None else cache
    if not cache:
        cache.update((path, file_fact(path)) for path in python_sources(tree))
    _write(build_dir / GENERATORS, {str(path): fact for path, fact in cache.items()})


def changed_generators(build_dir: Path, tree: Path) -> list[str] | None:
    """The tree's Python files whose content differs from when the module was built (added and
    removed files too), or None when its build left no record."""
    was = _read(build_dir / GENERATORS, facts)
    if was is None:
        return None
    now = {str(p) for p in python_sources(tree)}
    changed = sorted(set(was) ^ now)
    changed += [path for path in sorted(now & set(was)) if differs(path, was[path])]
    return sorted(changed)


def record_call(build_dir: Path, call: dict | None) -> None:
    """The call that made the module's JitSpec (fidev.jit.module_choice.generator_call), by a process
    that made it: `affected` makes it again to regenerate the module's sources. None: it was made
    by no call that can be made again."""
    if call:
        _write(build_dir / CALL, call)
    else:  # an older record would name a call this build did not come from
        (build_dir / CALL).unlink(missing_ok=True)


def recorded_call(build_dir: Path) -> dict | None:
    return _read(build_dir / CALL, a_call)


def record_smoke_module(build_dir: Path, key: str) -> None:
    """A module smoke's tests built (the wide tier's, where `build --wide` did not; `build`'s stamps name
    the modules it made): its smoke module key (fidev.builds.smoke_modules), so that `affected` takes
    smoke's tests of it for its tests, as for the modules `build` made."""
    build_dir.mkdir(parents=True, exist_ok=True)
    _write(build_dir / SMOKE_MODULE, key)


def smoke_module(build_dir: Path) -> str | None:
    """The key record_smoke_module wrote, else None (none, or unreadable: then the module is taken for one
    of FlashInfer's tests', whose recorded tests must run)."""
    return _read(build_dir / SMOKE_MODULE, lambda data: isinstance(data, str))


def mark_built_ahead(build_dir: Path) -> None:
    """A module upstream-tests' plan builds ahead of its tests (fidev.upstream.plan.build_ahead): marked
    before its build starts, so that one no test then loads, and no record names, can be told from what
    anyone else built (unrecorded_ahead), however its build ended."""
    build_dir.mkdir(parents=True, exist_ok=True)
    _write(build_dir / AHEAD, {"built_ahead": True})


def unrecorded_ahead(build_dir: Path) -> bool:
    """The module carries mark_built_ahead's mark, and the JIT dir's record names no test of it: built
    for a test that never loaded it (foreseen after a stand-in's answers, then skipped, or not in the
    run's sample), so that it has no test to run for an edit. A record that names it clears the mark
    (add_module_tests): a module a test loaded once is never taken for one."""
    return (build_dir / AHEAD).exists() and not module_tests(build_dir.parent).get(build_dir.name)


def add_module_tests(jit_dir: Path, report_lines: list[dict], whole: bool = False) -> None:
    """Merge records (FlashInfer's JIT-report objects: test_name, module_name) into the JIT dir's
    record of which tests need each module. A run's records (`whole`: every module each test it ran
    loaded) say what those tests need now, not what an earlier record said; the tests they name are
    kept as ran (MODULE_TESTS_RAN). A dry run's name only the first module each test asks for
    (FlashInfer's MissingJITCacheError ends the test there). Of a test a run recorded, a dry run's only
    add: a run records no module a case found loaded already (FlashInfer's functools caches: an earlier
    case of the process loaded it, `page` for most attention cases), so the first module a dry run
    names may be missing there for good reason. Of a test no run recorded: where the record names that
    module already, what it knows beyond is kept; where not, the test loads something else now, and the
    dry run's say what it needs. A warmup's records (fidev.upstream.plugin marks them) name the test
    that happened to come first, not one that needs the module, and are left out. A module the record
    names a test of afterwards loses its built-ahead mark (mark_built_ahead)."""
    said: dict[str, set[str]] = {}
    for entry in report_lines:
        name, test = entry.get("module_name"), entry.get("test_name")
        if name and test and name != "unknown" and not entry.get("warmup"):
            said.setdefault(test, set()).add(name)
    known, ran = module_tests(jit_dir), tests_ran(jit_dir)
    before: dict[str, set[str]] = {}
    for name, tests in known.items():
        for test in tests:
            before.setdefault(test, set()).add(name)
    replaced = {t for t, names in said.items() if whole or (t not in ran and not names <= before.get(t, set()))}
    merged = {name: [t for t in tests if t not in replaced] for name, tests in known.items()}
    for test in sorted(said):
        for name in sorted(said[test] - (set() if test in replaced else before.get(test, set()))):
            merged.setdefault(name, []).append(test)
    merged = {name: tests for name, tests in merged.items() if tests}
    jit_dir.parent.mkdir(parents=True, exist_ok=True)
    if whole:
        _write(jit_dir.parent / MODULE_TESTS_RAN, sorted(ran | set(said)))
    _write(jit_dir.parent / MODULE_TESTS, {name: sorted(tests) for name, tests in sorted(merged.items())})
    for name in merged:  # a module built ahead that a test is recorded for now: no longer one (unrecorded_ahead)
        (jit_dir / name / AHEAD).unlink(missing_ok=True)


def tests_ran(jit_dir: Path) -> set[str]:
    """The tests a run recorded in the JIT dir's record (add_module_tests); none where unreadable."""
    found = _read(jit_dir.parent / MODULE_TESTS_RAN, lambda data: isinstance(data, list))
    return {t for t in found if isinstance(t, str)} if found else set()


def module_tests(jit_dir: Path) -> dict[str, list[str]]:
    """{module name: FlashInfer test node ids (relative to the tree)} recorded for this JIT dir."""
    return _read(jit_dir.parent / MODULE_TESTS, tests_by_module) or {}


def _tree_files(tree: Path) -> list[Path]:
    return sorted(p for part in TREE_PARTS for p in (tree / part).rglob("*") if p.is_file())


def _facts_of(paths: list[Path], tree: Path, was: dict[str, list | None]) -> dict[str, list | None]:
    """{path relative to the tree: its file fact}, a file whose stat did not move since `was` keeping
    its hash there (hashed again only where it moved)."""
    now = {}
    for path in paths:
        rel = str(path.relative_to(tree))
        try:
            st = path.stat()
        except OSError:
            continue
        old = was.get(rel)
        now[rel] = old if old and old[:2] == [st.st_mtime_ns, st.st_size] else file_fact(path)
    return now


def record_tree(jit_dir: Path, tree: Path) -> None:
    """After a build in `jit_dir`: include/ and csrc/ as they were (a file whose stat did not move
    keeps its recorded hash: about 600 files, 10 MB, at v0.6.3)."""
    _write(jit_dir.parent / TREE, _facts_of(_tree_files(tree), tree, _read(jit_dir.parent / TREE, facts) or {}))


# The one Python file of the package an install writes (build_backend.py's _create_build_metadata at
# v0.6.3, rewritten by each editable install of a git checkout): no edit of a contributor's.
BUILD_META = "flashinfer/_build_meta.py"


def judged_part(rel: str) -> bool:
    """Whether a file of the tree (relative to it) is of what affected snapshots: include/, csrc/, and
    the package's Python files (a module's generator may be any of them, such as
    flashinfer/fp4_quantization.py's gen_fp4_quantization_module) but BUILD_META."""
    if rel.startswith("flashinfer/"):
        return rel.endswith(".py") and rel != BUILD_META and not rel.startswith("flashinfer/data/")
    return rel.startswith(tuple(f"{part}/" for part in TREE_PARTS))


def tree_snapshot(tree: Path, was: dict[str, list | None] | None = None) -> dict[str, list | None]:
    """{file of include/, csrc/ and the package's Python files (judged_part), relative to the tree:
    its file fact} now; a file whose stat did not move since `was` keeps its hash there."""
    generators = [p for p in python_sources(tree) if judged_part(str(p.relative_to(tree)))]
    return _facts_of([*_tree_files(tree), *generators], tree, was or {})


def tree_record(jit_dir: Path) -> dict[str, list | None]:
    """{file of include/ and csrc/, relative to the tree: its file fact} at the last build in
    `jit_dir`; empty where no build there left a readable record."""
    return _read(jit_dir.parent / TREE, facts) or {}


def generators_before(build_dir: Path, tree: Path) -> dict[str, list]:
    """{the tree's Python file, relative to it: its file fact} as the module's generators record
    holds them (at its last build); empty where it left none it can read."""
    recorded = _read(build_dir / GENERATORS, facts) or {}
    real = tree.resolve()
    return {
        str(Path(p).resolve().relative_to(real)): fact
        for p, fact in recorded.items()
        if Path(p).resolve().is_relative_to(real)
    }


def unreadable_tree(jit_dir: Path) -> Path | None:
    """The JIT dir's tree record, where it is there but cannot be read (truncated, not JSON, another shape)."""
    path = jit_dir.parent / TREE
    return path if path.exists() and _read(path, facts) is None else None


def changed_tree_files(jit_dir: Path, tree: Path) -> list[str] | None:
    """Files of include/ and csrc/ (relative to the tree) added, removed or of other content than
    at the last build in `jit_dir`; None when no build there left a record."""
    was = _read(jit_dir.parent / TREE, facts)
    if was is None:
        return None
    now = {str(path.relative_to(tree)): path for path in _tree_files(tree)}
    changed = [rel for rel, path in now.items() if differs(path, was.get(rel))]
    return sorted(changed + [rel for rel in was if rel not in now])
