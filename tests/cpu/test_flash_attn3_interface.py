"""flashback's FlashAttention-3-compatible functions (python/flashback/flash_attn3_interface.py)
without a GPU: the signatures are FlashAttention 3's (hopper/flash_attn_interface.py), calls map
onto flashback.attention / attention_varlen (replaced by recorders) with FA3's results, the
scheduling-only options are accepted, and what flashback does not implement raises
NotImplementedError naming the option before anything runs."""
import pytest
import torch

from flashback import flash_attn3_interface as fa3i
# The recorders standing in for flashback.attention / attention_varlen (fixtures dense, packed),
# the inputs and the check of what reached them: the FlashAttention 2 functions' tests' own.
from test_flash_attn_interface import _mapped, _packed_inputs, _params, _qkv, dense, packed  # noqa: F401

# FlashAttention 3's hopper/flash_attn_interface.py: names, order and defaults.
FA3_OPTIONS = [("softmax_scale", None), ("causal", False), ("qv", None), ("q_descale", None), ("k_descale", None),
               ("v_descale", None), ("window_size", (-1, -1)), ("attention_chunk", 0), ("softcap", 0.0),
               ("num_splits", 1), ("pack_gqa", None), ("deterministic", False), ("sm_margin", 0),
               ("return_attn_probs", False)]
FA3_FUNC = [("q", None), ("k", None), ("v", None)] + FA3_OPTIONS
FA3_VARLEN = ([("q", None), ("k", None), ("v", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
               ("max_seqlen_q", None), ("max_seqlen_k", None), ("seqused_q", None), ("seqused_k", None)]
              + FA3_OPTIONS)


def test_signatures_are_flash_attention_3s():
    assert _params(fa3i.flash_attn_func) == FA3_FUNC
    assert _params(fa3i.flash_attn_varlen_func) == FA3_VARLEN


def test_positional_call_returns_out(dense):
    q, k, v = _qkv()
    assert fa3i.flash_attn_func(q, k, v, 0.125, True) == "out"
    args = _mapped(dense, causal=True, softmax_scale=0.125)
    assert all(a is b for a, b in zip(args, (q, k, v)))


def test_attn_probs_give_out_and_lse(dense):
    q, k, v = _qkv()
    res = fa3i.flash_attn_func(q, k, v, softmax_scale=0.1, deterministic=True, return_attn_probs=True)
    assert res == ("out", "lse")
    _mapped(dense, softmax_scale=0.1, deterministic=True)


def test_scheduling_options_are_accepted(dense):
    q, k, v = _qkv()
    fa3i.flash_attn_func(q, k, v, causal=True, num_splits=4, pack_gqa=True, sm_margin=8)
    _mapped(dense, causal=True)


def test_causal_as_a_window(dense):
    fa3i.flash_attn_func(*_qkv(), window_size=(-1, 0))
    _mapped(dense, causal=True)


@pytest.mark.parametrize("option, value", [
    ("qv", torch.zeros(1)), ("q_descale", torch.ones(1)), ("k_descale", torch.ones(1)),
    ("v_descale", torch.ones(1)), ("attention_chunk", 128), ("softcap", 30.0),
], ids=lambda x: x if isinstance(x, str) else "")
def test_unsupported_options_raise_before_any_call(dense, option, value):
    with pytest.raises(NotImplementedError, match=option):
        fa3i.flash_attn_func(*_qkv(), **{option: value})
    assert dense.calls == []


def test_sliding_window_raises(dense):
    with pytest.raises(NotImplementedError, match="window_size"):
        fa3i.flash_attn_func(*_qkv(), window_size=(8, 0))
    assert dense.calls == []


def test_varlen_positional_call(packed):
    q, k, v, cu = _packed_inputs()
    assert fa3i.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, None, None, 0.2, True) == "out"
    args = _mapped(packed, causal=True, softmax_scale=0.2)
    assert args[:5] == (q, k, v, cu, cu) and args[5:] == (40, 40)


def test_varlen_attn_probs(packed):
    q, k, v, cu = _packed_inputs()
    res = fa3i.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, deterministic=True, return_attn_probs=True)
    assert res == ("out", "lse")
    _mapped(packed, deterministic=True)


@pytest.mark.parametrize("option", ["seqused_q", "seqused_k"])
def test_varlen_seqused_raises(packed, option):
    q, k, v, cu = _packed_inputs()
    with pytest.raises(NotImplementedError, match=option):
        fa3i.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, **{option: torch.tensor([5, 0, 40], dtype=torch.int32)})
    assert packed.calls == []
