"""GPU tests of flashback's attention: forward and backward against an FP32 PyTorch reference.

The bar (reference.check_close, as in FlashAttention's own tests): the error of our bf16 result
against the FP32 reference is at most twice the error of PyTorch computing in bf16.

- Inputs are fresh random numbers on every run. The seed is in every failure message; set
  FLASHBACK_TEST_SEED=<seed> to replay it (with -k to pick the test).
- Outputs are poisoned: out/lse/dq/dk/dv are preallocated, filled with NaN and passed through
  the out=/lse=/dq=/dk=/dv= arguments, so an element the kernels never write fails the test.
- One reference computation serves both deterministic modes of a shape (a one-entry cache:
  the two parametrizations of a shape run back to back).

Run: python3 -m pytest tests -m gpu -q  (needs an sm_90 GPU and the built library).
"""
import math
import os
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import flashback
from reference import attention_ref, check_close

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
DTYPE = torch.bfloat16


# ----------------------------------------------------------------------------------------------
# Shapes


@dataclass(frozen=True)
class Case:
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int
    causal: bool
    std: float = 1.0  # of q and k; 10 makes the softmax peaked
    softmax_scale: Optional[float] = None
    dtype: torch.dtype = torch.bfloat16

    def __str__(self):
        s = (f"d{self.headdim}-b{self.batch}-sq{self.seqlen_q}-sk{self.seqlen_k}"
             f"-h{self.nheads}-hk{self.nheads_k}-{'causal' if self.causal else 'full'}")
        if self.dtype != torch.bfloat16:
            s += "-fp16"
        if self.std != 1.0:
            s += f"-std{self.std:g}"
        if self.softmax_scale is not None:
            s += f"-scale{self.softmax_scale:g}"
        return s

    @property
    def empty_rows(self):
        """Query rows that see no key (causal, bottom-right aligned): row i sees keys
        j <= i + seqlen_k - seqlen_q, so rows i < seqlen_q - seqlen_k see none."""
        return max(0, self.seqlen_q - self.seqlen_k) if self.causal else 0


def _cases():
    cases = []
    for causal in (False, True):
        # Head dim 256, the focus: every kind of shape.
        cases += [
            Case(1, 1, 1, 1, 1, 256, causal),
            Case(2, 17, 17, 4, 4, 256, causal),
            Case(3, 113, 113, 2, 2, 256, causal),
            Case(4, 113, 113, 8, 2, 256, causal),          # GQA
            Case(2, 1000, 1000, 8, 1, 256, causal),        # MQA
            Case(1, 1000, 1000, 16, 16, 256, causal),
            Case(2, 113, 1000, 4, 4, 256, causal),         # seqlen_q < seqlen_k
            Case(2, 1000, 113, 4, 2, 256, causal),         # seqlen_q > seqlen_k: empty rows if causal
            Case(1, 17, 4095, 2, 2, 256, causal),
            Case(1, 4095, 17, 2, 1, 256, causal),
            # Causal: seqlen_k past the counter-fed bound (2048 at d = 256), so one CTA per tile
            # runs, and its first two Q blocks hold rows but see no key (n_count = 0); then the
            # same at the bound, on the counter and the Multi config (o_over_v's keyless tile).
            Case(1, 2560, 2304, 2, 2, 256, causal),
            Case(1, 2304, 2048, 2, 2, 256, causal),
            Case(1, 1, 1000, 2, 2, 256, causal),
            # seqlen_k 1, not causal: dQ = dK = 0 exactly, so the bar is its 1e-5 floor. dP - D is
            # then fp32 rounding alone (dP = dO V by the tensor cores, D = rowsum(dO O) with O = V),
            # summed into dK over the rows: at 113 rows it read 1.01e-5 and 1.17e-5 in two of
            # several runs, at random seeds (unchanged d = 256 kernels), hence 17 rows.
            Case(1, 17, 1, 2, 2, 256, causal),
            Case(1, 4095, 4095, 4, 4, 256, causal),
            Case(1, 4096, 4096, 8, 8, 256, causal),
            Case(1, 8192, 8192, 4, 2, 256, causal),
            Case(2, 1000, 1000, 4, 2, 256, causal, std=10.0),
            Case(1, 4096, 4096, 2, 2, 256, causal, std=10.0),
            Case(3, 113, 1000, 4, 4, 256, causal, softmax_scale=0.3),
        ]
        # Head dims 192, 128 and 64: fewer, smaller shapes.
        for d in (192, 128, 64):
            cases += [
                Case(1, 1, 1, 1, 1, d, causal),
                Case(2, 17, 17, 2, 2, d, causal),
                Case(3, 113, 1000, 4, 4, d, causal),
                Case(2, 1000, 113, 8, 2, d, causal),
                Case(4, 1000, 1000, 8, 1, d, causal),
                Case(1, 4095, 4095, 2, 2, d, causal),
                Case(2, 1000, 1000, 4, 4, d, causal, std=10.0),
                # More Q blocks than SMs, most of them (causal) seeing no key: a CTA that walks
                # several tiles meets empty ones between full ones.
                Case(4, 2000, 113, 8, 2, d, causal),
                # seqlen_k past the persistent grid's bound (4096 non-causal at d = 64 / 128):
                # one CTA per tile, at d = 128 its own config (kFwdSm90Hdim128FullLong); 3 Q
                # blocks, then 8 with a last K/V block of 50 keys (less than half a block of 176).
                Case(1, 300, 5000, 4, 2, d, causal),
                Case(2, 1000, 4450, 4, 2, d, causal),
            ]
        # fp16 at every head dim of the family.
        for d in (64, 128, 192, 256):
            f16 = torch.float16
            cases += [
                Case(1, 1, 1, 1, 1, d, causal, dtype=f16),
                Case(2, 113, 1000, 4, 2, d, causal, dtype=f16),
                Case(2, 1000, 113, 4, 4, d, causal, dtype=f16),
                Case(1, 4095, 4095, 4, 2, d, causal, dtype=f16),
                Case(1, 300, 5000, 2, 2, d, causal, dtype=f16),
            ]
    return cases


CASES = _cases()


# ----------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(autouse=True, scope="module")
def _require_flashback():
    # conftest.py skips these tests without an sm_90 GPU; with one, a missing library is a failure.
    if not flashback.is_available():
        pytest.fail("flashback.is_available() is False on an sm_90 GPU: the library was not "
                    "found or failed to load (build it, or set FLASHBACK_LIBRARY)", pytrace=False)


_FORCE_REFERENCE = os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0")


def _new_seed():
    env = os.environ.get("FLASHBACK_TEST_SEED")
    return int(env) if env else int.from_bytes(os.urandom(8), "little") >> 1


def _randn(gen, shape, std=1.0, dtype=DTYPE):
    return (torch.randn(shape, generator=gen, device=DEVICE, dtype=torch.float32) * std).to(dtype)


@dataclass
class Inputs:
    seed: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor


def _make_inputs(case):
    seed = _new_seed()
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    b, sq, sk, h, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.nheads_k, case.headdim
    q = _randn(gen, (b, sq, h, d), case.std, case.dtype)
    k = _randn(gen, (b, sk, hk, d), case.std, case.dtype)
    v = _randn(gen, (b, sk, hk, d), dtype=case.dtype)
    dout = _randn(gen, (b, sq, h, d), dtype=case.dtype)
    return Inputs(seed, q, k, v, dout)


def _reference(q, k, v, dout, causal, softmax_scale, upcast):
    """(out, lse, (dq, dk, dv)) of the PyTorch reference, in fp32 (upcast) or in q's dtype."""
    dtype = torch.float32 if upcast else q.dtype
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*leaves, causal=causal, softmax_scale=softmax_scale, upcast=upcast)
    grads = torch.autograd.grad(out, leaves, dout.to(dtype))
    return out.detach(), lse.detach(), grads


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), device=DEVICE, dtype=dtype)


def _check(ctx, name, ours, ref32, reflp):
    """reference.check_close with the seed and shape in the message, and a NaN count first
    (a NaN in a poisoned output usually means an element was never written)."""
    nan = int(torch.isnan(ours).sum())
    assert nan == 0, f"{ctx}: {name} has {nan} of {ours.numel()} elements NaN (never written?)"
    try:
        check_close(name, ours, ref32, reflp)
    except AssertionError as e:
        raise AssertionError(f"{ctx}: {e}") from None


def _check_lse(ctx, lse, ref32, empty_rows):
    """LSE against the fp32 reference's (both fp32). Tolerance 1e-3 + 1e-4 |lse|: fp32 rounding
    of S is ~1e-5 here, while the typical bugs (log2 vs ln, a missed key block of 80 in 8192)
    are >= 1e-2. Rows that see no key must be +inf exactly."""
    assert lse.dtype == torch.float32, f"{ctx}: lse dtype {lse.dtype}, expected float32"
    seen, empty = lse[:, :, empty_rows:], lse[:, :, :empty_rows]
    ref = ref32[:, :, empty_rows:].float()
    nan = int(torch.isnan(lse).sum())
    assert nan == 0, f"{ctx}: lse has {nan} of {lse.numel()} elements NaN (never written?)"
    assert torch.isfinite(seen).all(), f"{ctx}: lse is not finite in rows that see keys"
    if empty_rows:
        assert torch.isposinf(empty).all(), f"{ctx}: lse of the {empty_rows} rows that see no key is not +inf"
    if seen.numel():
        err = (seen - ref).abs()
        tol = 1e-3 + 1e-4 * ref.abs()
        worst = int(torch.argmax(err - tol))
        assert bool((err <= tol).all()), (
            f"{ctx}: lse max error {err.max().item():.3e} (at flat index {worst}: ours "
            f"{seen.flatten()[worst].item():.6f}, ref {ref.flatten()[worst].item():.6f}); "
            f"tolerance 1e-3 + 1e-4 |lse|")


def _assert_same_storage(ctx, name, returned, given):
    assert returned.data_ptr() == given.data_ptr(), f"{ctx}: {name}= was given but another tensor was returned"


def _poison_free_memory(case):
    """NaN-fill a block of the caching allocator at least the size of the backward's workspace
    and give it back, so that the workspace (torch.empty inside attention_backward) starts as
    NaN or as an earlier call's leftovers, not as fresh zeros: a dQaccum tile that the backward
    adds into without zeroing it first then shows in dq. Best effort (the allocator may pick
    another cached block, which holds leftovers too)."""
    rows = -(-case.seqlen_q // 128) * 128 * case.nheads * case.batch
    nbytes = rows * (case.headdim * 4 + 16) + (1 << 21)
    junk = torch.full((nbytes // 4,), float("nan"), device=DEVICE, dtype=torch.float32)
    del junk


def _call_poisoned(case, x, deterministic):
    """attention_forward then attention_backward, every output preallocated and NaN-filled (and
    the memory the backward's workspace comes from, _poison_free_memory)."""
    ctx = f"{case} deterministic={deterministic} seed={x.seed}"
    b, sq, h = case.batch, case.seqlen_q, case.nheads
    out, lse = _poisoned(x.q.shape, case.dtype), _poisoned((b, h, sq), torch.float32)
    out_r, lse_r = flashback.attention_forward(x.q, x.k, x.v, causal=case.causal,
                                               softmax_scale=case.softmax_scale, out=out, lse=lse)
    _assert_same_storage(ctx, "out", out_r, out)
    _assert_same_storage(ctx, "lse", lse_r, lse)
    dq, dk, dv = (_poisoned(t.shape, case.dtype) for t in (x.q, x.k, x.v))
    _poison_free_memory(case)
    grads = flashback.attention_backward(x.dout, x.q, x.k, x.v, out, lse, causal=case.causal,
                                         softmax_scale=case.softmax_scale, deterministic=deterministic,
                                         dq=dq, dk=dk, dv=dv)
    for name, returned, given in zip(("dq", "dk", "dv"), grads, (dq, dk, dv)):
        _assert_same_storage(ctx, name, returned, given)
    return ctx, out, lse, (dq, dk, dv)


# ----------------------------------------------------------------------------------------------
# Correctness against the reference

_cache = {}  # the last shape's inputs and references; its deterministic=True twin reuses them


def _inputs_and_references(case):
    if _cache.get("case") != case:
        _cache.clear()
        torch.cuda.empty_cache()
        x = _make_inputs(case)
        ref32 = _reference(x.q, x.k, x.v, x.dout, case.causal, case.softmax_scale, upcast=True)
        reflp = _reference(x.q, x.k, x.v, x.dout, case.causal, case.softmax_scale, upcast=False)
        _cache.update(case=case, x=x, ref32=ref32, reflp=reflp)
    return _cache["x"], _cache["ref32"], _cache["reflp"]


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["nondet", "det"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case, deterministic):
    if _FORCE_REFERENCE and flashback._checks.hopper_only(case.dtype, case.headdim):
        pytest.skip("runs on the Hopper kernels only (FLASHBACK_FORCE_REFERENCE is set)")
    x, (out32, lse32, g32), (outlp, _, glp) = _inputs_and_references(case)
    ctx, out, lse, grads = _call_poisoned(case, x, deterministic)
    # Every member of the family takes these (dense, aligned) inputs: the path report must say
    # the Hopper kernels ran, unless the reference is forced.
    for direction, path in (("forward", flashback.last_forward_path()),
                            ("backward", flashback.last_backward_path())):
        if _FORCE_REFERENCE:
            assert path.startswith("reference: "), f"{ctx}: the {direction} ran {path!r}"
        else:
            assert path == "sm90", f"{ctx}: the {direction} ran {path!r}, not the Hopper kernel"

    assert out.shape == x.q.shape and out.dtype == case.dtype
    assert lse.shape == (case.batch, case.nheads, case.seqlen_q)
    _check(ctx, "out", out, out32, outlp)
    _check_lse(ctx, lse, lse32, case.empty_rows)
    for name, ours, r32, rlp in zip(("dq", "dk", "dv"), grads, g32, glp):
        _check(ctx, name, ours, r32, rlp)

    n = case.empty_rows
    if n:  # rows that see no key: out = 0 and dq = 0 exactly
        assert bool((out[:, :n] == 0).all()), f"{ctx}: out is not 0 in the {n} rows that see no key"
        assert bool((grads[0][:, :n] == 0).all()), f"{ctx}: dq is not 0 in the {n} rows that see no key"


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    Case(2, 1000, 1000, 8, 2, 96, True),
    Case(2, 113, 1000, 4, 4, 80, False),
    Case(1, 17, 4095, 2, 2, 160, True),
    Case(2, 1000, 113, 4, 2, 224, True),       # empty rows
    Case(1, 300, 300, 2, 1, 32, False),
    Case(2, 113, 113, 4, 4, 96, True, dtype=torch.float16),
], ids=str)
def test_padded_headdims_match_reference(case):
    """attention() at head dims between the supported ones (zero-padded to the next): out, lse
    and the gradients through autograd within the bar, on the Hopper kernels."""
    padded = flashback._checks.padded_headdim(case.headdim)
    if _FORCE_REFERENCE and flashback._checks.hopper_only(case.dtype, padded):
        pytest.skip("runs on the Hopper kernels only (FLASHBACK_FORCE_REFERENCE is set)")
    x, (out32, lse32, g32), (outlp, _, glp) = _inputs_and_references(case)
    ctx = f"{case} (padded to {padded}) seed={x.seed}"
    leaves = [t.clone().requires_grad_() for t in (x.q, x.k, x.v)]
    out, lse = flashback.attention(*leaves, causal=case.causal, softmax_scale=case.softmax_scale,
                                   return_lse=True)
    grads = torch.autograd.grad(out, leaves, x.dout)
    for direction, path in (("forward", flashback.last_forward_path()),
                            ("backward", flashback.last_backward_path())):
        assert path == "sm90" or _FORCE_REFERENCE, f"{ctx}: the {direction} ran {path!r}"
    assert out.shape == x.q.shape and out.dtype == case.dtype
    _check(ctx, "out", out, out32, outlp)
    _check_lse(ctx, lse, lse32, case.empty_rows)
    for name, ours, r32, rlp in zip(("dq", "dk", "dv"), grads, g32, glp):
        assert ours.shape == r32.shape, f"{ctx}: {name} shape {tuple(ours.shape)}"
        _check(ctx, name, ours, r32, rlp)


# ----------------------------------------------------------------------------------------------
# Autograd, determinism, torch.compile, custom-op registration


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    Case(2, 1000, 1000, 8, 2, 256, True),
    Case(2, 1000, 1000, 8, 2, 256, False),
    Case(1, 4096, 4096, 8, 8, 256, True),
    Case(1, 4096, 4096, 4, 2, 256, False),
    Case(1, 12000, 12000, 2, 2, 256, False),  # 150 K/V blocks: more than one chunk of CTAs
    Case(1, 8191, 8191, 2, 1, 256, True),
    Case(2, 1000, 113, 4, 1, 256, True),
    Case(1, 300, 1000, 4, 4, 256, True),
    Case(2, 1000, 1000, 8, 8, 128, False),
    Case(2, 1000, 1000, 8, 2, 128, True),
    Case(1, 4096, 4096, 4, 2, 64, False),
    Case(2, 1000, 1000, 8, 2, 64, True),
    Case(1, 4096, 4096, 4, 2, 192, False),
    Case(2, 1000, 1000, 8, 2, 192, True),
    Case(1, 4096, 4096, 4, 2, 128, False, dtype=torch.float16),
], ids=str)
def test_deterministic_is_bitwise_reproducible(case):
    x = _make_inputs(case)
    ctx = f"{case} seed={x.seed}"
    out, lse = flashback.attention_forward(x.q, x.k, x.v, causal=case.causal)
    first = flashback.attention_backward(x.dout, x.q, x.k, x.v, out, lse, causal=case.causal, deterministic=True)
    path = flashback.last_backward_path()
    if not _FORCE_REFERENCE:
        assert path == "sm90", f"{ctx}: deterministic backward ran {path!r}, not the Hopper kernel"
    for _ in range(3):
        again = flashback.attention_backward(x.dout, x.q, x.k, x.v, out, lse, causal=case.causal,
                                             deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert not torch.isnan(a).any(), f"{ctx}: NaN in deterministic {name}"
            assert torch.equal(a, b), f"{ctx}: deterministic {name} differs between calls in {int((a != b).sum())} elements"


def _bits_under_env(tmp_path, variable, code):
    """Runs `code` (which saves a list of tensors to sys.argv[1]) in a fresh process with the
    environment variable `variable` set to 0 and to 1 (the library reads such switches once per
    process) and returns both lists."""
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text("import sys, torch, flashback\n" + code)
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    results = []
    for value in ("0", "1"):
        env[variable] = value
        path = tmp_path / f"out{value}.pt"
        run = subprocess.run([sys.executable, str(script), str(path)], env=env, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, f"{variable}={value}: {run.stderr[-2000:]}"
        results.append(torch.load(path))
    return results


@pytest.mark.gpu
def test_deterministic_cooperative_launches_give_the_same_bits(tmp_path):
    """FLASHBACK_DET_COOPERATIVE=1 launches the non-causal deterministic backward chunk by
    chunk; the order of the adds is the same, so the gradients must be bitwise those of the
    single launch. Both on one CTA per K/V block (FLASHBACK_BWD_PAIR=0): the chunked launches
    exist for that config only, and 12000 rows would otherwise take the 2-CTA pair without
    the switch."""
    single, coop = _bits_under_env(tmp_path, "FLASHBACK_DET_COOPERATIVE", (
        "import os\n"
        "os.environ['FLASHBACK_BWD_PAIR'] = '0'\n"
        "g = torch.Generator(device='cuda').manual_seed(1234)\n"
        "q, k, v, do = (torch.randn(1, 12000, 2, 256, generator=g, device='cuda').to(torch.bfloat16) for _ in range(4))\n"
        "out, lse = flashback.attention_forward(q, k, v)\n"
        "grads = flashback.attention_backward(do, q, k, v, out, lse, deterministic=True)\n"
        "assert flashback.last_backward_path() == 'sm90', flashback.last_backward_path()\n"
        "torch.save([t.cpu() for t in grads], sys.argv[1])\n"))
    for name, a, b in zip(("dq", "dk", "dv"), single, coop):
        assert torch.equal(a, b), f"{name}: cooperative chunk launches differ from the single launch"


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["nondet", "det"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bwd_pair_and_single_cta_agree(tmp_path, dtype, deterministic):
    """FLASHBACK_BWD_PAIR=0 runs the d = 256 backward on one CTA per K/V block (what runs short
    walks, and where no 2-CTA cluster fits), =1 in 2-CTA pairs. Causal, dK and dV are summed in
    the same order either way (each CTA walks its Q blocks in the same order, upwards, or in a
    deterministic order from the end, the same for both; the pair's upper block only
    adds causally masked steps, whose products are exact zeros, or skips them). dV = P^T dO takes
    the same 16-bit P in both, so it must be bitwise equal; the pair computes dS = P (dP - D)
    from P in 16 bits (S and dP split by role), the single CTA from P in fp32, so dK is within
    rounding, as dQ (atomics, or in the deterministic mode another fixed order). (Deterministic non-causal walks start at a shift per unit, which differs between
    the two, so there only the tests against the reference apply.) 13 K/V blocks: the last cluster's
    upper CTA lies past the keys; GQA 8 / 4: the masked steps recur mid-walk, on accumulators
    that are no longer zero. (Where no 2-CTA cluster fits, both runs take the single-CTA kernel
    and this checks nothing about the pair.)"""
    plain, paired = _bits_under_env(tmp_path, "FLASHBACK_BWD_PAIR", (
        "g = torch.Generator(device='cuda').manual_seed(4321)\n"
        f"q, do = (torch.randn(2, 1000, 8, 256, generator=g, device='cuda').to(torch.{dtype}) for _ in range(2))\n"
        f"k, v = (torch.randn(2, 1000, 4, 256, generator=g, device='cuda').to(torch.{dtype}) for _ in range(2))\n"
        "out, lse = flashback.attention_forward(q, k, v, causal=True)\n"
        f"grads = flashback.attention_backward(do, q, k, v, out, lse, causal=True, deterministic={deterministic})\n"
        "assert flashback.last_backward_path() == 'sm90', flashback.last_backward_path()\n"
        "import os\n"
        "want = 'pair' if os.environ['FLASHBACK_BWD_PAIR'] == '1' else 'single'\n"
        "assert flashback.last_backward_kernel() == want, (flashback.last_backward_kernel(), want)\n"
        "torch.save([t.cpu() for t in grads], sys.argv[1])\n"))
    dq_a, dq_b = plain[0].float(), paired[0].float()
    assert torch.isfinite(dq_a).all() and torch.isfinite(dq_b).all()
    assert (dq_a - dq_b).abs().max() <= 1e-2 * dq_a.abs().max(), "dq: the pair and one CTA per block disagree"
    dk_a, dk_b = plain[1].float(), paired[1].float()
    assert torch.isfinite(dk_a).all() and torch.isfinite(dk_b).all()
    assert (dk_a - dk_b).abs().max() <= 1e-2 * dk_a.abs().max(), "dk: the pair and one CTA per block disagree"
    assert torch.equal(plain[2], paired[2]), "dv: the pair and one CTA per block differ"


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["nondet", "det"])
def test_bwd_routes_by_query_rows_per_cta(deterministic):
    """The d = 256 backward takes the 2-CTA pair from kBwdSm90PairMinRows = 1024 query rows per
    CTA (seqlen_q x GQA group), one CTA per K/V block below; other head dims always the latter.
    (On an H100 / H200 a 2-CTA cluster of these CTAs fits; where none does the pair falls back.)"""
    g = torch.Generator(device="cuda").manual_seed(99)
    for headdim, seqlen, heads, heads_k, want in ((256, 1000, 4, 4, "single"), (256, 255, 8, 2, "single"),
                                                  (256, 256, 8, 2, "pair"), (256, 1024, 4, 4, "pair"),
                                                  (256, 3072, 4, 4, "pair"), (128, 3072, 4, 4, "single")):
        q, do = (torch.randn(1, seqlen, heads, headdim, generator=g, device="cuda").to(torch.bfloat16)
                 for _ in range(2))
        k, v = (torch.randn(1, seqlen, heads_k, headdim, generator=g, device="cuda").to(torch.bfloat16)
                for _ in range(2))
        out, lse = flashback.attention_forward(q, k, v, causal=True)
        flashback.attention_backward(do, q, k, v, out, lse, causal=True, deterministic=deterministic)
        ctx = f"d{headdim} seqlen {seqlen} heads {heads}/{heads_k}"
        assert flashback.last_backward_path() == "sm90", (ctx, flashback.last_backward_path())
        assert flashback.last_backward_kernel() == want, (ctx, flashback.last_backward_kernel())


@pytest.mark.gpu
@pytest.mark.parametrize("case,splits", [
    (Case(1, 4160, 4096, 1, 1, 256, False), True),   # 26 units, all in one partial wave; 65 Q
                                                     # blocks: parts of 33 and 32
    (Case(1, 4096, 4030, 3, 3, 256, False), True),   # 78 units, 12-21 in the last wave; 51 K/V
                                                     # blocks, so each head's last cluster has a
                                                     # ghost upper CTA
    (Case(1, 4096, 4096, 6, 3, 256, False), True),   # GQA 2: every part walks both q heads
    (Case(1, 256, 400, 16, 1, 256, False), True),    # GQA 16: 4 Q blocks make 64 steps
    (Case(1, 4096, 4096, 3, 3, 256, False, dtype=torch.float16), True),
    (Case(1, 64, 400, 64, 1, 256, False), False),    # 64 steps from one Q block: nothing to split
], ids=str)
def test_bwd_split_last_wave(case, splits):
    """split_last_wave (bwd_sm90.h; the d = 256 default config): a non-causal walk of >= 64 steps
    whose grid leaves a partial last wave of at most half the resident clusters splits it by
    query range into two parts, launched after the units before it; the parts' dV / dK partials
    meet in the workspace and the last part sums them in part order. With 104 SMs or more (an
    H100 / H200: 57-72 clusters) the `splits` shapes split whatever the exact cluster count;
    FLASHBACK_BWD_SPLIT=0 turns the split off (then they check the pair alone). Against the
    reference, and dK / dV bitwise equal over three runs with poisoned outputs and workspace."""
    if _FORCE_REFERENCE:
        pytest.skip("FLASHBACK_FORCE_REFERENCE is set")
    x, (out32, lse32, g32), (outlp, _, glp) = _inputs_and_references(case)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split_on = os.environ.get("FLASHBACK_BWD_SPLIT") != "0"
    want = "pair, last wave split" if splits and split_on else "pair"
    runs = []
    for _ in range(3):
        ctx, out, lse, grads = _call_poisoned(case, x, False)
        assert flashback.last_backward_path() == "sm90", (ctx, flashback.last_backward_path())
        kernel = flashback.last_backward_kernel()
        if sms >= 104:
            assert kernel == want, (ctx, kernel)
        else:
            assert kernel.startswith("pair"), (ctx, kernel)
        runs.append(grads)
    _check(ctx, "out", out, out32, outlp)
    for name, ours, r32, rlp in zip(("dq", "dk", "dv"), runs[0], g32, glp):
        _check(ctx, name, ours, r32, rlp)
    for r in runs[1:]:
        assert torch.equal(r[1], runs[0][1]) and torch.equal(r[2], runs[0][2]), f"{ctx}: dk/dv differ between runs"


def _attention_and_grads(fn, x, causal, return_lse):
    leaves = [t.clone().requires_grad_() for t in (x.q, x.k, x.v)]
    res = fn(*leaves, causal=causal, deterministic=True, return_lse=return_lse)
    out, lse = res if return_lse else (res, None)
    grads = torch.autograd.grad(out, leaves, x.dout)
    return out, lse, grads


@pytest.mark.gpu
def test_torch_compile_matches_eager():
    """fullgraph=True: no graph break. The second shape makes dynamo recompile with dynamic
    shapes, which runs the fake kernels on symbolic sizes. Same kernels, so the same bits."""
    torch._dynamo.reset()
    compiled = torch.compile(flashback.attention, fullgraph=True)
    for case, return_lse in ((Case(2, 1000, 1000, 8, 2, 256, True), False),
                             (Case(2, 113, 1000, 8, 2, 256, True), True)):
        x = _make_inputs(case)
        ctx = f"{case} return_lse={return_lse} seed={x.seed}"
        out_e, lse_e, grads_e = _attention_and_grads(flashback.attention, x, case.causal, return_lse)
        out_c, lse_c, grads_c = _attention_and_grads(compiled, x, case.causal, return_lse)
        assert torch.equal(out_c, out_e), f"{ctx}: compiled out differs from eager"
        if return_lse:
            assert torch.equal(lse_c, lse_e), f"{ctx}: compiled lse differs from eager"
        for name, c, e in zip(("dq", "dk", "dv"), grads_c, grads_e):
            assert torch.equal(c, e), f"{ctx}: compiled {name} differs from eager in {int((c != e).sum())} elements"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 192, 256], ids=lambda d: f"d{d}")
def test_cuda_graph_replay_matches_eager(headdim, causal):
    """A forward and a deterministic backward captured in a CUDA graph (what torch.compile's
    "reduce-overhead" mode and training loops with graphs do), replayed on fresh inputs copied
    into the static ones, give eager's bits. A host sync, a host read of device data or an
    allocation outside the graph's pool in the call would break the capture or the replay."""
    case = Case(2, 1000, 700, 8, 2, headdim, causal)
    first = _make_inputs(case)
    static = [t.clone() for t in (first.q, first.k, first.v, first.dout)]

    def step(q, k, v, dout):
        out, lse = flashback.attention_forward(q, k, v, causal=causal)
        grads = flashback.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
        return (out, lse, *grads)

    side = torch.cuda.Stream()  # warm-up off the capture stream, as torch.cuda.graph asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(*static)
    for _ in range(2):
        x = _make_inputs(case)
        ctx = f"{case} seed={x.seed}"
        for dst, src in zip(static, (x.q, x.k, x.v, x.dout)):
            dst.copy_(src)
        graph.replay()
        eager = step(x.q, x.k, x.v, x.dout)
        if not _FORCE_REFERENCE:
            assert flashback.last_forward_path() == "sm90", f"{ctx}: forward ran {flashback.last_forward_path()!r}"
            assert flashback.last_backward_path() == "sm90", f"{ctx}: backward ran {flashback.last_backward_path()!r}"
        torch.cuda.synchronize()
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), captured, eager):
            assert not torch.isnan(a).any(), f"{ctx}: NaN in the replayed {name}"
            assert torch.equal(a, b), f"{ctx}: replayed {name} differs from eager in {int((a != b).sum())} elements"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_eager_path_matches_the_op(causal):
    """Eager calls on plain tensors skip the dispatcher (ops.eager_ok); the op path (what
    torch.compile and modes see) must give the same bits: same kernels, deterministic dQ."""
    from flashback import ops

    case = Case(2, 1000, 700, 8, 2, 128, causal)
    x = _make_inputs(case)
    assert ops.eager_ok(x.q, x.k, x.v)

    def through_op(q, k, v, causal, deterministic, return_lse):
        out, lse = torch.ops.flashback.fwd(q, k, v, 1 / math.sqrt(q.shape[-1]), causal, deterministic)
        return (out, lse) if return_lse else out

    out_e, lse_e, grads_e = _attention_and_grads(flashback.attention, x, causal, True)
    out_o, lse_o, grads_o = _attention_and_grads(through_op, x, causal, True)
    assert out_e.grad_fn is not None and not lse_e.requires_grad
    assert torch.equal(out_e, out_o) and torch.equal(lse_e, lse_o)
    for name, e, o in zip(("dq", "dk", "dv"), grads_e, grads_o):
        assert torch.equal(e, o), f"{name}: eager path differs from the op in {int((e != o).sum())} elements"
    # The no-autograd entry points take the same path and give the same bits.
    out_f, lse_f = flashback.attention_forward(x.q, x.k, x.v, causal=causal)
    assert out_f.grad_fn is None and torch.equal(out_f, out_o) and torch.equal(lse_f, lse_o)
    grads_b = flashback.attention_backward(x.dout, x.q, x.k, x.v, out_f, lse_f, causal=causal,
                                           deterministic=True)
    for name, b, o in zip(("dq", "dk", "dv"), grads_b, grads_o):
        assert torch.equal(b, o), f"{name}: attention_backward differs from the op"
    # Without grad mode the eager forward records nothing.
    with torch.no_grad():
        assert flashback.attention(*(t.clone().requires_grad_() for t in (x.q, x.k, x.v))).grad_fn is None


@pytest.mark.gpu
def test_eager_path_refuses_aliasing_outputs():
    x = _make_inputs(Case(1, 128, 128, 2, 2, 128, False))
    with pytest.raises(ValueError, match="overlaps the memory of input q"):
        flashback.attention_forward(x.q, x.k, x.v, out=x.q)
    out, lse = flashback.attention_forward(x.q, x.k, x.v)
    with pytest.raises(ValueError, match="dk overlaps the memory of input k"):
        flashback.attention_backward(x.dout, x.q, x.k, x.v, out, lse, dk=x.k)


def _op_arguments(op, values):
    """Positional arguments for a custom op, picked by name from `values` in its schema's order
    (so the test follows the schema rather than repeating it)."""
    schema = op.default._schema
    missing = [a.name for a in schema.arguments if a.name not in values]
    if missing:
        pytest.fail(f"test has no value for argument(s) {missing} of {schema}")
    return tuple(values[a.name] for a in schema.arguments)


@pytest.mark.gpu
def test_opcheck():
    """torch.library.opcheck (schema and mutation annotations, fake kernel, autograd
    registration, AOT dispatch with dynamic shapes) on every flashback op, with a small shape.
    fwd gets inputs that require grad, so its autograd formula (which calls bwd) is checked too."""
    case = Case(1, 33, 70, 4, 2, 256, True)
    x = _make_inputs(case)
    b, sq, h = case.batch, case.seqlen_q, case.nheads
    out, lse = flashback.attention_forward(x.q, x.k, x.v, causal=True)
    values = dict(q=x.q, k=x.k, v=x.v, dout=x.dout, out=out, lse=lse,
                  softmax_scale=1.0 / math.sqrt(case.headdim), causal=True, deterministic=True)
    buffers = {"fwd_out": dict(out=torch.empty_like(x.q),
                               lse=torch.empty((b, h, sq), device=DEVICE, dtype=torch.float32)),
               "bwd_out": dict(dq=torch.empty_like(x.q), dk=torch.empty_like(x.k), dv=torch.empty_like(x.v))}
    names = [n for n in ("fwd", "bwd", "fwd_out", "bwd_out") if hasattr(torch.ops.flashback, n)]
    assert {"fwd", "bwd"} <= set(names), f"torch.ops.flashback has {names}, expected fwd and bwd"
    for name in names:
        op = getattr(torch.ops.flashback, name)
        vals = dict(values, **buffers.get(name, {}))
        if name == "fwd":
            vals.update({n: vals[n].detach().clone().requires_grad_() for n in ("q", "k", "v")})
        torch.library.opcheck(op, _op_arguments(op, vals))


# ----------------------------------------------------------------------------------------------
# Non-contiguous inputs (only the last dim must be contiguous)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_qkv(causal):
    """q, k, v unbound from one (b, s, 3, h, d) tensor; gradients land in the packed tensor."""
    b, s, h, d = 2, 1000, 4, 256
    seed = _new_seed()
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    qkv = _randn(gen, (b, s, 3, h, d))
    dout = _randn(gen, (b, s, h, d))
    ctx = f"packed qkv b={b} s={s} h={h} d={d} causal={causal} seed={seed}"

    def run(dtype, fn):
        leaf = qkv.detach().to(dtype).requires_grad_()
        out = fn(*leaf.unbind(2))
        out.backward(dout.to(dtype))
        return out.detach(), leaf.grad

    out, grad = run(DTYPE, lambda q, k, v: flashback.attention(q, k, v, causal=causal))
    out32, grad32 = run(torch.float32, lambda q, k, v: attention_ref(q, k, v, causal=causal, upcast=True)[0])
    outlp, gradlp = run(DTYPE, lambda q, k, v: attention_ref(q, k, v, causal=causal, upcast=False)[0])
    _check(ctx, "out", out, out32, outlp)
    for i, name in enumerate(("dq", "dk", "dv")):
        _check(ctx, name, grad[:, :, i], grad32[:, :, i], gradlp[:, :, i])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_unaligned_layout_takes_the_reference_path(causal):
    """A q that is 16-byte but not 128-byte aligned (a view at an offset of 8 elements) is valid
    input the Hopper kernels decline: it must run on the reference kernels, say so, and be right."""
    case = Case(2, 1000, 1000, 8, 2, 256, causal)
    x = _make_inputs(case)
    buf = torch.empty(x.q.numel() + 8, device=DEVICE, dtype=DTYPE)
    q_off = buf[8:].view(x.q.shape)
    q_off.copy_(x.q)
    assert q_off.data_ptr() % 128 != 0 and q_off.data_ptr() % 16 == 0
    t = Inputs(x.seed, q_off, x.k, x.v, x.dout)
    ctx, out, lse, grads = _call_poisoned(case, t, deterministic=False)
    ctx = "q at a 16-byte offset " + ctx
    for path in (flashback.last_forward_path(), flashback.last_backward_path()):
        assert path.startswith("reference: ") and "128-byte aligned" in path, f"{ctx}: path {path!r}"
    (out32, lse32, g32) = _reference(x.q, x.k, x.v, x.dout, causal, None, upcast=True)
    (outlp, _, glp) = _reference(x.q, x.k, x.v, x.dout, causal, None, upcast=False)
    _check(ctx, "out", out, out32, outlp)
    for name, ours, r32, rlp in zip(("dq", "dk", "dv"), grads, g32, glp):
        _check(ctx, name, ours, r32, rlp)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_dk_dv_are_reproducible(causal):
    """The Hopper backward sums dK and dV in registers in a fixed order: bitwise identical runs.
    dQ meets in fp32 atomics: run-to-run differences stay at rounding level."""
    case = Case(2, 1000, 1000, 8, 2, 256, causal)
    x = _make_inputs(case)
    out, lse = flashback.attention_forward(x.q, x.k, x.v, causal=causal)
    runs = [flashback.attention_backward(x.dout, x.q, x.k, x.v, out, lse, causal=causal) for _ in range(3)]
    if _FORCE_REFERENCE:
        pytest.skip("FLASHBACK_FORCE_REFERENCE is set")
    assert flashback.last_backward_path() == "sm90"
    for r in runs[1:]:
        assert torch.equal(r[1], runs[0][1]) and torch.equal(r[2], runs[0][2]), "dk/dv differ between runs"
        tol = 1e-2 * runs[0][0].float().abs().max().item()
        assert (r[0].float() - runs[0][0].float()).abs().max().item() <= tol


@pytest.mark.gpu
def test_backward_path_through_autograd():
    """The path is recorded process-wide, so it shows after autograd's own thread ran the backward."""
    q, k, v = (torch.randn(1, 300, 4, 256, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    flashback.attention(q, k, v, causal=True).sum().backward()
    assert flashback.last_backward_path() == ("reference: FLASHBACK_FORCE_REFERENCE is set"
                                              if _FORCE_REFERENCE else "sm90")
    q128, k128, v128 = (torch.randn(1, 300, 4, 128, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    flashback.attention(q128, k128, v128, causal=True).sum().backward()
    assert flashback.last_backward_path() == ("reference: FLASHBACK_FORCE_REFERENCE is set"
                                              if _FORCE_REFERENCE else "sm90")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_hopper_only_unaligned_input_is_copied(dtype):
    """fp16 and head dim 192 have no reference kernels: a q the Hopper kernels would decline (at
    a 16-byte offset) is copied to an aligned layout by the Python front, runs there, and is
    right."""
    if _FORCE_REFERENCE:
        pytest.skip("runs on the Hopper kernels only (FLASHBACK_FORCE_REFERENCE is set)")
    d = 192 if dtype == torch.bfloat16 else 128
    case = Case(2, 1000, 1000, 8, 2, d, True, dtype=dtype)
    x = _make_inputs(case)
    buf = torch.empty(x.q.numel() + 8, device=DEVICE, dtype=dtype)
    q_off = buf[8:].view(x.q.shape)
    q_off.copy_(x.q)
    assert q_off.data_ptr() % 128 != 0
    out, lse = flashback.attention_forward(q_off, x.k, x.v, causal=True)
    assert flashback.last_forward_path() == "sm90"
    grads = flashback.attention_backward(x.dout, q_off, x.k, x.v, out, lse, causal=True)
    assert flashback.last_backward_path() == "sm90"
    (out32, _, g32) = _reference(x.q, x.k, x.v, x.dout, True, None, upcast=True)
    (outlp, _, glp) = _reference(x.q, x.k, x.v, x.dout, True, None, upcast=False)
    ctx = f"{case} q at a 16-byte offset seed={x.seed}"
    _check(ctx, "out", out, out32, outlp)
    for name, ours, r32, rlp in zip(("dq", "dk", "dv"), grads, g32, glp):
        _check(ctx, name, ours, r32, rlp)


@pytest.mark.gpu
@pytest.mark.parametrize("headdim,causal,seqlen", [(128, True, 1000), (256, True, 2000), (256, False, 4095)],
                         ids=["d128-causal", "d256-causal-long", "d256-full-long"])
def test_forward_out_layouts_give_the_same_bits(headdim, causal, seqlen):
    """O leaves the forward by TMA where out's layout suits it (fwd_sm90.h, tma_store_o: these
    shapes run such configs) and by every thread otherwise. An out at a 16-byte offset (copied
    per thread) and an out that is the first half of a wider tensor (by TMA, with other strides
    in its map) must hold the bits of a plain contiguous out, and nothing may land outside."""
    if _FORCE_REFERENCE:
        pytest.skip("runs on the Hopper kernels only (FLASHBACK_FORCE_REFERENCE is set)")
    case = Case(2, seqlen, seqlen, 4, 2, headdim, causal)
    x = _make_inputs(case)
    ctx = f"{case} seed={x.seed}"
    plain, _ = flashback.attention_forward(x.q, x.k, x.v, causal=causal)
    assert flashback.last_forward_path() == "sm90", ctx
    assert not torch.isnan(plain).any(), ctx
    buf = _poisoned((x.q.numel() + 8,), DTYPE)
    offset = buf[8:].view(x.q.shape)
    assert offset.data_ptr() % 128 != 0 and offset.data_ptr() % 16 == 0
    flashback.attention_forward(x.q, x.k, x.v, causal=causal, out=offset)
    assert flashback.last_forward_path() == "sm90", ctx
    assert torch.equal(offset, plain), f"{ctx}: out at a 16-byte offset differs"
    wide = _poisoned(x.q.shape[:-1] + (2 * headdim,), DTYPE)
    half = wide[..., :headdim]
    flashback.attention_forward(x.q, x.k, x.v, causal=causal, out=half)
    assert flashback.last_forward_path() == "sm90", ctx
    assert torch.equal(half, plain), f"{ctx}: out with a row stride of {half.stride(1)} differs"
    assert torch.isnan(wide[..., headdim:]).all(), f"{ctx}: written past out's columns"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_transposed_inputs(causal):
    """q, k, v, dout stored as (b, h, s, d) and viewed as (b, s, h, d); low-level API, poisoned outputs."""
    case = Case(2, 113, 1000, 8, 2, 256, causal)
    x = _make_inputs(case)
    t = Inputs(x.seed, *(y.transpose(1, 2).contiguous().transpose(1, 2) for y in (x.q, x.k, x.v, x.dout)))
    assert not any(y.is_contiguous() for y in (t.q, t.k, t.v, t.dout))
    ctx, out, lse, grads = _call_poisoned(case, t, deterministic=False)
    ctx = "transposed inputs " + ctx
    (out32, lse32, g32) = _reference(x.q, x.k, x.v, x.dout, causal, None, upcast=True)
    (outlp, _, glp) = _reference(x.q, x.k, x.v, x.dout, causal, None, upcast=False)
    _check(ctx, "out", out, out32, outlp)
    _check_lse(ctx, lse, lse32, case.empty_rows)
    for name, ours, r32, rlp in zip(("dq", "dk", "dv"), grads, g32, glp):
        _check(ctx, name, ours, r32, rlp)
