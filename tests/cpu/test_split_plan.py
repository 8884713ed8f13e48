"""The head-dim-256 backward's split last wave: its plan (bwd_sm90_split_plan, through the C
API's flashback_debug_bwd_split_plan; no GPU needed). A partial last wave of r units is split in
two by query range where that shortens it: r at most half the resident clusters, a walk of at
least 64 steps, at least two Q blocks per head; at most 36 split units (the workspace's room)."""
import ctypes
import os

import pytest

from flashback import _lib


@pytest.fixture(scope="module")
def native():
    if not _lib.is_loadable():
        pytest.skip("libflashback.so is not built")
    return _lib.load()


def plan(lib, units, slots, m_blocks, group=1):
    first, parts = ctypes.c_int(), ctypes.c_int()
    lib.flashback_debug_bwd_split_plan(units, slots, m_blocks, group, ctypes.byref(first), ctypes.byref(parts))
    return (first.value, parts.value) if parts.value > 1 else None


def test_benchmark_shapes(native):
    """16384 tokens x 8 heads on 66 clusters: 4k and 8k leave 40 units in the last wave (more
    than half: two parts would take two half-walk waves, no shorter), 16k leaves 32 (split: 792
    units first, then 32 x 2 parts)."""
    if os.environ.get("FLASHBACK_BWD_SPLIT") == "0":
        pytest.skip("FLASHBACK_BWD_SPLIT=0 is set")
    assert plan(native, 4 * 8 * 26, 66, 64) is None
    assert plan(native, 2 * 8 * 52, 66, 128) is None
    assert plan(native, 1 * 8 * 103, 66, 256) == (792, 2)


def test_edges(native):
    if os.environ.get("FLASHBACK_BWD_SPLIT") == "0":
        pytest.skip("FLASHBACK_BWD_SPLIT=0 is set")
    assert plan(native, 26, 66, 64) == (0, 2)          # one partial wave: all of it splits
    assert plan(native, 26, 66, 63) is None            # a walk under 64 steps
    assert plan(native, 26, 66, 4, group=16) == (0, 2)  # 64 steps from 4 Q blocks x 16 heads
    assert plan(native, 26, 66, 1, group=64) is None   # one Q block: nothing to split
    assert plan(native, 132, 66, 64) is None           # whole waves only
    assert plan(native, 66 + 33, 66, 64) == (66, 2)    # exactly half the slots
    assert plan(native, 66 + 34, 66, 64) is None       # one more: two waves of parts
    assert plan(native, 144 + 36, 72, 64) == (144, 2)  # 36 units: the workspace's most
    assert plan(native, 37, 80, 64) is None            # 37 would outgrow it
    assert plan(native, 26, 0, 64) is None             # no cluster fits
