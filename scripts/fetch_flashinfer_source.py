"""Materialize the pinned FlashInfer source release into the source folder (extern/tracked/flashinfer).

For hosts that cannot reach GitHub, so cannot `git submodule update`. It looks the PyPI source
release flashinfer_python-<pin>.tar.gz up where pip would (pip.conf, PIP_INDEX_URL, find-links,
proxy and cert settings, read through `pip config list`), downloads it itself, and checks its
SHA-256 against the manifest before anything is unpacked. Nothing in the release runs: pip is not
asked to download it, because for a source release pip would first run the release's own build
backend to read its metadata. The tree is unpacked beside the destination and renamed into place,
so an interrupted run leaves nothing half-written. Idempotent; never touches a git checkout.
Needs no pixi: any Python >= 3.10 runs it.
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import argparse
import sys

from fidev.core.failure import ArgumentParser, option, run_main
from fidev.core.files import user_path
from fidev.core.manifest import pins
from fidev.tree import source_tree
from fidev.tree.source_release import materialize


def main() -> int:
    p = pins()
    parser = ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--archive", type=option(user_path), help=f"use this local {p.sdist_name} instead of downloading it"
    )
    parser.add_argument(
        "--dest",
        type=option(user_path),
        default=str(p.source_dir),
        help=f"where to put the tree (default: {source_tree.shown(p.source_dir)})",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="replace a tree that is not the pinned release, keeping it as <dest>.replaced-<time>",
    )
    args = parser.parse_args()
    print(materialize(args.dest.absolute(), p, args.archive, args.replace))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
