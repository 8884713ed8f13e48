// The backward's pre- and postprocess with their candidate kernels instantiated (see
// FLASHBACK_PREPOST_CANDIDATES in bwd_sm90_prepost.cu), for the `flashback_candidates` target.
#define FLASHBACK_PREPOST_CANDIDATES 1
#include "bwd_sm90/bwd_sm90_prepost.cu"
