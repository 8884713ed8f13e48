"""FlashAttention 3's Python functions (its Hopper module, `flash_attn_interface`) on flashback's
kernels: code written against FlashAttention 3 switches by changing an import.

    from flash_attn_interface import flash_attn_func, flash_attn_varlen_func          # FA3
    from flashback.flash_attn3_interface import flash_attn_func, flash_attn_varlen_func  # flashback

Convention: FlashAttention 3's `hopper/flash_attn_interface.py` (the version with attention_chunk
and sm_margin in its signatures): the same parameters in the same positional order, and the same results: `out`, or with
return_attn_probs=True the pair `(out, softmax_lse)`, softmax_lse fp32, natural log, (batch,
nheads, seqlen_q) or (nheads, total_q) for varlen, without gradient. Layouts as FlashAttention 2
(flash_attn_interface.py in this package, whose checks and errors these functions share); GQA/MQA
by fewer heads in k and v; causal aligned bottom-right.

FlashAttention 3's options that only steer its scheduling are accepted and have no effect here:
num_splits (split-KV for inference), pack_gqa, sm_margin (SMs left to other kernels; flashback's
kernels take the whole GPU). What flashback does not implement raises NotImplementedError naming
the option, before any kernel runs: qv (an extra query-value term), q_descale / k_descale /
v_descale (FP8 inputs), attention_chunk other than 0, softcap other than 0, a window_size other
than none or causal, and, for varlen, seqused_q / seqused_k (sequences shorter than their
cu_seqlens slots).
"""
from __future__ import annotations

from . import flash_attn_interface as _fa2

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]


def _check_fa3_options(qv, q_descale, k_descale, v_descale, attention_chunk, softcap,
                       seqused_q=None, seqused_k=None) -> None:
    if qv is not None:
        raise _fa2._unsupported("qv", type(qv).__name__, "it implements no query-value term")
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is not None:
            raise _fa2._unsupported(name, type(value).__name__, "it implements no FP8 inputs")
    if attention_chunk != 0:
        raise _fa2._unsupported("attention_chunk", attention_chunk, "it implements no chunked attention (use 0)")
    if softcap != 0:
        raise _fa2._unsupported("softcap", softcap, "it implements no softcapping (use 0.0)")
    for name, value in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if value is not None:
            raise _fa2._unsupported(name, type(value).__name__,
                                    "sequences shorter than their cu_seqlens slots are not implemented")


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    """FlashAttention 3's flash_attn_func on flashback: q (batch, seqlen_q, nheads, headdim), k and
    v (batch, seqlen_k, nheads_k, headdim). Returns out, or (out, softmax_lse) when
    return_attn_probs. deterministic: bitwise reproducible gradients (the forward always is)."""
    _check_fa3_options(qv, q_descale, k_descale, v_descale, attention_chunk, softcap)
    out, lse, _ = _fa2.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                       window_size=window_size, deterministic=deterministic,
                                       return_attn_probs=True)
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None,
                           k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                           num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False):
    """FlashAttention 3's flash_attn_varlen_func on flashback: q (total_q, nheads, headdim), k and
    v (total_k, nheads_k, headdim), sequence b in rows cu_seqlens[b] .. cu_seqlens[b+1] - 1 (int32
    offsets on q's device). Returns out, or (out, softmax_lse (nheads, total_q)) when
    return_attn_probs."""
    _check_fa3_options(qv, q_descale, k_descale, v_descale, attention_chunk, softcap, seqused_q, seqused_k)
    out, lse, _ = _fa2.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              softmax_scale=softmax_scale, causal=causal,
                                              window_size=window_size, deterministic=deterministic,
                                              return_attn_probs=True)
    return (out, lse) if return_attn_probs else out
