"""The --wide option of the GPU smoke suite (tests/smoke). Kept at the tests root so that pytest
registers it however it is started."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--wide", action="store_true", help="also run the wider GPU smoke tier")


def pytest_collection_modifyitems(config, items):
    skip_wide = pytest.mark.skip(reason="wider smoke tier: run with --wide")
    for item in items:
        if "wide" in item.keywords and not config.getoption("--wide"):
            item.add_marker(skip_wide)
