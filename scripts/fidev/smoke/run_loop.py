"""pytest's run loop in an order chosen as the cases go, for a run whose cases wait for the modules they
load: smoke's and abi-smoke's tests beside affected's rebuild (fidev.affected.ours.ready_first), and
FlashInfer's behind affected's gate (fidev.upstream.gate.run_in_turn). pytest is the caller's: nothing
here imports it."""

from __future__ import annotations

from collections.abc import Callable


def run_in_order(
    session,
    next_case: Callable[[list], object],
    ready_now: Callable[[list], object | None],
    kept: Callable[[object, list], object | None] = lambda item, left: None,
) -> bool | None:
    """A `pytest_runtestloop` over the session's cases: `next_case(left)` the case to run (waited for);
    pytest's `nextitem` is `ready_now(left)`, a case ready as the one before it starts, and that one runs
    next (the fixtures kept for it are its own); where none is ready yet, `kept(item, left)`'s (None:
    every fixture torn down, set up again by the next case). Collection errors, --collect-only, the early
    stop and pytest's -x end it as they end pytest's own loop (None: pytest's loop says them)."""
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        return None  # pytest's own loop says it
    if session.config.option.collectonly:
        return True
    left, committed = list(session.items), None
    while left:
        item = committed if committed is not None else next_case(left)
        left.remove(item)
        committed = ready_now(left) if left else None
        nextitem = committed if committed is not None else kept(item, left)
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
    return True
