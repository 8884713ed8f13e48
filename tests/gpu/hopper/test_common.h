// Helpers shared by the Hopper primitive test kernels. Each test is an extern "C" entry point
// taking raw device pointers; pytest (test_hopper_*.py) calls it through ctypes and compares the
// result with PyTorch. Entry points return a cudaError_t (0 = launched fine); the Python side
// synchronises and checks again.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "hopper/hopper.h"

#define FBH_EXPORT extern "C" __attribute__((visibility("default")))

#define FBH_TRY(expr)                               \
  do {                                              \
    cudaError_t err_ = (expr);                      \
    if (err_ != cudaSuccess) return (int)err_;      \
  } while (0)

namespace fbh_test {

// Contiguous tensor of `rank` dims (dims[0] innermost) -> byte strides of dims 1..rank-1.
inline void dense_strides(int rank, const uint64_t* dims, uint64_t elem_bytes, uint64_t* strides) {
  uint64_t s = elem_bytes;
  for (int i = 0; i + 1 < rank; ++i) {
    s *= dims[i];
    strides[i] = s;
  }
}

inline cudaError_t allow_smem(const void* kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

}  // namespace fbh_test
