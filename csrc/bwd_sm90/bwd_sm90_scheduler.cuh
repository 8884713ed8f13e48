// Tile order of the Hopper backward: which (K/V block, kv head, batch) a CTA owns, and the
// sequence of (q head, Q block) it walks. The producer and all consumer warpgroups walk the
// same sequence, so each derives it from the same two functions.
#pragma once

#include "bwd_sm90/bwd_sm90.h"
#include "common/sequence.cuh"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

struct BwdSm90Work {
  int n_block, kv_head, batch;
  int m_begin;   // first Q block that sees any key of this K/V block
  int m_count;   // Q blocks per q head (0: no query sees these keys; dK = dV = 0)
  int n_iters;   // group * m_count: the GQA group's q heads walked one after the other, so
                 // dK / dV of the kv head sum in registers with no atomics
  int shift;     // deterministic, non-causal: the walk starts at Q block m_begin + shift
  int det_lo, det_size;  // deterministic, non-causal: this pair's units in this CTA's chunk
  // The add order's unit: the K/V block, or (kPair) the cluster's two blocks, which add into a
  // dQ tile together (each CTA half the head dim). unit < units of this sequence.
  int unit, units;
  // split_last_wave, the parts' launch (kPart): this CTA walks part `part` of split unit
  // `split_unit` (its Q blocks [m_begin, m_begin + m_count) of every q head;
  // bwd_sm90_split_combine). Unset otherwise.
  int split_unit, part;
  // This sequence (dense: the params'; varlen: its own, flashback.h):
  SeqRows seq;
  int m_blocks, n_blocks;  // its Q and K/V blocks (p.m_blocks / p.n_blocks are the longest's)
  int map_batch;           // the maps' batch coordinate: the batch, or 0 for packed rows
  bool active;             // the K/V block holds keys of its sequence
};

// One-dimensional grid. The (batch, kv head) pairs are cut into groups of p.l2_group pairs;
// groups run one after the other, and inside a group the K/V block index is slower than the
// pair. So the CTAs in flight at any time belong to about one group, whose Q, dO and dQaccum
// rows (2 KB per query row) the launch sizes to stay in L2 (~16k query rows), and inside the
// group the first K/V blocks, which in the causal case have the most Q blocks to visit (rows at
// or after theirs), start first and the short ones fill the group's tail
// (longest-causal-work-first). Without causal masking every CTA has the same work and
// l2_group is 1: the K/V blocks of one head side by side.
//
// Deterministic mode (kDet) changes two things so that the fixed order of the dQ adds
// (bwd_sm90_dq_rank) rarely makes a CTA wait:
//   causal, det_from_the_end (kFromEnd; d = 128, 192, 256): the K/V blocks launch
//     longest-first, as in the default mode, and walk their Q blocks from the last one down to
//     their diagonal; a tile's adds go from block 0 up. Block n + 1 reaches a tile about when
//     block n does (a step behind it after the first collision) and its walk is shorter, so it
//     finishes no later; it waits only for lower blocks, launched before it.
//     Otherwise (d = 64): the K/V blocks of a pair run last-first. A tile's adds go from the
//     highest K/V block that sees it down to block 0; walking its Q blocks upwards, block n + 1
//     reaches any tile at least one step before block n (its first tile is at least one block
//     later), and it was launched earlier, so a CTA only ever waits for CTAs of lower blockIdx.
//   non-causal: every block sees every tile, so a plain walk would have all blocks of a head
//     on the same tile at once, each waiting for the previous one. Instead the grid is cut into
//     chunks of p.det_chunk CTAs (what is resident at once, and as all CTAs
//     take equally long, chunk c runs when chunk c - 1 is done); the blocks [det_lo,
//     det_lo + det_size) of a pair inside one chunk start their walks at Q blocks 0, 1, ..
//     (mod m_blocks), and a tile takes the adds of the pair's earlier chunks first, then those
//     of this chunk in the order they arrive: each block's predecessor on a tile was there at
//     least one step earlier, and no CTA waits for one that a later chunk holds.
//
// kPair (pair_dq, clusters of two): the order above over units of two K/V blocks; CTA r of a
// cluster (blockIdx.x & 1) takes block 2 j + r of unit j. Both walk the lower block's Q blocks
// in lockstep (the upper one's steps on the lower's diagonal blocks, the first of each q head's
// walk, or the last with det_from_the_end, are masked for it), and both are active while the
// lower block holds keys (the upper may lie past seqlen_k: all its keys masked). Deterministic,
// the unit is what the add order ranks (each CTA of it has its own counter, for its half of the
// head dim); the arguments above hold for units as for blocks (a unit's first Q block is its
// lower block's).
//
// kTailGroups > 1 (default mode, causal): the last kTailGroups groups run as one
// (grouped_tile_tail; BwdSm90Config::l2_tail_groups).
//
// kPart (split_last_wave; default mode, non-causal, dense, so l2_group is 1): the launch of
// the parts, p.split_parts consecutive clusters per unit of the grid's partial last wave (units
// p.split_first ..); part q walks Q blocks [ceil(q M / k), ceil((q + 1) M / k)) of every q head
// (M the sequence's Q blocks; the plan keeps k <= M, so every part has a Q block), so the last
// part, which sums the others' partials, has the shortest walk. The units before
// p.split_first run in a launch of their own (kPart false).
template <int kBlockM, int kBlockN, bool kDet = false, bool kPair = false, bool kFromEnd = false,
          int kTailGroups = 1, bool kPart = false>
__device__ __forceinline__ BwdSm90Work bwd_sm90_work(const BwdSm90Params& p) {
  constexpr int kUnitBlocks = kPair ? 2 : 1;
  BwdSm90Work w;
  int cta = p.block_base + static_cast<int>(kPair ? blockIdx.x / 2 : blockIdx.x);
  if constexpr (kPart) {
    w.split_unit = cta / p.split_parts;
    w.part = cta - w.split_unit * p.split_parts;
    cta = p.split_first + w.split_unit;
  }
  const int grid_units = (p.n_blocks + kUnitBlocks - 1) / kUnitBlocks;
  GroupedTile tile;
  if constexpr (kTailGroups > 1 && !kDet) {  // one tail group: grouped_tile's order
    tile = grouped_tile_tail(cta, p.l2_group, grid_units, p.nheads_k * p.batch, p.causal ? kTailGroups : 1);
  } else {
    tile = grouped_tile(cta, p.l2_group, grid_units, p.nheads_k * p.batch);
  }
  w.unit = (kDet && p.causal && !kFromEnd) ? grid_units - 1 - tile.block : tile.block;
  w.n_block = kPair ? 2 * w.unit + static_cast<int>(blockIdx.x & 1) : w.unit;
  w.kv_head = tile.pair % p.nheads_k;
  w.batch = tile.pair / p.nheads_k;
  w.seq = seq_rows(p, w.batch);
  w.m_blocks = (w.seq.seqlen_q + kBlockM - 1) / kBlockM;
  w.n_blocks = (w.seq.seqlen_k + kBlockN - 1) / kBlockN;
  w.units = (w.n_blocks + kUnitBlocks - 1) / kUnitBlocks;
  w.map_batch = w.seq.varlen ? 0 : w.batch;
  const int lead = kPair ? (w.n_block & ~1) : w.n_block;  // the block whose walk this one takes
  w.active = lead < w.n_blocks;
  const int n0 = lead * kBlockN;
  w.m_begin = p.causal
                  ? max(0, causal_first_query(n0, w.seq.seqlen_q, w.seq.seqlen_k)) / kBlockM
                  : 0;
  w.m_count = w.active ? max(0, w.m_blocks - w.m_begin) : 0;
  if constexpr (kPart) {  // non-causal: m_begin is 0 here
    const int k = p.split_parts;
    w.m_begin = (w.part * w.m_blocks + k - 1) / k;
    w.m_count = w.active ? ((w.part + 1) * w.m_blocks + k - 1) / k - w.m_begin : 0;
  }
  w.n_iters = p.group * w.m_count;
  w.shift = 0;
  w.det_lo = 0;
  w.det_size = 0;
  if (kDet && !p.causal && w.m_count > 0) {  // l2_group is 1: cta = pair * grid_units + unit
    // Chunks are slices of the grid (p.det_chunk units); the units of this sequence in it are
    // those below its own units (varlen: the grid's other ones exit at once).
    const int pair_base = tile.pair * grid_units;
    const int chunk = cta / p.det_chunk;
    w.det_lo = max(0, chunk * p.det_chunk - pair_base);
    w.det_size = min(w.units, (chunk + 1) * p.det_chunk - pair_base) - w.det_lo;
    w.shift = (w.unit - w.det_lo) % w.m_blocks;
  }
  return w;
}

// Iteration `it` of the walk -> (q head, Q block); `pos` gets the step's position in this
// head's walk (0 .. m_count - 1).
template <bool kDet = false, bool kFromEnd = false>
__device__ __forceinline__ void bwd_sm90_iter(const BwdSm90Params& p, const BwdSm90Work& w,
                                              int it, int& head, int& m_block, int& pos) {
  if (kDet && kFromEnd && p.causal) {
    // From the last Q block down to the diagonal, the GQA group's q heads inner: with heads
    // outer, unit u (a walk shorter than unit u - 1's) would reach head g's last Q block early
    // and wait there for the lower units, (g - 1) u steps (det_order_model.py: 0.78-0.91 of the
    // default at group 2-8, against 1.00 this way).
    const int g = p.group == 1 ? 0 : it % p.group;
    pos = p.group == 1 ? it : it / p.group;
    m_block = w.m_begin + w.m_count - 1 - pos;
    head = w.kv_head * p.group + g;
    return;
  }
  // Without GQA the walk has one q head: testing p.group == 1 (uniform) skips the run-time
  // division (~30 dependent instructions at every step's top, between one step's dK and the
  // next step's S). Measured +0.1..+4.0% at d = 64 / 128 / 192, 512-4096 (d = 64 most),
  // d = 256 -0.5..+1.3% (docs/perf-log.md, "Measured 2026-12-06, second run").
  const int g = p.group == 1 ? 0 : it / w.m_count;
  pos = it - g * w.m_count;
  int local = pos;
  if constexpr (kDet) {
    local += w.shift;
    if (local >= w.m_count) local -= w.m_count;
  }
  m_block = w.m_begin + local;
  head = w.kv_head * p.group + g;
}
template <bool kDet = false, bool kFromEnd = false>
__device__ __forceinline__ void bwd_sm90_iter(const BwdSm90Params& p, const BwdSm90Work& w,
                                              int it, int& head, int& m_block) {
  int pos;
  bwd_sm90_iter<kDet, kFromEnd>(p, w, it, head, m_block, pos);
}

// Deterministic mode: how many units (K/V blocks, or pairs of them: kUnitKeys = block_n or
// 2 block_n keys) add into Q tile `m_block` (of any q head) before unit w.unit, which is at
// position `pos` of its walk there. The turn counter of the tile must hold this value before
// the unit adds.
template <int kBlockM, int kUnitKeys, bool kFromEnd>
__device__ __forceinline__ int bwd_sm90_dq_rank(const BwdSm90Params& p, const BwdSm90Work& w,
                                                int m_block, int pos) {
  if (p.causal) {
    // Units 0 .. u_max see the tile (unit u does iff its m_begin <= m_block, which grows with
    // u). kFromEnd (det_from_the_end): the adds run from unit 0 up; else from u_max down.
    if constexpr (kFromEnd) return w.unit;
    const int rows_end = kBlockM * (m_block + 1) + (w.seq.seqlen_k - w.seq.seqlen_q);  // > 0 here
    const int u_max = min(w.units - 1, (rows_end - 1) / kUnitKeys);
    return u_max - w.unit;
  }
  // Non-causal: the pair's units in earlier chunks, then the units i' of this chunk that
  // reach the tile at an earlier position (position of i' = (m - i') mod M, M = m_blocks),
  // ties by index.
  const int M = w.m_blocks;
  const int i = w.unit - w.det_lo;
  const int size = w.det_size;
  // Blocks i' in [0, size) whose start residue i' mod M lies in the cyclic range
  // [m - pos + 1, m] (the positions below pos): pos * (size / M) plus those among the first
  // size % M residues.
  const int rem = size % M;
  const int lo = m_block - pos + 1;
  int extra;
  if (pos == 0) {
    extra = 0;
  } else if (lo >= 0) {
    extra = max(0, min(m_block, rem - 1) - lo + 1);
  } else {
    extra = min(m_block + 1, rem) + max(0, rem - (lo + M));
  }
  return w.det_lo + pos * (size / M) + extra + i / M;
}

}  // namespace sm90
}  // namespace flashback
