#!/usr/bin/env python3
"""How much of the causal forward's K and V comes from DRAM: a model of its L2 reuse.

Tiles (Q block, q head, batch) in the order of csrc/fwd_sm90/fwd_sm90_scheduler.cuh: (batch,
q head) pairs in L2 groups whose K and V fill `budget` MB (kFwdSm90L2 in fwd_sm90.h), the last
(longest) Q blocks first inside a group. A persistent grid takes them from a counter as each SM
frees (the causal forward at d <= 192, and d = 256 to 2048 keys); a tile takes its key blocks
plus a fixed cost in units of one key block's time. Every access goes through one LRU cache of
`l2` MB in the order of time: a tile's Q at its start, its key block j's K and V at step j, its
O written at its end (O and Q take room in the cache like K and V). DRAM bytes = Q + the K / V
misses + O. An H100 / H200 has 50 MB of L2 in two partitions; what one partition's SMs can keep
of data the whole chip reads is less, so the model is run at 50 and at 25 MB.

    python3 scripts/fwd_l2_model.py [--headdim 256] [--seqlen 512] [--budgets 32,16,8] [--l2 50,25]
"""
import argparse
import heapq
import math
from collections import OrderedDict

TOKENS = 16384
# head dim: (block_m, block_n), as in csrc/fwd_sm90/fwd_sm90.h (the configs the counter runs)
CONFIGS = {64: (192, 128), 128: (128, 128), 192: (128, 112), 256: (128, 80)}
MB = 1 << 20


def tile_order(batch, seqlen, heads, headdim, block_m, block_n, budget_mb, group_q=1):
    """(pair, Q block, key blocks) in launch order, causal, square (seqlen_q = seqlen_k)."""
    m_blocks, pairs = math.ceil(seqlen / block_m), batch * heads
    kv_bytes_per_pair = 4 * headdim * seqlen
    group = max(1, min(pairs, (budget_mb * MB) * group_q // kv_bytes_per_pair))
    order = []
    for tile in range(m_blocks * pairs):
        g = tile // (group * m_blocks)
        rest = tile - g * group * m_blocks
        group_pairs = min(group, pairs - g * group)
        block, pair = rest // group_pairs, g * group + rest % group_pairs
        m = m_blocks - 1 - block
        key_end = min(seqlen, (m + 1) * block_m)
        order.append((pair, m, math.ceil(key_end / block_n)))
    return order


def dram_bytes(order, sms, headdim, block_m, block_n, l2_mb, fixed=0.3, group_q=1):
    """Q + missed K / V + O bytes for the tiles in `order` on `sms` SMs taking them greedily."""
    q_bytes = block_m * headdim * 2
    kv_bytes = block_n * headdim * 2
    events = []  # (time, seq, kind, key, bytes)
    free = [(0.0, s) for s in range(sms)]
    heapq.heapify(free)
    seq = 0
    for pair, m, n in order:
        t0, sm = heapq.heappop(free)
        kv_pair = pair // group_q
        events.append((t0, seq, "q", ("q", pair, m), q_bytes))
        seq += 1
        for j in range(n):
            for name in ("k", "v"):
                events.append((t0 + fixed + j, seq, "kv", (name, kv_pair, j), kv_bytes))
                seq += 1
        end = t0 + fixed + n
        events.append((end, seq, "o", ("o", pair, m), q_bytes))
        seq += 1
        heapq.heappush(free, (end, sm))
    events.sort()
    cache, used, cap = OrderedDict(), 0, l2_mb * MB
    traffic = {"q": 0, "kv": 0, "o": 0}
    for _, _, kind, key, size in events:
        if key in cache:
            cache.move_to_end(key)
            continue
        traffic[kind] += size  # a miss reads from DRAM (O: the one write-back)
        cache[key] = size
        used += size
        while used > cap:
            _, old = cache.popitem(last=False)
            used -= old
    return traffic


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headdim", type=int, default=256)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--budgets", default="32,16,8")
    ap.add_argument("--l2", default="50,25")
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args()
    d = args.headdim
    block_m, block_n = CONFIGS[d]
    heads, batch = 2048 // d, TOKENS // args.seqlen
    minimum = 4 * batch * heads * args.seqlen * d * 2
    print(f"d = {d}, causal, {batch} x {args.seqlen}, {heads} heads: Q + K + V + O = {minimum / 1e6:.0f} MB")
    print("budget MB  L2 MB   DRAM MB  (Q / K+V / O)   / minimum")
    for budget in (int(b) for b in args.budgets.split(",")):
        order = tile_order(batch, args.seqlen, heads, d, block_m, block_n, budget)
        for l2 in (int(x) for x in args.l2.split(",")):
            t = dram_bytes(order, args.sms, d, block_m, block_n, l2)
            total = sum(t.values())
            print(f"{budget:9d} {l2:6d} {total / 1e6:9.0f}  ({t['q'] / 1e6:.0f} / {t['kv'] / 1e6:.0f} / "
                  f"{t['o'] / 1e6:.0f})   {total / minimum:.2f}")


if __name__ == "__main__":
    main()
