"""The manifest's flashinfer-dev tasks: each one's `depends-on` chain ends, as pixi needs to run it."""

from __future__ import annotations

from fidev.core.failure import Failure
from fidev.core.manifest import task_chain, task_names
from fidev.preflight.context import Context
from fidev.preflight.results import Result, fail, ok


def check_tasks(ctx: Context) -> Result:
    """Every task's chain read as bench_chain and the acceptance run read it (manifest.task_chain): a cycle
    among the depends-on, which pixi refuses, or a task that is no command, fails with the manifest's fix."""
    try:
        names = task_names()
        longest = max((task_chain(name) for name in names), key=len, default=[])
    except Failure as failure:
        return fail(failure.problem, failure.fix)
    return ok(f"{len(names)} tasks, each depends-on chain ends (longest: {' -> '.join(n for n, _ in longest)})")
