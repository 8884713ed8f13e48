// Main loop of the Hopper forward: the TMA producer and the consumer warpgroups. Consumer
// warpgroup w owns query rows 64w..64w+63 of the CTA's block_m and walks the K/V blocks of
// block_n keys:
//   S = Q_w K_j^T          SS, m64 n(block_n), K = d (d/16 k-steps); A = Q rows, B = K_j,
//                          both K-major
//   online softmax          row max / sum in registers (a row lives in the 4 lanes of a quad)
//   O = alpha O + P V_j     RS, m64 n(d), K = block_n; A = P as 16-bit fragments converted in
//                           place from the S accumulator, B = V_j read N-major (trans-b)
// The warpgroups share nothing but the Q and K/V stages, so while one does its softmax the
// others' GEMMs keep the tensor cores busy.
//
// Shared memory (128B-swizzled, 1024-aligned, all written by TMA; d/64 atom-columns each):
//   Q            kQStages x block_m rows x 128 B per atom-column (warpgroup w: rows 64w..,
//                +8 KB); a tile's O is staged over its Q stage, which the epilogue then frees
//                (o_over_v: over the V stages, and Q is freed after the tile's last S)
//   K_j, V_j     kv_stages x block_n rows x 128 B per atom-column
// The rings run on across the tiles of a persistent CTA (fwd_sm90_launch.cuh).
// (sizes per config in fwd_sm90.h).
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>

#include "fwd_sm90/fwd_sm90.h"
#include "fwd_sm90/fwd_sm90_epilogue.cuh"
#include "fwd_sm90/fwd_sm90_scheduler.cuh"
#include "hopper/hopper.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

namespace fh = flashback::hopper;

template <const FwdSm90Config& kCfg, Dtype kDtype>
struct FwdSm90Traits {
  static constexpr Dtype kElem = kDtype;
  static constexpr int kHeadDim = kCfg.head_dim;
  static constexpr int kConsumerWgs = kCfg.consumer_wgs;
  static constexpr int kBlockM = 64 * kConsumerWgs;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kStages = kCfg.kv_stages;
  static constexpr int kThreads = 128 * (1 + kConsumerWgs);  // producer + consumers
  static constexpr int kConsumerWarps = 4 * kConsumerWgs;    // arrivals that free a stage
  // Whether any call of the head dim has the producer load K one block ahead (p.k_ahead).
  static constexpr bool kKAheadAny = fwd_sm90_grid_row(kHeadDim).causal_k_ahead_keys > 0 ||
                                     fwd_sm90_grid_row(kHeadDim).full_k_ahead_keys > 0;
  static_assert(kHeadDim % 64 == 0 && kHeadDim >= 64 && kHeadDim <= 256,
                "d is a whole number of 64-element atom-columns, at most 256 (the O wgmma's N)");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "block_n: k16 steps of P V, N of S");
  static_assert(kConsumerWgs >= 1 && kConsumerWgs <= 3, "TMA boxes hold at most 256 rows");
  static constexpr int kAtomCols = kHeadDim / 64;
  static constexpr uint32_t kQAtomBytes = kBlockM * 128;
  static constexpr uint32_t kKvAtomBytes = kBlockN * 128;
  static constexpr uint32_t kQBytes = kAtomCols * kQAtomBytes;
  static constexpr uint32_t kKvTileBytes = kAtomCols * kKvAtomBytes;
  // Q goes through a ring too: its stage is freed by the tile's epilogue (O is staged over it),
  // so with two stages a persistent CTA loads the next tile's Q while it stores this tile's O.
  // Two when they fit (d <= 128), else one (the next Q then waits for the O copy-out).
  static constexpr int kQStages =
      kAtomCols * kQAtomBytes * 2 + kStages * 2 * kKvTileBytes + 2048 <= 232448 ? 2 : 1;
  static constexpr uint32_t kOffQ = 0;
  static constexpr uint32_t kOffK = kOffQ + kQStages * kQBytes;
  static constexpr uint32_t kOffV = kOffK + kStages * kKvTileBytes;
  static constexpr uint32_t kOffPipeQ = kOffV + kStages * kKvTileBytes;
  static constexpr uint32_t kOffPipeK = kOffPipeQ + sizeof(fh::TmaPipeline<kQStages>);
  static constexpr uint32_t kOffPipeV = kOffPipeK + sizeof(fh::TmaPipeline<kStages>);
  // dynamic_tiles: the producer hands each tile id to the consumers through a 2-slot ring.
  static constexpr bool kDynamic = kCfg.dynamic_tiles;
  static constexpr bool kPvWaitBelow = kCfg.pv_wait_below;
  static constexpr bool kLateTileFetch = kCfg.late_tile_fetch;
  static constexpr fh::WaitStyle kWaitStyle = fh::effective_wait_style(kCfg.wait_style);
  static constexpr bool kTmaStoreO = kCfg.tma_store_o;
  static constexpr bool kSplitMaskLoop = kCfg.split_mask_loop;
  static constexpr bool kFinalizeInPv = kCfg.finalize_in_pv;
  static constexpr bool kCopyOutEarly = kCfg.copy_out_early;
  static constexpr bool kFastTileDecode = kCfg.fast_tile_decode;
  static constexpr bool kPingpongAcrossTiles = kCfg.pingpong_across_tiles;
  static constexpr bool kSDescLo = kCfg.s_desc_lo;
  static constexpr bool kRescaleBetween = kCfg.rescale_between;
  static constexpr bool kLeanSoftmax = kCfg.lean_softmax;
  // Under ping-pong the multiplies would sit inside this warpgroup's turn (d = 128 measured
  // -0.6..-5.0% so).
  static_assert(!kRescaleBetween || !kCfg.pingpong, "rescale_between: configs without ping-pong");
  static_assert(!kPingpongAcrossTiles || kCfg.pingpong, "pingpong_across_tiles: a ping-pong config");
  // o_over_v: the O-free barrier (one arrival per consumer warp after its O rows left the V
  // stages; the producer waits for it before the next tile's V_0). It runs in step with the one
  // Q stage, so it shares the Q ring's state.
  static constexpr bool kOOverV = kCfg.o_over_v;
  static_assert(!kOOverV || kQStages == 1, "o_over_v: for one Q stage (its O-free barrier uses the Q ring's phase)");
  static_assert(!kOOverV || kAtomCols * kQAtomBytes <= kStages * kKvTileBytes,
                "o_over_v: the CTA's O tile must fit in the V stages");
  static constexpr uint32_t kOffPipeO = kOffPipeV + sizeof(fh::TmaPipeline<kStages>);
  static constexpr uint32_t kOffTileIds = kOffPipeO + (kOOverV ? sizeof(fh::TmaPipeline<1>) : 0);
  static constexpr uint32_t kOffPipeTile = kOffTileIds + 16;
  static constexpr size_t kSmemBytes =
      1024 /* alignment slack */ +
      (kDynamic ? kOffPipeTile + sizeof(fh::TmaPipeline<2>) : kOffTileIds);
  static_assert(kSmemBytes <= 232448, "over the 227 KB a CTA may have");
  static_assert(kKvAtomBytes % 1024 == 0, "K/V atom-columns must stay 1024-aligned");
  // __launch_bounds__(kThreads, 1) gives each thread 65536 / kThreads registers at entry (at
  // most 255); setmaxnreg moves them between warpgroups within that pool.
  static constexpr int kProducerRegs = kCfg.producer_regs;
  static constexpr int kConsumerRegs = kCfg.consumer_regs;
  static constexpr int kEntryRegs = 65536 / kThreads > 255 ? 255 : 65536 / kThreads;
  static_assert(128 * kCfg.producer_regs + 128 * kConsumerWgs * kCfg.consumer_regs <=
                    kEntryRegs / 8 * 8 * kThreads,
                "setmaxnreg budget exceeds the register file: .inc would deadlock");
  static_assert(kHeadDim / 2 + kBlockN / 2 + kBlockN / 4 + 24 <= kCfg.consumer_regs,
                "O, S and P fragments (plus ~24 for addresses and statistics) exceed the budget");
  // Named barriers (id 0 is __syncthreads): kBarEpilogue0 + w the epilogue's staging of
  // warpgroup w (fwd_sm90_epilogue.cuh), kBarTurn0 + w warpgroup w's turn to issue GEMMs
  // (ping-pong).
  static constexpr bool kPingpong = kCfg.pingpong && kConsumerWgs > 1;
  static constexpr uint32_t kBarEpilogue0 = 1;
  static constexpr uint32_t kBarTurn0 = 4;
  // o_over_v: every consumer warpgroup's last P V has read the V stages before any O is staged.
  static constexpr uint32_t kBarOStage = kBarTurn0 + kConsumerWgs;
  static_assert(kBarEpilogue0 + kConsumerWgs <= kBarTurn0 && kBarTurn0 + kConsumerWgs + 1 <= 16,
                "named barrier ids: 16 per CTA, the epilogue's and the turns' must not overlap");
};

struct FwdSm90Maps {
  const CUtensorMap* q;
  const CUtensorMap* k;
  const CUtensorMap* v;
};

// ------------------------------------------------------------------------------ producer ---
// One thread, one tile: K_0 and V_0 first (they stream while the consumers finish the previous
// tile), then Q (once its stage is free: the previous user's O has left), then K_j and V_j of
// every further step; o_over_v: K_0, Q, then V_0. p.k_ahead (FwdSm90Grid says where): K_0, Q,
// then K_{j+1} before V_j. The ring states carry over from tile to tile (K's and V's advance
// alike per tile, so one state is carried).
template <class T>
__device__ __forceinline__ void fwd_sm90_producer(const FwdSm90Params& p, const FwdSm90Maps& m,
                                                  const FwdSm90Work& w, uint8_t* smem,
                                                  fh::TmaPipeline<T::kQStages>* pipe_q,
                                                  fh::PipelineState<T::kQStages>& sq,
                                                  fh::TmaPipeline<T::kStages>* pipe_k,
                                                  fh::TmaPipeline<T::kStages>* pipe_v,
                                                  fh::PipelineState<T::kStages>& st) {
  const int kv_head = w.head / p.group;
  using State = fh::PipelineState<T::kStages>;
  // K_j / V_j into stage `at`.
  auto load_k = [&](int j, const State& at) {
    pipe_k->template producer_acquire<T::kWaitStyle>(at);
    pipe_k->producer_expect(at, T::kKvTileBytes);
    tma_tile<T::kAtomCols>(smem + T::kOffK + at.stage * T::kKvTileBytes, T::kKvAtomBytes, m.k,
                           pipe_k->full_barrier(at), p.head_inner & 2, w.row_k + j * T::kBlockN, kv_head,
                           w.map_batch);
  };
  auto load_v = [&](int j, const State& at) {
    pipe_v->template producer_acquire<T::kWaitStyle>(at);
    pipe_v->producer_expect(at, T::kKvTileBytes);
    tma_tile<T::kAtomCols>(smem + T::kOffV + at.stage * T::kKvTileBytes, T::kKvAtomBytes, m.v,
                           pipe_v->full_barrier(at), p.head_inner & 4, w.row_k + j * T::kBlockN, kv_head,
                           w.map_batch);
  };
  auto load_kv = [&](int j) {
    load_k(j, st);
    load_v(j, st);
    st.advance();
  };
  // o_over_v: K_0 and Q stream in while the previous tile finishes; V_0 (and with k_ahead K_1,
  // issued after it in program order) waits until its O has left the V stages. (Every tile,
  // n_count = 0 too, passes the O-free barrier once: its consumers stage an O as well.) A tile
  // without keys needs only its Q before its consumers free the O barrier: waiting after its Q
  // would let them complete this tile's phase and the next before the wait polls (a parity wait
  // cannot tell phase k + 1 from k - 1), so there the wait comes first.
  auto* pipe_o = reinterpret_cast<fh::TmaPipeline<1>*>(smem + T::kOffPipeO);
  const bool k_ahead = T::kKAheadAny && p.k_ahead;
  State sk = st;  // k_ahead: K's state, one block ahead of st (V's) within the tile
  if (T::kOOverV || k_ahead) {
    if (w.n_count > 0) {
      load_k(0, st);
      sk.advance();
    }
    if constexpr (T::kOOverV) {
      if (w.n_count == 0) pipe_o->template producer_acquire<T::kWaitStyle>(sq);
    }
  } else {
    if (w.n_count > 0) load_kv(0);
  }
  // Q even when no key is seen (n_count = 0): the consumers stage that tile's O too. (Inline:
  // a lambda here reorders the d = 128 kernel's SASS.)
  pipe_q->template producer_acquire<T::kWaitStyle>(sq);
  pipe_q->producer_expect(sq, T::kQBytes);
  tma_tile<T::kAtomCols>(smem + T::kOffQ + sq.stage * T::kQBytes, T::kQAtomBytes, m.q,
                         pipe_q->full_barrier(sq), p.head_inner & 1, w.row_q + w.m_block * T::kBlockM,
                         w.head, w.map_batch);
  if constexpr (T::kOOverV) {
    if (w.n_count > 0) pipe_o->template producer_acquire<T::kWaitStyle>(sq);
  }
  sq.advance();
  if (k_ahead) {
    // K_{j+1} waits for the release of K_{j-1} (after S_{j-1}), V_j for that of V_{j-2} (after
    // P_{j-2} V_{j-2}, half a step later): issued first, K_{j+1} no longer queues behind V_j.
    for (int j = 0; j < w.n_count; ++j) {
      if (j + 1 < w.n_count) {
        load_k(j + 1, sk);
        sk.advance();
      }
      load_v(j, st);
      st.advance();
    }
  } else {
    if constexpr (T::kOOverV) {
      if (w.n_count > 0) {
        load_v(0, st);
        st.advance();
      }
    }
    for (int j = 1; j < w.n_count; ++j) load_kv(j);
  }
}

// ------------------------------------------------------------------------------ consumer ---
// Max over the 4 lanes of a quad (the lanes that hold one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// One tile: this warpgroup's 64 query rows against K/V blocks 0 .. n_count - 1.
template <class T>
__device__ __forceinline__ void fwd_sm90_consumer(const FwdSm90Params& p, const FwdSm90Work& w,
                                                  uint8_t* smem,
                                                  fh::TmaPipeline<T::kQStages>* pipe_q,
                                                  fh::PipelineState<T::kQStages>& sq,
                                                  fh::TmaPipeline<T::kStages>* pipe_k,
                                                  fh::TmaPipeline<T::kStages>* pipe_v,
                                                  fh::PipelineState<T::kStages>& st, int wg,
                                                  const CUtensorMap* map_o, bool& turns_open) {
  constexpr int kS = T::kBlockN / 2;  // S accumulator registers (64 x block_n)
  const int t = threadIdx.x % 128;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  const int m0 = w.m_block * T::kBlockM + 64 * wg;  // this warpgroup's first query row
  const int diag = w.seqlen_k - w.seqlen_q;         // causal: query i sees keys <= i + diag
  const int row0 = fh::acc_row(0, t);               // this thread's rows: row0, row0 + 8
  uint8_t* q_stage = smem + T::kOffQ + sq.stage * T::kQBytes;  // this tile's Q, then its O
  const uint8_t* q_w = q_stage + 64 * wg * 128;

  // Ping-pong: the warpgroups issue their GEMM groups in turn (0, 1, .., 0, 1, ..), so the
  // tensor cores finish one warpgroup's S (and P V) before the next one's and that warpgroup's
  // softmax runs while the others' GEMMs do, instead of all softmaxes at once with the tensor
  // cores idle. A turn is bar.sync on this warpgroup's barrier (128 syncing + 128 arriving
  // threads) and ends with bar.arrive on the next one's; the last warpgroup opens the first turn
  // and leaves out its last hand-on, so every barrier phase that opens also closes (with
  // pingpong_across_tiles once per CTA instead of once per tile). Each of the tile's n_count + 1
  // GEMM groups is one turn of every warpgroup.
  const int n_turns = w.n_count > 0 ? w.n_count + 1 : 0;
  int turn = 0;
  auto turn_begin = [&] {
    if constexpr (T::kPingpong) fh::named_bar_sync(T::kBarTurn0 + wg, 256);
  };
  auto turn_end = [&] {
    if constexpr (T::kPingpong) {
      ++turn;
      if (wg + 1 < T::kConsumerWgs) {
        fh::named_bar_arrive(T::kBarTurn0 + wg + 1, 256);
      } else if (T::kPingpongAcrossTiles || turn < n_turns) {
        fh::named_bar_arrive(T::kBarTurn0, 256);
      }
    }
  };
  if constexpr (T::kPingpong) {
    if constexpr (T::kPingpongAcrossTiles) {
      // pingpong_across_tiles: opened once; every later tile's first turn takes the previous
      // tile's last hand-on (fwd_sm90_consumer_tiles takes the last one before exit).
      if (wg + 1 == T::kConsumerWgs && n_turns > 0 && !turns_open) fh::named_bar_arrive(T::kBarTurn0, 256);
      if (n_turns > 0) turns_open = true;
    } else {
      if (wg + 1 == T::kConsumerWgs && n_turns > 0) fh::named_bar_arrive(T::kBarTurn0, 256);
    }
  }

  float o[T::kHeadDim / 2];
  fh::zero_acc(o);
  float m_raw[2] = {-INFINITY, -INFINITY};  // running row max of S (unscaled)
  float l_part[2] = {0.f, 0.f};             // this thread's part of the row sums
  pipe_q->template consumer_wait<T::kWaitStyle>(sq);
  // o_over_v: the Q stage is read by this tile's S wgmmas only, so each warp frees it once its
  // last S has been waited for.
  auto release_q_after_last_s = [&](bool last) {
    if constexpr (T::kOOverV) {
      if (last && warp_leader) pipe_q->consumer_release(sq);
    }
  };
  release_q_after_last_s(w.n_count == 0);

  // S = Q_w K_j^T into `acc` (one commit group). Zeroed first although the first wgmma ignores
  // it: its asm reads the accumulators; the operand fence keeps the zeroing before
  // wgmma.fence (C7519).
  // s_desc_lo: the shared addresses once per tile (fwd_sm90.h), passed through an asm so that
  // ptxas keeps the values instead of re-deriving the aligned base in every key block.
  uint32_t q_w_addr = fh::smem_u32(q_w);
  uint32_t k_addr = fh::smem_u32(smem + T::kOffK);
  if constexpr (T::kSDescLo) {
    asm volatile("mov.b32 %0, %0;" : "+r"(q_w_addr));
    asm volatile("mov.b32 %0, %0;" : "+r"(k_addr));
  }
  // (q_rows is q_w at every call; the s_desc_lo path uses q_w_addr.)
  auto issue_s = [&](float (&acc)[kS], const fh::PipelineState<T::kStages>& at,
                     const uint8_t* q_rows) {
    fh::zero_acc(acc);
    fh::wgmma_fence_operand(acc);
    pipe_k->template consumer_wait<T::kWaitStyle>(at);
    fh::wgmma_fence();
    if constexpr (T::kSDescLo) {
      const uint64_t da = fh::make_smem_desc_sw128(q_w_addr, 16, 1024);
      const uint64_t db = fh::make_smem_desc_sw128(k_addr + at.stage * T::kKvTileBytes, 16, 1024);
#pragma unroll
      for (int k = 0; k < T::kHeadDim / 16; ++k) {
        fh::wgmma_ss<T::kBlockN, 0, 0, T::kElem>(acc, fh::desc_advance_lo(da, fh::kmajor_k_offset(k, T::kBlockM)),
                                                 fh::desc_advance_lo(db, fh::kmajor_k_offset(k, T::kBlockN)),
                                                 k > 0);
      }
    } else {
      const uint8_t* k_s = smem + T::kOffK + at.stage * T::kKvTileBytes;
      const uint64_t da = fh::desc_kmajor_sw128(q_rows);
      const uint64_t db = fh::desc_kmajor_sw128(k_s);
#pragma unroll
      for (int k = 0; k < T::kHeadDim / 16; ++k) {
        fh::wgmma_ss<T::kBlockN, 0, 0, T::kElem>(acc, fh::desc_advance(da, fh::kmajor_k_offset(k, T::kBlockM)),
                                                 fh::desc_advance(db, fh::kmajor_k_offset(k, T::kBlockN)),
                                                 k > 0);
      }
    }
    fh::wgmma_commit();
  };
  // O += P V_j (one commit group): B = V_j [key][d] read N-major; N = d spans its
  // atom-columns.
  auto issue_pv = [&](const uint32_t (&a)[T::kBlockN / 16][4], const fh::PipelineState<T::kStages>& at) {
    pipe_v->template consumer_wait<T::kWaitStyle>(at);
    fh::wgmma_fence();  // also after the wait loop's branch (C7519)
    const uint8_t* v_s = smem + T::kOffV + at.stage * T::kKvTileBytes;
    const uint64_t db = fh::desc_mnmajor_sw128(v_s, T::kKvAtomBytes);
#pragma unroll
    for (int c = 0; c < T::kBlockN / 16; ++c) {
      fh::wgmma_rs<T::kHeadDim, 1, T::kElem>(o, a[c], fh::desc_advance(db, fh::mnmajor_k_offset(c)),
                                             true);
    }
    fh::wgmma_commit();
  };
  // Mask, then the online softmax of block j in place (acc becomes P, unnormalized), the row
  // statistics updated; returns in alpha the factor O must be rescaled by before P_j V_j.
  // mask: 0 tests whether block j needs the mask, 1 never masks, 2 always (split_mask_loop;
  // always a literal at the call, folded once inlined).
  // Blocks are masked from the first that reaches past seqlen_k or past this warpgroup's first
  // row's diagonal on (both conditions only grow with the block).
  auto first_masked_block = [&] {
    const int diag_end = m0 + diag + 1;  // keys below it are seen by every row here
    const int past_keys = w.seqlen_k / T::kBlockN;
    return p.causal ? min(past_keys, diag_end <= 0 ? 0 : diag_end / T::kBlockN) : past_keys;
  };
  int lean_masked_from = 0;  // lean_softmax's per-tile bound
  if constexpr (T::kLeanSoftmax) lean_masked_from = first_masked_block();
  auto softmax = [&](float (&acc)[kS], int j, float (&alpha)[2], int mask) {
    const int n0 = j * T::kBlockN;
    // Keys past seqlen_k and (causal) after a row's diagonal get -inf; only blocks that reach
    // past seqlen_k or cross the diagonal test each element. (One compare per element against
    // a per-row limit, as the backward masks, measured no faster here: docs/perf-log.md, "The
    // runbook measured".)
    bool masked_block;
    if constexpr (T::kLeanSoftmax) {
      masked_block = j >= lean_masked_from;
    } else {
      masked_block = n0 + T::kBlockN > w.seqlen_k || (p.causal && n0 + T::kBlockN - 1 > m0 + diag);
    }
    if (mask == 2 || (mask == 0 && masked_block)) {
#pragma unroll
      for (int r = 0; r < kS; ++r) {
        const int key = n0 + fh::acc_col(r, t);
        const int query = m0 + fh::acc_row(r, t);
        if (key >= w.seqlen_k || (p.causal && key > query + diag)) acc[r] = -INFINITY;
      }
    }
    // Base 2: p = exp2(S * scale_log2 - m * scale_log2). A row that has seen only masked keys
    // keeps m = -inf; its offset is taken as 0 so that no inf - inf appears (its p are
    // exp2(-inf) = 0 and its O and l stay 0).
    float offset[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m_raw[h];
#pragma unroll
      for (int r = 0; r < kS; ++r) {
        if (((r >> 1) & 1) == h) mx = fmaxf(mx, acc[r]);
      }
      mx = quad_max(mx);
      if constexpr (T::kLeanSoftmax) {
        // (lean_softmax, fwd_sm90.h) -inf * scale_log2 - offset = -inf for any offset >= -FLT_MAX.
        offset[h] = fmaxf(mx * p.scale_log2, -FLT_MAX);
        alpha[h] = fh::exp2_approx(m_raw[h] * p.scale_log2 - offset[h]);
      } else {
        offset[h] = mx == -INFINITY ? 0.f : mx * p.scale_log2;
        // O and l are still 0 while no key was seen: alpha must then be 0, not exp2(-offset),
        // which overflows to inf (and 0 * inf = NaN) when the first row maximum is very negative.
        alpha[h] = m_raw[h] == -INFINITY ? 0.f : fh::exp2_approx(m_raw[h] * p.scale_log2 - offset[h]);
      }
      m_raw[h] = mx;
    }
    float rowsum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < kS; ++r) {
      const int h = (r >> 1) & 1;
      acc[r] = fh::exp2_approx(acc[r] * p.scale_log2 - offset[h]);
      rowsum[h] += acc[r];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_part[h] = l_part[h] * alpha[h] + rowsum[h];
  };
  auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < T::kHeadDim / 2; ++r) o[r] *= alpha[(r >> 1) & 1];
  };
  // After the wait that retires a P V group: keeps later writes of the P fragments (the next
  // to_frags) from being moved above it.
  auto fence_frags = [&](uint32_t (&a)[T::kBlockN / 16][4]) {
#pragma unroll
    for (int c = 0; c < T::kBlockN / 16; ++c) fh::wgmma_fence_operand(a[c]);
  };
  auto to_frags = [&](const float (&acc)[kS], uint32_t (&a)[T::kBlockN / 16][4]) {
#pragma unroll
    for (int c = 0; c < T::kBlockN / 16; ++c) fh::acc_to_a_frag<T::kElem>(acc, c, a[c]);
  };

  // Row sums over the quad; O / l and LSE = (m * scale_log2 + log2 l) * ln 2. A row that saw no
  // key (l = 0) gets O = 0 and LSE = +inf.
  float inv[2], lse[2];
  auto finalize = [&] {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = quad_sum(l_part[h]);
      inv[h] = l > 0.f ? 1.f / l : 0.f;
      lse[h] = l > 0.f ? (m_raw[h] * p.scale_log2 + log2f(l)) * 0.6931471805599453f : INFINITY;
    }
  };
  float s[kS];
  uint32_t a[T::kBlockN / 16][4];
  float alpha[2];
  // The softmax of block j+1 runs while P_j V_j is on the tensor cores: S_{j+1} goes to `s`
  // while `a` (P_j) is still read by the wgmma in flight. Every wgmma group is waited for
  // inside its iteration: ptxas serialized all wgmmas when a group stayed in flight across the
  // back edge (docs/perf-log.md, backward v5), so the last block's P V is issued after the loop.
  if (w.n_count > 0) {
    turn_begin();
    issue_s(s, st, q_w);
    turn_end();
    fh::wgmma_wait<0>();
    fh::wgmma_fence_operand(s);
    if (warp_leader) pipe_k->consumer_release(st);
    release_q_after_last_s(w.n_count == 1);
    softmax(s, 0, alpha, 0);
    to_frags(s, a);  // O is 0: no rescale
    auto step = [&](int j, int mask) {
      fh::PipelineState<T::kStages> next = st;
      next.advance();
      turn_begin();
      issue_s(s, next, q_w);
      if constexpr (T::kRescaleBetween) {
        // rescale_between: the fences keep the multiplies after the S issue (in its shadow) and
        // before the P V issue (which accumulates into O).
        fh::wgmma_fence_operand(o);
        rescale_o(alpha);
        fh::wgmma_fence_operand(o);
      }
      issue_pv(a, st);
      turn_end();
      fh::wgmma_wait<1>();  // S_{j+1}; P_j V_j may still run
      fh::wgmma_fence_operand(s);
      if (warp_leader) pipe_k->consumer_release(next);
      release_q_after_last_s(j + 2 == w.n_count);
      softmax(s, j + 1, alpha, mask);
      if constexpr (T::kPvWaitBelow) fh::keep_waits_below(w.seqlen_k);  // (wgmma.h)
      fh::wgmma_wait<0>();  // P_j V_j
      fh::wgmma_fence_operand(o);
      fence_frags(a);
      if (warp_leader) pipe_v->consumer_release(st);
      if constexpr (!T::kRescaleBetween) rescale_o(alpha);
      to_frags(s, a);
      st = next;
    };
    int j = 0;
    if constexpr (T::kSplitMaskLoop) {
      // The steps before the first masked block (step j computes block j + 1) need no mask code.
      const int masked_from = first_masked_block();
      for (; j + 1 < min(masked_from, w.n_count); ++j) step(j, 1);
      for (; j + 1 < w.n_count; ++j) step(j, 2);
    } else {
      for (; j + 1 < w.n_count; ++j) step(j, 0);
    }
    if constexpr (T::kRescaleBetween) rescale_o(alpha);  // the last block's factor
    turn_begin();
    issue_pv(a, st);
    turn_end();
    if constexpr (T::kFinalizeInPv) {
      // finalize_in_pv: while the last P V runs (l and m are final after the last softmax);
      // the wait kept below it in the SASS.
      finalize();
      fh::keep_waits_below(w.seqlen_k);  // (wgmma.h)
    }
    fh::wgmma_wait<0>();
    fh::wgmma_fence_operand(o);
    if (warp_leader) pipe_v->consumer_release(st);
    st.advance();  // the next tile's first block
  }
  if (!T::kFinalizeInPv || w.n_count == 0) finalize();
  const CUtensorMap* out_map = T::kTmaStoreO && p.out_tma ? map_o : nullptr;  // (epilogue)
  // Q of this warpgroup is read by no wgmma any more (its last S was waited for): the O tile
  // is staged over it.
  // With one Q stage (d >= 192) a persistent CTA stages this tile's O where the warpgroup's
  // other warps read the previous tile's O. The mbarriers order it (their reads, the Q release,
  // the producer's wait, the TMA of this Q, its full barrier), but compute-sanitizer's racecheck
  // does not follow a chain through a TMA and reported it as a race; this barrier (one per tile)
  // states the order where the tool sees it.
  if constexpr (T::kOOverV) {
    // Staged over the V stages (in the Q stage's layout): after every warpgroup's last P V
    // (their wgmmas read all of V), then freed for the next tile's V_0.
    fh::named_bar_sync(T::kBarOStage, 128 * T::kConsumerWgs);
    auto release_o = [&] {
      fh::fence_proxy_async_shared();  // generic accesses before the next TMA write of V
      __syncwarp();
      if (warp_leader) reinterpret_cast<fh::TmaPipeline<1>*>(smem + T::kOffPipeO)->consumer_release(sq);
    };
    if constexpr (T::kCopyOutEarly) {
      store_out_and_lse<T::kHeadDim, T::kElem, true>(p, w, out_map, smem + T::kOffV + 64 * wg * 128,
                                                     T::kQAtomBytes, m0, t, T::kBarEpilogue0 + wg, o,
                                                     inv, lse, release_o);
    } else {
      store_out_and_lse<T::kHeadDim, T::kElem>(p, w, out_map, smem + T::kOffV + 64 * wg * 128,
                                               T::kQAtomBytes, m0, t, T::kBarEpilogue0 + wg, o, inv, lse);
      release_o();
    }
  } else {
    if constexpr (T::kQStages == 1) fh::named_bar_sync(T::kBarEpilogue0 + wg, 128);
    // This warp's reads of the staged O are done: the stage may take the next Q (a TMA write,
    // async proxy, after generic-proxy writes and reads of the same bytes: fence first).
    auto release_q = [&] {
      fh::fence_proxy_async_shared();  // every lane, before the warp's release
      __syncwarp();
      if (warp_leader) pipe_q->consumer_release(sq);
    };
    if constexpr (T::kCopyOutEarly) {
      store_out_and_lse<T::kHeadDim, T::kElem, true>(p, w, out_map, q_stage + 64 * wg * 128,
                                                     T::kQAtomBytes, m0, t, T::kBarEpilogue0 + wg, o,
                                                     inv, lse, release_q);
    } else {
      store_out_and_lse<T::kHeadDim, T::kElem>(p, w, out_map, q_stage + 64 * wg * 128, T::kQAtomBytes,
                                               m0, t, T::kBarEpilogue0 + wg, o, inv, lse);
      release_q();
    }
  }
  sq.advance();
}

}  // namespace sm90
}  // namespace flashback
