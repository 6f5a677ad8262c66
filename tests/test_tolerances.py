"""Smoke's element-wise check (tests/support/gpu_checks.py) is as strict as FlashInfer's own tests:
no fp16 rule looser than their rtol = atol = 1e-3 (gdn's state aside: FlashInfer's own rule for it, carried to
smoke's scale of v, tested below), the output's own rounding passes, and kernel bugs
that are not a uniform scale fail. A max-normalised measure (max|out - ref| / max|ref| under 2e-3,
smoke's check before this one) let every non-uniform shape below through at smoke's output sizes."""

import pytest

from script_runs import require

require("torch", why="tests/support/gpu_checks.py is keyed by torch dtypes (torch is a flashinfer-dev package)")
import torch  # noqa: E402

import gpu_checks  # noqa: E402

F16, BF16 = torch.float16, torch.bfloat16
FLASHINFER_FP16 = (1e-3, 1e-3)  # rtol, atol of FlashInfer's fp16 tests of these kernels at v0.6.3
FP16_KERNELS = [k for k, rules in gpu_checks.TOLERANCE.items() if F16 in rules]
BF16_KERNELS = [k for k, rules in gpu_checks.TOLERANCE.items() if BF16 in rules]


def reference() -> torch.Tensor:
    """Values of the size smoke's norm outputs reach (max |ref| about 10 to 20), on a fixed seed; a
    last dimension of 111, a row with a tail past its last full vector of 8 fp16 values."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(2048, 111, dtype=torch.float64, generator=generator) * 4


# The shapes of bug the check must catch: each moves some elements by more than the fp16 allowance.
def uniform_scale(ref):  # the whole output 0.5% too large
    return ref * 1.005


def below_one_off(ref):  # 1% error on every element below 1 in magnitude
    return torch.where(ref.abs() < 1, ref * 1.01, ref)


def offset(ref):  # +0.012 on every element
    return ref + 0.012


def small_zeroed(ref):  # elements under 0.02 written as 0
    return torch.where(ref.abs() < 0.02, torch.zeros_like(ref), ref)


def tail_off(ref):  # 1% error on the 7 elements of each row past its last full vector
    out = ref.clone()
    out[:, 104:] *= 1.01
    return out


FP16_BUGS = [uniform_scale, below_one_off, offset, small_zeroed, tail_off]
BF16_BUGS = [offset, small_zeroed]  # bf16's own rounding (2^-8 of a value) hides a 1% error


def test_no_fp16_rule_is_looser_than_flashinfers():
    loose = {
        k: gpu_checks.TOLERANCE[k][F16]
        for k in FP16_KERNELS
        if k != "gdn_state"  # FlashInfer's state rule, carried to smoke's inputs' scale: its own tests below
        if any(ours > theirs for ours, theirs in zip(gpu_checks.TOLERANCE[k][F16], FLASHINFER_FP16, strict=True))
    }
    assert loose == {}


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_the_outputs_own_rounding_passes(dtype):
    ref = reference()
    for kernel in FP16_KERNELS if dtype == F16 else BF16_KERNELS:
        if kernel == "gdn_state":
            continue  # float32: its rounding is far below any rule
        used = gpu_checks.assert_close(ref.to(dtype), ref, kernel, dtype, seed=0)
        assert used < 0.5, f"{kernel}: rounding alone takes {used:.2f} of the allowance"


@pytest.mark.parametrize("bug", FP16_BUGS, ids=lambda bug: bug.__name__)
@pytest.mark.parametrize("kernel", FP16_KERNELS)
def test_an_fp16_bug_of_each_shape_fails(kernel, bug):
    ref = reference()
    with pytest.raises(AssertionError, match=f"^{kernel}: .* elements off by more than"):
        gpu_checks.assert_close(bug(ref).to(F16), ref, kernel, F16, seed=0)


@pytest.mark.parametrize("bug", BF16_BUGS, ids=lambda bug: bug.__name__)
@pytest.mark.parametrize("kernel", [k for k in BF16_KERNELS if k != "gdn_state"])
def test_a_bf16_bug_of_each_shape_it_can_see_fails(kernel, bug):
    ref = reference()
    with pytest.raises(AssertionError, match=f"^{kernel}: "):
        gpu_checks.assert_close(bug(ref).to(BF16), ref, kernel, BF16, seed=0)


def test_an_unwritten_element_fails_whatever_its_neighbours():
    ref = reference()
    out = ref.to(F16)
    out[5, 110] = float("nan")
    with pytest.raises(AssertionError, match="1 of 227328 output elements are NaN"):
        gpu_checks.assert_close(out, ref, "rmsnorm", F16, seed=0)


def test_the_failure_names_the_worst_element_and_the_seed():
    ref = reference()
    out = ref.to(F16)
    out[3, 17] += 1.0
    with pytest.raises(AssertionError, match=r"1 of 227328 elements .* worst at \(3, 17\): .* \(seed 42\)"):
        gpu_checks.assert_close(out, ref, "silu_and_mul", F16, seed=42)


# gdn's state: FlashInfer's rule (tests/gdn/test_prefill_delta_rule.py at v0.6.3), set for the inputs of
# tests/gdn/conftest.py's gen_qkv, and carried to gdn_inputs' N(0, 1) inputs by v's scale.
FLASHINFER_GDN_STATE = {F16: (1e-4, 1e-3), BF16: (1e-3, 5e-3)}


def gen_qkv_rows(rows, dim, generator):
    """tests/gdn/conftest.py's multidist_randu at v0.6.3 as gen_qkv calls it (mean_std=0.05, lower=-0.25,
    upper=0.25): per row, uniform within 0.25 of a mean drawn from N(0, 0.05)."""
    means = torch.randn(rows, 1, dtype=torch.float64, generator=generator) * 0.05
    return means + (torch.rand(rows, dim, dtype=torch.float64, generator=generator) * 0.5 - 0.25)


def test_gdn_state_rule_is_flashinfers_at_the_scale_of_flashinfers_v():
    generator = torch.Generator().manual_seed(0)
    v = gen_qkv_rows(20_000, 128, generator)
    assert v.pow(2).mean().sqrt().item() == pytest.approx(gpu_checks.GDN_V_RMS, rel=2e-3)
    for dtype, (rtol, atol) in FLASHINFER_GDN_STATE.items():
        assert gpu_checks.TOLERANCE["gdn_state"][dtype] == pytest.approx((rtol, atol / gpu_checks.GDN_V_RMS))


def gdn_case(dtype):
    """gdn_inputs' shapes and draws, on the CPU, and the exact state of each sequence."""
    generator = torch.Generator().manual_seed(1)
    total, heads, dim = 167, 4, 128
    q = torch.randn(total, heads, dim, generator=generator).to(dtype)
    keys = torch.randn(total, heads, dim, generator=generator)
    k = torch.nn.functional.normalize(keys, dim=-1).to(dtype)
    v = torch.randn(total, heads, dim, generator=generator).to(dtype)
    g, beta = torch.rand(total, heads, generator=generator), torch.rand(total, heads, generator=generator)
    return q, k, v, g, beta, torch.tensor([0, 37, 167])


def final_state(q, k, v, g, beta, cu):
    return gpu_checks.gated_delta_rule_ref(q, k, v, g, beta, cu, q.shape[-1] ** -0.5)[1]


def test_the_gdn_state_is_linear_in_v():
    """What carries FlashInfer's atol to smoke's scale: v scaled, the exact state scales with it."""
    q, k, v, g, beta, cu = gdn_case(F16)
    torch.testing.assert_close(final_state(q, k, 4 * v, g, beta, cu), 4 * final_state(q, k, v, g, beta, cu))


def last_token_skipped(q, k, v, g, beta, last):  # its gate and its update not applied
    return q, k, v, g.index_fill(0, last, 1.0), beta.index_fill(0, last, 0.0)


def last_gate_ignored(q, k, v, g, beta, last):
    return q, k, v, g.index_fill(0, last, 1.0), beta


def beta_ignored(q, k, v, g, beta, last):  # every update at full strength
    return q, k, v, g, torch.ones_like(beta)


def last_key_negated(q, k, v, g, beta, last):
    return q, k.index_copy(0, last, -k[last]), v, g, beta


def last_beta_tenth_less(q, k, v, g, beta, last):  # near the rule's edge: in bf16 a rule twice as loose passes it
    return q, k, v, g, beta.index_copy(0, last, beta[last] * 0.9)


@pytest.mark.parametrize(
    "bug", [last_token_skipped, last_gate_ignored, beta_ignored, last_key_negated, last_beta_tenth_less]
)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_a_gdn_state_bug_fails_the_carried_rule(dtype, bug):
    q, k, v, g, beta, cu = gdn_case(dtype)
    ref = final_state(q, k, v, g, beta, cu)
    wrong = final_state(*bug(q, k, v, g, beta, cu[1:] - 1), cu)
    with pytest.raises(AssertionError, match="^gdn_state: "):
        gpu_checks.assert_close(wrong.float(), ref, "gdn_state", dtype, seed=0)
    gpu_checks.assert_close(ref.float(), ref, "gdn_state", dtype, seed=0)  # float32's own rounding passes
