// exp2_approx test: every input of the array through the device wrapper; the caller compares
// with a float64 2^x (relative error, flush to zero below 2^-126, inf and NaN in and out).
#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

__global__ void exp2_approx_kernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fh::exp2_approx(x[i]);
}

}  // namespace

FBH_EXPORT int fbh_exp2_approx(const void* x, void* y, int n) {
  exp2_approx_kernel<<<(n + 255) / 256, 256>>>(static_cast<const float*>(x), static_cast<float*>(y), n);
  return (int)cudaGetLastError();
}
