#!/usr/bin/env python3
"""How evenly a forward grid's CTAs finish: a model of the Hopper forward's tile balance.

Each tile (Q block, head, batch) costs its key blocks plus a fixed cost (its Q load, the wait for
the first K/V, the epilogue), in units of one key block. Tiles come in the order of
csrc/fwd_sm90/fwd_sm90_scheduler.cuh (causal: L2 groups of (batch, head) pairs, longest rows
first inside a group). Three ways to hand them to the SMs:
  tiles     one CTA per tile: the hardware gives each freed SM the next tile (greedy)
  static    a persistent grid, CTA c takes tiles c, c + grid, c + 2 grid, ...
  counter   a persistent grid taking the next tile from an atomic counter when free (greedy)
Printed: each schedule's makespan over the ideal (total cost / SMs), and counter / tiles.
It reproduced the measured static-stride losses (docs/perf-log.md, "Dynamic tile counter").

    python3 scripts/fwd_balance_model.py [--sms 132] [--fixed-tiles 1.0] [--fixed-persistent 0.3]
"""
import argparse
import heapq
import math

TOKENS = 16384
# head dim: (block_m, block_n), as in csrc/fwd_sm90/fwd_sm90.h
CONFIGS = {64: (192, 128), 128: (128, 128), 192: (128, 112), 256: (128, 80)}


def tile_costs(batch, seqlen, heads, block_m, block_n, headdim, causal):
    """Key blocks per tile in launch order (the scheduler's grouped_tile and its L2 group)."""
    m_blocks, pairs = math.ceil(seqlen / block_m), batch * heads
    group = max(1, min(pairs, (32 << 20) // (4 * headdim * seqlen))) if causal else 1
    costs = []
    for tile in range(m_blocks * pairs):
        g = tile // (group * m_blocks)
        rest = tile - g * group * m_blocks
        block = rest // min(group, pairs - g * group)
        m = m_blocks - 1 - block if causal else block
        key_end = min(seqlen, (m + 1) * block_m) if causal else seqlen
        costs.append(math.ceil(key_end / block_n))
    return costs


def greedy(costs, sms, fixed):
    loads = [0.0] * sms
    for c in costs:
        heapq.heappush(loads, heapq.heappop(loads) + c + fixed)
    return max(loads)


def static_stride(costs, sms, fixed):
    loads = [0.0] * sms
    for i, c in enumerate(costs):
        loads[i % sms] += c + fixed
    return max(loads)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--fixed-tiles", type=float, default=1.0, help="fixed cost per tile, one CTA per tile")
    ap.add_argument("--fixed-persistent", type=float, default=0.3, help="fixed cost per tile, persistent CTA")
    ap.add_argument("--noncausal", action="store_true")
    a = ap.parse_args()
    print("d    seqlen  tiles   tiles/ideal  static/ideal  counter/ideal  counter/tiles")
    for d, (bm, bn) in CONFIGS.items():
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            costs = tile_costs(TOKENS // s, s, 2048 // d, bm, bn, d, not a.noncausal)
            ideal = sum(costs) / a.sms
            t = greedy(costs, a.sms, a.fixed_tiles)
            st = static_stride(costs, a.sms, a.fixed_persistent)
            c = greedy(costs, a.sms, a.fixed_persistent)
            print(f"{d:<4} {s:6d}  {len(costs):5d}   {t / ideal:11.3f}  {st / ideal:12.3f}  "
                  f"{c / ideal:13.3f}  {c / t:13.3f}")


if __name__ == "__main__":
    main()
