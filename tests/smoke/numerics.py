"""Poisoning, float64 references and error measures shared by the smoke tests."""

import os

import torch

# Largest accepted max-relative error, by the dtype the kernel computes in.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


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


def max_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref|, after checking every element was written and is finite."""
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    bad = (~torch.isfinite(out)).sum().item()
    assert bad == 0, f"{bad} of {out.numel()} output elements are NaN/inf (not written, or overflow)"
    ref = ref.double()
    return ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def assert_close(out, ref, dtype, seed) -> float:
    err = max_rel_err(out, ref)
    assert err < TOLERANCE[dtype], f"max relative error {err:.3e} >= {TOLERANCE[dtype]:.0e} for {dtype} (seed {seed})"
    return err


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
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(kv_lens, pages_per_seq, strict=True)], dtype=torch.int32, device="cuda")
    seqs = []
    for i, n in enumerate(kv_lens):
        pages = cache[order[indptr[i]:indptr[i + 1]].long()]  # [p, 2, page, H, D]
        kv = pages.transpose(0, 1).reshape(2, -1, kv_heads, dim)[:, :n]
        seqs.append((kv[0], kv[1]))
    return cache, indptr, order, last, seqs
