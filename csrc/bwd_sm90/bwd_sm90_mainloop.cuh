// Main loop of the Hopper backward (head dim 256): the TMA producer and the two consumer
// warpgroups. Steps numbered as DESIGN.md section 4:
//   (1) S = Q_i K_j^T   (2) P = exp2(S * scale * log2e - LSE_i * log2e), masked
//   (3) dP = dO_i V_j^T (4) dS = P * (dP - D_i)
//   (5) dV_j += P^T dO_i   (6) dK_j += dS^T Q_i   (7) dQ_i += dS K_j
//
// Everything is computed transposed (K/V rows = wgmma M = 64): S^T and dP^T come out with one
// key per accumulator row, so P^T and dS^T are already the register A operands of (5) and (6)
// (FACTS section 3: an fp32 accumulator converts in place into A fragments).
//
// Shared memory (all 128B-swizzled tiles of 64 rows x 128 bytes, 1024-aligned, written by TMA
// except dS):
//   K_j, V_j         4 atom-columns each (d = 0..255), loaded once        64 KB
//   Q_i, dO_i        q_stages x 4 atom-columns each                        128 KB
//   dS^T             [kv][q] bf16, written by warpgroup B                   8 KB
//   P^T              fp32 in accumulator order, A -> B hand-off             16 KB
//
// wgmma operand majorness (FACTS section 11):
//   (1) S^T = K Q^T    A = K  K-major, B = Q  K-major           (SS, M 64, N 64,  K 256)
//   (3) dP^T = V dO^T  A = V  K-major, B = dO K-major           (SS, M 64, N 64,  K 256)
//   (5) dV += P^T dO   A = P^T registers, B = dO MN-major       (RS, M 64, N 256, K 64)
//   (6) dK += dS^T Q   A = dS^T registers, B = Q MN-major       (RS, M 64, N 256, K 64)
//   (7) dQ = dS K      A = dS^T smem MN-major, B = K MN-major   (SS, M 64, N 128 per WG, K 64)
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_epilogue.cuh"
#include "bwd_sm90/bwd_sm90_scheduler.cuh"
#include "hopper/hopper.h"

namespace flashback {
namespace sm90 {

namespace fh = flashback::hopper;

template <const BwdSm90Config& kCfg>
struct BwdSm90Traits {
  static constexpr int kHeadDim = kCfg.head_dim;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kStages = kCfg.q_stages;
  static constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
  static_assert(kHeadDim == 256 && kBlockM == 64 && kBlockN == 64,
                "the warp roles below are written for 64 x 64 tiles at d = 256");
  static_assert(kBlockM == kDqTileRows, "dQaccum tiles are Q blocks");
  static constexpr int kAtomCols = kHeadDim / 64;          // 64-element (128-byte) columns
  static constexpr uint32_t kAtomBytes = 64 * 128;        // one 64-row atom-column
  static constexpr uint32_t kTileBytes = kAtomCols * kAtomBytes;  // 64 x 256 bf16 = 32 KB
  static constexpr uint32_t kOffK = 0;
  static constexpr uint32_t kOffV = kOffK + kTileBytes;
  static constexpr uint32_t kOffQ = kOffV + kTileBytes;
  static constexpr uint32_t kOffDo = kOffQ + kStages * kTileBytes;
  static constexpr uint32_t kOffDs = kOffDo + kStages * kTileBytes;
  static constexpr uint32_t kOffP = kOffDs + kBlockN * kBlockM * 2;
  static constexpr uint32_t kOffBar = kOffP + kBlockN * kBlockM * 4;
  static constexpr size_t kSmemBytes =
      1024 /* alignment slack */ + kOffBar + 8 /* kv barrier */ + sizeof(fh::TmaPipeline<kStages>);
  static_assert(kSmemBytes <= 232448, "over the 227 KB a CTA may have");
  // setmaxnreg budget: __launch_bounds__(384, 1) gives 168 per thread = 64512 in the pool.
  static_assert(128 * kCfg.producer_regs + 256 * kCfg.consumer_regs <= 168 * kThreads,
                "setmaxnreg budget exceeds the register file: .inc would deadlock");
  // Named barriers between the consumer warpgroups (id 0 is __syncthreads).
  static constexpr uint32_t kBarP = 1;   // P^T of this step is in shared memory
  static constexpr uint32_t kBarDs = 2;  // dS^T of this step is in shared memory
};

struct BwdSm90Maps {
  const CUtensorMap* q;
  const CUtensorMap* k;
  const CUtensorMap* v;
  const CUtensorMap* dout;
};

// ------------------------------------------------------------------------------ producer ---
// One thread: K_j and V_j once, then Q_i and dO_i of every step into the ring of stages.
// Maps are 4-D {d, seqlen, heads, batch} or {d, heads, seqlen, batch} (p.head_inner), boxes
// of 64 d x 64 rows. Rows past seqlen arrive as zeros and still count in the transaction bytes
// (FACTS section 4.2).
__device__ __forceinline__ void tma_rows(void* dst, const CUtensorMap* map, uint64_t* bar,
                                         bool head_inner, int d0, int row, int head, int batch) {
  if (head_inner) {
    const int c[4] = {d0, head, row, batch};
    fh::tma_load<4>(dst, map, bar, c);
  } else {
    const int c[4] = {d0, row, head, batch};
    fh::tma_load<4>(dst, map, bar, c);
  }
}

template <class T>
__device__ __forceinline__ void bwd_sm90_producer(const BwdSm90Params& p, const BwdSm90Maps& m,
                                                  const BwdSm90Work& w, uint8_t* smem,
                                                  uint64_t* kv_bar,
                                                  fh::TmaPipeline<T::kStages>* pipe) {
  if (w.n_iters == 0) return;  // nobody would wait for the copies
  const int n0 = w.n_block * T::kBlockN;
  fh::mbar_arrive_expect_tx(kv_bar, 2 * T::kTileBytes);
#pragma unroll
  for (int a = 0; a < T::kAtomCols; ++a) {
    tma_rows(smem + T::kOffK + a * T::kAtomBytes, m.k, kv_bar, p.head_inner & 2, 64 * a, n0,
             w.kv_head, w.batch);
    tma_rows(smem + T::kOffV + a * T::kAtomBytes, m.v, kv_bar, p.head_inner & 4, 64 * a, n0,
             w.kv_head, w.batch);
  }
  fh::PipelineState<T::kStages> st;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block;
    bwd_sm90_iter(p, w, it, head, m_block);
    pipe->producer_acquire(st);
    pipe->producer_expect(st, 2 * T::kTileBytes);
    uint64_t* full = pipe->full_barrier(st);
#pragma unroll
    for (int a = 0; a < T::kAtomCols; ++a) {
      const int m0 = m_block * T::kBlockM;
      tma_rows(smem + T::kOffQ + st.stage * T::kTileBytes + a * T::kAtomBytes, m.q, full,
               p.head_inner & 1, 64 * a, m0, head, w.batch);
      tma_rows(smem + T::kOffDo + st.stage * T::kTileBytes + a * T::kAtomBytes, m.dout, full,
               p.head_inner & 8, 64 * a, m0, head, w.batch);
    }
    st.advance();
  }
}

// ------------------------------------------------------------------- consumer helpers ---

// S^T or dP^T (64 keys x 64 queries) = X_j Y_i^T over d = 256: 16 k-steps of m64n64k16, both
// operands K-major (k-step s: atom-column s/4, 32 bytes per step inside it).
template <class T>
__device__ __forceinline__ void gemm_kv_by_q(float (&acc)[32], const uint8_t* x,
                                             const uint8_t* y) {
  const uint64_t dx = fh::desc_kmajor_sw128(x);
  const uint64_t dy = fh::desc_kmajor_sw128(y);
#pragma unroll
  for (int s = 0; s < T::kHeadDim / 16; ++s) {
    const uint32_t off = fh::kmajor_k_offset(s, 64);
    fh::wgmma_ss<64>(acc, fh::desc_advance(dx, off), fh::desc_advance(dy, off), s > 0);
  }
}

// dV += P^T dO or dK += dS^T Q: A = the 64 x 64 bf16 fragments (k-block c = queries 16c..),
// B = the Q-side tile as MN-major (rows = queries, 4 atom-columns of d 8 KB apart).
template <class T>
__device__ __forceinline__ void gemm_acc_dkv(float (&acc)[128], const uint32_t (&a)[4][4],
                                             const uint8_t* y) {
  const uint64_t dy = fh::desc_mnmajor_sw128(y, T::kAtomBytes);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    fh::wgmma_rs<256, 1>(acc, a[c], fh::desc_advance(dy, fh::mnmajor_k_offset(c)), true);
  }
}

// (7) dQ[:, 64 u .. 64 u + 64] = dS K_j: A = dS^T tile [kv][q] read as MN-major (M = q
// contiguous), B = K_j's atom-column u as MN-major (rows = keys). K = 64 keys, 4 steps.
template <class T>
__device__ __forceinline__ void gemm_dq(float (&dq)[32], const uint8_t* ds, const uint8_t* k,
                                        int u) {
  const uint64_t da = fh::desc_mnmajor_sw128(ds, T::kAtomBytes);
  const uint64_t db = fh::desc_mnmajor_sw128(k + u * T::kAtomBytes, T::kAtomBytes);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint32_t off = fh::mnmajor_k_offset(c);
    fh::wgmma_ss<64, 1, 1>(dq, fh::desc_advance(da, off), fh::desc_advance(db, off), c > 0);
  }
}

template <int R>
__device__ __forceinline__ void zero(float (&x)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) x[i] = 0.f;
}

template <int R>
__device__ __forceinline__ void to_a_frags(const float (&x)[R], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) fh::acc_to_a_frag(x, c, a[c]);
}

// ---------------------------------------------------------------- consumer warpgroups ---
// Both consumer warpgroups run this one function; `role` (0 = A, 1 = B, warpgroup-uniform)
// only picks operands and the elementwise middle:
//   role A: (1) S^T = K Q^T, (2) P^T -> shared memory, (5) dV += P^T dO, (7) dQ[:, 0:128]
//   role B: (3) dP^T = V dO^T, (4) dS^T -> shared memory, (6) dK += dS^T Q, (7) dQ[:, 128:256]
// One instruction stream instead of two: written as two functions, ptxas spilled ~900 bytes
// and serialized the wgmmas (C7512) although each alone compiled spill-free at <= 236
// registers (nvcc 13.0).
template <class T>
__device__ __forceinline__ void bwd_sm90_consumer(const BwdSm90Params& p, const BwdSm90Work& w,
                                                  uint8_t* smem, uint64_t* kv_bar,
                                                  fh::TmaPipeline<T::kStages>* pipe, int role) {
  const int t = threadIdx.x % 128;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  const int n0 = w.n_block * T::kBlockN;
  float* p_share = reinterpret_cast<float*>(smem + T::kOffP);
  uint8_t* ds_s = smem + T::kOffDs;
  // GEMM 1 operands: A: K_j x Q_i; B: V_j x dO_i. GEMM 2's B operand: A: dO_i; B: Q_i.
  const uint8_t* x_kv = smem + (role == 0 ? T::kOffK : T::kOffV);
  const uint32_t off_y1 = role == 0 ? T::kOffQ : T::kOffDo;
  const uint32_t off_y2 = role == 0 ? T::kOffDo : T::kOffQ;
  // LSE * log2e rows (role A) or D rows (role B), padded to whole Q blocks.
  const float* stat = role == 0 ? p.lse_log2 : p.dsum;
  float acc_kv[128];  // dV (role A) or dK (role B)
  zero(acc_kv);
  if (w.n_iters > 0) fh::mbar_wait(kv_bar, 0);

  fh::PipelineState<T::kStages> st;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block;
    bwd_sm90_iter(p, w, it, head, m_block);
    const int m0 = m_block * T::kBlockM;
    // This thread's 16 query columns (8 pairs) of LSE * log2e or D.
    const float* stat_row = stat +
                            (static_cast<int64_t>(w.batch) * p.nheads + head) * p.m_blocks * T::kBlockM +
                            m0 + 2 * (t % 4);
    float2 rowstat[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) rowstat[j] = *reinterpret_cast<const float2*>(stat_row + 8 * j);

    pipe->consumer_wait(st);
    const uint8_t* y1 = smem + off_y1 + st.stage * T::kTileBytes;
    const uint8_t* y2 = smem + off_y2 + st.stage * T::kTileBytes;

    // (1) S^T = K_j Q_i^T  |  (3) dP^T = V_j dO_i^T
    float s[32];
    zero(s);  // not loop-carried: the wgmma asm reads its accumulators ("+f") even when
              // scale-d is false, which otherwise keeps the last step's values alive
    fh::wgmma_fence();
    gemm_kv_by_q<T>(s, x_kv, y1);
    fh::wgmma_commit();
    fh::wgmma_wait<0>();
    fh::wgmma_fence_operand(s);

    if (role == 0) {
      // (2) P^T = exp2(S^T * scale * log2e - LSE * log2e); 0 for keys past seqlen_k and
      // (causal) keys after the query's diagonal. Query rows past seqlen_q have LSE = +inf.
      const int diag = p.seqlen_k - p.seqlen_q;
#pragma unroll
      for (int r = 0; r < 32; ++r) {
        const int key = n0 + fh::acc_row(r, t);
        const int query = m0 + fh::acc_col(r, t);
        const float l = (r & 1) ? rowstat[r >> 2].y : rowstat[r >> 2].x;
        const bool masked = key >= p.seqlen_k || (p.causal && key > query + diag);
        s[r] = masked ? 0.f : exp2f(s[r] * p.scale_log2 - l);
      }
      // Hand P^T to role B (fp32; its accumulator layout is ours: thread t, register r).
#pragma unroll
      for (int r = 0; r < 32; ++r) p_share[r * 128 + t] = s[r];
      fh::named_bar_arrive(T::kBarP, 256);
    } else {
      // (4) dS^T = P^T * (dP^T - D)
      fh::named_bar_sync(T::kBarP, 256);
#pragma unroll
      for (int r = 0; r < 32; ++r) {
        const float d = (r & 1) ? rowstat[r >> 2].y : rowstat[r >> 2].x;
        s[r] = p_share[r * 128 + t] * (s[r] - d);
      }
      // dS^T to shared memory as bf16 [kv][q], 128B-swizzled (the layout TMA would write for
      // a 64 x 64 box): key row R, query column C at R*128 + ((C/8 ^ R%8) * 16) + (C%8)*2.
      // A quad writes 16 contiguous bytes; a warp's 8 rows hit 8 different 16-byte bank groups.
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int r = 2 * j;
        const int row = fh::acc_row(r, t);
        const int col = fh::acc_col(r, t);
        const uint32_t off = row * 128 + (((col >> 3) ^ (row & 7)) << 4) + (col & 7) * 2;
        *reinterpret_cast<uint32_t*>(ds_s + off) = fh::pack_bf16x2(s[r], s[r + 1]);
      }
      fh::fence_proxy_async_shared();  // generic stores -> wgmma (async proxy) reads of dS^T
    }
    // dS^T of this step is in shared memory for both roles' (7). Role A also passes here
    // before writing the next P^T, so role B has read this one.
    fh::named_bar_sync(T::kBarDs, 256);

    // (5) dV += P^T dO_i  |  (6) dK += dS^T Q_i, then (7) dQ_i[:, 128 role ..] = dS K_j in
    // two 64-column quarters u = 2 role, 2 role + 1, all three issued back to back as three
    // commit groups (one fence covers the A fragments and the zeroed dQ registers). Groups
    // complete in order: wait<1> covers dV/dK and the first quarter (the stage can go back to
    // the producer and quarter 0 is added while quarter 1 is still on the tensor cores),
    // wait<0> the second quarter.
    uint32_t a[4][4];
    to_a_frags(s, a);
    float dq0[32], dq1[32];
    zero(dq0);
    zero(dq1);
    fh::wgmma_fence();
    gemm_acc_dkv<T>(acc_kv, a, y2);
    fh::wgmma_commit();
    gemm_dq<T>(dq0, ds_s, smem + T::kOffK, 2 * role);
    fh::wgmma_commit();
    gemm_dq<T>(dq1, ds_s, smem + T::kOffK, 2 * role + 1);
    fh::wgmma_commit();
    fh::wgmma_wait<1>();
    fh::wgmma_fence_operand(acc_kv);
    fh::wgmma_fence_operand(dq0);
    if (warp_leader) pipe->consumer_release(st);  // Q_i, dO_i no longer read by us
    add_dq_partial(p, w.batch, head, m_block, 2 * role, t, dq0);
    fh::wgmma_wait<0>();
    fh::wgmma_fence_operand(dq1);
    add_dq_partial(p, w.batch, head, m_block, 2 * role + 1, t, dq1);
    st.advance();
  }
  if (role == 0) {
    store_dkv(p.dv, p.dv_strides, w.batch, w.kv_head, n0, p.seqlen_k, t, 1.f, acc_kv);
  } else {
    store_dkv(p.dk, p.dk_strides, w.batch, w.kv_head, n0, p.seqlen_k, t, p.softmax_scale, acc_kv);
  }
}

}  // namespace sm90
}  // namespace flashback
