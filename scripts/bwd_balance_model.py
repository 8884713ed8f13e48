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
the share of it F accounts for, and the persistent form's gain at the given hidden fraction;
then the dQ conversion queue's gain (post_overlap: the postprocess on the SMs the grid's end
leaves idle instead of after it).
The per-CTA timeline (scripts/bwd_timeline.py on the timeline config) measures F.

    python3 scripts/bwd_balance_model.py [--headdim 256] [--fixed 0,0.5,1,2] [--hidden 0.7] [--sms 132]
"""
import argparse
import bisect
import heapq
import math

from fwd_balance_model import greedy  # each cost (+ fixed) to the slot that frees first

TOKENS = 16384
BLOCK_M, BLOCK_N = 64, 80  # the d = 256 pair's tile (csrc/bwd_sm90/bwd_sm90.h)
# head dim: (block_m, block_n, K/V blocks per unit: 2 for the pair), the default-mode rows of
# csrc/bwd_sm90/bwd_sm90.h (d = 256: the pair, from 1024 query rows per CTA)
CONFIGS = {64: (128, 128, 1), 128: (64, 128, 1), 192: (64, 96, 1), 256: (BLOCK_M, BLOCK_N, 2)}
L2_ROWS, L2_SHORT_ROWS, L2_SHORT_SEQLEN = 16384, 8192, 1024  # kBwdSm90L2 at d = 256 (x 256 / d)
# The postprocess over the main kernel at d = 256, 4096, causal / non-causal, from
# scripts/call_breakdown.py (H100: 52.7 / 1403.3 us, 52.9 / 2916.5 us; docs/perf-log.md).
POST_AT_4K = {True: 52.7 / 1403.3, False: 52.9 / 2916.5}


def grouped_tile_tail(cta, group, blocks, pairs, tail):
    """sm90_common.h's grouped_tile_tail, line for line (tail = 1: grouped_tile's order):
    (block, pair) of launch position cta."""
    full = max(0, (pairs + group - 1) // group - tail)  # groups before the merged one
    g = min(cta // (group * blocks), full)
    rest = cta - g * group * blocks
    group_pairs = pairs - full * group if g == full else group
    return rest // group_pairs, g * group + rest % group_pairs


def walks(batch, seqlen, heads, causal, tail_groups=1, headdim=256, with_pairs=False):
    """Steps per unit (the pair's cluster, or one CTA) in launch order (grouped_tile; causal
    with tail_groups > 1, grouped_tile_tail: the last tail_groups groups as one); with_pairs:
    (steps, (batch, kv head) pair) per unit."""
    block_m, block_n, per_unit = CONFIGS[headdim]
    m_blocks = math.ceil(seqlen / block_m)
    units = math.ceil(math.ceil(seqlen / block_n) / per_unit)
    pairs = batch * heads
    rows = (L2_SHORT_ROWS if seqlen <= L2_SHORT_SEQLEN else L2_ROWS) * 256 // headdim
    group = max(1, min(pairs, rows // seqlen)) if causal else 1
    out = []
    for cta in range(units * pairs):
        unit, pair = grouped_tile_tail(cta, group, units, pairs, tail_groups if causal else 1)
        first = (per_unit * unit * block_n) // block_m if causal else 0
        steps = max(0, m_blocks - first)
        out.append((steps, pair) if with_pairs else steps)
    return out


def post_overlap(units, slots, post_frac, dt_frac=1e-4):
    """The dQ conversion queue (BwdSm90Config::dq_post_queue) against the postprocess after the
    main kernel. units: (steps, pair) in launch order, greedy onto `slots`; post_frac: the
    postprocess's time at the full GPU over the main kernel's (as measured). The queue's
    conversion starts once the last unit has started (PDL: every CTA started), on each slot
    as it runs out of units, for pairs whose units have all ended, in the order they ended,
    at the full GPU's rate per slot. Returns (makespan, the call's end with the postprocess
    after it, with the queue), in steps."""
    heap = [(0.0, s) for s in range(slots)]
    pair_end, slot_free, last_start = {}, [0.0] * slots, 0.0
    for steps, pair in units:
        t, s = heapq.heappop(heap)
        last_start = max(last_start, t)
        end = t + steps
        slot_free[s] = end
        pair_end[pair] = max(pair_end.get(pair, 0.0), end)
        heapq.heappush(heap, (end, s))
    span = max(slot_free)
    work = post_frac * span * slots  # slot-steps
    per_pair = work / len(pair_end)
    ready = sorted(pair_end.values())
    dt = dt_frac * span
    t, done, i, avail = last_start, 0.0, 0, 0.0
    free_at = sorted(max(f, last_start) for f in slot_free)
    while done < work - 1e-9:
        while i < len(ready) and ready[i] <= t:
            avail += per_pair
            i += 1
        workers = bisect.bisect_right(free_at, t)
        take = min(avail, workers * dt)
        avail -= take
        done += take
        t += dt
    return span, span * (1 + post_frac), max(span, t)


def split_last_wave(steps, slots, pieces, overhead):
    """The non-causal grid (every unit the same walk) with the units of its partial last wave
    split by query range into `pieces` parts, each ceil(walk / pieces) steps plus `overhead`
    (its partial dK / dV written in fp32 and summed with the other parts'), launched after the
    full waves. Returns the makespan in steps (pieces = 1: the grid as it is)."""
    full = len(steps) - len(steps) % slots
    rest = steps[full:]
    if pieces == 1 or not rest:
        return greedy(steps, slots, 0.0)
    parts = [math.ceil(s / pieces) + overhead for s in rest for _ in range(pieces)]
    return greedy(steps[:full] + parts, slots, 0.0)


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
    p.add_argument("--post-causal", type=float, default=POST_AT_4K[True])
    p.add_argument("--post-full", type=float, default=POST_AT_4K[False])
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
    print("the dQ conversion queue (dq_post_queue): the call's main kernel + postprocess, after / under "
          f"the tail (postprocess at 4k: {a.post_causal:.4f} / {a.post_full:.4f} of the main kernel "
          "causal / non-causal, scaled by 4096 / seqlen)")
    for causal in (True, False):
        for seqlen in (1024, 2048, 4096, 8192, 16384):
            frac = (a.post_causal if causal else a.post_full) * 4096 / seqlen
            units = walks(TOKENS // seqlen, seqlen, a.heads, causal, 1, a.headdim, with_pairs=True)
            span, after, under = post_overlap(units, slots, frac)
            line = (f"  {'causal' if causal else 'non-causal':10s} {seqlen:5d}  after {after / span:.4f}  "
                    f"under {under / span:.4f}  gain +{100 * (after / under - 1):.2f}%")
            if causal:  # with the last two L2 groups merged too, against the same baseline
                units2 = walks(TOKENS // seqlen, seqlen, a.heads, True, 2, a.headdim, with_pairs=True)
                under2 = post_overlap(units2, slots, frac)[2]
                line += f"  with two tail groups +{100 * (after / under2 - 1):.2f}%"
            print(line)
    print("non-causal, the partial last wave split by query range into k parts (split_last_wave): "
          "makespan over the ideal at a part's overhead of 0 / 1 step")
    for seqlen in (1024, 2048, 4096, 8192, 16384):
        steps = walks(TOKENS // seqlen, seqlen, a.heads, False, 1, a.headdim)
        ideal = sum(steps) / slots
        cells = [f"{k}: {split_last_wave(steps, slots, k, 0) / ideal:.3f} / "
                 f"{split_last_wave(steps, slots, k, 1) / ideal:.3f}" for k in (1, 2, 3, 4)]
        print(f"  {seqlen:5d} ({len(steps) % slots:2d} of {slots} slots in the last wave)  " + "  ".join(cells))
    print("  (measured on an H100: k = 2 at 16384 +1.7 / +2.2%, k = 3 at 4096 / 8192 -0.7..+0.6%; the "
          "library splits in two parts where the last wave fills at most half the slots)")
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
