"""flashback's FlashAttention-2-compatible functions (python/flashback/flash_attn_interface.py)
without a GPU: the signatures are flash-attn 2's, FA's positional and keyword call patterns map
onto flashback.attention / attention_varlen as they should (those are replaced by recorders here),
and what flashback does not implement raises NotImplementedError naming the option before
anything runs. tests/gpu/test_flash_attn_interface_gpu.py runs the same patterns on the kernels."""
import inspect

import pytest
import torch

import flashback
from flashback import flash_attn_interface as fai
from flashback import interface, varlen

# flash-attn 2.x (flash_attn/flash_attn_interface.py, 2.6-2.8): names, order and defaults.
FA2_FUNC = [("q", None), ("k", None), ("v", None), ("dropout_p", 0.0), ("softmax_scale", None),
            ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
            ("deterministic", False), ("return_attn_probs", False)]
FA2_VARLEN = ([("q", None), ("k", None), ("v", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
               ("max_seqlen_q", None), ("max_seqlen_k", None)] + FA2_FUNC[3:] + [("block_table", None)])


def _params(fn):
    empty = inspect.Parameter.empty
    return [(p.name, None if p.default is empty else p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_are_flash_attn_2s():
    assert _params(fai.flash_attn_func) == FA2_FUNC
    assert _params(fai.flash_attn_varlen_func) == FA2_VARLEN
    assert flashback.flash_attn_func is fai.flash_attn_func
    assert flashback.flash_attn_varlen_func is fai.flash_attn_varlen_func
    assert flashback.flash_attn_interface is fai


class _Recorder:
    """Stands in for flashback.attention / attention_varlen: records the call, returns (out, lse)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "out", "lse"


@pytest.fixture
def dense(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(interface, "attention", rec)
    return rec


@pytest.fixture
def packed(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(varlen, "attention_varlen", rec)
    return rec


def _qkv(b=2, sq=64, sk=64, h=4, hk=2, d=128):
    return (torch.randn(b, sq, h, d, dtype=torch.bfloat16), torch.randn(b, sk, hk, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16))


def _mapped(rec, causal=False, softmax_scale=None, deterministic=False):
    assert len(rec.calls) == 1
    _, kwargs = rec.calls[0]
    assert kwargs == dict(causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
                          return_lse=True)
    return rec.calls[0][0]


def test_positional_call(dense):
    q, k, v = _qkv()
    assert fai.flash_attn_func(q, k, v, 0.0, 0.125, True) == "out"
    args = _mapped(dense, causal=True, softmax_scale=0.125)
    assert all(a is b for a, b in zip(args, (q, k, v)))


def test_keyword_call_with_attn_probs(dense):
    q, k, v = _qkv()
    res = fai.flash_attn_func(q=q, k=k, v=v, softmax_scale=0.1, causal=False, window_size=(-1, -1), softcap=0.0,
                              alibi_slopes=None, deterministic=True, return_attn_probs=True)
    assert res == ("out", "lse", None)
    _mapped(dense, causal=False, softmax_scale=0.1, deterministic=True)


@pytest.mark.parametrize("window, causal, expect", [
    ((-1, -1), False, False),
    ((-1, -1), True, True),
    ((-1, 0), False, True),          # causal as a window
    ((-1, 7), True, True),           # causal=True sets the right bound to 0, as in FlashAttention
    ((-5, -3), False, False),        # any negative bound is none
    ((63, 0), False, True),          # left >= seqlen_k - 1 reaches every key: no bound
    ((1000, 1000), False, False),
    ((-1, 63), False, False),        # right >= seqlen_q - 1: no bound
    ([-1, 0], False, True),          # a list works as in FlashAttention
], ids=str)
def test_windows_that_are_none_or_causal(dense, window, causal, expect):
    fai.flash_attn_func(*_qkv(sq=64, sk=64), causal=causal, window_size=window)
    _mapped(dense, causal=expect)


def test_last_dim_strided_inputs_are_copied_as_flashattention_does(dense):
    q, k, v = _qkv()
    qs = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, last dim strided
    assert qs.stride(-1) != 1
    fai.flash_attn_func(qs, k, v)
    got = _mapped(dense)[0]
    assert got.stride(-1) == 1 and torch.equal(got, q)


def _packed_inputs(lengths=(5, 0, 40), h=4, hk=2, d=128):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    return (torch.randn(total, h, d, dtype=torch.bfloat16), torch.randn(total, hk, d, dtype=torch.bfloat16),
            torch.randn(total, hk, d, dtype=torch.bfloat16), cu)


def test_varlen_positional_call(packed):
    q, k, v, cu = _packed_inputs()
    assert fai.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, 0.0, 0.2, True) == "out"
    args = _mapped(packed, causal=True, softmax_scale=0.2)
    assert args[:5] == (q, k, v, cu, cu) and args[5:] == (40, 40)


def test_varlen_keyword_call(packed):
    q, k, v, cu = _packed_inputs()
    res = fai.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=torch.tensor(40),
                                     max_seqlen_k=40, window_size=(-1, 0), deterministic=True,
                                     return_attn_probs=True, block_table=None)
    assert res == ("out", "lse", None)
    args = _mapped(packed, causal=True, deterministic=True)
    assert args[5:] == (40, 40) and all(type(a) is int for a in args[5:])


@pytest.mark.parametrize("option, kwargs", [
    ("dropout_p", dict(dropout_p=0.1)),
    ("softcap", dict(softcap=30.0)),
    ("alibi_slopes", dict(alibi_slopes=torch.ones(4))),
    ("window_size", dict(window_size=(16, 0))),
    ("window_size", dict(window_size=(16, 16))),
    ("window_size", dict(window_size=(-1, 3))),
    ("window_size", dict(window_size=(16, -1), causal=True)),
])
def test_what_flashback_does_not_implement_raises_before_anything_runs(monkeypatch, option, kwargs):
    def must_not_run(*args, **kw):
        raise AssertionError("reached flashback.attention")

    monkeypatch.setattr(interface, "attention", must_not_run)
    monkeypatch.setattr(varlen, "attention_varlen", must_not_run)
    with pytest.raises(NotImplementedError, match=option):
        fai.flash_attn_func(*_qkv(), **kwargs)
    q, k, v, cu = _packed_inputs()
    with pytest.raises(NotImplementedError, match=option):
        fai.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, **kwargs)


def test_paged_kv_raises_before_anything_runs(monkeypatch):
    monkeypatch.setattr(varlen, "attention_varlen", lambda *a, **k: pytest.fail("reached attention_varlen"))
    q, k, v, cu = _packed_inputs()
    with pytest.raises(NotImplementedError, match="block_table"):
        fai.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, block_table=torch.zeros(3, 1, dtype=torch.int32))


@pytest.mark.parametrize("window", [(-1,), 5, ("a", 0), None])
def test_malformed_window_is_a_type_error(dense, window):
    with pytest.raises(TypeError, match="window_size"):
        fai.flash_attn_func(*_qkv(), window_size=window)
    assert dense.calls == []


def test_varlen_max_seqlen_must_be_an_integer(packed):
    q, k, v, cu = _packed_inputs()
    with pytest.raises(TypeError, match="max_seqlen"):
        fai.flash_attn_varlen_func(q, k, v, cu, cu, 40.0, 40)
    assert packed.calls == []


def test_flashbacks_own_checks_still_apply():
    """Without stand-ins: the call reaches flashback.attention, whose checks reject CPU tensors
    and unsupported dtypes with its usual errors (nothing is launched)."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="CUDA"):
        fai.flash_attn_func(q, k, v, causal=True)
    with pytest.raises(TypeError, match="dtype"):
        fai.flash_attn_func(q.float(), k.float(), v.float())
    qp, kp, vp, cu = _packed_inputs()
    with pytest.raises(ValueError, match="CUDA"):
        fai.flash_attn_varlen_func(qp, kp, vp, cu, cu, 40, 40)
