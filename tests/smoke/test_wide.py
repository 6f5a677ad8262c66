"""Wider smoke tier (--wide): batch prefill paged/ragged with plan and run, batch paged decode,
append_paged_kv_cache, top-k, the cascade merge of attention states, and chunk_gated_delta_rule (gdn_prefill,
sm_90)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the smoke suite runs in flashinfer-dev)")
from gpu_checks import (  # noqa: E402
    assert_close,
    attention_ref,
    fresh_seed,
    gated_delta_rule_ref,
    gdn_inputs,
    gpu_ms,
    merge_ref,
    paged_kv,
    poison_allocator,
    poisoned,
)

HALF = [torch.float16, torch.bfloat16]

pytestmark = [pytest.mark.gpu, pytest.mark.wide]
F16 = torch.float16
HQ, HKV, D, PAGE = 32, 8, 128, 16


def workspace():
    return torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")


def indptr_of(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def test_batch_decode_paged(fi, record):
    seed = fresh_seed()
    kv_lens = [1, 17, 256, 1000, 33]
    cache, indptr, indices, last, seqs = paged_kv(kv_lens, PAGE, HKV, D, F16)
    q = torch.randn(len(kv_lens), HQ, D, dtype=F16, device="cuda")
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=F16, kv_data_type=F16)
    out = poisoned(q.shape, F16)
    wrapper.run(q, cache, out=out)
    ref = torch.stack([attention_ref(q[i][None], k, v, causal=False)[0] for i, (k, v) in enumerate(seqs)])
    err = assert_close(out, ref, "batch_decode", F16, seed)
    record("batch_decode paged fp16", "batch_decode", err, gpu_ms(lambda: wrapper.run(q, cache, out=out)))


def batch_prefill_case():
    qo_lens, kv_lens = [7, 64, 1, 130], [7, 200, 45, 130]
    q = torch.randn(sum(qo_lens), HQ, D, dtype=F16, device="cuda")
    return qo_lens, kv_lens, q


def prefill_ref(q, qo_lens, seqs):
    starts = indptr_of(qo_lens).tolist()
    return torch.cat([attention_ref(q[starts[i] : starts[i + 1]], k, v, causal=True) for i, (k, v) in enumerate(seqs)])


def test_batch_prefill_paged(fi, record, attention_backend):
    backend = attention_backend
    seed = fresh_seed()
    qo_lens, kv_lens, q = batch_prefill_case()
    cache, indptr, indices, last, seqs = paged_kv(kv_lens, PAGE, HKV, D, F16)
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", backend=backend)
    wrapper.plan(
        indptr_of(qo_lens), indptr, indices, last, HQ, HKV, D, PAGE, causal=True, q_data_type=F16, kv_data_type=F16
    )
    out = poisoned(q.shape, F16)
    wrapper.run(q, cache, out=out)
    err = assert_close(out, prefill_ref(q, qo_lens, seqs), "batch_prefill", F16, seed)
    record(
        f"batch_prefill paged fp16 {backend}",
        f"batch_prefill_{backend}",
        err,
        gpu_ms(lambda: wrapper.run(q, cache, out=out)),
    )


def test_batch_prefill_ragged(fi, record, attention_backend):
    backend = attention_backend
    seed = fresh_seed()
    qo_lens, kv_lens, q = batch_prefill_case()
    k = torch.randn(sum(kv_lens), HKV, D, dtype=F16, device="cuda")
    v = torch.randn_like(k)
    kv_starts = indptr_of(kv_lens).tolist()
    seqs = [(k[kv_starts[i] : kv_starts[i + 1]], v[kv_starts[i] : kv_starts[i + 1]]) for i in range(len(kv_lens))]
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD", backend=backend)
    wrapper.plan(indptr_of(qo_lens), indptr_of(kv_lens), HQ, HKV, D, causal=True, q_data_type=F16, kv_data_type=F16)
    out = poisoned(q.shape, F16)
    wrapper.run(q, k, v, out=out)
    err = assert_close(out, prefill_ref(q, qo_lens, seqs), "batch_prefill", F16, seed)
    record(
        f"batch_prefill ragged fp16 {backend}",
        f"batch_prefill_{backend}",
        err,
        gpu_ms(lambda: wrapper.run(q, k, v, out=out)),
    )


def test_append_paged_kv_cache(fi, record):
    fresh_seed()
    kv_lens = [5, 16, 40]
    cache, indptr, indices, last, _ = paged_kv(kv_lens, PAGE, HKV, D, F16)
    cache.fill_(float("nan"))
    k = torch.randn(sum(kv_lens), HKV, D, dtype=F16, device="cuda")
    v = torch.randn_like(k)
    append_indptr = indptr_of(kv_lens)
    seq_lens = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    batch, pos = fi.get_batch_indices_positions(append_indptr, seq_lens, k.shape[0])
    fi.append_paged_kv_cache(k, v, batch, pos, cache, indices, indptr, last, "NHD")
    starts = append_indptr.tolist()
    for i, n in enumerate(kv_lens):
        pages = cache[indices[indptr[i] : indptr[i + 1]].long()].transpose(0, 1).reshape(2, -1, HKV, D)[:, :n]
        assert torch.equal(pages[0], k[starts[i] : starts[i + 1]]) and torch.equal(
            pages[1], v[starts[i] : starts[i + 1]]
        ), f"sequence {i}"
    ms = gpu_ms(lambda: fi.append_paged_kv_cache(k, v, batch, pos, cache, indices, indptr, last, "NHD"))
    record("append_paged_kv_cache fp16 (exact)", "page", 0.0, ms)


def test_top_k(fi, record):
    fresh_seed()
    x = torch.randn(8, 50000, device="cuda")
    values, indices = fi.top_k(x, 64)
    assert torch.equal(x.gather(1, indices.long()), values), "indices do not point at the returned values"
    assert torch.equal(values.sort(dim=1, descending=True).values, x.topk(64, dim=1).values), "not the 64 largest"
    record("top_k fp32 (exact)", "topk", 0.0, gpu_ms(lambda: fi.top_k(x, 64)))


MERGE_N, MERGE_H = 300, 32  # positions and heads of the merged states: every head has its own weights


def attention_states(count, positions=MERGE_N):
    """`count` attention states of `positions` positions: fp16 outputs, and float32 log2-sum-exps spread over a few
    units, so that each state weighs in and the weights differ from head to head."""
    v = torch.randn(positions, count, MERGE_H, D, dtype=F16, device="cuda")
    return v, 3 * torch.randn(positions, count, MERGE_H, dtype=torch.float32, device="cuda")


def merged_outputs(positions=MERGE_N):
    poison_allocator(((positions, MERGE_H, D), F16), ((positions, MERGE_H), torch.float32))


def test_merge_two(fi, record):
    seed = fresh_seed()
    v, s = attention_states(2)
    a, b = (v[:, 0].contiguous(), s[:, 0].contiguous()), (v[:, 1].contiguous(), s[:, 1].contiguous())
    merged_outputs()
    out, lse = fi.merge_state(*a, *b)
    ref, ref_lse = merge_ref(v, s)
    err = assert_close(out, ref, "merge_state", F16, seed)
    assert_close(lse, ref_lse, "merge_lse", F16, seed)
    record("merge_state fp16", "cascade", err, gpu_ms(lambda: fi.merge_state(*a, *b)))


def test_merge_in_place(fi, record):
    """The merged state overwrites the first: an element the kernel leaves keeps the first state's value."""
    seed = fresh_seed()
    v, s = attention_states(2)
    out, lse, other = v[:, 0].contiguous(), s[:, 0].contiguous(), (v[:, 1].contiguous(), s[:, 1].contiguous())
    fi.merge_state_in_place(out, lse, *other)
    ref, ref_lse = merge_ref(v, s)
    err = assert_close(out, ref, "merge_state", F16, seed)
    assert_close(lse, ref_lse, "merge_lse", F16, seed)
    record("merge_state_in_place fp16", "cascade", err, gpu_ms(lambda: fi.merge_state_in_place(out, lse, *other)))


# merge_states' two kernels (include/flashinfer/attention/cascade.cuh, MergeStates at v0.6.3): MergeStatesKernel, a
# thread block a position; MergeStatesLargeNumIndexSetsKernel where the states are at least as many as the positions
@pytest.mark.parametrize("positions, count", [(MERGE_N, 5), (3, 40)], ids=["five states", "more states than positions"])
def test_merge_many(fi, record, positions, count):
    seed = fresh_seed()
    v, s = attention_states(count, positions)
    merged_outputs(positions)
    out, lse = fi.merge_states(v, s)
    ref, ref_lse = merge_ref(v, s)
    err = assert_close(out, ref, "merge_state", F16, seed)
    assert_close(lse, ref_lse, "merge_lse", F16, seed)
    record(f"merge_states fp16, {count} states", "cascade", err, gpu_ms(lambda: fi.merge_states(v, s)))


@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("dtype", HALF)
def test_gdn_prefill(fi, record, dtype):
    seed = fresh_seed()
    q, k, v, g, beta, cu = gdn_inputs(dtype)
    (total, heads, dim), seqs = q.shape, len(cu) - 1
    out = poisoned((total, heads, dim), dtype)
    state = poisoned((seqs, heads, dim, dim), torch.float32)
    fi.chunk_gated_delta_rule(q, k, v, g, beta, None, None, True, cu, output=out, output_state=state)
    ref_out, ref_state = gated_delta_rule_ref(q, k, v, g, beta, cu, dim**-0.5)
    err = assert_close(out, ref_out, "gdn_prefill", dtype, seed)
    # The state is float32 but accumulates products of `dtype` inputs: judged at that precision.
    assert_close(state, ref_state, "gdn_state", dtype, seed)
    ms = gpu_ms(
        lambda: fi.chunk_gated_delta_rule(q, k, v, g, beta, None, None, True, cu, output=out, output_state=state)
    )
    record(f"chunk_gated_delta_rule {str(dtype)[6:]}", "gdn_prefill", err, ms)
