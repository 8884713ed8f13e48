// setmaxnreg: move registers between the warpgroups of a CTA at run time. PTX ISA §9.7.19.5;
// hopper-facts.md §7.
//
// Why: in a warp-specialized kernel the TMA producer warpgroup needs a few dozen registers and
// the MMA warpgroups need ~200+ (a 64x256 fp32 accumulator alone is 128 per thread). The kernel
// starts with an even split (65536 / threads, rounded down to 8); the producer gives registers
// back to the per-CTA pool with .dec and the consumers take them with .inc.
//
// Rules: immediate in 24..256, multiple of 8; all threads of a warpgroup execute the same
// instruction (each role is one branch of a warp-uniform if/else); .inc blocks until the pool
// has enough, so budget sum(threads * count) <= 65536 or it deadlocks. The kernel needs a known
// register count at entry -- `__launch_bounds__(threads, 1)` -- or ptxas ignores setmaxnreg with
// warning C7508. In SASS a working setmaxnreg shows as USETMAXREG.
#pragma once

#include "hopper/common.h"

namespace flashback {
namespace hopper {

template <int Regs>
FB_DEVICE void setmaxnreg_inc() {
  static_assert(Regs >= 24 && Regs <= 256 && Regs % 8 == 0, "setmaxnreg takes 24..256, step 8");
#if FLASHBACK_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
#endif
}

template <int Regs>
FB_DEVICE void setmaxnreg_dec() {
  static_assert(Regs >= 24 && Regs <= 256 && Regs % 8 == 0, "setmaxnreg takes 24..256, step 8");
#if FLASHBACK_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
#endif
}

}  // namespace hopper
}  // namespace flashback
