"""The rules of tests/support/gpu_checks.py that the GPU suites (tests/smoke, tests/abi_smoke) judge a
kernel by, held on the CPU: the float64 references against independent loop-by-loop ones, the
allowance and its boundary, what a failure says and what MEASURED keeps, the median timing, the
paged cache's page table, the gdn inputs, the poisoned outputs, the closing tables, and the norm and
silu tail sizes against the kernels' launches they are chosen for (tests/test_tolerances.py holds
the tolerances against FlashInfer's and against shapes of bug).

Where a function makes its tensors on the GPU, gpu_checks' `torch` is swapped for a stand-in: a
device="cuda" tensor is made on the CPU as an OnGpu (what is computed from it stays one), any other
device is refused, and a CUDA event reads a clock the timed function moves. What that cannot show is
named in docs/testing.md ("Mutation testing of the verdict rules")."""

import math
import types
import weakref

import pytest

from script_runs import require

require("torch", why="tests/support/gpu_checks.py is keyed by torch dtypes (torch is a flashinfer-dev package)")
import torch  # noqa: E402

import gpu_checks  # noqa: E402

F16, BF16, F64 = torch.float16, torch.bfloat16, torch.float64
MADE_ON_DEVICE = ("full", "randn", "rand", "randperm", "tensor", "zeros")


class OnGpu(torch.Tensor):
    """A tensor gpu_checks made with device="cuda", held on the CPU."""


class CudaStandIn:
    """gpu_checks' `torch` on a machine without a GPU."""

    def __init__(self):
        self.now = 0.0  # the clock a CUDA event reads, in ms
        self.made = []  # weak references to each tensor made on the GPU, in order
        self.live_at_synchronize = []
        self.cuda = types.SimpleNamespace(synchronize=self.synchronize, Event=self.event)

    def __getattr__(self, name):
        make = getattr(torch, name)
        if name not in MADE_ON_DEVICE:
            return make

        def on_gpu(*args, device=None, **kwargs):
            tensor = make(*args, **kwargs)
            if device is None:
                return tensor
            assert device == "cuda", f"torch.{name} on {device!r}"
            tensor = tensor.as_subclass(OnGpu)
            self.made.append(weakref.ref(tensor))
            return tensor

        return on_gpu

    def synchronize(self):
        self.live_at_synchronize.append([ref() is not None for ref in self.made])

    def event(self, enable_timing=False):
        assert enable_timing is True, "elapsed_time needs an event made with enable_timing=True"
        clock = self

        class Event:
            def record(self):
                self.at = clock.now

            def synchronize(self):
                assert hasattr(self, "at"), "synchronized on an event never recorded"

            def elapsed_time(self, end):
                return end.at - self.at

        return Event()


@pytest.fixture
def gpu(monkeypatch):
    stand_in = CudaStandIn()
    monkeypatch.setattr(gpu_checks, "torch", stand_in)
    return stand_in


@pytest.fixture
def measured(monkeypatch):
    rows = []
    monkeypatch.setattr(gpu_checks, "MEASURED", rows)
    return rows


def test_a_fresh_seed_is_four_random_bytes_and_the_one_torch_is_seeded_with(monkeypatch):
    asked, seeds = [], []
    for drawn in (bytes([1, 2, 3, 4]), bytes([4, 3, 2, 255])):
        monkeypatch.setattr(
            gpu_checks, "os", types.SimpleNamespace(urandom=lambda n, drawn=drawn: asked.append(n) or drawn[:n])
        )
        with torch.random.fork_rng():
            seed = gpu_checks.fresh_seed()
            assert torch.initial_seed() == seed
        seeds.append(seed)
    assert asked == [4, 4] and seeds[0] != seeds[1] and all(0 <= seed < 2**32 for seed in seeds)


def test_a_poisoned_output_is_nan_everywhere_on_the_gpu(gpu):
    out = gpu_checks.poisoned((3, 5), BF16)
    assert isinstance(out, OnGpu) and out.shape == (3, 5) and out.dtype == BF16
    assert out.isnan().all()


def test_the_allocator_is_handed_back_a_nan_block_of_each_outputs_size_once_they_are_written(gpu):
    gpu_checks.poison_allocator(((4, 8), F16), ((2,), BF16))
    assert gpu.live_at_synchronize == [[True, True]]  # both blocks held until the fills are done
    assert [ref() for ref in gpu.made] == [None, None]  # then freed, back to PyTorch's caching allocator


def test_poisoned_blocks_are_the_outputs_shapes_and_dtypes(gpu, monkeypatch):
    blocks = []
    monkeypatch.setattr(gpu.cuda, "synchronize", lambda: blocks.extend(ref() for ref in gpu.made))
    gpu_checks.poison_allocator(((4, 8), F16), ((2,), BF16))
    assert [(tuple(b.shape), b.dtype, bool(b.isnan().all()), type(b)) for b in blocks] == [
        ((4, 8), F16, True, OnGpu),
        ((2,), BF16, True, OnGpu),
    ]


def test_the_allowance_used_is_the_error_over_atol_plus_rtol_times_the_reference():
    out = torch.tensor([1.0, -2.0, 3.0], dtype=F16)
    ref = torch.tensor([1.5, -1.0, 3.0], dtype=torch.float32)
    used = gpu_checks.allowance_used(out, ref, rtol=0.1, atol=0.5)
    assert used.dtype == F64
    assert used.tolist() == pytest.approx([0.5 / (0.5 + 0.15), 1.0 / (0.5 + 0.1), 0.0], rel=1e-12)


def test_an_element_at_exactly_its_allowance_passes(measured):
    out = torch.tensor([[1e-3, 0.0], [0.0, -1e-3]], dtype=F64)
    assert gpu_checks.assert_close(out, torch.zeros(2, 2, dtype=F64), "rmsnorm", F16, seed=1) == 1.0
    assert measured == [("rmsnorm", "float16", 1.0)]


def test_a_failure_counts_only_the_elements_past_their_allowance_and_names_the_worst(measured):
    out = torch.tensor([1.2e-3, 0.0, 1.8e-3, 1e-3], dtype=F64)
    message = (
        r"^rmsnorm: 2 of 4 elements off by more than 0\.001 \+ 0\.001 \|ref\| for torch\.float16; "
        r"worst at \(2,\): 0\.0018 against 0, 1\.80x its allowance \(seed 7\)$"
    )
    with pytest.raises(AssertionError, match=message):
        gpu_checks.assert_close(out, torch.zeros(4, dtype=F64), "rmsnorm", F16, seed=7)
    assert measured == [("rmsnorm", "float16", pytest.approx(1.8))]


def test_a_kernel_is_judged_by_its_own_rtol_and_atol_at_the_dtype_asked(measured):
    ref = torch.tensor([0.0, 100.0], dtype=F64)
    # gdn_state at bf16: rtol 1e-3, atol 5e-3 / 0.15275 (FlashInfer's, carried to smoke's scale):
    # 0.032 passes on a zero, 0.132 on a hundred
    worst = gpu_checks.assert_close(ref + torch.tensor([0.032, 0.132]), ref, "gdn_state", BF16, seed=0)
    assert worst == pytest.approx(0.132 / (0.1 + 5e-3 / 0.15275252), rel=1e-6)
    message = r"^gdn_state: 1 of 2 elements off by more than 0\.0327327 \+ 0\.001 \|ref\|"
    with pytest.raises(AssertionError, match=message):
        gpu_checks.assert_close(ref + torch.tensor([0.0, 0.134]), ref, "gdn_state", BF16, seed=0)
    assert [row[:2] for row in measured] == [("gdn_state", "bfloat16")] * 2


def test_an_output_of_the_wrong_shape_fails_naming_both_shapes():
    with pytest.raises(AssertionError, match=r"^shape \(2, 3\) != reference \(3, 2\)$"):
        gpu_checks.assert_close(torch.zeros(2, 3), torch.zeros(3, 2), "rmsnorm", F16, seed=0)


def test_an_infinite_element_fails_as_one_not_written(measured):
    out = torch.tensor([0.0, float("inf"), float("-inf"), float("nan")], dtype=F16)
    with pytest.raises(AssertionError, match=r"^3 of 4 output elements are NaN/inf .* \(seed 9\)$"):
        gpu_checks.assert_close(out, torch.zeros(4, dtype=F64), "rmsnorm", F16, seed=9)
    assert measured == []


def test_a_timing_is_the_median_of_warm_calls_timed_by_cuda_events(gpu):
    def timed(durations):
        calls = iter(durations)

        def fn():
            gpu.now += next(calls)

        return fn

    # the first, cold call (1000 ms) is not timed; of twenty, the upper median
    assert gpu_checks.gpu_ms(timed([1000.0, *[float((7 * i) % 20 + 1) for i in range(20)]])) == 11.0
    assert gpu_checks.gpu_ms(timed([1000.0, 5.0, 1.0, 4.0, 2.0, 3.0]), reps=5) == 3.0
    with pytest.raises(StopIteration):  # twenty timed calls by default, not more
        gpu_checks.gpu_ms(timed([1000.0] + [1.0] * 19))


def naive_attention(q, k, v, causal):
    """softmax(q k / sqrt(d)) v query by query and head by head; query i of qo_len sees the keys up to
    i + kv_len - qo_len where causal; query head h reads kv head h // (Hq / Hkv)."""
    (qo_len, heads, dim), (kv_len, kv_heads, _) = q.shape, k.shape
    out = torch.zeros(qo_len, heads, dim, dtype=F64)
    for i in range(qo_len):
        seen = i + kv_len - qo_len + 1 if causal else kv_len
        for h in range(heads):
            kv = h // (heads // kv_heads)
            scores = [
                sum(q[i, h, d].item() * k[j, kv, d].item() for d in range(dim)) / math.sqrt(dim) for j in range(seen)
            ]
            weights = [math.exp(s - max(scores)) for s in scores]
            for j in range(seen):
                out[i, h] += weights[j] / sum(weights) * v[j, kv].double()
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("qo_len", "kv_len"), [(3, 5), (4, 4)])
def test_the_attention_reference_is_float64_softmax_with_gqa_and_causal_aligned_at_the_end(causal, qo_len, kv_len):
    generator = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(n, heads, 6, generator=generator).to(F16) for n, heads in [(qo_len, 4), (kv_len, 2), (kv_len, 2)]
    )
    ref = gpu_checks.attention_ref(q, k, v, causal=causal)
    assert ref.dtype == F64 and ref.shape == (qo_len, 4, 6)
    torch.testing.assert_close(ref, naive_attention(q, k, v, causal), rtol=1e-12, atol=1e-12)


def test_the_references_are_made_on_their_inputs_device():
    q, k, v = (
        torch.zeros(3, 4, 8, device="meta"),
        torch.zeros(5, 2, 8, device="meta"),
        torch.zeros(5, 2, 8, device="meta"),
    )
    assert gpu_checks.attention_ref(q, k, v, causal=True).device.type == "meta"
    g, beta, cu = torch.zeros(5, 2, device="meta"), torch.zeros(5, 2, device="meta"), torch.tensor([0, 2, 5])
    out, states = gpu_checks.gated_delta_rule_ref(k, k, v, g, beta, cu, 0.5)
    assert (out.device.type, states.device.type) == ("meta", "meta")


def naive_gated_delta_rule(q, k, v, g, beta, cu, scale):
    """The recurrence head by head with S as a [K, V] matrix, reset to zero for each sequence; each
    final state kept as S^T, [V, K]."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    out, states = (
        torch.zeros(v.shape, dtype=F64),
        torch.zeros(len(cu) - 1, q.shape[1], v.shape[2], q.shape[2], dtype=F64),
    )
    for n in range(len(cu) - 1):
        for h in range(q.shape[1]):
            state = torch.zeros(q.shape[2], v.shape[2], dtype=F64)
            for t in range(cu[n], cu[n + 1]):
                state = g[t, h] * state
                state = state + beta[t, h] * torch.outer(k[t, h], v[t, h] - state.T @ k[t, h])
                out[t, h] = scale * state.T @ q[t, h]
            states[n, h] = state.T
    return out, states


def test_the_gated_delta_rule_reference_is_the_float64_recurrence_per_sequence_and_head():
    generator = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int64)  # the second sequence has no tokens: its state stays zero
    q, k = (torch.randn(7, 2, 3, generator=generator).to(BF16) for _ in range(2))
    v = torch.randn(7, 2, 5, generator=generator).to(BF16)
    g, beta = (torch.rand(7, 2, generator=generator) for _ in range(2))
    out, states = gpu_checks.gated_delta_rule_ref(q, k, v, g, beta, cu, 0.25)
    expected_out, expected_states = naive_gated_delta_rule(q, k, v, g, beta, cu.tolist(), 0.25)
    assert (out.dtype, states.dtype, tuple(states.shape)) == (F64, F64, (3, 2, 5, 3))
    torch.testing.assert_close(out, expected_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(states, expected_states, rtol=1e-12, atol=1e-12)
    _, states = gpu_checks.gated_delta_rule_ref(q[:0], k[:0], v[:0], g[:0], beta[:0], cu[:2] * 0, 0.25)
    assert states.dtype == F64 and torch.equal(states, torch.zeros(1, 2, 5, 3, dtype=F64))  # a batch of one such


def test_the_merge_reference_is_attention_over_the_union_of_the_states_keys():
    """Attention over keys split into parts, each part's output and log2-sum-exp (FlashInfer's state: its
    logits' natural log-sum-exp over ln 2), merged by merge_ref: the output and log2-sum-exp of attention
    over all the keys, position by position and head by head."""
    generator = torch.Generator().manual_seed(7)
    parts = [3, 1, 6]
    logits = torch.randn(4, 2, sum(parts), generator=generator, dtype=F64) * 3  # [n, heads, keys]
    values = torch.randn(sum(parts), 2, 5, generator=generator, dtype=F64)  # [keys, heads, d]
    whole = torch.einsum("nhk,khd->nhd", logits.softmax(-1), values)
    states, lses, start = [], [], 0
    for size in parts:
        part = logits[..., start : start + size]
        states.append(torch.einsum("nhk,khd->nhd", part.softmax(-1), values[start : start + size]))
        lses.append(part.logsumexp(-1) / math.log(2))
        start += size
    out, lse = gpu_checks.merge_ref(torch.stack(states, 1).to(F16), torch.stack(lses, 1).float())
    assert (out.dtype, lse.dtype, tuple(out.shape), tuple(lse.shape)) == (F64, F64, (4, 2, 5), (4, 2))
    torch.testing.assert_close(out, whole, rtol=2e-3, atol=2e-3)  # the states' fp16 rounding
    torch.testing.assert_close(lse, logits.logsumexp(-1) / math.log(2), rtol=1e-6, atol=1e-6)
    swapped, _ = gpu_checks.merge_ref(torch.stack(states, 1)[:, [0, 2, 1]], torch.stack(lses, 1))
    with pytest.raises(AssertionError):  # each state weighs by its own log2-sum-exp, not another's
        torch.testing.assert_close(swapped, whole)


@pytest.mark.parametrize("gemma", [False, True])
def test_the_rmsnorm_reference_is_float64_row_by_row_with_the_kernels_epsilon(gemma):
    generator = torch.Generator().manual_seed(11)
    x = (torch.randn(2, 3, 5, generator=generator) * 1e-3).to(F16)  # small enough that EPS weighs in
    w = torch.randn(5, generator=generator).to(F16)
    args = (x, w, True) if gemma else (x, w)  # rmsnorm's default is the plain one
    ref = gpu_checks.rms_ref(*args)
    assert ref.dtype == F64
    for row in [(i, j) for i in range(2) for j in range(3)]:  # each row of the last dimension, however many before
        x64 = x[row].double()
        scale = 1 / math.sqrt(sum(e.item() ** 2 for e in x64) / 5 + gpu_checks.EPS)
        expected = x64 * scale * ((1 + w.double()) if gemma else w.double())
        torch.testing.assert_close(ref[row], expected, rtol=1e-12, atol=0)


def test_a_paged_cache_holds_each_sequence_on_shuffled_pages_where_its_page_table_points(gpu):
    kv_lens, page = [1, 16, 17, 40], 16
    with torch.random.fork_rng():
        torch.manual_seed(0)
        cache, indptr, indices, last, seqs = gpu_checks.paged_kv(kv_lens, page, 2, 8, F16)
    assert all(isinstance(t, OnGpu) for t in (cache, indptr, indices, last))
    assert tuple(cache.shape) == (7, 2, page, 2, 8) and cache.dtype == F16
    assert (indptr.dtype, indices.dtype, last.dtype) == (torch.int32,) * 3
    assert indptr.tolist() == [0, 1, 2, 4, 7] and last.tolist() == [1, 16, 1, 8]
    assert sorted(indices.tolist()) == list(range(7)) and indices.tolist() != list(range(7))
    for i, (n, (k, v)) in enumerate(zip(kv_lens, seqs, strict=True)):
        assert tuple(k.shape) == tuple(v.shape) == (n, 2, 8)
        for t in range(n):
            where = indices[indptr[i] + t // page], t % page
            assert torch.equal(k[t], cache[where[0], 0, where[1]]) and torch.equal(v[t], cache[where[0], 1, where[1]])


def test_gdn_inputs_are_drawn_as_flashinfers_test_draws_them_on_the_gpu(gpu):
    q, k, v, g, beta, cu = gpu_checks.gdn_inputs(BF16, heads=2, dim=16, seq_lens=(3, 5))
    assert all(isinstance(t, OnGpu) for t in (q, k, v, g, beta, cu))
    assert [(tuple(t.shape), t.dtype) for t in (q, k, v, g, beta)] == [((8, 2, 16), BF16)] * 3 + [
        ((8, 2), torch.float32)
    ] * 2
    assert cu.tolist() == [0, 3, 8] and cu.dtype == torch.int64
    torch.testing.assert_close(k.double().norm(dim=-1), torch.ones(8, 2, dtype=F64), rtol=0, atol=1e-2)
    assert q.double().norm(dim=-1).max() > 1.5 and v.double().norm(dim=-1).max() > 1.5  # q and v are not
    for gate in (g, beta):
        assert 0 <= gate.min() and gate.max() < 1


def test_gdn_inputs_default_to_the_sizes_the_suites_margins_were_measured_at(gpu):
    # docs/measurements.md's gdn margins are of 4 heads of 128 over sequences of 37 and 130 tokens
    q, *_, cu = gpu_checks.gdn_inputs(F16)
    assert tuple(q.shape) == (167, 4, 128) and cu.tolist() == [0, 37, 167]


class Reporter:
    def __init__(self):
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


def test_the_closing_tables_pad_each_column_to_its_widest_cell_one_section_a_title(monkeypatch):
    monkeypatch.setattr(gpu_checks, "RESULTS", {})
    gpu_checks.add_result("norm", ["kernel", "ms"], ["rmsnorm fp16", "0.01"])
    gpu_checks.add_result("gdn", ("kernel",), ("gdn",))
    gpu_checks.add_result("norm", ["kernel", "ms"], ["x", "12.345"])
    reporter = Reporter()
    gpu_checks.write_results(reporter)
    assert reporter.lines == [
        "== norm",
        "kernel        ms    ",
        "rmsnorm fp16  0.01  ",
        "x             12.345",
        "== gdn",
        "kernel",
        "gdn   ",
    ]


def test_a_row_with_more_cells_than_its_header_is_refused_not_cut(monkeypatch):
    monkeypatch.setattr(gpu_checks, "RESULTS", {})
    gpu_checks.add_result("norm", ["kernel"], ["rmsnorm", "0.01"])
    with pytest.raises(ValueError, match="zip"):
        gpu_checks.write_results(Reporter())


def norm_launch(d):
    """(halves a vector, threads that load, rounds) of FlashInfer's norm kernels over a row of d halves, as
    gpu_checks' NORM_SIZES comment reads include/flashinfer/norm.cuh at v0.6.3; threads launch in whole warps."""
    vec = math.gcd(8, d)
    threads = min(1024, d // vec)
    return vec, threads, math.ceil(d / (vec * threads))


def test_the_norm_sizes_reach_each_case_of_the_kernels_loads():
    launches = [norm_launch(d) for d in gpu_checks.NORM_SIZES]
    # one round with a last warp part idle, at vectors of 1 and of 4 halves (no partial vector)
    assert {vec for vec, threads, rounds in launches if rounds == 1 and threads % 32} == {1, 4}
    assert (8, 1024, 1) in launches  # one round of all 1024 threads
    assert any(rounds > 1 for *_, rounds in launches)  # the loop past its first round


def silu_launch(d):
    """(whole 16-byte vectors, threads, passes of thread 0's vector loop, elements of the scalar remainder
    loop) of silu_and_mul over a row of d halves, as gpu_checks' SILU_TAIL_SIZES comment reads
    flashinfer/jit/activation.py and include/flashinfer/activation.cuh at v0.6.3."""
    vec = 16 // 2
    threads = min(1024, d // vec)
    return d * 2 % 16 == 0, threads, math.ceil(d // vec / threads), d % (threads * vec)


def test_the_silu_tail_sizes_are_whole_vectors_past_the_threads_first_pass():
    launches = [silu_launch(d) for d in gpu_checks.SILU_TAIL_SIZES]
    assert launches, "no tail size: smoke's silu_and_mul would test the plain 3072 only"
    for whole, threads, passes, _ in launches:
        assert whole  # silu_and_mul refuses a row of partial vectors
        assert threads == 1024 and passes > 1  # more vectors than its 1024 threads: the vector loop's second pass
    assert any(remainder for *_, remainder in launches)  # the scalar remainder loop runs (the last 8 again)
