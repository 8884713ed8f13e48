"""Variable-length batches on the GPU: attention_varlen forward and backward against each
sequence computed on its own by the PyTorch reference (the correctness bar of the dense suite),
mixed lengths including 1, 17, 1000, 4097 and an empty sequence, causal and not, GQA, every head
dim of the family in bf16 and fp16, both backward modes."""
import math
import os

import pytest
import torch

import flashback
from reference import attention_ref, check_close

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
_FORCE_REFERENCE = os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0")


def _seed():
    return int.from_bytes(os.urandom(4), "little")


def _per_sequence_refs(q, k, v, dout, cu_q, cu_k, causal, upcast):
    """Packed out, lse (h, total_q) and grads of the reference, one sequence at a time."""
    dtype = torch.float32 if upcast else q.dtype
    outs, lses, grads = [], [], [[], [], []]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        qs, ks, vs = (t[None].detach().to(dtype).requires_grad_() for t in
                      (q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]))
        if qs.shape[1] == 0:
            for i, t in enumerate((qs, ks, vs)):
                grads[i].append(torch.zeros_like(t[0]))
            continue
        if ks.shape[1] == 0:  # no keys: out 0, lse +inf, no gradient
            outs.append(torch.zeros_like(qs[0]))
            lses.append(torch.full((qs.shape[2], qs.shape[1]), math.inf, device=DEVICE))
            for i, t in enumerate((qs, ks, vs)):
                grads[i].append(torch.zeros_like(t[0]))
            continue
        out, lse = attention_ref(qs, ks, vs, causal=causal, upcast=upcast)
        g = torch.autograd.grad(out, (qs, ks, vs), dout[None, cq[b]:cq[b + 1]].to(dtype))
        outs.append(out.detach()[0])
        lses.append(lse.detach()[0].float())
        for i in range(3):
            grads[i].append(g[i][0])
    return torch.cat(outs), torch.cat(lses, dim=1), [torch.cat(g) for g in grads]


CASES = [
    # lengths_q, lengths_k, nheads, nheads_k, headdim, causal
    ([1, 17, 1000, 4097, 0, 300], None, 4, 2, 256, True),
    ([1, 17, 1000, 4097, 0, 300], None, 4, 2, 256, False),
    ([17, 1000, 64], [1000, 17, 200], 2, 2, 256, True),
    ([17, 1000, 64], [1000, 17, 200], 2, 1, 256, False),
    ([5, 0, 130], [0, 9, 130], 2, 2, 256, True),     # a sequence with queries and no keys
    ([1, 17, 1000, 0], None, 4, 4, 128, True),
    ([17, 1000, 64], [1000, 17, 200], 4, 2, 128, False),
    ([1, 17, 1000, 4097, 0, 300], None, 4, 2, 128, False),   # one CTA per tile (past 4096 keys)
    ([1, 17, 1000, 4097, 0, 300], None, 4, 2, 192, True),
    ([17, 1000, 64], [1000, 17, 200], 2, 1, 64, False),
    ([5, 0, 130], [0, 9, 130], 4, 2, 64, True),
    ([17, 1000, 64], [1000, 17, 200], 4, 2, 96, True),   # zero-padded to 128 (attention_varlen)
    # Non-causal at d = 192: the persistent grid serves every length (kFwdSm90Hdim192Grid).
    ([17, 1000, 64], [1000, 17, 200], 4, 2, 192, False),
    # Non-causal at d = 64 past 4096 keys: one CTA per tile (up to 4096 the persistent grid).
    ([1, 17, 1000, 4097, 0, 300], None, 4, 2, 64, False),
]


def _case_id(c):
    lk = "" if c[1] is None else f"_k{'-'.join(map(str, c[1]))}"
    return f"q{'-'.join(map(str, c[0]))}{lk}_h{c[2]}/{c[3]}_d{c[4]}_{'causal' if c[5] else 'full'}"


def _make(case, dtype=torch.bfloat16):
    lq, lk, h, hk, d, causal = case
    lk = lq if lk is None else lk
    gen = torch.Generator(device=DEVICE).manual_seed(_seed())
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0).tolist()), dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0).tolist()), dtype=torch.int32, device=DEVICE)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    rnd = lambda *s: torch.randn(*s, generator=gen, device=DEVICE, dtype=torch.float32).to(dtype)
    q, k, v = rnd(tq, h, d), rnd(tk, hk, d), rnd(tk, hk, d)
    dout = rnd(tq, h, d)
    return q, k, v, dout, cu_q, cu_k, max(lq), max(lk), causal


@pytest.mark.parametrize("deterministic", [False, True], ids=["nondet", "det"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_varlen_matches_per_sequence_reference(case, dtype, deterministic):
    if _FORCE_REFERENCE and flashback._checks.hopper_only(dtype, case[4]):
        pytest.skip("runs on the Hopper kernels only (FLASHBACK_FORCE_REFERENCE is set)")
    q, k, v, dout, cu_q, cu_k, mq, mk, causal = _make(case, dtype)
    # Freed NaN memory first, so that a row the kernels never write shows up as NaN.
    torch.full((4 * q.numel(),), float("nan"), device=DEVICE, dtype=q.dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashback.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=causal, return_lse=True,
                                          deterministic=deterministic)
    fwd_path = flashback.last_forward_path()
    grads = torch.autograd.grad(out, leaves, dout)
    bwd_path = flashback.last_backward_path()
    want = "reference: " if _FORCE_REFERENCE else "sm90"  # every head dim has a Hopper member
    assert fwd_path.startswith(want) and bwd_path.startswith(want), (fwd_path, bwd_path)
    out32, lse32, g32 = _per_sequence_refs(q, k, v, dout, cu_q, cu_k, causal, upcast=True)
    outlp, _, glp = _per_sequence_refs(q, k, v, dout, cu_q, cu_k, causal, upcast=False)
    check_close("out", out, out32, outlp)
    finite = torch.isfinite(lse32)
    assert torch.equal(torch.isinf(lse), ~finite), "lse: +inf rows differ from the reference"
    assert torch.allclose(lse[finite], lse32[finite], atol=1e-3, rtol=1e-4)
    for name, ours, r32, rlp in zip(("dq", "dk", "dv"), grads, g32, glp):
        check_close(name, ours, r32, rlp)


def test_varlen_deterministic_is_bitwise_reproducible():
    q, k, v, dout, cu_q, cu_k, mq, mk, causal = _make(CASES[0])
    runs = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flashback.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, leaves, dout))
        if not _FORCE_REFERENCE:
            assert flashback.last_backward_path() == "sm90", flashback.last_backward_path()
    for again in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], again):
            assert torch.equal(a, b), f"deterministic varlen {name} differs between calls"


def test_varlen_bad_offsets_raise_before_launch():
    q, k, v, dout, cu_q, cu_k, mq, mk, causal = _make(CASES[2])
    with pytest.raises(ValueError, match="must end at the number of rows"):
        flashback.attention_varlen(q, k, v, cu_q[:-1], cu_k[:-1], mq, mk)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flashback.attention_varlen(q, k, v, cu_q, cu_k, mq - 1, mk)
    bad = cu_q.clone()
    bad[1] = bad[2] + 1
    with pytest.raises(ValueError, match="non-decreasing"):
        flashback.attention_varlen(q, k, v, bad, cu_k, mq, mk)


EAGER_CASES = [
    # lengths_q, lengths_k, nheads, nheads_k, headdim: empty sequences on either side, and
    # a batch with no keys at all (handled without a launch, on both paths).
    ([17, 0, 1000, 64], [1000, 9, 0, 200], 4, 2, 128),
    ([17, 0, 1000, 64], [1000, 9, 0, 200], 4, 2, 256),
    ([5, 7], [0, 0], 2, 1, 128),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", EAGER_CASES, ids=lambda c: _case_id((*c, False))[:-5])
def test_eager_path_matches_the_op(case, causal):
    """attention_varlen on plain tensors skips the dispatcher (ops.eager_ok); the op that
    torch.compile and modes see must give the same bits: same launches, deterministic dQ."""
    from flashback import ops

    q, k, v, dout, cu_q, cu_k, mq, mk, causal = _make((*case, causal))
    assert ops.eager_ok(q, k, v, cu_q, cu_k)
    scale = 1.0 / math.sqrt(q.shape[-1])

    leaves_e = [t.clone().requires_grad_() for t in (q, k, v)]
    out_e, lse_e = flashback.attention_varlen(*leaves_e, cu_q, cu_k, mq, mk, causal=causal,
                                              deterministic=True, return_lse=True)
    assert type(out_e.grad_fn).__name__ == "_VarlenAttentionBackward", out_e.grad_fn
    assert not lse_e.requires_grad
    grads_e = torch.autograd.grad(out_e, leaves_e, dout)

    leaves_o = [t.clone().requires_grad_() for t in (q, k, v)]
    out_o, lse_o = torch.ops.flashback.varlen_fwd(*leaves_o, cu_q, cu_k, mq, mk, scale, causal, True)
    assert not lse_o.requires_grad
    grads_o = torch.autograd.grad(out_o, leaves_o, dout)

    assert torch.equal(out_e, out_o), f"out: eager path differs from the op in {int((out_e != out_o).sum())} elements"
    assert torch.equal(lse_e, lse_o), "lse: eager path differs from the op"
    for name, e, o in zip(("dq", "dk", "dv"), grads_e, grads_o):
        assert torch.equal(e, o), f"{name}: eager path differs from the op in {int((e != o).sum())} elements"
    # Without grad mode the eager forward records nothing and gives the same bits.
    with torch.no_grad():
        out_n = flashback.attention_varlen(*leaves_e, cu_q, cu_k, mq, mk, causal=causal)
    assert out_n.grad_fn is None and torch.equal(out_n, out_o)


def test_eager_path_checks_offset_values():
    q, k, v, dout, cu_q, cu_k, mq, mk, causal = _make(EAGER_CASES[0] + (True,))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with pytest.raises(ValueError, match="max_seqlen_k"):
        flashback.attention_varlen(*leaves, cu_q, cu_k, mq, mk - 1, causal=True)
