"""Variable-length batches, in FlashAttention's varlen layout.

    out = flashback.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, causal=True)

q is (total_q, nheads, headdim) and k, v are (total_k, nheads_k, headdim): the sequences of the
batch packed one after the other; sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1
of q (and likewise of k, v). cu_seqlens are int32 tensors of batch + 1 offsets on q's device,
starting at 0, non-decreasing (empty sequences are allowed), ending at total_q / total_k.
max_seqlen_q / max_seqlen_k are at least the longest sequence length. The LSE is
(nheads, total_q), fp32. Causal masking is bottom-right per sequence. No sequence reads or
writes another's rows.

The offsets' values are checked on the host (one small device-to-host copy, which synchronises
with the current stream, per offsets tensor and version: the layers of a model that share their
offsets pay it once; the eager backward trusts the forward's check of the offsets autograd
saved) so that bad offsets raise a clear error instead of
giving wrong answers; the custom ops (flashback::varlen_fwd, varlen_bwd) have fake kernels, so
torch.compile traces them (the value check then runs when the compiled graph executes).

Eager calls on plain CUDA tensors skip the dispatcher as flashback.attention does (see ops): the
custom-op wrapper and its autograd glue cost more host time than a short batch takes on the GPU.
They run _VarlenAttention, over the same launch code as the ops, so both give the same bits;
torch.compile, dispatch or function modes and tensor subclasses still get flashback::varlen_fwd.
"""
from __future__ import annotations

import ctypes
import weakref

import torch
from torch import Tensor

from . import _checks, _lib, ops as _ops

# The longest sequence the C API takes (its kMaxSeqlen).
MAX_SEQLEN = 1 << 30


# --- validation ----------------------------------------------------------------------------

def _check_packed(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _checks.SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}, which is not supported (supported: {_checks._DTYPE_TEXT})")
    if x.dim() != 3:
        raise ValueError(f"{name} must have 3 dims (total_tokens, nheads, headdim) in the varlen layout, "
                         f"got shape {tuple(x.shape)}")
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        raise ValueError(f"{name} must be contiguous in its last dim (headdim), got strides {tuple(x.stride())}")


def _check_offsets(name: str, cu, ref: Tensor, batch: int | None) -> int:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 offsets, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {tuple(cu.shape)}")
    if cu.device != ref.device:
        raise ValueError(f"{name} must be on the device of q ({ref.device}), got {cu.device}")
    if batch is not None and cu.shape[0] - 1 != batch:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), "
                         f"got {batch + 1} and {cu.shape[0]}")
    return cu.shape[0] - 1


def _check_max(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if value > MAX_SEQLEN:  # the C API's int, and its bound on sequence lengths
        raise ValueError(f"{name} must be at most {MAX_SEQLEN} (2**30), got {value}")
    return value


def check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale=None, require_cuda=True, pads=False):
    """Metadata checks (also on fake tensors); returns (batch, nheads, nheads_k, headdim).
    pads: the caller pads head dims between the supported ones (_checks.padded_headdim)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_packed(name, x)
    _checks._check_same_dtype({"q": q, "k": k, "v": v})
    _, h, d = q.shape
    _, hk, dk = k.shape
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if dk != d:
        raise ValueError(f"q and k must have the same headdim, got {d} and {dk}")
    if h < 1 or hk < 1 or h % hk != 0:
        raise ValueError(f"nheads of q ({h}) must be a positive multiple of nheads of k and v ({hk}) (GQA/MQA)")
    if h > _checks.MAX_HEADS:
        raise ValueError(f"nheads {h} is larger than the supported maximum {_checks.MAX_HEADS}")
    _checks.check_headdim(d, pads)
    batch = _check_offsets("cu_seqlens_q", cu_seqlens_q, q, None)
    _check_offsets("cu_seqlens_k", cu_seqlens_k, q, batch)
    if batch > _checks.MAX_BATCH:
        raise ValueError(f"batch {batch} is larger than the supported maximum {_checks.MAX_BATCH}")
    _check_max("max_seqlen_q", max_seqlen_q)
    _check_max("max_seqlen_k", max_seqlen_k)
    _checks.check_scale(softmax_scale, d)
    _checks._check_devices({"q": q, "k": k, "v": v}, require_cuda)
    return batch, h, hk, d


def check_offset_values(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, total_q: int, total_k: int,
                        max_seqlen_q: int, max_seqlen_k: int) -> None:
    """The offsets' values: first 0, non-decreasing, last = total, no sequence longer than
    max_seqlen. Reads them on the host, once per offsets tensor and version (_offset_facts)."""
    for name, cu, total, mx, mx_name in (("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q, "max_seqlen_q"),
                                         ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k, "max_seqlen_k")):
        last, longest = _offset_facts(name, cu)
        if last != total:
            raise ValueError(f"{name} must end at the number of rows ({total}), got {last}")
        if longest > mx:
            raise ValueError(f"{mx_name} ({mx}) is smaller than the longest sequence ({longest}) "
                             f"in {name}")


# Offsets tensors whose values were read and found well-formed: id -> (weak reference, version
# counter, data pointer, last offset, longest sequence). A model passes the same offsets to
# every layer, and each read waits for the stream: one read per tensor and version instead of
# one per call. An in-place write bumps the version and forces a new read; a tensor that has
# died is never matched (its weak reference is dead), whatever reuses its id or memory.
_OFFSET_FACTS: dict = {}
_OFFSET_FACTS_MAX = 16


def _offset_facts(name: str, cu: Tensor) -> tuple[int, int]:
    """(last offset, longest sequence) of well-formed offsets (first 0, non-decreasing), read on
    the host unless this tensor at this version was read before; raises on malformed ones."""
    try:
        key = (cu._version, cu.data_ptr())
    except RuntimeError:  # inference tensors keep no version counter: always read
        key = None
    hit = _OFFSET_FACTS.get(id(cu)) if key is not None else None
    if hit is not None and hit[0]() is cu and hit[1] == key:
        return hit[2]
    vals = cu.tolist()
    if vals[0] != 0:
        raise ValueError(f"{name} must start at 0, got {vals[0]}")
    lengths = [b - a for a, b in zip(vals, vals[1:])]
    bad = next((i for i, n in enumerate(lengths) if n < 0), None)
    if bad is not None:
        raise ValueError(f"{name} must be non-decreasing: entry {bad + 1} ({vals[bad + 1]}) is smaller "
                         f"than entry {bad} ({vals[bad]})")
    facts = (vals[-1], max(lengths, default=0))
    if key is not None:
        if len(_OFFSET_FACTS) >= _OFFSET_FACTS_MAX:
            _OFFSET_FACTS.pop(next(iter(_OFFSET_FACTS)))  # the oldest entry
        _OFFSET_FACTS[id(cu)] = (weakref.ref(cu), key, facts)
    return facts


# --- launches ------------------------------------------------------------------------------

def _ready(x: Tensor) -> Tensor:
    return x if _checks.kernel_layout_ok(x) else x.clone(memory_format=torch.contiguous_format)


def _strides(x: Tensor) -> _lib.Strides:
    return _lib.Strides(0, x.stride(0), x.stride(1))  # no batch dim: rows are packed


def _common(q, k, cu_q, cu_k, max_q, max_k):
    return dict(batch=cu_q.shape[0] - 1, seqlen_q=max_q, seqlen_k=max_k, nheads=q.shape[1],
                nheads_k=k.shape[1], headdim=q.shape[2], cu_seqlens_q=cu_q.data_ptr(),
                cu_seqlens_k=cu_k.data_ptr(), total_q=q.shape[0], total_k=k.shape[0],
                dtype=_lib.dtype_code(q.dtype), stream=torch.cuda.current_stream(q.device).cuda_stream)


def _launch_fwd(q, k, v, cu_q, cu_k, max_q, max_k, out, lse, scale, causal) -> None:
    lib = _lib.load()
    q, k, v = _ready(q), _ready(k), _ready(v)
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    p = _lib.FwdParams(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), out=out.data_ptr(),
                       lse=lse.data_ptr(), q_strides=_strides(q), k_strides=_strides(k),
                       v_strides=_strides(v), out_strides=_strides(out), softmax_scale=scale,
                       causal=int(causal), **_common(q, k, cu_q, cu_k, max_q, max_k))
    _ops._call(lib, lib.flashback_attention_forward, p, q.device, "varlen forward")


def _launch_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, scale, causal,
                deterministic) -> None:
    lib = _lib.load()
    dout, q, k, v, out = (_ready(x) for x in (dout, q, k, v, out))
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    p = _lib.BwdParams(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), out=out.data_ptr(),
                       dout=dout.data_ptr(), lse=lse.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(),
                       dv=dv.data_ptr(), q_strides=_strides(q), k_strides=_strides(k),
                       v_strides=_strides(v), out_strides=_strides(out),
                       dout_strides=_strides(dout), dq_strides=_strides(dq),
                       dk_strides=_strides(dk), dv_strides=_strides(dv), softmax_scale=scale,
                       causal=int(causal), deterministic=int(deterministic), workspace=None,
                       workspace_bytes=0, **_common(q, k, cu_q, cu_k, max_q, max_k))
    nbytes = lib.flashback_bwd_workspace_size(ctypes.byref(p))
    workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=q.device)
    p.workspace, p.workspace_bytes = workspace.data_ptr(), nbytes
    _ops._call(lib, lib.flashback_attention_backward, p, q.device, "varlen backward")


def _run_fwd(q, k, v, cu_q, cu_k, max_q, max_k, out, lse, scale, causal) -> None:
    """Into out and lse, for arguments whose metadata, offset values and device are checked."""
    if q.shape[0] == 0:
        return
    if k.shape[0] == 0:  # no keys anywhere: every row sees none
        out.zero_()
        lse.fill_(float("inf"))
        return
    _launch_fwd(q, k, v, cu_q, cu_k, max(max_q, 1), max(max_k, 1), out, lse, scale, causal)


def _run_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, scale, causal,
             deterministic) -> None:
    """Into dq, dk and dv, for arguments checked as for _run_fwd."""
    if q.shape[0] == 0 or k.shape[0] == 0:  # no query sees a key: all gradients are 0
        for g in (dq, dk, dv):
            g.zero_()
        return
    _launch_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max(max_q, 1), max(max_k, 1), dq, dk, dv, scale,
                causal, deterministic)


def _outputs_fwd(q):
    total_q, h, _ = q.shape
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty((h, total_q), dtype=torch.float32, device=q.device))


def _varlen_forward_impl(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
    """(out, lse) of arguments whose metadata is checked. The checks left need the offsets'
    values and the real device, so they run here, on every path that launches."""
    check_offset_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)
    _checks.check_runtime(q.device, q.shape[-1], q.dtype)
    out, lse = _outputs_fwd(q)
    _run_fwd(q, k, v, cu_q, cu_k, max_q, max_k, out, lse, scale, causal)
    return out, lse


def _varlen_backward_impl(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal,
                          deterministic, check_offsets=True):
    """(dq, dk, dv) of arguments whose metadata is checked (see _varlen_forward_impl).
    check_offsets=False: the offsets are the ones the forward checked, saved by autograd (whose
    version check refuses them if they were modified in place since), so their values need no
    second device-to-host read."""
    if check_offsets:
        check_offset_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)
    _checks.check_runtime(q.device, q.shape[-1], q.dtype)
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    _run_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, scale, causal, deterministic)
    return dq, dk, dv


# --- custom ops ----------------------------------------------------------------------------

@torch.library.custom_op("flashback::varlen_fwd", mutates_args=(), device_types="cuda")
def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
               deterministic: bool) -> tuple[Tensor, Tensor]:
    """(out, lse (nheads, total_q)). `deterministic` is for the autograd formula."""
    # The op is public (torch.ops.flashback.varlen_fwd): it checks its arguments itself.
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale)
    return _varlen_forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                softmax_scale, causal)


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic):
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                      require_cuda=False)
    return _outputs_fwd(q)


@torch.library.custom_op("flashback::varlen_bwd", mutates_args=(), device_types="cuda")
def varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: float, causal: bool, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale)
    _check_bwd_like(dout, out, lse, q)
    return _varlen_backward_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, softmax_scale, causal, deterministic)


def _check_bwd_like(dout, out, lse, q) -> None:
    for name, x in (("out", out), ("dout", dout)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(q.shape) or x.dtype != q.dtype:
            raise ValueError(f"{name} must be a tensor of q's shape {tuple(q.shape)} and dtype {q.dtype}")
    if (not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32
            or tuple(lse.shape) != (q.shape[1], q.shape[0]) or not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 tensor of shape (nheads, total_q) = "
                         f"{(q.shape[1], q.shape[0])}")


@varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      causal, deterministic):
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                      require_cuda=False)
    _check_bwd_like(dout, out, lse, q)
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, scale, causal, deterministic)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, scale, causal, deterministic = ctx.args
    dq, dk, dv = torch.ops.flashback.varlen_bwd(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k, max_q,
                                                max_k, scale, causal, deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None


torch.library.register_autograd("flashback::varlen_fwd", _backward, setup_context=_setup_context)


# --- eager fast path -----------------------------------------------------------------------

class _VarlenAttention(torch.autograd.Function):
    """flashback::varlen_fwd with its autograd formula, minus the dispatcher (eager_ok inputs
    whose metadata attention_varlen has checked)."""

    # forward without ctx plus setup_context: the form torch.func transforms (grad) accept.
    @staticmethod
    def forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, deterministic):
        return _varlen_forward_impl(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal)

    setup_context = staticmethod(_setup_context)  # the op's, so both paths save the same

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        max_q, max_k, scale, causal, deterministic = ctx.args
        # Autograd hands over dout with out's shape, dtype and device, which is what varlen_bwd's
        # own metadata check would confirm; contiguous() as the op path's formula does, so both
        # paths launch on the same tensors.
        dq, dk, dv = _varlen_backward_impl(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k, max_q,
                                           max_k, scale, causal, deterministic, check_offsets=False)
        return dq, dk, dv, None, None, None, None, None, None, None


def _attention_varlen_eager(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, deterministic):
    """(out, lse) of checked eager_ok inputs: what torch.ops.flashback.varlen_fwd returns, at
    less host cost."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _VarlenAttention.apply(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, deterministic)
    return _varlen_forward_impl(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal)


# --- public API ----------------------------------------------------------------------------

def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     softmax_scale: float | None = None, deterministic: bool = False,
                     return_lse: bool = False):
    """Differentiable attention over a packed variable-length batch (module docstring). Returns
    out (total_q, nheads, headdim), or (out, lse) with lse (nheads, total_q) when return_lse.
    Head dims 1-256 without a kernel of their own run zero-padded, as in attention()."""
    d = check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          softmax_scale, pads=True)[-1]
    scale = _checks.check_scale(softmax_scale, d)
    if _checks.padded_headdim(d):
        out, lse = _checks.run_padded(attention_varlen, q, k, v, scale, cu_seqlens_q, cu_seqlens_k,
                                      max_seqlen_q, max_seqlen_k, causal=causal, deterministic=deterministic)
        return (out, lse) if return_lse else out
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale,
            bool(causal), bool(deterministic))
    if _ops.eager_ok(q, k, v, cu_seqlens_q, cu_seqlens_k):
        out, lse = _attention_varlen_eager(*args)
    else:  # torch.compile, modes, subclasses: the op, which they see and trace
        out, lse = torch.ops.flashback.varlen_fwd(*args)
    return (out, lse) if return_lse else out
