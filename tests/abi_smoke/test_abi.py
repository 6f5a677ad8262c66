"""abi-smoke: FlashInfer's exported host functions called directly through TVM-FFI, with the
argument order of csrc/*_jit_binding.cu at the pinned release (what the Rust bindings hard-code),
against float64 torch references; bad calls must come back as decoded TVM-FFI errors.

When the pin moves and a signature changes, these calls fail with "Mismatched type on argument"
or "Mismatched number of arguments" instead of the bindings failing at run time."""

import re

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (abi-smoke runs in flashinfer-dev)")
from fidev.builds import smoke_modules  # noqa: E402
from fidev.jit.uris import AttentionConfig, module_uri  # noqa: E402
from gpu_checks import (  # noqa: E402
    EPS,
    add_result,
    assert_close,
    attention_ref,
    fresh_seed,
    gated_delta_rule_ref,
    gdn_inputs,
    poisoned,
    rms_ref,
)

pytestmark = pytest.mark.gpu

HALF = [torch.float16, torch.bfloat16]
# What flashinfer_norm_binding.cu exports at v0.6.3.
NORM_EXPORTS = [
    "rmsnorm",
    "rmsnorm_quant",
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_quant",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "layernorm",
]
MASK_CAUSAL, LAYOUT_NHD, NO_WINDOW = 1, 0, -1  # FlashInfer's MaskMode.CAUSAL, TensorLayout.NHD, window_left
PREFILL_TMP_BYTES = 32 << 20  # what FlashInfer's own single prefill passes as `tmp`


def record(function, spec, source, err):
    add_result(
        "flashinfer abi",
        ("function", "module", "source", "error/allowance"),
        (function, spec.name, source, f"{err:.2f}"),
    )


def expect_error(kind, fragment, call):
    """The call raises `kind` carrying `fragment`: FlashInfer's check, decoded by TVM-FFI."""
    with pytest.raises(kind) as caught:
        call()
        torch.cuda.synchronize()
    assert fragment in str(caught.value), (
        f"expected {kind.__name__} with {fragment!r}, got {type(caught.value).__name__}: {caught.value}"
    )


# ---------------------------------------------------------------- norm


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", ["rmsnorm", "gemma_rmsnorm"])
def test_norm(abi_module, name, dtype):
    module, spec, source = abi_module("norm", NORM_EXPORTS)
    seed = fresh_seed()
    x = torch.randn(37, 4096, dtype=dtype, device="cuda")
    w = torch.randn(4096, dtype=dtype, device="cuda")
    out = poisoned(x.shape, dtype)
    getattr(module, name)(out, x, w, EPS, False)  # (out, input, weight, eps, enable_pdl)
    torch.cuda.synchronize()
    err = assert_close(out, rms_ref(x, w, gemma=name == "gemma_rmsnorm"), name, dtype, seed)
    record(f"{name} {str(dtype)[6:]}", spec, source, err)


NORM_BAD_CALLS = {
    "weight shorter than the hidden size": (
        RuntimeError,
        "weight.size(0)",
        lambda f, out, x, w: f(out, x, w[:2048], EPS, False),
    ),
    "float32 tensors": (
        RuntimeError,
        "failed to dispatch data type",
        lambda f, out, x, w: f(out.float(), x.float(), w.float(), EPS, False),
    ),
    "eps passed as a string": (
        TypeError,
        "Mismatched type on argument #3",
        lambda f, out, x, w: f(out, x, w, "1e-6", False),
    ),
    "enable_pdl left out": (TypeError, "Mismatched number of arguments", lambda f, out, x, w: f(out, x, w, EPS)),
}


@pytest.mark.parametrize("case", NORM_BAD_CALLS)
def test_bad_norm_call_is_a_decoded_error(abi_module, case):
    module, _, _ = abi_module("norm", ["gemma_rmsnorm"])
    seed = fresh_seed()
    x = torch.randn(8, 4096, dtype=torch.float16, device="cuda")
    w = torch.randn(4096, dtype=torch.float16, device="cuda")
    out = poisoned(x.shape, torch.float16)
    kind, fragment, call = NORM_BAD_CALLS[case]
    expect_error(kind, fragment, lambda: call(module.gemma_rmsnorm, out, x, w))
    module.gemma_rmsnorm(out, x, w, EPS, False)  # the process and its CUDA context are still fine
    torch.cuda.synchronize()
    assert_close(out, rms_ref(x, w, gemma=True), "gemma_rmsnorm", torch.float16, seed)


# ---------------------------------------------------------------- single prefill


def prefill_call(module, backend, q, k, v, out, lse=None):
    """run(q, k, v, tmp, o, maybe_lse, mask_mode, layout, window_left, <additional params>), where
    the additional params are the backend's (flashinfer/jit/attention/modules.py)."""
    tmp = torch.empty(PREFILL_TMP_BYTES, dtype=torch.uint8, device="cuda")
    sm_scale = q.shape[-1] ** -0.5
    if (
        backend == "fa2"
    ):  # maybe_custom_mask, maybe_alibi_slopes, logits_soft_cap, sm_scale, rope_rcp_scale, rope_rcp_theta
        extra = (None, None, 0.0, sm_scale, 1.0, 1e-4)
    else:  # maybe_scale_v, logits_soft_cap, sm_scale, scale_v_scalar
        extra = (None, 0.0, sm_scale, 1.0)
    module.run(q, k, v, tmp, out, lse, MASK_CAUSAL, LAYOUT_NHD, NO_WINDOW, *extra)


def prefill_inputs():
    q = torch.randn(517, 32, 128, dtype=torch.float16, device="cuda")
    k = torch.randn(1031, 8, 128, dtype=torch.float16, device="cuda")
    return q, k, torch.randn_like(k)


def test_single_prefill_run(abi_module, attention_backend):
    backend = attention_backend
    module, spec, source = abi_module(f"single_prefill_{backend}", ["run"])
    assert spec.name == module_uri(AttentionConfig("single_prefill", backend=backend)), (
        "module-uri does not name what FlashInfer builds"
    )
    seed = fresh_seed()
    q, k, v = prefill_inputs()
    out = poisoned(q.shape, torch.float16)
    prefill_call(module, backend, q, k, v, out)
    torch.cuda.synchronize()
    err = assert_close(out, attention_ref(q, k, v, causal=True), "single_prefill", torch.float16, seed)
    record(f"run (single prefill, causal fp16, {backend})", spec, source, err)


def test_bad_single_prefill_call_is_a_decoded_error(abi_module, attention_backend):
    """fa2 checks the lse shape. The fa3 module checks no shapes (so a binding must), but TVM-FFI
    still refuses fa2's argument list, the drift a wrong module choice would cause."""
    module, _, _ = abi_module(f"single_prefill_{attention_backend}", ["run"])
    q, k, v = prefill_inputs()
    out = poisoned(q.shape, torch.float16)
    if attention_backend == "fa2":
        wrong_lse = torch.empty(3, q.shape[1], dtype=torch.float32, device="cuda")  # must be [qo_len, heads]
        expect_error(RuntimeError, "lse.size(0)", lambda: prefill_call(module, "fa2", q, k, v, out, wrong_lse))
    else:
        expect_error(TypeError, "Mismatched number of arguments", lambda: prefill_call(module, "fa2", q, k, v, out))


# ---------------------------------------------------------------- gdn prefill (sm_90)


def gdn_call(module, q, k, v, g, beta, cu, out, state):
    """gdn_prefill(output, output_state, q, k, v, cu_seqlens, input_state, alpha, beta, scale,
    workspace); scale 0.0 means 1/sqrt(head dim), the workspace holds 128 bytes per SM."""
    workspace = torch.empty(
        torch.cuda.get_device_properties(0).multi_processor_count * 128, dtype=torch.uint8, device="cuda"
    )
    module.gdn_prefill(out, state, q, k, v, cu, None, g, beta, 0.0, workspace)


@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("dtype", HALF)
def test_gdn_prefill(abi_module, dtype):
    module, spec, source = abi_module("gdn_prefill", ["gdn_prefill"])
    seed = fresh_seed()
    q, k, v, g, beta, cu = gdn_inputs(dtype)
    (total, heads, dim), seqs = q.shape, len(cu) - 1
    out = poisoned((total, heads, dim), dtype)
    state = poisoned((seqs, heads, dim, dim), torch.float32)
    gdn_call(module, q, k, v, g, beta, cu, out, state)
    torch.cuda.synchronize()
    ref_out, ref_state = gated_delta_rule_ref(q, k, v, g, beta, cu, dim**-0.5)
    err = assert_close(out, ref_out, "gdn_prefill", dtype, seed)
    assert_close(state, ref_state, "gdn_state", dtype, seed)  # float32, but accumulated from `dtype` inputs
    record(f"gdn_prefill {str(dtype)[6:]}", spec, source, err)


@pytest.mark.usefixtures("sm90")
def test_bad_gdn_prefill_call_is_a_decoded_error(abi_module):
    module, _, _ = abi_module("gdn_prefill", ["gdn_prefill"])
    q, k, v, g, beta, cu = gdn_inputs(torch.float16)
    (total, heads, dim), seqs = q.shape, len(cu) - 1
    out, state = poisoned((total, heads, dim), torch.float16), poisoned((seqs, heads, dim, dim), torch.float32)
    expect_error(RuntimeError, "cu_seqlens.dtype()", lambda: gdn_call(module, q, k, v, g, beta, cu.int(), out, state))


# ---------------------------------------------------------------- signatures: the module at run time against the source


# What abi-smoke calls, by module key: (exported name, binding file in the source tree, backend tail).
CALLED = [
    ("norm", "rmsnorm", "csrc/flashinfer_norm_binding.cu", None),
    ("norm", "gemma_rmsnorm", "csrc/flashinfer_norm_binding.cu", None),
    ("single_prefill_fa2", "run", "csrc/single_prefill_jit_binding.cu", "fa2"),
    ("single_prefill_fa3", "run", "csrc/single_prefill_sm90_jit_binding.cu", "fa3 and no fp8"),
    ("gdn_prefill", "gdn_prefill", "csrc/gdn_prefill_launcher.cu", None),
]
RUNTIME_SIGNATURE = re.compile(r"`(\w+)\((.*)\) -> ([^`]+)`")


@pytest.fixture(scope="session")
def source_abi():
    """The exports fidev.bindings.signatures reads from the vendored source (what `pixi run -e flashinfer-dev abi`
    prints)."""
    pytest.importorskip("tree_sitter_cpp", reason="tree-sitter-cpp is not installed (a flashinfer-dev dependency)")
    from fidev.bindings import signatures as abi
    from fidev.core.manifest import pins

    return {e.key: e for e in abi.report(pins().source_dir)}


@pytest.mark.parametrize("key, name, binding, tail", CALLED, ids=[f"{c[0]}.{c[1]}" for c in CALLED])
def test_runtime_signature_equals_the_source(abi_module, source_abi, request, key, name, binding, tail):
    """Called with no arguments, TVM-FFI names the signature it was built with; it must have the
    parameter count and types abi parsed from the source, in the same order."""
    if smoke_modules.BY_KEY[key].sm90:
        request.getfixturevalue("sm90")
    from fidev.bindings.signatures import tvm_ffi_type

    module, spec, _ = abi_module(key, [name])
    with pytest.raises(TypeError) as caught:
        getattr(module, name)()
    found = RUNTIME_SIGNATURE.search(str(caught.value))
    assert found, f"TVM-FFI did not print a signature: {caught.value}"
    runtime = [part.split(": ", 1)[1] for part in filter(None, (p.strip() for p in found.group(2).split(", ")))]
    export = source_abi[(binding, name)]
    params = [*export.signatures[0].params, *(export.tails[tail] if tail else ())]
    parsed = [tvm_ffi_type(p.type) for p in params]
    assert runtime == parsed, f"{spec.name}.{name}: TVM-FFI {runtime}, source {parsed} ({[p.name for p in params]})"
    assert found.group(3).strip() == tvm_ffi_type(export.signatures[0].returns)
    add_result(
        "abi signatures",
        ("function", "module", "parameters", "types match"),
        (name, spec.name, str(len(runtime)), "yes"),
    )
