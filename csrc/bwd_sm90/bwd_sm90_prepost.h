// Entry points of the pre/postprocess kernels (bwd_sm90_prepost.cu) and the dQaccum tile
// shape they share with the main kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/sequence.cuh"
#include "flashback/flashback.h"

namespace flashback {
namespace sm90 {

// One dQaccum tile: 64 rows (kDqTileRows) x d columns of fp32, stored in accumulator-fragment order, one
// 64 x 64 part per head-dim atom-column (bwd_sm90_epilogue.cuh).
constexpr int kDqTileRows = 64;
constexpr int kDqAtomFloats = kDqTileRows * 64;
__host__ __device__ constexpr int64_t dq_tile_floats(int head_dim) {
  return int64_t{kDqTileRows} * head_dim;
}
// Deterministic mode's turn counters per tile: one per phase of the adds (at most 2).
constexpr int kDqTurnsPerTile = 2;

// Which workspace tile holds the 64-row Q block m_block of (sequence, head): its dQaccum tile,
// its turn counters and its 64 rows of LSE * log2(e) and D. A main-kernel step covers
// step_tiles consecutive tiles (its block_m / 64), so every sequence has a whole number of
// steps' tiles. Dense batches: (batch, nheads, m_blocks) tiles, m_blocks a multiple of
// step_tiles. Varlen: per head the sequences' tiles packed, sequence b from tile
// cu_seqlens_q[b] / 64 + step_tiles * b, so a head needs total_q / 64 + step_tiles * batch + 1
// tiles however long the longest sequence is (sequence b's step_tiles * ceil(len / block_m)
// tiles are at most len / 64 + step_tiles and end before b + 1's begin).
struct DqTiles {
  int nheads;
  int m_blocks;             // dense: tiles per (batch, head)
  int64_t varlen_per_head;  // varlen: tiles per head
  int step_tiles;           // tiles per main-kernel step: block_m / 64
};
__host__ __device__ __forceinline__ int64_t dq_tile(const DqTiles& d, const SeqRows& seq, int head,
                                                   int m_block) {
  return seq.varlen
             ? head * d.varlen_per_head + seq.row_q / kDqTileRows + int64_t{seq.batch} * d.step_tiles +
                   m_block
             : (static_cast<int64_t>(seq.batch) * d.nheads + head) * d.m_blocks + m_block;
}
// m_blocks: 64-row tiles per (batch, head) of the longest sequence, a multiple of step_tiles.
inline DqTiles dq_tiles_of(const flashback_bwd_params& p, int m_blocks, int step_tiles) {
  return DqTiles{p.nheads, m_blocks,
                 p.cu_seqlens_q != nullptr
                     ? int64_t{p.total_q} / kDqTileRows + int64_t{step_tiles} * p.batch + 1
                     : 0,
                 step_tiles};
}
inline int64_t dq_tiles_total(const flashback_bwd_params& p, int m_blocks, int step_tiles) {
  const DqTiles d = dq_tiles_of(p, m_blocks, step_tiles);
  return p.cu_seqlens_q != nullptr ? d.varlen_per_head * p.nheads
                                   : int64_t{p.batch} * p.nheads * m_blocks;
}

// The dQ conversion queue (BwdSm90Config::dq_post_queue), `pairs` = batch x kv heads ints of
// each kind, in the workspace after the LSE / D rows:
//   done[pair]   counts the main kernel's warps that have finished their dQ adds for the (batch,
//                kv head) pair (each CTA of the pair's kv blocks counts a fixed number of times);
//   queue[slot]  the pairs in the order their counts completed (-1: not yet), appended by the
//                warp that counts last;
//   tail, claim  the queue's next free slot, and the postprocess's next tile to convert.
// The preprocess sets them (done 0, queue -1); the postprocess converts tile k of the k-th
// completed pair's q heads as soon as that pair is queued, while the main kernel still runs.
struct DqPostQueue {
  int* base;
  int pairs;
  // split_last_wave: the parts' counts (BwdSm90Params::split_done), zeroed with the queue.
  int* split_done = nullptr;
  int split_count = 0;
  __host__ __device__ int* done(int pair) const { return base + pair; }
  __host__ __device__ int* queue(int slot) const { return base + pairs + slot; }
  __host__ __device__ int* tail() const { return base + 2 * pairs; }
  __host__ __device__ int* claim() const { return base + 2 * pairs + 1; }
  static constexpr size_t bytes(int pairs) { return (2 * static_cast<size_t>(pairs) + 2) * sizeof(int); }
};

// m_blocks, step_tiles: as dq_tiles_of. The preprocess also zeroes the dQaccum tiles (and, with
// dq_turn non-null, the deterministic mode's turn counters) of every sequence's steps, which
// are all the main kernel adds into.
// post.base non-null: the dQ conversion queue is set too.
cudaError_t launch_bwd_sm90_preprocess(const flashback_bwd_params& p, int m_blocks, int step_tiles,
                                       float* lse_log2, float* dsum, float* dq_accum, int* dq_turn,
                                       DqPostQueue post, cudaStream_t stream);
// pdl: launched as the main kernel's dependent (hopper/pdl.h); it waits for the main kernel
// before it reads dQaccum either way.
cudaError_t launch_bwd_sm90_postprocess(const flashback_bwd_params& p, int m_blocks, int step_tiles,
                                        const float* dq_accum, bool pdl, cudaStream_t stream);
// dq_post_queue: the postprocess as a queue's consumer (DqPostQueue), launched as the main
// kernel's dependent (pdl) so that its CTAs take the SMs the main kernel's last CTAs leave;
// each converts the tiles of pairs whose adds are done, in the order they finished.
cudaError_t launch_bwd_sm90_postprocess_queue(const flashback_bwd_params& p, int m_blocks,
                                              int step_tiles, const float* dq_accum,
                                              DqPostQueue post, bool pdl, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashback
