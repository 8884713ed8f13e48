// TMA (the bulk tensor copy engine): tensor maps on the host, copies on the device.
// PTX ISA §9.7.9.25 (cp.async.bulk / cp.async.bulk.tensor / cp.reduce.async.bulk);
// CUDA Driver API "Tensor Map Object Management"; hopper-facts.md §4.
//
// Host side: make_tensor_map() encodes a CUtensorMap through cuTensorMapEncodeTiled, which it
// looks up at run time with cudaGetDriverEntryPointByVersion (the non-deprecated form of
// cudaGetDriverEntryPoint). So the library links only the CUDA runtime, never -lcuda; <cuda.h>
// and <cudaTypedefs.h> are included for the types alone.
//
// Device side: pass the map to the kernel by value as `const __grid_constant__ CUtensorMap`
// and hand its address to these wrappers. Coordinates are element indices, innermost first.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "hopper/cluster.h"  // mapa_shared
#include "hopper/common.h"

namespace flashback {
namespace hopper {

// ------------------------------------------------------------------------------------ host ---

enum class TmaType { kBf16, kF16, kF32 };
enum class TmaSwizzle { kNone, k128B };

// cuTensorMapEncodeTiled from the driver, looked up once. nullptr if the driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// Encodes a tiled tensor map of rank 1..5 over a dense-or-strided global tensor.
//   dims[i]          elements along dimension i (i = 0 is the contiguous one)
//   byte_strides[i]  byte stride of dimension i+1 (rank-1 entries; multiples of 16)
//   box[i]           elements per copy along dimension i (1..256); with k128B the inner box
//                    must be exactly 128 bytes or less (64 bf16 / 32 fp32): the swizzle span.
// Out-of-bound box parts read as zero (loads) and are skipped (stores/reductions).
// Returns cudaSuccess, or cudaErrorInvalidValue when the driver rejects the arguments (bad
// alignment, box too large, ...) -- never launch with a map that failed to encode.
inline cudaError_t make_tensor_map(CUtensorMap* map, const void* global, TmaType type, int rank,
                                   const uint64_t* dims, const uint64_t* byte_strides,
                                   const uint32_t* box, TmaSwizzle swizzle) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (rank < 1 || rank > 5) return cudaErrorInvalidValue;
  cuuint64_t gdim[5];
  cuuint64_t gstride[5];
  cuuint32_t bdim[5];
  cuuint32_t estride[5];
  for (int i = 0; i < rank; ++i) {
    gdim[i] = dims[i];
    bdim[i] = box[i];
    estride[i] = 1;
    if (i + 1 < rank) gstride[i] = byte_strides[i];
  }
  const CUtensorMapDataType dtype = type == TmaType::kBf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : type == TmaType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  CUresult r = encode(
      map, dtype,
      static_cast<cuuint32_t>(rank), const_cast<void*>(global), gdim, gstride, bdim, estride,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle == TmaSwizzle::k128B ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      // 256-byte L2 sectors: tiles are read in whole 128-byte rows, promote generously.
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Row-major matrix [rows][cols] with `ld` elements between rows: the common 2-D case.
inline cudaError_t make_tensor_map_2d(CUtensorMap* map, const void* global, TmaType type,
                                      uint64_t rows, uint64_t cols, uint64_t ld,
                                      uint32_t box_rows, uint32_t box_cols, TmaSwizzle swizzle) {
  const uint64_t elem = type == TmaType::kF32 ? 4 : 2;
  const uint64_t dims[2] = {cols, rows};
  const uint64_t strides[1] = {ld * elem};
  const uint32_t box[2] = {box_cols, box_rows};
  return make_tensor_map(map, global, type, 2, dims, strides, box, swizzle);
}

// ---------------------------------------------------------------------------------- device ---

FB_DEVICE uint64_t map_addr(const CUtensorMap* map) { return reinterpret_cast<uint64_t>(map); }

// Pull the 128-byte descriptor into the cache ahead of the first copy (one thread, at start).
FB_DEVICE void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map_addr(map)) : "memory");
}

// Load one box into this CTA's shared memory; completion = complete_tx of the box bytes on
// `bar`. One thread issues. `dst` must be 128-byte aligned (1024 for 128B-swizzled tiles).
// (.shared::cluster with this CTA's own address works with and without a cluster launch.)
template <int Rank>
FB_DEVICE void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, const int (&c)[Rank]) {
  static_assert(Rank >= 1 && Rank <= 5, "TMA tensors have rank 1..5");
  const uint32_t d = smem_u32(dst), b = smem_u32(bar);
  const uint64_t m = map_addr(map);
  if constexpr (Rank == 1) {
    asm volatile(
        "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3}], [%2];" ::"r"(d), "l"(m), "r"(b), "r"(c[0])
        : "memory");
  } else if constexpr (Rank == 2) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];" ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1])
        : "memory");
  } else if constexpr (Rank == 3) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]),
        "r"(c[2])
        : "memory");
  } else if constexpr (Rank == 4) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]),
        "r"(c[2]), "r"(c[3])
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(d), "l"(m), "r"(b), "r"(c[0]),
        "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4])
        : "memory");
  }
}

// L2 eviction priorities for the .L2::cache_hint forms below (createpolicy, PTX ISA 7.4, sm_80+):
// an opaque 64-bit policy applying `evict_last` (kept over normal lines, e.g. rows many CTAs
// read again) or `evict_first` (dropped first, e.g. rows one CTA reads once) to every line the
// access touches. A hint only: results do not depend on it. volatile, so that each call site
// makes its own (one instruction) instead of the compiler hoisting one value out of a loop and
// keeping it live across it (in the backward's 24-register producer that spilled).
FB_DEVICE uint64_t l2_policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
FB_DEVICE uint64_t l2_policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// tma_load with an L2 cache policy (the .L2::cache_hint form; ranks 2 and 4, what the kernels
// use).
template <int Rank>
FB_DEVICE void tma_load_hint(void* dst, const CUtensorMap* map, uint64_t* bar, const int (&c)[Rank],
                             uint64_t policy) {
  static_assert(Rank == 2 || Rank == 4, "tma_load_hint: ranks 2 and 4");
  const uint32_t d = smem_u32(dst), b = smem_u32(bar);
  const uint64_t m = map_addr(map);
  if constexpr (Rank == 2) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]),
        "r"(c[2]), "r"(c[3]), "l"(policy)
        : "memory");
  }
}

// tma_load, or with kHint tma_load_hint: callers whose hint is a compile-time choice.
template <bool kHint, int Rank>
FB_DEVICE void tma_load_maybe_hint(void* dst, const CUtensorMap* map, uint64_t* bar, const int (&c)[Rank],
                                   uint64_t policy) {
  if constexpr (kHint) {
    tma_load_hint<Rank>(dst, map, bar, c, policy);
  } else {
    tma_load<Rank>(dst, map, bar, c);
  }
}

// Ask L2 to fetch one box from global memory, with no shared-memory destination and no
// completion to wait for (cp.async.bulk.prefetch.tensor, PTX ISA 8.0, sm_90). For data a later
// tma_load will read: that load then finds its lines in L2 instead of paying the DRAM latency.
// Box parts past the tensor's end are not fetched. A hint: it may be dropped, and nothing may
// depend on it for correctness.
template <int Rank>
FB_DEVICE void tma_prefetch_l2(const CUtensorMap* map, const int (&c)[Rank]) {
  static_assert(Rank >= 1 && Rank <= 5, "TMA tensors have rank 1..5");
  const uint64_t m = map_addr(map);
  if constexpr (Rank == 1) {
    asm volatile("cp.async.bulk.prefetch.tensor.1d.L2.global.tile [%0, {%1}];" ::"l"(m), "r"(c[0])
                 : "memory");
  } else if constexpr (Rank == 2) {
    asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(m),
                 "r"(c[0]), "r"(c[1]) : "memory");
  } else if constexpr (Rank == 3) {
    asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];" ::"l"(m),
                 "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
  } else if constexpr (Rank == 4) {
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];" ::"l"(m),
                 "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]) : "memory");
  } else {
    asm volatile("cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %2, %3, %4, %5}];"
                 ::"l"(m), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]) : "memory");
  }
}

// tma_prefetch_l2 with an L2 cache policy (rank 4): the line comes into L2 with that priority.
FB_DEVICE void tma_prefetch_l2_hint(const CUtensorMap* map, const int (&c)[4], uint64_t policy) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile.L2::cache_hint [%0, {%1, %2, %3, %4}], %5;"
               ::"l"(map_addr(map)), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "l"(policy)
               : "memory");
}

// tma_prefetch_l2<4>, or with kHint tma_prefetch_l2_hint.
template <bool kHint>
FB_DEVICE void tma_prefetch_l2_maybe_hint(const CUtensorMap* map, const int (&c)[4], uint64_t policy) {
  if constexpr (kHint) {
    tma_prefetch_l2_hint(map, c, policy);
  } else {
    tma_prefetch_l2<4>(map, c);
  }
}

// 2-D convenience form: (c0 = inner/column, c1 = row).
FB_DEVICE void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  const int c[2] = {c0, c1};
  tma_load<2>(dst, map, bar, c);
}

// Multicast load (2-D): one CTA reads the box from global memory once and it lands at the same
// shared-memory offset in every CTA whose bit is set in `cta_mask` (bit i = %cluster_ctarank i),
// each signalling complete_tx on its own barrier at `bar`'s offset. Every destination CTA must
// have announced those bytes with expect_tx. Fast on sm_90a only (hopper-facts.md §4.2).
FB_DEVICE void tma_load_multicast_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                     uint16_t cta_mask, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%4, %5}], [%2], %3;" ::"r"(smem_u32(dst)),
      "l"(map_addr(map)), "r"(smem_u32(bar)), "h"(cta_mask), "r"(c0), "r"(c1)
      : "memory");
}

// The same for a rank-4 map (the attention kernels' {d, rows, head, batch} or {d, head, rows,
// batch} tensors): c[0] innermost.
FB_DEVICE void tma_load_multicast_4d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                     uint16_t cta_mask, const int (&c)[4]) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%4, %5, %6, %7}], [%2], %3;" ::"r"(smem_u32(dst)),
      "l"(map_addr(map)), "r"(smem_u32(bar)), "h"(cta_mask), "r"(c[0]), "r"(c[1]), "r"(c[2]),
      "r"(c[3])
      : "memory");
}

// Store one box from shared memory to global memory (tracked by bulk async-groups, not by an
// mbarrier). If ordinary stores wrote `src`, each writer must fence_proxy_async_shared() and the
// CTA must synchronise before the one issuing thread calls this. Start coordinates must be >= 0;
// box parts past the tensor's end are not written.
template <int Rank>
FB_DEVICE void tma_store(const CUtensorMap* map, const void* src, const int (&c)[Rank]) {
  static_assert(Rank >= 1 && Rank <= 5, "TMA tensors have rank 1..5");
  const uint32_t s = smem_u32(src);
  const uint64_t m = map_addr(map);
  if constexpr (Rank == 1) {
    asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.tile.bulk_group [%0, {%2}], [%1];"
                 ::"l"(m), "r"(s), "r"(c[0]) : "memory");
  } else if constexpr (Rank == 2) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];"
        ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]) : "memory");
  } else if constexpr (Rank == 3) {
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
        ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
  } else if constexpr (Rank == 4) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
        " [%0, {%2, %3, %4, %5}], [%1];" ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]),
        "r"(c[3]) : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group"
        " [%0, {%2, %3, %4, %5, %6}], [%1];" ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]),
        "r"(c[3]), "r"(c[4]) : "memory");
  }
}

// Element-wise atomic add of a shared-memory box into global memory (the map's element type:
// f32 for us). Each element update is relaxed/gpu-scope, so many CTAs may add to one tile.
// Same ordering rules as tma_store.
template <int Rank>
FB_DEVICE void tma_reduce_add(const CUtensorMap* map, const void* src, const int (&c)[Rank]) {
  static_assert(Rank == 2 || Rank == 3, "add ranks as needed");
  const uint32_t s = smem_u32(src);
  const uint64_t m = map_addr(map);
  if constexpr (Rank == 2) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group"
        " [%0, {%2, %3}], [%1];" ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]) : "memory");
  } else {
    asm volatile(
        "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
        " [%0, {%2, %3, %4}], [%1];" ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2])
        : "memory");
  }
}

// Non-tensor bulk copy global -> shared of `bytes` (a multiple of 16; both addresses 16-byte
// aligned) that completes as transaction bytes on `bar`, like a TMA tile load: the caller's
// arrive_expect_tx counts them. No tensor map: for small contiguous rows (e.g. a Q block's LSE
// and D, as the measured by-keys backward in docs/perf-log.md brought them). PTX ISA
// cp.async.bulk (sm_90).
FB_DEVICE void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// Non-tensor bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from this
// CTA's shared memory to the same offset `dst` in CTA `cta_rank` of the cluster, completed as
// transaction bytes on the barrier at offset `bar` there (its own arrive_expect_tx counts them;
// the bytes are visible to a CTA-scope waiter of that phase). The source is read through the
// async proxy: generic stores into it need fence_proxy_async_shared() and a barrier first, and
// it may be rewritten only once the receiver says so (e.g. a remote arrival once its barrier
// completed). For swapping tiles between the CTAs of a pair (docs/design.md section 5, "A 2-CTA
// pair"). PTX ISA cp.async.bulk, .shared::cluster.shared::cta (sm_90).
FB_DEVICE void bulk_copy_to_cta(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                uint32_t cta_rank) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %3, [%2];" ::"r"(
          mapa_shared(smem_u32(dst), cta_rank)),
      "r"(smem_u32(src)), "r"(mapa_shared(smem_u32(bar), cta_rank)), "r"(bytes)
      : "memory");
}

// Non-tensor bulk reduce: global[dst .. dst+bytes) += shared[src .. src+bytes) as fp32.
// `bytes` a multiple of 16, both addresses 16-byte aligned. No tensor map needed: the natural
// tool for a contiguous fp32 accumulator (e.g. dQaccum). Flushes fp32 subnormals to zero.
FB_DEVICE void bulk_reduce_add_f32(float* dst, const void* src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
      "r"(smem_u32(src)), "r"(bytes)
      : "memory");
}

// Close the bulk async-group of this thread's earlier stores / reductions.
FB_DEVICE void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Wait until at most N committed groups still READ their shared-memory source (the buffer may
// then be overwritten). Call with N = 0 before reusing a buffer and before the CTA exits.
template <int N>
FB_DEVICE void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Wait until at most N groups are pending at all (their global writes done).
template <int N>
FB_DEVICE void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace hopper
}  // namespace flashback
