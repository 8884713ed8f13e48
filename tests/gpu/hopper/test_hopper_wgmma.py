"""wgmma m64nNk16 bf16 -> fp32: every supported N; SS with K-major / MN-major A and B (128B
swizzle); RS (A in registers) with K-major / MN-major B; SS -> registers -> RS chain. fp16 -> fp32:
the same variants and chain at the N the kernel family issues."""
import ctypes

import pytest

torch = pytest.importorskip("torch")

from hopper_lib import check, ptr  # noqa: E402

pytestmark = pytest.mark.gpu

# The shapes the library was generated for (FLASHBACK_WGMMA_SHAPES); the list below is only
# used for test ids -- test_supported_shapes checks it against the library.
SHAPES = [16, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 256]
VARIANTS = [  # (a_mn, b_mn, rs)
    (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (0, 0, 1), (0, 1, 1),
]


# fp16: the N the kernel family issues (fbh_wgmma_f16 in wgmma_tests.cu says which GEMM uses
# which), each in every variant; the chain at the family's head dims (the forward's P V).
F16_SHAPES = [40, 64, 80, 112, 128, 192, 256]
F16_CHAIN_SHAPES = [64, 128, 192, 256]


def variant_id(v):
    a_mn, b_mn, rs = v
    return f"{'RS' if rs else 'SS'}-A{'mn' if a_mn else 'k'}-B{'mn' if b_mn else 'k'}"


def test_supported_shapes(hlib):
    buf = (ctypes.c_int * 32)()
    count = hlib.fbh_wgmma_supported_n(buf, 32)
    assert list(buf[:count]) == SHAPES
    assert {40, 64, 80, 128, 256} <= set(SHAPES)


def operands(n, a_mn, b_mn, dtype):
    """A (M x K), B (N x K) with D = A B^T, and the layouts the kernel is given."""
    a = torch.randn(64, 64, device="cuda").to(dtype)  # A: M x K
    b = torch.randn(n, 64, device="cuda").to(dtype)   # B: N x K  (D = A B^T)
    a_arg = a.t().contiguous() if a_mn else a
    if b_mn:  # K x N, padded to a multiple of 64 columns with random (unused) values
        npad = (n + 63) // 64 * 64
        b_arg = torch.randn(64, npad, device="cuda").to(dtype)
        b_arg[:, :n] = b.t()
    else:
        b_arg = b
    return a, b, a_arg, b_arg


def fp32_sum_bound(x, y):
    """Elementwise bound on |fp32 result - exact| of x @ y over K = 64 terms whose products are
    exact in fp32 (an fp16 x fp16 product has 22 significant bits): each of the 64 additions
    rounds by at most an ulp of a partial sum, 2^-23 |x| @ |y|; twice that as margin."""
    return 2 * 64 * 2.0 ** -23 * (x.double().abs() @ y.double().abs())


@pytest.mark.parametrize("variant", VARIANTS, ids=[variant_id(v) for v in VARIANTS])
@pytest.mark.parametrize("n", SHAPES)
def test_wgmma(hlib, n, variant):
    a_mn, b_mn, rs = variant
    a, b, a_arg, b_arg = operands(n, a_mn, b_mn, torch.bfloat16)
    d = torch.full((64, n), float("nan"), device="cuda")
    check(hlib, hlib.fbh_wgmma(ptr(a_arg), ptr(b_arg), ptr(d), n, a_mn, b_mn, rs), "fbh_wgmma")
    ref = (a.double() @ b.double().t()).float()
    torch.testing.assert_close(d, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("variant", VARIANTS, ids=[variant_id(v) for v in VARIANTS])
@pytest.mark.parametrize("n", F16_SHAPES)
def test_wgmma_f16(hlib, n, variant):
    a_mn, b_mn, rs = variant
    a, b, a_arg, b_arg = operands(n, a_mn, b_mn, torch.float16)
    d = torch.full((64, n), float("nan"), device="cuda")
    check(hlib, hlib.fbh_wgmma_f16(ptr(a_arg), ptr(b_arg), ptr(d), n, a_mn, b_mn, rs), "fbh_wgmma_f16")
    ref = a.double() @ b.double().t()
    err = (d.double() - ref).abs()
    bound = fp32_sum_bound(a, b.t())
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"


@pytest.mark.parametrize("n2", [64, 128, 256])
def test_wgmma_ss_to_rs_chain(hlib, n2):
    a = torch.randn(64, 64, device="cuda").bfloat16()
    b = torch.randn(64, 64, device="cuda").bfloat16()
    v = torch.randn(64, n2, device="cuda").bfloat16()  # K x N (N-major)
    o = torch.full((64, n2), float("nan"), device="cuda")
    check(hlib, hlib.fbh_wgmma_chain(ptr(a), ptr(b), ptr(v), ptr(o), n2), "fbh_wgmma_chain")
    p32 = a.double() @ b.double().t()
    p = p32.float().bfloat16()
    ref = p.double() @ v.double()
    # The kernel rounds its own fp32 S to bf16; where S sits next to a rounding boundary, its
    # accumulation order can round P one bf16 step the other way than the reference does (seen:
    # one element of 8192 off by 0.13). Each output may take one such step per row of P: the
    # largest |step x v| in its row and column, on top of the fp32 tolerance.
    step = torch.where(p32 == 0, torch.zeros_like(p32), 2.0 ** (torch.floor(torch.log2(p32.abs())) - 7))
    one_flip = (step.unsqueeze(2) * v.double().abs().unsqueeze(0)).amax(dim=1)
    err = (o.double() - ref).abs()
    assert bool((err <= 0.02 + 1e-2 * ref.abs() + one_flip).all()), f"max error {err.max().item():.3g}"
    assert ((o.double() - ref).norm() / ref.norm()).item() < 1e-3


@pytest.mark.parametrize("n2", F16_CHAIN_SHAPES)
def test_wgmma_ss_to_rs_chain_f16(hlib, n2):
    a = torch.randn(64, 64, device="cuda").half()
    b = torch.randn(64, 64, device="cuda").half()
    v = torch.randn(64, n2, device="cuda").half()  # K x N (N-major)
    o = torch.full((64, n2), float("nan"), device="cuda")
    check(hlib, hlib.fbh_wgmma_chain_f16(ptr(a), ptr(b), ptr(v), ptr(o), n2), "fbh_wgmma_chain_f16")
    p = (a.double() @ b.double().t()).half()  # |P| stays far below fp16's 65504
    ref = p.double() @ v.double()
    # The kernel rounds its fp32 P to fp16, which can land one fp16 ulp (<= 2^-10 |P|) from p;
    # then P V sums 64 exact products in fp32.
    mag = p.double().abs() @ v.double().abs()
    err = (o.double() - ref).abs()
    bound = 2.0 ** -10 * mag + fp32_sum_bound(p, v) + 1e-6
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"
    assert ((o.double() - ref).norm() / ref.norm()).item() < 1e-4


@pytest.mark.parametrize("n", [40, 80])
@pytest.mark.parametrize("roles", [0, 1])
def test_wgmma_rate_runs(hlib, n, roles):
    """The issue-rate benchmark's kernel (bench_wgmma_rate.py): it runs at both shapes and splits,
    its accumulators stay finite, and every CTA's clock count gives a rate no higher than the
    tensor cores' (4096 FLOP per clock per SM) and no lower than a hundredth of it."""
    ctas, wgs, iters = 4, 2, 64
    cycles = torch.zeros(ctas, dtype=torch.int64, device="cuda")
    sink = torch.full((ctas * 128 * wgs,), float("nan"), dtype=torch.float32, device="cuda")
    check(hlib, hlib.fbh_wgmma_rate(n, wgs, roles, iters, ctas, ptr(cycles), ptr(sink)), "fbh_wgmma_rate")
    torch.cuda.synchronize()
    assert torch.isfinite(sink).all()
    flop = wgs * iters * 16 * 2 * 64 * n * 16
    for c in cycles.tolist():
        assert 0 < c and 40.96 <= flop / c <= 4096 * 1.02, (n, roles, c)
