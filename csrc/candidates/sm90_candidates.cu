// The Hopper kernels' candidate configs (bwd_sm90.h, fwd_sm90.h; each has a section in
// docs/perf-log.md with its prediction and how to measure it): their kernels, compiled for bf16
// (the backward's in both modes) by the `flashback_candidates` target, which CI builds and
// nothing links. So a change that breaks a candidate shows before anyone swaps it into a table.
#include "bwd_sm90/bwd_sm90_launch.cuh"

namespace flashback {
namespace sm90 {
#define FLASHBACK_BWD_CANDIDATE(C)                                               \
  template cudaError_t run_bwd_sm90_config<BwdSm90Traits<C, Dtype::kBf16>, false>(   \
      const flashback_bwd_params&, cudaStream_t);                                  \
  template cudaError_t run_bwd_sm90_config<BwdSm90Traits<C, Dtype::kBf16>, true>(    \
      const flashback_bwd_params&, cudaStream_t);
FLASHBACK_BWD_CANDIDATE(kBwdSm90Hdim192Wg3)
FLASHBACK_BWD_CANDIDATE(kBwdSm90Hdim192Wg2)
FLASHBACK_BWD_CANDIDATE(kBwdSm90Hdim256Timeline)
FLASHBACK_BWD_CANDIDATE(kBwdSm90Hdim192Tail2)
FLASHBACK_BWD_CANDIDATE(kBwdSm90Hdim192Tail3)
FLASHBACK_BWD_CANDIDATE(kBwdSm90Hdim128Own)
FLASHBACK_BWD_CANDIDATE(kBwdSm90Hdim128OwnLate)
#undef FLASHBACK_BWD_CANDIDATE
}  // namespace sm90
}  // namespace flashback
