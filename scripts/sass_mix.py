#!/usr/bin/env python3
"""What two kernels execute, side by side: executed instructions per opcode and per code region,
from two Nsight Compute source pages (ours and another kernel of the same call, e.g. FA3's).

    ncu -i prof.ncu-rep --page source --csv --print-source sass > ours.csv   (and theirs.csv)
    python3 scripts/sass_mix.py ours.csv theirs.csv [--top 30] [--groups 10] [--count N ...]

Prints, for each page, the total executed instructions; then the opcodes whose executed counts
differ most (predicates dropped, .FTZ ignored: the same operation with or without flushing);
then each page's code grouped by how often its lines ran (lines executed the same number of
times are one region: the loop body per key block and warp, the once-per-tile code, a masked
loop), the largest groups first, so that regions can be matched by their counts; with --count
N, the opcodes of the lines that ran exactly N times in each page, side by side, for a region
found that way (give two counts, ours then theirs, when the regions ran a different number of
times).
"""
import argparse
import collections

import sass_loops
from sass_hotspots import num, rows


def opcode(sass: str) -> str:
    """sass_loops' opcode (the predicate dropped), .FTZ ignored; "?" for an empty line."""
    s = sass.strip()
    return sass_loops.opcode(s).replace(".FTZ", "") if s else "?"


def executed(path):
    """[(sass, executed count)] in address order."""
    return [(r["Source"], int(num(r["Instructions Executed"]))) for r in rows(path)]


def by_opcode(lines, only_count=None):
    c = collections.Counter()
    for sass, n in lines:
        if only_count is None:
            c[opcode(sass)] += n
        elif n == only_count:
            c[opcode(sass)] += 1
    return c


def groups(lines):
    """{executed count: number of lines}, for the lines that ran."""
    g = collections.Counter()
    for _, n in lines:
        if n > 0:
            g[n] += 1
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--top", type=int, default=30, help="opcodes listed")
    ap.add_argument("--groups", type=int, default=10, help="code regions listed per page")
    ap.add_argument("--count", type=int, nargs="+", help="opcodes of the lines run exactly this often")
    a = ap.parse_args()
    la, lb = executed(a.a), executed(a.b)
    ta, tb = sum(n for _, n in la), sum(n for _, n in lb)
    print(f"A {a.a}: {ta / 1e6:.2f} M instructions executed")
    print(f"B {a.b}: {tb / 1e6:.2f} M instructions executed ({ta / tb - 1:+.1%} A against B)")
    oa, ob = by_opcode(la), by_opcode(lb)
    print(f"\nopcodes, executed (M), largest differences first:\n{'opcode':30s} {'A':>8s} {'B':>8s} {'A - B':>8s}")
    for k in sorted(set(oa) | set(ob), key=lambda k: (-abs(oa[k] - ob[k]), k))[:a.top]:
        print(f"{k:30s} {oa[k] / 1e6:8.2f} {ob[k] / 1e6:8.2f} {(oa[k] - ob[k]) / 1e6:+8.2f}")
    for name, lines, total in (("A", la, ta), ("B", lb, tb)):
        print(f"\n{name}: code by how often its lines ran (count x lines = instructions)")
        g = groups(lines)
        for n, k in sorted(g.items(), key=lambda x: (-x[0] * x[1], -x[0]))[:a.groups]:
            print(f"  ran {n:>10d} x {k:5d} lines = {n * k / 1e6:8.2f} M  {n * k / total:6.1%}")
    if a.count:
        ca, cb = a.count[0], a.count[-1]
        ra, rb = by_opcode(la, ca), by_opcode(lb, cb)
        print(f"\nlines run {ca} times in A ({sum(ra.values())}) and {cb} times in B ({sum(rb.values())}), "
              f"per opcode:\n{'opcode':30s} {'A':>5s} {'B':>5s}")
        for k in sorted(set(ra) | set(rb), key=lambda k: (-abs(ra[k] - rb[k]), k)):
            if ra[k] != rb[k]:
                print(f"{k:30s} {ra[k]:5d} {rb[k]:5d}")


if __name__ == "__main__":
    main()
