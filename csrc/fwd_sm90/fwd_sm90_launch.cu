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

// A tile's fixed costs (its Q load and the wait for the first K/V, the epilogue) are hidden by
// a persistent CTA under its previous tile, which pays when tiles are short: measured (H200,
// docs/perf-log.md "Persistent forward") +8 to +21% at seqlen 512-1024 and up to +9% at 2048.
// With long rows the fixed costs are small and the static tile stride costs more than they do:
// causal tiles then vary in length, and the longest-first order that a one-CTA-per-tile grid
// keeps (the hardware hands a free SM the next tile) is lost, -4 to -32% at 4096-16384 and
// already -7 to -23% at 1024-2048 for the causal d = 192 / 256 rows (few, long tiles).
// Non-causal tiles are all alike, so the static stride keeps its edge at longer rows where it was
// measured: at d = 192 every length (+2.4 / +2.3 / +1.3% at 4k / 8k / 16k), at d = 128 up to 4096
// keys (+3.3% at 4k; 8k read -1.9% in a noisy run). d = 64 / 256 were not measured past 2048
// (docs/perf-log.md, "The runbook measured").
bool fwd_sm90_persistent(const flashback_fwd_params& p) {
  // varlen: seqlen_k is the longest sequence
  if (!p.causal && p.headdim == 192) return true;
  if (!p.causal && p.headdim == 128) return p.seqlen_k <= 4096;
  if (p.seqlen_k > 2048) return false;
  return !p.causal || p.headdim <= 128;
}

// Tiles from a counter (configs with dynamic_tiles: every row), docs/perf-log.md "Forward tiles
// from a counter". Causal only: the counter keeps the longest-first order that the static stride
// loses. Measured against the persistent static stride (d <= 128) or one CTA per tile: at
// d <= 128 +2..+12% at 1k-2k, +0..+4% at 4k-16k, at 512 within 2%; at d = 192 / 256 +8.8 / +5.1%
// and +7.0 / +0.3% at 512 / 1024, but -1.1 / -3.1% at 2048 and 2-11% slower at 4k-16k. The
// next tile's id was then taken as a tile starts, a reservation that a freed CTA could not run;
// taken after the tile's last K/V loads (late_tile_fetch) the counter gains +0.9..+3.7% over one
// CTA per tile at d = 192 causal 2048-16384 (the main config, as measured), while d = 256 still
// trails from 4096 (-0.4 / -1.5%) and keeps one CTA per tile past 1024 keys. Non-causal tiles
// are all alike: the static stride (or one CTA per tile) measured 0.3-4.4% faster than the
// counter there.
namespace {
bool counter_by_length(const flashback_fwd_params& p) {
  return p.causal && (p.headdim <= 128 || p.seqlen_k <= 1024);  // varlen: the longest sequence
}
}  // namespace

bool fwd_sm90_dynamic(const flashback_fwd_params& p) {
  return counter_by_length(p) || (p.causal && p.headdim == 192);
}

bool fwd_sm90_multi_tile(const flashback_fwd_params& p) { return fwd_sm90_persistent(p) || counter_by_length(p); }

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
