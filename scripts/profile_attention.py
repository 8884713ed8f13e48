#!/usr/bin/env python3
"""One forward or backward call to profile: random inputs, one warm-up call, then the call to
look at.

    ncu --set full -k regex:bwd_sm90_kernel -s 1 -c 1 --clock-control none \\
        python3 scripts/profile_attention.py --batch 2 --seqlen 8192 --causal
    ncu --set full -k regex:fwd_sm90_kernel -s 1 -c 1 --clock-control none \\
        python3 scripts/profile_attention.py --forward --batch 2 --seqlen 8192 --causal
    ncu --set full --kernel-name-base demangled -k regex:FlashAttnBwdSm90 -s 1 -c 1 \\
        --clock-control none python3 scripts/profile_attention.py --impl fa3 --headdim 128 --nheads 16 --causal
    ncu --set full -k regex:bwd_sm90_kernel -s 1 -c 1 --clock-control none \\
        python3 scripts/profile_attention.py --batch 2 --seqlen 8192 --causal --deterministic

(-s 1 skips the warm-up call's kernel.) Uses the source package in python/ and the library that
flashback finds ($FLASHBACK_LIBRARY or build/). --impl fa3 runs FlashAttention-3 instead (its
flash_attn_interface importable), for a profile of the same shape beside ours.
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
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--impl", choices=("flashback", "fa3"), default="flashback")
    ap.add_argument("--deterministic", action="store_true",
                    help="flashback's deterministic backward (its turn barriers show in the stall table)")
    a = ap.parse_args()
    shape = (a.batch, a.seqlen, a.nheads, a.headdim)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
    if a.impl == "fa3":
        from flash_attn_interface import flash_attn_func

        q, k, v = (x.requires_grad_() for x in (q, k, v))
        for _ in range(2):  # the warm-up call, then the one to look at
            res = flash_attn_func(q, k, v, causal=a.causal)
            out = res[0] if isinstance(res, tuple) else res
            if not a.forward:
                out.backward(dout)
        torch.cuda.synchronize()
        return
    out, lse = flashback.attention_forward(q, k, v, causal=a.causal)
    if a.forward:
        flashback.attention_forward(q, k, v, causal=a.causal, out=out, lse=lse)
        torch.cuda.synchronize()
        return
    for _ in range(2):
        flashback.attention_backward(dout, q, k, v, out, lse, causal=a.causal, deterministic=a.deterministic)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
