"""The public API: attention, attention_forward, attention_backward.

Layout as FlashAttention: q (batch, seqlen_q, nheads, headdim), k and v
(batch, seqlen_k, nheads_k, headdim) with nheads divisible by nheads_k (GQA/MQA); bf16; only the
last dim must be contiguous. Causal masking is aligned bottom-right: query i sees key j when
j <= i + seqlen_k - seqlen_q. A query row that sees no key gets out = 0, lse = +inf and zero
gradients. LSE is float32 (batch, nheads, seqlen_q), natural log.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import _checks
from . import ops as _ops  # registers torch.ops.flashback.*

__all__ = ["attention", "attention_forward", "attention_backward"]


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, softmax_scale: float | None = None,
              deterministic: bool = False, return_lse: bool = False):
    """Differentiable softmax(scale * q k^T) v. Returns out, or (out, lse) when return_lse.

    Head dims between 1 and 256 that have no kernel of their own (not 64, 128, 192, 256) run
    zero-padded to the next that has, with the softmax scale of the head dim given.

    deterministic: the gradients are bitwise reproducible run to run (the Hopper backward with
    the dQ adds of each tile in a fixed order: ~0.9x the default speed at head dim 256; the
    reference backward, which has no atomics, where the Hopper path declines the layout). When
    False, dQ is summed with atomics. The returned lse carries no gradient.
    """
    _checks.check_forward_args(q, k, v, softmax_scale=softmax_scale, pads=True)
    scale = _checks.check_scale(softmax_scale, q.shape[-1])
    if _checks.padded_headdim(q.shape[-1]):
        out, lse = _checks.run_padded(attention, q, k, v, scale, causal=causal, deterministic=deterministic)
        return (out, lse) if return_lse else out
    if _ops.eager_ok(q, k, v):
        out, lse = _ops.attention_eager(q, k, v, scale, bool(causal), bool(deterministic))
    else:  # torch.compile, modes, subclasses: the op, which they see and trace
        out, lse = torch.ops.flashback.fwd(q, k, v, scale, bool(causal), bool(deterministic))
    return (out, lse) if return_lse else out


def attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                      softmax_scale: float | None = None, out: Tensor | None = None,
                      lse: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(out, lse) with no autograd. out and lse may be preallocated (written in place); they
    must not share memory with q, k or v."""
    d = _checks.check_forward_args(q, k, v, out, lse, softmax_scale)[-1]
    scale = _checks.check_scale(softmax_scale, d)
    given = {n: t for n, t in (("out", out), ("lse", lse)) if t is not None}
    if _ops.eager_ok(q, k, v, *given.values()):
        _checks.check_no_aliasing(given, dict(q=q, k=k, v=v))
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
        lse = _ops._empty_lse(q) if lse is None else lse
        _ops._run_fwd(q, k, v, out, lse, scale, bool(causal))
        return out, lse
    if out is None and lse is None:
        return torch.ops.flashback.fwd(q, k, v, scale, bool(causal), False)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = _ops._empty_lse(q)
    torch.ops.flashback.fwd_out(q, k, v, out, lse, scale, bool(causal))
    return out, lse


def attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       causal: bool = False, softmax_scale: float | None = None,
                       deterministic: bool = False, dq: Tensor | None = None,
                       dk: Tensor | None = None, dv: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) for the out and lse that attention_forward returned with the same arguments.
    dq, dk and dv may be preallocated (written in place); they must not share memory with the
    inputs or start at the same address as each other (interleaved views of one packed
    gradient tensor are fine)."""
    d = _checks.check_backward_args(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale)[-1]
    scale = _checks.check_scale(softmax_scale, d)
    given = {n: t for n, t in (("dq", dq), ("dk", dk), ("dv", dv)) if t is not None}
    if _ops.eager_ok(dout, q, k, v, out, lse, *given.values()):
        _checks.check_no_aliasing(given, dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse))
        dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) if g is None else g
                      for g, x in ((dq, q), (dk, k), (dv, v)))
        _ops._run_bwd(dout, q, k, v, out, lse, dq, dk, dv, scale, bool(causal), bool(deterministic))
        return dq, dk, dv
    if dq is None and dk is None and dv is None:
        return torch.ops.flashback.bwd(dout, q, k, v, out, lse, scale, bool(causal), bool(deterministic))
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if dk is None else dk
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if dv is None else dv
    torch.ops.flashback.bwd_out(dout, q, k, v, out, lse, dq, dk, dv, scale, bool(causal),
                                bool(deterministic))
    return dq, dk, dv
