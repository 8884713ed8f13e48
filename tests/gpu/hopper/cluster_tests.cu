// Cluster and register tests: cluster launch with cudaLaunchKernelEx, %cluster_ctarank /
// %cluster_nctarank, distributed shared memory reads and writes through mapa, the cluster
// barrier; and setmaxnreg moving registers from a producer warpgroup to two consumers.
#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

// Each CTA fills a[] from `in`; after a cluster barrier it reads a peer's a[] (rank + 1) through
// DSMEM and writes a value into that peer's b[]; after a second barrier it reports its own b[].
__global__ void cluster_dsmem_kernel(const float* in, float* out_read, float* out_written,
                                     int* out_rank) {
  __shared__ float a[128], b[128];
  const int t = threadIdx.x;
  const uint32_t rank = fh::cluster_ctarank();
  const uint32_t cs = fh::cluster_size();
  a[t] = in[blockIdx.x * 128 + t];
  fh::cluster_sync();  // all CTAs started and a[] written before any peer reads it
  const uint32_t peer = (rank + 1) % cs;
  const float v = fh::ld_shared_cluster_f32(fh::mapa_shared(fh::smem_u32(&a[(t + 3) % 128]), peer));
  out_read[blockIdx.x * 128 + t] = v;
  fh::st_shared_cluster_f32(fh::mapa_shared(fh::smem_u32(&b[t]), peer), v * 2.0f + rank);
  fh::cluster_sync();  // peers' writes into b[] visible; no CTA exits while others still access it
  out_written[blockIdx.x * 128 + t] = b[t];
  if (t == 0) {
    out_rank[blockIdx.x * 2] = rank;
    out_rank[blockIdx.x * 2 + 1] = cs;
  }
}

// 384 threads, 168 registers each at entry (65536 / 384 rounded down to 8). Warpgroup 0 drops to
// 40, warpgroups 1-2 rise to 232: 128*40 + 256*232 = 64512 <= 384*168. Consumers then hold 128
// loaded values live at once; every thread writes a result.
constexpr int kLive = 128;
__global__ void __launch_bounds__(384, 1) setmaxnreg_kernel(const float* in, float* out) {
  const int wg = fh::warpgroup_index();
  const int i = threadIdx.x % 128;
  if (wg == 0) {
    fh::setmaxnreg_dec<40>();
    out[i] = in[i] * 3.0f;
  } else {
    fh::setmaxnreg_inc<232>();
    const int c = wg - 1;
    const float* src = in + 128 + (c * 128 + i) * kLive;
    float v[kLive];
#pragma unroll
    for (int j = 0; j < kLive; ++j) v[j] = src[j];
    float* dst = out + 128 + (c * 128 + i) * kLive;
#pragma unroll
    for (int j = 0; j < kLive; ++j) dst[j] = v[j] * v[kLive - 1 - j] + v[(j + 1) % kLive];
  }
}

}  // namespace

// in: fp32 [nclusters * cs][128]. out_read / out_written: same shape; out_rank: int [nctas][2].
FBH_EXPORT int fbh_cluster_dsmem(const float* in, float* out_read, float* out_written, int* out_rank,
                                 int cluster_size, int nclusters) {
  if (cluster_size > 8) {
    FBH_TRY(cudaFuncSetAttribute(cluster_dsmem_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  FBH_TRY(fh::launch_with_cluster(cluster_dsmem_kernel, dim3(cluster_size * nclusters), dim3(128), 0,
                                  0, dim3(cluster_size, 1, 1), in, out_read, out_written, out_rank));
  return (int)cudaGetLastError();
}

// in: fp32 [128 + 256 * 128]; out: same. out[i] = 3 in[i] (i < 128); consumer thread k's block
// of 128: out[j] = v[j] * v[127 - j] + v[(j + 1) % 128] with v = its input block.
FBH_EXPORT int fbh_setmaxnreg(const float* in, float* out) {
  setmaxnreg_kernel<<<1, 384>>>(in, out);
  return (int)cudaGetLastError();
}
