"""What a check answers (PASS, WARN or FAIL, what it found and the fix), and the probes every check may use:
a subprocess with a timeout, a package's metadata (never its import)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from importlib import metadata

SUBPROCESS_TIMEOUT_S = 5
ENV_FIX = "run it inside the environment: `pixi run -e flashinfer-dev preflight`, or `pixi shell -e flashinfer-dev`"


@dataclass(frozen=True)
class Result:
    status: str  # pass | warn | fail
    finding: str
    fix: str = ""


def ok(finding: str) -> Result:
    return Result("pass", finding)


def warn(finding: str, fix: str) -> Result:
    return Result("warn", finding, fix)


def fail(finding: str, fix: str) -> Result:
    return Result("fail", finding, fix)


def run(cmd) -> subprocess.CompletedProcess | None:
    """Run a probe; None when it cannot start or outlives SUBPROCESS_TIMEOUT_S."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def distribution(name: str):
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
