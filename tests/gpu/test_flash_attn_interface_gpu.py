"""flashback's FlashAttention-2-compatible functions on an sm_90 GPU: FA's positional and keyword
call patterns give what flashback.attention / flashback.attention_varlen give for the same
arguments. Both run the same kernels, so outputs, LSE and (deterministic) gradients are compared
bitwise; the correctness of those kernels is tests/gpu/test_attention.py's and test_varlen_gpu.py's.
The packed variants (qkv / kv in one tensor) are compared with the unpacked calls on contiguous
copies of the same q, k, v: outputs and LSE bitwise, the packed tensor's gradient against the
unpacked gradients stacked (bitwise when deterministic)."""
import math

import pytest
import torch

import flashback
from flashback import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                       flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)

pytestmark = pytest.mark.gpu
HEADDIMS = [d for d in (128, 256) if d in flashback.SUPPORTED_HEADDIMS]


def _randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _check_same(out, ref, leaves, ref_leaves, dout, bitwise_grads=True):
    assert torch.equal(out, ref)
    grads = torch.autograd.grad(out, leaves, dout)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout)
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads):
        if bitwise_grads:
            assert torch.equal(a, b), f"{name} differs"
        else:  # dQ summed with atomics: equal up to the order of the adds
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("pattern", ["positional", "keyword", "window", "attn_probs", "defaults",
                                     "strided", "seqlen_q<seqlen_k"])
def test_flash_attn_func_matches_flashback_attention(d, pattern):
    b, sq, sk, h, hk = 2, 1000, 1000, 8, 2
    if pattern == "seqlen_q<seqlen_k":
        sq = 517
    q, k, v, dout = _randn(b, sq, h, d), _randn(b, sk, hk, d), _randn(b, sk, hk, d), _randn(b, sq, h, d)
    scale = 0.5 / math.sqrt(d)
    leaves, ref_leaves = _leaves(q, k, v), _leaves(q, k, v)
    lse = None
    causal, ref_scale = True, scale
    if pattern == "positional":
        out = flash_attn_func(*leaves, 0.0, scale, True, (-1, -1), 0.0, None, True)
    elif pattern in ("keyword", "seqlen_q<seqlen_k"):
        out = flash_attn_func(q=leaves[0], k=leaves[1], v=leaves[2], softmax_scale=scale, causal=True,
                              deterministic=True)
    elif pattern == "window":
        out = flash_attn_func(*leaves, softmax_scale=scale, window_size=(-1, 0), deterministic=True)
    elif pattern == "attn_probs":
        out, lse, probs = flash_attn_func(*leaves, dropout_p=0.0, softmax_scale=scale, causal=True,
                                          deterministic=True, return_attn_probs=True)
        assert probs is None
    elif pattern == "strided":  # FlashAttention copies a q whose last dim is strided; so does flashback
        qs = leaves[0].transpose(-1, -2).contiguous().transpose(-1, -2)
        out = flash_attn_func(qs, leaves[1], leaves[2], softmax_scale=scale, causal=True, deterministic=True)
    else:
        out = flash_attn_func(*leaves)
        causal, ref_scale = False, None
    deterministic = pattern != "defaults"
    ref, ref_lse = flashback.attention(*ref_leaves, causal=causal, softmax_scale=ref_scale,
                                       deterministic=deterministic, return_lse=True)
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == (b, h, sq) and not lse.requires_grad
        assert torch.equal(lse, ref_lse)
    _check_same(out, ref, leaves, ref_leaves, dout, bitwise_grads=deterministic)


@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("pattern", ["positional", "keyword", "window", "attn_probs", "defaults"])
def test_flash_attn_varlen_func_matches_flashback_attention_varlen(d, pattern):
    lengths = [17, 1000, 0, 300]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total, h, hk, mx = sum(lengths), 8, 2, max(lengths)
    q, k, v, dout = _randn(total, h, d), _randn(total, hk, d), _randn(total, hk, d), _randn(total, h, d)
    scale = 0.5 / math.sqrt(d)
    leaves, ref_leaves = _leaves(q, k, v), _leaves(q, k, v)
    lse = None
    causal, ref_scale = True, scale
    if pattern == "positional":
        out = flash_attn_varlen_func(*leaves, cu, cu, mx, mx, 0.0, scale, True, (-1, -1), 0.0, None, True)
    elif pattern == "keyword":
        out = flash_attn_varlen_func(*leaves, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx,
                                     softmax_scale=scale, causal=True, deterministic=True, block_table=None)
    elif pattern == "window":
        out = flash_attn_varlen_func(*leaves, cu, cu, mx, mx, softmax_scale=scale, window_size=(-1, 0),
                                     deterministic=True)
    elif pattern == "attn_probs":
        out, lse, probs = flash_attn_varlen_func(*leaves, cu, cu, mx, mx, softmax_scale=scale, causal=True,
                                                 deterministic=True, return_attn_probs=True)
        assert probs is None
    else:
        out = flash_attn_varlen_func(*leaves, cu, cu, mx, mx)
        causal, ref_scale = False, None
    deterministic = pattern != "defaults"
    ref, ref_lse = flashback.attention_varlen(*ref_leaves, cu, cu, mx, mx, causal=causal, softmax_scale=ref_scale,
                                              deterministic=deterministic, return_lse=True)
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == (h, total)
        assert torch.equal(lse, ref_lse)
    _check_same(out, ref, leaves, ref_leaves, dout, bitwise_grads=deterministic)


def test_unsupported_option_raises_on_the_gpu_too():
    q, k, v = _randn(1, 64, 4, 128), _randn(1, 64, 4, 128), _randn(1, 64, 4, 128)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attn_func(q, k, v, 0.1)
    with pytest.raises(NotImplementedError, match="window_size"):
        flash_attn_func(q, k, v, window_size=(8, 0))


# --- packed variants --------------------------------------------------------------------------

def _unpacked(packed, dim):
    """Contiguous leaf copies of the tensors packed along dim: what a caller of the unpacked
    function would pass."""
    return [t.clone(memory_format=torch.contiguous_format).requires_grad_() for t in packed.detach().unbind(dim)]


def _check_packed(out, ref, lse, ref_lse, packed_leaves, ref_leaves, dout, deterministic):
    """out and lse bitwise equal; packed_leaves' gradients equal to ref_leaves' gradients, the
    packed tensor's against the unpacked ones stacked at its packed dim (given as
    (tensor, dim, count) entries; a plain tensor compares with one ref leaf)."""
    assert torch.equal(out, ref)
    assert lse.dtype == torch.float32 and not lse.requires_grad and torch.equal(lse, ref_lse)
    tensors = [p[0] if isinstance(p, tuple) else p for p in packed_leaves]
    grads = torch.autograd.grad(out, tensors, dout)
    ref_grads = list(torch.autograd.grad(ref, ref_leaves, dout))
    for entry, grad in zip(packed_leaves, grads):
        if isinstance(entry, tuple):
            _, dim, count = entry
            expect = torch.stack(ref_grads[:count], dim=dim)
            del ref_grads[:count]
        else:
            expect = ref_grads.pop(0)
        assert grad.shape == expect.shape
        if deterministic:
            assert torch.equal(grad, expect)
        else:  # dQ summed with atomics: equal up to the order of the adds
            torch.testing.assert_close(grad, expect, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [True, False])
def test_qkvpacked_matches_flash_attn_func(d, causal, deterministic):
    torch.manual_seed(1)
    b, s, h = 2, 1000, 8
    qkv = _randn(b, s, 3, h, d).requires_grad_()
    q, k, v = _unpacked(qkv, 2)
    dout, scale = _randn(b, s, h, d), 0.5 / math.sqrt(d)
    out, lse, probs = flash_attn_qkvpacked_func(qkv, 0.0, scale, causal, deterministic=deterministic,
                                                return_attn_probs=True)
    assert probs is None and out.shape == (b, s, h, d) and lse.shape == (b, h, s)
    ref, ref_lse, _ = flash_attn_func(q, k, v, 0.0, scale, causal, deterministic=deterministic,
                                      return_attn_probs=True)
    _check_packed(out, ref, lse, ref_lse, [(qkv, 2, 3)], [q, k, v], dout, deterministic)


@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [True, False])
def test_kvpacked_gqa_matches_flash_attn_func(d, causal, deterministic):
    torch.manual_seed(2)
    b, sq, sk, h, hk = 2, 517, 1000, 8, 2
    q, kv = _randn(b, sq, h, d).requires_grad_(), _randn(b, sk, 2, hk, d).requires_grad_()
    ref_q = q.detach().clone().requires_grad_()
    k, v = _unpacked(kv, 2)
    dout = _randn(b, sq, h, d)
    out, lse, _ = flash_attn_kvpacked_func(q, kv, causal=causal, deterministic=deterministic, return_attn_probs=True)
    ref, ref_lse, _ = flash_attn_func(ref_q, k, v, causal=causal, deterministic=deterministic,
                                      return_attn_probs=True)
    _check_packed(out, ref, lse, ref_lse, [q, (kv, 2, 2)], [ref_q, k, v], dout, deterministic)


def _offsets(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [True, False])
def test_varlen_qkvpacked_matches_flash_attn_varlen_func(d, causal, deterministic):
    torch.manual_seed(3)
    lengths, h = [17, 1000, 0, 300, 129], 8
    cu, total, mx = _offsets(lengths), sum(lengths), max(lengths)
    qkv = _randn(total, 3, h, d).requires_grad_()
    q, k, v = _unpacked(qkv, 1)
    dout, scale = _randn(total, h, d), 0.5 / math.sqrt(d)
    out, lse, _ = flash_attn_varlen_qkvpacked_func(qkv, cu, mx, 0.0, scale, causal, deterministic=deterministic,
                                                   return_attn_probs=True)
    assert out.shape == (total, h, d) and lse.shape == (h, total)
    ref, ref_lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, 0.0, scale, causal,
                                             deterministic=deterministic, return_attn_probs=True)
    _check_packed(out, ref, lse, ref_lse, [(qkv, 1, 3)], [q, k, v], dout, deterministic)


@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [True, False])
def test_varlen_kvpacked_gqa_matches_flash_attn_varlen_func(d, causal, deterministic):
    torch.manual_seed(4)
    # Uneven lengths, queries shorter and longer than their keys (causal rows that see no key).
    lengths_q, lengths_k, h, hk = [17, 700, 0, 300, 64], [40, 1000, 0, 128, 64], 8, 2
    cu_q, cu_k = _offsets(lengths_q), _offsets(lengths_k)
    q = _randn(sum(lengths_q), h, d).requires_grad_()
    kv = _randn(sum(lengths_k), 2, hk, d).requires_grad_()
    ref_q = q.detach().clone().requires_grad_()
    k, v = _unpacked(kv, 1)
    dout = _randn(sum(lengths_q), h, d)
    mq, mk = max(lengths_q), max(lengths_k)
    out, lse, _ = flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, mq, mk, causal=causal,
                                                  deterministic=deterministic, return_attn_probs=True)
    ref, ref_lse, _ = flash_attn_varlen_func(ref_q, k, v, cu_q, cu_k, mq, mk, causal=causal,
                                             deterministic=deterministic, return_attn_probs=True)
    _check_packed(out, ref, lse, ref_lse, [q, (kv, 1, 2)], [ref_q, k, v], dout, deterministic)


def test_packed_shape_and_option_errors_on_the_gpu_too():
    qkv, q = _randn(1, 64, 3, 4, 128), _randn(1, 64, 4, 128)
    with pytest.raises(ValueError, match="qkv must have shape"):
        flash_attn_qkvpacked_func(qkv[:, :, :2])
    with pytest.raises(ValueError, match="nheads of q"):
        flash_attn_kvpacked_func(q, _randn(1, 64, 2, 3, 128))
    with pytest.raises(NotImplementedError, match="softcap"):
        flash_attn_qkvpacked_func(qkv, softcap=30.0)
    with pytest.raises(NotImplementedError, match="window_size"):
        flash_attn_kvpacked_func(q, qkv[:, :, 1:], window_size=(8, 0))


@pytest.mark.parametrize("d", HEADDIMS)
def test_flash_attention_3_signatures_match_flashback(d):
    """FlashAttention 3's signatures (flashback.flash_attn3_interface): the positional order with
    softmax_scale fourth, (out, lse) under return_attn_probs, its scheduling options accepted;
    dense and varlen, outputs, LSE and deterministic gradients bitwise equal to flashback's."""
    from flashback import flash_attn3_interface as fa3i
    b, s, h, hk = 2, 1000, 8, 2
    q, k, v, dout = _randn(b, s, h, d), _randn(b, s, hk, d), _randn(b, s, hk, d), _randn(b, s, h, d)
    scale = 0.5 / math.sqrt(d)
    leaves, ref_leaves = _leaves(q, k, v), _leaves(q, k, v)
    out, lse = fa3i.flash_attn_func(*leaves, scale, True, num_splits=3, pack_gqa=True, sm_margin=4,
                                    deterministic=True, return_attn_probs=True)
    ref, ref_lse = flashback.attention(*ref_leaves, causal=True, softmax_scale=scale, deterministic=True,
                                       return_lse=True)
    assert torch.equal(lse, ref_lse)
    _check_same(out, ref, leaves, ref_leaves, dout)

    lengths = [300, 1, 699]
    cu = torch.tensor([0, 300, 301, 1000], device="cuda", dtype=torch.int32)
    qp, kp, vp, dp = (t[0] for t in (q, k, v, dout))  # (1000, heads, d): three packed sequences
    leaves, ref_leaves = _leaves(qp, kp, vp), _leaves(qp, kp, vp)
    out = fa3i.flash_attn_varlen_func(*leaves, cu, cu, max(lengths), max(lengths), None, None, scale, True,
                                      deterministic=True)
    ref = flashback.attention_varlen(*ref_leaves, cu, cu, max(lengths), max(lengths), causal=True,
                                     softmax_scale=scale, deterministic=True)
    _check_same(out, ref, leaves, ref_leaves, dp)
