"""Input validation: every check raises ValueError or TypeError naming the argument, what was
given and what is supported, before anything reaches a kernel.

Shape, dtype and layout checks are pure functions of tensor metadata, so they also run on fake
tensors while torch.compile traces. The device checks (GPU architecture, library present) need
the real device and run when the op executes.
"""
from __future__ import annotations

import functools
import math

import torch

from . import _lib

SUPPORTED_HEADDIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.bfloat16,)
_DTYPE_TEXT = ", ".join(str(d) for d in SUPPORTED_DTYPES)


def _check_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}, which is not supported (supported: {_DTYPE_TEXT})")
    if x.dim() != 4:
        raise ValueError(
            f"{name} must have 4 dims (batch, seqlen, nheads, headdim), got {x.dim()} dims "
            f"with shape {tuple(x.shape)}")
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        raise ValueError(
            f"{name} must be contiguous in its last dim (headdim), got strides {tuple(x.stride())}")


def _check_same_dtype(named: dict) -> None:
    dtypes = {n: t.dtype for n, t in named.items()}
    if len(set(dtypes.values())) > 1:
        given = ", ".join(f"{n}={d}" for n, d in dtypes.items())
        raise TypeError(f"all inputs must have the same dtype, got {given}")


def _check_devices(named: dict) -> None:
    devices = {n: t.device for n, t in named.items()}
    if len(set(devices.values())) > 1:
        given = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on the same device, got {given}")
    first_name, first = next(iter(named.items()))
    if first.device.type != "cuda":
        raise ValueError(
            f"{first_name} is on device '{first.device}'; flashback runs on CUDA GPUs (sm_90) only")


def check_scale(softmax_scale, headdim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    return float(softmax_scale)


def check_qkv(q, k, v) -> tuple[int, int, int, int, int, int]:
    """Validates q, k, v; returns (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim)."""
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
    if d not in SUPPORTED_HEADDIMS:
        raise ValueError(
            f"headdim {d} is not supported (supported: {', '.join(map(str, SUPPORTED_HEADDIMS))})")
    return b, sq, sk, h, hk, d


def check_like(name: str, x, ref, ref_name: str) -> None:
    """x (an output or dout) must match ref in shape, dtype and device."""
    _check_tensor(name, x)
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


def check_devices(**named) -> None:
    _check_devices(named)


@functools.lru_cache(maxsize=None)
def _device_error(index: int) -> str | None:
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(index)
        return f"flashback requires an sm_90 GPU (H100/H200), got sm_{major}{minor} ({name}) on cuda:{index}"
    return None


def check_runtime(device: torch.device) -> None:
    """Checks that need the real device: architecture, then the native library."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    err = _device_error(index)
    if err is not None:
        raise ValueError(err)
    _lib.load()
