// stmatrix tests: one warp stores a 16 x 16 bf16 matrix A, held in the mma fragment layout
// (lane l: row l/4, columns 2(l%4), 2(l%4)+1 of each 8 x 8 block), into shared memory: with
// .trans as A^T, .x4 (all four 8 x 8 blocks) or .x2 (the left 16 x 8 half only); without .trans
// (.x4) as A. The shared tile is then copied out as is; the caller compares.
#include "test_common.h"

namespace fh = flashback::hopper;

namespace {

// Lane l's registers of the four 8 x 8 blocks of A (16 x 16, row-major), block m = rows
// 8 (m & 1).., columns 8 (m >> 1)..  (the order of the A-fragment registers).
__device__ void load_frags(const uint16_t* a, int l, uint32_t (&r)[4]) {
  for (int m = 0; m < 4; ++m) {
    const int row = 8 * (m & 1) + l / 4;
    const int col = 8 * (m >> 1) + 2 * (l % 4);
    r[m] = static_cast<uint32_t>(a[row * 16 + col]) | (static_cast<uint32_t>(a[row * 16 + col + 1]) << 16);
  }
}

__global__ void stmatrix_trans_kernel(const uint16_t* a, uint16_t* out, int x4) {
  __shared__ __align__(128) uint16_t tile[16 * 16];
  const int l = threadIdx.x;
  for (int i = l; i < 256; i += 32) tile[i] = 0xFFFF;  // NaN: unwritten elements show
  __syncwarp();
  uint32_t r[4];
  load_frags(a, l, r);
  // Lane 8m + i gives the address of row i of stored block m: row (8 (m >> 1) + i) of A^T,
  // starting at column 8 (m & 1).
  const int m = (l / 8) % (x4 ? 4 : 2);
  const int i = l % 8;
  const uint32_t addr = fh::smem_u32(tile + (8 * (m >> 1) + i) * 16 + 8 * (m & 1));
  if (x4) {
    fh::stmatrix_x4_trans(addr, r[0], r[1], r[2], r[3]);
  } else {
    fh::stmatrix_x2_trans(addr, r[0], r[1]);
  }
  __syncwarp();
  for (int k = l; k < 256; k += 32) out[k] = tile[k];
}

// Without .trans (x4): lane 8m + i gives the address of row i of block m, which lands as is.
__global__ void stmatrix_plain_kernel(const uint16_t* a, uint16_t* out) {
  __shared__ __align__(128) uint16_t tile[16 * 16];
  const int l = threadIdx.x;
  for (int i = l; i < 256; i += 32) tile[i] = 0xFFFF;
  __syncwarp();
  uint32_t r[4];
  load_frags(a, l, r);
  const int m = l / 8;
  const int i = l % 8;
  fh::stmatrix_x4(fh::smem_u32(tile + (8 * (m & 1) + i) * 16 + 8 * (m >> 1)), r[0], r[1], r[2], r[3]);
  __syncwarp();
  for (int k = l; k < 256; k += 32) out[k] = tile[k];
}

// ldmatrix .trans reading back what stmatrix .trans stored: A^T is written plainly into shared
// memory, each lane loads A's fragments with the addresses stmatrix_trans_kernel stores with
// (x4: all four blocks; x2: the left 16 x 8 half, blocks 0 and 1) and writes them out in A's
// layout, the blocks it did not load left NaN.
__global__ void ldmatrix_trans_kernel(const uint16_t* a, uint16_t* out, int x4) {
  __shared__ __align__(128) uint16_t tile[16 * 16];
  const int l = threadIdx.x;
  for (int k = l; k < 256; k += 32) tile[(k % 16) * 16 + k / 16] = a[k];  // A^T
  for (int k = l; k < 256; k += 32) out[k] = 0xFFFF;
  __syncwarp();
  const int m = (l / 8) % (x4 ? 4 : 2);
  const int i = l % 8;
  const uint32_t addr = fh::smem_u32(tile + (8 * (m >> 1) + i) * 16 + 8 * (m & 1));
  uint32_t r[4] = {0, 0, 0, 0};
  if (x4) {
    fh::ldmatrix_x4_trans(addr, r[0], r[1], r[2], r[3]);
  } else {
    fh::ldmatrix_x2_trans(addr, r[0], r[1]);
  }
  __syncwarp();
  for (int b = 0; b < (x4 ? 4 : 2); ++b) {
    const int row = 8 * (b & 1) + l / 4;
    const int col = 8 * (b >> 1) + 2 * (l % 4);
    out[row * 16 + col] = static_cast<uint16_t>(r[b] & 0xFFFF);
    out[row * 16 + col + 1] = static_cast<uint16_t>(r[b] >> 16);
  }
}

}  // namespace

// a: bf16 [16][16] row-major; out: bf16 [16][16] = A read back by ldmatrix .trans from A^T in
// shared memory (x4 = 1), or for x4 = 0 its rows 0..15, columns 0..7 with the rest left NaN.
FBH_EXPORT int fbh_ldmatrix_trans(const void* a, void* out, int x4) {
  ldmatrix_trans_kernel<<<1, 32>>>(static_cast<const uint16_t*>(a), static_cast<uint16_t*>(out), x4);
  return (int)cudaGetLastError();
}

// a: bf16 [16][16] row-major; out: the same matrix, stored by stmatrix .x4 without .trans.
FBH_EXPORT int fbh_stmatrix_plain(const void* a, void* out) {
  stmatrix_plain_kernel<<<1, 32>>>(static_cast<const uint16_t*>(a), static_cast<uint16_t*>(out));
  return (int)cudaGetLastError();
}

// a: bf16 [16][16] row-major; out: bf16 [16][16] = A^T (x4 = 1) or, for x4 = 0, rows 0..7 of
// A^T (columns 0..7 of A) with the rest left NaN.
FBH_EXPORT int fbh_stmatrix_trans(const void* a, void* out, int x4) {
  stmatrix_trans_kernel<<<1, 32>>>(static_cast<const uint16_t*>(a), static_cast<uint16_t*>(out),
                                   x4);
  return (int)cudaGetLastError();
}
