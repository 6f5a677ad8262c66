"""Numbers given on a command line, read strictly: digits 0-9 only (str.isdigit() accepts '²', and
int() and float() accept '١' and other scripts' digits), finite, and within a bound that a real
use stays far below (a huge count or time is a typo, not a plan). A bad one is a Failure that
`fidev.core.failure.option` turns into a usage error: two lines, status 2."""

from __future__ import annotations

import re
from collections.abc import Callable

from fidev.core.failure import Failure

WHOLE = re.compile(r"[0-9]+")
DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")
MOST_COUNT = 10_000  # runs, GPUs, processes
MOST_SECONDS = 7 * 24 * 3600.0  # a week


def digits(text: str) -> bool:
    """Whether `text` is digits 0-9 alone (what int() of it reads as written), where str.isdigit() takes
    '²', which int() refuses, and '٣', which it reads as 3: for a number read from a program's output
    or a header, not a command line."""
    return WHOLE.fullmatch(text) is not None


def whole_number(least: int = 1, most: int = MOST_COUNT, example: str = "2") -> Callable[[str], int]:
    """A parser of a whole number from `least` to `most`."""

    def parse(text: str) -> int:
        if not WHOLE.fullmatch(text) or not least <= int(text) <= most:
            raise Failure(
                f"{text!r} is not a whole number from {least} to {most}", f"give one in the digits 0-9, e.g. {example}"
            )
        return int(text)

    parse.__name__ = "whole number"
    return parse


def decimal_number(
    least: float = 0.0, most: float = MOST_SECONDS, example: str = "60", unit: str = "seconds", zero: bool = False
) -> Callable[[str], float]:
    """A parser of a number of `unit` above `least` (or equal to it, with `zero`) and at most `most`."""

    def parse(text: str) -> float:
        value = float(text) if DECIMAL.fullmatch(text) else -1.0
        if not ((least <= value if zero else least < value) and value <= most):
            above = f"{least:g} or more" if zero else f"more than {least:g}"
            raise Failure(
                f"{text!r} is not a number of {unit}, {above} and at most {most:g}",
                f"give one in the digits 0-9 (a decimal point allowed), e.g. {example}",
            )
        return value

    parse.__name__ = f"number of {unit}"
    return parse
