// The Hopper forward's head-dim-64 instances (bf16, fp16): one file per head dim so that a
// parallel build compiles them side by side.
#include "fwd_sm90/fwd_sm90_launch.cuh"
#include "sm90/sm90_family.h"

namespace flashback {
namespace sm90 {
#if FLASHBACK_SM90_HAS_HDIM_64
FLASHBACK_FWD_SM90_INSTANCES(64)
#endif
}  // namespace sm90
}  // namespace flashback
