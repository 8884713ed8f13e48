// The Hopper backward's consumer warpgroups when the config splits (5)-(7) by keys
// (BwdSm90Config::by_keys; d = 64). Steps numbered as in bwd_sm90_mainloop.cuh, which holds the
// traits, the producer and the split by head dim; docs/design.md sections 4 and 7.2 compare the two.
//
// Warpgroup w owns keys 64 w .. 64 w + 63 of the K/V block and a step takes block_m = 64 W
// queries (W consumer warpgroups):
//   (1) S^T = K_w Q^T    (3) dP^T = V_w dO^T      SS, m64 (keys) x n block_m (queries), K = d
//   (2) P^T, (4) dS^T = P^T * (dP^T - D) on those accumulators (LSE, D per query column from
//       the stage's rows in shared memory)
//   (5) dV_w += P^T dO   (6) dK_w += dS^T Q       RS: A = P^T / dS^T from registers, B = dO / Q
//                                                 [query][d] read N-major, K = block_m
//   (7) dQ^T = K^T dS^T for queries 64 w ..       SS after the hand-off of dS^T, K = block_n
// So P^T never leaves the registers, dV and dK need no hand-off, and only dS^T is written to
// shared memory ([key][query], block_m / 64 atom-columns of block_n rows). With W = 2 the
// warpgroups do the same work (S^T, dP^T, dV, dK, dQ^T: 8 m64n64k16-equivalents each per 64
// queries) and each wgmma has N >= 64 with at most one operand re-read per warpgroup.
// Warpgroup w's dQ^T goes to workspace tile step_tiles * m_block + w (dq_tile_out: through its
// buffer and dQ warp w's bulk reduce with dq_smem, else, and in the deterministic mode, added from
// registers).
#pragma once

#include <climits>

#include "bwd_sm90/bwd_sm90_mainloop.cuh"

namespace flashback {
namespace sm90 {

// (1) S^T or (3) dP^T: this warpgroup's 64 rows of K or V (A, K-major, atom-columns of block_n
// rows) times the Q-side tile (B, K-major, block_m rows), K = d.
template <class T>
__device__ __forceinline__ void gemm_kv_by_q(float (&acc)[T::kBlockM / 2], const uint8_t* kv_w,
                                             const uint8_t* x) {
  const uint64_t da = fh::desc_kmajor_sw128(kv_w);
  const uint64_t db = fh::desc_kmajor_sw128(x);
  fh::wgmma_ss_set<T::kBlockM, 0, 0, T::kElem>(acc, da, db);
#pragma unroll
  for (int s = 1; s < T::kHeadDim / 16; ++s) {
    fh::wgmma_ss<T::kBlockM, 0, 0, T::kElem>(acc, fh::desc_advance(da, fh::kmajor_k_offset(s, T::kBlockN)),
                                             fh::desc_advance(db, fh::kmajor_k_offset(s, T::kBlockM)),
                                             true);
  }
}

// (5) dV_w or (6) dK_w += H x: A = P^T or dS^T fragments (64 keys x block_m queries), B = the
// Q-side tile [query][d] read N-major (N = d), K = block_m.
template <class T>
__device__ __forceinline__ void gemm_rs_dkv(float (&acc)[T::kHeadDim / 2],
                                            const uint32_t (&a)[T::kBlockM / 16][4],
                                            const uint8_t* x) {
  const uint64_t db = fh::desc_mnmajor_sw128(x, T::kQAtomBytes);
#pragma unroll
  for (int c = 0; c < T::kBlockM / 16; ++c) {
    fh::wgmma_rs<T::kHeadDim, 1, T::kElem>(acc, a[c], fh::desc_advance(db, fh::mnmajor_k_offset(c)),
                                           true);
  }
}

// (7) dQ^T of 64 queries = K^T dS^T: A = K's atom-column (M-major over block_n keys), B = one
// atom-column of the dS^T hand-off (64 queries, N-major), K = block_n keys.
template <class T>
__device__ __forceinline__ void gemm_dq_by_keys(float (&acc)[32], const uint8_t* k_atom,
                                                const uint8_t* ds_atom) {
  const uint64_t da = fh::desc_mnmajor_sw128(k_atom, T::kKvAtomBytes);
  const uint64_t db = fh::desc_mnmajor_sw128(ds_atom, T::kHandAtomBytes);
#pragma unroll
  for (int s = 0; s < T::kBlockN / 16; ++s) {
    const uint32_t off = fh::mnmajor_k_offset(s);
    fh::wgmma_ss<64, 1, 1, T::kElem>(acc, fh::desc_advance(da, off), fh::desc_advance(db, off),
                                     s > 0);
  }
}

// dS^T fragments (this warpgroup's 64 keys x block_m queries) into the hand-off [key][query]:
// stmatrix without .trans turns each 8 x 8 block into 8 key rows of 16 bytes (8 queries); the
// 16-byte chunk `chunk` of a row (queries 8 chunk ..) lies in atom-column chunk / 8, 128B-swizzled
// as the N-major B operand of (7) reads it. a[c][j] of warp v holds keys 16 v + 8 (j & 1) + l / 4,
// queries 16 c + 8 (j >> 1) + 2 (l % 4) + {0, 1} (the A-fragment layout, wgmma.h).
template <class T>
__device__ __forceinline__ void store_ds_t(uint8_t* hand, const uint32_t (&a)[T::kBlockM / 16][4],
                                           int wg, int t) {
  const int lane = t % 32;
  const int mat = lane / 8;
  const uint32_t base = fh::smem_u32(hand);
  const int key = T::kWgKeys * wg + 16 * (t / 32) + 8 * (mat & 1) + lane % 8;
#pragma unroll
  for (int c = 0; c < T::kBlockM / 16; ++c) {
    const int chunk = 2 * c + mat / 2;
    fh::stmatrix_x4(base + (chunk / 8) * T::kHandAtomBytes + key * 128 + (((chunk % 8) ^ (key & 7)) << 4),
                    a[c][0], a[c][1], a[c][2], a[c][3]);
  }
}

// dV_w or dK_w (64 keys x d, fp32) times `scale` as 16-bit rows [key][d] of the staging tile.
// Row stride 2d + 16 bytes: a warp's 8 rows x 4 lanes hit 32 different banks.
template <class T>
__device__ __forceinline__ void stage_dkv_rows(uint8_t* stage, const float (&acc)[T::kHeadDim / 2],
                                               float scale, int wg, int t) {
#pragma unroll
  for (int r = 0; r < T::kHeadDim / 2; r += 2) {
    const int key = T::kWgKeys * wg + fh::acc_row(r, t);
    *reinterpret_cast<uint32_t*>(stage + key * T::kStageRowBytes + fh::acc_col(r, t) * 2) =
        fh::pack2<T::kElem>(acc[r] * scale, acc[r + 1] * scale);
  }
}

// The step's dQ^T of warpgroup w (queries 64 w .. of the step, workspace tile m_block x
// kStepTiles + w) out: into its buffer for its dQ warp's bulk reduce (kDqSmem), or added into
// dQaccum from registers (skipped for a padding tile: its dS^T columns are 0). Deterministic:
// this warpgroup's tile is phase wg, added in its turn (turn warp wg).
template <class T, bool kDqSmem, bool kDet>
__device__ __forceinline__ void dq_tile_out(const BwdSm90Params& p, const BwdSm90Work& w, uint8_t* smem,
                                            int it, int head, int m_block, int wg, int t,
                                            const float (&dq)[32]) {
  if constexpr (kDet) fh::named_bar_sync(T::kBarTurn0 + wg, T::kTurnThreads);
  if constexpr (kDqSmem) {
    if (it > 0) fh::named_bar_sync(T::kBarDqFree0 + wg, T::kDqThreads);
    store_dq_partial(smem + T::kOffDqBuf + wg * T::kDqBufBytes, t, dq);
    fh::fence_proxy_async_shared();  // st.shared (generic proxy) -> bulk reduce (async)
    fh::named_bar_arrive(T::kBarDqFull0 + wg, T::kDqThreads);
  } else if (m_block * T::kBlockM + 64 * wg < w.seq.seqlen_q) {
    add_dq_partial<T::kHeadDim>(p, dq_tile(p.dq_tiles, w.seq, head, m_block * T::kStepTiles + wg), 0, t,
                                dq);
  }
  if constexpr (kDet) fh::named_bar_arrive(T::kBarAdded0 + wg, T::kTurnThreads);
}

// (2) P^T of one step (rows are keys key_lo, key_lo + 8; columns queries q0 + 8 j + {0, 1}):
// keys past seqlen_k and (causal) after a query's diagonal give 0 (kMasked); query columns past
// seqlen_q have LSE = +inf (workspace padding). Column groups [kJLo, kJHi) (all by default).
template <class T, bool kMasked, int kS, int kJLo = 0, int kJHi = T::kBlockM / 8>
__device__ __forceinline__ void p_t_exps(const BwdSm90Params& p, float (&s)[kS], const float2* lse2,
                                         int key_lo, int q0, int seqlen_k, int diag) {
  // The mask as one compare per element (p_values in bwd_sm90_mainloop.cuh): element (j, e) is
  // masked when its query offset 8 j + (e & 1) is below its key row's limit: all of a row past
  // seqlen_k, else (causal) the queries before key - diag.
  int qlim[2] = {0, 0};
  if constexpr (kMasked) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key_lo + 8 * h;
      qlim[h] = key >= seqlen_k ? INT_MAX : (p.causal ? key - diag - q0 : INT_MIN);
    }
  }
#pragma unroll
  for (int j = kJLo; j < kJHi; ++j) {
    const float2 l = lse2[4 * j];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 4 * j + e;
      const bool masked = kMasked && 8 * j + (e & 1) < qlim[e >> 1];
      s[r] = p_element(masked, s[r], p.scale_log2, (e & 1) ? l.y : l.x);
    }
  }
}

// (4) dS^T = P^T * (dP^T - D), into dp.
template <class T, int kS>
__device__ __forceinline__ void ds_t_values(const float (&s)[kS], float (&dp)[kS], const float2* dsum2) {
#pragma unroll
  for (int j = 0; j < T::kBlockM / 8; ++j) {
    const float2 dd = dsum2[4 * j];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? dd.y : dd.x));
    }
  }
}

// ds_in_branch: (2), the wait for dP^T and (4) in one function body per mask case (the step's
// branch; ptxas moves no instruction across its join). The first half of the exponentials
// stays above the wait for dP^T (results fenced, a basic block ended: ptxas would put the wait
// first), overlapping the dP^T wgmma; the second half (inputs fenced after the wait) shares a
// block with the dS arithmetic, which ptxas interleaves with them, as in FA3's step.
template <class T, bool kMasked, int kS>
__device__ __forceinline__ void p_t_and_ds_t(const BwdSm90Params& p, float (&s)[kS], float (&dp)[kS],
                                             const float2* lse2, const float2* dsum2, int key_lo,
                                             int q0, int seqlen_k, int diag) {
  constexpr int kJHalf = T::kBlockM / 16;  // column groups of 4 registers
  p_t_exps<T, kMasked, kS, 0, kJHalf>(p, s, lse2, key_lo, q0, seqlen_k, diag);
  fh::wgmma_fence_operand<0, 4 * kJHalf>(s);
  fh::keep_waits_below(seqlen_k);
  fh::wgmma_wait<0>();  // dP^T
  fh::wgmma_fence_operand(dp);
  fh::wgmma_fence_operand<4 * kJHalf, kS>(s);
  p_t_exps<T, kMasked, kS, kJHalf>(p, s, lse2, key_lo, q0, seqlen_k, diag);
  ds_t_values<T>(s, dp, dsum2);
}

template <class T, bool kDet>
__device__ __forceinline__ void bwd_sm90_consumer_by_keys(const BwdSm90Params& p,
                                                          const BwdSm90Work& w, uint8_t* smem,
                                                          uint64_t* kv_bar,
                                                          fh::TmaPipeline<T::kQStages>* pipe_q,
                                                          fh::TmaPipeline<T::kDoStages>* pipe_do,
                                                          const int wg) {
  constexpr int kS = T::kBlockM / 2;   // S^T, dP^T registers (64 keys x block_m queries)
  constexpr int kK = T::kBlockM / 16;  // k16 steps of (5), (6): fragments per operand
  // Deterministic, the ordered adds stay in registers unless the dQ warps keep the turns.
  constexpr bool kDqSmem = T::kDqViaSmem && (!kDet || T::kDetDqWarp);
  constexpr bool kTurns = kDet && !T::kDetDqWarp;  // the consumers wait for turn warps
  const int t = threadIdx.x % 128;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  const int n0 = w.n_block * T::kBlockN;
  const int seqlen_k = w.seq.seqlen_k;
  const int seqlen_q = w.seq.seqlen_q;
  const int diag = seqlen_k - seqlen_q;  // causal: query i sees keys <= i + diag
  // This thread's keys (accumulator rows) key_lo, key_lo + 8 and query columns col0 + 8 j + {0, 1}.
  const int key_lo = n0 + T::kWgKeys * wg + fh::acc_row(0, t);
  const int col0 = fh::acc_col(0, t);
  const uint8_t* k_w = smem + T::kOffK + T::kWgKeys * wg * 128;
  const uint8_t* v_w = smem + T::kOffV + T::kWgKeys * wg * 128;

  float acc_dv[T::kHeadDim / 2];  // dV of this warpgroup's 64 keys
  float acc_dk[T::kHeadDim / 2];
  fh::zero_acc(acc_dv);
  fh::zero_acc(acc_dk);
  if (w.n_iters > 0) fh::mbar_wait<T::kWaitStyle>(kv_bar, 0);  // K
  const BwdSm90StatRows<T, kDet> stat_rows{p, w, reinterpret_cast<float*>(smem + T::kOffRows), wg * 128 + t};
  if constexpr (T::kStatsByConsumers) stat_rows.prologue();

  fh::PipelineState<T::kQStages> sq;
  fh::PipelineState<T::kDoStages> sd;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block;
    bwd_sm90_iter<kDet, T::kDetFromEnd>(p, w, it, head, m_block);
    const int m0 = m_block * T::kBlockM;
    // stats_by_consumers: the next step's row, stored before this step's hand-off barrier.
    float next_row = 0.f;
    if constexpr (T::kStatsByConsumers) next_row = stat_rows.next(it);
    // LSE and D of column group j at [4 j] (two floats: columns col0 + 8 j, + 1): the stages'
    // rows, or stats_by_consumers' buffer of this step.
    const float2* lse2 =
        reinterpret_cast<const float2*>(T::kStatsByConsumers ? stat_rows.lse(it)
                                                             : reinterpret_cast<const float*>(
                                                                   smem + T::kOffLse + sq.stage * T::kStatBytes)) +
        col0 / 2;
    const float2* dsum2 =
        reinterpret_cast<const float2*>(T::kStatsByConsumers ? stat_rows.dsum(it)
                                                             : reinterpret_cast<const float*>(
                                                                   smem + T::kOffDsum + sd.stage * T::kStatBytes)) +
        col0 / 2;
    uint8_t* ds_t = smem + T::kOffDs + (it & 1) * T::kHandBytes;
    const uint8_t* q_s = smem + T::kOffQ + sq.stage * T::kQTileBytes;
    const uint8_t* do_s = smem + T::kOffDo + sd.stage * T::kQTileBytes;

    // (1) S^T = K_w Q_i^T  then  (3) dP^T = V_w dO_i^T, two commit groups.
    float s[kS], dp[kS];
    pipe_q->template consumer_wait<T::kWaitStyle>(sq);
    fh::wgmma_fence();
    gemm_kv_by_q<T>(s, k_w, q_s);
    fh::wgmma_commit();
    if (it == 0) fh::mbar_wait<T::kWaitStyle>(kv_bar + 1, 0);  // V
    pipe_do->template consumer_wait<T::kWaitStyle>(sd);
    fh::wgmma_fence();  // a wgmma after the wait loop's branch needs its own fence (C7519)
    gemm_kv_by_q<T>(dp, v_w, do_s);
    fh::wgmma_commit();

    // (2) P^T (p_t_exps), only steps that cross the diagonal or seqlen_k test the mask.
    fh::wgmma_wait<1>();
    fh::wgmma_fence_operand(s);
    const bool need_mask =
        n0 + T::kBlockN > seqlen_k || (p.causal && n0 + T::kBlockN - 1 > m0 + diag);
    if constexpr (T::kDsInBranch) {
      if (need_mask) {
        p_t_and_ds_t<T, true>(p, s, dp, lse2, dsum2, key_lo, m0 + col0, seqlen_k, diag);
      } else {
        p_t_and_ds_t<T, false>(p, s, dp, lse2, dsum2, key_lo, m0 + col0, seqlen_k, diag);
      }
    } else if (need_mask) {
      p_t_exps<T, true>(p, s, lse2, key_lo, m0 + col0, seqlen_k, diag);
    } else {
      p_t_exps<T, false>(p, s, lse2, key_lo, m0 + col0, seqlen_k, diag);
    }
    // (5) dV_w += P^T dO_i at once: it runs while dS^T is computed (ds_in_branch: after it).
    uint32_t pa[kK][4];
#pragma unroll
    for (int c = 0; c < kK; ++c) fh::acc_to_a_frag<T::kElem>(s, c, pa[c]);
    if constexpr (!T::kDsInBranch) {
      fh::wgmma_fence();
      gemm_rs_dkv<T>(acc_dv, pa, do_s);
      fh::wgmma_commit();

      // (4) dS^T = P^T * (dP^T - D)
      fh::wgmma_wait<1>();  // dP^T (dV may still run)
      fh::wgmma_fence_operand(dp);
      ds_t_values<T>(s, dp, dsum2);
    }
    uint32_t da[kK][4];
#pragma unroll
    for (int c = 0; c < kK; ++c) fh::acc_to_a_frag<T::kElem>(dp, c, da[c]);
    if constexpr (T::kDsInBranch) {  // the same group order as above: dV first
      fh::wgmma_fence();
      gemm_rs_dkv<T>(acc_dv, pa, do_s);
      fh::wgmma_commit();
    }
    // dS^T to shared memory for (7), then (6) dK_w += dS^T Q_i: the stores read the fragments
    // before the RS wgmma does (touching an in-flight wgmma's A registers is undefined in PTX).
    store_ds_t<T>(ds_t, da, wg, t);
    if constexpr (T::kStatsByConsumers) stat_rows.store(it, next_row);
    fh::fence_proxy_async_shared();  // stmatrix (generic proxy) -> wgmma (async proxy) reads
    if constexpr (!T::kDqBeforeDk) {
      fh::wgmma_fence();
      gemm_rs_dkv<T>(acc_dk, da, q_s);
      fh::wgmma_commit();
    }
    // Every warpgroup's dS^T is in place. The buffers alternate with the step's parity: the
    // other warpgroups passed this barrier only after their last wgmmas of step i-1 had
    // completed, so step i+1 may overwrite what step i-1 read.
    fh::named_bar_sync(T::kBarHandoff, T::kConsumerThreads);

    // (7) dQ^T = K^T dS^T for queries m0 + 64 wg ..
    float dq[32];
    fh::zero_acc(dq);
    fh::wgmma_fence_operand(dq);
    fh::wgmma_fence();
    gemm_dq_by_keys<T>(dq, smem + T::kOffK, ds_t + wg * T::kHandAtomBytes);
    fh::wgmma_commit();
    if constexpr (T::kDqBeforeDk) {
      gemm_rs_dkv<T>(acc_dk, da, q_s);
      fh::wgmma_commit();
    }
    // Groups retire in order (dV, dK, dQ^T; dq_before_dk: dV, dQ^T, dK): dV frees dO_i (and
    // P^T's registers), dK frees Q_i. A warp's
    // leader releases a stage for its lanes, whose reads of its LSE / D rows the next bulk copy
    // into it overwrites: __syncwarp orders those reads before the leader's release (an
    // mbarrier arrive releases only its own thread's accesses); the proxy fence after the dS^T
    // stores orders them before that async-proxy write.
    __syncwarp();
    fh::wgmma_wait<2>();
    if (warp_leader) pipe_do->consumer_release(sd);
    if constexpr (T::kDqBeforeDk) {
      fh::wgmma_wait<1>();  // dQ^T; dK may still run
      fh::wgmma_fence_operand(dq);
      dq_tile_out<T, kDqSmem, kTurns>(p, w, smem, it, head, m_block, wg, t, dq);
      fh::wgmma_wait<0>();  // dK, whose A fragments (da) stay live until here
#pragma unroll
      for (int c = 0; c < kK; ++c) {
        fh::wgmma_fence_operand(pa[c]);
        fh::wgmma_fence_operand(da[c]);
      }
      if (warp_leader) pipe_q->consumer_release(sq);
    } else {
      fh::wgmma_wait<1>();
      if (warp_leader) pipe_q->consumer_release(sq);
#pragma unroll
      for (int c = 0; c < kK; ++c) {
        fh::wgmma_fence_operand(pa[c]);
        fh::wgmma_fence_operand(da[c]);
      }
      fh::wgmma_wait<0>();
      fh::wgmma_fence_operand(dq);
      dq_tile_out<T, kDqSmem, kTurns>(p, w, smem, it, head, m_block, wg, t, dq);
    }
    sq.advance();
    sd.advance();
  }
  fh::wgmma_fence_operand(acc_dv);
  fh::wgmma_fence_operand(acc_dk);

  dq_post_arrive<T, kDet>();
  // Epilogue as in the split by head dim, rows of this warpgroup's keys.
  fh::named_bar_sync(T::kBarEpilogue, T::kConsumerThreads);
  uint8_t* stage_dv = smem;
  uint8_t* stage_dk = smem + T::kStageBytes;
  stage_dkv_rows<T>(stage_dv, acc_dv, 1.f, wg, t);
  stage_dkv_rows<T>(stage_dk, acc_dk, p.softmax_scale, wg, t);
  copy_out_dkv<T>(p, w, stage_dv, stage_dk, n0, seqlen_k);
}

}  // namespace sm90
}  // namespace flashback
