// Hopper (sm_90a) backward for head dim 256, bf16: the fast path of flashback_attention_backward.
//
// Files, one per role (steps numbered as DESIGN.md section 4 everywhere):
//   bwd_sm90.h            this: the config, the kernel parameters, the entry points
//   bwd_sm90_prepost.cu   (0) preprocess: D = rowsum(dO * O), LSE * log2(e), both padded;
//                         postprocess: dQ = scale * dQaccum (un-permuted) to bf16
//   bwd_sm90_scheduler.cuh  which (K/V block, kv head, batch) a CTA owns; its Q-block walk
//   bwd_sm90_mainloop.cuh   TMA producer and the two consumer warpgroups, steps (1)-(7)
//   bwd_sm90_epilogue.cuh   dQ partial -> fp32 dQaccum (coalesced red.v4), dK / dV stores
//   bwd_sm90_launch.cu      kernel, tensor maps, workspace, can_implement, the launches
//
// dQ partials of different K/V blocks meet in fp32 atomics: not deterministic, unless
// p.deterministic, which launches the kernel's kDet instance: the adds into each tile then go
// in one fixed order (bwd_sm90_scheduler.cuh, bwd_sm90_epilogue.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "bwd_sm90/bwd_sm90_prepost.h"
#include "flashback/flashback.h"

namespace flashback {
namespace sm90 {

// Tile shape and warp roles. A CTA owns block_n rows of K and V (resident in shared memory)
// and walks the Q blocks of block_m rows that see them.
struct BwdSm90Config {
  int head_dim;
  int block_m;        // Q rows per step
  int block_n;        // K/V rows per CTA
  int q_stages;       // Q pipeline depth
  int do_stages;      // dO pipeline depth
  int producer_regs;  // setmaxnreg of the TMA warpgroup
  int consumer_regs;  // setmaxnreg of the two MMA warpgroups
};

// Two consumer warpgroups split the work by data, not by role (DESIGN.md section 5):
//   (1)-(4) warpgroup w computes S, dP, P, dS for all 64 queries and keys 40w..40w+39
//           (64 x 40 each) and stores P^T and dS^T in bf16 to shared memory;
//   one barrier: both halves of P^T and dS^T are there;
//   (5)-(7) warpgroup w computes dV^T, dK^T and dQ^T for head-dim rows 128w..128w+127 over all
//           80 keys (dV/dK accumulate across steps, dQ^T goes to dQaccum).
// Registers per consumer thread: dV^T + dK^T 2 x 128 x 80 / 128 = 160, dQ^T 64, S and dP 40
// (dead before dQ starts): <= 224 live accumulators under the 240 of setmaxnreg.
// Shared memory: K, V 40 KB each, Q 2 x 32 KB, dO 1 x 32 KB, P^T and dS^T 2 x 10 KB each
// (double-buffered: one barrier per step) = 216 KB. A second dO stage would need 228 KB.
constexpr BwdSm90Config kBwdSm90Hdim256 = {
    /*head_dim=*/256, /*block_m=*/64, /*block_n=*/80, /*q_stages=*/2, /*do_stages=*/1,
    /*producer_regs=*/24, /*consumer_regs=*/240};

// What the main kernel reads besides the tensor maps of Q, K, V, dO.
struct BwdSm90Params {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, group;  // group = nheads / nheads_k
  int m_blocks;     // ceil(seqlen_q / block_m): also the padded row count / block_m
  int n_blocks;     // ceil(seqlen_k / block_n)
  int l2_group;     // (batch, kv head) pairs scheduled together (bwd_sm90_scheduler.cuh)
  int causal;
  int head_inner;  // bit 0 Q, 1 K, 2 V, 3 dO: that tensor map's dims are {d, head, seq, batch}
                   // (else {d, seq, head, batch}); see make_map in bwd_sm90_launch.cu
  float scale_log2;     // softmax_scale * log2(e)
  float softmax_scale;  // dK = scale * sum dS^T Q
  // The workspace is indexed by tile (dq_tile in bwd_sm90_prepost.h; dense batches:
  // (batch, nheads, m_blocks) tiles):
  const float* lse_log2;  // 64 rows per tile: LSE * log2(e), +inf padding
  const float* dsum;      // same: D = rowsum(dO * O), 0 padding
  float* dq_accum;        // block_m x 256 fp32 per tile, fragment order
  DqTiles dq_tiles;
  // Deterministic mode (deterministic=True): per dQaccum tile and phase of the adds (the first
  // or the second quarter each consumer warpgroup adds), how many K/V blocks have added theirs. Each tile takes the adds in one fixed order
  // (bwd_sm90_dq_rank in bwd_sm90_scheduler.cuh), so every element is summed the same way
  // every run. Null otherwise.
  int* dq_turn;           // per workspace tile (dq_tile, bwd_sm90_prepost.h): 2 counters
  int det_chunk;          // deterministic, non-causal: CTAs per chunk of the grid (the SM count)
  int block_base;         // grid index of this launch's CTA 0 (cooperative chunk launches), else 0
  // Varlen (flashback.h): per-sequence offsets, null for dense batches; seqlen_q / seqlen_k
  // (and m_blocks / n_blocks) are then the longest sequence's, and the maps address packed rows.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  void* dk;
  void* dv;
  flashback_strides dk_strides, dv_strides;
};

// Does the fast path take these params? Static (no device state): head dim 256, bf16,
// every tensor TMA-addressable (16-byte aligned base, strides multiples of
// 16 bytes -- the API already demands both). `why` (may be null) gets the first reason not.
bool bwd_sm90_can_implement(const flashback_bwd_params& p, const char** why);

// Workspace bytes of the fast path (256-byte aligned parts): dQaccum, padded LSE*log2e and D.
size_t bwd_sm90_workspace_size(const flashback_bwd_params& p);

// Runs (0) preprocess, the main kernel, the postprocess on p.stream. Returns
// cudaErrorNotSupported without launching anything when a tensor map cannot be encoded (the
// caller then takes the reference path).
cudaError_t run_bwd_sm90(const flashback_bwd_params& p, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashback
