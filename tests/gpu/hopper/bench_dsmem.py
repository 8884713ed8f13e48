#!/usr/bin/env python3
"""How long a tile takes to reach the partner CTA of a 2-CTA cluster (distributed shared memory),
for sizing exchanges between the CTAs of a pair (the d = 256 backward's dS^T today, 10 KB a step;
a head-dim split would exchange fp32 partial sums of S and dP, 20 KB each).

Two CTAs bounce a tile `--rounds` times (cluster_tests.cu, cluster_pingpong_kernel); CTA 0 counts
clock64 cycles; one way = cycles / (2 rounds). mode 0: one thread's bulk copy from shared memory
(complete_tx on the partner's barrier); mode 1: every thread's 16-byte DSMEM stores, then a
remote arrive with release at cluster scope, the receiver waiting with acquire. With --pairs 1
one pair runs alone; with more, that many pairs run at once (132 SMs: 66 pairs fill the card).
The data is checked after every run. Prints one line per (pairs, bytes, mode), median of
--repeats runs.

Usage: python tests/gpu/hopper/bench_dsmem.py [--rounds 200 --repeats 5 --pairs 1,66]
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hopper_lib  # noqa: E402
from hopper_lib import ptr  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs", default="1,66")
    ap.add_argument("--bytes", default="2048,10240,20480,40960")
    ap.add_argument("--threads", type=int, default=128)
    a = ap.parse_args()
    lib = hopper_lib.load()
    print(f"device: {torch.cuda.get_device_name()}")
    print(f"{'pairs':>5} {'bytes':>6} {'mode':>16} {'cycles one way':>15} {'min..max':>16}")
    for npairs in (int(v) for v in a.pairs.split(",")):
        for nbytes in (int(v) for v in a.bytes.split(",")):
            for mode, name in ((0, "bulk copy"), (1, "stores+release")):
                per_way = []
                for _ in range(a.repeats):
                    x = torch.randint(-2**31, 2**31 - 1, (npairs, nbytes // 4), dtype=torch.int32, device="cuda")
                    out = torch.full((npairs, 2, nbytes // 4), -1, dtype=torch.int32, device="cuda")
                    cycles = torch.zeros(npairs, dtype=torch.int64, device="cuda")
                    rc = lib.fbh_cluster_pingpong(ptr(x), ptr(out), ptr(cycles), nbytes, a.rounds, mode,
                                                  npairs, a.threads)
                    hopper_lib.check(lib, rc, "fbh_cluster_pingpong")
                    torch.cuda.synchronize()
                    if not (torch.equal(out[:, 0], x) and torch.equal(out[:, 1], x)):
                        sys.exit(f"wrong data: pairs {npairs} bytes {nbytes} mode {mode}")
                    per_way.append(statistics.median(cycles.tolist()) / (2 * a.rounds))
                print(f"{npairs:>5} {nbytes:>6} {name:>16} {statistics.median(per_way):>15.0f} "
                      f"{min(per_way):>7.0f}..{max(per_way):<7.0f}")


if __name__ == "__main__":
    main()
