// The hang guard of the Hopper kernels' mbarrier waits (hopper/mbarrier.h), included by each
// kernel's launch header before anything that includes the Hopper layer.
//
// A wrong barrier count or byte count would hang the GPU; trap instead once one wait has spun
// for 1e12 cycles (~8 minutes at 2 GHz): far beyond any legitimate wait, even with the GPU
// time-sliced or the process stopped in a debugger, yet a hang still ends. The GPU tests build
// the Hopper primitives with a ~2 s limit. By default the spin reads clock64 once before its
// first try (one CS2R per wait in SASS, also when the phase is already complete) and then on each
// retry; a config may instead try first and read the clock only after a failed try, or retry with
// a suspend-time hint as FA3's waits do (hopper/wait_style.h: chosen per config by measurement).
#pragma once

#ifndef FLASHBACK_MBAR_TIMEOUT_CYCLES
#define FLASHBACK_MBAR_TIMEOUT_CYCLES 1000000000000ll
#endif
