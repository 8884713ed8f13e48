// Hopper forward (head dim 256): the kernel, its tensor maps and the launch.
//
// Kernel structure: 3 warpgroups of 128 threads, __launch_bounds__(384, 1) (168 registers each
// at entry, needed for setmaxnreg):
//   warpgroup 0      producer: setmaxnreg.dec to 24, one thread issues every TMA copy
//   warpgroups 1, 2  consumers (setmaxnreg 240), 64 query rows each
// See fwd_sm90_mainloop.cuh for the shared-memory plan and the GEMM operands.
#include <cuda.h>

#include <cstdlib>

#include <algorithm>

// A wrong barrier count or byte count would hang the GPU; trap instead after ~8 minutes of
// one wait (the same guard as the backward's, bwd_sm90_launch.cu).
#ifndef FLASHBACK_MBAR_TIMEOUT_CYCLES
#define FLASHBACK_MBAR_TIMEOUT_CYCLES 1000000000000ll
#endif

#include "fwd_sm90/fwd_sm90.h"
#include "fwd_sm90/fwd_sm90_mainloop.cuh"
#include "fwd_sm90/fwd_sm90_scheduler.cuh"
#include "hopper/hopper.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {
namespace {

using Traits = FwdSm90Traits<kFwdSm90Hdim256>;

// kPersistent (EXPERIMENTAL, FLASHBACK_FWD_PERSISTENT=1; bitwise the default's results on the
// GPU tests, but measured slower so far, see docs/perf-log.md): one CTA per SM walks tiles
// blockIdx.x, + gridDim.x, ... in the grid's order; the K/V ring and the Q barrier phases carry
// over, so the next tile's loads overlap this one's last P V and epilogue.
template <bool kPersistent>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ CUtensorMap map_q,
                    const __grid_constant__ CUtensorMap map_k,
                    const __grid_constant__ CUtensorMap map_v, const FwdSm90Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = fh::align_smem(smem_raw);
  uint64_t* q_bar = reinterpret_cast<uint64_t*>(smem + Traits::kOffBar);
  uint64_t* q_empty = reinterpret_cast<uint64_t*>(smem + Traits::kOffQEmpty);
  auto* pipe_k = reinterpret_cast<fh::TmaPipeline<Traits::kStages>*>(smem + Traits::kOffPipeK);
  auto* pipe_v = reinterpret_cast<fh::TmaPipeline<Traits::kStages>*>(smem + Traits::kOffPipeV);

  const int wg = fh::warpgroup_index();
  if (threadIdx.x == 0) {
    fh::tma_prefetch_map(&map_q);
    fh::tma_prefetch_map(&map_k);
    fh::tma_prefetch_map(&map_v);
    fh::mbar_init(q_bar, 1);
    fh::mbar_init(q_empty, 8);  // one arrival per consumer warp
    pipe_k->init(8);  // empty[s]: one arrival per consumer warp (2 warpgroups x 4 warps)
    pipe_v->init(8);
  }
  __syncthreads();

  const int first = static_cast<int>(blockIdx.x);
  const int step = kPersistent ? static_cast<int>(gridDim.x) : p.num_tiles;
  if (!kPersistent && !fwd_sm90_work<Traits::kBlockM, Traits::kBlockN>(p, first).active) {
    return;  // varlen: past the end of a shorter sequence (the whole CTA)
  }
  fh::PipelineState<Traits::kStages> st;
  int q_loads = 0;
  if (wg == 0) {
    fh::setmaxnreg_dec<kFwdSm90Hdim256.producer_regs>();
    if (threadIdx.x == 0) {
      const FwdSm90Maps maps{&map_q, &map_k, &map_v};
      for (int id = first; id < p.num_tiles; id += step) {
        const FwdSm90Work w = fwd_sm90_work<Traits::kBlockM, Traits::kBlockN>(p, id);
        if (w.active) fwd_sm90_producer<Traits>(p, maps, w, smem, q_bar, q_empty, pipe_k, pipe_v, st, q_loads);
        if (!kPersistent) break;
      }
    }
  } else {
    fh::setmaxnreg_inc<kFwdSm90Hdim256.consumer_regs>();
    // Shared-memory descriptors of this warpgroup's Q rows and of the first K / V stage, made
    // once: later stages are fixed offsets from them.
    const uint64_t desc_q = fh::desc_kmajor_sw128(smem + Traits::kOffQ + 64 * (wg - 1) * 128);
    const uint64_t desc_k0 = fh::desc_kmajor_sw128(smem + Traits::kOffK);
    const uint64_t desc_v0 = fh::desc_mnmajor_sw128(smem + Traits::kOffV, Traits::kKvAtomBytes);
    for (int id = first; id < p.num_tiles; id += step) {
      const FwdSm90Work w = fwd_sm90_work<Traits::kBlockM, Traits::kBlockN>(p, id);
      if (w.active) {
        fwd_sm90_consumer<Traits, kPersistent>(p, w, smem, q_bar, q_empty, pipe_k, pipe_v, wg - 1, st,
                                               q_loads, desc_q, desc_k0, desc_v0);
      }
      if (!kPersistent) break;
    }
  }
}

bool fwd_persistent() {
  static const bool on = env_switch("FLASHBACK_FWD_PERSISTENT");
  return on;
}

}  // namespace

bool fwd_sm90_can_implement(const flashback_fwd_params& p, const char** why) {
  const char* reason = nullptr;
  if (p.headdim != 256) {
    reason = "headdim is not 256";
  } else if (p.dtype != FLASHBACK_DTYPE_BF16) {
    reason = "dtype is not bf16";
  } else if (int64_t{(p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM} * p.nheads * p.batch >
             int64_t{0x7fffffff}) {
    reason = "grid too large (batch x nheads x query blocks of the longest sequence)";
  } else {
    // out and lse are written with 16- and 4-byte stores (the API checks their alignment).
    const void* ptrs[3] = {p.q, p.k, p.v};
    const flashback_strides sts[3] = {map_strides(p.q_strides, p, true), map_strides(p.k_strides, p, false),
                                      map_strides(p.v_strides, p, false)};
    tma_layout_ok(ptrs, sts, 3, &reason);
  }
  if (why) *why = reason;
  return reason == nullptr;
}

cudaError_t run_fwd_sm90(const flashback_fwd_params& p, cudaStream_t stream) {
  CUtensorMap map_q, map_k, map_v;
  bool hi[3];
  constexpr uint32_t kRowsQ = Traits::kBlockM, kRowsKv = Traits::kBlockN;
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
  kp.m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  kp.n_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  // (batch, q head) pairs whose K and V (1 KB per key row and kv head) fill ~32 MB of L2.
  const int pairs = p.batch * p.nheads;
  kp.l2_group = std::max(1, std::min(pairs, 32768 * kp.group / std::max(1, p.seqlen_k)));
  kp.causal = p.causal ? 1 : 0;
  kp.head_inner = (hi[0] ? 1 : 0) | (hi[1] ? 2 : 0) | (hi[2] ? 4 : 0);
  kp.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  kp.softmax_scale = p.softmax_scale;
  kp.out = p.out;
  kp.out_strides = p.out_strides;
  kp.lse = static_cast<float*>(p.lse);
  kp.cu_seqlens_q = p.cu_seqlens_q;
  kp.cu_seqlens_k = p.cu_seqlens_k;
  kp.total_q = p.total_q;

  kp.num_tiles = kp.m_blocks * p.nheads * p.batch;
  const bool persistent = fwd_persistent();
  const auto kernel = persistent ? fwd_sm90_kernel<true> : fwd_sm90_kernel<false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(Traits::kSmemBytes));
  if (err != cudaSuccess) return err;
  int ctas = kp.num_tiles;
  if (persistent) {
    int resident = 1;
    err = resident_ctas(kernel, Traits::kThreads, Traits::kSmemBytes, &resident);
    if (err != cudaSuccess) return err;
    ctas = std::min(ctas, resident);
  }
  kernel<<<dim3(ctas), Traits::kThreads, Traits::kSmemBytes, stream>>>(map_q, map_k, map_v, kp);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace flashback
