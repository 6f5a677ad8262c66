"""PEP 440 versions and specifier sets for the standard-library-only scripts (preflight must not
need `packaging`, so that it can diagnose a half-installed environment).

Follows packaging.version and packaging.specifiers: epochs, pre-, post- and dev-releases, local
versions, and the ==, !=, <, <=, >, >=, ~=, === and X.* operators. An installed version is checked
as `pip check` does, with pre-releases allowed. tests/test_versions.py holds this module to
`packaging` over a grid of versions and specifiers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION = re.compile(
    r"""v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>\d+)?)?
    (?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?""",
    re.VERBOSE | re.IGNORECASE | re.ASCII,  # PEP 440's digits are 0-9; \d alone takes every script's
)
_PRE = {"a": "a", "alpha": "a", "b": "b", "beta": "b", "c": "rc", "rc": "rc", "pre": "rc", "preview": "rc"}
_OPERATORS = ("===", "~=", "==", "!=", "<=", ">=", "<", ">")
_INF, _NEG = (float("inf"),), (float("-inf"),)


@dataclass(frozen=True)
class Version:
    epoch: int
    release: tuple[int, ...]
    pre: tuple[str, int] | None
    post: int | None
    dev: int | None
    local: tuple | None

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    @property
    def public(self) -> Version:
        return Version(self.epoch, self.release, self.pre, self.post, self.dev, None)

    @property
    def base(self) -> Version:
        return Version(self.epoch, self.release, None, None, None, None)

    def key(self) -> tuple:
        """packaging's _cmpkey: trailing zeros ignored; a dev-only release sorts before its
        pre-releases, a final release after them; no post before any post; no dev after any dev."""
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        if self.pre is None and self.post is None and self.dev is not None:
            pre = _NEG
        else:
            pre = _INF if self.pre is None else ("a b rc".split().index(self.pre[0]), self.pre[1])
        post = _NEG if self.post is None else (self.post,)
        dev = _INF if self.dev is None else (self.dev,)
        local = (
            ()
            if self.local is None
            else tuple((p, "") if isinstance(p, int) else (float("-inf"), p) for p in self.local)
        )
        return self.epoch, tuple(release), pre, post, dev, local

    def __lt__(self, other: Version) -> bool:
        return self.key() < other.key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __le__(self, other: Version) -> bool:
        return self.key() <= other.key()


def parse(text: str) -> Version:
    match = _VERSION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a PEP 440 version")
    g = match.groupdict()
    pre = (_PRE[g["pre_l"].lower()], int(g["pre_n"] or 0)) if g["pre_l"] else None
    post = g["post_n1"] or g["post_n2"] or ("0" if g["post_l"] else None)
    local = tuple(int(p) if p.isdigit() else p.lower() for p in re.split(r"[-_.]", g["local"])) if g["local"] else None
    return Version(
        int(g["epoch"] or 0),
        tuple(int(p) for p in g["release"].split(".")),
        pre,
        int(post) if post is not None else None,
        int(g["dev_n"] or 0) if g["dev_l"] else None,
        local,
    )


def _prefix_match(version: Version, spec: str) -> bool:
    """`== spec.*`: the release starts with spec's (zero-padded), ignoring pre/post/dev/local."""
    want = parse(spec)
    have = version.release + (0,) * max(0, len(want.release) - len(version.release))
    return version.epoch == want.epoch and have[: len(want.release)] == want.release


def _holds(version: Version, raw: str, clause: str) -> bool:
    op = next((o for o in _OPERATORS if clause.startswith(o)), None)
    if op is None:
        raise ValueError(f"{clause!r} has no comparison operator ({', '.join(_OPERATORS)})")
    target = clause[len(op) :].strip()
    if op == "===":
        return raw.strip().lower() == target.lower()
    if target.endswith(".*"):
        if op not in ("==", "!="):
            raise ValueError(f"{clause!r}: only == and != take a .* suffix")
        return _prefix_match(version, target[:-2]) == (op == "==")
    spec = parse(target)
    if spec.local is not None and op not in ("==", "!="):
        raise ValueError(f"{clause!r}: a local version (+...) goes only with == and !=")
    if op == "~=":
        if len(spec.release) < 2:
            raise ValueError(f"{clause!r}: ~= needs at least two release numbers")
        prefix = ".".join(map(str, spec.release[:-1]))
        return version.public.key() >= spec.key() and _prefix_match(version, f"{spec.epoch}!{prefix}")
    if op in ("==", "!="):
        have = version if spec.local is not None else version.public
        return (have == spec) == (op == "==")
    public = version.public
    if op == "<=":
        return public <= spec
    if op == ">=":
        return spec <= public
    if op == "<":
        # A pre-release of the bound's own release is not below it, unless the bound is one.
        return public < spec and (spec.is_prerelease or not version.is_prerelease or version.base != spec.base)
    # ">": neither a post-release nor a local version of the bound is above it, unless the bound is one.
    if not spec < public:
        return False
    if spec.post is None and version.post is not None and version.base == spec.base:
        return False
    return not (version.local is not None and public.base == spec.base and public == spec)


def in_range(version: str, specifiers: str) -> bool:
    """Whether version satisfies a comma-separated specifier set, pre-releases allowed."""
    parsed = parse(version)
    return all(_holds(parsed, version, clause.strip()) for clause in specifiers.split(",") if clause.strip())


def major_minor(text: str) -> str:
    """'12.9.86' -> '12.9'."""
    return ".".join(text.split(".")[:2])


def version_key(text: str) -> tuple:
    """A sort key for version strings (driver and CUDA releases)."""
    return parse(text).key()
