#!/usr/bin/env python3
"""One forward or backward call to profile: random inputs, one warm-up call, then the call to
look at.

    ncu --set full -k regex:bwd_sm90_kernel -s 1 -c 1 --clock-control none \\
        python3 scripts/profile_attention.py --batch 2 --seqlen 8192 --causal
    ncu --set full -k regex:fwd_sm90_kernel -s 1 -c 1 --clock-control none \\
        python3 scripts/profile_attention.py --forward --batch 2 --seqlen 8192 --causal

(-s 1 skips the warm-up call's kernel.) Uses the source package in python/ and the library that
flashback finds ($FLASHBACK_LIBRARY or build/).
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
    ap.add_argument("--headdim", type=int, default=256)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--forward", action="store_true", help="profile the forward (default: backward)")
    a = ap.parse_args()
    shape = (a.batch, a.seqlen, a.nheads, a.headdim)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = flashback.attention_forward(q, k, v, causal=a.causal)
    if a.forward:
        flashback.attention_forward(q, k, v, causal=a.causal, out=out, lse=lse)
        torch.cuda.synchronize()
        return
    for _ in range(2):
        flashback.attention_backward(dout, q, k, v, out, lse, causal=a.causal)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
