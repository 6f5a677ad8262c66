"""Materialize the pinned FlashInfer source release into extern/tracked/flashinfer.

For hosts that cannot reach GitHub (so cannot `git submodule update`): it takes the PyPI
source release flashinfer_python-<pin>.tar.gz, which carries 3rdparty/cutlass and spdlog,
through `pip download` so that the user's index configuration (pip.conf, PIP_INDEX_URL,
proxies) applies, verifies its SHA-256 against the manifest, and unpacks it atomically.
Idempotent; never touches an initialized submodule.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from fidev.files import sha256_file
from fidev.manifest import pins
from fidev.ui import Failure, run_main

# Written inside a materialized tree; it says which archive the tree came from.
MARKER = ".materialized-from-sdist"
DOWNLOAD_TIMEOUT_S = 600


def download(release: str, into: Path) -> Path:
    """`pip download` the source release (no install: it only fetches the file)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=flashinfer-python",
           "--disable-pip-version-check", "-d", str(into), f"flashinfer-python=={release}"]
    fix = ("check the network and your index settings (`pip config list`), "
           "or pass --archive PATH to a copy of the release")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Failure(f"downloading flashinfer-python=={release} took over {DOWNLOAD_TIMEOUT_S} s", fix) from None
    archives = sorted(into.glob("*.tar.gz"))
    if done.returncode != 0 or not archives:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip() and not line.startswith("WARNING")]
        reason = lines[-1].strip() if lines else f"pip exited {done.returncode}"
        raise Failure(f"cannot download the flashinfer-python=={release} source release: {reason}", fix)
    return archives[0]


def unpack(archive: Path, dest: Path, marker_text: str) -> None:
    """Unpack into a sibling temp dir, then rename: an interrupted run leaves no half tree."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a run that was killed
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            raise Failure(f"cannot unpack {archive.name}: {e}", "re-download it; the copy is damaged or incomplete") from e
        tops = list(tmp.iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise Failure(f"{archive.name} does not hold one top-level folder", "use the unmodified sdist from PyPI")
        tree = tops[0]
        (tree / MARKER).write_text(marker_text)
        if dest.exists():
            dest.rmdir()  # the empty folder git leaves for an uninitialized submodule
        tree.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def materialize(dest: Path, release: str, sha256: str, archive: Path | None = None) -> str:
    """Return what was done; raise Failure when it cannot be done safely."""
    marker_text = f"flashinfer_python-{release}.tar.gz sha256={sha256}\n"
    if (dest / ".git").exists():
        raise Failure(f"{dest} is an initialized git submodule; refusing to overwrite it",
                      "use it as it is, or run `git submodule deinit -f <path>` first to replace it")
    marker = dest / MARKER
    if marker.is_file() and marker.read_text() == marker_text:
        return f"{dest} already holds flashinfer_python-{release}; nothing to do"
    if dest.exists() and any(dest.iterdir()):
        raise Failure(f"{dest} is not empty and is not the pinned release {release}",
                      "move it away (or delete it), then run this again")
    with tempfile.TemporaryDirectory() as scratch:
        path = archive if archive else download(release, Path(scratch))
        if not path.is_file():
            raise Failure(f"{path} does not exist", "pass --archive the path of the downloaded sdist")
        actual = sha256_file(path)
        if actual != sha256:
            raise Failure(f"{path.name} has sha256 {actual}, the manifest pins {sha256}",
                          "the file is not the pinned release: check the index or mirror serving it, or re-download")
        unpack(path, dest, marker_text)
    return f"materialized flashinfer_python-{release} into {dest}"


def main() -> int:
    p = pins()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, help=f"use this local {p.sdist_name} instead of downloading it")
    parser.add_argument("--dest", type=Path, default=p.source_dir, help="where to put the tree (default: %(default)s)")
    args = parser.parse_args()
    print(materialize(args.dest.resolve(), p.flashinfer, p.sdist_sha256, args.archive))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
