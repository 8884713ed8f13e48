#!/usr/bin/env python3
"""Shared-memory bytes against tensor-core clocks for one step of the Hopper backward split by
head dim (S and dP by role, dV^T / dK^T / dQ^T by head-dim atom-columns), the d = 256 pair or a
single CTA: a lower bound per step from each unit's rate, to weigh a tile shape or a change
before it is built.

Per step (block_m queries against the CTA's block_n keys; SS wgmma, M = 64 rows per chain; S and
dP by role as the d = 256 pair runs them; the other head dims split S and dP by keys, each
warpgroup reading its own A, which the model leaves out):
  S = Q K^T, dP = dO V^T: A (64 x d per chain, the Q-side tile) and B (block_n x d, read again by
    every 64-row chain);
  dV^T, dK^T: per 64-column head-dim atom, A (that atom of dO / Q, 64 x block_m) and B (P^T or
    dS^T, block_n x block_m, read again by every atom);
  dQ^T: per atom this CTA owns, A (that atom of K, block_n x 64) and B (dS^T); the pair does it
    over both blocks' keys for half the atoms;
  copies in: the Q and dO rows (TMA), the partner's dS^T (pair); stmatrix of P^T and dS^T, the
  ldmatrix of P^T (by role, the dS side reads P back); the bulk copy's read of dS^T (pair).
Rates: 128 bytes of shared memory and 4096 FLOP (bf16 / fp16 dense) per clock per SM.

    python3 scripts/bwd_smem_model.py [--head-dim 256] [--block-m 64] [--block-n 80] [--single]

The 2026-12-06 twelfth run's timeline: ~6200 clocks per step at d = 256 64 x 80 (the pair),
against this model's 3856 clocks of shared memory and 3200 of math; the step is bound by both
and by its dependency chain, and a copy landing amid S / dP slowed them (docs/perf-log.md).
"""
import argparse

SMEM_BYTES_PER_CLOCK = 128
FLOP_PER_CLOCK = 4096


def step_model(head_dim=256, block_m=64, block_n=80, pair=True, elem=2):
    """Per-step bytes (by item) and FLOP of one CTA. Returns (items: list of (name, bytes, flop))."""
    assert head_dim % 64 == 0 and block_m % 64 == 0
    atoms = head_dim // 64
    chains = block_m // 64  # 64-row wgmma chains per GEMM with M = queries
    tile_q = block_m * head_dim * elem  # Q or dO rows
    tile_kv = block_n * head_dim * elem  # K or V
    hand = block_n * block_m * elem  # P^T or dS^T
    items = []
    for name in ("S = Q K^T", "dP = dO V^T"):
        items.append((name, tile_q + chains * tile_kv, 2 * block_m * block_n * head_dim))
    for name in ("dV^T += dO^T P", "dK^T += Q^T dS"):
        items.append((name, atoms * (block_m * 64 * elem + hand), 2 * block_m * block_n * head_dim))
    # dQ^T: a single CTA all atoms over its keys; the pair half the atoms over both blocks' keys.
    dq_atoms, dq_blocks = (atoms // 2, 2) if pair else (atoms, 1)
    items.append(("dQ^T = K^T dS^T", dq_atoms * dq_blocks * (block_n * 64 * elem + hand),
                  2 * block_m * block_n * 64 * dq_atoms * dq_blocks))
    items.append(("copies in (Q, dO" + (", partner dS^T)" if pair else ")"),
                  2 * tile_q + (hand if pair else 0), 0))
    items.append(("stmatrix P^T, dS^T; ldmatrix P^T", 3 * hand, 0))
    if pair:
        items.append(("bulk copy out (reads dS^T)", hand, 0))
    return items


def clocks(items):
    """(shared-memory clocks, math clocks) of a step."""
    total_bytes = sum(b for _, b, _ in items)
    total_flop = sum(f for _, _, f in items)
    return total_bytes / SMEM_BYTES_PER_CLOCK, total_flop / FLOP_PER_CLOCK


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--block-m", type=int, default=64)
    p.add_argument("--block-n", type=int, default=80)
    p.add_argument("--single", action="store_true", help="one CTA per K/V block (no pair)")
    a = p.parse_args()
    items = step_model(a.head_dim, a.block_m, a.block_n, pair=not a.single)
    kind = "single CTA" if a.single else "pair"
    print(f"d = {a.head_dim}, {a.block_m} x {a.block_n}, {kind}: per step")
    print(f"  {'item':40s} {'KB':>8s} {'MFLOP':>8s} {'smem clk':>9s} {'math clk':>9s}")
    for name, b, f in items:
        print(f"  {name:40s} {b / 1024:8.1f} {f / 1e6:8.2f} {b / SMEM_BYTES_PER_CLOCK:9.0f} "
              f"{f / FLOP_PER_CLOCK:9.0f}")
    smem, math = clocks(items)
    print(f"  {'total':40s} {sum(b for _, b, _ in items) / 1024:8.1f} "
          f"{sum(f for _, _, f in items) / 1e6:8.2f} {smem:9.0f} {math:9.0f}")
    print(f"  bound: {'shared memory' if smem > math else 'math'} ({max(smem, math):.0f} clocks; "
          f"shared memory / math = {smem / math:.2f})")


if __name__ == "__main__":
    main()
