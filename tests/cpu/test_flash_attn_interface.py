"""flashback's FlashAttention-2-compatible functions (python/flashback/flash_attn_interface.py)
without a GPU: the signatures are flash-attn 2's, FA's positional and keyword call patterns map
onto flashback.attention / attention_varlen as they should (those are replaced by recorders here),
and what flashback does not implement raises NotImplementedError naming the option before
anything runs. The packed variants: their signatures, the views and options they hand to
flash_attn_func / flash_attn_varlen_func (replaced by recorders), gradients reaching the packed
tensor (through a differentiable CPU stand-in for the kernels) and their shape errors.
tests/gpu/test_flash_attn_interface_gpu.py runs the same patterns on the kernels."""
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


# Options of FlashAttention's functions that flashback does not implement: each must raise
# NotImplementedError naming the option before any attention runs.
_UNSUPPORTED = [
    ("dropout_p", dict(dropout_p=0.1)),
    ("softcap", dict(softcap=30.0)),
    ("alibi_slopes", dict(alibi_slopes=torch.ones(4))),
    ("window_size", dict(window_size=(16, 0))),
    ("window_size", dict(window_size=(16, 16))),
    ("window_size", dict(window_size=(-1, 3))),
    ("window_size", dict(window_size=(16, -1), causal=True)),
]


def _forbid_attention(monkeypatch):
    def must_not_run(*args, **kw):
        raise AssertionError("reached flashback.attention")

    monkeypatch.setattr(interface, "attention", must_not_run)
    monkeypatch.setattr(varlen, "attention_varlen", must_not_run)


@pytest.mark.parametrize("option, kwargs", _UNSUPPORTED)
def test_what_flashback_does_not_implement_raises_before_anything_runs(monkeypatch, option, kwargs):
    _forbid_attention(monkeypatch)
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


# --- packed variants ------------------------------------------------------------------------

# flash-attn 2.x's packed functions: the options of flash_attn_func, no block_table.
FA2_QKVPACKED = [("qkv", None)] + FA2_FUNC[3:]
FA2_KVPACKED = [("q", None), ("kv", None)] + FA2_FUNC[3:]
FA2_VARLEN_QKVPACKED = [("qkv", None), ("cu_seqlens", None), ("max_seqlen", None)] + FA2_FUNC[3:]
FA2_VARLEN_KVPACKED = ([("q", None), ("kv", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
                        ("max_seqlen_q", None), ("max_seqlen_k", None)] + FA2_FUNC[3:])
PACKED_NAMES = ["flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
                "flash_attn_varlen_kvpacked_func"]


def test_packed_signatures_are_flash_attn_2s():
    assert _params(fai.flash_attn_qkvpacked_func) == FA2_QKVPACKED
    assert _params(fai.flash_attn_kvpacked_func) == FA2_KVPACKED
    assert _params(fai.flash_attn_varlen_qkvpacked_func) == FA2_VARLEN_QKVPACKED
    assert _params(fai.flash_attn_varlen_kvpacked_func) == FA2_VARLEN_KVPACKED
    for name in PACKED_NAMES:
        assert getattr(flashback, name) is getattr(fai, name)
        assert name in fai.__all__ and name in flashback.__all__


class _FuncRecorder:
    """Stands in for flash_attn_func / flash_attn_varlen_func: records the call, returns "res"."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "res"

    def only_call(self):
        assert len(self.calls) == 1
        return self.calls[0]


@pytest.fixture
def fa_func(monkeypatch):
    rec = _FuncRecorder()
    monkeypatch.setattr(fai, "flash_attn_func", rec)
    return rec


@pytest.fixture
def fa_varlen(monkeypatch):
    rec = _FuncRecorder()
    monkeypatch.setattr(fai, "flash_attn_varlen_func", rec)
    return rec


OPTIONS = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "deterministic",
           "return_attn_probs"]
DEFAULT_OPTIONS = dict(FA2_FUNC[3:])
# Values a flashback call accepts, none of them a default, in the positional order.
SET_OPTIONS = dict(dropout_p=0.0, softmax_scale=0.1, causal=True, window_size=(-1, 0), softcap=0.0,
                   alibi_slopes=None, deterministic=True, return_attn_probs=True)


def _is_view(view, packed, index, dim):
    """view is packed.select(dim, index): same storage and offset, same strides, no copy."""
    ref = packed.select(dim, index)
    return (view._base is packed and view.data_ptr() == ref.data_ptr() and view.shape == ref.shape
            and view.stride() == ref.stride())


@pytest.mark.parametrize("call", ["defaults", "positional", "keyword"])
def test_qkvpacked_passes_views_and_options(fa_func, call):
    qkv = torch.randn(2, 64, 3, 4, 128, dtype=torch.bfloat16)
    if call == "defaults":
        assert fai.flash_attn_qkvpacked_func(qkv) == "res"
        options = DEFAULT_OPTIONS
    elif call == "positional":
        assert fai.flash_attn_qkvpacked_func(qkv, *SET_OPTIONS.values()) == "res"
        options = SET_OPTIONS
    else:
        assert fai.flash_attn_qkvpacked_func(qkv=qkv, **SET_OPTIONS) == "res"
        options = SET_OPTIONS
    args, kwargs = fa_func.only_call()
    assert len(args) == 3 and all(_is_view(a, qkv, i, 2) for i, a in enumerate(args))
    assert kwargs == options


@pytest.mark.parametrize("call", ["defaults", "positional", "keyword"])
def test_kvpacked_passes_views_and_options(fa_func, call):
    q, kv = torch.randn(2, 40, 6, 128, dtype=torch.bfloat16), torch.randn(2, 64, 2, 3, 128, dtype=torch.bfloat16)
    if call == "defaults":
        fai.flash_attn_kvpacked_func(q, kv)
        options = DEFAULT_OPTIONS
    elif call == "positional":
        fai.flash_attn_kvpacked_func(q, kv, *SET_OPTIONS.values())
        options = SET_OPTIONS
    else:
        fai.flash_attn_kvpacked_func(kv=kv, q=q, **SET_OPTIONS)
        options = SET_OPTIONS
    args, kwargs = fa_func.only_call()
    assert len(args) == 3 and args[0] is q and _is_view(args[1], kv, 0, 2) and _is_view(args[2], kv, 1, 2)
    assert kwargs == options


@pytest.mark.parametrize("call", ["defaults", "positional", "keyword"])
def test_varlen_qkvpacked_passes_views_offsets_and_options(fa_varlen, call):
    cu = torch.tensor([0, 5, 5, 45], dtype=torch.int32)
    qkv = torch.randn(45, 3, 4, 128, dtype=torch.bfloat16)
    if call == "defaults":
        fai.flash_attn_varlen_qkvpacked_func(qkv, cu, 40)
        options = DEFAULT_OPTIONS
    elif call == "positional":
        fai.flash_attn_varlen_qkvpacked_func(qkv, cu, torch.tensor(40), *SET_OPTIONS.values())
        options = SET_OPTIONS
    else:
        fai.flash_attn_varlen_qkvpacked_func(qkv=qkv, cu_seqlens=cu, max_seqlen=40, **SET_OPTIONS)
        options = SET_OPTIONS
    args, kwargs = fa_varlen.only_call()
    assert len(args) == 7 and all(_is_view(a, qkv, i, 1) for i, a in enumerate(args[:3]))
    assert args[3] is cu and args[4] is cu and args[5:] == (40, 40) and all(type(a) is int for a in args[5:])
    assert kwargs == options


@pytest.mark.parametrize("call", ["defaults", "positional", "keyword"])
def test_varlen_kvpacked_passes_views_offsets_and_options(fa_varlen, call):
    cu_q, cu_k = torch.tensor([0, 3, 10], dtype=torch.int32), torch.tensor([0, 20, 21], dtype=torch.int32)
    q, kv = torch.randn(10, 8, 64, dtype=torch.bfloat16), torch.randn(21, 2, 1, 64, dtype=torch.bfloat16)
    if call == "defaults":
        fai.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 7, 20)
        options = DEFAULT_OPTIONS
    elif call == "positional":
        fai.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 7, 20, *SET_OPTIONS.values())
        options = SET_OPTIONS
    else:
        fai.flash_attn_varlen_kvpacked_func(q=q, kv=kv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7,
                                            max_seqlen_k=20, **SET_OPTIONS)
        options = SET_OPTIONS
    args, kwargs = fa_varlen.only_call()
    assert args[0] is q and _is_view(args[1], kv, 0, 1) and _is_view(args[2], kv, 1, 1)
    assert args[3] is cu_q and args[4] is cu_k and args[5:] == (7, 20)
    assert kwargs == options


def _reference_attention(q, k, v, causal=False, softmax_scale=None, deterministic=False, return_lse=False):
    """A differentiable stand-in for flashback.attention on the CPU (tests/reference.py)."""
    from reference import attention_ref
    out, lse = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale)
    return (out, lse) if return_lse else out


def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, softmax_scale=None, deterministic=False,
                      return_lse=False):
    """The same for flashback.attention_varlen: one dense reference call per sequence."""
    outs, lses = [], []
    for b in range(cu_q.numel() - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        out, lse = _reference_attention(q[None, qs], k[None, ks], v[None, ks], causal, softmax_scale,
                                        return_lse=True)
        outs.append(out[0])
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, dim=-1)
    return (out, lse) if return_lse else out


@pytest.fixture
def reference_kernels(monkeypatch):
    monkeypatch.setattr(interface, "attention", _reference_attention)
    monkeypatch.setattr(varlen, "attention_varlen", _reference_varlen)


def _grads(out, dout, *leaves):
    return torch.autograd.grad(out, leaves, dout)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_gradients_reach_the_packed_tensor(reference_kernels, causal):
    """With a differentiable CPU stand-in for the kernels, each packed call gives the unpacked
    call's output and LSE, and the packed tensor's gradient is the unpacked q, k, v gradients
    stacked where they came from."""
    torch.manual_seed(0)
    f64 = dict(dtype=torch.float64)
    # dense qkv-packed
    qkv = torch.randn(2, 9, 3, 4, 64, **f64, requires_grad=True)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    dout = torch.randn(2, 9, 4, 64, **f64)
    out, lse, _ = fai.flash_attn_qkvpacked_func(qkv, causal=causal, return_attn_probs=True)
    ref, ref_lse, _ = fai.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    (dqkv,), ref_grads = _grads(out, dout, qkv), _grads(ref, dout, q, k, v)
    assert torch.equal(dqkv, torch.stack(ref_grads, dim=2))
    # dense kv-packed, GQA, seqlen_q < seqlen_k
    q = torch.randn(2, 5, 6, 64, **f64, requires_grad=True)
    kv = torch.randn(2, 11, 2, 2, 64, **f64, requires_grad=True)
    k, v = (kv.detach()[:, :, i].clone().requires_grad_() for i in range(2))
    dout = torch.randn(2, 5, 6, 64, **f64)
    out = fai.flash_attn_kvpacked_func(q, kv, 0.0, 0.3, causal)
    ref = fai.flash_attn_func(q, k, v, 0.0, 0.3, causal)
    assert torch.equal(out, ref)
    dq, dkv = _grads(out, dout, q, kv)
    ref_dq, ref_dk, ref_dv = _grads(ref, dout, q, k, v)
    assert torch.equal(dq, ref_dq) and torch.equal(dkv, torch.stack((ref_dk, ref_dv), dim=2))
    # varlen qkv-packed, uneven lengths with an empty one
    cu = torch.tensor([0, 3, 3, 13, 14], dtype=torch.int32)
    qkv = torch.randn(14, 3, 4, 64, **f64, requires_grad=True)
    q, k, v = (qkv.detach()[:, i].clone().requires_grad_() for i in range(3))
    dout = torch.randn(14, 4, 64, **f64)
    out, lse, _ = fai.flash_attn_varlen_qkvpacked_func(qkv, cu, 10, causal=causal, return_attn_probs=True)
    ref, ref_lse, _ = fai.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10, causal=causal, return_attn_probs=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    (dqkv,), ref_grads = _grads(out, dout, qkv), _grads(ref, dout, q, k, v)
    assert torch.equal(dqkv, torch.stack(ref_grads, dim=1))
    # varlen kv-packed, GQA, different query and key lengths
    cu_q, cu_k = torch.tensor([0, 2, 9, 10], dtype=torch.int32), torch.tensor([0, 6, 10, 22], dtype=torch.int32)
    q = torch.randn(10, 4, 64, **f64, requires_grad=True)
    kv = torch.randn(22, 2, 1, 64, **f64, requires_grad=True)
    k, v = (kv.detach()[:, i].clone().requires_grad_() for i in range(2))
    dout = torch.randn(10, 4, 64, **f64)
    out = fai.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 7, 12, causal=causal)
    ref = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 12, causal=causal)
    assert torch.equal(out, ref)
    dq, dkv = _grads(out, dout, q, kv)
    ref_dq, ref_dk, ref_dv = _grads(ref, dout, q, k, v)
    assert torch.equal(dq, ref_dq) and torch.equal(dkv, torch.stack((ref_dk, ref_dv), dim=1))
    assert dkv.abs().sum() > 0 and dq.abs().sum() > 0


def _bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


_CU = torch.tensor([0, 5, 45], dtype=torch.int32)


WRONG_SHAPES = [  # (id, call, what the ValueError says)
    ("qkv missing the 3", lambda: fai.flash_attn_qkvpacked_func(_bf16(2, 64, 4, 128)),
     r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\).*got shape \(2, 64, 4, 128\)"),
    ("qkv 3 at the wrong dim", lambda: fai.flash_attn_qkvpacked_func(_bf16(2, 64, 4, 3, 128)),
     r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\) with 3 at dim 2"),
    ("qkv with 2 packed", lambda: fai.flash_attn_qkvpacked_func(_bf16(2, 64, 2, 4, 128)),
     r"with 3 at dim 2 \(q, k, v packed\), got shape \(2, 64, 2, 4, 128\)"),
    ("kv missing the 2", lambda: fai.flash_attn_kvpacked_func(_bf16(2, 64, 4, 128), _bf16(2, 64, 4, 128)),
     r"kv must have shape \(batch, seqlen_k, 2, nheads_k, headdim\) with 2 at dim 2"),
    ("kv with 3 packed", lambda: fai.flash_attn_kvpacked_func(_bf16(2, 64, 4, 128), _bf16(2, 64, 3, 4, 128)),
     r"kv must have shape .* \(k, v packed\), got shape \(2, 64, 3, 4, 128\)"),
    ("kv heads do not divide", lambda: fai.flash_attn_kvpacked_func(_bf16(2, 64, 4, 128), _bf16(2, 64, 2, 3, 128)),
     r"nheads of q \(4\) must be a multiple of nheads_k of kv \(3\)"),
    ("kv more heads than q", lambda: fai.flash_attn_kvpacked_func(_bf16(2, 64, 2, 128), _bf16(2, 64, 2, 4, 128)),
     r"nheads of q \(2\) must be a multiple of nheads_k of kv \(4\)"),
    ("kv headdim", lambda: fai.flash_attn_kvpacked_func(_bf16(2, 64, 4, 128), _bf16(2, 64, 2, 4, 64)),
     r"q and kv must have the same headdim, got 128"),
    ("kv batch", lambda: fai.flash_attn_kvpacked_func(_bf16(2, 64, 4, 128), _bf16(3, 64, 2, 4, 128)),
     r"q and kv must have the same batch size"),
    ("kvpacked q not 4-D", lambda: fai.flash_attn_kvpacked_func(_bf16(64, 4, 128), _bf16(2, 64, 2, 4, 128)),
     r"q must have shape \(batch, seqlen_q, nheads, headdim\), got shape \(64, 4, 128\)"),
    ("varlen qkv dense layout", lambda: fai.flash_attn_varlen_qkvpacked_func(_bf16(1, 45, 3, 4, 128), _CU, 40),
     r"qkv must have shape \(total, 3, nheads, headdim\) with 3 at dim 1"),
    ("varlen qkv missing the 3", lambda: fai.flash_attn_varlen_qkvpacked_func(_bf16(45, 4, 128), _CU, 40),
     r"qkv must have shape \(total, 3, nheads, headdim\).*got shape \(45, 4, 128\)"),
    ("varlen kv missing the 2", lambda: fai.flash_attn_varlen_kvpacked_func(
        _bf16(45, 4, 128), _bf16(45, 4, 128), _CU, _CU, 40, 40),
     r"kv must have shape \(total_k, 2, nheads_k, headdim\) with 2 at dim 1"),
    ("varlen kv heads", lambda: fai.flash_attn_varlen_kvpacked_func(
        _bf16(45, 4, 128), _bf16(45, 2, 8, 128), _CU, _CU, 40, 40),
     r"nheads of q \(4\) must be a multiple of nheads_k of kv \(8\)"),
    ("varlen kv headdim", lambda: fai.flash_attn_varlen_kvpacked_func(
        _bf16(45, 4, 128), _bf16(45, 2, 2, 256), _CU, _CU, 40, 40),
     r"q and kv must have the same headdim, got 128 .* and 256"),
    ("varlen kvpacked q dense", lambda: fai.flash_attn_varlen_kvpacked_func(
        _bf16(1, 45, 4, 128), _bf16(45, 2, 2, 128), _CU, _CU, 40, 40),
     r"q must have shape \(total_q, nheads, headdim\)"),
]


@pytest.mark.parametrize("call, match", [pytest.param(call, match, id=name) for name, call, match in WRONG_SHAPES])
def test_wrong_packed_shapes_raise_before_anything_runs(fa_func, fa_varlen, call, match):
    with pytest.raises(ValueError, match=match):
        call()
    assert fa_func.calls == [] and fa_varlen.calls == []


def test_packed_inputs_that_are_not_tensors_are_type_errors(fa_func, fa_varlen):
    with pytest.raises(TypeError, match="qkv must be a torch.Tensor"):
        fai.flash_attn_qkvpacked_func([[1.0]])
    with pytest.raises(TypeError, match="kv must be a torch.Tensor"):
        fai.flash_attn_kvpacked_func(_bf16(2, 64, 4, 128), None)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        fai.flash_attn_varlen_kvpacked_func(None, _bf16(45, 2, 2, 128), _CU, _CU, 40, 40)
    with pytest.raises(TypeError, match="max_seqlen must be an int"):
        fai.flash_attn_varlen_qkvpacked_func(_bf16(45, 3, 4, 128), _CU, 40.0)
    assert fa_func.calls == [] and fa_varlen.calls == []


def _packed_calls(kwargs):
    qkv, q, kv = _bf16(2, 64, 3, 4, 128), _bf16(2, 64, 4, 128), _bf16(2, 64, 2, 2, 128)
    vqkv, vq, vkv = _bf16(45, 3, 4, 128), _bf16(45, 4, 128), _bf16(45, 2, 2, 128)
    return [lambda: fai.flash_attn_qkvpacked_func(qkv, **kwargs),
            lambda: fai.flash_attn_kvpacked_func(q, kv, **kwargs),
            lambda: fai.flash_attn_varlen_qkvpacked_func(vqkv, _CU, 40, **kwargs),
            lambda: fai.flash_attn_varlen_kvpacked_func(vq, vkv, _CU, _CU, 40, 40, **kwargs)]


@pytest.mark.parametrize("option, kwargs", _UNSUPPORTED)
def test_packed_unsupported_options_raise_before_anything_runs(monkeypatch, option, kwargs):
    _forbid_attention(monkeypatch)
    for call in _packed_calls(kwargs):
        with pytest.raises(NotImplementedError, match=option):
            call()


def test_packed_calls_reach_flashbacks_own_checks():
    """Without stand-ins: the views reach flashback.attention / attention_varlen, whose checks
    reject CPU tensors as for the unpacked calls (nothing is launched)."""
    for call in _packed_calls({}):
        with pytest.raises(ValueError, match="CUDA"):
            call()
