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

An event-driven form (`event_makespan`) adds steps of random length 1 +- jitter and a third
order, det_from_the_end (production at d = 128-256): units launch longest-first as in the default, walk
their Q blocks from the last down to their diagonal, and a tile's adds go from unit 0 up.

    python3 scripts/det_order_model.py [--slots 66] [--unit-keys 160] [--jitter 0,0.1,0.3] [--latency 0.4]

--latency: a tile's turn passes from one unit's add to the next unit's after this many steps (the
adds reaching L2 before the release, the poll that sees it), instead of at once.
"""
import argparse
import heapq
import random


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


# (each head's units launched last-first, walks from the last Q block down, a tile's adds from
# the "top" unit down / the "bottom" unit up / None: in any order, the GQA group's q heads the
# inner loop of a walk)
ORDERS = {
    "default": (False, False, None, False),
    "prod": (True, False, "top", False),
    "from_end": (False, True, "bottom", True),
}


def event_makespan(seqlen, pairs, l2_group, slots, unit_keys, order, jitter=0.0, seed=1, block_m=64,
                   group=1, latency=0.0):
    """Makespan of the causal grid with `slots` units resident, each step of length 1 + U(-j, j)
    and a unit's dQ add at the end of its step. order: a name of ORDERS ("default": no add order,
    longest-first launch, upward walks; "prod": adds from the highest unit down, each head's units
    last-first, upward walks; "from_end": adds from unit 0 up, longest-first, walks from the last
    Q block down, q heads inner) or such a tuple. `group` q heads per kv head (GQA): a unit walks
    every head's tiles. A unit whose add is not next on its tile waits (holding its slot) until
    it is. latency (in steps): the hand-off of a tile's turn, from one unit's add to the next
    unit's (its adds reaching L2 before the release, the next CTA's poll seeing the counter); 0:
    at once. Returns (makespan, units left waiting: > 0 is a deadlock)."""
    last_first, from_end, adds, heads_inner = ORDERS[order] if isinstance(order, str) else order
    rng = random.Random(seed)
    m_blocks = seqlen // block_m
    units = (seqlen + unit_keys - 1) // unit_keys
    first = [u * unit_keys // block_m for u in range(units)]
    launch = []  # bwd_sm90_work's grouping: l2_group pairs, the block index slower than the pair
    for g0 in range(0, pairs, l2_group):
        in_group = range(g0, min(pairs, g0 + l2_group))
        for b in range(units):
            launch += [(p, units - 1 - b if last_first else b) for p in in_group]
    walks = []
    for p, u in launch:
        blocks = list(range(first[u], m_blocks))
        blocks = blocks[::-1] if from_end else blocks
        if heads_inner:
            tiles = [(g, m) for m in blocks for g in range(group)]
        else:
            tiles = [(g, m) for g in range(group) for m in blocks]
        walks.append((p, u, tiles))
    # The adders of tile m are the units u with first[u] <= m, ranked from the top or the bottom.
    def rank(m, u):
        if adds == "top":
            return max(v for v in range(units) if first[v] <= m) - u
        return u
    added = {}      # (pair, tile) -> adds made
    free_at = {}    # (pair, tile) -> the earliest time of its next add (latency after the last)
    waiting = {}    # (pair, tile) -> {rank: (unit index, time ready)}
    events = []     # (time the unit's step ends, tie-break, unit index)
    at = [0] * len(walks)
    seq, next_unit, finish = 0, 0, 0.0

    def begin_step(i, t):
        nonlocal seq
        heapq.heappush(events, (t + 1.0 + (rng.uniform(-jitter, jitter) if jitter else 0.0), seq, i))
        seq += 1

    while next_unit < len(walks) and next_unit < slots:
        begin_step(next_unit, 0.0)
        next_unit += 1
    while events:
        t, _, i = heapq.heappop(events)
        while True:  # i adds at t; then maybe the tile's next adder, already waiting, at once
            p, u, tiles = walks[i]
            key = (p, tiles[at[i]])
            r = rank(tiles[at[i]][1], u)
            if adds is not None and r != added.get(key, 0):
                waiting.setdefault(key, {})[r] = i
                break
            if adds is not None and t < free_at.get(key, 0.0):
                heapq.heappush(events, (free_at[key], seq, i))  # the turn has not reached it yet
                seq += 1
                break
            added[key] = added.get(key, 0) + 1
            free_at[key] = t + latency
            at[i] += 1
            if at[i] < len(tiles):
                begin_step(i, t)
            else:
                finish = max(finish, t)
                if next_unit < len(walks):
                    begin_step(next_unit, t)
                    next_unit += 1
            nxt = waiting.get(key, {}).pop(added[key], None)
            if nxt is None:
                break
            if latency > 0:
                heapq.heappush(events, (t + latency, seq, nxt))
                seq += 1
                break
            i = nxt
    return finish, sum(len(w) for w in waiting.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=66, help="units resident at once (66 pairs of CTAs)")
    ap.add_argument("--unit-keys", type=int, default=160, help="keys per unit (160: a pair of 80-key blocks)")
    ap.add_argument("--jitter", default="0,0.1,0.3", help="step-length jitters for the event model")
    ap.add_argument("--group", type=int, default=1, help="GQA q heads per kv head (event model)")
    ap.add_argument("--latency", type=float, default=0.0,
                    help="a tile's turn hand-off between two units' adds, in steps (event model)")
    a = ap.parse_args()
    sweep = ((4096, 32, 4), (8192, 16, 2), (16384, 8, 1))  # d = 256, 8 heads, 16k tokens
    for seqlen, pairs, l2 in sweep:
        base, _ = makespan(seqlen, pairs, l2, a.slots, a.unit_keys, False)
        det, waits = makespan(seqlen, pairs, l2, a.slots, a.unit_keys, True)
        asc, asc_waits = makespan(seqlen, pairs, l2, a.slots, a.unit_keys, True, ascending=True)
        print(f"seqlen {seqlen}: default {base} steps, deterministic {det} ({waits} unit-steps of waiting), "
              f"ratio {base / det:.3f}; ascending adds {asc} ({asc_waits} waiting), ratio {base / asc:.3f}")
    print("event model, fraction of the default's makespan (same jitter and seed):")
    for seqlen, pairs, l2 in sweep:
        for j in (float(x) for x in a.jitter.split(",")):
            base, _ = event_makespan(seqlen, pairs, l2, a.slots, a.unit_keys, "default", j, group=a.group)
            row = []
            for order in ("prod", "from_end"):
                t, stuck = event_makespan(seqlen, pairs, l2, a.slots, a.unit_keys, order, j, group=a.group,
                                          latency=a.latency)
                row.append(f"{order} {base / t:.3f}" + (" (deadlock)" if stuck else ""))
            print(f"  seqlen {seqlen} jitter {j}: " + ", ".join(row))


if __name__ == "__main__":
    main()
