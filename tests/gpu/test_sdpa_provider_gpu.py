"""flashback as PyTorch's SDPA flash-attention provider, on an sm_90 GPU: what it serves runs on
flashback's Hopper kernels and meets the correctness bar, forward and backward, under
torch.compile too; what it does not serve falls through to PyTorch's own kernel unchanged."""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

import flashback
from reference import attention_ref, check_close, deterministic_algorithms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not hasattr(torch.nn.attention, "activate_flash_attention_impl"),
                       reason="this PyTorch has no flash-attention provider registry (< 2.10)"),
    pytest.mark.skipif(os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0"),
                       reason="FLASHBACK_FORCE_REFERENCE is set: nothing runs on the Hopper kernels"),
]
FLASH = [torch.nn.attention.SDPBackend.FLASH_ATTENTION]


@pytest.fixture
def provider():
    torch.nn.attention.activate_flash_attention_impl("flashback")
    yield
    torch.nn.attention.restore_flash_attention_impl()


def _inputs(b, h, hk, s, d, dtype=torch.bfloat16):
    """SDPA order (b, h, s, d) over (b, s, h, d) memory, as models produce it."""
    q, k, v, dout = (torch.randn(b, s, n, d, device="cuda", dtype=dtype).transpose(1, 2)
                     for n in (h, hk, hk, h))
    return [t.requires_grad_() for t in (q, k, v)], dout


def _ref(q, k, v, dout, causal, upcast):
    """attention_ref takes (b, s, h, d)."""
    dtype = torch.float32 if upcast else q.dtype
    leaves = [t.detach().transpose(1, 2).to(dtype).requires_grad_() for t in (q, k, v)]
    out, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
    grads = torch.autograd.grad(out, leaves, dout.transpose(1, 2).to(dtype))
    return out.detach().transpose(1, 2), [g.transpose(1, 2) for g in grads]


def _check_bar(q, k, v, dout, causal, grads, out=None):
    """The correctness bar on the gradients (and on `out` when given) against attention_ref in
    fp32 and in the inputs' dtype."""
    out32, g32 = _ref(q, k, v, dout, causal, upcast=True)
    outlp, glp = _ref(q, k, v, dout, causal, upcast=False)
    if out is not None:
        check_close("out", out, out32, outlp)
    for name, ours, r32, rlp in zip(("dq", "dk", "dv"), grads, g32, glp):
        check_close(name, ours, r32, rlp)


def _sdpa(q, k, v, causal, gqa):
    with torch.nn.attention.sdpa_kernel(FLASH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 8, 8, 1000), (1, 8, 2, 4096)], ids=["mha-1000", "gqa-4096"])
def test_sdpa_runs_on_flashback(provider, shape, causal):
    b, h, hk, s = shape
    (q, k, v), dout = _inputs(b, h, hk, s, 256)
    out = _sdpa(q, k, v, causal, gqa=h != hk)
    assert flashback.last_forward_path() == "sm90"
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert flashback.last_backward_path() == "sm90"
    _check_bar(q, k, v, dout, causal, grads, out)


@pytest.mark.parametrize("case", ["hdim128", "fp16"])
def test_other_inputs_fall_through_unchanged(provider, case):
    d, dtype = (128, torch.bfloat16) if case == "hdim128" else (256, torch.float16)
    (q, k, v), dout = _inputs(2, 8, 8, 1000, d, dtype)
    before = (flashback.last_forward_path(), flashback.last_backward_path())
    out = _sdpa(q, k, v, True, gqa=False)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert (flashback.last_forward_path(), flashback.last_backward_path()) == before
    torch.nn.attention.restore_flash_attention_impl()
    try:
        out_pt = _sdpa(q, k, v, True, gqa=False)
        grads_pt = torch.autograd.grad(out_pt, (q, k, v), dout)
    finally:
        torch.nn.attention.activate_flash_attention_impl("flashback")
    assert torch.equal(out, out_pt)
    for a, b in zip(grads, grads_pt):  # PyTorch's own backward sums dQ with atomics
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_torch_compile(provider):
    """The provider under torch.compile (fullgraph), forward and backward: the same output as
    eager, the gradients within the bar, both directions on flashback's kernels."""
    (q, k, v), dout = _inputs(2, 8, 8, 1000, 256)
    f = torch.compile(lambda q, k, v: _sdpa(q, k, v, True, gqa=False), fullgraph=True)
    out = f(q, k, v)
    assert flashback.last_forward_path() == "sm90"
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert flashback.last_backward_path() == "sm90"
    out_eager = _sdpa(q, k, v, True, gqa=False)
    grads_eager = torch.autograd.grad(out_eager, (q, k, v), dout)
    # Bitwise: both ran flashback (the path reports are process-wide, so they alone could be
    # stale); dK and dV are reproducible bit for bit, dQ (atomics) in its last bits only.
    assert torch.equal(out, out_eager)
    assert torch.equal(grads[1], grads_eager[1]) and torch.equal(grads[2], grads_eager[2])
    _check_bar(q, k, v, dout, True, grads)


def test_deterministic_algorithms_run_flashbacks_deterministic_backward(provider):
    (q, k, v), dout = _inputs(1, 8, 2, 3000, 256)
    with deterministic_algorithms():
        out = _sdpa(q, k, v, True, gqa=True)
        grads = [torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) for _ in range(3)]
    assert flashback.last_backward_path() == "sm90"
    for again in grads[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), grads[0], again):
            assert torch.equal(a, b), f"{name} differs between deterministic backward calls"
    _check_bar(q, k, v, dout, True, grads[0])


@pytest.mark.skipif(importlib.util.find_spec("torch.nn.attention.varlen") is None,
                    reason="this PyTorch has no varlen_attn")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_varlen_attn_runs_on_flashback(provider, compiled):
    """torch.nn.attention.varlen.varlen_attn goes through aten::_flash_attention_forward with
    offsets; with the provider active it runs flashback's varlen kernels, eager and under
    torch.compile (fullgraph), with the results of flashback.attention_varlen."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    lengths = [17, 1000, 300]
    cu = torch.tensor([0, 17, 1017, 1317], dtype=torch.int32, device="cuda")
    q, k, v, dout = (torch.randn(1317, 4, 256, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    causal = ({"is_causal": True} if "is_causal" in inspect.signature(varlen_attn).parameters
              else {"window_size": (-1, 0)})  # newer PyTorch: causal as a (-1, 0) window

    def call(q, k, v):
        return varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), **causal)

    out = (torch.compile(call, fullgraph=True) if compiled else call)(*leaves)
    assert flashback.last_forward_path() == "sm90"
    grads = torch.autograd.grad(out, leaves, dout)
    assert flashback.last_backward_path() == "sm90"
    direct = [t.detach().requires_grad_() for t in (q, k, v)]
    ref = flashback.attention_varlen(*direct, cu, cu, max(lengths), max(lengths), causal=True)
    ref_grads = torch.autograd.grad(ref, direct, dout)
    assert torch.equal(out, ref)
    # dK and dV are bitwise reproducible; dQ is summed with atomics (last bits vary).
    assert torch.equal(grads[1], ref_grads[1]) and torch.equal(grads[2], ref_grads[2])
    torch.testing.assert_close(grads[0], ref_grads[0], rtol=1e-2, atol=1e-2)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("step", ["q_full_kv_first_half", "q_second_half_kv_full", "diagonal"])
def test_context_parallel_ring_step_contract(provider, step):
    """The calls PyTorch's context-parallel ring makes per step (load-balanced causal): the
    SDPA flash op on chunks of the local sequence (q twice as long as k/v, or q a strided
    second half), non-causal off the diagonal, then its backward with chunks of out, dout and of
    a merged LSE. Each call must meet the bar on its own inputs and run on flashback."""
    b, h, s, d = 1, 8, 4096, 256
    q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    causal = step == "diagonal"
    if step == "q_full_kv_first_half":
        k, v = k.chunk(2, dim=2)[0], v.chunk(2, dim=2)[0]
    elif step == "q_second_half_kv_full":
        q, dout = q.chunk(2, dim=2)[1], dout.chunk(2, dim=2)[1]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[:2]
    assert flashback.last_forward_path() == "sm90"
    wide = torch.empty(b, h, 2 * q.shape[2], device="cuda")
    lse_chunk = wide.chunk(2, dim=2)[1]
    lse_chunk.copy_(lse)  # a chunk of a larger merged LSE, as the ring hands it over
    grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse_chunk, None, None, q.shape[2], k.shape[2], 0.0, causal,
        torch.zeros(2, dtype=torch.uint64, device="cuda"), torch.zeros((), dtype=torch.uint64, device="cuda"))
    assert flashback.last_backward_path() == "sm90"
    _check_bar(q, k, v, dout, causal, grads, out)
