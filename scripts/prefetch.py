"""Download the wheels a Cargo.toml pins into the Rust bindings crate's cache, so that the crate's first run \
on this host needs no network.

Reads [package.metadata.flashinfer_rs.pinned_wheels.<name>.<cuda>.<arch>] from PINS (the
crate's Cargo.toml, or what the `pin` task printed) and fills
$FLASHINFER_RS_CACHE_DIR/wheels/<sha256>-<filename> (default ~/.cache/flashinfer-rs). A wheel is
renamed into place only once its SHA-256 matches the pin; a failed run leaves no wheel and no
temporary file (at most the crate's empty lock file, which the crate keeps too).
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import argparse
import platform
import sys
from pathlib import Path

from fidev.bindings import cargo_pins, wheel_cache
from fidev.core import numbers
from fidev.core.failure import ArgumentParser, Failure, option, run_main
from fidev.core.files import not_a_folder, read_input, user_path
from fidev.core.manifest import cuda_release, cuda_tag, no_bom, toml_document


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def cuda_key(text: str) -> str:
    """'all', or a CUDA release in either spelling (12.9, cu129) as the crate's key, cu129."""
    return text if text == "all" else cuda_tag(cuda_release(text))


class Lines:
    """prefetch's output. Its first line names the cache folder, and goes out with the first line
    about a wheel: each of those comes once the cache took a file (a lock, a download, a wheel it
    holds), so no line says wheels go into a folder that turns out unusable."""

    def __init__(self, header: str):
        self.header = header

    def say(self, line: str) -> None:
        if self.header:
            print(self.header)
            self.header = ""
        print(line, flush=True)

    def waiting(self, filename):
        return lambda: self.say(f"  {filename}: waiting for another process that holds its lock")

    def progress(self, filename):
        return lambda done, total: self.say(
            f"  {filename}: {done / 1e6:.0f}{f' of {total / 1e6:.0f}' if total else ''} MB"
        )


def parse_args() -> argparse.Namespace:
    """The command line: PINS and which of its pins to fetch, and from where."""
    parser = ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "pins", metavar="PINS", type=option(user_path), help="Cargo.toml (or any TOML) holding the pinned_wheels table"
    )
    parser.add_argument(
        "--arch",
        default=host_arch(),
        choices=[*cargo_pins.ARCHES, "all"],
        help="arch key to fetch (default: this host's)",
    )
    parser.add_argument(
        "--cuda", default="all", type=option(cuda_key), help="CUDA key to fetch: 12.9 or cu129 (default: all)"
    )
    parser.add_argument(
        "--from",
        dest="seed",
        metavar="DIR",
        type=option(user_path),
        help="copy the wheels from DIR (an offline host) instead of downloading them",
    )
    parser.add_argument(
        "--timeout",
        type=option(numbers.decimal_number(example="--timeout 60")),
        default=60,
        help="give up on a download that sends nothing for this long (default 60 s)",
    )
    return parser.parse_args()


def chosen_pins(path: Path, arch: str, cuda: str) -> list[cargo_pins.Pin]:
    """The pins of PINS (`path`) for `arch` and `cuda` ('all': every one), or the two lines of why there are
    none, or of a chosen pin whose URL can never download its wheel (cargo_pins.downloadable)."""
    try:
        document = toml_document(no_bom(read_input(path), str(path)))
    except (OSError, ValueError) as e:  # no regular file (a FIFO, /dev/zero), not UTF-8, not TOML
        raise Failure(
            f"cannot read {path}: {e}", "name the bindings crate's Cargo.toml, or a file with the `pin` task's output"
        ) from e
    except RecursionError:
        raise Failure(
            f"cannot read {path}: it nests its tables or arrays too deeply",
            "name the bindings crate's Cargo.toml, or a file with the `pin` task's output",
        ) from None
    every = cargo_pins.read_pins(document, str(path))
    chosen = [p for p in every if arch in ("all", p.arch) and cuda in ("all", p.cuda)]
    if not chosen:
        keys = sorted({f"{p.cuda}.{p.arch}" for p in every})
        raise Failure(
            f"{path} pins nothing for cuda {cuda}, arch {arch} (it has {', '.join(keys) or 'no entries'})",
            "pick one it has with --cuda/--arch (or 'all')",
        )
    for pin in chosen:  # a pin written by hand: pin's rules for a URL, before anything is downloaded
        cargo_pins.downloadable(pin, str(path))
    return chosen


def main() -> int:
    args = parse_args()
    seed = args.seed.expanduser() if args.seed else None
    if seed is not None and (why := not_a_folder(seed)):  # a FIFO or /dev/null exists: it is said for what it is
        raise Failure(f"--from {seed} {why}", "name the folder the pinned wheels were copied into")
    path = args.pins.expanduser()
    chosen = chosen_pins(path, args.arch, args.cuda)
    by_wheel = {}  # one wheel may serve several keys (tvm-ffi under every CUDA key): fetch it once
    for p in chosen:
        by_wheel.setdefault((p.sha256, p.filename), []).append(p)
    root = wheel_cache.cache_dir()
    out = Lines(f"prefetch: {len(by_wheel)} wheel{'s' * (len(by_wheel) != 1)} into {root / 'wheels'}")
    for pin, *others in by_wheel.values():
        keys = ", ".join(f"{p.name}.{p.cuda}.{p.arch}" for p in (pin, *others))
        outcome = wheel_cache.ensure(
            pin,
            root,
            seed,
            timeout=args.timeout,
            waiting=out.waiting(pin.filename),
            progress=out.progress(pin.filename),
        )
        rate = (
            f", {outcome.size / 1e6 / outcome.seconds:.0f} MB/s"
            if outcome.state != "cached" and outcome.seconds > 0
            else ""
        )
        out.say(
            f"  {outcome.state:10} {pin.filename}  "
            f"({outcome.size / 1e6:.1f} MB in {outcome.seconds:.1f} s{rate}; {keys})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
