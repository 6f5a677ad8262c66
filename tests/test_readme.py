"""The README's promises next to its two commands: what runs when you edit a kernel, and the one
command that runs the tests without pixi."""

import os
import re

from fidev.core.manifest import ROOT
from fidev.jit import kernel_source

README = (ROOT / "README.md").read_text()
COMMANDS = README[README.index("## The two commands") :]


def test_it_says_what_runs_when_a_kernel_is_edited(monkeypatch):
    monkeypatch.delenv(kernel_source.ENV, raising=False)
    assert kernel_source.mode() == kernel_source.AUTO, (
        "the default kernel source changed: say so in the README's note on edits"
    )
    assert "by default (`auto`), a module whose inputs you edited" in COMMANDS
    for mode in (kernel_source.VENDORED, kernel_source.PREBUILT):
        assert f"`{kernel_source.ENV}={mode}`" in COMMANDS


def test_it_names_the_command_that_runs_the_tests_without_pixi():
    assert re.search(r"\*\*Without pixi:\*\* `bash \.ci/run`", COMMANDS)
    assert os.access(ROOT / ".ci/run", os.X_OK)
    assert 'task_command("test")' in (ROOT / ".ci/run").read_text(), ".ci/run must run the test task's own command"


def test_it_says_what_the_pypi_release_lacks_beside_the_submodule():
    """The fetch from PyPI is the same release, but without FlashInfer's tests: the README, which offers both,
    says what that costs, as the guide does."""
    text = " ".join(README.split())
    assert "lacks FlashInfer's `tests/` and `pytest.ini`" in text and "never a pass" in text
