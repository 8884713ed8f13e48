// Which members of the Hopper kernel family this build compiled, as one list both kernels'
// tables (fwd_sm90_launch.cu, bwd_sm90_launch.cu) and instance files expand.
//
// The build passes FLASHBACK_HEADDIM_<d> for every head dim it wants (CMake's
// FLASHBACK_HEADDIMS); a translation unit compiled on its own gets all of them. Each compiled
// head dim has one forward and one backward config (fwd_sm90.h, bwd_sm90.h), each instantiated
// for bf16 and fp16. Adding a head dim: a config in each header, a line below, an instance
// file per kernel, and the measurement in docs/perf-log.md.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "flashback/flashback.h"

#if !defined(FLASHBACK_HEADDIM_64) && !defined(FLASHBACK_HEADDIM_128) && \
    !defined(FLASHBACK_HEADDIM_192) && !defined(FLASHBACK_HEADDIM_256)
#define FLASHBACK_SM90_HAS_HDIM_64 1
#define FLASHBACK_SM90_HAS_HDIM_128 1
#define FLASHBACK_SM90_HAS_HDIM_192 1
#define FLASHBACK_SM90_HAS_HDIM_256 1
#else
#ifdef FLASHBACK_HEADDIM_64
#define FLASHBACK_SM90_HAS_HDIM_64 1
#endif
#ifdef FLASHBACK_HEADDIM_128
#define FLASHBACK_SM90_HAS_HDIM_128 1
#endif
#ifdef FLASHBACK_HEADDIM_192
#define FLASHBACK_SM90_HAS_HDIM_192 1
#endif
#ifdef FLASHBACK_HEADDIM_256
#define FLASHBACK_SM90_HAS_HDIM_256 1
#endif
#endif

#if FLASHBACK_SM90_HAS_HDIM_64
#define FLASHBACK_SM90_HDIM_64(X) X(64)
#else
#define FLASHBACK_SM90_HDIM_64(X)
#endif
#if FLASHBACK_SM90_HAS_HDIM_128
#define FLASHBACK_SM90_HDIM_128(X) X(128)
#else
#define FLASHBACK_SM90_HDIM_128(X)
#endif
#if FLASHBACK_SM90_HAS_HDIM_192
#define FLASHBACK_SM90_HDIM_192(X) X(192)
#else
#define FLASHBACK_SM90_HDIM_192(X)
#endif
#if FLASHBACK_SM90_HAS_HDIM_256
#define FLASHBACK_SM90_HDIM_256(X) X(256)
#else
#define FLASHBACK_SM90_HDIM_256(X)
#endif

// X(d) once per compiled head dim of the family.
#define FLASHBACK_SM90_FOR_EACH_HEADDIM(X) \
  FLASHBACK_SM90_HDIM_64(X) FLASHBACK_SM90_HDIM_128(X) FLASHBACK_SM90_HDIM_192(X) FLASHBACK_SM90_HDIM_256(X)

namespace flashback {
namespace sm90 {

// One row of a kernel's table (fwd_sm90_launch.cu, bwd_sm90_launch.cu): a head dim, its config
// and its two instances.
template <class Config, class Params>
struct Sm90Row {
  using Run = cudaError_t (*)(const Params&, cudaStream_t);
  int head_dim;
  const Config* cfg;
  Run bf16, fp16;
  cudaError_t run(const Params& p, cudaStream_t stream) const {
    return (p.dtype == FLASHBACK_DTYPE_FP16 ? fp16 : bf16)(p, stream);
  }
};

// The row of `head_dim` in a table that ends with a row of null cfg, or null.
template <class Row, size_t N>
const Row* find_row(const Row (&table)[N], int head_dim) {
  for (const Row& r : table) {
    if (r.cfg != nullptr && r.head_dim == head_dim) return &r;
  }
  return nullptr;
}

}  // namespace sm90
}  // namespace flashback
