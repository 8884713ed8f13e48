// A warp-specialized bf16 GEMM on the Hopper primitives: the worked example that proves them.
//
//   C[M][N] (bf16) = A[M][K] (bf16) * B[N][K]^T (bf16), fp32 accumulation.
//   (torch: C = A @ B.T; both operands K-major, as wgmma likes them.)
//
// Structure (one CTA per SM, persistent over output tiles):
//   warpgroup 0      producer: setmaxnreg.dec to 40; one thread issues the TMA loads of A and B
//                    tiles into a ring of kStages shared-memory stages (TmaPipeline).
//   warpgroups 1, 2  consumers: setmaxnreg.inc to 232; each owns 64 rows of the 128 x 256 tile,
//                    a 64 x 256 fp32 accumulator (128 registers/thread), and issues four
//                    m64n256k16 SS wgmmas per 64-wide K stage; then writes bf16 C from registers.
// Optional cluster of 2 CTAs along M (kClusterM = 2): the two CTAs need the same B tile, so each
// fetches half of it and multicasts it to both, halving B's L2->SM traffic.
//
// Measured at M = N = K = 8192 on an H200 (docs/perf-log.md): 644-666 TFLOP/s persistent,
// 653-666 with the cluster of 2, against 672-687 for torch.matmul in the same runs (95-97%).
//
// Teaching example, not a product: M a multiple of 128 * cluster, N of 256, K of 64.
#include <cuda_bf16.h>

#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

struct GemmConfig {
  static constexpr int kBlockM = 128;  // 2 consumer warpgroups x 64 rows (wgmma M)
  static constexpr int kBlockN = 256;  // largest wgmma N: fewest A re-reads per FLOP
  static constexpr int kBlockK = 64;   // 64 bf16 = 128 bytes = one swizzle atom row
  static constexpr int kStages = 4;    // 4 x 48 KB = 192 KB of the 227 KB
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kGroupM = 16;  // raster: walk 16 M-tiles down before moving along N
  static constexpr uint32_t kABytes = kBlockM * kBlockK * 2;  // 16 KB
  static constexpr uint32_t kBBytes = kBlockN * kBlockK * 2;  // 32 KB
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  static constexpr size_t kSmemBytes =
      1024 /* alignment slack */ + kStages * kStageBytes + sizeof(fh::TmaPipeline<kStages>);
  static_assert(kSmemBytes <= 232448, "over the 227 KB a CTA may have");
  // Registers at entry with __launch_bounds__(kThreads, 1): 65536 / 384 -> 168 per thread.
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 168 * kThreads,
                "setmaxnreg budget exceeds the register file: .inc would deadlock");
};

// Unit u (one tile per CTA of the cluster: kClusterM tiles stacked along M) -> (unit row, col).
// Grouped raster: consecutive units sweep kGroupM tiles of M before moving along N, so the ~132
// tiles in flight at once share few A row-panels and B column-panels (L2 reuse).
template <int kClusterM>
__device__ void unit_coords(int unit, int units_m, int tiles_n, int& um, int& tn) {
  constexpr int kGroup = GemmConfig::kGroupM / kClusterM;
  const int per_group = kGroup * tiles_n;
  const int first = (unit / per_group) * kGroup;
  const int size = min(units_m - first, kGroup);
  const int within = unit % per_group;
  um = first + within % size;
  tn = within / size;
}

template <int kClusterM>
__global__ void __launch_bounds__(GemmConfig::kThreads, 1)
    gemm_bf16_tn_kernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_b, __nv_bfloat16* __restrict__ c,
                        int m, int n, int k) {
  using Cfg = GemmConfig;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = fh::align_smem(smem_raw);
  uint8_t* smem_a = smem;                            // [stage][128 rows][128 B], 128B swizzle
  uint8_t* smem_b = smem + kStages * Cfg::kABytes;  // [stage][256 rows][128 B], 128B swizzle
  auto* pipe = reinterpret_cast<fh::TmaPipeline<kStages>*>(smem + kStages * Cfg::kStageBytes);

  const int wg = fh::warpgroup_index();
  const uint32_t cta_rank = kClusterM > 1 ? fh::cluster_ctarank() : 0;
  if (threadIdx.x == 0) {
    fh::tma_prefetch_map(&map_a);
    fh::tma_prefetch_map(&map_b);
    // empty[s] completes when every consumer warp of every CTA that reads stage s released it.
    pipe->init(4 * Cfg::kConsumers * kClusterM);
  }
  if constexpr (kClusterM > 1) {
    fh::cluster_sync();  // peers' barriers exist before multicast copies or remote arrivals
  } else {
    __syncthreads();
  }

  const int units_m = m / (Cfg::kBlockM * kClusterM);
  const int tiles_n = n / Cfg::kBlockN;
  const int num_units = units_m * tiles_n;
  const int k_iters = k / Cfg::kBlockK;
  const int first_unit = blockIdx.x / kClusterM;
  const int unit_stride = gridDim.x / kClusterM;

  if (wg == 0) {
    // ---------------------------------------------------------------- producer warpgroup
    fh::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      fh::PipelineState<kStages> st;
      for (int unit = first_unit; unit < num_units; unit += unit_stride) {
        int um, tn;
        unit_coords<kClusterM>(unit, units_m, tiles_n, um, tn);
        const int row_a = (um * kClusterM + cta_rank) * Cfg::kBlockM;
        const int row_b = tn * Cfg::kBlockN;
        for (int kb = 0; kb < k_iters; ++kb) {
          pipe->producer_acquire(st);
          pipe->producer_expect(st, Cfg::kStageBytes);  // A + all of B, whoever fetches it
          uint64_t* full = pipe->full_barrier(st);
          fh::tma_load_2d(smem_a + st.stage * Cfg::kABytes, &map_a, full, kb * Cfg::kBlockK, row_a);
          uint8_t* b_dst = smem_b + st.stage * Cfg::kBBytes;
          if constexpr (kClusterM == 1) {
            fh::tma_load_2d(b_dst, &map_b, full, kb * Cfg::kBlockK, row_b);
          } else {
            constexpr int kSlice = Cfg::kBlockN / kClusterM;  // rows of B this CTA fetches
            fh::tma_load_multicast_2d(b_dst + cta_rank * kSlice * 128, &map_b, full,
                                      static_cast<uint16_t>((1u << kClusterM) - 1),
                                      kb * Cfg::kBlockK, row_b + cta_rank * kSlice);
          }
          st.advance();
        }
      }
    }
  } else {
    // --------------------------------------------------------------- consumer warpgroups
    fh::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int cw = wg - 1;  // rows [64 cw, 64 cw + 64) of the tile
    const int t = threadIdx.x % 128;
    const bool warp_leader = (threadIdx.x % 32) == 0;
    // Stage-0 descriptors; stage s and k16 step kk are a byte offset away (desc_advance).
    const uint64_t desc_a0 = fh::desc_kmajor_sw128(smem_a + cw * 64 * 128);
    const uint64_t desc_b0 = fh::desc_kmajor_sw128(smem_b);
    float acc[Cfg::kBlockN / 2];
    fh::PipelineState<kStages> st, prev;

    auto release = [&](const fh::PipelineState<kStages>& s) {
      if (warp_leader) {
        if constexpr (kClusterM == 1) {
          pipe->consumer_release(s);
        } else {
#pragma unroll
          for (int r = 0; r < kClusterM; ++r) pipe->consumer_release_cluster(s, r);
        }
      }
    };

    for (int unit = first_unit; unit < num_units; unit += unit_stride) {
      int um, tn;
      unit_coords<kClusterM>(unit, units_m, tiles_n, um, tn);
      for (int kb = 0; kb < k_iters; ++kb) {
        pipe->consumer_wait(st);
        fh::wgmma_fence();  // the previous tile's epilogue read acc with ordinary code
#pragma unroll
        for (int kk = 0; kk < Cfg::kBlockK / 16; ++kk) {
          const uint64_t da = fh::desc_advance(desc_a0, st.stage * Cfg::kABytes + kk * 32);
          const uint64_t db = fh::desc_advance(desc_b0, st.stage * Cfg::kBBytes + kk * 32);
          fh::wgmma_ss<Cfg::kBlockN>(acc, da, db, kb > 0 || kk > 0);
        }
        fh::wgmma_commit();
        // Keep this stage's group in flight; the previous stage's group is done after this,
        // so its buffers go back to the producer while the tensor cores keep working.
        fh::wgmma_wait<1>();
        if (kb > 0) release(prev);
        prev = st;
        st.advance();
      }
      fh::wgmma_wait<0>();
      release(prev);
      fh::wgmma_fence_operand(acc);

      // Epilogue: fp32 -> bf16 straight from the accumulator layout. A quad of lanes writes 16
      // contiguous bytes of a row; the producer is already filling the next tile's stages.
      const int row0 = (um * kClusterM + cta_rank) * Cfg::kBlockM + cw * 64;
      const int col0 = tn * Cfg::kBlockN;
#pragma unroll
      for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
        const int r = row0 + fh::acc_row(4 * j, t);
        const int col = col0 + fh::acc_col(4 * j, t);
        uint32_t* p0 = reinterpret_cast<uint32_t*>(c + static_cast<size_t>(r) * n + col);
        uint32_t* p1 = reinterpret_cast<uint32_t*>(c + static_cast<size_t>(r + 8) * n + col);
        *p0 = fh::pack_bf16x2(acc[4 * j], acc[4 * j + 1]);
        *p1 = fh::pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
  }
  if constexpr (kClusterM > 1) {
    fh::cluster_sync();  // no CTA exits while its peer may still multicast into it / arrive on it
  }
}

template <int kClusterM>
int launch_gemm(const void* a, const void* b, void* c, int m, int n, int k, int num_ctas,
                cudaStream_t stream) {
  using Cfg = GemmConfig;
  if (m <= 0 || n <= 0 || k <= 0 || m % (Cfg::kBlockM * kClusterM) || n % Cfg::kBlockN ||
      k % Cfg::kBlockK) {
    return (int)cudaErrorInvalidValue;
  }
  CUtensorMap map_a, map_b;
  FBH_TRY(fh::make_tensor_map_2d(&map_a, a, fh::TmaType::kBf16, m, k, k, Cfg::kBlockM,
                                 Cfg::kBlockK, fh::TmaSwizzle::k128B));
  FBH_TRY(fh::make_tensor_map_2d(&map_b, b, fh::TmaType::kBf16, n, k, k,
                                 Cfg::kBlockN / kClusterM, Cfg::kBlockK, fh::TmaSwizzle::k128B));
  auto kernel = gemm_bf16_tn_kernel<kClusterM>;
  static bool configured = false;
  if (!configured) {
    FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes));
    configured = true;
  }
  const int units = (m / (Cfg::kBlockM * kClusterM)) * (n / Cfg::kBlockN);
  int ctas = num_ctas;
  if (ctas <= 0) {  // persistent: as many CTAs (clusters) as can be resident at once
    if (kClusterM == 1) {
      int dev = 0, sms = 0;
      FBH_TRY(cudaGetDevice(&dev));
      FBH_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      ctas = sms;
    } else {
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = kClusterM;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(units * kClusterM);
      cfg.blockDim = dim3(Cfg::kThreads);
      cfg.dynamicSmemBytes = Cfg::kSmemBytes;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      FBH_TRY(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
      if (clusters <= 0) return (int)cudaErrorInvalidConfiguration;
      ctas = clusters * kClusterM;
    }
  }
  ctas = min(ctas, units * kClusterM);
  ctas -= ctas % kClusterM;
  if (kClusterM == 1) {
    kernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_a, map_b,
                                                              static_cast<__nv_bfloat16*>(c), m, n, k);
  } else {
    FBH_TRY(fh::launch_with_cluster(kernel, dim3(ctas), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream,
                                    dim3(kClusterM, 1, 1), map_a, map_b,
                                    static_cast<__nv_bfloat16*>(c), m, n, k));
  }
  return (int)cudaGetLastError();
}

}  // namespace

// C[m][n] = A[m][k] B[n][k]^T, all bf16 row-major, fp32 accumulation. cluster_m: 1 or 2 (B tile
// multicast across 2 CTAs). num_ctas: 0 = persistent (one CTA per SM / max active clusters),
// otherwise the grid size (e.g. one CTA per tile). stream: a cudaStream_t (0 = legacy default).
FBH_EXPORT int fbh_gemm_bf16_tn(const void* a, const void* b, void* c, int m, int n, int k,
                                int cluster_m, int num_ctas, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (cluster_m) {
    case 1: return launch_gemm<1>(a, b, c, m, n, k, num_ctas, s);
    case 2: return launch_gemm<2>(a, b, c, m, n, k, num_ctas, s);
    default: return (int)cudaErrorInvalidValue;
  }
}
