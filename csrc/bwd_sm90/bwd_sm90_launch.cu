// Hopper backward: which config serves a call (the table), its workspace, whether the fast path
// takes it (can_implement), and the dispatch to the instance.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_launch.cuh"
#include "bwd_sm90/bwd_sm90_prepost.h"
#include "sm90/sm90_common.h"
#include "sm90/sm90_family.h"

namespace flashback {
namespace sm90 {

#define FLASHBACK_BWD_SM90_DECLARE(D)                                                        \
  cudaError_t run_bwd_sm90_hdim##D##_bf16(const flashback_bwd_params& p, cudaStream_t stream); \
  cudaError_t run_bwd_sm90_hdim##D##_fp16(const flashback_bwd_params& p, cudaStream_t stream);
FLASHBACK_SM90_FOR_EACH_HEADDIM(FLASHBACK_BWD_SM90_DECLARE)
#undef FLASHBACK_BWD_SM90_DECLARE

namespace {

// One row per head dim the family serves; each row runs bf16 and fp16 (sm90_family.h says which
// head dims and dtypes this build compiled; an instance left out is null).
using BwdSm90Row = Sm90Row<BwdSm90Config, flashback_bwd_params>;

#define FLASHBACK_BWD_ROW(D)                                                                \
  BwdSm90Row{D, &kBwdSm90Hdim##D, FLASHBACK_SM90_BF16_OR_NULL(run_bwd_sm90_hdim##D##_bf16), \
            FLASHBACK_SM90_FP16_OR_NULL(run_bwd_sm90_hdim##D##_fp16)},
constexpr BwdSm90Row kTable[] = {FLASHBACK_SM90_FOR_EACH_HEADDIM(FLASHBACK_BWD_ROW)
                                     BwdSm90Row{0, nullptr, nullptr, nullptr}};
#undef FLASHBACK_BWD_ROW

constexpr size_t kAlign = 256;

// The main kernel's CTAs for the longest sequence: one per K/V block (pair_dq: whole clusters
// of two).
int64_t grid_ctas(const BwdSm90Config& cfg, const flashback_bwd_params& p) {
  const int64_t unit_keys = int64_t{cfg.pair_dq ? 2 : 1} * cfg.block_n;
  return (p.seqlen_k + unit_keys - 1) / unit_keys * (cfg.pair_dq ? 2 : 1) * p.nheads_k * p.batch;
}

// 64-row dQ tiles per (batch, q head) of the longest sequence: its steps of block_m rows, each
// block_m / 64 tiles (what the workspace holds and the dQ conversion counts).
int64_t dq_tiles_per_head(int block_m, const flashback_bwd_params& p) {
  return (int64_t{p.seqlen_q} + block_m - 1) / block_m * (block_m / kDqTileRows);
}

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

bool bwd_sm90_det_cooperative() {
  static const bool on = env_switch("FLASHBACK_DET_COOPERATIVE");
  return on;
}

bool bwd_sm90_pdl() {
  static const bool on = [] {
    const char* v = std::getenv("FLASHBACK_BWD_PDL");
    return !(v != nullptr && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// FLASHBACK_BWD_PAIR: "0" never, "1" always (where a cluster fits), anything else automatic.
int bwd_sm90_pair_switch() {
  static const int value = [] {
    const char* v = std::getenv("FLASHBACK_BWD_PAIR");
    if (v != nullptr && std::strcmp(v, "0") == 0) return 0;
    if (v != nullptr && std::strcmp(v, "1") == 0) return 1;
    return -1;
  }();
  return value;
}

namespace {
std::atomic<const char*> g_last_kernel{""};  // static strings only
}  // namespace

void bwd_sm90_note_kernel(const char* kernel) { g_last_kernel.store(kernel, std::memory_order_relaxed); }
const char* bwd_sm90_last_kernel() { return g_last_kernel.load(std::memory_order_relaxed); }

namespace {
// The timeline buffer (flashback_debug_bwd_timeline): set before the calls it measures, by one
// thread; a measuring aid, so plain statics.
unsigned long long* g_timeline = nullptr;
int g_timeline_ctas = 0, g_timeline_steps = 0;
}  // namespace

void bwd_sm90_set_timeline(unsigned long long* buffer, int ctas, int steps) {
  g_timeline = buffer;
  g_timeline_ctas = buffer != nullptr ? ctas : 0;
  g_timeline_steps = buffer != nullptr ? steps : 0;
}

void bwd_sm90_timeline(unsigned long long** buffer, int* ctas, int* steps) {
  *buffer = g_timeline;
  *ctas = g_timeline_ctas;
  *steps = g_timeline_steps;
}

bool bwd_sm90_pair_pays(const flashback_bwd_params& p) {
  // FLASHBACK_DET_COOPERATIVE's chunked launches exist for one CTA per K/V block only.
  if (p.deterministic && !p.causal && bwd_sm90_det_cooperative()) return false;
  const int forced = bwd_sm90_pair_switch();
  if (forced >= 0) return forced == 1;
  // A CTA walks every q head of its kv head's group over the (longest) sequence's queries.
  const int64_t rows = int64_t{p.seqlen_q} * (p.nheads / p.nheads_k);
  return rows >= kBwdSm90PairMinRows;
}

WorkspaceParts bwd_sm90_workspace_parts(const flashback_bwd_params& p) {
  const BwdSm90Row* row = find_row(kTable, p.headdim);
  const int block_m = row != nullptr ? row->cfg->block_m : kDqTileRows;
  const int step_tiles = block_m / kDqTileRows;
  const int m_blocks = static_cast<int>(dq_tiles_per_head(block_m, p));  // 64-row tiles
  const size_t tiles = static_cast<size_t>(dq_tiles_total(p, m_blocks, step_tiles));
  const size_t rows = tiles * kDqTileRows;
  WorkspaceParts w;
  w.dq_accum = 0;
  w.dq_turn = align_up(tiles * static_cast<size_t>(dq_tile_floats(p.headdim)) * sizeof(float));
  w.lse = w.dq_turn + (p.deterministic ? align_up(tiles * kDqTurnsPerTile * sizeof(int)) : 0);
  w.dsum = w.lse + align_up(rows * sizeof(float));
  w.dq_post = w.dsum + align_up(rows * sizeof(float));
  w.split_done = w.dq_post + align_up(DqPostQueue::bytes(p.batch * p.nheads_k));
  // split_last_wave: room for the most split units the call could have (bwd_sm90_split_plan;
  // a partial wave has fewer units than the grid, and at most kBwdSm90SplitMaxUnits), where
  // the call's config could split: default mode, non-causal, dense, a long enough walk.
  w.split_units = 0;
  if (row != nullptr && row->cfg->split_last_wave && !p.deterministic && !p.causal &&
      p.cu_seqlens_q == nullptr &&
      int64_t{(p.seqlen_q + block_m - 1) / block_m} * (p.nheads / std::max(1, p.nheads_k)) >=
          kBwdSm90SplitMinSteps) {
    const int64_t units = grid_ctas(*row->cfg, p) / 2;
    w.split_units = static_cast<int>(std::min<int64_t>(units, kBwdSm90SplitMaxUnits));
  }
  w.split_dkv = w.split_done + align_up(2 * static_cast<size_t>(w.split_units) * sizeof(int));
  w.split_slot_bytes = row != nullptr ? size_t{2} * row->cfg->head_dim * row->cfg->block_n * sizeof(float) : 0;
  w.total = w.split_dkv + align_up(2 * static_cast<size_t>(w.split_units) * (kBwdSm90SplitMaxParts - 1) *
                                   w.split_slot_bytes);
  return w;
}

BwdSm90SplitPlan bwd_sm90_split_plan(int units, int slots, int m_blocks, int group) {
  const BwdSm90SplitPlan none;
  // FLASHBACK_BWD_SPLIT=0 (read once per process): never split, for A/B runs of a config that
  // splits against its own kernels unsplit.
  static const bool off = [] {
    const char* v = std::getenv("FLASHBACK_BWD_SPLIT");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  const int64_t walk = int64_t{m_blocks} * group;
  if (off || slots < 1 || walk < kBwdSm90SplitMinSteps) return none;
  const int r = units % slots;  // the partial last wave's units
  if (r == 0 || r > kBwdSm90SplitMaxUnits) return none;
  // The last wave's length in steps: one walk unsplit; with k parts ceil(r k / slots) waves of
  // the longest part's walk (each q head's Q blocks split k ways: group x ceil(m_blocks / k))
  // plus a step for what a part costs besides (its partial out or the sum in), the fill model's
  // overhead (scripts/bwd_balance_model.py, split_last_wave). Every part gets a Q block.
  int64_t best = walk;
  int best_k = 1;
  for (int k = 2; k <= kBwdSm90SplitMaxParts && k <= m_blocks; ++k) {
    const int64_t waves = (int64_t{r} * k + slots - 1) / slots;
    const int64_t len = waves * (int64_t{group} * ((m_blocks + k - 1) / k) + 1);
    if (len < best) {
      best = len;
      best_k = k;
    }
  }
  return best_k > 1 ? BwdSm90SplitPlan{units - r, best_k} : none;
}

bool bwd_sm90_can_implement(const flashback_bwd_params& p, const char** why) {
  const char* reason = nullptr;
  const BwdSm90Row* row = find_row(kTable, p.headdim);
  if (row == nullptr) {
    reason = "no Hopper backward config for this headdim in this build";
  } else if (p.dtype != FLASHBACK_DTYPE_BF16 && p.dtype != FLASHBACK_DTYPE_FP16) {
    reason = "dtype is neither bf16 nor fp16";
  } else if (!dtype_compiled(p.dtype)) {
    reason = dtype_not_compiled(p.dtype);  // FLASHBACK_DTYPES left it out: the row's instance is null
  } else if (grid_ctas(*row->cfg, p) > int64_t{0x7fffffff}) {
    reason = "grid too large (batch x kv heads x key blocks of the longest sequence)";
  } else if (int64_t{p.batch} * p.nheads * dq_tiles_per_head(row->cfg->block_m, p) > int64_t{0x7fffffff}) {
    // The dQ conversion counts its tiles in int (bwd_sm90_postprocess_queue_kernel).
    reason = "too many dQ tiles (batch x heads x 64-row tiles of the longest sequence)";
  } else {
    // The dK/dV/dQ writes and the preprocess use 4- and 16-byte vectors (the API checks
    // alignment and strides of those already).
    const void* ptrs[4] = {p.q, p.k, p.v, p.dout};
    const flashback_strides sts[4] = {map_strides(p.q_strides, p, true), map_strides(p.k_strides, p, false),
                                      map_strides(p.v_strides, p, false), map_strides(p.dout_strides, p, true)};
    tma_layout_ok(ptrs, sts, 4, &reason);
  }
  if (why) *why = reason;
  return reason == nullptr;
}

size_t bwd_sm90_workspace_size(const flashback_bwd_params& p) { return bwd_sm90_workspace_parts(p).total; }

cudaError_t run_bwd_sm90(const flashback_bwd_params& p, cudaStream_t stream) {
  const BwdSm90Row* row = find_row(kTable, p.headdim);
  if (row == nullptr) return cudaErrorNotSupported;
  return row->run(p, stream);
}

}  // namespace sm90
}  // namespace flashback
