"""The 2-CTA pair's dS^T exchange (csrc/bwd_sm90/bwd_sm90_mainloop.cuh, pair_dq and pair_ghost)
as a model of its mbarriers, run under many random interleavings: every step each CTA reads the
partner's dS^T of that very step, no buffer is overwritten before its reader is done, no waiter
sees a barrier two phases ahead, and both CTAs finish. The model follows the consumer's order per
step (one actor per CTA: the warpgroups move together between the hand-off barriers):

  arm full[it & 1] (expect 1 tile)            -- not when the partner is a ghost
  it >= 2: wait free[it & 1], phase (it >> 1) - 1   -- the partner read what we sent at it - 2
  write ds_t[it & 1]; bulk copy it into the partner's peer[it & 1], complete_tx on its full
  wait full[it & 1], phase it >> 1; read peer[it & 1]   -- not when the partner is a ghost
  arrive on the partner's free[it & 1]                   -- not when the partner is a ghost

A ghost (pair_ghost: the upper CTA of an odd block count) per step: arm full, wait full, read
peer, arrive on the partner's free; it never writes or sends. The copy engine reads the source
when the copy completes, which may be any time after its issue."""
import random

import pytest

from mbarrier_model import Barrier


class Cta:
    def __init__(self, ghost):
        self.ghost = ghost
        self.full = [Barrier(1), Barrier(1)]
        self.free = [Barrier(1), Barrier(1)]
        self.ds = [None, None]    # own dS^T buffers: the step whose tile they hold
        self.peer = [None, None]  # the partner's dS^T as received
        self.read = []            # the steps whose partner tile this CTA read, in order


def steps(me, partner, n_iters, copies, free_wait=True):
    """The consumer of `me`, a generator yielding until its next action may run."""
    for it in range(n_iters):
        b = it & 1
        if me.ghost or not partner.ghost:
            me.full[b].arrive(expect_tx=1)
        if not me.ghost:
            if it >= 2 and free_wait:
                while not me.free[b].passed((it >> 1) - 1):
                    yield
            me.ds[b] = it
            copies.append((me, partner, b))
            yield
        if me.ghost or not partner.ghost:
            while not me.full[b].passed(it >> 1):
                yield
            assert me.peer[b] == it, f"step {it}: read the partner's step {me.peer[b]}"
            me.read.append(it)
            yield  # the read lasts until the wgmma that reads the tile retires
            assert me.peer[b] == it, f"step {it}: the tile changed while being read"
            partner.free[b].arrive()
        yield


def ghost_protocol_step(me, partner, it, ghost_step, copies, upper, recv, tile, wait):
    """One step `it` of pair_ghost (ghost_step: the upper block's keys are all masked), `tile`
    naming what it sends and expects to read; wait(barrier, j) is the kernel's wait for phase j
    of the barrier as the walk counts it. The lower sends every step; the upper sends on the other
    steps only. The lower counts the upper's sends per buffer (`recv`) for its full barriers and
    waits for its free barrier by the step (the upper reads every step); the upper never waits
    for its free barrier (the lower's sends, one per step, keep it in lockstep), and the lower
    does not arrive on it."""
    b = it & 1
    sends = not (upper and ghost_step)
    receives = upper or not ghost_step
    if receives:
        me.full[b].arrive(expect_tx=1)
    if sends:
        if not upper and it >= 2:
            while not wait(me.free[b], (it >> 1) - 1):
                yield
        me.ds[b] = tile
        copies.append((me, partner, b))
        yield
    if receives:
        j = (it >> 1) if upper else recv[b]
        while not wait(me.full[b], j):
            yield
        assert me.peer[b] == tile, f"step {tile}: read the partner's step {me.peer[b]}"
        me.read.append(tile)
        recv[b] += 1
        yield  # the read lasts until the wgmma that reads the tile retires
        assert me.peer[b] == tile, f"step {tile}: the tile changed while being read"
        if upper:
            partner.free[b].arrive()
    yield


def steps_ghost_steps(me, partner, ghost, copies, upper):
    """pair_ghost over one walk: `ghost[it]` says the upper block's keys are all masked at step
    it (ghost_protocol_step); phases count from the barriers' first."""
    recv = [0, 0]  # the lower: the upper's sends received per buffer
    for it in range(len(ghost)):
        yield from ghost_protocol_step(me, partner, it, ghost[it], copies, upper, recv, it,
                                       lambda bar, j: bar.passed(j))


def _schedule(actors, copies, rng, max_actions, what):
    """Runs the two consumers and the copy engine in a random order until all are done."""
    done = [False, False]
    for _ in range(max_actions):
        if all(done) and not copies:
            return
        choices = [i for i in range(2) if not done[i]] + (["copy"] if copies else [])
        pick = rng.choice(choices)
        if pick == "copy":
            src, dst, b = copies.pop(rng.randrange(len(copies)))
            dst.peer[b] = src.ds[b]  # the engine reads the source now
            dst.full[b].complete_tx(1)
        else:
            try:
                next(actors[pick])
            except StopIteration:
                done[pick] = True
    raise AssertionError(f"no progress: {what}")


def run_ghost_steps(ghost, seed, max_actions=200000):
    rng = random.Random(seed)
    lower, upper = Cta(False), Cta(False)
    copies = []
    actors = [steps_ghost_steps(lower, upper, ghost, copies, False),
              steps_ghost_steps(upper, lower, ghost, copies, True)]
    _schedule(actors, copies, rng, max_actions, f"ghost={ghost} seed={seed}")
    assert upper.read == list(range(len(ghost)))
    assert lower.read == [it for it, g in enumerate(ghost) if not g]


def test_pair_ghost_steps_under_random_interleavings():
    """Ghost steps at the start of every q head's walk (causal: the upper block's first Q blocks
    see none of its keys), one to three of them, GQA groups of one to three heads; the same at
    the end of each walk (the deterministic walk from the last Q block down, det_from_the_end;
    with the q heads inner the ghosts of all heads come together at the end); and every step a
    ghost (the upper block past the keys)."""
    patterns = [[True] * 5]
    for g in (1, 2, 3):
        for heads in (1, 2, 3):
            for m_count in (g, g + 1, g + 4):
                patterns.append(([True] * g + [False] * (m_count - g)) * heads)
                patterns.append([False] * ((m_count - g) * heads) + [True] * (g * heads))
    for ghost in patterns:
        for seed in range(60):
            run_ghost_steps(ghost, seed)


def run(n_iters, ghost_upper, seed, free_wait=True, max_actions=200000):
    rng = random.Random(seed)
    lower, upper = Cta(False), Cta(ghost_upper)
    copies = []  # issued, not yet completed: (source CTA, destination CTA, buffer)
    actors = [steps(lower, upper, n_iters, copies, free_wait), steps(upper, lower, n_iters, copies, free_wait)]
    _schedule(actors, copies, rng, max_actions, f"n_iters={n_iters} ghost={ghost_upper} seed={seed}")
    expect = list(range(n_iters))
    assert upper.read == expect
    assert lower.read == ([] if ghost_upper else expect)


@pytest.mark.parametrize("ghost_upper", [False, True])
def test_pair_exchange_under_random_interleavings(ghost_upper):
    for n_iters in (0, 1, 2, 3, 4, 7, 16):
        for seed in range(150):
            run(n_iters, ghost_upper, seed)


def test_the_free_wait_is_what_holds_a_ghosts_partner_back():
    """Between two full CTAs the full waits alone keep them in lockstep (a CTA's send of step
    it + 1 follows its read of step it, and the partner needs that send before its step it + 2),
    so dropping the free wait breaks nothing there. A ghost sends nothing: only the free wait
    keeps its partner from rewriting a buffer, or landing a copy in the ghost's, before the
    ghost has read the previous tile; some interleaving shows it."""
    for seed in range(100):
        run(8, False, seed, free_wait=False)
    failures = 0
    for seed in range(300):
        try:
            run(8, True, seed, free_wait=False, max_actions=5000)
        except AssertionError:
            failures += 1
    assert failures > 0


class UnitCta(Cta):
    def __init__(self):
        super().__init__(False)
        self.ready = Barrier(1, "partner_ready")  # the persistent pair's partner_ready


def parity_passed(bar, j, base):
    """The kernel's parity wait for its unit's phase j (parity j & 1: its steps count from 0 in
    every unit), on a barrier whose phase was `base` at the unit's start. The wait is sound while
    the barrier is at phase base + j (in progress) or base + j + 1 (done); the assertions say the
    protocol never lets it be elsewhere."""
    assert base % 2 == 0, f"{bar.name}: a unit starts at phase {base}, whose parity is 1"
    assert base + j <= bar.phase <= base + j + 1, f"{bar.name}: phase {bar.phase} for a wait of {base + j}"
    return (bar.phase & 1) != (j & 1)


def unit_walk(me, partner, units, copies, upper, drain=True, ready_wait=True):
    """The persistent pair's consumer (kBwdSm90Hdim256Persistent, bwd_sm90_persistent): unit k's
    ghost pattern is units[k], its steps as steps_ghost_steps's, counted from 0 with a one-unit
    CTA's parity waits. Each unit's end (bwd_sm90_pair_rearm): the lower waits for the upper's
    free arrivals of its last two sends, one local completion pads each barrier that completed
    an odd number of phases in the unit, then an arrival on the partner's partner_ready, which
    the partner waits for before its next unit (unit k waits for phase k - 1)."""
    for k, ghost in enumerate(units):
        if k > 0 and ready_wait:
            while not me.ready.passed(k - 1):
                yield
        base = {id(bar): bar.phase for bar in me.full + me.free}  # each barrier's at the unit's start
        recv = [0, 0]
        n = len(ghost)
        for it in range(n):
            yield from ghost_protocol_step(me, partner, it, ghost[it], copies, upper, recv, (k, it),
                                           lambda bar, j: parity_passed(bar, j, base[id(bar)]))
        per_buffer = [(n + 1) >> 1, n >> 1]  # steps per buffer (it & 1)
        if not upper and drain:
            for g in range(max(n, 2), n + 2):
                while not parity_passed(me.free[g & 1], (g >> 1) - 1, base[id(me.free[g & 1])]):
                    yield
        full_done, free_done = (per_buffer, [0, 0]) if upper else (recv, per_buffer)
        for b in range(2):
            if full_done[b] & 1:
                me.full[b].arrive()
            if free_done[b] & 1:
                me.free[b].arrive()
        partner.ready.arrive()
        yield


def run_units(units, seed, max_actions=400000, **kw):
    rng = random.Random(seed)
    lower, upper = UnitCta(), UnitCta()
    copies = []
    actors = [unit_walk(lower, upper, units, copies, False, **kw), unit_walk(upper, lower, units, copies, True, **kw)]
    _schedule(actors, copies, rng, max_actions, f"units={units} seed={seed}")
    assert upper.read == [(k, it) for k, g in enumerate(units) for it in range(len(g))]
    assert lower.read == [(k, it) for k, g in enumerate(units) for it, x in enumerate(g) if not x]
    for cta in (lower, upper):
        assert all(bar.phase % 2 == 0 for bar in cta.full + cta.free)


def _unit_patterns():
    # One-step units (ghost or not), odd and even lengths, whole-ghost units (the upper block past
    # the keys), ghost steps first (causal) and last (the deterministic walk's order), in turn.
    shapes = [[False], [True], [False, False], [False] * 3, [True] * 3, [True, False, False],
              [False, False, True], [True, True, False, False, False], [False] * 4]
    rng = random.Random(5)
    walks = [shapes, shapes[::-1], [[True]] * 5, [[False]] * 5]
    for _ in range(12):
        walks.append([rng.choice(shapes) for _ in range(rng.randint(2, 6))])
    return walks


def test_persistent_units_under_random_interleavings():
    for units in _unit_patterns():
        for seed in range(25):
            run_units(units, seed)


@pytest.mark.parametrize("dropped", ["drain", "ready_wait"])
def test_the_drain_and_the_ready_wait_are_needed(dropped):
    """Without the lower's drain (a late free arrival lands after the pad) or the partner_ready
    wait (the partner's next unit arms, sends or arrives before the pad), some walk and
    interleaving fails: a wait sees its barrier off the phase it means, a wrong tile is read, or
    a unit starts at an odd phase."""
    failures = 0
    for units in _unit_patterns():
        for seed in range(25):
            try:
                run_units(units, seed, max_actions=20000, **{dropped: False})
            except AssertionError:
                failures += 1
    assert failures > 0
