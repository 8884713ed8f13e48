#!/usr/bin/env python3
"""Run-to-run reproducibility of the backward: the same inputs through attention_backward
several times; prints the largest run-to-run difference of dQ, dK and dV and the path taken.

On the Hopper path (deterministic=False) dK and dV are summed in registers in a fixed order and
must be bitwise identical; dQ is summed with fp32 atomics across K/V blocks, so its last bits may
differ. With --deterministic every gradient must be identical.

    python3 scripts/bwd_repro.py [--batch 2 --seqlen 8192 --causal --runs 5 --deterministic]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import torch  # noqa: E402

import flashback  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--nheads", type=int, default=8)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    shape = (a.batch, a.seqlen, a.nheads, 256)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = flashback.attention_forward(q, k, v, causal=a.causal)
    runs = []
    for _ in range(a.runs):
        runs.append(flashback.attention_backward(dout, q, k, v, out, lse, causal=a.causal,
                                                 deterministic=a.deterministic))
    torch.cuda.synchronize()
    path = flashback.last_backward_path()
    report = []
    for i, name in enumerate(("dq", "dk", "dv")):
        ref = runs[0][i].float()
        diff = max((r[i].float() - ref).abs().max().item() for r in runs[1:])
        same = all(torch.equal(r[i], runs[0][i]) for r in runs[1:])
        report.append(f"{name}: max run-to-run |diff| {diff:.3e} ({'bitwise identical' if same else 'differs'}; "
                      f"max |{name}| {ref.abs().max().item():.3e})")
    print(f"batch {a.batch} seqlen {a.seqlen} nheads {a.nheads} causal {a.causal} deterministic "
          f"{a.deterministic}, {a.runs} runs, path {path}")
    print("\n".join(report))


if __name__ == "__main__":
    main()
