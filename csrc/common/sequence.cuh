// One sequence of a batch as every kernel (reference and Hopper) sees it: dense batches index
// it with the batch strides, variable-length batches (cu_seqlens_q set, flashback.h) by its
// first row in the packed tensors. Kernels size their grids for the longest sequence
// (params seqlen_q / seqlen_k) and read their own sequence's lengths here.
#pragma once

#include <cstdint>

#include "flashback/flashback.h"

namespace flashback {

struct SeqRows {
  int batch;
  int seqlen_q, seqlen_k;  // this sequence's lengths (varlen: may be 0)
  int64_t row_q, row_k;    // varlen: its first row in the packed q / k; dense: 0
  bool varlen;

  // Element offset of the sequence's row 0 in a tensor with these strides.
  __host__ __device__ __forceinline__ int64_t q_offset(const flashback_strides& s) const {
    return varlen ? row_q * s.row : static_cast<int64_t>(batch) * s.batch;
  }
  __host__ __device__ __forceinline__ int64_t k_offset(const flashback_strides& s) const {
    return varlen ? row_k * s.row : static_cast<int64_t>(batch) * s.batch;
  }
};

template <class Params>
__device__ __forceinline__ SeqRows seq_rows(const Params& p, int batch) {
  if (p.cu_seqlens_q == nullptr) return SeqRows{batch, p.seqlen_q, p.seqlen_k, 0, 0, false};
  const int q0 = p.cu_seqlens_q[batch], q1 = p.cu_seqlens_q[batch + 1];
  const int k0 = p.cu_seqlens_k[batch], k1 = p.cu_seqlens_k[batch + 1];
  return SeqRows{batch, q1 - q0, k1 - k0, q0, k0, true};
}

// Where row i of (sequence, head) keeps its LSE: lse is (batch, nheads, seqlen_q) for dense
// batches, (nheads, total_q) for varlen ones.
template <class Params>
__device__ __forceinline__ int64_t lse_index(const Params& p, const SeqRows& s, int head, int i) {
  return s.varlen ? static_cast<int64_t>(head) * p.total_q + s.row_q + i
                  : (static_cast<int64_t>(s.batch) * p.nheads + head) * p.seqlen_q + i;
}

}  // namespace flashback
