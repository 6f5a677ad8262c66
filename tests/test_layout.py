"""The workspace's house rules (scripts/fidev/__init__.py), as tests:
- a script (scripts/) or a maintainer tool (tools/) imports no script and no tool: shared steps live in fidev;
- fidev's parts import in one direction (fidev.PARTS: a part imports itself and the parts before it), and
  its modules import each other without cycles;
- importing any fidev module needs only the standard library (third-party imports sit inside the functions
  that need them), so preflight can diagnose a half-installed environment;
- preflight's own modules (the task and the part fidev.preflight) import nothing outside the standard library
  and the workspace, not even inside a function, the NVML probe aside; and a run of preflight imports nothing
  else either, through the other parts it calls;
- no function of the product (scripts/, fidev) runs past MAX_FUNCTION_LINES;
- no line of the workspace's Python (scripts/, tools/, tests/) runs past MAX_LINE_LENGTH characters, the
  line-length [tool.ruff] gives ruff (`ruff format` at that width);
- ruff's known-first-party names exactly the workspace's own top-level modules that are imported."""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

import fidev
from fidev.core.manifest import ROOT, load_manifest

SCRIPTS, TESTS, TOOLS, FIDEV = ROOT / "scripts", ROOT / "tests", ROOT / "tools", ROOT / "scripts" / "fidev"
SUPPORT = TESTS / "support"
TASKS = {p.stem for folder in (SCRIPTS, TOOLS) for p in folder.glob("*.py")}
MAX_FUNCTION_LINES = 60
MAX_LINE_LENGTH = 120


def library() -> list:
    return sorted(FIDEV.rglob("*.py"))


def module_name(path) -> str:
    parts = path.relative_to(SCRIPTS).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path, top_level_only=False):
    """(module, line) of each absolute import; with top_level_only, not those inside a function.
    `from fidev.x import y` counts as fidev.x.y where that is a module."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    if top_level_only:  # `try: import tomllib except ...:` at the top
        nodes = [inner for node in nodes for inner in (ast.walk(node) if isinstance(node, ast.Try) else [node])]
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub.startswith("fidev.") and (SCRIPTS / (sub.replace(".", "/") + ".py")).is_file():
                    found.append((sub, node.lineno))
    return found


def part_of(module: str) -> str | None:
    pieces = module.split(".")
    return pieces[1] if pieces[0] == "fidev" and len(pieces) > 1 else None


def test_the_parts_are_the_packages_of_fidev():
    assert set(fidev.PARTS) == {p.name for p in FIDEV.iterdir() if (p / "__init__.py").is_file()}
    assert [p.name for p in FIDEV.glob("*.py")] == ["__init__.py"], "every module of fidev lives in a part"


def test_no_script_or_tool_imports_another():
    found = task_imports([*SCRIPTS.glob("*.py"), *TOOLS.glob("*.py")])
    assert found == [], f"a task imports a task: move the shared step into fidev: {found}"


def test_no_test_imports_a_script_or_tool():
    found = task_imports(TESTS.rglob("*.py"))
    assert found == [], f"tests run scripts as a user does, and import fidev for their steps: {found}"


def test_parts_import_in_one_direction():
    order = {part: i for i, part in enumerate(fidev.PARTS)}
    against = []
    for path in library():
        mine = part_of(module_name(path))
        for name, line in imports(path):
            theirs = part_of(name)
            if mine and theirs and order[theirs] > order[mine]:
                against.append(f"{path.relative_to(SCRIPTS)}:{line} ({mine}) imports {name} ({theirs})")
            assert name.split(".")[0] not in TASKS, f"{path.relative_to(SCRIPTS)}:{line} imports the task {name}"
    assert against == [], against


def test_fidev_modules_have_no_import_cycles():
    graph = {
        module_name(p): {n for n, _ in imports(p) if n.startswith("fidev.") and n != module_name(p)} for p in library()
    }
    seen, stack = set(), []

    def visit(module):
        assert module not in stack, f"import cycle: {' -> '.join([*stack[stack.index(module) :], module])}"
        if module in seen:
            return
        stack.append(module)
        for dep in graph.get(module, ()):
            visit(dep)
        stack.pop()
        seen.add(module)

    for module in graph:
        visit(module)


def test_importing_fidev_needs_only_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"fidev", "__future__"}
    outside = [
        (p.relative_to(SCRIPTS).as_posix(), name, line)
        for p in library()
        for name, line in imports(p, top_level_only=True)
        if name.split(".")[0] not in allowed and not name.startswith(("tomli", "pip._vendor"))
    ]
    assert outside == [], outside


# preflight diagnoses a half-installed environment: what it imports must not be what it diagnoses. The one
# exception, named: the NVML probe, whose every failure (no pynvml, no driver) hands the reading to nvidia-smi.
PREFLIGHT_OUTSIDE = {("fidev/preflight/driver.py", "pynvml")}


def preflight_modules() -> list:
    return [SCRIPTS / "preflight.py", *sorted((FIDEV / "preflight").rglob("*.py"))]


def test_preflight_imports_only_the_standard_library_even_inside_functions():
    allowed = set(sys.stdlib_module_names) | {"fidev", "__future__"}
    outside = {
        (p.relative_to(SCRIPTS).as_posix(), name)
        for p in preflight_modules()
        for name, _ in imports(p)
        if name.split(".")[0] not in allowed
    }
    assert outside == PREFLIGHT_OUTSIDE, "preflight's modules import the standard library and fidev only"
    dynamic = [
        f"{p.relative_to(SCRIPTS)}:{node.lineno}"
        for p in preflight_modules()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
    ]
    assert dynamic == [], "preflight imports by name only, where this test reads it"


PREFLIGHT_RUN = """
import pathlib, runpy, sys
script = pathlib.Path(sys.argv[1])
sys.argv, before = [str(script), "--json"], set(sys.modules)
sys.path.insert(0, str(script.parent))
try:
    runpy.run_path(str(script), run_name="__main__")
except SystemExit:
    pass
print(" ".join(sorted({name.partition(".")[0] for name in set(sys.modules) - before})), file=sys.stderr)
"""


def test_a_run_of_preflight_imports_only_the_standard_library(tmp_path):
    """Through the other parts it calls too: preflight runs in the test interpreter, whose packages (in
    flashinfer-dev's: torch, nvidia-ml-py, packaging) and a stand-in flashinfer on the path would import and
    show; what the run added to sys.modules is the standard library, fidev and the NVML probe's pynvml."""
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", PREFLIGHT_RUN, str(SCRIPTS / "preflight.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "Traceback" not in done.stderr, done.stderr
    findings = [c["finding"] for c in json.loads(done.stdout)["checks"]]
    assert not [f for f in findings if f.startswith("the check crashed")], findings
    allowed = set(sys.stdlib_module_names) | {"fidev"} | {name for _, name in PREFLIGHT_OUTSIDE}
    added = set(done.stderr.splitlines()[-1].split())
    assert added - allowed == set(), f"a run of preflight imported {sorted(added - allowed)}"
    assert "fidev" in added


def long_functions(paths) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.name}:{node.lineno} {node.name} ({length} lines)")
    return found


def task_imports(paths) -> list[tuple[str, str, int]]:
    return [(p.name, name, line) for p in paths for name, line in imports(p) if name.split(".")[0] in TASKS]


def test_no_product_function_runs_past_the_limit():
    """The tasks, the library and the maintainer tools (tools/): each function at most MAX_FUNCTION_LINES."""
    found = long_functions([*SCRIPTS.glob("*.py"), *library(), *sorted(TOOLS.glob("*.py"))])
    assert found == [], f"split into named steps (at most {MAX_FUNCTION_LINES} lines)"


def test_the_length_rule_sees_a_long_function(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"class A:\n    def long(self):\n{body}\n")
    (tmp_path / "short.py").write_text("def short():\n    return 1\n")
    assert long_functions([tmp_path / "long.py", tmp_path / "short.py"]) == [
        f"long.py:2 long ({MAX_FUNCTION_LINES + 1} lines)"
    ]


def test_no_line_runs_past_the_limit():
    """Every Python file of scripts/, tools/ and tests/: each line at most MAX_LINE_LENGTH characters."""
    found = [
        f"{path.relative_to(ROOT)}:{n} ({len(line)} characters)"
        for folder in (SCRIPTS, TOOLS, TESTS)
        for path in sorted(folder.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > MAX_LINE_LENGTH
    ]
    assert found == [], f"wrap these lines (at most {MAX_LINE_LENGTH} characters): {found}"


def test_ruff_is_given_the_line_length():
    assert load_manifest()["tool"]["ruff"]["line-length"] == MAX_LINE_LENGTH


@pytest.mark.parametrize(
    "statement",
    [
        "import affected",
        "from upstream_tests import main",
        "import bench_upstream as bench",
        "def f():\n    import gpu_acceptance",
    ],
)
def test_the_task_rule_sees_an_import_of_a_task(tmp_path, statement):
    (tmp_path / "t.py").write_text(statement + "\n")
    assert len(task_imports([tmp_path / "t.py"])) == 1


def test_known_first_party_names_the_imported_own_modules():
    own = TASKS | {p.stem for p in SUPPORT.glob("*.py")} | {"fidev"}
    files = [*SCRIPTS.glob("*.py"), *TOOLS.glob("*.py"), *library(), *TESTS.rglob("*.py")]
    imported = {name.split(".")[0] for path in files for name, _ in imports(path)} & own
    declared = set(load_manifest()["tool"]["ruff"]["lint"]["isort"]["known-first-party"])
    assert declared == imported, f"declare {sorted(imported - declared)}, drop {sorted(declared - imported)}"


# affected's rooms, each importing only those before it: which tests (selection), what they covered
# (coverage), what is printed (report), and the verdict with its exit status (verdict); the run (judge) calls
# them in turn, and scripts/affected.py calls it
ROOMS = ("selection", "coverage", "report", "verdict")


def test_affecteds_rooms_import_in_one_direction():
    wrong = []
    for i, room in enumerate(ROOMS):
        path = FIDEV / "affected" / f"{room}.py"
        for name, line in imports(path):
            other = name.split(".")[2] if name.startswith("fidev.affected.") else None
            if (
                other is not None
                and (other not in ROOMS[:i] and other != room)
                and (room != "verdict" or other in ROOMS[i:])
            ):
                wrong.append(f"affected/{room}.py:{line} imports {name}")
    assert wrong == [], (
        "selection, coverage, report, verdict: each imports only those before it (the verdict also the kept "
        "verdicts and changes)"
    )


def prints(path) -> list[int]:
    """The lines of `path` that call print, or write to sys.stdout or sys.stderr."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.id if isinstance(f, ast.Name) else ast.unparse(f) if isinstance(f, ast.Attribute) else ""
            if called == "print" or called.startswith(("sys.stdout.", "sys.stderr.")):
                found.append(node.lineno)
    return found


def test_only_affecteds_report_prints_of_its_rooms():
    """Which tests (selection), what they covered (coverage) and the verdict (verdict) decide and print nothing:
    what is said is the report's."""
    said = {room: prints(FIDEV / "affected" / f"{room}.py") for room in ROOMS if room != "report"}
    assert said == {room: [] for room in said}, f"print in a room that decides: {said}"


@pytest.mark.parametrize("statement", ["print('x')", "sys.stdout.write('x')", "sys.stderr.write('x')"])
def test_the_print_rule_sees_each_way_of_saying(tmp_path, statement):
    (tmp_path / "room.py").write_text(f"import sys\ndef f():\n    {statement}\n")
    assert prints(tmp_path / "room.py") == [3]


def test_the_affected_script_parses_calls_and_prints():
    """scripts/affected.py parses its options and hands them to its run (fidev.affected.judge.answer): it
    defines main alone, and of affected's rooms imports judge alone, so no verdict is decided in it."""
    tree = ast.parse((SCRIPTS / "affected.py").read_text())
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    rooms = {name for name, _ in imports(SCRIPTS / "affected.py") if name.startswith("fidev.affected.")}
    assert (defined, rooms) == (["main"], {"fidev.affected.judge"})


# affected's run of the tests (fidev.affected.tests) drives smoke's tests in its process (ours) and FlashInfer's
# behind their gate (theirs): each room imports only those it names
TEST_ROOMS = {"ours": (), "theirs": (), "tests": ("ours", "theirs")}


def test_affecteds_test_rooms_import_in_one_direction():
    wrong = []
    for room, below in TEST_ROOMS.items():
        path = FIDEV / "affected" / f"{room}.py"
        for name, line in imports(path):
            other = name.split(".")[2] if name.startswith("fidev.affected.") else None
            if other in TEST_ROOMS and other != room and other not in below:
                wrong.append(f"affected/{room}.py:{line} imports {name}")
    assert wrong == [], f"tests imports ours and theirs; ours and theirs import neither tests nor each other: {wrong}"


def string_constants(paths) -> list[tuple[str, int, object]]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
                found.append((str(path.relative_to(ROOT)), node.lineno, node.value))
    return found


def test_the_verdicts_and_the_interrupted_status_are_stated_once():
    """affected's verdicts that are no test outcome besides ("nothing changed", "build failed", ...) are
    written only in fidev.affected.verdict, and the interrupted status 130 only in fidev.core.interrupts (a
    task's first import, which says an interrupt before fidev.core.failure is imported): every other file names
    them (Verdict, INTERRUPTED)."""
    from fidev.affected.verdict import Verdict
    from fidev.core.failure import INTERRUPTED

    own = {v.value for v in Verdict} - {
        "passed",
        "failed",
        "not covered",
        "error",
    }  # these are test outcomes and kept results too
    paths = [*SCRIPTS.rglob("*.py"), *TOOLS.glob("*.py")]
    said = [
        (f, line, value)
        for f, line, value in string_constants(paths)
        if (value in own and f != "scripts/fidev/affected/verdict.py")
        or (value == INTERRUPTED and f != "scripts/fidev/core/interrupts.py")
    ]
    assert said == [], "name them: fidev.affected.verdict.Verdict, fidev.core.failure.INTERRUPTED"


def test_the_session_guard_names_what_a_test_left_in_the_checkout(tmp_path):
    """tests/conftest.py fails the session where it left a file of the checkout new or changed
    (tests/support/checkout.py); what was there before the session is not its doing."""
    from checkout import checkout_state, left_in_checkout

    if shutil.which("git") is None:
        pytest.skip("no git on this host: the guard does nothing without it")
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    (repo / "kept.txt").write_text("a\n")
    (repo / ".gitignore").write_text("ignored/\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "x"], check=True)
    (repo / "users_own.txt").write_text("the user's, before the session\n")
    before = checkout_state(repo)
    (repo / "kept.txt").write_text("b\n")
    (repo / "new" / "deep").mkdir(parents=True)
    (repo / "new" / "deep" / "left.txt").write_text("left\n")
    (repo / "ignored").mkdir()
    (repo / "ignored" / "x").write_text("fine\n")
    assert left_in_checkout(before, checkout_state(repo)) == [" M kept.txt", "?? new/deep/left.txt"]
    assert checkout_state(tmp_path / "not-a-repo") is None
    assert left_in_checkout(None, set()) == [] and left_in_checkout(set(), None) == []


def test_the_checkout_guard_holds_the_cpu_suite_not_the_gpu_suites_alone():
    """smoke, abi-smoke and affected run the GPU suites in the user's own tree: not held to it."""
    from checkout import guards_checkout

    assert guards_checkout([]) and guards_checkout(["tests"]) and guards_checkout(["tests/test_layout.py::test_x"])
    assert guards_checkout([f"{ROOT}/tests/smoke/test_kernels.py", "tests/test_layout.py"])
    assert not guards_checkout([f"{ROOT}/tests/smoke/test_kernels.py::test_rmsnorm[fp16]", "tests/abi_smoke"])


# FlashInfer's names of the workspace's folders and files, which fidev.core.workspace states once
WORKSPACE_NAMES = {"cached_ops", "generated", "build.ninja", "flashinfer_jit.lock", "fidev-module-tests.json"}


def test_the_workspace_names_its_folders_and_files_in_one_place():
    """A path of the workspace's state built by hand beside fidev.core.workspace drifts from it: every
    string that is one of those names, in scripts/ and tools/, is workspace.py's."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
        for path in sorted([*SCRIPTS.rglob("*.py"), *TOOLS.glob("*.py")])
        if path != FIDEV / "core" / "workspace.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in WORKSPACE_NAMES
    ]
    assert found == []
