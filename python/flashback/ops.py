"""The PyTorch custom ops: flashback::fwd, fwd_out, bwd, bwd_out, and the eager fast path.

Each op is opaque to torch.compile (a fake kernel gives its output shapes), runs on the current
CUDA stream with no host synchronisation, and calls the C API through ctypes. `fwd` carries the
autograd formula, so `flashback.attention` is differentiable and compiles with fullgraph=True.
The *_out variants write into caller-provided tensors.

Eager calls on plain CUDA tensors skip the dispatcher: the custom-op wrapper and its autograd
glue cost about 90 us of host time per forward (measured on an H200 host), as much as the
kernel itself at seqlen 512, so `attention` runs `_Attention` (a torch.autograd.Function over
the same launch code) there. Under torch.compile, a dispatch or function mode (FakeTensorMode,
FlopCounterMode, ...) or with tensor subclasses the ops run as before, so tracing and modes see
flashback::fwd.
"""
from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from . import _checks, _lib


def eager_ok(*tensors: Tensor) -> bool:
    """Whether a call on these tensors may bypass the dispatcher (see the module docstring)."""
    if torch.compiler.is_compiling():
        return False
    if _dispatch_stack_len() or _function_mode_on():
        return False
    return all(type(t) is torch.Tensor and t.is_cuda for t in tensors)


# Private PyTorch queries, read once; where one is missing every call takes the op path.
_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)
_function_mode_on = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: True)


def _kernel_ready(x: Tensor) -> Tensor:
    """An input as the kernels can read it: x itself, or a contiguous copy. clone() to
    contiguous_format, not .contiguous(): the latter returns x itself when only the stride of
    a size-1 dim is odd, or when x is contiguous but starts at an unaligned offset."""
    return x if _checks.kernel_layout_ok(x) else x.clone(memory_format=torch.contiguous_format)


def _kernel_target(x: Tensor) -> Tensor:
    """An output as the kernels can write it: x itself, or a fresh buffer copied into x after."""
    return x if _checks.kernel_layout_ok(x) else torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _strides(x: Tensor) -> _lib.Strides:
    return _lib.Strides(*x.stride()[:3])


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _call(lib, fn, params, device: torch.device, what: str) -> None:
    # The launch targets the tensors' device, which need not be the current one.
    if device.index is None or device.index == torch.cuda.current_device():
        _lib.check(lib, fn(ctypes.byref(params)), what)
    else:
        with torch.cuda.device(device):
            _lib.check(lib, fn(ctypes.byref(params)), what)


def _launch_fwd(q, k, v, out, lse, softmax_scale, causal) -> None:
    # The ops are public too (torch.ops.flashback.*): they check their arguments themselves.
    _checks.check_forward_args(q, k, v, out, lse, softmax_scale)
    _checks.check_no_aliasing(dict(out=out, lse=lse), dict(q=q, k=k, v=v))
    _run_fwd(q, k, v, out, lse, softmax_scale, causal)


def _run_fwd(q, k, v, out, lse, softmax_scale, causal) -> None:
    """The launch, for arguments already checked and outputs that alias no input."""
    _checks.check_runtime(q.device, q.shape[-1], q.dtype)
    lib = _lib.load()
    q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
    dst = _kernel_target(out)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    p = _lib.FwdParams(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), out=dst.data_ptr(), lse=lse.data_ptr(),
        q_strides=_strides(q), k_strides=_strides(k), v_strides=_strides(v),
        out_strides=_strides(dst), batch=b, seqlen_q=sq, seqlen_k=sk, nheads=h, nheads_k=hk,
        headdim=d, softmax_scale=softmax_scale, causal=int(causal), dtype=_lib.dtype_code(q.dtype),
        stream=_stream(q.device))
    _call(lib, lib.flashback_attention_forward, p, q.device, "forward")
    if dst is not out:
        out.copy_(dst)


def _launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic) -> None:
    _checks.check_backward_args(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale)
    _checks.check_no_aliasing(dict(dq=dq, dk=dk, dv=dv),
                              dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse))
    _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic)


def _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic) -> None:
    """The launch, for arguments already checked (dout: any layout) and gradients that alias
    no input."""
    _checks.check_runtime(q.device, q.shape[-1], q.dtype)
    lib = _lib.load()
    dout, q, k, v, out = (_kernel_ready(x) for x in (dout, q, k, v, out))
    dsts = [_kernel_target(x) for x in (dq, dk, dv)]
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    p = _lib.BwdParams(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), out=out.data_ptr(),
        dout=dout.data_ptr(), lse=lse.data_ptr(),
        dq=dsts[0].data_ptr(), dk=dsts[1].data_ptr(), dv=dsts[2].data_ptr(),
        q_strides=_strides(q), k_strides=_strides(k), v_strides=_strides(v),
        out_strides=_strides(out), dout_strides=_strides(dout), dq_strides=_strides(dsts[0]),
        dk_strides=_strides(dsts[1]), dv_strides=_strides(dsts[2]),
        batch=b, seqlen_q=sq, seqlen_k=sk, nheads=h, nheads_k=hk, headdim=d,
        softmax_scale=softmax_scale, causal=int(causal), deterministic=int(deterministic),
        dtype=_lib.dtype_code(q.dtype), workspace=None, workspace_bytes=0, stream=_stream(q.device))
    nbytes = lib.flashback_bwd_workspace_size(ctypes.byref(p))
    # The caching allocator hands out blocks aligned to at least 512 bytes, and reusing it keeps
    # the call free of cudaMalloc (CUDA-graph safe).
    workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=q.device)
    p.workspace, p.workspace_bytes = workspace.data_ptr(), nbytes
    _call(lib, lib.flashback_attention_backward, p, q.device, "backward")
    for dst, user in zip(dsts, (dq, dk, dv)):
        if dst is not user:
            user.copy_(dst)


def _empty_lse(q: Tensor) -> Tensor:
    b, sq, h, _ = q.shape
    return torch.empty((b, h, sq), dtype=torch.float32, device=q.device)


# --- forward -------------------------------------------------------------------------------

@torch.library.custom_op("flashback::fwd", mutates_args=(), device_types="cuda")
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool,
        deterministic: bool) -> tuple[Tensor, Tensor]:
    """(out, lse). `deterministic` is unused here; the autograd formula passes it to bwd."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _empty_lse(q)
    _launch_fwd(q, k, v, out, lse, softmax_scale, causal)
    return out, lse


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, deterministic):
    _checks.check_forward_args(q, k, v, require_cuda=False)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), _empty_lse(q)


@torch.library.custom_op("flashback::fwd_out", mutates_args=("out", "lse"), device_types="cuda")
def fwd_out(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: float,
            causal: bool) -> None:
    _launch_fwd(q, k, v, out, lse, softmax_scale, causal)


@fwd_out.register_fake
def _(q, k, v, out, lse, softmax_scale, causal):
    _checks.check_forward_args(q, k, v, out, lse, require_cuda=False)
    return None


# --- backward ------------------------------------------------------------------------------

@torch.library.custom_op("flashback::bwd", mutates_args=(), device_types="cuda")
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        softmax_scale: float, causal: bool, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    _launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic)
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, deterministic):
    _checks.check_backward_args(dout, q, k, v, out, lse, require_cuda=False)
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))


@torch.library.custom_op("flashback::bwd_out", mutates_args=("dq", "dk", "dv"), device_types="cuda")
def bwd_out(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dq: Tensor,
            dk: Tensor, dv: Tensor, softmax_scale: float, causal: bool, deterministic: bool) -> None:
    _launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic)


@bwd_out.register_fake
def _(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic):
    _checks.check_backward_args(dout, q, k, v, out, lse, dq, dk, dv, require_cuda=False)
    return None


# --- autograd ------------------------------------------------------------------------------

def _fwd_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale, ctx.causal, ctx.deterministic = softmax_scale, causal, deterministic
    # The LSE is returned for inspection and carries no gradient, as in FlashAttention.
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashback.bwd(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal,
                                         ctx.deterministic)
    return dq, dk, dv, None, None, None


torch.library.register_autograd("flashback::fwd", _fwd_backward, setup_context=_fwd_setup_context)


# --- eager fast path -----------------------------------------------------------------------

def _new_fwd(q, k, v, softmax_scale, causal):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _empty_lse(q)
    _run_fwd(q, k, v, out, lse, softmax_scale, causal)
    return out, lse


class _Attention(torch.autograd.Function):
    """flashback::fwd with its autograd formula, minus the dispatcher (eager_ok inputs only)."""

    # forward without ctx plus setup_context: the form torch.func transforms (grad) accept.
    @staticmethod
    def forward(q, k, v, softmax_scale, causal, deterministic):
        return _new_fwd(q, k, v, softmax_scale, causal)

    setup_context = staticmethod(_fwd_setup_context)  # the op's, so both paths save the same

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        # Autograd hands over dout with out's shape, dtype and device; its layout may be anything
        # (_run_bwd copies what the kernels cannot read).
        dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
        _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, ctx.softmax_scale, ctx.causal, ctx.deterministic)
        return dq, dk, dv, None, None, None


def attention_eager(q, k, v, softmax_scale, causal, deterministic):
    """(out, lse) of checked eager_ok inputs: what torch.ops.flashback.fwd returns, at less host
    cost."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Attention.apply(q, k, v, softmax_scale, causal, deterministic)
    return _new_fwd(q, k, v, softmax_scale, causal)
