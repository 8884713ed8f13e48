// stmatrix: a warp stores 8x8 b16 matrices from register fragments to shared memory.
// PTX ISA §9.7.14.5.16 (sm_90, PTX 7.8); hopper-facts.md §3.
//
// Why: a wgmma accumulator converted to bf16 (pack_bf16x2) holds, for every 8 x 8 block, lane l's
// row l/4 and columns 2(l%4), 2(l%4)+1 -- the fragment stmatrix takes. With .trans the block lands
// transposed: row address i (given by lane 8m + i for matrix m) receives column i of the block,
// i.e. its 8 rows as 16 contiguous bytes. That turns an accumulator [rows][cols] into a
// shared-memory tile [cols][rows] without shuffles or 2-byte stores (P^T, dS^T and the dK/dV
// epilogue of the Hopper backward).
//
// Addresses: 16-byte aligned, one per lane; .x4 uses lanes 0..31 (matrix m = lane / 8), .x2
// lanes 0..15. Generic-proxy stores: a wgmma or TMA that reads them needs
// fence_proxy_async_shared() and a barrier first.
#pragma once

#include "hopper/common.h"

namespace flashback {
namespace hopper {

// Without .trans: row address i of matrix m receives row i of the block (lanes 4i..4i+3's
// registers m), 16 contiguous bytes; an accumulator [rows][cols] lands as the tile [rows][cols].
FB_DEVICE void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

FB_DEVICE void stmatrix_x4_trans(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                 uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                   smem_addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

FB_DEVICE void stmatrix_x2_trans(uint32_t smem_addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};" ::"r"(smem_addr),
               "r"(r0), "r"(r1)
               : "memory");
}

// ldmatrix .trans, the inverse (PTX ISA §9.7.14.5.15, sm_75+): the same addresses as the
// stmatrix .trans that stored a tile give back the fragments it took, so a tile [cols][rows]
// written from accumulators is read into the accumulator layout of [rows][cols] (the d = 256
// backward split by role reads P^T back as P; bwd_sm90.h, sdp_by_role). A generic-proxy read:
// the writes it reads need a barrier (or __syncwarp within a warp) before it.
FB_DEVICE void ldmatrix_x4_trans(uint32_t smem_addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                 uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr)
               : "memory");
}

FB_DEVICE void ldmatrix_x2_trans(uint32_t smem_addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr)
               : "memory");
}

}  // namespace hopper
}  // namespace flashback
