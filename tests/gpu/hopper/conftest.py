# Hopper primitive tests: need an sm_90 GPU and the compiled test library; on any other machine
# (CI is CPU-only) every test here is collected and skipped with the reason.
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hopper_lib  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (and for Hopper tests, sm_90)")


@pytest.fixture(scope="session")
def hlib():
    reason = hopper_lib.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return hopper_lib.load()
