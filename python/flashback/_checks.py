"""Input validation: every check raises ValueError or TypeError naming the argument, what was
given and what is supported, before anything reaches a kernel.

Shape, dtype and layout checks are pure functions of tensor metadata, so they also run on fake
tensors while torch.compile traces. The device checks (GPU architecture, library present) need
the real device and run when the op executes.
"""
from __future__ import annotations

import ctypes
import functools
import math

import torch

from . import _lib

SUPPORTED_HEADDIMS = (64, 128, 192, 256)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
# What the reference kernels (the fallback for layouts the Hopper kernels decline) serve; the
# rest runs on the Hopper kernels only, so its inputs are copied to a layout those take.
REFERENCE_HEADDIMS = (64, 128, 256)
REFERENCE_DTYPES = (torch.bfloat16,)


# The differentiable calls (attention, attention_varlen and the flash-attn interfaces on them)
# also take the head dims between, up to the largest, as FlashAttention does: zero-padded to the
# next supported one (zero columns of q and k add nothing to q k^T, those of v give zero columns
# of out, sliced off; the gradients' padded columns are dropped by the pad's backward), at the
# padded head dim's cost.
MAX_PADDED_HEADDIM = SUPPORTED_HEADDIMS[-1]


def padded_headdim(d: int) -> int | None:
    """The supported head dim that a head dim d between the supported ones runs at, or None
    (d supported itself, or out of range)."""
    if d in SUPPORTED_HEADDIMS or not 1 <= d <= MAX_PADDED_HEADDIM:
        return None
    return next(s for s in SUPPORTED_HEADDIMS if s > d)


def check_headdim(d: int, pads: bool) -> None:
    """Raises unless head dim d has a kernel, or (pads: the caller pads) padded_headdim takes it."""
    if d in SUPPORTED_HEADDIMS or (pads and padded_headdim(d)):
        return
    supported = ", ".join(map(str, SUPPORTED_HEADDIMS))
    if pads:
        raise ValueError(f"headdim {d} is not supported (supported: {supported}, and every head dim "
                         f"from 1 to {MAX_PADDED_HEADDIM}, padded to the next of those)")
    raise ValueError(f"headdim {d} is not supported (supported: {supported}; attention() and "
                     f"attention_varlen() also take 1 to {MAX_PADDED_HEADDIM}, padded)")


def run_padded(fn, q, k, v, scale: float, *args, **kwargs):
    """(out, lse) of fn (attention or attention_varlen) on q, k, v zero-padded from their head
    dim to padded_headdim's, with the softmax scale of the head dim given; out sliced back."""
    d = q.shape[-1]
    pad = padded_headdim(d) - d
    qp, kp, vp = (torch.nn.functional.pad(x, (0, pad)) for x in (q, k, v))
    out, lse = fn(qp, kp, vp, *args, softmax_scale=scale, return_lse=True, **kwargs)
    return out.narrow(-1, 0, d), lse


def hopper_only(dtype: torch.dtype, headdim: int) -> bool:
    return dtype not in REFERENCE_DTYPES or headdim not in REFERENCE_HEADDIMS


def kernel_layout_ok(x) -> bool:
    """The kernels can access x (4-D dense or 3-D packed) where it lies: last dim contiguous,
    16-byte aligned base and the other strides in multiples of 8 elements; for what only the
    Hopper kernels serve (fp16, head dim 192), 128-byte aligned and positive multiples of 64
    elements below 2^39 (what their tensor maps take: a broadcast stride of 0 is copied), since
    there is no fallback for layouts they decline."""
    if hopper_only(x.dtype, x.shape[-1]):
        return (x.data_ptr() % 128 == 0 and x.stride(-1) == 1
                and all(0 < s < 2**39 and s % 64 == 0 for s in x.stride()[:-1]))
    return x.data_ptr() % 16 == 0 and x.stride(-1) == 1 and all(s % 8 == 0 for s in x.stride()[:-1])
# The kernels put heads and batch in grid dims y and z, which CUDA caps at 65535.
MAX_BATCH = MAX_HEADS = 65535
_DTYPE_TEXT = ", ".join(str(d) for d in SUPPORTED_DTYPES)


def _check_tensor(name: str, x, last_dim_contiguous: bool = True) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}, which is not supported (supported: {_DTYPE_TEXT})")
    if x.dim() != 4:
        raise ValueError(
            f"{name} must have 4 dims (batch, seqlen, nheads, headdim), got {x.dim()} dims "
            f"with shape {tuple(x.shape)}")
    if last_dim_contiguous and x.stride(-1) != 1 and x.shape[-1] > 1:
        raise ValueError(
            f"{name} must be contiguous in its last dim (headdim), got strides {tuple(x.stride())}")


def _check_same_dtype(named: dict) -> None:
    dtypes = {n: t.dtype for n, t in named.items()}
    if len(set(dtypes.values())) > 1:
        given = ", ".join(f"{n}={d}" for n, d in dtypes.items())
        raise TypeError(f"all inputs must have the same dtype, got {given}")


def _check_devices(named: dict, require_cuda: bool = True) -> None:
    devices = {n: t.device for n, t in named.items()}
    if len(set(devices.values())) > 1:
        given = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on the same device, got {given}")
    first_name, first = next(iter(named.items()))
    if require_cuda and first.device.type != "cuda":
        raise ValueError(
            f"{first_name} is on device '{first.device}'; flashback runs on CUDA GPUs (sm_90) only")


def check_scale(softmax_scale, headdim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    # The kernels take a float32: check the value they will see, not the Python float.
    try:
        as_f32 = ctypes.c_float(float(softmax_scale)).value
    except OverflowError:
        as_f32 = math.inf
    if not (0.0 < as_f32 < math.inf):
        raise ValueError(
            f"softmax_scale must be > 0 and finite as a float32, got {softmax_scale}")
    return float(softmax_scale)


def check_qkv(q, k, v, pads: bool = False) -> tuple[int, int, int, int, int, int]:
    """Validates q, k, v; returns (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim).
    pads: the caller pads head dims between the supported ones (padded_headdim)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    _check_same_dtype({"q": q, "k": k, "v": v})
    b, sq, h, d = q.shape
    bk, sk, hk, dk = k.shape
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if bk != b:
        raise ValueError(f"q and k must have the same batch size, got {b} and {bk}")
    if dk != d:
        raise ValueError(f"q and k must have the same headdim, got {d} and {dk}")
    if b < 1:
        raise ValueError(f"batch must be >= 1, got q of shape {tuple(q.shape)}")
    if sq < 1 or sk < 1:
        raise ValueError(
            f"empty sequences are not supported: seqlen_q={sq}, seqlen_k={sk} (both must be >= 1)")
    if h < 1 or hk < 1:
        raise ValueError(f"nheads must be >= 1, got q nheads {h} and k nheads {hk}")
    if h % hk != 0:
        raise ValueError(
            f"nheads of q ({h}) must be divisible by nheads of k and v ({hk}) (GQA/MQA)")
    if b > MAX_BATCH:
        raise ValueError(f"batch {b} is larger than the supported maximum {MAX_BATCH}")
    if h > MAX_HEADS:
        raise ValueError(f"nheads {h} is larger than the supported maximum {MAX_HEADS}")
    check_headdim(d, pads)
    return b, sq, sk, h, hk, d


def check_like(name: str, x, ref, ref_name: str, last_dim_contiguous: bool = True) -> None:
    """x (an output or dout) must match ref in shape and dtype."""
    _check_tensor(name, x, last_dim_contiguous)
    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(f"{name} must have the shape of {ref_name} {tuple(ref.shape)}, got {tuple(x.shape)}")
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {x.dtype}")


def check_lse(name: str, lse, b: int, h: int, sq: int) -> None:
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(lse).__name__}")
    if lse.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {lse.dtype}")
    if tuple(lse.shape) != (b, h, sq):
        raise ValueError(f"{name} must have shape (batch, nheads, seqlen_q) = {(b, h, sq)}, got {tuple(lse.shape)}")
    if not lse.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tuple(lse.stride())}")


def check_output_layout(name: str, x) -> None:
    """An output written by many CTAs at once must not have two indices on one element."""
    dims = sorted((x.stride(i), x.shape[i]) for i in range(x.dim()) if x.shape[i] > 1)
    reach = 1  # elements spanned by the dims inside the current one
    for stride, size in dims:
        if stride < reach:
            raise ValueError(
                f"{name} has overlapping memory (shape {tuple(x.shape)}, strides "
                f"{tuple(x.stride())}): an output must give every element its own address")
        reach = stride * size


def check_forward_args(q, k, v, out=None, lse=None, softmax_scale=None, require_cuda=True, pads=False):
    """All metadata checks of a forward call; returns (batch, seqlen_q, seqlen_k, nheads,
    nheads_k, headdim). Runs on fake tensors too (no data access). The fake kernels pass
    require_cuda=False: the ops' dispatch already limits the real kernels to CUDA."""
    dims = check_qkv(q, k, v, pads)
    b, sq, _, h, _, _ = dims
    named = dict(q=q, k=k, v=v)
    if out is not None:
        check_like("out", out, q, "q")
        check_output_layout("out", out)
        named["out"] = out
    if lse is not None:
        check_lse("lse", lse, b, h, sq)
        named["lse"] = lse
    check_scale(softmax_scale, dims[-1])
    _check_devices(named, require_cuda)
    return dims


def check_backward_args(dout, q, k, v, out, lse, dq=None, dk=None, dv=None, softmax_scale=None,
                        require_cuda=True):
    """All metadata checks of a backward call (see check_forward_args)."""
    dims = check_qkv(q, k, v)
    b, sq, _, h, _, _ = dims
    check_like("out", out, q, "q")
    # Autograd hands over dout in whatever layout the loss produced (out.sum() gives an
    # all-zero-stride broadcast), so any dout is taken and copied when the kernels need it.
    check_like("dout", dout, q, "q", last_dim_contiguous=False)
    check_lse("lse", lse, b, h, sq)
    named = dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse)
    for name, grad, ref, ref_name in (("dq", dq, q, "q"), ("dk", dk, k, "k"), ("dv", dv, v, "v")):
        if grad is not None:
            check_like(name, grad, ref, ref_name)
            check_output_layout(name, grad)
            named[name] = grad
    check_scale(softmax_scale, dims[-1])
    _check_devices(named, require_cuda)
    return dims


def _byte_range(x):
    if x.numel() == 0:
        return (0, 0)
    span = sum((size - 1) * stride for size, stride in zip(x.shape, x.stride())) + 1
    start = x.data_ptr()
    return start, start + span * x.element_size()


def check_no_aliasing(outputs: dict, inputs: dict) -> None:
    """Outputs must not share memory with inputs (other CTAs still read them while an output
    is written: e.g. dk written over k changes the dQ computed from k afterwards), nor start at
    the same address as another output. Outputs may interleave without overlapping, as the
    three views of one packed (batch, seqlen, 3, heads, headdim) gradient do. Needs real
    tensors (data pointers), so it runs when the op executes, not while tracing."""
    for oname, o in outputs.items():
        o0, o1 = _byte_range(o)
        for iname, i in inputs.items():
            i0, i1 = _byte_range(i)
            if o0 < i1 and i0 < o1:
                raise ValueError(f"{oname} overlaps the memory of input {iname}: outputs must not alias inputs")
    ptrs = {}
    for oname, o in outputs.items():
        if o.data_ptr() in ptrs:
            raise ValueError(f"{oname} and {ptrs[o.data_ptr()]} are the same memory: each output needs its own")
        ptrs[o.data_ptr()] = oname


@functools.lru_cache(maxsize=None)
def _device_error(index: int) -> str | None:
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(index)
        return f"flashback requires an sm_90 GPU (H100/H200), got sm_{major}{minor} ({name}) on cuda:{index}"
    return None


@functools.lru_cache(maxsize=None)
def _build_error(lib, headdim: int, dtype_code: int | None) -> str | None:
    """Why this build of the library cannot take the head dim (and dtype), or None. Cached per
    library object: the answer is fixed at build time, and asking costs two foreign calls."""
    if not lib.flashback_headdim_supported(headdim):
        built = [d for d in SUPPORTED_HEADDIMS if lib.flashback_headdim_supported(d)]
        return (f"headdim {headdim} is not supported by this build of flashback "
                f"(built: {', '.join(map(str, built)) or 'none'})")
    if dtype_code is not None and not lib.flashback_supports(headdim, dtype_code):
        dtype = torch.float16 if dtype_code == _lib.DTYPE_FP16 else torch.bfloat16
        return f"headdim {headdim} in {dtype} is not supported by this build of flashback"
    return None


def check_runtime(device: torch.device, headdim: int | None = None, dtype: torch.dtype | None = None) -> None:
    """Checks that need the real device: architecture, then the native library, then whether
    this build of it has the head dim (builds may leave head dims out)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    err = _device_error(index)
    if err is not None:
        raise ValueError(err)
    lib = _lib.load()
    if headdim is not None:
        err = _build_error(lib, headdim, None if dtype is None else _lib.dtype_code(dtype))
        if err is not None:
            raise ValueError(err)
