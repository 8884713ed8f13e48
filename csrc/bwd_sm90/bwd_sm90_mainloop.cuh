// Main loop of the Hopper backward: the TMA producer and the consumer warpgroups. Steps
// numbered as docs/design.md section 4:
//   (1) S = Q_i K_j^T   (2) P = exp2(S * scale * log2e - LSE_i * log2e), masked
//   (3) dP = dO_i V_j^T (4) dS = P * (dP - D_i)
//   (5) dV_j += P^T dO_i   (6) dK_j += dS^T Q_i   (7) dQ_i += dS K_j
//
// Split by head dim (bwd_sm90.h; the split by keys, BwdSm90Config::by_keys, is in
// bwd_sm90_mainloop_by_keys.cuh): consumer warpgroup w owns keys (block_n / W) w .. for (1)-(4) and
// its head-dim atom-columns (64 rows each) for (5)-(7). (5)-(7) are computed transposed
// (M = head dim):
//   (5) dV^T += dO^T P     (6) dK^T += Q^T dS     (7) dQ^T = K^T dS^T
// so every operand is a tile already in shared memory and no GEMM needs registers from the other
// warpgroup. P^T and dS^T ([key][query], block_n rows of 128 bytes) are the only hand-off:
// written with stmatrix.trans from each warpgroup's S / dP accumulators, read by all after one
// barrier. (sdp_by_role, the d = 256 pair, bwd_sm90.h: warpgroup 0 computes S and P for all
// block_n keys, warpgroup 1 dP and dS, reading P back from P^T.)
//
// Shared memory (128B-swizzled tiles, 1024-aligned; TMA writes all but P^T / dS^T; d/64
// atom-columns per tile):
//   K_j, V_j     block_n rows x 128 B per atom-column, loaded once
//   Q_i          q_stages x block_m rows x 128 B per atom-column
//   dO_i         do_stages x block_m rows x 128 B per atom-column
//   P^T, dS^T    2 buffers each (step parity; single_hand: 1 each), block_n rows x 128 B per
//                64 queries (by keys: dS^T only)
//   dQ^T         with dq_smem: one 16 KB fp32 buffer per consumer warpgroup
//   LSE, D       by keys or stats_smem: the step's block_m rows of each per Q / dO stage
//   K_peer, dS^T_peer  with pair_dq: the partner block's K for this CTA's dQ^T atom-columns
//                (TMA, with K) and 2 buffers of the partner's dS^T (its bulk copies)
// (sizes per config in bwd_sm90.h).
//
// wgmma operands (docs/hopper-facts.md section 11; M always 64 per instruction), N = block_n:
//   (1) S   = Q K_w^T    A = Q_i K-major, B = K rows (N/W) w.. K-major   (SS, m64 n(N/W), K d)
//   (3) dP  = dO V_w^T   A = dO_i K-major, B = V rows (N/W) w.. K-major  (SS, m64 n(N/W), K d)
//   (5) dV^T = dO^T P    A = dO_i MN-major (trans-a), B = P^T K-major     (SS, m64 nN, K 64)
//   (6) dK^T = Q^T dS    A = Q_i MN-major (trans-a), B = dS^T K-major     (SS, m64 nN, K 64)
//   (7) dQ^T = K^T dS^T  A = K MN-major (trans-a), B = dS^T MN-major      (SS, m64 n64, K N)
// (5)-(7) per warpgroup: one m64 tile per atom-column it owns.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "bwd_sm90/bwd_sm90.h"
#include "bwd_sm90/bwd_sm90_epilogue.cuh"
#include "bwd_sm90/bwd_sm90_scheduler.cuh"
#include "hopper/hopper.h"
#include "sm90/sm90_common.h"

namespace flashback {
namespace sm90 {

namespace fh = flashback::hopper;

template <const BwdSm90Config& kCfg, Dtype kDtype>
struct BwdSm90Traits {
  static constexpr Dtype kElem = kDtype;
  static constexpr int kHeadDim = kCfg.head_dim;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kQStages = kCfg.q_stages;
  static constexpr int kDoStages = kCfg.do_stages;
  static constexpr int kProducerRegs = kCfg.producer_regs;
  static constexpr int kConsumerRegs = kCfg.consumer_regs;
  static constexpr int kConsumerWgs = kCfg.consumer_wgs;
  static_assert(kConsumerWgs == 2 || kConsumerWgs == 3, "two or three consumer warpgroups");
  static constexpr int kThreads = 128 * (1 + kConsumerWgs);
  // Registers per thread at entry under __launch_bounds__(kThreads, 1): 65536 / kThreads rounded
  // down to a multiple of 8, 168 for 384 threads, 128 for 512 (docs/hopper-facts.md section 7).
  static constexpr int kEntryRegs = (65536 / kThreads) / 8 * 8;
  static constexpr int kConsumerWarps = 4 * kConsumerWgs;   // arrivals that free a stage
  static constexpr int kConsumerThreads = 128 * kConsumerWgs;
  static_assert(kHeadDim % 64 == 0 && kHeadDim >= 64 && kHeadDim <= 256,
                "d is a whole number of 64-element atom-columns, at most 256");
  // (5)-(7) split by keys (bwd_sm90_mainloop_by_keys.cuh) instead of by head-dim atom-columns.
  static constexpr bool kByKeys = kCfg.by_keys;
  static_assert(kByKeys ? kBlockM == 64 * kConsumerWgs : kBlockM == 64,
                "by head dim: one wgmma M (64 queries) per step; by keys: 64 queries of dQ^T per "
                "warpgroup");
  static_assert(kBlockM % kDqTileRows == 0, "a step covers whole dQaccum tiles");
  static constexpr int kStepTiles = kBlockM / kDqTileRows;  // workspace tiles per step
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "block_n: k16 steps of dQ^T, N of dV^T");
  static_assert(kBlockN % (8 * kConsumerWgs) == 0, "each warpgroup's keys: a whole wgmma N");
  static constexpr int kWgKeys = kBlockN / kConsumerWgs;  // keys per consumer warpgroup
  static constexpr int kAtomCols = kHeadDim / 64;          // 64-element (128-byte) columns
  static_assert(!kByKeys || (kWgKeys == 64 && kAtomCols == 1),
                "by keys: each warpgroup's keys one wgmma M, one head-dim atom-column (d = 64: "
                "a warpgroup's dQ^T is one m64n64 tile)");
  // Head-dim atom-columns of (5)-(7) per warpgroup: the first kAtomCols % kConsumerWgs take one
  // more (with two warpgroups: warpgroup 0 takes the larger share; written out for two, as the
  // run-time warpgroup index of a shared instance then costs one select).
  static constexpr int own(int wg) {
    return kConsumerWgs == 2 ? (wg == 0 ? (kAtomCols + 1) / 2 : kAtomCols / 2)
                             : kAtomCols / kConsumerWgs + (wg < kAtomCols % kConsumerWgs ? 1 : 0);
  }
  static constexpr int first_atom(int wg) {
    return kConsumerWgs == 2 ? (wg == 0 ? 0 : (kAtomCols + 1) / 2)
                             : wg * (kAtomCols / kConsumerWgs) +
                                   (wg < kAtomCols % kConsumerWgs ? wg : kAtomCols % kConsumerWgs);
  }
  static constexpr int kOwn0 = own(0);
  static constexpr int kOwn1 = own(kConsumerWgs - 1);  // the smallest share
  // Every consumer warpgroup runs one instance of bwd_sm90_consumer (see there), unless two
  // warpgroups own different non-zero shares.
  static constexpr bool kSharedConsumer = kOwn0 == kOwn1 || (kConsumerWgs == 2 && kOwn1 == 0);
  static_assert(kSharedConsumer || kConsumerWgs == 2, "unequal shares: written for two warpgroups");
  static constexpr uint32_t kQAtomBytes = kBlockM * 128;   // one atom-column of a Q-side tile
  static constexpr uint32_t kKvAtomBytes = kBlockN * 128;  // one atom-column of K or V
  static constexpr uint32_t kQTileBytes = kAtomCols * kQAtomBytes;
  static constexpr uint32_t kKvTileBytes = kAtomCols * kKvAtomBytes;
  static constexpr uint32_t kHandBytes = kBlockN * kBlockM * 2;  // P^T or dS^T
  // The hand-off tiles [key][query] in atom-columns of 64 queries (by keys: kBlockM / 64).
  static constexpr uint32_t kHandAtomBytes = kBlockN * 128;
  static constexpr uint32_t kOffK = 0;
  static constexpr uint32_t kOffV = kOffK + kKvTileBytes;
  static constexpr uint32_t kOffQ = kOffV + kKvTileBytes;
  static constexpr uint32_t kOffDo = kOffQ + kQStages * kQTileBytes;
  // P^T only by head dim (by keys it stays in registers); 2 buffers each (step parity), or 1
  // (single_hand).
  static constexpr uint32_t kOffP = kOffDo + kDoStages * kQTileBytes;
  static constexpr bool kSingleHand = kCfg.single_hand;
  static constexpr fh::WaitStyle kWaitStyle = fh::effective_wait_style(kCfg.wait_style);
  static constexpr bool kDqBeforeDk = kCfg.dq_before_dk;
  static_assert(!kDqBeforeDk || kByKeys, "dq_before_dk: for the split by keys");
  static constexpr bool kDsInBranch = kCfg.ds_in_branch;
  static_assert(!kDsInBranch || kByKeys, "ds_in_branch: by keys only (bwd_sm90.h)");
  static constexpr uint32_t kHandBufs = kSingleHand ? 1 : 2;
  // sdp_by_role (bwd_sm90.h): warpgroup 0 computes S and P, warpgroup 1 dP and dS, each over all
  // block_n keys (one m64 n block_n accumulator instead of S and dP of block_n / 2 keys each).
  static constexpr bool kSdpByRole = kCfg.sdp_by_role;
  // own_keys_first (bwd_sm90.h): half 0 of a warpgroup's dV^T / dK^T registers holds its own
  // kWgKeys keys, half 1 the other warpgroup's.
  static constexpr bool kOwnKeysFirst = kCfg.own_keys_first > 0;
  // own_keys_first 1: the own dV^T half right after P^T's store (under dS), else with dK^T's.
  static constexpr bool kOwnDvUnderDs = kCfg.own_keys_first == 1;
  static_assert(kCfg.own_keys_first >= 0 && kCfg.own_keys_first <= 2, "own_keys_first: 0, 1 or 2");
  static constexpr uint32_t kOffDs = kOffP + (kByKeys ? 0 : kHandBufs * kHandBytes);
  // dQ through shared memory (kCfg.dq_smem, default mode): one 64 x 64 fp32 buffer per consumer
  // warpgroup in dQaccum's fragment order, which a producer-warpgroup warp adds into dQaccum
  // with one bulk reduce per step (bwd_sm90_dq_warp).
  static constexpr bool kDqViaSmem = kCfg.dq_smem;
  static_assert(!kDqViaSmem || kByKeys || (kOwn0 == 1 && kOwn1 == 1),
                "dq_smem: one dQ^T atom-column per warpgroup, one dQ warp each");
  // The deterministic mode's dQ adds through the dQ warps too (det_dq_warp, bwd_sm90.h): one
  // turn counter per warpgroup's atom-column (by head dim) or per step tile (by keys).
  static constexpr bool kDetDqWarp = kCfg.det_dq_warp;
  static_assert(!kDetDqWarp || (kDqViaSmem && (kByKeys || kConsumerWgs <= kDqTurnsPerTile)),
                "det_dq_warp: dQ through shared memory and a turn counter per warpgroup");
  // The deterministic causal order (det_from_the_end, bwd_sm90.h); every walker of a CTA
  // (producer, consumers, dQ and turn warps) passes it to the scheduler's functions.
  static constexpr bool kDetFromEnd = kCfg.det_from_the_end;
  static constexpr uint32_t kDqBufBytes = kDqAtomFloats * 4;  // 16 KB
  static constexpr uint32_t kOffDqBuf = kOffDs + kHandBufs * kHandBytes;
  // By keys a thread needs LSE and D of 32 query columns, too many to hold from the step's
  // start: each Q stage brings the step's LSE * log2(e) rows, each dO stage its D rows (a tensor
  // copy through the stats map on the stage's full barrier), read from shared memory next to
  // their use. stats_smem: the same for the split by head dim.
  static constexpr bool kStatsByConsumers = kCfg.stats_by_consumers;
  static constexpr bool kStatsSmem = (kByKeys || kCfg.stats_smem) && !kStatsByConsumers;
  static constexpr uint32_t kStatBytes = kStatsSmem ? kBlockM * 4 : 0;
  static constexpr uint32_t kOffLse = kOffDqBuf + (kDqViaSmem ? kConsumerWgs * kDqBufBytes : 0);
  static constexpr uint32_t kOffDsum = kOffLse + kQStages * kStatBytes;
  static_assert(kStatBytes == 0 || (kOffLse % 128 == 0 && kStatBytes % 128 == 0),
                "stage rows: 128-byte aligned tensor copy destinations");
  // stats_by_consumers: two buffers (step parity) of the step's LSE * log2(e) rows, then its D rows.
  static_assert(!kStatsByConsumers ||
                    (!kCfg.stats_smem && !kCfg.pair_ghost && kConsumerThreads >= 2 * kBlockM),
                "stats_by_consumers: one row per consumer thread, every step stores its "
                "successor's rows (a ghost step would skip the store)");
  static constexpr uint32_t kOffRows = kOffDsum + kDoStages * kStatBytes;
  static constexpr uint32_t kRowsBytes = kStatsByConsumers ? 2 * 2 * kBlockM * 4 : 0;
  // pair_dq (default mode): the partner's K for this CTA's half of the head dim (loaded with K)
  // and two buffers (step parity) for the partner's dS^T, bulk-copied in by the partner.
  static constexpr bool kPair = kCfg.pair_dq;
  static_assert(!kPair || (!kByKeys && !kDqViaSmem && kConsumerWgs == 2 && kAtomCols == 4 &&
                            !kSingleHand),
                "pair_dq: split by head dim, two warpgroups, d = 256 (one dQ^T atom-column of "
                "the CTA's half each), the P^T / dS^T buffers by step parity");
  static constexpr int kPairAtoms = kAtomCols / 2;  // dQ^T atom-columns per CTA of a pair
  static constexpr bool kPairGhost = kCfg.pair_ghost;
  static constexpr bool kAddsBeforeWait = kCfg.adds_before_wait;
  static constexpr bool kTimeline = kCfg.timeline;
  static constexpr bool kPrefetchNextRows = kCfg.prefetch_next_rows;
  static constexpr bool kDkBeforePeer = kCfg.dk_before_peer;
  static constexpr bool kL2Hints = kCfg.l2_hints;
  static constexpr int kL2TailGroups = kCfg.l2_tail_groups;
  static_assert(kL2TailGroups >= 1, "l2_tail_groups: 1 keeps every group");
  static constexpr bool kDqPostQueue = kCfg.dq_post_queue;
  static constexpr bool kSplitLastWave = kCfg.split_last_wave;
  static_assert(!kSplitLastWave || (kCfg.pair_dq && kCfg.dq_post_queue && !kCfg.timeline),
                "split_last_wave: the pair (both warpgroups hold dV^T / dK^T) with the queue");
  // split_last_wave: a CTA's dV^T and dK^T partial, fp32 (kSplitSlotFloats per slot).
  static constexpr int kSplitSlotFloats = 2 * kHeadDim * kBlockN;
  static_assert(!kDkBeforePeer || kCfg.pair_dq, "dk_before_peer: the pair's step");
  static_assert(!kTimeline || (kCfg.pair_dq && kCfg.sdp_by_role), "timeline: the pair's steps by role");
  static_assert(!kPairGhost || kPair, "pair_ghost: the pair's upper CTA");
  // Swizzled tiles start on 1024 bytes (the stat rows before may end anywhere).
  static constexpr uint32_t kOffKPeer = (kOffRows + kRowsBytes + 1023) / 1024 * 1024;
  static constexpr uint32_t kOffDsPeer = kOffKPeer + (kPair ? kPairAtoms * kKvAtomBytes : 0);
  static constexpr uint32_t kOffBar = kOffDsPeer + (kPair ? 2 * kHandBytes : 0);
  static constexpr uint32_t kOffPipeQ = kOffBar + 16;  // after the K and V barriers
  static constexpr uint32_t kOffPipeDo = kOffPipeQ + sizeof(fh::TmaPipeline<kQStages>);
  // pair_dq: per buffer b, full[b] (this CTA's arrive_expect_tx + the partner's bytes) and
  // free[b] (the partner's two warpgroups' remote arrivals once their dQ^T wgmmas read it).
  static constexpr uint32_t kOffPairBar = kOffPipeDo + sizeof(fh::TmaPipeline<kDoStages>);
  // q_atom_barriers: per Q stage one full barrier per atom-column (the ring's own full barrier
  // unused for Q).
  static constexpr bool kQAtomBars = kCfg.q_atom_barriers;
  static_assert(!kQAtomBars || (!kStatsSmem && !kByKeys && !kStatsByConsumers),
                "q_atom_barriers: split by head dim, no stats rows on the Q stage's barrier");
  static constexpr uint32_t kOffQAtomBar = kOffPairBar + (kPair ? 32 : 0);
  static constexpr uint32_t kPlanBytes = kOffQAtomBar + (kQAtomBars ? kQStages * kAtomCols * 8 : 0);
  // 1 KB of slack lets align_smem round the dynamic window up to 1024 bytes.
  static constexpr size_t kSmemBytes = 1024 + kPlanBytes;
  static_assert(kSmemBytes <= 232448, "over the 227 KB a CTA may have");
  static_assert(kKvAtomBytes % 1024 == 0 && kWgKeys * 128 % 1024 == 0 && kHandBytes % 1024 == 0,
                "swizzled tiles and each warpgroup's kWgKeys-row part must stay 1024-aligned");
  static_assert((kOffQ | kOffDo | kOffP | kOffDs | kOffDqBuf | kOffKPeer | kOffDsPeer) % 1024 == 0,
                "every swizzled tile starts 1024-aligned");
  // Epilogue staging of dV and dK as 16-bit [key][d] rows padded by 16 bytes (stmatrix rows of
  // one matrix then fall into 8 different bank groups), over K, V and Q, dead by then.
  static constexpr uint32_t kStageRowBytes = kHeadDim * 2 + 16;
  static constexpr uint32_t kStageBytes = kBlockN * kStageRowBytes;
  static_assert(2 * kStageBytes <= kOffDo, "dK/dV staging must fit over K, V and Q");
  // setmaxnreg budget: the pool is what the CTA got at entry (kEntryRegs per thread).
  static_assert(128 * kCfg.producer_regs + kConsumerThreads * kCfg.consumer_regs <=
                    kEntryRegs * kThreads,
                "setmaxnreg budget exceeds the register file: .inc would deadlock");
  // dV^T and dK^T live throughout; S and dP (kWgKeys / 2 each) die at the hand-off, before the
  // dQ^T atom (32) is born.
  static_assert(kByKeys ||
                    2 * kOwn0 * kBlockN / 2 + (kWgKeys > 32 ? kWgKeys : 32) <= kCfg.consumer_regs - 8,
                "dV^T, dK^T and S + dP or one dQ^T atom exceed the consumer register budget");
  // By keys: dV, dK (d / 2 each), S^T and dP^T (block_m / 2 each) and P^T's 16-bit fragments
  // (block_m / 4) live together while dV is issued.
  static_assert(!kByKeys || kHeadDim + kBlockM + kBlockM / 4 <= kCfg.consumer_regs - 16,
                "dV, dK, S^T, dP^T and P^T's fragments exceed the consumer register budget");
  // Named barriers between the consumer warpgroups (id 0 is __syncthreads).
  static constexpr uint32_t kBarHandoff = 1;  // all parts of P^T, dS^T of this step written
  static constexpr uint32_t kBarEpilogue = 2;  // K/V/Q reads done, then staging written
  // Deterministic mode, per phase h of the dQ adds (h: the h-th atom-column each warpgroup
  // adds) and its turn warp (bwd_sm90_turn_warp):
  // By keys, phase h is warpgroup h's tile (step tile h), which only that warpgroup adds.
  // Add phases per step: by keys one per warpgroup's tile; by head dim one per atom-column a
  // warpgroup adds (pair_dq: one, the CTA's half of the head dim).
  static constexpr int kDqPhases = kByKeys ? kConsumerWgs : kPair ? 1 : kOwn0;
  static_assert(kDqPhases <= 2, "two turn warps and barrier pairs");
  static constexpr uint32_t kBarTurn0 = 3;   // 3 + h: the tile's turn for phase h has come
  static constexpr uint32_t kBarAdded0 = 5;  // 5 + h: all warpgroups issued their phase-h adds
  static constexpr uint32_t kTurnThreads = (kByKeys ? 128 : kConsumerThreads) + 32;
  // dQ through shared memory, per consumer warpgroup w (128 threads + its dQ warp):
  static constexpr uint32_t kBarDqFull0 = 7;  // 7 + w: w's dQ^T partial is in its buffer
  // kBarDqFree0 + w: the bulk reduce has read w's buffer.
  static constexpr uint32_t kBarDqFree0 = kBarDqFull0 + kConsumerWgs;
  static constexpr uint32_t kDqThreads = 128 + 32;
  static_assert(kBarDqFree0 + kConsumerWgs <= 16, "16 named barriers per CTA");
  // sdp_by_role: warpgroup 0 has issued S (warpgroup 1 then issues dP) / has stored P^T.
  static constexpr uint32_t kBarSIssued = kBarDqFree0 + kConsumerWgs;
  static constexpr uint32_t kBarPStored = kBarSIssued + 1;
  // own_keys_first: kBarOwnHand0 + w, warpgroup w's own P^T (then dS^T) rows are stored.
  static constexpr uint32_t kBarOwnHand0 = 13;
  static_assert(!kOwnKeysFirst || (!kByKeys && !kPair && !kSdpByRole && !kSingleHand &&
                                   !kQAtomBars && kConsumerWgs == 2 && kOwn0 == 1 && kOwn1 == 1 &&
                                   kWgKeys == 64 && kBarDqFree0 + kConsumerWgs <= kBarOwnHand0),
                "own_keys_first: by head dim, two warpgroups of one atom-column and 64 keys each "
                "(the halves are m64n64), no pair; its barrier ids clear of the dQ warps'");
  // single_hand: every consumer warpgroup's (5)-(7) of the last step have read P^T and dS^T.
  static constexpr uint32_t kBarHandFree = 15;
  static_assert(!kSingleHand || (!kByKeys && kBarDqFree0 + kConsumerWgs <= kBarHandFree),
                "single_hand: split by head dim; its barrier id clear of the dQ warps'");
  static_assert(!kSdpByRole || (!kByKeys && kConsumerWgs == 2 && !kStatsByConsumers &&
                                kBarPStored < kBarHandFree),
                "sdp_by_role: split by head dim, two warpgroups (one per role), the stat rows from "
                "the stages or global memory; its barrier ids clear of the others");
  // dq_post_queue, default mode with the adds from registers: the consumers have issued their
  // last adds (they arrive), the producer warpgroup's warp 1 counts them (it syncs). The turn
  // barrier's id: the turns are the deterministic mode's alone.
  static constexpr uint32_t kBarPostCount = kBarTurn0;
  static constexpr uint32_t kPostCountThreads = kConsumerThreads + 32;
};

struct BwdSm90Maps {
  const CUtensorMap* q;
  const CUtensorMap* k;
  const CUtensorMap* v;
  const CUtensorMap* dout;
  const CUtensorMap* stats;  // stage rows: the workspace's LSE then D rows, [row][64] fp32
};

// pair_ghost: whether the pair's upper block (2 j + 1) holds no key that the queries of Q block
// m_block see (past the sequence's keys, or causal and after every row's diagonal): a ghost step
// for that CTA, which then only computes its dQ^T half from the lower block's dS^T.
template <class T>
__device__ __forceinline__ bool bwd_sm90_upper_masked(const BwdSm90Params& p, const BwdSm90Work& w,
                                                      int m_block) {
  const int n0u = (w.n_block | 1) * T::kBlockN;
  const int diag = w.seq.seqlen_k - w.seq.seqlen_q;
  return n0u >= w.seq.seqlen_k || (p.causal && n0u > m_block * T::kBlockM + T::kBlockM - 1 + diag);
}

// stats_by_consumers (both consumer kinds): consumer thread ct < 2 block_m brings row
// ct % block_m of the LSE * log2(e) (ct < block_m) or D rows of every step, one step ahead: loaded
// at a step's top (`load`), stored into the buffer of the next step's parity just before the
// step's hand-off barrier (`store`), read after it; step 0's before the loop (`prologue`, with
// one more hand-off-barrier sync). The buffer of step i + 1 was last read in step i - 1, before
// that step's hand-off barrier.
template <class T, bool kDet>
struct BwdSm90StatRows {
  const BwdSm90Params& p;
  const BwdSm90Work& w;
  float* rows;  // [2][2 block_m]
  int ct;       // 0 .. consumer threads - 1
  __device__ __forceinline__ bool loads() const { return ct < 2 * T::kBlockM; }
  __device__ __forceinline__ float load(int step) const {
    int head, m_block;
    bwd_sm90_iter<kDet, T::kDetFromEnd>(p, w, step, head, m_block);
    // A step's kStepTiles workspace tiles are consecutive.
    const int64_t row = dq_tile(p.dq_tiles, w.seq, head, m_block * T::kStepTiles) * kDqTileRows +
                        ct % T::kBlockM;
    return ct < T::kBlockM ? p.lse_log2[row] : p.dsum[row];
  }
  __device__ __forceinline__ void prologue() const {
    if (w.n_iters == 0) return;
    if (loads()) rows[ct] = load(0);
    fh::named_bar_sync(T::kBarHandoff, T::kConsumerThreads);  // buffer 0 complete
  }
  __device__ __forceinline__ float next(int it) const {
    return it + 1 < w.n_iters && loads() ? load(it + 1) : 0.f;
  }
  __device__ __forceinline__ void store(int it, float v) const {
    if (it + 1 < w.n_iters && loads()) rows[((it + 1) & 1) * 2 * T::kBlockM + ct] = v;
  }
  __device__ __forceinline__ const float* lse(int it) const { return rows + (it & 1) * 2 * T::kBlockM; }
  __device__ __forceinline__ const float* dsum(int it) const { return lse(it) + T::kBlockM; }
};

// timeline configs: warpgroup wg's thread 0 stamps event e of step it (BwdTimelineEvent; the
// producer stamps its own events in warpgroup 0's slots). Each call sits under `if constexpr
// (T::kTimeline)`: even an empty inline call moved ptxas's uniform registers in the shipped pair
// kernels.
// The 16 slots of warpgroup wg in step it of this CTA.
__device__ __forceinline__ unsigned long long* timeline_row(const BwdSm90Params& p, int it, int wg) {
  return p.timeline + ((static_cast<int64_t>(blockIdx.x) * p.timeline_steps + it) * 2 + wg) * 16;
}
template <class T>
__device__ __forceinline__ void timeline_stamp(const BwdSm90Params& p, int it, int wg, int t, int e) {
  if (t == 0 && static_cast<int>(blockIdx.x) < p.timeline_ctas && it < p.timeline_steps) {
    timeline_row(p, it, wg)[e] = static_cast<unsigned long long>(clock64());
  }
}

// timeline configs: the CTA's entry (exit = false) or exit stamps of consumer warpgroup wg
// (kTlCtaEntry..kTlCtaSm, step 0's slots).
template <class T>
__device__ __forceinline__ void timeline_cta_stamp(const BwdSm90Params& p, int wg, int t, bool exit) {
  if (t == 0 && static_cast<int>(blockIdx.x) < p.timeline_ctas && p.timeline_steps > 0) {
    unsigned long long* row = timeline_row(p, 0, wg);
    unsigned long long ns;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    row[exit ? kTlCtaExit : kTlCtaEntry] = static_cast<unsigned long long>(clock64());
    row[exit ? kTlCtaExitNs : kTlCtaEntryNs] = ns;
    row[kTlCtaSm] = sm;
  }
}

// ------------------------------------------------------------------------------ producer ---
// One thread: K_j and V_j once, then Q_i and dO_i of every step into their rings (by keys or
// stats_smem with the step's LSE * log2(e) or D rows, kStatBytes, copied on the same full
// barrier).
// Maps (sm90_common.h) give boxes of 64 d x block_m rows (Q, dO) or 64 d x block_n rows (K, V).
template <class T, bool kDet, bool kPart = false>
__device__ __forceinline__ void bwd_sm90_producer(const BwdSm90Params& p, const BwdSm90Maps& m,
                                                  const BwdSm90Work& w, uint8_t* smem,
                                                  uint64_t* kv_bar,
                                                  fh::TmaPipeline<T::kQStages>* pipe_q,
                                                  fh::TmaPipeline<T::kDoStages>* pipe_do) {
  if (w.n_iters == 0) return;  // nobody would wait for the copies
  const int n0 = w.n_block * T::kBlockN;
  // l2_hints: Q / dO rows kept in L2, K / V (read once here) dropped first. Each site makes its
  // policy (one instruction) rather than holding one live in the 24-register producer.
  auto keep = [] { return T::kL2Hints ? fh::l2_policy_evict_last() : uint64_t{0}; };
  auto once = [] { return T::kL2Hints ? fh::l2_policy_evict_first() : uint64_t{0}; };
  // K on its own barrier, first: the first S needs K and Q_0 only; V (for dP) follows Q_0.
  auto load_kv = [&](uint32_t off, const CUtensorMap* map, uint64_t* bar, bool head_inner) {
    fh::mbar_arrive_expect_tx(bar, T::kKvTileBytes);
    tma_tile<T::kAtomCols, T::kL2Hints>(smem + off, T::kKvAtomBytes, map, bar, head_inner,
                                        static_cast<int>(w.seq.row_k) + n0, w.kv_head, w.map_batch, once());
  };
  if constexpr (T::kPair) {
    // K, then on the same barrier the partner's K rows for this CTA's dQ^T atom-columns (rank r
    // of the pair computes atom-columns kPairAtoms r ..). Rows past the sequence's keys meet
    // dS^T rows that are 0 (their P is 0), as in any partial block.
    const int rank = static_cast<int>(blockIdx.x & 1);
    const int peer_row = static_cast<int>(w.seq.row_k) + (w.n_block ^ 1) * T::kBlockN;
    auto load_peer_k = [&] {
#pragma unroll
      for (int a = 0; a < T::kPairAtoms; ++a) {
        tma_rows<T::kL2Hints>(smem + T::kOffKPeer + a * T::kKvAtomBytes, m.k, kv_bar, p.head_inner & 2,
                              64 * (T::kPairAtoms * rank + a), peer_row, w.kv_head, w.map_batch, once());
      }
    };
    if (T::kPairGhost && w.n_block >= w.n_blocks) {
      // A ghost (pair_ghost): the partner's K half is all it reads.
      fh::mbar_arrive_expect_tx(kv_bar, T::kPairAtoms * T::kKvAtomBytes);
      load_peer_k();
      return;
    }
    // pair_ghost: a partner past the keys sends nothing, so its K rows are not read here.
    const bool peer_k = !(T::kPairGhost && rank == 0 && w.n_block + 1 >= w.n_blocks);
    fh::mbar_arrive_expect_tx(kv_bar, T::kKvTileBytes + (peer_k ? T::kPairAtoms * T::kKvAtomBytes : 0));
    tma_tile<T::kAtomCols, T::kL2Hints>(smem + T::kOffK, T::kKvAtomBytes, m.k, kv_bar, p.head_inner & 2,
                                        static_cast<int>(w.seq.row_k) + n0, w.kv_head, w.map_batch, once());
    if (peer_k) load_peer_k();
  } else {
    load_kv(T::kOffK, m.k, kv_bar, p.head_inner & 2);
  }
  // PDL (bwd_sm90_kernel): the stages carry the preprocess's LSE / D rows where kStatBytes > 0.
  // (The parts' launch, kPart, follows a launch whose CTAs all waited for the preprocess.)
  if constexpr (!kPart) fh::grid_dependency_wait();
  fh::PipelineState<T::kQStages> sq;
  fh::PipelineState<T::kDoStages> sd;
  bool v_pending = true;  // pair_ghost: V comes with the first step that is not a ghost's
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block;
    bwd_sm90_iter<kDet, T::kDetFromEnd>(p, w, it, head, m_block);
    if constexpr (T::kPairGhost) {
      if ((blockIdx.x & 1) && bwd_sm90_upper_masked<T>(p, w, m_block)) continue;  // no Q, dO
    }
    const int m0 = m_block * T::kBlockM;
    // Q first: the step's first GEMM (S) needs it, and with two Q stages Q_i's stage was freed a
    // step earlier. With one Q stage (the d = 256 pair) dO first, issued as soon as its stage is
    // free, measured 2.6-5.4% slower (not profiled; docs/perf-log.md, "Measured 2026-12-06,
    // tenth run").
    // Rows m0.. of Q or dO of this q head into the next stage of their ring, with the step's
    // stats-map rows from stat_row0 where kStatBytes > 0 (its kStepTiles workspace tiles,
    // consecutive: LSE's or D's).
    auto load_rows = [&](auto* pipe, auto& st, uint32_t off, const CUtensorMap* map, bool inner,
                         uint32_t stat_off, int stat_row0) {
      pipe->template producer_acquire<T::kWaitStyle>(st);
      pipe->producer_expect(st, T::kQTileBytes + T::kStatBytes);
      if constexpr (T::kStatBytes > 0) {
        const int64_t tile = dq_tile(p.dq_tiles, w.seq, head, m_block * T::kStepTiles);
        fh::tma_load<2>(smem + stat_off + st.stage * T::kStatBytes, m.stats, pipe->full_barrier(st),
                        {0, stat_row0 + static_cast<int>(tile)});
      }
      tma_tile<T::kAtomCols, T::kL2Hints>(smem + off + st.stage * T::kQTileBytes, T::kQAtomBytes, map,
                                          pipe->full_barrier(st), inner, static_cast<int>(w.seq.row_q) + m0,
                                          head, w.map_batch, keep());
      st.advance();
    };
    if constexpr (T::kQAtomBars) {
      // Each atom-column box on its own barrier (q_atom_barriers).
      pipe_q->template producer_acquire<T::kWaitStyle>(sq);
      if constexpr (T::kTimeline) timeline_stamp<T>(p, it, 0, 0, kTlProducerQFree);
      uint64_t* qb = reinterpret_cast<uint64_t*>(smem + T::kOffQAtomBar) + sq.stage * T::kAtomCols;
#pragma unroll
      for (int a = 0; a < T::kAtomCols; ++a) {
        fh::mbar_arrive_expect_tx(qb + a, T::kQAtomBytes);
        tma_rows<T::kL2Hints>(smem + T::kOffQ + sq.stage * T::kQTileBytes + a * T::kQAtomBytes, m.q, qb + a,
                              p.head_inner & 1, 64 * a, static_cast<int>(w.seq.row_q) + m0, head,
                              w.map_batch, keep());
      }
      sq.advance();
    } else {
      load_rows(pipe_q, sq, T::kOffQ, m.q, p.head_inner & 1, T::kOffLse, 0);
    }
    if (T::kPairGhost ? v_pending : it == 0) load_kv(T::kOffV, m.v, kv_bar + 1, p.head_inner & 4);
    v_pending = false;
    load_rows(pipe_do, sd, T::kOffDo, m.dout, p.head_inner & 8, T::kOffDsum, p.dsum_tile0);
    if constexpr (T::kTimeline) timeline_stamp<T>(p, it, 0, 0, kTlProducerDoIssued);
    if constexpr (T::kPrefetchNextRows) {
      // The next step's Q and dO rows into L2 now, a step before their loads (the config's
      // comment). A pair_ghost step's rows too: the lower CTA of the pair loads them.
      if (it + 1 < w.n_iters) {
        int next_head, next_block;
        bwd_sm90_iter<kDet, T::kDetFromEnd>(p, w, it + 1, next_head, next_block);
        const int row = static_cast<int>(w.seq.row_q) + next_block * T::kBlockM;
#pragma unroll
        for (int a = 0; a < T::kAtomCols; ++a) {
          tma_rows_prefetch<T::kL2Hints>(m.q, p.head_inner & 1, 64 * a, row, next_head, w.map_batch, keep());
          tma_rows_prefetch<T::kL2Hints>(m.dout, p.head_inner & 8, 64 * a, row, next_head, w.map_batch, keep());
        }
      }
    }
  }
}

// ------------------------------------------------------------------- consumer helpers ---

// (1) S or (3) dP for this warpgroup's kN keys (kWgKeys = block_n / W; sdp_by_role: all block_n):
// X_i (64 queries, K-major, atom-columns 8 KB apart) times Y rows (that part of a block_n-row
// tile, K-major), K = d. With
// `atom_bars` (q_atom_barriers: X's atom-columns complete one mbarrier each, parity `phase`),
// each atom-column's barrier is waited for just before its k-steps, every wait loop ending in a
// wgmma fence (C7519).
template <class T, int kN = T::kWgKeys>
__device__ __forceinline__ void gemm_q_by_kv(float (&acc)[kN / 2], const uint8_t* x,
                                             const uint8_t* y, uint64_t* atom_bars = nullptr,
                                             uint32_t phase = 0) {
  const uint64_t dx = fh::desc_kmajor_sw128(x);
  const uint64_t dy = fh::desc_kmajor_sw128(y);
  constexpr int kStepsPerAtom = 64 / 16;
#pragma unroll
  for (int s = 0; s < T::kHeadDim / 16; ++s) {
    if (atom_bars != nullptr && s % kStepsPerAtom == 0) {
      fh::mbar_wait<T::kWaitStyle>(atom_bars + s / kStepsPerAtom, phase);
      fh::wgmma_fence();
    }
    if (s == 0) {
      fh::wgmma_ss_set<kN, 0, 0, T::kElem>(acc, dx, dy);
    } else {
      fh::wgmma_ss<kN, 0, 0, T::kElem>(acc, fh::desc_advance(dx, fh::kmajor_k_offset(s, T::kBlockM)),
                                              fh::desc_advance(dy, fh::kmajor_k_offset(s, T::kBlockN)),
                                              true);
    }
  }
}

// (5) dV^T or (6) dK^T atom-column += X^T H: A = the Q-side tile's atom-column (64 head-dim rows,
// read M-major), B = the hand-off tile H^T [key][query] (K-major, K = 64 queries).
// kN < block_n (own_keys_first): the kN keys of the hand-off rows from `hand` on.
template <class T, int kN = T::kBlockN>
__device__ __forceinline__ void gemm_dkv(float (&acc)[kN / 2], const uint8_t* x_atom,
                                         const uint8_t* hand) {
  const uint64_t da = fh::desc_mnmajor_sw128(x_atom, T::kQAtomBytes);
  const uint64_t db = fh::desc_kmajor_sw128(hand);
#pragma unroll
  for (int s = 0; s < T::kBlockM / 16; ++s) {
    fh::wgmma_ss<kN, 1, 0, T::kElem>(acc, fh::desc_advance(da, fh::mnmajor_k_offset(s)),
                                     fh::desc_advance(db, fh::kmajor_k_offset(s, kN)), true);
  }
}

// own_keys_first: half h of a warpgroup's dV^T / dK^T registers (m64 x kWgKeys keys) as an
// accumulator of its own.
template <class T, int kH>
__device__ __forceinline__ float (&key_half(float (&acc)[T::kBlockN / 2]))[T::kWgKeys / 2] {
  return *reinterpret_cast<float(*)[T::kWgKeys / 2]>(&acc[kH * T::kWgKeys / 2]);
}

// own_keys_first: this warpgroup's own P^T / dS^T rows, stored by its 128 threads (generic
// proxy), made readable by its wgmmas (async proxy): each thread's fence, then its barrier.
template <class T>
__device__ __forceinline__ void own_rows_ready(int wg) {
  fh::fence_proxy_async_shared();
  fh::named_bar_sync(T::kBarOwnHand0 + wg, 128);
  fh::wgmma_fence();
}

// own_keys_first: (5) or (6) over one warpgroup's keys (rows key_row.. of the hand-off tile)
// into half kH of acc, as one commit group. The rows were stored by this warpgroup (kH = 0,
// after its own barrier) or by the other (kH = 1, after the hand-off barrier).
template <class T, int kH>
__device__ __forceinline__ void issue_dkv_half(float (&acc)[T::kBlockN / 2], const uint8_t* x_atom,
                                               const uint8_t* hand, int key_row) {
  gemm_dkv<T, T::kWgKeys>(key_half<T, kH>(acc), x_atom, hand + key_row * 128);
  fh::wgmma_commit();
}

// (7) dQ^T atom-column = K^T dS^T: A = K's atom-column (64 head-dim rows, M-major over block_n
// keys), B = dS^T [key][query] read N-major (N = 64 queries), K = block_n keys.
// `accumulate`: add to acc (the pair's second block of keys) instead of overwriting it.
template <class T>
__device__ __forceinline__ void gemm_dq(float (&acc)[T::kBlockM / 2], const uint8_t* k_atom,
                                        const uint8_t* ds, bool accumulate = false) {
  const uint64_t da = fh::desc_mnmajor_sw128(k_atom, T::kKvAtomBytes);
  const uint64_t db = fh::desc_mnmajor_sw128(ds, T::kHandBytes);
#pragma unroll
  for (int s = 0; s < T::kBlockN / 16; ++s) {
    const uint32_t off = fh::mnmajor_k_offset(s);
    fh::wgmma_ss<T::kBlockM, 1, 1, T::kElem>(acc, fh::desc_advance(da, off), fh::desc_advance(db, off),
                                   accumulate || s > 0);
  }
}

// stats_smem: this thread's two rows (q_row, q_row + 8) of the step's LSE * log2(e) or D, from
// the rows a Q or dO stage brought at `off`.
template <class T>
__device__ __forceinline__ void stage_rows(const uint8_t* smem, uint32_t off, int stage, int q_row, float& r0,
                                           float& r1) {
  const float* rows = reinterpret_cast<const float*>(smem + off + stage * T::kStatBytes);
  r0 = rows[q_row];
  r1 = rows[q_row + 8];
}

// (5) dV^T += dO^T P (rows_s = dO_i, hand_t = P^T) or (6) dK^T += Q^T dS (Q_i, dS^T) for the
// kOwn atom-columns from `first`: one commit group.
template <class T, int kOwn>
__device__ __forceinline__ void issue_dkv(float (*acc)[T::kBlockN / 2], const uint8_t* rows_s, int first,
                                          const uint8_t* hand_t) {
#pragma unroll
  for (int u = 0; u < kOwn; ++u) gemm_dkv<T>(acc[u], rows_s + (first + u) * T::kQAtomBytes, hand_t);
  fh::wgmma_commit();
}

// (7) one dQ^T atom-column over this block's keys (overwriting dq), then (5) dV^T += dO^T P for
// the kOwn atom-columns first ..: two commit groups, both in flight on return. kDkBetween
// (dk_before_peer): (6) dK^T += Q^T dS (acc_dk, Q_i at q_s) as a group between the two.
// (7) one dQ^T atom-column over this block's keys (overwriting dq): one commit group.
template <class T>
__device__ __forceinline__ void issue_dq(float (&dq)[T::kBlockM / 2], const uint8_t* k_atom,
                                         const uint8_t* ds_t) {
  fh::zero_acc(dq);
  fh::wgmma_fence_operand(dq);
  fh::wgmma_fence();
  gemm_dq<T>(dq, k_atom, ds_t);
  fh::wgmma_commit();
}

template <class T, int kOwn, int kAcc, bool kDkBetween = false>
__device__ __forceinline__ void issue_dq_dv(float (&dq)[T::kBlockM / 2], const uint8_t* k_atom,
                                            const uint8_t* ds_t, float (&acc_dv)[kAcc][T::kBlockN / 2],
                                            const uint8_t* do_s, int first, const uint8_t* p_t,
                                            float (*acc_dk)[T::kBlockN / 2] = nullptr,
                                            const uint8_t* q_s = nullptr) {
  issue_dq<T>(dq, k_atom, ds_t);
  if constexpr (kDkBetween) issue_dkv<T, kOwn>(acc_dk, q_s, first, ds_t);
  issue_dkv<T, kOwn>(acc_dv, do_s, first, p_t);
}

// The hand-off tile's address for stmatrix / ldmatrix .trans: block (key group j, query half h)
// of warp `warp` (keys key0 + 8j.., queries 16 warp + 8h..), row r of the stored block (key
// key0 + 8j + r) in the tile [key][query] (128 B per key row, 128B-swizzled).
__device__ __forceinline__ uint32_t hand_t_addr(uint32_t base, int key0, int warp, int j, int h, int r) {
  const int key = key0 + 8 * j + r;
  const int chunk = 2 * warp + h;
  return base + key * 128 + ((chunk ^ (key & 7)) << 4);
}

// A 64 x kN accumulator (queries x keys key0 ..) as 16-bit into the hand-off tile [key][query]
// (block_n rows x 128 B, 128B-swizzled as a K-major wgmma operand): stmatrix.trans turns each
// 8 x 8 block (8 queries x 8 keys) into 8 key rows of 16 contiguous bytes. Block (key group j,
// query half h) of warp v holds keys key0 + 8j.., queries 16v + 8h..; matrices are taken in the
// order (j, 0), (j, 1), (j + 1, 0), (j + 1, 1).
template <class T, int kN = T::kWgKeys>
__device__ __forceinline__ void store_hand_t(uint8_t* hand, const float (&acc)[kN / 2], int key0,
                                             int t) {
  const int lane = t % 32;
  const int warp = t / 32;
  const uint32_t base = fh::smem_u32(hand);
  uint32_t pk[kN / 4];
#pragma unroll
  for (int i = 0; i < kN / 4; ++i) pk[i] = fh::pack2<T::kElem>(acc[2 * i], acc[2 * i + 1]);
  // pk[2j] = (j, 0), pk[2j + 1] = (j, 1).
  const int mat = lane / 8;  // x4: matrices 0..3; x2 uses lanes 0..15
  const int r = lane % 8;
#pragma unroll
  for (int j = 0; j + 1 < kN / 8; j += 2) {
    fh::stmatrix_x4_trans(hand_t_addr(base, key0, warp, j + mat / 2, mat & 1, r), pk[2 * j],
                          pk[2 * j + 1], pk[2 * j + 2], pk[2 * j + 3]);
  }
  if constexpr ((kN / 8) % 2 == 1) {
    constexpr int j = kN / 8 - 1;
    fh::stmatrix_x2_trans(hand_t_addr(base, key0, warp, j, mat & 1, r), pk[2 * j], pk[2 * j + 1]);
  }
}

// Two 16-bit elements of one register (low half first) as floats.
template <Dtype E>
__device__ __forceinline__ void unpack2(uint32_t v, float& lo, float& hi) {
  if constexpr (E == Dtype::kF16) {
    const __half2 h = *reinterpret_cast<const __half2*>(&v);
    lo = __low2float(h);
    hi = __high2float(h);
  } else {
    lo = __uint_as_float(v << 16);
    hi = __uint_as_float(v & 0xffff0000u);
  }
}

// sdp_by_role, warpgroup 1: (4) dS = P (dP - D) over all block_n keys, P read back from the P^T
// tile (ldmatrix .trans with store_hand_t's addresses gives the accumulator layout of dp), a
// block pair at a time so that only four more registers are live.
template <class T>
__device__ __forceinline__ void ds_values_from_hand(const uint8_t* p_t, float (&dp)[T::kBlockN / 2],
                                                    float dsum0, float dsum1, int t) {
  const int lane = t % 32;
  const int warp = t / 32;
  const uint32_t base = fh::smem_u32(p_t);
  const int mat = lane / 8;
  const int r = lane % 8;
  auto ds4 = [&](int i, uint32_t v) {  // register i of P's 16-bit fragments: elements 2i, 2i + 1
    float lo, hi;
    unpack2<T::kElem>(v, lo, hi);
    const float d = ((2 * i) & 2) ? dsum1 : dsum0;
    dp[2 * i] = lo * (dp[2 * i] - d);
    dp[2 * i + 1] = hi * (dp[2 * i + 1] - d);
  };
#pragma unroll
  for (int j = 0; j + 1 < T::kBlockN / 8; j += 2) {
    uint32_t v0, v1, v2, v3;
    fh::ldmatrix_x4_trans(hand_t_addr(base, 0, warp, j + mat / 2, mat & 1, r), v0, v1, v2, v3);
    ds4(2 * j, v0);
    ds4(2 * j + 1, v1);
    ds4(2 * j + 2, v2);
    ds4(2 * j + 3, v3);
  }
  if constexpr ((T::kBlockN / 8) % 2 == 1) {
    constexpr int j = T::kBlockN / 8 - 1;
    uint32_t v0, v1;
    fh::ldmatrix_x2_trans(hand_t_addr(base, 0, warp, j, mat & 1, r), v0, v1);
    ds4(2 * j, v0);
    ds4(2 * j + 1, v1);
  }
}

// One dQ^T atom-column of this step into dQaccum; deterministic, inside add phase h's turn
// (the turn warp opens it, kBarTurn0 + h, and waits for every warpgroup's adds, kBarAdded0 + h).
template <class T, bool kDet>
__device__ __forceinline__ void add_dq_in_turn(const BwdSm90Params& p, int64_t tile, int atom,
                                               int t, const float (&dq)[T::kBlockM / 2], int h = 0) {
  if constexpr (kDet) fh::named_bar_sync(T::kBarTurn0 + h, T::kTurnThreads);
  add_dq_partial<T::kHeadDim, T::kL2Hints>(p, tile, atom, t, dq,
                                           T::kL2Hints ? fh::l2_policy_evict_last() : 0);
  if constexpr (kDet) fh::named_bar_arrive(T::kBarAdded0 + h, T::kTurnThreads);
}

// pair_dq: the receive buffer of step it's exchange (the step's parity) ...
__device__ __forceinline__ int recv_buf(int it) { return it & 1; }
// ... and the phase of its full barrier for a CTA that receives every step.
__device__ __forceinline__ uint32_t recv_phase(int it) { return (it >> 1) & 1; }

// pair_ghost: one ghost step of the pair's upper CTA (warpgroup wg): the lower's dS^T in, the
// dQ^T atom-column kPairAtoms + wg over the lower's keys, the buffer handed back, the add. With
// `handoff`, the hand-off barrier marks the step for the warpgroups' own P^T / dS^T buffers
// (their step parity: step it + 1 may rewrite what step it - 1 read).
template <class T, bool kDet>
__device__ __forceinline__ void pair_ghost_step(const BwdSm90Params& p, uint8_t* smem, int it,
                                                int64_t tile, int wg, bool handoff) {
  const int t = threadIdx.x % 128;
  uint64_t* pair_bar = reinterpret_cast<uint64_t*>(smem + T::kOffPairBar);
  // The upper receives every step: buffer and phase follow the step.
  const int b = recv_buf(it);
  if (wg == 0 && t == 0) fh::mbar_arrive_expect_tx(pair_bar + b, T::kHandBytes);
  if (handoff) fh::named_bar_sync(T::kBarHandoff, T::kConsumerThreads);
  float dq[T::kBlockM / 2];
  fh::zero_acc(dq);  // overwritten by the first wgmma; defined for the "+f" operands
  fh::wgmma_fence_operand(dq);
  fh::mbar_wait<T::kWaitStyle>(pair_bar + b, recv_phase(it));
  fh::wgmma_fence();
  gemm_dq<T>(dq, smem + T::kOffKPeer + wg * T::kKvAtomBytes, smem + T::kOffDsPeer + b * T::kHandBytes);
  fh::wgmma_commit();
  fh::wgmma_wait<0>();
  fh::wgmma_fence_operand(dq);
  if (threadIdx.x % 32 == 0) fh::mbar_arrive_cluster(pair_bar + 2 + b, 0);  // the lower
  add_dq_in_turn<T, kDet>(p, tile, T::kPairAtoms + wg, t, dq);
}

// ------------------------------------------------------------- the dQ conversion queue ---
// dq_post_queue (BwdSm90Config): who counts a CTA's dQ adds done, and how many times per CTA:
// its dQ warps (one per consumer warpgroup; each after its last bulk reduce has completed),
// else in the deterministic mode its turn warps (one per add phase; each after its last turn),
// else warp 1 of the producer warpgroup once every consumer thread has issued its last add
// (kBarPostCount). A CTA with no keys of its sequence counts them all at once.

// Whether warp 1 of the producer warpgroup counts (default mode, the adds from registers).
template <class T, bool kDet>
constexpr bool dq_post_by_count_warp() {
  return T::kDqPostQueue && !kDet && !T::kDqViaSmem;
}
template <class T, bool kDet>
constexpr int dq_post_counts_per_cta() {
  if constexpr ((!kDet || T::kDetDqWarp) && T::kDqViaSmem) {
    return T::kConsumerWgs;
  } else if constexpr (kDet) {
    return T::kDqPhases;
  } else {
    return 1;
  }
}
// Counts n for this CTA's (batch, kv head): the adds this thread has ordered before it (its own
// completed bulk reduces, or other threads' adds through a barrier it synced on) are published
// by the release, and the count that completes the pair's total has acquired every earlier
// one's, so its release of the queue slot publishes all the pair's adds to the postprocess.
__device__ __forceinline__ void dq_post_count(const BwdSm90Params& p, const BwdSm90Work& w, int n) {
  const int pair = w.batch * p.nheads_k + w.kv_head;
  if (fh::atom_acq_rel_gpu_add(p.dq_post.done(pair), n) + n == p.dq_post_total) {
    const int slot = atomicAdd(p.dq_post.tail(), 1);
    fh::red_release_gpu_add(p.dq_post.queue(slot), pair + 1);  // -1 -> pair
  }
}
// The consumers' side of the count by warp 1 (default mode, adds from registers): after the
// walk's last add, before the epilogue (which does not wait for the count).
template <class T, bool kDet>
__device__ __forceinline__ void dq_post_arrive() {
  if constexpr (dq_post_by_count_warp<T, kDet>()) {
    fh::named_bar_arrive(T::kBarPostCount, T::kPostCountThreads);
  }
}

// ------------------------------------------------------------ deterministic turn warps ---
// Deterministic mode: warp 1 + h of the producer warpgroup keeps the dQ turns of phase h (by
// head dim the atom-column each consumer warpgroup adds first, h = 0, or second, h = 1, into the
// step's tile; by keys warpgroup h's own tile of the step), so that neither the poll
// nor the release (which waits for the adds to reach L2) stalls the consumers, and each has a
// whole step to do both. Per step: poll the tile's phase-h counter until this K/V block's rank
// (bwd_sm90_dq_rank), let the consumers add (kBarTurn0 + h), wait until all warpgroups have
// issued their adds (kBarAdded0 + h: their bar.arrive orders the adds before this warp's
// bar.sync), then hand the turn on with one red.release. Each barrier has at most one phase
// open: the consumers cannot reach the next step's turn before this warp has passed the last.
// Deterministic mode: the turn counter that orders adds `i` into step m_block's tile of `head`.
// By keys the step has kStepTiles tiles, one counter each (counter 0 of tile i); by head dim one
// tile whose kDqTurnsPerTile counters serve its add phases / warpgroups / pair halves (i).
template <class T>
__device__ __forceinline__ int* dq_turn_counter(const BwdSm90Params& p, const BwdSm90Work& w,
                                                int head, int m_block, int i) {
  return T::kByKeys
             ? p.dq_turn + dq_tile(p.dq_tiles, w.seq, head, m_block * T::kStepTiles + i) * kDqTurnsPerTile
             : p.dq_turn + dq_tile(p.dq_tiles, w.seq, head, m_block) * kDqTurnsPerTile + i;
}

template <class T>
__device__ __forceinline__ void bwd_sm90_turn_warp(const BwdSm90Params& p, const BwdSm90Work& w,
                                                   int h) {
  const bool leader = (threadIdx.x % 32) == 0;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block, pos;
    bwd_sm90_iter<true, T::kDetFromEnd>(p, w, it, head, m_block, pos);
    // By keys phase h is the step's tile h (one counter each), else both phases share a tile
    // (pair_dq: one phase, counter r for the head-dim half of the pair's rank r).
    const int counter = T::kPair ? static_cast<int>(blockIdx.x & 1) : h;  // by keys: h
    int* turn = dq_turn_counter<T>(p, w, head, m_block, counter);
    constexpr int kUnitKeys = (T::kPair ? 2 : 1) * T::kBlockN;
    if (leader) {
      const int rank = bwd_sm90_dq_rank<T::kBlockM, kUnitKeys, T::kDetFromEnd>(p, w, m_block, pos);
      dq_turn_acquire<T::kWaitStyle>(turn, rank);
    }
    __syncwarp();
    fh::named_bar_arrive(T::kBarTurn0 + h, T::kTurnThreads);
    fh::named_bar_sync(T::kBarAdded0 + h, T::kTurnThreads);
    if (leader) dq_turn_release(turn);
  }
  if constexpr (T::kDqPostQueue) {
    if (leader) dq_post_count(p, w, 1);  // after the last kBarAdded sync: every add of phase h
  }
}

// --------------------------------------------------------------------------- dQ warps ---
// Default mode where the config says dq_smem (d = 64, 128, 192): warp 1 + w of the producer warpgroup
// adds consumer warpgroup w's dQ^T partial of every step into dQaccum with one 16 KB bulk
// reduce, so the MMA warpgroups issue 8 shared stores per thread instead of 8 global reductions.
// Per step: wait until the partial is in the buffer (kBarDqFull0 + w), issue the reduce, wait
// until it has read the buffer, hand the buffer back (kBarDqFree0 + w; not after the last step,
// which nobody waits for). Before exit, wait for the adds themselves.
// kDet (T::kDetDqWarp): the warp also keeps the turns of its warpgroup's adds: before the
// reduce it waits until the tile's counter holds its rank, and after the buffer went back it
// waits for the reduce's global writes and hands the turn on (the async-proxy fences order the
// reduce after the acquire and before the release).
template <class T, bool kDet>
__device__ __forceinline__ void bwd_sm90_dq_warp(const BwdSm90Params& p, const BwdSm90Work& w,
                                                 const uint8_t* smem, int wg) {
  const bool leader = (threadIdx.x % 32) == 0;
  const uint8_t* buf = smem + T::kOffDqBuf + wg * T::kDqBufBytes;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block, pos;
    bwd_sm90_iter<kDet, T::kDetFromEnd>(p, w, it, head, m_block, pos);
    const int64_t tile = dq_tile(p.dq_tiles, w.seq, head, m_block * T::kStepTiles);
    int* turn = nullptr;
    if constexpr (kDet) turn = dq_turn_counter<T>(p, w, head, m_block, wg);
    fh::named_bar_sync(T::kBarDqFull0 + wg, T::kDqThreads);
    if (leader) {
      if constexpr (kDet) {
        dq_turn_acquire<T::kWaitStyle>(turn, bwd_sm90_dq_rank<T::kBlockM, T::kBlockN, T::kDetFromEnd>(p, w, m_block, pos));
        fh::fence_proxy_async_global();
      }
      // By keys warpgroup w's partial is all of step tile w; by head dim its atom-column of
      // the step's tile.
      float* dst = T::kByKeys
                       ? p.dq_accum + (tile + wg) * dq_tile_floats(T::kHeadDim)
                       : p.dq_accum + tile * dq_tile_floats(T::kHeadDim) + T::first_atom(wg) * kDqAtomFloats;
      fh::bulk_reduce_add_f32(dst, buf, T::kDqBufBytes);
      fh::bulk_commit_group();
      fh::bulk_wait_group_read<0>();
    }
    __syncwarp();
    if (it + 1 < w.n_iters) fh::named_bar_arrive(T::kBarDqFree0 + wg, T::kDqThreads);
    if constexpr (kDet) {
      if (leader) {
        fh::bulk_wait_group<0>();
        fh::fence_proxy_async_global();
        dq_turn_release(turn);
      }
      __syncwarp();  // converged before the next step's bar.sync
    }
  }
  if (leader) {
    fh::bulk_wait_group<0>();
    if constexpr (T::kDqPostQueue) {
      fh::fence_proxy_async_global();  // the reduces' writes (async proxy) before the release
      dq_post_count(p, w, 1);
    }
  }
}

// split_last_wave (BwdSm90Config), the parts' launch: the parts of one split unit meet here,
// per CTA rank, after their walks and the barrier after them (kBarEpilogue), with every
// consumer thread (ct = 0 .. 255) holding its dV^T / dK^T fragments (kData; a ghost CTA past the
// keys holds none). Part q < k - 1 stores its fragments into slot q (float4 chunk c of thread
// ct at c x 256 + ct: each warp's stores one 512-byte line), fences, and its thread 0 counts on
// split_done once all threads have passed kBarEpilogue. Part k - 1 waits (thread 0) until the
// k - 1 others have counted, replaces its fragments by ((p_0 + p_1) + ...) + p_{k-1} (the same
// order every run, whichever part finishes first), and counts the unit's dQ adds done for the
// queue (dq_post_count, once per CTA rank): the parts' adds were ordered before their counts,
// and this thread acquired those. Returns whether this CTA writes dK / dV (part k - 1). Slots are
// read from L2 (ld.global.cg): other SMs wrote them in this kernel. Progress: the last part
// waits only for lower-numbered clusters of its launch, which the plan's 2 r <= slots lets be
// resident beside it; where fewer SMs are free (other streams, MPS) it relies, as the
// deterministic mode does, on clusters being dispatched in index order.
template <class T, bool kData, int kAcc>
__device__ __forceinline__ bool bwd_sm90_split_combine(const BwdSm90Params& p, const BwdSm90Work& w,
                                                       float (&acc_dv)[kAcc][T::kBlockN / 2],
                                                       float (&acc_dk)[kAcc][T::kBlockN / 2]) {
  constexpr int kThreads = T::kConsumerThreads;
  constexpr int kPerAcc = T::kBlockN / 2;  // floats per fragment array
  constexpr int kChunks = 2 * kAcc * kPerAcc / 4;
  static_assert(!kData || (kPerAcc % 4 == 0 && kChunks * 4 * kThreads == T::kSplitSlotFloats),
                "a slot holds every consumer thread's dV^T and dK^T fragments");
  const int ct = static_cast<int>(threadIdx.x) - 128;
  const int unit_cta = 2 * w.split_unit + static_cast<int>(blockIdx.x & 1);
  const int k = p.split_parts;
  int* done = p.split_done + unit_cta;
  float4* slots = reinterpret_cast<float4*>(p.split_dkv) +
                  static_cast<int64_t>(unit_cta) * (k - 1) * (T::kSplitSlotFloats / 4);
  auto frag = [&](int c, int e) -> float& {  // float e of chunk c: dV^T's arrays, then dK^T's
    const int f = 4 * c + e;
    const int a = f / kPerAcc;
    return a < kAcc ? acc_dv[a][f % kPerAcc] : acc_dk[a - kAcc][f % kPerAcc];
  };
  if (w.part < k - 1) {
    if constexpr (kData) {
      float4* mine = slots + static_cast<int64_t>(w.part) * (T::kSplitSlotFloats / 4);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        __stcg(mine + c * kThreads + ct, make_float4(frag(c, 0), frag(c, 1), frag(c, 2), frag(c, 3)));
      }
    }
    __threadfence();
    fh::named_bar_sync(T::kBarEpilogue, kThreads);
    if (ct == 0) fh::red_release_gpu_add(done, 1);
    return false;
  }
  if (ct == 0) {
#if defined(FLASHBACK_MBAR_TIMEOUT_CYCLES)
    using hopper::mbar_timeout_trap;  // named by the macro
#endif
    FLASHBACK_MBAR_SPIN_STYLED(T::kWaitStyle, fh::ld_acquire_gpu(done) == k - 1);
    dq_post_count(p, w, 1);
  }
  __syncwarp();  // the spinning lane's warp converged before the aligned barrier below
  if constexpr (kData) {
    fh::named_bar_sync(T::kBarEpilogue, kThreads);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float4 sum = __ldcg(slots + c * kThreads + ct);
      for (int q = 1; q < k - 1; ++q) {
        const float4 v = __ldcg(slots + static_cast<int64_t>(q) * (T::kSplitSlotFloats / 4) + c * kThreads + ct);
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
      }
      frag(c, 0) = sum.x + frag(c, 0);
      frag(c, 1) = sum.y + frag(c, 1);
      frag(c, 2) = sum.z + frag(c, 2);
      frag(c, 3) = sum.w + frag(c, 3);
    }
  }
  return true;
}

// The staged rows of dV or dK (`out`, `st`) of the CTA's keys (rows past seqlen_k skipped) to
// global memory, by all consumer threads (0 .. kConsumerThreads - 1 over the consumer
// warpgroups).
template <class T>
__device__ __forceinline__ void copy_out_staged(const BwdSm90Work& w, void* out, const flashback_strides& st,
                                                const uint8_t* stage, int n0, int seqlen_k) {
  copy_dkv_out<T::kBlockN, T::kHeadDim, T::kConsumerThreads>(out, st, stage, T::kStageRowBytes,
                                                              w.seq.k_offset(st), w.kv_head, n0, seqlen_k,
                                                              threadIdx.x - 128);
}

// Both, after the barrier that completes the staging (both splits' epilogue).
template <class T>
__device__ __forceinline__ void copy_out_dkv(const BwdSm90Params& p, const BwdSm90Work& w,
                                             const uint8_t* stage_dv, const uint8_t* stage_dk,
                                             int n0, int seqlen_k) {
  fh::named_bar_sync(T::kBarEpilogue, T::kConsumerThreads);
  copy_out_staged<T>(w, p.dv, p.dv_strides, stage_dv, n0, seqlen_k);
  copy_out_staged<T>(w, p.dk, p.dk_strides, stage_dk, n0, seqlen_k);
}

// P of one element: exp2(s * scale_log2 - lse), 0 where masked. Shared by the split by head dim
// (p_values) and by keys (p_t_exps). The form exp2(masked ? -inf : ...) (same bits; no predicated
// constant loads in SASS) measured -1.1..+1.4% (docs/perf-log.md, "Measured 2026-12-06, third run").
__device__ __forceinline__ float p_element(bool masked, float s, float scale_log2, float lse) {
  return masked ? 0.f : fh::exp2_approx(s * scale_log2 - lse);
}

// Registers as bwd_sm90_consumer's: element r of s / dp is key key0 + 8 (r >> 2) + (r & 1) and
// query q0 + 8 ((r >> 1) & 1), whose LSE / D are lse1 / dsum1 when r & 2.
// (2) P: keys past seqlen_k and (causal) after the query's diagonal give 0 (kMasked); query rows
// past seqlen_q have LSE = +inf.
template <class T, bool kMasked, int kN>
__device__ __forceinline__ void p_values(const BwdSm90Params& p, float (&s)[kN], float lse0, float lse1, int key0,
                                         int q0, int seqlen_k, int diag) {
  // The mask as one compare per element (FA3's formulation too): element r is masked when its
  // key offset 8 (r >> 2) + (r & 1), an immediate, reaches its row's limit, min(seqlen_k,
  // query + diag + 1) - key0 (causal), seqlen_k - key0 (not), computed once per row and step.
  // Measured against two compares on key and query: +1.4..+2.2% at d = 192 up to 4k, +0.4..+0.7%
  // at d = 128, neutral at d = 64 / 256 (docs/perf-log.md, "The runbook measured").
  int lim[2] = {0, 0};
  if constexpr (kMasked) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lim[h] = (p.causal ? min(seqlen_k, q0 + 8 * h + diag + 1) : seqlen_k) - key0;
    }
  }
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    const float l = (r & 2) ? lse1 : lse0;
    const bool masked = kMasked && 8 * (r >> 2) + (r & 1) >= lim[(r >> 1) & 1];
    s[r] = p_element(masked, s[r], p.scale_log2, l);
  }
}
// (2) for a step's block: the mask test only where the block reaches past seqlen_k or crosses
// the diagonal (n0: the block's first key, m0: the step's first query, key0: this thread's first
// key column in s).
template <class T, int kN>
__device__ __forceinline__ void p_values_of_block(const BwdSm90Params& p, float (&s)[kN], float lse0, float lse1,
                                                  int key0, int n0, int m0, int q_row, int seqlen_k, int diag) {
  const bool need_mask = n0 + T::kBlockN > seqlen_k || (p.causal && n0 + T::kBlockN - 1 > m0 + diag);
  if (need_mask) {
    p_values<T, true>(p, s, lse0, lse1, key0, m0 + q_row, seqlen_k, diag);
  } else {
    p_values<T, false>(p, s, lse0, lse1, key0, m0 + q_row, seqlen_k, diag);
  }
}
// (4) dS = P * (dP - D), into dp.
template <int kN>
__device__ __forceinline__ void ds_values(const float (&s)[kN], float (&dp)[kN], float dsum0, float dsum1) {
#pragma unroll
  for (int r = 0; r < kN; ++r) dp[r] = s[r] * (dp[r] - ((r & 2) ? dsum1 : dsum0));
}
// ---------------------------------------------------------------- consumer warpgroups ---
// wg: which consumer warpgroup (0 .. W - 1), a run-time value; kOwn: the head-dim atom-columns of
// (5)-(7) this instance holds accumulators for, a compile-time value (the arrays' size). Where
// all warpgroups own kOwn, or (W = 2) warpgroup 1 owns none (d = 64 split by head dim, which
// no table row uses since d = 64 went by keys), all run one instance
// (BwdSm90Traits::kSharedConsumer): one copy of the step loop, measured no faster than two but
// smaller and without the d = 128 deterministic instance's spills (docs/design.md section 7.2).
// Otherwise (a split such as 2 / 1, which only the candidate kBwdSm90Hdim192Wg2 has; production
// d = 192 runs three warpgroups of one atom-column each) each warpgroup has its own.
template <class T, bool kDet, int kOwn, bool kPart = false>
__device__ __forceinline__ void bwd_sm90_consumer(const BwdSm90Params& p, const BwdSm90Work& w,
                                                  uint8_t* smem, uint64_t* kv_bar,
                                                  fh::TmaPipeline<T::kQStages>* pipe_q,
                                                  fh::TmaPipeline<T::kDoStages>* pipe_do,
                                                  const int wg) {
  static_assert(kOwn == T::kOwn0 || kOwn == T::kOwn1, "an instance holds one warpgroup's share");
  static_assert(kOwn <= 2, "at most two dQ^T atom-columns per warpgroup (the loop below)");
  // Deterministic, the ordered adds stay in registers unless the dQ warps keep the turns.
  constexpr bool kDqSmem = T::kDqViaSmem && (!kDet || T::kDetDqWarp);
  constexpr bool kPairOn = T::kPair;  // pair_dq
  constexpr int kAcc = kOwn > 0 ? kOwn : 1;  // arrays need a size; unused when kOwn = 0
  // Whether this warpgroup computes (5)-(7): false only for warpgroup 1 at d = 64.
  const bool has_cols = kOwn > 0 && T::own(wg) > 0;
  const int first = T::first_atom(wg);
  const int t = threadIdx.x % 128;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  const int n0 = w.n_block * T::kBlockN;
  const int seqlen_k = w.seq.seqlen_k;
  const int diag = seqlen_k - w.seq.seqlen_q;  // causal: query i sees keys <= i + diag
  // This thread's two query rows in S / dP (accumulator rows) and first key column.
  const int q_row = fh::acc_row(0, t);
  const int key0 = n0 + T::kWgKeys * wg + fh::acc_col(0, t);
  // pair_dq: rank r of the pair, its partner, the dQ^T atom-column this warpgroup computes over
  // both blocks' keys, and the exchange barriers (full[2], free[2]: kOffPairBar).
  const uint32_t pair_rank = blockIdx.x & 1;
  const int dq_atom = T::kPairAtoms * static_cast<int>(pair_rank) + wg;
  uint64_t* pair_bar = reinterpret_cast<uint64_t*>(smem + T::kOffPairBar);
  // pair_ghost: in the upper block's ghost steps (bwd_sm90_upper_masked) the upper CTA sends no
  // dS^T, so the lower counts what it received per buffer for its full barriers' phases; the
  // upper still reads the lower's every step, which keeps it in lockstep without free waits.
  int received0 = 0, received1 = 0;
  bool v_pending = true;
  const uint8_t* k_half = smem + T::kOffK + T::kWgKeys * wg * 128;
  const uint8_t* v_half = smem + T::kOffV + T::kWgKeys * wg * 128;

  float acc_dv[kAcc][T::kBlockN / 2];  // dV^T of atom-columns first ..
  float acc_dk[kAcc][T::kBlockN / 2];  // dK^T, same atom-columns
#pragma unroll
  for (int u = 0; u < kAcc; ++u) {
    fh::zero_acc(acc_dv[u]);
    fh::zero_acc(acc_dk[u]);
  }
  if (w.n_iters > 0) fh::mbar_wait<T::kWaitStyle>(kv_bar, 0);  // K

  const BwdSm90StatRows<T, kDet> stat_rows{p, w, reinterpret_cast<float*>(smem + T::kOffRows), wg * 128 + t};
  if constexpr (T::kStatsByConsumers) stat_rows.prologue();

  fh::PipelineState<T::kQStages> sq;
  fh::PipelineState<T::kDoStages> sd;
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block;
    bwd_sm90_iter<kDet, T::kDetFromEnd>(p, w, it, head, m_block);
    const int m0 = m_block * T::kBlockM;
    const int64_t tile = dq_tile(p.dq_tiles, w.seq, head, m_block);  // dQaccum, stats, turns
    if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlStepTop);
    // stats_by_consumers: the next step's row, stored before this step's hand-off barrier.
    float next_row = 0.f;
    if constexpr (T::kStatsByConsumers) next_row = stat_rows.next(it);
    const bool ghost_step = T::kPairGhost && bwd_sm90_upper_masked<T>(p, w, m_block);
    const bool partner_ghost = ghost_step && pair_rank == 0;  // nothing comes from the upper
    if constexpr (T::kPairGhost) {
      if (ghost_step && pair_rank == 1) {
        // A ghost step; the hand-off barrier still marks it for the buffers' step parity.
        pair_ghost_step<T, kDet>(p, smem, it, tile, wg, true);
        continue;  // no Q / dO stage was loaded for it
      }
    }
    float lse0 = 0.f, lse1 = 0.f, dsum0 = 0.f, dsum1 = 0.f;
    if constexpr (T::kStatsByConsumers) {
      // Written before the hand-off barrier of step it - 1 (or the one before the loop).
      lse0 = stat_rows.lse(it)[q_row];
      lse1 = stat_rows.lse(it)[q_row + 8];
      dsum0 = stat_rows.dsum(it)[q_row];
      dsum1 = stat_rows.dsum(it)[q_row + 8];
    } else if constexpr (!T::kStatsSmem) {
      const int64_t stat_row = tile * T::kBlockM + q_row;
      if (!T::kSdpByRole || wg == 0) {  // by role: warpgroup 0 needs LSE, warpgroup 1 D
        lse0 = p.lse_log2[stat_row];
        lse1 = p.lse_log2[stat_row + 8];
      }
      if (!T::kSdpByRole || wg == 1) {
        dsum0 = p.dsum[stat_row];
        dsum1 = p.dsum[stat_row + 8];
      }
    }
    uint8_t* p_t = smem + T::kOffP + (T::kSingleHand ? 0 : (it & 1)) * T::kHandBytes;
    uint8_t* ds_t = smem + T::kOffDs + (T::kSingleHand ? 0 : (it & 1)) * T::kHandBytes;
    const int pb = recv_buf(it);
    if constexpr (kPairOn) {
      // This step's partner dS^T lands in buffer pb: arm its full barrier (the buffer's previous
      // phase has completed: every thread waited for it).
      if (wg == 0 && t == 0 && !partner_ghost) fh::mbar_arrive_expect_tx(pair_bar + pb, T::kHandBytes);
    }
    const uint8_t* q_s = smem + T::kOffQ + sq.stage * T::kQTileBytes;
    const uint8_t* do_s = smem + T::kOffDo + sd.stage * T::kQTileBytes;

    if constexpr (!T::kSdpByRole) {
      // (1) S = Q_i K_w^T  then  (3) dP = dO_i V_w^T, two commit groups.
      float s[T::kWgKeys / 2], dp[T::kWgKeys / 2];
      // Both start with a write-only wgmma (wgmma_ss_set): no zeroing pass, no old value kept.
      if constexpr (T::kQAtomBars) {
        gemm_q_by_kv<T>(s, q_s, k_half,
                        reinterpret_cast<uint64_t*>(smem + T::kOffQAtomBar) + sq.stage * T::kAtomCols,
                        sq.phase);
      } else {
        pipe_q->template consumer_wait<T::kWaitStyle>(sq);
        fh::wgmma_fence();
        gemm_q_by_kv<T>(s, q_s, k_half);
      }
      fh::wgmma_commit();
      if constexpr (T::kStatsSmem) {
        stage_rows<T>(smem, T::kOffLse, sq.stage, q_row, lse0, lse1);
      }
      if (T::kPairGhost ? v_pending : it == 0) fh::mbar_wait<T::kWaitStyle>(kv_bar + 1, 0);  // V
      v_pending = false;
      pipe_do->template consumer_wait<T::kWaitStyle>(sd);
      fh::wgmma_fence();  // a wgmma after the wait loop's branch needs its own fence (C7519)
      gemm_q_by_kv<T>(dp, do_s, v_half);
      fh::wgmma_commit();
      if constexpr (T::kStatsSmem) {
        stage_rows<T>(smem, T::kOffDsum, sd.stage, q_row, dsum0, dsum1);
        // A warp's leader releases the stages for its lanes (an mbarrier arrive releases only its
        // own thread's accesses), and the next bulk copy into them overwrites these rows.
        __syncwarp();
      }

      // (2) P = exp2(S * scale * log2e - LSE * log2e) while dP is on the tensor cores. Keys past
      // seqlen_k and (causal) after the query's diagonal give 0; query rows past seqlen_q have
      // LSE = +inf. Only blocks that reach past seqlen_k or cross the diagonal test each element.
      fh::wgmma_wait<1>();
      fh::wgmma_fence_operand(s);
      p_values_of_block<T>(p, s, lse0, lse1, key0, n0, m0, q_row, seqlen_k, diag);
      // single_hand: the last step's (5)-(7) wgmmas of every warpgroup were waited for before it
      // gets here (wait<0> at the step's end), so the one buffer may be rewritten.
      if constexpr (T::kSingleHand) {
        if (it > 0) fh::named_bar_sync(T::kBarHandFree, T::kConsumerThreads);
      }
      store_hand_t<T>(p_t, s, T::kWgKeys * wg, t);
      if constexpr (T::kOwnDvUnderDs) {
        // (5) over this warpgroup's keys while (4) runs.
        own_rows_ready<T>(wg);
        issue_dkv_half<T, 0>(acc_dv[0], do_s + first * T::kQAtomBytes, p_t, T::kWgKeys * wg);
      }

      // (4) dS = P * (dP - D)
      fh::wgmma_wait<T::kOwnDvUnderDs ? 1 : 0>();  // dP (own_keys_first 1: dV^T's half may run on)
      fh::wgmma_fence_operand(dp);
      ds_values(s, dp, dsum0, dsum1);
      if constexpr (kPairOn) {
        // Two buffers: ds_t was sent to the partner at step it - 2; rewrite it once the partner
        // has read what it received then (its free arrivals), which also means the copy has read
        // ds_t. The free barrier only hands buffers back (no data published through it: the bytes travel
        // by complete_tx on full), so CTA-scope arrive and wait are the multicast stage-release
        // pattern of mbar_arrive_cluster; if the GPU disagrees, the wait becomes mbar_wait_cluster.
        // pair_ghost, upper CTA: no wait. The lower sends every step, and its send of step it - 1
        // follows its hand-off barrier of it - 1, by which both its warpgroups retired their reads
        // of what this CTA sent before; this CTA waited for that send (full) before getting here.
        if (it >= 2 && !(T::kPairGhost && pair_rank == 1)) {
          fh::mbar_wait<T::kWaitStyle>(pair_bar + 2 + (it & 1), ((it >> 1) - 1) & 1);
        }
      }
      store_hand_t<T>(ds_t, dp, T::kWgKeys * wg, t);
      if constexpr (T::kOwnKeysFirst) {
        // (6) (and with own_keys_first 2 (5) first) over this warpgroup's keys, in flight
        // through the hand-off barrier's wait.
        own_rows_ready<T>(wg);
        if constexpr (!T::kOwnDvUnderDs) {
          issue_dkv_half<T, 0>(acc_dv[0], do_s + first * T::kQAtomBytes, p_t, T::kWgKeys * wg);
        }
        issue_dkv_half<T, 0>(acc_dk[0], q_s + first * T::kQAtomBytes, ds_t, T::kWgKeys * wg);
      }
    } else {
      // (1)-(4) split by role (sdp_by_role): warpgroup 0 S and P, warpgroup 1 dP and dS, each
      // over all block_n keys; P crosses through the P^T tile, which (5) reads anyway.
      if (wg == 0) {
        float acc[T::kBlockN / 2];
        if constexpr (T::kQAtomBars) {
          if constexpr (T::kTimeline) {
            // Q_i's first atom-column in (the GEMM's own wait for it then passes at once).
            fh::mbar_wait<T::kWaitStyle>(reinterpret_cast<uint64_t*>(smem + T::kOffQAtomBar) + sq.stage * T::kAtomCols,
                          sq.phase);
            timeline_stamp<T>(p, it, wg, t, kTlInput);
          }
          gemm_q_by_kv<T, T::kBlockN>(acc, q_s, smem + T::kOffK,
                                      reinterpret_cast<uint64_t*>(smem + T::kOffQAtomBar) +
                                          sq.stage * T::kAtomCols,
                                      sq.phase);
        } else {
          pipe_q->template consumer_wait<T::kWaitStyle>(sq);
          if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlInput);
          fh::wgmma_fence();
          gemm_q_by_kv<T, T::kBlockN>(acc, q_s, smem + T::kOffK);
        }
        fh::wgmma_commit();
        // S goes to the tensor cores before dP, so that it finishes first and the exponentials
        // below overlap dP.
        fh::named_bar_arrive(T::kBarSIssued, T::kConsumerThreads);
        if constexpr (T::kStatsSmem) {
          stage_rows<T>(smem, T::kOffLse, sq.stage, q_row, lse0, lse1);
          __syncwarp();  // every lane's reads before its leader may release the stage
        }
        fh::wgmma_wait<0>();
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlGemm1);
        fh::wgmma_fence_operand(acc);
        p_values_of_block<T>(p, acc, lse0, lse1, n0 + fh::acc_col(0, t), n0, m0, q_row, seqlen_k, diag);
        if constexpr (T::kSingleHand) {
          if (it > 0) fh::named_bar_sync(T::kBarHandFree, T::kConsumerThreads);
        }
        store_hand_t<T, T::kBlockN>(p_t, acc, 0, t);
        // Warpgroup 1 reads P^T back with ldmatrix (generic proxy, like the stmatrix stores):
        // the named barrier orders them.
        fh::named_bar_arrive(T::kBarPStored, T::kConsumerThreads);
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlGemm2);
        pipe_do->template consumer_wait<T::kWaitStyle>(sd);  // dO_i, for (5) dV^T
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlCross);
      } else {
        float acc[T::kBlockN / 2];
        if (T::kPairGhost ? v_pending : it == 0) fh::mbar_wait<T::kWaitStyle>(kv_bar + 1, 0);  // V
        pipe_do->template consumer_wait<T::kWaitStyle>(sd);
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlInput);
        if constexpr (T::kStatsSmem) {
          stage_rows<T>(smem, T::kOffDsum, sd.stage, q_row, dsum0, dsum1);
          __syncwarp();  // every lane's reads before its leader may release the stage
        }
        fh::named_bar_sync(T::kBarSIssued, T::kConsumerThreads);
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlGemm1);
        fh::wgmma_fence();
        gemm_q_by_kv<T, T::kBlockN>(acc, do_s, smem + T::kOffV);
        fh::wgmma_commit();
        // Q_i, for (6) dK^T: this warpgroup has not waited for it.
        if constexpr (T::kQAtomBars) {
          uint64_t* qb = reinterpret_cast<uint64_t*>(smem + T::kOffQAtomBar) + sq.stage * T::kAtomCols;
#pragma unroll
          for (int a = 0; a < T::kAtomCols; ++a) fh::mbar_wait<T::kWaitStyle>(qb + a, sq.phase);
        } else {
          pipe_q->template consumer_wait<T::kWaitStyle>(sq);
        }
        fh::wgmma_wait<0>();
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlGemm2);
        fh::wgmma_fence_operand(acc);
        if constexpr (T::kSingleHand) {
          if (it > 0) fh::named_bar_sync(T::kBarHandFree, T::kConsumerThreads);
        }
        fh::named_bar_sync(T::kBarPStored, T::kConsumerThreads);
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlCross);
        ds_values_from_hand<T>(p_t, acc, dsum0, dsum1, t);
        if constexpr (kPairOn) {
          // As in the split by keys (above): ds_t was sent at step it - 2; the partner has read it.
          // Warpgroup 0's thread 0, which issues the next copy into the partner's buffer, does
          // not wait here: this wait, then the hand-off barrier, orders its copy after it.
          if (it >= 2 && !(T::kPairGhost && pair_rank == 1)) {
            fh::mbar_wait<T::kWaitStyle>(pair_bar + 2 + (it & 1), ((it >> 1) - 1) & 1);
          }
        }
        store_hand_t<T, T::kBlockN>(ds_t, acc, 0, t);
      }
      v_pending = false;
    }
    if constexpr (T::kStatsByConsumers) stat_rows.store(it, next_row);
    // stmatrix (generic proxy) -> wgmma (async proxy) reads (own_keys_first: fenced above).
    if constexpr (!T::kOwnKeysFirst) fh::fence_proxy_async_shared();
    // Every warpgroup's part is in place. The buffers alternate with the step's parity: the
    // other warpgroups passed this barrier only after their last wgmmas of step i-1 had completed,
    // so step i+1 may overwrite what step i-1 read (single_hand: one buffer, and the barrier
    // before the P^T store orders step i+1's writes after step i's reads).
    fh::named_bar_sync(T::kBarHandoff, T::kConsumerThreads);
    if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlHandoff);
    if constexpr (kPairOn) {
      // The whole dS^T (both warpgroups' parts, fenced for the async proxy above) to the
      // partner's buffer pb, completed on its full barrier there.
      if (wg == 0 && t == 0) {
        fh::bulk_copy_to_cta(smem + T::kOffDsPeer + pb * T::kHandBytes, ds_t, T::kHandBytes,
                             pair_bar + pb, pair_rank ^ 1);
      }
    }

    // (7) dQ^T = K^T dS^T, (5) dV^T += dO^T P, (6) dK^T += Q^T dS. One dQ atom-column at a time
    // (32 registers: dV^T/dK^T + 2 x 32 in flight made ptxas serialize and spill at d = 256):
    // the first is added while dV^T / dK^T run, the second after them. Groups retire in order:
    // dV frees dO_i, dK frees Q_i.
    if constexpr (kPairOn) {
      // (7) for atom-column dq_atom over both blocks' keys: K_own^T dS_own^T, then (after dV^T,
      // which needs no partner) K_peer^T dS_peer^T once the partner's dS^T is in; dK^T last
      // (dk_before_peer moves dK^T ahead of dV^T and the partner wait, bwd_sm90.h).
      // dQ^T is complete after the first three groups: released, added while dK^T runs.
      // The step's end once dQ^T is complete: its adds, and Q handed back after dK^T.
      const auto add_dq_release_q = [&](const float(&dq)[T::kBlockM / 2]) {
        add_dq_in_turn<T, kDet>(p, tile, dq_atom, t, dq);
        if constexpr (T::kAddsBeforeWait) fh::keep_waits_below(seqlen_k);  // (wgmma.h)
        fh::wgmma_wait<0>();
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlStepEnd);
        if (warp_leader) pipe_q->consumer_release(sq);
      };
      float dq[T::kBlockM / 2];
      issue_dq_dv<T, kOwn, kAcc, T::kDkBeforePeer>(dq, smem + T::kOffK + dq_atom * T::kKvAtomBytes, ds_t,
                                                     acc_dv, do_s, first, p_t, acc_dk, q_s);
      if constexpr (T::kDkBeforePeer) {
        // dQ^T own, dK^T, dV^T: wait<1> then finds Q_i read (dk_before_peer, bwd_sm90.h).
        fh::wgmma_wait<1>();
        if (warp_leader) pipe_q->consumer_release(sq);
      }
      if (T::kPairGhost && partner_ghost && T::kDkBeforePeer) {
        // Nothing from the partner; Q_i is back, dQ^T complete; dV^T still runs.
        fh::wgmma_fence_operand(dq);
        add_dq_in_turn<T, kDet>(p, tile, dq_atom, t, dq);
        if constexpr (T::kAddsBeforeWait) fh::keep_waits_below(seqlen_k);  // (wgmma.h)
        fh::wgmma_wait<0>();
        if (warp_leader) pipe_do->consumer_release(sd);
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlStepEnd);
      } else if (T::kPairGhost && partner_ghost) {
        // Nothing from the partner: dQ^T own, dV^T, dK^T; dQ^T is complete at wait<1>.
        if constexpr (!T::kDkBeforePeer) {
          fh::wgmma_fence();  // a wgmma after a branch (C7519)
          issue_dkv<T, kOwn>(acc_dk, q_s, first, ds_t);
        }
        fh::wgmma_wait<1>();
        fh::wgmma_fence_operand(dq);
        if (warp_leader) pipe_do->consumer_release(sd);
        add_dq_release_q(dq);
      } else {
        if (T::kPairGhost && pair_rank == 0) {
          // The phase of this buffer's full barrier: the upper's sends into it so far.
          const int n = pb == 1 ? received1++ : received0++;
          fh::mbar_wait<T::kWaitStyle>(pair_bar + pb, n & 1);
        } else {
          fh::mbar_wait<T::kWaitStyle>(pair_bar + pb, recv_phase(it));
        }
        if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlPartner);
        fh::wgmma_fence();  // a wgmma after the wait loop's branch needs its own fence (C7519)
        gemm_dq<T>(dq, smem + T::kOffKPeer + wg * T::kKvAtomBytes,
                   smem + T::kOffDsPeer + pb * T::kHandBytes, true);
        fh::wgmma_commit();
        if constexpr (T::kDkBeforePeer) {
          fh::wgmma_wait<1>();  // all but dQ^T peer: dO_i read
          if (warp_leader) pipe_do->consumer_release(sd);
          fh::wgmma_wait<0>();  // dQ^T peer
          if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlDqDone);
          fh::wgmma_fence_operand(dq);
          // This warp's reads of the partner's buffer are done: one of its 8 free arrivals
          // (pair_ghost: the upper waits for none).
          if (warp_leader && !(T::kPairGhost && pair_rank == 0)) {
            fh::mbar_arrive_cluster(pair_bar + 2 + pb, pair_rank ^ 1);
          }
          add_dq_in_turn<T, kDet>(p, tile, dq_atom, t, dq);
          if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlStepEnd);
        } else {
          issue_dkv<T, kOwn>(acc_dk, q_s, first, ds_t);
          fh::wgmma_wait<1>();
          if constexpr (T::kTimeline) timeline_stamp<T>(p, it, wg, t, kTlDqDone);
          fh::wgmma_fence_operand(dq);
          if (warp_leader) {
            pipe_do->consumer_release(sd);
            // This warp's reads of the partner's buffer are done: one of its 8 free arrivals
            // (pair_ghost: the upper waits for none).
            if (!(T::kPairGhost && pair_rank == 0)) {
              fh::mbar_arrive_cluster(pair_bar + 2 + pb, pair_rank ^ 1);
            }
          }
          add_dq_release_q(dq);
        }
      }
    } else if (has_cols) {
      float dq[T::kBlockM / 2];
      if constexpr (T::kOwnKeysFirst) {
        // (7) over all keys, then (5) and (6) over the other warpgroup's: with the own halves
        // (one group each, issued above) five groups; wait<2> below leaves the last two, so
        // dQ^T is complete there as without own_keys_first.
        const int other_row = T::kWgKeys * (1 - wg);
        issue_dq<T>(dq, smem + T::kOffK + first * T::kKvAtomBytes, ds_t);
        issue_dkv_half<T, 1>(acc_dv[0], do_s + first * T::kQAtomBytes, p_t, other_row);
        issue_dkv_half<T, 1>(acc_dk[0], q_s + first * T::kQAtomBytes, ds_t, other_row);
      } else {
        issue_dq_dv<T, kOwn>(dq, smem + T::kOffK + first * T::kKvAtomBytes, ds_t, acc_dv, do_s, first, p_t);
        issue_dkv<T, kOwn>(acc_dk, q_s, first, ds_t);
      }
      fh::wgmma_wait<2>();
      fh::wgmma_fence_operand(dq);
      if constexpr (!kDqSmem) {
        // Deterministic: wait until the phase-0 turn warp says this block's turn has come.
        add_dq_in_turn<T, kDet>(p, tile, first, t, dq);
      }
      if constexpr (kOwn == 2) {
        fh::wgmma_fence();
        gemm_dq<T>(dq, smem + T::kOffK + (first + 1) * T::kKvAtomBytes, ds_t);
        fh::wgmma_commit();
        fh::wgmma_wait<2>();
        if (warp_leader) pipe_do->consumer_release(sd);
        fh::wgmma_wait<1>();
        if (warp_leader) pipe_q->consumer_release(sq);
        fh::wgmma_wait<0>();
        fh::wgmma_fence_operand(dq);
        add_dq_in_turn<T, kDet>(p, tile, first + 1, t, dq, 1);
      } else {
        fh::wgmma_wait<1>();
        if (warp_leader) pipe_do->consumer_release(sd);
        if constexpr (kDqSmem) {
          // Here, not right after dQ^T's wait: the dQ warp gets dV^T's time more to finish
          // reading the last partial (ncu: the wait for the buffer was 6.5% of the stall
          // samples there), and the stores and the fence overlap dK^T on the tensor cores.
          if (it > 0) fh::named_bar_sync(T::kBarDqFree0 + wg, T::kDqThreads);
          store_dq_partial(smem + T::kOffDqBuf + wg * T::kDqBufBytes, t, dq);
          fh::fence_proxy_async_shared();  // st.shared (generic proxy) -> bulk reduce (async)
          fh::named_bar_arrive(T::kBarDqFull0 + wg, T::kDqThreads);
        }
        fh::wgmma_wait<0>();
        if (warp_leader) pipe_q->consumer_release(sq);
      }
    } else {
      // No atom-column of (5)-(7) here (d = 64 by head dim, warpgroup 1): its reads of Q_i and
      // dO_i ended with (1) and (3) (waited for before (2) and (4)).
      if (warp_leader) {
        pipe_do->consumer_release(sd);
        pipe_q->consumer_release(sq);
      }
    }
    if constexpr (kDet && !T::kDetDqWarp) {
      // Phases this warpgroup has no atom-column for still take part in the turn barriers.
#pragma unroll
      for (int h = !has_cols ? 0 : kPairOn ? 1 : kOwn; h < T::kDqPhases; ++h) {
        fh::named_bar_sync(T::kBarTurn0 + h, T::kTurnThreads);
        fh::named_bar_arrive(T::kBarAdded0 + h, T::kTurnThreads);
      }
    }
    sq.advance();
    sd.advance();
  }
#pragma unroll
  for (int u = 0; u < kAcc; ++u) {
    fh::wgmma_fence_operand(acc_dv[u]);
    fh::wgmma_fence_operand(acc_dk[u]);
  }

  if constexpr (!kPart) dq_post_arrive<T, kDet>();  // the parts count in bwd_sm90_split_combine
  // Epilogue: all warpgroups are done reading K, V, Q (their last wgmmas were waited for) once
  // all pass this barrier; then the staging tiles may overwrite them.
  fh::named_bar_sync(T::kBarEpilogue, T::kConsumerThreads);
  if constexpr (kPart) {
    if (!bwd_sm90_split_combine<T, true>(p, w, acc_dv, acc_dk)) {
      fh::cluster_sync();  // as below: the partner may still copy into this CTA
      return;
    }
  }
  uint8_t* stage_dv = smem;
  uint8_t* stage_dk = smem + T::kStageBytes;
  if (has_cols) {
    // own_keys_first: register key k holds key (k + kWgKeys w) mod block_n.
    const int key_rot = T::kOwnKeysFirst ? T::kWgKeys * wg : 0;
    stage_dkv_t<T::kBlockN, kOwn, T::kElem, T::kOwnKeysFirst>(
        PaddedRows{fh::smem_u32(stage_dv), T::kStageRowBytes}, acc_dv, 1.f, first, t, key_rot);
    stage_dkv_t<T::kBlockN, kOwn, T::kElem, T::kOwnKeysFirst>(
        PaddedRows{fh::smem_u32(stage_dk), T::kStageRowBytes}, acc_dk, p.softmax_scale, first, t, key_rot);
  }
  copy_out_dkv<T>(p, w, stage_dv, stage_dk, n0, seqlen_k);
  // pair_dq: neither CTA exits while its partner may still copy into it or arrive on it.
  if constexpr (kPairOn) fh::cluster_sync();
}

// pair_ghost: the consumer warpgroups of a cluster's upper CTA that holds no keys (odd block
// count). Per step of the partner's walk: receive its dS^T, compute dQ^T of this CTA's
// head-dim half over the partner's keys (warpgroup w: atom-column kPairAtoms + w), hand the
// buffer back, add. No dV / dK (its rows are past the keys), no stores.
template <class T, bool kDet, bool kPart = false>
__device__ __forceinline__ void bwd_sm90_consumer_ghost(const BwdSm90Params& p, const BwdSm90Work& w,
                                                        uint8_t* smem, uint64_t* kv_bar, const int wg) {
  if (w.n_iters > 0) fh::mbar_wait<T::kWaitStyle>(kv_bar, 0);  // the partner's K half
  for (int it = 0; it < w.n_iters; ++it) {
    int head, m_block;
    bwd_sm90_iter<kDet, T::kDetFromEnd>(p, w, it, head, m_block);
    const int64_t tile = dq_tile(p.dq_tiles, w.seq, head, m_block);
    pair_ghost_step<T, kDet>(p, smem, it, tile, wg, false);  // no hand-off buffers in use
  }
  if constexpr (kPart) {
    // The parts meet without data (no dV / dK here); the last counts the ghost's adds.
    float none[1][T::kBlockN / 2];
    fh::named_bar_sync(T::kBarEpilogue, T::kConsumerThreads);
    bwd_sm90_split_combine<T, false>(p, w, none, none);
  } else {
    dq_post_arrive<T, kDet>();
  }
  fh::cluster_sync();  // as bwd_sm90_consumer: no exit while the partner may still copy in
}

}  // namespace sm90
}  // namespace flashback
