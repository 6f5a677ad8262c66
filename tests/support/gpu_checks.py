"""What the GPU suites (tests/smoke, tests/abi_smoke) share: poisoning, float64 references, error
measures, timing, and the result tables printed at the end of a run."""

import math
import os

import torch

EPS = 1e-6  # the rmsnorm epsilon the tests use
RESULTS: dict[str, list[tuple[str, ...]]] = {}  # table title -> rows; the first row is the header
# (kernel, dtype, worst share of its allowance) of every check, for tools/smoke_noise.py
MEASURED: list[tuple[str, str, float]] = []

F16, BF16 = torch.float16, torch.bfloat16
# FlashInfer's own rule, element by element, against our float64 reference: an element passes when
# |out - ref| <= atol + rtol * |ref| (torch.testing.assert_close's test). (rtol, atol) by kernel and
# the dtype its output is judged at. fp16: FlashInfer's v0.6.3 tests' values, rtol = atol = 1e-3
# (tests/utils/test_norm.py test_norm, tests/utils/test_activation.py test_fused_silu_mul,
# tests/attention/test_single_prefill.py, test_batch_decode_kernels.py, test_batch_prefill_kernels.py);
# gdn: tests/gdn/test_prefill_delta_rule.py, its output at each input dtype, and its float32 state
# as GDN_STATE_RULE below carries FlashInfer's rule to smoke's inputs.
# bf16 norm and silu, which FlashInfer does not test in bf16: rtol = atol = 1e-2, its bf16 output's
# values in that gdn test. The output's own rounding takes up to half an ulp, 2^-11 of a value in
# fp16: under 1/2.05 of the fp16 allowance, so no fp16 check keeps more than about 2x of margin
# (tools/smoke_noise.py asks 1.5x; docs/tasks.md, "Smoke's tolerances").
FP16_RULE, BF16_RULE = (1e-3, 1e-3), (1e-2, 1e-2)
# gdn's float32 state, by FlashInfer's own rule (tests/gdn/test_prefill_delta_rule.py at v0.6.3: rtol, atol
# 1e-4, 1e-3 from fp16 inputs and 1e-3, 5e-3 from bf16), set there for the inputs that test draws: q, k and v
# from tests/gdn/conftest.py's gen_qkv (multidist_randu: uniform within 0.25 of a mean drawn from N(0, 0.05)
# per row), so v's rms is sqrt(0.5^2 / 12 + 0.05^2), about 0.153. gdn_inputs draws v from N(0, 1), rms 1,
# so that FlashInfer's output rule can see a bug: at gen_qkv's scale the bf16 output is within a few atols of
# zero (docs/measurements.md, row "gdn error at FlashInfer's input scale").
# The state is linear in v (gated_delta_rule_ref: S <- g S, then S <- S + beta k (v - k^T S)^T, from S = 0):
# its values and their rounding errors grow with v's rms. So the atol FlashInfer sets at its scale is
# atol / GDN_V_RMS at ours; rtol, a share of each value, stays. That carries the rms, not the largest values:
# N(0, 1) has longer tails than gen_qkv's bounded draw, so by its largest values our state is about twice
# as large again, and the carried rule stays the stricter one. FlashInfer's atol as it stands held the
# state down into the kernel's own bf16 rounding (row "gdn bf16 state margin").
GDN_V_RMS = math.sqrt(0.25**2 / 3 + 0.05**2)
FLASHINFER_GDN_STATE = {F16: (1e-4, 1e-3), BF16: (1e-3, 5e-3)}
GDN_STATE_RULE = {dtype: (rtol, atol / GDN_V_RMS) for dtype, (rtol, atol) in FLASHINFER_GDN_STATE.items()}
TOLERANCE = {
    "rmsnorm": {F16: FP16_RULE, BF16: BF16_RULE},
    "gemma_rmsnorm": {F16: FP16_RULE, BF16: BF16_RULE},
    "fused_add_rmsnorm": {F16: FP16_RULE, BF16: BF16_RULE},
    "residual_sum": {F16: FP16_RULE, BF16: BF16_RULE},
    "silu_and_mul": {F16: FP16_RULE, BF16: BF16_RULE},
    "single_decode": {F16: FP16_RULE},
    "single_prefill": {F16: FP16_RULE},
    "batch_decode": {F16: FP16_RULE},
    "batch_prefill": {F16: FP16_RULE},
    "gdn_prefill": {F16: FP16_RULE, BF16: BF16_RULE},
    "gdn_state": GDN_STATE_RULE,  # float32, accumulated from fp16/bf16 inputs
    # the cascade merge (flashinfer/cascade.py): its output, and its float32 log2-sum-exp judged at the fp16 rule,
    # as tests/attention/test_shared_prefix_kernels.py's test_merge_state_in_place_with_mask judges both at v0.6.3
    "merge_state": {F16: FP16_RULE},
    "merge_lse": {F16: FP16_RULE},
}
# Row sizes beside the plain 4096, from FlashInfer's norm tests (tests/utils/test_norm.py's hidden_size at
# v0.6.3). The norm kernels (include/flashinfer/norm.cuh, RMSNorm and FusedAddRMSNorm at v0.6.3) load
# vectors of gcd(8, d) halves with min(1024, d / vec) threads, rounded up to whole warps, in
# ceil(d / (vec * threads)) rounds:
# - 111 and 500: vectors of 1 and 4 halves, so no partial vector; one round whose last warp has threads
#   with nothing to load (111 and 125 of 128 threads load);
# - 8192: one round of all 1024 threads; 16384: two rounds, so the kernel's loop goes past its first.
NORM_SIZES = [111, 500, 8192, 16384]
# silu_and_mul's rows must be whole 16-byte vectors (flashinfer/activation.py, silu_and_mul, at v0.6.3,
# refuses others; a half row that is not, 500, faults the GPU), so it has no partial vector to test.
# What it has past the plain case is a row longer than its 1024 threads' vectors
# (flashinfer/jit/activation.py: blockDim = min(d / vec_size, 1024)): 8192 + 8 in fp16 and bf16, where
# act_and_mul_kernel's vector loop takes a second pass (thread 0), and its scalar remainder loop
# (include/flashinfer/activation.cuh) writes the last 8 elements again.
SILU_TAIL_SIZES = [8200]


def fresh_seed() -> int:
    """A new seed each run (fresh inputs); the failure message prints it to reproduce."""
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def poison_allocator(*shapes_dtypes) -> None:
    """For APIs that allocate their own output: hand PyTorch's caching allocator NaN-filled
    blocks of the output's size, so that the output's torch.empty gets one of them back and an
    element the kernel never writes stays NaN."""
    blocks = [poisoned(shape, dtype) for shape, dtype in shapes_dtypes]
    torch.cuda.synchronize()
    del blocks


def allowance_used(out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """|out - ref| / (atol + rtol |ref|), element by element: above 1 where the element fails."""
    ref = ref.double()
    return (out.double() - ref).abs() / (atol + rtol * ref.abs())


def assert_close(out, ref, kernel: str, dtype, seed) -> float:
    """Every element of `out` written, finite, and within FlashInfer's (rtol, atol) of `kernel` at
    `dtype` of the float64 `ref`. Returns the worst element's share of its allowance (kept in MEASURED)."""
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    bad = (~torch.isfinite(out)).sum().item()
    assert bad == 0, f"{bad} of {out.numel()} output elements are NaN/inf (not written, or overflow) (seed {seed})"
    rtol, atol = TOLERANCE[kernel][dtype]
    used = allowance_used(out, ref, rtol, atol)
    worst = used.max().item()
    MEASURED.append((kernel, str(dtype).removeprefix("torch."), worst))
    if worst > 1:
        at = tuple(int(i) for i in torch.unravel_index(used.argmax(), used.shape))
        failing = (used > 1).sum().item()
        raise AssertionError(
            f"{kernel}: {failing} of {out.numel()} elements off by more than {atol:g} + {rtol:g} |ref| "
            f"for {dtype}; worst at {at}: {out[at].item():.6g} against {ref[at].item():.6g}, "
            f"{worst:.2f}x its allowance (seed {seed})"
        )
    return worst


def gpu_ms(fn, reps: int = 20) -> float:
    """Median time of a warm call, by CUDA events."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def merge_ref(v, s):
    """Float64 merge of attention states along dim 1 (v: [n, states, heads, d]; s: [n, states, heads], each
    state's log2-sum-exp of its logits, FlashInfer's base: include/flashinfer/attention/cascade.cuh at v0.6.3):
    (the merged output [n, heads, d], the merged log2-sum-exp [n, heads])."""
    s = s.double()
    merged = torch.logsumexp(s * math.log(2), dim=1) / math.log(2)
    weights = torch.exp2(s - merged[:, None])
    return (weights[..., None] * v.double()).sum(dim=1), merged


def attention_ref(q, k, v, causal: bool) -> torch.Tensor:
    """Float64 softmax(q k^T / sqrt(d)) v, NHD layout, GQA by repeating kv heads.
    q: [qo_len, Hq, D], k/v: [kv_len, Hkv, D]. Causal aligns the last query with the last key."""
    qo_len, heads, dim = q.shape
    kv_len = k.shape[0]
    group = heads // k.shape[1]
    q64 = q.double().transpose(0, 1)
    k64 = k.double().repeat_interleave(group, dim=1).transpose(0, 1)
    v64 = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = q64 @ k64.transpose(1, 2) / dim**0.5
    if causal:
        rows = torch.arange(qo_len, device=q.device)[:, None] + (kv_len - qo_len)
        scores = scores.masked_fill(torch.arange(kv_len, device=q.device)[None, :] > rows, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v64).transpose(0, 1)


def paged_kv(kv_lens, page_size, kv_heads, dim, dtype):
    """A paged KV cache (NHD, [pages, 2, page_size, H, D]) holding random sequences of the given
    lengths on shuffled pages. Returns the cache, the page table (indptr, indices, last_page_len)
    and each sequence's contiguous (k, v) for the reference."""
    pages_per_seq = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(pages_per_seq)
    cache = torch.randn(total, 2, page_size, kv_heads, dim, dtype=dtype, device="cuda")
    order = torch.randperm(total, device="cuda").to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(pages_per_seq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    last = torch.tensor(
        [n - (p - 1) * page_size for n, p in zip(kv_lens, pages_per_seq, strict=True)], dtype=torch.int32, device="cuda"
    )
    seqs = []
    for i, n in enumerate(kv_lens):
        pages = cache[order[indptr[i] : indptr[i + 1]].long()]  # [p, 2, page, H, D]
        kv = pages.transpose(0, 1).reshape(2, -1, kv_heads, dim)[:, :n]
        seqs.append((kv[0], kv[1]))
    return cache, indptr, order, last, seqs


def rms_ref(x, w, gemma=False):
    """Float64 RMSNorm; Gemma's variant scales by (1 + w)."""
    x64 = x.double()
    scale = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    return x64 * scale * ((1.0 + w.double()) if gemma else w.double())


def gated_delta_rule_ref(q, k, v, g, beta, cu_seqlens, scale):
    """Float64 recurrence, per sequence and head, state S as [K, V]:
    S <- g S;  S <- S + beta k (v - k^T S)^T;  o = scale q^T S.  Returns o and the final
    states in FlashInfer's k-last layout [N, H, V, K]."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    out = torch.empty_like(v)
    states = []
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True):
        state = torch.zeros(q.shape[1], q.shape[2], v.shape[2], dtype=torch.float64, device=q.device)
        for t in range(start, end):
            state = g[t][:, None, None] * state
            error = v[t] - torch.einsum("hk,hkv->hv", k[t], state)
            state = state + beta[t][:, None, None] * torch.einsum("hk,hv->hkv", k[t], error)
            out[t] = scale * torch.einsum("hk,hkv->hv", q[t], state)
        states.append(state.transpose(-1, -2))
    return out, torch.stack(states)


def gdn_inputs(dtype, heads=4, dim=128, seq_lens=(37, 130)):
    """Random q, k, v, gates and cu_seqlens (int64) for chunk_gated_delta_rule. Keys and gates as
    tests/gdn/test_prefill_delta_rule.py draws them at v0.6.3 (`_test_prefill_kernel`: unit-norm keys,
    forget gates `alpha` and `beta` uniform in [0, 1)); with longer-memory gates (in [0.8, 1)) the bf16
    state's error came nearer its allowance (docs/measurements.md, row "gdn bf16 state margin, gates in
    [0.8, 1)"). q and v from N(0, 1), about 6.5 times the scale of FlashInfer's gen_qkv, which
    GDN_STATE_RULE carries FlashInfer's state rule to."""
    cu = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int64, device="cuda")
    total = sum(seq_lens)
    q = torch.randn(total, heads, dim, dtype=dtype, device="cuda")
    k = torch.nn.functional.normalize(torch.randn(total, heads, dim, device="cuda"), dim=-1).to(dtype)
    v = torch.randn(total, heads, dim, dtype=dtype, device="cuda")
    g = torch.rand(total, heads, device="cuda")
    beta = torch.rand(total, heads, device="cuda")
    return q, k, v, g, beta, cu


def add_result(title, header, row):
    RESULTS.setdefault(title, [tuple(header)]).append(tuple(row))


def write_results(reporter):
    for title, rows in RESULTS.items():
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        reporter.section(title)
        for row in rows:
            reporter.write_line("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
