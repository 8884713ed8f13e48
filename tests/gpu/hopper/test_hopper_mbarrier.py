"""mbarrier phases and tx accounting, the N-stage TmaPipeline ring, named barriers."""
import pytest

torch = pytest.importorskip("torch")

from hopper_lib import check, ptr  # noqa: E402

pytestmark = pytest.mark.gpu


def test_mbarrier_phase_parity_and_tx(hlib):
    out = torch.full((18,), -1, dtype=torch.int32, device="cuda")
    check(hlib, hlib.fbh_mbarrier_phases(ptr(out)), "fbh_mbarrier_phases")
    got = out.tolist()
    # Per phase: try_wait(current parity) before the arrivals = 0, try_wait(previous parity) = 1
    # (also on the fresh barrier: the producer's first-pass rule), after the arrivals = 1.
    assert got[:12] == [0, 1, 1] * 4
    # arrive.expect_tx(256): 0; 128 bytes delivered: 0; the other 128: 1.
    assert got[12:15] == [0, 0, 1]
    # expect_tx(64) with no arrival: 0; plain arrival, 64 bytes still outstanding: 0;
    # complete_tx(64): 1.
    assert got[15:18] == [0, 0, 1]


@pytest.mark.parametrize("style", [0, 1, 2], ids=["spin", "try_first", "try_first_sleep"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_tma_pipeline_ring(hlib, stages, style):
    ntiles = 37  # not a multiple of any stage count: phases wrap mid-ring
    src = torch.randn(ntiles * 64, 32, device="cuda")
    dst = torch.full_like(src, float("nan"))
    check(hlib, hlib.fbh_pipeline_copy(ptr(src), ptr(dst), ntiles, stages, style), "fbh_pipeline_copy")
    assert torch.equal(dst, src)


def test_named_barriers_between_warpgroups(hlib):
    rounds = 9
    src = torch.randn(rounds, 128, device="cuda")
    out = torch.full_like(src, float("nan"))
    check(hlib, hlib.fbh_named_barrier(ptr(src), ptr(out), rounds), "fbh_named_barrier")
    idx = (torch.arange(128, device="cuda") * 37 + 5) % 128
    expect = src[:, idx] * 2 + torch.arange(rounds, device="cuda", dtype=torch.float32)[:, None]
    assert torch.equal(out, expect)
