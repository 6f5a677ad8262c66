"""The workspace's house rules (scripts/fidev/__init__.py), as tests: a script holds its task;
fidev holds what two users share and every fact two files must agree on; importing any fidev
module needs only the standard library (third-party imports sit inside the functions that need
them); nothing in fidev imports a script, and fidev's modules import each other without cycles;
ruff's known-first-party names exactly the workspace's own modules that are imported."""

import ast
import sys

from fidev.manifest import ROOT, load_manifest

SCRIPTS, TESTS, FIDEV = ROOT / "scripts", ROOT / "tests", ROOT / "scripts" / "fidev"
OWN = {p.stem for p in SCRIPTS.glob("*.py")} | {p.stem for p in TESTS.glob("*.py")} | {"fidev"}


def imports(path, top_level_only=False):
    """(module, line) of each import; with top_level_only, not those inside a function."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Try) and top_level_only:  # `try: import tomllib except ...:` at the top
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom) and getattr(inner, "level", 0) == 0:
                    found += [(a.name, inner.lineno) for a in inner.names] if isinstance(inner, ast.Import) else [(inner.module, inner.lineno)]
    return found


def test_importing_fidev_needs_only_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"fidev", "__future__"}
    outside = [(p.name, name, line) for p in FIDEV.glob("*.py") for name, line in imports(p, top_level_only=True)
               if name.split(".")[0] not in allowed and not name.startswith(("tomli", "pip._vendor"))]
    assert outside == [], outside


def test_fidev_imports_no_script_and_has_no_cycles():
    graph = {}
    for path in FIDEV.glob("*.py"):
        names = [name for name, _ in imports(path)]
        upward = [n for n in names if n.split(".")[0] in OWN - {"fidev"}]
        assert upward == [], f"{path.name} imports {upward}: shared code must not reach up into a task"
        graph[path.stem] = {n.split(".")[1] for n in names if n.startswith("fidev.")}
        tree = ast.parse(path.read_text())
        graph[path.stem] |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "fidev"
                             for alias in node.names}
    seen, stack = set(), []

    def visit(module):
        assert module not in stack, f"import cycle: {' -> '.join([*stack[stack.index(module):], module])}"
        if module in seen:
            return
        stack.append(module)
        for dep in graph.get(module, ()):
            visit(dep)
        stack.pop()
        seen.add(module)

    for module in graph:
        visit(module)


def test_known_first_party_names_the_imported_own_modules():
    imported = {name.split(".")[0] for folder in (SCRIPTS, TESTS, FIDEV, TESTS / "smoke", TESTS / "abi_smoke")
                for path in folder.glob("*.py") for name, _ in imports(path)} & OWN
    declared = set(load_manifest()["tool"]["ruff"]["lint"]["isort"]["known-first-party"])
    assert declared == imported, f"declare {sorted(imported - declared)}, drop {sorted(declared - imported)}"
