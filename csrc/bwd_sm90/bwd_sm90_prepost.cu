// Pre- and postprocess kernels of the Hopper backward (head dim 256).
//
// (0) preprocess, one warp per Q row: D_i = rowsum(dO_i * O_i) and LSE_i * log2(e), written to
//     workspace rows padded to whole Q blocks (padding: D = 0, LSE = +inf, so padded rows give
//     P = exp2(S * scale_log2 - inf) = 0 and the main kernel needs no row bounds for them).
// postprocess, one CTA per (Q block, head, batch): dQ = scale * dQaccum to bf16. dQaccum holds
//     each 64 x 256 tile in the order the main kernel's wgmma accumulators add it (see
//     bwd_sm90_epilogue.cuh), so that its atomics cover whole 128-byte lines; this kernel maps
//     (quarter, group, thread, element) back to (row, column).
#include <cuda_bf16.h>

#include <cmath>

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_prepost.h"

namespace flashback {
namespace sm90 {
namespace {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kHeadDim = 256;
constexpr int kPreThreads = 256;
constexpr int kLanesPerRow = kHeadDim / 8;  // 16 bytes per lane
constexpr int kRowsPerCta = kPreThreads / kLanesPerRow;

__global__ void __launch_bounds__(kPreThreads)
    bwd_sm90_preprocess_kernel(const flashback_bwd_params p, int rows_padded, float* lse_log2,
                               float* dsum) {
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int row = blockIdx.x * kRowsPerCta + static_cast<int>(threadIdx.x) / kLanesPerRow;
  const int col = (static_cast<int>(threadIdx.x) % kLanesPerRow) * 8;
  if (row >= rows_padded) return;  // whole rows leave together: a row is one warp
  float acc = 0.f;
  if (row < p.seqlen_q) {
    const bf16* o = static_cast<const bf16*>(p.out) + batch * p.out_strides.batch +
                    head * p.out_strides.head + row * p.out_strides.row + col;
    const bf16* dout = static_cast<const bf16*>(p.dout) + batch * p.dout_strides.batch +
                       head * p.dout_strides.head + row * p.dout_strides.row + col;
    const uint4 o_raw = *reinterpret_cast<const uint4*>(o);
    const uint4 do_raw = *reinterpret_cast<const uint4*>(dout);
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o_raw);
    const __nv_bfloat162* do2 = reinterpret_cast<const __nv_bfloat162*>(&do_raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = __bfloat1622float2(o2[i]);
      const float2 b = __bfloat1622float2(do2[i]);
      acc += a.x * b.x + a.y * b.y;
    }
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  }
  if (col == 0) {
    const int64_t bh = static_cast<int64_t>(batch) * p.nheads + head;
    const int64_t idx = bh * rows_padded + row;
    dsum[idx] = acc;
    lse_log2[idx] = row < p.seqlen_q ? p.lse[bh * p.seqlen_q + row] * kLog2e : INFINITY;
  }
}

// Thread t reads, for quarter u (= 64-column block, u = 2 w + quarter of consumer warpgroup
// w in the main kernel) and g = 0..7, the float4 its wgmma accumulator registers 4g..4g+3
// added: rows r0 and r0 + 8 of the tile, columns c and c + 1 (FACTS section 3 accumulator
// layout, N = 64, column offset 64 u).
constexpr int kPostThreads = 256;

__global__ void __launch_bounds__(kPostThreads)
    bwd_sm90_postprocess_kernel(const flashback_bwd_params p, int m_blocks,
                                const float* dq_accum) {
  const int m_block = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int t = threadIdx.x % 128;
  const int64_t tile = (static_cast<int64_t>(batch) * p.nheads + head) * m_blocks + m_block;
  const int r0 = m_block * kDqTileRows + 16 * (t / 32) + (t % 32) / 4;
  bf16* dq = static_cast<bf16*>(p.dq) + batch * p.dq_strides.batch + head * p.dq_strides.head;
  const float s = p.softmax_scale;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int u = static_cast<int>(threadIdx.x) / 128 + 2 * pass;
    const float4* src =
        reinterpret_cast<const float4*>(dq_accum + tile * kDqTileFloats + u * (kDqTileFloats / 4)) + t;
#pragma unroll 4
    for (int g = 0; g < 8; ++g) {
      const float4 v = src[g * 128];
      const int c = 64 * u + 8 * g + 2 * (t % 4);
      if (r0 < p.seqlen_q) {
        *reinterpret_cast<__nv_bfloat162*>(dq + r0 * p.dq_strides.row + c) =
            __floats2bfloat162_rn(v.x * s, v.y * s);
      }
      if (r0 + 8 < p.seqlen_q) {
        *reinterpret_cast<__nv_bfloat162*>(dq + (r0 + 8) * p.dq_strides.row + c) =
            __floats2bfloat162_rn(v.z * s, v.w * s);
      }
    }
  }
}

template <class... KernelArgs, class... Args>
cudaError_t launch(void (*kernel)(KernelArgs...), dim3 grid, int threads, cudaStream_t stream,
                   Args&&... args) {
  kernel<<<grid, threads, 0, stream>>>(static_cast<Args&&>(args)...);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_bwd_sm90_preprocess(const flashback_bwd_params& p, int m_blocks,
                                       float* lse_log2, float* dsum, cudaStream_t stream) {
  const int rows_padded = m_blocks * kDqTileRows;
  const dim3 grid((rows_padded + kRowsPerCta - 1) / kRowsPerCta, p.nheads, p.batch);
  return launch(bwd_sm90_preprocess_kernel, grid, kPreThreads, stream, p, rows_padded, lse_log2,
                dsum);
}

cudaError_t launch_bwd_sm90_postprocess(const flashback_bwd_params& p, int m_blocks,
                                        const float* dq_accum, cudaStream_t stream) {
  const dim3 grid(m_blocks, p.nheads, p.batch);
  return launch(bwd_sm90_postprocess_kernel, grid, kPostThreads, stream, p, m_blocks, dq_accum);
}

}  // namespace sm90
}  // namespace flashback
