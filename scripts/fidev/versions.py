"""Version parsing for the standard-library-only scripts (preflight must not need `packaging`)."""

from __future__ import annotations

import re

_VERSION = re.compile(r"(\d+(?:\.\d+)*)(?:\.?post(\d+))?(?:\+(\S+))?$")


def version_key(text: str) -> tuple:
    """'0.1.8.post0' -> ((0, 1, 8), 0); '0.1.8' -> ((0, 1, 8), -1). Trailing zeros ignored."""
    match = _VERSION.match(text.strip())
    if not match:
        raise ValueError(f"cannot read version {text!r}")
    release = tuple(int(p) for p in match.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    return release, int(match.group(2)) if match.group(2) is not None else -1


def in_range(version: str, specifiers: str) -> bool:
    """Whether version satisfies a comma-separated set of >=, <=, >, <, ==, != clauses."""
    ops = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           "<": lambda a, b: a < b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
    have = version_key(version.split("+")[0])
    for clause in filter(None, (c.strip() for c in specifiers.split(","))):
        op = next(o for o in (">=", "<=", "==", "!=", ">", "<") if clause.startswith(o))
        if not ops[op](have, version_key(clause[len(op):])):
            return False
    return True


def major_minor(text: str) -> str:
    """'12.9.86' -> '12.9'."""
    return ".".join(text.split(".")[:2])
