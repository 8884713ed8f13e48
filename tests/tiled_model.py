"""NumPy model of the Hopper kernels, walking the tiles exactly as they do (docs/design.md section 4).

Everything is float64, so the model agrees with the dense formulas in tests/reference.py to
rounding: a disagreement is a bug in the tiling (block bounds, causal skipping, masking of partial
tiles, online-softmax rescaling, accumulation), not precision. The kernels' per-tile logic and
the block ranges they iterate must stay the same as here; the step numbers (0)-(7) are the ones
used in the CUDA sources.

Conventions as in reference.py: q (batch, seqlen_q, nheads, d), k/v (batch, seqlen_k, nheads_k,
d), GQA head h -> kv head h // (nheads // nheads_k), causal bottom-right (query row r sees key
column c iff c <= r + seqlen_k - seqlen_q), rows seeing no key give out = 0 and lse = +inf.

Tiles that run past the end of a sequence are loaded zero-padded to the full block (what a TMA
load does out of bounds) and their columns masked; rows past the end are computed and dropped on
store. The model pads explicitly so that this path is exercised.
"""

import math

import numpy as np

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

# The fast configuration at head dim 256 (docs/design.md section 5): 64 Q rows x 80 K/V rows per tile.
DEFAULT_BLOCK_M = 64
DEFAULT_BLOCK_N = 80


def _cdiv(a, b):
    return -(-a // b)


def _pad_rows(x, rows, value=0.0):
    """x (n, ...) padded to (rows, ...) with `value`, as an out-of-bounds TMA load fills zeros."""
    if x.shape[0] == rows:
        return x
    pad = np.full((rows - x.shape[0],) + x.shape[1:], value, dtype=x.dtype)
    return np.concatenate([x, pad], axis=0)


# --------------------------------------------------------------------------------------------
# Block ranges: which tile pairs the kernels visit
# --------------------------------------------------------------------------------------------
# A tile pair (Q block i, K/V block j) is visited iff at least one (row, col) in it is a real
# position (row < seqlen_q, col < seqlen_k) that is visible. With bottom-right alignment the last
# row sees every key, so FA's unclipped bound ((m_block + 1) * block_m - 1 as the last row) gives
# the same ranges; the clipped form below states the rule directly.

def n_block_range(m_block, seqlen_q, seqlen_k, block_m, block_n, causal):
    """Forward: the K/V blocks [lo, hi) that Q block m_block sees."""
    n_blocks = _cdiv(seqlen_k, block_n)
    if not causal:
        return 0, n_blocks
    last_row = min((m_block + 1) * block_m, seqlen_q) - 1
    last_col = last_row + seqlen_k - seqlen_q        # rightmost column that last_row sees
    if last_col < 0:
        return 0, 0                                  # every row of the block sees no key
    return 0, min(n_blocks, last_col // block_n + 1)


def m_block_range(n_block, seqlen_q, seqlen_k, block_m, block_n, causal):
    """Backward: the Q blocks [lo, hi) that see K/V block n_block (causal: rows at or after the
    row that first sees the block's first column; all blocks after it see it too)."""
    m_blocks = _cdiv(seqlen_q, block_m)
    if not causal:
        return 0, m_blocks
    first_row = n_block * block_n - (seqlen_k - seqlen_q)  # first row that sees column n0
    return max(first_row, 0) // block_m, m_blocks


def visible_tile_pairs_bruteforce(seqlen_q, seqlen_k, block_m, block_n, causal):
    """Number of (i, j) tile pairs with at least one visible real element, per head, by looking."""
    visible = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if causal:
        rows = np.arange(seqlen_q)[:, None]
        visible = np.arange(seqlen_k)[None, :] <= rows + seqlen_k - seqlen_q
    count = 0
    for i in range(_cdiv(seqlen_q, block_m)):
        for j in range(_cdiv(seqlen_k, block_n)):
            count += bool(visible[i * block_m:(i + 1) * block_m,
                                  j * block_n:(j + 1) * block_n].any())
    return count


def _tile_mask(m_block, n_block, seqlen_q, seqlen_k, block_m, block_n, causal):
    """(block_m, block_n) boolean: True where the kernel keeps S. Columns past seqlen_k are always
    masked (they hold the zero padding); rows past seqlen_q are left alone (dropped on store)."""
    rows = m_block * block_m + np.arange(block_m)[:, None]
    cols = n_block * block_n + np.arange(block_n)[None, :]
    keep = np.broadcast_to(cols < seqlen_k, (block_m, block_n))
    if causal:
        keep = keep & (cols <= rows + seqlen_k - seqlen_q)
    return keep


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------

def _zero_padded_load(arrays):
    """The default tile load: rows r0 .. r0 + rows of one (batch, head), zero past the end."""
    def load(name, b, r0, head, rows):
        return _pad_rows(arrays[name][b, r0:r0 + rows, head], rows)
    return load


def tiled_forward(q, k, v, causal=False, scale=None, block_m=DEFAULT_BLOCK_M,
                  block_n=DEFAULT_BLOCK_N, return_visits=False, load=None):
    """Flash forward with online softmax. Returns (out, lse), plus the number of tile pairs
    visited (summed over batch and heads) when return_visits. `load(name, b, r0, head, rows)`
    fetches a tile ("q", "k", "v"); the default zero-pads past the end (varlen_forward passes
    one that reads on into the next sequence, as a TMA load of a packed tensor does)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    load = load or _zero_padded_load({"q": q, "k": k, "v": v})
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads // nheads_k
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    scale_log2 = scale * LOG2E          # exp(x * scale) == exp2(x * scale_log2), as in the kernel
    out = np.zeros((batch, seqlen_q, nheads, v.shape[-1]))
    lse = np.zeros((batch, nheads, seqlen_q))
    visits = 0

    for b in range(batch):
        for h in range(nheads):
            hk = h // group
            for m_block in range(_cdiv(seqlen_q, block_m)):
                r0 = m_block * block_m
                q_i = load("q", b, r0, h, block_m)
                row_max = np.full(block_m, -np.inf)   # running max of raw (unscaled) S
                row_sum = np.zeros(block_m)           # running sum of exp2, relative to row_max
                acc = np.zeros((block_m, v.shape[-1]))
                lo, hi = n_block_range(m_block, seqlen_q, seqlen_k, block_m, block_n, causal)
                # Last block first, as FA3 does: the blocks that need masking (causal diagonal,
                # sequence end) come first and the rest of the loop runs without masks.
                for n_block in reversed(range(lo, hi)):
                    visits += 1
                    c0 = n_block * block_n
                    k_j = load("k", b, c0, hk, block_n)
                    v_j = load("v", b, c0, hk, block_n)
                    s = q_i @ k_j.T                                         # S = Q K^T
                    keep = _tile_mask(m_block, n_block, seqlen_q, seqlen_k, block_m, block_n,
                                      causal)
                    s = np.where(keep, s, -np.inf)
                    new_max = np.maximum(row_max, s.max(axis=1))
                    # A row with nothing visible yet keeps max -inf; subtract 0 instead so that
                    # exp2(-inf - -inf) = NaN never happens (its p and rescale are then 0).
                    base = np.where(new_max == -np.inf, 0.0, new_max)
                    rescale = np.exp2((row_max - base) * scale_log2)
                    p = np.exp2(s * scale_log2 - (base * scale_log2)[:, None])
                    row_sum = row_sum * rescale + p.sum(axis=1)
                    acc = acc * rescale[:, None] + p @ v_j                  # O += P V
                    row_max = new_max
                # Epilogue: normalise, write only the real rows; lse = +inf where no key was seen.
                rows = min(block_m, seqlen_q - r0)
                seen = row_sum > 0
                inv = np.divide(1.0, row_sum, out=np.zeros(block_m), where=seen)
                out[b, r0:r0 + rows, h] = (acc * inv[:, None])[:rows]
                with np.errstate(divide="ignore"):
                    lse_i = np.where(seen, (row_max * scale_log2 + np.log2(row_sum)) * LN2, np.inf)
                lse[b, h, r0:r0 + rows] = lse_i[:rows]
    return (out, lse, visits) if return_visits else (out, lse)


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------

def _bwd_preprocess(dout, out, lse, q, k, v, block_m):
    """(0) Preprocess: D = rowsum(dO * O); LSE in base 2; zero the dQ accumulator. Per-row arrays
    are padded to whole Q blocks; padded rows get LSE2 = +inf so that their P is exactly 0
    (their dO and Q are zero-padded too, so they would contribute nothing either way).
    Returns (dsum, lse2, dq_accum, dk, dv)."""
    batch, seqlen_q, nheads, d = q.shape
    seqlen_q_rounded = _cdiv(seqlen_q, block_m) * block_m
    dsum = np.zeros((batch, nheads, seqlen_q_rounded))
    dsum[:, :, :seqlen_q] = np.einsum("bshd,bshd->bhs", dout, out)
    lse2 = np.full((batch, nheads, seqlen_q_rounded), np.inf)
    lse2[:, :, :seqlen_q] = lse * LOG2E          # +inf (no-key rows) stays +inf
    dq_accum = np.zeros((batch, seqlen_q_rounded, nheads, d))
    return dsum, lse2, dq_accum, np.zeros_like(k), np.zeros_like(v)


def _bwd_step_rows(load, lse2, dsum, b, h, r0, block_m):
    """A backward step's Q and dO rows r0.. of head h, with their LSE * log2(e) and D."""
    return (load("q", b, r0, h, block_m), load("dout", b, r0, h, block_m),
            lse2[b, h, r0:r0 + block_m], dsum[b, h, r0:r0 + block_m])


def _bwd_tile_p_ds(q_i, do_i, k_j, v_j, lse2_i, d_i, keep, scale_log2):
    """Steps (1)-(4) of one tile pair: returns (P, dS)."""
    # (1) S = Q_i K_j^T
    s = q_i @ k_j.T
    # (2) P = exp2(S * scale * log2e - LSE2_i), masked (S set to -inf first, as the kernel
    # does, so masked entries cannot overflow)
    s = np.where(keep, s, -np.inf)
    p = np.exp2(s * scale_log2 - lse2_i[:, None])
    # (3) dP = dO_i V_j^T
    dp = do_i @ v_j.T
    # (4) dS = P * (dP - D_i)
    return p, p * (dp - d_i[:, None])


def tiled_backward(dout, q, k, v, out, lse, causal=False, scale=None, block_m=DEFAULT_BLOCK_M,
                   block_n=DEFAULT_BLOCK_N, return_visits=False, load=None):
    """Flash backward: preprocess, main loop (one CTA per (batch, kv head, K/V block)),
    postprocess. Returns (dq, dk, dv), plus the tile pairs visited when return_visits. `load`
    as in tiled_forward (names "q", "k", "v", "dout")."""
    dout, q, k, v, out, lse = (np.asarray(x, dtype=np.float64) for x in (dout, q, k, v, out, lse))
    load = load or _zero_padded_load({"q": q, "k": k, "v": v, "dout": dout})
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads // nheads_k
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    scale_log2 = scale * LOG2E
    visits = 0
    dsum, lse2, dq_accum, dk, dv = _bwd_preprocess(dout, out, lse, q, k, v, block_m)

    # Main kernel: each CTA owns one K/V block; its dK, dV stay in registers across the walk and
    # are written once, so kv heads shared by a GQA group need no atomics. dQ is shared between
    # CTAs and accumulated into dq_accum (fp32 atomics on the GPU).
    for b in range(batch):
        for hk in range(nheads_k):
            for n_block in range(_cdiv(seqlen_k, block_n)):
                c0 = n_block * block_n
                k_j = load("k", b, c0, hk, block_n)
                v_j = load("v", b, c0, hk, block_n)
                dk_j = np.zeros((block_n, d))
                dv_j = np.zeros((block_n, v.shape[-1]))
                lo, hi = m_block_range(n_block, seqlen_q, seqlen_k, block_m, block_n, causal)
                for h in range(hk * group, (hk + 1) * group):
                    for m_block in range(lo, hi):
                        visits += 1
                        r0 = m_block * block_m
                        q_i, do_i, lse2_i, d_i = _bwd_step_rows(load, lse2, dsum, b, h, r0, block_m)
                        keep = _tile_mask(m_block, n_block, seqlen_q, seqlen_k, block_m, block_n,
                                          causal)
                        p, ds = _bwd_tile_p_ds(q_i, do_i, k_j, v_j, lse2_i, d_i, keep, scale_log2)
                        # (5) dV_j += P^T dO_i
                        dv_j += p.T @ do_i
                        # (6) dK_j += dS^T Q_i
                        dk_j += ds.T @ q_i
                        # (7) dQaccum_i += dS K_j
                        dq_accum[b, r0:r0 + block_m, h] += ds @ k_j
                # Epilogue: dK gets its softmax scale here (dV needs none); drop padded rows.
                cols = min(block_n, seqlen_k - c0)
                dk[b, c0:c0 + cols, hk] = (dk_j * scale)[:cols]
                dv[b, c0:c0 + cols, hk] = dv_j[:cols]

    # Postprocess: dQ = scale * dQaccum (converted to bf16 on the GPU).
    dq = scale * dq_accum[:, :seqlen_q]
    return (dq, dk, dv, visits) if return_visits else (dq, dk, dv)


def tiled_backward_pair(dout, q, k, v, out, lse, causal=False, scale=None, block_m=DEFAULT_BLOCK_M,
                        block_n=DEFAULT_BLOCK_N, return_visits=False):
    """The backward as the 2-CTA pair runs it (BwdSm90Config::pair_dq, docs/design.md section 5):
    CTAs r = 0, 1 of pair j own K/V blocks 2 j + r (the upper one may lie past seqlen_k: zero
    padded, all masked) and walk the lower block's Q blocks in lockstep; per step each computes
    its dS, the two swap them, and CTA r adds dQ for head-dim half r over both blocks' keys, so
    every dQ element gets one add per pair. Returns (dq, dk, dv), plus the steps both CTAs ran
    (masked ones included) when return_visits."""
    dout, q, k, v, out, lse = (np.asarray(x, dtype=np.float64) for x in (dout, q, k, v, out, lse))
    load = _zero_padded_load({"q": q, "k": k, "v": v, "dout": dout})
    batch, seqlen_q, nheads, d = q.shape
    assert d % 2 == 0, "the pair splits the head dim in halves"
    half = d // 2
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads // nheads_k
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    scale_log2 = scale * LOG2E
    n_blocks = _cdiv(seqlen_k, block_n)
    visits = 0
    dsum, lse2, dq_accum, dk, dv = _bwd_preprocess(dout, out, lse, q, k, v, block_m)

    for b in range(batch):
        for hk in range(nheads_k):
            for pair in range(_cdiv(n_blocks, 2)):
                blocks = (2 * pair, 2 * pair + 1)
                k_r = [load("k", b, n * block_n, hk, block_n) for n in blocks]
                v_r = [load("v", b, n * block_n, hk, block_n) for n in blocks]
                dk_r = [np.zeros((block_n, d)) for _ in blocks]
                dv_r = [np.zeros((block_n, v.shape[-1])) for _ in blocks]
                # Both walk the lower block's Q blocks (the upper block's are a subset).
                lo, hi = m_block_range(blocks[0], seqlen_q, seqlen_k, block_m, block_n, causal)
                for h in range(hk * group, (hk + 1) * group):
                    for m_block in range(lo, hi):
                        visits += 2
                        r0 = m_block * block_m
                        q_i, do_i, lse2_i, d_i = _bwd_step_rows(load, lse2, dsum, b, h, r0, block_m)
                        ds_r = []
                        for r, n_block in enumerate(blocks):
                            keep = _tile_mask(m_block, n_block, seqlen_q, seqlen_k, block_m,
                                              block_n, causal)
                            p, ds = _bwd_tile_p_ds(q_i, do_i, k_r[r], v_r[r], lse2_i, d_i, keep,
                                                   scale_log2)
                            dv_r[r] += p.T @ do_i
                            dk_r[r] += ds.T @ q_i
                            ds_r.append(ds)
                        # The swap: CTA r holds both dS and adds its head-dim half of dQ.
                        for r in range(2):
                            cols = slice(r * half, (r + 1) * half)
                            dq_accum[b, r0:r0 + block_m, h, cols] += (
                                ds_r[0] @ k_r[0][:, cols] + ds_r[1] @ k_r[1][:, cols])
                for r, n_block in enumerate(blocks):
                    c0 = n_block * block_n
                    rows = min(block_n, seqlen_k - c0)
                    if rows > 0:
                        dk[b, c0:c0 + rows, hk] = (dk_r[r] * scale)[:rows]
                        dv[b, c0:c0 + rows, hk] = dv_r[r][:rows]

    dq = scale * dq_accum[:, :seqlen_q]
    return (dq, dk, dv, visits) if return_visits else (dq, dk, dv)


# --------------------------------------------------------------------------------------------
# Variable-length batches
# --------------------------------------------------------------------------------------------
# Packed (total, heads, d) tensors and int offsets cu (batch + 1). Each sequence runs as its own
# batch element, but its tiles are loaded from the packed tensors at its first row: a tile that
# runs past the sequence's end holds the next sequence's rows (zeros only past the last row),
# which the per-sequence masks and bounds must keep out. LSE is (heads, total_q).

def _packed_load(arrays, row0):
    def load(name, b, r0, head, rows):
        x = arrays[name]
        start = row0[name] + r0
        return _pad_rows(x[start:start + rows, head], rows)
    return load


def varlen_forward(q, k, v, cu_q, cu_k, causal=False, scale=None, block_m=DEFAULT_BLOCK_M,
                   block_n=DEFAULT_BLOCK_N):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    out = np.zeros_like(q)
    lse = np.zeros((q.shape[1], q.shape[0]))
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        load = _packed_load({"q": q, "k": k, "v": v}, {"q": q0, "k": k0, "v": k0})
        o_b, l_b = tiled_forward(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, scale,
                                 block_m, block_n, load=load)
        out[q0:q1] = o_b[0]
        lse[:, q0:q1] = l_b[0]
    return out, lse


def varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, causal=False, scale=None,
                    block_m=DEFAULT_BLOCK_M, block_n=DEFAULT_BLOCK_N):
    dout, q, k, v, out, lse = (np.asarray(x, dtype=np.float64) for x in (dout, q, k, v, out, lse))
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        load = _packed_load({"q": q, "k": k, "v": v, "dout": dout},
                            {"q": q0, "k": k0, "v": k0, "dout": q0})
        g = tiled_backward(dout[None, q0:q1], q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                           out[None, q0:q1], lse[None, :, q0:q1], causal, scale, block_m,
                           block_n, load=load)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv
