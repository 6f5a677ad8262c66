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
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # conda_prefix
from conda_prefix import MARKER, TOOLKIT_FIX, build, environment, toolkit_problem  # noqa: E402
from fidev.core.failure import ArgumentParser, Failure, option, run_main, usage  # noqa: E402
from fidev.core.files import not_a_folder, user_path  # noqa: E402
from fidev.jit import activation  # noqa: E402


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
        parser.error(
            usage("the command after -- is empty", "name a program on the PATH, or a path to an executable file")
        )
    prefix = lay_out(args.prefix, args.toolkit)
    env = environment(prefix, dict(os.environ), args.cuda_home_only)
    if args.print_env or not command:
        for name in ("CONDA_PREFIX", "PATH", *activation.manifest_env()):
            if name in env:  # a shell word (shlex.quote): `eval` runs nothing of a path's $(...), quotes or `
                print(f"export {name}={shlex.quote(env[name])}")
        return 0
    try:
        return subprocess.run(command, env=env).returncode
    except OSError as e:  # no such program, or not executable: said, as a shell would
        raise Failure(
            f"cannot run {command[0]!r} in the prefix: {e.strerror or e}",
            "name a program on the PATH, or a path to an executable file, after --",
        ) from None


if __name__ == "__main__":
    sys.exit(run_main(main))
