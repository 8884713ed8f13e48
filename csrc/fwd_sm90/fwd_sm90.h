// Hopper (sm_90a) forward, one kernel family for head dims 64-256 in bf16 and fp16: the fast
// path of flashback_attention_forward. docs/design.md describes the algorithm and budgets.
//
// Files, one per role:
//   fwd_sm90.h             this: the config, the kernel parameters, the entry points
//   fwd_sm90_scheduler.cuh which (Q block, head, batch) a CTA owns; the K/V blocks it walks
//   fwd_sm90_mainloop.cuh  TMA producer and the consumer warpgroups (S = Q K^T, online
//                          softmax, O += P V; ping-pong turns where the config asks)
//   fwd_sm90_epilogue.cuh  O / l to bf16 through shared memory, LSE
//   fwd_sm90_launch.cuh    kernel, tensor maps, the launch of one config (a template)
//   fwd_sm90_launch.cu     the table of configs, can_implement, the dispatch
//   fwd_sm90_hdim*.cu      the instances of one head dim (one file each: parallel builds)
// Shared with the backward: csrc/sm90/sm90_common.h (tensor maps, layout test, causal ranges).
#pragma once

#include <cuda_runtime.h>

#include "common/fast_div.h"
#include "hopper/wait_style.h"
#include "flashback/flashback.h"

namespace flashback {
namespace sm90 {

// One member of the family. Everything else (threads, register budget check, barrier arrival
// counts, the shared-memory plan) is derived from it in FwdSm90Traits and checked at compile time.
struct FwdSm90Config {
  int head_dim;       // 64 x atoms (64-element, 128-byte columns of the swizzled tiles)
  int block_n;        // K/V rows per step (a multiple of 16; the S wgmma's N)
  int consumer_wgs;   // MMA warpgroups, 64 query rows each: block_m = 64 x consumer_wgs
  int kv_stages;      // K and V pipeline depth
  int producer_regs;  // setmaxnreg of the TMA warpgroup
  int consumer_regs;  // setmaxnreg of the MMA warpgroups
  bool pingpong;      // the consumer warpgroups take turns issuing their GEMMs (mainloop)
  // A persistent grid may take its tiles from a global counter in the scheduler's order
  // (longest first when causal) as each CTA's producer becomes free, instead of the static
  // stride blockIdx.x + k gridDim.x (fwd_sm90_dynamic says when; fwd_sm90_launch.cuh).
  bool dynamic_tiles = false;
  // The wait for P_j V_j kept below the softmax of block j + 1 (hopper::keep_waits_below): in
  // the SASS without it ptxas puts that wait right after the wait for S_{j+1}, above the
  // softmax, which then never overlaps P_j V_j (ncu, d = 256 non-causal 8k: 11% of the stall
  // samples on the wait; FA3's kernel keeps about half its exponentials above it). Measured
  // (H200, bf16): d = 256 +1.0..+3.2%, d = 192 -2.6..+9.1% (+1.4% mean), d = 128 -5.6..+0.7%,
  // d = 64 -1.3..-6.3%: on at d = 192 and 256, and in the d = 128 FullLong config (176-key
  // blocks with ping-pong, below) (docs/perf-log.md).
  bool pv_wait_below = false;
  // One Q stage (d >= 192): the tile's O staged over the V stages instead of its Q stage, so Q is
  // freed once the tile's last S has been waited for and the next tile's Q (and K_0) load during
  // this tile's last P V and epilogue; the producer holds the next tile's V_0 (and, with
  // k_ahead, K_1, which it issues after the wait) until the O has left (an "O free" barrier per
  // tile). A persistent grid (tiles from the counter when causal)
  // then starts no tile with a bare Q load. On at d = 192 / 256 for the calls a persistent grid
  // serves (the Multi configs below); -5..-10% causal at 4k-16k (on the counter there).
  bool o_over_v = false;
  // dynamic_tiles: the producer takes the next tile's id from the counter after it has issued
  // this tile's last K/V loads (about kv_stages key blocks before the tile ends) instead of as
  // the tile starts, so a busy CTA does not hold a reserved tile that a freed CTA could run.
  // scripts/fwd_balance_model.py: the reservation a tile ahead costs 2-10% against one CTA per
  // tile on long causal d = 192 / 256 rows, the late one gains 1-3.5% there. Measured (H200,
  // bf16): +1.1..+2.4% on the counter-fed d = 192 / 256 calls at 512-1024, and it turned the
  // counter's loss on long causal d = 192 rows into a gain (docs/perf-log.md, "The runbook
  // measured"): on at d = 192 / 256; at d = 128 +0.5..+1.1% causal 512-8192 (docs/perf-log.md,
  // "O by TMA"): on there too.
  bool late_tile_fetch = false;
  // O leaves by TMA: each warp writes its 16 rows of O / l with stmatrix into the staging tile
  // (the same swizzled layout TMA loads Q in), and one thread per warpgroup stores the d / 64
  // boxes of 64 rows with bulk tensor copies, instead of 32-bit stores, a barrier, 16-byte loads
  // and 16-byte global stores by every thread (at d = 192: 12 stmatrix against 48 + 12 + 12 per
  // thread). The consumers are free for the next tile once the copy has read the tile. A
  // warpgroup whose 64 rows run past seqlen_q (a varlen map would write into the next sequence)
  // or an out whose layout TMA cannot take keeps the per-thread copy. Measured (H200, bf16,
  // docs/perf-log.md "O by TMA"): d = 128 +0.5..+3.1% (every call), d = 256 one CTA per tile
  // +0.7..+2.0%, d = 192 one CTA per tile +0.3..+1.2% (no d = 192 call runs one CTA per tile
  // since: its grid row sends every call to the Multi config); with o_over_v (the d = 192 Multi
  // config) -0.3..-1.1%, at d = 64 -0.4..-0.6% causal: on where it gained, except the d = 128
  // non-causal calls (kFwdSm90Hdim128Full); the d = 256 Multi config has it since, measured
  // there with copy_out_early (below).
  bool tma_store_o = false;
  // The key blocks a warpgroup's 64 rows see whole (no key past seqlen_k, none after a row's
  // diagonal) run in a loop of their own whose softmax has no mask code, then the blocks that
  // need it in a second loop, instead of one loop that branches on the mask per block. FA3's
  // causal kernels have the two loops (SASS: 469 and 616 instructions per block at d = 128
  // against our one loop of 771 with a 238-instruction mask block); ptxas does not schedule
  // across the branch, so the split gives it the unmasked step as straight-line code. Measured
  // (H200, per call): d = 128 causal +3.5..+8.1%, d = 64 +0.1..+2.6%, d = 192 -2.9..+2.5% (its
  // short calls +0.3..+1.0%), d = 256 mixed: on at d = 64-192 but the d = 128 non-causal
  // configs (-2.7..+1.9% there, docs/perf-log.md "Measured 2026-12-07, fifth run").
  bool split_mask_loop = false;
  // The row sums, 1 / l and LSE computed between the issue of the tile's last P V and the wait
  // for it (the row statistics are final after the last softmax), instead of after the wait,
  // with the tensor cores idle: ~100 instructions per warp per tile off the tile's tail.
  // Measured with copy_out_early and fast_tile_decode on the d = 256 Multi config (below).
  bool finalize_in_pv = false;
  // The per-thread copy-out of O (no TMA store) as one batch: each thread reads its 16-byte
  // chunk t % 8 of rows t / 8 + 16 k of every atom-column (the swizzle then constant per thread,
  // every offset an immediate), hands the staging buffer back (Q stage, or o_over_v's V stages)
  // and only then issues its global stores, instead of a loop of 16-byte chunks with the row,
  // column, swizzle and 64-bit address worked out per chunk and the buffer handed back after the
  // last global store (~400 instructions per warp per tile at d = 256).
  bool copy_out_early = false;
  // The tile decode (fwd_sm90_work: the tile id to its Q block, head and batch) by precomputed
  // multiply-shift divisors instead of three integer divisions (~20 instructions each), which a
  // persistent CTA runs between its tiles with the tensor cores idle.
  bool fast_tile_decode = false;
  // Ping-pong across a persistent CTA's tiles: the last warpgroup's last turn of a tile hands on
  // to the first warpgroup (opened once, at the first tile with keys; the first warpgroup takes
  // the last hand-on before exit), instead of the rotation closing at each tile's end and the
  // last warpgroup reopening it at the next tile's start, after its epilogue and tile decode.
  // The first warpgroup's first S of tile k + 1 then runs while the last one finishes tile k
  // (FA3's rotation runs on the same way).
  bool pingpong_across_tiles = false;
  // The S = Q K^T issue's descriptors built from 32-bit shared addresses taken once per tile and
  // advanced per k16 step on their low word (hopper::desc_advance_lo). Built from the generic
  // pointers per key block, ptxas re-derives the aligned shared base (S2UR of the CTA id, the
  // 1024-byte round-up) each block and advances both 64-bit descriptors with add + add-with-carry
  // + moves: 8 uniform instructions per S wgmma. A SASS count of the d = 128 non-causal 176-key
  // loop put ours at 647 instructions per key block against FA3's 590, the same math, +48 of the
  // difference in the S issue (docs/perf-log.md, "The forward's S issue in uniform
  // instructions"). Measured (H100, bf16, GPU time, builds interleaved x 2 and x 3): d = 128
  // causal +1.2..+2.1% at 4k-16k, non-causal -0.7..+2.6%; d = 64 -0.2..+1.0% causal, noise
  // non-causal; d = 192 (its Multi config serves every call) non-causal +0.4..+2.2% at 4k-16k,
  // causal -0.7..+0.2% (noise); d = 256 alone -2.1..-0.1% (one +3.2% at non-causal 16k, within a
  // 7% spread) (docs/perf-log.md, "Measured 2026-12-06,
  // fourteenth run"): on at d = 64-192, and at d = 256 with rescale_between.
  bool s_desc_lo = false;
  // The O rescale by block j's factor after S_{j+1} is issued and before P_j V_j (FA3's order:
  // its 128 x 80 d = 256 loop multiplies O while its S wgmmas run), instead of after P_{j-1} V_{j-1}
  // is waited for, where this warpgroup has no wgmma in flight until the next S. With s_desc_lo,
  // in GPU time (H100, bf16, builds interleaved x 2 and x 3): d = 256 causal +1.5..+3.4% at
  // 4k-16k in both runs, non-causal +3.1 / -2.2% at 4k / 8k (16k -6.3 / -0.6%, with 4-7%
  // spreads), on the
  // persistent grid (the Multi config, to 2048 keys) -1.4..+0.2%; d = 192 -1.4..+0.7%. So the
  // d = 256 causal config alone, which also serves the non-causal calls of 2049-4096 keys (as
  // kFwdSm90Hdim256Full; docs/perf-log.md, "Measured 2026-12-06, fourteenth run"). At
  // d = 128 with ping-pong it read -0.7..-5.0% (ninth run).
  bool rescale_between = false;
  // The softmax without its -inf guards and the per-block mask test from a per-tile bound. A row
  // that has seen only masked keys keeps m = -inf: its offset is floored at -FLT_MAX instead of
  // tested (-inf - offset stays -inf, exp2 0), and the rescale factor exp2(m_old * scale -
  // offset) is 0 by itself when m_old = -inf (the API keeps the scale finite and > 0); the same
  // bits for every finite row. Without split_mask_loop, block j takes the mask when j >=
  // masked_from, the bound split_mask_loop's loops use, computed once per tile, instead of two
  // products and two compares per block. A SASS read beside FA3's d = 256 loop (480 executed
  // instructions per key block against 449; the math and the wgmmas equal) put +8 on the guards
  // and +9 on the mask test (docs/perf-log.md, "Ideas not built (after the fourteenth run)").
  bool lean_softmax = false;
  // How the pipeline waits spin (hopper/wait_style.h). kTryFirst: one try before the spin, so a
  // wait already satisfied skips the hang guard's clock read and compare. Measured with every build of
  // the library in one process, call by call in turn (bench_attention.py --builds; H100, bf16,
  // 3 repeats, a copy of the same build at 0.999-1.008, docs/perf-log.md "Measured 2026-12-07,
  // eighth run"): d = 64 forward +0.2..+0.6% at 4k-16k, causal and not (every repeat above); the
  // d = 256 non-causal rows above 4096 keys (FullLong) +1.3..+2.0%; but the d = 256 causal rows
  // -0.2..-0.5% and the non-causal to 4096 keys -0.4%, and the backward -0.3..+0.5%: on at
  // d = 64 and the d = 256 FullLong row. The d = 64 Multi row (causal to 2048 keys, non-causal
  // to 4096) stays off: of its calls only the non-causal 4k point was timed (+0.4%).
  // kTryFirstSleep (the retries with a suspend-time hint) measured below kTryFirst on both rows
  // (d = 64 -3.0..+0.3%, FullLong +0.7..+1.0%).
  hopper::WaitStyle wait_style = hopper::WaitStyle::kSpin;
  // Measured and removed (H100, bf16, GPU time, A B C x 2; docs/perf-log.md, "Measured
  // 2026-12-07, fourth run"): under ping-pong only the first warpgroup waiting for K_j / V_j (the
  // others' turns follow its wait), d = 64 -2.8..-6.5%; with the turns' barrier ids taken once per
  // tile on top, d = 64 -5.1..+1.7%; the wait for P_j V_j after a quarter of block j + 1's
  // exponentials as FA3's loops place it, d = 128 non-causal -2.5..+4.4% (below lean_softmax's
  // gain at every length), causal -0.7..+0.7%, d = 256 -1.9..+0.7%.
};

// The configs, one per table row (fwd_sm90_launch.cu). Per consumer thread: O is 64 x d / 128 =
// d / 2 fp32 registers, S block_n / 2, P as 16-bit A fragments block_n / 4 (S of the next block
// and P of this one are live together: the softmax of block j + 1 overlaps P_j V_j).
// Shared memory: Q stages x block_m x 2d bytes + kv_stages x 2 x block_n x 2d bytes (two Q
// stages where they fit, FwdSm90Traits::kQStages).
//   d = 64:  192 x 128, 3 consumer warpgroups: O 32 + S 64 + P 32 under 160 registers;
//            2 x 24 KB + 2 x 2 x 16 KB = 112 KB. The exponentials cost as much as the GEMMs at
//            this width, so a third warpgroup keeps the tensor cores fed during softmaxes.
//   d = 128: 128 x 128: O 64 + S 64 + P 32; 2 x 32 KB + 2 x 2 x 32 KB = 192 KB.
//   d = 192: 128 x 112: O 96 + S 56 + P 28; 48 KB + 2 x 2 x 42 KB = 216 KB (one Q stage).
//   d = 256: 128 x 80: O 128 + S 40 + P 20; 64 KB + 2 x 2 x 40 KB = 224 KB (one Q stage).
// Ping-pong (the warpgroups issue their GEMMs in turn) measured +3 to +8% at d = 64 (three
// warpgroups, softmax as costly as the GEMMs) and -0 to -6% at d = 128 and 256, mixed at 192
// (docs/perf-log.md, "Forward ping-pong"); at d = 128 causal again per call at the power cap, with
// and without pv_wait_below: -1.5..+1.1% and -3.1..+2.1%, noise (docs/perf-log.md, "Ping-pong
// at d = 128 per call"): on at d = 64 only. There the rotation runs across a persistent CTA's
// tiles (pingpong_across_tiles): +2.3..+8.7% causal, -1.2..+6.0% non-causal at 512-16k (H100,
// docs/perf-log.md, "Measured 2026-12-06, eighth run").
constexpr FwdSm90Config kFwdSm90Hdim64 = {64, 128, 3, 2, 24, 160, true, true, false, false,
                                         false, false, true, false, false, false, true, true,
                                         false, false, hopper::WaitStyle::kTryFirst};
// d = 128 (causal, and its Multi): the statistics in the last P V's shadow and the tile decode
// without divisions, the d = 64 tail changes on top of O by TMA. Measured against the config
// without them (H100, bf16, GPU time, A B A B): causal +2.8 / +2.4 / +1.5 / +0.8 / +0.5 / +0.5%
// at 512-16k. On the non-causal persistent-grid config (kFwdSm90Hdim128Full, per-thread copy-out)
// the same two read +1.5% at 512 and -0.6 / -1.8 / -2.2% at 1024-4096: not there
// (docs/perf-log.md, "Measured 2026-12-06, tenth run").
constexpr FwdSm90Config kFwdSm90Hdim128 = {128, 128, 2, 2, 24, 240, false, true, false, false, true, true,
                                          true, true, false, true, false, true};
// d = 192: the row's causal (and Full) config, whose values can_implement reads; no call runs it
// (kFwdSm90Hdim192Grid sends every call to kFwdSm90Hdim192Multi), so no kernel of it is compiled
// (run_fwd_sm90_entry).
constexpr FwdSm90Config kFwdSm90Hdim192 = {192, 112, 2, 2, 24, 240, false, true, true, false, true, true,
                                          false, false, false, false, false, true};
// d = 256 causal above 2048 keys and, as kFwdSm90Hdim256Full, non-causal 2049-4096 (one CTA per
// tile): s_desc_lo with rescale_between (above).
constexpr FwdSm90Config kFwdSm90Hdim256 = {256, 80, 2, 2, 24, 240, false, true, true, false, true, true,
                                          false, false, false, false, false, true, true};
// The config of a head dim's non-causal calls: the tile shape may differ with the mask (FA3's
// public choices do at d = 128: 176 keys per block without the mask, 128 with it). Where one
// config serves both, the same object (and the same instance). Both of a head dim share
// consumer_wgs: can_implement reads the causal one's.
static constexpr const FwdSm90Config& kFwdSm90Hdim64Full = kFwdSm90Hdim64;
// d = 128 without the mask up to 4096 keys (the persistent grid; from 8k FullLong). O by TMA read
// -2.2..-5.4% at 8k / 16k in three per-call runs at the card's power cap, -2.3 / -0.0% at
// 2k / 4k (+1.0..+2.2% in GPU time after an idle sleep), so this config copies O out per
// thread (docs/perf-log.md, "O by TMA"), as one batch (copy_out_early): +2.1 / +1.0 / +0.1% at
// 512 / 1024 / 2048, -1.0 / +2.0 / -0.3% at 4k / 8k / 16k (noise there) (docs/perf-log.md,
// "Measured 2026-12-06, second run").
// lean_softmax (the softmax without its -inf guards and per-block mask products) on both d = 128
// non-causal rows: against them (H100, bf16, GPU time, A B A B) +0.8 / +0.9 / +1.1 / +1.7 / +3.3 /
// +4.5% at 512-16k; per call beside FA3, rows interleaved x 2: 0.980 / 0.957 against 0.936 / 0.904
// at 4k, 0.912 / 0.910 against 0.925 / 0.839 at 8k, 0.964 / 0.966 against 0.929 / 0.944 at 16k. On
// the d = 128 causal config -0.7..+1.6% and at d = 256 -7.2..+1.2% (non-causal 16k -7.2%): not
// there (docs/perf-log.md, "Measured 2026-12-07, fourth run").
constexpr FwdSm90Config kFwdSm90Hdim128Full = {128, 128, 2, 2, 24, 240, false, true, false, false,
                                              false, false, false, false, true, false, false,
                                              true, false, true};
static constexpr const FwdSm90Config& kFwdSm90Hdim192Full = kFwdSm90Hdim192;
static constexpr const FwdSm90Config& kFwdSm90Hdim256Full = kFwdSm90Hdim256;
// The config of a head dim's non-causal calls past full_long_keys (FwdSm90Grid; one CTA per
// tile); where it is the Full config's object, Full serves them. d = 128: FA3's public arrangement for
// these calls, 176-key blocks (O 64 + S 88 + P 44 registers, one Q stage, 32 + 2 x 2 x 44 =
// 208 KB) with ping-pong and the P V wait below the softmax. Measured as the Full config at every
// length (H100, bf16, GPU time, builds interleaved x 2): +3.1 / +5.7% at 8k / 16k, -1.4% at 4k
// and -4..-15% at 512-2048 on the persistent grid, hence from 8k only; 176 keys alone +3.1 /
// +3.7%, ping-pong and the P V wait on 128 keys +1.7 / -0.1%. From 8k against the 128-key config
// per call at the power cap (A B x 3): +4.7 / +3.2% at 8k / 16k (docs/perf-log.md, "Measured
// 2026-12-06, seventh run").
static constexpr const FwdSm90Config& kFwdSm90Hdim64FullLong = kFwdSm90Hdim64Full;
constexpr FwdSm90Config kFwdSm90Hdim128FullLong = {128, 176, 2, 2, 24, 240, true, true, true, false,
                                                  false, false, false, false, true, false, false, true,
                                                  false, true};
static constexpr const FwdSm90Config& kFwdSm90Hdim192FullLong = kFwdSm90Hdim192Full;
// d = 256 non-causal above 4096 keys (kFwdSm90Hdim256Grid): the causal config's flags without
// s_desc_lo and rescale_between, which read +3.1% at 4096 and -2.2% at 8k there (above).
constexpr FwdSm90Config kFwdSm90Hdim256FullLong = {256, 80, 2, 2, 24, 240, false, true, true, false,
                                                  true, true, false, false, false, false, false, false,
                                                  false, false, hopper::WaitStyle::kTryFirst};
// Measured slower and removed: d = 128 with 176-key blocks on the causal config's flags
// (-1.2..-1.8% non-causal, docs/perf-log.md, "Five candidates measured"); the non-causal forward
// on a persistent grid at every length (+1.7 / +2.4% at 8k / 16k, below kFwdSm90Hdim128FullLong).
// split_mask_loop at d = 256 (its causal row and its Multi row) measured -0.7..+2.1% causal,
// -3.4..+0.7% non-causal at 4k-16k, -0.8..+0.5% at 512-2048 (docs/perf-log.md, "The split loops,
// the dQ conversion and the late PDL wait measured"): off there.
// Also measured and removed (H100, docs/perf-log.md, "Measured 2026-12-06, eighth run"): the
// d = 128 non-causal forward in 2-CTA clusters multicasting K / V halves (kv_multicast): -0.7 /
// +0.5% at 8k / 16k (noise), -7.7..-0.4% at 512-4096 on the persistent grid; the 4096-key calls on
// FullLong one CTA per tile: -0.9% with 6% spreads. Measured and removed after the ninth run
// (H100, GPU time, A B C x 2; docs/perf-log.md, "Measured 2026-12-06, ninth run"): the d = 128
// forward in FA3's loop order, ping-pong across tiles with the P V wait below the softmax: with
// the O rescale between the GEMM issues, causal -0.7..-4.4% at 512-16k, non-causal -2.5..-5.0% at
// 512-4096 (and FullLong with it -0.8 / -0.6% at 8k / 16k, noise); without it, causal -0.6..-2.4%,
// non-causal -3.8..+0.5% at 512-4096.
// Measured and removed after the eleventh run (H100, GPU time, A B A B): the counter-fed and the
// static tile loop as two kernels of half the code each (the d = 256 Multi config and both d = 128
// configs): d = 256 -0.3..+1.1% (noise), d = 128 causal -0.0..-3.1%, non-causal -2.5..+0.8%. ncu
// of the d = 256 non-causal 512 forward read about the same with its caches flushed before the
// launch and without (147 / 151 us): the kernel's size is not what the short forward pays for
// (docs/perf-log.md, "Measured 2026-12-06, eleventh run").
// Measured and removed after the twelfth run (H100, GPU time, A B A B): on the persistent grid's
// static stride, the next tile's Q and first K / V block asked of L2 a tile ahead (as the
// backward pair's prefetch_next_rows): non-causal d = 256 -10.0 / -6.9 / -3.2% at 512 / 1k / 2k,
// d = 128 -3.8..-1.6% to 4096, d = 64 -1.1..+0.9%; causal calls unchanged (docs/perf-log.md,
// "Measured 2026-12-06, twelfth run").
// The config of a head dim's calls that fwd_sm90_multi_tile picks (non-causal up to 2048 keys,
// 4096 at d = 64 / 128, every length at d = 192; causal up to 2048 keys at d = 64 / 256, every
// length at d = 128 / 192; the grid row's causal_multi_keys), causal or not; where it is the
// causal config's object (d = 128), the two configs above serve those calls. Longer causal
// d = 64 calls are counter-fed too but run kFwdSm90Hdim64. d = 192 / 256: o_over_v,
// so a CTA's next Q loads during its tile's end. Measured (H200, bf16, A B A B, 16384 tokens)
// against the configs above: d = 192 +5.7 / +4.2% causal 512 / 1024, +6.0 / +2.9 / +2.0% non-causal
// 512 / 1024 / 2048; d = 256 +4.5 / +2.9% causal, +4.9 / +3.3 / +1.9% non-causal. On the counter at
// causal 2048 (one CTA per tile without it) it read +2.4% at d = 192 but -2.9% at d = 256 (before
// the late fetch and the shortened tail: +1.9% now), and -5..-10% causal at 4k-16k while the
// counter fetched early; with the late fetch d = 192 +0.2..+2.2% at 2k-16k, so d = 192 takes it at
// every length (docs/perf-log.md, "o_over_v at short sequences, measured", "O by TMA"). O by TMA:
// -0.3..-1.1% with o_over_v, so not at d = 192 (the d = 256 Multi config has it since, below).
// d = 64 with O by TMA, the statistics in the last P V's shadow and the fast tile decode (the
// tile's tail shorter; ncu of the causal 512 forward beside FA3 put ~1035 instructions per tile
// on the per-thread copy-out of O). Measured against kFwdSm90Hdim64 at every length (H100, bf16,
// GPU time, A B C x 2): causal +4.4 / +3.9 / +1.9% at 512 / 1024 / 2048, +0.5 / -0.2 / -1.8% at
// 4k / 8k / 16k; non-causal +3.9 / +0.4 / -0.4 / -0.1% at 512-4096, -0.8 / -2.8% at 8k / 16k.
// So it serves the persistent grid's calls only (causal to 2048 keys, non-causal to 4096,
// kFwdSm90Hdim64Grid). O by
// TMA alone read -0.3..+1.2% to 8k and -2.5 / -3.0% at 16k (not kept; docs/perf-log.md,
// "Measured 2026-12-06, ninth run").
constexpr FwdSm90Config kFwdSm90Hdim64Multi = {64, 128, 3, 2, 24, 160, true, true, false, false,
                                              false, true, true, true, false, true, true, true};
static constexpr const FwdSm90Config& kFwdSm90Hdim128Multi = kFwdSm90Hdim128;
// d = 192 with lean_softmax (the softmax without its -inf guards and per-block mask products):
// every d = 192 call runs this config (kFwdSm90Hdim192Grid). Against it (H100, bf16, GPU time,
// A B A B) non-causal +1.3 / +1.4 / +1.5 / +2.0 / +2.4 / +3.7% at 512-16k, causal -0.6 / +0.4 /
// +0.7 / +0.7 / -0.3 / +0.4% (noise); at d = 64 -0.9..-3.2% both masks: not there
// (docs/perf-log.md, "Measured 2026-12-07, fifth run", and "lean_softmax on the config d = 192
// runs").
constexpr FwdSm90Config kFwdSm90Hdim192Multi = {192, 112, 2, 2, 24, 240, false, true, true, true, true,
                                               false, true, false, false, false, false, true, false,
                                               true};
// d = 256 with finalize_in_pv, copy_out_early and fast_tile_decode (the tile's tail ~450
// instructions shorter), on the counter to 2048 keys causal: +1.9% at causal 2048 (one CTA per
// tile before), +0.1 / +0.3% at causal 512 / 1024, +0.1 / +0.3 / -0.5% non-causal 512-2048; to
// 4096 keys it read -0.2% at 4096 (docs/perf-log.md, "Measured 2026-12-06, second run"). O by
// TMA (tma_store_o): ncu put 12% of the causal 512 stall samples on the per-thread copy-out's
// 16-byte stores draining (64 KB of O per tile); the bulk store hands the V stages back once it
// has read them. Measured with copy_out_early and K ahead (H100, A B A B): causal +0.4 / +1.3 /
// +2.1%, non-causal +2.0 / +2.3 / +3.1% at 512 / 1024 / 2048. At d = 192 the same read -1.5..+0.7%
// (not taken; docs/perf-log.md, "Measured 2026-12-06, fifth run"). s_desc_lo, lean_softmax and
// both on this row (its loop 494 executed instructions per key block against FA3's 459; SASS
// spans 656 / 655 / 638 against 666) read -1.7..-0.0%, -2.4..+1.4% and -1.1..+0.6% at 512-2048
// (H100, GPU time, x 2): not taken (docs/perf-log.md, "Measured 2026-12-07, seventh run").
constexpr FwdSm90Config kFwdSm90Hdim256Multi = {256, 80, 2, 2, 24, 240, false, true, true, true,
                                               true, true, false, true, true, true};
// Which grid serves a head dim's calls, by seqlen_k (varlen: the longest sequence). Tiles are
// (Q block, head, batch); a persistent grid (one CTA per SM) hides each tile's fixed costs (the
// first Q and K loads, the epilogue) under the previous tile, +8..+21% at seqlen 512-1024 and
// up to +9% at 2048 (docs/perf-log.md, "Persistent forward"). Its static stride (tiles
// blockIdx.x, + gridDim.x, ...) loses the longest-first order of causal tiles, which one CTA per
// tile keeps (the hardware hands a freed SM the next tile): -4..-32% causal at 4k-16k. Tiles
// from a counter keep that order on a persistent grid.
struct FwdSm90Grid {
  // Non-causal: a persistent grid (static stride) up to this seqlen_k, else one CTA per tile.
  int full_persistent_keys;
  // Causal: tiles from the counter (fwd_sm90_dynamic) up to this seqlen_k, else one CTA per tile.
  int causal_counter_keys;
  // Causal: the head dim's Multi config (where it has one of its own) up to this seqlen_k.
  int causal_multi_keys;
  // Causal without a counter (no stream-ordered memory pool): the static stride up to this
  // seqlen_k, else one CTA per tile.
  int causal_static_keys;
  // The producer issues K_{j+1} before V_j (FwdSm90Params::k_ahead) up to this seqlen_k, causal /
  // not; else K_j and V_j in pairs.
  int causal_k_ahead_keys;
  int full_k_ahead_keys;
  // Non-causal: the head dim's FullLong config (where it is a config of its own) above this
  // seqlen_k, else its Full config; at least full_persistent_keys (FullLong runs one CTA per tile).
  int full_long_keys;
};
constexpr int kAllKeys = 0x7fffffff;
// Measured (H200, bf16; docs/perf-log.md "Forward tiles from a counter at every head dim", "The
// runbook measured" and "O by TMA"):
// - The counter against the static stride (d <= 128) or one CTA per tile: at d <= 128 +2..+12%
//   at 1k-2k, +0..+4% at 4k-16k, within 2% at 512; at d = 192 / 256 +8.8 / +5.1% and +7.0 /
//   +0.3% at 512 / 1024. At longer d = 192 / 256 rows it lost 2-11% while it fetched the next
//   tile as a tile started (a reservation a freed CTA could not run); with late_tile_fetch
//   d = 192 gains +0.9..+3.7% at 2048-16384, d = 256 still trails from 4096 (-0.4 / -1.5%).
// - Non-causal tiles are all alike: the static stride beats the counter by 0.3-4.4%, and it beats
//   one CTA per tile past 2048 keys at d = 192 (+2.4 / +2.3 / +1.3% at 4k / 8k / 16k), at d = 128
//   4096 (+3.3%; 8k read -1.9% and +2.0% in two noisy runs) and at d = 64 4096 (+2.5%; 8k / 16k
//   -0.2 / -0.4%). d = 256 at 4k-16k: +1.4 / +1.0 / -0.8% against one CTA per tile without O by
//   TMA, which one CTA per tile now has (+0.9 / +2.0 / +1.4%): not taken.
// - The Multi configs (o_over_v, d = 192 / 256) on the counter: -5..-10% causal at 4k-16k, while
//   the counter still fetched early; +2.4% at d = 192 2048, -2.9% at d = 256 (+1.9% with the late
//   fetch and the shortened tail, kFwdSm90Hdim256Multi). With the late
//   fetch, d = 192 +2.2 / +0.9 / +0.4 / +0.2% at 2k / 4k / 8k / 16k against its main config.
// - K_{j+1} before V_j (k_ahead; docs/perf-log.md "The forward's K loads one block ahead"). The
//   consumers' step j issues S_{j+1} and P_j V_j; K_j's stage frees once S_j has been waited for
//   (in step j - 1), V_j's only after P_j V_j (end of step j). In pairs, K_{j+2} queued behind
//   V_{j+1}, whose stage frees at the end of step j - 1, so K had one step's lead; ncu at d = 256
//   causal 4096 (H100) put 4.8% of the stall samples on the K wait against FA3's 1.4%, and 5.0%
//   on the tile's first Q / K against 1.8%. Measured in one order for every call (H100, bf16,
//   A B x 3, GPU time, 512 / 1k / 2k / 4k / 8k / 16k): d = 256 causal +0.8..+3.4%, non-causal
//   +3.3 / +1.5 / +0.4 / +1.4 / +0.4 / -3.9%; d = 192 causal +2.3 / +1.9 / +2.8 / +0.9 / +0.5 /
//   -1.4%, non-causal +2.6 / +1.2%, then -0.7..-2.7%; d = 128 causal +2.1 / +2.2 / +0.7%, then
//   -0.5..-3.5%, non-causal -1.6..+0.8% (noise); d = 64 -1.7..+4.6% (noise). On where it gained
//   (the 16k column swings 3-6% between repeats of one build).
// - FullLong (full_long_keys): d = 128 from 8k (its persistent grid ends at 4096); d = 256 above
//   4096 keys, where s_desc_lo with rescale_between, which the causal and Full config share, read
//   -2.2% at 8k against +3.1% at 4096 (kFwdSm90Hdim256FullLong).
constexpr FwdSm90Grid kFwdSm90Hdim64Grid = {4096, kAllKeys, 2048, 2048, 0, 0, kAllKeys};
constexpr FwdSm90Grid kFwdSm90Hdim128Grid = {4096, kAllKeys, kAllKeys, 2048, 2048, 0, 4096};
constexpr FwdSm90Grid kFwdSm90Hdim192Grid = {kAllKeys, kAllKeys, kAllKeys, 0, 4096, 1024, kAllKeys};
constexpr FwdSm90Grid kFwdSm90Hdim256Grid = {2048, 2048, 2048, 0, kAllKeys, 4096, 4096};
static_assert(kFwdSm90Hdim64Grid.full_long_keys >= kFwdSm90Hdim64Grid.full_persistent_keys &&
                  kFwdSm90Hdim128Grid.full_long_keys >= kFwdSm90Hdim128Grid.full_persistent_keys &&
                  kFwdSm90Hdim192Grid.full_long_keys >= kFwdSm90Hdim192Grid.full_persistent_keys &&
                  kFwdSm90Hdim256Grid.full_long_keys >= kFwdSm90Hdim256Grid.full_persistent_keys,
              "FullLong runs one CTA per tile: never below the persistent grid's bound");
// The causal forward's L2 groups: (batch, q head) pairs whose K and V fill about this many MB of
// L2 run together, longest Q block first inside a group (fwd_sm90_scheduler.cuh). At 32 MB, ncu
// of the d = 256 causal 512 forward (b32 h8, H100) read 281 MB from DRAM against 204 MB at 16 MB
// (K and V are 134 MB, Q 67): a group of 32 MB did not stay in the 50 MB L2 (two partitions)
// while Q streamed in and O out beside it. Measured 16 / 8 MB against 32 (H100, bf16, A B C x 2,
// causal): 16 MB d = 128 / 192 / 256 +22.7 / +14.0 / +13.5% at 512, +11.4 / +5.0 / +5.3% at
// 1024, +1.5..+2.4% at 2048, -0.5..+1.4% from 4096; d = 64 +1.8 / +1.4% at 512 / 1024, -0.9..-1.8%
// from 2048. 8 MB gains more at 512 but loses up to 4.9 / 6.8% at d = 192 / 256 at 2048-8192
// (too few pairs per group to fill the machine with long tiles). docs/perf-log.md, "Measured
// 2026-12-06, fifth run". So 8 MB up to 512 keys, 16 MB beyond: measured against 16 MB
// everywhere (H100, A B A B, causal) +3.6 / +1.9 / +3.2% at d = 128 / 192 / 256 512, -0.4% at
// d = 64 512, -0.9..+0.1% from 1024 (the same kernels there) (docs/perf-log.md, "Measured
// 2026-12-06, sixth run"). A value, for scripts/build_candidates.sh.
struct FwdSm90L2 {
  int causal_kv_mb;
  // Calls with seqlen_k <= short_keys take short_kv_mb instead (0: none).
  int short_kv_mb;
  int short_keys;
};
constexpr FwdSm90L2 kFwdSm90L2 = {16, 8, 512};
// Whether a grid row sends every call, causal or not and of any length, to its Multi config
// (fwd_sm90_multi_tile is then true for every call).
constexpr bool fwd_sm90_multi_takes_all(const FwdSm90Grid& g) {
  return g.full_persistent_keys == kAllKeys && g.causal_multi_keys == kAllKeys;
}
// A head dim's row, at compile time (the producer keeps one load order where its row has k_ahead
// nowhere).
constexpr FwdSm90Grid fwd_sm90_grid_row(int head_dim) {
  return head_dim == 64 ? kFwdSm90Hdim64Grid
         : head_dim == 128 ? kFwdSm90Hdim128Grid
         : head_dim == 192 ? kFwdSm90Hdim192Grid
                           : kFwdSm90Hdim256Grid;
}

// Measured slower and removed (docs/perf-log.md): a persistent CTA's tiles as one software
// pipeline (cross_tile, d = 128: -6..+1% main sweep, -8..-17% short), ping-pong at d = 128 / 192
// on the counter-fed tiles (-3.9..+0.3% / -3.3..+2.6%), O from registers without staging
// (-2..-7% at d = 128-256), 1 / l and
// log2 l by rcp.approx / lg2.approx (mean +0.2%, -3.8..+2.3%), d = 192 with 80-key blocks and two
// Q stages (-7..-14%), d = 128 on three consumer warpgroups at 192 x 80 (-7.3 / -4.9 / +0.7% causal),
// d = 128 with ping-pong and pv_wait_below together (-0.0..-3.1%), O rescaled between the GEMM
// issues (rescale_between, d = 64 / 128 mean -0.5%, d = 192 / 256 -1.4..+2.6%, noise; with
// ping-pong across tiles and the P V wait below at d = 128, -0.7..-5.0%), the
// d = 128 P V wait after half the exponentials (pv_wait_split, -2.3..+1.5%), the mask as one
// compare per element against a per-row limit (-1.1..+1.0%; kept in the backward). Not kept
// for want of a gain (main and short sweeps within noise, "Measured 2026-12-06" and its second
// run): a tile's loads as K_0, Q, V_0 on the one-CTA-per-tile rows (q_before_v, -0.4..+0.6%
// short, -3.3..+1.3% main), finalize_in_pv alone on every head dim (-1.6..+0.9% short), copy_out_early
// on the d = 64 row and the d = 192 / 256 Multi configs (-1.1..+1.1% short), the d = 192 Multi
// config with all three tail changes (-0.3..+0.9% short, -4.0..+1.1% main), the d = 256
// counter to 4096 keys (-0.2% at 4096).

struct FwdSm90Params {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, group;  // group = nheads / nheads_k
  int m_blocks;  // ceil(seqlen_q / block_m)
  int n_blocks;  // ceil(seqlen_k / block_n)
  int l2_group;  // (batch, head) pairs scheduled together (fwd_sm90_scheduler.cuh)
  int num_tiles;  // m_blocks * nheads * batch: the grid
  int causal;
  int head_inner;       // bit 0 Q, 1 K, 2 V, 3 out: that map's dims are {d, head, seq, batch}
  int out_tma;          // tma_store_o: the out map was made (out's layout suits TMA)
  float scale_log2;     // softmax_scale * log2(e)
  float softmax_scale;
  void* out;
  flashback_strides out_strides;
  float* lse;  // (batch, nheads, seqlen_q), natural log; varlen: (nheads, total_q)
  // Varlen (flashback.h): per-sequence offsets, null for dense batches. seqlen_q / seqlen_k
  // are then the longest lengths (they size the grid); the maps address the packed rows.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q;
  int k_ahead;  // the producer issues K_{j+1} before V_j (FwdSm90Grid); else K_j, V_j in pairs
  int* tile_counter;  // dynamic_tiles: a zeroed int; CTA c's k-th fetch gets tile gridDim.x + n
                      // (n: the fetches before it); null: the static stride
  // fast_tile_decode: the tile decode's divisors (grouped_tile_fast, sm90_common.h): l2_group x
  // m_blocks, l2_group, the last group's pairs, nheads; and the number of groups.
  FastDiv div_group_tiles, div_group, div_last_group, div_heads;
  int groups;
};

// Does the fast path take these params? A config for the head dim in the table, bf16 or fp16,
// q/k/v TMA-addressable (sm90_common.h), dense or varlen. `why` (may be null) gets the first
// reason not.
bool fwd_sm90_can_implement(const flashback_fwd_params& p, const char** why);

// SMs of the current device, read once per process and device (the persistent grid).
int fwd_sm90_sm_count();

// Whether the call runs a persistent grid with the static stride (one CTA per SM walking
// tiles) rather than one CTA per tile, where no counter feeds it (the head dim's FwdSm90Grid).
bool fwd_sm90_persistent(const flashback_fwd_params& p);

// Whether a config with dynamic_tiles takes this call's tiles from a counter (a persistent
// grid; the head dim's FwdSm90Grid).
bool fwd_sm90_dynamic(const flashback_fwd_params& p);

// Whether the producer loads K one block ahead of V for this call (the head dim's FwdSm90Grid).
bool fwd_sm90_k_ahead(const flashback_fwd_params& p);

// Whether a non-causal call runs the head dim's FullLong config (the head dim's FwdSm90Grid).
bool fwd_sm90_full_long(const flashback_fwd_params& p);

// Whether the head dim's Multi config serves this call: the persistent grid's calls, and causal
// ones up to the grid row's causal_multi_keys (counter-fed; a longer counter-fed call, d = 64
// causal above 2048 keys, runs the causal config).
bool fwd_sm90_multi_tile(const flashback_fwd_params& p);

// Runs the forward on `stream`. Returns cudaErrorNotSupported without launching anything when
// a tensor map cannot be encoded (the caller then takes the reference path).
cudaError_t run_fwd_sm90(const flashback_fwd_params& p, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashback
