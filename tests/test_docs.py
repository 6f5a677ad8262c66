"""The docs' relative links resolve: every `[text](target)` in README.md and docs/*.md that is not
a URL names a file of the workspace and, with `#anchor`, a heading of that file (GitHub's anchors:
lowercase, punctuation dropped, spaces to hyphens, a repeated heading numbered -1, -2, ...)."""

import re

import pytest

from fidev.core.manifest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for line in re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    # fenced blocks hold no links; a link's text may hold inline code
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return [m.group(1) for m in LINK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_the_checker_catches_what_it_should(tmp_path):
    page = tmp_path / "a.md"
    page.write_text(
        "# The chain: build, smoke (and import-check)\n## FlashInfer's own tests\n## x\n## x\n"
        "[ok](#the-chain-build-smoke-and-import-check) [ok](#flashinfers-own-tests) [ok](#x-1)\n"
        "[gone](b.md) [bad](#nope) [`code` in text](a.md#x)\n```\n[not a link](c.md)\n```\n"
    )
    assert links(page) == [
        "#the-chain-build-smoke-and-import-check",
        "#flashinfers-own-tests",
        "#x-1",
        "b.md",
        "#nope",
        "a.md#x",
    ]
    assert {"the-chain-build-smoke-and-import-check", "flashinfers-own-tests", "x", "x-1"} <= anchors(page)


CITED = re.compile(r'docs/([\w-]+\.md)(?:,? \\?"([^"\\]+)\\?")?')


def test_every_doc_the_code_points_to_has_the_section_it_names():
    """A pointer in code, a comment or a fix line (`docs/X.md, "Section"`) names a page that exists
    and a heading on it: the guide was split into pages, and a pointer left behind sends a reader nowhere."""
    files = [
        p
        for p in (
            *ROOT.glob("scripts/**/*.py"),
            *ROOT.glob("tools/*.py"),
            *ROOT.glob("tests/**/*.py"),
            ROOT / "pyproject.toml",
            ROOT / ".ci/run",
            ROOT / ".ci/requirements.txt",
        )
        if p.is_file() and p.name != "test_docs.py"
    ]
    stale = []
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for page, section in CITED.findall(line):
                doc = ROOT / "docs" / page
                headings = (
                    [h.lstrip("#").strip() for h in doc.read_text().splitlines() if h.startswith("#")]
                    if doc.is_file()
                    else []
                )
                if not doc.is_file() or (section and not any(section in h for h in headings)):
                    stale.append(f"{path.relative_to(ROOT)}:{n}: docs/{page}" + (f', "{section}"' if section else ""))
    assert stale == [], stale
