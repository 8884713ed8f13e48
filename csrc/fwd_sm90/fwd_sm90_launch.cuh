// Hopper forward: the kernel, its tensor maps and the launch of one config and dtype. A
// template: the instances live in fwd_sm90_hdim*.cu, the table that picks one in
// fwd_sm90_launch.cu.
//
// Kernel structure: 1 + consumer_wgs warpgroups of 128 threads, __launch_bounds__(threads, 1)
// (65536 / threads registers each at entry, the pool setmaxnreg redistributes):
//   warpgroup 0      producer: setmaxnreg.dec to producer_regs, one thread issues every TMA copy
//   warpgroups 1..   consumers (setmaxnreg.inc to consumer_regs), 64 query rows each
// See fwd_sm90_mainloop.cuh for the shared-memory plan and the GEMM operands.
#pragma once

#include <cuda.h>

#include <algorithm>

#include "sm90/sm90_hang_guard.h"  // first: before anything includes the Hopper layer

#include "fwd_sm90/fwd_sm90.h"
#include "fwd_sm90/fwd_sm90_mainloop.cuh"
#include "fwd_sm90/fwd_sm90_scheduler.cuh"
#include "hopper/hopper.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

// A consumer warpgroup's tiles: next_id() gives its next tile id (the static stride, or either
// ring), every consumer thread calling it at the same points; an id past the last tile ends the
// loop, and a tile past the end of a shorter sequence (varlen) is skipped by all.
template <class T, class NextId>
__device__ __forceinline__ void fwd_sm90_consumer_tiles(const FwdSm90Params& p, uint8_t* smem,
                                                        fh::TmaPipeline<T::kQStages>* pipe_q,
                                                        fh::TmaPipeline<T::kStages>* pipe_k,
                                                        fh::TmaPipeline<T::kStages>* pipe_v,
                                                        int wg, const CUtensorMap* map_o,
                                                        NextId next_id) {
  fh::PipelineState<T::kQStages> sq;
  fh::PipelineState<T::kStages> st;
  bool turns_open = false;  // pingpong_across_tiles: the rotation has been opened
  for (;;) {
    const int id = next_id();
    if (id >= p.num_tiles) break;
    const FwdSm90Work w = fwd_sm90_work<T::kBlockM, T::kBlockN, T::kFastTileDecode>(p, id);
    if (w.active) fwd_sm90_consumer<T>(p, w, smem, pipe_q, sq, pipe_k, pipe_v, st, wg, map_o, turns_open);
  }
  if constexpr (T::kPingpong && T::kPingpongAcrossTiles) {
    // The last warpgroup's last hand-on, so that the barrier's last phase completes.
    if (turns_open && wg == 0) fh::named_bar_sync(T::kBarTurn0, 256);
  }
}

// dynamic_tiles: the persistent grid's tile loop with the ids from p.tile_counter. CTA c starts
// with tile c; its producer thread fetches the next id (one atomicAdd, issued before the tile's
// loads so that its latency hides under them; late_tile_fetch: after them, hidden by the tile's
// last kv_stages key blocks, which the consumers still have to run) and hands every id to the
// consumer warps through a 2-slot ring (an id written, then the slot's full barrier; freed by
// one arrival per consumer warp). An id past the last tile ends the loop of everyone.
template <class T>
__device__ __forceinline__ void fwd_sm90_dynamic_tiles(const FwdSm90Params& p,
                                                       const CUtensorMap& map_q,
                                                       const CUtensorMap& map_k,
                                                       const CUtensorMap& map_v,
                                                       const CUtensorMap& map_o, uint8_t* smem,
                                                       fh::TmaPipeline<T::kQStages>* pipe_q,
                                                       fh::TmaPipeline<T::kStages>* pipe_k,
                                                       fh::TmaPipeline<T::kStages>* pipe_v,
                                                       int wg) {
  auto* pipe_tile = reinterpret_cast<fh::TmaPipeline<2>*>(smem + T::kOffPipeTile);
  // The ring's slots are written and read with shared-memory atomics: its mbarriers order them
  // already (an arrive releases, a wait acquires), but compute-sanitizer racecheck does not
  // follow mbarrier phases and reported every plain access to the slots (the producer's store
  // against the consumers' reads of the slot's previous use); it does not report atomics. One
  // atomic per consumer warp per tile; measured neutral (docs/perf-log.md).
  int* ids_rw = reinterpret_cast<int*>(smem + T::kOffTileIds);
  fh::PipelineState<2> sr;
  if (wg == 0) {
    fh::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x != 0) return;
    const FwdSm90Maps maps{&map_q, &map_k, &map_v};
    fh::PipelineState<T::kQStages> sq;
    fh::PipelineState<T::kStages> st;
    int id = static_cast<int>(blockIdx.x);
    for (;;) {
      pipe_tile->template producer_acquire<T::kWaitStyle>(sr);
      atomicExch(ids_rw + sr.stage, id);
      fh::mbar_arrive(pipe_tile->full_barrier(sr));  // releases the id's store
      sr.advance();
      if (id >= p.num_tiles) break;
      int next = 0;
      if constexpr (!T::kLateTileFetch) next = static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);
      const FwdSm90Work w = fwd_sm90_work<T::kBlockM, T::kBlockN, T::kFastTileDecode>(p, id);
      if (w.active) fwd_sm90_producer<T>(p, maps, w, smem, pipe_q, sq, pipe_k, pipe_v, st);
      if constexpr (T::kLateTileFetch) next = static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);
      id = next;
    }
  } else {
    fh::setmaxnreg_inc<T::kConsumerRegs>();
    const bool warp_leader = (threadIdx.x % 32) == 0;
    auto next_id = [&] {
      pipe_tile->template consumer_wait<T::kWaitStyle>(sr);
      // One read per warp (same-address atomics of a warp's lanes serialize), broadcast.
      int id = 0;
      if (warp_leader) id = atomicAdd(ids_rw + sr.stage, 0);
      id = __shfl_sync(0xffffffffu, id, 0);
      __syncwarp();  // every lane's read before the leader frees the slot
      if (warp_leader) pipe_tile->consumer_release(sr);
      sr.advance();
      return id;
    };
    fwd_sm90_consumer_tiles<T>(p, smem, pipe_q, pipe_k, pipe_v, wg - 1, &map_o, next_id);
  }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ CUtensorMap map_q,
                    const __grid_constant__ CUtensorMap map_k,
                    const __grid_constant__ CUtensorMap map_v,
                    const __grid_constant__ CUtensorMap map_o, const FwdSm90Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = fh::align_smem(smem_raw);
  auto* pipe_q = reinterpret_cast<fh::TmaPipeline<T::kQStages>*>(smem + T::kOffPipeQ);
  auto* pipe_k = reinterpret_cast<fh::TmaPipeline<T::kStages>*>(smem + T::kOffPipeK);
  auto* pipe_v = reinterpret_cast<fh::TmaPipeline<T::kStages>*>(smem + T::kOffPipeV);

  const int wg = fh::warpgroup_index();
  if (threadIdx.x == 0) {
    fh::tma_prefetch_map(&map_q);
    fh::tma_prefetch_map(&map_k);
    fh::tma_prefetch_map(&map_v);
    if constexpr (T::kTmaStoreO) {
      if (p.out_tma) fh::tma_prefetch_map(&map_o);
    }
    pipe_q->init(T::kConsumerWarps);  // empty[s]: one arrival per consumer warp after its O left
    pipe_k->init(T::kConsumerWarps);  // empty[s]: one arrival per consumer warp
    pipe_v->init(T::kConsumerWarps);
    if constexpr (T::kDynamic) {
      // full[s]: the producer's arrive after it wrote the id; empty[s]: one per consumer warp
      reinterpret_cast<fh::TmaPipeline<2>*>(smem + T::kOffPipeTile)->init(T::kConsumerWarps);
    }
    if constexpr (T::kOOverV) {
      // empty: one arrival per consumer warp after its O rows left the V stages
      reinterpret_cast<fh::TmaPipeline<1>*>(smem + T::kOffPipeO)->init(T::kConsumerWarps);
    }
  }
  __syncthreads();
  if constexpr (T::kDynamic) {
    if (p.tile_counter != nullptr) {
      fwd_sm90_dynamic_tiles<T>(p, map_q, map_k, map_v, map_o, smem, pipe_q, pipe_k, pipe_v, wg);
      return;
    }
  }

  // Tiles blockIdx.x, + gridDim.x, ...: one per CTA unless the launch is persistent (a grid of
  // one CTA per SM). Every thread computes the same work item, so all skip the same ones.
  if (wg == 0) {
    fh::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      const FwdSm90Maps maps{&map_q, &map_k, &map_v};
      fh::PipelineState<T::kQStages> sq;
      fh::PipelineState<T::kStages> st;
      for (int id = blockIdx.x; id < p.num_tiles; id += gridDim.x) {
        const FwdSm90Work w = fwd_sm90_work<T::kBlockM, T::kBlockN, T::kFastTileDecode>(p, id);
        if (w.active) fwd_sm90_producer<T>(p, maps, w, smem, pipe_q, sq, pipe_k, pipe_v, st);
      }
    }
  } else {
    fh::setmaxnreg_inc<T::kConsumerRegs>();
    int id = static_cast<int>(blockIdx.x) - static_cast<int>(gridDim.x);
    auto next_id = [&] { return id += static_cast<int>(gridDim.x); };
    fwd_sm90_consumer_tiles<T>(p, smem, pipe_q, pipe_k, pipe_v, wg - 1, &map_o, next_id);
  }
}

template <class T>
cudaError_t run_fwd_sm90_config(const flashback_fwd_params& p, cudaStream_t stream) {
  CUtensorMap map_q, map_k, map_v;
  bool hi[3];
  constexpr uint32_t kRowsQ = T::kBlockM, kRowsKv = T::kBlockN;
  if (make_call_map(&map_q, &hi[0], p.q, p.q_strides, p, true, kRowsQ) != cudaSuccess ||
      make_call_map(&map_k, &hi[1], p.k, p.k_strides, p, false, kRowsKv) != cudaSuccess ||
      make_call_map(&map_v, &hi[2], p.v, p.v_strides, p, false, kRowsKv) != cudaSuccess) {
    return cudaErrorNotSupported;  // nothing launched: the caller takes the reference path
  }
  FwdSm90Params kp;
  kp.batch = p.batch;
  kp.seqlen_q = p.seqlen_q;
  kp.seqlen_k = p.seqlen_k;
  kp.nheads = p.nheads;
  kp.nheads_k = p.nheads_k;
  kp.group = p.nheads / p.nheads_k;
  kp.m_blocks = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  kp.n_blocks = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  // (batch, q head) pairs whose K and V (4 d bytes per key row and kv head) fill
  // kFwdSm90L2's MB of L2 (short_kv_mb up to short_keys keys).
  const int pairs = p.batch * p.nheads;
  const int64_t kv_bytes_per_pair = int64_t{4} * T::kHeadDim * std::max(1, p.seqlen_k);
  // Without causal masking every Q block of a pair walks the same K/V: the Q blocks of one pair
  // go fastest (a group of one pair), so the CTAs sharing a K/V block run at the same time and
  // it comes from DRAM once. Causal keeps the groups for its longest-first order.
  const int l2_mb = p.seqlen_k <= kFwdSm90L2.short_keys ? kFwdSm90L2.short_kv_mb
                                                         : kFwdSm90L2.causal_kv_mb;
  kp.l2_group = p.causal ? static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(pairs, (int64_t{l2_mb} << 20) * kp.group / kv_bytes_per_pair))) : 1;
  kp.causal = p.causal ? 1 : 0;
  kp.k_ahead = fwd_sm90_k_ahead(p) ? 1 : 0;
  // tma_store_o: a map for out with boxes of one warpgroup's 64 rows, where out's layout suits
  // TMA (the API asks only for 16-byte alignment); else every thread copies O out.
  CUtensorMap map_o;
  bool hi_o = false;
  kp.out_tma = 0;
  if constexpr (T::kTmaStoreO) {
    const flashback_strides out_st = map_strides(p.out_strides, p, true);
    const char* why = nullptr;
    const void* out_ptr = p.out;
    if (tma_layout_ok(&out_ptr, &out_st, 1, &why) &&
        make_call_map(&map_o, &hi_o, p.out, p.out_strides, p, true, 64) == cudaSuccess) {
      kp.out_tma = 1;
    }
  }
  if (!kp.out_tma) map_o = map_q;  // not read (a defined value for the kernel argument)
  kp.head_inner = (hi[0] ? 1 : 0) | (hi[1] ? 2 : 0) | (hi[2] ? 4 : 0) | (hi_o ? 8 : 0);
  kp.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  kp.softmax_scale = p.softmax_scale;
  kp.out = p.out;
  kp.out_strides = p.out_strides;
  kp.lse = static_cast<float*>(p.lse);
  kp.cu_seqlens_q = p.cu_seqlens_q;
  kp.cu_seqlens_k = p.cu_seqlens_k;
  kp.total_q = p.total_q;
  kp.num_tiles = kp.m_blocks * p.nheads * p.batch;
  kp.groups = (pairs + kp.l2_group - 1) / kp.l2_group;
  kp.div_group_tiles = FastDiv::of(static_cast<uint32_t>(kp.l2_group) * kp.m_blocks);
  kp.div_group = FastDiv::of(kp.l2_group);
  kp.div_last_group = FastDiv::of(pairs - (kp.groups - 1) * kp.l2_group);
  kp.div_heads = FastDiv::of(p.nheads);

  kp.tile_counter = nullptr;

  const auto kernel = fwd_sm90_kernel<T>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(T::kSmemBytes));
  if (err != cudaSuccess) return err;
  if constexpr (T::kDynamic) {
    // The counter: 4 bytes from the stream-ordered allocator, zeroed, freed after the kernel
    // (all in stream order, so concurrent streams never share one and graph capture records
    // them as nodes). Without a stream-ordered pool the static stride below runs instead.
    if (fwd_sm90_dynamic(p)) {
      if (cudaMallocAsync(reinterpret_cast<void**>(&kp.tile_counter), sizeof(int), stream) ==
          cudaSuccess) {
        err = cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream);
        if (err == cudaSuccess) {
          const int grid = std::min(kp.num_tiles, fwd_sm90_sm_count());
          kernel<<<dim3(grid), T::kThreads, T::kSmemBytes, stream>>>(map_q, map_k, map_v, map_o, kp);
          err = cudaGetLastError();
        }
        const cudaError_t freed = cudaFreeAsync(kp.tile_counter, stream);
        return err != cudaSuccess ? err : freed;
      }
      (void)cudaGetLastError();  // the declined cudaMallocAsync's error, so it is not reported later
      kp.tile_counter = nullptr;
    }
  }
  const int grid = fwd_sm90_persistent(p) ? std::min(kp.num_tiles, fwd_sm90_sm_count()) : kp.num_tiles;
  kernel<<<dim3(grid), T::kThreads, T::kSmemBytes, stream>>>(map_q, map_k, map_v, map_o, kp);
  return cudaGetLastError();
}

// The config that serves a call of one head dim (its row's configs: causal, Full, FullLong and
// Multi, references where two are one config): the Multi config for calls a persistent grid
// serves, where it is a config of its own; else the causal config for calls with the mask, the
// FullLong config past the grid row's full_long_keys, and Full. A template, so that branches
// its configs rule out are not compiled: where two configs are one object they are one instance,
// and where the grid row sends every call to the Multi config (d = 192) only that one exists.
template <const FwdSm90Config& kCausal, const FwdSm90Config& kFull, const FwdSm90Config& kFullLong,
          const FwdSm90Config& kMulti, Dtype kDtype>
cudaError_t run_fwd_sm90_entry(const flashback_fwd_params& p, cudaStream_t stream) {
  constexpr bool kOwnMulti = &kMulti != &kCausal;
  if constexpr (kOwnMulti && fwd_sm90_multi_takes_all(fwd_sm90_grid_row(kCausal.head_dim))) {
    return run_fwd_sm90_config<FwdSm90Traits<kMulti, kDtype>>(p, stream);
  } else {
    if constexpr (kOwnMulti) {
      if (fwd_sm90_multi_tile(p)) return run_fwd_sm90_config<FwdSm90Traits<kMulti, kDtype>>(p, stream);
    }
    if (p.causal) return run_fwd_sm90_config<FwdSm90Traits<kCausal, kDtype>>(p, stream);
    if constexpr (&kFullLong != &kFull) {
      if (fwd_sm90_full_long(p)) return run_fwd_sm90_config<FwdSm90Traits<kFullLong, kDtype>>(p, stream);
    }
    return run_fwd_sm90_config<FwdSm90Traits<kFull, kDtype>>(p, stream);
  }
}

// The entry points of head dim D's instances, bf16 and fp16 (in fwd_sm90_hdim<D>.cu; the table in
// fwd_sm90_launch.cu declares them).
#define FLASHBACK_FWD_SM90_ENTRY(D, DT, DTYPE)                                                     \
  cudaError_t run_fwd_sm90_hdim##D##_##DT(const flashback_fwd_params& p, cudaStream_t stream) { \
    return run_fwd_sm90_entry<kFwdSm90Hdim##D, kFwdSm90Hdim##D##Full, kFwdSm90Hdim##D##FullLong, \
                              kFwdSm90Hdim##D##Multi, DTYPE>(p, stream);                         \
  }
#define FLASHBACK_FWD_SM90_INSTANCES(D)                                                   \
  static_assert(kFwdSm90Hdim##D##Full.consumer_wgs == kFwdSm90Hdim##D.consumer_wgs &&      \
                    kFwdSm90Hdim##D##Full.head_dim == kFwdSm90Hdim##D.head_dim,           \
                "can_implement reads the causal config's query rows per tile");           \
  static_assert(kFwdSm90Hdim##D##FullLong.consumer_wgs == kFwdSm90Hdim##D.consumer_wgs &&  \
                    kFwdSm90Hdim##D##FullLong.head_dim == kFwdSm90Hdim##D.head_dim,       \
                "can_implement reads the causal config's query rows per tile");           \
  static_assert(kFwdSm90Hdim##D##Multi.consumer_wgs == kFwdSm90Hdim##D.consumer_wgs &&     \
                    kFwdSm90Hdim##D##Multi.head_dim == kFwdSm90Hdim##D.head_dim,          \
                "can_implement reads the causal config's query rows per tile");           \
  FLASHBACK_SM90_IF_BF16(FLASHBACK_FWD_SM90_ENTRY(D, bf16, Dtype::kBf16))                 \
  FLASHBACK_SM90_IF_FP16(FLASHBACK_FWD_SM90_ENTRY(D, fp16, Dtype::kF16))

}  // namespace sm90
}  // namespace flashback
