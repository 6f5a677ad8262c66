"""The FlashInfer JIT modules the GPU suites call, in one list that build, smoke and abi-smoke share.

Each entry makes the same JitSpec that the FlashInfer API call in tests/smoke makes (same
dtypes, head dim and flags), so `build` compiles exactly what `smoke` loads; tests/abi_smoke loads the
`abi` ones directly through TVM-FFI. Import flashinfer only after fidev.jit.module_choice.apply().
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fidev.jit.uris import AttentionConfig, module_uri
from fidev.records import build_records

HEAD_DIM = 128  # the attention smoke tests use fp16, head dim 128, no RoPE, no window, no soft cap
DEFAULT, WIDE = "default", "wide"


@dataclass(frozen=True)
class SmokeModule:
    key: str
    kernels: str  # the API calls that load it
    make: Callable  # () -> flashinfer.jit.JitSpec
    sm90: bool = False  # built and tested on sm_90 only
    tier: str = DEFAULT
    abi: bool = False  # called directly through TVM-FFI by abi-smoke, as the Rust bindings call it
    tests: tuple[str, ...] = ()  # the tests under tests/ that load it (a function's every case), for `affected`
    # the kernel family (fidev.tree.families) whose sources it compiles: an edit that reaches it runs these tests too
    family: str = ""
    # the module's name (its folder in the JIT dir), as make() names it, known without importing flashinfer: a
    # module of this name is this one, whoever built it (build, smoke's tests, FlashInfer's)
    name: str = ""


def _uri(kind: str, backend: str = "fa2") -> str:
    """FlashInfer's name of the attention module _attention_args configures (fidev.jit.uris restates
    get_*_uri, flashinfer/jit/attention/modules.py at v0.6.3; its defaults are these arguments)."""
    return module_uri(AttentionConfig(kind, backend))


def _attention_args():
    import torch

    f16 = torch.float16
    return f16, f16, f16, HEAD_DIM, HEAD_DIM, 0, False, False  # dtypes, head dims, posenc NONE, swa, soft cap


def _single_prefill(backend):
    from flashinfer.jit import gen_single_prefill_module

    return gen_single_prefill_module(backend, *_attention_args(), False)  # no fp16 qk reduction


def _batch_prefill(backend):
    import torch
    from flashinfer.jit import gen_batch_prefill_module

    f16 = torch.float16
    return gen_batch_prefill_module(backend, f16, f16, f16, torch.int32, HEAD_DIM, HEAD_DIM, 0, False, False, False)


def _norm():
    from flashinfer.jit.norm import gen_norm_module

    return gen_norm_module()


def _silu():
    from flashinfer.jit import gen_act_and_mul_module

    return gen_act_and_mul_module("silu")


def _sampling():
    from flashinfer.jit.sampling import gen_sampling_module

    return gen_sampling_module()


def _single_decode():
    from flashinfer.jit import gen_single_decode_module

    return gen_single_decode_module(*_attention_args())


def _gdn_prefill():
    from flashinfer.jit.gdn import gen_gdn_prefill_sm90_module

    return gen_gdn_prefill_sm90_module()


def _batch_decode():
    import torch
    from flashinfer.jit import gen_batch_decode_module

    f16 = torch.float16
    return gen_batch_decode_module(f16, f16, f16, torch.int32, HEAD_DIM, HEAD_DIM, 0, False, False)


def _page():
    from flashinfer.jit.page import gen_page_module

    return gen_page_module()


def _cascade():
    from flashinfer.jit.cascade import gen_cascade_module

    return gen_cascade_module()


def _topk():
    from flashinfer.jit.topk import gen_topk_module

    return gen_topk_module()


def _tests(*names: str) -> tuple[str, ...]:
    """Tests under tests/ that load the module: a function with all its cases
    ("smoke/test_kernels.py::test_rmsnorm"), or one case ("...::test_single_prefill[fa2]") where the
    function's other cases load another module (tests/test_affected.py checks that pytest collects each)."""
    return names


def _case(function: str, case: str) -> str:
    return f"{function}[{case}]"


_K, _W, _A = "smoke/test_kernels.py::", "smoke/test_wide.py::", "abi_smoke/test_abi.py::"
_SIGNATURES = (
    _A + "test_runtime_signature_equals_the_source"
)  # a case per (module, function): tests/abi_smoke/test_abi.py, CALLED


def _single_prefill_tests(backend: str) -> tuple[str, ...]:
    return (
        _case(_K + "test_single_prefill", backend),
        _case(_A + "test_single_prefill_run", backend),
        _case(_A + "test_bad_single_prefill_call_is_a_decoded_error", backend),
        _case(_SIGNATURES, f"single_prefill_{backend}.run"),
    )


def _batch_prefill_tests(backend: str) -> tuple[str, ...]:
    return _case(_W + "test_batch_prefill_paged", backend), _case(_W + "test_batch_prefill_ragged", backend)


MODULES = [
    SmokeModule(
        "norm",
        "rmsnorm, gemma_rmsnorm, fused_add_rmsnorm",
        _norm,
        abi=True,
        tests=_tests(
            _K + "test_rmsnorm",
            _K + "test_fused_add_rmsnorm",
            _A + "test_norm",
            _A + "test_bad_norm_call_is_a_decoded_error",
            _case(_SIGNATURES, "norm.rmsnorm"),
            _case(_SIGNATURES, "norm.gemma_rmsnorm"),
        ),
        family="norm",
        name="norm",  # gen_norm_module: gen_jit_spec("norm", ...), flashinfer/jit/norm.py
    ),
    SmokeModule(
        "silu",
        "silu_and_mul",
        _silu,
        tests=_tests(_K + "test_silu_and_mul"),
        family="activation",
        name="silu_and_mul",  # gen_act_and_mul_module: f"{act_func_name}_and_mul", flashinfer/jit/activation.py
    ),
    SmokeModule(
        "sampling",
        "top_k_top_p_sampling_from_probs",
        _sampling,
        tests=_tests(_K + "test_top_k_top_p_sampling"),
        family="sampling",
        name="sampling",  # gen_sampling_module: gen_jit_spec("sampling", ...), flashinfer/jit/sampling.py
    ),
    SmokeModule(
        "single_decode",
        "single_decode_with_kv_cache",
        _single_decode,
        tests=_tests(_K + "test_single_decode"),
        family="single_decode",
        name=_uri("single_decode"),
    ),
    SmokeModule(
        "single_prefill_fa2",
        "single_prefill_with_kv_cache(backend='fa2')",
        lambda: _single_prefill("fa2"),
        abi=True,
        tests=_tests(*_single_prefill_tests("fa2")),
        family="single_prefill",
        name=_uri("single_prefill"),
    ),
    SmokeModule(
        "single_prefill_fa3",
        "single_prefill_with_kv_cache(backend='fa3'|'auto')",
        lambda: _single_prefill("fa3"),
        sm90=True,
        abi=True,
        tests=_tests(*_single_prefill_tests("fa3"), _K + "test_auto_backend_is_fa3_on_sm90"),
        family="hopper",
        name=_uri("single_prefill", "fa3"),
    ),
    # Wide tier: its 32 kernel instantiations alone take minutes of a cold build, past the default
    # tier's 3-minute budget (docs/measurements.md, row "gdn_prefill_sm90 cold build").
    SmokeModule(
        "gdn_prefill",
        "chunk_gated_delta_rule",
        _gdn_prefill,
        sm90=True,
        tier=WIDE,
        abi=True,
        tests=_tests(
            _W + "test_gdn_prefill",
            _A + "test_gdn_prefill",
            _A + "test_bad_gdn_prefill_call_is_a_decoded_error",
            _case(_SIGNATURES, "gdn_prefill.gdn_prefill"),
        ),
        family="gdn",
        name="gdn_prefill_sm90",  # gen_gdn_prefill_sm90_module: uri = "gdn_prefill_sm90", flashinfer/jit/gdn.py
    ),
    SmokeModule(
        "batch_prefill_fa2",
        "BatchPrefillWith{Paged,Ragged}KVCacheWrapper(backend='fa2')",
        lambda: _batch_prefill("fa2"),
        tier=WIDE,
        tests=_tests(*_batch_prefill_tests("fa2")),
        family="prefill",
        name=_uri("batch_prefill"),
    ),
    SmokeModule(
        "batch_prefill_fa3",
        "BatchPrefillWith{Paged,Ragged}KVCacheWrapper(backend='fa3')",
        lambda: _batch_prefill("fa3"),
        sm90=True,
        tier=WIDE,
        tests=_tests(*_batch_prefill_tests("fa3")),
        family="hopper",
        name=_uri("batch_prefill", "fa3"),
    ),
    SmokeModule(
        "batch_decode",
        "BatchDecodeWithPagedKVCacheWrapper",
        _batch_decode,
        tier=WIDE,
        tests=_tests(_W + "test_batch_decode_paged"),
        family="decode",
        name=_uri("batch_decode"),
    ),
    SmokeModule(
        "page",
        "append_paged_kv_cache",
        _page,
        tier=WIDE,
        tests=_tests(_W + "test_append_paged_kv_cache"),
        family="page",
        name="page",  # gen_page_module: gen_jit_spec("page", ...), flashinfer/jit/page.py
    ),
    SmokeModule(
        "cascade",
        "merge_state, merge_state_in_place, merge_states",
        _cascade,
        tier=WIDE,
        tests=_tests(_W + "test_merge_two", _W + "test_merge_in_place", _W + "test_merge_many"),
        family="cascade",
        name="cascade",  # gen_cascade_module: gen_jit_spec("cascade", ...), flashinfer/jit/cascade.py
    ),
    SmokeModule(
        "topk",
        "top_k",
        _topk,
        tier=WIDE,
        tests=_tests(_W + "test_top_k"),
        family="topk",
        name="topk",  # gen_topk_module: gen_jit_spec("topk", ...), flashinfer/jit/topk.py
    ),
]
BY_KEY = {m.key: m for m in MODULES}
BY_NAME = {m.name: m for m in MODULES}


def mark_built(spec) -> None:
    """A module smoke's tests built (their own loader, or affected's builds beside them): where it is one of
    smoke's, marked so (fidev.records.build_records.record_smoke_module), as `build`'s stamps mark its own."""
    if (module := BY_NAME.get(spec.name)) is not None:
        build_records.record_smoke_module(spec.build_dir, module.key)


def select(wide: bool, sm90: bool, abi: bool = False) -> list[SmokeModule]:
    """The modules of the chosen tiers (plus abi-smoke's, with `abi`) that this architecture runs."""
    tiers = {DEFAULT, WIDE} if wide else {DEFAULT}
    return [m for m in MODULES if (m.tier in tiers or (abi and m.abi)) and (sm90 or not m.sm90)]
