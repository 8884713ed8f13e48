// Hopper forward: which config serves a call (the table), whether the fast path takes it
// (can_implement), and the dispatch to the instance.
#include <atomic>

#include "fwd_sm90/fwd_sm90.h"
#include "sm90/sm90_common.h"
#include "sm90/sm90_family.h"

namespace flashback {
namespace sm90 {

#define FLASHBACK_FWD_SM90_DECLARE(D)                                                        \
  cudaError_t run_fwd_sm90_hdim##D##_bf16(const flashback_fwd_params& p, cudaStream_t stream); \
  cudaError_t run_fwd_sm90_hdim##D##_fp16(const flashback_fwd_params& p, cudaStream_t stream);
FLASHBACK_SM90_FOR_EACH_HEADDIM(FLASHBACK_FWD_SM90_DECLARE)
#undef FLASHBACK_FWD_SM90_DECLARE

namespace {

// One row per head dim the family serves; each row runs bf16 and fp16. A row is compiled when
// the build asked for its head dim (FLASHBACK_HEADDIMS), an instance when it asked for its dtype
// (FLASHBACK_DTYPES; else null); sm90_family.h says which those are.
using FwdSm90Row = Sm90Row<FwdSm90Config, flashback_fwd_params>;

#define FLASHBACK_FWD_ROW(D)                                                                \
  FwdSm90Row{D, &kFwdSm90Hdim##D, FLASHBACK_SM90_BF16_OR_NULL(run_fwd_sm90_hdim##D##_bf16), \
            FLASHBACK_SM90_FP16_OR_NULL(run_fwd_sm90_hdim##D##_fp16)},
constexpr FwdSm90Row kTable[] = {FLASHBACK_SM90_FOR_EACH_HEADDIM(FLASHBACK_FWD_ROW)
                                     FwdSm90Row{0, nullptr, nullptr, nullptr}};
#undef FLASHBACK_FWD_ROW

}  // namespace

bool fwd_sm90_can_implement(const flashback_fwd_params& p, const char** why) {
  const char* reason = nullptr;
  const FwdSm90Row* row = find_row(kTable, p.headdim);
  if (row == nullptr) {
    reason = "no Hopper forward config for this headdim in this build";
  } else if (p.dtype != FLASHBACK_DTYPE_BF16 && p.dtype != FLASHBACK_DTYPE_FP16) {
    reason = "dtype is neither bf16 nor fp16";
  } else if (!dtype_compiled(p.dtype)) {
    reason = dtype_not_compiled(p.dtype);  // FLASHBACK_DTYPES left it out: the row's instance is null
  } else if (int64_t{(p.seqlen_q + 64 * row->cfg->consumer_wgs - 1) / (64 * row->cfg->consumer_wgs)} *
                 p.nheads * p.batch >
             int64_t{0x7fffffff}) {
    reason = "grid too large (batch x nheads x query blocks of the longest sequence)";
  } else {
    // out and lse are written with 16- and 4-byte stores (the API checks their alignment).
    const void* ptrs[3] = {p.q, p.k, p.v};
    const flashback_strides sts[3] = {map_strides(p.q_strides, p, true), map_strides(p.k_strides, p, false),
                                      map_strides(p.v_strides, p, false)};
    tma_layout_ok(ptrs, sts, 3, &reason);
  }
  if (why) *why = reason;
  return reason == nullptr;
}

namespace {
// The head dim's row of grid bounds (fwd_sm90.h says why each is what it is).
const FwdSm90Grid& grid_of(int headdim) {
  static constexpr FwdSm90Grid kNone = {0, 0, 0, 0, 0, 0, 0};  // not a head dim of this build
  switch (headdim) {
#define FLASHBACK_FWD_GRID_CASE(D) \
  case D:                          \
    return kFwdSm90Hdim##D##Grid;
    FLASHBACK_SM90_FOR_EACH_HEADDIM(FLASHBACK_FWD_GRID_CASE)
#undef FLASHBACK_FWD_GRID_CASE
    default:
      return kNone;
  }
}
}  // namespace

// varlen: seqlen_k is the longest sequence.
bool fwd_sm90_persistent(const flashback_fwd_params& p) {
  const FwdSm90Grid& g = grid_of(p.headdim);
  return p.seqlen_k <= (p.causal ? g.causal_static_keys : g.full_persistent_keys);
}

bool fwd_sm90_dynamic(const flashback_fwd_params& p) {
  return p.causal && p.seqlen_k <= grid_of(p.headdim).causal_counter_keys;
}

bool fwd_sm90_k_ahead(const flashback_fwd_params& p) {
  const FwdSm90Grid& g = grid_of(p.headdim);
  return p.seqlen_k <= (p.causal ? g.causal_k_ahead_keys : g.full_k_ahead_keys);
}

bool fwd_sm90_full_long(const flashback_fwd_params& p) {
  return !p.causal && p.seqlen_k > grid_of(p.headdim).full_long_keys;
}

bool fwd_sm90_multi_tile(const flashback_fwd_params& p) {
  return fwd_sm90_persistent(p) || (p.causal && p.seqlen_k <= grid_of(p.headdim).causal_multi_keys);
}

int fwd_sm90_sm_count() {
  static std::atomic<int> counts[64] = {};  // per device ordinal; 0 = not read yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  int n = counts[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    counts[dev].store(n, std::memory_order_relaxed);  // two threads at once both store the same
  }
  return n;
}

cudaError_t run_fwd_sm90(const flashback_fwd_params& p, cudaStream_t stream) {
  const FwdSm90Row* row = find_row(kTable, p.headdim);
  if (row == nullptr) return cudaErrorNotSupported;
  return row->run(p, stream);
}

}  // namespace sm90
}  // namespace flashback
