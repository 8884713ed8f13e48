"""Variable-length and SDPA-route benchmark (head dim 256, bf16, nheads 8).

1. varlen: 16384 tokens as 8 sequences of random lengths, flashback.attention_varlen forward
   and forward + backward, against the same sequences padded to the longest one and run as a
   dense batch (what a model without varlen does). TFLOP/s count only the real tokens (causal:
   half of each sequence's square).
2. SDPA route: F.scaled_dot_product_attention with the flashback provider active against
   flashback.attention called directly, forward + backward, (2, 8192) causal: the provider's
   overhead in percent.

    python benchmarks/bench_varlen.py [--iters 30] [--out DIR]

Results are kept under benchmarks/results/varlen/ (their own schema: the sweep files of
bench_attention.py sit in benchmarks/results/).
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import flashback  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention  # noqa: E402

H, D = 8, 256


def time_ms(fn, iters):
    """Median of two runs of bench_attention's per-call CUDA-event timing."""
    return statistics.median(bench_attention.time_ms(fn, iters, warmup=5, repeats=2))


def lengths(total, n, gen):
    cuts = sorted(torch.randperm(total - 1, generator=gen)[: n - 1].add(1).tolist())
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


def varlen_rows(iters, gen):
    lens = lengths(16384, 8, gen)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    mx = max(lens)
    rows = []
    for causal in (True, False):
        flops = sum(4 * n * n * H * D // (2 if causal else 1) for n in lens)
        q, k, v, do = (torch.randn(16384, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]
        fwd = lambda: flashback.attention_varlen(*leaves, cu, cu, mx, mx, causal=causal)
        train = lambda: torch.autograd.grad(fwd(), leaves, do)
        # The same sequences padded to the longest and run as a dense batch.
        pad = [torch.zeros(8, mx, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        for i, (a, n) in enumerate(zip(cu.tolist(), lens)):
            for p, t in zip(pad, (q, k, v, do)):
                p[i, :n] = t.detach()[a:a + n]
        pl = [t.requires_grad_() for t in pad[:3]]
        dfwd = lambda: flashback.attention(*pl, causal=causal)
        dtrain = lambda: torch.autograd.grad(dfwd(), pl, pad[3])
        for name, fn, mult in (("varlen fwd", fwd, 1.0), ("varlen train", train, 3.5),
                               ("padded fwd", dfwd, 1.0), ("padded train", dtrain, 3.5)):
            ms = time_ms(fn, iters)
            rows.append(dict(row=name, causal=causal, lengths=lens, ms=ms, tflops=mult * flops / ms / 1e9))
    return rows


def sdpa_route(iters):
    b, s = 2, 8192
    q, k, v, do = (torch.randn(b, s, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    direct = lambda: torch.autograd.grad(flashback.attention(*leaves, causal=True), leaves, do)
    t_leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    do_t = do.transpose(1, 2)
    flash = [torch.nn.attention.SDPBackend.FLASH_ATTENTION]

    def via_sdpa():
        with torch.nn.attention.sdpa_kernel(flash):
            out = F.scaled_dot_product_attention(*t_leaves, is_causal=True)
        return torch.autograd.grad(out, t_leaves, do_t)

    torch.nn.attention.activate_flash_attention_impl("flashback")
    try:
        ms_sdpa = time_ms(via_sdpa, iters)
        assert flashback.last_forward_path() == "sm90" and flashback.last_backward_path() == "sm90"
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    ms_direct = time_ms(direct, iters)
    return dict(row="sdpa route", shape=[b, s], ms_direct=ms_direct, ms_sdpa=ms_sdpa,
                overhead_pct=100.0 * (ms_sdpa / ms_direct - 1.0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows = varlen_rows(a.iters, gen)
    route = sdpa_route(a.iters)
    print(f"{torch.cuda.get_device_name()}, lengths {rows[0]['lengths']}")
    for r in rows:
        print(f"{r['row']:13} {'causal' if r['causal'] else 'full  '} {r['ms']:7.3f} ms {r['tflops']:6.1f} TFLOP/s")
    print(f"sdpa route (2 x 8192 causal, fwd+bwd): direct {route['ms_direct']:.3f} ms, via SDPA "
          f"{route['ms_sdpa']:.3f} ms, overhead {route['overhead_pct']:+.1f}%")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "varlen.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), varlen=rows, sdpa_route=route), f, indent=1)


if __name__ == "__main__":
    main()
