"""FlashInfer's own test suites (the tests/ of the source tree), by kernel family, so that a
contributor need not know their layout. The node ids are those of the pinned release (v0.6.3);
upstream-tests checks they exist before it runs anything."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    what: str
    nodes: tuple[str, ...]  # paths under tests/, or path::test_function


FAMILIES = [
    Family("norm", "rmsnorm, fused add rmsnorm, gemma rmsnorm, layernorm", ("utils/test_norm.py",)),
    Family("activation", "silu/gelu/gelu-tanh and mul", ("utils/test_activation.py",)),
    Family("sampling", "sampling from probs and logits, top-k/top-p/min-p", ("utils/test_sampling.py",)),
    Family("topk", "top-k and its page-table/ragged transforms", ("utils/test_topk.py",)),
    Family("page", "appending to a paged KV cache", ("attention/test_page.py",)),
    Family("rope", "rotary embeddings, with quantize-and-append", ("attention/test_rope.py",)),
    Family("single_decode", "single-request decode: soft cap, sliding window, ALiBi", (
        "attention/test_logits_cap.py::test_single_decode_logits_soft_cap",
        "attention/test_sliding_window.py::test_single_decode_sliding_window",
        "attention/test_alibi.py::test_single_decode_alibi")),
    Family("single_prefill", "single-request prefill (fa2), soft cap, sliding window, ALiBi", (
        "attention/test_single_prefill.py",
        "attention/test_logits_cap.py::test_single_prefill_logits_soft_cap",
        "attention/test_sliding_window.py::test_single_prefill_sliding_window",
        "attention/test_alibi.py::test_single_prefill_alibi")),
    Family("decode", "batch decode on paged KV, CUDA graphs, tensor cores", (
        "attention/test_batch_decode_kernels.py", "attention/test_tensor_cores_decode.py", "attention/test_non_contiguous_decode.py")),
    Family("prefill", "batch prefill on paged and ragged KV", (
        "attention/test_batch_prefill_kernels.py", "attention/test_non_contiguous_prefill.py")),
    Family("hopper", "fa3 (sm_90) single, batch and paged prefill", ("attention/test_hopper.py",)),
    Family("cascade", "shared-prefix (cascade) attention", ("attention/test_shared_prefix_kernels.py",)),
    Family("gdn", "gated delta rule prefill and decode", ("gdn/test_prefill_delta_rule.py", "gdn/test_decode_delta_rule.py")),
    Family("quantization", "packbits and segment packbits", ("utils/test_quantization.py",)),
]
BY_NAME = {f.name: f for f in FAMILIES}
