// Cluster and register tests: cluster launch with cudaLaunchKernelEx, %cluster_ctarank /
// %cluster_nctarank, distributed shared memory reads and writes through mapa, the cluster
// barrier; and setmaxnreg moving registers from a producer warpgroup to two consumers.
#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

// Each CTA fills a[] from `in`; after a cluster barrier it reads a peer's a[] (rank + 1) through
// DSMEM and writes a value into that peer's b[]; after a second barrier it reports its own b[].
__global__ void cluster_dsmem_kernel(const float* in, float* out_read, float* out_written,
                                     int* out_rank) {
  __shared__ float a[128], b[128];
  const int t = threadIdx.x;
  const uint32_t rank = fh::cluster_ctarank();
  const uint32_t cs = fh::cluster_size();
  a[t] = in[blockIdx.x * 128 + t];
  fh::cluster_sync();  // all CTAs started and a[] written before any peer reads it
  const uint32_t peer = (rank + 1) % cs;
  const float v = fh::ld_shared_cluster_f32(fh::mapa_shared(fh::smem_u32(&a[(t + 3) % 128]), peer));
  out_read[blockIdx.x * 128 + t] = v;
  fh::st_shared_cluster_f32(fh::mapa_shared(fh::smem_u32(&b[t]), peer), v * 2.0f + rank);
  fh::cluster_sync();  // peers' writes into b[] visible; no CTA exits while others still access it
  out_written[blockIdx.x * 128 + t] = b[t];
  if (t == 0) {
    out_rank[blockIdx.x * 2] = rank;
    out_rank[blockIdx.x * 2 + 1] = cs;
  }
}

// Pairs of CTAs swap a 10 KB tile (the size of a 64 x 80 16-bit dS tile) kRounds times with
// bulk copies into the partner's shared memory: round r, each CTA fills `send` from in[r], and
// after the partner freed its `recv` (a remote arrival on this CTA's `freed` barrier, from the
// round before) one thread copies `send` to the partner's `recv`, completed on the partner's
// `full`; each CTA waits on its own `full`, writes `recv` to out[r] and frees it for the partner.
constexpr int kSwapBytes = 10240;
constexpr int kSwapRounds = 3;
__global__ void cluster_bulk_swap_kernel(const uint4* in, uint4* out) {
  __shared__ alignas(128) uint4 send[kSwapBytes / 16];
  __shared__ alignas(128) uint4 recv[kSwapBytes / 16];
  __shared__ alignas(8) uint64_t full, freed;
  const uint32_t rank = fh::cluster_ctarank();
  const uint32_t peer = rank ^ 1;
  const int t = threadIdx.x;
  constexpr int kVec = kSwapBytes / 16;
  if (t == 0) {
    fh::mbar_init(&full, 1);   // this CTA's arrive_expect_tx + the partner's bytes
    fh::mbar_init(&freed, 1);  // the partner's remote arrival: it read its recv
    fh::fence_mbarrier_init();
  }
  fh::cluster_sync();  // barriers initialised in both CTAs before any remote use
  for (int r = 0; r < kSwapRounds; ++r) {
    if (t == 0) fh::mbar_arrive_expect_tx(&full, kSwapBytes);
    // The copy of round r - 1 has completed (the partner freed recv only after its full), so
    // send may be rewritten.
    if (r > 0) fh::mbar_wait(&freed, (r - 1) & 1);
    for (int i = t; i < kVec; i += blockDim.x) send[i] = in[(size_t(r) * gridDim.x + blockIdx.x) * kVec + i];
    fh::fence_proxy_async_shared();  // generic stores -> the bulk copy's async-proxy reads
    __syncthreads();
    if (t == 0) fh::bulk_copy_to_cta(recv, send, kSwapBytes, &full, peer);
    fh::mbar_wait(&full, r & 1);
    for (int i = t; i < kVec; i += blockDim.x) out[(size_t(r) * gridDim.x + blockIdx.x) * kVec + i] = recv[i];
    __syncthreads();  // every read of recv done before the partner may write it again
    if (t == 0) fh::mbar_arrive_cluster(&freed, peer);
  }
  fh::cluster_sync();  // no CTA exits while its partner may still arrive on its barriers
}

// How long a tile takes to reach the partner CTA of a pair: the two CTAs bounce `bytes` back and
// forth `rounds` times, CTA 0 timing the round trips with clock64 (cycles[pair]). mode 0: one
// thread bulk-copies the tile from shared memory into the partner's (complete_tx on its
// barrier), as the d = 256 pair sends dS^T; mode 1: every thread stores its 16-byte pieces
// straight into the partner's shared memory (st.shared::cluster.v4) and arrives on the
// partner's barrier with release at cluster scope, the receiver waiting with acquire at cluster
// scope: the path for values that are still in registers (a partial sum of S, say). CTA 1
// echoes what it received. A round's data may be overwritten only after the echo came back,
// which the echo's arrival says (mode 0: the copy's bytes landed, so its reads are done; mode 1:
// every partner thread arrived after its loads and stores). Afterwards each CTA writes what it
// last received to out[pair][rank].
constexpr int kPingMaxBytes = 40960;
__global__ void cluster_pingpong_kernel(const uint4* in, uint4* out, long long* cycles, int bytes,
                                        int rounds, int mode) {
  extern __shared__ __align__(128) uint4 ping_smem[];
  uint4* send = ping_smem;
  uint4* recv = ping_smem + kPingMaxBytes / 16;
  __shared__ alignas(8) uint64_t full;
  const uint32_t rank = fh::cluster_ctarank();
  const uint32_t peer = rank ^ 1;
  const int t = threadIdx.x;
  const int vecs = bytes / 16;
  const int pair = blockIdx.x / 2;
  for (int i = t; i < vecs; i += blockDim.x) send[i] = in[size_t(pair) * vecs + i];
  if (t == 0) {
    fh::mbar_init(&full, mode == 0 ? 1 : blockDim.x);
    fh::fence_mbarrier_init();
  }
  fh::fence_proxy_async_shared();  // send's generic stores -> the bulk copy's reads
  fh::cluster_sync();              // barriers initialised and send filled in both CTAs
  // Mode 0: one thread sends and waits; mode 1: every thread sends its pieces and waits.
  auto send_to_peer = [&](const uint4* src) {
    if (mode == 0) {
      if (t == 0) fh::bulk_copy_to_cta(recv, src, bytes, &full, peer);
    } else {
      for (int i = t; i < vecs; i += blockDim.x) {
        fh::st_shared_cluster_v4(fh::mapa_shared(fh::smem_u32(&recv[i]), peer), src[i]);
      }
      fh::mbar_arrive_cluster_release(&full, peer);
    }
  };
  auto arm = [&] {
    if (mode == 0 && t == 0) fh::mbar_arrive_expect_tx(&full, bytes);
  };
  auto wait_full = [&](int r) {
    if (mode == 0) {
      if (t == 0) fh::mbar_wait(&full, r & 1);
    } else {
      fh::mbar_wait_cluster(&full, r & 1);
    }
  };
  long long start = clock64();
  for (int r = 0; r < rounds; ++r) {
    arm();
    if (rank == 0) {
      send_to_peer(send);
      wait_full(r);
    } else {
      wait_full(r);
      send_to_peer(recv);  // the echo: from the tile just received (mode 0 reads it by the copy)
    }
  }
  const long long stop = clock64();
  if (rank == 0 && t == 0) cycles[pair] = stop - start;
  __syncthreads();  // mode 0: thread 0 waited for the last phase for the whole CTA
  for (int i = t; i < vecs; i += blockDim.x) out[(size_t(pair) * 2 + rank) * vecs + i] = recv[i];
  fh::cluster_sync();  // no CTA exits while its partner may still copy into it or arrive on it
}

// 384 threads, 168 registers each at entry (65536 / 384 rounded down to 8). Warpgroup 0 drops to
// 40, warpgroups 1-2 rise to 232: 128*40 + 256*232 = 64512 <= 384*168. Consumers then hold 128
// loaded values live at once; every thread writes a result.
constexpr int kLive = 128;
__global__ void __launch_bounds__(384, 1) setmaxnreg_kernel(const float* in, float* out) {
  const int wg = fh::warpgroup_index();
  const int i = threadIdx.x % 128;
  if (wg == 0) {
    fh::setmaxnreg_dec<40>();
    out[i] = in[i] * 3.0f;
  } else {
    fh::setmaxnreg_inc<232>();
    const int c = wg - 1;
    const float* src = in + 128 + (c * 128 + i) * kLive;
    float v[kLive];
#pragma unroll
    for (int j = 0; j < kLive; ++j) v[j] = src[j];
    float* dst = out + 128 + (c * 128 + i) * kLive;
#pragma unroll
    for (int j = 0; j < kLive; ++j) dst[j] = v[j] * v[kLive - 1 - j] + v[(j + 1) % kLive];
  }
}

}  // namespace

// in: fp32 [nclusters * cs][128]. out_read / out_written: same shape; out_rank: int [nctas][2].
FBH_EXPORT int fbh_cluster_dsmem(const float* in, float* out_read, float* out_written, int* out_rank,
                                 int cluster_size, int nclusters) {
  if (cluster_size > 8) {
    FBH_TRY(cudaFuncSetAttribute(cluster_dsmem_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  FBH_TRY(fh::launch_with_cluster(cluster_dsmem_kernel, dim3(cluster_size * nclusters), dim3(128), 0,
                                  0, dim3(cluster_size, 1, 1), in, out_read, out_written, out_rank));
  return (int)cudaGetLastError();
}

// in, out: [kSwapRounds][2 * npairs][10240 B]. out[r][c] = in[r][c ^ 1].
FBH_EXPORT int fbh_cluster_bulk_swap(const void* in, void* out, int npairs) {
  FBH_TRY(fh::launch_with_cluster(cluster_bulk_swap_kernel, dim3(2 * npairs), dim3(128), 0, 0,
                                  dim3(2, 1, 1), static_cast<const uint4*>(in), static_cast<uint4*>(out)));
  return (int)cudaGetLastError();
}

// in: [npairs][bytes]; out: [npairs][2][bytes] (each CTA's last received tile: the input);
// cycles: int64 [npairs], CTA 0's clock64 cycles for `rounds` round trips. bytes: a multiple of
// 16 up to 40960; mode 0 bulk copy, 1 per-thread DSMEM stores with release / acquire at cluster
// scope.
FBH_EXPORT int fbh_cluster_pingpong(const void* in, void* out, long long* cycles, int bytes, int rounds,
                                    int mode, int npairs, int threads) {
  if (bytes <= 0 || bytes % 16 != 0 || bytes > kPingMaxBytes || rounds < 1 || (mode != 0 && mode != 1)) {
    return (int)cudaErrorInvalidValue;
  }
  // 128 KB, of which the kernel uses 80: two such CTAs cannot share an SM, so each pair's tile
  // crosses between SMs (with 80 KB both CTAs of a cluster could land on one SM).
  const size_t smem = 128 * 1024;
  static_assert(2 * kPingMaxBytes <= 128 * 1024, "send and recv fit");
  FBH_TRY(cudaFuncSetAttribute(cluster_pingpong_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  FBH_TRY(fh::launch_with_cluster(cluster_pingpong_kernel, dim3(2 * npairs), dim3(threads), smem, 0,
                                  dim3(2, 1, 1), static_cast<const uint4*>(in), static_cast<uint4*>(out),
                                  cycles, bytes, rounds, mode));
  return (int)cudaGetLastError();
}

// in: fp32 [128 + 256 * 128]; out: same. out[i] = 3 in[i] (i < 128); consumer thread k's block
// of 128: out[j] = v[j] * v[127 - j] + v[(j + 1) % 128] with v = its input block.
FBH_EXPORT int fbh_setmaxnreg(const float* in, float* out) {
  setmaxnreg_kernel<<<1, 384>>>(in, out);
  return (int)cudaGetLastError();
}
