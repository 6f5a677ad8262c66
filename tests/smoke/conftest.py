"""Fixtures of the GPU smoke suite (the shared GPU fixtures are in tests/conftest.py). Without a
GPU, or without FlashInfer, every test skips and says why; the smoke task (scripts/smoke.py) turns
"nothing ran" into a failure."""

import pytest

from fidev.builds import smoke_modules


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
    """record(kernel, module key, worst share of the allowance, ms): one row of the closing table."""
    from gpu_checks import add_result

    def add(kernel, key, err, ms):
        name, source = module_source(key)
        add_result(
            "flashinfer smoke",
            ("kernel", "module", "source", "error/allowance", "time"),
            (kernel, name, source, f"{err:.2f}", f"{ms:.3f} ms"),
        )

    return add
