"""How every script of the workspace fails: one line naming the problem, one line with the fix."""

from __future__ import annotations

import sys


class Failure(Exception):
    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def run_main(main) -> int:
    """Call main(); turn a Failure into the two-line message and exit status 1."""
    try:
        return main() or 0
    except Failure as failure:
        print(f"error: {failure.problem}", file=sys.stderr)
        print(f"  fix: {failure.fix}", file=sys.stderr)
        return 1
