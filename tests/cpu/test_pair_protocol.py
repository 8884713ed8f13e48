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


def steps_ghost_steps(me, partner, ghost, copies, upper):
    """pair_ghost per step: `ghost[it]` says the upper block's keys are all masked at step it.
    The lower sends every step; the upper sends on the other steps only. The lower counts the
    upper's sends per buffer for its full barriers and waits for its free barrier by the step
    (the upper reads every step); the upper never waits for its free barrier (the lower's sends,
    one per step, keep it in lockstep), and the lower does not arrive on it."""
    recv = [0, 0]  # the lower: the upper's sends received per buffer
    for it in range(len(ghost)):
        b = it & 1
        sends = not (upper and ghost[it])
        receives = upper or not ghost[it]
        if receives:
            me.full[b].arrive(expect_tx=1)
        if sends:
            if not upper and it >= 2:
                while not me.free[b].passed((it >> 1) - 1):
                    yield
            me.ds[b] = it
            copies.append((me, partner, b))
            yield
        if receives:
            n = (it >> 1) if upper else recv[b]
            while not me.full[b].passed(n):
                yield
            assert me.peer[b] == it, f"step {it}: read the partner's step {me.peer[b]}"
            me.read.append(it)
            recv[b] += 1
            yield  # the read lasts until the wgmma that reads the tile retires
            assert me.peer[b] == it, f"step {it}: the tile changed while being read"
            if upper:
                partner.free[b].arrive()
        yield


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
    see none of its keys), one to three of them, GQA groups of one to three heads; and every
    step a ghost (the upper block past the keys)."""
    patterns = [[True] * 5]
    for g in (1, 2, 3):
        for heads in (1, 2, 3):
            for m_count in (g, g + 1, g + 4):
                patterns.append(([True] * g + [False] * (m_count - g)) * heads)
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


def steps_lag(me, partner, ghost, copies, upper):
    """pair_dq_lag (bwd_sm90.h): a step's dQ^T (both blocks' keys) is computed in the next step,
    after that step's own dS^T went out, so the partner's dS^T has a whole step to land. Per step
    of a CTA that sends: arm full[b]; wait free[b] for its previous send into b; write ds_t[b] and
    send it; then the lagged read of the previous step: its own ds_t (kept until the step after
    next), and, when the partner sent that step, the partner's tile, then the free arrival. Both
    CTAs wait for their free barriers: the lockstep that lets the upper skip the wait without the
    lag is gone (its read of the lower's step it - 1 now follows its own write of step it), so the
    lower arrives on the upper's free barrier too, and the upper counts its sends per buffer.
    A ghost step of the upper first finishes the pending lagged read, then reads the lower's tile
    of that very step (pair_ghost_step, no lag)."""
    recv = [0, 0]  # the lower: the upper's sends received per buffer
    sent = [0, 0]  # the upper: its sends per buffer (the phases of its free barriers)
    pending = None  # (step, whether the partner sent that step)

    def lagged(j, peer):
        assert me.ds[j & 1] == j, f"step {j}: own dS^T rewritten before its lagged read"
        if peer:
            pb = j & 1
            n = (j >> 1) if upper else recv[pb]
            while not me.full[pb].passed(n):
                yield
            assert me.peer[pb] == j, f"lagged step {j}: read the partner's step {me.peer[pb]}"
            me.read.append(j)
            recv[pb] += 1
            yield  # the read lasts until the wgmma that reads the tile retires
            assert me.peer[pb] == j, f"lagged step {j}: the tile changed while being read"
            assert me.ds[j & 1] == j, f"step {j}: own dS^T changed while being read"
            partner.free[pb].arrive()

    for it in range(len(ghost)):
        b = it & 1
        if upper and ghost[it]:
            if pending is not None:
                yield from lagged(*pending)
                pending = None
            me.full[b].arrive(expect_tx=1)
            while not me.full[b].passed(it >> 1):
                yield
            assert me.peer[b] == it, f"ghost step {it}: read the partner's step {me.peer[b]}"
            me.read.append(it)
            yield
            partner.free[b].arrive()
            yield
            continue
        receives = upper or not ghost[it]
        if receives:
            me.full[b].arrive(expect_tx=1)
        prev = sent[b] if upper else it >> 1
        if prev > 0:
            while not me.free[b].passed(prev - 1):
                yield
        sent[b] += 1
        me.ds[b] = it
        copies.append((me, partner, b))
        yield
        if pending is not None:
            yield from lagged(*pending)
        pending = (it, receives)
        yield
    if pending is not None:
        yield from lagged(*pending)


def run_lag(ghost, seed, max_actions=200000):
    rng = random.Random(seed)
    lower, upper = Cta(False), Cta(False)
    copies = []
    actors = [steps_lag(lower, upper, ghost, copies, False), steps_lag(upper, lower, ghost, copies, True)]
    _schedule(actors, copies, rng, max_actions, f"lag ghost={ghost} seed={seed}")
    assert upper.read == list(range(len(ghost)))
    assert lower.read == [it for it, g in enumerate(ghost) if not g]


def test_pair_lag_under_random_interleavings():
    """The lagged exchange with and without ghost steps: no ghosts (0-16 steps), ghost steps at
    the start of every q head's walk (GQA groups of one to three heads), ghosts in the middle."""
    patterns = [[False] * n for n in (0, 1, 2, 3, 4, 7, 16)]
    for g in (1, 2, 3):
        for heads in (1, 2, 3):
            for m_count in (g, g + 1, g + 4):
                patterns.append(([True] * g + [False] * (m_count - g)) * heads)
    patterns.append([False, True, False, False, True, True, False])
    for ghost in patterns:
        for seed in range(60):
            run_lag(ghost, seed)


def test_the_lag_needs_the_uppers_free_wait():
    """Without the lag the upper may skip its free wait (lockstep); with it the lower reads the
    upper's tile of step it - 1 only after its own send of step it, so an upper that does not
    wait can rewrite or land a copy over a tile the lower has not read: some interleaving shows
    it (the model with the upper's wait dropped)."""
    failures = 0
    for seed in range(300):
        rng = random.Random(seed)
        lower, upper = Cta(False), Cta(False)
        upper.free = [_NeverBlocks(), _NeverBlocks()]
        copies = []
        actors = [steps_lag(lower, upper, [False] * 8, copies, False),
                  steps_lag(upper, lower, [False] * 8, copies, True)]
        try:
            _schedule(actors, copies, rng, 5000, "lag without the upper's free wait")
            assert lower.read == list(range(8))
        except AssertionError:
            failures += 1
    assert failures > 0


class _NeverBlocks:
    """A free barrier whose waits always pass (the upper's wait dropped)."""

    def arrive(self, expect_tx=0):
        pass

    def passed(self, n):
        return True
