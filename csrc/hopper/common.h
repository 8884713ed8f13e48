// Shared basics for the Hopper (sm_90a) wrappers: address conversion, proxy fences, elect.
//
// Every wrapper in csrc/hopper/ is one PTX instruction (or one fixed idiom) with a comment that
// says why it exists and which rule of the PTX ISA it follows. Facts and their sources:
// the project's Hopper notes, docs/hopper-facts.md (the design is in docs/design.md); their
// section numbers are quoted as "hopper-facts.md §n".
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

// wgmma and setmaxnreg exist only on the arch-specific sm_90a target. A compute_90 (or host) pass
// must not see their asm, so their wrappers compile to a trap elsewhere (hopper-facts.md §0).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHBACK_SM90A 1
#else
#define FLASHBACK_SM90A 0
#endif

#define FB_DEVICE __device__ __forceinline__

namespace flashback {
namespace hopper {

// 32-bit shared-window address of a __shared__ object. PTX shared-memory operands
// (mbarrier, cp.async.bulk, wgmma descriptors, mapa) take this form, not a generic pointer.
FB_DEVICE uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Rounds a shared-memory pointer up to `align` bytes. 128B-swizzled tiles must start on a
// 1024-byte boundary because the swizzle is keyed on absolute address bits [9:7] (hopper-facts.md §2.1);
// the alignment of `extern __shared__` is not documented, so kernels over-allocate and round up.
template <typename T = uint8_t>
FB_DEVICE T* align_smem(void* ptr, uint32_t align = 1024) {
  uint32_t a = smem_u32(ptr);
  uint32_t pad = (align - (a & (align - 1))) & (align - 1);
  return reinterpret_cast<T*>(static_cast<uint8_t*>(ptr) + pad);
}

// Orders this thread's earlier generic-proxy shared-memory writes (st.shared, stmatrix) before
// later async-proxy reads of the same bytes (wgmma operands, TMA store/reduce sources).
// Each writing thread executes it, then a barrier, then the async consumer runs (hopper-facts.md §6).
FB_DEVICE void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The same between the generic and the async proxy for global memory. Used around a turn handed
// on between CTAs: after the acquire, before a bulk reduce into global memory (async proxy), and
// after the reduce's cp.async.bulk.wait_group 0, before the release. Whether the wait's
// completion already orders the reduce for the release is not settled here, so both fences stay
// (hopper-facts.md section 6).
FB_DEVICE void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// A global int read with acquire, and an add to it with release, at GPU scope: a counter that
// hands a turn from CTA to CTA (the deterministic backward's dQ turns).
FB_DEVICE int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
FB_DEVICE void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// The same add that also acquires and returns the old value: the last of n CTAs to count
// (old + v == n) has acquired what every earlier one released before its count, and can
// publish that onward with one more release (the backward's dQ conversion queue).
FB_DEVICE int atom_acq_rel_gpu_add(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// Makes mbarrier.init visible to the async proxy (TMA complete_tx) and to other CTAs of the
// cluster. Follow with __syncthreads() or a cluster barrier before anyone uses the barrier.
FB_DEVICE void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One deterministic leader lane of the (fully active) warp. Cheaper and clearer than
// `lane == 0` when the issuing lane does not matter (TMA issue, mbarrier arrive).
FB_DEVICE bool elect_one() {
  uint32_t pred = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "elect.sync _|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(pred));
  return pred != 0;
}

// 2^x with the one SFU instruction (MUFU.EX2), results below 2^-126 flushed to 0. exp2f compiles
// to MUFU.EX2 plus a range test and two predicated multiplies that keep subnormal results, three
// more instructions per element; in the attention softmax (80 exponentials per thread per key
// block) they were ~1/5 of the consumer loop. Flushing is harmless there: p < 2^-126 is at least
// 2^-126 below the row maximum's p = 1. ex2(-inf) = +0; max relative error ~2^-22 (PTX ISA,
// ex2.approx.ftz.f32).
FB_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Index of this thread's warpgroup (4 consecutive warps starting at a warp rank divisible by 4;
// wgmma and setmaxnreg operate on these). Read through __shfl_sync so the compiler knows it is
// warp-uniform and keeps role branches uniform.
FB_DEVICE int warpgroup_index() { return __shfl_sync(0xffffffff, threadIdx.x / 128, 0); }

}  // namespace hopper
}  // namespace flashback
