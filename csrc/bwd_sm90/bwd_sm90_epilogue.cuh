// Where the gradients leave the Hopper backward's registers.
//
// (7) dQ: each consumer warpgroup holds one 64 x 64 fp32 dQ^T partial per head-dim atom-column u
// it owns (rows = head dim, columns = queries) for the current (Q block, K/V block) pair (by keys
// one: its atom-column, or at d = 64 its 64 queries' only one) and adds them into the fp32
// dQaccum workspace.
// docs/design.md section 5 measured the layout of the adds as the deciding factor (2.2 us per 64 KB
// tile when a warp covers whole 128-byte lines, 7.6-8 us straight from the fragment layout), so
// dQaccum is not row-major: tile (batch, head, 64-row block) stores atom-column u, register group g
// (accumulator registers 4g..4g+3), thread t at float offset u*4096 + (g*128 + t)*4. One
// red.global.add.v4.f32 per thread per group then covers 512 contiguous bytes per warp.
// The postprocess kernel (bwd_sm90_prepost.cu) maps it back to rows and columns.
//
// dK, dV: written once per CTA. The accumulators are transposed (dV^T, dK^T: rows = head dim),
// so they go through shared memory (stmatrix.trans) and leave as whole 2d-byte rows.
#pragma once

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_prepost.h"
#include "hopper/hopper.h"

namespace flashback {
namespace sm90 {

// 4 x fp32 atomic add (per element, relaxed, gpu scope); 16-byte aligned. PTX ISA 8.1, sm_90.
__device__ __forceinline__ void red_add_v4(float* dst, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

// The same with an L2 cache policy (hopper::l2_policy_*; the .L2::cache_hint form).
__device__ __forceinline__ void red_add_v4_hint(float* dst, float a, float b, float c, float d,
                                                uint64_t policy) {
  asm volatile("red.global.add.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(dst), "f"(a),
               "f"(b), "f"(c), "f"(d), "l"(policy)
               : "memory");
}

// One atom-column of a dQaccum tile in the fragment order above: thread t's register group g
// (accumulator registers 4g..4g+3) at float dq_frag_thread(t) + g * kDqFragGroupFloats.
__host__ __device__ constexpr int dq_frag_thread(int t) { return t * 4; }
constexpr int kDqFragGroupFloats = 512;  // 128 threads x 4 floats

// (7) dQaccum[tile][atom-column u] += dq (32 registers of an m64n64 accumulator).
// kHint: the adds carry the L2 cache policy `policy` (l2_hints).
template <int kHeadDim, bool kHint = false>
__device__ __forceinline__ void add_dq_partial(const BwdSm90Params& p, int64_t tile, int u, int t,
                                               const float (&dq)[32], uint64_t policy = 0) {
  float* dst = p.dq_accum + tile * dq_tile_floats(kHeadDim) + u * kDqAtomFloats + dq_frag_thread(t);
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    if constexpr (kHint) {
      red_add_v4_hint(dst + g * kDqFragGroupFloats, dq[4 * g], dq[4 * g + 1], dq[4 * g + 2],
                      dq[4 * g + 3], policy);
    } else {
      red_add_v4(dst + g * kDqFragGroupFloats, dq[4 * g], dq[4 * g + 1], dq[4 * g + 2],
                 dq[4 * g + 3]);
    }
  }
}

// (7) The same partial into a 16 KB shared-memory buffer laid out as one atom-column of a
// dQaccum tile (dq_frag_thread), for one bulk reduce-add (bwd_sm90_dq_warp); a warp's stores
// cover 512 contiguous bytes (no bank conflicts).
__device__ __forceinline__ void store_dq_partial(uint8_t* buf, int t, const float (&dq)[32]) {
  float* dst = reinterpret_cast<float*>(buf) + dq_frag_thread(t);
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    *reinterpret_cast<float4*>(dst + g * kDqFragGroupFloats) =
        make_float4(dq[4 * g], dq[4 * g + 1], dq[4 * g + 2], dq[4 * g + 3]);
  }
}

// Deterministic mode: the dQ adds into a tile happen in one fixed order of K/V blocks
// (bwd_sm90_dq_rank); a per-tile counter says how many have added. The release/acquire pattern
// of CUTLASS's generic barrier: one thread polls with ld.acquire and a barrier then orders the
// warpgroup's adds after it; after the adds a barrier, then one thread's red.release, which
// (cumulative) publishes every add of the warpgroup before the count moves on
// (bwd_sm90_turn_warp). Deadlock-free because a CTA only waits for CTAs of lower blockIdx or
// of its own chunk, which fits on the GPU at once (bwd_sm90_scheduler.cuh) -- assuming, as
// FA2/FA3's deterministic modes do, that CTAs are dispatched in blockIdx order (observed
// behaviour, not documented by CUDA) and that the kernel can have every SM.
// Spins until `turn` holds `n`, with the mbarrier waits' hang guard in the config's wait style
// S: a broken order traps instead of hanging.
template <hopper::WaitStyle S>
__device__ __forceinline__ void dq_turn_acquire(const int* turn, int n) {
#if defined(FLASHBACK_MBAR_TIMEOUT_CYCLES)
  using hopper::mbar_timeout_trap;  // named by the macro
#endif
  FLASHBACK_MBAR_SPIN_STYLED(S, hopper::ld_acquire_gpu(turn) == n);
}

__device__ __forceinline__ void dq_turn_release(int* turn) { hopper::red_release_gpu_add(turn, 1); }

// Where stage_dkv_t puts the 16 bytes of key row `key` at head-dim column `d` (a multiple of 8):
// a [key][d] tile of `row_bytes` rows (2d + 16: the eight lanes of one stmatrix matrix, eight
// keys, fall into eight bank groups).
struct PaddedRows {
  uint32_t base, row_bytes;
  __device__ __forceinline__ uint32_t operator()(int key, int d) const { return base + key * row_bytes + d * 2; }
};

// dV^T or dK^T of one warpgroup (kOwn head-dim atom-columns from `first`, m64 x kBlockN each),
// times `scale`, as 16-bit into a staging of key rows (`at`): stmatrix.trans turns each 8 x 8
// block (8 head-dim rows x 8 keys) into 8 key rows of 16 contiguous bytes. kRotated: register
// key k is key (k + key_rot) mod kBlockN (own_keys_first).
template <int kBlockN, int kOwn, hopper::Dtype kElem, bool kRotated = false>
__device__ __forceinline__ void stage_dkv_t(const PaddedRows& at, const float (&acc)[kOwn][kBlockN / 2],
                                            float scale, int first, int t, int key_rot = 0) {
  static_assert(kBlockN % 16 == 0, "key groups are taken two at a time");
  const int lane = t % 32;
  const int mat = lane / 8;
  const int r = lane % 8;
#pragma unroll
  for (int jj = 0; jj < kOwn; ++jj) {
    const int d0 = 64 * (first + jj) + 16 * (t / 32);
    uint32_t pk[kBlockN / 4];  // pk[2c] = key group c, rows d0..; pk[2c + 1] = rows d0 + 8..
#pragma unroll
    for (int i = 0; i < kBlockN / 4; ++i) {
      pk[i] = hopper::pack2<kElem>(acc[jj][2 * i] * scale, acc[jj][2 * i + 1] * scale);
    }
#pragma unroll
    for (int c = 0; c < kBlockN / 8; c += 2) {
      int key = 8 * (c + mat / 2) + r;
      if constexpr (kRotated) key = (key + key_rot) % kBlockN;
      const int d = d0 + 8 * (mat & 1);
      hopper::stmatrix_x4_trans(at(key, d), pk[2 * c], pk[2 * c + 1], pk[2 * c + 2], pk[2 * c + 3]);
    }
  }
}

// Staged rows [n0, n0 + kBlockN) of dK or dV to global memory: a row is 2d bytes of 16-byte
// chunks, consecutive threads take consecutive chunks; rows past seqlen_k are not written.
// `tid` counts kThreads threads.
template <int kBlockN, int kHeadDim, int kThreads>
__device__ __forceinline__ void copy_dkv_out(void* out, const flashback_strides& st,
                                             const uint8_t* stage, uint32_t row_bytes,
                                             int64_t seq_offset, int kv_head, int n0,
                                             int seqlen_k, int tid) {
  uint16_t* base = static_cast<uint16_t*>(out) + seq_offset + kv_head * st.head;
  constexpr int kChunks = kHeadDim * 2 / 16;  // 16-byte chunks per row
  for (int idx = tid; idx < kBlockN * kChunks; idx += kThreads) {
    const int row = idx / kChunks;
    const int chunk = idx % kChunks;
    if (n0 + row < seqlen_k) {
      const uint4 v = *reinterpret_cast<const uint4*>(stage + row * row_bytes + chunk * 16);
      *reinterpret_cast<uint4*>(base + static_cast<int64_t>(n0 + row) * st.row + chunk * 8) = v;
    }
  }
}

}  // namespace sm90
}  // namespace flashback
