// Programmatic dependent launch (PDL): the kernel after this one on the stream may be scheduled
// before this one has finished, and waits for it only where it reads what this one wrote.
// PTX ISA, griddepcontrol; Programming Guide, "Programmatic Dependent Launch and
// Synchronization"; hopper-facts.md §15.
//
// A kernel launched with pdl_attribute() (the secondary) may start once every CTA of the kernel
// before it (the primary) has executed launch_dependents() or exited. Until it executes
// grid_dependency_wait() nothing the primary wrote is guaranteed visible, so the secondary
// keeps to work that does not depend on it (barrier init, tensor-map prefetch, loads of the
// call's inputs) above its wait. What came before the primary on the stream finished before
// the primary started, so the inputs are safe to read, unless the primary is itself a
// secondary that triggered before its own wait (then its own primary may still run: a chain of
// early triggers carries no such guarantee, and the kernels in it say what they rely on
// instead; the backward's split last wave, bwd_sm90_launch.cuh). Launched without the
// attribute, the wait returns at once: a kernel with these calls is correct either way.
#pragma once

#include <utility>

#include "hopper/cluster.h"
#include "hopper/common.h"

namespace flashback {
namespace hopper {

// ------------------------------------------------------------------------------------ host ---

// The launch attribute that lets a kernel start before the one before it on the stream ends.
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return attr;
}

// Launch `kernel` in clusters of `cluster` CTAs (none when it is 1 x 1 x 1) and, with `pdl`,
// as the secondary of the kernel before it on `stream`.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                 size_t smem_bytes, cudaStream_t stream, dim3 cluster, bool pdl,
                                 Args&&... args) {
  cudaLaunchAttribute attr[2] = {};
  cudaLaunchConfig_t config = cluster_config(grid, block, smem_bytes, stream, cluster, &attr[0]);
  if (cluster.x * cluster.y * cluster.z == 1) config.numAttrs = 0;  // no cluster attribute
  if (pdl) attr[config.numAttrs++] = pdl_attribute();
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// ---------------------------------------------------------------------------------- device ---

// The calling thread waits until every primary grid has completed and its memory operations are
// visible to this grid. Per thread: only the threads that touch the primary's output need it.
FB_DEVICE void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// This CTA lets the dependent grid be scheduled: it starts once every CTA of this grid has
// called this or exited (a CTA's first call counts, later ones do nothing). It orders no memory:
// the dependent still waits with grid_dependency_wait() before reading this grid's output.
FB_DEVICE void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace hopper
}  // namespace flashback
