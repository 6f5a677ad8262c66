"""Report every function a FlashInfer source tree exports through TVM-FFI, with its C++ signature.

  abi [SOURCE] [--match TEXT] [--json]
  abi --diff OLD NEW [--tvm-ffi OLD NEW] [--json]
  abi --tvm-ffi OLD NEW [--json]

SOURCE, OLD and NEW are FlashInfer source trees or source releases (flashinfer_python-X.tar.gz,
read without being unpacked or installed); SOURCE defaults to the vendored tree. For each
`TVM_FFI_DLL_EXPORT_TYPED_FUNC(name, fn)`: the exported symbol, the binding file and line, the
C++ function it binds with its parameters in order (type, Optional or not, default) and its return
type, and for attention modules the parameters FlashInfer appends per backend. --diff lists what
was added and removed and every changed signature, with file and line on both sides, and exits 1
when anything OLD exports was removed or changed. --tvm-ffi compares the TVMFFITypeIndex values of
two apache-tvm-ffi wheels or installed tvm_ffi folders, and exits 1 when an old value moved.
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import argparse
import json
import re
import sys
from dataclasses import asdict
from pathlib import Path

from fidev.bindings import signatures as abi
from fidev.bindings.jit_modules import matches
from fidev.core.failure import ArgumentParser, Failure, option, run_main
from fidev.core.files import user_path
from fidev.core.manifest import pins
from fidev.tree import source_tree


def version_of(location: Path) -> str:
    """The FlashInfer release of a tree (version.txt, or PKG-INFO) or of a source release (its file name)."""
    match = re.fullmatch(r"flashinfer_python-(.+)\.tar\.gz", location.name)
    if match:
        return match.group(1)
    if (location / "version.txt").is_file():  # a git checkout
        return abi.read_capped(location / "version.txt").decode(errors="replace").strip()
    info = location / "PKG-INFO"  # a materialized source release
    text = abi.read_capped(info).decode(errors="replace") if info.is_file() else ""
    found = re.search(r"^Version: (\S+)", text, re.M)
    return found.group(1) if found else "?"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def params_text(params) -> str:
    return ", ".join(f"{p.type} {p.name}".strip() + (f" = {p.default}" if p.default else "") for p in params)


def show_report(location: Path, exports: list[abi.Export]) -> None:
    files = sorted({e.file for e in exports})
    print(
        f"abi: {source_tree.shown(location)} (FlashInfer {version_of(location)}): "
        f"{plural(len(exports), 'export')} in {plural(len(files), 'file')}"
    )
    for file in files:
        print(file)
        for e in (e for e in exports if e.file == file):
            where = f"line {e.line}" + (f", under {e.condition}" if e.condition else "")
            print(f"  {e.symbol}  -> {e.binds}  ({where})")
            if not e.signatures:
                print("    (no declaration of it found in csrc/ or include/)")
            for sig in e.signatures:
                tail = ", ADDITIONAL_FUNC_PARAMS" if sig.tail else ""
                print(f"    {sig.returns} {e.binds}({params_text(sig.params)}{tail})  [{sig.file}:{sig.line}]")
            if len(e.signatures) > 1:
                print("    overloaded: TVM-FFI needs a cast to pick one")
            for backend, params in e.tails.items():
                print(f"    ADDITIONAL_FUNC_PARAMS, {backend}: {params_text(params)}")


def show_diff(old: Path, new: Path, added, removed, changes) -> None:
    print(
        f"abi --diff: FlashInfer {version_of(old)} ({source_tree.shown(old)}) -> {version_of(new)} "
        f"({source_tree.shown(new)})"
    )
    for title, items in (("added", added), ("removed", removed)):
        print(f"{title} ({len(items)}):")
        for e in items:
            print(f"  {e.file}:{e.line}  {e.symbol} -> {e.binds}")
    keys = sorted({c.key for c in changes})
    print(f"changed ({len(keys)}):")
    for key in keys:
        mine = [c for c in changes if c.key == key]
        print(f"  {key[0]}  __tvm_ffi_{key[1]}  [{mine[0].old_at} -> {mine[0].new_at}]")
        for c in mine:
            print(f"    {c.what}")


def parse_args() -> argparse.Namespace:
    """The command line: SOURCE, or the comparisons (--diff, --tvm-ffi), never both."""
    parser = ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "source",
        nargs="?",
        type=option(user_path),
        help="a FlashInfer source tree or source release (default: the vendored tree)",
    )
    parser.add_argument(
        "--diff", nargs=2, type=option(user_path), metavar=("OLD", "NEW"), help="compare two trees or source releases"
    )
    parser.add_argument(
        "--tvm-ffi",
        nargs=2,
        type=option(user_path),
        metavar=("OLD", "NEW"),
        help="compare the TVMFFITypeIndex values of two tvm-ffi wheels or installs",
    )
    parser.add_argument(
        "--match",
        metavar="TEXT",
        help="only exports whose name, bound function or file contains TEXT (or matches it as a glob)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()
    if args.source and (args.diff or args.tvm_ffi):
        parser.error("SOURCE goes without --diff and --tvm-ffi")
    return args


def list_exports(args: argparse.Namespace) -> int:
    """Every export of one tree or release (SOURCE, else the vendored tree), as lines or JSON."""
    location = (args.source or pins().source_dir).absolute()
    if args.source is None and not (location / "csrc").is_dir():
        raise Failure(
            f"the vendored tree {source_tree.shown(location)} is not checked out",
            f"{source_tree.GET}, or name a tree or release",
        )
    exports = [
        e
        for e in abi.report(location)
        if not args.match or any(matches(text, args.match) for text in (e.name, e.binds, e.file))
    ]
    if args.match and not exports:
        raise Failure(
            f"no export of {source_tree.shown(location)} matches {args.match!r}",
            "drop --match to list every export",
        )
    if args.json:
        print(
            json.dumps(
                {"source": str(location), "version": version_of(location), "exports": abi.as_json(exports)},
                indent=1,
            )
        )
    else:
        show_report(location, exports)
    return 0


def compare(args: argparse.Namespace) -> int:
    """--diff and --tvm-ffi: what changed from the old side to the new; 1 where what the old side exports changed."""
    result, broken = {}, False
    if args.diff:
        old, new = (p.absolute() for p in args.diff)
        added, removed, changes = abi.diff(abi.report(old), abi.report(new))
        broken |= bool(removed or changes)
        result["functions"] = {
            "old": str(old),
            "new": str(new),
            "added": abi.as_json(added),
            "removed": abi.as_json(removed),
            "changed": [asdict(c) for c in changes],
        }
        if not args.json:
            show_diff(old, new, added, removed, changes)
    if args.tvm_ffi:
        before, after = (abi.type_indices(p) for p in args.tvm_ffi)
        lines = abi.index_diff(before, after)
        broken |= any(not line.endswith(" added") for line in lines)
        result["tvm_ffi_type_index"] = {"old": str(args.tvm_ffi[0]), "new": str(args.tvm_ffi[1]), "changes": lines}
        if not args.json:
            print(
                f"TVMFFITypeIndex: {len(before)} values in {args.tvm_ffi[0].name}, {len(after)} in "
                f"{args.tvm_ffi[1].name}"
            )
            for line in lines or ["(no change)"]:
                print(f"  {line}")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"abi: {'the bump changes what the old side exports' if broken else 'nothing the old side exports changed'}"
        )
    return 1 if broken else 0


def main() -> int:
    args = parse_args()
    return compare(args) if args.diff or args.tvm_ffi else list_exports(args)


if __name__ == "__main__":
    sys.exit(run_main(main))
