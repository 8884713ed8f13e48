"""The deterministic Hopper backward's add order (csrc/bwd_sm90/bwd_sm90_scheduler.cuh), modelled
on the CPU (causal: both orders, det_from_the_end off (d = 64) and on (d = 128-256)): for every dQ tile the units that add into it (K/V blocks, or with pair_dq clusters of
two blocks) get the ranks 0, 1, .. exactly once, and a run of the grid with only so many CTAs
resident at a time, each waiting for its rank on every tile, finishes (no CTA waits for one that
cannot run). Python transcriptions of bwd_sm90_work, bwd_sm90_iter and bwd_sm90_dq_rank; dense
batches (one sequence length)."""
import itertools

import pytest


def work(cta, p, unit_blocks):
    """bwd_sm90_work for the CTA (a cluster index with pairs) `cta`: its walk and order data."""
    grid_units = -(-p["n_blocks"] // unit_blocks)
    # l2_group: causal grids group (batch, head) pairs; the order argument holds for any group.
    group, pairs = p["l2_group"], p["pairs"]
    g = cta // (group * grid_units)
    rest = cta - g * group * grid_units
    group_pairs = min(group, pairs - g * group)
    block, pair = rest // group_pairs, g * group + rest % group_pairs
    unit = grid_units - 1 - block if p["causal"] and not p.get("from_end") else block
    sq, sk, bm, bn = p["seqlen_q"], p["seqlen_k"], p["block_m"], p["block_n"]
    m_blocks = -(-sq // bm)
    n_blocks = -(-sk // bn)
    units = -(-n_blocks // unit_blocks)
    lead = unit * unit_blocks
    active = lead < n_blocks
    m_begin = max(0, lead * bn - (sk - sq)) // bm if p["causal"] else 0
    m_count = max(0, m_blocks - m_begin) if active else 0
    w = dict(unit=unit, units=units, pair=pair, m_blocks=m_blocks, m_begin=m_begin, m_count=m_count,
             shift=0, det_lo=0, det_size=0)
    if not p["causal"] and m_count > 0:
        pair_base = pair * grid_units
        chunk = cta // p["det_chunk"]
        w["det_lo"] = max(0, chunk * p["det_chunk"] - pair_base)
        w["det_size"] = min(units, (chunk + 1) * p["det_chunk"] - pair_base) - w["det_lo"]
        w["shift"] = (unit - w["det_lo"]) % m_blocks
    return w


def walk(w, group, from_end=False):
    """bwd_sm90_iter<true>: (q head in the group, Q block, position) per step; from_end
    (det_from_the_end, causal): the Q blocks from the last down, q heads inner."""
    for it in range(group * w["m_count"]):
        if from_end:
            pos, g = divmod(it, group)
            yield g, w["m_begin"] + w["m_count"] - 1 - pos, pos
            continue
        g, pos = divmod(it, w["m_count"])
        local = pos + w["shift"]
        if local >= w["m_count"]:
            local -= w["m_count"]
        yield g, w["m_begin"] + local, pos


def rank(p, w, m_block, pos, unit_keys):
    """bwd_sm90_dq_rank<block_m, unit_keys>."""
    if p["causal"]:
        if p.get("from_end"):
            return w["unit"]
        rows_end = p["block_m"] * (m_block + 1) + (p["seqlen_k"] - p["seqlen_q"])
        return min(w["units"] - 1, (rows_end - 1) // unit_keys) - w["unit"]
    M = w["m_blocks"]
    i = w["unit"] - w["det_lo"]
    size = w["det_size"]
    rem = size % M
    lo = m_block - pos + 1
    if pos == 0:
        extra = 0
    elif lo >= 0:
        extra = max(0, min(m_block, rem - 1) - lo + 1)
    else:
        extra = min(m_block + 1, rem) + max(0, rem - (lo + M))
    return w["det_lo"] + pos * (size // M) + extra + i // M


def run_grid(p, unit_blocks, resident):
    """Every unit's walk with its ranks; then a simulated run: CTAs start in grid order, at most
    `resident` at once, each step waits for the tile's counter to equal its rank."""
    unit_keys = unit_blocks * p["block_n"]
    grid_units = -(-p["n_blocks"] // unit_blocks)
    ctas = grid_units * p["pairs"]
    steps = []
    seen = {}
    for cta in range(ctas):
        w = work(cta, p, unit_blocks)
        s = []
        for g, m, pos in walk(w, p["group"], p["causal"] and p.get("from_end", False)):
            tile = (w["pair"], g, m)
            r = rank(p, w, m, pos, unit_keys)
            s.append((tile, r))
            seen.setdefault(tile, []).append(r)
        steps.append(s)
    for tile, ranks in seen.items():
        assert sorted(ranks) == list(range(len(ranks))), (p, unit_blocks, tile, ranks)
    counter = {t: 0 for t in seen}
    at = [0] * ctas
    running, next_cta, done = [], 0, 0
    while done < ctas:
        while len(running) < resident and next_cta < ctas:
            running.append(next_cta)
            next_cta += 1
        moved = False
        for c in list(running):
            while at[c] < len(steps[c]) and counter[steps[c][at[c]][0]] == steps[c][at[c]][1]:
                counter[steps[c][at[c]][0]] += 1
                at[c] += 1
                moved = True
            if at[c] == len(steps[c]):
                running.remove(c)
                done += 1
                moved = True
        assert moved, f"deadlock: {p}, unit_blocks={unit_blocks}, resident={resident}"
    assert all(counter[t] == len(seen[t]) for t in seen)


CASES = [
    # (seqlen_q, seqlen_k): equal, more keys, more queries, one row, tile remainders.
    (1, 1), (17, 17), (200, 200), (300, 170), (170, 300), (64, 400), (449, 81),
]


@pytest.mark.parametrize("unit_blocks", [1, 2])
@pytest.mark.parametrize("causal,from_end", [(True, False), (True, True), (False, False)])
def test_det_order_ranks_and_progress(unit_blocks, causal, from_end):
    block_m, block_n = 64, 80
    for (sq, sk), pairs, group in itertools.product(CASES, (1, 3), (1, 2)):
        n_blocks = -(-sk // block_n)
        units = -(-n_blocks // unit_blocks)
        for l2_group in ((1, 2) if causal else (1,)):
            for det_chunk in ((1,) if causal else (1, 2, 3, 5)):
                p = dict(seqlen_q=sq, seqlen_k=sk, block_m=block_m, block_n=block_n, causal=causal,
                         n_blocks=n_blocks, pairs=pairs, group=group, l2_group=l2_group,
                         det_chunk=det_chunk, from_end=from_end)
                # Causal: any residency (a CTA only waits for earlier ones). Non-causal: a chunk
                # is resident at once, the launch's promise (det_chunk = what fits).
                for resident in ((1, 2, units * pairs) if causal else (det_chunk,)):
                    run_grid(p, unit_blocks, resident)
