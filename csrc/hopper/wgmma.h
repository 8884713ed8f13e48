// wgmma (warpgroup matrix multiply-accumulate), bf16 or fp16 inputs (Dtype), fp32 accumulators.
// PTX ISA §9.7.15; hopper-facts.md §1-§3.
//
//   D(64 x N) (+)= A(64 x 16) * B(16 x N)   per instruction, per warpgroup (128 threads)
//
// A comes from shared memory (a 64-bit matrix descriptor, "SS") or from four registers ("RS");
// B always from shared memory. All four warps of the warpgroup execute every call here with
// identical descriptors (.sync.aligned). The instructions are asynchronous: issue, then
// wgmma_commit(), then wgmma_wait<n>() before touching the accumulators or reusing the smem.
#pragma once

#include "hopper/common.h"
#include "hopper/dtype.h"
#include "hopper/wgmma_gen.h"

namespace flashback {
namespace hopper {

// ----------------------------------------------------------------- shared-memory descriptors
//
// Only the 128-byte swizzle is provided: it is what TMA with CU_TENSOR_MAP_SWIZZLE_128B writes,
// and the bank-conflict-free layout for 64-element (128-byte) bf16 rows. An "atom" is 8 rows of
// 128 bytes (1024 B, must be 1024-aligned); a tile is a stack of atoms.
//
// Bits (hopper-facts.md §2.3): [0,14) start >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [49,52) base offset
// (0: our atoms are 1024-aligned), [62,64) swizzle mode (1 = 128B on sm_90; Blackwell differs).
FB_DEVICE uint64_t make_smem_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                        uint32_t sbo_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32;
  desc |= 1ull << 62;
  return desc;
}

// K-major tile (rows = M or N, each row 64 contiguous K elements = one 128-byte line):
// LBO is unused for swizzled K-major layouts (written as 16 B, "assumed 1"); SBO = 1024 is the
// distance between 8-row groups. k16 step s inside the 64-wide atom starts 32*s bytes later;
// see kmajor_k_offset for K > 64.
FB_DEVICE uint64_t desc_kmajor_sw128(const void* tile) {
  return make_smem_desc_sw128(smem_u32(tile), 16, 1024);
}

// MN-major tile (rows = K, each row 64 contiguous M or N elements; wider M/N uses further
// atoms-columns of the same height `atom_col_bytes` apart): LBO = that distance between
// M/N-adjacent 64-element chunks, SBO = 1024 between 8-row (K) groups. k16 step s starts
// 16 rows * 128 B = 2048*s bytes later. Swapping LBO and SBO gives wrong results (HW T3).
FB_DEVICE uint64_t desc_mnmajor_sw128(const void* tile, uint32_t atom_col_bytes) {
  return make_smem_desc_sw128(smem_u32(tile), atom_col_bytes, 1024);
}

// Byte offset of k16 step `s` in a K-major tile of `rows` rows whose K extent is split into
// 64-element atom-columns stored one after the other (rows*128 bytes each).
__host__ __device__ constexpr uint32_t kmajor_k_offset(int s, int rows) {
  return static_cast<uint32_t>((s >> 2) * rows * 128 + (s & 3) * 32);
}
// Byte offset of k16 step `s` in an MN-major tile.
__host__ __device__ constexpr uint32_t mnmajor_k_offset(int s) { return static_cast<uint32_t>(s * 2048); }

// Advance a descriptor's start address by `bytes` (multiple of 16). The 14-bit field cannot carry
// into LBO for addresses below 256 KB, so adding to the whole word is safe and cheapest.
FB_DEVICE uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// The same value as desc_advance, built as a 32-bit add on the low word joined to the
// unchanged high word (SBO, swizzle). Where ptxas cannot tell the 64-bit add never carries it
// emits add + add-with-carry + register moves per wgmma (8 uniform instructions in the
// S loop of a persistent forward, measured and since removed); this form costs 4. Use it where
// SASS shows that pattern.
FB_DEVICE uint64_t desc_advance_lo(uint64_t desc, uint32_t bytes) {
  uint64_t r;
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  const uint32_t hi = static_cast<uint32_t>(desc >> 32);
  asm("mov.b64 %0, {%1, %2};" : "=l"(r) : "r"(lo), "r"(hi));
  return r;
}

// ------------------------------------------------------------------------------- ordering

// Required before the first wgmma of a sequence and whenever ordinary code wrote (or read) the
// accumulator or A-fragment registers since the last wgmma: zeroing, rescaling, the epilogue of
// a previous tile. Back-to-back wgmmas into the same accumulators need none between them.
FB_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

// Closes the current group of issued wgmmas (per warp; all 4 warps call it).
FB_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

// Blocks until at most N committed groups are still in flight. Only then may their accumulators
// be read or the shared memory they read be overwritten (e.g. the stage released to TMA).
template <int N>
FB_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps a wgmma_wait below the work placed before this call (`never_negative` must be >= 0, a
// run-time value the compiler cannot prove so: the branch is never taken). A wait has no
// operands, so ptxas's scheduler finds it ready anywhere after the previous wait and fills a
// latency gap with it, after which everything below stalls until the group retires; ptxas
// schedules within basic blocks, and this branch ends one. Measured in the forward's SASS: the
// wait for P_j V_j sat above the whole softmax of block j + 1 that was meant to overlap it
// (ncu, d = 256: 11% of the stall samples on it; docs/perf-log.md).
// The value passes through an asm so that no range the compiler knows (a loop bound implying
// it is positive) lets it delete the branch.
FB_DEVICE void keep_waits_below(int never_negative) {
  int v;
  asm volatile("mov.b32 %0, %1;" : "=r"(v) : "r"(never_negative));
  if (v < 0) __nanosleep(1);
}

// Compiler-level fence on the accumulator registers: an empty asm that "reads and writes" each
// one, so the compiler cannot move ordinary uses of them across the wgmma_wait / wgmma_fence
// next to it (the asm statements above do not name the registers). Costs no instruction.
template <int R>
FB_DEVICE void wgmma_fence_operand(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for elements [Lo, Hi) of d: values computed before it stay before it, and uses of
// them after it stay after it (to keep part of a computation on one side of a wgmma_wait).
template <int Lo, int Hi, int R>
FB_DEVICE void wgmma_fence_operand(float (&d)[R]) {
  static_assert(0 <= Lo && Lo <= Hi && Hi <= R, "a range of the array");
#pragma unroll
  for (int i = Lo; i < Hi; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
FB_DEVICE void wgmma_fence_operand(uint32_t (&a)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// Zeroes accumulator registers before a sequence whose first wgmma ignores them (scale-d
// false): the asm still reads them ("+f"), and leaving them unset keeps old values alive.
// Follow with wgmma_fence_operand so the zeroing stays before the next wgmma_fence.
template <int R>
FB_DEVICE void zero_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) d[i] = 0.f;
}

// ------------------------------------------------------------------------------- the MMAs
//
// TransA / TransB = 0: operand K-major (A stored M x K row-major; B stored N x K row-major).
//                 = 1: operand MN-major (A stored K x M; B stored K x N), descriptor operands only.
// E = the input type of A and B (bf16 by default). ScaleA / ScaleB = 1 or -1 (negate the
// operand). accumulate = false: D = A*B (D's old value is ignored, so no zeroing pass is needed
// for the first k-step).

// SS: A and B from shared memory.
template <int N, int TransA = 0, int TransB = 0, Dtype E = Dtype::kBf16, int ScaleA = 1,
          int ScaleB = 1>
FB_DEVICE void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(TransA == 0 || TransA == 1, "TransA is 0 (K-major) or 1 (M-major)");
  static_assert(TransB == 0 || TransB == 1, "TransB is 0 (K-major) or 1 (N-major)");
  static_assert(ScaleA == 1 || ScaleA == -1, "ScaleA is 1 or -1");
  static_assert(ScaleB == 1 || ScaleB == -1, "ScaleB is 1 or -1");
#if FLASHBACK_SM90A
  detail::Wgmma<N, E>::template ss<ScaleA, ScaleB, TransA, TransB>(d, desc_a, desc_b,
                                                                    accumulate ? 1u : 0u);
#else
  __trap();
#endif
}

// SS, first k-step of a fresh accumulator: D = A*B with D's registers only written. Unlike
// wgmma_ss(..., false) it needs no zeroing pass before it (with "+f" the asm reads D, so the
// caller must define it: 40 register moves per S tile in the forward's loop) and keeps no old
// value alive.
template <int N, int TransA = 0, int TransB = 0, Dtype E = Dtype::kBf16, int ScaleA = 1,
          int ScaleB = 1>
FB_DEVICE void wgmma_ss_set(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(TransA == 0 || TransA == 1, "TransA is 0 (K-major) or 1 (M-major)");
  static_assert(TransB == 0 || TransB == 1, "TransB is 0 (K-major) or 1 (N-major)");
  static_assert(ScaleA == 1 || ScaleA == -1, "ScaleA is 1 or -1");
  static_assert(ScaleB == 1 || ScaleB == -1, "ScaleB is 1 or -1");
#if FLASHBACK_SM90A
  detail::Wgmma<N, E>::template ss_set<ScaleA, ScaleB, TransA, TransB>(d, desc_a, desc_b);
#else
  __trap();
#endif
}

// RS: A from registers (always K-major: PTX has no transpose for a register A), B from shared
// memory. Fragment layout: see a_frag_row / a_frag_col below.
template <int N, int TransB = 0, Dtype E = Dtype::kBf16, int ScaleA = 1, int ScaleB = 1>
FB_DEVICE void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                        bool accumulate) {
  static_assert(TransB == 0 || TransB == 1, "TransB is 0 (K-major) or 1 (N-major)");
  static_assert(ScaleA == 1 || ScaleA == -1, "ScaleA is 1 or -1");
  static_assert(ScaleB == 1 || ScaleB == -1, "ScaleB is 1 or -1");
#if FLASHBACK_SM90A
  detail::Wgmma<N, E>::template rs<ScaleA, ScaleB, TransB>(d, a, desc_b, accumulate ? 1u : 0u);
#else
  __trap();
#endif
}

// ----------------------------------------------------------------------- fragment layouts
//
// Accumulator of m64nNk16 (fp32): thread t of the warpgroup (warp w = t/32, lane l = t%32) holds
// N/2 registers d[r]. Register r sits at
//   row = 16*w + l/4 + 8*((r >> 1) & 1)        col = 8*(r >> 2) + 2*(l % 4) + (r & 1)
// i.e. each thread owns two rows (16w + l/4 and that + 8) and, for every 8-column block j,
// columns 8j + 2(l%4) + {0,1} of both rows: d[4j], d[4j+1] in the first row, d[4j+2], d[4j+3] in
// the second. A row is spread over the 4 lanes of a quad (reduce with xor-shuffles 1 and 2).
__host__ __device__ constexpr int acc_row(int r, int t) {
  return 16 * (t / 32) + (t % 32) / 4 + 8 * ((r >> 1) & 1);
}
__host__ __device__ constexpr int acc_col(int r, int t) { return 8 * (r >> 2) + 2 * (t % 4) + (r & 1); }

// Register A of the RS form (64 x 16, four .b32 registers of two 16-bit elements each; the low half is
// the lower column): a[j] holds A[row][col], A[row][col+1] with
//   row = 16*w + l/4 + 8*(j & 1)                col = 2*(l % 4) + 8*(j >> 1)
// This equals the accumulator layout of columns 16c..16c+15, so an fp32 accumulator converts in
// place into the A operand of the next wgmma: a[j] = pack(d[8c + 2j], d[8c + 2j + 1]).
__host__ __device__ constexpr int a_frag_row(int j, int t) {
  return 16 * (t / 32) + (t % 32) / 4 + 8 * (j & 1);
}
__host__ __device__ constexpr int a_frag_col(int j, int t) { return 2 * (t % 4) + 8 * (j >> 1); }

// Two floats -> one bf16x2 register (round to nearest even), low half = `lo`.
FB_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two floats -> one fp16x2 register (round to nearest even), low half = `lo`.
FB_DEVICE uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two floats -> one register of two E elements (the kernels' one conversion point).
template <Dtype E>
FB_DEVICE uint32_t pack2(float lo, float hi) {
  if constexpr (E == Dtype::kF16) {
    return pack_f16x2(lo, hi);
  } else {
    return pack_bf16x2(lo, hi);
  }
}

// k-block c (columns 16c..16c+15) of an fp32 accumulator as the A operand of an RS wgmma.
template <Dtype E = Dtype::kBf16, int R>
FB_DEVICE void acc_to_a_frag(const float (&d)[R], int c, uint32_t (&a)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = pack2<E>(d[8 * c + 2 * j], d[8 * c + 2 * j + 1]);
}

}  // namespace hopper
}  // namespace flashback
