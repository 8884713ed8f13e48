"""The warp-specialized GEMM example (gemm.cu) against PyTorch on small shapes. Speed is
bench_gemm.py's job."""
import pytest

torch = pytest.importorskip("torch")

from hopper_lib import check, ptr  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [(256, 256, 64), (384, 512, 192), (1024, 768, 1024), (2048, 2048, 4096)]


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-tile"])
@pytest.mark.parametrize("cluster_m", [1, 2])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_bf16_tn(hlib, m, n, k, cluster_m, persistent):
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16()
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    num_ctas = 0 if persistent else (m // 128) * (n // 256)
    rc = hlib.fbh_gemm_bf16_tn(ptr(a), ptr(b), ptr(c), m, n, k, cluster_m, num_ctas, None)
    if m % (128 * cluster_m):
        assert rc != 0, "shape the kernel cannot tile must be rejected"
        return
    check(hlib, rc, "fbh_gemm_bf16_tn")
    ref = a.float() @ b.float().t()
    assert not torch.isnan(c).any(), "some output elements were never written"
    err = ((c.float() - ref).norm() / ref.norm()).item()
    assert err < 4e-3, f"relative error {err}"
    torch.testing.assert_close(c.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
