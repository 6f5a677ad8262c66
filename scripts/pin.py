"""Print the Cargo.toml blocks that pin wheels for the Rust bindings crate.

For each WHEEL file: `[package.metadata.flashinfer_rs.pinned_wheels.<name>.<cuda>.<arch>]` with its
filename, download URL and SHA-256, one block per arch it serves. The SHA-256 is computed from the
file; the URL is looked up on the index the manifest installs that package from (PyPI for a package
it names no index for), which must publish the same SHA-256. The TOML goes to stdout and notes to stderr, so
`pin WHEEL >> Cargo.toml` works. A wheel from the crate's cache (`<sha256>-<filename>`) is pinned
under its published filename.
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import argparse
import sys

from fidev.bindings import cargo_pins, wheel_cache
from fidev.core import package_index
from fidev.core.failure import USAGE, ArgumentParser, Failure, option, run_main
from fidev.core.files import not_a_file, user_path
from fidev.core.manifest import cuda_release, cuda_tag, package_indexes, pins


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("wheels", nargs="+", metavar="WHEEL", type=option(user_path), help="wheel files to pin")
    parser.add_argument(
        "--url",
        type=option(package_index.url),
        help="the wheel's download URL, ending in its file name (one wheel only; default: looked up on its index)",
    )
    parser.add_argument(
        "--index",
        type=option(package_index.url),
        help="the simple index to look the wheels up on (default: the one the manifest installs each from)",
    )
    parser.add_argument(
        "--cuda",
        type=option(cuda_release),
        help=f"CUDA key for wheels whose version names none: 12.9 or cu129 (default: the manifest's, {pins().cuda})",
    )
    args = parser.parse_args()
    args.wheels = list(
        dict.fromkeys(args.wheels)
    )  # a wheel named twice is pinned once (its table written twice is no TOML)
    if args.url and len(args.wheels) > 1:
        raise Failure(
            "--url names one wheel's URL, but several wheels were given", "pin them one at a time", exit_status=USAGE
        )
    cuda = cuda_tag(args.cuda or pins().cuda)
    blocks = []
    for path in args.wheels:
        path = path.expanduser()
        if why := not_a_file(path):  # missing, a folder, a FIFO or a device: said for what it is
            raise Failure(f"{path} {why}", "download the wheel, then pass its path")
        if path.suffix != ".whl":
            raise Failure(f"{path} is not a wheel file", "download the wheel, then pass its path")
        cached_sha, filename = wheel_cache.split_cached_name(path.name)
        wheel = cargo_pins.parse_wheel_filename(filename)
        if args.cuda and wheel.cuda and wheel.cuda != cuda:
            raise Failure(f"{filename} is built for {wheel.cuda}, not {cuda}", f"drop --cuda, or pin the {cuda} wheel")
        found = cargo_pins.pins_for(
            path, filename, cuda, args.index or cargo_pins.index_for(wheel, package_indexes()), args.url
        )
        if cached_sha and cached_sha != found[0].sha256:
            raise Failure(
                f"{path.name}: its cache name says sha256 {cached_sha}, the file has {found[0].sha256}",
                "the cached copy is damaged: run prefetch again, or pin the downloaded wheel",
            )
        print(f"pin: {filename}: sha256 {found[0].sha256}, {found[0].url}", file=sys.stderr)
        blocks += found
    print(cargo_pins.pin_toml(blocks), end="")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
