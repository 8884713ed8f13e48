// How a kernel's blocking mbarrier waits spin (hopper::mbar_wait<S>): a per-config choice of the
// forward and backward families (FwdSm90Config / BwdSm90Config::wait_style). Host-visible (no
// device code), so the config headers can name it.
//
// The styles execute the same tries; they differ in a few instructions per wait, and what that
// did to ptxas's schedule of the loops around the waits moved kernels by -3..+2% with a sign per
// kernel, steady across repeats (docs/perf-log.md, "Measured 2026-12-07, eighth run"). So each
// config names the style it measured fastest with, and a build can force one style on every
// kernel to measure it (FLASHBACK_WAIT_STYLE=0/1/2 as a compile definition).
#pragma once

namespace flashback {
namespace hopper {

enum class WaitStyle : int {
  // The hang guard's clock read, then try until done (the guard compares after each failure).
  kSpin = 0,
  // One try first; only after a second failed try the guard's clock is read and the spin starts:
  // a wait that finds its phase complete costs a try and a branch.
  kTryFirst = 1,
  // kTryFirst, with the spin's tries carrying a suspend-time hint (FLASHBACK_MBAR_SUSPEND_NS,
  // 10 ms: the thread sleeps in the try until the phase completes or the hint runs out), the
  // form FA3's waits compile to.
  kTryFirstSleep = 2,
};

// The style a config's kernels use: its own, or the build's FLASHBACK_WAIT_STYLE.
constexpr WaitStyle effective_wait_style(WaitStyle configured) {
#if defined(FLASHBACK_WAIT_STYLE)
  static_assert(FLASHBACK_WAIT_STYLE >= 0 && FLASHBACK_WAIT_STYLE <= 2, "FLASHBACK_WAIT_STYLE is 0, 1 or 2");
  return (void)configured, static_cast<WaitStyle>(FLASHBACK_WAIT_STYLE);
#else
  return configured;
#endif
}

}  // namespace hopper
}  // namespace flashback
