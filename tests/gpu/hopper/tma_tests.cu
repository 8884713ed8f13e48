// TMA tests: tensor-map encoding (rank 2..5, bf16/fp32, 128B swizzle or none), tile loads
// completing on an mbarrier (raw shared-memory bytes dumped for the swizzle check), tile stores,
// tensor reduce-add, non-tensor bulk reduce-add of fp32 (also in a fixed order across CTAs, by
// acquire / release turns), and multicast loads in a cluster.
#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

struct Coords {
  int c[5];
};

template <int Rank>
__global__ void tma_load_store_kernel(const __grid_constant__ CUtensorMap src,
                                      const __grid_constant__ CUtensorMap dst, uint8_t* raw,
                                      uint32_t box_bytes, Coords lc, Coords sc, int do_store,
                                      int prefetch) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* tile = fh::align_smem(smem_raw);
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    fh::mbar_init(&bar, 1);
    fh::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int c[Rank];
    for (int i = 0; i < Rank; ++i) c[i] = lc.c[i];
    // The L2 prefetch of the same box (partly out of bounds) first: it must not fault or
    // change what the load brings.
    if constexpr (Rank == 4) {
      // Bits 0 and 1 / 2 together: the prefetch carries the policy too (tma_prefetch_l2_hint).
      if ((prefetch & 1) && (prefetch & 6)) {
        fh::tma_prefetch_l2_hint(&src, c, (prefetch & 2) ? fh::l2_policy_evict_last() : fh::l2_policy_evict_first());
      } else if (prefetch & 1) {
        fh::tma_prefetch_l2<Rank>(&src, c);
      }
    } else {
      if (prefetch & 1) fh::tma_prefetch_l2<Rank>(&src, c);
    }
    fh::mbar_arrive_expect_tx(&bar, box_bytes);
    if constexpr (Rank == 2 || Rank == 4) {
      // The load with an L2 cache policy (bit 1: evict_last, bit 2: evict_first): same bytes.
      if (prefetch & 6) {
        const uint64_t policy = (prefetch & 2) ? fh::l2_policy_evict_last() : fh::l2_policy_evict_first();
        fh::tma_load_hint<Rank>(tile, &src, &bar, c, policy);
      } else {
        fh::tma_load<Rank>(tile, &src, &bar, c);
      }
    } else {
      fh::tma_load<Rank>(tile, &src, &bar, c);
    }
  }
  fh::mbar_wait(&bar, 0);
  for (uint32_t i = threadIdx.x * 16; i < box_bytes; i += blockDim.x * 16) {
    *reinterpret_cast<uint4*>(raw + i) = *reinterpret_cast<const uint4*>(tile + i);
  }
  // The tile was written by TMA (async proxy) and is read by TMA again: no proxy fence needed.
  if (do_store && threadIdx.x == 0) {
    int c[Rank];
    for (int i = 0; i < Rank; ++i) c[i] = sc.c[i];
    fh::tma_store<Rank>(&dst, tile, c);
    fh::bulk_commit_group();
    fh::bulk_wait_group<0>();
  }
}

// CTA b loads block b of `src` and adds it into `dst` at (c0, c1): dst tile += sum_b src_b.
__global__ void tma_reduce_kernel(const __grid_constant__ CUtensorMap src,
                                  const __grid_constant__ CUtensorMap dst, uint32_t box_bytes,
                                  int box_rows, int c0, int c1) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* tile = fh::align_smem(smem_raw);
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    fh::mbar_init(&bar, 1);
    fh::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    fh::mbar_arrive_expect_tx(&bar, box_bytes);
    fh::tma_load_2d(tile, &src, &bar, 0, blockIdx.x * box_rows);
    fh::mbar_wait(&bar, 0);
    const int c[2] = {c0, c1};
    fh::tma_reduce_add<2>(&dst, tile, c);
    fh::bulk_commit_group();
    fh::bulk_wait_group<0>();
  }
}

// One thread bulk-copies src[0 .. n) into shared memory on an mbarrier's transaction count;
// after the wait every thread copies it out to dst.
__global__ void bulk_load_kernel(const float* src, float* dst, int n) {
  extern __shared__ uint8_t smem_raw[];
  float* buf = fh::align_smem<float>(smem_raw, 128);
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    fh::mbar_init(&bar, 1);
    fh::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    fh::mbar_arrive_expect_tx(&bar, n * 4);
    fh::bulk_load(buf, src, n * 4, &bar);
  }
  fh::mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = buf[i];
}

// CTA b copies src[b*n .. b*n+n) into shared memory with ordinary stores, then one bulk
// reduce-add into dst[0 .. n): dst += sum_b src_b.
__global__ void bulk_reduce_kernel(const float* src, float* dst, int n) {
  extern __shared__ uint8_t smem_raw[];
  float* buf = fh::align_smem<float>(smem_raw, 128);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = src[blockIdx.x * n + i];
  fh::fence_proxy_async_shared();  // generic writes -> async-proxy read by the bulk copy
  __syncthreads();
  if (threadIdx.x == 0) {
    fh::bulk_reduce_add_f32(dst, buf, n * 4);
    fh::bulk_commit_group();
    fh::bulk_wait_group<0>();
  }
}

// The deterministic dQ warp's pattern: CTA b waits until *turn == b (acquire), bulk-reduces its
// row src[b] into dst, waits for the global writes, and hands the turn on (release); the proxy
// fences order the async-proxy reduce after the acquire and before the release. dst then holds
// the sequential fp32 sum in CTA order, bitwise. Every CTA must be resident (ncta small).
__global__ void ordered_bulk_reduce_kernel(const float* src, float* dst, int* turn, int n) {
  extern __shared__ uint8_t smem_raw[];
  float* buf = fh::align_smem<float>(smem_raw, 128);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = src[blockIdx.x * n + i];
  fh::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (fh::ld_acquire_gpu(turn) != static_cast<int>(blockIdx.x)) {
      if (clock64() - start > (1ll << 34)) __trap();  // a lost turn fails the test, not hangs it
    }
    fh::fence_proxy_async_global();
    fh::bulk_reduce_add_f32(dst, buf, n * 4);
    fh::bulk_commit_group();
    fh::bulk_wait_group<0>();
    fh::fence_proxy_async_global();
    fh::red_release_gpu_add(turn, 1);
  }
}

// The dQ conversion queue's count (hopper::atom_acq_rel_gpu_add): every CTA writes its row of
// `rows` with plain stores, then one thread counts with acquire-release; the one CTA that
// counts last (old == ncta - 1) reads every CTA's row and writes their sum (CTA order) to out.
// Without the acquire the last one could read rows not yet visible to it.
__global__ void last_arrival_sum_kernel(const float* src, float* rows, float* out, int* counter,
                                        int* lasts, int n, int ncta) {
  __shared__ int last;
  for (int i = threadIdx.x; i < n; i += blockDim.x) rows[blockIdx.x * n + i] = src[blockIdx.x * n + i];
  __syncthreads();
  if (threadIdx.x == 0) {
    last = fh::atom_acq_rel_gpu_add(counter, 1) == ncta - 1;
    if (last) atomicAdd(lasts, 1);
  }
  __syncthreads();
  if (!last) return;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float sum = 0.f;
    for (int b = 0; b < ncta; ++b) sum += __ldcg(rows + b * n + i);
    out[i] = sum;
  }
}

// Cluster of `cs` CTAs; cluster q shares tile q (rows [q*rows, q*rows+rows) of `map`). Rank r
// fetches slice r (rows/cs rows) and multicasts it to every CTA of the cluster; each CTA then
// dumps its whole tile to out[blockIdx.x].
__global__ void tma_multicast_kernel(const __grid_constant__ CUtensorMap map, uint8_t* out,
                                     int rows) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* tile = fh::align_smem(smem_raw);
  __shared__ uint64_t bar;
  const uint32_t cs = fh::cluster_size();
  const uint32_t rank = fh::cluster_ctarank();
  const int cluster_id = blockIdx.x / cs;
  const uint32_t tile_bytes = rows * 128;
  if (threadIdx.x == 0) {
    fh::mbar_init(&bar, 1);
    fh::fence_mbarrier_init();
  }
  fh::cluster_sync();  // every barrier initialised before any peer's multicast can land
  if (threadIdx.x == 0) {
    const int slice = rows / cs;
    fh::mbar_arrive_expect_tx(&bar, tile_bytes);  // own slice + the peers' slices
    fh::tma_load_multicast_2d(tile + rank * slice * 128, &map, &bar,
                              static_cast<uint16_t>((1u << cs) - 1), 0,
                              cluster_id * rows + rank * slice);
  }
  fh::mbar_wait(&bar, 0);  // CTA scope suffices for TMA data, multicast included
  for (uint32_t i = threadIdx.x * 16; i < tile_bytes; i += blockDim.x * 16) {
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(blockIdx.x) * tile_bytes + i) =
        *reinterpret_cast<const uint4*>(tile + i);
  }
  fh::cluster_sync();  // nobody exits while a peer's copy may still target it
}

// The 4-D form the attention kernels use (a tile of 64 rows x kAtoms 64-column boxes of a
// {64 kAtoms, seqlen, heads, batch} bf16 tensor, 128B-swizzled): cluster q of two takes rows
// row0.. of (head, batch) = (q % heads, q % batch), row0 = the (q % 3)-th of {0, 64, seqlen - 32}
// (the last box half past the rows: zeros in both CTAs); rank r issues the boxes a with
// a % 2 == r, multicast to both, each CTA expecting the whole tile on its own barrier. With
// `delay`, rank 1 arms its barrier only after about that many clock cycles, so its partner's
// boxes land before its arrive_expect_tx (the transaction count goes below zero first).
constexpr int kMc4Atoms = 4;
__global__ void tma_multicast_4d_kernel(const __grid_constant__ CUtensorMap map, uint8_t* out,
                                        int seqlen, int heads, int batch, long long delay) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* tile = fh::align_smem(smem_raw);
  __shared__ uint64_t bar;
  const uint32_t rank = fh::cluster_ctarank();
  const int q = blockIdx.x / 2;
  const int rows0[3] = {0, 64, seqlen - 32};
  const int c_row = rows0[q % 3], c_head = q % heads, c_batch = q % batch;
  constexpr uint32_t kAtomBytes = 64 * 128;
  if (threadIdx.x == 0) {
    fh::mbar_init(&bar, 1);
    fh::fence_mbarrier_init();
  }
  fh::cluster_sync();  // both barriers initialised before either CTA's copy can land
  if (threadIdx.x == 0) {
    if (rank == 1 && delay > 0) {
      const long long start = clock64();
      while (clock64() - start < delay) {
      }
    }
    fh::mbar_arrive_expect_tx(&bar, kMc4Atoms * kAtomBytes);
    for (int a = static_cast<int>(rank); a < kMc4Atoms; a += 2) {
      const int c[4] = {64 * a, c_row, c_head, c_batch};
      fh::tma_load_multicast_4d(tile + a * kAtomBytes, &map, &bar, 0b11, c);
    }
  }
  fh::mbar_wait(&bar, 0);
  const uint32_t bytes = kMc4Atoms * kAtomBytes;
  for (uint32_t i = threadIdx.x * 16; i < bytes; i += blockDim.x * 16) {
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(blockIdx.x) * bytes + i) =
        *reinterpret_cast<const uint4*>(tile + i);
  }
  fh::cluster_sync();  // nobody exits while its peer's copy may still target it
}

fh::TmaType tma_type(int is_f32) { return is_f32 ? fh::TmaType::kF32 : fh::TmaType::kBf16; }
fh::TmaSwizzle tma_swizzle(int sw) { return sw ? fh::TmaSwizzle::k128B : fh::TmaSwizzle::kNone; }

}  // namespace

// Load the box at load_coord of `src` (dims[0] innermost, contiguous) into shared memory, copy
// the raw shared-memory bytes to `raw`, and, if store_coord is not null, TMA-store the tile into
// `dst` (same shape as src) at store_coord.
// prefetch bit 0: the loading thread first asks L2 for the same box (hopper::tma_prefetch_l2);
// bits 1 / 2 (ranks 2 and 4): the load carries an evict_last / evict_first L2 policy
// (hopper::tma_load_hint), and at rank 4 with bit 0 the prefetch too (tma_prefetch_l2_hint).
FBH_EXPORT int fbh_tma_load_store(const void* src, void* raw, void* dst, int is_f32, int rank,
                                  const long long* dims, const int* box, const int* load_coord,
                                  const int* store_coord, int swizzle128, int prefetch) {
  uint64_t gdims[5], strides[4];
  uint32_t gbox[5];
  Coords lc = {}, sc = {};
  uint32_t box_bytes = is_f32 ? 4 : 2;
  for (int i = 0; i < rank; ++i) {
    gdims[i] = static_cast<uint64_t>(dims[i]);
    gbox[i] = static_cast<uint32_t>(box[i]);
    box_bytes *= gbox[i];
    lc.c[i] = load_coord[i];
    sc.c[i] = store_coord ? store_coord[i] : 0;
  }
  fbh_test::dense_strides(rank, gdims, is_f32 ? 4 : 2, strides);
  CUtensorMap src_map, dst_map;
  FBH_TRY(fh::make_tensor_map(&src_map, src, tma_type(is_f32), rank, gdims, strides, gbox,
                              tma_swizzle(swizzle128)));
  FBH_TRY(fh::make_tensor_map(&dst_map, dst ? dst : src, tma_type(is_f32), rank, gdims, strides,
                              gbox, tma_swizzle(swizzle128)));
  const size_t smem = box_bytes + 1024;
  const int do_store = store_coord != nullptr && dst != nullptr;
  auto args = [&](auto kernel) -> int {
    FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(kernel), smem));
    kernel<<<1, 128, smem>>>(src_map, dst_map, static_cast<uint8_t*>(raw), box_bytes, lc, sc,
                             do_store, prefetch);
    return (int)cudaGetLastError();
  };
  switch (rank) {
    case 2: return args(tma_load_store_kernel<2>);
    case 3: return args(tma_load_store_kernel<3>);
    case 4: return args(tma_load_store_kernel<4>);
    case 5: return args(tma_load_store_kernel<5>);
    default: return (int)cudaErrorInvalidValue;
  }
}

// Returns the encode result alone (0 = accepted), for the argument-validation tests.
FBH_EXPORT int fbh_tma_encode(const void* src, int is_f32, int rank, const long long* dims,
                              const long long* byte_strides, const int* box, int swizzle128) {
  uint64_t gdims[5], strides[4];
  uint32_t gbox[5];
  for (int i = 0; i < rank; ++i) {
    gdims[i] = static_cast<uint64_t>(dims[i]);
    gbox[i] = static_cast<uint32_t>(box[i]);
    if (i + 1 < rank) strides[i] = static_cast<uint64_t>(byte_strides[i]);
  }
  CUtensorMap map;
  return (int)fh::make_tensor_map(&map, src, tma_type(is_f32), rank, gdims, strides, gbox,
                                  tma_swizzle(swizzle128));
}

// src: fp32 [ncta * box_rows][box_cols]; dst: fp32 [rows][cols]. dst[c1.., c0..] += sum of blocks.
FBH_EXPORT int fbh_tma_reduce_add(const float* src, float* dst, int rows, int cols, int box_rows,
                                  int box_cols, int ncta, int c0, int c1, int swizzle128) {
  CUtensorMap src_map, dst_map;
  FBH_TRY(fh::make_tensor_map_2d(&src_map, src, fh::TmaType::kF32, (uint64_t)ncta * box_rows,
                                 box_cols, box_cols, box_rows, box_cols, tma_swizzle(swizzle128)));
  FBH_TRY(fh::make_tensor_map_2d(&dst_map, dst, fh::TmaType::kF32, rows, cols, cols, box_rows,
                                 box_cols, tma_swizzle(swizzle128)));
  const uint32_t box_bytes = box_rows * box_cols * 4;
  const size_t smem = box_bytes + 1024;
  FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(tma_reduce_kernel), smem));
  tma_reduce_kernel<<<ncta, 32, smem>>>(src_map, dst_map, box_bytes, box_rows, c0, c1);
  return (int)cudaGetLastError();
}

// dst[0 .. n) = src[0 .. n) through shared memory by one bulk copy. n multiple of 4.
FBH_EXPORT int fbh_bulk_load(const float* src, float* dst, int n) {
  if (n % 4 != 0) return (int)cudaErrorInvalidValue;
  const size_t smem = n * 4 + 128;
  FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(bulk_load_kernel), smem));
  bulk_load_kernel<<<1, 128, smem>>>(src, dst, n);
  return (int)cudaGetLastError();
}

// src: fp32 [ncta][n]; dst: fp32 [n] += sum over CTAs. n multiple of 4.
FBH_EXPORT int fbh_bulk_reduce_add_f32(const float* src, float* dst, int n, int ncta) {
  if (n % 4 != 0) return (int)cudaErrorInvalidValue;
  const size_t smem = n * 4 + 128;
  FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(bulk_reduce_kernel), smem));
  bulk_reduce_kernel<<<ncta, 256, smem>>>(src, dst, n);
  return (int)cudaGetLastError();
}

// src: fp32 [ncta][n]; dst: fp32 [n] += src_0, then += src_1, ... in that order; turn: one
// zeroed int. n multiple of 4; ncta at most the SM count (all CTAs resident).
FBH_EXPORT int fbh_ordered_bulk_reduce_add_f32(const float* src, float* dst, int* turn, int n, int ncta) {
  if (n % 4 != 0 || ncta < 1 || ncta > 64) return (int)cudaErrorInvalidValue;
  const size_t smem = n * 4 + 128;
  FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(ordered_bulk_reduce_kernel), smem));
  ordered_bulk_reduce_kernel<<<ncta, 256, smem>>>(src, dst, turn, n);
  return (int)cudaGetLastError();
}

// src: fp32 [ncta][n]; rows: fp32 scratch of the same size; out: fp32 [n] = the sum of the rows
// in CTA order, written by the CTA that counted last; counter, lasts: zeroed ints (lasts: how
// many CTAs saw themselves last). Any ncta: no CTA waits for another.
FBH_EXPORT int fbh_last_arrival_sum(const float* src, float* rows, float* out, int* counter,
                                    int* lasts, int n, int ncta) {
  if (n < 1 || ncta < 1) return (int)cudaErrorInvalidValue;
  last_arrival_sum_kernel<<<ncta, 256>>>(src, rows, out, counter, lasts, n, ncta);
  return (int)cudaGetLastError();
}

// src: bf16 [nclusters * rows][64]; out: [nclusters * cs][rows * 128 bytes] raw tiles.
FBH_EXPORT int fbh_tma_multicast(const void* src, void* out, int rows, int cluster_size,
                                 int nclusters, int swizzle128) {
  if (rows % (cluster_size * 8) != 0) return (int)cudaErrorInvalidValue;
  CUtensorMap map;
  FBH_TRY(fh::make_tensor_map_2d(&map, src, fh::TmaType::kBf16, (uint64_t)nclusters * rows, 64,
                                 64, rows / cluster_size, 64, tma_swizzle(swizzle128)));
  const size_t smem = rows * 128 + 1024;
  FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(tma_multicast_kernel), smem));
  FBH_TRY(fh::launch_with_cluster(tma_multicast_kernel, dim3(cluster_size * nclusters), dim3(128),
                                  smem, 0, dim3(cluster_size, 1, 1), map,
                                  static_cast<uint8_t*>(out), rows));
  return (int)cudaGetLastError();
}

// src: bf16 [batch][heads][seqlen][256] (so the map is {256, seqlen, heads, batch}); out:
// [2 nclusters][4 x 64 x 128 bytes] raw tiles.
FBH_EXPORT int fbh_tma_multicast_4d(const void* src, void* out, int seqlen, int heads, int batch,
                                    int nclusters, long long delay) {
  if (seqlen < 128) return (int)cudaErrorInvalidValue;
  CUtensorMap map;
  const uint64_t dims[4] = {64 * kMc4Atoms, static_cast<uint64_t>(seqlen),
                            static_cast<uint64_t>(heads), static_cast<uint64_t>(batch)};
  const uint64_t strides[3] = {64 * kMc4Atoms * 2, 64ull * kMc4Atoms * 2 * seqlen,
                               64ull * kMc4Atoms * 2 * seqlen * heads};
  const uint32_t box[4] = {64, 64, 1, 1};
  FBH_TRY(fh::make_tensor_map(&map, src, fh::TmaType::kBf16, 4, dims, strides, box,
                              fh::TmaSwizzle::k128B));
  const size_t smem = kMc4Atoms * 64 * 128 + 1024;
  FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(tma_multicast_4d_kernel), smem));
  FBH_TRY(fh::launch_with_cluster(tma_multicast_4d_kernel, dim3(2 * nclusters), dim3(128), smem,
                                  0, dim3(2, 1, 1), map, static_cast<uint8_t*>(out), seqlen, heads,
                                  batch, delay));
  return (int)cudaGetLastError();
}

FBH_EXPORT int fbh_device_synchronize() { return (int)cudaDeviceSynchronize(); }
