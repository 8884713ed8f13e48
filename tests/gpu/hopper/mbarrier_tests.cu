// mbarrier tests: phase/parity rules and tx accounting, an N-stage TMA producer/consumer ring
// (TmaPipeline) with two consumer warpgroups, and named barriers between warpgroups.
#include <type_traits>

#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

__device__ void spin_cycles(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// One try_wait whose answer is known before the caller goes on. Needed because SYNCS.PHASECHK
// (try_wait) returns its predicate asynchronously and ptxas may issue the caller's next mbarrier
// operation before it: inlined, a try_wait followed by complete_tx was seen on an H200 to report
// the phase state *after* that complete_tx. The call boundary forces the order.
__device__ __noinline__ int observe(uint64_t* bar, uint32_t parity) {
  return fh::mbar_try_wait(bar, parity) ? 1 : 0;
}

// try_wait until true or `tries` attempts: 1 if the phase completed.
__device__ __noinline__ int poll(uint64_t* bar, uint32_t parity, int tries = 100000) {
  for (int i = 0; i < tries; ++i)
    if (fh::mbar_try_wait(bar, parity)) return 1;
  return 0;
}

// Records try_wait results that the parity rules predict (see test_hopper_mbarrier.py).
__global__ void mbarrier_phase_kernel(int* out) {
  __shared__ uint64_t bar, txbar;
  const int t = threadIdx.x;
  if (t == 0) {
    fh::mbar_init(&bar, blockDim.x);
    fh::mbar_init(&txbar, 1);
    fh::fence_mbarrier_init();
  }
  __syncthreads();
  int k = 0;
  for (int p = 0; p < 4; ++p) {
    const uint32_t parity = p & 1;
    if (t == 0) {
      out[k] = observe(&bar, parity);          // current phase: not complete
      out[k + 1] = observe(&bar, parity ^ 1);  // preceding phase: complete
    }
    k += 2;
    __syncthreads();
    fh::mbar_arrive(&bar);
    fh::mbar_wait(&bar, parity);
    if (t == 0) out[k] = observe(&bar, parity);  // now complete
    k += 1;
    __syncthreads();
  }
  if (t == 0) {
    // Phase 0 of txbar: one arrival with 256 bytes announced, the bytes delivered in two halves.
    fh::mbar_arrive_expect_tx(&txbar, 256);
    out[k++] = observe(&txbar, 0);  // 256 outstanding
    fh::mbar_complete_tx(&txbar, 128);
    out[k++] = observe(&txbar, 0);  // 128 outstanding
    fh::mbar_complete_tx(&txbar, 128);
    out[k++] = poll(&txbar, 0);     // complete
    // Phase 1: bytes announced with expect_tx (no arrival), then a plain arrival.
    fh::mbar_expect_tx(&txbar, 64);
    out[k++] = observe(&txbar, 1);  // arrival missing
    fh::mbar_arrive(&txbar);
    out[k++] = observe(&txbar, 1);  // 64 outstanding
    fh::mbar_complete_tx(&txbar, 64);
    out[k++] = poll(&txbar, 1);     // complete
  }
}

// Streams `ntiles` fp32 tiles of 64 x 32 through a ring of Stages buffers: warp 0 of warpgroup 0
// is the TMA producer, warpgroups 1 and 2 each copy half of every tile to dst. Consumers dawdle
// on some tiles so that a producer that refilled a stage too early would corrupt the output.
// Both sides wait in style S (hopper/wait_style.h): the dawdling makes waits that find their
// phase complete and waits that spin (and, with kTryFirstSleep, sleep in the try).
template <int Stages, fh::WaitStyle S>
__global__ void __launch_bounds__(384, 1)
    pipeline_kernel(const __grid_constant__ CUtensorMap map, float* dst, int ntiles) {
  constexpr uint32_t kTileBytes = 64 * 32 * 4;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* stages = fh::align_smem(smem_raw);
  __shared__ fh::TmaPipeline<Stages> pipe;
  if (threadIdx.x == 0) pipe.init(8);  // one arrival per consumer warp (2 warpgroups x 4)
  __syncthreads();
  const int wg = fh::warpgroup_index();
  if (wg == 0) {
    if (threadIdx.x < 32 && fh::elect_one()) {
      fh::PipelineState<Stages> st;
      for (int t = 0; t < ntiles; ++t) {
        pipe.template producer_acquire<S>(st);
        pipe.producer_expect(st, kTileBytes);
        fh::tma_load_2d(stages + st.stage * kTileBytes, &map, pipe.full_barrier(st), 0, t * 64);
        st.advance();
      }
    }
  } else {
    const int c = wg - 1;
    const int i = threadIdx.x % 128;
    fh::PipelineState<Stages> st;
    for (int t = 0; t < ntiles; ++t) {
      pipe.template consumer_wait<S>(st);
      if ((t + c) % 3 == 0) spin_cycles(2000);
      const float* tile = reinterpret_cast<const float*>(stages + st.stage * kTileBytes);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int idx = c * 1024 + e * 128 + i;
        dst[static_cast<size_t>(t) * 2048 + idx] = tile[idx];
      }
      __syncwarp();
      if (threadIdx.x % 32 == 0) pipe.consumer_release(st);
      st.advance();
    }
  }
}

// Warpgroup 1 writes a buffer and signals with bar.arrive(1); warpgroup 2 waits with bar.sync(1),
// reads it (each thread a value another thread wrote) and hands the buffer back with
// bar.arrive(2). Warpgroup 0 takes no part: named barriers count only their participants.
__global__ void __launch_bounds__(384, 1) named_barrier_kernel(const float* in, float* out,
                                                               int rounds) {
  __shared__ float buf[128];
  const int wg = fh::warpgroup_index();
  const int i = threadIdx.x % 128;
  if (wg == 1) {
    for (int r = 0; r < rounds; ++r) {
      if (r > 0) fh::named_bar_sync(2, 256);  // reader done with the previous round
      spin_cycles(1000 + 37 * i);             // make an early reader see stale data
      buf[i] = in[r * 128 + i] * 2.0f;
      fh::named_bar_arrive(1, 256);
    }
  } else if (wg == 2) {
    for (int r = 0; r < rounds; ++r) {
      fh::named_bar_sync(1, 256);
      out[r * 128 + i] = buf[(i * 37 + 5) % 128] + static_cast<float>(r);
      if (r + 1 < rounds) fh::named_bar_arrive(2, 256);
    }
  }
}

}  // namespace

FBH_EXPORT int fbh_mbarrier_phases(int* out) {
  mbarrier_phase_kernel<<<1, 128>>>(out);
  return (int)cudaGetLastError();
}

// src: fp32 [ntiles * 64][32] -> dst, same shape, through a ring of `stages` (1..4) buffers,
// waiting in WaitStyle `style` (0..2).
FBH_EXPORT int fbh_pipeline_copy(const float* src, float* dst, int ntiles, int stages, int style) {
  CUtensorMap map;
  FBH_TRY(fh::make_tensor_map_2d(&map, src, fh::TmaType::kF32, (uint64_t)ntiles * 64, 32, 32, 64,
                                 32, fh::TmaSwizzle::kNone));
  const size_t smem = stages * 64 * 32 * 4 + 1024;
  auto go = [&](auto kernel) -> int {
    FBH_TRY(fbh_test::allow_smem(reinterpret_cast<const void*>(kernel), smem));
    kernel<<<1, 384, smem>>>(map, dst, ntiles);
    return (int)cudaGetLastError();
  };
  auto of_style = [&](auto stages_c) -> int {
    constexpr int kStages = decltype(stages_c)::value;
    switch (style) {
      case 0: return go(pipeline_kernel<kStages, fh::WaitStyle::kSpin>);
      case 1: return go(pipeline_kernel<kStages, fh::WaitStyle::kTryFirst>);
      case 2: return go(pipeline_kernel<kStages, fh::WaitStyle::kTryFirstSleep>);
      default: return (int)cudaErrorInvalidValue;
    }
  };
  switch (stages) {
    case 1: return of_style(std::integral_constant<int, 1>{});
    case 2: return of_style(std::integral_constant<int, 2>{});
    case 3: return of_style(std::integral_constant<int, 3>{});
    case 4: return of_style(std::integral_constant<int, 4>{});
    default: return (int)cudaErrorInvalidValue;
  }
}

// in: fp32 [rounds][128]; out[r][i] = 2 * in[r][(37 i + 5) % 128] + r.
FBH_EXPORT int fbh_named_barrier(const float* in, float* out, int rounds) {
  named_barrier_kernel<<<1, 384>>>(in, out, rounds);
  return (int)cudaGetLastError();
}
