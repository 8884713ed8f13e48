// Entry points of the pre/postprocess kernels (bwd_sm90_prepost.cu) and the dQaccum tile
// shape they share with the main kernel.
#pragma once

#include <cuda_runtime.h>

#include "flashback/flashback.h"

namespace flashback {
namespace sm90 {

// One dQaccum tile: block_m rows x 256 columns of fp32, stored in accumulator-fragment order.
constexpr int kDqTileRows = 64;
constexpr int kDqTileFloats = kDqTileRows * 256;

cudaError_t launch_bwd_sm90_preprocess(const flashback_bwd_params& p, int m_blocks,
                                       float* lse_log2, float* dsum, cudaStream_t stream);
cudaError_t launch_bwd_sm90_postprocess(const flashback_bwd_params& p, int m_blocks,
                                        const float* dq_accum, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashback
