// Thread-block clusters: launch, CTA ranks, distributed shared memory (DSMEM), cluster barrier.
// PTX ISA §9.7.9.23 (mapa), §9.7.13.3 (barrier.cluster); Programming Guide, Thread Block
// Clusters; hopper-facts.md §8.
//
// The CTAs of a cluster run at the same time on one GPC and can read, write and arrive on each
// other's shared memory. Two rules: every CTA must have started before anyone touches a peer's
// shared memory (cluster_sync() after setup), and no CTA may exit while a peer may still access
// its shared memory (cluster_sync() at the end).
#pragma once

#include <utility>

#include "hopper/common.h"

namespace flashback {
namespace hopper {

// ------------------------------------------------------------------------------------ host ---

// A launch configuration with clusters of (cx, cy, cz) CTAs, its one attribute in `attr`.
inline cudaLaunchConfig_t cluster_config(dim3 grid, dim3 block, size_t smem_bytes,
                                         cudaStream_t stream, dim3 cluster,
                                         cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = cluster.x;
  attr->val.clusterDim.y = cluster.y;
  attr->val.clusterDim.z = cluster.z;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

// Launch `kernel` with clusters of (cx, cy, cz) CTAs; grid dims must be multiples of them.
// cudaLaunchKernelEx is the run-time way to pick the cluster shape (the compile-time way is
// __cluster_dims__). Sizes above 8 also need cudaFuncAttributeNonPortableClusterSizeAllowed.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_with_cluster(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                       size_t smem_bytes, cudaStream_t stream, dim3 cluster,
                                       Args&&... args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = cluster_config(grid, block, smem_bytes, stream, cluster, &attr);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// How many clusters of `cluster` CTAs of `kernel` can be resident at once (0: none fits): the
// co-residency that a schedule whose clusters wait for each other relies on. The kernel's
// dynamic shared-memory attribute must be set first.
template <typename... KernelArgs>
inline cudaError_t max_active_clusters(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                       size_t smem_bytes, dim3 cluster, int* clusters) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = cluster_config(grid, block, smem_bytes, nullptr, cluster, &attr);
  *clusters = 0;
  return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
}

// ---------------------------------------------------------------------------------- device ---

// This CTA's rank in its cluster (0 .. cluster_size-1); used for multicast masks and mapa.
FB_DEVICE uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Number of CTAs in the cluster.
FB_DEVICE uint32_t cluster_size() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

// Shared::cluster address of the variable at local shared address `smem_addr` in CTA `rank`.
FB_DEVICE uint32_t mapa_shared(uint32_t smem_addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr), "r"(rank));
  return r;
}

// DSMEM accesses through a mapa address (may name this CTA or a peer).
FB_DEVICE float ld_shared_cluster_f32(uint32_t cluster_addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_addr) : "memory");
  return v;
}
FB_DEVICE void st_shared_cluster_f32(uint32_t cluster_addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(cluster_addr), "f"(v) : "memory");
}
FB_DEVICE uint32_t ld_shared_cluster_u32(uint32_t cluster_addr) {
  uint32_t v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(cluster_addr) : "memory");
  return v;
}
FB_DEVICE void st_shared_cluster_u32(uint32_t cluster_addr, uint32_t v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(cluster_addr), "r"(v) : "memory");
}
// 16 bytes at a 16-byte aligned mapa address: a thread's piece of a tile sent from registers.
FB_DEVICE void st_shared_cluster_v4(uint32_t cluster_addr, uint4 v) {
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(cluster_addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Cluster barrier, split in two so independent work can go between arrive and wait. Each
// thread arrives once per phase; wait covers all non-exited threads of the cluster. Release /
// acquire: shared-memory writes before the arrive are visible to peers after their wait.
// (Not the .aligned form: callers may reach it from divergent code, e.g. after a one-thread
// producer loop.)
FB_DEVICE void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
FB_DEVICE void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
FB_DEVICE void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

}  // namespace hopper
}  // namespace flashback
