// Reference backward, dQ: steps (1)-(4) and (7) of docs/design.md section 4.
//
// A CTA owns kBlockM rows of Q (and dO) of one (batch, head); each warp owns 16 of them and
// keeps its dQ slab (16 x headdim, fp32) in registers. The CTA walks the K/V blocks those rows
// see, recomputing S and dP (the dK/dV kernel computed them too, but sharing them would need
// atomics on dQ), and writes dQ once: deterministic.
#include <cuda_bf16.h>

#include "bwd/reference_bwd.h"
#include "common/attention.cuh"
#include "common/sequence.cuh"
#include "common/mma.cuh"
#include "common/tile.cuh"

namespace flashback {
namespace ref {
namespace {

struct BwdDqConfig {
  int block_m;  // Q rows per CTA (16 per warp)
  int block_n;  // K/V rows per step
  int warps;
};

// headdim 256: the dQ slab is 128 registers per thread, S and dP 64 more; 4 warps keep the
// Q + dO + K + V tiles at 135 KB.
// -Xptxas -v (nvcc 13.0): 155 / 194 / 250 registers at headdim 64 / 128 / 256, no spills.
[[maybe_unused]] constexpr BwdDqConfig bwd_dq_config(int head_dim) {
  return head_dim <= 128 ? BwdDqConfig{128, 64, 8} : BwdDqConfig{64, 64, 4};
}

template <int kHeadDim>
struct BwdDqTraits {
  static constexpr BwdDqConfig kCfg = bwd_dq_config(kHeadDim);
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kWarps = kCfg.warps;
  static constexpr int kThreads = 32 * kWarps;
  static_assert(kBlockM == 16 * kWarps, "each warp owns 16 Q rows");
  static_assert(kBlockN % 16 == 0, "K/V blocks are whole mma k-steps");

  using QTile = SmemTile<kBlockM, kHeadDim>;
  using KVTile = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = 2 * QTile::kBytes + 2 * KVTile::kBytes;
  static_assert(kSmemBytes <= kMaxSmemBytes, "dQ tiles exceed shared memory");
};

template <int kHeadDim>
__global__ void __launch_bounds__(BwdDqTraits<kHeadDim>::kThreads, 1)
    reference_bwd_dq_kernel(const flashback_bwd_params p, const float* dsum) {
  using T = BwdDqTraits<kHeadDim>;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kThreads = T::kThreads;

  extern __shared__ __align__(16) unsigned char smem[];
  const typename T::QTile q_s{reinterpret_cast<bf16*>(smem)};
  const typename T::QTile do_s{reinterpret_cast<bf16*>(smem + T::QTile::kBytes)};
  const typename T::KVTile k_s{reinterpret_cast<bf16*>(smem + 2 * T::QTile::kBytes)};
  const typename T::KVTile v_s{
      reinterpret_cast<bf16*>(smem + 2 * T::QTile::kBytes + T::KVTile::kBytes)};

  // Causal: the last Q blocks see the most keys, so they are scheduled first.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_k = head / (p.nheads / p.nheads_k);
  const int m0 = m_block * kBlockM;
  const int warp_row0 = (threadIdx.x / 32) * 16;  // this warp's Q rows inside the block
  const SeqRows seq = seq_rows(p, batch);
  if (m0 >= seq.seqlen_q) return;  // varlen: the grid covers the longest sequence
  const Mask mask{seq.seqlen_q, seq.seqlen_k, p.causal != 0};
  const float scale_log2 = p.softmax_scale * kLog2e;

  const bf16* q = static_cast<const bf16*>(p.q) + seq.q_offset(p.q_strides) +
                  head * p.q_strides.head + m0 * p.q_strides.row;
  const bf16* dout = static_cast<const bf16*>(p.dout) + seq.q_offset(p.dout_strides) +
                     head * p.dout_strides.head + m0 * p.dout_strides.row;
  const bf16* k = static_cast<const bf16*>(p.k) + seq.k_offset(p.k_strides) +
                  head_k * p.k_strides.head;
  const bf16* v = static_cast<const bf16*>(p.v) + seq.k_offset(p.v_strides) +
                  head_k * p.v_strides.head;
  load_tile_async<kThreads>(q_s, q, p.q_strides.row, seq.seqlen_q - m0);
  load_tile_async<kThreads>(do_s, dout, p.dout_strides.row, seq.seqlen_q - m0);
  cp_async_commit();

  // This thread's two rows (g and g + 8 of the warp's slab): LSE in log2 units and D.
  // Rows past the end get LSE = +inf, hence P = 0, and are never written.
  float lse_log2[2], row_dsum[2];
  {
    // D lives in the workspace as (batch, nheads, seqlen_q) for dense and varlen batches alike.
    const int64_t dsum_offset = (static_cast<int64_t>(batch) * p.nheads + head) * p.seqlen_q;
    const int64_t lse_offset = lse_index(p, seq, head, 0);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = m0 + warp_row0 + acc_row(2 * r);
      lse_log2[r] = i < seq.seqlen_q ? p.lse[lse_offset + i] * kLog2e : INFINITY;
      row_dsum[r] = i < seq.seqlen_q ? dsum[dsum_offset + i] : 0.f;
    }
  }

  float dq[kHeadDim / 8][4];
  zero(dq);

  const int n_blocks = mask.n_block_end(m0, kBlockM, kBlockN);
  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    const int n0 = n_block * kBlockN;
    __syncthreads();  // every warp is done with the previous K and V
    load_tile_async<kThreads>(k_s, k + n0 * p.k_strides.row, p.k_strides.row, seq.seqlen_k - n0);
    cp_async_commit();
    load_tile_async<kThreads>(v_s, v + n0 * p.v_strides.row, p.v_strides.row, seq.seqlen_k - n0);
    cp_async_commit();
    cp_async_wait<1>();  // Q, dO and K have landed; V may still be in flight during (1)-(2)
    __syncthreads();

    // (1) S = Q_i K_j^T
    float s[kBlockN / 8][4];
    zero(s);
    gemm_abt_smem<kBlockN, kHeadDim>(s, q_s, warp_row0, k_s, 0);

    // (2) P = exp2(S * scale * log2e - LSE_i * log2e), 0 where masked
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = m0 + warp_row0 + acc_row(e);
        const int j = n0 + acc_col(nt, e);
        s[nt][e] = mask(i, j) ? 0.f : exp2f(s[nt][e] * scale_log2 - lse_log2[e / 2]);
      }
    }

    cp_async_wait<0>();
    __syncthreads();  // V is visible to every warp

    // (3) dP = dO_i V_j^T
    float ds[kBlockN / 8][4];
    zero(ds);
    gemm_abt_smem<kBlockN, kHeadDim>(ds, do_s, warp_row0, v_s, 0);

    // (4) dS = P * (dP - D_i)
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = s[nt][e] * (ds[nt][e] - row_dsum[e / 2]);
    }

    // (7) dQ_i += dS K_j (softmax_scale is applied once, at the end)
    uint32_t ds_frags[kBlockN / 16][4];
    acc_to_a_frags<kBlockN>(ds_frags, ds);
    gemm_ab_reg<kHeadDim, kBlockN>(dq, ds_frags, k_s);
  }

  // Epilogue: stage scale * dQ as bf16 in the Q tile, copy out with 16-byte stores.
  cp_async_wait<0>();  // Q/dO may still be in flight if no K/V block was visited
  __syncthreads();
  acc_to_smem(q_s, warp_row0, dq, p.softmax_scale);
  __syncthreads();
  bf16* dq_out = static_cast<bf16*>(p.dq) + seq.q_offset(p.dq_strides) +
                 head * p.dq_strides.head + m0 * p.dq_strides.row;
  store_tile<kThreads>(q_s, dq_out, p.dq_strides.row, seq.seqlen_q - m0);
}

}  // namespace

template <int kHeadDim>
cudaError_t launch_bwd_dq(const flashback_bwd_params& p, const float* dsum, cudaStream_t stream) {
  using T = BwdDqTraits<kHeadDim>;
  const dim3 grid((p.seqlen_q + T::kBlockM - 1) / T::kBlockM, p.nheads, p.batch);
  return launch_kernel(reference_bwd_dq_kernel<kHeadDim>, grid, T::kThreads, T::kSmemBytes,
                       stream, p, dsum);
}

#define FLASHBACK_REF_INSTANTIATE(d) \
  template cudaError_t launch_bwd_dq<d>(const flashback_bwd_params&, const float*, cudaStream_t);
FLASHBACK_REF_FOR_EACH_HEADDIM(FLASHBACK_REF_INSTANTIATE)
#undef FLASHBACK_REF_INSTANTIATE

}  // namespace ref
}  // namespace flashback
