"""The 2-CTA pair's Q / dO multicast (BwdSm90Config::pair_multicast, the candidate
kBwdSm90Hdim256Mc: d = 256, four 64-column boxes per tile, q_atom_barriers, pair_ghost) as a model
of its mbarriers, run under many random interleavings: every consumer warp reads the Q and dO
tiles of its own step (the boxes of both CTAs), no box overwrites a stage a warp still reads, no
box lands on a barrier phase other than the one it was issued for, no waiter sees a barrier two
phases ahead (its parity would name the wrong phase), both CTAs finish (a state in which no actor
can move before all are done fails as a deadlock), and no copy is in flight at the exit.

Barriers (bwd_sm90_kernel's init): per Q stage one full barrier per box (q_atom_barriers), per
dO stage one full barrier, each of count 1 plus the bytes of the whole tile; per stage an empty
barrier of count kStageReleases = consumer warps x 2 (TmaPipeline::init): one arrival per
consumer warp of both CTAs. The pair's dS^T exchange (full[2] of count 1 plus bytes, free[2] of
one arrival per partner consumer warp) is modelled too, since it also ties the CTAs' walks
together. Stages go round their rings as PipelineState does: step it uses stage it % stages for
the (it // stages)-th time; a full wait is for that phase, the producer's acquire for the
empty barrier's phase before it (on the first use the "preceding" phase, which counts as done).

The producer (bwd_sm90_producer, one actor per CTA), per step: acquire the Q stage (empty),
arm every box's full barrier for the whole box (arrive_expect_tx; the partner's bytes may land
before it), issuing its own boxes (a % 2 == rank) as one copy per destination CTA (multicast);
V with step 0 (not in a ghost CTA); then acquire the dO stage, arm its full barrier for the
whole tile, issue its own boxes to both CTAs. The copy engine completes each destination's copy
separately, at any later time.

A consumer warp (bwd_sm90_consumer, one actor per warp), per step:
  warp 0 arms the partner's dS^T full barrier  -- not when the partner has a ghost step
  wait each Q box's full barrier, read it (all boxes: both CTAs' halves); V on the first step
  wait the dO stage's full barrier, read it
  the lower, it >= 2: wait free[it & 1] for phase (it >> 1) - 1
  the hand-off barrier (all the CTA's consumer warps); warp 0 writes dS^T and sends it
  the partner's dS^T: wait full[it & 1] (the lower counts the upper's sends per buffer), read
  it; release the dO stage (release_stage: an arrival on this CTA's empty barrier and one on
  the partner's); the upper arrives on the lower's free[it & 1]; release the Q stage
  (when the partner has a ghost step: release dO, then Q, without the exchange)
then the epilogue barrier, the staging over K, V and Q (nothing may still land there), and
cluster_sync with the partner's consumer warps.
The upper CTA's ghost step (bwd_sm90_upper_masked): pass_stages (wait every Q box and the dO
stage, read nothing, release both stages to both CTAs), then pair_ghost_step with the hand-off
barrier (arm full, wait for the lower's dS^T, read it, arrive on the lower's free). A ghost CTA
(bwd_sm90_consumer_ghost, past the keys): per step pass_stages and pair_ghost_step without the
hand-off barrier, then cluster_sync; its producer still issues its half of every tile.

A warp reads a stage from its wait until its release (the wgmma reads retire before it). A warp
moves as one (pass_stages' __syncwarp: no lane still polls when its leader releases). K is left
out (one load, waited for once). The config has one Q and one dO stage and eight consumer warps
per CTA; the model runs two warps per CTA with one or two Q stages, and a few walks with eight
warps or two dO stages.

Planted bugs, each caught by some interleaving: an empty barrier counting only the local warps,
a release that does not arrive on the partner's empty barrier (in release_stage or in
pass_stages), a ghost step that releases the stages before waiting for them."""
import random

import pytest

from mbarrier_model import Barrier

ATOMS = 4  # d = 256: 64-column boxes per Q / dO tile; CTA r issues the boxes a % 2 == r
WAIT = object()  # yielded by an actor that cannot move until another actor or a copy does


class NamedBarrier:
    """bar.sync among `count` warps of one CTA (the hand-off and epilogue barriers)."""

    def __init__(self, count):
        self.count, self.arrived, self.generation = count, 0, 0

    def sync(self):
        g = self.generation
        self.arrived += 1
        if self.arrived == self.count:
            self.arrived, self.generation = 0, g + 1
        yield
        while self.generation == g:
            yield WAIT


class Cta:
    def __init__(self, rank, ghost_cta, nwarps, q_stages, do_stages, releases):
        self.rank, self.ghost_cta = rank, ghost_cta
        c = f"cta{rank}"
        self.full_q = [[Barrier(1, f"{c}.full_q[{s}][{a}]") for a in range(ATOMS)]
                       for s in range(q_stages)]
        self.full_do = [Barrier(1, f"{c}.full_do[{s}]") for s in range(do_stages)]
        self.empty = {"q": [Barrier(releases, f"{c}.empty_q[{s}]") for s in range(q_stages)],
                      "do": [Barrier(releases, f"{c}.empty_do[{s}]") for s in range(do_stages)]}
        self.full_v = Barrier(1, f"{c}.v")
        self.pair_full = [Barrier(1, f"{c}.pair_full[{b}]") for b in range(2)]
        self.pair_free = [Barrier(nwarps, f"{c}.pair_free[{b}]") for b in range(2)]
        self.data = {"q": [[None] * ATOMS for _ in range(q_stages)],
                     "do": [[None] * ATOMS for _ in range(do_stages)]}
        self.v = None
        self.ds = [None, None]    # own dS^T buffers: the step whose tile they hold
        self.peer = [None, None]  # the partner's dS^T as received
        # Per stage (peer: per buffer) the warps reading it now and the step they read.
        self.reading = {"q": [{} for _ in range(q_stages)], "do": [{} for _ in range(do_stages)],
                        "peer": [{}, {}]}
        self.handoff, self.epilogue = NamedBarrier(nwarps), NamedBarrier(nwarps)
        self.staged = False
        self.reads = [[] for _ in range(nwarps)]       # steps whose Q and dO a warp read
        self.peer_reads = [[] for _ in range(nwarps)]  # steps whose partner dS^T a warp read


class Pair:
    """One cluster's walk of len(ghost) steps; ghost[it]: the upper block holds no key the step's
    queries see (every step when ghost_cta: the upper CTA is past the keys).

    Planted bugs: local_empty_count (empty barriers count one CTA's warps), no_remote_release
    ("consumer": release_stage arrives only locally; "pass": pass_stages does),
    ghost_release_first (pass_stages releases the stages before it waits for them)."""

    def __init__(self, ghost, ghost_cta, q_stages, do_stages=1, nwarps=2, local_empty_count=False,
                 no_remote_release=None, ghost_release_first=False):
        assert not ghost_cta or all(ghost)
        self.ghost, self.n = list(ghost), len(ghost)
        self.q_stages, self.do_stages, self.nwarps = q_stages, do_stages, nwarps
        self.no_remote_release, self.ghost_release_first = no_remote_release, ghost_release_first
        releases = nwarps if local_empty_count else 2 * nwarps
        self.cta = [Cta(0, False, nwarps, q_stages, do_stages, releases),
                    Cta(1, ghost_cta, nwarps, q_stages, do_stages, releases)]
        self.copies = []  # in flight: (kind, destination, stage or buffer, box, step, phase)
        self.at_cluster_sync = 0
        # The phase of the lower's full[b] that the upper's send of step it completes: its sends
        # into buffer b before it (none in ghost steps).
        self.upper_sends_before = []
        sent = [0, 0]
        for it, g in enumerate(self.ghost):
            self.upper_sends_before.append(sent[it & 1])
            sent[it & 1] += not g

    # ------------------------------------------------------------------ copy engine ---
    def issue(self, kind, src, stage, box, step):
        """A multicast box: one copy per destination CTA, completing on that CTA's barrier in
        the phase of this step's use of the stage."""
        stages = self.q_stages if kind == "q" else self.do_stages
        for dst in (0, 1):
            self.copies.append((kind, dst, stage, box, step, step // stages))

    def land(self, k):
        kind, dst, s, a, step, phase = self.copies.pop(k)
        d = self.cta[dst]
        if kind in ("q", "do"):
            bar = d.full_q[s][a] if kind == "q" else d.full_do[s]
            assert bar.phase == phase, (f"{kind} box {a} of step {step} lands in {bar.name} "
                                        f"phase {bar.phase}, issued for phase {phase}")
            readers = d.reading[kind][s]
            assert all(r == step for r in readers.values()), \
                f"{kind} box {a} of step {step} overwrites cta{dst}'s stage {s} while read: {readers}"
            assert not (kind == "q" and d.staged), f"Q box {a} of step {step} lands in cta{dst}'s staging"
            d.data[kind][s][a] = step
            bar.complete_tx(1)
        elif kind == "v":
            assert not d.staged, f"V lands in cta{dst}'s staging"
            assert d.full_v.phase == 0
            d.v = step
            d.full_v.complete_tx(1)
        else:  # the partner's dS^T into buffer s
            bar = d.pair_full[s]
            assert bar.phase == phase, \
                f"dS^T of step {step} lands in {bar.name} phase {bar.phase}, issued for phase {phase}"
            assert not d.reading["peer"][s], f"dS^T of step {step} overwrites cta{dst}'s peer[{s}] while read"
            d.peer[s] = self.cta[dst ^ 1].ds[s]  # the engine reads the source now
            bar.complete_tx(1)

    # --------------------------------------------------------------------- producer ---
    def producer(self, c):
        """bwd_sm90_producer with pair_multicast (K is left out: one load, waited for once)."""
        me = self.cta[c]
        if self.n == 0:
            return  # nobody would wait for the copies
        v_pending = True
        for it in range(self.n):
            s, use = it % self.q_stages, it // self.q_stages
            while not me.empty["q"][s].passed(use - 1):  # producer_acquire
                yield WAIT
            for a in range(ATOMS):
                me.full_q[s][a].arrive(expect_tx=1)  # the whole box, the partner's too
                if a % 2 == c:
                    self.issue("q", c, s, a, it)
                yield
            if not me.ghost_cta and v_pending:  # V with step 0, ghost step or not
                me.full_v.arrive(expect_tx=1)
                self.copies.append(("v", c, 0, 0, it, 0))
            v_pending = False
            s, use = it % self.do_stages, it // self.do_stages
            while not me.empty["do"][s].passed(use - 1):
                yield WAIT
            me.full_do[s].arrive(expect_tx=ATOMS)  # producer_expect: the whole tile
            for a in range(c, ATOMS, 2):
                self.issue("do", c, s, a, it)
                yield

    # ------------------------------------------------------------------- consumers ---
    def release(self, kind, c, w, s, step, site):
        """release_stage (or pass_stages' release when step is None): this CTA's empty barrier
        and the partner's. A reading warp's tile must not have changed while it read."""
        me = self.cta[c]
        if step is not None:
            assert me.data[kind][s] == [step] * ATOMS, \
                f"cta{c} warp {w} step {step}: {kind} changed while read: {me.data[kind][s]}"
            del me.reading[kind][s][w]
        me.empty[kind][s].arrive()
        if self.no_remote_release != site:
            self.cta[c ^ 1].empty[kind][s].arrive()

    def pass_stages(self, c, w, it):
        """A ghost step's stages: wait until every box has landed, read nothing, release."""
        me = self.cta[c]
        sq, uq = it % self.q_stages, it // self.q_stages
        sd, ud = it % self.do_stages, it // self.do_stages
        if self.ghost_release_first:
            self.release("q", c, w, sq, None, "pass")
            self.release("do", c, w, sd, None, "pass")
            yield
        for a in range(ATOMS):
            while not me.full_q[sq][a].passed(uq):
                yield WAIT
        while not me.full_do[sd].passed(ud):
            yield WAIT
        yield
        if not self.ghost_release_first:
            self.release("q", c, w, sq, None, "pass")
            self.release("do", c, w, sd, None, "pass")
            yield

    def pair_ghost_step(self, c, w, it, handoff):
        """pair_ghost_step: the lower's dS^T in, read, the lower's free barrier arrived on."""
        me, b = self.cta[c], it & 1
        if w == 0:
            me.pair_full[b].arrive(expect_tx=1)
            yield
        if handoff:
            yield from me.handoff.sync()
        while not me.pair_full[b].passed(it >> 1):
            yield WAIT
        assert me.peer[b] == it, f"cta{c} warp {w} ghost step {it}: read the lower's step {me.peer[b]}"
        me.reading["peer"][b][w] = it
        me.peer_reads[w].append(it)
        yield  # the read lasts until the wgmma that reads the tile retires
        assert me.peer[b] == it, f"cta{c} warp {w} ghost step {it}: the lower's dS^T changed while read"
        del me.reading["peer"][b][w]
        self.cta[c ^ 1].pair_free[b].arrive()
        yield

    def cluster_sync(self):
        self.at_cluster_sync += 1
        if self.at_cluster_sync == 2 * self.nwarps:
            assert not self.copies, f"both CTAs may exit with copies in flight: {self.copies}"
        yield
        while self.at_cluster_sync < 2 * self.nwarps:
            yield WAIT

    def warp(self, c, w):
        me, other = self.cta[c], self.cta[c ^ 1]
        if me.ghost_cta:  # bwd_sm90_consumer_ghost
            for it in range(self.n):
                yield from self.pass_stages(c, w, it)
                yield from self.pair_ghost_step(c, w, it, handoff=False)
            yield from self.cluster_sync()
            return
        v_pending = True
        received = [0, 0]  # the lower: the upper's sends per buffer so far
        for it in range(self.n):
            b = it & 1
            sq, uq = it % self.q_stages, it // self.q_stages
            sd, ud = it % self.do_stages, it // self.do_stages
            if c == 1 and self.ghost[it]:
                yield from self.pass_stages(c, w, it)
                yield from self.pair_ghost_step(c, w, it, handoff=True)
                continue
            partner_ghost = self.ghost[it]  # the lower, the upper's ghost step: nothing comes
            if w == 0 and not partner_ghost:
                me.pair_full[b].arrive(expect_tx=1)
                yield
            for a in range(ATOMS):  # gemm_q_by_kv: each box's wait before its k-steps
                while not me.full_q[sq][a].passed(uq):
                    yield WAIT
                got = me.data["q"][sq][a]
                assert got == it, f"cta{c} warp {w} step {it}: Q box {a} holds step {got}"
                me.reading["q"][sq][w] = it
                yield
            if v_pending:
                while not me.full_v.passed(0):
                    yield WAIT
                assert me.v is not None
                v_pending = False
            while not me.full_do[sd].passed(ud):
                yield WAIT
            got = me.data["do"][sd]
            assert got == [it] * ATOMS, f"cta{c} warp {w} step {it}: dO boxes hold steps {got}"
            me.reading["do"][sd][w] = it
            me.reads[w].append(it)
            yield
            if c == 0 and it >= 2:
                while not me.pair_free[b].passed((it >> 1) - 1):
                    yield WAIT
            yield from me.handoff.sync()
            if w == 0:
                me.ds[b] = it
                phase = (it >> 1) if c == 0 else self.upper_sends_before[it]
                self.copies.append(("ds", c ^ 1, b, 0, it, phase))
                yield
            if partner_ghost:
                self.release("do", c, w, sd, it, "consumer")
                yield
                self.release("q", c, w, sq, it, "consumer")
                yield
                continue
            if c == 0:
                n, received[b] = received[b], received[b] + 1
            else:
                n = it >> 1
            while not me.pair_full[b].passed(n):
                yield WAIT
            assert me.peer[b] == it, f"cta{c} warp {w} step {it}: read the partner's step {me.peer[b]}"
            me.reading["peer"][b][w] = it
            me.peer_reads[w].append(it)
            yield
            assert me.peer[b] == it, f"cta{c} warp {w} step {it}: the partner's dS^T changed while read"
            del me.reading["peer"][b][w]
            self.release("do", c, w, sd, it, "consumer")
            if c == 1:
                other.pair_free[b].arrive()
            yield
            self.release("q", c, w, sq, it, "consumer")
            yield
        # The epilogue: every warp is done with K, V and Q; the staging overwrites them.
        yield from me.epilogue.sync()
        me.staged = True
        in_flight = [k for k in self.copies if k[1] == c and k[0] in ("q", "v")]
        assert not in_flight, f"cta{c} stages dV / dK while {in_flight} are in flight"
        yield from self.cluster_sync()

    # ------------------------------------------------------------------- the run ---
    def run(self, seed):
        rng = random.Random(seed)
        names = [f"producer{c}" for c in range(2)] + \
                [f"cta{c} warp {w}" for c in range(2) for w in range(self.nwarps)]
        actors = [self.producer(c) for c in range(2)] + \
                 [self.warp(c, w) for c in range(2) for w in range(self.nwarps)]
        live = list(range(len(actors)))
        blocked = set()  # waiting, and nothing changed since they last looked
        while live or self.copies:
            movable = [i for i in live if i not in blocked]
            if not movable and not self.copies:
                raise AssertionError("deadlock: " + ", ".join(names[i] for i in live) + " all wait")
            k = rng.randrange(len(movable) + (1 if self.copies else 0))
            if k == len(movable):
                self.land(rng.randrange(len(self.copies)))
                blocked.clear()
                continue
            i = movable[k]
            try:
                moved = next(actors[i]) is not WAIT
            except StopIteration:
                live.remove(i)
                continue
            if moved:
                blocked.clear()
            else:
                blocked.add(i)
        self.check_end()

    def check_end(self):
        every = list(range(self.n))
        lower, upper = self.cta
        for w in range(self.nwarps):
            assert lower.reads[w] == every
            upper_steps = [] if upper.ghost_cta else [it for it in every if not self.ghost[it]]
            assert lower.peer_reads[w] == upper_steps  # the upper sends in these steps only
            assert upper.reads[w] == upper_steps
            assert upper.peer_reads[w] == every
        # Every stage went through one phase per use and is left with nothing armed.
        for cta in self.cta:
            for stages, fulls, kind in ((self.q_stages, cta.full_q, "q"),
                                        (self.do_stages, [[f] for f in cta.full_do], "do")):
                for s in range(stages):
                    uses = len(range(s, self.n, stages))
                    for bar in fulls[s] + [cta.empty[kind][s]]:
                        assert (bar.phase, bar.pending, bar.tx) == (uses, bar.count, 0), bar.name


def run(ghost, ghost_cta, q_stages, seed, **kw):
    Pair(ghost, ghost_cta, q_stages, **kw).run(seed)


T, F = True, False
WALKS = {
    "n_iters 0": ([], False),
    "n_iters 1": ([F], False),
    "n_iters 1, upper ghost": ([T], False),
    "n_iters 1, ghost CTA": ([T], True),
    "no ghost steps": ([F] * 5, False),
    "causal, one ghost step per head": ([T, F, F] * 2, False),
    "causal, two ghost steps per head": ([T, T, F] * 2, False),
    "scattered ghost steps": ([F, T, F, F, T, T, F], False),
    "upper ghost every step": ([T] * 4, False),
    "ghost CTA": ([T] * 5, True),
}
SEEDS = 200


@pytest.mark.parametrize("q_stages", [1, 2])
@pytest.mark.parametrize("walk", list(WALKS))
def test_multicast_stages_under_random_interleavings(walk, q_stages):
    ghost, ghost_cta = WALKS[walk]
    for seed in range(SEEDS):
        run(ghost, ghost_cta, q_stages, seed)


@pytest.mark.parametrize("walk", ["causal, two ghost steps per head", "ghost CTA"])
def test_the_kernels_eight_warps_and_two_do_stages(walk):
    ghost, ghost_cta = WALKS[walk]
    for seed in range(15):
        run(ghost, ghost_cta, 1, seed, nwarps=8)
        run(ghost, ghost_cta, 2, seed, do_stages=2)


MUTANT_WALKS = ["causal, two ghost steps per head", "scattered ghost steps", "ghost CTA"]


def failures(mutation, seeds=8):
    """Messages of the runs of a planted bug that fail, over a few walks, seeds, stage counts."""
    caught = []
    for walk in MUTANT_WALKS:
        ghost, ghost_cta = WALKS[walk]
        for q_stages in (1, 2):
            for seed in range(seeds):
                try:
                    run(ghost, ghost_cta, q_stages, seed, **mutation)
                except AssertionError as e:
                    caught.append(str(e))
    return caught


def test_an_empty_barrier_counting_only_the_local_warps_is_caught():
    """Any nwarps arrivals complete a phase: a stage refilled while the partner's warps still
    read it, phases run ahead of the walk."""
    assert failures({"local_empty_count": True})


@pytest.mark.parametrize("site", ["consumer", "pass"])
def test_a_missing_remote_release_is_caught(site):
    """A stage's empty barrier then misses the partner's warps' arrivals (in its common steps
    or in the upper's ghost steps): its producer waits for ever; with one step, the barrier is
    left short of its phase."""
    caught = failures({"no_remote_release": site})
    assert caught and any(m.startswith("deadlock") for m in caught)


def test_a_ghost_step_releasing_before_its_wait_is_caught():
    """The producers may arm the next phase while this one's boxes are still in flight."""
    assert failures({"ghost_release_first": True})
