#!/usr/bin/env python3
"""The order of a kernel's synchronisation and math landmarks in its SASS, one line per kernel:
whether a wgmma wait sits where the source put it (docs/hopper-facts.md pitfall 16).

    cuobjdump -sass build/libflashback.so > lib.sass
    python3 scripts/sass_order.py lib.sass [--kernel fwd_sm90_kernel] [--chars 400]

Letters: G<n> n HGMMAs (| after the group's last, which carries gsb0), D<n> WARPGROUP.DEPBAR.LE
gsb0, n (a wgmma wait), E<n> n MUFU.EX2, R<n> n global reductions, S<n> n STSM, W<n> n mbarrier
try-waits, A an mbarrier arrive, B a named barrier, T<n> n TMA loads. Runs of a letter are
counted.
"""
import argparse
import re


def kernels(path):
    cur, out = None, {}
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if cur and m:
            out[cur].append(m.group(2).strip())
    return out


def landmarks(ins):
    seq = []
    for s in ins:
        t = s.split()
        op = t[1] if t[0].startswith("@") else t[0]
        if op.startswith("WARPGROUP.DEPBAR"):
            seq.append(f"[D{s.split(',')[-1].strip()[-1]}]")
        elif op.startswith("HGMMA"):
            seq.append("G|" if "gsb0" in s else "G")
        elif op.startswith("MUFU.EX2"):
            seq.append("E")
        elif op.startswith("RED"):
            seq.append("R")
        elif op.startswith("STSM"):
            seq.append("S")
        elif op.startswith("SYNCS.PHASECHK"):
            seq.append("W")
        elif op.startswith("SYNCS.ARRIVE"):
            seq.append("A")
        elif op.startswith("BAR.SYNC") or op.startswith("BAR.ARV"):
            seq.append("B")
        elif op.startswith("UTMALDG"):
            seq.append("T")
    txt = "".join(seq)
    txt = re.sub(r"G(G*)\|", lambda m: f"G{len(m.group(1)) + 1}|", txt)
    for c in "ERSWT":
        txt = re.sub(f"({c}+)", lambda m: f"{c}{len(m.group())}", txt)
    return re.sub(r"(?<![0-9|])G(?![0-9])", "G1", txt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("--kernel", default="sm90_kernel", help="substring of the mangled names to show")
    ap.add_argument("--chars", type=int, default=400)
    a = ap.parse_args()
    for name, ins in kernels(a.sass).items():
        if a.kernel in name:
            print(f"{name} ({len(ins)} instructions)\n  {landmarks(ins)[:a.chars]}")


if __name__ == "__main__":
    main()
