#!/usr/bin/env python3
"""How evenly a forward grid's CTAs finish: a model of the Hopper forward's tile balance.

Each tile (Q block, head, batch) costs its key blocks plus a fixed cost (its Q load, the wait for
the first K/V, the epilogue), in units of one key block. Tiles come in the order of
csrc/fwd_sm90/fwd_sm90_scheduler.cuh (causal: L2 groups of (batch, head) pairs, longest rows
first inside a group). Three ways to hand them to the SMs:
  tiles     one CTA per tile: the hardware gives each freed SM the next tile (greedy)
  static    a persistent grid, CTA c takes tiles c, c + grid, c + 2 grid, ...
  counter   a persistent grid taking the next tile from an atomic counter when free (greedy)
  ahead     the counter as the kernel uses it: each CTA reserves its next tile as it starts one
  late      the counter with the reservation made two key blocks before the current tile ends
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


def greedy_ahead(costs, sms, fixed):
    """The counter as the kernel uses it: CTA c starts with tile c and, as it starts each tile,
    takes the id of its next one from the counter (a tile ahead, so the fetch's latency hides),
    so every busy CTA holds one reserved tile that no other CTA can take."""
    n = len(costs)
    nxt = min(sms, n)  # the counter: tiles handed out so far (the grid's first tiles by blockIdx)
    heap, reserved = [], {}
    for c in range(min(sms, n)):
        if nxt < n:
            reserved[c], nxt = nxt, nxt + 1
        heapq.heappush(heap, (costs[c] + fixed, c))
    end = 0.0
    while heap:
        t, c = heapq.heappop(heap)
        end = max(end, t)
        r = reserved.pop(c, None)
        if r is None:
            continue
        if nxt < n:
            reserved[c], nxt = nxt, nxt + 1
        heapq.heappush(heap, (t + costs[r] + fixed, c))
    return end


def greedy_late(costs, sms, fixed, lead=2.0):
    """The counter with the next tile's id fetched `lead` key blocks before the current tile
    ends (say, when the producer issues the tile's last K/V loads) instead of as it starts:
    events in time order, a fetch takes the counter's next tile."""
    n = len(costs)
    nxt = min(sms, n)
    events = []  # (time, kind, cta): kind 0 = fetch, 1 = finish
    start_of = {}
    for c in range(min(sms, n)):
        dur = costs[c] + fixed
        heapq.heappush(events, (max(0.0, dur - lead), 0, c))
        heapq.heappush(events, (dur, 1, c))
    reserved, end = {}, 0.0
    while events:
        t, kind, c = heapq.heappop(events)
        if kind == 0:
            if nxt < n:
                reserved[c], nxt = nxt, nxt + 1
            continue
        end = max(end, t)
        r = reserved.pop(c, None)
        if r is None:
            continue
        dur = costs[r] + fixed
        heapq.heappush(events, (t + max(0.0, dur - lead), 0, c))
        heapq.heappush(events, (t + dur, 1, c))
    return end


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
    print("d    seqlen  tiles   tiles/ideal  static/ideal  counter/ideal  counter/tiles  ahead/tiles  late/tiles")
    for d, (bm, bn) in CONFIGS.items():
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            costs = tile_costs(TOKENS // s, s, 2048 // d, bm, bn, d, not a.noncausal)
            ideal = sum(costs) / a.sms
            t = greedy(costs, a.sms, a.fixed_tiles)
            st = static_stride(costs, a.sms, a.fixed_persistent)
            c = greedy(costs, a.sms, a.fixed_persistent)
            ah = greedy_ahead(costs, a.sms, a.fixed_persistent)
            la = greedy_late(costs, a.sms, a.fixed_persistent)
            print(f"{d:<4} {s:6d}  {len(costs):5d}   {t / ideal:11.3f}  {st / ideal:12.3f}  "
                  f"{c / ideal:13.3f}  {c / t:13.3f}  {ah / t:11.3f}  {la / t:10.3f}")


if __name__ == "__main__":
    main()
