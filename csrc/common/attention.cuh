// Pieces every reference attention kernel shares: the mask, the block ranges it implies,
// the list of compiled head dims, and the launch helper.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <utility>

namespace flashback {
namespace ref {

constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))
constexpr float kLn2 = 0.6931471805599453f;    // log(x) = log2(x) * ln(2)
constexpr int kMaxSmemBytes = 227 * 1024;      // opt-in dynamic shared memory per CTA, sm_90

// Which (query row i, key column j) pairs are hidden. Causal masking is aligned bottom-right:
// row i sees key j iff j <= i + seqlen_k - seqlen_q, so with seqlen_q > seqlen_k the first
// seqlen_q - seqlen_k rows see nothing (their output is 0 and their LSE +inf).
struct Mask {
  int seqlen_q;
  int seqlen_k;
  bool causal;

  __device__ __forceinline__ bool operator()(int i, int j) const {
    return j >= seqlen_k || (causal && j > i + seqlen_k - seqlen_q);
  }

  // Number of key blocks that query rows [m0, m0 + block_m) have to visit: all of them, or
  // (causal) those up to the last key the block's last row sees. 0 when no row sees any key.
  __device__ __forceinline__ int n_block_end(int m0, int block_m, int block_n) const {
    int key_end = seqlen_k;
    if (causal) {
      const int last_row = min(m0 + block_m, seqlen_q) - 1;
      key_end = min(key_end, last_row + seqlen_k - seqlen_q + 1);
    }
    return key_end <= 0 ? 0 : (key_end + block_n - 1) / block_n;
  }

  // First query block that sees any key of rows [n0, ...): 0, or (causal) the block holding
  // the first row i with i + seqlen_k - seqlen_q >= n0. Later blocks all see at least n0.
  __device__ __forceinline__ int m_block_begin(int n0, int block_m) const {
    return causal ? max(0, n0 - seqlen_k + seqlen_q) / block_m : 0;
  }
};

// Dynamic shared memory above 48 KB needs an explicit opt-in per kernel. Setting it on every
// call is cheap (host-side attribute, no stream work), keeps the launch CUDA-graph safe, and
// avoids a per-device "already done" cache.
template <class... KernelArgs, class... Args>
cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, int threads, int smem_bytes,
                          cudaStream_t stream, Args&&... args) {
  if (smem_bytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, threads, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}

}  // namespace ref
}  // namespace flashback

// Head dims to instantiate: the build passes FLASHBACK_HEADDIM_<d> for each one it wants;
// a translation unit compiled on its own (no such macro) gets all of them.
#if !defined(FLASHBACK_HEADDIM_64) && !defined(FLASHBACK_HEADDIM_128) && !defined(FLASHBACK_HEADDIM_192) && \
    !defined(FLASHBACK_HEADDIM_256)
#define FLASHBACK_REF_HEADDIM_64(X) X(64)
#define FLASHBACK_REF_HEADDIM_128(X) X(128)
#define FLASHBACK_REF_HEADDIM_256(X) X(256)
#else
#ifdef FLASHBACK_HEADDIM_64
#define FLASHBACK_REF_HEADDIM_64(X) X(64)
#else
#define FLASHBACK_REF_HEADDIM_64(X)
#endif
#ifdef FLASHBACK_HEADDIM_128
#define FLASHBACK_REF_HEADDIM_128(X) X(128)
#else
#define FLASHBACK_REF_HEADDIM_128(X)
#endif
#ifdef FLASHBACK_HEADDIM_256
#define FLASHBACK_REF_HEADDIM_256(X) X(256)
#else
#define FLASHBACK_REF_HEADDIM_256(X)
#endif
#endif

// X(d) once for every compiled head dim (instantiations, dispatch switches). The reference
// kernels are bf16 only: a build that leaves bf16 out (FLASHBACK_DTYPES=fp16, which passes
// FLASHBACK_WITH_FP16 alone) compiles none of them.
#if defined(FLASHBACK_WITH_FP16) && !defined(FLASHBACK_WITH_BF16)
#define FLASHBACK_REF_FOR_EACH_HEADDIM(X)
#else
#define FLASHBACK_REF_FOR_EACH_HEADDIM(X) \
  FLASHBACK_REF_HEADDIM_64(X) FLASHBACK_REF_HEADDIM_128(X) FLASHBACK_REF_HEADDIM_256(X)
#endif
