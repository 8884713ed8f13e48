// Reference backward, dK and dV: steps (1)-(6) of docs/design.md section 4, without (7).
//
// A CTA owns kBlockN rows of K and V of one (batch, kv head), keeps them in shared memory, and
// walks every q head of the GQA group and every Q block that sees those rows (causal: from the
// block holding the diagonal on). dK and dV accumulate in fp32 registers over the whole walk
// and are written once, so there are no atomics and the result is deterministic.
//
// Everything is computed transposed, with the warp's 16 key rows as the mma M dimension:
// S^T = K Q^T has one key per accumulator row, so P^T and dS^T come out of the mma already in
// the A-operand layout of dV += P^T dO and dK += dS^T Q and never visit shared memory.
//
// At headdim 256 one warp cannot hold both dK and dV for 16 rows (2 x 128 registers per
// thread), so the warps split roles (BwdDkDvConfig::split_roles): the first half recompute
// P^T and accumulate dV, the second half recompute P^T, dP^T, dS^T and accumulate dK, each
// half covering all kBlockN rows. S is computed twice; that is the price of fitting.
#include <cuda_bf16.h>

#include "bwd/reference_bwd.h"
#include "common/attention.cuh"
#include "common/sequence.cuh"
#include "common/mma.cuh"
#include "common/tile.cuh"

namespace flashback {
namespace ref {
namespace {

struct BwdDkDvConfig {
  int block_m;       // Q rows per step
  int block_n;       // K/V rows owned by the CTA (16 per warp, per role)
  int warps;
  bool split_roles;  // half the warps do dV, half do dK (see the file comment)
};

// headdim <= 128: a warp holds dK + dV (<= 128 registers) and S^T, dP^T for 64 Q rows (64).
// headdim 256: split roles; a dK warp holds dK (128), S^T and dP^T (64).
// -Xptxas -v (nvcc 13.0): 184 / 246 / 244 registers at headdim 64 / 128 / 256, no spills.
[[maybe_unused]] constexpr BwdDkDvConfig bwd_dkdv_config(int head_dim) {
  return head_dim <= 128 ? BwdDkDvConfig{64, 128, 8, false} : BwdDkDvConfig{64, 64, 8, true};
}

template <int kHeadDim>
struct BwdDkDvTraits {
  static constexpr BwdDkDvConfig kCfg = bwd_dkdv_config(kHeadDim);
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kWarps = kCfg.warps;
  static constexpr bool kSplitRoles = kCfg.split_roles;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpsPerRole = kSplitRoles ? kWarps / 2 : kWarps;
  static_assert(kBlockN == 16 * kWarpsPerRole, "each warp (of each role) owns 16 K/V rows");
  static_assert(kBlockM % 16 == 0, "Q blocks are whole mma k-steps");

  using KVTile = SmemTile<kBlockN, kHeadDim>;
  using QTile = SmemTile<kBlockM, kHeadDim>;
  static constexpr int kStatsBytes = 2 * kBlockM * static_cast<int>(sizeof(float));
  static constexpr int kSmemBytes = 2 * KVTile::kBytes + 2 * QTile::kBytes + kStatsBytes;
  static_assert(kSmemBytes <= kMaxSmemBytes, "dK/dV tiles exceed shared memory");
};

struct Smem {
  bf16 *k, *v, *q, *dout;
  float* lse_log2;  // [kBlockM]: LSE * log2(e) of the Q block's rows; +inf past seqlen_q
  float* dsum;      // [kBlockM]: D of the Q block's rows; 0 past seqlen_q
};

enum class Role { kBoth, kDv, kDk };

// One Q block against this warp's 16 K/V rows. dv/dk are the warp's accumulators; a warp
// with a single role gets the same array twice and touches only its own.
template <int kHeadDim, Role kRole>
__device__ __forceinline__ void dkdv_step(const Smem& sm, int warp_row0, int n0, int m0,
                                          const Mask& mask, float scale_log2,
                                          float (&dv)[kHeadDim / 8][4],
                                          float (&dk)[kHeadDim / 8][4]) {
  using T = BwdDkDvTraits<kHeadDim>;
  constexpr int kBlockM = T::kBlockM;
  const typename T::KVTile k_s{sm.k}, v_s{sm.v};
  const typename T::QTile q_s{sm.q}, do_s{sm.dout};

  // (1) S^T = K_j Q_i^T: this warp's 16 keys x kBlockM queries
  float p[kBlockM / 8][4];
  zero(p);
  gemm_abt_smem<kBlockM, kHeadDim>(p, k_s, warp_row0, q_s, 0);

  // (2) P^T = exp2(S^T * scale * log2e - LSE_i * log2e), 0 where masked. Query rows past the
  // end and rows that saw no key have LSE = +inf, so their P is exactly 0 too.
#pragma unroll
  for (int nt = 0; nt < kBlockM / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = n0 + warp_row0 + acc_row(e);
      const int i_local = acc_col(nt, e);
      p[nt][e] = mask(m0 + i_local, j) ? 0.f : exp2f(p[nt][e] * scale_log2 - sm.lse_log2[i_local]);
    }
  }

  // (5) before (3): a dV-only warp is done after this.
  if constexpr (kRole != Role::kDk) {
    // (5) dV_j += P^T dO_i
    uint32_t p_frags[kBlockM / 16][4];
    acc_to_a_frags<kBlockM>(p_frags, p);
    gemm_ab_reg<kHeadDim, kBlockM>(dv, p_frags, do_s);
  }

  if constexpr (kRole != Role::kDv) {
    // (3) dP^T = V_j dO_i^T
    float ds[kBlockM / 8][4];
    zero(ds);
    gemm_abt_smem<kBlockM, kHeadDim>(ds, v_s, warp_row0, do_s, 0);

    // (4) dS^T = P^T * (dP^T - D_i)
#pragma unroll
    for (int nt = 0; nt < kBlockM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - sm.dsum[acc_col(nt, e)]);
    }

    // (6) dK_j += dS^T Q_i (softmax_scale is applied once, at the end)
    uint32_t ds_frags[kBlockM / 16][4];
    acc_to_a_frags<kBlockM>(ds_frags, ds);
    gemm_ab_reg<kHeadDim, kBlockM>(dk, ds_frags, q_s);
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(BwdDkDvTraits<kHeadDim>::kThreads, 1)
    reference_bwd_dkdv_kernel(const flashback_bwd_params p, const float* dsum) {
  using T = BwdDkDvTraits<kHeadDim>;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kThreads = T::kThreads;
  constexpr bool kSplitRoles = T::kSplitRoles;

  extern __shared__ __align__(16) unsigned char smem[];
  Smem sm;
  {
    unsigned char* ptr = smem;
    sm.k = reinterpret_cast<bf16*>(ptr);
    ptr += T::KVTile::kBytes;
    sm.v = reinterpret_cast<bf16*>(ptr);
    ptr += T::KVTile::kBytes;
    sm.q = reinterpret_cast<bf16*>(ptr);
    ptr += T::QTile::kBytes;
    sm.dout = reinterpret_cast<bf16*>(ptr);
    ptr += T::QTile::kBytes;
    sm.lse_log2 = reinterpret_cast<float*>(ptr);
    sm.dsum = sm.lse_log2 + kBlockM;
  }
  const typename T::KVTile k_s{sm.k}, v_s{sm.v};
  const typename T::QTile q_s{sm.q}, do_s{sm.dout};

  const int n_block = blockIdx.x;
  const int head_k = blockIdx.y;
  const int batch = blockIdx.z;
  const int group = p.nheads / p.nheads_k;
  const int n0 = n_block * kBlockN;
  const int warp = threadIdx.x / 32;
  const bool is_dk_warp = kSplitRoles && warp >= T::kWarpsPerRole;
  const int warp_row0 = (warp % T::kWarpsPerRole) * 16;  // this warp's K/V rows in the block
  const SeqRows seq = seq_rows(p, batch);
  if (n0 >= seq.seqlen_k) return;  // varlen: the grid covers the longest sequence
  const Mask mask{seq.seqlen_q, seq.seqlen_k, p.causal != 0};
  const float scale_log2 = p.softmax_scale * kLog2e;

  const bf16* k = static_cast<const bf16*>(p.k) + seq.k_offset(p.k_strides) +
                  head_k * p.k_strides.head + n0 * p.k_strides.row;
  const bf16* v = static_cast<const bf16*>(p.v) + seq.k_offset(p.v_strides) +
                  head_k * p.v_strides.head + n0 * p.v_strides.row;
  load_tile_async<kThreads>(k_s, k, p.k_strides.row, seq.seqlen_k - n0);
  load_tile_async<kThreads>(v_s, v, p.v_strides.row, seq.seqlen_k - n0);
  cp_async_commit();

  // acc[0] is dV (or, for a dK-role warp, dK); acc[1] is dK when the warp does both.
  float acc[kSplitRoles ? 1 : 2][kHeadDim / 8][4];
#pragma unroll
  for (int a = 0; a < (kSplitRoles ? 1 : 2); ++a) zero(acc[a]);

  const int m_begin = mask.m_block_begin(n0, kBlockM);
  const int m_end = (seq.seqlen_q + kBlockM - 1) / kBlockM;
  for (int head = head_k * group; head < (head_k + 1) * group; ++head) {
    const bf16* q = static_cast<const bf16*>(p.q) + seq.q_offset(p.q_strides) +
                    head * p.q_strides.head;
    const bf16* dout = static_cast<const bf16*>(p.dout) + seq.q_offset(p.dout_strides) +
                       head * p.dout_strides.head;
    // D lives in the workspace as (batch, nheads, seqlen_q) for dense and varlen batches alike.
    const int64_t dsum_offset = (static_cast<int64_t>(batch) * p.nheads + head) * p.seqlen_q;
    const int64_t lse_offset = lse_index(p, seq, head, 0);

    for (int m_block = m_begin; m_block < m_end; ++m_block) {
      const int m0 = m_block * kBlockM;
      __syncthreads();  // every warp is done with the previous Q block
      load_tile_async<kThreads>(q_s, q + m0 * p.q_strides.row, p.q_strides.row, seq.seqlen_q - m0);
      load_tile_async<kThreads>(do_s, dout + m0 * p.dout_strides.row, p.dout_strides.row,
                                seq.seqlen_q - m0);
      cp_async_commit();
      for (int r = threadIdx.x; r < kBlockM; r += kThreads) {
        const bool valid = m0 + r < seq.seqlen_q;
        sm.lse_log2[r] = valid ? p.lse[lse_offset + m0 + r] * kLog2e : INFINITY;
        sm.dsum[r] = valid ? dsum[dsum_offset + m0 + r] : 0.f;
      }
      cp_async_wait<0>();
      __syncthreads();

      if constexpr (!kSplitRoles) {
        dkdv_step<kHeadDim, Role::kBoth>(sm, warp_row0, n0, m0, mask, scale_log2, acc[0],
                                         acc[1]);
      } else if (is_dk_warp) {
        dkdv_step<kHeadDim, Role::kDk>(sm, warp_row0, n0, m0, mask, scale_log2, acc[0], acc[0]);
      } else {
        dkdv_step<kHeadDim, Role::kDv>(sm, warp_row0, n0, m0, mask, scale_log2, acc[0], acc[0]);
      }
    }
  }

  // Epilogue: stage dV and scale * dK as bf16 in the V and K tiles, then copy out with
  // 16-byte stores. The barrier first: with split roles the other half still reads these rows.
  cp_async_wait<0>();  // K/V may still be in flight if no Q block was visited
  __syncthreads();
  if constexpr (!kSplitRoles) {
    acc_to_smem(v_s, warp_row0, acc[0], 1.f);
    acc_to_smem(k_s, warp_row0, acc[1], p.softmax_scale);
  } else if (is_dk_warp) {
    acc_to_smem(k_s, warp_row0, acc[0], p.softmax_scale);
  } else {
    acc_to_smem(v_s, warp_row0, acc[0], 1.f);
  }
  __syncthreads();
  bf16* dk = static_cast<bf16*>(p.dk) + seq.k_offset(p.dk_strides) + head_k * p.dk_strides.head +
             n0 * p.dk_strides.row;
  bf16* dv = static_cast<bf16*>(p.dv) + seq.k_offset(p.dv_strides) + head_k * p.dv_strides.head +
             n0 * p.dv_strides.row;
  store_tile<kThreads>(k_s, dk, p.dk_strides.row, seq.seqlen_k - n0);
  store_tile<kThreads>(v_s, dv, p.dv_strides.row, seq.seqlen_k - n0);
}

}  // namespace

template <int kHeadDim>
cudaError_t launch_bwd_dkdv(const flashback_bwd_params& p, const float* dsum,
                            cudaStream_t stream) {
  using T = BwdDkDvTraits<kHeadDim>;
  // Causal: low key blocks are seen by the most Q blocks; blockIdx.x = 0 goes first.
  const dim3 grid((p.seqlen_k + T::kBlockN - 1) / T::kBlockN, p.nheads_k, p.batch);
  return launch_kernel(reference_bwd_dkdv_kernel<kHeadDim>, grid, T::kThreads, T::kSmemBytes,
                       stream, p, dsum);
}

#define FLASHBACK_REF_INSTANTIATE(d) \
  template cudaError_t launch_bwd_dkdv<d>(const flashback_bwd_params&, const float*, cudaStream_t);
FLASHBACK_REF_FOR_EACH_HEADDIM(FLASHBACK_REF_INSTANTIATE)
#undef FLASHBACK_REF_INSTANTIATE

}  // namespace ref
}  // namespace flashback
