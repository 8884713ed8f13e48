"""exp2_approx (ex2.approx.ftz.f32), the softmax exponential of both attention kernels: relative
error against float64 2^x over the range the softmax uses, results below 2^-126 flushed to 0,
2^-inf = 0, 2^0 = 1 exactly, NaN stays NaN."""
import pytest

torch = pytest.importorskip("torch")

from hopper_lib import check, ptr  # noqa: E402

pytestmark = pytest.mark.gpu


def _run(hlib, x):
    y = torch.full_like(x, float("nan"))
    check(hlib, hlib.fbh_exp2_approx(ptr(x), ptr(y), x.numel()), "fbh_exp2_approx")
    torch.cuda.synchronize()
    return y


def test_exp2_approx_matches_float64(hlib):
    x = torch.cat([torch.linspace(-125, 0, 1 << 16), torch.rand(1 << 16) * -30, torch.rand(1 << 12) * 60 - 30])
    x = x.cuda()
    y = _run(hlib, x)
    ref = torch.exp2(x.double())
    rel = ((y.double() - ref).abs() / ref).max().item()
    assert rel < 2 ** -20, f"max relative error {rel:.3e}"


def test_exp2_approx_special_values(hlib):
    x = torch.tensor([float("-inf"), 0.0, -127.5, -149.0, -200.0, 1.0, float("nan"), float("inf")], device="cuda")
    y = _run(hlib, x).tolist()
    assert y[0] == 0.0 and y[1] == 1.0, y
    assert y[2] == 0.0 and y[3] == 0.0 and y[4] == 0.0, f"results below 2^-126 must flush to 0: {y}"
    assert abs(y[5] - 2.0) <= 2.0 * 2 ** -21  # PTX bounds the error; it does not promise exact integers
    assert y[6] != y[6], "NaN in, NaN out"
    assert y[7] == float("inf")
