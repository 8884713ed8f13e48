// Where the forward's results leave the registers.
//
// O: each consumer warpgroup holds a 64 x d fp32 accumulator (rows 16 w + l/4 and + 8 of
// thread t, columns 8 j + 2 (l % 4) + {0, 1}). It is scaled by 1 / l, packed to bf16 or fp16 and
// staged in the warpgroup's own part of the Q tile (d/64 atom-columns of 64 rows x 128 B, 16-byte
// chunks XOR-swizzled by row so the stores of a warp hit 8 different bank groups), then copied
// out as whole 2d-byte rows. Rows past seqlen_q are not written.
// With a map for out (tma_store_o, fwd_sm90.h): the same staging, written by stmatrix, and one
// thread's bulk tensor stores instead of the copy-out, for warpgroups whose 64 rows all lie
// within seqlen_q.
// LSE: one fp32 per row (natural log), written by the first lane of the row's quad.
#pragma once

#include "fwd_sm90/fwd_sm90.h"
#include "fwd_sm90/fwd_sm90_scheduler.cuh"
#include "hopper/hopper.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

// LSE: one fp32 per row (natural log) of this thread's rows `row` and `row` + 8, written by the
// first lane of the row's quad.
__device__ __forceinline__ void store_lse(const FwdSm90Params& p, const FwdSm90Work& w, int row,
                                          int t, const float (&lse)[2]) {
  if (t % 4 != 0) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row + 8 * h < w.seqlen_q) p.lse[w.lse_offset + row + 8 * h] = lse[h];
  }
}

// O / l of this warpgroup's 64 rows through `stage` to out by TMA: warp v's 16 rows with
// stmatrix (an x4 takes the 8 x 8 blocks (rows +0 / +8) x (columns 8 j, 8 j + 8); lane L names
// row L % 8 of block L / 8), then thread 0 stores the d / 64 boxes of 64 rows and waits until
// they have been read, so that every warp may free `stage` after this returns. Warps 1-3 free it
// before the copy has read it; that is safe because the stage's empty barrier counts one arrival
// per consumer warp and the issuing thread is warp 0's leader, which arrives only after the wait
// (move the store to another thread, or count arrivals differently, and it becomes a race).
template <int kHeadDim, hopper::Dtype kElem>
__device__ __forceinline__ void store_out_tma(const FwdSm90Params& p, const FwdSm90Work& w,
                                              const CUtensorMap* map_o, uint8_t* stage,
                                              uint32_t atom_bytes, int m0, int t, uint32_t bar,
                                              const float (&o)[kHeadDim / 2], const float (&inv)[2]) {
  const int lane = t % 32;
  const int row = 16 * (t / 32) + 8 * ((lane / 8) % 2) + lane % 8;
  const uint32_t base = hopper::smem_u32(stage) + row * 128;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; j += 2) {
    uint32_t r[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int jj = j + m / 2, h = m % 2;
      r[m] = hopper::pack2<kElem>(o[4 * jj + 2 * h] * inv[h], o[4 * jj + 2 * h + 1] * inv[h]);
    }
    const int jl = j + lane / 16;  // the column block of the matrix this lane addresses
    hopper::stmatrix_x4(base + (jl / 8) * atom_bytes + (((jl % 8) ^ (lane % 8)) << 4), r[0], r[1],
                        r[2], r[3]);
  }
  hopper::fence_proxy_async_shared();  // the stmatrix writes, before the async proxy reads them
  hopper::named_bar_sync(bar, 128);
  if (t == 0) {
#pragma unroll
    for (int a = 0; a < kHeadDim / 64; ++a) {
      tma_rows_store(stage + a * atom_bytes, map_o, p.head_inner & 8, 64 * a, w.row_q + m0, w.head,
                     w.map_batch);
    }
    hopper::bulk_commit_group();
    hopper::bulk_wait_group_read<0>();
  }
}

struct NoRelease {
  __device__ __forceinline__ void operator()() const {}
};

// One 16-byte global store. Written out because at d = 64 the compiler split the copy-out's
// uint4 stores into four 32-bit ones (the values were separate registers by then).
__device__ __forceinline__ void store_global_16(void* dst, const uint4& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// `map_o` null: the per-thread copy-out (also for a warpgroup whose rows run past seqlen_q).
// kEarly (FwdSm90Config::copy_out_early): `release` (which hands `stage` back) is called here,
// between the copy-out's shared-memory reads and its global stores, or after the TMA store;
// without it the caller releases after this returns.
template <int kHeadDim, hopper::Dtype kElem, bool kEarly = false, class Release = NoRelease>
__device__ __forceinline__ void store_out_and_lse(const FwdSm90Params& p, const FwdSm90Work& w,
                                                  const CUtensorMap* map_o, uint8_t* stage,
                                                  uint32_t atom_bytes, int m0, int t, uint32_t bar,
                                                  const float (&o)[kHeadDim / 2],
                                                  const float (&inv)[2], const float (&lse)[2],
                                                  Release release = {}) {
  const int row0 = hopper::acc_row(0, t);
  store_lse(p, w, m0 + row0, t, lse);
  if (map_o != nullptr && m0 + 64 <= w.seqlen_q) {
    store_out_tma<kHeadDim, kElem>(p, w, map_o, stage, atom_bytes, m0, t, bar, o, inv);
    if constexpr (kEarly) release();
    return;
  }
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 8 * h;
      const uint32_t off = (j / 8) * atom_bytes + r * 128 + (((j % 8) ^ (r & 7)) << 4) + (t % 4) * 4;
      *reinterpret_cast<uint32_t*>(stage + off) =
          hopper::pack2<kElem>(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
    }
  }
  hopper::named_bar_sync(bar, 128);  // this warpgroup's staged rows are complete
  uint16_t* out = static_cast<uint16_t*>(p.out) + w.out_offset +
                       w.head * p.out_strides.head;
  if constexpr (kEarly) {
    // Thread t: 16-byte chunk t % 8 of each atom-column's 128-byte row, rows t / 8 + 16 k. Rows
    // 16 k apart share their swizzle (row & 7), so every read is one base plus an immediate.
    constexpr int kAtoms = kHeadDim / 64;
    const int cin = t % 8, r0 = t / 8;
    const uint8_t* src = stage + r0 * 128 + ((cin ^ (r0 & 7)) << 4);
    uint4 v[4][kAtoms];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int a = 0; a < kAtoms; ++a) {
        v[k][a] = *reinterpret_cast<const uint4*>(src + a * atom_bytes + k * 16 * 128);
      }
    }
    release();
    uint16_t* dst = out + static_cast<int64_t>(m0 + r0) * p.out_strides.row + cin * 8;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (m0 + r0 + 16 * k < w.seqlen_q) {
#pragma unroll
        for (int a = 0; a < kAtoms; ++a) {
          store_global_16(dst + static_cast<int64_t>(16 * k) * p.out_strides.row + 64 * a, v[k][a]);
        }
      }
    }
    return;
  }
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  for (int idx = t; idx < 64 * kChunks; idx += 128) {
    const int row = idx / kChunks;
    const int c = idx % kChunks;
    if (m0 + row < w.seqlen_q) {
      const uint4 v = *reinterpret_cast<const uint4*>(stage + (c / 8) * atom_bytes + row * 128 +
                                                      (((c % 8) ^ (row & 7)) << 4));
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(m0 + row) * p.out_strides.row + c * 8) = v;
    }
  }
}

}  // namespace sm90
}  // namespace flashback
