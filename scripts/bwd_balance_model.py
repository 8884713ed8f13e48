#!/usr/bin/env python3
"""How much of the d = 256 pair backward's grid time a fixed cost per CTA takes, by sequence
length: a model of the pair grid's fill, to price a persistent pair before building one
(--headdim 64 / 128 / 192: the one-CTA grids of those rows, units of one K/V block).

Each cluster (two CTAs on K/V blocks 2u and 2u + 1 of one (batch, kv head), in lockstep) walks
the Q blocks that see its lower block: m_blocks - first Q block (causal) or m_blocks steps,
in units of one step, plus a fixed cost F per cluster (its start: barrier init, the cluster
barrier, K / V / the partner's K half in flight; its end: dK / dV staged and stored, the final
cluster barrier; the launch of the next cluster on the freed SMs). Clusters come in the
launch order of csrc/bwd_sm90/bwd_sm90_scheduler.cuh (causal: L2 groups of (batch, kv head)
pairs, the unit index slower than the pair, so the longest walks of a group start first) and
go to the first of SMS / 2 cluster slots that is free (the hardware's greedy fill). The
persistent form keeps a cluster per slot that takes the next unit when free and hides a
fraction of F under its neighbours' steps (the next unit's K / V load under the last steps,
the dK / dV stores under the next unit's first); each slot still pays F once.

Printed per length: the makespan of one CTA per cluster over the ideal (total steps / slots),
the share of it F accounts for, and the persistent form's gain at the given hidden fraction.
The per-CTA timeline (scripts/bwd_timeline.py on the timeline config) measures F.

    python3 scripts/bwd_balance_model.py [--headdim 256] [--fixed 0,0.5,1,2] [--hidden 0.7] [--sms 132]
"""
import argparse
import math

from fwd_balance_model import greedy  # each cost (+ fixed) to the slot that frees first

TOKENS = 16384
BLOCK_M, BLOCK_N = 64, 80  # the d = 256 pair's tile (csrc/bwd_sm90/bwd_sm90.h)
# head dim: (block_m, block_n, K/V blocks per unit: 2 for the pair), the default-mode rows of
# csrc/bwd_sm90/bwd_sm90.h (d = 256: the pair, from 1024 query rows per CTA)
CONFIGS = {64: (128, 128, 1), 128: (64, 128, 1), 192: (64, 96, 1), 256: (BLOCK_M, BLOCK_N, 2)}
L2_ROWS, L2_SHORT_ROWS, L2_SHORT_SEQLEN = 16384, 8192, 1024  # kBwdSm90L2 at d = 256 (x 256 / d)


def grouped_tile_tail(cta, group, blocks, pairs, tail):
    """sm90_common.h's grouped_tile_tail, line for line (tail = 1: grouped_tile's order):
    (block, pair) of launch position cta."""
    full = max(0, (pairs + group - 1) // group - tail)  # groups before the merged one
    g = min(cta // (group * blocks), full)
    rest = cta - g * group * blocks
    group_pairs = pairs - full * group if g == full else group
    return rest // group_pairs, g * group + rest % group_pairs


def walks(batch, seqlen, heads, causal, tail_groups=1, headdim=256):
    """Steps per unit (the pair's cluster, or one CTA) in launch order (grouped_tile; causal
    with tail_groups > 1, grouped_tile_tail: the last tail_groups groups as one)."""
    block_m, block_n, per_unit = CONFIGS[headdim]
    m_blocks = math.ceil(seqlen / block_m)
    units = math.ceil(math.ceil(seqlen / block_n) / per_unit)
    pairs = batch * heads
    rows = (L2_SHORT_ROWS if seqlen <= L2_SHORT_SEQLEN else L2_ROWS) * 256 // headdim
    group = max(1, min(pairs, rows // seqlen)) if causal else 1
    out = []
    for cta in range(units * pairs):
        unit, _ = grouped_tile_tail(cta, group, units, pairs, tail_groups if causal else 1)
        first = (per_unit * unit * block_n) // block_m if causal else 0
        out.append(max(0, m_blocks - first))
    return out


def persistent_makespan(steps, slots, fixed, hidden):
    """A persistent cluster per slot: the first unit of a slot pays all of F, later ones
    (1 - hidden) of it. Every slot takes one of the first units at time 0, so this is the
    greedy fill with (1 - hidden) F per unit, shifted by the hidden F that each slot pays once."""
    return fixed * hidden + greedy(steps, slots, fixed * (1 - hidden))


def model(batch, seqlen, heads, causal, fixed, hidden, sms, tail_groups=1, headdim=256):
    steps = walks(batch, seqlen, heads, causal, tail_groups, headdim)
    slots = sms // CONFIGS[headdim][2]
    ideal = sum(steps) / slots
    tiles = greedy(steps, slots, fixed)
    bare = greedy(steps, slots, 0.0)
    pers = persistent_makespan(steps, slots, fixed, hidden)
    return {"ideal": ideal, "tiles": tiles, "bare": bare, "persistent": pers,
            "mean_walk": sum(steps) / len(steps)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fixed", default="0,0.5,1,2", help="fixed cost per cluster, in steps (comma list)")
    p.add_argument("--hidden", type=float, default=0.7, help="share of it a persistent cluster hides")
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--headdim", type=int, default=256, choices=sorted(CONFIGS))
    p.add_argument("--heads", type=int, default=None, help="default 2048 / head dim, as the benchmark")
    a = p.parse_args()
    a.heads = a.heads or 2048 // a.headdim
    slots = a.sms // CONFIGS[a.headdim][2]
    print(f"d = {a.headdim}, {TOKENS} tokens x {a.heads} heads, {slots} slots; makespan over "
          f"the ideal; F's share of it; the persistent form's gain hiding {a.hidden:.0%} of F")
    for causal in (True, False):
        for seqlen in (1024, 2048, 4096, 8192, 16384):
            batch = TOKENS // seqlen
            cells = []
            for f in (float(x) for x in a.fixed.split(",")):
                r = model(batch, seqlen, a.heads, causal, f, a.hidden, a.sms, 1, a.headdim)
                cells.append(f"F={f:g}: {r['tiles'] / r['ideal']:.3f} F {100 * (r['tiles'] - r['bare']) / r['tiles']:4.1f}% "
                             f"pers +{100 * (r['tiles'] / r['persistent'] - 1):4.1f}%")
            r = model(batch, seqlen, a.heads, causal, 0.0, a.hidden, a.sms, 1, a.headdim)
            print(f"{'causal' if causal else 'non-causal':10s} {seqlen:5d} (walk {r['mean_walk']:5.1f} steps)  " + "  ".join(cells))
    print("causal, the last L2 groups merged (l2_tail_groups): makespan over the ideal at F = 0 / 1 step")
    for seqlen in (1024, 2048, 4096, 8192, 16384):
        cells = []
        for tail in (1, 2, 3):
            r0, r1 = (model(TOKENS // seqlen, seqlen, a.heads, True, f, a.hidden, a.sms, tail, a.headdim)
                      for f in (0.0, 1.0))
            cells.append(f"{tail}: {r0['tiles'] / r0['ideal']:.3f} / {r1['tiles'] / r1['ideal']:.3f}")
        print(f"  {seqlen:5d}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
