"""FlashInfer's own test suites (the tests/ of the source tree), by kernel family, so that a
contributor need not know their layout. The node ids are those of the pinned release (v0.6.3);
upstream-tests checks they exist before it runs anything.

Each family also names what its modules compile, relative to the tree (`sources`, globs): the
csrc/ files and templates its generators list at v0.6.3 (flashinfer/jit/norm.py's gen_norm_module,
sampling.py's gen_sampling_module, topk.py's gen_topk_module, page.py's gen_page_module, rope.py's
gen_rope_module, cascade.py's gen_cascade_module, quantization.py's gen_quantization_module; the
attention and gdn generators in jit/attention/modules.py and jit/gdn.py render
csrc/*_kernel_inst.jinja and compile csrc/<kind>*.cu; the activation template includes
<flashinfer/activation.cuh>, jit/activation.py's `activation_templ`). `affected` follows their #include lines
to name the families whose tests would compile a file that no built module does.

And the package's Python files that hold its API (`api`: flashinfer/norm.py defines rmsnorm, prefill.py the
single and batch prefill wrappers of the fa2 and fa3 backends, decode.py the single and batch decode ones, at
v0.6.3): an edit of one runs the family's tests, which call it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Family:
    name: str
    what: str
    nodes: tuple[str, ...]  # paths under tests/, or path::test_function
    sources: tuple[str, ...] = field(default=())  # globs, relative to the tree: what its modules compile
    api: tuple[str, ...] = field(
        default=()
    )  # the package's Python files that hold the family's API, relative to the tree


FAMILIES = [
    Family(
        "norm",
        "rmsnorm, fused add rmsnorm, gemma rmsnorm, layernorm",
        ("utils/test_norm.py",),
        ("csrc/norm.cu", "csrc/flashinfer_norm_binding.cu"),
        api=("flashinfer/norm.py",),
    ),
    Family(
        "activation",
        "silu/gelu/gelu-tanh and mul",
        ("utils/test_activation.py",),
        ("flashinfer/jit/activation.py", "include/flashinfer/activation.cuh"),
        api=("flashinfer/activation.py",),
    ),
    Family(
        "sampling",
        "sampling from probs and logits, top-k/top-p/min-p",
        ("utils/test_sampling.py",),
        ("csrc/sampling.cu", "csrc/renorm.cu", "csrc/flashinfer_sampling_binding.cu"),
        api=("flashinfer/sampling.py",),
    ),
    Family(
        "topk",
        "top-k and its page-table/ragged transforms",
        ("utils/test_topk.py",),
        ("csrc/topk.cu", "csrc/flashinfer_topk_binding.cu"),
        api=("flashinfer/topk.py",),
    ),
    Family(
        "page",
        "appending to a paged KV cache",
        ("attention/test_page.py",),
        ("csrc/page.cu", "csrc/flashinfer_page_binding.cu"),
        api=("flashinfer/page.py",),
    ),
    Family(
        "rope",
        "rotary embeddings, with quantize-and-append",
        ("attention/test_rope.py",),
        ("csrc/rope.cu", "csrc/flashinfer_rope_binding.cu"),
        api=("flashinfer/rope.py",),
    ),
    Family(
        "single_decode",
        "single-request decode: soft cap, sliding window, ALiBi",
        (
            "attention/test_logits_cap.py::test_single_decode_logits_soft_cap",
            "attention/test_sliding_window.py::test_single_decode_sliding_window",
            "attention/test_alibi.py::test_single_decode_alibi",
        ),
        ("csrc/single_decode.cu", "csrc/single_decode_jit_binding.cu", "csrc/single_decode_*.jinja"),
        api=("flashinfer/decode.py",),
    ),
    Family(
        "single_prefill",
        "single-request prefill (fa2), soft cap, sliding window, ALiBi",
        (
            "attention/test_single_prefill.py",
            "attention/test_logits_cap.py::test_single_prefill_logits_soft_cap",
            "attention/test_sliding_window.py::test_single_prefill_sliding_window",
            "attention/test_alibi.py::test_single_prefill_alibi",
        ),
        (
            "csrc/single_prefill.cu",
            "csrc/single_prefill_jit_binding.cu",
            "csrc/single_prefill_kernel_inst.jinja",
            "csrc/single_prefill_customize_config.jinja",
        ),
        api=("flashinfer/prefill.py",),
    ),
    Family(
        "decode",
        "batch decode on paged KV, CUDA graphs, tensor cores",
        (
            "attention/test_batch_decode_kernels.py",
            "attention/test_tensor_cores_decode.py",
            "attention/test_non_contiguous_decode.py",
        ),
        (
            "csrc/batch_decode.cu",
            "csrc/batch_decode_jit_binding.cu",
            "csrc/batch_decode_kernel_inst.jinja",
            "csrc/batch_decode_customize_config.jinja",
        ),
        api=("flashinfer/decode.py",),
    ),
    Family(
        "prefill",
        "batch prefill on paged and ragged KV",
        ("attention/test_batch_prefill_kernels.py", "attention/test_non_contiguous_prefill.py"),
        (
            "csrc/batch_prefill.cu",
            "csrc/batch_prefill_jit_binding.cu",
            "csrc/batch_prefill_paged_kernel_inst.jinja",
            "csrc/batch_prefill_ragged_kernel_inst.jinja",
            "csrc/batch_prefill_customize_config.jinja",
        ),
        api=("flashinfer/prefill.py",),
    ),
    Family(
        "hopper",
        "fa3 (sm_90) single, batch and paged prefill",
        ("attention/test_hopper.py",),
        ("csrc/single_prefill_sm90*", "csrc/batch_prefill_sm90*"),
        api=("flashinfer/prefill.py",),
    ),
    Family(
        "cascade",
        "shared-prefix (cascade) attention",
        ("attention/test_shared_prefix_kernels.py",),
        ("csrc/cascade.cu", "csrc/flashinfer_cascade_binding.cu"),
        api=("flashinfer/cascade.py",),
    ),
    Family(
        "gdn",
        "gated delta rule prefill and decode",
        ("gdn/test_prefill_delta_rule.py", "gdn/test_decode_delta_rule.py"),
        ("csrc/gdn_prefill*",),
        api=("flashinfer/gdn_prefill.py", "flashinfer/gdn_decode.py"),
    ),
    Family(
        "quantization",
        "packbits and segment packbits",
        ("utils/test_quantization.py",),
        ("csrc/quantization.cu", "csrc/flashinfer_quantization_binding.cu"),
        api=("flashinfer/quantization.py",),
    ),
]
BY_NAME = {f.name: f for f in FAMILIES}


INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


_INCLUDED: dict[tuple, list[Path]] = {}


def _includes(path: Path, tree: Path, dirs: tuple[Path, ...] = ()) -> list[Path]:
    """The files that `path` includes: "x.h" beside it, or under the tree's include/ or csrc/, or
    under `dirs` (a module's own include dirs); read once per process."""
    key = (path, dirs)
    if key not in _INCLUDED:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            text = ""
        found = []
        for name in INCLUDE.findall(text):
            for base in (path.parent, tree / "include", tree / "csrc", *dirs):
                if (base / name).is_file():
                    found.append((base / name).resolve())
                    break
        _INCLUDED[key] = found
    return _INCLUDED[key]


def include_steps(paths: list[Path], tree: Path, dirs: list[Path] = ()) -> dict[Path, int]:
    """{`paths` (resolved) and every file they include, directly or through others: the fewest #include
    lines from one of `paths` to it (0: one of them)}, searching the tree's include/ and csrc/ and `dirs` (a
    module's extra include dirs, such as csrc/nv_internal)."""
    tree, dirs = tree.resolve(), tuple(d.resolve() for d in dirs)
    steps = {p.resolve(): 0 for p in paths}
    front = list(steps)
    while front:
        found = []
        for path in front:
            for included in _includes(path, tree, dirs):
                if included not in steps:
                    steps[included] = steps[path] + 1
                    found.append(included)
        front = found
    return steps


def closure(paths: list[Path], tree: Path, dirs: list[Path] = ()) -> set[Path]:
    """`paths` (resolved) and every file they include, directly or through others (include_steps)."""
    return set(include_steps(paths, tree, dirs))


def family_steps(tree: Path, changed: list[str]) -> dict[str, dict[str, int]]:
    """{changed file (relative to the tree): {each family whose sources are it or include it, directly or
    through other files of the tree: the fewest #include lines from its sources to it (0: one of them); or
    whose API it holds (`Family.api`): 0}}, the families in FAMILIES' order."""
    tree = tree.resolve()
    wanted = {(tree / rel).resolve(): rel for rel in changed}
    reach: dict[str, dict[str, int]] = {rel: {} for rel in changed}
    for family in FAMILIES:
        steps = include_steps([p for pattern in family.sources for p in tree.glob(pattern) if p.is_file()], tree)
        for path, rel in wanted.items():
            if rel in family.api or path in steps:
                reach[rel][family.name] = 0 if rel in family.api else steps[path]
    return reach


def families_compiling(tree: Path, changed: list[str]) -> dict[str, list[str]]:
    """{changed file (relative to the tree): the families whose sources are it or include it,
    directly or through other files of the tree, or whose API it holds (`Family.api`)}."""
    return {rel: list(steps) for rel, steps in family_steps(tree, changed).items()}


def nearest(steps: dict[str, dict[str, int]]) -> list[str]:
    """Of family_steps' families, those nearest an edited file: the fewest #include lines from their
    sources to it (a family whose source or API it is: 0), for each file; in FAMILIES' order. Where an edit
    reaches several families, the tests of the family nearest it are the likeliest to catch it."""
    near = {fam for fams in steps.values() for fam, n in fams.items() if n == min(fams.values())}
    return [f.name for f in FAMILIES if f.name in near]


def owners(tree: Path, inputs: dict[str, set[str]]) -> dict[str, list[str]]:
    """{module: the families whose sources (`Family.sources`, resolved) it compiles}, of modules
    given with their inputs (resolved paths): a module built from csrc/rope.cu is rope's, whichever
    test built it, so a run of rope's tests is a run of its tests."""
    tree = tree.resolve()
    sources = {
        str(p.resolve()): family.name
        for family in FAMILIES
        for pattern in family.sources
        for p in tree.glob(pattern)
        if p.is_file()
    }
    return {
        name: sorted({sources[p] for p in paths if p in sources})
        for name, paths in inputs.items()
        if any(p in sources for p in paths)
    }
