"""The SDPA provider (python/flashback/sdpa.py) without a GPU: registration, activation through
torch.nn.attention, what it serves and what falls through, the op contract (outputs, autograd),
and removal. The override is installed at the CPU dispatch key over a stand-in for PyTorch's own
flash kernel, and flashback's kernels are replaced by an fp32 reference; the real CUDA path is
tested in tests/gpu/test_sdpa_provider_gpu.py."""
import math

import pytest
import torch

import flashback
from flashback import sdpa
from reference import causal_mask, deterministic_algorithms

FWD = torch.ops.aten._scaled_dot_product_flash_attention
needs_registry = pytest.mark.skipif(not hasattr(torch.nn.attention, "register_flash_attention_impl"),
                                    reason="this PyTorch has no flash-attention provider registry (< 2.10)")
needs_get_kernel = pytest.mark.skipif(not hasattr(torch.library, "get_kernel"),
                                      reason="this PyTorch has no torch.library.get_kernel (< 2.9)")


def _scores(q, k, v, scale, causal):
    """fp32 (scaled, masked scores, k and v with each kv head repeated for its q heads); tensors
    (batch, heads, seqlen, dim), k/v heads may divide q heads; causal bottom-right."""
    g = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    s = q.float() @ kf.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~torch.from_numpy(causal_mask(*s.shape[-2:])), float("-inf"))
    return s, kf, vf


def _reference(q, k, v, scale, causal):
    """(out, lse) in fp32."""
    s, _, vf = _scores(q, k, v, scale, causal)
    return torch.softmax(s, -1) @ vf, torch.logsumexp(s, -1)


def _reference_grads(q, k, v, dout, scale, causal):
    """(dq, dk, dv) in fp32 by the explicit formulas (the stand-ins run below autograd, where
    nothing is recorded): dS = P * (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q,
    dV = P^T dO; GQA sums dK and dV over each kv head's q heads."""
    hk, g = k.shape[1], q.shape[1] // k.shape[1]
    s, kf, vf = _scores(q, k, v, scale, causal)
    qf, dof = q.float(), dout.float()
    p = torch.softmax(s, -1)
    o = p @ vf
    dp = dof @ vf.transpose(-1, -2)
    ds = p * (dp - (dof * o).sum(-1, keepdim=True))
    dq = ds @ kf * scale
    dk = (ds.transpose(-1, -2) @ qf * scale).unflatten(1, (hk, g)).sum(2)
    dv = (p.transpose(-1, -2) @ dof).unflatten(1, (hk, g)).sum(2)
    return dq, dk, dv


class _PyTorchStandIn:
    """Plays PyTorch's own CPU kernel of the two flash ops (there is none on CPU)."""

    def __init__(self):
        self.calls = 0
        self.lib = torch.library.Library("aten", "IMPL", "CPU")
        self.lib.impl("_scaled_dot_product_flash_attention", self.forward, "CPU")
        self.lib.impl("_scaled_dot_product_flash_attention_backward", self.backward, "CPU")
        self.lib.impl("_flash_attention_forward", self.flash_forward, "CPU")
        self.lib.impl("_flash_attention_backward", self.flash_backward, "CPU")

    def forward(self, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        self.calls += 1
        scale = scale if scale is not None else q.shape[-1] ** -0.5
        out, lse = _reference(q, k, v, scale, is_causal)
        z = torch.zeros((2,), dtype=torch.uint64)
        return (out.to(q.dtype), lse, None, None, q.shape[2], k.shape[2], z, torch.zeros((), dtype=torch.uint64),
                torch.empty(0, dtype=q.dtype))

    def backward(self, dout, q, k, v, out, lse, cq, ck, mq, mk, dropout_p, is_causal, seed, offset, *, scale=None):
        self.calls += 1
        scale = scale if scale is not None else q.shape[-1] ** -0.5
        grads = _reference_grads(q, k, v, dout, scale, is_causal)
        return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))

    def flash_forward(self, q, k, v, cq, ck, mq, mk, dropout_p, is_causal, return_debug_mask, **kwargs):
        self.calls += 1
        scale = kwargs.get("scale") or q.shape[-1] ** -0.5
        out, lse = _flash_reference(q, k, v, cq, ck, scale, is_causal)
        z = torch.zeros((2,), dtype=torch.uint64)
        return out.to(q.dtype), lse, z, torch.zeros((), dtype=torch.uint64), torch.empty(0, dtype=q.dtype)

    def flash_backward(self, dout, q, k, v, out, lse, cq, ck, mq, mk, dropout_p, is_causal, rng, unused, **kwargs):
        self.calls += 1
        scale = kwargs.get("scale") or q.shape[-1] ** -0.5
        return tuple(g.to(t.dtype) for g, t in zip(_flash_reference_grads(dout, q, k, v, cq, ck, scale, is_causal),
                                                   (q, k, v)))

    def close(self):
        self.lib._destroy()


def _segments(cq, ck, tq, tk):
    """[(q rows, k rows)] per sequence: one (all, all) pair per batch element when dense."""
    if cq is None or cq.numel() == 0:
        return None
    a, b = cq.tolist(), ck.tolist()
    return [(slice(a[i], a[i + 1]), slice(b[i], b[i + 1])) for i in range(len(a) - 1)]


def _flash_reference(q, k, v, cq, ck, scale, causal):
    """The flash op's (out, lse) in fp32: (b, s, h, d) tensors with lse (b, h, s), or packed
    (total, h, d) tensors with lse (h, total)."""
    segs = _segments(cq, ck, q.shape[0], k.shape[0])
    if segs is None:
        out, lse = _reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, causal)
        return out.transpose(1, 2), lse
    outs, lses = [], []
    for sq, sk in segs:
        o, l = _reference(*(t[None, s].transpose(1, 2) for t, s in ((q, sq), (k, sk), (v, sk))), scale, causal)
        outs.append(o.transpose(1, 2)[0])
        lses.append(l[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def _flash_reference_grads(dout, q, k, v, cq, ck, scale, causal):
    segs = _segments(cq, ck, q.shape[0], k.shape[0])
    if segs is None:
        g = _reference_grads(*(t.transpose(1, 2) for t in (q, k, v, dout)), scale, causal)
        return [x.transpose(1, 2) for x in g]
    parts = []
    for sq, sk in segs:
        qs, ks, vs, ds = (t[None, s].transpose(1, 2) for t, s in ((q, sq), (k, sk), (v, sk), (dout, sq)))
        parts.append([x.transpose(1, 2)[0] for x in _reference_grads(qs, ks, vs, ds, scale, causal)])
    return [torch.cat([p[i] for p in parts]) for i in range(3)]


class _FlashbackStandIn(sdpa._Backend):
    """flashback's kernels as an fp32 reference on the CPU, in flashback's (b, s, h, d) order."""

    def __init__(self):
        self.forward_calls = self.backward_calls = 0
        self.deterministic = []  # the mode of each served backward

    def device_ok(self, x):
        return True

    def layout_ok(self, x):
        return x.stride(-1) == 1

    def accepts(self, q, k, v, scale):
        from flashback import _checks

        try:
            _checks.check_forward_args(q, k, v, softmax_scale=scale, require_cuda=False)
        except (TypeError, ValueError) as e:
            return f"flashback rejects it ({e})"
        return None

    def forward(self, q, k, v, out, lse, scale, causal):
        self.forward_calls += 1
        o, l = _reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, causal)
        out.copy_(o.transpose(1, 2))
        lse.copy_(l)

    def accepts_varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale):
        from flashback import varlen

        try:
            varlen.check_varlen_args(q, k, v, cu_q, cu_k, int(max_q), int(max_k), softmax_scale=scale,
                                     require_cuda=False)
        except (TypeError, ValueError) as e:
            return f"flashback rejects it ({e})"
        return None

    def varlen_forward(self, q, k, v, cu_q, cu_k, max_q, max_k, out, lse, scale, causal):
        self.forward_calls += 1
        o, l = _flash_reference(q, k, v, cu_q, cu_k, scale, causal)
        out.copy_(o)
        lse.copy_(l)

    def varlen_backward(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, scale, causal,
                        deterministic):
        self.backward_calls += 1
        self.deterministic.append(deterministic)
        for dst, g in zip((dq, dk, dv), _flash_reference_grads(dout, q, k, v, cu_q, cu_k, scale, causal)):
            dst.copy_(g)

    def backward(self, dout, q, k, v, out, lse, dq, dk, dv, scale, causal, deterministic):
        self.backward_calls += 1
        self.deterministic.append(deterministic)
        grads = _reference_grads(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 dout.transpose(1, 2), scale, causal)
        for dst, g in zip((dq, dk, dv), grads):
            dst.copy_(g.transpose(1, 2))


@pytest.fixture
def cpu_provider(monkeypatch):
    """PyTorch's stand-in registered first, then flashback's override on top of it at CPU."""
    torch_kernel = _PyTorchStandIn()
    backend = _FlashbackStandIn()
    monkeypatch.setattr(sdpa, "_backend", backend)
    monkeypatch.setattr(sdpa, "_DISPATCH_KEY", "CPU")
    yield torch_kernel, backend
    if hasattr(torch.nn.attention, "restore_flash_attention_impl"):
        torch.nn.attention.restore_flash_attention_impl(_raise_warn=False)
    torch_kernel.close()


def _unsupported_headdim():
    """A head dim PyTorch's flash kernel takes (a multiple of 8 up to 256) and flashback does not."""
    return next(d for d in (96, 80, 48, 32, 160, 224) if d not in flashback.SUPPORTED_HEADDIMS)


def _qkv(d=256, dtype=torch.bfloat16, b=2, h=4, hk=2, sq=33, sk=33):
    q = torch.randn(b, sq, h, d).to(dtype).transpose(1, 2)  # SDPA order over (b, s, h, d) memory
    k = torch.randn(b, sk, hk, d).to(dtype).transpose(1, 2)
    v = torch.randn(b, sk, hk, d).to(dtype).transpose(1, 2)
    return q, k, v


@needs_registry
def test_import_registers_but_does_not_activate():
    assert "flashback" in torch.nn.attention.list_flash_attention_impls()
    assert torch.nn.attention.current_flash_attention_impl() != "flashback"


@needs_registry
@needs_get_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_activated_provider_serves_the_fast_path(cpu_provider, causal):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    assert torch.nn.attention.current_flash_attention_impl() == "flashback"
    q, k, v = _qkv()
    scale = 1 / 16
    res = FWD(q, k, v, 0.0, causal, False, scale=scale)
    assert (backend.forward_calls, torch_kernel.calls) == (1, 0)
    out, lse, cq, ck, max_q, max_k, rng, unused, debug = res
    ref_out, ref_lse = _reference(q, k, v, scale, causal)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride() == torch.empty_like(q).stride()
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    assert (max_q, max_k) == (33, 33) and rng.dtype == torch.uint64 and rng.shape == (2,)
    assert unused.dtype == torch.uint64 and unused.shape == () and debug.numel() == 0
    torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


@needs_registry
@needs_get_kernel
def test_autograd_reaches_the_backward_override(cpu_provider):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v = (t.detach().requires_grad_() for t in _qkv())
    out = FWD(q, k, v, 0.0, True, False, scale=0.0625)[0]
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert (backend.forward_calls, backend.backward_calls, torch_kernel.calls) == (1, 1, 0)
    assert backend.deterministic == [False]
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(_reference(*leaves, 0.0625, True)[0], leaves, dout.float())
    for ours, r, t in zip((dq, dk, dv), ref, (q, k, v)):
        assert ours.shape == t.shape
        torch.testing.assert_close(ours.float(), r, atol=3e-2, rtol=3e-2)


@needs_registry
@needs_get_kernel
@pytest.mark.parametrize("d", sorted(flashback.SUPPORTED_HEADDIMS))
def test_every_supported_head_dim_is_served(cpu_provider, d):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v = _qkv(d=d)
    out = FWD(q, k, v, 0.0, True, False, scale=0.1)[0]
    assert (backend.forward_calls, torch_kernel.calls) == (1, 0)
    torch.testing.assert_close(out.float(), _reference(q, k, v, 0.1, True)[0], atol=2e-2, rtol=2e-2)


@needs_registry
@needs_get_kernel
@pytest.mark.parametrize("case", ["fp32", "headdim", "dropout", "debug_mask", "negative_scale"])
def test_everything_else_falls_through_unchanged(cpu_provider, case):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    assert torch.float32 not in flashback._checks.SUPPORTED_DTYPES
    q, k, v = _qkv(d=_unsupported_headdim() if case == "headdim" else 256,
                   dtype=torch.float32 if case == "fp32" else torch.bfloat16)
    dropout = 0.1 if case == "dropout" else 0.0
    debug = case == "debug_mask"
    scale = -0.1 if case == "negative_scale" else 0.1  # PyTorch takes any scale; flashback > 0 only
    out = FWD(q, k, v, dropout, True, debug, scale=scale)[0]
    assert (backend.forward_calls, torch_kernel.calls) == (0, 1)
    torch.testing.assert_close(out.float(), _reference(q, k, v, scale, True)[0], atol=2e-2, rtol=2e-2)


@needs_registry
@needs_get_kernel
def test_deterministic_mode_serves_the_backward_in_flashbacks_deterministic_mode(cpu_provider):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v = (t.detach().requires_grad_() for t in _qkv())
    with deterministic_algorithms():
        out = FWD(q, k, v, 0.0, True, False, scale=0.0625)[0]
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert (backend.forward_calls, backend.backward_calls, torch_kernel.calls) == (1, 1, 0)
    assert backend.deterministic == [True]
    ref = _reference_grads(q, k, v, dout, 0.0625, True)
    for ours, r in zip(grads, ref):
        torch.testing.assert_close(ours.float(), r, atol=3e-2, rtol=3e-2)


@needs_get_kernel
def test_removal_restores_the_previous_kernel(cpu_provider):
    torch_kernel, backend = cpu_provider
    handle = sdpa.install("CPU")
    q, k, v = _qkv()
    FWD(q, k, v)
    assert (backend.forward_calls, torch_kernel.calls) == (1, 0)
    handle.remove()
    handle.remove()  # idempotent
    FWD(q, k, v)
    assert (backend.forward_calls, torch_kernel.calls) == (1, 1)


@needs_get_kernel
def test_install_without_a_kernel_to_fall_back_to_says_so():
    # No CPU kernel of the op exists in PyTorch: nothing to fall through to.
    with pytest.raises(RuntimeError, match="no CPU kernel of PyTorch's flash attention"):
        sdpa.install("CPU")


def test_decline_reasons(monkeypatch):
    monkeypatch.setattr(sdpa, "_backend", _FlashbackStandIn())
    q, k, v = _qkv()
    assert sdpa.decline_reason(q, k, v) is None
    assert sdpa.decline_reason(q, k, v, dropout_p=0.5) == "dropout"
    assert sdpa.decline_reason(q, k, v, return_debug_mask=True) == "debug mask requested"
    for d in flashback.SUPPORTED_HEADDIMS:
        assert sdpa.decline_reason(*_qkv(d=d)) is None
    assert sdpa.decline_reason(*_qkv(d=_unsupported_headdim())) == "head dim not supported by flashback"
    assert sdpa.decline_reason(*_qkv(dtype=torch.float32)) == "dtype not supported by flashback"
    assert sdpa.decline_reason(q, k[:, :, :, :128], v) == "head dim not supported by flashback"
    assert sdpa.decline_reason(*_qkv(h=3, hk=2)) == "shapes"
    assert sdpa.decline_reason(q, k[:, :0], v[:, :0]) == "shapes"  # no kv heads
    assert "flashback rejects it" in sdpa.decline_reason(q, k, v, scale=0.0)
    assert "flashback rejects it" in sdpa.decline_reason(q, k, v, scale=float("inf"))
    with deterministic_algorithms():
        assert sdpa.decline_reason(q, k, v) is None
        assert sdpa.decline_reason(q, k, v, backward=True) is None
    monkeypatch.setattr(sdpa._backend, "device_ok", lambda x: False)
    assert "sm_90" in sdpa.decline_reason(q, k, v)


def _aligned(shape, offset_elems=0):
    """A bf16 tensor of `shape` whose base is 128-byte aligned (plus offset_elems)."""
    n = math.prod(shape)
    flat = torch.empty(n + 128, dtype=torch.bfloat16)
    start = (-flat.data_ptr() % 128) // 2 + offset_elems
    return flat[start:start + n].view(shape)


def test_tma_layout_rule():
    x = _aligned((2, 64, 8, 256))
    assert sdpa._tma_ok(x)
    bhsd = _aligned((2, 8, 64, 256)).transpose(1, 2)  # (b, h, s, d) memory seen as (b, s, h, d)
    assert sdpa._tma_ok(bhsd)
    assert not sdpa._tma_ok(_aligned((2, 64, 8, 256), offset_elems=8))  # 16-byte, not 128-byte aligned
    assert not sdpa._tma_ok(_aligned((2, 64, 8, 264))[..., :256])  # head stride 264: not a multiple of 64
    assert not sdpa._tma_ok(x.transpose(-1, -2))  # last dim not contiguous


# --- the lower-level flash ops (varlen_attn's route) ------------------------------------------

FLASH_FWD = torch.ops.aten._flash_attention_forward
FLASH_BWD = torch.ops.aten._flash_attention_backward


def _packed(lengths_q, lengths_k, h=4, hk=2, d=256, dtype=torch.bfloat16):
    cq = torch.tensor([0] + torch.tensor(lengths_q).cumsum(0).tolist(), dtype=torch.int32)
    ck = torch.tensor([0] + torch.tensor(lengths_k).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cq[-1]), h, d).to(dtype)
    k, v = (torch.randn(int(ck[-1]), hk, d).to(dtype) for _ in range(2))
    return q, k, v, cq, ck


@needs_registry
@needs_get_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_flash_op_is_served(cpu_provider, causal):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v, cq, ck = _packed([5, 0, 40], [7, 3, 40])
    out, lse, rng, unused, debug = FLASH_FWD(q, k, v, cq, ck, 40, 40, 0.0, causal, False, scale=0.0625)
    assert (backend.forward_calls, torch_kernel.calls) == (1, 0)
    assert out.shape == q.shape and lse.shape == (4, 45) and lse.dtype == torch.float32
    assert rng.dtype == torch.uint64 and rng.shape == (2,) and debug.numel() == 0
    ref_out, ref_lse = _flash_reference(q, k, v, cq, ck, 0.0625, causal)
    torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    dout = torch.randn_like(out)
    dq, dk, dv = FLASH_BWD(dout, q, k, v, out, lse, cq, ck, 40, 40, 0.0, causal, rng, unused, scale=0.0625)
    assert (backend.backward_calls, torch_kernel.calls) == (1, 0)
    for ours, r in zip((dq, dk, dv), _flash_reference_grads(dout, q, k, v, cq, ck, 0.0625, causal)):
        torch.testing.assert_close(ours.float(), r, atol=3e-2, rtol=3e-2)


@needs_registry
@needs_get_kernel
def test_dense_flash_op_is_served(cpu_provider):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v = (t.transpose(1, 2) for t in _qkv())  # the flash op takes (b, s, h, d)
    out, lse, rng, unused, _ = FLASH_FWD(q, k, v, None, None, 33, 33, 0.0, True, False, scale=0.0625)
    assert (backend.forward_calls, torch_kernel.calls) == (1, 0)
    assert out.shape == q.shape and lse.shape == (2, 4, 33)
    ref_out, ref_lse = _flash_reference(q, k, v, None, None, 0.0625, True)
    torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


@needs_registry
@needs_get_kernel
@pytest.mark.parametrize("case", ["window", "dropout", "fp32", "headdim", "seqused_k"])
def test_unserved_flash_op_calls_fall_through(cpu_provider, case):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v, cq, ck = _packed([5, 40], [7, 40], d=_unsupported_headdim() if case == "headdim" else 256,
                              dtype=torch.float32 if case == "fp32" else torch.bfloat16)
    kwargs = {"scale": 0.0625}
    if case == "window":
        kwargs["window_size_left"] = 8
    if case == "seqused_k":
        kwargs["seqused_k"] = torch.tensor([7, 40], dtype=torch.int32)
    dropout = 0.1 if case == "dropout" else 0.0
    if case in ("window", "seqused_k"):  # the stand-in ignores them; only the routing matters
        assert sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40, dropout, False, **kwargs) is not None
        return
    FLASH_FWD(q, k, v, cq, ck, 40, 40, dropout, True, False, **kwargs)
    assert (backend.forward_calls, torch_kernel.calls) == (0, 1)


def test_flash_decline_reasons(cpu_provider, monkeypatch):
    q, k, v, cq, ck = _packed([5, 40], [7, 40])
    assert sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40) is None
    assert sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40, window_size_left=-1, window_size_right=-1,
                                     num_splits=4) is None
    assert sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40, window_size_right=0) is None  # causal
    assert sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40, window_size_right=5) == "sliding window"
    assert sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40, window_size_left=64,
                                     window_size_right=0) == "sliding window"
    assert sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40, block_table=cq) == "block_table"
    assert sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40, alibi_slopes=cq) == "alibi_slopes"
    assert sdpa.flash_decline_reason(q, k, v, cq.long(), ck, 40, 40).startswith("flashback rejects it")
    assert sdpa.flash_decline_reason(q[None], k, v, cq, ck, 40, 40) == "varlen tensors not 3-D"
    assert sdpa.flash_decline_reason(q, k, v, None, ck, 40, 40) == "offsets for k only"
    monkeypatch.setattr(sdpa._backend, "device_ok", lambda x: False)
    assert "sm_90" in sdpa.flash_decline_reason(q, k, v, cq, ck, 40, 40)


@needs_registry
@needs_get_kernel
def test_window_minus_one_zero_is_served_as_causal(cpu_provider):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v, cq, ck = _packed([5, 40], [7, 40])
    out = FLASH_FWD(q, k, v, cq, ck, 40, 40, 0.0, False, False, scale=0.0625, window_size_left=-1,
                    window_size_right=0)[0]
    assert (backend.forward_calls, torch_kernel.calls) == (1, 0)
    ref_out, _ = _flash_reference(q, k, v, cq, ck, 0.0625, True)
    torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)


@needs_registry
@needs_get_kernel
def test_deterministic_non_causal_backward_falls_through(cpu_provider):
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v = (t.detach().requires_grad_() for t in _qkv())
    with deterministic_algorithms():
        out = FWD(q, k, v, 0.0, False, False, scale=0.0625)[0]
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert (backend.forward_calls, backend.backward_calls, torch_kernel.calls) == (1, 0, 1)


@needs_registry
@needs_get_kernel
def test_backward_takes_a_strided_lse_and_declines_a_foreign_one(cpu_provider):
    """Context parallel hands the backward chunks of a merged LSE: a non-contiguous fp32 LSE of
    the right shape is served (made contiguous); one of another shape or dtype falls through."""
    torch_kernel, backend = cpu_provider
    torch.nn.attention.activate_flash_attention_impl("flashback")
    q, k, v = _qkv()
    out, lse = FWD(q, k, v, 0.0, True, False, scale=0.0625)[:2]
    dout = torch.randn_like(out)
    wide = torch.empty(lse.shape[0], lse.shape[1], 2 * lse.shape[2])
    strided = wide[:, :, ::2]
    strided.copy_(lse)
    assert not strided.is_contiguous()
    BWD = torch.ops.aten._scaled_dot_product_flash_attention_backward
    grads = BWD(dout, q, k, v, out, strided, None, None, 33, 33, 0.0, True, torch.zeros(2, dtype=torch.uint64),
                torch.zeros((), dtype=torch.uint64), scale=0.0625)
    assert (backend.backward_calls, torch_kernel.calls) == (1, 0)
    for ours, r in zip(grads, _reference_grads(q, k, v, dout, 0.0625, True)):
        torch.testing.assert_close(ours.float(), r, atol=3e-2, rtol=3e-2)
    BWD(dout, q, k, v, out, lse.double(), None, None, 33, 33, 0.0, True, torch.zeros(2, dtype=torch.uint64),
        torch.zeros((), dtype=torch.uint64), scale=0.0625)
    assert (backend.backward_calls, torch_kernel.calls) == (1, 1)


def test_backward_inputs_on_another_device_fall_through():
    # The kernels would take a pointer of another device as their own: such a backward call
    # goes to PyTorch's kernel instead.
    q = torch.randn(2, 4, 16, 64)
    lse_shape = (2, 4, 16)
    ok = sdpa._backward_inputs_decline(q.clone(), q, q.clone(), torch.zeros(lse_shape), lse_shape)
    assert ok is None
    for i in range(3):
        args = [q.clone(), q.clone(), torch.zeros(lse_shape)]
        args[i] = args[i].to("meta")
        why = sdpa._backward_inputs_decline(args[0], q, args[1], args[2], lse_shape)
        assert why == "dout, out or logsumexp on another device than q", i
