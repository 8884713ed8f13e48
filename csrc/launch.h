// Entry points of the kernels, called by csrc/api.cu after it has validated the params.
// Each returns the CUDA error of its launches (cudaSuccess when all went out).
#pragma once

#include <cuda_runtime.h>

#include "flashback/flashback.h"

namespace flashback {

// Reference path (FlashAttention-2 style, warp-level mma.sync): every head dim in
// kSupportedHeadDims, any seqlen >= 1, causal or not, GQA/MQA. Deterministic.
cudaError_t run_reference_fwd(const flashback_fwd_params& p, cudaStream_t stream);

// Workspace bytes run_reference_bwd needs in p.workspace (256-byte aligned).
size_t reference_bwd_workspace_size(const flashback_bwd_params& p);
cudaError_t run_reference_bwd(const flashback_bwd_params& p, cudaStream_t stream);

}  // namespace flashback
