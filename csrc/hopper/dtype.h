// The 16-bit input types the Hopper kernels take. One enum, used as a template argument by the
// wgmma wrappers, the conversions below and the tensor maps, so that a kernel is written once
// for both: wgmma, TMA and stmatrix move 16-bit elements the same way whatever their format;
// only the MMA's type field and the fp32 -> 16-bit conversions differ.
#pragma once

#include <cstdint>

namespace flashback {
namespace hopper {

enum class Dtype { kBf16, kF16 };

}  // namespace hopper
}  // namespace flashback
