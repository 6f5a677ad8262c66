"""What the test session leaves in the checkout (tests/conftest.py fails the session on it)."""

import shutil
import subprocess
from pathlib import Path


def checkout_state(root: Path) -> set[str] | None:
    """`git status --porcelain` of the checkout, untracked files one by one (ignored ones left out);
    None where `root` is no git work tree or git is missing (a copy of the checkout, a host without git)."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    done = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=False,
    )
    return set(done.stdout.splitlines()) if done.returncode == 0 else None


def left_in_checkout(before: set[str] | None, after: set[str] | None) -> list[str]:
    """What the session left in the checkout that was not there before it: a new or changed file,
    tracked or not (a test must write under tmp_path, and put back what it changes)."""
    return sorted(after - before) if before is not None and after is not None else []


GPU_SUITES = ("smoke", "abi_smoke")  # tests/<suite>: what smoke, abi-smoke and affected run on a GPU host


def guards_checkout(args: list[str]) -> bool:
    """Whether a session named by these arguments is held to leaving the checkout as it found it:
    not one of the GPU suites alone (smoke, abi-smoke, affected's run of their tests), which run in
    a user's tree beside FlashInfer's JIT and the user's own work."""
    return not args or not all(any(part in GPU_SUITES for part in Path(arg.split("::")[0]).parts) for arg in args)
