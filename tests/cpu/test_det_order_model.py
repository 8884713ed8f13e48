"""scripts/det_order_model.py: its event model agrees with the list-scheduling one where both
apply, finds the deadlock a wrong order makes, and keeps the candidate order's claim (the walk
from the end, adds from unit 0 up) at one small shape."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts"))

import det_order_model as m  # noqa: E402


def test_event_model_matches_the_list_model_without_jitter():
    for seqlen, pairs, l2, slots in ((1024, 8, 2, 6), (2048, 4, 1, 10), (1024, 3, 3, 50)):
        base, _ = m.makespan(seqlen, pairs, l2, slots, 160, False)
        det, _ = m.makespan(seqlen, pairs, l2, slots, 160, True)
        assert m.event_makespan(seqlen, pairs, l2, slots, 160, "default") == (base, 0)
        assert m.event_makespan(seqlen, pairs, l2, slots, 160, "prod") == (det, 0)


def test_from_end_keeps_the_default_makespan_and_never_deadlocks():
    for seqlen, pairs, l2, slots in ((1024, 8, 2, 6), (2048, 4, 1, 10), (1024, 3, 3, 1), (4096, 2, 1, 3)):
        base, _ = m.event_makespan(seqlen, pairs, l2, slots, 160, "default")
        t, stuck = m.event_makespan(seqlen, pairs, l2, slots, 160, "from_end")
        assert stuck == 0
        assert t <= base * 1.02, (seqlen, pairs, slots, t, base)
        # with jitter it may lose a little, never deadlock
        tj, stuck = m.event_makespan(seqlen, pairs, l2, slots, 160, "from_end", jitter=0.3, seed=5)
        assert stuck == 0 and tj > 0


def test_a_unit_waiting_for_one_that_cannot_launch_is_a_deadlock():
    # Adds from the top with the longest walks launched first: with one slot, unit 0 waits on its
    # second tile for unit 1, which never gets a slot. Production's pairing is safe there.
    t, stuck = m.event_makespan(1024, 1, 1, 1, 160, (False, False, "top", False))
    assert stuck == 1
    assert m.event_makespan(1024, 1, 1, 1, 160, "prod")[1] == 0


def test_gqa_heads_inner_keeps_from_end_at_the_default():
    # With the q heads outer, a higher unit (a shorter walk) reaches the next head's tiles before
    # the lower units and waits there; with them inner (what bwd_sm90_iter does) it does not.
    for group in (2, 4):
        base, _ = m.event_makespan(4096, 8, 2, 66, 160, "default", group=group)
        inner, stuck = m.event_makespan(4096, 8, 2, 66, 160, "from_end", group=group)
        outer, stuck_outer = m.event_makespan(4096, 8, 2, 66, 160, (False, True, "bottom", False), group=group)
        assert stuck == 0 and stuck_outer == 0
        assert inner <= base * 1.02, (group, inner, base)
        assert outer > inner * 1.05, (group, outer, inner)


def test_a_slow_turn_hand_off_costs_from_end_little_and_never_deadlocks():
    # latency: a tile's turn reaches the next unit that many steps after the last add. It can
    # only lengthen the makespan (0 is the model without it), and the walk from the end stays
    # within a few percent of the default: the order is not what the deterministic pair loses on.
    for seqlen, pairs, l2, slots in ((2048, 4, 1, 10), (4096, 8, 2, 24)):
        base, _ = m.event_makespan(seqlen, pairs, l2, slots, 160, "default")
        t0, stuck0 = m.event_makespan(seqlen, pairs, l2, slots, 160, "from_end")
        assert m.event_makespan(seqlen, pairs, l2, slots, 160, "from_end", latency=0.0) == (t0, stuck0)
        prev = t0
        for latency in (0.2, 0.4, 0.6):
            t, stuck = m.event_makespan(seqlen, pairs, l2, slots, 160, "from_end", latency=latency)
            assert stuck == 0
            assert t >= prev - 1e-9, (latency, t, prev)
            assert t <= base * 1.08, (seqlen, latency, t, base)
            prev = t
