#!/usr/bin/env python3
"""Benchmark of the Hopper GEMM example (gemm.cu) against torch.matmul, in the same run.

  C = A @ B.T   A: M x K, B: N x K, bf16 in, bf16 out, fp32 accumulation.

For every variant: check against an fp32 PyTorch reference (random inputs, output poisoned with
NaN first), then time it. Timing: CUDA events around each call, `--warmup` untimed calls, median
of `--iters` timed calls; TFLOP/s = 2 M N K / time. Variants and torch are timed in alternation
over `--repeats` rounds so clock drift hits both. Prints a table last.

Usage: python tests/gpu/hopper/bench_gemm.py [--m 8192 --n 8192 --k 8192 --iters 100]
"""
import argparse
import datetime
import statistics
import sys
from ctypes import c_void_p
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hopper_lib  # noqa: E402


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=8192)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    reason = hopper_lib.unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    lib = hopper_lib.load()
    m, n, k = args.m, args.n, args.k
    flops = 2.0 * m * n * k
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16()
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    stream = c_void_p(torch.cuda.current_stream().cuda_stream)
    tiles = (m // 128) * (n // 256)

    variants = {  # name -> (cluster_m, num_ctas)
        "ours persistent": (1, 0),
        "ours persistent cluster2 (B multicast)": (2, 0),
        "ours one CTA per tile": (1, tiles),
        "ours per tile cluster2": (2, tiles),
    }

    def ours(cluster_m, num_ctas):
        def run():
            rc = lib.fbh_gemm_bf16_tn(hopper_lib.ptr(a), hopper_lib.ptr(b), hopper_lib.ptr(c), m, n, k,
                                      cluster_m, num_ctas, stream)
            if rc != 0:
                raise RuntimeError(f"fbh_gemm_bf16_tn returned CUDA error {rc}")
        return run

    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"problem: C[{m}x{n}] = A[{m}x{k}] @ B[{n}x{k}]^T, bf16, random normal inputs")

    ref = a.float() @ b.float().t()
    ok = {}
    for name, (cm, nc) in variants.items():
        c.fill_(float("nan"))
        try:
            ours(cm, nc)()
            torch.cuda.synchronize()
        except RuntimeError as e:
            print(f"{name}: FAILED to run: {e}")
            ok[name] = False
            continue
        nan = torch.isnan(c).any().item()
        err = ((c.float() - ref).norm() / ref.norm()).item()
        good = (not nan) and err < 4e-3
        ok[name] = good
        print(f"check {name}: rel. error {err:.2e}, unwritten elements: {nan} -> {'OK' if good else 'WRONG'}")
    t_err = ((torch.matmul(a, b.t()).float() - ref).norm() / ref.norm()).item()
    print(f"check torch.matmul(A, B.T): rel. error {t_err:.2e}")
    del ref

    b_kn = b.t().contiguous()  # torch's other natural layout, for information
    results = {name: [] for name in variants if ok[name]}
    results["torch.matmul(A, B.T)"] = []
    results["torch.matmul(A, B_kn)"] = []
    for r in range(args.repeats):
        results["torch.matmul(A, B.T)"] += timed(lambda: torch.matmul(a, b.t(), out=c), args.warmup, args.iters)
        for name, (cm, nc) in variants.items():
            if ok[name]:
                results[name] += timed(ours(cm, nc), args.warmup, args.iters)
        results["torch.matmul(A, B_kn)"] += timed(lambda: torch.matmul(a, b_kn, out=c), args.warmup, args.iters)

    torch_tf = flops / statistics.median(results["torch.matmul(A, B.T)"]) / 1e12
    print(f"\n{'implementation':42s} {'median ms':>10s} {'TFLOP/s':>9s} {'vs torch':>9s}   (min..max ms)")
    for name, ts in results.items():
        med = statistics.median(ts)
        tf = flops / med / 1e12
        print(f"{name:42s} {med * 1e3:10.3f} {tf:9.1f} {tf / torch_tf:8.1%}   ({min(ts) * 1e3:.3f}..{max(ts) * 1e3:.3f})")
    if not all(ok.values()):
        sys.exit("some variants were WRONG")


if __name__ == "__main__":
    main()
