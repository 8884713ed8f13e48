// Main loop of the Hopper backward (head dim 256): the TMA producer and the two consumer
// warpgroups. Steps numbered as DESIGN.md section 4:
//   (1) S = Q_i K_j^T   (2) P = exp2(S * scale * log2e - LSE_i * log2e), masked
//   (3) dP = dO_i V_j^T (4) dS = P * (dP - D_i)
//   (5) dV_j += P^T dO_i   (6) dK_j += dS^T Q_i   (7) dQ_i += dS K_j
//
// Split by data (bwd_sm90.h): consumer warpgroup w owns keys 40w..40w+39 for (1)-(4) and
// head-dim rows 128w..128w+127 for (5)-(7). (5)-(7) are computed transposed (M = head dim):
//   (5) dV^T += dO^T P     (6) dK^T += Q^T dS     (7) dQ^T = K^T dS^T
// so every operand is a tile already in shared memory and no GEMM needs registers from the other
// warpgroup. P^T and dS^T ([key][query], 80 rows of 128 bytes) are the only hand-off: written
// with stmatrix.trans from each warpgroup's S / dP accumulators, read by both after one barrier.
//
// Shared memory (128B-swizzled tiles, 1024-aligned; TMA writes all but P^T / dS^T):
//   K_j, V_j     4 atom-columns of 80 rows x 128 B each, loaded once          80 KB
//   Q_i          q_stages x 4 atom-columns of 64 rows                           64 KB
//   dO_i         do_stages x 4 atom-columns of 64 rows                          32 KB
//   P^T, dS^T    2 buffers each (step parity), 80 rows x 128 B                  40 KB
//
// wgmma operands (FACTS section 11; M always 64 per instruction):
//   (1) S   = Q K_w^T    A = Q_i K-major, B = K rows 40w.. K-major      (SS, m64n40, K 256)
//   (3) dP  = dO V_w^T   A = dO_i K-major, B = V rows 40w.. K-major     (SS, m64n40, K 256)
//   (5) dV^T = dO^T P    A = dO_i MN-major (trans-a), B = P^T K-major    (SS, m64n80, K 64)
//   (6) dK^T = Q^T dS    A = Q_i MN-major (trans-a), B = dS^T K-major    (SS, m64n80, K 64)
//   (7) dQ^T = K^T dS^T  A = K MN-major (trans-a), B = dS^T MN-major     (SS, m64n64, K 80)
// (5)-(7) per warpgroup: two m64 tiles (head-dim quarters 2w, 2w+1).
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_epilogue.cuh"
#include "bwd_sm90/bwd_sm90_scheduler.cuh"
#include "hopper/hopper.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

namespace fh = flashback::hopper;

template <const BwdSm90Config& kCfg>
struct BwdSm90Traits {
  static constexpr int kHeadDim = kCfg.head_dim;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kQStages = kCfg.q_stages;
  static constexpr int kDoStages = kCfg.do_stages;
  static constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
  static_assert(kHeadDim == 256 && kBlockM == 64 && kBlockN == 80,
                "the warpgroup split below is written for 64 x 80 tiles at d = 256");
  static_assert(kBlockM == kDqTileRows, "dQaccum tiles are Q blocks");
  static constexpr int kHalfN = kBlockN / 2;               // keys per consumer warpgroup
  static constexpr int kAtomCols = kHeadDim / 64;          // 64-element (128-byte) columns
  static constexpr uint32_t kQAtomBytes = kBlockM * 128;   // one atom-column of a Q-side tile
  static constexpr uint32_t kKvAtomBytes = kBlockN * 128;  // one atom-column of K or V
  static constexpr uint32_t kQTileBytes = kAtomCols * kQAtomBytes;   // 32 KB
  static constexpr uint32_t kKvTileBytes = kAtomCols * kKvAtomBytes;  // 40 KB
  static constexpr uint32_t kHandBytes = kBlockN * kBlockM * 2;       // P^T or dS^T, 10 KB
  static constexpr uint32_t kOffK = 0;
  static constexpr uint32_t kOffV = kOffK + kKvTileBytes;
  static constexpr uint32_t kOffQ = kOffV + kKvTileBytes;
  static constexpr uint32_t kOffDo = kOffQ + kQStages * kQTileBytes;
  static constexpr uint32_t kOffP = kOffDo + kDoStages * kQTileBytes;  // 2 buffers
  static constexpr uint32_t kOffDs = kOffP + 2 * kHandBytes;           // 2 buffers
  static constexpr uint32_t kOffBar = kOffDs + 2 * kHandBytes;
  static constexpr uint32_t kOffPipeQ = kOffBar + 16;  // after the K and V barriers
  static constexpr uint32_t kOffPipeDo = kOffPipeQ + sizeof(fh::TmaPipeline<kQStages>);
  static constexpr size_t kSmemBytes =
      1024 /* alignment slack */ + kOffPipeDo + sizeof(fh::TmaPipeline<kDoStages>);
  static_assert(kSmemBytes <= 232448, "over the 227 KB a CTA may have");
  static_assert(kKvAtomBytes % 1024 == 0 && kHalfN * 128 % 1024 == 0 && kHandBytes % 1024 == 0,
                "swizzled tiles and their 40-row halves must stay 1024-aligned");
  // Epilogue staging of dV and dK as bf16 [key][d] rows padded by 16 bytes (stmatrix rows of
  // one matrix then fall into 8 different bank groups), over K, V and Q, dead by then.
  static constexpr uint32_t kStageRowBytes = kHeadDim * 2 + 16;
  static constexpr uint32_t kStageBytes = kBlockN * kStageRowBytes;
  static_assert(2 * kStageBytes <= kOffDo, "dK/dV staging must fit over K, V and Q");
  // setmaxnreg budget: __launch_bounds__(384, 1) gives 168 per thread = 64512 in the pool.
  static_assert(128 * kCfg.producer_regs + 256 * kCfg.consumer_regs <= 168 * kThreads,
                "setmaxnreg budget exceeds the register file: .inc would deadlock");
  // Named barriers between the consumer warpgroups (id 0 is __syncthreads).
  static constexpr uint32_t kBarHandoff = 1;  // both halves of P^T, dS^T of this step written
  static constexpr uint32_t kBarEpilogue = 2;  // K/V/Q reads done, then staging written
  // Deterministic mode, per phase h of the dQ adds (h = 0: the first quarter each warpgroup
  // adds, h = 1: the second) and its turn warp (bwd_sm90_turn_warp):
  static constexpr uint32_t kBarTurn0 = 3;   // 3 + h: the tile's turn for phase h has come
  static constexpr uint32_t kBarAdded0 = 5;  // 5 + h: both warpgroups issued their phase-h adds
  static constexpr uint32_t kTurnThreads = 256 + 32;
};

struct BwdSm90Maps {
  const CUtensorMap* q;
  const CUtensorMap* k;
  const CUtensorMap* v;
  const CUtensorMap* dout;
};

// ------------------------------------------------------------------------------ producer ---
// One thread: K_j and V_j once, then Q_i and dO_i of every step into their rings.
// Maps (sm90_common.h) give boxes of 64 d x 64 rows (Q, dO) or 64 d x 80 rows (K, V).
template <class T, bool kDet>
__device__ __forceinline__ void bwd_sm90_producer(const BwdSm90Params& p, const BwdSm90Maps& m,
                                                  const BwdSm90Work& w, uint8_t* smem,
                                                  uint64_t* kv_bar,
                                                  fh::TmaPipeline<T::kQStages>* pipe_q,
                                                  fh::TmaPipeline<T::kDoStages>* pipe_do) {
  if (w.n_iters == 0) return;  // nobody would wait for the copies
  const int n0 = w.n_block * T::kBlockN;
  // K on its own barrier, first: the first S needs K and Q_0 only; V (for dP) follows Q_0.
  auto load_kv = [&](uint32_t off, const CUtensorMap* map, uint64_t* bar, bool head_inner) {
    fh::mbar_arrive_expect_tx(bar, T::kKvTileBytes);
    tma_tile(smem + off, T::kKvAtomBytes, map, bar, head_inner, static_cast<int>(w.seq.row_k) + n0,
             w.kv_head, w.map_batch);
  };
  load_kv(T::kOffK, m.k, kv_bar, p.head_inner & 2);
  fh::PipelineState<T::kQStages> sq;
  fh::PipelineState<T::kDoStages> sd;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block;
    bwd_sm90_iter<kDet>(p, w, it, head, m_block);
    const int m0 = m_block * T::kBlockM;
    // Q first: with one dO stage the producer waits here for dO_{i-1} to be released (after
    // dV of step i-1), and Q_i is already on its way by then.
    // Rows m0.. of Q or dO of this q head into the next stage of their ring.
    auto load_rows = [&](auto* pipe, auto& st, uint32_t off, const CUtensorMap* map, bool inner) {
      pipe->producer_acquire(st);
      pipe->producer_expect(st, T::kQTileBytes);
      tma_tile(smem + off + st.stage * T::kQTileBytes, T::kQAtomBytes, map, pipe->full_barrier(st),
               inner, static_cast<int>(w.seq.row_q) + m0, head, w.map_batch);
      st.advance();
    };
    load_rows(pipe_q, sq, T::kOffQ, m.q, p.head_inner & 1);
    if (it == 0) load_kv(T::kOffV, m.v, kv_bar + 1, p.head_inner & 4);
    load_rows(pipe_do, sd, T::kOffDo, m.dout, p.head_inner & 8);
  }
}

// ------------------------------------------------------------------- consumer helpers ---

// (1) S or (3) dP for this warpgroup's 40 keys: X_i (64 queries, K-major, atom-columns 8 KB
// apart) times Y rows (40 keys of an 80-row tile, K-major, atom-columns 10 KB apart), K = 256.
template <class T>
__device__ __forceinline__ void gemm_q_by_kv(float (&acc)[T::kHalfN / 2], const uint8_t* x,
                                             const uint8_t* y) {
  const uint64_t dx = fh::desc_kmajor_sw128(x);
  const uint64_t dy = fh::desc_kmajor_sw128(y);
  fh::wgmma_ss_set<T::kHalfN>(acc, dx, dy);
#pragma unroll
  for (int s = 1; s < T::kHeadDim / 16; ++s) {
    fh::wgmma_ss<T::kHalfN>(acc, fh::desc_advance(dx, fh::kmajor_k_offset(s, T::kBlockM)),
                            fh::desc_advance(dy, fh::kmajor_k_offset(s, T::kBlockN)), true);
  }
}

// (5) dV^T or (6) dK^T quarter += X^T H: A = the Q-side tile's atom-column (64 head-dim rows,
// read M-major), B = the hand-off tile H^T [key][query] (K-major, K = 64 queries).
template <class T>
__device__ __forceinline__ void gemm_dkv(float (&acc)[T::kBlockN / 2], const uint8_t* x_atom,
                                         const uint8_t* hand) {
  const uint64_t da = fh::desc_mnmajor_sw128(x_atom, T::kQAtomBytes);
  const uint64_t db = fh::desc_kmajor_sw128(hand);
#pragma unroll
  for (int s = 0; s < T::kBlockM / 16; ++s) {
    fh::wgmma_ss<T::kBlockN, 1, 0>(acc, fh::desc_advance(da, fh::mnmajor_k_offset(s)),
                                   fh::desc_advance(db, fh::kmajor_k_offset(s, T::kBlockN)),
                                   true);
  }
}

// (7) dQ^T quarter = K^T dS^T: A = K's atom-column (64 head-dim rows, M-major over 80 keys),
// B = dS^T [key][query] read N-major (N = 64 queries), K = 80 keys in 5 steps.
template <class T>
__device__ __forceinline__ void gemm_dq(float (&acc)[T::kBlockM / 2], const uint8_t* k_atom,
                                        const uint8_t* ds) {
  const uint64_t da = fh::desc_mnmajor_sw128(k_atom, T::kKvAtomBytes);
  const uint64_t db = fh::desc_mnmajor_sw128(ds, T::kHandBytes);
#pragma unroll
  for (int s = 0; s < T::kBlockN / 16; ++s) {
    const uint32_t off = fh::mnmajor_k_offset(s);
    fh::wgmma_ss<T::kBlockM, 1, 1>(acc, fh::desc_advance(da, off), fh::desc_advance(db, off),
                                   s > 0);
  }
}

// A 64 x 40 accumulator (queries x this warpgroup's keys) as bf16 into the hand-off tile
// [key][query] (80 rows x 128 B, 128B-swizzled as a K-major wgmma operand): stmatrix.trans
// turns each 8 x 8 block (8 queries x 8 keys) into 8 key rows of 16 contiguous bytes.
// Block (key group j, query half h) of warp v holds keys 8j.., queries 16v + 8h..; matrices
// are taken in the order (j, 0), (j, 1), (j + 1, 0), (j + 1, 1).
template <class T>
__device__ __forceinline__ void store_hand_t(uint8_t* hand, const float (&acc)[T::kHalfN / 2],
                                             int wg, int t) {
  const int lane = t % 32;
  const int warp = t / 32;
  const uint32_t base = fh::smem_u32(hand);
  uint32_t pk[T::kHalfN / 4];
#pragma unroll
  for (int i = 0; i < T::kHalfN / 4; ++i) pk[i] = fh::pack_bf16x2(acc[2 * i], acc[2 * i + 1]);
  // pk[2j] = (j, 0), pk[2j + 1] = (j, 1).
  const int mat = lane / 8;  // x4: matrices 0..3; x2 uses lanes 0..15
  const int r = lane % 8;
  auto addr = [&](int j, int h) {
    const int key = T::kHalfN * wg + 8 * j + r;
    const int chunk = 2 * warp + h;
    return base + key * 128 + ((chunk ^ (key & 7)) << 4);
  };
#pragma unroll
  for (int j = 0; j + 1 < T::kHalfN / 8; j += 2) {
    fh::stmatrix_x4_trans(addr(j + mat / 2, mat & 1), pk[2 * j], pk[2 * j + 1], pk[2 * j + 2],
                          pk[2 * j + 3]);
  }
  if constexpr ((T::kHalfN / 8) % 2 == 1) {
    constexpr int j = T::kHalfN / 8 - 1;
    fh::stmatrix_x2_trans(addr(j, mat & 1), pk[2 * j], pk[2 * j + 1]);
  }
}

// ------------------------------------------------------------ deterministic turn warps ---
// Deterministic mode: warp 1 + h of the producer warpgroup keeps the dQ turns of phase h (the
// quarter each consumer warpgroup adds first, h = 0, or second, h = 1), so that neither the poll
// nor the release (which waits for the adds to reach L2) stalls the consumers, and each has a
// whole step to do both. Per step: poll the tile's phase-h counter until this K/V block's rank
// (bwd_sm90_dq_rank), let the consumers add (kBarTurn0 + h), wait until both warpgroups have
// issued their adds (kBarAdded0 + h: their bar.arrive orders the adds before this warp's
// bar.sync), then hand the turn on with one red.release. Each barrier has at most one phase
// open: the consumers cannot reach the next step's turn before this warp has passed the last.
template <class T>
__device__ __forceinline__ void bwd_sm90_turn_warp(const BwdSm90Params& p, const BwdSm90Work& w,
                                                   int h) {
  const bool leader = (threadIdx.x % 32) == 0;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block, pos;
    bwd_sm90_iter<true>(p, w, it, head, m_block, pos);
    int* turn = p.dq_turn + dq_tile(p.dq_tiles, w.seq, head, m_block) * 2 + h;
    if (leader) dq_turn_acquire(turn, bwd_sm90_dq_rank<T::kBlockM, T::kBlockN>(p, w, m_block, pos));
    __syncwarp();
    fh::named_bar_arrive(T::kBarTurn0 + h, T::kTurnThreads);
    fh::named_bar_sync(T::kBarAdded0 + h, T::kTurnThreads);
    if (leader) dq_turn_release(turn);
  }
}

// ---------------------------------------------------------------- consumer warpgroups ---
template <class T, bool kDet>
__device__ __forceinline__ void bwd_sm90_consumer(const BwdSm90Params& p, const BwdSm90Work& w,
                                                  uint8_t* smem, uint64_t* kv_bar,
                                                  fh::TmaPipeline<T::kQStages>* pipe_q,
                                                  fh::TmaPipeline<T::kDoStages>* pipe_do,
                                                  int wg) {
  const int t = threadIdx.x % 128;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  const int n0 = w.n_block * T::kBlockN;
  const int seqlen_k = w.seq.seqlen_k;
  const int diag = seqlen_k - w.seq.seqlen_q;  // causal: query i sees keys <= i + diag
  // This thread's two query rows in S / dP (accumulator rows) and first key column.
  const int q_row = fh::acc_row(0, t);
  const int key0 = n0 + T::kHalfN * wg + fh::acc_col(0, t);
  const uint8_t* k_half = smem + T::kOffK + T::kHalfN * wg * 128;
  const uint8_t* v_half = smem + T::kOffV + T::kHalfN * wg * 128;

  float acc_dv[2][T::kBlockN / 2];  // dV^T, head-dim quarters 2 wg and 2 wg + 1
  float acc_dk[2][T::kBlockN / 2];  // dK^T, same quarters
  fh::zero_acc(acc_dv[0]);
  fh::zero_acc(acc_dv[1]);
  fh::zero_acc(acc_dk[0]);
  fh::zero_acc(acc_dk[1]);
  if (w.n_iters > 0) fh::mbar_wait(kv_bar, 0);  // K

  fh::PipelineState<T::kQStages> sq;
  fh::PipelineState<T::kDoStages> sd;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block;
    bwd_sm90_iter<kDet>(p, w, it, head, m_block);
    const int m0 = m_block * T::kBlockM;
    const int64_t tile = dq_tile(p.dq_tiles, w.seq, head, m_block);  // dQaccum, stats, turns
    const int64_t stat_row = tile * T::kBlockM + q_row;
    const float lse0 = p.lse_log2[stat_row];
    const float lse1 = p.lse_log2[stat_row + 8];
    const float dsum0 = p.dsum[stat_row];
    const float dsum1 = p.dsum[stat_row + 8];
    uint8_t* p_t = smem + T::kOffP + (it & 1) * T::kHandBytes;
    uint8_t* ds_t = smem + T::kOffDs + (it & 1) * T::kHandBytes;
    const uint8_t* q_s = smem + T::kOffQ + sq.stage * T::kQTileBytes;
    const uint8_t* do_s = smem + T::kOffDo + sd.stage * T::kQTileBytes;

    // (1) S = Q_i K_w^T  then  (3) dP = dO_i V_w^T, two commit groups.
    float s[T::kHalfN / 2], dp[T::kHalfN / 2];
    // Both start with a write-only wgmma (wgmma_ss_set): no zeroing pass, no old value kept.
    pipe_q->consumer_wait(sq);
    fh::wgmma_fence();
    gemm_q_by_kv<T>(s, q_s, k_half);
    fh::wgmma_commit();
    if (it == 0) fh::mbar_wait(kv_bar + 1, 0);  // V
    pipe_do->consumer_wait(sd);
    fh::wgmma_fence();  // a wgmma after the wait loop's branch needs its own fence (C7519)
    gemm_q_by_kv<T>(dp, do_s, v_half);
    fh::wgmma_commit();

    // (2) P = exp2(S * scale * log2e - LSE * log2e) while dP is on the tensor cores. Keys past
    // seqlen_k and (causal) after the query's diagonal give 0; query rows past seqlen_q have
    // LSE = +inf. Only blocks that reach past seqlen_k or cross the diagonal test each element.
    fh::wgmma_wait<1>();
    fh::wgmma_fence_operand(s);
    const bool need_mask =
        n0 + T::kBlockN > seqlen_k || (p.causal && n0 + T::kBlockN - 1 > m0 + diag);
    if (need_mask) {
#pragma unroll
      for (int r = 0; r < T::kHalfN / 2; ++r) {
        const int key = key0 + 8 * (r >> 2) + (r & 1);
        const int query = m0 + q_row + 8 * ((r >> 1) & 1);
        const float l = (r & 2) ? lse1 : lse0;
        const bool masked = key >= seqlen_k || (p.causal && key > query + diag);
        s[r] = masked ? 0.f : fh::exp2_approx(s[r] * p.scale_log2 - l);
      }
    } else {
#pragma unroll
      for (int r = 0; r < T::kHalfN / 2; ++r) {
        s[r] = fh::exp2_approx(s[r] * p.scale_log2 - ((r & 2) ? lse1 : lse0));
      }
    }
    store_hand_t<T>(p_t, s, wg, t);

    // (4) dS = P * (dP - D)
    fh::wgmma_wait<0>();
    fh::wgmma_fence_operand(dp);
#pragma unroll
    for (int r = 0; r < T::kHalfN / 2; ++r) dp[r] = s[r] * (dp[r] - ((r & 2) ? dsum1 : dsum0));
    store_hand_t<T>(ds_t, dp, wg, t);
    fh::fence_proxy_async_shared();  // stmatrix (generic proxy) -> wgmma (async proxy) reads
    // Both warpgroups' halves are in place. The buffers alternate with the step's parity: the
    // other warpgroup passed this barrier only after its last wgmma of step i-1 had completed,
    // so step i+1 may overwrite what step i-1 read.
    fh::named_bar_sync(T::kBarHandoff, 256);

    // (7) dQ^T = K^T dS^T, (5) dV^T += dO^T P, (6) dK^T += Q^T dS. One dQ quarter at a time
    // (32 registers: 160 for dV^T/dK^T + 2 x 32 in flight made ptxas serialize and spill): the
    // first quarter is added while dV^T / dK^T run, the second after them. Groups retire in
    // order: dV frees dO_i, dK frees Q_i.
    float dq[T::kBlockM / 2];
    fh::zero_acc(dq);
    fh::wgmma_fence_operand(dq);
    fh::wgmma_fence();
    gemm_dq<T>(dq, smem + T::kOffK + (2 * wg) * T::kKvAtomBytes, ds_t);
    fh::wgmma_commit();
    gemm_dkv<T>(acc_dv[0], do_s + (2 * wg) * T::kQAtomBytes, p_t);
    gemm_dkv<T>(acc_dv[1], do_s + (2 * wg + 1) * T::kQAtomBytes, p_t);
    fh::wgmma_commit();
    gemm_dkv<T>(acc_dk[0], q_s + (2 * wg) * T::kQAtomBytes, ds_t);
    gemm_dkv<T>(acc_dk[1], q_s + (2 * wg + 1) * T::kQAtomBytes, ds_t);
    fh::wgmma_commit();
    fh::wgmma_wait<2>();
    fh::wgmma_fence_operand(dq);
    // Deterministic: wait until the phase-0 turn warp says this block's turn has come.
    if constexpr (kDet) fh::named_bar_sync(T::kBarTurn0, T::kTurnThreads);
    add_dq_partial(p, tile, 2 * wg, t, dq);
    if constexpr (kDet) fh::named_bar_arrive(T::kBarAdded0, T::kTurnThreads);
    fh::wgmma_fence();
    gemm_dq<T>(dq, smem + T::kOffK + (2 * wg + 1) * T::kKvAtomBytes, ds_t);
    fh::wgmma_commit();
    fh::wgmma_wait<2>();
    if (warp_leader) pipe_do->consumer_release(sd);
    fh::wgmma_wait<1>();
    if (warp_leader) pipe_q->consumer_release(sq);
    fh::wgmma_wait<0>();
    fh::wgmma_fence_operand(dq);
    if constexpr (kDet) fh::named_bar_sync(T::kBarTurn0 + 1, T::kTurnThreads);
    add_dq_partial(p, tile, 2 * wg + 1, t, dq);
    if constexpr (kDet) fh::named_bar_arrive(T::kBarAdded0 + 1, T::kTurnThreads);
    sq.advance();
    sd.advance();
  }
  fh::wgmma_fence_operand(acc_dv[0]);
  fh::wgmma_fence_operand(acc_dv[1]);
  fh::wgmma_fence_operand(acc_dk[0]);
  fh::wgmma_fence_operand(acc_dk[1]);

  // Epilogue: both warpgroups are done reading K, V, Q (their last wgmmas were waited for) once
  // both pass this barrier; then the staging tiles may overwrite them.
  fh::named_bar_sync(T::kBarEpilogue, 256);
  uint8_t* stage_dv = smem;
  uint8_t* stage_dk = smem + T::kStageBytes;
  stage_dkv_t<T::kBlockN>(stage_dv, T::kStageRowBytes, acc_dv, 1.f, wg, t);
  stage_dkv_t<T::kBlockN>(stage_dk, T::kStageRowBytes, acc_dk, p.softmax_scale, wg, t);
  fh::named_bar_sync(T::kBarEpilogue, 256);
  const int tid = threadIdx.x - 128;  // 0..255 over both consumer warpgroups
  copy_dkv_out<T::kBlockN>(p.dv, p.dv_strides, stage_dv, T::kStageRowBytes,
                           w.seq.k_offset(p.dv_strides), w.kv_head, n0, seqlen_k, tid);
  copy_dkv_out<T::kBlockN>(p.dk, p.dk_strides, stage_dk, T::kStageRowBytes,
                           w.seq.k_offset(p.dk_strides), w.kv_head, n0, seqlen_k, tid);
}

}  // namespace sm90
}  // namespace flashback
