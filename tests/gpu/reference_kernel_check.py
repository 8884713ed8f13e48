"""Correctness check of the reference (mma.sync) forward and backward kernels through the C API.

Calls libflashback.so directly with ctypes (the struct mirror in python/flashback/_lib.py, loaded
on its own so nothing else of the package is involved) and compares against PyTorch:

    error(kernel vs fp32 reference) <= 2 * error(bf16 reference vs fp32 reference) + 1e-5

for O, dQ, dK, dV (max abs error), the FA2/FA3 test convention. Outputs, LSE and the workspace
are filled with NaN before each call, so anything left unwritten fails. LSE must match the fp32
reference (+inf exactly where a causal row sees no key). The backward runs twice and must be
bitwise identical (the reference backward is deterministic by construction).

    PYTHONPATH=python python3 tests/gpu/reference_kernel_check.py [--quick|--tiny] [--bench]

Library: $FLASHBACK_LIBRARY, else build/libflashback.so. Exit status 1 if any case fails.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import itertools
import math
import os
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_lib():
    spec = importlib.util.spec_from_file_location("flashback_lib", ROOT / "python/flashback/_lib.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, mod.load()


LIBMOD, LIB = load_lib()


def strides_of(t: torch.Tensor):
    """(batch, row, head) element strides of a (batch, seqlen, heads, headdim) tensor."""
    assert t.stride(3) == 1
    return LIBMOD.Strides(t.stride(0), t.stride(1), t.stride(2))


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def call_fwd(q, k, v, out, lse, causal, scale):
    b, sq, h, d = q.shape
    p = LIBMOD.FwdParams()
    p.q, p.k, p.v, p.out, p.lse = ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse)
    p.q_strides, p.k_strides, p.v_strides, p.out_strides = map(strides_of, (q, k, v, out))
    p.batch, p.seqlen_q, p.seqlen_k, p.nheads, p.nheads_k, p.headdim = b, sq, k.shape[1], h, k.shape[2], d
    p.softmax_scale, p.causal, p.dtype = scale, int(causal), LIBMOD.DTYPE_BF16
    p.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    LIBMOD.check(LIB, LIB.flashback_attention_forward(ctypes.byref(p)), "forward")


def call_bwd(dout, q, k, v, out, lse, dq, dk, dv, causal, scale):
    b, sq, h, d = q.shape
    p = LIBMOD.BwdParams()
    for name, t in dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse, dq=dq, dk=dk, dv=dv).items():
        setattr(p, name, ptr(t))
    for name, t in dict(q=q, k=k, v=v, out=out, dout=dout, dq=dq, dk=dk, dv=dv).items():
        setattr(p, name + "_strides", strides_of(t))
    p.batch, p.seqlen_q, p.seqlen_k, p.nheads, p.nheads_k, p.headdim = b, sq, k.shape[1], h, k.shape[2], d
    p.softmax_scale, p.causal, p.deterministic, p.dtype = scale, int(causal), 1, LIBMOD.DTYPE_BF16
    p.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    nbytes = LIB.flashback_bwd_workspace_size(ctypes.byref(p))
    assert nbytes > 0, LIBMOD.last_error(LIB)
    ws = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device=q.device)
    p.workspace, p.workspace_bytes = ptr(ws), nbytes
    LIBMOD.check(LIB, LIB.flashback_attention_backward(ctypes.byref(p)), "backward")


def reference(q, k, v, dout, causal, scale, dtype):
    """O, LSE, dQ, dK, dV computed by PyTorch in `dtype` (autograd for the gradients)."""
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    sq, sk, h, hk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    qh = q.transpose(1, 2)
    kh = k.repeat_interleave(h // hk, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(h // hk, dim=2).transpose(1, 2)
    s = (qh @ kh.transpose(-1, -2)) * scale
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    allowed = (j <= i + sk - sq) if causal else torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    has_key = allowed.any(-1)[:, None]
    # Rows that see no key: softmax over a row of zeros, then zeroed (no NaN, zero gradient).
    s = torch.where(has_key, s.masked_fill(~allowed, float("-inf")), torch.zeros_like(s))
    prob = torch.softmax(s, dim=-1) * has_key
    o = prob @ vh
    lse = torch.where(has_key[:, 0], torch.logsumexp(s.float(), dim=-1), float("inf"))
    o.backward(dout.to(dtype).transpose(1, 2))
    return o.transpose(1, 2).detach(), lse.detach(), q.grad, k.grad, v.grad


def make_qkv(b, sq, sk, h, hk, d, strided):
    dev = "cuda"
    if strided:  # q, k, v as views into packed buffers: row and head strides are not dense
        qkv = torch.randn(b, sq, 3, h, d, device=dev, dtype=torch.bfloat16)
        q = qkv[:, :, 0]
        kv = torch.randn(b, sk, 2, hk, d + 8, device=dev, dtype=torch.bfloat16)
        k, v = kv[:, :, 0, :, :d], kv[:, :, 1, :, :d]
    else:
        q = torch.randn(b, sq, h, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, sk, hk, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, sk, hk, d, device=dev, dtype=torch.bfloat16)
    return q, k, v


def nan_like(t, dtype=None):
    return torch.full(t.shape, float("nan"), dtype=dtype or t.dtype, device=t.device)


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


def check_case(b, sq, sk, h, hk, d, causal, strided=False):
    torch.manual_seed(hash((b, sq, sk, h, hk, d, causal, strided)) % 2**31)
    scale = 1.0 / math.sqrt(d)
    q, k, v = make_qkv(b, sq, sk, h, hk, d, strided)
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)

    out = nan_like(q)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    call_fwd(q, k, v, out, lse, causal, scale)
    grads = []
    for _ in range(2):
        dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
        call_bwd(dout, q, k, v, out, lse, dq, dk, dv, causal, scale)
        grads.append((dq, dk, dv))
    torch.cuda.synchronize()

    ref32 = reference(q, k, v, dout, causal, scale, torch.float32)
    ref16 = reference(q, k, v, dout, causal, scale, torch.bfloat16)
    names = ("out", "dq", "dk", "dv")
    ours = (out,) + grads[0]
    problems, report = [], []
    for name, x, r32, r16 in zip(names, ours, ref32[:1] + ref32[2:], ref16[:1] + ref16[2:]):
        if torch.isnan(x).any():
            problems.append(f"{name} has NaN ({torch.isnan(x).sum().item()} elements)")
            continue
        err, err16 = max_err(x, r32), max_err(r16, r32)
        bound = 2 * err16 + 1e-5
        report.append(f"{name} {err:.2e}/{bound:.2e}")
        if err > bound:
            problems.append(f"{name} error {err:.3e} > bound {bound:.3e}")
    inf_ours, inf_ref = torch.isinf(lse), torch.isinf(ref32[1])
    if torch.isnan(lse).any() or not torch.equal(inf_ours, inf_ref):
        problems.append("lse NaN or +inf pattern differs")
    else:
        finite = ~inf_ref
        lse_err = max_err(lse[finite], ref32[1][finite]) if finite.any() else 0.0
        report.append(f"lse {lse_err:.1e}")
        if lse_err > 1e-3:
            problems.append(f"lse error {lse_err:.3e}")
    if not all(torch.equal(a, c) for a, c in zip(grads[0], grads[1])):
        problems.append("backward not bitwise reproducible")
    return problems, report


def package_smoke():
    """The same kernels through flashback.attention_forward/backward, when the package imports."""
    try:
        import flashback
    except Exception as e:  # noqa: BLE001 - report, do not fail the kernel check
        return f"package import failed: {type(e).__name__}: {e}"
    try:
        b, s, h, hk, d = 2, 257, 8, 2, 128
        q, k, v = make_qkv(b, s, s, h, hk, d, False)
        dout = torch.randn_like(q)
        out, lse = flashback.attention_forward(q, k, v, causal=True)
        dq, dk, dv = flashback.attention_backward(dout, q, k, v, out, lse, causal=True)
        out2, lse2 = nan_like(q), torch.full((b, h, s), float("nan"), device="cuda")
        call_fwd(q, k, v, out2, lse2, True, 1 / math.sqrt(d))
        dq2, dk2, dv2 = nan_like(q), nan_like(k), nan_like(v)
        call_bwd(dout, q, k, v, out2, lse2, dq2, dk2, dv2, True, 1 / math.sqrt(d))
        same = all(torch.equal(a, c) for a, c in zip((out, lse, dq, dk, dv), (out2, lse2, dq2, dk2, dv2)))
        return f"package path {'matches' if same else 'DIFFERS from'} the C API bitwise"
    except Exception as e:  # noqa: BLE001
        return f"package path failed: {type(e).__name__}: {e}"


def bench():
    """Rough TFLOP/s (forward 4*b*s^2*h*d, backward 2.5x, halved when causal)."""
    for d, causal in itertools.product((64, 128, 256), (False, True)):
        b, s, h = 4, 4096, 8
        q, k, v = make_qkv(b, s, s, h, h, d, False)
        dout = torch.randn_like(q)
        out, lse = nan_like(q), torch.empty(b, h, s, device="cuda")
        dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
        scale = 1 / math.sqrt(d)
        fwd = lambda: call_fwd(q, k, v, out, lse, causal, scale)  # noqa: E731
        bwd = lambda: call_bwd(dout, q, k, v, out, lse, dq, dk, dv, causal, scale)  # noqa: E731
        flops = 4 * b * s * s * h * d * (0.5 if causal else 1.0)
        res = []
        for name, fn, f in (("fwd", fwd, flops), ("bwd", bwd, 2.5 * flops)):
            fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(10):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            t = sorted(times)[len(times) // 2]
            res.append(f"{name} {t * 1e3:.2f} ms {f / t / 1e12:.0f} TFLOP/s")
        print(f"bench hdim {d} causal {int(causal)} (b {b}, s {s}, h {h}): " + ", ".join(res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--bench", action="store_true", help="also print rough TFLOP/s")
    ap.add_argument("--tiny", action="store_true",
                    help="a dozen small shapes (for running under compute-sanitizer)")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "lib", LIB._name)

    seqs = [(1, 1), (17, 17), (113, 113), (1000, 1000), (1, 17), (17, 113), (113, 1000),
            (1000, 113), (113, 17)]
    heads = [(8, 2), (8, 1), (4, 4)]
    cases = [(2, sq, sk, h, hk, d, causal, False)
             for d, (sq, sk), (h, hk), causal in itertools.product((64, 128, 256), seqs, heads, (False, True))]
    cases += [(2, sq, sk, 4, 2, d, causal, True) for d in (64, 128, 256)
              for (sq, sk) in ((113, 113), (1000, 113)) for causal in (False, True)]
    if args.quick:
        cases = [c for c in cases if c[1] in (17, 113) and c[3:5] == (8, 2)]
    if args.tiny:
        cases = [(1, sq, sk, 2, 1, d, causal, False) for d in (64, 128, 256)
                 for (sq, sk) in ((17, 113), (113, 17)) for causal in (False, True)]
    failures = 0
    t0 = time.time()
    for case in cases:
        problems, report = check_case(*case)
        b, sq, sk, h, hk, d, causal, strided = case
        tag = f"d={d:3d} b={b} sq={sq:4d} sk={sk:4d} h={h}/{hk} causal={int(causal)}{' strided' if strided else ''}"
        status = "FAIL" if problems else "ok  "
        print(f"{status} {tag}: " + "  ".join(report) + ("  <- " + "; ".join(problems) if problems else ""))
        failures += bool(problems)
    print(f"{len(cases) - failures}/{len(cases)} cases passed in {time.time() - t0:.0f} s")
    if not args.tiny:
        print(package_smoke())
    if args.bench:
        bench()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
