"""The docs' relative links resolve: every `[text](target)` in README.md and docs/*.md that is not
a URL names a file of the workspace and, with `#anchor`, a heading of that file (GitHub's anchors:
lowercase, punctuation dropped, spaces to hyphens, a repeated heading numbered -1, -2, ...)."""

import re
from pathlib import Path

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


MEASURED = re.compile(r'measurements\.md\)?,? rows? ((?:\\?"[^"\\]+\\?"(?:,? and |, )?)+)')


def test_every_row_of_measurements_that_code_or_docs_point_to_is_there():
    """A pointer to a measure (docs/measurements.md, then row or rows and each row's name in double quotes) names
    the first cell of a row of measurements.md's table (or its start, before a parenthesis): a row renamed leaves
    the pointer sending its reader nowhere. Wrapped lines are read joined, a comment's `#` dropped."""
    table = (ROOT / "docs/measurements.md").read_text().splitlines()
    rows = {line.split("|")[1].strip() for line in table if line.startswith("| ") and not line.startswith("| ---")}
    named = {row.split(" (")[0] for row in rows} | rows
    files = [*ROOT.glob("scripts/**/*.py"), *ROOT.glob("tools/*.py"), *ROOT.glob("tests/**/*.py")]
    files += [*ROOT.glob("docs/*.md"), ROOT / "README.md"]
    pointed, stale = 0, []
    for path in files:
        flat = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text())
        for names in MEASURED.findall(flat):
            for name in re.findall(r'"([^"\\]+)\\?"', names):
                pointed += 1
                if name not in named:
                    stale.append(f"{path.relative_to(ROOT)}: {name}")
    assert pointed >= 20 and stale == [], stale


def said_exceptions() -> set[str]:
    """The variables faults.md says an empty value is not unset for: each `NAME=` of its list."""
    text = (ROOT / "docs/faults.md").read_text()
    start = text.index("An empty environment variable counts as unset")
    return set(re.findall(r"^- `([A-Z_]+)=`", text[start : text.index("| id |", start)], flags=re.M))


def empty_is_not_unset(monkeypatch, tmp_path) -> dict[str, bool]:
    """For each variable faults.md excepts, whether the code does take an empty value otherwise than unset."""
    from fidev.builds import build_stamp
    from fidev.core import workspace
    from fidev.jit import compile_cache, kernel_source
    from fidev.upstream import runs

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(build_stamp, "_gpu_uuids", lambda: None)  # no driver: the arch list alone decides
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "")
    arch_list_set = build_stamp.fingerprint({}, tmp_path, kernel_source.VENDORED) is not None
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST")
    return {
        "FLASHINFER_WORKSPACE_BASE": workspace.base({"FLASHINFER_WORKSPACE_BASE": ""}) == Path("."),
        "FLASHINFER_NVCC": compile_cache.check({compile_cache.VARIABLE: ""})[0] == "fail",
        "CUDA_VISIBLE_DEVICES": runs.host_gpus() == [],
        "FLASHINFER_CUDA_ARCH_LIST": arch_list_set
        and build_stamp.fingerprint({}, tmp_path, kernel_source.VENDORED) is None,
    }


def empty_is_unset(monkeypatch) -> dict[str, bool]:
    """Some of the other variables the scripts read: an empty value is the unset one."""
    from fidev.bindings import wheel_cache
    from fidev.jit import jit_toolchain, kernel_source
    from fidev.upstream import settings, suite

    for name in ("FLASHINFER_DEV_KERNEL_SOURCE", "FLASHINFER_RS_CACHE_DIR", "PYTHONPATH"):
        monkeypatch.setenv(name, "")
    return {
        "FLASHINFER_DEV_KERNEL_SOURCE": kernel_source.mode() == kernel_source.AUTO,
        "FLASHINFER_RS_CACHE_DIR": wheel_cache.cache_dir() == Path.home() / ".cache" / "flashinfer-rs",
        "PYTHONPATH": suite.scripts_path() == str(ROOT / "scripts"),
        "CUDA_HOME": jit_toolchain.cuda_home({"CUDA_HOME": "", "CUDA_PATH": "/opt/cuda"})
        == (Path("/opt/cuda"), "CUDA_PATH"),
        "FIDEV_UPSTREAM_*": settings.Settings.read({v: "" for v in settings.VARIABLES.values()}) == settings.Settings(),
    }


def test_an_empty_variable_is_what_faults_md_says(monkeypatch, tmp_path):
    """faults.md: an empty variable counts as unset, but for the few it lists, where FlashInfer or CUDA
    read it otherwise: the list is exactly the exceptions checked here, and the code does as it says."""
    excepted = empty_is_not_unset(monkeypatch, tmp_path)
    assert said_exceptions() == set(excepted)
    assert [name for name, holds in excepted.items() if not holds] == []
    assert [name for name, holds in empty_is_unset(monkeypatch).items() if not holds] == []
