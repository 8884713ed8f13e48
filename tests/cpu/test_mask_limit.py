"""The backward's mask (csrc/bwd_sm90/bwd_sm90_mainloop.cuh p_values,
csrc/bwd_sm90/bwd_sm90_mainloop_by_keys.cuh p_t_exps), modelled on the CPU: the
per-row limit with the element's offset as an immediate masks exactly the elements the direct
test `key >= seqlen_k or (causal and key > query + diag)` masks, for every accumulator element
of every thread, over blocks that cross the diagonal or seqlen_k from either side. Python
transcriptions of the limit arithmetic and of the accumulator layout (hopper/wgmma.h acc_row /
acc_col)."""
import itertools
import random

INT_MAX, INT_MIN = 2**31 - 1, -(2**31)


def acc_row(r, t):
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((r >> 1) & 1)


def acc_col(r, t):
    return 8 * (r >> 2) + 2 * (t % 4) + (r & 1)


def direct(key, query, seqlen_k, causal, diag):
    return key >= seqlen_k or (causal and key > query + diag)


def shapes():
    rng = random.Random(7)
    for _ in range(60):
        seqlen_q = rng.choice([1, 17, 64, 113, 128, 1000, rng.randint(1, 4096)])
        seqlen_k = rng.choice([1, 17, 80, 113, 1000, rng.randint(1, 4096)])
        yield seqlen_q, seqlen_k, rng.random() < 0.7


def test_rows_by_queries_split_by_head_dim():
    """Rows are queries (m0 + acc_row), columns keys (n0 + acc_col): the backward's p_values,
    kS = block_n / 2 registers per thread."""
    checked = 0
    for (seqlen_q, seqlen_k, causal), block_n in itertools.product(shapes(), (64, 80, 112, 128)):
        diag = seqlen_k - seqlen_q
        ks = block_n // 2
        for m0 in range(0, seqlen_q, 64):
            for n0 in range(0, seqlen_k, block_n):
                if not (n0 + block_n > seqlen_k or (causal and n0 + block_n - 1 > m0 + diag)):
                    continue  # the step tests no mask
                for t in range(0, 128, 5):
                    c0 = n0 + acc_col(0, t)
                    lim = [(min(seqlen_k, m0 + acc_row(2 * h, t) + diag + 1) if causal else seqlen_k) - c0
                           for h in range(2)]
                    for r in range(ks):
                        ours = acc_col(r, 0) >= lim[(r >> 1) & 1]
                        want = direct(n0 + acc_col(r, t), m0 + acc_row(r, t), seqlen_k, causal, diag)
                        assert ours == want, (seqlen_q, seqlen_k, causal, block_n, m0, n0, t, r)
                        checked += 1
    assert checked > 100_000


def test_rows_by_keys():
    """By keys (d = 64): rows are keys (key_lo, key_lo + 8), columns queries q0 + 8 j + (e & 1),
    element r = 4 j + e of block_m / 2 registers; the limit is on the query offset."""
    checked = 0
    block_m, block_n = 128, 128
    for seqlen_q, seqlen_k, causal in shapes():
        diag = seqlen_k - seqlen_q
        for m0 in range(0, seqlen_q, block_m):
            for n0 in range(0, seqlen_k, block_n):
                if not (n0 + block_n > seqlen_k or (causal and n0 + block_n - 1 > m0 + diag)):
                    continue
                for wg, t in itertools.product(range(2), range(0, 128, 3)):
                    key_lo = n0 + 64 * wg + acc_row(0, t)
                    q0 = m0 + acc_col(0, t)
                    qlim = []
                    for h in range(2):
                        key = key_lo + 8 * h
                        qlim.append(INT_MAX if key >= seqlen_k else (key - diag - q0 if causal else INT_MIN))
                    for j, e in itertools.product(range(block_m // 8), range(4)):
                        ours = 8 * j + (e & 1) < qlim[e >> 1]
                        want = direct(key_lo + 8 * (e >> 1), q0 + 8 * j + (e & 1), seqlen_k, causal, diag)
                        assert ours == want, (seqlen_q, seqlen_k, causal, m0, n0, wg, t, j, e)
                        checked += 1
    assert checked > 100_000
