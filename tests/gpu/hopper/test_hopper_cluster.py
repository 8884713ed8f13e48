"""Cluster launch, ranks, distributed shared memory (mapa + ld/st.shared::cluster), cluster
barrier; setmaxnreg register hand-off between warpgroups."""
import pytest

torch = pytest.importorskip("torch")

from hopper_lib import check, ptr  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cluster_size", [2, 4, 8, 16])
def test_cluster_dsmem(hlib, cluster_size):
    nclusters = 3
    nctas = cluster_size * nclusters
    x = torch.randn(nctas, 128, device="cuda")
    read = torch.full_like(x, float("nan"))
    written = torch.full_like(x, float("nan"))
    ranks = torch.full((nctas, 2), -1, dtype=torch.int32, device="cuda")
    rc = hlib.fbh_cluster_dsmem(ptr(x), ptr(read), ptr(written), ptr(ranks), cluster_size, nclusters)
    check(hlib, rc, "fbh_cluster_dsmem")
    cta = torch.arange(nctas, device="cuda")
    rank = cta % cluster_size
    base = cta - rank
    peer = base + (rank + 1) % cluster_size
    idx = (torch.arange(128, device="cuda") + 3) % 128
    expect_read = x[peer][:, idx]
    assert torch.equal(ranks[:, 0].long(), rank)
    assert torch.equal(ranks[:, 1].long(), torch.full_like(rank, cluster_size))
    assert torch.equal(read, expect_read)
    # CTA `c` wrote read[c] * 2 + rank(c) into its peer's b[]; so peer p holds it.
    expect_written = torch.empty_like(x)
    expect_written[peer] = read * 2 + rank[:, None].float()
    assert torch.equal(written, expect_written)


def test_cluster_bulk_swap(hlib):
    # Three rounds of pairs swapping a 10 KB tile through bulk copies into the partner's shared
    # memory, each round's buffer freed by a remote mbarrier arrival.
    rounds, npairs, nbytes = 3, 5, 10240
    x = torch.randint(-2**31, 2**31 - 1, (rounds, 2 * npairs, nbytes // 4), dtype=torch.int32, device="cuda")
    out = torch.full_like(x, -1)
    check(hlib, hlib.fbh_cluster_bulk_swap(ptr(x), ptr(out), npairs), "fbh_cluster_bulk_swap")
    partner = torch.arange(2 * npairs, device="cuda") ^ 1
    assert torch.equal(out, x[:, partner])


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("nbytes", [2048, 10240, 40960])
def test_cluster_pingpong(hlib, mode, nbytes):
    # A tile bounced between the two CTAs of each pair, by bulk copy (mode 0) or by per-thread
    # DSMEM stores with release / acquire at cluster scope (mode 1): both CTAs end holding the
    # input, and CTA 0 timed a positive number of cycles (bench_dsmem.py reports them).
    npairs, rounds = 3, 5
    x = torch.randint(-2**31, 2**31 - 1, (npairs, nbytes // 4), dtype=torch.int32, device="cuda")
    out = torch.full((npairs, 2, nbytes // 4), -1, dtype=torch.int32, device="cuda")
    cycles = torch.zeros(npairs, dtype=torch.int64, device="cuda")
    rc = hlib.fbh_cluster_pingpong(ptr(x), ptr(out), ptr(cycles), nbytes, rounds, mode, npairs, 128)
    check(hlib, rc, "fbh_cluster_pingpong")
    assert torch.equal(out[:, 0], x) and torch.equal(out[:, 1], x)
    assert bool((cycles > 0).all())


def test_cluster_pingpong_rejects_bad_arguments(hlib):
    buf = torch.zeros(16, dtype=torch.int32, device="cuda")
    cycles = torch.zeros(1, dtype=torch.int64, device="cuda")
    for nbytes, mode in ((24, 0), (40976, 0), (64, 2)):
        assert hlib.fbh_cluster_pingpong(ptr(buf), ptr(buf), ptr(cycles), nbytes, 1, mode, 1, 128) != 0


def test_setmaxnreg_split(hlib):
    n_live = 128
    x = torch.randn(128 + 256 * n_live, device="cuda")
    out = torch.full_like(x, float("nan"))
    check(hlib, hlib.fbh_setmaxnreg(ptr(x), ptr(out)), "fbh_setmaxnreg")
    torch.testing.assert_close(out[:128], x[:128] * 3, rtol=0, atol=0)
    v = x[128:].view(256, n_live).double()
    expect = v * v.flip(1) + v.roll(-1, dims=1)
    torch.testing.assert_close(out[128:].view(256, n_live).double(), expect, rtol=1e-6, atol=1e-6)
