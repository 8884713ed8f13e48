#!/usr/bin/env python3
"""Where one backward (or forward) call's GPU time goes: each kernel and memset it launches, by
name, with its GPU time, and the span from the first one's start to the last one's end (which
adds the gaps between them), from torch.profiler over a few calls after warm-up.

    python3 scripts/call_breakdown.py --headdim 256 --seqlen 4096 --causal
    python3 scripts/call_breakdown.py --headdim 256 --seqlen 512 --impl fa3

Shape: nheads = 2048 / headdim and batch = 16384 / seqlen (the benchmark's sweep), bf16. Says how
much of a call the per-call work around the main kernel costs (dQaccum zeroing, the
preprocess's D = rowsum(dO * O), the postprocess's dQ conversion): the share a fused
pre/postprocess could take back, which grows as the sequences get shorter. --impl fa3 profiles
FlashAttention-3's call of the same shape (flash_attn_interface importable).
"""
import argparse
import os
import sys
from collections import OrderedDict


def short_name(name):
    """A kernel's name without its template arguments and namespaces, for a table. A generic
    launcher template (CUTLASS's `device_kernel<Op>`, which names all of FA3's kernels) is
    named by its first template argument instead."""
    if name.startswith("Memset") or name.startswith("Memcpy"):
        return name
    clean = name.replace("(anonymous namespace)::", "")
    base = clean.split("<", 1)[0].split("(", 1)[0]
    base = base.replace("void ", "").strip().rsplit("::", 1)[-1]
    if base == "device_kernel" and "<" in clean:
        arg = clean.split("<", 1)[1]
        for stop in "<,>(":
            arg = arg.split(stop, 1)[0]
        arg = arg.strip().rsplit("::", 1)[-1]
        if arg:
            return arg
    return base or name


def breakdown(events, calls):
    """events: (name, start_us, end_us) of the GPU activities of `calls` identical calls, in any
    order. Returns (rows, span_us): rows of (name, count per call, GPU us per call), in the
    order of first appearance, and the mean span per call (the first start to the last end of
    the whole run, divided by calls; the calls are queued back to back)."""
    events = sorted(events, key=lambda e: e[1])
    per = OrderedDict()
    for name, start, end in events:
        n, us = per.get(short_name(name), (0, 0.0))
        per[short_name(name)] = (n + 1, us + (end - start))
    rows = [(k, n / calls, us / calls) for k, (n, us) in per.items()]
    span = (max(e[2] for e in events) - events[0][1]) / calls if events else 0.0
    return rows, span


def format_table(rows, span):
    total = sum(us for _, _, us in rows)
    lines = [f"{'kernel':48} {'per call':>8} {'GPU us':>9} {'share':>6}"]
    for name, n, us in rows:
        lines.append(f"{name[:48]:48} {n:8.2f} {us:9.1f} {us / total:6.1%}")
    lines.append(f"{'sum of GPU times':48} {'':8} {total:9.1f}")
    lines.append(f"{'span, first start to last end':48} {'':8} {span:9.1f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--headdim", type=int, default=256)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--forward", action="store_true", help="the forward call (default: backward)")
    ap.add_argument("--deterministic", action="store_true", help="flashback's deterministic backward")
    ap.add_argument("--impl", choices=("flashback", "fa3"), default="flashback")
    ap.add_argument("--calls", type=int, default=10)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import torch
    from torch.autograd import DeviceType

    d, s = a.headdim, a.seqlen
    b, h = 16384 // s, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, s, h, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4))
    if a.impl == "fa3":
        if a.deterministic:
            sys.exit("--deterministic: flashback's mode only (FA3's deterministic backward is not wired here)")
        import flash_attn_interface as fa3
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]

        def fwd():
            return fa3.flash_attn_func(*leaves, causal=a.causal)
        out = fwd()
        out = out[0] if isinstance(out, tuple) else out

        def call():
            if a.forward:
                fwd()
            else:
                torch.autograd.grad(out, leaves, do, retain_graph=True)
    else:
        import flashback
        out, lse = flashback.attention_forward(q, k, v, causal=a.causal)
        grads = [torch.empty_like(t) for t in (q, k, v)]

        def call():
            if a.forward:
                flashback.attention_forward(q, k, v, causal=a.causal, out=out, lse=lse)
            else:
                flashback.attention_backward(do, q, k, v, out, lse, causal=a.causal,
                                             deterministic=a.deterministic, dq=grads[0], dk=grads[1],
                                             dv=grads[2])
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(a.calls):
            call()
        torch.cuda.synchronize()
    events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
              if e.device_type == DeviceType.CUDA]
    rows, span = breakdown(events, a.calls)
    what = "forward" if a.forward else ("deterministic backward" if a.deterministic else "backward")
    print(f"{a.impl} {what}, d {d}, {b} x {s}, {h} heads, {'causal' if a.causal else 'non-causal'}, "
          f"bf16; {a.calls} calls")
    print(format_table(rows, span))


if __name__ == "__main__":
    main()
