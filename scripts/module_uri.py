"""Print the URI FlashInfer gives the attention module of a configuration, and where it lives.

The URI names the module a binding loads: `flashinfer_jit_cache/jit_cache/<uri>/<uri>.so` in the
jit-cache wheel, `<JIT dir>/<uri>/<uri>.so` when built from source. Example:
  module_uri.py single_prefill --backend fa3 --dtype bf16 --head-dim 128
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import argparse
import json
import re
import sys

from fidev.bindings import jit_modules
from fidev.core.failure import USAGE, ArgumentParser, Failure, option, run_main
from fidev.jit import uris

# Everything module-uri refuses is the arguments it was given: a value (argparse names the option)
# or a combination FlashInfer has no module for. Both are bad usage, status 2.
ACCEPTED = "see `module_uri.py --help` for the accepted values"


def dtype(text: str) -> str:
    try:
        return uris.dtype(text)
    except ValueError as e:
        raise Failure(str(e), ACCEPTED) from e


def head_dim(text: str) -> int:
    # the digits 0-9 (a minus is read, to say a negative is no positive multiple of 16): int() takes '١٢٨',
    # '+128', '1_28' and ' 128', and refuses 5000 digits with a ValueError of its own, leading zeros and all
    # (never reached: the length is looked at first, and int() is asked of the digits past the zeros)
    if not re.fullmatch(r"-?[0-9]+", text):
        raise Failure(f"{text!r} is not a whole number", "give one in the digits 0-9, e.g. 128")
    if text.startswith("-"):
        raise Failure(f"{text} is not a positive multiple of 16", ACCEPTED)
    digits = text.lstrip("0")
    if len(digits) > len(str(uris.MOST_HEAD_DIM)):  # int() is not asked of thousands of digits
        raise Failure(
            uris.too_large(text if len(digits) <= 20 else f"{digits[:8]}... ({len(digits)} digits)"), ACCEPTED
        )
    try:
        return uris.head_dim(int(digits or "0"))
    except ValueError as e:
        raise Failure(str(e), ACCEPTED) from e


def installed_member(uri: str) -> str:
    """Where the installed flashinfer-jit-cache has the module, or why it has not."""
    try:
        member = jit_modules.installed_jit_cache().location / uris.library_member(uri)
    except Failure:
        return "flashinfer-jit-cache is not installed here"
    return (
        f"in the installed flashinfer-jit-cache: {member}"
        if member.is_file()
        else "not in the installed flashinfer-jit-cache: FlashInfer compiles it on first use (and `build` can)"
    )


def parse_args() -> argparse.Namespace:
    """The command line: the module's kind and its configuration's options."""
    parser = ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", choices=uris.KINDS, help="the attention module's kind: %(choices)s")
    parser.add_argument("--backend", choices=uris.BACKENDS, help="prefill only; fa3 modules end in _sm90 (default fa2)")
    parser.add_argument(
        "--dtype",
        default="f16",
        type=option(dtype),
        help="q, kv and o dtype: f16 or bf16 (torch names work too; default f16); fp8 (e4m3, e5m2) goes to "
        "--dtype-kv, or to --dtype-q and --dtype-kv with --backend fa3: no module has an fp8 output",
    )
    parser.add_argument("--dtype-q", type=option(dtype), help="q dtype only (default: --dtype)")
    parser.add_argument("--dtype-kv", type=option(dtype), help="kv dtype only (default: --dtype)")
    parser.add_argument("--dtype-o", type=option(dtype), help="o (output) dtype only (default: --dtype)")
    parser.add_argument(
        "--dtype-idx", type=option(dtype), help="batch kinds only: page-table index dtype (default i32)"
    )
    parser.add_argument(
        "--head-dim",
        type=option(head_dim),
        default=128,
        help=f"qk and vo head dim, a multiple of 16 up to {uris.MOST_HEAD_DIM} (default 128)",
    )
    parser.add_argument("--head-dim-qk", type=option(head_dim), help="qk head dim only (default: --head-dim)")
    parser.add_argument("--head-dim-vo", type=option(head_dim), help="vo head dim only (default: --head-dim)")
    parser.add_argument(
        "--posenc",
        choices=sorted(uris.POSENC),
        default="none",
        help="position encoding fused in the kernel (default none)",
    )
    parser.add_argument(
        "--sliding-window", action="store_true", help="the module variant with a sliding window (default: without)"
    )
    parser.add_argument(
        "--logits-soft-cap", action="store_true", help="the module variant with a logits soft cap (default: without)"
    )
    parser.add_argument("--fp16-qk-reduction", action="store_true", help="prefill only")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    return parser.parse_args()


def config_of(args: argparse.Namespace) -> uris.AttentionConfig:
    """The attention configuration the options name."""
    # An option given for a kind it does not apply to is refused, not silently ignored.
    if args.dtype_idx is not None and not args.kind.startswith("batch"):
        raise Failure(
            f"--dtype-idx applies to batch kinds only, not {args.kind}", "drop --dtype-idx", exit_status=USAGE
        )
    if args.backend is not None and args.kind.endswith("decode"):
        raise Failure(
            f"--backend applies to prefill kinds only: {args.kind} modules have no backend in their name",
            "drop --backend",
            exit_status=USAGE,
        )
    try:
        config = uris.AttentionConfig(
            args.kind,
            args.backend or "fa2",
            args.dtype_q or args.dtype,
            args.dtype_kv or args.dtype,
            args.dtype_o or args.dtype,
            args.dtype_idx or "i32",
            args.head_dim if args.head_dim_qk is None else args.head_dim_qk,
            args.head_dim if args.head_dim_vo is None else args.head_dim_vo,
            uris.POSENC[args.posenc],
            args.sliding_window,
            args.logits_soft_cap,
            args.fp16_qk_reduction,
        )
    except ValueError as e:  # uris.Refused names the options FlashInfer has a module for
        raise Failure(str(e), getattr(e, "fix", ACCEPTED), exit_status=USAGE) from e
    return config


def main() -> int:
    args = parse_args()
    config = config_of(args)
    uri = uris.module_uri(config)
    if args.json:
        print(json.dumps({"uri": uri, "member": uris.library_member(uri), "config": config.__dict__}))
        return 0
    print(uri)
    print(f"module-uri: {installed_member(uri)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
