"""Programmatic dependent launch: the secondary starts before the primary ends, and its
griddepcontrol.wait makes every write of the primary visible."""
import pytest

torch = pytest.importorskip("torch")

from hopper_lib import check, ptr  # noqa: E402

pytestmark = pytest.mark.gpu


def test_pdl_secondary_waits_for_the_primary(hlib):
    ctas = 16  # few CTAs: the secondary's find free SMs at once
    buf = torch.full((ctas, 128), float("nan"), device="cuda")
    out = torch.full_like(buf, float("nan"))
    done = torch.zeros(1, dtype=torch.int32, device="cuda")
    seen = torch.full((ctas,), -1, dtype=torch.int32, device="cuda")
    check(hlib, hlib.fbh_pdl_order(ptr(buf), ptr(out), ptr(done), ptr(seen), ctas, 200_000),
          "fbh_pdl_order")
    expect = 3.0 * torch.arange(ctas * 128, device="cuda", dtype=torch.float32).view(ctas, 128) + 1.0
    assert torch.equal(buf, expect)
    assert torch.equal(out, 2.0 * expect)  # after the wait: every value of the primary
    assert int(done.item()) == ctas
    # Each primary CTA sleeps ~200 us after letting the secondary go: secondary CTAs that started
    # while none had finished show that the launch overlapped (what the attribute is for).
    assert int((seen == 0).sum()) > 0, f"no secondary CTA started early: {seen.tolist()}"
