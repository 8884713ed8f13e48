"""FlashAttention's Python functions on flashback's kernels: code written against FlashAttention 2
switches by changing an import.

    from flash_attn import flash_attn_func, flash_attn_varlen_func   # FlashAttention 2
    from flashback import flash_attn_func, flash_attn_varlen_func    # the same calls on flashback
    # or: from flashback.flash_attn_interface import ...  (as flash_attn.flash_attn_interface)

The packed variants are here too: flash_attn_qkvpacked_func (qkv (batch, seqlen, 3, nheads,
headdim)), flash_attn_kvpacked_func (kv (batch, seqlen_k, 2, nheads_k, headdim)),
flash_attn_varlen_qkvpacked_func (qkv (total, 3, nheads, headdim)) and
flash_attn_varlen_kvpacked_func (kv (total_k, 2, nheads_k, headdim)). They split the packed
tensor into views (no copy: the kernels read the views of a contiguous packed tensor in place)
and call flash_attn_func / flash_attn_varlen_func, so options, results and errors are theirs,
after checking the packed shapes themselves. The gradient reaches the packed tensor through
autograd (assembled from dq, dk, dv by one stack, where flash-attn 2 writes it in place).

Convention: flash-attn 2.x, the `flash_attn` package (signatures as of 2.6-2.8): the same
parameters in the same positional order, and the same results: `out`, or with
return_attn_probs=True the triple `(out, softmax_lse, S_dmask)`. S_dmask is None: flash-attn 2
fills it only when dropout is on, which flashback does not implement. softmax_lse is fp32,
natural log, (batch, nheads, seqlen_q) or (nheads, total_q) for varlen, and carries no gradient.
Layouts as flash-attn: (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim) with
int32 cumulative offsets; GQA/MQA by fewer heads in k and v; causal aligned bottom-right.

FlashAttention 3's Hopper module (`flash_attn_interface`) orders its parameters differently
(softmax_scale fourth, no dropout_p) and returns (out, softmax_lse) under return_attn_probs: its
signatures are in flash_attn3_interface.py.

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

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"]


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


# --- packed variants -------------------------------------------------------------------------

def _shape_text(x) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else f"a {type(x).__name__}"


def _unpack(name: str, x, layout: tuple[str, ...], packed_dim: int):
    """x's views along packed_dim (q, k, v or k, v), after checking x has the layout's dims and
    len(views) at packed_dim. layout names the dims, the packed one by its size ("3" or "2")."""
    count = int(layout[packed_dim])
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape ({', '.join(layout)}), got {_shape_text(x)}")
    if x.dim() != len(layout) or x.shape[packed_dim] != count:
        raise ValueError(f"{name} must have shape ({', '.join(layout)}) with {count} at dim {packed_dim} "
                         f"({'q, k, v' if count == 3 else 'k, v'} packed), got {_shape_text(x)}")
    return x.unbind(packed_dim)


def _check_q_against_kv(q, kv, dense: bool) -> None:
    """q's layout, and the heads and head dim it shares with kv, checked with the packed names
    (flashback.attention would name k)."""
    layout = ("batch", "seqlen_q", "nheads", "headdim") if dense else ("total_q", "nheads", "headdim")
    kv_layout = "(batch, seqlen_k, 2, nheads_k, headdim)" if dense else "(total_k, 2, nheads_k, headdim)"
    if not isinstance(q, Tensor):
        raise TypeError(f"q must be a torch.Tensor of shape ({', '.join(layout)}), got {_shape_text(q)}")
    if q.dim() != len(layout):
        raise ValueError(f"q must have shape ({', '.join(layout)}), got {_shape_text(q)}")
    h, d = q.shape[-2], q.shape[-1]
    hk, dk = kv.shape[-2], kv.shape[-1]
    if dense and q.shape[0] != kv.shape[0]:
        raise ValueError(f"q and kv must have the same batch size, got q {_shape_text(q)} and kv {_shape_text(kv)}")
    if d != dk:
        raise ValueError(f"q and kv must have the same headdim, got {d} (q {_shape_text(q)}) and {dk} "
                         f"(kv {_shape_text(kv)}, {kv_layout})")
    if hk < 1 or h % hk != 0:
        raise ValueError(f"nheads of q ({h}) must be a multiple of nheads_k of kv ({hk}) (GQA/MQA); got q "
                         f"{_shape_text(q)} and kv {_shape_text(kv)}, {kv_layout}")


def _max_seqlen(value) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"max_seqlen must be an int, got {type(value).__name__}") from None


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn 2's flash_attn_qkvpacked_func on flashback: qkv (batch, seqlen, 3, nheads,
    headdim), q, k, v along dim 2 (same heads; GQA is flash_attn_kvpacked_func). Returns out
    (batch, seqlen, nheads, headdim), or (out, softmax_lse, None) when return_attn_probs."""
    _check_options(dropout_p, softcap, alibi_slopes)
    q, k, v = _unpack("qkv", qkv, ("batch", "seqlen", "3", "nheads", "headdim"), 2)
    return flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                           window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                           deterministic=deterministic, return_attn_probs=return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn 2's flash_attn_kvpacked_func on flashback: q (batch, seqlen_q, nheads, headdim),
    kv (batch, seqlen_k, 2, nheads_k, headdim), k and v along dim 2, nheads a multiple of nheads_k.
    Returns out, or (out, softmax_lse, None) when return_attn_probs."""
    _check_options(dropout_p, softcap, alibi_slopes)
    k, v = _unpack("kv", kv, ("batch", "seqlen_k", "2", "nheads_k", "headdim"), 2)
    _check_q_against_kv(q, kv, dense=True)
    return flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                           window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                           deterministic=deterministic, return_attn_probs=return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash-attn 2's flash_attn_varlen_qkvpacked_func on flashback: qkv (total, 3, nheads,
    headdim), q, k, v along dim 1, sequence b in rows cu_seqlens[b] .. cu_seqlens[b+1] - 1 for
    all three. Returns out (total, nheads, headdim), or (out, softmax_lse (nheads, total), None)
    when return_attn_probs."""
    _check_options(dropout_p, softcap, alibi_slopes)
    q, k, v = _unpack("qkv", qkv, ("total", "3", "nheads", "headdim"), 1)
    max_seqlen = _max_seqlen(max_seqlen)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=dropout_p,
                                  softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                  softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic,
                                  return_attn_probs=return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn 2's flash_attn_varlen_kvpacked_func on flashback: q (total_q, nheads, headdim),
    kv (total_k, 2, nheads_k, headdim), k and v along dim 1, nheads a multiple of nheads_k.
    Returns out (total_q, nheads, headdim), or (out, softmax_lse (nheads, total_q), None) when
    return_attn_probs."""
    _check_options(dropout_p, softcap, alibi_slopes)
    k, v = _unpack("kv", kv, ("total_k", "2", "nheads_k", "headdim"), 1)
    _check_q_against_kv(q, kv, dense=False)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                  window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                                  deterministic=deterministic, return_attn_probs=return_attn_probs)
