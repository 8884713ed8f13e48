// Which members of the Hopper kernel family this build compiled, as one list both kernels'
// tables (fwd_sm90_launch.cu, bwd_sm90_launch.cu) and instance files expand.
//
// The build passes FLASHBACK_HEADDIM_<d> for every head dim it wants (CMake's
// FLASHBACK_HEADDIMS) and FLASHBACK_WITH_BF16 / FLASHBACK_WITH_FP16 for every dtype it wants
// (CMake's FLASHBACK_DTYPES); a translation unit compiled on its own gets all of them. Each
// compiled head dim has one forward config and a backward config per mode (fwd_sm90.h;
// bwd_sm90.h: default and deterministic, often the same), each instantiated for every compiled
// dtype. Adding a head dim: a config in each header, a line
// below, an instance file per kernel, and the measurement in docs/perf-log.md.
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

// The dtypes of the family's instances: FLASHBACK_SM90_HAS_BF16 / _FP16 are 1 or 0.
#if !defined(FLASHBACK_WITH_BF16) && !defined(FLASHBACK_WITH_FP16)
#define FLASHBACK_SM90_HAS_BF16 1
#define FLASHBACK_SM90_HAS_FP16 1
#else
#ifdef FLASHBACK_WITH_BF16
#define FLASHBACK_SM90_HAS_BF16 1
#else
#define FLASHBACK_SM90_HAS_BF16 0
#endif
#ifdef FLASHBACK_WITH_FP16
#define FLASHBACK_SM90_HAS_FP16 1
#else
#define FLASHBACK_SM90_HAS_FP16 0
#endif
#endif

// IF_<dtype>(tokens): the tokens when the build compiles that dtype, else nothing (the instance
// definitions). <dtype>_OR_NULL(function): the function, or nullptr when the dtype is not
// compiled (the table rows), so that nothing names an instance the build left out.
#if FLASHBACK_SM90_HAS_BF16
#define FLASHBACK_SM90_IF_BF16(...) __VA_ARGS__
#define FLASHBACK_SM90_BF16_OR_NULL(...) __VA_ARGS__
#else
#define FLASHBACK_SM90_IF_BF16(...)
#define FLASHBACK_SM90_BF16_OR_NULL(...) nullptr
#endif
#if FLASHBACK_SM90_HAS_FP16
#define FLASHBACK_SM90_IF_FP16(...) __VA_ARGS__
#define FLASHBACK_SM90_FP16_OR_NULL(...) __VA_ARGS__
#else
#define FLASHBACK_SM90_IF_FP16(...)
#define FLASHBACK_SM90_FP16_OR_NULL(...) nullptr
#endif

namespace flashback {
namespace sm90 {

// Whether this build compiled the family's instances of `dtype` (FLASHBACK_DTYPES).
constexpr bool dtype_compiled(flashback_dtype dtype) {
  return dtype == FLASHBACK_DTYPE_BF16   ? FLASHBACK_SM90_HAS_BF16 != 0
         : dtype == FLASHBACK_DTYPE_FP16 ? FLASHBACK_SM90_HAS_FP16 != 0
                                         : false;
}

// Why a bf16 or fp16 call finds no instance in this build (the reason can_implement and the C
// API give), or null when it finds one (or the dtype is neither).
inline const char* dtype_not_compiled(flashback_dtype dtype) {
  if (dtype == FLASHBACK_DTYPE_BF16 && !dtype_compiled(dtype))
    return "bf16 not compiled in this build (FLASHBACK_DTYPES)";
  if (dtype == FLASHBACK_DTYPE_FP16 && !dtype_compiled(dtype))
    return "fp16 not compiled in this build (FLASHBACK_DTYPES)";
  return nullptr;
}

// One row of a kernel's table (fwd_sm90_launch.cu, bwd_sm90_launch.cu): a head dim, its config
// and its instances, one per dtype; an instance is null when the build did not compile its dtype.
template <class Config, class Params>
struct Sm90Row {
  using Run = cudaError_t (*)(const Params&, cudaStream_t);
  int head_dim;
  const Config* cfg;
  Run bf16, fp16;
  // The instance of `dtype`, or null (a dtype the build left out, or neither bf16 nor fp16).
  Run instance(flashback_dtype dtype) const {
    return dtype == FLASHBACK_DTYPE_BF16 ? bf16 : dtype == FLASHBACK_DTYPE_FP16 ? fp16 : nullptr;
  }
  // can_implement declines what has no instance; should such a call get here all the same, it
  // launches nothing.
  cudaError_t run(const Params& p, cudaStream_t stream) const {
    const Run f = instance(p.dtype);
    return f != nullptr ? f(p, stream) : cudaErrorNotSupported;
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
