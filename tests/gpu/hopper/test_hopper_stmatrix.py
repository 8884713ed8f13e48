"""stmatrix: mma-fragment registers of a 16 x 16 bf16 matrix land in shared memory transposed
(.trans: the P^T / dS^T hand-off and the dK/dV epilogue of the Hopper backward) or as they are
(no caller in the kernels today; the measured by-keys backward, docs/perf-log.md, used it); and
ldmatrix .trans, which reads such a tile back into the fragments (the backward split by role)."""
import pytest

torch = pytest.importorskip("torch")

from hopper_lib import check, ptr  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("x4", [1, 0], ids=["x4", "x2"])
def test_stmatrix_trans(hlib, x4):
    a = torch.randn(16, 16, device="cuda").bfloat16()
    out = torch.full((16, 16), float("nan"), device="cuda", dtype=torch.bfloat16)
    check(hlib, hlib.fbh_stmatrix_trans(ptr(a), ptr(out), x4), "fbh_stmatrix_trans")
    expect = a.t()
    if x4:
        assert torch.equal(out, expect)
    else:
        assert torch.equal(out[:8], expect[:8])
        assert torch.isnan(out[8:].float()).all()


def test_stmatrix_plain(hlib):
    a = torch.randn(16, 16, device="cuda").bfloat16()
    out = torch.full((16, 16), float("nan"), device="cuda", dtype=torch.bfloat16)
    check(hlib, hlib.fbh_stmatrix_plain(ptr(a), ptr(out)), "fbh_stmatrix_plain")
    assert torch.equal(out, a)


@pytest.mark.parametrize("x4", [1, 0], ids=["x4", "x2"])
def test_ldmatrix_trans(hlib, x4):
    """What stmatrix .trans stores as A^T, ldmatrix .trans at the same addresses reads back as A's
    fragments (x2: the first two 8 x 8 blocks, rows 0..15 of columns 0..7)."""
    a = torch.randn(16, 16, device="cuda").bfloat16()
    out = torch.full((16, 16), float("nan"), device="cuda", dtype=torch.bfloat16)
    check(hlib, hlib.fbh_ldmatrix_trans(ptr(a), ptr(out), x4), "fbh_ldmatrix_trans")
    if x4:
        assert torch.equal(out, a)
    else:
        assert torch.equal(out[:, :8], a[:, :8])
        assert torch.isnan(out[:, 8:].float()).all()
