"""Test setup shared by tests/cpu (CI, no GPU) and tests/gpu (an sm_90 GPU).

Puts the source package (python/) and tests/ on sys.path, so the suite runs from a checkout
with the library built into build/ (or FLASHBACK_LIBRARY pointing at it), and skips tests
marked `gpu` when no sm_90 GPU is present: they are skipped, never faked.
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# FLASHBACK_TEST_INSTALLED=1 leaves python/ off the path, so the installed package (a wheel) is
# what the suite imports.
INSTALLED = os.environ.get("FLASHBACK_TEST_INSTALLED") == "1"
for path in ([] if INSTALLED else [os.path.join(ROOT, "python")]) + [os.path.join(ROOT, "tests")]:
    if path not in sys.path:
        sys.path.insert(0, path)


def _gpu_skip_reason():
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"needs an sm_90 GPU, found sm_{major}{minor}"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an sm_90 GPU (H100/H200); skipped without one")


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


_PARTIAL = []


def _partial_build():
    """Whether the loaded library leaves a head dim or dtype of the family out (a build with
    FLASHBACK_HEADDIMS / FLASHBACK_DTYPES narrowed for speed). Asked once per session."""
    if not _PARTIAL:
        try:
            from flashback import _checks, _lib
            lib = _lib.load()
            _PARTIAL.append(not all(lib.flashback_supports(d, c) for d in _checks.SUPPORTED_HEADDIMS
                                    for c in (_lib.DTYPE_BF16, _lib.DTYPE_FP16)))
        except Exception:  # no library: every GPU test fails loudly on its own
            _PARTIAL.append(False)
    return _PARTIAL[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A GPU test that asks a narrowed build for a head dim or dtype it left out is reported as
    skipped, with the library's message. Only for narrowed builds: with every instance built, the
    same error is a failure."""
    outcome = yield
    rep = outcome.get_result()
    if call.when != "call" or call.excinfo is None or "gpu" not in item.keywords:
        return
    err = call.excinfo.value
    if (isinstance(err, ValueError) and "not supported by this build of flashback" in str(err)
            and _partial_build()):
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {err}")
