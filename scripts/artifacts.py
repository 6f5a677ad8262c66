"""List FlashInfer JIT modules with their exported TVM-FFI functions and needed libraries.

SOURCE is a flashinfer-jit-cache wheel, or a folder of built modules (the JIT cache that `build`
prints); without it, the flashinfer-jit-cache installed in this environment. `--pin` prints, for
wheels, the Cargo.toml block the Rust bindings crate pins them with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fidev import artifacts, wheels
from fidev.ui import Failure, run_main


def describe(source: artifacts.Source) -> str:
    version = f" {source.version}" if source.version else ""
    return {"installed": f"installed flashinfer-jit-cache{version} ({source.location})",
            "wheel": f"wheel {source.location.name}", "folder": f"folder {source.location}"}[source.kind]


def list_modules(args) -> int:
    sources = [artifacts.open_source(s) for s in (args.sources or [None])]
    report = []
    for source in sources:
        found = list(artifacts.modules(source, args.match))
        report.append((source, found))
        if not found and args.match:
            raise Failure(f"{describe(source)}: no module matches {args.match!r}",
                          "list without --match to see every module; `module-uri` gives the URI of an attention configuration")
        if not found:
            raise Failure(f"{describe(source)}: no `<uri>/<uri>.so` module", "name a flashinfer-jit-cache wheel or a folder of built modules")
    if args.json:
        print(json.dumps([{"source": {"kind": s.kind, "path": str(s.location), "version": s.version},
                           "modules": [{"uri": m.uri, "path": m.path, "size": m.size, "machine": m.dynamic.machine,
                                        "exports": list(m.dynamic.exports), "needed": list(m.dynamic.needed)} for m in found]}
                          for s, found in report], indent=2))
        return 0
    for source, found in report:
        print(f"artifacts: {describe(source)}: {len(found)} module{'s' * (len(found) != 1)}"
              + (f" matching {args.match!r}" if args.match else ""))
        for m in found:
            print(f"{m.path}  ({m.size / 1e6:.1f} MB, {m.dynamic.machine})")
            for symbol in m.dynamic.exports or ("(none: not a TVM-FFI module)",):
                print(f"  export  {symbol}")
            print(f"  needs   {', '.join(m.dynamic.needed) or '(nothing)'}")
    return 0


def pin(args) -> int:
    paths = [Path(s).expanduser() for s in args.sources]
    if not paths:
        raise Failure("--pin needs the wheel files to pin", "artifacts --pin path/to/flashinfer_jit_cache-...whl [more.whl]")
    for path in paths:
        if not (path.is_file() and path.suffix == ".whl"):
            raise Failure(f"--pin pins wheel files; {path} is not one", "download the wheel, then pass its path")
    if args.url and len(paths) > 1:
        raise Failure("--url names one wheel's URL, but several wheels were given", "pin them one at a time")
    blocks = []
    for path in paths:
        found = wheels.pins_for(path, url=args.url, index=args.index, cuda=args.cuda)
        print(f"artifacts: {path.name}: sha256 {found[0].sha256}, {found[0].url}", file=sys.stderr)
        blocks += found
    print(wheels.pin_toml(blocks), end="")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", metavar="SOURCE", help="wheel file or folder (default: the installed flashinfer-jit-cache)")
    parser.add_argument("--match", metavar="TEXT", help="only modules whose URI contains TEXT (or matches it as a glob)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--pin", action="store_true", help="print the Cargo.toml pin blocks of the given wheels")
    parser.add_argument("--url", help="with --pin: the wheel's download URL (default: looked up on its package index)")
    parser.add_argument("--index", help="with --pin: the simple index to look the wheel up on (default: the one the manifest installs it from)")
    parser.add_argument("--cuda", help="with --pin: the CUDA key (e.g. cu129) for wheels whose version names none (default: the manifest's)")
    args = parser.parse_args()
    return pin(args) if args.pin else list_modules(args)


if __name__ == "__main__":
    sys.exit(run_main(main))
