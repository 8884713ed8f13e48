// How fast an SM issues SS wgmma at the shapes of the d = 256 backward's S = Q K^T and dP = dO V^T
// (docs/perf-log.md, "S and dP at N = 40: the shared-memory bound"). Each k16 step of an SS
// m64nNk16 reads its A (64 x 16, 2 KB) and B (N x 16, 32 N bytes) from shared memory; at 128
// bytes per clock that takes 16 + N / 4 clocks against N / 2 clocks of math at the data sheet's
// dense rate (4096 FLOP per clock per SM), so below N = 64 the operands, not the tensor cores,
// would set the pace. The backward's two consumer warpgroups split S and dP by keys (N = 40
// each, the same A); split by role (one warpgroup S, the other dP) each would run N = 80.
//
// `wgs` warpgroups per CTA each issue `iters` tiles of 16 k-steps (K = 256, both operands K-major,
// 128B-swizzled), one commit and wait per tile, as the backward's S and dP do. roles = 0: every
// warpgroup reads the same A and its own N rows of one B tile of wgs x N rows (split by keys);
// roles = 1: warpgroup w reads an A and a B tile of its own (split by role). Shared memory is
// filled with pseudo-random bf16 in [-1, 1) (not zeros). Thread 0 of each CTA writes the clocks
// between two CTA barriers around the loops; `sink` gets each thread's accumulator sum so that
// nothing is optimised away.
#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

constexpr uint32_t kATileBytes = 64 * 512;  // 64 rows x 256 bf16: four 64 x 128 B atom-columns

__device__ uint32_t random_bf16x2(uint32_t i) {
  uint32_t h = i * 2654435761u ^ 0x9e3779b9u;
  h ^= h >> 15;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  const float lo = static_cast<float>(h & 0xffff) / 32768.0f - 1.0f;
  const float hi = static_cast<float>(h >> 16) / 32768.0f - 1.0f;
  return fh::pack_bf16x2(lo, hi);
}

template <int N>
__global__ void __launch_bounds__(256) wgmma_rate_kernel(int iters, int roles, long long* cycles,
                                                         float* sink) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = fh::align_smem(smem_raw);
  const int wgs = static_cast<int>(blockDim.x) / 128;
  const int wg = static_cast<int>(threadIdx.x) / 128;
  const uint32_t a_bytes = (roles ? wgs : 1) * kATileBytes;
  const uint32_t b_bytes = wgs * N * 512;
  uint32_t* words = reinterpret_cast<uint32_t*>(smem);
  for (uint32_t i = threadIdx.x; i < (a_bytes + b_bytes) / 4; i += blockDim.x) {
    words[i] = random_bf16x2(i + blockIdx.x * 65536u);
  }
  fh::fence_proxy_async_shared();  // generic writes -> wgmma (async proxy) reads
  __syncthreads();
  // B rows of this warpgroup: its own tile (roles) or rows N wg.. of the shared tile, whose
  // atom-columns are wgs x N rows high.
  const int b_rows = roles ? N : wgs * N;
  const uint8_t* a = smem + (roles ? wg * kATileBytes : 0);
  const uint8_t* b = smem + a_bytes + (roles ? wg * N * 512 : wg * N * 128);
  const uint64_t da = fh::desc_kmajor_sw128(a);
  const uint64_t db = fh::desc_kmajor_sw128(b);
  float acc[N / 2];
  fh::zero_acc(acc);
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    fh::wgmma_fence();
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      fh::wgmma_ss<N>(acc, fh::desc_advance(da, fh::kmajor_k_offset(s, 64)),
                      fh::desc_advance(db, fh::kmajor_k_offset(s, b_rows)), true);
    }
    fh::wgmma_commit();
    fh::wgmma_wait<0>();
  }
  fh::wgmma_fence_operand(acc);
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  float sum = 0.0f;
#pragma unroll
  for (int r = 0; r < N / 2; ++r) sum += acc[r];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

template <int N>
int run_rate(int wgs, int roles, int iters, int ctas, long long* cycles, float* sink) {
  if (wgs < 1 || wgs > 2 || iters < 1 || ctas < 1) return (int)cudaErrorInvalidValue;
  const size_t a_bytes = (roles ? wgs : 1) * size_t{kATileBytes};
  const size_t b_bytes = size_t{static_cast<unsigned>(wgs)} * N * 512;
  // At least 116 KB, so that one CTA runs per SM whatever the shape.
  const size_t smem = 1024 + std::max<size_t>(a_bytes + b_bytes, 116 * 1024);
  auto kernel = wgmma_rate_kernel<N>;
  FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(kernel), smem));
  kernel<<<ctas, 128 * wgs, smem>>>(iters, roles, cycles, sink);
  return (int)cudaGetLastError();
}

}  // namespace

// cycles: int64 [ctas]; sink: fp32 [ctas x 128 wgs]. n = 40, 64, 80 or 128; wgs 1 or 2.
FBH_EXPORT int fbh_wgmma_rate(int n, int wgs, int roles, int iters, int ctas, long long* cycles,
                              float* sink) {
  switch (n) {
    case 40: return run_rate<40>(wgs, roles, iters, ctas, cycles, sink);
    case 64: return run_rate<64>(wgs, roles, iters, ctas, cycles, sink);
    case 80: return run_rate<80>(wgs, roles, iters, ctas, cycles, sink);
    case 128: return run_rate<128>(wgs, roles, iters, ctas, cycles, sink);
    default: return (int)cudaErrorInvalidValue;
  }
}
