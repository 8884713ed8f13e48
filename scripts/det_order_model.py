#!/usr/bin/env python3
"""A list-scheduling model of the Hopper backward's causal grid: how much the deterministic
mode's launch order costs before any real wait.

Every CTA (unit: a K/V block, or a 2-CTA pair's two blocks) walks the Q blocks at or after its
diagonal, one step per time unit; `slots` units are resident at once and a freed slot takes the
next unit of the launch order. Non-deterministic: longest walks first (K/V block 0 first).
Deterministic (bwd_sm90_scheduler.cuh): each (batch, kv head) pair's units last-first, and a
unit adds into a Q tile only after every higher unit that sees the tile has (the fixed add
order); the model counts the steps a unit waits for that. Prints the makespans and their
ratio, per seqlen of the benchmark's causal sweep.

    python3 scripts/det_order_model.py [--slots 66] [--unit-keys 160]
"""
import argparse


def makespan(seqlen, pairs, l2_group, slots, unit_keys, det, block_m=64, ascending=False):
    """ascending (det only): the other deadlock-free fixed order, the units longest-first and a
    tile's adds from the lowest unit up (a unit then trails the one below it in lockstep)."""
    m_blocks = seqlen // block_m
    units = (seqlen + unit_keys - 1) // unit_keys
    first = [u * unit_keys // block_m for u in range(units)]  # the unit's first Q block
    u_max = [min(units - 1, (block_m * (m + 1) - 1) // unit_keys) for m in range(m_blocks)]
    order = []  # grouped as bwd_sm90_work: l2_group pairs, the block index slower than the pair
    for g0 in range(0, pairs, l2_group):
        group = range(g0, min(pairs, g0 + l2_group))
        for b in range(units):
            order += [(p, units - 1 - b if det and not ascending else b) for p in group]
    next_unit = {}  # (pair, tile) -> the unit whose add is next (det)
    running, queue, t, waits = [], list(reversed(order)), 0, 0
    while running or queue:
        while len(running) < slots and queue:
            p, u = queue.pop()
            if first[u] < m_blocks:
                running.append([p, u, first[u]])
        for r in running:
            p, u, m = r
            if det and next_unit.get((p, m), 0 if ascending else u_max[m]) != u:
                waits += 1
                continue
            next_unit[(p, m)] = u + 1 if ascending else u - 1
            r[2] += 1
        running = [r for r in running if r[2] < m_blocks]
        t += 1
    return t, waits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=66, help="units resident at once (66 pairs of CTAs)")
    ap.add_argument("--unit-keys", type=int, default=160, help="keys per unit (160: a pair of 80-key blocks)")
    a = ap.parse_args()
    for seqlen, pairs, l2 in ((4096, 32, 4), (8192, 16, 2), (16384, 8, 1)):  # d = 256, 8 heads, 16k tokens
        base, _ = makespan(seqlen, pairs, l2, a.slots, a.unit_keys, False)
        det, waits = makespan(seqlen, pairs, l2, a.slots, a.unit_keys, True)
        asc, asc_waits = makespan(seqlen, pairs, l2, a.slots, a.unit_keys, True, ascending=True)
        print(f"seqlen {seqlen}: default {base} steps, deterministic {det} ({waits} unit-steps of waiting), "
              f"ratio {base / det:.3f}; ascending adds {asc} ({asc_waits} waiting), ratio {base / asc:.3f}")


if __name__ == "__main__":
    main()
