"""The torch.library machinery of the ops, checked without a GPU.

The ops' only real kernels are CUDA. To exercise schema, fake kernels, autograd registration and
torch.compile on a CPU-only machine, this module registers *test-only* CPU kernels computed with
the reference math (tests/reference.py). They check the op plumbing, not the CUDA kernels (the
GPU suite does that); the public API still refuses CPU tensors.
"""
import pytest
import torch

import flashback  # noqa: F401  (registers torch.ops.flashback.*)
from reference import attention_ref, explicit_attention

BF16 = torch.bfloat16


def _ref_fwd(q, k, v, softmax_scale, causal):
    out, lse = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, upcast=True)
    return out.to(q.dtype).contiguous(), lse.float().contiguous()


def _ref_bwd(dout, q, k, v, softmax_scale, causal):
    # Written out (no autograd): a backend kernel runs below the autograd dispatch key.
    grads = explicit_attention(q, k, v, softmax_scale, causal, dout)
    return tuple(g.to(BF16).contiguous() for g in grads)


@pytest.fixture(scope="module", autouse=True)
def cpu_reference_kernels():
    lib = torch.library.Library("flashback", "IMPL")

    def fwd(q, k, v, softmax_scale, causal, deterministic):
        return _ref_fwd(q, k, v, softmax_scale, causal)

    def fwd_out(q, k, v, out, lse, softmax_scale, causal):
        o, l = _ref_fwd(q, k, v, softmax_scale, causal)
        out.copy_(o)
        lse.copy_(l)

    def bwd(dout, q, k, v, out, lse, softmax_scale, causal, deterministic):
        return _ref_bwd(dout, q, k, v, softmax_scale, causal)

    def bwd_out(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic):
        for dst, src in zip((dq, dk, dv), _ref_bwd(dout, q, k, v, softmax_scale, causal)):
            dst.copy_(src)

    for name, fn in (("fwd", fwd), ("fwd_out", fwd_out), ("bwd", bwd), ("bwd_out", bwd_out)):
        lib.impl(name, fn, "CPU")
    yield
    lib._destroy()


def inputs(b=2, sq=24, sk=40, h=4, hk=2, d=64, requires_grad=False):
    g = torch.Generator().manual_seed(torch.seed() % (2**31))
    q = torch.randn(b, sq, h, d, generator=g).to(BF16)
    k = torch.randn(b, sk, hk, d, generator=g).to(BF16)
    v = torch.randn(b, sk, hk, d, generator=g).to(BF16)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_fwd(causal):
    q, k, v = inputs(requires_grad=True)
    torch.library.opcheck(torch.ops.flashback.fwd.default, (q, k, v, 0.125, causal, False))


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_bwd(causal):
    q, k, v = inputs()
    out, lse = _ref_fwd(q, k, v, 0.125, causal)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashback.bwd.default, (dout, q, k, v, out, lse, 0.125, causal, False))


def test_opcheck_out_variants():
    q, k, v = inputs()
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1])
    torch.library.opcheck(torch.ops.flashback.fwd_out.default, (q, k, v, out, lse, 0.125, True))
    dout = torch.randn_like(q)
    o, l = _ref_fwd(q, k, v, 0.125, True)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    torch.library.opcheck(torch.ops.flashback.bwd_out.default,
                          (dout, q, k, v, o, l, dq, dk, dv, 0.125, True, False))


def test_autograd_formula_calls_bwd():
    # Gradients through torch.ops.flashback.fwd equal the bwd op's, and lse has no gradient.
    q, k, v = inputs(requires_grad=True)
    out, lse = torch.ops.flashback.fwd(q, k, v, 0.125, True, False)
    assert not lse.requires_grad
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    expected = torch.ops.flashback.bwd(dout, q.detach(), k.detach(), v.detach(), out.detach(), lse,
                                       0.125, True, False)
    for g, e in zip(grads, expected):
        assert torch.equal(g, e)


def test_compile_fullgraph_forward_and_backward():
    # fullgraph=True fails on any graph break; aot_eager also traces the backward through the
    # registered autograd formula and fake kernels.
    def f(q, k, v):
        out, _ = torch.ops.flashback.fwd(q, k, v, 0.125, True, False)
        return (out.float() * 2).sum()

    q, k, v = inputs(requires_grad=True)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    loss_ref = f(q, k, v)
    grads_ref = torch.autograd.grad(loss_ref, (q, k, v))
    assert torch.allclose(loss, loss_ref)
    for g, e in zip(grads, grads_ref):
        assert torch.equal(g, e)


def test_interface_traces_without_graph_break():
    # The public function, validation included, traced by dynamo on fake CUDA tensors: the
    # Python checks are metadata-only and must not break the graph.
    from torch._subclasses.fake_tensor import FakeTensorMode

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, v):
        return flashback.attention(q, k, v, causal=True)

    with FakeTensorMode():
        q = torch.empty(1, 32, 4, 128, dtype=BF16, device="cuda")
        k = torch.empty(1, 48, 2, 128, dtype=BF16, device="cuda")
        gm_export = torch._dynamo.export(f)(q, k, k)
    targets = [str(n.target) for n in gm_export.graph_module.graph.nodes if n.op == "call_function"]
    assert any("flashback.fwd" in t for t in targets), targets


@pytest.mark.parametrize("name", ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"])
def test_flash_attn_functions_trace_without_graph_break(name):
    # FlashAttention-style calls inside torch.compile'd models: the drop-in functions, their
    # option checks and the unpacking of packed inputs, traced by dynamo on fake CUDA tensors,
    # end in flashback's forward op with no graph break.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flashback import flash_attn_interface as fai

    fn = getattr(fai, name)
    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 128, dtype=BF16, device="cuda")
        if name == "flash_attn_func":
            args = (q, torch.empty(2, 80, 2, 128, dtype=BF16, device="cuda"),
                    torch.empty(2, 80, 2, 128, dtype=BF16, device="cuda"))
        elif name == "flash_attn_qkvpacked_func":
            args = (torch.empty(2, 64, 3, 4, 128, dtype=BF16, device="cuda"),)
        else:
            args = (q, torch.empty(2, 80, 2, 2, 128, dtype=BF16, device="cuda"))
        gm_export = torch._dynamo.export(lambda *a: fn(*a, causal=True))(*args)
    targets = [str(n.target) for n in gm_export.graph_module.graph.nodes if n.op == "call_function"]
    assert any("flashback.fwd" in t for t in targets), targets


def test_eager_fast_path_only_for_plain_cuda_tensors():
    # What must still see flashback::fwd (fake tensors, dispatch modes, CPU tensors that the op
    # rejects with its own message) is kept off the dispatcher-free path.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from flashback import ops

    q, k, v = inputs()
    assert not ops.eager_ok(q, k, v)  # CPU
    with FakeTensorMode():
        fq = torch.empty(1, 32, 4, 128, dtype=BF16, device="cuda")
        assert not ops.eager_ok(fq, fq, fq)

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():
        assert ops._dispatch_stack_len() > 0
    assert ops._dispatch_stack_len() == 0 and not ops._function_mode_on()
