// The three launches of the reference backward, one file each (run_reference_bwd in
// reference_bwd_launch.cu calls them in this order on one stream):
//   reference_bwd_preprocess.cu  (0) D_i = rowsum(dO_i * O_i) into the fp32 workspace
//   reference_bwd_dkdv.cu        (1)-(6): dK, dV; a CTA owns a K/V block, walks Q blocks
//   reference_bwd_dq.cu          (1)-(4), (7): dQ; a CTA owns a Q block, walks K/V blocks
// Splitting dQ from dK/dV recomputes S and dP once more (7 GEMMs instead of 5) but needs no
// atomics, so the gradients are bitwise reproducible.
#pragma once

#include <cuda_runtime.h>

#include "flashback/flashback.h"

namespace flashback {
namespace ref {

// dsum: (batch, nheads, seqlen_q) fp32, contiguous (the workspace).
template <int kHeadDim>
cudaError_t launch_bwd_preprocess(const flashback_bwd_params& p, float* dsum,
                                  cudaStream_t stream);
template <int kHeadDim>
cudaError_t launch_bwd_dkdv(const flashback_bwd_params& p, const float* dsum,
                            cudaStream_t stream);
template <int kHeadDim>
cudaError_t launch_bwd_dq(const flashback_bwd_params& p, const float* dsum, cudaStream_t stream);

}  // namespace ref
}  // namespace flashback
