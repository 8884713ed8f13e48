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
