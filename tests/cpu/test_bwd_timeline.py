"""scripts/bwd_timeline.py's summary on fabricated stamps: segments between consecutive events
per role, the last one to the next step's top; the first step, steps without a next top and
steps with a missing stamp left out."""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bwd_timeline  # noqa: E402


def stamps_of(ctas, steps, gaps, step_clocks):
    """Each step starts at step * step_clocks; event e at the sum of gaps[wg][:e]."""
    t = np.zeros((ctas, steps, 2, 16), dtype=np.int64)
    for c in range(ctas):
        for s in range(steps):
            for wg in (0, 1):
                t[c, s, wg, : len(gaps[wg]) + 1] = 1000 + s * step_clocks + np.concatenate(([0], np.cumsum(gaps[wg])))
    return t


def test_segments_per_role():
    gaps = {0: [10, 20, 30, 40, 50, 60, 70, 80], 1: [5, 5, 5, 5, 5, 5, 5, 5]}
    t = stamps_of(2, 6, gaps, 1000)
    rows = bwd_timeline.summarize(t, 2, 6)
    assert len(rows[0]) == len(bwd_timeline.SEGMENTS[0]) == len(bwd_timeline.EVENTS)
    # steps 1..4 give segments (step 0 and the last step only bound them): 4 per CTA
    for wg in (0, 1):
        assert all(len(s) == 8 for s in rows[wg])
        assert [s[0] for s in rows[wg][:-1]] == gaps[wg]
        assert rows[wg][-1][0] == 1000 - sum(gaps[wg])  # step end to the next step's top
        assert sum(s.mean() for s in rows[wg]) == 1000


def test_unwritten_steps_are_skipped():
    gaps = {0: [1] * 8, 1: [2] * 8}
    t = stamps_of(1, 8, gaps, 100)
    t[0, 3, 1, 4] = 0  # one missing stamp: warpgroup 1 of step 3 drops out, warpgroup 0 keeps it
    t[0, 6:, :, :] = 0  # steps past the walk were never written
    rows = bwd_timeline.summarize(t, 1, 8)
    assert len(rows[0][0]) == 4  # steps 1..4 (5 has no next top)
    assert len(rows[1][0]) == 3  # steps 1, 2, 4: step 3 has its top, so step 2 keeps its last segment
    assert (rows[1][-1] == 100 - 16).all()


def test_step_zero_is_left_out_not_the_first_full_step():
    # Causal pairs: step 0 is a ghost step in one CTA (its top only); step 1 still counts.
    gaps = {0: [3] * 8, 1: [4] * 8}
    t = stamps_of(1, 4, gaps, 50)
    t[0, 0, :, 1:] = 0
    rows = bwd_timeline.summarize(t, 1, 4)
    assert len(rows[0][0]) == 2  # steps 1, 2 (3 has no next top)


def test_producer_segments():
    steps, step_clocks = 5, 1000
    t = np.zeros((1, steps, 2, 16), dtype=np.int64)
    for s in range(steps):
        top = 1000 + s * step_clocks
        t[0, s, 0, :9] = top + np.arange(9) * 10          # wg 0: input at top + 10, step end at top + 80
        t[0, s, 1, :9] = top + np.arange(9) * 11          # wg 1: input at top + 11, step end at top + 88
        # the producer loads step s's rows after the previous step's end
        free = (1000 + (s - 1) * step_clocks + 88 + 7) if s else top - 50
        t[0, s, 0, bwd_timeline.PRODUCER_QFREE] = free
        t[0, s, 0, bwd_timeline.PRODUCER_DO_ISSUED] = free + 3
    segs = bwd_timeline.summarize_producer(t, 1, steps)
    assert [len(x) for x in segs] == [steps - 1] * 4  # step 0 has no previous release
    assert (segs[0] == 7).all()  # after the later release (wg 1's, at + 88)
    assert (segs[1] == step_clocks + 10 - 88 - 7).all()
    assert (segs[2] == 3).all()
    assert (segs[3] == step_clocks + 11 - 88 - 7 - 3).all()
    t[0, 2, 0, bwd_timeline.PRODUCER_DO_ISSUED] = 0  # a ghost step: the producer stamps nothing
    assert [len(x) for x in bwd_timeline.summarize_producer(t, 1, steps)] == [steps - 2] * 4


def test_producer_segments_two_stages():
    # With two Q stages step s reuses the stage of step s - 2: the release paired with its free.
    steps, step_clocks = 6, 1000
    t = np.zeros((1, steps, 2, 16), dtype=np.int64)
    for s in range(steps):
        top = 1000 + s * step_clocks
        t[0, s, 0, :9] = top + np.arange(9) * 10
        t[0, s, 1, :9] = top + np.arange(9) * 11
        free = (1000 + (s - 2) * step_clocks + 88 + 5) if s >= 2 else top - 900
        t[0, s, 0, bwd_timeline.PRODUCER_QFREE] = free
        t[0, s, 0, bwd_timeline.PRODUCER_DO_ISSUED] = free + 3
    segs = bwd_timeline.summarize_producer(t, 1, steps, q_stages=2)
    assert [len(x) for x in segs] == [steps - 2] * 4
    assert (segs[0] == 5).all()
    assert (segs[1] == 2 * step_clocks + 10 - 88 - 5).all()
    # read as one stage, the same stamps give a free before its release
    assert (bwd_timeline.summarize_producer(t, 1, steps)[0][1:] < 0).all()


def test_cta_summary():
    # Two SMs; SM 0 runs CTAs 0 then 2, SM 1 runs CTA 1 (its own steps, no ghost) and then
    # nothing: the tail is the time after SM 1's last exit.
    steps = 3
    t = np.zeros((3, steps, 2, 16), dtype=np.int64)
    cta_ns = {0: (0, 0, 10_000), 1: (1, 0, 6_000), 2: (0, 10_500, 20_000)}  # sm, entry, exit
    for c, (sm, e, x) in cta_ns.items():
        for wg in (0, 1):
            t[c, 0, wg, bwd_timeline.CTA_ENTRY] = 100
            t[c, 0, wg, 0] = 100 + 40 * (c + 1)  # step 0's top
            for s in range(steps):
                t[c, s, wg, len(bwd_timeline.EVENTS) - 1] = 1000 + 500 * s  # step ends
            t[c, 0, wg, bwd_timeline.CTA_EXIT] = 1000 + 500 * (steps - 1) + 30 * (c + 1)
            t[c, 0, wg, bwd_timeline.CTA_ENTRY_NS] = e + 1 + wg  # the warpgroups' stamps differ
            t[c, 0, wg, bwd_timeline.CTA_EXIT_NS] = x - wg
            t[c, 0, wg, bwd_timeline.CTA_SM] = sm
    r = bwd_timeline.summarize_ctas(t, 3, steps)
    assert list(r["prologue"]) == [40, 80, 120]
    assert list(r["epilogue"]) == [30, 60, 90]
    assert r["sms"] == 2
    assert r["span_ns"] == 20_000 - 1
    assert list(r["gaps_ns"]) == [10_501 - 10_000]
    assert r["tail_ns"] == 20_000 - 6_000
    busy = (10_000 - 1) + (6_000 - 1) + (20_000 - 10_501)
    assert abs(r["busy"] - busy / (2 * (20_000 - 1))) < 1e-12
    t[:, :, :, bwd_timeline.CTA_ENTRY:] = 0  # a library without the CTA stamps
    assert bwd_timeline.summarize_ctas(t, 3, steps) is None
