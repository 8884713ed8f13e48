// Programmatic dependent launch: a secondary kernel launched with pdl_attribute() starts while
// the primary still runs (the primary's CTAs let it go at their start, then sleep), and after
// grid_dependency_wait() it sees everything the primary wrote.
#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

// Each CTA lets the dependent go, sleeps ~`sleep_ns`, then writes its 128 values and counts
// itself done.
__global__ void pdl_primary_kernel(float* buf, int* done, long long sleep_ns) {
  fh::launch_dependents();
  const long long start = clock64();
  while (clock64() - start < sleep_ns * 2) __nanosleep(1000);  // ~2 cycles per ns
  buf[blockIdx.x * 128 + threadIdx.x] = 3.0f * (blockIdx.x * 128 + threadIdx.x) + 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(done, 1);
  }
}

// Before its wait, thread 0 of each CTA records how many primary CTAs had finished (fewer than
// all: this CTA started early); after it, every thread reads the primary's values.
__global__ void pdl_secondary_kernel(const float* buf, float* out, const int* done, int* seen,
                                     int primary_ctas) {
  if (threadIdx.x == 0) {
    seen[blockIdx.x] = *reinterpret_cast<const volatile int*>(done);
  }
  fh::grid_dependency_wait();
  const int i = blockIdx.x * 128 + threadIdx.x;
  out[i] = 2.0f * buf[i % (primary_ctas * 128)];
}

}  // namespace

// buf: fp32 [ctas][128] (poisoned by the caller), out: fp32 [ctas][128], done: int [1] (0),
// seen: int [ctas]. out[i] = 2 buf[i]; seen[c] = primary CTAs finished when secondary CTA c
// started.
// own_stream: both kernels on a stream created here (non-blocking) instead of the legacy default
// stream.
FBH_EXPORT int fbh_pdl_order(float* buf, float* out, int* done, int* seen, int ctas, long long sleep_ns,
                             int own_stream) {
  cudaStream_t stream = 0;
  if (own_stream) FBH_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  pdl_primary_kernel<<<ctas, 128, 0, stream>>>(buf, done, sleep_ns);
  FBH_TRY(cudaGetLastError());
  FBH_TRY(fh::launch_kernel(pdl_secondary_kernel, dim3(ctas), dim3(128), 0, stream, dim3(1, 1, 1),
                            true, static_cast<const float*>(buf), out, static_cast<const int*>(done),
                            seen, ctas));
  if (own_stream) {
    FBH_TRY(cudaStreamSynchronize(stream));
    FBH_TRY(cudaStreamDestroy(stream));
  }
  return (int)cudaGetLastError();
}
