// The Hopper backward's head-dim-192 instances (bf16, fp16; each with its deterministic
// variant): one file per head dim so that a parallel build compiles them side by side.
#include "bwd_sm90/bwd_sm90_launch.cuh"
#include "sm90/sm90_family.h"

namespace flashback {
namespace sm90 {
#if FLASHBACK_SM90_HAS_HDIM_192
FLASHBACK_BWD_SM90_INSTANCES(192)
#endif
}  // namespace sm90
}  // namespace flashback
