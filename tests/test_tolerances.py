"""Smoke's tolerances (tests/support/gpu_checks.py) catch a kernel bug of the size FlashInfer's own tests
catch: every fp16 bound is under 5e-3, and an fp16 output 0.5% off fails the check, while the
output's own rounding passes it."""

import pytest

from script_runs import require

require("torch", why="tests/support/gpu_checks.py is keyed by torch dtypes (torch is a flashinfer-dev package)")
import torch  # noqa: E402

import gpu_checks  # noqa: E402

PLANTED = 5e-3  # the fp16 bug every bound must catch


def test_every_fp16_bound_is_under_the_planted_bug():
    loose = {kernel: bounds[torch.float16] for kernel, bounds in gpu_checks.TOLERANCE.items()
             if torch.float16 in bounds and bounds[torch.float16] >= PLANTED}
    assert loose == {}, f"these fp16 bounds let a {PLANTED:.0e} bug through"


@pytest.mark.parametrize("kernel", [k for k, b in gpu_checks.TOLERANCE.items() if torch.float16 in b])
def test_a_half_percent_fp16_error_fails_and_rounding_passes(kernel):
    ref = torch.randn(4096, 256, dtype=torch.float64)
    gpu_checks.assert_close(ref.half(), ref, kernel, torch.float16, seed=0)  # fp16 rounding alone
    with pytest.raises(AssertionError, match=kernel):
        gpu_checks.assert_close((ref * (1 + PLANTED)).half(), ref, kernel, torch.float16, seed=0)
