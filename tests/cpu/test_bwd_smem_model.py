"""scripts/bwd_smem_model.py: the d = 256 pair's per-step bytes and FLOP counted by hand."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bwd_smem_model  # noqa: E402


def test_pair_d256_64x80():
    items = bwd_smem_model.step_model(256, 64, 80, pair=True)
    by_name = {name: (b, f) for name, b, f in items}
    # S: Q (64 x 256 x 2) once, K (80 x 256 x 2) once per 64-row chain; 2 M N d FLOP.
    assert by_name["S = Q K^T"] == (32768 + 40960, 2 * 64 * 80 * 256)
    # dV^T: four atoms, each its dO atom (64 x 64 x 2) and all of P^T (80 x 64 x 2).
    assert by_name["dV^T += dO^T P"][0] == 4 * (8192 + 10240)
    # dQ^T of the pair: two atoms over both blocks' keys, each K atom (80 x 128 B) and dS^T.
    assert by_name["dQ^T = K^T dS^T"] == (2 * 2 * (10240 + 10240), 2 * 64 * 80 * 64 * 4)
    smem, math = bwd_smem_model.clocks(items)
    assert sum(f for _, _, f in items) == 10 * 64 * 80 * 256
    assert math == 3200 and smem == 493568 / 128


def test_single_cta_has_no_exchange():
    pair = bwd_smem_model.step_model(256, 64, 80, pair=True)
    single = bwd_smem_model.step_model(256, 64, 80, pair=False)
    assert not any("bulk copy" in name for name, _, _ in single)
    # the same FLOP; the single CTA's dQ^T covers all atoms over its own keys only
    assert sum(f for _, _, f in single) == sum(f for _, _, f in pair)
    assert bwd_smem_model.clocks(single)[0] < bwd_smem_model.clocks(pair)[0]


def test_larger_block_n_lowers_the_ratio():
    r80 = bwd_smem_model.clocks(bwd_smem_model.step_model(256, 64, 80, pair=False))
    r128 = bwd_smem_model.clocks(bwd_smem_model.step_model(256, 64, 128, pair=False))
    assert r128[0] / r128[1] < r80[0] / r80[1]
