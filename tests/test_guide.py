"""The onboarding guide's (docs/flashinfer-dev.md) promises that a reader acts on: what the PyPI source
release lacks beside the submodule, which environments the manifest has, and what faults.md holds."""

import re

from fidev.core.manifest import ROOT, load_manifest

GUIDE = " ".join((ROOT / "docs/flashinfer-dev.md").read_text().split())  # its prose, one space between words
INTRO = GUIDE[: GUIDE.index("## Prerequisites")]
SOURCE = GUIDE[GUIDE.index("git submodule update") : GUIDE.index("## Installing")]  # getting the source


def the_sentence(text: str, *words: str) -> str:
    """The one sentence of `text` that holds each of `words`."""
    found = [s for s in re.split(r"(?<=\.) (?=[A-Z`])", text) if all(w in s for w in words)]
    assert len(found) == 1, f"the guide has {len(found)} sentence(s) with {words}, not one: {found}"
    return found[0]


def test_it_says_the_pypi_release_lacks_flashinfers_tests_so_upstream_tests_and_affecteds_sample_cannot_run():
    """The package index's release is the same v0.6.3, but without tests/ (its conftest.py) and
    pytest.ini: upstream-tests and affected's FlashInfer sample cannot run on that tree."""
    said = the_sentence(SOURCE, "package index's release")
    for lacked in ("`tests/`", "`conftest.py`", "`pytest.ini`"):
        assert lacked in said, f"the guide no longer says the PyPI release lacks {lacked}: {said}"
    assert re.search(r"\b(neither|lacks|has no|without)\b", said), said
    assert "`upstream-tests` and the FlashInfer sample of `affected` cannot run on that tree" in said, said
    assert "never a pass" in SOURCE


def test_it_names_every_environment_of_the_manifest():
    """The manifest's environments (pixi's `default` is one, declared or not), each named in the guide's
    opening, where it says what the manifest holds."""
    environments = {"default", *load_manifest()["tool"]["pixi"]["environments"]}
    assert len(environments) >= 3, environments  # default, codex-build, flashinfer-dev
    missing = sorted(name for name in environments if f"`{name}`" not in INTRO)
    assert not missing, f"the guide's opening does not name the environment(s) {missing}"


def test_it_does_not_claim_faults_md_holds_every_error_line():
    """faults.md lists the error lines a step of the chain most often prints, not every one a script
    may print: the guide says so, and no clause of it that points to faults.md claims all of them."""
    said = the_sentence(GUIDE, "`error:` line", "faults.md")
    for clause in (c for c in said.split(";") if "faults.md" in c):
        assert not re.search(r"\b(every|all|each|any|whole|complete)\b", clause, re.IGNORECASE), said
    assert "lists the ones a step of the chain most often prints" in said, said
