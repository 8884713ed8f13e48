#!/usr/bin/env python3
"""Where a kernel's warps wait, by SASS instruction: a summary of an Nsight Compute source page.

    ncu --set full -k regex:fwd_sm90_kernel -s 1 -c 1 -o prof python3 scripts/profile_attention.py ...
    ncu -i prof.ncu-rep --page source --csv --print-source sass > prof-sass.csv
    python3 scripts/sass_hotspots.py prof-sass.csv [--top 25]

Prints the stall samples per reason over the whole kernel, then the instructions with the most
samples (address, SASS, samples, the main reasons), then the samples per opcode, then (--waits)
every wait instruction holding at least 0.2% of the samples: mbarrier try-waits with the branch
that spins on them, wgmma / bulk-copy depbars, named barriers, sleeps; with how often each ran
(a wait run once per tile per warp and one run per step tell prologue from loop) and the
mbarrier operand, which names the ring.
"""
import argparse
import collections
import csv
import re


def rows(path):
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    # The first line names the kernel; the header is the first line with "Address" and "Source".
    start = next(i for i, r in enumerate(lines) if r[:2] == ["Address", "Source"])
    header = lines[start]
    for r in lines[start + 1:]:
        if len(r) == len(header):
            yield dict(zip(header, r))


def num(x):
    try:
        return float(x.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--waits", action="store_true", help="also the table of wait instructions")
    a = ap.parse_args()
    data = list(rows(a.csv))
    reasons = [k for k in data[0] if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in data)
    print(f"{len(data)} instructions, {total:.0f} samples")
    by_reason = {k: sum(num(r[k]) for r in data) for k in reasons}
    print("samples per reason: " + ", ".join(f"{k[6:]} {v / total:.1%}" for k, v in
                                              sorted(by_reason.items(), key=lambda kv: -kv[1]) if v > 0.005 * total))
    print(f"\ntop {a.top} instructions (share of samples; main reasons)")
    for r in sorted(data, key=lambda r: -num(r["Warp Stall Sampling (All Samples)"]))[:a.top]:
        s = num(r["Warp Stall Sampling (All Samples)"])
        main_reasons = sorted(((num(r[k]), k[6:]) for k in reasons), reverse=True)[:3]
        why = ", ".join(f"{n} {v / s:.0%}" for v, n in main_reasons if v > 0)
        print(f"  {r['Address']:>6} {s / total:6.1%}  {r['Source'][:60]:60}  {why}")
    ops = collections.Counter()
    for r in data:
        m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+(\.[A-Z0-9_]+)?)", r["Source"])
        ops[m.group(2) if m else "?"] += num(r["Warp Stall Sampling (All Samples)"])
    print("\nsamples per opcode: " + ", ".join(f"{k} {v / total:.1%}" for k, v in ops.most_common(15)))
    if a.waits:
        print("\nwaits (samples on the wait and the instruction after it; times executed)")
        for addr, share, executed, src in waits(data, total):
            print(f"  {addr:>6} {share:6.1%}  {executed:>10.0f}  {src[:70]}")


WAIT = re.compile(r"TRYWAIT|DEPBAR|BAR\.SYNC|NANOSLEEP|WARPSYNC")


def waits(data, total, min_share=0.002):
    """(address, share of all samples, times executed, SASS) per wait instruction. A try-wait's
    share includes the next instruction (the branch that spins back to it takes the samples), as
    does a scoreboard DEPBAR's (the instruction held behind it takes them); a warpgroup DEPBAR
    takes its own."""
    out = []
    for i, r in enumerate(data):
        if not WAIT.search(r["Source"]):
            continue
        s = num(r["Warp Stall Sampling (All Samples)"])
        takes_next = "TRYWAIT" in r["Source"] or re.search(r"(^|\s)DEPBAR", r["Source"])
        if takes_next and i + 1 < len(data):
            s += num(data[i + 1]["Warp Stall Sampling (All Samples)"])
        if total > 0 and s / total >= min_share:
            out.append((r["Address"], s / total, num(r["Instructions Executed"]), r["Source"].strip()))
    return out


if __name__ == "__main__":
    main()
