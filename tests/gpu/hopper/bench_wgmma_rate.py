#!/usr/bin/env python3
"""SS wgmma issue rate per SM at the d = 256 backward's S / dP shapes (wgmma_rate.cu): m64nNk16,
K = 256 per tile, one or two warpgroups per CTA, split by keys (one A, each warpgroup N rows of B)
or by role (each warpgroup its own A and B). Prints FLOP per clock per SM (the median CTA of the
median run) and its share of the data sheet's dense bf16 rate (989.4 TFLOP/s at 1830 MHz over
132 SMs: 4096 FLOP per clock per SM). One CTA alone, then one per SM.

The question it answers (docs/perf-log.md, "S and dP at N = 40: the shared-memory bound"): do two
warpgroups at N = 40 on one A (how S and dP run today) reach the rate of two at N = 80 on their
own operands (S and dP split by role)? Shared-memory operand bytes predict 77% against 100%.

Usage: python tests/gpu/hopper/bench_wgmma_rate.py [--iters 2000 --repeats 5]
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hopper_lib  # noqa: E402
from hopper_lib import ptr  # noqa: E402

PEAK_PER_SM_CLOCK = 4096.0


def rate(lib, n, wgs, roles, iters, ctas):
    """FLOP per clock per SM of the median CTA."""
    cycles = torch.zeros(ctas, dtype=torch.int64, device="cuda")
    sink = torch.empty(ctas * 128 * wgs, dtype=torch.float32, device="cuda")
    hopper_lib.check(lib, lib.fbh_wgmma_rate(n, wgs, roles, iters, ctas, ptr(cycles), ptr(sink)), "fbh_wgmma_rate")
    torch.cuda.synchronize()
    if not torch.isfinite(sink).all():
        sys.exit(f"non-finite accumulators: n {n} wgs {wgs} roles {roles}")
    flop = wgs * iters * 16 * 2 * 64 * n * 16
    return flop / statistics.median(cycles.tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shapes", default="40,64,80,128")
    a = ap.parse_args()
    lib = hopper_lib.load()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name()} ({sms} SMs)")
    print(f"{'ctas':>5} {'N':>4} {'wgs':>3} {'split':>6} {'FLOP/clk/SM':>12} {'of 4096':>8}")
    for ctas in (1, sms):
        for n in (int(v) for v in a.shapes.split(",")):
            for wgs, roles in ((1, 0), (2, 0), (2, 1)):
                runs = [rate(lib, n, wgs, roles, a.iters, ctas) for _ in range(a.repeats)]
                r = statistics.median(runs)
                name = "-" if wgs == 1 else ("role" if roles else "keys")
                print(f"{ctas:>5} {n:>4} {wgs:>3} {name:>6} {r:>12.0f} {r / PEAK_PER_SM_CLOCK:>8.1%}")


if __name__ == "__main__":
    main()
