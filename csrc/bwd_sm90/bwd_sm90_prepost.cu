// Pre- and postprocess kernels of the Hopper backward, templated on head dim and dtype (those
// the build compiles, sm90_family.h).
//
// (0) preprocess, d / 8 lanes per Q row (d = 192: one warp per row): D_i = rowsum(dO_i * O_i) and
//     LSE_i * log2(e), written to workspace rows padded to whole main-kernel steps (padding: D = 0,
//     LSE = +inf, so padded rows give P = exp2(S * scale_log2 - inf) = 0 and the main kernel needs
//     no row bounds for them), and the zeroing of the dQaccum tiles (and turn counters) the main
//     kernel adds into.
// postprocess, one CTA per (64-row tile, head, batch): dQ = scale * dQaccum to bf16 / fp16. dQaccum
//     holds each 64 x d tile in the order the main kernel's dQ^T accumulators add it (see
//     bwd_sm90_epilogue.cuh), so that its atomics cover whole 128-byte lines; this kernel maps
//     (atom-column, group, thread, element) back to (query row, head-dim column).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include <cmath>

#include "sm90/sm90_hang_guard.h"  // first: before anything includes the Hopper layer

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_prepost.h"
#include "common/sequence.cuh"
#include "hopper/common.h"
#include "hopper/dtype.h"
#include "hopper/mbarrier.h"
#include "hopper/pdl.h"
#include "sm90/sm90_common.h"
#include "sm90/sm90_family.h"

namespace flashback {
namespace sm90 {
namespace {

namespace fh = flashback::hopper;
using hopper::Dtype;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kPreThreads = 256;
constexpr int kRowsPerCta = kPreThreads / 32;  // one row per warp

// Two 16-bit elements (one 32-bit word) to floats.
template <Dtype E>
__device__ __forceinline__ float2 to_float2(uint32_t bits) {
  if constexpr (E == Dtype::kF16) {
    __half2 h;
    memcpy(&h, &bits, 4);
    return __half22float2(h);
  } else {
    __nv_bfloat162 h;
    memcpy(&h, &bits, 4);
    return __bfloat1622float2(h);
  }
}

template <Dtype E>
__device__ __forceinline__ uint16_t from_float(float x) {
  if constexpr (E == Dtype::kF16) {
    return __half_as_ushort(__float2half_rn(x));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
}

// d = 192 (the head dim 16-byte lanes would not divide; the others run by lanes, below): lane l of
// a row's warp reads elements 2 (l + 32 i), +1 for i < d / 64, coalesced 128-byte words. A warp
// takes one row and issues every load of it, LSE included, before any arithmetic: the kernel is a
// few memory latencies per CTA. (Four rows per warp, for more bytes in flight, measured -0.5..+0.4%
// at d = 256: docs/perf-log.md, "The runbook measured".) It also zeroes dQaccum and the
// deterministic mode's turn counters, which a memset did before it (+0.5..+1.0% at seqlen
// 512-2048).
// dq_post_queue (kPost): the queue's counters and slots set (DqPostQueue), by CTA x = 0 of each
// (q head < kv heads, batch), before any of its rows can return.
__device__ __forceinline__ void set_post_queue(const DqPostQueue& post, int nheads_k) {
  const int head = blockIdx.y;
  if (blockIdx.x != 0 || threadIdx.x != 0 || head >= nheads_k) return;
  const int pair = static_cast<int>(blockIdx.z) * nheads_k + head;
  *post.done(pair) = 0;
  *post.queue(pair) = -1;
  for (int i = pair; i < post.split_count; i += post.pairs) post.split_done[i] = 0;
  if (pair == 0) {
    *post.tail() = 0;
    *post.claim() = 0;
  }
}

template <int kHeadDim, Dtype E, bool kPost>
__global__ void __launch_bounds__(kPreThreads)
    bwd_sm90_preprocess_kernel(const flashback_bwd_params p, int rows_padded, DqTiles tiles,
                               float* lse_log2, float* dsum, float* dq_accum, int* dq_turn,
                               DqPostQueue post) {
  constexpr int kWords = kHeadDim / 64;  // 32-bit words per lane per row and tensor
  // The main kernel (the dependent, hopper/pdl.h) may be scheduled once every CTA here has
  // started; it waits for this grid's end before it reads what this one writes.
  if (threadIdx.x == 0) fh::launch_dependents();
  if constexpr (kPost) set_post_queue(post, p.nheads_k);
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row = blockIdx.x * kRowsPerCta + warp;
  const SeqRows seq = seq_rows(p, batch);
  // Only this sequence's own tiles, whole steps of them (varlen: the next tiles are the next
  // sequence's); rows_padded bounds the grid's last CTA.
  const int step_rows = tiles.step_tiles * kDqTileRows;
  const int rows_end = min(rows_padded, (seq.seqlen_q + step_rows - 1) / step_rows * step_rows);
  uint32_t o_w[kWords], do_w[kWords];
  float lse = INFINITY;  // rows past seqlen_q: P = 0 in the main kernel
#pragma unroll
  for (int i = 0; i < kWords; ++i) o_w[i] = do_w[i] = 0;
  if (row < seq.seqlen_q) {  // (row < rows_end: seqlen_q <= rows_end unless rows_padded cuts it)
    const uint32_t* o = reinterpret_cast<const uint32_t*>(
        static_cast<const uint16_t*>(p.out) + seq.q_offset(p.out_strides) +
        head * p.out_strides.head + row * p.out_strides.row);
    const uint32_t* dout = reinterpret_cast<const uint32_t*>(
        static_cast<const uint16_t*>(p.dout) + seq.q_offset(p.dout_strides) +
        head * p.dout_strides.head + row * p.dout_strides.row);
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      o_w[i] = o[lane + 32 * i];
      do_w[i] = dout[lane + 32 * i];
    }
    if (lane == 0) lse = p.lse[lse_index(p, seq, head, row)] * kLog2e;
  }
  if (row >= rows_end) return;  // whole rows leave together: a row is one warp
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    const float2 a = to_float2<E>(o_w[i]);
    const float2 b = to_float2<E>(do_w[i]);
    acc += a.x * b.x + a.y * b.y;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  }
  const int64_t tile = dq_tile(tiles, seq, head, row / kDqTileRows);
  if (lane == 0) {
    const int64_t idx = tile * kDqTileRows + row % kDqTileRows;
    dsum[idx] = acc;
    lse_log2[idx] = lse;
  }
  // The zeroing of the tiles the main kernel adds into (every tile of this sequence's whole
  // steps, the rows walked here): row r of a tile zeroes the tile's r-th 1/64, as a flat
  // array (its fragment order does not matter for zeros).
  float2* z = reinterpret_cast<float2*>(dq_accum + tile * dq_tile_floats(kHeadDim) +
                                        int64_t{row % kDqTileRows} * kHeadDim);
#pragma unroll
  for (int i = 0; i < kWords; ++i) z[lane + 32 * i] = make_float2(0.f, 0.f);
  if (dq_turn != nullptr && row % kDqTileRows == 0 && lane < kDqTurnsPerTile) {
    dq_turn[tile * kDqTurnsPerTile + lane] = 0;
  }
}

// The preprocess by lanes: kLanes = d / 8 lanes per row, each loading 16 bytes of O and of dO,
// so a warp takes 32 / kLanes rows (d = 64 / 128 / 256: 4 / 2 / 1) and the row's sum needs
// log2(kLanes) shuffles; d = 192 (24 lanes would not divide a warp) keeps one warp per row with
// 4-byte loads (the kernel above). At d = 64 that warp issued ~220 instructions per row, more
// than the row's bytes take; by lanes measured +3.7..+7.0% on the whole d = 64 backward at
// 512-2048, neutral elsewhere (docs/perf-log.md, "Measured 2026-12-06, second run"). Every lane
// stays to the shuffles (a row past rows_end only skips its stores: the group's lanes share a
// warp with other rows).
template <int kHeadDim>
constexpr int pre_lanes() {
  return kHeadDim / 8;
}
template <int kHeadDim>
constexpr bool pre_by_lanes() {
  return 32 % pre_lanes<kHeadDim>() == 0;
}
template <int kHeadDim>
constexpr int pre_rows_per_cta() {
  return pre_by_lanes<kHeadDim>() ? kPreThreads / pre_lanes<kHeadDim>() : kRowsPerCta;
}

template <int kHeadDim, Dtype E, bool kPost>
__global__ void __launch_bounds__(kPreThreads)
    bwd_sm90_preprocess_lanes_kernel(const flashback_bwd_params p, int rows_padded, DqTiles tiles,
                                     float* lse_log2, float* dsum, float* dq_accum, int* dq_turn,
                                     DqPostQueue post) {
  constexpr int kLanes = pre_lanes<kHeadDim>();
  static_assert(32 % kLanes == 0, "a warp holds whole rows");
  static_assert(kLanes >= kDqTurnsPerTile, "a row's lanes zero its tile's turn counters");
  constexpr int kRows = kPreThreads / kLanes;  // rows per CTA: pre_rows_per_cta, the grid's
  if (threadIdx.x == 0) fh::launch_dependents();
  if constexpr (kPost) set_post_queue(post, p.nheads_k);
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int sub = static_cast<int>(threadIdx.x) % kLanes;  // this lane's 16 bytes of the row
  const int row = blockIdx.x * kRows + static_cast<int>(threadIdx.x) / kLanes;
  const SeqRows seq = seq_rows(p, batch);
  const int step_rows = tiles.step_tiles * kDqTileRows;
  const int rows_end = min(rows_padded, (seq.seqlen_q + step_rows - 1) / step_rows * step_rows);
  uint4 o_v = make_uint4(0, 0, 0, 0), do_v = make_uint4(0, 0, 0, 0);
  float lse = INFINITY;  // rows past seqlen_q: P = 0 in the main kernel
  if (row < seq.seqlen_q) {
    const uint16_t* o = static_cast<const uint16_t*>(p.out) + seq.q_offset(p.out_strides) +
                        head * p.out_strides.head + int64_t{row} * p.out_strides.row;
    const uint16_t* dout = static_cast<const uint16_t*>(p.dout) + seq.q_offset(p.dout_strides) +
                           head * p.dout_strides.head + int64_t{row} * p.dout_strides.row;
    o_v = *reinterpret_cast<const uint4*>(o + 8 * sub);
    do_v = *reinterpret_cast<const uint4*>(dout + 8 * sub);
    if (sub == 0) lse = p.lse[lse_index(p, seq, head, row)] * kLog2e;
  }
  const uint32_t ow[4] = {o_v.x, o_v.y, o_v.z, o_v.w};
  const uint32_t dw[4] = {do_v.x, do_v.y, do_v.z, do_v.w};
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = to_float2<E>(ow[i]);
    const float2 b = to_float2<E>(dw[i]);
    acc += a.x * b.x + a.y * b.y;
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  }
  if (row >= rows_end) return;  // after the shuffles: the warp's other rows needed this lane
  const int64_t tile = dq_tile(tiles, seq, head, row / kDqTileRows);
  if (sub == 0) {
    const int64_t idx = tile * kDqTileRows + row % kDqTileRows;
    dsum[idx] = acc;
    lse_log2[idx] = lse;
  }
  // Row r of a tile zeroes the tile's r-th 1/64 (d floats): 8 per lane, two 16-byte stores.
  float4* z = reinterpret_cast<float4*>(dq_accum + tile * dq_tile_floats(kHeadDim) +
                                        int64_t{row % kDqTileRows} * kHeadDim) + 2 * sub;
  z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
  z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (dq_turn != nullptr && row % kDqTileRows == 0 && sub < kDqTurnsPerTile) {
    dq_turn[tile * kDqTurnsPerTile + sub] = 0;
  }
}

// dQaccum tile layout (bwd_sm90_epilogue.cuh): float4 number i = (u * 8 + g) * 128 + t holds
// what thread t of a consumer warpgroup added from its dQ^T accumulator registers 4g..4g+3 of
// head-dim atom-column u: with the m64n64 accumulator layout (docs/hopper-facts.md section 3,
// rows = head dim,
// columns = queries), d0 = 64 u + 16 (t / 32) + (t % 32) / 4 and q0 = 8 g + 2 (t % 4), its four
// floats are (q0, d0), (q0 + 1, d0), (q0, d0 + 8), (q0 + 1, d0 + 8). The kernel reads the tile
// in that order (coalesced), transposes it through shared memory as scaled bf16 and writes
// whole 2d-byte rows.
constexpr int kPostThreads = 256;
template <int kHeadDim>
constexpr int post_row_elems() {
  return kHeadDim + 8;  // 16 bytes of padding per row
}

// One tile (its 64 rows of `head` in sequence `seq`): dQ = scale * dQaccum through tile_s.
// kCg: the tile's loads bypass L1 (ld.global.cg), for the queue's form, which reads tiles other
// CTAs finished adding into while this grid runs (ordered by the queue's acquire, bwd_sm90.h).
template <int kHeadDim, Dtype E, bool kCg>
__device__ __forceinline__ void convert_dq_tile(const flashback_bwd_params& p, const DqTiles& tiles,
                                                const float* dq_accum, const SeqRows seq, int head,
                                                int m_block, uint16_t* tile_s) {
  constexpr int kPostRowElems = post_row_elems<kHeadDim>();
  constexpr int kTileFloats = static_cast<int>(dq_tile_floats(kHeadDim));
  const int64_t tile = dq_tile(tiles, seq, head, m_block);
  const float4* src = reinterpret_cast<const float4*>(dq_accum + tile * kTileFloats);
  const float s = p.softmax_scale;
#pragma unroll 4
  for (int i = threadIdx.x; i < kTileFloats / 4; i += kPostThreads) {
    const float4 v = kCg ? __ldcg(src + i) : src[i];
    const int t = i % 128;
    const int g = (i / 128) % 8;
    const int u = i / 1024;
    const int d0 = 64 * u + 16 * (t / 32) + (t % 32) / 4;
    const int q0 = 8 * g + 2 * (t % 4);
    tile_s[q0 * kPostRowElems + d0] = from_float<E>(v.x * s);
    tile_s[(q0 + 1) * kPostRowElems + d0] = from_float<E>(v.y * s);
    tile_s[q0 * kPostRowElems + d0 + 8] = from_float<E>(v.z * s);
    tile_s[(q0 + 1) * kPostRowElems + d0 + 8] = from_float<E>(v.w * s);
  }
  __syncthreads();
  uint16_t* dq = static_cast<uint16_t*>(p.dq) + seq.q_offset(p.dq_strides) + head * p.dq_strides.head;
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kDqTileRows * kChunks; i += kPostThreads) {
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const int q = m_block * kDqTileRows + row;
    if (q < seq.seqlen_q) {
      *reinterpret_cast<uint4*>(dq + static_cast<int64_t>(q) * p.dq_strides.row + chunk * 8) =
          *reinterpret_cast<const uint4*>(tile_s + row * kPostRowElems + chunk * 8);
    }
  }
}

template <int kHeadDim, Dtype E>
__global__ void __launch_bounds__(kPostThreads)
    bwd_sm90_postprocess_kernel(const flashback_bwd_params p, DqTiles tiles, const float* dq_accum) {
  __shared__ __align__(16) uint16_t tile_s[kDqTileRows * post_row_elems<kHeadDim>()];
  const int m_block = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const SeqRows seq = seq_rows(p, batch);
  if (m_block * kDqTileRows >= seq.seqlen_q) return;  // varlen: past a shorter sequence's end
  // Launched as the main kernel's dependent (PDL): dQaccum is complete only after this wait.
  fh::grid_dependency_wait();
  convert_dq_tile<kHeadDim, E, false>(p, tiles, dq_accum, seq, head, m_block, tile_s);
}

// The queue's form (dq_post_queue): as many CTAs as fit at once, each taking the next tile of
// the queue (claim) until all pairs' tiles are done (a claim past them is left unused). Tile k
// belongs to the pair in queue slot k / (group x m_blocks); thread 0 waits until that slot is
// filled (acquire: the pair's adds are then visible, DqPostQueue), sleeping between polls so
// that the main kernel's last CTAs keep the memory system. Its CTAs start only once every
// main-kernel CTA has (PDL), so they take the SMs that CTAs leave and never hold one a
// main-kernel CTA waits for. The grid's end waits for the main kernel's (its dK / dV stores may
// still be in flight when a pair is queued), so that work after this kernel on the stream sees
// every gradient. (With the split last wave the main kernel is two launches, the parts' after
// the units'; the parts' grid ends only after the units' grid, bwd_sm90_launch.cuh.)
// The queue and claim are read without a wait for the preprocess that sets them: this grid is
// launched only once every main-kernel CTA has triggered it, and each triggers after its own
// griddepcontrol.wait, which returns once the preprocess has completed and its writes are
// visible (hopper/pdl.h); the split last wave's parts trigger at their start, each having
// started after every CTA of the units' launch passed that wait (or, with no units before
// them, after the preprocess in stream order). The slot's wait may legitimately last the main kernel's whole tail;
// the hang guard's limit (sm90_hang_guard.h, ~8 minutes) is far above that.
template <int kHeadDim, Dtype E>
__global__ void __launch_bounds__(kPostThreads)
    bwd_sm90_postprocess_queue_kernel(const flashback_bwd_params p, DqTiles tiles,
                                      const float* dq_accum, DqPostQueue post) {
#if defined(FLASHBACK_MBAR_TIMEOUT_CYCLES)
  using hopper::mbar_timeout_trap;  // named by the macro
#endif
  __shared__ __align__(16) uint16_t tile_s[kDqTileRows * post_row_elems<kHeadDim>()];
  __shared__ int claimed[2];  // tile, pair
  const int group = p.nheads / p.nheads_k;
  const int per_pair = group * tiles.m_blocks;
  const int total = post.pairs * per_pair;
  // Thread 0 claims a tile ahead: the claim's round trip to L2 runs under the tile before it.
  int next = 0;
  if (threadIdx.x == 0) next = atomicAdd(post.claim(), 1);
  for (;;) {
    if (threadIdx.x == 0) {
      const int k = next;
      int pair = -1;
      if (k < total) {
        const int* slot = post.queue(k / per_pair);
        FLASHBACK_MBAR_SPIN((pair = fh::ld_acquire_gpu(slot)) >= 0 || (__nanosleep(256), false));
        next = atomicAdd(post.claim(), 1);
      }
      claimed[0] = k;
      claimed[1] = pair;
    }
    __syncthreads();
    const int k = claimed[0];
    const int pair = claimed[1];
    if (k >= total) break;
    const int r = k % per_pair;
    const int batch = pair / p.nheads_k;
    const int head = pair % p.nheads_k * group + r / tiles.m_blocks;
    const int m_block = r % tiles.m_blocks;
    const SeqRows seq = seq_rows(p, batch);
    if (m_block * kDqTileRows < seq.seqlen_q) {  // varlen: past a shorter sequence's end
      convert_dq_tile<kHeadDim, E, true>(p, tiles, dq_accum, seq, head, m_block, tile_s);
    }
    __syncthreads();  // tile_s and claimed are rewritten by the next tile
  }
  fh::grid_dependency_wait();
}

template <class... KernelArgs, class... Args>
cudaError_t launch(void (*kernel)(KernelArgs...), dim3 grid, int threads, cudaStream_t stream,
                   Args&&... args) {
  kernel<<<grid, threads, 0, stream>>>(static_cast<Args&&>(args)...);
  return cudaGetLastError();
}

// The instance for the call's head dim and dtype (the family's head dims and dtypes,
// sm90_family.h), or null; a dtype the build left out (FLASHBACK_DTYPES) is not instantiated.
template <template <int, Dtype> class Pick, int D, Dtype E, class Fn>
Fn kernel_if_compiled() {
  if constexpr (dtype_compiled(E == Dtype::kF16 ? FLASHBACK_DTYPE_FP16 : FLASHBACK_DTYPE_BF16)) {
    return Pick<D, E>::kernel;
  } else {
    return nullptr;
  }
}
template <template <int, Dtype> class Pick, class Fn>
Fn pick_kernel(const flashback_bwd_params& p) {
  const bool f16 = p.dtype == FLASHBACK_DTYPE_FP16;
  switch (p.headdim) {
#define FLASHBACK_PREPOST_CASE(D)                                     \
  case D:                                                             \
    return f16 ? kernel_if_compiled<Pick, D, Dtype::kF16, Fn>()       \
               : kernel_if_compiled<Pick, D, Dtype::kBf16, Fn>();
    FLASHBACK_SM90_FOR_EACH_HEADDIM(FLASHBACK_PREPOST_CASE)
#undef FLASHBACK_PREPOST_CASE
    default:
      return nullptr;
  }
}
template <int D, Dtype E, bool kPost, bool kByLanes = pre_by_lanes<D>()>
struct PickPreImpl {
  static constexpr auto kernel = bwd_sm90_preprocess_kernel<D, E, kPost>;
};
template <int D, Dtype E, bool kPost>
struct PickPreImpl<D, E, kPost, true> {
  static constexpr auto kernel = bwd_sm90_preprocess_lanes_kernel<D, E, kPost>;
};
template <int D, Dtype E>
struct PickPre : PickPreImpl<D, E, false> {};
template <int D, Dtype E>
struct PickPrePost : PickPreImpl<D, E, true> {};
// Rows per preprocess CTA of the call's head dim (its grid).
int pre_rows_for(int headdim) {
  switch (headdim) {
#define FLASHBACK_PRE_ROWS_CASE(D) \
  case D:                          \
    return pre_rows_per_cta<D>();
    FLASHBACK_SM90_FOR_EACH_HEADDIM(FLASHBACK_PRE_ROWS_CASE)
#undef FLASHBACK_PRE_ROWS_CASE
    default:
      return kRowsPerCta;
  }
}
template <int D, Dtype E>
struct PickPost {
  static constexpr auto kernel = bwd_sm90_postprocess_kernel<D, E>;
};
template <int D, Dtype E>
struct PickPostQueue {
  static constexpr auto kernel = bwd_sm90_postprocess_queue_kernel<D, E>;
};
using PreKernel = void (*)(const flashback_bwd_params, int, DqTiles, float*, float*, float*, int*,
                           DqPostQueue);
using PostKernel = void (*)(const flashback_bwd_params, DqTiles, const float*);
using PostQueueKernel = void (*)(const flashback_bwd_params, DqTiles, const float*, DqPostQueue);

}  // namespace

cudaError_t launch_bwd_sm90_preprocess(const flashback_bwd_params& p, int m_blocks, int step_tiles,
                                       float* lse_log2, float* dsum, float* dq_accum, int* dq_turn,
                                       DqPostQueue post, cudaStream_t stream) {
  const PreKernel kernel = post.base != nullptr ? pick_kernel<PickPrePost, PreKernel>(p)
                                                : pick_kernel<PickPre, PreKernel>(p);
  if (kernel == nullptr) return cudaErrorNotSupported;
  const int rows_padded = m_blocks * kDqTileRows;
  const int rows_per_cta = pre_rows_for(p.headdim);
  const dim3 grid((rows_padded + rows_per_cta - 1) / rows_per_cta, p.nheads, p.batch);
  return launch(kernel, grid, kPreThreads, stream, p, rows_padded,
                dq_tiles_of(p, m_blocks, step_tiles), lse_log2, dsum, dq_accum, dq_turn, post);
}

cudaError_t launch_bwd_sm90_postprocess(const flashback_bwd_params& p, int m_blocks, int step_tiles,
                                        const float* dq_accum, bool pdl, cudaStream_t stream) {
  const PostKernel kernel = pick_kernel<PickPost, PostKernel>(p);
  if (kernel == nullptr) return cudaErrorNotSupported;
  const dim3 grid(m_blocks, p.nheads, p.batch);
  return fh::launch_kernel(kernel, grid, dim3(kPostThreads), 0, stream, dim3(1, 1, 1), pdl, p,
                           dq_tiles_of(p, m_blocks, step_tiles), dq_accum);
}

cudaError_t launch_bwd_sm90_postprocess_queue(const flashback_bwd_params& p, int m_blocks,
                                              int step_tiles, const float* dq_accum,
                                              DqPostQueue post, bool pdl, cudaStream_t stream) {
  const PostQueueKernel kernel = pick_kernel<PickPostQueue, PostQueueKernel>(p);
  if (kernel == nullptr) return cudaErrorNotSupported;
  int resident = 0;
  const cudaError_t err = resident_ctas(kernel, kPostThreads, 0, &resident);
  if (err != cudaSuccess) return err;
  const int64_t tiles = int64_t{post.pairs} * (p.nheads / p.nheads_k) * m_blocks;
  const int ctas = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(tiles, resident)));
  return fh::launch_kernel(kernel, dim3(ctas), dim3(kPostThreads), 0, stream, dim3(1, 1, 1), pdl, p,
                           dq_tiles_of(p, m_blocks, step_tiles), dq_accum, post);
}

}  // namespace sm90
}  // namespace flashback
