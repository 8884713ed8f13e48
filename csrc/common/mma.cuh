// Warp-level tensor-core primitives for the reference kernels: one small wrapper per PTX
// instruction (mma.sync m16n8k16 bf16, ldmatrix, cp.async) plus the fragment layout they use.
//
// Fragment layout of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix
// fragments for mma.m16n8k16"). With lane = threadIdx.x % 32, g = lane / 4 (0..7) and
// t = lane % 4 (0..3):
//
//   A (16 x 16, bf16, row-major), 4 registers of 2 bf16 each (lower column in the low half):
//     a[0] = A[g    ][2t, 2t+1]      a[2] = A[g    ][2t+8, 2t+9]
//     a[1] = A[g + 8][2t, 2t+1]      a[3] = A[g + 8][2t+8, 2t+9]
//   B (16 x 8, bf16, "col": B[k][n] with k contiguous per register), 2 registers:
//     b[0] = B[2t, 2t+1][g]          b[1] = B[2t+8, 2t+9][g]
//   C/D (16 x 8, fp32), 4 registers:
//     c[0], c[1] = C[g    ][2t, 2t+1]
//     c[2], c[3] = C[g + 8][2t, 2t+1]
//
// Two C fragments side by side (columns 0..7 and 8..15) hold, after packing to bf16, exactly
// the A fragment of a 16 x 16 tile; that is how P and dS go from one GEMM's output to the next
// GEMM's input without touching shared memory (acc_to_a below).
//
// ldmatrix loads 8x8 bf16 matrices from shared memory: lane l supplies the address of row
// (l % 8) of matrix (l / 8); afterwards each lane holds, per matrix, the pair
// M[g][2t, 2t+1] (plain) or M[2t, 2t+1][g] (.trans) — the A/B register layouts above.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

namespace flashback {
namespace ref {

// D += A * B for one 16x8x16 tile (fp32 accumulate).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices; r[i] is this lane's pair of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_ptr)));
}

// Same, each matrix transposed on the way (for operands whose k index runs along rows).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_ptr)));
}

// 16-byte asynchronous global->shared copy; when !valid the 16 bytes are zero-filled and
// nothing is read (src must still be a mapped address, so callers pass a safe one).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Two floats -> one register of two bf16 (round to nearest even); `lo` goes to the low half,
// i.e. the smaller column index in the fragment layouts above.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// A fragment for k-columns [16 kk, 16 kk + 16) of a 16 x N fp32 accumulator held as N/8 C
// fragments (see the layout note at the top of this file).
template <int kNTiles>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&acc)[kNTiles][4],
                                         int kk) {
  a[0] = pack_bf16(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack_bf16(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack_bf16(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack_bf16(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

}  // namespace ref
}  // namespace flashback
