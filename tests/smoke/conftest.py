"""Fixtures of the GPU smoke suite. Without a GPU, or without FlashInfer, every test skips and
says why; the smoke task (scripts/smoke.py) turns "nothing ran" into a failure."""

import pytest

from fidev import kernels, smoke_modules

SMOKE_ROWS = []  # one per measured kernel, printed as the closing table


@pytest.fixture(scope="session")
def fi():
    """The flashinfer package, imported in the workspace's kernel source mode."""
    kernels.apply()
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch.cuda.is_available() is False")
    try:
        import flashinfer
    except ImportError as e:
        pytest.skip(f"flashinfer is not importable: {e}")
    return flashinfer


@pytest.fixture(scope="session")
def arch(fi):
    import torch

    return torch.cuda.get_device_capability()


@pytest.fixture
def sm90(arch):
    if arch != (9, 0):
        pytest.skip(f"needs sm_90 (Hopper); this GPU is sm_{arch[0]}{arch[1]}")


@pytest.fixture(scope="session")
def module_source(fi):
    """'prebuilt' when flashinfer-jit-cache provides the module, else 'compiled'."""
    cache = {}

    def source(key):
        if key not in cache:
            spec = smoke_modules.BY_KEY[key].make()
            cache[key] = (spec.name, "prebuilt" if spec.is_aot else "compiled")
        return cache[key]

    return source


@pytest.fixture
def record(module_source):
    """record(kernel, module key, max rel err, ms): one row of the closing table."""
    def add(kernel, key, err, ms):
        name, source = module_source(key)
        SMOKE_ROWS.append({"kernel": kernel, "module": name, "source": source, "err": err, "ms": ms})

    return add


def pytest_terminal_summary(terminalreporter):
    if not SMOKE_ROWS:
        return
    header = ("kernel", "module", "source", "max rel err", "time")
    rows = [header] + [(r["kernel"], r["module"], r["source"], f"{r['err']:.2e}", f"{r['ms']:.3f} ms") for r in SMOKE_ROWS]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    terminalreporter.section("flashinfer smoke")
    for row in rows:
        terminalreporter.write_line("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


@pytest.fixture(params=["fa2", "fa3"])
def attention_backend(request):
    """The attention backends under test; fa3 runs on sm_90 only."""
    if request.param == "fa3":
        request.getfixturevalue("sm90")
    return request.param
