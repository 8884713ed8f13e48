// Tile order of the Hopper backward: which (K/V block, kv head, batch) a CTA owns, and the
// sequence of (q head, Q block) it walks. The producer and both consumer warpgroups walk the
// same sequence, so each derives it from the same two functions.
#pragma once

#include "bwd_sm90/bwd_sm90.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

struct BwdSm90Work {
  int n_block, kv_head, batch;
  int m_begin;   // first Q block that sees any key of this K/V block
  int m_count;   // Q blocks per q head (0: no query sees these keys; dK = dV = 0)
  int n_iters;   // group * m_count: the GQA group's q heads walked one after the other, so
                 // dK / dV of the kv head sum in registers with no atomics
};

// One-dimensional grid. The (batch, kv head) pairs are cut into groups of p.l2_group pairs;
// groups run one after the other, and inside a group the K/V block index is slower than the
// pair. So the CTAs in flight at any time belong to about one group, whose Q, dO and dQaccum
// rows (2 KB per query row) the launch sizes to stay in L2 (~16k query rows), and inside the
// group the first K/V blocks, which in the causal case have the most Q blocks to visit (rows at
// or after theirs), start first and the short ones fill the group's tail
// (longest-causal-work-first). Without causal masking every CTA has the same work and
// l2_group is 1: the K/V blocks of one head side by side.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ BwdSm90Work bwd_sm90_work(const BwdSm90Params& p) {
  BwdSm90Work w;
  const GroupedTile tile = grouped_tile(static_cast<int>(blockIdx.x), p.l2_group, p.n_blocks,
                                       p.nheads_k * p.batch);
  w.n_block = tile.block;
  w.kv_head = tile.pair % p.nheads_k;
  w.batch = tile.pair / p.nheads_k;
  const int n0 = w.n_block * kBlockN;
  w.m_begin =
      p.causal ? max(0, causal_first_query(n0, p.seqlen_q, p.seqlen_k)) / kBlockM : 0;
  w.m_count = max(0, p.m_blocks - w.m_begin);
  w.n_iters = p.group * w.m_count;
  return w;
}

// Iteration `it` of the walk -> (q head, Q block).
__device__ __forceinline__ void bwd_sm90_iter(const BwdSm90Params& p, const BwdSm90Work& w,
                                              int it, int& head, int& m_block) {
  const int g = it / w.m_count;
  m_block = w.m_begin + (it - g * w.m_count);
  head = w.kv_head * p.group + g;
}

}  // namespace sm90
}  // namespace flashback
