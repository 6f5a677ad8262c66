"""fidev.core.versions (standard library only, for preflight) against `packaging`, which pip and uv
follow, over a grid of versions and specifier sets: pre-, post-, dev- and local versions, every
operator, and the wildcard forms."""

import itertools

import pytest

from script_runs import require

require("packaging", why="the reference fidev.core.versions is held to")
from packaging.specifiers import InvalidSpecifier, SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

from fidev.core.versions import in_range, parse  # noqa: E402

VERSIONS = [
    "0.1.5",
    "0.1.6",
    "0.1.7",
    "0.1.8",
    "0.1.8.post0",
    "0.1.8.post1",
    "0.1.9.post1",
    "0.2.0rc1",
    "0.2.0",
    "0.2.0.dev3",
    "0.2.0a1.dev2",
    "0.2.0b2",
    "0.2.0.post1.dev1",
    "0.2",
    "0.2.0+cu129",
    "0.2.0+local.7",
    "1!0.1",
    "2.8.0+cu129",
    "2.8.1",
    "2.8.0rc1",
    "12.9",
    "12.9.86",
    "13.0",
    "0.6.3",
    "0.6.3+cu129",
    "0.6.10",
    "1.0.0-1",
]
SPECIFIERS = [
    ">=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0",
    "~=0.1.7",
    "~=0.2.0",
    "~=2.8",
    "==0.2.*",
    "!=0.2.*",
    "==0.2.0",
    "==0.2.0+cu129",
    "<0.2.0",
    "<=0.2.0",
    ">0.2.0",
    ">=0.2.0rc1",
    "<0.2.0rc2",
    ">0.1.8",
    ">0.1.8.post0",
    "===0.6.3",
    "==2.8.*",
    "==12.9.*",
    ">=12.9",
    "!=0.6.3",
    ">0.6.3",
    "",
]


@pytest.mark.parametrize("spec", SPECIFIERS)
def test_in_range_agrees_with_packaging(spec):
    for version in VERSIONS:
        expected = SpecifierSet(spec).contains(version, prereleases=True)
        assert in_range(version, spec) == expected, (version, spec)


def test_ordering_agrees_with_packaging():
    for a, b in itertools.product(VERSIONS, repeat=2):
        assert (parse(a).key() < parse(b).key()) == (Version(a) < Version(b)), (a, b)
        assert (parse(a).key() == parse(b).key()) == (Version(a) == Version(b)), (a, b)


@pytest.mark.parametrize("bad", ["0.1.x", "", "latest"])
def test_not_a_version_is_a_value_error(bad):
    with pytest.raises(ValueError, match="not a PEP 440 version"):
        parse(bad)


@pytest.mark.parametrize("spec", ["0.1.6", "~=1", ">=0.1.*", "<0.6.3+cu129"])
def test_malformed_specifiers_are_value_errors(spec):
    with pytest.raises(InvalidSpecifier):
        SpecifierSet(spec)  # packaging refuses them too
    with pytest.raises(ValueError):
        in_range("0.1.7", spec)


def test_a_version_in_another_scripts_digits_is_no_pep_440_version():
    """PEP 440's digits are 0-9: '١٢.٩' (Arabic-Indic) is refused, not read as 12.9."""
    with pytest.raises(ValueError, match="is not a PEP 440 version"):
        parse("١٢.٩")
