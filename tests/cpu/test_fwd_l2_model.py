"""scripts/fwd_l2_model.py: the causal forward's DRAM bytes under an LRU model of L2."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts"))

import fwd_balance_model as balance  # noqa: E402
import fwd_l2_model as m  # noqa: E402


def test_tile_order_is_the_balance_models():
    """The same launch order as the tile-balance model (the scheduler's grouped_tile) at 32 MB."""
    for d, seqlen in [(256, 512), (128, 2048), (64, 4096)]:
        block_m, block_n = m.CONFIGS[d]
        heads, batch = 2048 // d, m.TOKENS // seqlen
        order = m.tile_order(batch, seqlen, heads, d, block_m, block_n, 32)
        assert [n for _, _, n in order] == balance.tile_costs(batch, seqlen, heads, block_m, block_n, d, True)


def test_unbounded_cache_reads_every_block_once():
    """With room for everything, K and V come from DRAM once per (pair, key block): the minimum."""
    d, seqlen = 256, 512
    block_m, block_n = m.CONFIGS[d]
    heads, batch = 8, 4
    order = m.tile_order(batch, seqlen, heads, d, block_m, block_n, 32)
    t = m.dram_bytes(order, 132, d, block_m, block_n, l2_mb=1 << 20)
    blocks = -(-seqlen // block_n)
    assert t["kv"] == batch * heads * blocks * 2 * block_n * d * 2
    assert t["q"] == t["o"] == batch * heads * seqlen * d * 2


def test_smaller_groups_reread_less_when_the_cache_is_tight():
    """d = 256 causal 512 (the ncu case): 32 MB groups re-read K / V from DRAM in a 25 or 50 MB
    cache; 16 MB groups come within 10% of the minimum."""
    d, seqlen = 256, 512
    block_m, block_n = m.CONFIGS[d]
    heads, batch = 8, 32
    kv = {}
    for budget in (32, 16):
        order = m.tile_order(batch, seqlen, heads, d, block_m, block_n, budget)
        for l2 in (50, 25):
            kv[budget, l2] = m.dram_bytes(order, 132, d, block_m, block_n, l2)["kv"]
    minimum = m.dram_bytes(m.tile_order(batch, seqlen, heads, d, block_m, block_n, 16), 132, d,
                           block_m, block_n, 1 << 20)["kv"]
    assert kv[32, 25] > kv[32, 50] > 1.1 * minimum
    assert kv[16, 50] <= 1.1 * minimum and kv[16, 25] <= 1.1 * minimum
