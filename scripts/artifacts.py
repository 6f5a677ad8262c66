"""List FlashInfer JIT modules with their exported TVM-FFI functions and needed libraries.

SOURCE is a flashinfer-jit-cache wheel, or a folder of built modules (the JIT cache that `build`
prints); without it, the flashinfer-jit-cache installed in this environment. The Cargo.toml block
that pins a wheel for the Rust bindings crate is the `pin` task's (scripts/pin.py).
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import json
import sys

from fidev.bindings import jit_modules
from fidev.core.failure import ArgumentParser, Failure, option, run_main
from fidev.core.files import user_path


def describe(source: jit_modules.Source) -> str:
    version = f" {source.version}" if source.version else ""
    return {
        "installed": f"installed flashinfer-jit-cache{version} ({source.location})",
        "wheel": f"wheel {source.location.name}",
        "folder": f"folder {source.location}",
    }[source.kind]


def list_modules(args) -> int:
    sources = [jit_modules.open_source(s) for s in (args.sources or [None])]
    report = []
    for source in sources:
        found = list(jit_modules.modules(source, args.match))
        report.append((source, found))
        if not found and args.match:
            raise Failure(
                f"{describe(source)}: no module matches {args.match!r}",
                "list without --match to see every module; `module-uri` gives the URI of an attention configuration",
            )
        if not found:
            raise Failure(
                f"{describe(source)}: no `<uri>/<uri>.so` module",
                "name a flashinfer-jit-cache wheel or a folder of built modules",
            )
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "source": {"kind": s.kind, "path": str(s.location), "version": s.version},
                        "modules": [
                            {
                                "uri": m.uri,
                                "path": m.path,
                                "size": m.size,
                                "machine": m.dynamic.machine,
                                "exports": list(m.dynamic.exports),
                                "needed": list(m.dynamic.needed),
                            }
                            for m in found
                        ],
                    }
                    for s, found in report
                ],
                indent=2,
            )
        )
        return 0
    for source, found in report:
        print(
            f"artifacts: {describe(source)}: {len(found)} module{'s' * (len(found) != 1)}"
            + (f" matching {args.match!r}" if args.match else "")
        )
        for m in found:
            print(f"{m.path}  ({m.size / 1e6:.1f} MB, {m.dynamic.machine})")
            for symbol in m.dynamic.exports or ("(none: not a TVM-FFI module)",):
                print(f"  export  {symbol}")
            print(f"  needs   {', '.join(m.dynamic.needed) or '(nothing)'}")
    return 0


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        type=option(user_path),
        help="wheel file or folder (default: the installed flashinfer-jit-cache)",
    )
    parser.add_argument(
        "--match", metavar="TEXT", help="only modules whose URI contains TEXT (or matches it as a glob)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return list_modules(parser.parse_args())


if __name__ == "__main__":
    sys.exit(run_main(main))
