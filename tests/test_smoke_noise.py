"""tools/smoke_noise.py's verdict, in its own process on the CPU: exit 1 where a run failed or where any
kernel's margin (the inverse of the largest share of its allowance an element took) is under 1.5x, every
kernel and dtype alike; else 0. The suite's runs are stood in for by what they leave in gpu_checks."""

import sys
import types

import pytest

from script_runs import tool_module


def noise(monkeypatch, capsys, shares, failed_runs=0):
    """smoke_noise.main() over 2 runs, each measuring `shares` ({(kernel, dtype): share}); (status, output)."""
    tool = tool_module("smoke_noise")
    checks = types.ModuleType("gpu_checks")
    checks.RESULTS, checks.MEASURED = {}, []
    checks.TOLERANCE = {kernel: {f"torch.{dtype}": (1e-3, 1e-3)} for kernel, dtype in shares}
    failures = iter([failed_runs > 0] + [False] * 9)

    def run(title, suite, args, mode):  # one run of the suite, as gpu_suite.run leaves it
        sys.modules["gpu_checks"] = checks
        checks.MEASURED.extend((kernel, dtype, share) for (kernel, dtype), share in shares.items())
        return int(next(failures))

    monkeypatch.setitem(sys.modules, "gpu_checks", checks)
    monkeypatch.setattr(tool.gpu_suite, "run", run)
    monkeypatch.setattr(sys, "argv", ["smoke_noise.py", "--runs", "2"])
    status = tool.main()
    return status, capsys.readouterr().out


@pytest.mark.parametrize("kernel", ["gdn_state", "rmsnorm"])
def test_a_margin_under_one_and_a_half_fails_whatever_the_kernel(monkeypatch, capsys, kernel):
    status, out = noise(monkeypatch, capsys, {(kernel, "bfloat16"): 0.7, ("silu_and_mul", "float16"): 0.1})
    assert status == 1
    assert out.splitlines()[-1].endswith(f"margins under 1.5x: {kernel} bfloat16")


def test_margins_of_one_and_a_half_or_more_pass(monkeypatch, capsys):
    status, out = noise(monkeypatch, capsys, {("gdn_state", "bfloat16"): 0.66, ("rmsnorm", "float16"): 0.2})
    assert status == 0, out
    assert out.splitlines()[-1] == "smoke-noise: 2 runs of smoke, 0 failed; margins under 1.5x: none"
    assert "1.5x" in next(line for line in out.splitlines() if line.startswith("gdn_state"))


def test_a_failed_run_fails_whatever_the_margins(monkeypatch, capsys):
    status, out = noise(monkeypatch, capsys, {("rmsnorm", "float16"): 0.2}, failed_runs=1)
    assert status == 1
    assert "2 runs of smoke, 1 failed" in out
