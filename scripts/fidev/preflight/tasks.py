"""The manifest's flashinfer-dev tasks: each one's `depends-on` chain ends, as pixi needs to run it."""

from __future__ import annotations

from fidev.core.failure import Failure
from fidev.core.manifest import task_chain, task_names
from fidev.preflight.context import Context
from fidev.preflight.results import Result, fail, ok

# The chain a user runs first (`pixi run -e flashinfer-dev smoke`), each task of it by name
CHAIN = ("preflight", "build", "import-check", "smoke")


def check_tasks(ctx: Context) -> Result:
    """Every task's chain read as bench_chain and the acceptance run read it (manifest.task_chain): a cycle
    among the depends-on, which pixi refuses, or a task that is no command, fails with the manifest's fix;
    so does a manifest without a task of the CHAIN, which `pixi run` and the tools that time it would miss."""
    try:
        names = task_names()
        longest = max((task_chain(name) for name in names), key=len, default=[])
    except Failure as failure:
        return fail(failure.problem, failure.fix)
    if missing := [name for name in CHAIN if name not in names]:
        return fail(
            f"the manifest has no task {', '.join(missing)}, of the chain {' -> '.join(CHAIN)}",
            "restore the tasks from the checkout: git checkout pyproject.toml (or add them back by hand)",
        )
    return ok(f"{len(names)} tasks, each depends-on chain ends (longest: {' -> '.join(n for n, _ in longest)})")
