"""FlashAttention's Python functions on flashback's kernels: code written against FlashAttention 2
switches by changing an import.

    from flash_attn import flash_attn_func, flash_attn_varlen_func   # FlashAttention 2
    from flashback import flash_attn_func, flash_attn_varlen_func    # the same calls on flashback
    # or: from flashback.flash_attn_interface import ...  (as flash_attn.flash_attn_interface)

Convention: flash-attn 2.x, the `flash_attn` package (signatures as of 2.6-2.8): the same
parameters in the same positional order, and the same results: `out`, or with
return_attn_probs=True the triple `(out, softmax_lse, S_dmask)`. S_dmask is None: flash-attn 2
fills it only when dropout is on, which flashback does not implement. softmax_lse is fp32,
natural log, (batch, nheads, seqlen_q) or (nheads, total_q) for varlen, and carries no gradient.
Layouts as flash-attn: (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim) with
int32 cumulative offsets; GQA/MQA by fewer heads in k and v; causal aligned bottom-right.

FlashAttention 3's Hopper module (`flash_attn_interface`) orders its parameters differently
(softmax_scale fourth, no dropout_p) and returns (out, softmax_lse) under return_attn_probs: code
written for it runs here when it passes options by keyword and takes `result[:2]`.

What flashback does not implement raises NotImplementedError naming the option, before any
kernel runs: dropout_p other than 0, softcap other than 0, alibi_slopes, block_table (a paged KV
cache), a window_size other than none or causal. Everything else is flashback.attention /
flashback.attention_varlen, whose own checks (dtype, head dim, GPU) apply.
"""
from __future__ import annotations

import operator

from torch import Tensor

from . import interface as _interface
from . import varlen as _varlen

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]


def _unsupported(option: str, value, why: str) -> NotImplementedError:
    return NotImplementedError(f"{option}={value!r} is not supported by flashback: {why}")


def _check_options(dropout_p, softcap, alibi_slopes, block_table=None) -> None:
    if dropout_p != 0:
        raise _unsupported("dropout_p", dropout_p, "it implements no dropout (use 0.0)")
    if softcap != 0:
        raise _unsupported("softcap", softcap, "it implements no softcapping (use 0.0)")
    if alibi_slopes is not None:
        raise _unsupported("alibi_slopes", type(alibi_slopes).__name__, "it implements no ALiBi bias")
    if block_table is not None:
        raise _unsupported("block_table", type(block_table).__name__, "it implements no paged KV cache")


def _window_is_causal(window_size, causal: bool, max_q: int, max_k: int) -> bool:
    """FlashAttention's window: query i sees key j when
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right, a negative side
    unbounded, and causal=True sets right to 0. flashback has no bound (False) and right = 0
    with no left bound (True, causal). A bound no sequence can reach is no bound (left >=
    seqlen_k - 1, right >= seqlen_q - 1; the longest sequences for varlen), as in FlashAttention,
    which also drops bounds past the sequence."""
    try:
        left, right = window_size
        left, right = operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}") from None
    if causal:
        right = 0
    if not (left < 0 or left >= max_k - 1):
        raise _unsupported("window_size", tuple(window_size), "it implements no sliding window (only "
                           "(-1, -1), and (-1, 0) or causal=True)")
    if right == 0:
        return True
    if right < 0 or right >= max_q - 1:
        return False
    raise _unsupported("window_size", tuple(window_size), "a right bound other than 0 (causal) or none "
                       "is a sliding window, which it does not implement")


def _last_dim_contiguous(x):
    # FlashAttention takes any strides (it copies a tensor whose last dim is strided); flashback's
    # kernels need the last dim contiguous, so such inputs are copied here the same way.
    return x.contiguous() if isinstance(x, Tensor) and x.dim() > 0 and x.stride(-1) != 1 else x


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn 2's flash_attn_func on flashback: q (batch, seqlen_q, nheads, headdim), k and v
    (batch, seqlen_k, nheads_k, headdim). Returns out, or (out, softmax_lse, None) when
    return_attn_probs. deterministic: bitwise reproducible gradients (the forward always is)."""
    _check_options(dropout_p, softcap, alibi_slopes)
    seqlens = [t.shape[1] if isinstance(t, Tensor) and t.dim() == 4 else 0 for t in (q, k)]
    causal = _window_is_causal(window_size, bool(causal), *seqlens)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    out, lse = _interface.attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                    deterministic=bool(deterministic), return_lse=True)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn 2's flash_attn_varlen_func on flashback: q (total_q, nheads, headdim), k and v
    (total_k, nheads_k, headdim), sequence b in rows cu_seqlens[b] .. cu_seqlens[b+1] - 1 (int32
    offsets on q's device). Returns out, or (out, softmax_lse (nheads, total_q), None) when
    return_attn_probs."""
    _check_options(dropout_p, softcap, alibi_slopes, block_table)
    try:
        # A 0-d tensor or NumPy integer works in FlashAttention (its binding calls __index__).
        max_seqlen_q, max_seqlen_k = operator.index(max_seqlen_q), operator.index(max_seqlen_k)
    except TypeError:
        raise TypeError(f"max_seqlen_q and max_seqlen_k must be ints, got {type(max_seqlen_q).__name__} "
                        f"and {type(max_seqlen_k).__name__}") from None
    causal = _window_is_causal(window_size, bool(causal), max_seqlen_q, max_seqlen_k)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    out, lse = _varlen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        causal=causal, softmax_scale=softmax_scale,
                                        deterministic=bool(deterministic), return_lse=True)
    return (out, lse, None) if return_attn_probs else out
