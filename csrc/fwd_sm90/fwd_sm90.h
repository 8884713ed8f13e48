// Hopper (sm_90a) forward for head dim 256, bf16: the fast path of flashback_attention_forward.
//
// Files, one per role:
//   fwd_sm90.h             this: the config, the kernel parameters, the entry points
//   fwd_sm90_scheduler.cuh which (Q block, head, batch) a CTA owns; the K/V blocks it walks
//   fwd_sm90_mainloop.cuh  TMA producer and the two consumer warpgroups (S = Q K^T, online
//                          softmax, O += P V)
//   fwd_sm90_epilogue.cuh  O / l to bf16 through shared memory, LSE
//   fwd_sm90_launch.cu     kernel, tensor maps, can_implement, the launch
// Shared with the backward: csrc/sm90/sm90_common.h (tensor maps, layout test, causal ranges).
#pragma once

#include <cuda_runtime.h>

#include "flashback/flashback.h"

namespace flashback {
namespace sm90 {

struct FwdSm90Config {
  int head_dim;
  int block_m;        // Q rows per CTA: 64 per consumer warpgroup
  int block_n;        // K/V rows per step
  int kv_stages;      // K and V pipeline depth
  int producer_regs;  // setmaxnreg of the TMA warpgroup
  int consumer_regs;  // setmaxnreg of the two MMA warpgroups
};

// 128 x 80 (FA3's hdim-256 forward tile): per consumer thread O is 64 x 256 / 128 = 128 fp32
// registers, S 40, P as bf16 A fragments 20. Shared memory: Q 64 KB + 2 stages of K and V
// (40 KB each) = 224 KB.
constexpr FwdSm90Config kFwdSm90Hdim256 = {
    /*head_dim=*/256, /*block_m=*/128, /*block_n=*/80, /*kv_stages=*/2,
    /*producer_regs=*/24, /*consumer_regs=*/240};

struct FwdSm90Params {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, group;  // group = nheads / nheads_k
  int m_blocks;  // ceil(seqlen_q / block_m)
  int n_blocks;  // ceil(seqlen_k / block_n)
  int l2_group;  // (batch, head) pairs scheduled together (fwd_sm90_scheduler.cuh)
  int num_tiles;  // m_blocks * nheads * batch: the grid, or the persistent kernel's tile count
  int causal;
  int head_inner;       // bit 0 Q, 1 K, 2 V: that map's dims are {d, head, seq, batch}
  float scale_log2;     // softmax_scale * log2(e)
  float softmax_scale;
  void* out;
  flashback_strides out_strides;
  float* lse;  // (batch, nheads, seqlen_q), natural log; varlen: (nheads, total_q)
  // Varlen (flashback.h): per-sequence offsets, null for dense batches. seqlen_q / seqlen_k
  // are then the longest lengths (they size the grid); the maps address the packed rows.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q;
};

// Does the fast path take these params? Head dim 256, bf16, q/k/v TMA-addressable
// (sm90_common.h), dense or varlen. `why` (may be null) gets the first reason not.
bool fwd_sm90_can_implement(const flashback_fwd_params& p, const char** why);

// Runs the forward on `stream`. Returns cudaErrorNotSupported without launching anything when
// a tensor map cannot be encoded (the caller then takes the reference path).
cudaError_t run_fwd_sm90(const flashback_fwd_params& p, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashback
