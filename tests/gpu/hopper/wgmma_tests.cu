// wgmma tests: D(64 x N) = A(64 x 64) * B(N x 64)^T with K = 64 (four k16 steps), for every
// supported N, SS with A and B each K-major or MN-major (128B swizzle, loaded by TMA), and RS
// (A from registers in the documented fragment layout) with B K-major or MN-major. The result is
// written out through the documented accumulator mapping acc_row / acc_col. Plus a chain
// SS -> 16-bit A-fragments in place -> RS, the pattern of P = softmax(S) feeding P V. bf16 at
// every generated N; fp16 (the same code with Dtype::kF16) at the N the kernel family uses.
#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

using fh::Dtype;

constexpr int kM = 64, kK = 64;
constexpr uint32_t kAtomColBytes = 64 * 128;  // one 64-wide MN chunk of a K=64 MN-major tile

constexpr fh::TmaType tma_type(Dtype e) {
  return e == Dtype::kF16 ? fh::TmaType::kF16 : fh::TmaType::kBf16;
}

template <int N, bool BMn>
constexpr uint32_t b_tile_bytes() {
  return BMn ? ((N + 63) / 64) * kAtomColBytes : ((N * 128 + 1023) / 1024) * 1024;
}

// Loads B (K-major: box {64, N} of the N x K matrix; MN-major: 64-wide N chunks of the K x N
// matrix, one atom-column each) into `tile` on `bar`. Returns the bytes the copies deliver.
template <int N, bool BMn>
__device__ uint32_t load_b(uint8_t* tile, const CUtensorMap* map, uint64_t* bar) {
  if constexpr (BMn) {
    for (int i = 0; i < (N + 63) / 64; ++i) fh::tma_load_2d(tile + i * kAtomColBytes, map, bar, 64 * i, 0);
    return ((N + 63) / 64) * kAtomColBytes;
  } else {
    fh::tma_load_2d(tile, map, bar, 0, 0);
    return N * 128;
  }
}

template <bool BMn>
__device__ uint64_t b_desc(const uint8_t* tile, int s) {
  return BMn ? fh::desc_mnmajor_sw128(tile + fh::mnmajor_k_offset(s), kAtomColBytes)
             : fh::desc_kmajor_sw128(tile + fh::kmajor_k_offset(s, 0));
}

template <int N>
__device__ void store_acc(float (&acc)[N / 2], float* d) {
  const int t = threadIdx.x;
#pragma unroll
  for (int r = 0; r < N / 2; ++r) d[fh::acc_row(r, t) * N + fh::acc_col(r, t)] = acc[r];
}

// Two 16-bit elements (bf16 or fp16: only their bits move) as one register, low half = p[0].
__device__ uint32_t load_16x2(const uint16_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 16);
}

template <int N, bool AMn, bool BMn, bool Rs, Dtype E>
__global__ void __launch_bounds__(128) wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                                                    const __grid_constant__ CUtensorMap map_b,
                                                    const uint16_t* a_kmajor, float* d) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* tile_a = fh::align_smem(smem_raw);      // 64 x 128 B = 8 KB
  uint8_t* tile_b = tile_a + kM * 128;             // see b_tile_bytes
  __shared__ uint64_t bar;
  const int t = threadIdx.x;
  if (t == 0) {
    fh::mbar_init(&bar, 1);
    fh::fence_mbarrier_init();
  }
  __syncthreads();
  if (t == 0) {
    fh::mbar_arrive_expect_tx(&bar, (Rs ? 0 : kM * 128) + b_tile_bytes<N, BMn>());
    if (!Rs) fh::tma_load_2d(tile_a, &map_a, &bar, 0, 0);
    load_b<N, BMn>(tile_b, &map_b, &bar);
  }
  fh::mbar_wait(&bar, 0);

  float acc[N / 2];
  uint32_t a_frag[4][4];
  if constexpr (Rs) {
    // Register A, K-major: a[j] = A[row][col], A[row][col+1] for k-block s.
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        a_frag[s][j] = load_16x2(a_kmajor + fh::a_frag_row(j, t) * kK + 16 * s + fh::a_frag_col(j, t));
    fh::wgmma_fence_operand(a_frag[0]);
    fh::wgmma_fence_operand(a_frag[1]);
    fh::wgmma_fence_operand(a_frag[2]);
    fh::wgmma_fence_operand(a_frag[3]);
  }
  fh::wgmma_fence();  // accumulators / A registers written by ordinary code before this point
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint64_t db = b_desc<BMn>(tile_b, s);
    if constexpr (Rs) {
      fh::wgmma_rs<N, BMn ? 1 : 0, E>(acc, a_frag[s], db, s > 0);
    } else {
      const uint64_t da = AMn ? fh::desc_mnmajor_sw128(tile_a + fh::mnmajor_k_offset(s), kAtomColBytes)
                              : fh::desc_kmajor_sw128(tile_a + fh::kmajor_k_offset(s, kM));
      fh::wgmma_ss<N, AMn ? 1 : 0, BMn ? 1 : 0, E>(acc, da, db, s > 0);
    }
  }
  fh::wgmma_commit();
  fh::wgmma_wait<0>();
  fh::wgmma_fence_operand(acc);
  store_acc<N>(acc, d);
}

// P = A B^T (SS, 64 x 64, K = 64), then O = E(P) V with V given as K x N2 (N-major), A operand
// taken from P's accumulators in place (converted to E, bf16 or fp16).
template <int N2, Dtype E>
__global__ void __launch_bounds__(128) wgmma_chain_kernel(const __grid_constant__ CUtensorMap map_a,
                                                          const __grid_constant__ CUtensorMap map_b,
                                                          const __grid_constant__ CUtensorMap map_v,
                                                          float* o) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* tile_a = fh::align_smem(smem_raw);
  uint8_t* tile_b = tile_a + 64 * 128;
  uint8_t* tile_v = tile_b + 64 * 128;
  __shared__ uint64_t bar;
  const int t = threadIdx.x;
  if (t == 0) {
    fh::mbar_init(&bar, 1);
    fh::fence_mbarrier_init();
  }
  __syncthreads();
  if (t == 0) {
    fh::mbar_arrive_expect_tx(&bar, 2 * 64 * 128 + b_tile_bytes<N2, true>());
    fh::tma_load_2d(tile_a, &map_a, &bar, 0, 0);
    fh::tma_load_2d(tile_b, &map_b, &bar, 0, 0);
    load_b<N2, true>(tile_v, &map_v, &bar);
  }
  fh::mbar_wait(&bar, 0);
  float p[32];
  fh::wgmma_fence();
  // First k-step write-only (wgmma_ss_set: p is never initialized), then accumulate, the later
  // k-steps' descriptors made with desc_advance_lo (the persistent forward's form).
  const uint64_t da = fh::desc_kmajor_sw128(tile_a);
  const uint64_t db = fh::desc_kmajor_sw128(tile_b);
  fh::wgmma_ss_set<64, 0, 0, E>(p, da, db);
#pragma unroll
  for (int s = 1; s < 4; ++s) {
    fh::wgmma_ss<64, 0, 0, E>(p, fh::desc_advance_lo(da, 32 * s), fh::desc_advance_lo(db, 32 * s), true);
  }
  fh::wgmma_commit();
  fh::wgmma_wait<0>();
  fh::wgmma_fence_operand(p);
  uint32_t a[4][4];
#pragma unroll
  for (int c = 0; c < 4; ++c) fh::acc_to_a_frag<E>(p, c, a[c]);
  float out[N2 / 2];
  fh::wgmma_fence();  // A fragments were written by ordinary code
#pragma unroll
  for (int c = 0; c < 4; ++c) fh::wgmma_rs<N2, 1, E>(out, a[c], b_desc<true>(tile_v, c), c > 0);
  fh::wgmma_commit();
  fh::wgmma_wait<0>();
  fh::wgmma_fence_operand(out);
  store_acc<N2>(out, o);
}

template <int N, bool AMn, bool BMn, bool Rs, Dtype E>
int run_wgmma(const void* a, const void* b, float* d) {
  CUtensorMap map_a, map_b;
  // A: K-major [M=64][K=64] or MN-major [K=64][M=64]; both 64 x 64, one 128-byte atom wide.
  FBH_TRY(fh::make_tensor_map_2d(&map_a, a, tma_type(E), 64, 64, 64, 64, 64,
                                 fh::TmaSwizzle::k128B));
  if (BMn) {  // [K=64][round_up(N, 64)], 64-column boxes; the MMA reads the first N columns
    constexpr int kNPad = (N + 63) / 64 * 64;
    FBH_TRY(fh::make_tensor_map_2d(&map_b, b, tma_type(E), kK, kNPad, kNPad, kK, 64,
                                   fh::TmaSwizzle::k128B));
  } else {  // [N][K=64], one box of N rows
    FBH_TRY(fh::make_tensor_map_2d(&map_b, b, tma_type(E), N, kK, kK, N, 64,
                                   fh::TmaSwizzle::k128B));
  }
  const size_t smem = 1024 + kM * 128 + b_tile_bytes<N, BMn>();
  auto kernel = wgmma_kernel<N, AMn, BMn, Rs, E>;
  FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(kernel), smem));
  kernel<<<1, 128, smem>>>(map_a, map_b, static_cast<const uint16_t*>(a), d);
  return (int)cudaGetLastError();
}

template <int N, Dtype E = Dtype::kBf16>
int dispatch_variant(const void* a, const void* b, float* d, int a_mn, int b_mn, int rs) {
  if (rs) {
    if (a_mn) return (int)cudaErrorInvalidValue;  // register A is K-major only
    return b_mn ? run_wgmma<N, false, true, true, E>(a, b, d) : run_wgmma<N, false, false, true, E>(a, b, d);
  }
  if (a_mn) return b_mn ? run_wgmma<N, true, true, false, E>(a, b, d) : run_wgmma<N, true, false, false, E>(a, b, d);
  return b_mn ? run_wgmma<N, false, true, false, E>(a, b, d) : run_wgmma<N, false, false, false, E>(a, b, d);
}

template <Dtype E>
int run_chain(const void* a, const void* b, const void* v, float* o, int n2) {
  CUtensorMap map_a, map_b, map_v;
  FBH_TRY(fh::make_tensor_map_2d(&map_a, a, tma_type(E), 64, 64, 64, 64, 64, fh::TmaSwizzle::k128B));
  FBH_TRY(fh::make_tensor_map_2d(&map_b, b, tma_type(E), 64, 64, 64, 64, 64, fh::TmaSwizzle::k128B));
  FBH_TRY(fh::make_tensor_map_2d(&map_v, v, tma_type(E), 64, n2, n2, 64, 64, fh::TmaSwizzle::k128B));
  auto go = [&](auto kernel, int bytes_v) -> int {
    const size_t smem = 1024 + 2 * 64 * 128 + bytes_v;
    FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(kernel), smem));
    kernel<<<1, 128, smem>>>(map_a, map_b, map_v, o);
    return (int)cudaGetLastError();
  };
  switch (n2) {
    case 64: return go(wgmma_chain_kernel<64, E>, b_tile_bytes<64, true>());
    case 128: return go(wgmma_chain_kernel<128, E>, b_tile_bytes<128, true>());
    case 192: return go(wgmma_chain_kernel<192, E>, b_tile_bytes<192, true>());
    case 256: return go(wgmma_chain_kernel<256, E>, b_tile_bytes<256, true>());
    default: return (int)cudaErrorInvalidValue;
  }
}

}  // namespace

// a: bf16, K-major [64][64] (a_mn = 0) or MN-major [64 (K)][64 (M)] (a_mn = 1);
// b: bf16, K-major [N][64] (b_mn = 0) or MN-major [64 (K)][round_up(N, 64)] (b_mn = 1; only the
//    first N columns are used);
// d: fp32 [64][N] = A_math B_math^T. rs = 1: A through registers (needs a_mn = 0).
FBH_EXPORT int fbh_wgmma(const void* a, const void* b, float* d, int n, int a_mn, int b_mn, int rs) {
  switch (n) {
#define FBH_WGMMA_CASE(N) \
  case N:                 \
    return dispatch_variant<N>(a, b, d, a_mn, b_mn, rs);
    FBH_WGMMA_CASE(16) FBH_WGMMA_CASE(32) FBH_WGMMA_CASE(40) FBH_WGMMA_CASE(48) FBH_WGMMA_CASE(56)
    FBH_WGMMA_CASE(64) FBH_WGMMA_CASE(80) FBH_WGMMA_CASE(96) FBH_WGMMA_CASE(112) FBH_WGMMA_CASE(128)
    FBH_WGMMA_CASE(144) FBH_WGMMA_CASE(160) FBH_WGMMA_CASE(176) FBH_WGMMA_CASE(192)
    FBH_WGMMA_CASE(208) FBH_WGMMA_CASE(224) FBH_WGMMA_CASE(256)
#undef FBH_WGMMA_CASE
    default: return (int)cudaErrorInvalidValue;
  }
}

FBH_EXPORT int fbh_wgmma_supported_n(int* out, int capacity) {
  const int shapes[] = {FLASHBACK_WGMMA_SHAPES};
  const int count = static_cast<int>(sizeof(shapes) / sizeof(shapes[0]));
  for (int i = 0; i < count && i < capacity; ++i) out[i] = shapes[i];
  return count;
}

// a, b: bf16 [64][64] K-major; v: bf16 [64 (K)][n2] N-major; o: fp32 [64][n2] = bf16(a b^T) v.
// n2 = 64, 128, 192 or 256.
FBH_EXPORT int fbh_wgmma_chain(const void* a, const void* b, const void* v, float* o, int n2) {
  return run_chain<Dtype::kBf16>(a, b, v, o, n2);
}

// fbh_wgmma with fp16 a and b (wgmma's f16 type), at the N the kernel family issues
// (fwd_sm90.h, bwd_sm90.h): block_n of the forward's S = Q K^T (80, 112, 128); head dim of its
// P V (64, 128, 192, 256); block_n / 2 of the backward's S and dP (40, 64); block_n of its dV^T
// and dK^T (80, 128); block_m of its dQ^T (64). Every variant at each of them.
FBH_EXPORT int fbh_wgmma_f16(const void* a, const void* b, float* d, int n, int a_mn, int b_mn, int rs) {
  switch (n) {
#define FBH_WGMMA_F16_CASE(N) \
  case N:                     \
    return dispatch_variant<N, Dtype::kF16>(a, b, d, a_mn, b_mn, rs);
    FBH_WGMMA_F16_CASE(40) FBH_WGMMA_F16_CASE(64) FBH_WGMMA_F16_CASE(80) FBH_WGMMA_F16_CASE(112)
    FBH_WGMMA_F16_CASE(128) FBH_WGMMA_F16_CASE(192) FBH_WGMMA_F16_CASE(256)
#undef FBH_WGMMA_F16_CASE
    default: return (int)cudaErrorInvalidValue;
  }
}

// fbh_wgmma_chain in fp16: o = fp16(a b^T) v, the forward's fp16 P V.
FBH_EXPORT int fbh_wgmma_chain_f16(const void* a, const void* b, const void* v, float* o, int n2) {
  return run_chain<Dtype::kF16>(a, b, v, o, n2);
}
