"""Default smoke tier: the kernels the Rust bindings call, against float64 torch references."""

import pytest

from fidev.builds.smoke_modules import BY_KEY

torch = pytest.importorskip("torch", reason="torch is not installed (the smoke suite runs in flashinfer-dev)")
from gpu_checks import (  # noqa: E402
    EPS,
    NORM_SIZES,
    SILU_TAIL_SIZES,
    assert_close,
    attention_ref,
    fresh_seed,
    gpu_ms,
    poison_allocator,
    poisoned,
    rms_ref,
)

pytestmark = pytest.mark.gpu

HALF = [torch.float16, torch.bfloat16]


# A row of 16-byte vectors in one round, then rows of short vectors, a full block, and two rounds (NORM_SIZES).
HIDDEN = [4096, *NORM_SIZES]


def size_tag(hidden: int) -> str:
    return "" if hidden == HIDDEN[0] else f" d={hidden}"


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("gemma", [False, True], ids=["rmsnorm", "gemma_rmsnorm"])
def test_rmsnorm(fi, record, dtype, gemma, hidden):
    seed = fresh_seed()
    x = torch.randn(37, hidden, dtype=dtype, device="cuda")
    w = torch.randn(hidden, dtype=dtype, device="cuda")
    out = poisoned(x.shape, dtype)
    name = "gemma_rmsnorm" if gemma else "rmsnorm"
    call = getattr(fi, name)
    call(x, w, EPS, out=out)
    err = assert_close(out, rms_ref(x, w, gemma), name, dtype, seed)
    record(f"{name} {str(dtype)[6:]}{size_tag(hidden)}", "norm", err, gpu_ms(lambda: call(x, w, EPS, out=out)))


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", HALF)
def test_fused_add_rmsnorm(fi, record, dtype, hidden):
    seed = fresh_seed()
    x = torch.randn(37, hidden, dtype=dtype, device="cuda")
    residual = torch.randn_like(x)
    w = torch.randn(hidden, dtype=dtype, device="cuda")
    summed = x.double() + residual.double()
    # The kernel normalizes the float sum, not the rounded one it stores in `residual`
    # (include/flashinfer/norm.cuh, FusedAddRMSNormKernel at v0.6.3).
    expected = rms_ref(summed, w)
    fi.fused_add_rmsnorm(x, residual, w, EPS)  # in place: x <- norm(x + residual), residual <- x + residual
    assert_close(residual, summed, "residual_sum", dtype, seed)
    err = assert_close(x, expected, "fused_add_rmsnorm", dtype, seed)
    record(
        f"fused_add_rmsnorm {str(dtype)[6:]}{size_tag(hidden)}",
        "norm",
        err,
        gpu_ms(lambda: fi.fused_add_rmsnorm(x, residual, w, EPS)),
    )


@pytest.mark.parametrize("d", [3072, *SILU_TAIL_SIZES])
@pytest.mark.parametrize("dtype", HALF)
def test_silu_and_mul(fi, record, dtype, d):
    seed = fresh_seed()
    x = torch.randn(83, 2 * d, dtype=dtype, device="cuda")
    out = poisoned((83, d), dtype)
    fi.silu_and_mul(x, out=out)
    gate, up = x.double().chunk(2, dim=-1)
    err = assert_close(out, torch.nn.functional.silu(gate) * up, "silu_and_mul", dtype, seed)
    record(
        f"silu_and_mul {str(dtype)[6:]}{'' if d == 3072 else f' d={d}'}",
        "silu",
        err,
        gpu_ms(lambda: fi.silu_and_mul(x, out=out)),
    )


def test_single_decode(fi, record):
    seed = fresh_seed()
    q = torch.randn(32, 128, dtype=torch.float16, device="cuda")
    k = torch.randn(2049, 8, 128, dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    poison_allocator((q.shape, q.dtype))
    out = fi.single_decode_with_kv_cache(q, k, v)
    ref = attention_ref(q[None], k, v, causal=False)[0]
    err = assert_close(out, ref, "single_decode", torch.float16, seed)
    record("single_decode fp16", "single_decode", err, gpu_ms(lambda: fi.single_decode_with_kv_cache(q, k, v)))


def prefill_inputs():
    q = torch.randn(517, 32, 128, dtype=torch.float16, device="cuda")
    k = torch.randn(1031, 8, 128, dtype=torch.float16, device="cuda")
    return q, k, torch.randn_like(k)


def test_single_prefill(fi, record, attention_backend):
    backend = attention_backend
    seed = fresh_seed()
    q, k, v = prefill_inputs()
    poison_allocator((q.shape, q.dtype))
    out = fi.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend)
    err = assert_close(out, attention_ref(q, k, v, causal=True), "single_prefill", torch.float16, seed)
    ms = gpu_ms(lambda: fi.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend))
    record(f"single_prefill causal fp16 {backend}", f"single_prefill_{backend}", err, ms)


@pytest.mark.usefixtures("sm90")
def test_auto_backend_is_fa3_on_sm90(fi):
    from flashinfer.utils import determine_attention_backend

    assert determine_attention_backend(torch.device("cuda"), 0, False, False, torch.float16, torch.float16) == "fa3"
    q, k, v = prefill_inputs()
    auto = fi.single_prefill_with_kv_cache(q, k, v, causal=True)
    fa3 = fi.single_prefill_with_kv_cache(q, k, v, causal=True, backend="fa3")
    # bit for bit: fa2 accumulates in another order, so its output differs in some element
    assert torch.equal(auto, fa3), "backend='auto' did not run the fa3 kernel"
    assert BY_KEY["single_prefill_fa3"].make().name.endswith("_sm90")


# Pearson's chi-square, 9 degrees of freedom: P(X > 40) is about 7e-6, so a correct sampler
# fails this about once in 140,000 runs.
CHI2_LIMIT_DF9 = 40.0


def test_top_k_top_p_sampling(fi, record):
    seed = fresh_seed()
    vocab, rows, top_k = 512, 16384, 10
    base = torch.rand(vocab, device="cuda") + 0.05
    probs = (base / base.sum()).repeat(rows, 1)
    samples = fi.top_k_top_p_sampling_from_probs(probs, top_k, 1.0)
    allowed = base.topk(top_k).indices
    assert torch.isin(samples, allowed).all(), f"sampled a token outside the top {top_k} (seed {seed})"
    counts = torch.bincount(samples.long(), minlength=vocab)[allowed].double()
    expected = base[allowed].double() / base[allowed].double().sum() * rows
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < CHI2_LIMIT_DF9, (
        f"sample frequencies are off the renormalized top-{top_k} distribution: chi2 {chi2:.1f} (seed {seed})"
    )
    # top_p alone: a distribution with a clear nucleus (0.5 + 0.3 of the mass in 2 tokens).
    peaked = torch.full((vocab,), 0.2 / (vocab - 2), device="cuda")
    peaked[[3, 77]] = torch.tensor([0.5, 0.3], device="cuda")
    nucleus = fi.top_k_top_p_sampling_from_probs(peaked.repeat(4096, 1), vocab, 0.7)
    assert set(nucleus.unique().tolist()) <= {3, 77}, f"top_p=0.7 sampled outside the nucleus (seed {seed})"
    record(
        "top_k_top_p_sampling (chi2/limit)",
        "sampling",
        chi2 / CHI2_LIMIT_DF9,
        gpu_ms(lambda: fi.top_k_top_p_sampling_from_probs(probs, top_k, 1.0)),
    )
