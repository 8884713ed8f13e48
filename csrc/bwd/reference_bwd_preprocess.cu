// Reference backward, step (0): D_i = rowsum(dO_i * O_i) in fp32.
//
// D_i equals sum_j P_ij dP_ij, the term the softmax backward subtracts in (4)
// dS = P * (dP - D). Computing it once per row here saves both later kernels a GEMM-sized
// reduction. A row is read by kHeadDim / 8 lanes, 16 bytes each, and reduced with shuffles.
#include <cuda_bf16.h>

#include "bwd/reference_bwd.h"
#include "common/attention.cuh"
#include "common/sequence.cuh"
#include "common/tile.cuh"

namespace flashback {
namespace ref {
namespace {

constexpr int kPreprocessThreads = 256;

template <int kHeadDim>
__global__ void __launch_bounds__(kPreprocessThreads)
    reference_bwd_preprocess_kernel(const flashback_bwd_params p, float* dsum) {
  constexpr int kLanesPerRow = kHeadDim / 8;
  constexpr int kRowsPerCta = kPreprocessThreads / kLanesPerRow;
  static_assert(32 % kLanesPerRow == 0, "a row's lanes sit inside one warp");

  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int row = blockIdx.x * kRowsPerCta + static_cast<int>(threadIdx.x) / kLanesPerRow;
  const int col = (static_cast<int>(threadIdx.x) % kLanesPerRow) * 8;

  const SeqRows seq = seq_rows(p, batch);
  float acc = 0.f;
  if (row < seq.seqlen_q) {
    const bf16* o = static_cast<const bf16*>(p.out) + seq.q_offset(p.out_strides) +
                    head * p.out_strides.head + row * p.out_strides.row + col;
    const bf16* dout = static_cast<const bf16*>(p.dout) + seq.q_offset(p.dout_strides) +
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
  // Rows past the end contribute 0 but still take part: every lane of the warp shuffles.
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  }
  if (col == 0 && row < seq.seqlen_q) {
    dsum[(static_cast<int64_t>(batch) * p.nheads + head) * p.seqlen_q + row] = acc;
  }
}

}  // namespace

template <int kHeadDim>
cudaError_t launch_bwd_preprocess(const flashback_bwd_params& p, float* dsum,
                                  cudaStream_t stream) {
  constexpr int kRowsPerCta = kPreprocessThreads / (kHeadDim / 8);
  const dim3 grid((p.seqlen_q + kRowsPerCta - 1) / kRowsPerCta, p.nheads, p.batch);
  return launch_kernel(reference_bwd_preprocess_kernel<kHeadDim>, grid, kPreprocessThreads, 0,
                       stream, p, dsum);
}

#define FLASHBACK_REF_INSTANTIATE(d)                                                        \
  template cudaError_t launch_bwd_preprocess<d>(const flashback_bwd_params&, float*, \
                                                cudaStream_t);
FLASHBACK_REF_FOR_EACH_HEADDIM(FLASHBACK_REF_INSTANTIATE)
#undef FLASHBACK_REF_INSTANTIATE

}  // namespace ref
}  // namespace flashback
