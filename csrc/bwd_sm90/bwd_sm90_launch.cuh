// Hopper backward: the kernel, its tensor maps and the launches of one config and dtype. A
// template: the instances live in bwd_sm90_hdim*.cu, the table that picks one, the workspace
// plan and can_implement in bwd_sm90_launch.cu.
//
// Order on the stream: (0) preprocess (which also zeroes dQaccum), main kernel, postprocess.
// Kernel structure: 1 + consumer_wgs warpgroups of 128 threads, __launch_bounds__(kThreads, 1)
// (168 registers each at entry with two consumer warpgroups, 128 with three; setmaxnreg needs
// the count known at entry):
//   warpgroup 0  producer: setmaxnreg.dec to producer_regs, one thread issues every TMA copy;
//                with deterministic=True warps 1 .. (one per add phase) keep the dQ turns
//                (bwd_sm90_turn_warp); otherwise, where the config says dq_smem, warps 1 ..
//                (one per consumer warpgroup) issue the bulk reduces of its dQ^T partials
//                (bwd_sm90_dq_warp)
//   warpgroups 1 .. consumer_wgs  consumers (setmaxnreg.inc to consumer_regs), split by
//                data: keys (block_n / consumer_wgs) w.. for S, dP, P, dS; their head-dim
//                atom-columns for dV^T, dK^T, dQ^T (by keys: their keys' dV, dK and one
//                m64n64 dQ^T tile, bwd_sm90_mainloop_by_keys.cuh). sdp_by_role splits S / P
//                and dP / dS by warpgroup instead.
// See bwd_sm90_mainloop.cuh for the shared-memory plan and the GEMM operands.
#pragma once

#include <cuda.h>

#include <algorithm>

#include <cstdlib>
#include <cstring>

#include "sm90/sm90_hang_guard.h"  // first: before anything includes the Hopper layer

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_mainloop.cuh"
#include "bwd_sm90/bwd_sm90_mainloop_by_keys.cuh"
#include "bwd_sm90/bwd_sm90_prepost.h"
#include "bwd_sm90/bwd_sm90_scheduler.cuh"
#include "hopper/hopper.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

// The workspace plan (bwd_sm90_launch.cu): per workspace tile (dq_tile, bwd_sm90_prepost.h) a
// dQaccum tile, the turn counters (deterministic), 64 rows of LSE * log2(e) and of D.
struct WorkspaceParts {
  size_t dq_accum, dq_turn, lse, dsum, total;  // dq_accum and dq_turn: zeroed by the preprocess
  size_t dq_post;  // the dQ conversion queue (DqPostQueue; dq_post_queue configs), set by it too
  // split_last_wave: the parts' counts (zeroed by the preprocess) and their dV^T / dK^T slots
  // (split_slot_bytes each, the table row's config's); split_units the split units they have
  // room for (0: none).
  size_t split_done, split_dkv, split_slot_bytes;
  int split_units;
};
WorkspaceParts bwd_sm90_workspace_parts(const flashback_bwd_params& p);
// FLASHBACK_DET_COOPERATIVE, read once per process.
bool bwd_sm90_det_cooperative();
// FLASHBACK_BWD_PDL, read once per process: "0" launches the backward's three kernels plainly
// (for A/B runs), anything else with programmatic dependent launch.
bool bwd_sm90_pdl();
// Does a 2-CTA pair config pay for these params (run_bwd_sm90_mode): enough query rows per CTA
// (kBwdSm90PairMinRows). FLASHBACK_BWD_PAIR (for A/B runs and tests, read once per process)
// overrides it: 0 never, 1 always (where a cluster fits), anything else by the rows. Never
// for FLASHBACK_DET_COOPERATIVE's deterministic non-causal chunks (single CTAs only).
bool bwd_sm90_pair_pays(const flashback_bwd_params& p);

// kPart (split_last_wave): the launch of the grid's split last wave (bwd_sm90_split_plan), after
// the launch of the units before it, whose kernel is the config's own. It is that launch's PDL
// dependent and starts once all of that launch's CTAs have started: it does not wait for that
// grid to end (its CTAs take the SMs that launch's last CTAs leave), and needs no wait for the
// preprocess, which had completed, its writes visible, before any of that launch's CTAs
// triggered it (each after its own griddepcontrol.wait; hopper/pdl.h). Thread 0 waits for that
// grid at its exit, so that this grid ends after it: the postprocess's final wait, and what
// follows on the stream, then cover both launches' dK / dV stores.
template <class T, bool kDet, bool kPart = false>
__global__ void __launch_bounds__(T::kThreads, 1)
    bwd_sm90_kernel(const __grid_constant__ CUtensorMap map_q,
                    const __grid_constant__ CUtensorMap map_k,
                    const __grid_constant__ CUtensorMap map_v,
                    const __grid_constant__ CUtensorMap map_do,
                    const __grid_constant__ CUtensorMap map_stats, const BwdSm90Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = fh::align_smem(smem_raw);
  uint64_t* kv_bar = reinterpret_cast<uint64_t*>(smem + T::kOffBar);
  auto* pipe_q = reinterpret_cast<fh::TmaPipeline<T::kQStages>*>(smem + T::kOffPipeQ);
  auto* pipe_do =
      reinterpret_cast<fh::TmaPipeline<T::kDoStages>*>(smem + T::kOffPipeDo);

  const int wg = fh::warpgroup_index();
  if constexpr (T::kTimeline) {
    if (wg > 0) timeline_cta_stamp<T>(p, wg - 1, threadIdx.x % 128, false);
  }
  if (threadIdx.x == 0) {
    fh::tma_prefetch_map(&map_q);
    fh::tma_prefetch_map(&map_k);
    fh::tma_prefetch_map(&map_v);
    fh::tma_prefetch_map(&map_do);
    if constexpr (T::kStatBytes > 0) fh::tma_prefetch_map(&map_stats);
    fh::mbar_init(kv_bar, 1);      // K
    fh::mbar_init(kv_bar + 1, 1);  // V
    pipe_q->init(T::kConsumerWarps);  // empty[s]: one arrival per consumer warp
    pipe_do->init(T::kConsumerWarps);
    if constexpr (T::kQAtomBars) {
      uint64_t* qb = reinterpret_cast<uint64_t*>(smem + T::kOffQAtomBar);
      for (int i = 0; i < T::kQStages * T::kAtomCols; ++i) fh::mbar_init(qb + i, 1);  // 1 + tx bytes
      fh::fence_mbarrier_init();
    }
    if constexpr (T::kPair) {
      uint64_t* pair_bar = reinterpret_cast<uint64_t*>(smem + T::kOffPairBar);
      fh::mbar_init(pair_bar, 1);      // full[0]: this CTA's arrive_expect_tx + the partner's bytes
      fh::mbar_init(pair_bar + 1, 1);  // full[1]
      fh::mbar_init(pair_bar + 2, T::kConsumerWarps);  // free[0]: the partner's consumer warps
      fh::mbar_init(pair_bar + 3, T::kConsumerWarps);  // free[1]
      fh::fence_mbarrier_init();
    }
  }
  // pair_dq: both CTAs' barriers initialised before either uses the other's.
  if constexpr (T::kPair) {
    fh::cluster_sync();
  } else {
    __syncthreads();
  }

  // The postprocess (launched with the PDL attribute) may be scheduled once every CTA of this
  // grid has started; it waits for this grid's end before it reads dQaccum. dq_post_queue:
  // once every CTA has passed its wait for the preprocess (below), which sets the queue the
  // postprocess reads from its start. The parts' launch (kPart) triggers at its start: each of
  // its CTAs started after every CTA of the launch before it had passed that wait.
  if constexpr (!T::kDqPostQueue || kPart) {
    if (threadIdx.x == 0) fh::launch_dependents();
  }
  BwdSm90Work w =
      bwd_sm90_work<T::kBlockM, T::kBlockN, kDet, T::kPair, T::kDetFromEnd, T::kL2TailGroups, kPart>(p);
  if (!w.active) {  // varlen: past the end of a shorter sequence's keys (the whole CTA)
    if constexpr (T::kDqPostQueue && !kPart) {  // the parts' launch is dense: every CTA active
      if (threadIdx.x == 32) {  // no adds: all of the CTA's counts at once
        fh::grid_dependency_wait();
        dq_post_count(p, w, dq_post_counts_per_cta<T, kDet>());
      }
    }
    return;
  }
  // This grid may start while the preprocess still runs (PDL): what it wrote (LSE * log2(e),
  // D, the zeroed dQaccum and turn counters) is read or added to only after this wait. The
  // producer thread's own wait follows its K issue (an input: visible already), but the K load
  // does not start early: its warp's other lanes wait here, and the producer warpgroup's
  // setmaxnreg below is warp-synchronous, so thread 0 reaches it only after the preprocess ends.
  // Waits below the setmaxnreg calls, so that K goes first, measured neutral (-0.5..+0.6%,
  // docs/perf-log.md, "The split loops, the dQ conversion and the late PDL wait measured").
  if (!kPart && threadIdx.x != 0) fh::grid_dependency_wait();
  if constexpr (T::kDqPostQueue && !kPart) {
    if (threadIdx.x == 32) fh::launch_dependents();
  }
  if (wg == 0) {
    fh::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      const BwdSm90Maps maps{&map_q, &map_k, &map_v, &map_do, &map_stats};
      bwd_sm90_producer<T, kDet, kPart>(p, maps, w, smem, kv_bar, pipe_q, pipe_do);
      if constexpr (kPart) fh::grid_dependency_wait();  // this grid ends after the units' launch
    } else if (kDet && !T::kDetDqWarp && threadIdx.x / 32 >= 1 && threadIdx.x / 32 <= T::kDqPhases) {
      bwd_sm90_turn_warp<T>(p, w, threadIdx.x / 32 - 1);
    } else if ((!kDet || T::kDetDqWarp) && T::kDqViaSmem && threadIdx.x / 32 >= 1 &&
               threadIdx.x / 32 <= T::kConsumerWgs) {
      bwd_sm90_dq_warp<T, kDet>(p, w, smem, threadIdx.x / 32 - 1);
    } else if (!kPart && dq_post_by_count_warp<T, kDet>() && threadIdx.x / 32 == 1) {
      fh::named_bar_sync(T::kBarPostCount, T::kPostCountThreads);  // dq_post_arrive
      if (threadIdx.x == 32) dq_post_count(p, w, 1);
    }
  } else {
    fh::setmaxnreg_inc<T::kConsumerRegs>();
    if constexpr (T::kPairGhost) {
      if (w.n_block >= w.n_blocks) {
        bwd_sm90_consumer_ghost<T, kDet, kPart>(p, w, smem, kv_bar, wg - 1);
        if constexpr (T::kTimeline) timeline_cta_stamp<T>(p, wg - 1, threadIdx.x % 128, true);
        return;
      }
    }
    if constexpr (T::kByKeys) {
      bwd_sm90_consumer_by_keys<T, kDet>(p, w, smem, kv_bar, pipe_q, pipe_do, wg - 1);
    } else if constexpr (T::kSharedConsumer) {
      bwd_sm90_consumer<T, kDet, T::kOwn0, kPart>(p, w, smem, kv_bar, pipe_q, pipe_do, wg - 1);
    } else if (wg == 1) {
      bwd_sm90_consumer<T, kDet, T::kOwn0, kPart>(p, w, smem, kv_bar, pipe_q, pipe_do, 0);
    } else {
      bwd_sm90_consumer<T, kDet, T::kOwn1, kPart>(p, w, smem, kv_bar, pipe_q, pipe_do, 1);
    }
    if constexpr (T::kTimeline) timeline_cta_stamp<T>(p, wg - 1, threadIdx.x % 128, true);
  }
}

// kDet: the deterministic mode (p.deterministic), whose config may differ from the default's
// (bwd_sm90.h, kBwdSm90Hdim*Det; today d = 256's alone differs, by its step's order).
template <class T, bool kDet>
cudaError_t run_bwd_sm90_config(const flashback_bwd_params& p, cudaStream_t stream) {
  CUtensorMap map_q, map_k, map_v, map_do;
  bool hi[4];
  constexpr uint32_t kRowsQ = T::kBlockM, kRowsKv = T::kBlockN;
  if (make_call_map(&map_q, &hi[0], p.q, p.q_strides, p, true, kRowsQ) != cudaSuccess ||
      make_call_map(&map_k, &hi[1], p.k, p.k_strides, p, false, kRowsKv) != cudaSuccess ||
      make_call_map(&map_v, &hi[2], p.v, p.v_strides, p, false, kRowsKv) != cudaSuccess ||
      make_call_map(&map_do, &hi[3], p.dout, p.dout_strides, p, true, kRowsQ) != cudaSuccess) {
    return cudaErrorNotSupported;  // nothing launched: the caller takes the reference path
  }
  const auto kernel = bwd_sm90_kernel<T, kDet>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(T::kSmemBytes));
  if (err != cudaSuccess) return err;
  // split_last_wave: the parts' kernel (kPart), set up before anything is queued.
  if constexpr (T::kSplitLastWave && !kDet) {
    err = cudaFuncSetAttribute(bwd_sm90_kernel<T, kDet, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(T::kSmemBytes));
    if (err != cudaSuccess) return err;
  }
  int resident_pairs = 0;  // pair_dq: clusters resident at once
  if constexpr (T::kPair) {
    // Two CTAs of ~225 KB each on one GPC: where SMs are partitioned away (MPS, green contexts)
    // none may fit. Asked before anything is queued, so that the caller can take the reference
    // path; every call, as the non-pair deterministic launch asks for its CTAs (the
    // deterministic non-causal order needs this device's count).
    if (fh::max_active_clusters(kernel, dim3(2), dim3(T::kThreads), T::kSmemBytes, dim3(2, 1, 1),
                                &resident_pairs) != cudaSuccess ||
        resident_pairs < 1) {
      (void)cudaGetLastError();
      return cudaErrorNotSupported;
    }
  }
  const WorkspaceParts parts = bwd_sm90_workspace_parts(p);
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  float* dq_accum = reinterpret_cast<float*>(ws + parts.dq_accum);
  float* lse_log2 = reinterpret_cast<float*>(ws + parts.lse);
  float* dsum = reinterpret_cast<float*>(ws + parts.dsum);
  const int m_blocks = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;  // steps
  const int tiles_m = m_blocks * T::kStepTiles;  // 64-row workspace tiles (bwd_sm90_prepost.h)
  // Stage rows (by keys, stats_smem): LSE's rows, then D's, as one [row][64] fp32 tensor (both
  // regions are whole 256-byte rows: kAlign). Unused by the other configs, which get a zeroed map.
  CUtensorMap map_stats;
  std::memset(&map_stats, 0, sizeof(map_stats));
  int dsum_tile0 = 0;
  if constexpr (T::kStatBytes > 0) {
    const uint64_t stat_rows = (parts.dq_post - parts.lse) / 256;
    if (stat_rows > uint64_t{0x7fffffff}) return cudaErrorNotSupported;  // TMA coordinates are int
    dsum_tile0 = static_cast<int>((parts.dsum - parts.lse) / 256);
    if (fh::make_tensor_map_2d(&map_stats, lse_log2, fh::TmaType::kF32, stat_rows, kDqTileRows,
                               kDqTileRows, T::kStepTiles, kDqTileRows,
                               fh::TmaSwizzle::kNone) != cudaSuccess) {
      return cudaErrorNotSupported;  // nothing launched: the caller takes the reference path
    }
  }

  // The three kernels overlap their ends and starts (programmatic dependent launch, hopper/pdl.h):
  // the main kernel may start (barriers, tensor-map prefetch) while the preprocess
  // finishes, and the postprocess while the main kernel's last CTAs run; each waits for the
  // kernel before it where it reads that kernel's output. FLASHBACK_BWD_PDL=0: plain launches.
  const bool pdl = bwd_sm90_pdl();
  DqPostQueue post{nullptr, p.batch * p.nheads_k};
  if constexpr (T::kDqPostQueue) post.base = reinterpret_cast<int*>(ws + parts.dq_post);
  // split_last_wave (default mode, non-causal, dense, where the workspace has room): the
  // grid's partial last wave cut into parts (bwd_sm90_split_plan), which add clusters.
  BwdSm90SplitPlan split;  // none
  if constexpr (T::kSplitLastWave && !kDet) {
    if (!p.causal) {
      const int n_blocks = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
      const int units = (n_blocks + 1) / 2 * p.batch * p.nheads_k;
      const BwdSm90SplitPlan plan = bwd_sm90_split_plan(units, resident_pairs, m_blocks, p.nheads / p.nheads_k);
      if (plan.parts > 1 && parts.split_units >= units - plan.first &&
          parts.split_slot_bytes == sizeof(float) * T::kSplitSlotFloats) {
        split = plan;
        post.split_done = reinterpret_cast<int*>(ws + parts.split_done);
        post.split_count = 2 * (units - plan.first);
      }
    }
  }
  // (0) D = rowsum(dO * O), LSE * log2(e); dQaccum (and the deterministic mode's turn
  // counters, the dQ conversion queue) set by the same kernel, no memset before it.
  err = launch_bwd_sm90_preprocess(p, tiles_m, T::kStepTiles, lse_log2, dsum, dq_accum,
                                   kDet ? reinterpret_cast<int*>(ws + parts.dq_turn) : nullptr, post,
                                   stream);
  if (err != cudaSuccess) return err;
  // dQ = scale * dQaccum, after the main kernel (as its PDL dependent where `dependent`), or
  // with dq_post_queue under its tail.
  auto postprocess = [&](bool dependent) {
    return T::kDqPostQueue
               ? launch_bwd_sm90_postprocess_queue(p, tiles_m, T::kStepTiles, dq_accum, post,
                                                   dependent, stream)
               : launch_bwd_sm90_postprocess(p, tiles_m, T::kStepTiles, dq_accum, dependent, stream);
  };

  BwdSm90Params kp;
  kp.batch = p.batch;
  kp.seqlen_q = p.seqlen_q;
  kp.seqlen_k = p.seqlen_k;
  kp.nheads = p.nheads;
  kp.nheads_k = p.nheads_k;
  kp.group = p.nheads / p.nheads_k;
  kp.m_blocks = m_blocks;
  kp.n_blocks = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  kp.causal = p.causal ? 1 : 0;
  // Causal: as many (batch, kv head) pairs at a time as keep the Q, dO and dQaccum rows (x the
  // GQA group) of kBwdSm90L2's queries at d = 256 in L2 (256 / d times as many at head dim d;
  // short_rows_at_d256 up to short_seqlen); otherwise one (docs/perf-log.md v4).
  const int pairs = p.batch * p.nheads_k;
  const int rows_per_pair = p.seqlen_q * (p.nheads / p.nheads_k);
  const int l2_rows = (p.seqlen_q <= kBwdSm90L2.short_seqlen ? kBwdSm90L2.short_rows_at_d256
                                                             : kBwdSm90L2.causal_rows_at_d256) *
                      256 / T::kHeadDim;
  kp.l2_group = p.causal ? std::max(1, std::min(pairs, l2_rows / std::max(1, rows_per_pair))) : 1;
  kp.head_inner = (hi[0] ? 1 : 0) | (hi[1] ? 2 : 0) | (hi[2] ? 4 : 0) | (hi[3] ? 8 : 0);
  kp.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  kp.softmax_scale = p.softmax_scale;
  kp.lse_log2 = lse_log2;
  kp.dsum = dsum;
  kp.dsum_tile0 = dsum_tile0;
  kp.dq_accum = dq_accum;
  kp.dq_turn = kDet ? reinterpret_cast<int*>(ws + parts.dq_turn) : nullptr;
  kp.dq_tiles = dq_tiles_of(p, tiles_m, T::kStepTiles);
  kp.cu_seqlens_q = p.cu_seqlens_q;
  kp.cu_seqlens_k = p.cu_seqlens_k;
  kp.dk = p.dk;
  kp.dv = p.dv;
  kp.dk_strides = p.dk_strides;
  kp.dv_strides = p.dv_strides;
  kp.timeline = nullptr;
  kp.timeline_ctas = 0;
  kp.timeline_steps = 0;
  if constexpr (T::kTimeline) bwd_sm90_timeline(&kp.timeline, &kp.timeline_ctas, &kp.timeline_steps);
  kp.dq_post = post;
  kp.split_first = split.first;
  kp.split_parts = split.parts;
  kp.split_dkv = split.parts > 1 ? reinterpret_cast<float*>(ws + parts.split_dkv) : nullptr;
  kp.split_done = post.split_done;
  // Every CTA of a (batch, kv head) counts, those past a shorter sequence's keys too: the
  // grid's K/V blocks per pair (pair_dq: rounded up to whole clusters).
  kp.dq_post_total = (T::kPair ? 2 * ((kp.n_blocks + 1) / 2) : kp.n_blocks) *
                     dq_post_counts_per_cta<T, kDet>();  // a split unit's last part counts for it

  // (1)-(7)
  const int ctas = kp.n_blocks * p.nheads_k * p.batch;
  kp.block_base = 0;
  kp.det_chunk = 1;
  if constexpr (T::kPair) {
    // pair_dq: clusters of two CTAs on K/V blocks 2 j, 2 j + 1 (an odd count gets a partner
    // past the keys, bwd_sm90_scheduler.cuh).
    const int pair_ctas = 2 * ((kp.n_blocks + 1) / 2) * p.nheads_k * p.batch;
    // Deterministic, non-causal: chunks of the clusters that fit on the GPU at once (the
    // scheduler's units).
    if (kDet && !p.causal) kp.det_chunk = resident_pairs;
    if constexpr (T::kSplitLastWave && !kDet) {
      if (split.parts > 1) {
        // The units before the split in the config's own kernel, then the split units' k parts
        // each in the parts' kernel, as its PDL dependent (bwd_sm90_kernel, kPart).
        if (split.first > 0) {
          err = fh::launch_kernel(kernel, dim3(2 * split.first), dim3(T::kThreads), T::kSmemBytes, stream,
                                  dim3(2, 1, 1), pdl, map_q, map_k, map_v, map_do, map_stats, kp);
          if (err != cudaSuccess) return err;
        }
        // Without units before it, it follows the preprocess in stream order: it skips the
        // wait for the grid before it, so it must not start early.
        err = fh::launch_kernel(bwd_sm90_kernel<T, kDet, true>, dim3(2 * (pair_ctas / 2 - split.first) * split.parts),
                                dim3(T::kThreads), T::kSmemBytes, stream, dim3(2, 1, 1),
                                pdl && split.first > 0, map_q, map_k, map_v, map_do, map_stats, kp);
        if (err != cudaSuccess) return err;
        err = postprocess(pdl);
        if (err == cudaSuccess) bwd_sm90_note_kernel("pair, last wave split");
        return err;
      }
    }
    err = fh::launch_kernel(kernel, dim3(pair_ctas), dim3(T::kThreads), T::kSmemBytes, stream,
                            dim3(2, 1, 1), pdl, map_q, map_k, map_v, map_do, map_stats, kp);
    if (err != cudaSuccess) return err;
    err = postprocess(pdl);
    if (err == cudaSuccess) bwd_sm90_note_kernel("pair");
    return err;
  }
  if constexpr (kDet) {
    // Non-causal: chunks of CTAs that fit on the GPU at once (bwd_sm90_scheduler.cuh), so that
    // a CTA waiting for a chunk-mate's add never holds the SM that one needs.
    err = resident_ctas(kernel, T::kThreads, T::kSmemBytes, &kp.det_chunk);
    if (err != cudaSuccess) return err;
    if (!p.causal && bwd_sm90_det_cooperative()) {
      // EXPERIMENTAL (FLASHBACK_DET_COOPERATIVE=1; bitwise the single launch's gradients on the
      // GPU tests, 3-7% slower non-causal, see docs/perf-log.md): one cooperative launch per
      // chunk, so the driver places a chunk only when all of it fits and a concurrent kernel
      // holding SMs delays the launch instead of stalling resident CTAs.
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.blockDim = dim3(T::kThreads);
      cfg.dynamicSmemBytes = T::kSmemBytes;
      cfg.stream = stream;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      bool launched_all = true;
      for (int base = 0; base < ctas; base += kp.det_chunk) {
        kp.block_base = base;
        cfg.gridDim = dim3(std::min(kp.det_chunk, ctas - base));
        err = cudaLaunchKernelEx(&cfg, kernel, map_q, map_k, map_v, map_do, map_stats, kp);
        if (err == cudaErrorCooperativeLaunchTooLarge && base == 0) {
          // Fewer SMs than the device has are available to cooperative launches (MPS, ...):
          // nothing of the main kernel ran yet, so take the single launch below.
          (void)cudaGetLastError();
          kp.block_base = 0;
          launched_all = false;
          break;
        }
        if (err != cudaSuccess) return err;
      }
      if (launched_all) return postprocess(false);
    }
  }
  err = fh::launch_kernel(kernel, dim3(ctas), dim3(T::kThreads), T::kSmemBytes, stream,
                          dim3(1, 1, 1), pdl, map_q, map_k, map_v, map_do, map_stats, kp);
  if (err != cudaSuccess) return err;
  return postprocess(pdl);
}

// One mode of one head dim (kCfg: its default or deterministic config). Where kCfg is a 2-CTA
// pair, the head dim's single-CTA config runs the call instead when the pair does not pay
// (bwd_sm90_pair_pays: short walks, or FLASHBACK_BWD_PAIR=0) or cannot run (no cluster fits:
// cudaErrorNotSupported with nothing queued), so fp16, which the reference kernels do not
// serve, keeps a fast path.
// run_bwd_sm90_config, noting the kernel's form for flashback_last_backward_kernel.
template <const BwdSm90Config& kCfg, Dtype kDtype, bool kDet>
cudaError_t run_bwd_sm90_noted(const flashback_bwd_params& p, cudaStream_t stream) {
  const cudaError_t err = run_bwd_sm90_config<BwdSm90Traits<kCfg, kDtype>, kDet>(p, stream);
  if (err == cudaSuccess && !kCfg.pair_dq) bwd_sm90_note_kernel("single");  // the pair notes its own form
  return err;
}

template <const BwdSm90Config& kCfg, const BwdSm90Config& kSingleCfg, Dtype kDtype, bool kDet>
cudaError_t run_bwd_sm90_mode(const flashback_bwd_params& p, cudaStream_t stream) {
  if constexpr (kCfg.pair_dq) {
    static_assert(!kSingleCfg.pair_dq, "the fallback of a pair is one CTA per K/V block");
    if (bwd_sm90_pair_pays(p)) {
      const cudaError_t err = run_bwd_sm90_noted<kCfg, kDtype, kDet>(p, stream);
      if (err != cudaErrorNotSupported) return err;
      (void)cudaGetLastError();  // a declined launch's error is not the single CTA's to report
    }
    return run_bwd_sm90_noted<kSingleCfg, kDtype, kDet>(p, stream);
  } else {
    return run_bwd_sm90_noted<kCfg, kDtype, kDet>(p, stream);
  }
}

// The entry point of head dim D's instances, bf16 and fp16 (in bwd_sm90_hdim<D>.cu; the table
// in bwd_sm90_launch.cu declares them).
#define FLASHBACK_BWD_SM90_ENTRY(D, DT, DTYPE)                                                     \
  cudaError_t run_bwd_sm90_hdim##D##_##DT(const flashback_bwd_params& p, cudaStream_t stream) { \
    return p.deterministic                                                                      \
        ? run_bwd_sm90_mode<kBwdSm90Hdim##D##Det, kBwdSm90Hdim##D##Single, DTYPE, true>(p, stream) \
        : run_bwd_sm90_mode<kBwdSm90Hdim##D, kBwdSm90Hdim##D##Single, DTYPE, false>(p, stream); \
  }
// The workspace is sized by the row's block_m, and can_implement bounds the grid by its block_n
// (more, smaller blocks give the larger grid): the mode's and the single-CTA configs share
// block_m and have no smaller block_n. They walk in one causal order (det_from_the_end), which
// is also the order dK and dV accumulate in: the pair and the single CTA give the same bits.
#define FLASHBACK_BWD_SM90_INSTANCES(D)                                                         \
  static_assert(kBwdSm90Hdim##D##Det.block_m == kBwdSm90Hdim##D.block_m &&                      \
                    kBwdSm90Hdim##D##Det.block_n >= kBwdSm90Hdim##D.block_n &&                  \
                    kBwdSm90Hdim##D##Single.block_m == kBwdSm90Hdim##D.block_m &&               \
                    kBwdSm90Hdim##D##Single.block_n >= kBwdSm90Hdim##D.block_n,                 \
                "the workspace and can_implement read the default config's tiles");             \
  static_assert(kBwdSm90Hdim##D##Det.det_from_the_end == kBwdSm90Hdim##D.det_from_the_end &&    \
                    kBwdSm90Hdim##D##Single.det_from_the_end == kBwdSm90Hdim##D.det_from_the_end, \
                "one deterministic walk order per head dim");                                    \
  FLASHBACK_SM90_IF_BF16(FLASHBACK_BWD_SM90_ENTRY(D, bf16, Dtype::kBf16))                       \
  FLASHBACK_SM90_IF_FP16(FLASHBACK_BWD_SM90_ENTRY(D, fp16, Dtype::kF16))

}  // namespace sm90
}  // namespace flashback
