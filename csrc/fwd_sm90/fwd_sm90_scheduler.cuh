// Tile order of the Hopper forward: which (Q block, head, batch) a CTA owns and how many K/V
// blocks it walks.
#pragma once

#include "fwd_sm90/fwd_sm90.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

struct FwdSm90Work {
  int m_block, head, batch;
  int n_count;  // K/V blocks 0 .. n_count-1 (0: no query of the block sees a key)
};

// One-dimensional grid. (batch, q head) pairs, q head fastest so that the q heads of one kv
// head are neighbours, are cut into groups of p.l2_group pairs sized so that the group's K and
// V (1 KB per key row and kv head) stay in L2; groups run one after the other. Inside a group
// the Q block is slower than the pair, and with causal masking the last Q blocks, which see the
// most keys, start first (longest-first), so the short ones fill the group's tail.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ FwdSm90Work fwd_sm90_work(const FwdSm90Params& p) {
  FwdSm90Work w;
  const GroupedTile tile = grouped_tile(static_cast<int>(blockIdx.x), p.l2_group, p.m_blocks,
                                       p.nheads * p.batch);
  w.m_block = p.causal ? p.m_blocks - 1 - tile.block : tile.block;
  w.head = tile.pair % p.nheads;
  w.batch = tile.pair / p.nheads;
  int key_end = p.seqlen_k;
  if (p.causal) {
    const int m_end = min(p.seqlen_q, (w.m_block + 1) * kBlockM);
    key_end = min(key_end, causal_key_end(m_end, p.seqlen_q, p.seqlen_k));
  }
  w.n_count = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
  return w;
}

}  // namespace sm90
}  // namespace flashback
