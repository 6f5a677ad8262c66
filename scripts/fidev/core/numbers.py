"""Numbers given on a command line, read strictly: digits 0-9 only (str.isdigit() accepts '²', and
int() and float() accept '١' and other scripts' digits), finite, and within a bound that a real
use stays far below (a huge count or time is a typo, not a plan), written in at most MOST_DIGITS characters
(int() refuses more than 4,300 digits with a ValueError of its own, leading zeros and all). A bad one is a
Failure that `fidev.core.failure.option` turns into a usage error: two lines, status 2, the value quoted
short (`quoted`) where it is long."""

from __future__ import annotations

import re
from collections.abc import Callable

from fidev.core.failure import Failure

WHOLE = re.compile(r"[0-9]+")
DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")
MOST_COUNT = 10_000  # runs, GPUs, processes
MOST_SECONDS = 7 * 24 * 3600.0  # a week
MOST_DIGITS = 30  # characters of a number given on a command line: far past any bound above, far below int()'s limit
SHOWN = 24  # characters of a long value quoted in a message


def digits(text: str) -> bool:
    """Whether `text` is digits 0-9 alone (what int() of it reads as written), where str.isdigit() takes
    '²', which int() refuses, and '٣', which it reads as 3: for a number read from a program's output
    or a header, not a command line."""
    return WHOLE.fullmatch(text) is not None


def quoted(text: str) -> str:
    """`text` quoted for a message: whole where short, else its start and its length (a value of thousands of
    digits would make the error line thousands of characters long)."""
    return repr(text) if len(text) <= SHOWN else f"{text[:SHOWN]!r}... ({len(text)} characters)"


def short(text: str) -> str:
    """`text` (a number read back from a record: str(10**400)) as `quoted` shows it, unquoted."""
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


def whole(text: str) -> int | None:
    """int(text) where `text` is digits 0-9 alone, at most MOST_DIGITS of them; else None."""
    return int(text) if len(text) <= MOST_DIGITS and WHOLE.fullmatch(text) else None


def whole_number(least: int = 1, most: int = MOST_COUNT, example: str = "2") -> Callable[[str], int]:
    """A parser of a whole number from `least` to `most`."""

    def parse(text: str) -> int:
        value = whole(text)
        if value is None or not least <= value <= most:
            raise Failure(
                f"{quoted(text)} is not a whole number from {least} to {most}",
                f"give one in the digits 0-9, e.g. {example}",
            )
        return value

    parse.__name__ = "whole number"
    return parse


def decimal_number(
    least: float = 0.0, most: float = MOST_SECONDS, example: str = "60", unit: str = "seconds", zero: bool = False
) -> Callable[[str], float]:
    """A parser of a number of `unit` above `least` (or equal to it, with `zero`) and at most `most`."""

    def parse(text: str) -> float:
        value = float(text) if len(text) <= MOST_DIGITS and DECIMAL.fullmatch(text) else -1.0
        if not ((least <= value if zero else least < value) and value <= most):
            above = f"{least:g} or more" if zero else f"more than {least:g}"
            raise Failure(
                f"{quoted(text)} is not a number of {unit}, {above} and at most {most:g}",
                f"give one in the digits 0-9 (a decimal point allowed), e.g. {example}",
            )
        return value

    parse.__name__ = f"number of {unit}"
    return parse
