"""fidev.tree.release_reference: which files of the vendored tree differ from the pinned release, for a
git checkout (against the pinned commit) and for the source release (against the hashes recorded
when it was unpacked), and two lines for a tree that matches neither."""

import dataclasses
import os
import shutil
import subprocess

import pytest

from fidev.core.failure import Failure
from fidev.core.manifest import pins
from fidev.tree import release_reference, source_tree


def tree_files(tree):
    (tree / "include/flashinfer").mkdir(parents=True)
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 1;\n")
    (tree / "csrc").mkdir()
    (tree / "csrc/norm.cu").write_text("int f();\n")
    (tree / "flashinfer/jit").mkdir(parents=True)
    (tree / "flashinfer/jit/activation.py").write_text("# generator\n")


def test_the_release_is_told_by_its_recorded_hashes(tmp_path):
    tree = tmp_path / "tree"
    tree_files(tree)
    (tree / source_tree.MARKER).write_text(source_tree.marker_text(pins()))
    release_reference.record_release(tree)
    p = dataclasses.replace(pins(), source_dir=tree)
    assert release_reference.edited_files(tree, p) == []
    header = tree / "include/flashinfer/norm.cuh"
    os.utime(header, ns=(header.stat().st_mtime_ns + 10**9,) * 2)  # touched, same content: no edit
    (tree / "flashinfer/__pycache__").mkdir()
    (tree / "flashinfer/__pycache__/x.pyc").write_bytes(b"\0")  # what importing it leaves: no edit
    (tree / "flashinfer/data").mkdir()
    (tree / "flashinfer/data/include").symlink_to(tree / "include")  # the editable install's links: no edit
    assert release_reference.edited_files(tree, p) == []
    header.write_text("constexpr int K = 2;\n")
    (tree / "csrc/new.cu").write_text("\n")
    (tree / "flashinfer/jit/activation.py").unlink()
    assert release_reference.edited_files(tree, p) == [
        "csrc/new.cu",
        "flashinfer/jit/activation.py",
        "include/flashinfer/norm.cuh",
    ]


@pytest.mark.skipif(not shutil.which("git"), reason="needs git")
def test_a_checkout_is_told_against_the_pinned_commit(tmp_path):
    tree = tmp_path / "tree"
    tree_files(tree)
    git = ["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "release"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    p = dataclasses.replace(pins(), source_dir=tree, source_commit=head)
    assert release_reference.edited_files(tree, p) == []
    (tree / "include/flashinfer/norm.cuh").write_text("constexpr int K = 2;\n")
    (tree / "csrc/new.cu").write_text("\n")
    assert release_reference.edited_files(tree, p) == ["csrc/new.cu", "include/flashinfer/norm.cuh"]
    subprocess.run(
        [*git, "commit", "-qam", "a contributor's commit"], check=True
    )  # HEAD moves on: its edits are still edits
    (tree / "csrc/norm.cu").write_text("int g();\n")
    assert release_reference.edited_files(tree, p) == ["csrc/new.cu", "csrc/norm.cu", "include/flashinfer/norm.cuh"]
    subprocess.run(
        [*git, "mv", "include/flashinfer/norm.cuh", "include/flashinfer/norm2.cuh"], check=True
    )  # a rename: both names
    assert release_reference.edited_files(tree, p) == [
        "csrc/new.cu",
        "csrc/norm.cu",
        "include/flashinfer/norm.cuh",
        "include/flashinfer/norm2.cuh",
    ]
    with pytest.raises(Failure, match="does not have the pinned commit"):
        release_reference.edited_files(tree, dataclasses.replace(p, source_commit="0" * 40))
    env_path = os.environ["PATH"]
    try:
        os.environ["PATH"] = str(tmp_path / "no-git-here")
        with pytest.raises(Failure, match="git could not answer"):
            release_reference.edited_files(tree, p)
    finally:
        os.environ["PATH"] = env_path


def test_a_tree_that_matches_neither_is_two_lines(tmp_path):
    tree = tmp_path / "tree"
    tree_files(tree)
    with pytest.raises(Failure, match="neither the pinned commit's checkout nor the pinned release") as refused:
        release_reference.edited_files(tree, dataclasses.replace(pins(), source_dir=tree))
    assert "fetch_flashinfer_source.py --replace" in refused.value.fix
    (tree / source_tree.MARKER).write_text(
        source_tree.marker_text(pins())
    )  # the release, unpacked before records were kept
    with pytest.raises(Failure, match="without its file record"):
        release_reference.edited_files(tree, dataclasses.replace(pins(), source_dir=tree))
