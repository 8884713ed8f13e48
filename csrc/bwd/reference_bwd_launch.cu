// Reference backward entry points: workspace size and the three launches in order.
#include <cuda_runtime.h>

#include "bwd/reference_bwd.h"
#include "common/attention.cuh"
#include "launch.h"

namespace flashback {
namespace {

// The workspace holds D = rowsum(dO * O), fp32 (batch, nheads, seqlen_q), contiguous.
size_t dsum_bytes(const flashback_bwd_params& p) {
  return static_cast<size_t>(p.batch) * p.nheads * p.seqlen_q * sizeof(float);
}

template <int kHeadDim>
cudaError_t run_bwd(const flashback_bwd_params& p, cudaStream_t stream) {
  float* dsum = static_cast<float*>(p.workspace);
  // (0) D_i = rowsum(dO_i * O_i)
  cudaError_t err = ref::launch_bwd_preprocess<kHeadDim>(p, dsum, stream);
  if (err != cudaSuccess) return err;
  // (1)-(6): dK, dV
  err = ref::launch_bwd_dkdv<kHeadDim>(p, dsum, stream);
  if (err != cudaSuccess) return err;
  // (1)-(4), (7): dQ
  return ref::launch_bwd_dq<kHeadDim>(p, dsum, stream);
}

}  // namespace

size_t reference_bwd_workspace_size(const flashback_bwd_params& p) {
  constexpr size_t kAlign = 256;
  return (dsum_bytes(p) + kAlign - 1) / kAlign * kAlign;
}

cudaError_t run_reference_bwd(const flashback_bwd_params& p, cudaStream_t stream) {
  switch (p.headdim) {
#define FLASHBACK_REF_BWD_CASE(d) \
  case d:                         \
    return run_bwd<d>(p, stream);
    FLASHBACK_REF_FOR_EACH_HEADDIM(FLASHBACK_REF_BWD_CASE)
#undef FLASHBACK_REF_BWD_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace flashback
