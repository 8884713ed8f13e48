// Where the gradients leave the Hopper backward's registers.
//
// (7) dQ: each consumer warpgroup holds a 64 x 64 fp32 dQ partial (a quarter u of the head
// dim) for the current (Q block, K/V block) pair and adds it into the fp32 dQaccum workspace.
// DESIGN.md section 5 measured the layout of the adds as the deciding factor (2.2 us per 64 KB
// tile when a warp covers whole 128-byte lines, 7.6-8 us straight from the fragment layout), so
// dQaccum is not row-major: tile (batch, head, Q block) stores quarter u, register group g
// (accumulator registers 4g..4g+3), thread t at float offset u*4096 + (g*128 + t)*4. One
// red.global.add.v4.f32 per thread per group then covers 512 contiguous bytes per warp.
// The postprocess kernel (bwd_sm90_prepost.cu) maps it back to rows and columns.
//
// dK, dV: written once per CTA as bf16 straight from the accumulator layout (a quad of lanes
// covers 16 contiguous bytes of a row); rows past seqlen_k are not written.
#pragma once

#include <cuda_bf16.h>

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_prepost.h"
#include "hopper/hopper.h"

namespace flashback {
namespace sm90 {

// 4 x fp32 atomic add (per element, relaxed, gpu scope); 16-byte aligned. PTX ISA 8.1, sm_90.
__device__ __forceinline__ void red_add_v4(float* dst, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

// (7) dQaccum[tile][quarter u] += dq (32 registers of an m64n64 accumulator).
__device__ __forceinline__ void add_dq_partial(const BwdSm90Params& p, int batch, int head,
                                               int m_block, int u, int t,
                                               const float (&dq)[32]) {
  const int64_t tile = (static_cast<int64_t>(batch) * p.nheads + head) * p.m_blocks + m_block;
  float* dst = p.dq_accum + tile * kDqTileFloats + u * (kDqTileFloats / 4) + t * 4;
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    red_add_v4(dst + g * 512, dq[4 * g], dq[4 * g + 1], dq[4 * g + 2], dq[4 * g + 3]);
  }
}

// dK or dV rows [n0, n0 + 64) of one kv head from an m64n256 accumulator, times `scale`.
__device__ __forceinline__ void store_dkv(void* out, const flashback_strides& st, int batch,
                                          int kv_head, int n0, int seqlen_k, int t, float scale,
                                          const float (&acc)[128]) {
  __nv_bfloat16* base = static_cast<__nv_bfloat16*>(out) + batch * st.batch + kv_head * st.head;
  const int r0 = n0 + hopper::acc_row(0, t);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int c = hopper::acc_col(4 * j, t);
    if (r0 < seqlen_k) {
      *reinterpret_cast<uint32_t*>(base + r0 * st.row + c) =
          hopper::pack_bf16x2(acc[4 * j] * scale, acc[4 * j + 1] * scale);
    }
    if (r0 + 8 < seqlen_k) {
      *reinterpret_cast<uint32_t*>(base + (r0 + 8) * st.row + c) =
          hopper::pack_bf16x2(acc[4 * j + 2] * scale, acc[4 * j + 3] * scale);
    }
  }
}

}  // namespace sm90
}  // namespace flashback
