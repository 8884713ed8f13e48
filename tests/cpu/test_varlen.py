"""Variable-length batches, without a GPU: the tiled model of the packed layout against
per-sequence dense references, the argument and offset checks, and the op plumbing (fake
kernels, autograd, torch.compile) through test-only CPU kernels built from the reference math.
"""
import os

import numpy as np
import pytest
import torch

import flashback
from flashback import varlen as fv
from reference import dense_backward_np, dense_forward_np, explicit_attention
from tiled_model import varlen_backward, varlen_forward

BF16 = torch.bfloat16


@pytest.fixture
def rng():
    seed = int(os.environ.get("FLASHBACK_TEST_SEED", np.random.SeedSequence().entropy))
    print(f"FLASHBACK_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def _offsets(lengths):
    return [0] + list(np.cumsum(lengths))


# --- the tiled model of packed tiles ----------------------------------------------------------

VARLEN_CASES = [
    # (lengths_q, lengths_k, nheads, nheads_k, causal)
    ([17, 0, 100, 1, 64], [17, 0, 100, 1, 64], 2, 1, True),
    ([17, 0, 100, 1, 64], [17, 0, 100, 1, 64], 2, 2, False),
    ([5, 130, 81], [90, 7, 200], 4, 2, True),     # seqlen_q != seqlen_k per sequence
    ([5, 130, 81], [90, 7, 200], 4, 2, False),
    ([70, 3], [0, 161], 2, 1, True),             # a sequence with no keys
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{c[0]}x{c[1]}-h{c[2]}/{c[3]}-{'causal' if c[4] else 'full'}")
def test_varlen_model_matches_per_sequence_dense(rng, case):
    """Tiles loaded from the packed tensors run into the next sequence's rows; masks and bounds
    must keep them out, so every sequence equals its own dense computation."""
    lq, lk, h, hk, causal = case
    d = 32
    cu_q, cu_k = _offsets(lq), _offsets(lk)
    q = rng.standard_normal((cu_q[-1], h, d))
    k, v = (rng.standard_normal((cu_k[-1], hk, d)) for _ in range(2))
    dout = rng.standard_normal((cu_q[-1], h, d))
    out, lse = varlen_forward(q, k, v, cu_q, cu_k, causal, block_m=64, block_n=80)
    dq, dk, dv = varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, causal, block_m=64, block_n=80)
    for b in range(len(lq)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lq[b] == 0:
            continue
        if lk[b] == 0:
            assert np.all(out[sq] == 0) and np.all(np.isinf(lse[:, sq])) and np.all(dq[sq] == 0)
            continue
        o_ref, l_ref = dense_forward_np(q[None, sq], k[None, sk], v[None, sk], causal)
        g_ref = dense_backward_np(dout[None, sq], q[None, sq], k[None, sk], v[None, sk], causal)
        np.testing.assert_allclose(out[sq], o_ref[0], rtol=0, atol=1e-10)
        np.testing.assert_allclose(lse[:, sq], l_ref[0], rtol=0, atol=1e-10)
        for got, want in zip((dq[sq], dk[sk], dv[sk]), g_ref):
            np.testing.assert_allclose(got, want[0], rtol=0, atol=1e-9)
    # Keys of a sequence no query sees get zero gradient (sequence 1 of the first cases).
    for b in range(len(lq)):
        if lq[b] == 0:
            assert np.all(dk[cu_k[b]:cu_k[b + 1]] == 0) and np.all(dv[cu_k[b]:cu_k[b + 1]] == 0)


# --- argument and offset checks -------------------------------------------------------------

def _packed(total_q=30, total_k=40, h=4, hk=2, d=64, dtype=BF16):
    return (torch.randn(total_q, h, d).to(dtype), torch.randn(total_k, hk, d).to(dtype),
            torch.randn(total_k, hk, d).to(dtype))


def _cu(*vals):
    return torch.tensor(vals, dtype=torch.int32)


def _check(q, k, v, cu_q, cu_k, mq=20, mk=25):
    return fv.check_varlen_args(q, k, v, cu_q, cu_k, mq, mk, require_cuda=False)


def test_valid_arguments_pass():
    q, k, v = _packed()
    assert _check(q, k, v, _cu(0, 10, 30), _cu(0, 15, 40)) == (2, 4, 2, 64)
    fv.check_offset_values(_cu(0, 10, 30), _cu(0, 15, 40), 30, 40, 20, 25)
    fv.check_offset_values(_cu(0, 0, 30), _cu(0, 40, 40), 30, 40, 30, 40)  # empty sequences


@pytest.mark.parametrize("bad, error, match", [
    (dict(cu_q=_cu(0, 10, 30).long()), TypeError, "cu_seqlens_q must have dtype torch.int32"),
    (dict(cu_k=_cu(0, 15, 40).float()), TypeError, "cu_seqlens_k must have dtype torch.int32"),
    (dict(cu_q=_cu(0)), ValueError, "batch \\+ 1 >= 2"),
    (dict(cu_q=_cu(0, 10, 30).reshape(1, 3)), ValueError, "must be 1-D"),
    (dict(cu_k=_cu(0, 40)), ValueError, "same length"),
    (dict(q=torch.randn(1, 30, 4, 64).to(BF16)), ValueError, "3 dims"),
    (dict(q=torch.randn(30, 4, 64)), TypeError, "dtype"),
    (dict(q=torch.randn(30, 3, 64).to(BF16)), ValueError, "multiple of nheads"),
    (dict(q=torch.randn(30, 4, 32).to(BF16)), ValueError, "same headdim"),
    (dict(mq=-1), ValueError, "max_seqlen_q must be >= 0"),
    (dict(mk=2.5), TypeError, "max_seqlen_k must be an int"),
    # The C API's int: 2**32 + 5 would reach it as 5 and leave every row past 5 uncomputed.
    (dict(mq=2**32 + 5), ValueError, "max_seqlen_q must be at most 1073741824"),
    (dict(mk=2**30 + 1), ValueError, "max_seqlen_k must be at most 1073741824"),
    (dict(cu_q="0,10,30"), TypeError, "cu_seqlens_q must be a torch.Tensor"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_arguments_raise(bad, error, match):
    q, k, v = _packed()
    args = dict(q=q, k=k, v=v, cu_q=_cu(0, 10, 30), cu_k=_cu(0, 15, 40), mq=20, mk=25)
    args.update(bad)
    with pytest.raises(error, match=match):
        _check(args["q"], args["k"], args["v"], args["cu_q"], args["cu_k"], args["mq"], args["mk"])


@pytest.mark.parametrize("cu_q, cu_k, mq, mk, match", [
    (_cu(1, 10, 30), _cu(0, 15, 40), 30, 40, "cu_seqlens_q must start at 0"),
    (_cu(0, 20, 10, 30), _cu(0, 15, 20, 40), 30, 40, "non-decreasing: entry 2 \\(10\\)"),
    (_cu(0, 10, 29), _cu(0, 15, 40), 30, 40, "must end at the number of rows \\(30\\), got 29"),
    (_cu(0, 10, 30), _cu(0, 15, 41), 30, 40, "cu_seqlens_k must end at the number of rows \\(40\\)"),
    (_cu(0, 10, 30), _cu(0, 15, 40), 19, 40, "max_seqlen_q \\(19\\) is smaller than the longest sequence \\(20\\)"),
    (_cu(0, 10, 30), _cu(0, 15, 40), 20, 24, "max_seqlen_k \\(24\\) is smaller than the longest sequence \\(25\\)"),
])
def test_bad_offsets_raise(cu_q, cu_k, mq, mk, match):
    with pytest.raises(ValueError, match=match):
        fv.check_offset_values(cu_q, cu_k, 30, 40, mq, mk)


def test_cpu_tensors_are_refused_before_any_launch():
    q, k, v = _packed()
    with pytest.raises(ValueError, match="CUDA GPUs"):
        flashback.attention_varlen(q, k, v, _cu(0, 10, 30), _cu(0, 15, 40), 20, 25)


def test_offsets_on_another_device_are_refused():
    q, k, v = _packed()
    with pytest.raises(ValueError, match="cu_seqlens_q must be on the device of q"):
        fv.check_varlen_args(q, k, v, _cu(0, 10, 30).to("meta"), _cu(0, 15, 40), 20, 25,
                             require_cuda=False)


# --- op plumbing with test-only CPU kernels --------------------------------------------------

def _dense_one(q, k, v, scale, causal, dout=None):
    """One sequence (s, h, d): (out, lse (h, s)) or, with dout, (dq, dk, dv)."""
    res = explicit_attention(q[None], k[None], v[None], scale, causal, None if dout is None else dout[None])
    return tuple(t[0] for t in res)


def _per_sequence(q, k, v, cu_q, cu_k, scale, causal, dout=None):
    """Reference: each sequence on its own, packed again."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    parts = []
    for b in range(len(cq) - 1):
        a, e, a2, e2 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        parts.append(_dense_one(q[a:e], k[a2:e2], v[a2:e2], scale, causal,
                                None if dout is None else dout[a:e]))
    if dout is None:
        return (torch.cat([o for o, _ in parts]).to(q.dtype).contiguous(),
                torch.cat([l for _, l in parts], dim=1).float().contiguous())
    return [torch.cat([g[i] for g in parts]).to(q.dtype).contiguous() for i in range(3)]


@pytest.fixture(scope="module")
def cpu_varlen_kernels():
    lib = torch.library.Library("flashback", "IMPL")

    def fwd(q, k, v, cu_q, cu_k, mq, mk, scale, causal, deterministic):
        return _per_sequence(q, k, v, cu_q, cu_k, scale, causal)

    def bwd(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, scale, causal, deterministic):
        return tuple(_per_sequence(q, k, v, cu_q, cu_k, scale, causal, dout))

    lib.impl("varlen_fwd", fwd, "CPU")
    lib.impl("varlen_bwd", bwd, "CPU")
    yield
    lib._destroy()


def test_opcheck_varlen(cpu_varlen_kernels):
    q, k, v = _packed()
    cu_q, cu_k = _cu(0, 10, 10, 30), _cu(0, 15, 15, 40)
    torch.library.opcheck(torch.ops.flashback.varlen_fwd.default,
                          (q, k, v, cu_q, cu_k, 20, 25, 0.125, True, False))
    out, lse = torch.ops.flashback.varlen_fwd(q, k, v, cu_q, cu_k, 20, 25, 0.125, True, False)
    assert out.shape == q.shape and lse.shape == (4, 30)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashback.varlen_bwd.default,
                          (dout, q, k, v, out, lse, cu_q, cu_k, 20, 25, 0.125, True, False))


def test_varlen_autograd_and_compile(cpu_varlen_kernels):
    q, k, v = (t.requires_grad_() for t in _packed())
    cu_q, cu_k = _cu(0, 10, 30), _cu(0, 15, 40)

    def f(q, k, v):
        out, _ = torch.ops.flashback.varlen_fwd(q, k, v, cu_q, cu_k, 20, 25, 0.125, True, False)
        return (out.float() * 2).sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    grads = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = _per_sequence(q.detach(), k.detach(), v.detach(), cu_q, cu_k, 0.125, True,
                         dout=torch.full(q.shape, 2.0))
    for g, w in zip(grads, want):
        torch.testing.assert_close(g.float(), w.float(), atol=2e-2, rtol=2e-2)


# --- eager fast path ------------------------------------------------------------------------

def _fake_cuda_varlen():
    q = torch.empty(30, 4, 128, dtype=BF16, device="cuda")
    k = torch.empty(40, 2, 128, dtype=BF16, device="cuda")
    cu_q = torch.empty(3, dtype=torch.int32, device="cuda")
    cu_k = torch.empty(3, dtype=torch.int32, device="cuda")
    return q, k, cu_q, cu_k


def test_varlen_eager_path_only_for_plain_cuda_tensors(monkeypatch):
    # CPU and fake tensors (torch.compile, FakeTensorMode) must reach flashback::varlen_fwd: the
    # eager path reads the offsets on the host, which a fake tensor cannot give.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flashback import ops

    q, k, v = _packed()
    assert not ops.eager_ok(q, k, v, _cu(0, 10, 30), _cu(0, 15, 40))

    def no_eager(*args):
        raise AssertionError("the eager path ran on fake tensors")

    monkeypatch.setattr(fv, "_attention_varlen_eager", no_eager)
    with FakeTensorMode():
        fq, fk, cu_q, cu_k = _fake_cuda_varlen()
        assert not ops.eager_ok(fq, fk, fk, cu_q, cu_k)
        out, lse = flashback.attention_varlen(fq, fk, fk, cu_q, cu_k, 20, 25, causal=True, return_lse=True)
    assert out.shape == (30, 4, 128) and lse.shape == (4, 30)


def test_attention_varlen_traces_to_the_op():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def f(q, k, v, cu_q, cu_k):
        return flashback.attention_varlen(q, k, v, cu_q, cu_k, 20, 25, causal=True)

    with FakeTensorMode():
        fq, fk, cu_q, cu_k = _fake_cuda_varlen()
        gm = torch._dynamo.export(f)(fq, fk, fk, cu_q, cu_k).graph_module
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert any("flashback.varlen_fwd" in t for t in targets), targets


@pytest.fixture
def cpu_varlen_launches(monkeypatch):
    """The eager path on CPU tensors: its launches replaced by the reference the test-only CPU
    kernels compute, and no device check. Records the dout each backward launch got."""
    douts = []

    def launch_fwd(q, k, v, cu_q, cu_k, mq, mk, out, lse, scale, causal):
        o, l = _per_sequence(q, k, v, cu_q, cu_k, scale, causal)
        out.copy_(o)
        lse.copy_(l)

    def launch_bwd(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, dq, dk, dv, scale, causal, deterministic):
        douts.append(dout)
        for dst, g in zip((dq, dk, dv), _per_sequence(q, k, v, cu_q, cu_k, scale, causal, dout)):
            dst.copy_(g)

    monkeypatch.setattr(fv, "_launch_fwd", launch_fwd)
    monkeypatch.setattr(fv, "_launch_bwd", launch_bwd)
    monkeypatch.setattr(fv._checks, "check_runtime", lambda *a, **kw: None)
    return douts


def test_varlen_eager_autograd_matches_the_op(cpu_varlen_kernels, cpu_varlen_launches):
    # The autograd.Function against the op's registered formula, on the same (reference) math:
    # the same outputs, an lse without gradient, gradients for q, k, v only, and a dout made
    # contiguous before the launch as the op path's formula does.
    q, k, v = _packed()
    cu_q, cu_k = _cu(0, 10, 10, 30), _cu(0, 15, 15, 40)
    args = (cu_q, cu_k, 20, 25, 0.125, True, True)
    leaves_e = [t.clone().requires_grad_() for t in (q, k, v)]
    leaves_o = [t.clone().requires_grad_() for t in (q, k, v)]
    out_e, lse_e = fv._attention_varlen_eager(*leaves_e, *args)
    out_o, lse_o = torch.ops.flashback.varlen_fwd(*leaves_o, *args)
    assert out_e.grad_fn is not None and not lse_e.requires_grad
    assert torch.equal(out_e, out_o) and torch.equal(lse_e, lse_o)
    dout = torch.randn(1, 4, 1).to(BF16).expand(q.shape)  # zero strides, as a broadcast loss gives
    grads_e = torch.autograd.grad(out_e, leaves_e, dout)
    grads_o = torch.autograd.grad(out_o, leaves_o, dout)
    assert len(cpu_varlen_launches) == 1 and cpu_varlen_launches[0].is_contiguous()
    for name, e, o in zip(("dq", "dk", "dv"), grads_e, grads_o):
        assert torch.equal(e, o), name


def test_varlen_eager_without_autograd_skips_the_function(cpu_varlen_launches, monkeypatch):
    class NoFunction:
        @staticmethod
        def apply(*args):
            raise AssertionError("the autograd.Function ran with nothing to record")

    q, k, v = _packed()
    args = (_cu(0, 10, 30), _cu(0, 15, 40), 20, 25, 0.125, False, False)
    want = fv._attention_varlen_eager(q, k, v, *args)
    monkeypatch.setattr(fv, "_VarlenAttention", NoFunction)
    with torch.no_grad():
        got = fv._attention_varlen_eager(*(t.clone().requires_grad_() for t in (q, k, v)), *args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert fv._attention_varlen_eager(q, k, v, *args)[0].grad_fn is None  # nothing requires grad


def test_varlen_eager_empty_batches_skip_the_launch(cpu_varlen_launches, monkeypatch):
    # No keys at all: out 0, lse +inf, zero gradients, and nothing launched either way.
    def no_launch(*args):
        raise AssertionError("launched with no keys")

    monkeypatch.setattr(fv, "_launch_fwd", no_launch)
    monkeypatch.setattr(fv, "_launch_bwd", no_launch)
    q, k, v = (t.requires_grad_() for t in _packed(total_k=0))
    out, lse = fv._attention_varlen_eager(q, k, v, _cu(0, 10, 30), _cu(0, 0, 0), 20, 0, 0.125, False, False)
    assert torch.equal(out, torch.zeros_like(out)) and bool(torch.isinf(lse).all())
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    q0 = torch.empty(0, 4, 64, dtype=BF16, requires_grad=True)
    out0, lse0 = fv._attention_varlen_eager(q0, k, v, _cu(0, 0, 0), _cu(0, 0, 0), 0, 0, 0.125, True, False)
    assert out0.shape == (0, 4, 64) and lse0.shape == (4, 0)


def test_varlen_eager_checks_offset_values(cpu_varlen_launches):
    # attention_varlen checks metadata only; the offsets' values are the eager path's to check.
    q, k, v = _packed()
    with pytest.raises(ValueError, match="must end at the number of rows"):
        fv._attention_varlen_eager(q, k, v, _cu(0, 10, 29), _cu(0, 15, 40), 20, 25, 0.125, False, False)


def test_varlen_eager_backward_reads_the_offsets_once(cpu_varlen_launches, monkeypatch):
    # The forward checked the offsets' values (a device-to-host read); the backward gets the
    # same tensors from autograd, which refuses them if they were modified in place since, so
    # it does not read them again.
    reads = []
    check = fv.check_offset_values
    monkeypatch.setattr(fv, "check_offset_values", lambda *a: (reads.append(1), check(*a))[1])
    q, k, v = (t.requires_grad_() for t in _packed())
    cu_q, cu_k = _cu(0, 10, 30), _cu(0, 15, 40)
    out, _ = fv._attention_varlen_eager(q, k, v, cu_q, cu_k, 20, 25, 0.125, True, False)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out), retain_graph=True)
    assert len(reads) == 1
    cu_k.add_(0)  # an in-place write: the saved offsets are stale now
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def test_offsets_are_read_once_per_tensor_and_version(monkeypatch):
    # Each read of the offsets waits for the stream; a model passes the same offsets to every
    # layer, so they are read once per tensor and version. A write in place is seen.
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: (reads.append(1), tolist(t))[1])
    cu_q, cu_k = _cu(0, 10, 30), _cu(0, 15, 40)
    for _ in range(3):
        fv.check_offset_values(cu_q, cu_k, 30, 40, 20, 25)
    assert len(reads) == 2
    # The facts stay checked against each call's totals and maxima.
    with pytest.raises(ValueError, match="max_seqlen_k"):
        fv.check_offset_values(cu_q, cu_k, 30, 40, 20, 24)
    with pytest.raises(ValueError, match="must end at the number of rows"):
        fv.check_offset_values(cu_q, cu_k, 31, 40, 20, 25)
    assert len(reads) == 2
    cu_k[1] = 41  # in place: the version moves, the values are read again
    with pytest.raises(ValueError, match="non-decreasing"):
        fv.check_offset_values(cu_q, cu_k, 30, 40, 20, 25)
    assert len(reads) == 3  # cu_k only
    fv.check_offset_values(cu_q, _cu(0, 15, 40), 30, 40, 20, 25)  # another tensor: read
    assert len(reads) == 4


def test_varlen_eager_path_under_torch_func_grad(cpu_varlen_launches):
    # torch.func transforms take the eager path's autograd.Function (forward + setup_context
    # form) and give autograd's gradient.
    q, k, v = _packed()
    cu_q, cu_k = _cu(0, 10, 30), _cu(0, 15, 40)

    def loss(q):
        return fv._attention_varlen_eager(q, k, v, cu_q, cu_k, 20, 25, 0.125, True, False)[0].float().sum()

    leaf = q.clone().requires_grad_()
    assert torch.equal(torch.func.grad(loss)(q), torch.autograd.grad(loss(leaf), leaf)[0])
