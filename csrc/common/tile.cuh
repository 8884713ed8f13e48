// Shared-memory tiles and the warp-level GEMMs the reference kernels are built from.
//
// Every operand tile lives in shared memory row-major with a 16-byte pad per row: a row of
// 64/128/256 bf16 is 128/256/512 bytes, so without the pad the eight rows one ldmatrix phase
// reads would all start in the same bank; with it, consecutive rows start 16 bytes apart and
// the eight 16-byte row segments cover all 32 banks exactly once.
//
// A warp always computes a 16-row slab: acc (16 x N) is N/8 mma C fragments, float[N/8][4]
// (layout in mma.cuh).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "common/mma.cuh"

namespace flashback {
namespace ref {

using bf16 = __nv_bfloat16;

template <int kRows_, int kCols_>
struct SmemTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kPitch = kCols + 8;  // elements; the pad is explained above
  static constexpr int kBytes = kRows * kPitch * static_cast<int>(sizeof(bf16));
  static_assert(kCols % 16 == 0, "tiles are whole 16-column mma steps");
  static_assert(kBytes % 16 == 0, "tiles are carved back to back at 16-byte alignment");

  bf16* base;
  __device__ __forceinline__ bf16* at(int r, int c) const { return base + r * kPitch + c; }
};

// Issues cp.async copies of rows [0, kRows) of a global (rows, kCols) slice whose rows are
// `row_stride` elements apart; rows >= valid_rows are zero-filled (never read), so partial
// tiles at the end of a sequence hold exact zeros rather than garbage that could turn into NaN.
// All kThreads threads of the CTA take part; the caller commits and waits.
template <int kThreads, class Tile>
__device__ __forceinline__ void load_tile_async(Tile tile, const bf16* gmem, int64_t row_stride,
                                                int valid_rows) {
  constexpr int kChunksPerRow = Tile::kCols / 8;  // 16-byte chunks
  constexpr int kChunks = Tile::kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
  // Not unrolled: the copies are asynchronous, so unrolling buys nothing, and unrolled, ptxas
  // keeps every chunk's 64-bit address live across the whole mainloop (headdim-256 spills).
#pragma unroll 1
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int idx = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = idx / kChunksPerRow;
    const int c = (idx % kChunksPerRow) * 8;
    const bool valid = r < valid_rows;
    // Row 0 always exists (seqlen >= 1), so it is the safe address for a zero-fill.
    const bf16* src = gmem + (valid ? r * row_stride + c : 0);
    cp_async_16(tile.at(r, c), src, valid);
  }
}

// Copies rows [0, valid_rows) of a shared tile to global memory, 16 bytes per thread per step.
template <int kThreads, class Tile>
__device__ __forceinline__ void store_tile(Tile tile, bf16* gmem, int64_t row_stride,
                                           int valid_rows) {
  constexpr int kChunksPerRow = Tile::kCols / 8;
  constexpr int kChunks = Tile::kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int idx = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = idx / kChunksPerRow;
    const int c = (idx % kChunksPerRow) * 8;
    if (r < valid_rows) {
      *reinterpret_cast<uint4*>(gmem + r * row_stride + c) =
          *reinterpret_cast<const uint4*>(tile.at(r, c));
    }
  }
}

// Position of element e (0..3) of C fragment nt inside the warp's 16 x N accumulator.
__device__ __forceinline__ int acc_row(int e) { return (threadIdx.x % 32) / 4 + (e / 2) * 8; }
__device__ __forceinline__ int acc_col(int nt, int e) {
  return nt * 8 + (threadIdx.x % 4) * 2 + (e % 2);
}

template <int kNTiles>
__device__ __forceinline__ void zero(float (&acc)[kNTiles][4]) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
  }
}

// acc (16 x kN) += A (16 x kK) * B^T, both operands in shared memory:
//   A = rows [a_row0, a_row0 + 16) of tile `a`, columns [0, kK);
//   B = rows [b_row0, b_row0 + kN) of tile `b`, columns [0, kK), i.e. B is stored (n, k).
// This is the "Q K^T" shape: both operands have the reduction dim (head dim) contiguous.
template <int kN, int kK, class TileA, class TileB>
__device__ __forceinline__ void gemm_abt_smem(float (&acc)[kN / 8][4], TileA a, int a_row0,
                                              TileB b, int b_row0) {
  static_assert(kN % 16 == 0 && kK % 16 == 0, "whole 16x16 steps");
  const int lane = threadIdx.x % 32;
  // Unrolled by 4, not fully: fully unrolled at headdim 256 (16 k-steps), ptxas hoists the
  // ldmatrix of many k-steps ahead and the dK/dV kernel spills (-Xptxas -v: 52 bytes).
#pragma unroll 4
  for (int kk = 0; kk < kK / 16; ++kk) {
    // Matrices 0..3 = (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
    // (rows 8-15, cols 8-15): a[0..3] in the A layout.
    uint32_t af[4];
    ldmatrix_x4(af, a.at(a_row0 + lane % 16, kk * 16 + (lane / 16) * 8));
#pragma unroll
    for (int nn = 0; nn < kN / 16; ++nn) {
      // Matrices 0..3 = (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15):
      // b[0], b[1] of n-tile 2nn, then b[0], b[1] of n-tile 2nn+1.
      uint32_t bf[4];
      ldmatrix_x4(bf, b.at(b_row0 + nn * 16 + lane % 8 + (lane / 16) * 8,
                           kk * 16 + ((lane / 8) % 2) * 8));
      mma_16816(acc[2 * nn], af, bf[0], bf[1]);
      mma_16816(acc[2 * nn + 1], af, bf[2], bf[3]);
    }
  }
}

// The bf16 A fragments of a warp's fp32 16 x kK accumulator (P or dS), packed once so the
// fp32 copy can die before the GEMM that consumes them (fewer live registers at headdim 256).
template <int kK>
__device__ __forceinline__ void acc_to_a_frags(uint32_t (&a)[kK / 16][4],
                                               const float (&acc)[kK / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) acc_to_a(a[kk], acc, kk);
}

// acc (16 x kN) += A (16 x kK) * B with A in registers and B in shared memory:
//   A = bf16 A fragments from acc_to_a_frags (P or dS);
//   B = rows [0, kK) of tile `b`, columns [0, kN), i.e. B is stored (k, n).
// This is the "P V" shape: the reduction dim runs along B's rows, so B is read with
// ldmatrix.trans.
template <int kN, int kK, class TileB>
__device__ __forceinline__ void gemm_ab_reg(float (&acc)[kN / 8][4],
                                            const uint32_t (&a)[kK / 16][4], TileB b) {
  static_assert(kN % 16 == 0 && kK % 16 == 0, "whole 16x16 steps");
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < kN / 16; ++nn) {
      // Matrices 0..3 = (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15),
      // transposed: b[0], b[1] of n-tile 2nn, then of n-tile 2nn+1.
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, b.at(kk * 16 + lane % 16, nn * 16 + (lane / 16) * 8));
      mma_16816(acc[2 * nn], a[kk], bf[0], bf[1]);
      mma_16816(acc[2 * nn + 1], a[kk], bf[2], bf[3]);
    }
  }
}

// Writes scale * acc (the warp's 16 x N slab) as bf16 into rows [row0, row0 + 16) of a tile.
template <int kNTiles, class Tile>
__device__ __forceinline__ void acc_to_smem(Tile tile, int row0, const float (&acc)[kNTiles][4],
                                            float scale) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows g and g + 8
      *reinterpret_cast<uint32_t*>(tile.at(row0 + acc_row(2 * half), acc_col(nt, 0))) =
          pack_bf16(acc[nt][2 * half] * scale, acc[nt][2 * half + 1] * scale);
    }
  }
}

}  // namespace ref
}  // namespace flashback
