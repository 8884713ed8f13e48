#!/usr/bin/env python3
"""Does the card itself run fp16 tensor-core work slower than bf16 at its power cap?

The attention kernels run the same SASS in both dtypes (docs/perf-log.md, "fp16 against bf16:
the code is the same"), yet at the 700 W cap fp16 calls clock lower. This script takes the
kernels out of the question: cuBLAS GEMMs (torch.matmul, M = N = K = --size) on fresh random
normal inputs, bf16 and fp16 in turn (--rounds pairs, --seconds each, alternating which goes
first), each timed by CUDA events over its whole run, with the SM clock and board power sampled
every few GEMMs through NVML (via PyTorch). Prints TFLOP/s, mean clock and power per dtype and
round, then each dtype's median and the fp16 / bf16 ratios; --out writes them as JSON.

  python3 benchmarks/dtype_power.py [--size 8192] [--seconds 6] [--rounds 3] [--out FILE]

If fp16 / bf16 of the GEMMs matches that of the attention kernels (0.93-0.99 in the 12a252a run),
the difference is the card's, not the kernels'.
"""
import argparse
import json
import statistics
import sys


def run_one(torch, dtype, size, seconds, gen):
    """One dtype's run: GEMMs for about `seconds`. Returns (TFLOP/s, mean MHz, mean W)."""
    a = torch.randn(size, size, generator=gen, device="cuda").to(dtype)
    b = torch.randn(size, size, generator=gen, device="cuda").to(dtype)
    c = torch.empty(size, size, device="cuda", dtype=dtype)
    for _ in range(3):  # warm-up: cuBLAS picks its kernel
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    # Calibrate the count for the wanted duration from one timed batch.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.matmul(a, b, out=c)
    end.record()
    end.synchronize()
    per_gemm_s = start.elapsed_time(end) / 1000.0 / 10
    count = max(10, int(seconds / per_gemm_s))
    clocks, powers = [], []
    sample_every = max(1, count // 40)
    start.record()
    for i in range(count):
        torch.matmul(a, b, out=c)
        if i % sample_every == sample_every - 1:
            # The host runs ahead of the GPU by at most the launch queue; sampling while the
            # queue is full reads the state under load.
            clocks.append(torch.cuda.clock_rate())
            powers.append(torch.cuda.power_draw() / 1000.0)
    end.record()
    end.synchronize()
    seconds_taken = start.elapsed_time(end) / 1000.0
    if not torch.isfinite(c.float()).all():
        sys.exit(f"non-finite GEMM result in {dtype}")
    tflops = 2.0 * size ** 3 * count / seconds_taken / 1e12
    # Skip the first quarter of the samples: the clock settles at the cap after a second or so.
    keep = len(clocks) // 4
    return tflops, statistics.mean(clocks[keep:] or clocks), statistics.mean(powers[keep:] or powers)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="JSON file for the rows and the summary")
    a = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(11)
    names = {"bf16": torch.bfloat16, "fp16": torch.float16}
    rows = []
    for r in range(a.rounds):
        order = ("bf16", "fp16") if r % 2 == 0 else ("fp16", "bf16")
        for name in order:
            tflops, mhz, watts = run_one(torch, names[name], a.size, a.seconds, gen)
            rows.append({"round": r, "dtype": name, "tflops": round(tflops, 1), "sm_clock_mhz": round(mhz),
                         "power_w": round(watts, 1)})
            print(f"round {r} {name}: {tflops:7.1f} TFLOP/s  {mhz:6.0f} MHz  {watts:6.1f} W", flush=True)
    summary = {}
    for name in names:
        mine = [x for x in rows if x["dtype"] == name]
        summary[name] = {k: statistics.median(x[k] for x in mine) for k in ("tflops", "sm_clock_mhz", "power_w")}
    ratio = {k: summary["fp16"][k] / summary["bf16"][k] for k in ("tflops", "sm_clock_mhz", "power_w")}
    for name in names:
        s = summary[name]
        print(f"{name} median: {s['tflops']:7.1f} TFLOP/s  {s['sm_clock_mhz']:6.0f} MHz  {s['power_w']:6.1f} W")
    print(f"fp16 / bf16: TFLOP/s {ratio['tflops']:.3f}  clock {ratio['sm_clock_mhz']:.3f}  power {ratio['power_w']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "size": a.size,
                       "seconds": a.seconds, "rows": rows, "median": summary, "fp16_over_bf16": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
