"""scripts/fwd_balance_model.py's counter schedules: the fetch a tile ahead (the kernel's
default), the late fetch (late_tile_fetch) and fetch-when-free (greedy) agree where they must
and differ where a reserved tile waits behind a long one."""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts"))

import fwd_balance_model as m  # noqa: E402


def test_late_fetch_bounds():
    rng = random.Random(3)
    for _ in range(200):
        costs = [rng.randint(1, 40) for _ in range(rng.randint(1, 60))]
        sms = rng.randint(1, 8)
        greedy = m.greedy(costs, sms, 0.0)
        # A fetch at the very end is fetching when free; one as long as any tile before its end is
        # the fetch a tile ahead.
        assert abs(m.greedy_late(costs, sms, 0.0, lead=0.0) - greedy) < 1e-9
        assert abs(m.greedy_late(costs, sms, 0.0, lead=1e9) - m.greedy_ahead(costs, sms, 0.0)) < 1e-9
        assert m.greedy_ahead(costs, sms, 0.0) >= sum(costs) / sms - 1e-9


def test_a_reserved_tile_waits_behind_a_long_one():
    # Two SMs. CTA 0 starts the long tile and reserves tile 2 at once; CTA 1 finishes tile 1
    # early and can only take tile 3. Fetching when free, CTA 1 runs both short tiles.
    costs = [10, 1, 1, 1]
    assert m.greedy_ahead(costs, 2, 0.0) == 11
    assert m.greedy(costs, 2, 0.0) == 10
    assert m.greedy_late(costs, 2, 0.0, lead=2.0) == 10
