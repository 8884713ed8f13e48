// Tile order of the Hopper forward: which (Q block, head, batch) a CTA owns and how many K/V
// blocks it walks.
#pragma once

#include "common/sequence.cuh"
#include "fwd_sm90/fwd_sm90.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

struct FwdSm90Work {
  int m_block, head, batch;
  int n_count;  // K/V blocks 0 .. n_count-1 (0: no query of the block sees a key)
  bool active;  // the Q block holds rows of its sequence (varlen: not past a short one's end)
  int seqlen_q, seqlen_k;  // this sequence's
  int row_q, row_k;        // its first row in the maps' row coordinate (varlen), else 0
  int map_batch;           // the maps' batch coordinate: the batch, or 0 for packed rows
  int64_t out_offset;      // element offset of the sequence's row 0 in out
  int64_t lse_offset;      // index of its row 0 of this head in lse
};

// One-dimensional grid. (batch, q head) pairs, q head fastest so that the q heads of one kv
// head are neighbours, are cut into groups of p.l2_group pairs sized so that the group's K and
// V (1 KB per key row and kv head) stay in L2; groups run one after the other. Inside a group
// the Q block is slower than the pair, and with causal masking the last Q blocks, which see the
// most keys, start first (longest-first), so the short ones fill the group's tail.
// kFast (FwdSm90Config::fast_tile_decode): the same by the params' precomputed divisors.
template <int kBlockM, int kBlockN, bool kFast = false>
__device__ __forceinline__ FwdSm90Work fwd_sm90_work(const FwdSm90Params& p, int id) {
  FwdSm90Work w;
  if constexpr (kFast) {
    const GroupedTile tile =
        grouped_tile_fast(id, p.div_group_tiles, p.div_group, p.div_last_group, p.groups);
    w.m_block = p.causal ? p.m_blocks - 1 - tile.block : tile.block;
    w.batch = p.div_heads.div(tile.pair);
    w.head = tile.pair - w.batch * p.nheads;
  } else {
    const GroupedTile tile = grouped_tile(id, p.l2_group, p.m_blocks, p.nheads * p.batch);
    w.m_block = p.causal ? p.m_blocks - 1 - tile.block : tile.block;
    w.head = tile.pair % p.nheads;
    w.batch = tile.pair / p.nheads;
  }
  const SeqRows seq = seq_rows(p, w.batch);
  w.seqlen_q = seq.seqlen_q;
  w.seqlen_k = seq.seqlen_k;
  w.row_q = static_cast<int>(seq.row_q);
  w.row_k = static_cast<int>(seq.row_k);
  w.map_batch = seq.varlen ? 0 : w.batch;
  w.out_offset = seq.q_offset(p.out_strides);
  w.lse_offset = lse_index(p, seq, w.head, 0);
  w.active = w.m_block * kBlockM < w.seqlen_q;
  int key_end = w.seqlen_k;
  if (p.causal) {
    const int m_end = min(w.seqlen_q, (w.m_block + 1) * kBlockM);
    key_end = min(key_end, causal_key_end(m_end, w.seqlen_q, w.seqlen_k));
  }
  w.n_count = w.active && key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
  return w;
}

}  // namespace sm90
}  // namespace flashback
