"""The settings of the plugin in FlashInfer's test processes (fidev.upstream.settings): read once into a
frozen object, handed to a child in the environment given to its process, never by writing the parent's
os.environ; and the progress line of a long build (fidev.builds.module_builds)."""

import ast
import dataclasses
import threading
import time
from pathlib import Path

import pytest

from fidev.builds import module_builds
from fidev.core.manifest import ROOT
from fidev.upstream import settings as upstream_settings
from fidev.upstream.settings import Settings, child_env

FULL = Settings(
    dry_dir=None,
    outcomes=Path("/r/a.jsonl"),
    gate=Path("/g/gate"),
    gate_owner="12:34",
    part=(2, 3),
    sample=Path("/s/sample.json"),
    stop_after=1,
    stop_file=Path("/r/failing-cases"),
)


def test_settings_said_in_the_environment_read_back_the_same_and_are_frozen():
    env = FULL.env()
    assert env == {
        "FIDEV_UPSTREAM_RUN": "/r/a.jsonl",
        "FIDEV_UPSTREAM_GATE": "/g/gate",
        "FIDEV_UPSTREAM_GATE_OWNER": "12:34",
        "FIDEV_UPSTREAM_PART": "2/3",
        "FIDEV_UPSTREAM_SAMPLE": "/s/sample.json",
        "FIDEV_UPSTREAM_STOP_AFTER": "1",
        "FIDEV_UPSTREAM_STOP_FILE": "/r/failing-cases",
    }
    assert Settings.read(env) == FULL and Settings.read({}) == Settings() and Settings().env() == {}
    assert Settings.read({"FIDEV_UPSTREAM_PART": "", "FIDEV_UPSTREAM_GATE": ""}) == Settings(), "empty counts as unset"
    assert FULL.in_run and not Settings().in_run and not FULL.but(dry_dir=Path("/d")).in_run
    with pytest.raises(dataclasses.FrozenInstanceError):
        FULL.gate = None
    with pytest.raises(ValueError, match="not a part"):
        Settings.read({"FIDEV_UPSTREAM_PART": "4/3"})


def test_a_child_gets_its_own_settings_and_none_its_parent_inherited():
    """A process of a run started by a gated upstream-tests: the parent's inherited part or stop does
    not leak into a child whose settings have none; the rest of the environment passes."""
    parent = {"PATH": "/bin", **FULL.env()}
    child = child_env(Settings(outcomes=Path("/r/b.jsonl")), parent, PYTHONPATH="/x")
    assert child == {"PATH": "/bin", "FIDEV_UPSTREAM_RUN": "/r/b.jsonl", "PYTHONPATH": "/x"}
    assert set(upstream_settings.VARIABLES) == {f.name for f in dataclasses.fields(Settings)}


ALLOWED = {  # where a process changes its own environment, and why
    "scripts/fidev/smoke/gpu_suite.py",  # pytest runs in this process: its plugin autoload is read from os.environ
    "scripts/fidev/affected/ours.py",  # the same, for smoke's tests in affected's process; restored after
    "tools/prebuilt_set.py",  # FlashInfer's own build runs in this process and reads the kernel source mode there
}


def environ_writes(path: Path) -> list[int]:
    """Lines that write os.environ: an item assigned or deleted, or a mutating method called; os.putenv."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else node.targets if isinstance(node, ast.Delete) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and ast.unparse(target.value) == "os.environ":
                found.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, name = ast.unparse(node.func.value), node.func.attr
            if (owner == "os.environ" and name in ("update", "setdefault", "pop", "popitem", "clear")) or (
                owner,
                name,
            ) == ("os", "putenv"):
                found.append(node.lineno)
    return found


def test_no_task_passes_settings_by_writing_its_own_environment():
    files = [*ROOT.glob("scripts/**/*.py"), *ROOT.glob("tools/*.py")]
    writes = {str(p.relative_to(ROOT)): environ_writes(p) for p in files}
    found = {p: lines for p, lines in writes.items() if lines and p not in ALLOWED}
    assert found == {}, (
        "hand a child its settings in the environment given to its process (fidev.upstream.settings.child_env)"
    )
    assert all(writes.get(p) for p in ALLOWED), "an allowed file no longer writes os.environ: take it off ALLOWED"


def test_a_long_build_says_how_many_modules_are_done(monkeypatch):
    """Past PROGRESS_EVERY_S, a line of the modules done out of all, until the build ends."""
    monkeypatch.setattr(module_builds, "PROGRESS_EVERY_S", 0.05)
    said, done, ended = [], ["norm"], threading.Event()
    ticker = threading.Thread(
        target=module_builds.keep_saying_progress, args=(3, done, ended, said.append, threading.Lock())
    )
    ticker.start()
    deadline = time.monotonic() + 10
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    ended.set()
    ticker.join(timeout=5)
    assert said and said[0].startswith("  building: 1 of 3 module(s) done, "), said
    count = len(said)
    time.sleep(0.2)
    assert len(said) == count, "the line went on after the build ended"
