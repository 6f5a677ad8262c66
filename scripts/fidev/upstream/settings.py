"""The settings of the pytest plugin that runs in FlashInfer's test processes (fidev.upstream.plugin),
and how a parent hands them down: the one owner of their environment variables' names.

A process reads them once, at the plugin's start (Settings.read), into a frozen Settings that its
plugins are given. A parent never writes its own os.environ to pass them: it builds the child's
environment with child_env, from its own (less every setting it inherited) and the child's Settings.
upstream-tests reads the settings it inherited (affected's gate) once, at its start, and passes them down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

DRY_RUN_DIR = "FIDEV_UPSTREAM_DRY_RUN_DIR"  # where each dry-run process writes its records
RUN_MODE = (
    "FIDEV_UPSTREAM_RUN"  # in each test file's process of a run (fidev.upstream.runs): where it writes its outcomes
)
GATE, GATE_OWNER = "FIDEV_UPSTREAM_GATE", "FIDEV_UPSTREAM_GATE_OWNER"  # the gate file, and the identity of who opens it
PART = "FIDEV_UPSTREAM_PART"  # "i/k" in a part of a file's run: its cases are every k-th from the i-th
# the sample spec's path in a sampled run (`upstream-tests --sample`): each process runs the sample of the cases
# it collected (fidev.upstream.sample)
SAMPLE = "FIDEV_UPSTREAM_SAMPLE"
STOP_AFTER, STOP_FILE = (
    "FIDEV_UPSTREAM_STOP_AFTER",
    "FIDEV_UPSTREAM_STOP_FILE",
)  # the failures to stop at, their shared file


def in_part(value: str) -> tuple[int, int]:
    """PART's (i, k), 1 <= i <= k."""
    i, k = (int(v) for v in value.split("/"))
    if not 1 <= i <= k:
        raise ValueError(f"{PART}={value}: not a part i/k with 1 <= i <= k")
    return i, k


@dataclass(frozen=True)
class Settings:
    """What a process of FlashInfer's suite is to do, as its parent said it. Each field has its
    variable (VARIABLES); an empty or absent variable is the field's default."""

    dry_dir: Path | None = None  # a process of the plan's dry run: its records go here
    outcomes: Path | None = None  # a test file's process of a run: its outcomes go here
    gate: Path | None = None  # the run waits at this gate file once collected
    gate_owner: str = ""  # the process that opens the gate (fidev.upstream.gate.process_identity)
    part: tuple[int, int] | None = None  # (i, k): every k-th collected case from the i-th
    sample: Path | None = None  # the sample spec (fidev.upstream.sample)
    stop_after: int = 0  # the run's failing cases that stop it (0: none)
    stop_file: Path | None = None  # where the run's processes append their failing cases

    @classmethod
    def read(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """The settings the environment gives; a malformed PART or STOP_AFTER is ValueError."""
        found = {}
        for f in fields(cls):
            value = env.get(VARIABLES[f.name], "")
            if value:
                found[f.name] = PARSE.get(f.name, Path)(value)
        return cls(**found)

    def env(self) -> dict[str, str]:
        """The variables that say these settings (the defaults: none)."""
        said = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in (None, "", 0):
                said[VARIABLES[f.name]] = f"{value[0]}/{value[1]}" if f.name == "part" else str(value)
        return said

    def but(self, **changes) -> Settings:
        return replace(self, **changes)

    @property
    def in_run(self) -> bool:
        """A test file's process of a run (not the dry run's)."""
        return self.dry_dir is None and self.outcomes is not None


VARIABLES = {
    "dry_dir": DRY_RUN_DIR,
    "outcomes": RUN_MODE,
    "gate": GATE,
    "gate_owner": GATE_OWNER,
    "part": PART,
    "sample": SAMPLE,
    "stop_after": STOP_AFTER,
    "stop_file": STOP_FILE,
}
PARSE = {"gate_owner": str, "part": in_part, "stop_after": int}


def child_env(settings: Settings, base: Mapping[str, str] = os.environ, **extra: str) -> dict[str, str]:
    """A child process's environment: `base` less every setting it holds, then `settings`' and `extra`."""
    env = {k: v for k, v in base.items() if k not in VARIABLES.values()}
    return {**env, **settings.env(), **extra}
