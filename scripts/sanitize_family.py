#!/usr/bin/env python3
"""One small call per member of the Hopper kernel family, for compute-sanitizer.

  compute-sanitizer --tool memcheck  python3 scripts/sanitize_family.py
  compute-sanitizer --tool racecheck python3 scripts/sanitize_family.py --headdims 64,128 --dtypes bf16

Each (head dim, dtype): forward, then the backward in both modes, causal, GQA, seqlen 200 (not
a multiple of any tile); then forwards with more tiles than SMs at seqlen 300, causal and not,
so that the persistent grid's CTAs walk several tiles (the Q, K/V rings carried from tile to
tile); then forwards of 300 and of 256 queries (3 and 2 Q blocks of 128) against 5000 keys, causal and not, which run one CTA per tile
where a head dim's grid row ends its persistent grid or counter below 5000 keys (d = 64 / 128
non-causal, d = 128 on its own config, kFwdSm90Hdim128FullLong; d = 256 both, whose configs
store O by TMA). At d = 256 the backward also runs on the 2-CTA pair (1040 query rows per kv
head), causal and not, both modes, and non-causal with its grid's last wave split by query range
(split_last_wave). --forward-only leaves out the backward (racecheck is slow there). Asserts that the Hopper kernels ran and that nothing is NaN; the sanitizer reports memory
errors and shared-memory races. Numbers are checked by the GPU tests.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import torch  # noqa: E402

import flashback  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--headdims", default="64,128,192,256")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--forward-only", action="store_true")
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(7)
    for d in (int(x) for x in a.headdims.split(",")):
        for name in a.dtypes.split(","):
            dtype = torch.float16 if name == "fp16" else torch.bfloat16
            q, dout = (torch.randn(1, 200, 4, d, generator=g, device="cuda").to(dtype) for _ in range(2))
            k, v = (torch.randn(1, 200, 2, d, generator=g, device="cuda").to(dtype) for _ in range(2))
            out, lse = flashback.attention_forward(q, k, v, causal=True)
            assert flashback.last_forward_path() == "sm90", flashback.last_forward_path()
            for det in () if a.forward_only else (False, True):
                grads = flashback.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=det)
                assert flashback.last_backward_path() == "sm90", flashback.last_backward_path()
                assert not any(torch.isnan(t).any() for t in (out, *grads)), (d, name, det)
            if d == 256 and not a.forward_only:
                # The 2-CTA pair serves from kBwdSm90PairMinRows (1024) query rows per kv head:
                # 520 queries x 2 q heads per kv head, not a multiple of its 64-row steps.
                qp, dop = (torch.randn(1, 520, 4, d, generator=g, device="cuda").to(dtype) for _ in range(2))
                kp, vp = (torch.randn(1, 520, 2, d, generator=g, device="cuda").to(dtype) for _ in range(2))
                for causal in (True, False):
                    outp, lsep = flashback.attention_forward(qp, kp, vp, causal=causal)
                    for det in (False, True):
                        grads = flashback.attention_backward(dop, qp, kp, vp, outp, lsep, causal=causal,
                                                             deterministic=det)
                        assert flashback.last_backward_kernel().startswith("pair"), flashback.last_backward_kernel()
                        assert not any(torch.isnan(t).any() for t in grads), (d, name, causal, det, "pair")
                # The non-causal split last wave (split_last_wave): 256 queries x 16 q heads per
                # kv head (64 steps), 400 keys (3 units, the last with a ghost upper CTA), so the
                # whole grid is one partial wave of two parts per unit.
                qs, dos = (torch.randn(1, 256, 16, d, generator=g, device="cuda").to(dtype) for _ in range(2))
                ks, vs = (torch.randn(1, 400, 1, d, generator=g, device="cuda").to(dtype) for _ in range(2))
                outs, lses = flashback.attention_forward(qs, ks, vs)
                grads = flashback.attention_backward(dos, qs, ks, vs, outs, lses)
                split = os.environ.get("FLASHBACK_BWD_SPLIT") != "0"
                want = "pair, last wave split" if split else "pair"
                assert flashback.last_backward_kernel() == want, flashback.last_backward_kernel()
                assert not any(torch.isnan(t).any() for t in grads), (d, name, "split")
            # 3 Q blocks of 128 (2 of 192 at d = 64) x 96 heads: more tiles than SMs.
            q, k, v = (torch.randn(1, 300, 96, d, generator=g, device="cuda").to(dtype) for _ in range(3))
            for causal in (True, False):
                out, _ = flashback.attention_forward(q, k, v, causal=causal)
                assert flashback.last_forward_path() == "sm90", flashback.last_forward_path()
                assert not torch.isnan(out).any(), (d, name, causal)
            for sq in (300, 256):  # 3 Q blocks of 128, then 2 (a partial last one and none)
                q = torch.randn(1, sq, 2, d, generator=g, device="cuda").to(dtype)
                k, v = (torch.randn(1, 5000, 2, d, generator=g, device="cuda").to(dtype) for _ in range(2))
                for causal in (True, False):
                    out, _ = flashback.attention_forward(q, k, v, causal=causal)
                    assert flashback.last_forward_path() == "sm90", flashback.last_forward_path()
                    assert not torch.isnan(out).any(), (d, name, causal, "long keys", sq)
            torch.cuda.synchronize()
            print(f"d={d} {name}: ok", flush=True)


if __name__ == "__main__":
    main()
