// Division by a divisor fixed for a whole kernel launch, without the GPU's integer division.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashback {

// n / d for 0 <= n < 2^31 and 1 <= d < 2^31 by a multiply-high, an add and a shift instead of
// an integer division (about 20 instructions on the GPU): with l = ceil(log2 d) and
// m = floor(2^32 (2^l - d) / d) + 1, n / d = (umulhi(n, m) + n) >> l (Granlund and Montgomery,
// "Division by invariant integers using multiplication", PLDI 1994; the sum stays below 2^32
// for n < 2^31). Made on the host, once per call, for a divisor the kernel divides by per tile.
struct FastDiv {
  uint32_t d, m, l;
  static FastDiv of(uint32_t d) {
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    const uint64_t m = ((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1;
    return {d, static_cast<uint32_t>(m), l};
  }
  __device__ __forceinline__ int div(int n) const {
    return static_cast<int>((__umulhi(static_cast<uint32_t>(n), m) + static_cast<uint32_t>(n)) >> l);
  }
};

}  // namespace flashback
