#!/usr/bin/env python3
"""The deterministic backward's gradients on a few fixed shapes, saved or compared bitwise, for
checking that a candidate library sums every element in the same order as production (the
same inputs in two processes, one library each):

    FLASHBACK_LIBRARY=build/libflashback.so python3 scripts/det_grads.py --save logs/det-a.pt
    FLASHBACK_LIBRARY=build-X/libflashback.so python3 scripts/det_grads.py --compare logs/det-a.pt

Inputs come from a fixed seed on the GPU (the same in both runs). --headdims limits the shapes
(a candidate library built for some head dims only). Exit status 1 when any gradient differs.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import torch  # noqa: E402

import flashback  # noqa: E402

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal)
SHAPES = [
    (2, 1000, 1000, 4, 2, 64, True),
    (1, 2048, 2048, 8, 8, 64, False),
    (2, 777, 1234, 4, 4, 128, True),
    (1, 4096, 4096, 8, 2, 128, True),
    (2, 1500, 1500, 4, 4, 128, False),
    (1, 2048, 2048, 4, 4, 192, True),
    (1, 4096, 4096, 4, 4, 256, True),
]


def grads(shape, seed):
    b, sq, sk, h, hk, d, causal = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, dout = (torch.randn(b, sq, h, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, sk, hk, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    out, lse = flashback.attention_forward(q, k, v, causal=causal)
    dq, dk, dv = flashback.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
    return {"dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu(), "path": flashback.last_backward_path()}


def main():
    ap = argparse.ArgumentParser()
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--save")
    group.add_argument("--compare")
    ap.add_argument("--headdims", default="64,128,192,256")
    a = ap.parse_args()
    dims = {int(x) for x in a.headdims.split(",")}
    results = {str(s): grads(s, seed) for seed, s in enumerate(SHAPES) if s[5] in dims}
    if a.save:
        torch.save(results, a.save)
        for name, r in results.items():
            print(f"{name}: saved ({r['path']})")
        return 0
    ref = torch.load(a.compare)
    bad = 0
    for name, r in results.items():
        if name not in ref:
            print(f"{name}: not in {a.compare}")
            bad += 1
            continue
        diffs = {k: int((r[k] != ref[name][k]).sum()) for k in ("dq", "dk", "dv")}
        same = all(v == 0 for v in diffs.values())
        bad += not same
        print(f"{name}: {'bitwise equal' if same else 'DIFFERS ' + str(diffs)} ({ref[name]['path']} -> {r['path']})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
