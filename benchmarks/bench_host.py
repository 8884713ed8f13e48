#!/usr/bin/env python3
"""Host time per call: how long the Python front and the launches take on the CPU, per forward,
backward and training step, for flashback, FlashAttention-3 (when flash_attn_interface is
importable) and PyTorch SDPA's flash backend.

The shape is tiny by default (one head of 128 rows; --batch, --seqlen, --nheads change it), so
the GPU finishes each call long before the host has issued the next: the wall time of many
back-to-back calls is the host's. (The d = 256 backward runs its 2-CTA pair from 1024 rows:
--seqlen 1024 with one head still leaves the GPU idle between calls.) At short sequences
this is what per-call event timing measures once a kernel is shorter than it (see
bench_attention.py --queue-ahead). Numbers vary between machines by tens of percent: compare
implementations within one run.

--issue times something else: at a real shape (--batch, --seqlen, --nheads), the host time until
each call returns, with the GPU idle before the call (a synchronize between calls, outside the
timed part), median of --calls. That is the time by which a call's first kernel trails the
event recorded before it under per-call timing, and it includes what the C side asks the driver
on every call (the pair backward's cluster fit, the forward's tile counter).

    python3 benchmarks/bench_host.py [--calls 2000] [--headdim 128] [--seqlen 1024]
    python3 benchmarks/bench_host.py --issue --headdim 256 --batch 16 --seqlen 1024 [--nheads 8]
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def per_call_us(fn, calls):
    import torch
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def issue_us(fn, calls):
    import statistics

    import torch
    for _ in range(10):
        fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--issue", action="store_true", help="host time to issue one call at a real shape")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqlen", type=int, default=128)
    ap.add_argument("--nheads", type=int, default=1)
    a = ap.parse_args()
    if a.issue and a.calls == 2000:
        a.calls = 200  # each call waits for the GPU: a real shape takes milliseconds
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashback

    shape = (a.batch, a.seqlen, a.nheads, a.headdim)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def sdpa(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)

    impls = {"flashback": lambda q, k, v, causal: flashback.attention(q, k, v, causal=causal), "sdpa_flash": sdpa}
    try:
        from flash_attn_interface import flash_attn_func

        def fa3(q, k, v, causal):
            res = flash_attn_func(q, k, v, causal=causal)
            return res[0] if isinstance(res, tuple) else res
        impls["fa3"] = fa3
    except Exception:  # noqa: BLE001 - FA3 is optional
        pass

    timer = issue_us if a.issue else per_call_us
    what = "host us to issue one call (median)" if a.issue else "host us per call"
    what += f", b{a.batch} s{a.seqlen} h{a.nheads}"
    print(f"{what}, head dim {a.headdim}, {a.calls} calls ({torch.cuda.get_device_name()}, "
          f"torch {torch.__version__})")
    print(f"{'impl':12} {'fwd (autograd)':>15} {'fwd (no grad)':>14} {'bwd':>8} {'train':>8}")
    for name, f in impls.items():
        fwd = timer(lambda: f(*leaves, True), a.calls)
        with torch.no_grad():
            nograd = timer(lambda: f(q, k, v, True), a.calls)
        out = f(*leaves, True)
        bwd = timer(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True), a.calls)
        train = timer(lambda: torch.autograd.grad(f(*leaves, True), leaves, dout), a.calls)
        print(f"{name:12} {fwd:15.1f} {nograd:14.1f} {bwd:8.1f} {train:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
