"""Lay out a prefix the way conda's CUDA 12.x packages lay out a Pixi environment
(tests/support/conda_prefix.py), and run a command in it with the manifest's activation applied.

  python tools/conda_layout.py PREFIX [--toolkit /usr/local/cuda] [--cuda-home-only] -- CMD [ARG...]
  python tools/conda_layout.py PREFIX --print-env

Without --toolkit the files are empty (enough for path checks). The command runs with the host
toolkit taken off PATH, LIBRARY_PATH and the compiler path variables unset, CONDA_PREFIX set, and
the manifest's activation env applied (only CUDA_HOME=$CONDA_PREFIX with --cuda-home-only).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # conda_prefix
from conda_prefix import MARKER, TOOLKIT_FIX, build, environment, toolkit_problem  # noqa: E402
from fidev.core.failure import ArgumentParser, Failure, option, run_main, usage  # noqa: E402
from fidev.core.files import missing_folders, not_a_file, not_a_folder, remove_empty, user_path  # noqa: E402
from fidev.jit import activation, compile_cache  # noqa: E402


def lay_out(prefix: Path, toolkit: Path | None) -> Path:
    """The prefix laid out (tests/support/conda_prefix.build), or two lines where it cannot be."""
    if prefix.is_symlink() and not prefix.exists():
        raise Failure(
            f"{prefix} is a symbolic link to nothing", "name the folder itself, or a path where one can be made"
        )
    if prefix.exists() and (why := not_a_folder(prefix)):
        raise Failure(f"{prefix} {why}", "name a folder (made where missing)")
    if prefix.is_dir() and not (prefix / MARKER).is_file() and any(prefix.iterdir()):
        raise Failure(
            f"{prefix} holds files and is no replica this tool laid out (no {MARKER}): it lays one out only into "
            "an empty folder or a new path, and changes nothing there",
            "name an empty folder or a path where nothing is yet",
        )
    if toolkit is not None and (why := toolkit_problem(toolkit)):  # before the prefix is made: the toolkit is at fault
        raise Failure(f"--toolkit {toolkit} {why}", TOOLKIT_FIX)
    try:
        return build(prefix.resolve(), toolkit)
    except OSError as e:
        raise Failure(
            f"cannot lay out {prefix}: {e.strerror or e}",
            "name a folder you can write, whose name leaves room for a scratch folder beside it (under 240 bytes)",
        ) from None


RUN_FIX = "name a program on the PATH, or a path to an executable file, after --"


def command_problem(program: str, path: str, toolkit: Path | None) -> str | None:
    """Why `program`, the command's first word, cannot be run in the prefix, as said after its name: checked
    before the prefix is laid out, on the PATH the command will run with (`path`) and among the programs the
    layout puts in its bin/ (nvcc, ccache, a toolkit's bin/); None where it can be."""
    if "/" in program:
        if why := not_a_file(program):
            return why
        return None if os.access(program, os.X_OK) else "is not executable"
    laid_out = {"nvcc", compile_cache.LAUNCHER}
    if toolkit is not None and (toolkit / "bin").is_dir():
        laid_out |= {entry.name for entry in (toolkit / "bin").iterdir()}
    return None if program in laid_out or shutil.which(program, path=path) else "is no program on the PATH"


def take_back(prefix: Path, made: list[Path]) -> None:
    """The prefix this run laid out, removed, and the folders made for it (files.missing_folders of the path
    given, the prefix's own first); where it was an empty folder before (`made` empty), it is left empty."""
    shutil.rmtree(prefix, ignore_errors=True)
    if made:
        remove_empty(made[1:])
    else:
        prefix.mkdir(exist_ok=True)


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("prefix", type=option(user_path), help="the prefix to lay out (made where missing)")
    parser.add_argument(
        "--toolkit", type=option(user_path), help="a host CUDA toolkit to take the files from (default: empty files)"
    )
    parser.add_argument(
        "--cuda-home-only",
        action="store_true",
        help="apply only CUDA_HOME=$CONDA_PREFIX, not the manifest's activation",
    )
    parser.add_argument("--print-env", action="store_true", help="print what the activation sets, as shell exports")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if command and not command[0].strip():  # before the prefix is laid out
        parser.error(usage("the command after -- is empty", RUN_FIX))
    prefix = Path(os.path.abspath(args.prefix))
    env = environment(prefix.resolve(), dict(os.environ), args.cuda_home_only)
    if command and (why := command_problem(command[0], env.get("PATH", ""), args.toolkit)):
        raise Failure(f"cannot run {command[0]!r} in the prefix: it {why}", RUN_FIX)  # nothing laid out yet
    fresh, made = not (prefix / MARKER).is_file(), missing_folders(prefix)  # a replica there already is kept
    prefix = lay_out(args.prefix, args.toolkit)
    if args.print_env or not command:
        for name in ("CONDA_PREFIX", "PATH", *activation.manifest_env()):
            if name in env:  # a shell word (shlex.quote): `eval` runs nothing of a path's $(...), quotes or `
                print(f"export {name}={shlex.quote(env[name])}")
        return 0
    try:
        return subprocess.run(command, env=env).returncode
    except OSError as e:  # no such program, or not executable, after all: said, as a shell would
        if fresh:
            take_back(prefix, made)
        raise Failure(f"cannot run {command[0]!r} in the prefix: {e.strerror or e}", RUN_FIX) from None


if __name__ == "__main__":
    sys.exit(run_main(main))
