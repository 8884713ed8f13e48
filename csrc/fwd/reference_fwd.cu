// Reference forward: FlashAttention-2 with warp-level mma.sync. Writes O (bf16) and the
// log-sum-exp (fp32, natural log) that the backward recomputes P from.
//
// One CTA owns kBlockM query rows of one (batch, head); each warp owns 16 of those rows and
// keeps its slab of O (16 x headdim, fp32) in registers. The CTA walks the key blocks the rows
// can see; per block every warp computes S = Q K^T for its rows, updates a running row max and
// row sum (online softmax), and accumulates O += P V with P taken straight from registers.
#include <cuda_bf16.h>

#include "common/attention.cuh"
#include "common/sequence.cuh"
#include "common/mma.cuh"
#include "common/tile.cuh"
#include "launch.h"

namespace flashback {
namespace ref {
namespace {

struct FwdConfig {
  int block_m;  // query rows per CTA (16 per warp)
  int block_n;  // key rows per step
  int warps;
};

// At headdim 256 the O slab alone is 128 registers per thread, so the key step stays at 64
// (S = 32 more registers) and the CTA shrinks to 4 warps to keep shared memory moderate.
// -Xptxas -v (nvcc 13.0): 125 / 163 / 237 registers at headdim 64 / 128 / 256, no spills.
[[maybe_unused]] constexpr FwdConfig fwd_config(int head_dim) {
  return head_dim <= 128 ? FwdConfig{128, 64, 8} : FwdConfig{64, 64, 4};
}

template <int kHeadDim>
struct FwdTraits {
  static constexpr FwdConfig kCfg = fwd_config(kHeadDim);
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kWarps = kCfg.warps;
  static constexpr int kThreads = 32 * kWarps;
  static_assert(kBlockM == 16 * kWarps, "each warp owns 16 query rows");
  static_assert(kBlockN % 16 == 0, "key blocks are whole mma k-steps");

  using QTile = SmemTile<kBlockM, kHeadDim>;
  using KVTile = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = QTile::kBytes + 2 * KVTile::kBytes;
  static_assert(kSmemBytes <= kMaxSmemBytes, "forward tiles exceed shared memory");
};

template <int kHeadDim>
__global__ void __launch_bounds__(FwdTraits<kHeadDim>::kThreads, 1)
    reference_fwd_kernel(const flashback_fwd_params p) {
  using T = FwdTraits<kHeadDim>;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kThreads = T::kThreads;

  extern __shared__ __align__(16) unsigned char smem[];
  const typename T::QTile q_s{reinterpret_cast<bf16*>(smem)};
  const typename T::KVTile k_s{reinterpret_cast<bf16*>(smem + T::QTile::kBytes)};
  const typename T::KVTile v_s{
      reinterpret_cast<bf16*>(smem + T::QTile::kBytes + T::KVTile::kBytes)};

  // Causal: the last query blocks see the most keys, so they are scheduled first.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_k = head / (p.nheads / p.nheads_k);
  const int m0 = m_block * kBlockM;
  const int warp_row0 = (threadIdx.x / 32) * 16;  // this warp's rows inside the block
  const SeqRows seq = seq_rows(p, batch);
  if (m0 >= seq.seqlen_q) return;  // varlen: the grid covers the longest sequence
  const Mask mask{seq.seqlen_q, seq.seqlen_k, p.causal != 0};

  const bf16* q = static_cast<const bf16*>(p.q) + seq.q_offset(p.q_strides) +
                  head * p.q_strides.head + m0 * p.q_strides.row;
  const bf16* k = static_cast<const bf16*>(p.k) + seq.k_offset(p.k_strides) +
                  head_k * p.k_strides.head;
  const bf16* v = static_cast<const bf16*>(p.v) + seq.k_offset(p.v_strides) +
                  head_k * p.v_strides.head;

  load_tile_async<kThreads>(q_s, q, p.q_strides.row, seq.seqlen_q - m0);
  cp_async_commit();

  float o[kHeadDim / 8][4];
  zero(o);
  // Per thread: rows g and g + 8 of the warp's slab. The max is in log2 units (S * scale *
  // log2 e); the sum is this thread's partial over its columns, reduced across the quad once
  // at the end.
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.softmax_scale * kLog2e;

  const int n_blocks = mask.n_block_end(m0, kBlockM, kBlockN);
  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    const int n0 = n_block * kBlockN;
    __syncthreads();  // every warp is done with the previous K and V
    load_tile_async<kThreads>(k_s, k + n0 * p.k_strides.row, p.k_strides.row, seq.seqlen_k - n0);
    cp_async_commit();
    load_tile_async<kThreads>(v_s, v + n0 * p.v_strides.row, p.v_strides.row, seq.seqlen_k - n0);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K have landed; V may still be in flight during S and softmax
    __syncthreads();

    // S = Q K^T
    float s[kBlockN / 8][4];
    zero(s);
    gemm_abt_smem<kBlockN, kHeadDim>(s, q_s, warp_row0, k_s, 0);

    // Scale into log2 units and mask (scaling before the max keeps this right for any sign
    // of softmax_scale).
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = m0 + warp_row0 + acc_row(e);
        const int j = n0 + acc_col(nt, e);
        s[nt][e] = mask(i, j) ? -INFINITY : s[nt][e] * scale_log2;
      }
    }

    // Online softmax: new running max, rescale what was accumulated under the old one,
    // P = exp2(S - max) in place of S.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
        mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      }
      // The four threads of a quad hold the same row.
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has only seen masked keys keeps max = -inf; subtracting 0 instead makes
      // its P exactly 0 rather than exp2(-inf - -inf) = NaN.
      const float base = mx == -INFINITY ? 0.f : mx;
      const float correction = exp2f(row_max[r] - base);
      row_max[r] = mx;
      row_sum[r] *= correction;
#pragma unroll
      for (int nt = 0; nt < kHeadDim / 8; ++nt) {
        o[nt][2 * r] *= correction;
        o[nt][2 * r + 1] *= correction;
      }
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
        s[nt][2 * r] = exp2f(s[nt][2 * r] - base);
        s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - base);
        row_sum[r] += s[nt][2 * r] + s[nt][2 * r + 1];
      }
    }

    cp_async_wait<0>();
    __syncthreads();  // V is visible to every warp

    // O += P V (P rounded to bf16 as the mma input; the row sum above used fp32 P)
    uint32_t p_frags[kBlockN / 16][4];
    acc_to_a_frags<kBlockN>(p_frags, s);
    gemm_ab_reg<kHeadDim, kBlockN>(o, p_frags, v_s);
  }

  // Epilogue: O /= rowsum, LSE = ln(rowsum) + max. A row that saw no key gets O = 0 and
  // LSE = +inf, which makes the backward's P = exp(S - LSE) exactly 0 for it.
  float* lse = p.lse + lse_index(p, seq, head, 0);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv_sum = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int nt = 0; nt < kHeadDim / 8; ++nt) {
      o[nt][2 * r] *= inv_sum;
      o[nt][2 * r + 1] *= inv_sum;
    }
    const int i = m0 + warp_row0 + acc_row(2 * r);
    if (threadIdx.x % 4 == 0 && i < seq.seqlen_q) {
      lse[i] = sum > 0.f ? (row_max[r] + log2f(sum)) * kLn2 : INFINITY;
    }
  }

  // Stage O through the Q tile (each warp overwrites only its own rows, but the copy out is
  // CTA-wide) so global stores are whole 16-byte chunks.
  cp_async_wait<0>();  // Q may still be in flight if no key block was visited
  __syncthreads();
  acc_to_smem(q_s, warp_row0, o, 1.f);
  __syncthreads();
  bf16* out = static_cast<bf16*>(p.out) + seq.q_offset(p.out_strides) +
              head * p.out_strides.head + m0 * p.out_strides.row;
  store_tile<kThreads>(q_s, out, p.out_strides.row, seq.seqlen_q - m0);
}

template <int kHeadDim>
cudaError_t launch_fwd(const flashback_fwd_params& p, cudaStream_t stream) {
  using T = FwdTraits<kHeadDim>;
  const dim3 grid((p.seqlen_q + T::kBlockM - 1) / T::kBlockM, p.nheads, p.batch);
  return launch_kernel(reference_fwd_kernel<kHeadDim>, grid, T::kThreads, T::kSmemBytes, stream,
                       p);
}

}  // namespace
}  // namespace ref

cudaError_t run_reference_fwd(const flashback_fwd_params& p, cudaStream_t stream) {
  switch (p.headdim) {
#define FLASHBACK_REF_FWD_CASE(d) \
  case d:                         \
    return ref::launch_fwd<d>(p, stream);
    FLASHBACK_REF_FOR_EACH_HEADDIM(FLASHBACK_REF_FWD_CASE)
#undef FLASHBACK_REF_FWD_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace flashback
