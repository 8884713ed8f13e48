// What the Hopper attention kernels (csrc/fwd_sm90, csrc/bwd_sm90) share: the tensor maps of the
// (batch, seqlen, heads, d) 16-bit tensors, the TMA load of a tile of rows, the layout test
// both fast paths apply, and the causal key range of a query block.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "common/fast_div.h"
#include "flashback/flashback.h"
#include "hopper/hopper.h"

namespace flashback {
namespace sm90 {

using hopper::Dtype;

// The API's dtype as the kernels' template argument.
inline constexpr Dtype dtype_of(flashback_dtype t) {
  return t == FLASHBACK_DTYPE_FP16 ? Dtype::kF16 : Dtype::kBf16;
}

// 4-D map over a (batch, seqlen, heads, head_dim) tensor of 16-bit elements, boxes of 64 d x
// box_rows rows with the 128-byte swizzle wgmma reads (docs/hopper-facts.md section 2). The two
// middle dims go in ascending stride order ({d, heads, seqlen, batch} for the usual contiguous
// layout, where a head is 2 d bytes and a row nheads * 2 d): the driver documents strides as
// growing with the dimension, and a box of {64, 1, rows, 1} lands in shared memory exactly as
// {64, rows, 1, 1} would. *head_inner tells the kernel which coordinate order to use (tma_rows).
inline cudaError_t make_rows_map(CUtensorMap* map, bool* head_inner, const void* ptr,
                                 const flashback_strides& st, int batch, int seqlen, int heads,
                                 int head_dim, Dtype dtype, uint32_t box_rows) {
  *head_inner = st.head < st.row;
  const uint64_t s_rows = static_cast<uint64_t>(st.row) * 2;
  const uint64_t s_head = static_cast<uint64_t>(st.head) * 2;
  const uint64_t d = static_cast<uint64_t>(head_dim);
  const uint64_t dims_rows_first[4] = {d, static_cast<uint64_t>(seqlen),
                                       static_cast<uint64_t>(heads), static_cast<uint64_t>(batch)};
  const uint64_t dims_head_first[4] = {d, static_cast<uint64_t>(heads),
                                       static_cast<uint64_t>(seqlen), static_cast<uint64_t>(batch)};
  const uint64_t strides_rows_first[3] = {s_rows, s_head, static_cast<uint64_t>(st.batch) * 2};
  const uint64_t strides_head_first[3] = {s_head, s_rows, static_cast<uint64_t>(st.batch) * 2};
  const uint32_t box_rows_first[4] = {64, box_rows, 1, 1};
  const uint32_t box_head_first[4] = {64, 1, box_rows, 1};
  const hopper::TmaType type = dtype == Dtype::kF16 ? hopper::TmaType::kF16 : hopper::TmaType::kBf16;
  return *head_inner ? hopper::make_tensor_map(map, ptr, type, 4, dims_head_first,
                                               strides_head_first, box_head_first,
                                               hopper::TmaSwizzle::k128B)
                     : hopper::make_tensor_map(map, ptr, type, 4, dims_rows_first,
                                               strides_rows_first, box_rows_first,
                                               hopper::TmaSwizzle::k128B);
}

// How many CTAs of `kernel` the GPU holds at once (SMs x CTAs per SM): the deterministic
// backward's chunk.
template <class Kernel>
inline cudaError_t resident_ctas(Kernel kernel, int threads, size_t smem_bytes, int* ctas) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
  *ctas = sms * (per_sm > 0 ? per_sm : 1);
  if (*ctas < 1) *ctas = 1;
  return err;
}

// An experimental switch: the environment variable is set and not "0" (callers read it once).
inline bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// Varlen batches (cu_seqlens set) are mapped as one batch element of total packed rows; a
// sequence then loads from its first row, and a tile that runs past its end reads the next
// sequence's rows, which the kernels mask (keys) or drop (queries). map_rows gives the map's
// (batch, rows), map_strides the strides with a positive batch stride the map can take (the
// batch dim has size 1 then, so its value is never used).
struct MapRows {
  int batch, rows;
};
template <class Params>
inline MapRows map_rows(const Params& p, bool query_side) {
  if (p.cu_seqlens_q == nullptr) return {p.batch, query_side ? p.seqlen_q : p.seqlen_k};
  return {1, query_side ? p.total_q : p.total_k};
}
template <class Params>
inline flashback_strides map_strides(const flashback_strides& st, const Params& p, bool query_side) {
  if (p.cu_seqlens_q == nullptr) return st;
  const int64_t rows = query_side ? p.total_q : p.total_k;
  const int64_t heads = query_side ? p.nheads : p.nheads_k;
  const int64_t span = st.row * rows > st.head * heads ? st.row * rows : st.head * heads;
  return {span, st.row, st.head};
}

// The map of one tensor of a call: query side (q, out, dout; nheads) or key side (k, v;
// nheads_k), dense or packed.
template <class Params>
inline cudaError_t make_call_map(CUtensorMap* map, bool* head_inner, const void* ptr,
                                 const flashback_strides& st, const Params& p, bool query_side,
                                 uint32_t box_rows) {
  const MapRows r = map_rows(p, query_side);
  return make_rows_map(map, head_inner, ptr, map_strides(st, p, query_side), r.batch, r.rows,
                       query_side ? p.nheads : p.nheads_k, p.headdim, dtype_of(p.dtype), box_rows);
}

// One box (64 d x the map's rows) at (d0, row) of (head, batch) into `dst`, completing on `bar`.
// Rows past seqlen arrive as zeros and still count in the transaction bytes
// (docs/hopper-facts.md section 4.2).
// kHint: with the L2 cache policy `policy` (hopper::tma_load_hint).
template <bool kHint = false>
__device__ __forceinline__ void tma_rows(void* dst, const CUtensorMap* map, uint64_t* bar,
                                         bool head_inner, int d0, int row, int head, int batch,
                                         uint64_t policy = 0) {
  if (head_inner) {
    const int c[4] = {d0, head, row, batch};
    hopper::tma_load_maybe_hint<kHint, 4>(dst, map, bar, c, policy);
  } else {
    const int c[4] = {d0, row, head, batch};
    hopper::tma_load_maybe_hint<kHint, 4>(dst, map, bar, c, policy);
  }
}

// The same box as tma_rows, fetched into L2 only (hopper::tma_prefetch_l2): no destination, no
// barrier. kHint: with the L2 cache policy `policy`.
template <bool kHint = false>
__device__ __forceinline__ void tma_rows_prefetch(const CUtensorMap* map, bool head_inner, int d0, int row,
                                                  int head, int batch, uint64_t policy = 0) {
  if (head_inner) {
    const int c[4] = {d0, head, row, batch};
    hopper::tma_prefetch_l2_maybe_hint<kHint>(map, c, policy);
  } else {
    const int c[4] = {d0, row, head, batch};
    hopper::tma_prefetch_l2_maybe_hint<kHint>(map, c, policy);
  }
}

// One box (64 d x the map's rows) from `src` to (d0, row) of (head, batch); box rows past the
// tensor's end are not written. A bulk async-group of the calling thread tracks it
// (hopper::bulk_commit_group, then bulk_wait_group_read before `src` is reused).
__device__ __forceinline__ void tma_rows_store(const void* src, const CUtensorMap* map, bool head_inner,
                                               int d0, int row, int head, int batch) {
  if (head_inner) {
    const int c[4] = {d0, head, row, batch};
    hopper::tma_store<4>(map, src, c);
  } else {
    const int c[4] = {d0, row, head, batch};
    hopper::tma_store<4>(map, src, c);
  }
}

// A whole tile of rows [row, row + the map's box rows) x d = 64 kAtoms: its kAtoms boxes of 64 d
// into the atom-columns of `dst`, `atom_bytes` apart, all completing on `bar` (expect kAtoms
// boxes of bytes).
template <int kAtoms, bool kHint = false>
__device__ __forceinline__ void tma_tile(uint8_t* dst, uint32_t atom_bytes, const CUtensorMap* map,
                                         uint64_t* bar, bool head_inner, int row, int head,
                                         int batch, uint64_t policy = 0) {
#pragma unroll
  for (int a = 0; a < kAtoms; ++a) {
    tma_rows<kHint>(dst + a * atom_bytes, map, bar, head_inner, 64 * a, row, head, batch, policy);
  }
}

// Whether `n` tensors can be read through make_rows_map by the fast kernels. TMA with 128-byte
// swizzle: the driver accepts 16-byte aligned bases and byte strides that are multiples of 16,
// but whether the swizzle pattern then still matches what the wgmma descriptors assume is
// unconfirmed on hardware (docs/hopper-facts.md section 13), and the GPU suite only ran 128-byte aligned
// layouts. So the fast paths take 128-byte aligned bases and strides in multiples of 64
// elements (what every dense or packed PyTorch layout at head dims 64-256 has). Strides below 2^39
// elements keep byte strides below TMA's 2^40. `why` gets the first reason not.
inline bool tma_layout_ok(const void* const* ptrs, const flashback_strides* strides, int n,
                          const char** why) {
  for (int i = 0; i < n; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 128 != 0) {
      *why = "a tensor is not 128-byte aligned";
      return false;
    }
    const int64_t s[3] = {strides[i].row, strides[i].head, strides[i].batch};
    for (int k = 0; k < 3; ++k) {
      if (s[k] <= 0 || s[k] % 64 != 0 || s[k] >= (int64_t{1} << 39)) {
        *why = "a stride is not a positive multiple of 64 elements below 2^39";
        return false;
      }
    }
  }
  return true;
}

// Tile `id` of a one-dimensional grid ordered in groups: (batch, head) pairs are cut into groups
// of `group` pairs that run one after the other; inside a group the block index (`blocks` of
// them) is slower than the pair. Both kernels size `group` so that what a group's CTAs share
// stays in L2.
struct GroupedTile {
  int block, pair;
};
__device__ __forceinline__ GroupedTile grouped_tile(int id, int group, int blocks, int pairs) {
  const int g = id / (group * blocks);
  const int rest = id - g * group * blocks;
  const int group_pairs = min(group, pairs - g * group);
  return {rest / group_pairs, g * group + rest % group_pairs};
}

// grouped_tile with the last `tail` groups merged into one (tail >= 1; 1: grouped_tile's
// order). With causal walks, longest first inside a group, a group's longest walks can outlast
// its share of the SMs' time; in the last group nothing follows to fill in beside them, so they
// end the grid (scripts/bwd_balance_model.py: 1.9-2.2% of the d = 256 pair's causal makespan at
// 4k-16k). A larger last group spreads its longest walks over more work.
__device__ __forceinline__ GroupedTile grouped_tile_tail(int id, int group, int blocks, int pairs,
                                                         int tail) {
  const int full = max(0, (pairs + group - 1) / group - tail);  // groups before the merged one
  const int g = min(id / (group * blocks), full);
  const int rest = id - g * group * blocks;
  const int group_pairs = g == full ? pairs - full * group : group;
  return {rest / group_pairs, g * group + rest % group_pairs};
}

// grouped_tile with the divisions by precomputed divisors: `per_group` = group x blocks, `group`,
// `last` = the last group's pairs (pairs - (groups - 1) x group), `groups` the number of groups.
__device__ __forceinline__ GroupedTile grouped_tile_fast(int id, const FastDiv& per_group,
                                                         const FastDiv& group, const FastDiv& last,
                                                         int groups) {
  const int g = per_group.div(id);
  const int rest = id - g * static_cast<int>(per_group.d);
  // The divisor's fields picked by value: a reference picked between two kernel parameters
  // would put them in local memory.
  const bool in_last = g + 1 == groups;
  const FastDiv f = {in_last ? last.d : group.d, in_last ? last.m : group.m, in_last ? last.l : group.l};
  const int block = f.div(rest);
  return {block, g * static_cast<int>(group.d) + rest - block * static_cast<int>(f.d)};
}

// Causal masking is aligned bottom-right: query row i sees key j iff j <= i + seqlen_k - seqlen_q.
// The first query row that sees key n0 (may be <= 0 or past the last row):
__host__ __device__ __forceinline__ int causal_first_query(int n0, int seqlen_q, int seqlen_k) {
  return n0 - (seqlen_k - seqlen_q);
}
// One past the last key that query rows [.., m_end) see (may be <= 0: no key at all):
__host__ __device__ __forceinline__ int causal_key_end(int m_end, int seqlen_q, int seqlen_k) {
  return m_end + (seqlen_k - seqlen_q);
}

}  // namespace sm90
}  // namespace flashback
