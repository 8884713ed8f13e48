"""scripts/bwd_balance_model.py: the pair grid's walks in launch order and the two fills."""
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bwd_balance_model as m  # noqa: E402


def test_walks_non_causal_are_whole():
    w = m.walks(4, 4096, 8, causal=False)
    assert len(w) == 32 * math.ceil(math.ceil(4096 / 80) / 2)
    assert set(w) == {4096 // 64}


def test_walks_causal_longest_first_in_each_group():
    batch, seqlen, heads = 4, 4096, 8
    w = m.walks(batch, seqlen, heads, causal=True)
    units = math.ceil(math.ceil(seqlen / 80) / 2)
    group = m.L2_ROWS // seqlen  # 4 (batch, kv head) pairs per L2 group
    first_group = w[: group * units]
    # unit-major inside the group: each unit's walk repeated for the group's pairs, shrinking
    for u in range(units):
        steps = first_group[u * group:(u + 1) * group]
        assert steps == [64 - (160 * u) // 64] * group
    assert sum(w) == batch * heads * sum(64 - (160 * u) // 64 for u in range(units))


def test_persistent_without_hiding_is_the_greedy_fill():
    steps = m.walks(2, 8192, 8, causal=True)
    for fixed in (0.0, 1.5):
        tiles = m.greedy(steps, 66, fixed)
        assert m.persistent_makespan(steps, 66, fixed, 0.0) == tiles
        assert m.persistent_makespan(steps, 66, fixed, 1.0) <= tiles


def test_persistent_by_hand():
    # Two slots, F = 2, half of it hidden after a slot's first unit: A runs 4 (+2) then 1 (+1),
    # B runs 3 (+2) then 2 (+1); both end at 8.
    assert m.persistent_makespan([4, 3, 2, 1], 2, 2.0, 0.5) == 8.0
    # Fully hidden: only a slot's first unit pays F. A runs 5 (+1): 6; B runs 4 (+1), then 3: 8.
    assert m.persistent_makespan([5, 4, 3], 2, 1.0, 1.0) == 8.0


def test_fixed_cost_weighs_more_on_shorter_walks():
    share = {}
    for seqlen in (4096, 8192):
        r = m.model(16384 // seqlen, seqlen, 8, True, 1.0, 0.7, 132)
        assert r["bare"] <= r["tiles"] and r["ideal"] <= r["bare"]
        share[seqlen] = (r["tiles"] - r["bare"]) / r["tiles"]
    assert share[4096] > 1.5 * share[8192]


def test_tail_groups_merge_the_last_groups():
    batch, seqlen, heads = 4, 4096, 8  # 8 groups of 4 pairs
    units = math.ceil(math.ceil(seqlen / 80) / 2)
    one = m.walks(batch, seqlen, heads, True)
    for tail in (2, 3, 100):
        merged = m.walks(batch, seqlen, heads, True, tail)
        assert sorted(merged) == sorted(one)  # the same clusters, in another order
        kept = max(0, 8 - tail) * 4 * units
        assert merged[:kept] == one[:kept]
        last = merged[kept:]
        width = 32 - max(0, 8 - tail) * 4  # pairs in the merged group
        assert last == [x for u in range(units) for x in [64 - (160 * u) // 64] * width]
    assert m.walks(batch, seqlen, heads, False, 3) == m.walks(batch, seqlen, heads, False)


def test_grouped_tile_tail_is_a_bijection_and_keeps_the_groups_before():
    for pairs in (1, 2, 5, 8, 13, 32):
        for group in (1, 2, 3, 4, 8):
            group = min(group, pairs)
            for blocks in (1, 3, 26):
                for tail in (1, 2, 3, 9):
                    tiles = [m.grouped_tile_tail(c, group, blocks, pairs, tail) for c in range(blocks * pairs)]
                    assert sorted(tiles) == [(b, p) for b in range(blocks) for p in range(pairs)]
                    full = max(0, -(-pairs // group) - tail)
                    for c in range(full * group * blocks):  # grouped_tile's order there
                        g, rest = divmod(c, group * blocks)
                        assert tiles[c] == (rest // group, g * group + rest % group)
                    if tail == 1:  # grouped_tile itself, its last group the remainder
                        for c in range(blocks * pairs):
                            g, rest = divmod(c, group * blocks)
                            gp = min(group, pairs - g * group)
                            assert tiles[c] == (rest // gp, g * group + rest % gp)


def test_one_cta_grids_of_the_other_head_dims():
    # d = 192: 96-key blocks, one per CTA, 64-row steps; 10 heads at 8k x 2: groups of 2 pairs
    w = m.walks(2, 8192, 10, True, headdim=192)
    blocks = math.ceil(8192 / 96)
    assert len(w) == blocks * 20
    assert w[:2] == [128, 128] and w[2:4] == [128 - 96 // 64] * 2
    r = m.model(2, 8192, 10, True, 0.0, 0.7, 132, 1, 192)
    assert r["ideal"] == sum(w) / 132


def test_post_overlap_by_hand():
    # Two slots: pair 0's unit runs 0-4, pair 1's 0-1. The postprocess is a quarter of the
    # 4-step kernel at the full GPU: 2 slot-steps, 1 per pair. After the kernel: 4 + 1 = 5.
    # Under it: slot 1 converts pair 1 from 1 to 2; pair 0 ends at 4, both slots take it: 4.5.
    span, after, under = m.post_overlap([(4, 0), (1, 1)], 2, 0.25)
    assert span == 4 and after == 5
    assert abs(under - 4.5) < 1e-2


def test_post_overlap_never_later_than_after():
    for causal in (True, False):
        units = m.walks(4, 4096, 8, causal, with_pairs=True)
        assert [s for s, _ in units] == m.walks(4, 4096, 8, causal)
        assert sorted({p for _, p in units}) == list(range(32))
        span, after, under = m.post_overlap(units, 66, 0.03)
        assert span <= under <= after + 1e-6
        assert m.post_overlap(units, 66, 0.0)[2] == span


def test_two_tail_groups_never_end_the_queue_later():
    """The adopted d = 256 default (queue + two merged causal tail groups) against the queue
    alone, on the benchmark's causal lengths: the merged groups end the call no later (the model
    behind l2_tail_groups = 2, which no run measured at 1024 / 2048)."""
    slots = 132 // m.CONFIGS[256][2]
    for seqlen in (1024, 2048, 4096, 8192, 16384):
        frac = m.POST_AT_4K[True] * 4096 / seqlen
        one = m.post_overlap(m.walks(16384 // seqlen, seqlen, 8, True, 1, with_pairs=True), slots, frac)
        two = m.post_overlap(m.walks(16384 // seqlen, seqlen, 8, True, 2, with_pairs=True), slots, frac)
        assert two[2] <= one[2] * 1.001, seqlen


def test_split_last_wave_by_hand():
    # Three 6-step units on two slots: the third runs alone, 12 steps. Split in two: 6 + 3 = 9;
    # in three parts of 2 (two slots): 6 + 2 + 2 = 10; with a 1-step overhead per part, 6 + 4 = 10.
    assert m.split_last_wave([6, 6, 6], 2, 1, 0) == 12
    assert m.split_last_wave([6, 6, 6], 2, 2, 0) == 9
    assert m.split_last_wave([6, 6, 6], 2, 3, 0) == 10
    assert m.split_last_wave([6, 6, 6], 2, 2, 1) == 10
    assert m.split_last_wave([6, 6, 6, 6], 2, 3, 0) == 12  # no partial wave: nothing to split
