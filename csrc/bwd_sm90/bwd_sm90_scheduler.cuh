// Tile order of the Hopper backward: which (K/V block, kv head, batch) a CTA owns, and the
// sequence of (q head, Q block) it walks. The producer and both consumer warpgroups walk the
// same sequence, so each derives it from the same two functions.
#pragma once

#include "bwd_sm90/bwd_sm90.h"

namespace flashback {
namespace sm90 {

struct BwdSm90Work {
  int n_block, kv_head, batch;
  int m_begin;   // first Q block that sees any key of this K/V block
  int m_count;   // Q blocks per q head (0: no query sees these keys; dK = dV = 0)
  int n_iters;   // group * m_count: the GQA group's q heads walked one after the other, so
                 // dK / dV of the kv head sum in registers with no atomics
};

// One-dimensional grid in one of two orders (measured on the H200, docs/perf-log.md v4):
// - causal: K/V block index slowest. The first K/V blocks have the most Q blocks to visit
//   (rows at or after theirs), so they start first and the short ones fill the tail of the
//   last wave (longest-causal-work-first); the heads and batches of one K/V block run side by
//   side.
// - not causal: every CTA has the same work, so the order serves L2 instead: K/V block index
//   fastest, so a wave's CTAs share the Q, dO and dQaccum rows of one or two heads
//   (+5-8% over the causal order at 4k-16k).
template <int kBlockM, int kBlockN>
__device__ __forceinline__ BwdSm90Work bwd_sm90_work(const BwdSm90Params& p) {
  BwdSm90Work w;
  const int id = static_cast<int>(blockIdx.x);
  int rest;
  if (p.causal) {
    const int per_n_block = p.nheads_k * p.batch;
    w.n_block = id / per_n_block;
    rest = id % per_n_block;
  } else {
    w.n_block = id % p.n_blocks;
    rest = id / p.n_blocks;
  }
  w.kv_head = rest % p.nheads_k;
  w.batch = rest / p.nheads_k;
  const int n0 = w.n_block * kBlockN;
  // Causal (bottom-right aligned): query row i sees key j iff j <= i + seqlen_k - seqlen_q,
  // so the first row that sees key n0 is n0 - seqlen_k + seqlen_q.
  w.m_begin = p.causal ? max(0, n0 - p.seqlen_k + p.seqlen_q) / kBlockM : 0;
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
