// Hopper (sm_90a) backward, one kernel family for head dims 64-256 in bf16 and fp16: the fast
// path of flashback_attention_backward. docs/design.md describes the algorithm and budgets.
//
// Files, one per role (steps numbered as docs/design.md section 4 everywhere):
//   bwd_sm90.h            this: the config, the kernel parameters, the entry points
//   bwd_sm90_prepost.cu   (0) preprocess: D = rowsum(dO * O), LSE * log2(e), both padded;
//                         postprocess: dQ = scale * dQaccum (un-permuted) to bf16 / fp16
//   bwd_sm90_scheduler.cuh  which (K/V block, kv head, batch) a CTA owns; its Q-block walk
//   bwd_sm90_mainloop.cuh   TMA producer and the consumer warpgroups, steps (1)-(7)
//   bwd_sm90_epilogue.cuh   dQ partial -> fp32 dQaccum (coalesced red.v4, or a shared-memory
//                           buffer for one bulk reduce), dK / dV stores
//   bwd_sm90_launch.cuh     kernel, tensor maps, the launches of one config (a template)
//   bwd_sm90_launch.cu      the table of configs, workspace, can_implement, the dispatch
//   bwd_sm90_hdim*.cu       the instances of one head dim (one file each: parallel builds)
//
// dQ partials of different K/V blocks meet in fp32 atomics: not deterministic, unless
// p.deterministic, which launches the kernel's kDet instance: the adds into each tile then go
// in one fixed order (bwd_sm90_scheduler.cuh, bwd_sm90_epilogue.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "bwd_sm90/bwd_sm90_prepost.h"
#include "flashback/flashback.h"
#include "hopper/wait_style.h"

namespace flashback {
namespace sm90 {

// One member of the family: tile shape and warp roles. A CTA owns block_n rows of K and V
// (resident in shared memory) and walks the Q blocks of block_m rows that see them. Threads,
// register budget check, barrier counts and the shared-memory plan are derived from it in
// BwdSm90Traits and checked at compile time.
struct BwdSm90Config {
  int head_dim;       // 64 x atoms (64-element, 128-byte columns of the swizzled tiles)
  int block_m;        // Q rows per step (64: one wgmma M; by keys at d = 64: 64 x consumer_wgs)
  int block_n;        // K/V rows per CTA (a multiple of 16)
  int q_stages;       // Q pipeline depth
  int do_stages;      // dO pipeline depth
  int producer_regs;  // setmaxnreg of the TMA warpgroup
  int consumer_regs;  // setmaxnreg of the MMA (consumer) warpgroups
  // Default mode: dQ^T partials leave through shared memory and one bulk reduce per step, issued
  // by a producer-warpgroup warp, instead of global reductions from the MMA warpgroups. Needs
  // each warpgroup to own one atom-column (split by head dim) or its step's 64 queries (by keys),
  // and 16 KB of room per warpgroup; measured +1-5% at d = 128,
  // 6-11% slower at d = 192 with two warpgroups and 1-3.5% slower at d = 64 (by keys, twice);
  // d = 192 takes it with three warpgroups and single_hand, d = 64 with dq_before_dk
  // (docs/perf-log.md).
  bool dq_smem;
  int consumer_wgs;   // MMA warpgroups (2 or 3) splitting the work by data
  // How (5)-(7) are split (below): false, by head-dim atom-columns; true, by keys (d = 64:
  // warpgroup w keeps dV and dK of its block_n / W keys, fed P^T and dS^T from its registers,
  // and computes dQ^T of queries 64 w.. of a block_m = 64 x W step;
  // bwd_sm90_mainloop_by_keys.cuh).
  bool by_keys = false;
  // Default mode, split by head dim at d = 256: CTAs in clusters of two on neighbouring K/V
  // blocks of one (batch, kv head) walk the same Q blocks; each sends its dS^T into the
  // partner's shared memory and computes dQ^T for its half of the head dim over both blocks'
  // keys, so each dQ element is added once per pair (docs/design.md section 5, "A 2-CTA pair").
  bool pair_dq = false;
  // Split by head dim: each Q / dO stage also brings the step's LSE * log2(e) / D rows into
  // shared memory (as by keys), read after the stage's full wait, instead of four global loads
  // per thread at the step's top, whose latency the S wgmma does not hide. Measured +0.5..+4.7%
  // at d = 128 / 192 (d = 192 now takes stats_by_consumers, below); on the d = 256 pair
  // -0.2..-2.0% (its one Q stage then waits for the rows too), on the d = 256 single CTA (two Q
  // stages) +0.5..+2.5%: on there. The producer brings the rows with a tensor copy through a
  // 2-D map of the workspace's rows (64 fp32 per tile), a fifth kernel parameter: the same
  // bytes by a non-tensor bulk copy measured the same (-1.4..+1.8%, H100) but compute-sanitizer
  // racecheck reported those copies against the consumers' reads (it does not follow their
  // mbarrier order), never the tensor copies on the same barriers (docs/perf-log.md, "The
  // stage rows by tensor copy", "Measured 2026-12-06, fifth run").
  bool stats_smem = false;
  // pair_dq: the upper block of a pair walks the lower's Q blocks, so it has steps in which it
  // holds no key the queries see: causal, its first 1-2 Q blocks of every q head's walk; with
  // an odd block count, every step of the last cluster's upper CTA (past the keys). With
  // pair_ghost such a step is a ghost step: no Q / dO loads, no S, dP, dV, dK; the upper CTA
  // only computes its dQ^T half over the lower block's keys from the dS^T it receives, sends
  // nothing, and the lower skips its peer dQ^T (a CTA past the keys loads only the lower's K
  // half). Without it those steps run in full on masked keys (at seqlen 512 causal ~1 in 4 of
  // the upper CTAs' steps). Measured +0..+2.6% on the main sweep, +0.7..+3.6% at 512-2048.
  bool pair_ghost = false;
  // Instead of stats_smem (or by keys' stage rows): the consumer threads bring the next step's
  // LSE * log2(e) / D rows themselves (one global load each, issued at a step's top, stored to
  // a shared buffer of the next step's parity before the step's hand-off barrier, which orders
  // the stores before every read). The same rows without the producer's bulk copies, ordered
  // by a named barrier, which compute-sanitizer racecheck follows (it reports the stage copies,
  // which only mbarriers order). Measured against the stage rows (H200, bf16): d = 128 -0.8..-0.0%
  // (within the run's noise), racecheck no report; d = 192 -1.1..-2.7% (two warpgroups) and
  // -0.4..-1.6% (three), d = 64 (by keys) -6..-7%: on at d = 192, for racecheck-clean
  // instances (d = 128 went back to the stage rows, racecheck-clean since: +0.6..+3.5%) (docs/perf-log.md, "The forward's P V wait, the pair's Q atoms", "Five candidates
  // measured, one kept").
  bool stats_by_consumers = false;
  // pair_dq: the step's dQ adds kept above the wait for dK^T (hopper::keep_waits_below). In the
  // SASS without it ptxas puts that wait amid the adds, so the Q stage's release (after the
  // wait) also waits for the rest of them to issue; ncu: 17% of the stall samples are the
  // consumers waiting for the next Q. Alone measured -0.2..+0.7% (noise); kept as part of
  // q_atom_barriers' measured config.
  bool adds_before_wait = false;
  // Split by head dim, no stats rows in the stages: each Q stage completes per atom-column (one
  // mbarrier per 64-column box) and S = Q K^T waits for each atom-column just before its k-steps,
  // so the step's first wgmmas start when the first 8 KB (d = 256: of 32) have landed instead of
  // the whole tile. With the pair's one Q stage the next Q is loaded only after dK^T; ncu: 17% of
  // the stall samples in the wait for it. Measured with adds_before_wait at d = 256 (pair):
  // +2.7..+5.3% default mode, +1.5..+3.9% deterministic.
  bool q_atom_barriers = false;
  // Split by head dim: one P^T and one dS^T buffer instead of two (step parity), so that d = 192
  // with three warpgroups and dQ through shared memory has room for a second Q stage (not with
  // pair_dq: the pair's exchange double-buffers the tiles it sends). The price: a consumer
  // barrier per step before the next P^T is written (every warpgroup's (5)-(7) of this step
  // have read the buffers). On at d = 192.
  bool single_hand = false;
  // By keys: (7) dQ^T issued before (6) dK, right after the hand-off barrier, and the step's dQ
  // adds made once dQ^T is done, while dK still runs, instead of dK, the barrier, dQ^T and the
  // adds after every wgmma of the step (FA3's d = 64 step orders dQ before dK in its SASS, its
  // dQ stores overlapping dK; ours issue 8 global reductions per thread with the tensor cores
  // idle, and ncu put 11% of the stall samples on the next step's wait for them).
  bool dq_before_dk = false;
  // (2) P, the wait for dP and (4) dS in one basic block per mask case (the step's branch on
  // whether it tests the mask), instead of (2) in the branch and (4) after its join, which ptxas
  // does not schedule across: the exponentials (MUFU) and the dS arithmetic (FMA pipe) then run
  // one after the other. In one block ptxas may interleave them (FA3's d = 64 step in its SASS:
  // the exponentials mixed with the dS arithmetic, the dP wait among them). This also issues
  // (5) dV after (4), since dV reads every P^T fragment. By keys only: split by head dim the same
  // block (half the exponentials above the dP wait) measured -1.2..+3.9% at d = 128-256, noise.
  bool ds_in_branch = false;
  // Deterministic mode, causal: the order of the walks and of the ordered dQ adds. false: the
  // units (K/V blocks, or a pair's two) of a (batch, kv head) launch last-first and walk their
  // Q blocks upwards; a tile's adds go from the highest unit down. Launching the longest walks
  // last makes them the grid's tail (scripts/det_order_model.py: 0.937 of the default's
  // makespan before any real wait). true: units launch longest-first, as in the default mode,
  // walk their Q blocks from the last down to their diagonal (the GQA group's q heads inner),
  // and a tile's adds go from unit 0 up (a unit waits only for lower units, launched before it,
  // so no residency can deadlock). Units of a head reach a tile nearly together, unit u one
  // step behind unit u - 1, and finish no later than unit 0's longer walk (the model: 1.00 of
  // the default without jitter, 0.97-0.99 with it, at GQA groups 1-8 too); a pair's upper-CTA
  // ghost steps then come last in a walk and wait for their turn like any step. Measured (H100,
  // deterministic causal, A B A B): d = 256 +9.7 / +22.5 / +12.5 / +7.2 / +3.9 / +2.1% at 512 /
  // 1k / 2k / 4k / 8k / 16k; d = 128 +2.0..+8.1%; d = 192 +2.6..+10.4% to 4096, -2.5 / -2.2% at
  // 8k / 16k; d = 64 (by keys) -2.6..-6.4%: on at d = 128, 192, 256 (docs/perf-log.md,
  // "Measured 2026-12-06, fourth run").
  bool det_from_the_end = false;
  // Deterministic mode where dq_smem is on and each warpgroup can have a turn counter of its
  // own (d = 64 by keys, d = 128 by head dim; not three warpgroups against two counters per
  // tile). false: the consumers add from registers inside turns that a producer warp keeps,
  // and wait for each turn. true: as in the default mode, the consumers store the partial and go
  // on, and the dQ warp of each warpgroup takes the turn itself: waits until the tile's counter
  // (per atom-column, or per step tile by keys) holds its rank, issues the bulk reduce, hands
  // the buffer back once it is read, and releases the turn once the reduce's global writes are
  // done; the consumers wait only when their dQ warp falls a whole buffer behind. Same sums in
  // the same order (gradients bitwise equal to the other way's). Measured (H100, deterministic,
  // A B A B, production order): d = 64 causal -1.9 / -0.7 / +0.9 / +3.2 / +5.0 / +5.7% at 512 ..
  // 16k, non-causal -2.5..+6.0%; d = 128 causal -0.7..-0.0% to 4096, +3.7 / +7.8% at 8k / 16k,
  // non-causal +0.0..+2.3%. d = 128 with det_from_the_end as well, against det_from_the_end
  // alone: causal -2.0 / -1.8 / -2.1 / -0.6% at 512-4096, +3.4 / +4.2% at 8k / 16k; on at d = 64
  // and 128, both as tested (docs/perf-log.md, "Measured 2026-12-06, fourth run").
  bool det_dq_warp = false;
  // Split by head dim with two warpgroups: (1)-(4) split by role instead of by keys. Warpgroup 0
  // computes S = Q K^T for all block_n keys and P (and stores P^T), warpgroup 1 dP = dO V^T for
  // all keys, then dS = P (dP - D) from P^T read back (ldmatrix .trans: P in 16 bits there, fp32
  // in the split by keys), and stores dS^T; warpgroup 1 issues dP once warpgroup 0 has issued S,
  // so that S finishes first and its exponentials overlap dP. Why: each SS k-step reads its A
  // (2 KB) and B (32 N bytes) from shared memory; at N = block_n / 2 = 40 that is more bytes per
  // clock than the math needs clocks (16 + N / 4 against N / 2 at 128 B and 4096 FLOP per clock),
  // at N = 80 it is not (docs/perf-log.md, "S and dP at N = 40: the shared-memory bound").
  bool sdp_by_role = false;
  // A measuring aid, never in the table: the pair's consumer warpgroups write clock64() at nine
  // points of each step (BwdTimelineEvent) into the buffer flashback_debug_bwd_timeline set,
  // for scripts/bwd_timeline.py, which prices each wait by its share of the step (the stall
  // table does not: in the tenth run a wait holding ~9% of the samples was not on the step's
  // critical path, docs/perf-log.md).
  bool timeline = false;
  // The producer asks L2 for the next step's Q and dO rows (hopper::tma_prefetch_l2) as it
  // issues this step's loads, a step before their own loads. With one Q stage (the d = 256
  // pair) the next Q can be loaded only once dK^T has read this one, and the CTAs of a head walk
  // the same Q blocks nearly in step, so each of those loads waits out a DRAM miss: the pair's
  // timeline (H100) put 10-17% of warpgroup 0's step on the first Q atom-column and 17-23% of
  // warpgroup 1's on dO. An L2 hit instead shortens the wait without moving the stages. Measured
  // on the pair +1.9..+7.5% where its CTAs walk in step (kBwdSm90Hdim256); with two Q stages
  // (d = 128, 192) the load has a step to land anyway: there it read -0.4..-4.7% at most points.
  bool prefetch_next_rows = false;
  // pair_dq: the step's groups as dQ^T own, dK^T, dV^T, and the Q stage handed back once the
  // first two complete, before the wait for the partner's dS^T (dK^T needs none); the next Q's
  // copy then lands under dV^T and dQ^T peer, and the dQ adds follow dQ^T peer. Otherwise Q is
  // freed only after dK^T, the step's last group, and ~850 clocks of each step's top wait for
  // the next Q (the pair's timeline, H100). Measured (H200, A B C A B C): deterministic +0.7..+3.1%
  // at 4k-16k, where the adds wait for their turn anyway; default -0.4..-2.1%, where the adds
  // lose their overlap with dK^T. So the deterministic d = 256 config only (docs/perf-log.md,
  // "Measured 2026-12-06, thirteenth run").
  bool dk_before_peer = false;
  // L2 cache policies on the step's traffic (hopper::l2_policy_*): Q and dO rows, which every
  // CTA of the head (x the GQA group) reads again, and the dQ adds into dQaccum, which every
  // K/V block's CTA updates, as evict_last; K and V, which one CTA (or pair) reads once, as
  // evict_first. ncu (H100, d = 256 causal 4k) read our L2 hit rate at 64.6% against FA3's
  // 84.3%, and FA3's backward SASS carries evict_last hints on its Q / dO loads and its dQ
  // reduce where ours carries none (docs/perf-log.md, "L2 cache policies in the backward").
  // The adds from registers only (add_dq_partial); the dQ warps' bulk reduce takes no hint.
  // Measured on the d = 256 pair (H100, bf16, GPU time, A B A B): default +0.2..+1.1% causal at
  // 1k-16k, non-causal +0.5 / +0.2% at 1k / 2k, -0.3 / -0.8 / +1.6% at 4k / 8k / 16k (those
  // three with 0.5-2.1% spreads); deterministic -0.2..+0.6% at 4k-16k. Small, but positive at
  // every point whose repeats agree within 0.4%: on in both d = 256 pair configs
  // (docs/perf-log.md, "Measured 2026-12-06, fourteenth run").
  bool l2_hints = false;
  // Default mode, causal: the last l2_tail_groups L2 groups of (batch, kv head) pairs run as
  // one (grouped_tile_tail, sm90_common.h), so that the last group's longest walks, launched
  // first in it, overlap more of its shorter ones instead of ending the grid alone. A model of
  // the grid's fill (scripts/bwd_balance_model.py, d = 256 pair) puts the makespan over the
  // ideal at 1.019-1.022 at 4k-16k with one group, 1.010 with the last two merged, 1.002-1.005
  // with three; the price is L2 room in the grid's last phase (that many groups' rows at once).
  // Measured with dq_post_queue on the d = 256 pair (H100, bf16, GPU time, A Q T2Q x 2):
  // causal +1.8 / +3.9 / +1.9% at 4k / 8k / 16k against production, the queue alone +1.1 /
  // +4.5 / -0.1%: two groups on at d = 256 (docs/perf-log.md, "Measured 2026-12-07").
  int l2_tail_groups = 1;
  // The postprocess (dQ = scale * dQaccum) as a queue's consumer that runs under the main
  // kernel's tail instead of after it: each CTA counts, once its dQ adds are done, on its
  // (batch, kv head)'s counter; the count that completes a pair queues it (DqPostQueue,
  // bwd_sm90_prepost.h); the postprocess, launched as the main kernel's dependent, starts on
  // the SMs the last CTAs leave and converts queued pairs' tiles in the order they finished.
  // Without it the conversion (53 us at 16384 tokens x 8 heads at d = 256: 3.4% of a causal 4k
  // call, 9-12% at 512) starts after the main kernel's last CTA, while the causal grid's last
  // L2 group and the non-causal grid's half-full last wave leave SMs idle (the fill model:
  // 1.9-2.2% and 3.1-4.1% of the d = 256 kernel). The cost in the main kernel: one acquire-release
  // add per counting warp and CTA, off the consumers' path (docs/perf-log.md, "The dQ
  // conversion under the main kernel's tail"). Measured (H100, bf16, GPU time, A Q A Q): at
  // d = 256 causal +0.7..+1.1 / +2.3..+4.5 / -1.0..-0.1% at 4k / 8k / 16k in two runs,
  // non-causal +0.9..+1.1 / +0.3..+0.5 / -0.1..+0.4%, 512-2048 +0.2..+2.8%, deterministic
  // -1.4..+1.7%: on in every d = 256 config. At d = 64 / 128 / 192, where the dQ warps count,
  // -1.4..+2.7% on the main sweep and -2.4 / -2.0% at d = 128 512: off (docs/perf-log.md,
  // "Measured 2026-12-07").
  bool dq_post_queue = false;
  // Default mode, non-causal, dense, the pair with dq_post_queue: the grid's partial last wave
  // (r units of r < the resident clusters, every unit's walk as long) split by query range into
  // k parts (bwd_sm90_split_plan), so that r k shorter walks fill the slots that r long ones
  // would leave idle for a whole walk (the fill model: 1.041 -> 1.001 of the ideal makespan at
  // 16k with k = 2). The parts run in a second launch of their own kernel instance (kPart), the
  // first launch's PDL dependent, so the units before them run the config's kernel unchanged
  // (with the split in the one kernel, its extra decode moved ptxas's schedule of the main loop:
  // -2..-5% on every point, causal too). Part q < k - 1 leaves its dV^T / dK^T partial in fp32 in
  // a workspace slot and counts; part k - 1 waits for the others' counts and sums the partials
  // in part order before its epilogue, so dK and dV stay bitwise equal run to run. Measured
  // (H100, bf16, GPU time, two A/B runs): non-causal 16k (two parts) +1.7 / +2.2%; 4k / 8k, where
  // the model picked three parts, -0.7..+0.6%: so at most two parts, and 4k / 8k do not split;
  // causal unchanged (docs/design.md section 5, "The split last wave"; docs/perf-log.md).
  bool split_last_wave = false;
  // How the main kernel's mbarrier waits spin (hopper/wait_style.h). With every kernel on one
  // style (H100, bf16, every build in one process, docs/perf-log.md "Measured 2026-12-07, eighth
  // run"): kTryFirst d = 256 -0.3..+0.5%, d = 64 -0.1..+0.0%; kTryFirstSleep d = 256 -3.3..-0.2%,
  // d = 64 +0.4..+1.2% (its pre / postprocess kernels on it too: their spin follows only the
  // build-wide FLASHBACK_WAIT_STYLE). Per config, each build against production call by call in
  // turn (H100, twelfth run): d = 64 (kBwdSm90Hdim64's main kernels) on kTryFirstSleep
  // +0.4..+0.7%, taken; the backward at d = 128 kTryFirst -0.6..-0.3%, kTryFirstSleep
  // -0.2..+0.0%, at d = 192 both +0.1..+0.3% (a copy of production read 0.0..+0.1%): on kSpin.
  hopper::WaitStyle wait_style = hopper::WaitStyle::kSpin;
  // Split by head dim, two warpgroups of one atom-column each, no pair (d = 128): each
  // warpgroup issues the half of (5) dV^T and (6) dK^T over its own keys before the hand-off
  // barrier, from the P^T / dS^T rows it stored itself (a barrier of its own 128 threads orders
  // them): dV^T's half right after its P^T store, under (4) dS; dK^T's after its dS^T store,
  // under the wait at the hand-off barrier. After the barrier, dQ^T and the halves over the
  // other warpgroup's keys. Why: in the lockstep step both warpgroups reach the hand-off with
  // no wgmma in flight, so the tensor cores idle through the exponentials, dS and the barrier
  // (ncu, H100, d = 128 causal: 68% tensor-pipe activity against FA3's 74%, twice its barrier
  // stall samples; FA3's d = 128 step issues dV from registers before its one barrier). The
  // price: dV^T and dK^T as m64n64 halves, 16 wgmmas a step instead of 8, each half's
  // operands at the shared-memory read rate the tensor cores consume. Register half 0 of
  // dV^T / dK^T holds the warpgroup's own keys (so every wgmma names its registers at compile
  // time); the epilogue rotates the rows back. Sums in the same order: bitwise equal results.
  // The risk: wgmmas leave the tensor pipe in issue order, so the other warpgroup's S / dP may
  // queue behind these halves (the d = 256 pair's dV^T before its hand-off measured -4..-8%,
  // where the partner CTA waited for the dS queued behind it; docs/perf-log.md).
  // 0: off; 1: as above; 2: both own halves after dS^T's store (under the hand-off wait only:
  // one barrier of the warpgroup a step instead of two, dS not overlapped).
  int own_keys_first = 0;
};

// The consumer warpgroups (consumer_wgs of them, W below) split the work by data (docs/design.md
// section 7.2, "By data"; the d = 256 pair takes (1)-(4) by role instead, sdp_by_role, section
// 7.1):
//   (1)-(4) warpgroup w computes S, dP, P, dS for all 64 queries and keys (block_n / W) w ..
//           (64 x block_n / W each) and stores P^T and dS^T in 16 bits to shared memory;
//   one barrier: every warpgroup's part of P^T and dS^T is there;
//   (5)-(7) warpgroup w computes dV^T, dK^T and dQ^T for its head-dim atom-columns (64 rows
//           each, dealt out evenly, the first warpgroups taking one more: with W = 2 warpgroup 0
//           takes the first ceil(atoms / 2)) over all block_n keys (dV/dK accumulate across
//           steps, dQ^T goes to dQaccum).
// (By keys, d = 64, the split is different: bwd_sm90_mainloop_by_keys.cuh; 128 x 128 steps,
// registers dV + dK 2 x 32, S^T + dP^T 2 x 64, P^T fragments 32: 224; shared memory K, V 16 KB
// each, Q and dO 2 x 16 KB each, dS^T 2 x 32 KB, dQ^T buffers (dq_smem) 2 x 16 KB, LSE / D
// rows 4 x 512 B: 194 KB.)
// With W = 2, registers per consumer thread of warpgroup 0 (the larger share), own = ceil(d / 128):
// dV^T + dK^T 2 x own x block_n / 2, S and dP 2 x block_n / 4 (dead before dQ starts), one dQ^T
// atom 32 in flight. Shared memory: K, V block_n x 2d bytes each, Q and dO 64 x 2d bytes per
// stage, P^T and dS^T double-buffered (step parity: one barrier per step; single_hand: one of
// each), block_n x 128 B each.
//   d = 128: 64 x 128, own 1 each: 224 registers; 64 + 2 x 2 x 16 + 64 = 192 KB, + 2 x 16 KB
//            dQ buffers (dq_smem) = 224 KB, + LSE / D rows (stats_smem) 1 KB.
//   d = 192 (the two-warpgroup shape, measured before three): 64 x 80, own 2 / 1: 160 + 40 + 32
//            = 232; 60 + 2 x 2 x 24 + 40 = 196 KB, + 1 KB of LSE / D rows.
//   d = 256: 64 x 80, own 2 each: 232; 80 + 2 x 32 + 1 x 32 + 40 = 216 KB (a second dO stage
//            would need 228 KB); the pair (default mode): one Q stage, + the partner's K half
//            20 KB + its dS^T 2 x 10 KB = 224 KB.
// Three consumer warpgroups (512 threads, 128 registers each at entry, setmaxnreg 24 / 160) split
// the keys of (1)-(4) in three and own one atom-column each at d = 192: 64 x 96, dV^T + dK^T
// 2 x 48, S and dP 2 x 16, one dQ^T atom 32; shared memory in kBwdSm90Hdim192's comment.
// d = 64: by keys, dQ^T before dK and through shared memory (dq_before_dk with dq_smem: the
// step's dQ^T leaves by a bulk reduce while dK runs). Measured against dK first with the adds
// from registers (H200, bf16, A B A B): +0.6 / +1.7 / +2.0% causal 4k / 8k / 16k, +1.3 / +2.0 /
// +2.0% non-causal; dQ before dK with the adds from registers +0.3..+2.7%; dq_smem alone
// (after dK) -1.3..-3.5% (docs/perf-log.md, "The d = 64 backward: dQ before dK, measured").
// The deterministic mode's ordered adds go through the dQ warps too (det_dq_warp).
// ds_in_branch on top (dV issued after dS^T, the exponentials and the dS arithmetic in one
// block): +3.2 / +2.1 / +1.4% causal, +3.0 / +2.8 / +3.3% non-causal; the deterministic mode
// unchanged (-0.4..+0.2%) (docs/perf-log.md, "dV after dS at d = 64, measured").
// Its waits in kTryFirstSleep (the main kernels; the pre / postprocess kernels stay on kSpin):
// +0.4..+0.7% at every main-sweep point against kSpin (H100, bf16, production and this config
// built side by side and timed call by call in turn; a build with every kernel on that style had
// read +0.4..+1.2%) (docs/perf-log.md, "Measured 2026-12-07, twelfth run").
constexpr BwdSm90Config kBwdSm90Hdim64 = {64, 128, 128, 2, 2, 24, 240, true, 2, true, false, false,
                                         false, false, false, false, false, true, true, false, true,
                                         false, false, false, false, false, 1, false, false,
                                         hopper::WaitStyle::kTryFirstSleep};
// The LSE / D rows arrive with the Q / dO stages (stats_smem) rather than by the consumers'
// loads: +0.6..+3.5% default mode, +0.1..+3.6% deterministic at 512-16k, one -0.9% at
// non-causal 8k with a 5% spread (H100, bf16, A B A B; docs/perf-log.md, "Measured 2026-12-06,
// eighth run"). At d = 192 the same swap read -2.3..+1.8% and -1.6..+1.2% there: left off.
constexpr BwdSm90Config kBwdSm90Hdim128 = {128, 64, 128, 2, 2, 24, 240, true, 2, false, false, true, false, false,
                                          false, false, false, false, false, true, true};
// d = 192: three consumer warpgroups of one atom-column each (64 x 96), dQ^T through shared
// memory, one P^T / dS^T buffer (single_hand) for the room of a second Q stage: K, V 2 x 36 KB,
// Q 2 x 24 KB, dO 24 KB, P^T and dS^T 2 x 12 KB, dQ buffers 3 x 16 KB: 216 KB. Measured against
// two warpgroups at 64 x 80 (two Q and dO stages): +4.1..+7.6% causal, +3.4..+7.9% non-causal;
// the same without single_hand (one Q stage) -17..-25% (docs/perf-log.md). The LSE / D rows are
// brought by the consumer threads (stats_by_consumers), not the stages' bulk copies, which
// compute-sanitizer racecheck reports (it does not follow their mbarrier order): measured
// -0.4..-1.6% against the stage rows, for a racecheck-clean instance (docs/perf-log.md, "Five
// candidates measured, one kept").
constexpr BwdSm90Config kBwdSm90Hdim192 = {192, 64, 96, 2, 1, 24, 160, true, 3, false, false, false,
                                          false, true, false, false, true, false, false, true};
// d = 256 runs the 2-CTA pair (pair_dq, with pair_ghost): its dS^T buffers take the room of
// the second Q stage. Measured on the H200 against one CTA with two Q stages: +0.9 / +4.4 /
// +5.2% causal 4k / 8k / 16k, -0.5 / +0.5 / +1.9% non-causal; one Q stage alone costs 4-7%;
// pair_ghost on top +0..+2.6%; q_atom_barriers (with adds_before_wait) +2.7..+5.3% (docs/perf-log.md).
// sdp_by_role: a benchmark of the SS wgmma alone (tests/gpu/hopper/bench_wgmma_rate.py, H100)
// ran two warpgroups at N = 40 at 76.9% of the math rate and at N = 80 at 100%, by keys or by
// role alike; the pair with S and dP by role measured (H100, A B A B) +2.4 / +2.1 / +1.4% causal
// 4k / 8k / 16k, +2.6 / +2.1 / +2.4% non-causal, deterministic +0.5..+1.1%. The single CTA by
// role read -1.8 / -1.9% at 2048 (default mode), +0.4..+1.4% deterministic: not taken
// (docs/perf-log.md, "Measured 2026-12-06, sixth run"). prefetch_next_rows (H100, GPU time,
// A B A B, 512 / 1k / 2k / 4k / 8k / 16k; 512 runs the single CTA, unchanged): default causal
// -0.3..+0.5% (noise), non-causal +4.6 / +5.4 / +5.0 / +1.9 / +3.7% at 1k-16k; deterministic
// causal +7.5 / +4.8 / +4.4 / +4.6 / +3.2%, non-causal +4.3 / +4.7 / +4.8 / +2.5 / +2.6%. Causal
// CTAs of a head start their walks at different Q blocks, so most of their loads already hit
// L2; the deterministic causal walks and the non-causal ones go in step. At d = 128 / 192 (two
// Q stages; d = 192 one dO stage) the same read -0.4..-4.7% but for three points at 8k (+0.3 /
// +3.0% at d = 128, +2.0% at d = 192 causal): off there (docs/perf-log.md, "Measured
// 2026-12-06, eleventh run").
constexpr BwdSm90Config kBwdSm90Hdim256 = {256, 64, 80, 1, 1, 24, 240, false, 2, false, true, false, true, false, true, true,
                                          false, false, false, true, false, true, false, true, false, true, 2, true,
                                          true};
// The deterministic mode's config per head dim (the configs of a head dim share block_m, and
// none has a smaller block_n than the default's: the workspace and can_implement read the
// default's; they share det_from_the_end, whose walk order is also dK's and dV's order of
// accumulation, the same in the pair and the single CTA: dV bitwise equal between them, dK
// within rounding, since the pair's dS takes P in 16 bits (sdp_by_role)). Every head dim but
// d = 256 runs its default config in this mode too; d = 256 the default's pair with the step's
// groups reordered (dk_before_peer). The pair: against the single-CTA config in this
// mode +3.5 / +5.3 / +7.9% causal, +5.0 / +5.5 / +5.8% non-causal; q_atom_barriers (with
// adds_before_wait) +1.5..+3.9%; pair_ghost +1.6 / +0.9 / +0.3% causal, +0.4 / +0.9 / +1.3%
// non-causal (measured while the causal walks went upwards, when an upper CTA's ghost steps
// were the first of each q head's walk, on tiles no higher unit sees; with det_from_the_end they
// come last and wait for their turn like any step) (docs/perf-log.md, "Ghost steps in the
// deterministic pair").
static constexpr const BwdSm90Config& kBwdSm90Hdim64Det = kBwdSm90Hdim64;
static constexpr const BwdSm90Config& kBwdSm90Hdim128Det = kBwdSm90Hdim128;
static constexpr const BwdSm90Config& kBwdSm90Hdim192Det = kBwdSm90Hdim192;
// d = 256: the default's pair (l2_hints included) with dk_before_peer (above; measured in this
// mode +2.4 / +3.1 / +0.8% causal, +1.7 / +0.7 / +1.2% non-causal at 4k / 8k / 16k, H200).
constexpr BwdSm90Config kBwdSm90Hdim256Det = {256, 64, 80, 1, 1, 24, 240, false, 2, false, true, false, true, false,
                                             true, true, false, false, false, true, false, true, false, true, true,
                                             true, 1, true};
// The single-CTA config of a head dim whose configs are pairs: it runs both modes where the
// pair does not pay (short walks: fewer than kBwdSm90PairMinRows query rows per CTA, measured
// 2.0-5.6% faster than the pair at seqlen 512) or cannot run (no 2-CTA cluster fits, or
// FLASHBACK_BWD_PAIR=0), and the deterministic non-causal calls under
// FLASHBACK_DET_COOPERATIVE. d = 256: the second Q stage back, 216 KB, as measured before the
// pair. Where no config is a pair it is the default's and never runs on its own.
static constexpr const BwdSm90Config& kBwdSm90Hdim64Single = kBwdSm90Hdim64;
static constexpr const BwdSm90Config& kBwdSm90Hdim128Single = kBwdSm90Hdim128;
static constexpr const BwdSm90Config& kBwdSm90Hdim192Single = kBwdSm90Hdim192;
// d = 256 with stats_smem: the step's LSE / D rows ride the Q / dO stages. Measured on the H200
// at 512-2048 against four global loads per thread at the step's top: +1.2..+2.5% default mode,
// +0.5..+1.8% deterministic; stats_by_consumers there -0.6..-2.4% (docs/perf-log.md, "The
// single-CTA d = 256 backward measured").
constexpr BwdSm90Config kBwdSm90Hdim256Single = {256, 64, 80, 2, 1, 24, 240, false, 2, false, false, true,
                                                false, false, false, false, false, false, false, true,
                                                false, false, false, false, false, false, 1, true};

// The causal backward's L2 groups: as many (batch, kv head) pairs at a time as keep the Q, dO
// and dQaccum rows (x the GQA group) of this many queries at d = 256 in L2 (256 / d times as
// many at head dim d; 2 KB per row at d = 256: ~32 MB). Swept at 4k-16k on the H200 (d = 64-192:
// half the rows -3.0..+0.7%, one group of all pairs -1.8..-22.7%, one pair per group
// -4.2..+0.1%; docs/perf-log.md, "Profiles of the three weakest points, two candidates and an
// L2-group sweep"); half the rows again at every head dim and 512-16k (H100): +2.1..+5.6% at
// 512 (d = 64 also +5.4% at 1024), -0.2..-3.1% at d = 192 / 256 from 2048 (docs/perf-log.md,
// "Measured 2026-12-06, fifth run"). So half the rows up to seqlen_q 1024 only: measured
// against the whole (H100, A B A B, causal) +2.0..+5.4% at 512, d = 64 +5.3% at 1024, the rest
// -0.6..+0.8% (docs/perf-log.md, "Measured 2026-12-06, sixth run"). A value, for
// scripts/build_candidates.sh.
struct BwdSm90L2 {
  int causal_rows_at_d256;
  // Calls with seqlen_q <= short_seqlen take short_rows_at_d256 instead (0: none).
  int short_rows_at_d256;
  int short_seqlen;
};
constexpr BwdSm90L2 kBwdSm90L2 = {16384, 8192, 1024};
// Query rows a CTA walks (seqlen_q x the GQA group) from which a pair config runs. Measured
// at d = 256: the single CTA faster by 1.7-12% at 512-2048 rows, the pair faster from 4096,
// before the pair split S and dP by role; after it, the pair against the single CTA (H100,
// bf16, GPU time, builds interleaved x 2, default mode): causal -2.0 / +3.2 / +4.6%, non-causal -5.6 / +0.3 / +4.4% at
// 512 / 1024 / 2048 (docs/perf-log.md, "Measured 2026-12-06, seventh run"). So from 1024.
constexpr int kBwdSm90PairMinRows = 1024;

// Measured slower and removed: the d = 256 pair on 64-key blocks with two Q stages (and its
// single-CTA companion), -8..-14% (docs/perf-log.md, "dV after dS at d = 64, measured"); the
// pair at 64 x 80 with two Q stages in the room of single P^T / dS^T buffers and one dS^T
// receive buffer, -3.5 / -3.5 / -4.5% causal 4k / 8k / 16k, -2.6..+2.5% non-causal,
// deterministic -0.9..+1.4% (H100; docs/perf-log.md, "Measured 2026-12-06, fifth run"); again
// after S / dP by role and the L2 prefetch, +0.3..-6.5% default (a loss from 2048), -0.6..-4.6%
// deterministic at 1k-16k: the Q wait at the step's top halved, but S and the partner's dS^T came later (the next
// Q's copy lands amid the step's shared-memory-bound GEMMs; docs/perf-log.md, "Measured
// 2026-12-06, twelfth run").
// The d = 256 pair's step as dV^T, dK^T, then dQ^T (the one Q stage handed back while dQ^T
// runs): -0.1..+1.9%, noise; with dQ^T peer queued behind dQ^T own -0.5..-2.9%; its dQ^T one
// step late (the partner's dS^T a step ahead; one more consumer barrier and both CTAs' free
// waits) -1.3..-3.7%, with dV^T / dK^T first -2.7..-4.9% (docs/perf-log.md, "Measured
// 2026-12-06, second run").
// At d = 256 (one CTA and the pair): the last CTA to add into a dQaccum tile converting it to
// dQ in the main kernel, no postprocess, 3-11% slower (causal calls converting too: 8-14%); the
// per-step count and verdict cost more than the postprocess (docs/perf-log.md, "The split
// loops, the dQ conversion and the late PDL wait measured").
// d = 192 with three consumer warpgroups of one atom-column each (64 x 96, FA3's public d = 192
// shape; registers 128 of 160, 216 KB): passed the d = 192 GPU tests and measured no faster
// than two warpgroups at 64 x 80 (-2.7..+3.1%, docs/perf-log.md); its kernels are compiled by the
// flashback_candidates target (csrc/candidates/), not linked.
constexpr BwdSm90Config kBwdSm90Hdim192Wg3 = {192, 64, 96, 2, 2, 24, 160, false, 3};
// The d = 256 config with the per-step clock stamps (timeline), a measuring aid: swapped in by
// scripts/build_candidates.sh kBwdSm90Hdim256=kBwdSm90Hdim256Timeline for scripts/bwd_timeline.py.
constexpr BwdSm90Config kBwdSm90Hdim256Timeline = {256, 64, 80, 1, 1, 24, 240, false, 2, false, true, false, true, false,
                                                  true, true, false, false, false, true, false, true, true, true,
                                                  false, true, 2, true};
// The d = 256 default with the last three causal L2 groups merged instead of two measured
// -0.8 / -1.4 / +0.4% at 4k / 8k / 16k, with none merged -0.2 / +0.5 / +0.2% at 512 / 1024 /
// 2048 (H100, bf16, A/B; docs/perf-log.md, "Measured 2026-12-07, second run"): two kept.
// The d = 192 candidates below merge two or three groups
// (one CTA per 96-key block, 132 slots, 10 groups at 8k / 16k), where the
// model puts one group at 1.015 / 1.032 / 1.032 of the ideal at 4k / 8k / 16k, two merged at
// 1.010 / 1.013 / 1.013, three at 1.005 / 1.015 / 1.016 (d = 64 / 128: within 0.4% either way).
constexpr BwdSm90Config kBwdSm90Hdim192Tail2 = {192, 64, 96, 2, 1, 24, 160, true, 3, false, false, false,
                                               false, true, false, false, true, false, false, true,
                                               false, false, false, false, false, false, 2};
constexpr BwdSm90Config kBwdSm90Hdim192Tail3 = {192, 64, 96, 2, 1, 24, 160, true, 3, false, false, false,
                                               false, true, false, false, true, false, false, true,
                                               false, false, false, false, false, false, 3};
// Candidates (written, not yet run): the d = 128 config with own_keys_first 1 (Own) and 2
// (OwnLate). scripts/build_candidates.sh kBwdSm90Hdim128=kBwdSm90Hdim128Own; docs/perf-log.md,
// "d = 128 backward: each warpgroup's own keys first (candidate)".
constexpr BwdSm90Config kBwdSm90Hdim128Own = {128, 64, 128, 2, 2, 24, 240, true, 2, false, false, true, false,
                                             false, false, false, false, false, false, true, true,
                                             false, false, false, false, false, 1, false, false,
                                             hopper::WaitStyle::kSpin, 1};
constexpr BwdSm90Config kBwdSm90Hdim128OwnLate = {128, 64, 128, 2, 2, 24, 240, true, 2, false, false, true, false,
                                                 false, false, false, false, false, false, true, true,
                                                 false, false, false, false, false, 1, false, false,
                                                 hopper::WaitStyle::kSpin, 2};
// Measured and not adopted (H100, bf16, A Q A Q; docs/perf-log.md, "Measured 2026-12-07"): the
// dQ conversion under the main kernel's tail (dq_post_queue) at d = 64 / 128 / 192, -1.4..+2.7%
// on the main sweep, d = 128 at 512 -2.4 / -2.0%.
// Measured and removed (H200, bf16, GPU time, A B C A B C; docs/perf-log.md, "Measured
// 2026-12-06, thirteenth run"): the d = 256 pair with dK^T queued behind dV^T before the
// partner wait and Q handed back with dO after dQ^T peer's issue, -1.3..-2.7% default,
// +0.1..+1.6% deterministic (below dk_before_peer's order there).
// Measured and removed (H100, bf16, GPU time, A B C D x 2; docs/perf-log.md, "Measured
// 2026-12-06, tenth run"): in the d = 256 pair, the next step's dO issued before its Q
// (-2.6..-5.4% at 1024-16k, not profiled; ncu had put ~9% of the stall samples on the dO wait),
// and the LSE / D rows loaded a step ahead into registers (-1.4..+0.6% default, -0.4..+0.5%
// deterministic: noise).
// The two-warpgroup d = 192 config the table had before (64 x 80, Q 2 / dO 2, shares 2 / 1):
// 3.4-7.9% slower than kBwdSm90Hdim192 (docs/perf-log.md). Compiled by the candidates target
// because it is the one config with unequal shares, whose second consumer instance
// (bwd_sm90_launch.cuh) no table row instantiates now.
constexpr BwdSm90Config kBwdSm90Hdim192Wg2 = {192, 64, 80, 2, 2, 24, 240, false, 2, false, false, true};
// Measured slower and removed (H100, bf16, against the production configs; docs/perf-log.md,
// "Measured 2026-12-06, seventh run"): the d = 256 pair by role with each warpgroup's dV^T issued
// as soon as P^T is in shared memory, before the hand-off barrier, -4.6..-7.8% default mode,
// -4.1..-5.2% deterministic (the main sweep); the deterministic pair's two turn warps taking the
// steps in turn, -0.2..-0.7%; d = 192 on 80-key blocks with S by keys on two warpgroups and dP
// over all keys on the third (160 / 160 / 168 registers), -4.1..+3.0% default mode,
// -6.0..-12.6% deterministic.

// Measured slower and removed (docs/perf-log.md, "Measured 2026-12-06, eighth run"): the
// deterministic d = 256 pair releasing Q before its dQ turn, -0.0..-1.1%, and with the turn
// poll by relaxed loads too, -0.0..-2.2%.

// Measured slower and removed (H100, bf16, GPU time; docs/perf-log.md, "Measured 2026-12-07,
// fifth run"): in the d = 256 pair, an idle producer warp asking L2 for K / V of the unit one
// resident wave ahead, -0.4..-3.1%; the pair as a persistent grid of resident clusters walking
// units from a counter (each unit's K / V loaded under the last unit's dV / dK stores),
// -3.5..-7.9%. Its second form (units counting steps from 0 behind a per-unit rearm of the
// exchange barriers, in a kernel of its own; "Measured 2026-12-07, sixth run"): -1.5..-7.5% at
// production's 24 / 240 registers, -3.2..+1.2% at 40 / 232. The fixed cost per CTA it was to
// hide (~5% of causal 4k) is smaller than what a persistent step loop loses.

// What the main kernel reads besides the tensor maps of Q, K, V, dO (and the stage rows').
struct BwdSm90Params {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, group;  // group = nheads / nheads_k
  int m_blocks;     // ceil(seqlen_q / block_m): the steps of the longest sequence
  int n_blocks;     // ceil(seqlen_k / block_n)
  int l2_group;     // (batch, kv head) pairs scheduled together (bwd_sm90_scheduler.cuh)
  int causal;
  int head_inner;  // bit 0 Q, 1 K, 2 V, 3 dO: that tensor map's dims are {d, head,
                   // seq, batch} (else {d, seq, head, batch}); see make_rows_map in sm90_common.h
  float scale_log2;     // softmax_scale * log2(e)
  float softmax_scale;  // dK = scale * sum dS^T Q
  // The workspace is indexed by 64-row tile (dq_tile in bwd_sm90_prepost.h; dense batches:
  // (batch, nheads, m_blocks x block_m / 64) tiles):
  const float* lse_log2;  // 64 rows per tile: LSE * log2(e), +inf padding
  const float* dsum;      // same: D = rowsum(dO * O), 0 padding
  float* dq_accum;        // 64 x d fp32 per tile, fragment order
  DqTiles dq_tiles;
  // Deterministic mode (deterministic=True): per dQaccum tile and phase of the adds (by head
  // dim, the first or the second atom-column each consumer warpgroup adds; by keys one phase
  // per tile, counter 0, added by one warpgroup; pair_dq: counter r for the head-dim half that
  // rank r adds), how many units (K/V blocks, or a pair's two) have added theirs. Each tile takes the adds in one fixed order
  // (bwd_sm90_dq_rank in bwd_sm90_scheduler.cuh), so every element is summed the same way
  // every run. Null otherwise.
  int* dq_turn;           // per workspace tile (dq_tile, bwd_sm90_prepost.h): 2 counters
  int dsum_tile0;         // stage rows: the first row of D in the stats map (after LSE's rows)
  int det_chunk;          // deterministic, non-causal: units per chunk of the grid (what is
                          // resident at once: CTAs, or pair_dq clusters)
  int block_base;         // grid index of this launch's CTA 0 (cooperative chunk launches), else 0
  // Varlen (flashback.h): per-sequence offsets, null for dense batches; seqlen_q / seqlen_k
  // (and m_blocks / n_blocks) are then the longest sequence's, and the maps address packed rows.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  void* dk;
  void* dv;
  flashback_strides dk_strides, dv_strides;
  // timeline configs only (set from flashback_debug_bwd_timeline): 16 slots per consumer
  // warpgroup per step per CTA, for CTAs < timeline_ctas and steps < timeline_steps.
  unsigned long long* timeline;
  int timeline_ctas, timeline_steps;
  // dq_post_queue configs only: the queue (DqPostQueue), and the count that completes a pair
  // (its CTAs x the counts per CTA, dq_post_counts_per_cta).
  DqPostQueue dq_post;
  int dq_post_total;
  // split_last_wave configs only (bwd_sm90_split_plan): grid units (clusters) from split_first
  // on are parts, split_parts per split unit (1: no split; then split_first is past the grid).
  // Per split unit and rank, split_parts - 1 slots of dV^T then dK^T partials (kSplitSlotFloats
  // fp32 each) and one count of the parts that have left theirs (split_done, zeroed by the
  // preprocess with the queue).
  int split_first, split_parts;
  float* split_dkv;
  int* split_done;
};

// split_last_wave: how the grid's partial last wave is cut (bwd_sm90_launch.cu). units: the
// grid's units (clusters), slots: clusters resident at once, m_blocks: the Q blocks a unit walks
// per q head, group: its q heads (the GQA group). k = 1: none.
struct BwdSm90SplitPlan {
  int first = 0x7fffffff;  // the first split unit (none: past any grid)
  int parts = 1;           // k
};
// A walk shorter than this many steps is not split (the fill model: at 1024 / 2048 keys the
// split gains nothing over the queue, docs/perf-log.md, "Next idea for the non-causal points").
constexpr int kBwdSm90SplitMinSteps = 64;
// Parts per split unit: two. Three (the model's pick where the last wave holds 40 of 66 units,
// 4k / 8k on the benchmark's shapes) measured +0.6 / -0.5% and -0.7 / +0.5% at 4k / 8k, two
// (16k: 32 of 66) +1.7 / +2.2% (H100, bf16, GPU time, A/B; docs/perf-log.md, "The split last
// wave"). With two parts a split pays only where the last wave's units fit the slots twice
// (r <= slots / 2), so at most 36 units split (half a 144-SM die's clusters): that bounds the
// workspace by the shapes, not the device.
constexpr int kBwdSm90SplitMaxParts = 2;
constexpr int kBwdSm90SplitMaxUnits = 36;
BwdSm90SplitPlan bwd_sm90_split_plan(int units, int slots, int m_blocks, int group);

// The points of a pair step a timeline config stamps (slot index per warpgroup and step).
// By role: warpgroup 0 computes S and P, warpgroup 1 dP and dS.
enum BwdTimelineEvent {
  kTlStepTop,    // after the step's work item was decoded
  kTlInput,      // wg 0: Q_i in (q_atom_barriers: its first atom-column; S issues);
                 // wg 1: dO_i waited for (dP issues after S)
  kTlGemm1,      // wg 0: S complete; wg 1: S issued (its barrier passed; dP issues)
  kTlGemm2,      // wg 0: P^T stored; wg 1: dP complete (Q_i, for dK^T, waited for after dP's issue)
  kTlCross,      // wg 0: dO_i waited for (dV^T); wg 1: P^T read barrier passed (dS next)
  kTlHandoff,    // the hand-off barrier passed (dS^T of both warpgroups in place)
  kTlPartner,    // the partner's dS^T arrived
  kTlDqDone,     // dQ^T complete (wait<1>), dO_i released
  kTlStepEnd,    // the adds issued and dK^T complete, Q_i released
  kTlEvents,
  // The producer's points, in warpgroup 0's slots of the step whose rows it loads.
  kTlProducerQFree = kTlEvents,  // the one Q stage seen free (every consumer warp released Q_{i-1})
  kTlProducerDoIssued,           // Q_i's and dO_i's copies issued
  // Once per CTA, in step 0's slots of each consumer warpgroup: what a CTA costs outside its
  // steps (its start to the first step's top, the last step's end to its exit) and, from the
  // global timer and the SM id, how the grid's CTAs fill the SMs over the kernel's time.
  kTlCtaEntry = kTlProducerDoIssued + 1,  // clock64 at the kernel's top
  kTlCtaExit,                             // clock64 after the epilogue's final cluster barrier
  kTlCtaEntryNs,                          // %globaltimer (ns) at the kernel's top
  kTlCtaExitNs,                           // %globaltimer at the exit
  kTlCtaSm,                               // %smid
};
static_assert(kTlCtaSm < 16, "16 timeline slots per warpgroup and step");

// The buffer a timeline config writes to (bwd_sm90_launch.cu; null: none).
void bwd_sm90_set_timeline(unsigned long long* buffer, int ctas, int steps);
void bwd_sm90_timeline(unsigned long long** buffer, int* ctas, int* steps);

// Does the fast path take these params? Static (no device state): a config for the head dim in
// the table, bf16 or fp16, every tensor TMA-addressable (16-byte aligned base, strides multiples of
// 16 bytes -- the API already demands both). `why` (may be null) gets the first reason not.
bool bwd_sm90_can_implement(const flashback_bwd_params& p, const char** why);

// Workspace bytes of the fast path (256-byte aligned parts): dQaccum, padded LSE*log2e and D.
size_t bwd_sm90_workspace_size(const flashback_bwd_params& p);

// Runs (0) preprocess, the main kernel, the postprocess on p.stream. Returns
// cudaErrorNotSupported without launching anything when a tensor map cannot be encoded or no
// 2-CTA cluster of a pair_dq config fits on the device (the caller then takes the reference
// path).
cudaError_t run_bwd_sm90(const flashback_bwd_params& p, cudaStream_t stream);

// The form the last run_bwd_sm90 of this process launched ("pair", "single"; "" after
// bwd_sm90_note_kernel("") or when it launched nothing): flashback_last_backward_kernel.
void bwd_sm90_note_kernel(const char* kernel);
const char* bwd_sm90_last_kernel();

}  // namespace sm90
}  // namespace flashback
