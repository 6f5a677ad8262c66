"""FlashInfer's test suite in the vendored tree: where it is, what a selection names, and the
pytest options it runs under (upstream-tests, and affected's dry run)."""

from __future__ import annotations

from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.manifest import pins
from fidev.tree import families as upstream_suites
from fidev.tree import source_tree


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
