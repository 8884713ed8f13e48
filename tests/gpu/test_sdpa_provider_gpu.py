"""flashback as PyTorch's SDPA flash-attention provider, on an sm_90 GPU: what it serves runs on
flashback's Hopper kernels and meets the correctness bar, forward and backward, under
torch.compile too; what it does not serve falls through to PyTorch's own kernel unchanged. Plain
SDPA calls, with no backend named, reach flashback once the provider is active (kernels checked
by name in the profiler), and after restore run exactly what they ran before."""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

import flashback
from profiling import flashback_kernels, kernels, pytorch_attention_kernels
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
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128, 192, 256], ids=lambda d: f"d{d}")
def test_sdpa_runs_on_flashback(provider, d, dtype, shape, causal):
    """Every member of the Hopper family (head dim x dtype) through SDPA's flash op."""
    if not _hopper_serves(d, dtype):
        pytest.skip(f"this build has no Hopper kernel for head dim {d} in {dtype}")
    b, h, hk, s = shape
    (q, k, v), dout = _inputs(b, h, hk, s, d, dtype)
    out = _sdpa(q, k, v, causal, gqa=h != hk)
    assert flashback.last_forward_path() == "sm90"
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert flashback.last_backward_path() == "sm90"
    _check_bar(q, k, v, dout, causal, grads, out)


def _unsupported_headdim():
    """A head dim PyTorch's flash kernel takes (a multiple of 8 up to 256) and flashback does not."""
    return next(d for d in (96, 80, 48, 32, 160, 224) if d not in flashback.SUPPORTED_HEADDIMS)


@pytest.mark.parametrize("case", ["headdim", "fp16"])
def test_other_inputs_fall_through_unchanged(provider, case):
    if case == "fp16" and torch.float16 in flashback._checks.SUPPORTED_DTYPES:
        pytest.skip("flashback serves fp16")
    d, dtype = (_unsupported_headdim(), torch.bfloat16) if case == "headdim" else (256, torch.float16)
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


# --- plain SDPA calls: no backend named ------------------------------------------------------

def _hopper_serves(d, dtype):
    """Whether this build runs (d, dtype) on its Hopper kernels (else on the reference ones)."""
    from flashback import _lib

    lib = _lib.load()
    if hasattr(lib, "flashback_sm90_supports") and hasattr(_lib, "dtype_code"):
        return bool(lib.flashback_sm90_supports(d, _lib.dtype_code(dtype)))
    return d == 256 and dtype == torch.bfloat16


def _sdp_state():
    """PyTorch's process-wide SDPA choice: the priority order and every backend's enable flag."""
    flags = {name: getattr(torch._C, f"_get_{name}_sdp_enabled")()
             for name in ("cudnn", "flash", "mem_efficient", "math", "overrideable")
             if hasattr(torch._C, f"_get_{name}_sdp_enabled")}
    return list(torch._C._get_sdp_priority_order()), flags


@pytest.mark.parametrize("d, hk", [(128, 8), (256, 8), (256, 2)], ids=["d128", "d256", "d256-gqa"])
def test_plain_sdpa_call_runs_on_flashback_and_restore_brings_pytorch_back(d, hk):
    """F.scaled_dot_product_attention(q, k, v, is_causal=True) outside any sdpa_kernel(): before
    activation PyTorch's kernels (cuDNN on an H200), while active flashback's for the forward and
    the backward (names with sm90 where the build has Hopper kernels for it) within the bar, after
    restore exactly the kernels, priority order and enable flags of before."""
    if d not in flashback.SUPPORTED_HEADDIMS:
        pytest.skip(f"this flashback does not serve head dim {d}")
    (q, k, v), dout = _inputs(2, 8, hk, 4096, d)
    gqa = {"enable_gqa": True} if hk != 8 else {}

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        torch.autograd.grad(out, (q, k, v), dout)

    step()  # PyTorch settles its priority order and builds its plans on the first call
    state = _sdp_state()
    before = kernels(step)
    assert pytorch_attention_kernels(before) and not flashback_kernels(before), sorted(before)

    torch.nn.attention.activate_flash_attention_impl("flashback")
    try:
        flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
        assert _sdp_state() == ([flash] + [b for b in state[0] if b != flash], state[1])
        res = {}
        fwd = kernels(lambda: res.setdefault("out", F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)))
        bwd = kernels(lambda: res.setdefault("grads", torch.autograd.grad(res["out"], (q, k, v), dout)))
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    for name, ran in (("forward", fwd), ("backward", bwd)):
        assert flashback_kernels(ran), f"{name} ran no flashback kernel: {sorted(ran)}"
        assert not pytorch_attention_kernels(ran), f"{name} ran PyTorch's: {sorted(pytorch_attention_kernels(ran))}"
        if _hopper_serves(d, q.dtype):
            assert any("sm90" in n for n in flashback_kernels(ran)), sorted(flashback_kernels(ran))
    _check_bar(q, k, v, dout, True, res["grads"], res["out"])

    assert _sdp_state() == state
    step()
    after = kernels(step)
    assert after == before, f"after restore: {sorted(after ^ before)} differ"


@pytest.mark.parametrize("case", ["fp32", "headdim"])
def test_plain_sdpa_calls_flashback_declines(case):
    """What flashback does not serve, with no backend named. A call PyTorch's flash backend
    cannot take (fp32) runs the very kernels it ran before; one flash takes and flashback
    declines (a head dim flashback lacks) runs PyTorch's kernels (its flash kernel while the
    provider is active: flash is first in the order), never flashback's. After restore both run
    what they ran before."""
    d, dtype = (64, torch.float32) if case == "fp32" else (_unsupported_headdim(), torch.bfloat16)
    (q, k, v), dout = _inputs(2, 8, 8, 1024, d, dtype)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), dout)

    step()
    before = kernels(step)
    torch.nn.attention.activate_flash_attention_impl("flashback")
    try:
        step()
        active = kernels(step)
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    assert not flashback_kernels(active), sorted(flashback_kernels(active))
    assert pytorch_attention_kernels(active), sorted(active)
    if case == "fp32":
        assert active == before, f"while active: {sorted(active ^ before)} differ"
    step()
    assert kernels(step) == before
