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
// Not deterministic: dQ partials of different K/V blocks meet in fp32 atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "flashback/flashback.h"

namespace flashback {
namespace sm90 {

// Tile shape and warp roles. A CTA owns block_n rows of K and V (resident in shared memory)
// and walks the Q blocks of block_m rows that see them.
struct BwdSm90Config {
  int head_dim;
  int block_m;        // Q rows per step (wgmma N of S^T / dP^T, K of dV / dK)
  int block_n;        // K/V rows per CTA (wgmma M of every transposed GEMM)
  int q_stages;       // Q/dO pipeline depth
  int producer_regs;  // setmaxnreg of the TMA warpgroup
  int consumer_regs;  // setmaxnreg of the two MMA warpgroups
};

// Two consumer warpgroups over the same 64 K/V rows, split by role so that one thread never
// holds both dK and dV (2 x 128 fp32 registers at d = 256, DESIGN.md section 5):
//   warpgroup A: (1) S^T, (2) P^T, (5) dV += P^T dO, (7) dQ[:, 0:128]
//   warpgroup B: (3) dP^T, (4) dS^T, (6) dK += dS^T Q, (7) dQ[:, 128:256]
// Each does 2.5 of the 5 GEMMs of a tile pair. P^T goes from A to B through shared memory
// (fp32), dS through shared memory as the wgmma operand of (7).
// Registers: 128 (dV or dK) + 64 (dQ half) + 16 (bf16 fragments) + addresses < 240.
constexpr BwdSm90Config kBwdSm90Hdim256 = {
    /*head_dim=*/256, /*block_m=*/64, /*block_n=*/64, /*q_stages=*/2,
    /*producer_regs=*/24, /*consumer_regs=*/240};

// What the main kernel reads besides the tensor maps of Q, K, V, dO.
struct BwdSm90Params {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, group;  // group = nheads / nheads_k
  int m_blocks;     // ceil(seqlen_q / block_m): also the padded row count / block_m
  int n_blocks;     // ceil(seqlen_k / block_n)
  int causal;
  int head_inner;  // bit 0 Q, 1 K, 2 V, 3 dO: that tensor map's dims are {d, head, seq, batch}
                   // (else {d, seq, head, batch}); see make_map in bwd_sm90_launch.cu
  float scale_log2;     // softmax_scale * log2(e)
  float softmax_scale;  // dK = scale * sum dS^T Q
  const float* lse_log2;  // (batch, nheads, m_blocks * block_m): LSE * log2(e), +inf padding
  const float* dsum;      // same shape: D = rowsum(dO * O), 0 padding
  float* dq_accum;        // (batch, nheads, m_blocks) tiles of block_m x 256 fp32, fragment order
  void* dk;
  void* dv;
  flashback_strides dk_strides, dv_strides;
};

// Does the fast path take these params? Static (no device state): head dim 256, bf16,
// not deterministic, every tensor TMA-addressable (16-byte aligned base, strides multiples of
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
