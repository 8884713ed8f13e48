// mbarrier (shared-memory transaction barrier) wrappers, a producer/consumer ring of N stages,
// and named barriers between warpgroups. PTX ISA §9.7.13.15 (mbarrier), §9.7.13.1 (bar);
// hopper-facts.md §5 and §8.
//
// Model: an 8-byte mbarrier holds a phase bit, a pending-arrival count and a transaction (tx)
// byte count. A phase completes when both reach zero; the phase bit then flips and the arrival
// count reloads. Waiters name the phase they wait for by its parity (0 or 1).
#pragma once

#include "hopper/common.h"
#include "hopper/wait_style.h"

namespace flashback {
namespace hopper {

// Sets the expected arrivals per phase (1 .. 2^20-1); phase 0 starts. One thread calls it, then
// fence_mbarrier_init() and a CTA (or cluster) barrier before the barrier is used.
FB_DEVICE void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals)
               : "memory");
}

// One arrival (release semantics at CTA scope: this thread's earlier writes are visible to a
// thread that then observes the phase completed). The returned state token is not needed
// with parity waits, so it goes to a scratch register.
FB_DEVICE void mbar_arrive(uint64_t* bar) {
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n"
      "}\n" ::"r"(smem_u32(bar))
      : "memory");
}

// Announce `bytes` of async (TMA) traffic for the current phase, then arrive once. The phase
// cannot complete until the copies have delivered exactly that many bytes (boxes count in full,
// out-of-bounds parts too: hopper-facts.md §4.2). This is how a TMA producer "commits" a stage.
FB_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// Raise the expected tx count without arriving (e.g. a second thread adding its copies).
FB_DEVICE void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// Mark `bytes` of announced traffic as delivered without a copy (what TMA does internally).
// Useful in tests and when a producer writes a stage with ordinary stores.
FB_DEVICE void mbar_complete_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// Arrive on the barrier at the same offset in CTA `cta_rank` of the cluster (may be this CTA).
// Used to release a stage that a peer's multicast TMA writes into. Remote barriers may only be
// arrived on, never waited on (hopper-facts.md §5). Default semantics (release at CTA scope), as CUTLASS
// uses for its pipelines: enough to hand back a stage whose reads have completed (wgmma_wait).
FB_DEVICE void mbar_arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(cta_rank)
      : "memory");
}

// Same with release at cluster scope: use it when this thread's earlier writes (e.g. DSMEM
// stores into the peer) must be visible to whoever waits on that barrier. It costs a
// MEMBAR.ALL.GPU before the arrive in SASS: per pipeline stage in the GEMM example it cost ~30%
// (474 vs 666 TFLOP/s measured on an H200), so do not use it just to release a stage.
FB_DEVICE void mbar_arrive_cluster_release(uint64_t* bar, uint32_t cta_rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(cta_rank)
      : "memory");
}

// True once the phase with this parity has completed. Valid for the current phase (false until
// it completes) and the one just before it (true). May also return false after a system-defined
// time limit, so callers loop. Acquire at CTA scope: TMA data of that phase is then visible.
// The answer arrives asynchronously (SYNCS.PHASECHK writes its predicate later): ptxas may issue
// this thread's next mbarrier operation before the check has looked, so branch on the result
// before changing the same barrier if the order matters (seen on an H200 in our tests).
FB_DEVICE bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

#ifndef FLASHBACK_MBAR_SUSPEND_NS
#define FLASHBACK_MBAR_SUSPEND_NS 10000000
#endif
// mbar_try_wait with a suspend-time hint: the thread may sleep in the try up to
// FLASHBACK_MBAR_SUSPEND_NS nanoseconds, waking when the phase completes (WaitStyle::kTryFirstSleep).
FB_DEVICE bool mbar_try_wait_sleep(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity), "n"(FLASHBACK_MBAR_SUSPEND_NS)
      : "memory");
  return done != 0;
}

// Same with acquire at cluster scope: needed when the phase publishes data that other CTAs
// wrote with ordinary (generic) stores, e.g. DSMEM st.shared::cluster + a release arrive.
// Costs an L1 invalidate (CCTL.IVALL in SASS) after every successful wait. Not needed for TMA
// data, multicast included: the complete_tx of the copy makes its bytes visible to a CTA-scope
// waiter (what CUTLASS's pipelines rely on, and what the GEMM example does).
FB_DEVICE bool mbar_try_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Blocking waits. A phase that never completes (wrong expect_tx bytes, wrong arrival count, wrong
// parity) hangs the kernel; builds that define FLASHBACK_MBAR_TIMEOUT_CYCLES (the GPU tests do)
// trap after that many clock cycles instead, so a bug costs an error, not a hung device.
//
// The trap sits in a separate non-inlined function. Inlined (a BPT.TRAP block inside the
// kernel), ptxas (nvcc 13.0) ignored the registers that setmaxnreg.inc gives a consumer
// warpgroup whose sibling branch (the producer) has code: the bwd_sm90 consumers were
// allocated only up to R171 of 240 and spilled around every wgmma (C7512). With the call the
// same kernel compiles spill-free (SASS up to R215); the call is on the cold path only.
#if defined(FLASHBACK_MBAR_TIMEOUT_CYCLES)
static __device__ __noinline__ void mbar_timeout_trap() { __trap(); }
#define FLASHBACK_MBAR_SPIN_EARLY_CLOCK(try_wait_call)                                      \
  do {                                                                                      \
    const long long start_ = clock64();                                                     \
    while (!(try_wait_call)) {                                                              \
      if (clock64() - start_ > (long long)(FLASHBACK_MBAR_TIMEOUT_CYCLES)) mbar_timeout_trap(); \
    }                                                                                       \
  } while (0)
// The same with the guard's clock read only after a failed try.
#define FLASHBACK_MBAR_SPIN_LATE_CLOCK(try_wait_call)                                         \
  do {                                                                                        \
    if (!(try_wait_call)) {                                                                   \
      const long long start_ = clock64();                                                     \
      while (!(try_wait_call)) {                                                              \
        if (clock64() - start_ > (long long)(FLASHBACK_MBAR_TIMEOUT_CYCLES)) mbar_timeout_trap(); \
      }                                                                                       \
    }                                                                                         \
  } while (0)
#else
#define FLASHBACK_MBAR_SPIN_EARLY_CLOCK(try_wait_call) \
  do {                                                 \
    while (!(try_wait_call)) {                         \
    }                                                  \
  } while (0)
#define FLASHBACK_MBAR_SPIN_LATE_CLOCK(try_wait_call) FLASHBACK_MBAR_SPIN_EARLY_CLOCK(try_wait_call)
#endif
// The raw spins outside mbar_wait (global-memory counters): the late clock where a build forces a
// try-first style on every kernel (so that such a build measures that style everywhere).
#if defined(FLASHBACK_WAIT_STYLE) && FLASHBACK_WAIT_STYLE > 0
#define FLASHBACK_MBAR_SPIN(try_wait_call) FLASHBACK_MBAR_SPIN_LATE_CLOCK(try_wait_call)
#else
#define FLASHBACK_MBAR_SPIN(try_wait_call) FLASHBACK_MBAR_SPIN_EARLY_CLOCK(try_wait_call)
#endif

// A raw spin (a global counter's acquire load, not an mbarrier) in WaitStyle S: the early clock
// for kSpin, the late one for the try-first styles (no suspend hint: there is no try to carry it).
#define FLASHBACK_MBAR_SPIN_STYLED(S, try_wait_call)                       \
  do {                                                                     \
    if constexpr ((S) == ::flashback::hopper::WaitStyle::kSpin) {          \
      FLASHBACK_MBAR_SPIN(try_wait_call);                                  \
    } else {                                                               \
      FLASHBACK_MBAR_SPIN_LATE_CLOCK(try_wait_call);                       \
    }                                                                      \
  } while (0)

// S: the config's WaitStyle (hopper/wait_style.h), as effective_wait_style gives it.
template <WaitStyle S = WaitStyle::kSpin>
FB_DEVICE void mbar_wait(uint64_t* bar, uint32_t parity) {
  if constexpr (S == WaitStyle::kSpin) {
    FLASHBACK_MBAR_SPIN(mbar_try_wait(bar, parity));
  } else {
    if (mbar_try_wait(bar, parity)) return;
    if constexpr (S == WaitStyle::kTryFirstSleep) {
      FLASHBACK_MBAR_SPIN_LATE_CLOCK(mbar_try_wait_sleep(bar, parity));
    } else {
      FLASHBACK_MBAR_SPIN_LATE_CLOCK(mbar_try_wait(bar, parity));
    }
  }
}

// The try-first styles change only the spin's clock read here (what the measured builds did).
template <WaitStyle S = WaitStyle::kSpin>
FB_DEVICE void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  if constexpr (S == WaitStyle::kSpin) {
    FLASHBACK_MBAR_SPIN(mbar_try_wait_cluster(bar, parity));
  } else {
    FLASHBACK_MBAR_SPIN_LATE_CLOCK(mbar_try_wait_cluster(bar, parity));
  }
}

// ---------------------------------------------------------------------------------------------
// Producer/consumer ring of `Stages` shared-memory stages (the TMA pipeline).
//
//   full[s]  : 1 arrival (the producer's arrive_expect_tx) + the stage's TMA bytes.
//   empty[s] : `consumer_arrivals` arrivals per use (e.g. one per consumer warp).
//
// Both sides walk the same sequence of (stage, phase) with PipelineState. The consumer waits for
// full[s] with parity `phase`; the producer waits for empty[s] with parity `phase ^ 1`, so its
// first pass over the ring does not block: on a fresh barrier (phase 0 in progress) parity 1
// names the "preceding" phase, which counts as completed (PTX try_wait rule; CUTLASS starts its
// producer state at phase 1 for the same reason).
// ---------------------------------------------------------------------------------------------
template <int Stages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  FB_DEVICE void advance() {
    if (++stage == Stages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

template <int Stages>
struct TmaPipeline {
  static_assert(Stages >= 1, "a ring needs at least one stage");
  uint64_t full[Stages];
  uint64_t empty[Stages];

  // One thread. Follow with fence_mbarrier_init() (done here) and a CTA/cluster barrier.
  FB_DEVICE void init(uint32_t consumer_arrivals) {
    for (int s = 0; s < Stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], consumer_arrivals);
    }
    fence_mbarrier_init();
  }
  // Producer: block until every consumer released this stage's previous contents.
  template <WaitStyle S = WaitStyle::kSpin>
  FB_DEVICE void producer_acquire(const PipelineState<Stages>& st) {
    mbar_wait<S>(&empty[st.stage], st.phase ^ 1);
  }
  // Producer (the one issuing thread): announce the stage's bytes; issue the TMA copies with
  // &full[stage] as their completion barrier right after.
  FB_DEVICE void producer_expect(const PipelineState<Stages>& st, uint32_t bytes) {
    mbar_arrive_expect_tx(&full[st.stage], bytes);
  }
  FB_DEVICE uint64_t* full_barrier(const PipelineState<Stages>& st) { return &full[st.stage]; }
  // Consumer: block until the stage's data has landed.
  template <WaitStyle S = WaitStyle::kSpin>
  FB_DEVICE void consumer_wait(const PipelineState<Stages>& st) {
    mbar_wait<S>(&full[st.stage], st.phase);
  }
  // Consumer: one arrival (call from one thread per arriving unit, after the last read of the
  // stage has finished -- for wgmma operands, after the covering wgmma_wait).
  FB_DEVICE void consumer_release(const PipelineState<Stages>& st) { mbar_arrive(&empty[st.stage]); }
  // Same, on the empty barrier of CTA `cta_rank` of the cluster (multicast stages: a stage may be
  // refilled only when the consumers of every CTA it is multicast to have released it). The
  // waits above stay CTA-scope also with multicast (see mbar_try_wait_cluster).
  FB_DEVICE void consumer_release_cluster(const PipelineState<Stages>& st, uint32_t cta_rank) {
    mbar_arrive_cluster(&empty[st.stage], cta_rank);
  }
};

// ---------------------------------------------------------------------------------------------
// Named barriers: 16 per CTA, id 0 is __syncthreads(). They let two warpgroups hand data to each
// other without stopping the rest of the CTA (e.g. the producer warpgroup). `threads` counts all
// participants (arrivers + syncers), a multiple of 32.
// ---------------------------------------------------------------------------------------------

// Arrive and wait until `threads` threads have arrived at barrier `id`.
FB_DEVICE void named_bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrive without waiting (the signalling side of a producer -> consumer hand-off).
FB_DEVICE void named_bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace hopper
}  // namespace flashback
