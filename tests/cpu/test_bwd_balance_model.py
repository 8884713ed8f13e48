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
        tiles = m.makespan([s + fixed for s in steps], 66)
        assert m.persistent_makespan(steps, 66, fixed, 0.0) == tiles
        assert m.persistent_makespan(steps, 66, fixed, 1.0) <= tiles


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
