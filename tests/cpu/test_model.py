"""CPU checks of the reference math and of the NumPy model of the tiled kernels.

Chain of trust: the float64 dense formulas (reference.py) are checked against PyTorch autograd
through `attention_ref`; the tiled model (tiled_model.py) is checked against the dense formulas
to float64 rounding; the GPU tests then hold the kernels to `attention_ref` with `check_close`.

Inputs are fresh random each run. The seed is printed (pytest shows it for a failing test) and
the FLASHBACK_TEST_SEED environment variable replays it.
"""

import os

import numpy as np
import pytest
import torch

from reference import (attention_ref, causal_mask, check_close, dense_backward_np,
                       dense_forward_np, error_bound)
from tiled_model import (m_block_range, n_block_range, tiled_backward, tiled_backward_pair,
                         tiled_forward, visible_tile_pairs_bruteforce)

# float64 results that differ only in summation order agree to ~1e-15 relative; 1e-10 leaves room
# for long sums without letting any real tiling mistake through.
RTOL = 1e-10


@pytest.fixture
def rng():
    seed = int(os.environ.get("FLASHBACK_TEST_SEED", np.random.SeedSequence().entropy))
    print(f"FLASHBACK_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def make_inputs(rng, batch, seqlen_q, seqlen_k, nheads, nheads_k, d):
    q = rng.standard_normal((batch, seqlen_q, nheads, d))
    k = rng.standard_normal((batch, seqlen_k, nheads_k, d))
    v = rng.standard_normal((batch, seqlen_k, nheads_k, d))
    dout = rng.standard_normal((batch, seqlen_q, nheads, d))
    return q, k, v, dout


def assert_close64(name, got, want, rtol=RTOL):
    """|got - want| <= rtol * max(1, max|want|) on finite entries; infinities must coincide."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert not np.isnan(got).any(), f"{name}: NaN in result"
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite]), f"{name}: infinities differ"
    assert np.isfinite(got[finite]).all(), f"{name}: infinite where the reference is finite"
    if finite.any():
        err = np.abs(got[finite] - want[finite]).max()
        tol = rtol * max(1.0, np.abs(want[finite]).max())
        assert err <= tol, f"{name}: max abs error {err:.3e} > {tol:.3e}"


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, d, block_m, block_n, softmax_scale)
MODEL_CASES = [
    (1, 1, 1, 1, 1, 16, 64, 80, None),          # a single element
    (2, 17, 17, 2, 2, 16, 64, 80, None),        # one partial block each way
    (1, 64, 64, 1, 1, 64, 64, 80, None),        # exactly one Q block, partial K/V block
    (1, 128, 160, 2, 2, 16, 64, 80, None),      # blocks divide both sequences, sq < sk
    (1, 160, 128, 2, 2, 16, 64, 80, None),      # blocks divide both sequences, sq > sk
    (2, 100, 100, 4, 2, 16, 64, 80, None),      # GQA, blocks do not divide
    (1, 100, 100, 4, 1, 64, 32, 16, None),      # MQA, small blocks, many tiles per row
    (1, 17, 100, 2, 1, 16, 16, 32, None),       # seqlen_q < seqlen_k
    (2, 100, 17, 4, 2, 16, 64, 80, None),       # seqlen_q > seqlen_k: no-key rows when causal
    (1, 100, 45, 2, 2, 16, 16, 16, None),       # no-key rows spanning whole Q blocks
    (1, 1, 100, 2, 2, 16, 64, 80, None),        # one query row
    (1, 100, 1, 2, 2, 16, 64, 80, None),        # one key
    (1, 37, 53, 2, 1, 16, 1, 1, None),          # 1x1 tiles: every element its own tile
    (1, 100, 100, 2, 2, 16, 128, 48, None),     # block_m larger than the sequence
    (1, 100, 120, 2, 2, 16, 32, 40, 2.0),       # peaked softmax: running max moves a lot
    (1, 96, 96, 2, 1, 256, 64, 80, None),       # head dim 256 with the fast kernel's tiles
    (1, 1000, 1000, 2, 1, 16, 64, 80, None),    # long sequence
]


def _case_id(case):
    b, sq, sk, h, hk, d, bm, bn, scale = case
    s = f"b{b}-q{sq}-k{sk}-h{h}/{hk}-d{d}-tile{bm}x{bn}"
    return s if scale is None else s + f"-scale{scale}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", MODEL_CASES, ids=_case_id)
def test_tiled_model_matches_dense(rng, case, causal):
    batch, sq, sk, h, hk, d, block_m, block_n, scale = case
    q, k, v, dout = make_inputs(rng, batch, sq, sk, h, hk, d)

    out_ref, lse_ref = dense_forward_np(q, k, v, causal, scale)
    out, lse = tiled_forward(q, k, v, causal, scale, block_m, block_n)
    assert_close64("out", out, out_ref)
    assert_close64("lse", lse, lse_ref)

    dq_ref, dk_ref, dv_ref = dense_backward_np(dout, q, k, v, causal, scale)
    # The backward consumes the forward's O and LSE, as the real pipeline does.
    dq, dk, dv = tiled_backward(dout, q, k, v, out, lse, causal, scale, block_m, block_n)
    assert_close64("dq", dq, dq_ref)
    assert_close64("dk", dk, dk_ref)
    assert_close64("dv", dv, dv_ref)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", MODEL_CASES, ids=_case_id)
def test_pair_model_matches_dense(rng, case, causal):
    """The 2-CTA pair's walk (lockstep from the lower block, a partner past the keys when the
    block count is odd, dS swapped, dQ added per head-dim half over both blocks) gives the
    dense gradients, and runs exactly 2 x the lower blocks' steps."""
    batch, sq, sk, h, hk, d, block_m, block_n, scale = case
    q, k, v, dout = make_inputs(rng, batch, sq, sk, h, hk, d)
    out, lse = dense_forward_np(q, k, v, causal, scale)
    dq_ref, dk_ref, dv_ref = dense_backward_np(dout, q, k, v, causal, scale)
    dq, dk, dv, steps = tiled_backward_pair(dout, q, k, v, out, lse, causal, scale, block_m,
                                            block_n, return_visits=True)
    assert_close64("dq", dq, dq_ref)
    assert_close64("dk", dk, dk_ref)
    assert_close64("dv", dv, dv_ref)
    n_blocks = -(-sk // block_n)
    lower_steps = sum(
        hi - lo for lo, hi in (m_block_range(n, sq, sk, block_m, block_n, causal)
                               for n in range(0, n_blocks, 2)))
    assert steps == 2 * lower_steps * batch * h


# ---------------------------------------------------------------------------------------------
# Causal block skipping visits exactly the tiles with something visible
# ---------------------------------------------------------------------------------------------

def _range_pairs(sq, sk, block_m, block_n, causal):
    """Tile pairs implied by the forward's and by the backward's block ranges."""
    fwd = sum(np.subtract(*reversed(n_block_range(i, sq, sk, block_m, block_n, causal)))
              for i in range(-(-sq // block_m)))
    bwd = sum(np.subtract(*reversed(m_block_range(j, sq, sk, block_m, block_n, causal)))
              for j in range(-(-sk // block_n)))
    return fwd, bwd


@pytest.mark.parametrize("block_m, block_n", [(64, 80), (64, 64), (128, 64), (16, 48), (1, 7)])
def test_block_ranges_sweep(block_m, block_n):
    """Every (seqlen_q, seqlen_k) on a grid: the ranges give the brute-force tile count."""
    lengths = [1, 2, 15, 16, 17, 63, 64, 65, 79, 80, 81, 150, 160, 241]
    for sq in lengths:
        for sk in lengths:
            for causal in (False, True):
                want = visible_tile_pairs_bruteforce(sq, sk, block_m, block_n, causal)
                fwd, bwd = _range_pairs(sq, sk, block_m, block_n, causal)
                assert (fwd, bwd) == (want, want), (
                    f"sq={sq} sk={sk} tile {block_m}x{block_n} causal={causal}: forward visits "
                    f"{fwd}, backward {bwd}, tiles with a visible element {want}")


@pytest.mark.parametrize("sq, sk, block_m, block_n", [
    (300, 300, 64, 80), (300, 170, 64, 80), (170, 300, 64, 80), (256, 256, 64, 64),
    (100, 30, 16, 16),
])
def test_visited_tile_pairs(rng, sq, sk, block_m, block_n):
    """The model's loops (not just the range functions) visit exactly the expected tiles."""
    batch, h, hk, d = 2, 4, 2, 4
    q, k, v, dout = make_inputs(rng, batch, sq, sk, h, hk, d)
    for causal in (False, True):
        want = batch * h * visible_tile_pairs_bruteforce(sq, sk, block_m, block_n, causal)
        out, lse, fwd = tiled_forward(q, k, v, causal, None, block_m, block_n, return_visits=True)
        *_, bwd = tiled_backward(dout, q, k, v, out, lse, causal, None, block_m, block_n,
                                 return_visits=True)
        assert fwd == want and bwd == want, f"causal={causal}: fwd {fwd} bwd {bwd} want {want}"
    # Causal skipping does skip: about half the tiles of a square problem.
    if sq == sk:
        full = visible_tile_pairs_bruteforce(sq, sk, block_m, block_n, False)
        assert visible_tile_pairs_bruteforce(sq, sk, block_m, block_n, True) < full


# ---------------------------------------------------------------------------------------------
# The torch reference used by the GPU tests agrees with the float64 formulas
# ---------------------------------------------------------------------------------------------

def _torch_ref_with_grads(q, k, v, dout, causal, scale, dtype=torch.float64, upcast=True):
    qt, kt, vt = (torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q, k, v))
    out, lse = attention_ref(qt, kt, vt, causal=causal, softmax_scale=scale, upcast=upcast)
    out.backward(torch.tensor(dout, dtype=out.dtype))
    return out.detach(), lse.detach(), qt.grad, kt.grad, vt.grad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [
    (1, 1, 1, 1, 1, 16), (2, 17, 33, 4, 2, 16), (1, 64, 64, 2, 1, 64), (2, 100, 17, 4, 2, 16),
    (1, 33, 20, 2, 2, 256),
], ids=lambda s: "b{}-q{}-k{}-h{}/{}-d{}".format(*s))
def test_dense_np_matches_torch_reference(rng, shape, causal):
    q, k, v, dout = make_inputs(rng, *shape)
    scale = None if shape[1] != 17 else 0.3     # one explicit scale
    out, lse, dq, dk, dv = _torch_ref_with_grads(q, k, v, dout, causal, scale)
    assert out.dtype == torch.float64 and lse.dtype == torch.float32
    out_np, lse_np = dense_forward_np(q, k, v, causal, scale)
    dq_np, dk_np, dv_np = dense_backward_np(dout, q, k, v, causal, scale)
    assert_close64("out", out.numpy(), out_np)
    # lse comes back as float32 by contract, so only float32 rounding is expected there.
    assert_close64("lse", lse.numpy(), lse_np.astype(np.float32), rtol=1e-6)
    assert_close64("dq", dq.numpy(), dq_np)
    assert_close64("dk", dk.numpy(), dk_np)
    assert_close64("dv", dv.numpy(), dv_np)


# ---------------------------------------------------------------------------------------------
# Rows that see no key: out 0, lse +inf, zero gradient, no NaN anywhere
# ---------------------------------------------------------------------------------------------

def test_no_key_rows(rng):
    batch, sq, sk, h, hk, d = 2, 100, 17, 4, 2, 16
    empty = ~causal_mask(sq, sk).any(axis=1)
    assert empty.sum() == sq - sk              # rows 0..82 see nothing
    q, k, v, dout = make_inputs(rng, batch, sq, sk, h, hk, d)

    def check(name, out, lse, dq, dk, dv):
        for t, x in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            assert np.isfinite(x).all(), f"{name}: non-finite {t}"
        assert (out[:, empty] == 0).all(), f"{name}: out not zero on no-key rows"
        assert (dq[:, empty] == 0).all(), f"{name}: dq not zero on no-key rows"
        assert np.isposinf(lse[:, :, empty]).all(), f"{name}: lse not +inf on no-key rows"
        assert np.isfinite(lse[:, :, ~empty]).all(), f"{name}: lse not finite on other rows"
        assert (out[:, ~empty] != 0).any()

    check("dense", *dense_forward_np(q, k, v, True), *dense_backward_np(dout, q, k, v, True))
    out, lse = tiled_forward(q, k, v, True)
    check("tiled", out, lse, *tiled_backward(dout, q, k, v, out, lse, True))
    for dtype, upcast in ((torch.float64, True), (torch.bfloat16, True), (torch.bfloat16, False)):
        res = _torch_ref_with_grads(q, k, v, dout, True, None, dtype=dtype, upcast=upcast)
        check(f"torch {dtype} upcast={upcast}", *(t.double().numpy() for t in res))


# ---------------------------------------------------------------------------------------------
# The error bar can fail
# ---------------------------------------------------------------------------------------------

def _bf16_refs(rng, causal):
    q, k, v, dout = (torch.tensor(x, dtype=torch.bfloat16)
                     for x in make_inputs(rng, 2, 100, 80, 4, 2, 64))
    out32, lse32 = attention_ref(q, k, v, causal=causal)
    out16, lse16 = attention_ref(q, k, v, causal=causal, upcast=False)
    assert out32.dtype == torch.float32 and out16.dtype == torch.bfloat16
    assert lse32.dtype == lse16.dtype == torch.float32
    return out32, lse32, out16, lse16


def test_error_bound_formula(rng):
    out32, _, out16, _ = _bf16_refs(rng, causal=False)
    diff = (out16.double() - out32.double()).abs().max().item()
    assert diff > 0, "the bf16 reference should differ from the fp32 one"
    assert error_bound(out32, out16) == pytest.approx(2 * diff + 1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_check_close_passes_and_fails(rng, causal):
    out32, lse32, out16, lse16 = _bf16_refs(rng, causal)
    # The bf16 reference meets its own bar (its error is half the bound).
    check_close("out", out16, out32, out16)
    check_close("lse", lse16, lse32, lse16)     # carries +inf on no-key rows when causal

    bound = error_bound(out32, out16)
    bad = out32.clone()
    bad[1, 50, 3, 7] += 1.5 * bound
    with pytest.raises(AssertionError, match=r"out: max abs error .* exceeds the bound"):
        check_close("out", bad, out32, out16)

    nan = out32.clone()
    nan[0, 0, 0, 0] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        check_close("out", nan, out32, out16)

    inf = lse32.clone()
    inf[0, 0, -1] = float("inf")                # last row always sees keys
    with pytest.raises(AssertionError, match="infinite"):
        check_close("lse", inf, lse32, lse16)
    if causal:
        finite = lse32.clone()
        finite[0, 0, 0] = 0.0                   # row 0 sees no key: lse must stay +inf
        with pytest.raises(AssertionError, match="infinite"):
            check_close("lse", finite, lse32, lse16)
