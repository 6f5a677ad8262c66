"""The source materializer, against fixture archives built here (no network but loopback)."""

import dataclasses
import hashlib
import io
import os
import tarfile

import pytest

from fidev.core.failure import Failure
from fidev.core.manifest import pins
from fidev.tree.source_release import materialize
from fidev.tree.source_tree import MARKER
from script_runs import run

RELEASE = pins().flashinfer


def pinned(sha):
    """The manifest's pins, with a fixture archive's SHA-256 in place of the real release's."""
    return dataclasses.replace(pins(), sdist_sha256=sha)


def make_archive(path, files=None):
    files = files or {
        "version.txt": RELEASE,
        "csrc/norm.cu": "// kernel",
        "include/flashinfer/norm.cuh": "",
        "3rdparty/cutlass/include/c.h": "",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"flashinfer_python-{RELEASE}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def archive(tmp_path):
    return make_archive(tmp_path / f"flashinfer_python-{RELEASE}.tar.gz")


def test_good_hash_materializes_the_tree(tmp_path, archive):
    path, sha = archive
    dest = tmp_path / "extern" / "flashinfer"
    dest.mkdir(parents=True)  # the empty folder of an uninitialized submodule
    assert "materialized" in materialize(dest, pinned(sha), path)
    assert (dest / "version.txt").read_text() == RELEASE
    assert (dest / "3rdparty/cutlass/include/c.h").exists()
    assert sha in (dest / MARKER).read_text()
    assert [p.name for p in dest.parent.iterdir()] == ["flashinfer"]  # no temp dir left


def test_bad_hash_is_refused_and_writes_nothing(tmp_path, archive):
    path, _ = archive
    dest = tmp_path / "flashinfer"
    with pytest.raises(Failure, match="sha256"):
        materialize(dest, pinned("0" * 64), path)
    assert not dest.exists()


def test_interrupted_unpack_leaves_no_half_tree(tmp_path, archive):
    path, _ = archive
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    dest = tmp_path / "out" / "flashinfer"
    dest.mkdir(parents=True)
    with pytest.raises(Failure, match="cannot unpack"):
        materialize(dest, pinned(hashlib.sha256(truncated.read_bytes()).hexdigest()), truncated)
    assert dest.is_dir() and not any(dest.iterdir())
    assert [p.name for p in dest.parent.iterdir()] == ["flashinfer"]


def test_stale_partial_dir_from_a_killed_run_is_removed(tmp_path, archive):
    path, sha = archive
    stale = tmp_path / ".flashinfer.partial-dead"
    (stale / "csrc").mkdir(parents=True)
    materialize(tmp_path / "flashinfer", pinned(sha), path)
    assert not stale.exists()


def test_second_run_is_a_no_op(tmp_path, archive):
    path, sha = archive
    dest = tmp_path / "flashinfer"
    materialize(dest, pinned(sha), path)
    before = {p: p.stat().st_mtime_ns for p in dest.rglob("*")}
    path.unlink()  # a no-op needs neither the archive nor the network
    assert "nothing to do" in materialize(dest, pinned(sha), None)
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*")} == before


def test_a_release_whose_record_cannot_be_read_is_unpacked_again_by_replace_and_no_other_way(tmp_path, archive):
    """affected and planted_bugs tell edits by the release's record of its files: where it cannot be read, their fix
    is --replace, which must unpack the release again (the tree kept beside it), not say "nothing to do"."""
    from fidev.tree import release_reference

    path, sha = archive
    dest = tmp_path / "flashinfer"
    materialize(dest, pinned(sha), path)
    (dest / "csrc/norm.cu").write_text("// my edit")
    (dest / release_reference.RELEASE_FILES).write_text("[]")
    with pytest.raises(Failure, match="cannot be read") as refused:
        release_reference.edited_files(dest, pinned(sha))
    assert "--replace unpacks the release again" in refused.value.fix
    with pytest.raises(Failure, match=r"holds the pinned release, whose record of its files .* cannot be read"):
        materialize(dest, pinned(sha), path)
    assert "materialized" in materialize(dest, pinned(sha), path, replace=True)
    assert release_reference.edited_files(dest, pinned(sha)) == []
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("flashinfer.replaced-")]
    assert len(kept) == 1 and (kept[0] / "csrc/norm.cu").read_text() == "// my edit"


def test_initialized_submodule_is_left_alone(tmp_path, archive):
    path, sha = archive
    dest = tmp_path / "flashinfer"
    dest.mkdir()
    (dest / ".git").write_text("gitdir: ../../.git/modules/flashinfer\n")
    (dest / "README.md").write_text("mine")
    with pytest.raises(Failure, match="is a git checkout"):
        materialize(dest, pinned(sha), path)
    assert (dest / "README.md").read_text() == "mine"


def test_foreign_tree_is_not_overwritten(tmp_path, archive):
    path, sha = archive
    dest = tmp_path / "flashinfer"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep")
    with pytest.raises(Failure, match="not a FlashInfer tree"):
        materialize(dest, pinned(sha), path)
    assert (dest / "notes.txt").read_text() == "keep"


def run_script(*args, env=None):
    return run("fetch_flashinfer_source.py", *args, env=env)


def test_cli_reports_a_hash_mismatch_in_two_lines(tmp_path, archive):
    path, _ = archive  # the fixture is not the pinned release, so its hash must be refused
    done = run_script("--archive", str(path), "--dest", str(tmp_path / "flashinfer"))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "sha256" in lines[0] and lines[1].lstrip().startswith("fix:")
    assert not (tmp_path / "flashinfer").exists()


def test_an_index_without_the_project_is_tried_not_unreachable(tmp_path, index_server):
    # A 404 project page means "not on this index", as pip reads it: the message names the page tried.
    env = {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": f"{index_server.url}/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
    }
    done = run("fetch_flashinfer_source.py", "--dest", tmp_path / "fi", env=env)
    assert done.returncode == 1, done.stderr
    assert f"is on none of the indexes pip uses (tried {index_server.url}/simple/flashinfer-python/)" in done.stderr, (
        done.stderr
    )


@pytest.mark.parametrize("replacing", [False, True], ids=["new", "--replace"])
def test_a_dest_whose_name_leaves_no_room_for_the_names_made_beside_it_is_refused_first(tmp_path, archive, replacing):
    """A --dest name within 255 bytes whose lock, unpack folder or (with --replace over a tree) kept old tree
    would not be: two lines naming --dest and its room, before anything is written beside it."""
    path, sha = archive
    dest = tmp_path / "out" / ("é" * (118 if replacing else 122))  # 236 or 244 bytes: the names beside pass 255
    if replacing:  # another release there
        (dest / "csrc").mkdir(parents=True)
        (dest / "version.txt").write_text("0.0.1")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(Failure, match="past the file system's limit of 255") as refused:
        materialize(dest, pinned(sha), path, replace=replacing)
    assert refused.value.problem.startswith("--dest ") and "at most" in refused.value.fix
    assert sorted(tmp_path.rglob("*")) == before
