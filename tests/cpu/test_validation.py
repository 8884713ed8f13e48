"""Bad input is refused before any launch, with an error naming the argument, what was given and
what is supported. Runs on CPU tensors (and fake CUDA tensors), so it runs in CI."""
import ctypes
import os
import pathlib
import re

import pytest
import torch

import flashback
from flashback import _checks, _lib

BF16 = torch.bfloat16


def qkv(b=2, sq=16, sk=16, h=4, hk=2, d=64, dtype=BF16, device="cpu"):
    q = torch.randn(b, sq, h, d, dtype=dtype, device=device)
    k = torch.randn(b, sk, hk, d, dtype=dtype, device=device)
    v = torch.randn(b, sk, hk, d, dtype=dtype, device=device)
    return q, k, v


def fake_mode():
    """A mode in which CUDA tensors are fake: metadata only, no GPU needed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


# --- types and dtypes --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_unsupported_dtype(name, dtype):
    t = dict(zip("qkv", qkv()))
    t[name] = t[name].to(dtype)
    with pytest.raises(TypeError, match=rf"{name} has dtype {dtype}.*supported: torch.bfloat16, torch.float16"):
        flashback.attention(t["q"], t["k"], t["v"])


def test_mixed_dtypes_name_the_odd_one():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"all inputs must have the same dtype, got .*v=torch.float16"):
        flashback.attention(q, k, v.half())


@pytest.mark.parametrize("bad", [None, 3.0, [1, 2], "q"])
def test_not_a_tensor(bad):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k must be a torch.Tensor"):
        flashback.attention(q, bad, v)


# --- shapes ------------------------------------------------------------------------------

def test_wrong_rank():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q must have 4 dims .* got 3 dims"):
        flashback.attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"v must have 4 dims .* got 5 dims"):
        flashback.attention(q, k, v[None])


def test_mismatched_batch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k and v must have the same shape"):
        flashback.attention(q, k, v[:1])
    with pytest.raises(ValueError, match=r"same batch size, got 2 and 1"):
        flashback.attention(q, k[:1], v[:1])


def test_mismatched_seqlen_of_k_and_v():
    q, k, v = qkv(sk=16)
    with pytest.raises(ValueError, match=r"k and v must have the same shape"):
        flashback.attention(q, k, v[:, :8])


def test_mismatched_headdim():
    q, _, _ = qkv(d=64)
    _, k, v = qkv(d=128)
    with pytest.raises(ValueError, match=r"same headdim, got 64 and 128"):
        flashback.attention(q, k, v)


def test_nheads_not_divisible():
    q, k, v = qkv(h=6, hk=4)
    with pytest.raises(ValueError, match=r"nheads of q \(6\) must be divisible by nheads of k and v \(4\)"):
        flashback.attention(q, k, v)


@pytest.mark.parametrize("d", [32, 80, 96, 160, 320])
def test_unsupported_headdim(d):
    """The calls without autograd take the supported head dims only, and say that the
    differentiable ones pad the others."""
    q, k, v = qkv(d=d)
    with pytest.raises(ValueError, match=rf"headdim {d} is not supported \(supported: 64, 128, 192, 256; "
                                         r"attention\(\) and attention_varlen\(\) also take 1 to 256, padded\)"):
        flashback.attention_forward(q, k, v)


@pytest.mark.parametrize("d", [257, 320])
def test_headdim_past_the_largest(d):
    q, k, v = qkv(d=d)
    with pytest.raises(ValueError, match=rf"headdim {d} is not supported \(supported: 64, 128, 192, 256, "
                                         r"and every head dim from 1 to 256, padded to the next of those\)"):
        flashback.attention(q, k, v)


def test_padded_headdim_is_the_next_supported():
    from flashback import _checks
    assert [_checks.padded_headdim(d) for d in (1, 63, 64, 65, 128, 129, 192, 193, 255, 256, 257, 0)] == \
        [64, 64, None, 128, None, 192, None, 256, 256, None, None, None]


@pytest.mark.parametrize("d", [1, 32, 80, 96, 160, 224])
def test_padded_headdims_pass_the_checks(d):
    """attention() takes the head dims between the supported ones: these CPU inputs get past
    the head-dim check to the device check."""
    q, k, v = qkv(d=d)
    with pytest.raises(ValueError, match=r"q is on device 'cpu'; flashback runs on CUDA GPUs"):
        flashback.attention(q, k, v)


@pytest.mark.parametrize("d", [80, 96, 224])
def test_padded_headdim_on_fake_cuda_tensors(d):
    """Under a fake mode (as torch.compile traces) the padded call gives out of the head dim
    given and lse as usual; varlen the same."""
    with fake_mode():
        q, k, v = qkv(b=2, sq=33, sk=17, h=8, hk=2, d=d, device="cuda")
        out, lse = flashback.attention(q, k, v, causal=True, return_lse=True)
        assert out.shape == q.shape and out.dtype == BF16 and lse.shape == (2, 8, 33)
        cu = torch.tensor([0, 5, 33], dtype=torch.int32, device="cuda")
        qv, kv, vv = (torch.empty(33, h, d, dtype=BF16, device="cuda") for h in (8, 2, 2))
        out, lse = flashback.attention_varlen(qv, kv, vv, cu, cu, 28, 28, return_lse=True)
        assert out.shape == qv.shape and lse.shape == (8, 33)


def _attention_math(q, k, v, causal=False, softmax_scale=None, deterministic=False, return_lse=True):
    """softmax(scale q k^T) v and its LSE in fp32 on (batch, seqlen, heads, d), GQA by repeat:
    a stand-in for the kernels, to check what run_padded does around them."""
    assert return_lse
    g = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(g, dim=2).float() for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) * softmax_scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), vv)
    return out.to(q.dtype), lse


@pytest.mark.parametrize("d", [1, 40, 96, 160, 224])
@pytest.mark.parametrize("causal", [False, True])
def test_run_padded_equals_the_unpadded_math(d, causal):
    """Zero columns of q and k leave q k^T as it is, those of v give zero columns of out: the
    padded call's out, LSE and gradients (through the pad and the slice) equal the math at d,
    with d's softmax scale."""
    from flashback import _checks
    torch.manual_seed(d)
    q, k, v = (t.float().requires_grad_() for t in qkv(b=2, sq=9, sk=13, h=4, hk=2, d=d))
    scale = _checks.check_scale(None, d)
    out, lse = _checks.run_padded(_attention_math, q, k, v, scale, causal=causal)
    ref_out, ref_lse = _attention_math(q, k, v, causal=causal, softmax_scale=scale)
    assert out.shape == q.shape and lse.shape == ref_lse.shape
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v), dout)
    for name, g, r in zip("qkv", grads, ref_grads):
        assert g.shape == r.shape, name
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5, msg=f"d{name}")


@pytest.mark.parametrize("sq,sk", [(0, 16), (16, 0), (0, 0)])
def test_empty_sequences(sq, sk):
    q, k, v = qkv(sq=sq, sk=sk)
    with pytest.raises(ValueError, match=r"empty sequences are not supported"):
        flashback.attention(q, k, v)


def test_empty_batch_and_heads():
    q, k, v = qkv(b=0)
    with pytest.raises(ValueError, match=r"batch must be >= 1"):
        flashback.attention(q, k, v)
    q, k, v = qkv(h=0, hk=0)
    with pytest.raises(ValueError, match=r"nheads must be >= 1"):
        flashback.attention(q, k, v)


def test_last_dim_not_contiguous():
    q, k, v = qkv()
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, headdim stride != 1
    assert qt.stride(-1) != 1
    with pytest.raises(ValueError, match=r"q must be contiguous in its last dim"):
        flashback.attention(qt, k, v)


@pytest.mark.parametrize("scale,exc", [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                       (float("inf"), ValueError), ("0.1", TypeError), (True, TypeError)])
def test_bad_softmax_scale(scale, exc):
    q, k, v = qkv()
    with pytest.raises(exc, match=r"softmax_scale"):
        flashback.attention(q, k, v, softmax_scale=scale)


# --- backward arguments ------------------------------------------------------------------

def bwd_args():
    q, k, v = qkv()
    out = torch.randn_like(q)
    dout = torch.randn_like(q)
    lse = torch.randn(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    return dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)


@pytest.mark.parametrize("name", ["out", "dout"])
def test_backward_out_and_dout_must_match_q(name):
    a = bwd_args()
    a[name] = a[name][:, :8]
    with pytest.raises(ValueError, match=rf"{name} must have the shape of q"):
        flashback.attention_backward(**a)
    a = bwd_args()
    a[name] = a[name].half()
    with pytest.raises(TypeError, match=rf"{name} must have the dtype of q \(torch.bfloat16\), got torch.float16"):
        flashback.attention_backward(**a)


def test_backward_lse_checks():
    a = bwd_args()
    a["lse"] = a["lse"].to(torch.bfloat16)
    with pytest.raises(TypeError, match=r"lse must be float32"):
        flashback.attention_backward(**a)
    a = bwd_args()
    a["lse"] = a["lse"][:, :, :8]
    with pytest.raises(ValueError, match=r"lse must have shape \(batch, nheads, seqlen_q\) = \(2, 4, 16\)"):
        flashback.attention_backward(**a)
    a = bwd_args()
    a["lse"] = a["lse"].transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(ValueError, match=r"lse must be contiguous"):
        flashback.attention_backward(**a)


@pytest.mark.parametrize("name,ref", [("dq", "q"), ("dk", "k"), ("dv", "v")])
def test_backward_preallocated_grads(name, ref):
    a = bwd_args()
    bad = torch.empty_like(a[ref])[:, :3]
    with pytest.raises(ValueError, match=rf"{name} must have the shape of {ref}"):
        flashback.attention_backward(**a, **{name: bad})


def test_forward_preallocated_outputs():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"out must have the shape of q"):
        flashback.attention_forward(q, k, v, out=torch.empty_like(q)[:, :1])
    with pytest.raises(TypeError, match=r"lse must be float32"):
        flashback.attention_forward(q, k, v, lse=torch.empty(2, 4, 16, dtype=torch.float64))


# --- devices -----------------------------------------------------------------------------

def test_cpu_tensors_are_refused():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q is on device 'cpu'; flashback runs on CUDA GPUs"):
        flashback.attention(q, k, v)
    with pytest.raises(ValueError, match=r"on device 'cpu'"):
        flashback.attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"on device 'cpu'"):
        flashback.attention_backward(**bwd_args())


def test_tensors_on_different_devices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"same device, got q on cpu, k on meta, v on cpu"):
        flashback.attention(q, k.to("meta"), v)
    a = bwd_args()
    a["lse"] = a["lse"].to("meta")
    with pytest.raises(ValueError, match=r"same device.*lse on meta"):
        flashback.attention_backward(**a)


@pytest.mark.parametrize("capability,name,expected", [
    ((8, 0), "NVIDIA A100", r"requires an sm_90 GPU \(H100/H200\), got sm_80 \(NVIDIA A100\)"),
    ((8, 9), "NVIDIA L4", r"got sm_89"),
    # sm_90a machine code runs on compute capability 9.0 only, not on newer GPUs either.
    ((10, 0), "NVIDIA B200", r"got sm_100"),
])
def test_gpu_other_than_sm90(monkeypatch, capability, name, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: name)
    _checks._device_error.cache_clear()
    try:
        with pytest.raises(ValueError, match=expected):
            _checks.check_runtime(torch.device("cuda", 0))
    finally:
        _checks._device_error.cache_clear()


def test_library_missing(monkeypatch, tmp_path):
    missing = tmp_path / "libflashback.so"
    monkeypatch.setattr(_lib, "candidate_paths", lambda: [missing])
    monkeypatch.setattr(_lib, "_lib", None)
    with pytest.raises(flashback.LibraryNotFoundError, match=r"was not found.*pip install \..*not found"):
        _lib.load()
    assert not _lib.is_loadable()
    # check_runtime reaches the library check once the GPU passes.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    _checks._device_error.cache_clear()
    try:
        with pytest.raises(flashback.LibraryNotFoundError):
            _checks.check_runtime(torch.device("cuda", 0))
    finally:
        _checks._device_error.cache_clear()


def test_library_that_is_not_a_library(monkeypatch, tmp_path):
    bogus = tmp_path / "libflashback.so"
    bogus.write_text("not an ELF file")
    monkeypatch.setattr(_lib, "candidate_paths", lambda: [bogus])
    monkeypatch.setattr(_lib, "_lib", None)
    with pytest.raises(flashback.LibraryNotFoundError, match=r"could not be loaded"):
        _lib.load()


def test_library_without_the_functions_this_package_calls(monkeypatch):
    # A shared library that loads but lacks flashback's functions (as an older libflashback.so
    # lacks the newer ones): a clear error, not an AttributeError from deep inside ctypes.
    other = pathlib.Path(torch.__file__).parent / "lib" / "libc10.so"
    if not other.is_file():
        pytest.skip(f"{other} not found")
    monkeypatch.setattr(_lib, "candidate_paths", lambda: [other])
    monkeypatch.setattr(_lib, "_lib", None)
    with pytest.raises(flashback.LibraryNotFoundError, match=r"does not match this Python package"):
        _lib.load()


def test_valid_input_passes_python_checks_on_fake_cuda_tensors():
    # Everything right, on fake CUDA tensors: all metadata checks pass and the op's fake kernel
    # gives the documented shapes (the real kernel never runs).
    with fake_mode():
        q, k, v = qkv(b=2, sq=33, sk=17, h=8, hk=2, d=256, device="cuda")
        out, lse = flashback.attention(q, k, v, causal=True, return_lse=True)
        assert out.shape == q.shape and out.dtype == BF16 and out.device.type == "cuda"
        assert lse.shape == (2, 8, 33) and lse.dtype == torch.float32
        dout = torch.empty_like(q)
        dq, dk, dv = flashback.attention_backward(dout, q, k, v, out, lse)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


# --- the C API re-checks what the kernels rely on ----------------------------------------

@pytest.fixture
def native():
    if not _lib.is_loadable():
        pytest.skip("libflashback.so is not built")
    return _lib.load()


def valid_fwd_params(d=128, b=2, sq=100, sk=80, h=4, hk=2):
    # Fake, well-aligned addresses: the C API validates before touching memory or the GPU.
    addr = iter(range(1 << 20, 1 << 30, 1 << 20))
    st_q = _lib.Strides(sq * h * d, h * d, d)
    st_k = _lib.Strides(sk * hk * d, hk * d, d)
    return _lib.FwdParams(q=next(addr), k=next(addr), v=next(addr), out=next(addr), lse=next(addr),
                          q_strides=st_q, k_strides=st_k, v_strides=st_k, out_strides=st_q,
                          batch=b, seqlen_q=sq, seqlen_k=sk, nheads=h, nheads_k=hk, headdim=d,
                          softmax_scale=0.1, causal=1, dtype=_lib.DTYPE_BF16, stream=None)


def bwd_params_like(f, dtype=0):
    """Backward params for the shapes, strides and inputs of forward params `f`, with fresh fake
    addresses for dout, dq, dk, dv and no workspace."""
    addr = iter(range(1 << 31, 1 << 33, 1 << 20))
    return _lib.BwdParams(q=f.q, k=f.k, v=f.v, out=f.out, dout=next(addr), lse=f.lse, dq=next(addr),
                          dk=next(addr), dv=next(addr), q_strides=f.q_strides, k_strides=f.k_strides,
                          v_strides=f.v_strides, out_strides=f.out_strides, dout_strides=f.q_strides,
                          dq_strides=f.q_strides, dk_strides=f.k_strides, dv_strides=f.v_strides,
                          batch=f.batch, seqlen_q=f.seqlen_q, seqlen_k=f.seqlen_k, nheads=f.nheads,
                          nheads_k=f.nheads_k, headdim=f.headdim, softmax_scale=0.1, causal=1,
                          deterministic=0, dtype=dtype, workspace=None, workspace_bytes=0, stream=None)


def call_fwd(lib, p):
    status = lib.flashback_attention_forward(ctypes.byref(p))
    return status, _lib.last_error(lib)


@pytest.mark.parametrize("mutate,status,message", [
    (lambda p: setattr(p, "q", None), 1, "q is a null pointer"),
    (lambda p: setattr(p, "lse", None), 1, "lse is a null pointer"),
    (lambda p: setattr(p, "k", p.k + 8), 1, "k must be 16-byte aligned"),
    (lambda p: setattr(p.v_strides, "row", 130), 1, "v row stride must be a non-negative multiple of 8"),
    (lambda p: setattr(p.out_strides, "head", 8), 1, "out head stride 8 overlaps other elements"),
    (lambda p: setattr(p.out_strides, "batch", 0), 1, "out batch stride 0 overlaps other elements"),
    # stride x size would wrap in int64 and pass the overlap check
    (lambda p: setattr(p.out_strides, "head", 2**63 - 8), 2, "out head stride must be at most 2^40"),
    (lambda p: setattr(p.k_strides, "batch", 2**40 + 8), 2, "k batch stride must be at most 2^40"),
    # row stride == head stride: row i+1 of head 0 is row i of head 1
    (lambda p: setattr(p.out_strides, "row", p.out_strides.head), 1, "out row stride 128 overlaps"),
    (lambda p: setattr(p, "batch", 70000), 2, "batch (70000) and nheads (4) must be at most 65535"),
    (lambda p: setattr(p, "headdim", 96), 2, "headdim 96 is not supported"),
    (lambda p: setattr(p, "dtype", 2), 2, "dtype 2 is not supported"),
    (lambda p: setattr(p, "nheads", 3), 1, "nheads (3) must be divisible by nheads_k (2)"),
    (lambda p: setattr(p, "seqlen_k", 0), 1, "seqlen_q and seqlen_k must be >= 1"),
    # Block counts round seqlen up in int: a loose varlen bound near INT_MAX would wrap them.
    (lambda p: setattr(p, "seqlen_q", 2**31 - 1), 2, "seqlen_q and seqlen_k must be at most 1073741824"),
    (lambda p: setattr(p, "seqlen_k", 2**30 + 1), 2, "seqlen_q and seqlen_k must be at most 1073741824"),
    (lambda p: setattr(p, "batch", 0), 1, "batch must be >= 1"),
    (lambda p: setattr(p, "softmax_scale", float("nan")), 1, "softmax_scale must be finite"),
])
def test_c_api_rejects(native, mutate, status, message):
    p = valid_fwd_params()
    mutate(p)
    got_status, got_message = call_fwd(native, p)
    assert (got_status, message in got_message) == (status, True), got_message


def test_c_api_valid_params_reach_the_device_check(native):
    # Valid params pass every check; on a machine without a usable sm_90 GPU the call then
    # stops at the device check, so nothing is launched at the fake addresses.
    status, message = call_fwd(native, valid_fwd_params())
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("an sm_90 GPU is present: valid params would launch")
    assert status in (2, 3), message
    assert "sm_90" in message or "cuda" in message.lower() or "device" in message.lower()


def test_c_api_null_params_and_headdims(native):
    assert native.flashback_attention_forward(None) == 1
    assert "params is a null pointer" in _lib.last_error(native)
    assert native.flashback_attention_backward(None) == 1
    assert [native.flashback_headdim_supported(d) for d in (32, 64, 96, 128, 192, 256)] == [0, 1, 0, 1, 1, 1]
    # The one predicate of the Hopper family: every head dim in bf16 (0) and fp16 (1).
    assert [native.flashback_sm90_supports(d, t) for d in (64, 128, 192, 256) for t in (0, 1)] == [1] * 8
    assert [native.flashback_sm90_supports(d, 0) for d in (32, 96, 320)] == [0, 0, 0]
    assert native.flashback_sm90_supports(128, 2) == 0
    # Some path serves: the reference kernels add nothing the family lacks.
    assert [native.flashback_supports(d, t) for d in (64, 128, 192, 256) for t in (0, 1)] == [1] * 8
    assert native.flashback_version().decode() == flashback.__version__
    # The build's commit: hex digits (a "-dirty" suffix when the tree had changes), or "unknown".
    commit = native.flashback_build_commit().decode()
    assert re.fullmatch(r"[0-9a-f]{4,40}(-dirty)?|unknown", commit), commit
    assert flashback.build_commit() == commit


def test_c_api_backward_workspace_is_checked(native):
    f = valid_fwd_params()
    p = bwd_params_like(f)
    addr = iter(range(1 << 33, 1 << 34, 1 << 20))  # beyond bwd_params_like's addresses
    need = native.flashback_bwd_workspace_size(ctypes.byref(p))
    assert need >= 4 * f.batch * f.nheads * f.seqlen_q  # at least D = rowsum(dO * O) in fp32
    assert native.flashback_attention_backward(ctypes.byref(p)) == 1
    assert "workspace of 0 bytes" in _lib.last_error(native)
    p.workspace, p.workspace_bytes = next(addr) + 16, need
    assert native.flashback_attention_backward(ctypes.byref(p)) == 1
    assert "256-byte aligned" in _lib.last_error(native)
    p.workspace = next(addr)
    p.dk_strides.row = 4
    assert native.flashback_attention_backward(ctypes.byref(p)) == 1
    assert "dk row stride" in _lib.last_error(native)


def test_c_api_declines_a_dtype_the_build_left_out(native):
    # A build with FLASHBACK_DTYPES=bf16 (or fp16) has no kernel for the other dtype: both
    # predicates say no, and a call fails with NOT_SUPPORTED and the reason before any device
    # check or launch. The default build compiles both dtypes and has nothing to decline.
    built = [d for d in (64, 128, 192, 256) if native.flashback_headdim_supported(d)]
    assert built
    left_out = [t for t in (0, 1) if not any(native.flashback_sm90_supports(d, t) for d in built)]
    if not left_out:
        pytest.skip("this build compiles bf16 and fp16 (the FLASHBACK_DTYPES default)")
    assert len(left_out) == 1, "a build compiles at least one dtype"
    t = left_out[0]
    name = {0: "bf16", 1: "fp16"}[t]
    assert [native.flashback_supports(d, t) for d in built] == [0] * len(built)
    assert all(native.flashback_sm90_supports(d, 1 - t) for d in built)
    p = valid_fwd_params(d=built[0])
    p.dtype = t
    status, message = call_fwd(native, p)
    assert (status, f"{name} not compiled in this build" in message) == (2, True), message
    b = bwd_params_like(p, dtype=t)
    assert native.flashback_bwd_workspace_size(ctypes.byref(b)) == 0
    assert native.flashback_attention_backward(ctypes.byref(b)) == 2
    assert f"{name} not compiled in this build" in _lib.last_error(native)


def test_python_struct_mirror_matches_header():
    # The header is the source of truth; a field added there and not in _lib.py would shift
    # every later field. flashback_params_sizes() guards this at load time; here we check the
    # field names too, by parsing the header.
    header = (pathlib.Path(__file__).resolve().parents[2] / "include" / "flashback" / "flashback.h").read_text()
    for struct, cls in (("flashback_fwd_params", _lib.FwdParams), ("flashback_bwd_params", _lib.BwdParams)):
        body = header.split("typedef struct {")[1:]
        body = next(b for b in body if b.split("}")[1].strip().startswith(struct))
        body = body.split("}")[0]
        import re

        decl_names = []
        for line in body.splitlines():
            line = line.split("/*")[0].strip().rstrip(";")
            if not line:
                continue
            names = line.split(None, 1)[1] if not line.startswith("const ") else line.split(None, 2)[2]
            decl_names += [re.sub(r"[*\s]", "", n) for n in names.split(",")]
        assert decl_names == [f[0] for f in cls._fields_], struct


# --- outputs that overlap themselves or the inputs; limits -------------------------------

@pytest.mark.parametrize("scale", [1e39, 1e-50, 10**400])
def test_softmax_scale_must_fit_float32(scale):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"softmax_scale must be > 0 and finite as a float32"):
        flashback.attention(q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("b,h,expected", [(70000, 1, r"batch 70000 is larger than the supported maximum 65535"),
                                          (1, 65536, r"nheads 65536 is larger than the supported maximum 65535")])
def test_grid_limits(b, h, expected):
    with fake_mode():
        q = torch.empty(b, 2, h, 64, dtype=BF16, device="cuda")
        with pytest.raises(ValueError, match=expected):
            flashback.attention(q, q, q)


def test_output_that_overlaps_itself():
    b, s, h, d = 2, 16, 4, 64
    q, k, v = qkv(b=b, sq=s, sk=s, h=h, hk=h, d=d)
    expanded = torch.empty(1, s, h, d, dtype=BF16).expand(b, s, h, d)  # batch stride 0
    with pytest.raises(ValueError, match=r"out has overlapping memory"):
        flashback.attention_forward(q, k, v, out=expanded)
    rows_on_heads = torch.empty(b * s * d + h * d, dtype=BF16).as_strided((b, s, h, d), (s * d, d, d, 1))
    with pytest.raises(ValueError, match=r"dk has overlapping memory"):
        flashback.attention_backward(**bwd_args_like(q, k, v), dk=rows_on_heads)


def bwd_args_like(q, k, v):
    lse = torch.randn(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    return dict(dout=torch.randn_like(q), q=q, k=k, v=v, out=torch.randn_like(q), lse=lse)


def test_outputs_must_not_alias_inputs():
    q, k, v = qkv()
    args = bwd_args_like(q, k, v)
    grads = dict(dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v))
    inputs = {n: args[n] for n in ("dout", "q", "k", "v", "out", "lse")}
    _checks.check_no_aliasing(grads, inputs)  # distinct buffers pass
    with pytest.raises(ValueError, match=r"dk overlaps the memory of input k"):
        _checks.check_no_aliasing(dict(grads, dk=k), inputs)
    with pytest.raises(ValueError, match=r"dv overlaps the memory of input q"):
        _checks.check_no_aliasing(dict(grads, dv=q[:, :, :2]), inputs)
    with pytest.raises(ValueError, match=r"dv and dk are the same memory"):
        _checks.check_no_aliasing(dict(grads, dv=grads["dk"]), inputs)
    # Three interleaved views of one packed gradient are fine.
    packed = torch.empty(2, 16, 3, 4, 64, dtype=BF16)
    dq, dk, dv = packed.unbind(2)
    _checks.check_no_aliasing(dict(dq=dq, dk=dk, dv=dv), dict(q=q))


def test_ops_check_their_arguments_too():
    # torch.ops.flashback.* are public: float32 or mismatched head dims must not reach a kernel.
    # On fake CUDA tensors the fake kernels reject them (so torch.compile fails at trace time).
    with fake_mode():
        q32 = torch.empty(1, 8, 2, 64, device="cuda")
        with pytest.raises(TypeError, match=r"q has dtype torch.float32"):
            torch.ops.flashback.fwd(q32, q32, q32, 0.1, False, False)
        q = torch.empty(1, 8, 2, 64, dtype=BF16, device="cuda")
        k = torch.empty(1, 8, 2, 128, dtype=BF16, device="cuda")
        with pytest.raises(ValueError, match=r"same headdim, got 64 and 128"):
            torch.ops.flashback.fwd(q, k, k, 0.1, False, False)
        with pytest.raises(ValueError, match=r"lse must have shape"):
            torch.ops.flashback.fwd_out(q, q, q, torch.empty_like(q), torch.empty(1, device="cuda"), 0.1, False)
    # The real implementations run the same checks before anything else.
    from flashback import ops

    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k has dtype torch.float32"):
        ops._launch_fwd(q, k.float(), v, torch.empty_like(q), torch.empty(2, 4, 16), 0.1, False)
    a = bwd_args_like(q, k, v)
    with pytest.raises(ValueError, match=r"lse must have shape"):
        ops._launch_bwd(a["dout"], q, k, v, a["out"], a["lse"][:, :1], torch.empty_like(q),
                        torch.empty_like(k), torch.empty_like(v), 0.1, False, False)


def test_headdim_left_out_of_the_build(monkeypatch):
    class PartialBuild:
        @staticmethod
        def flashback_headdim_supported(d):
            return int(d == 256)

        @staticmethod
        def flashback_supports(d, t):
            return int(d == 256)

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    monkeypatch.setattr(_lib, "load", lambda: PartialBuild)
    _checks._device_error.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"headdim 64 is not supported by this build of flashback \(built: 256\)"):
            _checks.check_runtime(torch.device("cuda", 0), 64)
        _checks.check_runtime(torch.device("cuda", 0), 256)
    finally:
        _checks._device_error.cache_clear()


def test_dout_may_have_any_layout():
    # out.sum().backward() hands the backward an expanded dout with all strides 0.
    a = bwd_args()
    a["dout"] = torch.ones(1, dtype=BF16).expand(a["q"].shape)
    assert a["dout"].stride() == (0, 0, 0, 0)
    _checks.check_backward_args(**a, require_cuda=False)
    a["dout"] = a["q"].transpose(-1, -2).contiguous().transpose(-1, -2)
    _checks.check_backward_args(**a, require_cuda=False)


def test_c_api_backward_path_choice(native):
    # Head dim 256 may take the Hopper backward, whose workspace also holds an fp32 dQ
    # accumulator (>= 4 * batch * nheads * seqlen_q * 256 bytes), plus, with deterministic=1,
    # the per-tile turn counters; FLASHBACK_FORCE_REFERENCE takes the atomic-free reference,
    # which needs only D. The size depends on shapes and flags only: broadcast (stride-0)
    # inputs, which run on the reference, get the same size.
    def bwd_params(deterministic, k_batch_stride=None):
        f = valid_fwd_params(d=256)
        if k_batch_stride is not None:
            f.k_strides.batch = k_batch_stride
        addr = iter(range(1 << 31, 1 << 33, 1 << 20))
        return _lib.BwdParams(q=f.q, k=f.k, v=f.v, out=f.out, dout=next(addr), lse=f.lse,
                              dq=next(addr), dk=next(addr), dv=next(addr), q_strides=f.q_strides,
                              k_strides=f.k_strides, v_strides=f.v_strides, out_strides=f.out_strides,
                              dout_strides=f.q_strides, dq_strides=f.q_strides, dk_strides=f.v_strides,
                              dv_strides=f.v_strides, batch=f.batch, seqlen_q=f.seqlen_q,
                              seqlen_k=f.seqlen_k, nheads=f.nheads, nheads_k=f.nheads_k, headdim=256,
                              softmax_scale=0.1, causal=1, deterministic=deterministic, dtype=0,
                              workspace=None, workspace_bytes=0, stream=None)

    size = lambda p: native.flashback_bwd_workspace_size(ctypes.byref(p))
    f = valid_fwd_params(d=256)
    dq_accum_bytes = 4 * f.batch * f.nheads * f.seqlen_q * 256
    if os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0"):
        assert 0 < size(bwd_params(deterministic=0)) < dq_accum_bytes
        assert 0 < size(bwd_params(deterministic=1)) < dq_accum_bytes
        return
    assert size(bwd_params(deterministic=0)) >= dq_accum_bytes
    assert size(bwd_params(deterministic=1)) > size(bwd_params(deterministic=0))
    assert size(bwd_params(deterministic=0, k_batch_stride=0)) == size(bwd_params(deterministic=0))


def test_c_api_backward_path_is_empty_before_any_backward(native):
    # Recorded only by a backward that launched; a rejected call leaves it alone.
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("an sm_90 GPU is present: an earlier test may have run a backward")
    assert native.flashback_attention_backward(None) == 1
    assert native.flashback_last_backward_path() == b""
    assert flashback.last_backward_path() == ""
    assert native.flashback_last_backward_kernel() == b""
    assert flashback.last_backward_kernel() == ""


def test_c_api_debug_timeline_validates(native):
    # A buffer needs its extent; None turns the aid off and always succeeds.
    assert native.flashback_debug_bwd_timeline(1 << 20, 0, 8) == 1
    assert b"ctas and steps must be >= 1" in native.flashback_last_error()
    assert native.flashback_debug_bwd_timeline(1 << 20, 4, -1) == 1
    assert native.flashback_debug_bwd_timeline(None, 0, 0) == 0
    assert native.flashback_last_error() == b""


def _varlen_bwd_params(batch, max_len, total, h=8, d=256):
    addr = iter(range(1 << 31, 1 << 34, 1 << 20))
    st = _lib.Strides(0, h * d, d)
    return _lib.BwdParams(q=next(addr), k=next(addr), v=next(addr), out=next(addr), dout=next(addr), lse=next(addr),
                          dq=next(addr), dk=next(addr), dv=next(addr), q_strides=st, k_strides=st, v_strides=st,
                          out_strides=st, dout_strides=st, dq_strides=st, dk_strides=st, dv_strides=st,
                          batch=batch, seqlen_q=max_len, seqlen_k=max_len, nheads=h, nheads_k=h, headdim=d,
                          softmax_scale=0.1, causal=1, deterministic=0, dtype=0, workspace=None,
                          workspace_bytes=0, stream=None, cu_seqlens_q=next(addr), cu_seqlens_k=next(addr),
                          total_q=total, total_k=total)


def test_c_api_varlen_workspace_follows_the_packed_total(native):
    """The Hopper backward's workspace (fp32 dQ tiles, 1 KB per row and head) is sized by the
    packed total plus a tile per sequence, not by batch x the longest sequence: 64 sequences
    with one of 8192 rows and 65536 rows in all need ~(65536 / 64 + 65) tiles per head."""
    if os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0"):
        pytest.skip("FLASHBACK_FORCE_REFERENCE is set")
    size = native.flashback_bwd_workspace_size(ctypes.byref(_varlen_bwd_params(64, 8192, 65536)))
    tiles = 8 * (65536 // 64 + 64 + 1)
    assert tiles * 64 * 256 * 4 <= size < 1.1 * tiles * 64 * (256 * 4 + 8) + 4096
    assert size < 64 * 8192 * 8 * 256 * 4 / 4  # far below batch x longest x heads x 1 KB


def test_c_api_workspace_size_checks_the_varlen_totals(native):
    """total_q sizes the varlen workspace: a query with a bad total gets 0 (the documented
    answer for params the call would reject), not a size computed from it; the longest
    sequence the API takes gets a size, one more row gets 0."""
    good = _varlen_bwd_params(64, 8192, 65536)
    assert native.flashback_bwd_workspace_size(ctypes.byref(good)) > 0
    for total in (0, -5):
        assert native.flashback_bwd_workspace_size(ctypes.byref(_varlen_bwd_params(64, 8192, total))) == 0
    assert native.flashback_bwd_workspace_size(ctypes.byref(_varlen_bwd_params(64, 2**30, 65536))) > 0
    assert native.flashback_bwd_workspace_size(ctypes.byref(_varlen_bwd_params(64, 2**30 + 1, 65536))) == 0


def test_c_api_backward_workspace_has_room_for_the_split_last_wave(native):
    """The d = 256 default config splits a non-causal grid's partial last wave (split_last_wave,
    bwd_sm90.h): the workspace then holds, per split unit (at most 36, kBwdSm90SplitMaxUnits)
    and CTA of its pair, one fp32 dV / dK slot (2 x 80 x 256 floats) and a count. Sized by the
    shapes alone: causal calls, the deterministic mode, walks under 64 steps (4096 query rows
    x the GQA group) and other head dims get none."""
    if os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0"):
        pytest.skip("FLASHBACK_FORCE_REFERENCE is set")
    if not native.flashback_sm90_supports(256, _lib.DTYPE_BF16):
        pytest.skip("this build has no d = 256 bf16 Hopper kernels")

    def size(causal, deterministic=0, sq=4096, h=3, hk=3, d=256, b=1):
        p = bwd_params_like(valid_fwd_params(d=d, b=b, sq=sq, sk=sq, h=h, hk=hk))
        p.causal, p.deterministic = causal, deterministic
        return native.flashback_bwd_workspace_size(ctypes.byref(p))

    def align(n):
        return -(-n // 256) * 256

    slot = 2 * 80 * 256 * 4
    for sq, h, hk, units in ((4096, 3, 3, 78), (4096, 1, 1, 26), (8192, 2, 1, 52), (4096, 6, 3, 78)):
        split = min(units, 36)
        extra = align(2 * split * 4) + align(2 * split * slot)
        assert size(0, sq=sq, h=h, hk=hk) - size(1, sq=sq, h=h, hk=hk) == extra, (sq, h, hk)
    assert size(0, deterministic=1) == size(1, deterministic=1)  # the deterministic mode never splits
    assert size(0, sq=2048, h=4, hk=4) == size(1, sq=2048, h=4, hk=4)  # 32 steps: not split
    assert size(0, sq=2048, h=4, hk=2) > size(1, sq=2048, h=4, hk=2)  # GQA 2: 64 steps
    if native.flashback_sm90_supports(128, _lib.DTYPE_BF16):
        assert size(0, d=128, h=4, hk=4) == size(1, d=128, h=4, hk=4)  # no split at d = 128


def _aligned(shape, dtype, align=128):
    """A dense tensor of `shape` whose data starts on `align` bytes."""
    n = 1
    for s in shape:
        n *= s
    buf = torch.empty(n + align, dtype=dtype)
    skip = (-buf.data_ptr() % align) // buf.element_size()
    return buf[skip:skip + n].view(shape)


def test_kernel_layout_ok_copies_what_the_tensor_maps_decline():
    """Where only the Hopper kernels serve (fp16), a broadcast stride (0) would reach a tensor
    map that declines it, with no fallback: such inputs are copied. Where the reference kernels
    stand behind (bf16, d = 64), a broadcast stays as it is."""
    from flashback import _checks
    for dtype, hopper_only in ((torch.float16, True), (torch.bfloat16, False)):
        x = _aligned((2, 128, 4, 64), dtype)
        assert _checks.hopper_only(dtype, 64) == hopper_only
        assert _checks.kernel_layout_ok(x)
        expanded = x[:, :1].expand(2, 128, 4, 64)  # seqlen stride 0
        assert expanded.stride()[1] == 0
        assert _checks.kernel_layout_ok(expanded) == (not hopper_only)
        assert _checks.kernel_layout_ok(x[:, :, :1].expand(2, 128, 4, 64)) == (not hopper_only)
