#!/usr/bin/env python3
"""Where a step of the d = 256 pair backward spends its clocks, per role, from clock stamps.

Needs a library whose d = 256 row is the timeline config (a measuring aid, never shipped):

  scripts/build_candidates.sh kBwdSm90Hdim256=kBwdSm90Hdim256Timeline
  FLASHBACK_LIBRARY=build-kBwdSm90Hdim256Timeline/libflashback.so \\
      python3 scripts/bwd_timeline.py --batch 4 --seqlen 4096 --causal [--deterministic]

Each consumer warpgroup's thread 0 writes clock64() at nine points of every full step
(BwdTimelineEvent in csrc/bwd_sm90/bwd_sm90.h), and the producer thread two more per step (the
one Q stage seen free, Q_i's and dO_i's copies issued), all on the CTA's SM clock. By role, warpgroup 0 computes S and P and
warpgroup 1 dP and dS; both then pass the hand-off barrier, wait for the partner CTA's dS^T, run
dQ^T / dV^T / dK^T and add dQ. The table gives, per role, the median and mean clocks of each
segment between consecutive points and its share of the step (step top to the next step's
top), over every CTA's steps but its first and last (and those with a stamp missing: a pair's
ghost steps). A segment that ends in a wait holds the wait's time: the share of the step it
costs, which the stall table does not give.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

EVENTS = ["step top", "input in", "gemm 1", "gemm 2", "cross", "hand-off", "partner dS", "dQ done", "step end"]
# What ends each segment, per role (warpgroup 0: S and P; warpgroup 1: dP and dS).
SEGMENTS = {
    0: ["wait Q_i (first atom)", "S issue + wait S", "P, store P^T", "wait dO_i", "to hand-off barrier",
        "wait partner dS^T", "dQ^T own+peer, dV^T (wait<1>)", "adds, dK^T (wait<0>)", "to next step top"],
    1: ["wait dO_i", "wait S issued", "dP issue, Q_i in, wait dP", "wait P^T stored", "dS, to hand-off barrier",
        "wait partner dS^T", "dQ^T own+peer, dV^T (wait<1>)", "adds, dK^T (wait<0>)", "to next step top"],
}


def summarize(stamps, ctas, steps):
    """stamps: [ctas, steps, 2, 16] int64 (0: not written). Per role, the segment clocks."""
    import numpy as np

    t = stamps[:, :, :, : len(EVENTS)].astype(np.int64)
    rows = {}
    for wg in (0, 1):
        segs = [[] for _ in SEGMENTS[wg]]
        for c in range(ctas):
            written = [s for s in range(steps) if (t[c, s, wg] != 0).all()]
            # Not step 0 (the walk's start), and only steps whose next step has its top stamped
            # (the last step has none; a pair ghost step stamps its top only). Steps with a
            # stamp missing drop out: the upper CTA's ghost steps, and the lower CTA's steps
            # whose partner was a ghost (no partner dS^T: no kTlPartner / kTlDqDone).
            for a in written:
                if a == 0 or a + 1 >= steps or t[c, a + 1, wg, 0] == 0:
                    continue
                row = t[c, a, wg]
                for i in range(len(EVENTS) - 1):
                    segs[i].append(row[i + 1] - row[i])
                segs[-1].append(t[c, a + 1, wg, 0] - row[-1])
        rows[wg] = [np.asarray(s, dtype=np.float64) for s in segs]
    return rows


# The producer's two stamps (kTlProducerQFree, kTlProducerDoIssued), in warpgroup 0's slots of the
# step whose Q and dO it loads, and the loads' four segments built from them.
PRODUCER_QFREE, PRODUCER_DO_ISSUED = len(EVENTS), len(EVENTS) + 1
PRODUCER_SEGMENTS = [
    "Q_{i-n} released (both wgs) -> producer sees the stage free",
    "stage free -> Q_i first atom-column in (wg 0)",
    "stage free -> dO_i issued",
    "dO_i issued -> dO_i in (wg 1)",
]


def summarize_producer(stamps, ctas, steps, q_stages=1):
    """The Q / dO loads of the pair's ring of q_stages Q stages: per step i >= q_stages whose
    stamps are all written, the clocks from the later of the two warpgroups' release of Q_{i-n}
    (n = q_stages: the step whose stage step i reuses; their step-end stamps) to the producer
    seeing the stage free, from there to Q_i's first atom-column at warpgroup 0 (its wait's end:
    an upper bound where warpgroup 0 came to the wait late), to dO_i's copies issued, and from
    those to warpgroup 1's wait for dO_i ending. One array per segment. (Steps are counted per
    CTA, so a walk with ghost steps, which load nothing, pairs a few steps with the wrong
    release; their stamps are missing and they drop out where the ghost is step i itself.)"""
    import numpy as np

    t = stamps.astype(np.int64)
    end = len(EVENTS) - 1  # kTlStepEnd
    segs = [[] for _ in PRODUCER_SEGMENTS]
    for c in range(ctas):
        for s in range(q_stages, steps):
            free, issued = t[c, s, 0, PRODUCER_QFREE], t[c, s, 0, PRODUCER_DO_ISSUED]
            q_in, do_in = t[c, s, 0, 1], t[c, s, 1, 1]
            rel0, rel1 = t[c, s - q_stages, 0, end], t[c, s - q_stages, 1, end]
            if 0 in (free, issued, q_in, do_in, rel0, rel1):
                continue
            segs[0].append(free - max(rel0, rel1))
            segs[1].append(q_in - free)
            segs[2].append(issued - free)
            segs[3].append(do_in - issued)
    return [np.asarray(x, dtype=np.float64) for x in segs]


# Once per CTA, in step 0's slots of each consumer warpgroup (kTlCtaEntry.. in bwd_sm90.h).
CTA_ENTRY, CTA_EXIT, CTA_ENTRY_NS, CTA_EXIT_NS, CTA_SM = range(PRODUCER_DO_ISSUED + 1, PRODUCER_DO_ISSUED + 6)


def summarize_ctas(stamps, ctas, steps):
    """What the CTAs cost outside their steps, and how they fill the SMs.

    Per CTA with keys (warpgroup 0's stamps): its start to the first step's top (barrier
    init, the cluster barrier, K / V / the partner's K half and the first Q in flight), the last
    step's end to its exit (dK / dV staged and stored, the final cluster barrier), and its whole
    time, in clocks. From the global timer (ns) and the SM ids: the kernel's span from the first
    CTA's start to the last one's exit, the share of SM-time inside CTAs, the gaps between one
    CTA's exit and the next one's start on the same SM, and the tail: the span's part after the
    first SM ran out of CTAs. Returns a dict, or None without the stamps."""
    import numpy as np

    t = stamps.astype(np.int64)
    pro, epi, whole = [], [], []
    for c in range(ctas):
        row = t[c, :, 0]
        entry, exit_ = row[0, CTA_ENTRY], row[0, CTA_EXIT]
        if entry == 0 or exit_ == 0:
            continue
        whole.append(exit_ - entry)
        if row[0, 0] == 0:  # no keys: the ghost CTA of an odd block count
            continue
        pro.append(row[0, 0] - entry)
        ends = [row[s, len(EVENTS) - 1] for s in range(steps) if row[s, len(EVENTS) - 1] != 0]
        if ends:
            epi.append(exit_ - max(ends))
    if not whole:
        return None
    cta_ns = [(int(t[c, 0, 0, CTA_SM]), min(t[c, 0, w, CTA_ENTRY_NS] for w in (0, 1)),
               max(t[c, 0, w, CTA_EXIT_NS] for w in (0, 1)))
              for c in range(ctas) if all(t[c, 0, w, CTA_ENTRY_NS] and t[c, 0, w, CTA_EXIT_NS] for w in (0, 1))]
    start = min(e for _, e, _ in cta_ns)
    end = max(x for _, _, x in cta_ns)
    by_sm = {}
    for sm, e, x in cta_ns:
        by_sm.setdefault(sm, []).append((e, x))
    gaps, last_exits = [], []
    for runs in by_sm.values():
        runs.sort()
        gaps += [b[0] - a[1] for a, b in zip(runs, runs[1:])]
        last_exits.append(runs[-1][1])
    busy = sum(x - e for _, e, x in cta_ns)
    return {
        "prologue": np.asarray(pro, dtype=np.float64), "epilogue": np.asarray(epi, dtype=np.float64),
        "cta": np.asarray(whole, dtype=np.float64), "span_ns": end - start, "sms": len(by_sm),
        "busy": busy / (len(by_sm) * (end - start)), "gaps_ns": np.asarray(gaps, dtype=np.float64),
        "tail_ns": end - min(last_exits),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--nheads", type=int, default=8)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--q-stages", type=int, default=1,
                   help="Q stages of the config timed (its producer segments pair step i with i - n)")
    a = p.parse_args()

    import numpy as np
    import torch

    import flashback
    from flashback import _lib

    d, block_n, block_m = 256, 80, 64
    ctas = a.batch * a.nheads * ((a.seqlen + block_n - 1) // block_n + 1)  # + 1: the pair's even count
    steps = (a.seqlen + block_m - 1) // block_m + 1
    buf = torch.zeros(ctas, steps, 2, 16, dtype=torch.int64, device="cuda")
    lib = _lib.load()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(a.batch, a.seqlen, a.nheads, d, generator=g, device="cuda",
                                 dtype=torch.bfloat16) for _ in range(4))
    out, lse = flashback.attention_forward(q, k, v, causal=a.causal)
    flashback.attention_backward(dout, q, k, v, out, lse, causal=a.causal, deterministic=a.deterministic)
    torch.cuda.synchronize()  # the warm-up call, not stamped
    if lib.flashback_debug_bwd_timeline(buf.data_ptr(), ctas, steps) != 0:
        raise SystemExit(lib.flashback_last_error().decode())
    try:
        flashback.attention_backward(dout, q, k, v, out, lse, causal=a.causal, deterministic=a.deterministic)
        torch.cuda.synchronize()
    finally:
        lib.flashback_debug_bwd_timeline(None, 0, 0)
    if not flashback.last_backward_kernel().startswith("pair"):
        raise SystemExit(f"the backward ran {flashback.last_backward_kernel()!r}, not the pair")
    stamps = buf.cpu().numpy()
    if not stamps.any():
        raise SystemExit("no stamps: is the d = 256 row the timeline config (kBwdSm90Hdim256Timeline)?")
    rows = summarize(stamps, ctas, steps)
    mode = "deterministic" if a.deterministic else "default"
    print(f"d = 256 pair, b{a.batch} s{a.seqlen} h{a.nheads} {'causal' if a.causal else 'non-causal'}, "
          f"{mode}: clocks per step segment (median / mean, share of the mean step)")
    for wg in (0, 1):
        step = sum(s.mean() for s in rows[wg]) if len(rows[wg][0]) else float("nan")
        print(f"warpgroup {wg} ({'S, P' if wg == 0 else 'dP, dS'}): {len(rows[wg][0])} steps, mean step {step:.0f}")
        for name, s in zip(SEGMENTS[wg], rows[wg]):
            if len(s):
                print(f"  {name:32s} {np.median(s):8.0f} {s.mean():8.0f}  {100 * s.mean() / step:5.1f}%")
    cta = summarize_ctas(stamps, ctas, steps)
    if cta is not None:
        print(f"CTAs: {len(cta['cta'])}, median {np.median(cta['cta']):.0f} clocks each; outside the steps "
              f"(median / mean clocks, share of the CTAs' summed time):")
        for name in ("prologue", "epilogue"):
            s = cta[name]
            if len(s):
                print(f"  {name:10s} {np.median(s):8.0f} {s.mean():8.0f}  {100 * s.sum() / cta['cta'].sum():5.1f}%")
        g = cta["gaps_ns"]
        print(f"  kernel {cta['span_ns'] / 1e3:.1f} us on {cta['sms']} SMs: {100 * cta['busy']:.1f}% of SM time "
              f"inside CTAs; gaps between CTAs on an SM median {np.median(g) if len(g) else 0:.0f} ns "
              f"(mean {g.mean() if len(g) else 0:.0f}); tail after the first SM ran dry "
              f"{cta['tail_ns'] / 1e3:.1f} us ({100 * cta['tail_ns'] / cta['span_ns']:.1f}%)")
    prod = summarize_producer(stamps, ctas, steps, a.q_stages)
    if len(prod[0]):
        print(f"producer, Q_i / dO_i loads ({a.q_stages} Q stage{'s' if a.q_stages > 1 else ''}): "
              f"{len(prod[0])} steps (median / mean clocks)")
        if np.median(prod[0]) < 0:
            print("  (the stage is seen free before its release: is --q-stages that of the config?)")
        for name, s in zip(PRODUCER_SEGMENTS, prod):
            print(f"  {name:58s} {np.median(s):8.0f} {s.mean():8.0f}")


if __name__ == "__main__":
    main()
