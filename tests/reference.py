"""Reference attention math shared by the CPU and GPU tests.

Two independent implementations of the same definition (docs/design.md section 1):

* ``attention_ref``: PyTorch, differentiable through autograd. The GPU tests compare the kernels
  against it twice: once computed in float32 (the truth) and once in the inputs' low precision
  (what "plain PyTorch in bf16" would give). The kernel passes when its error against the float32
  result is at most twice the low-precision reference's error (``error_bound``, ``check_close``).
* ``dense_forward_np`` / ``dense_backward_np``: NumPy float64, with the backward written out by
  hand. The CPU tests check the tiled model (tests/tiled_model.py) and ``attention_ref`` against
  them, so the torch reference is itself verified rather than trusted.

Conventions, everywhere in this file:
  q (batch, seqlen_q, nheads, d); k, v (batch, seqlen_k, nheads_k, d); nheads % nheads_k == 0 and
  query head h reads kv head h // (nheads // nheads_k) (GQA; MQA when nheads_k == 1).
  Causal is aligned bottom-right: query i sees key j iff j <= i + seqlen_k - seqlen_q.
  lse is (batch, nheads, seqlen_q), float32 in torch, natural log.
  A query row that sees no key (causal with seqlen_q > seqlen_k) has out = 0, lse = +inf and gets
  zero gradient: +inf is what makes the backward's exp(S - lse) vanish on such rows.
"""

import contextlib
import math

import numpy as np
import torch

__all__ = [
    "attention_ref",
    "causal_mask",
    "error_bound",
    "check_close",
    "dense_forward_np",
    "dense_backward_np",
]


def causal_mask(seqlen_q, seqlen_k):
    """Boolean (seqlen_q, seqlen_k) NumPy array, True where query i may see key j (bottom-right)."""
    rows = np.arange(seqlen_q)[:, None]
    cols = np.arange(seqlen_k)[None, :]
    return cols <= rows + (seqlen_k - seqlen_q)


def _check_shapes(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be 4-D (batch, seqlen, nheads, d), got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k disagree on batch or headdim: {q.shape} vs {k.shape}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"nheads ({q.shape[2]}) must be divisible by nheads_k ({k.shape[2]})")
    return q.shape[2] // k.shape[2]


# --------------------------------------------------------------------------------------------
# PyTorch reference (autograd)
# --------------------------------------------------------------------------------------------

def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True):
    """Attention in PyTorch; returns (out, lse), differentiable with respect to q, k, v.

    upcast=True: computed in float32 from the inputs cast to float32 (float64 inputs stay float64,
      so the CPU tests can check this function against the float64 NumPy formulas); out is returned
      in that dtype.
    upcast=False: every op runs in the inputs' dtype, as a user writing attention in PyTorch with
      bf16 tensors would get (including a bf16 logsumexp). Its distance to the upcast result is the
      error bar the kernels must meet (see error_bound). lse is still returned as float32.
    """
    group = _check_shapes(q, k, v)
    d = q.shape[-1]
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    if upcast:
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    # GQA/MQA: each kv head serves `group` consecutive query heads.
    if group > 1:
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)

    # Scale after the matmul, as the kernels do (S is accumulated unscaled in fp32).
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
    if causal:
        # Built on the device: a NumPy mask would cost a seqlen_q x seqlen_k host copy.
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        visible = torch.arange(seqlen_k, device=q.device)[None, :] <= rows + seqlen_k - seqlen_q
        # A row with no visible key would be softmax over all -inf = NaN, and NaN poisons autograd
        # even when masked out afterwards. So such rows are given scores of 0 (any finite value)
        # and their probabilities are zeroed by `row_has_key` below.
        row_has_key = visible.any(dim=-1)                                   # (seqlen_q,)
        fill = torch.where(row_has_key[:, None], float("-inf"), 0.0).to(scores.dtype)
        scores = torch.where(visible, scores, fill)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if causal:
        probs = probs * row_has_key[:, None].to(probs.dtype)
        lse = torch.where(row_has_key, lse, torch.full_like(lse, float("inf")))
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return out, lse.float()


# --------------------------------------------------------------------------------------------
# The error bar
# --------------------------------------------------------------------------------------------

def _finite_max_abs_diff(a, b):
    """max |a - b| over entries where b is finite (b's +inf entries are compared separately)."""
    a, b = a.double(), b.double()
    finite = torch.isfinite(b)
    if not finite.any():
        return 0.0
    return (a[finite] - b[finite]).abs().max().item()


def error_bound(ref_fp32, ref_lowp):
    """The project's bar: twice the error of the same reference computed in low precision, plus a
    small absolute floor so that exactly representable results do not demand exact equality.
    Entries that are +inf in ref_fp32 (lse of rows that see no key) are left out."""
    return 2.0 * _finite_max_abs_diff(ref_lowp, ref_fp32) + 1e-5


def check_close(name, ours, ref_fp32, ref_lowp):
    """Assert that `ours` meets the bar; the message names the tensor, the error and the bound.

    No NaN is allowed anywhere in `ours`, and an infinity only where ref_fp32 has the same one
    (lse = +inf on rows that see no key); everywhere else `ours` must be finite.
    """
    if ours.shape != ref_fp32.shape:
        raise AssertionError(f"{name}: shape {tuple(ours.shape)} != reference "
                             f"{tuple(ref_fp32.shape)}")
    ours64, ref64 = ours.detach().double().cpu(), ref_fp32.detach().double().cpu()
    n_nan = torch.isnan(ours64).sum().item()
    assert n_nan == 0, f"{name}: {n_nan} NaN entries"
    ref_inf = torch.isinf(ref64)
    bad_inf = (torch.isinf(ours64) & ~ref_inf) | (ref_inf & (ours64 != ref64))
    n_bad = bad_inf.sum().item()
    assert n_bad == 0, f"{name}: {n_bad} entries infinite where the reference is not (or vice versa)"
    bound = error_bound(ref64, ref_lowp.detach().double().cpu())
    err = _finite_max_abs_diff(ours64, ref64)
    assert err <= bound, (f"{name}: max abs error {err:.3e} exceeds the bound {bound:.3e} "
                          f"(2 x low-precision reference error + 1e-5)")
    return err, bound


# --------------------------------------------------------------------------------------------
# NumPy float64 dense formulas
# --------------------------------------------------------------------------------------------

def _np_scale(d, scale):
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _dense_probs_np(qh, kh, causal, scale):
    """Probabilities P (seqlen_q, seqlen_k) and lse (seqlen_q,) for one head, float64."""
    seqlen_q, seqlen_k = qh.shape[0], kh.shape[0]
    s = (qh @ kh.T) * scale
    visible = causal_mask(seqlen_q, seqlen_k) if causal else np.ones_like(s, dtype=bool)
    s = np.where(visible, s, -np.inf)
    has_key = visible.any(axis=1)
    row_max = np.where(has_key, s.max(axis=1, initial=-np.inf), 0.0)
    e = np.where(visible, np.exp(s - row_max[:, None]), 0.0)
    row_sum = e.sum(axis=1)
    p = np.divide(e, row_sum[:, None], out=np.zeros_like(e), where=has_key[:, None])
    with np.errstate(divide="ignore"):
        lse = np.where(has_key, row_max + np.log(row_sum), np.inf)
    return p, lse


def dense_forward_np(q, k, v, causal=False, scale=None):
    """O = softmax(scale * Q K^T) V per head, float64. Returns (out, lse)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = _check_shapes(q, k, v)
    batch, seqlen_q, nheads, d = q.shape
    scale = _np_scale(d, scale)
    out = np.zeros((batch, seqlen_q, nheads, v.shape[-1]))
    lse = np.zeros((batch, nheads, seqlen_q))
    for b in range(batch):
        for h in range(nheads):
            hk = h // group
            p, lse[b, h] = _dense_probs_np(q[b, :, h], k[b, :, hk], causal, scale)
            out[b, :, h] = p @ v[b, :, hk]
    return out, lse


def dense_backward_np(dout, q, k, v, causal=False, scale=None):
    """Gradients of sum(dout * O) with respect to q, k, v, float64. Returns (dq, dk, dv).

    Written from the textbook derivation, not from the tiled algorithm: P recomputed densely,
    dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q.
    Query heads sharing a kv head add their dK, dV.
    """
    dout, q, k, v = (np.asarray(x, dtype=np.float64) for x in (dout, q, k, v))
    group = _check_shapes(q, k, v)
    batch, seqlen_q, nheads, d = q.shape
    scale = _np_scale(d, scale)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(batch):
        for h in range(nheads):
            hk = h // group
            qh, kh, vh, doh = q[b, :, h], k[b, :, hk], v[b, :, hk], dout[b, :, h]
            p, _ = _dense_probs_np(qh, kh, causal, scale)
            dp = doh @ vh.T
            ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))
            dv[b, :, hk] += p.T @ doh
            dk[b, :, hk] += scale * (ds.T @ qh)
            dq[b, :, h] = scale * (ds @ kh)
    return dq, dk, dv


def explicit_attention(q, k, v, scale, causal, dout=None):
    """fp32 attention of (b, s, h, d) torch tensors written out without autograd (for test-only
    kernels registered below the autograd key): (out, lse (b, h, s)), or with dout the
    gradients (dq, dk, dv). GQA sums dK and dV over each kv head's q heads; a row that sees no
    key gets out 0, lse +inf and no gradient."""
    import torch

    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    group = h // hk
    qf = q.float()
    kf, vf = (t.float().repeat_interleave(group, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        visible = (torch.arange(sk, device=q.device)[None, :]
                   <= torch.arange(sq, device=q.device)[:, None] + (sk - sq))
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(visible, torch.exp(s - torch.nan_to_num(lse, neginf=0.0)[..., None]), 0.0)
    if dout is None:
        seen = visible.any(-1)
        return torch.einsum("bhqk,bkhd->bqhd", p, vf), torch.where(seen, lse, float("inf"))
    dof = dout.float()
    dp = torch.einsum("bqhd,bkhd->bhqk", dof, vf)
    ds = p * (dp - (p * dp).sum(-1, keepdim=True))
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kf) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, qf) * scale
    dv = torch.einsum("bhqk,bqhd->bkhd", p, dof)
    dk, dv = (t.reshape(b, sk, hk, group, d).sum(3) for t in (dk, dv))
    return dq, dk, dv


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) inside the block, the previous setting after."""
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev)
