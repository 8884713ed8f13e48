"""flashback as the kernels behind PyTorch's SDPA flash-attention backend (opt-in).

    import flashback, torch
    torch.nn.attention.activate_flash_attention_impl("flashback")
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # flashback
    torch.nn.attention.restore_flash_attention_impl()                                  # PyTorch's

Importing flashback only registers the name "flashback" (PyTorch >= 2.10 has the registry);
nothing changes until the user activates it. Activation overrides the CUDA kernels of
`aten::_scaled_dot_product_flash_attention` and its backward. A call goes to flashback only when
flashback serves it (a dtype and head dim flashback's argument checks accept and this build has,
no dropout, no debug mask, an sm_90 GPU, TMA-addressable layouts); every other call falls
through to the kernel PyTorch had before, unchanged. The lower-level
`aten::_flash_attention_forward` / `_backward` (dense (b, s, h, d) or packed with offsets, the
route of `torch.nn.attention.varlen.varlen_attn`) are overridden the same way where this PyTorch
has them (a window of (-1, 0) is causal masking, as varlen_attn asks for it); a sliding window,
seqused_k, ALiBi and paged KV fall through.

Routing (_Routing): SDPA picks a backend in C++ from a global priority order before any of these
ops runs, and on H100/H200 PyTorch puts cuDNN ahead of flash, so a plain SDPA call would never
reach the flash op. On an sm_90 GPU activation therefore moves FLASH_ATTENTION to the front of
the order, leaving the other backends in their order and every enable flag as it is; removing
the provider puts the saved order back. A call PyTorch's flash backend cannot take skips it and
lands where it did before (the rest of the order is unchanged); a call it takes but flashback
declines runs PyTorch's own flash kernel, where cuDNN may have run it before.

Semantics: the flash op's is_causal is aligned bottom-right when seqlen_q != seqlen_k (SDPA itself
only picks the flash backend for causal when they are equal), as in flashback. The LSE is float32
(batch, heads, seqlen_q), natural log; the RNG outputs are the zero tensors PyTorch returns when
dropout is 0.
"""
from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor

NAME = "flashback"

_FWD_OP = "_scaled_dot_product_flash_attention"
_BWD_OP = "_scaled_dot_product_flash_attention_backward"
# The lower-level flash ops: (b, s, h, d) tensors, or packed (total, h, d) ones with cumulative
# offsets (what torch.nn.attention.varlen.varlen_attn calls).
_FLASH_FWD_OP = "_flash_attention_forward"
_FLASH_BWD_OP = "_flash_attention_backward"


def _bshd(x: Tensor) -> Tensor:
    """An SDPA tensor (batch, heads, seqlen, dim) as flashback's (batch, seqlen, heads, dim) view."""
    return x.transpose(1, 2)


def _tma_ok(x: Tensor) -> bool:
    """What the Hopper kernels take without falling back (csrc/sm90/sm90_common.h): 128-byte
    aligned base, strides (batch, row, head) positive multiples of 64 elements, last dim
    contiguous. x in flashback's (batch, seqlen, heads, dim) order."""
    if x.data_ptr() % 128 != 0 or x.stride(-1) != 1:
        return False
    return all(0 < s < 2**39 and s % 64 == 0 for s in x.stride()[:3])


class _Backend:
    """What the overrides call. The CUDA one launches flashback's kernels; tests substitute a
    stand-in to exercise the dispatch on machines without a GPU."""

    def device_ok(self, x: Tensor) -> bool:
        return x.is_cuda and _sm90_with_flashback(x.device.index if x.device.index is not None
                                                  else torch.cuda.current_device())

    def layout_ok(self, x: Tensor) -> bool:
        return _tma_ok(x)

    def accepts(self, q: Tensor, k: Tensor, v: Tensor, scale) -> str | None:
        """flashback's own argument checks (flashback order), as a reason instead of an error:
        what they reject (a scale <= 0, grid limits, a build without the head dim, ...) goes to
        PyTorch rather than failing."""
        from . import _checks

        try:
            _checks.check_forward_args(q, k, v, softmax_scale=scale)
            _checks.check_runtime(q.device, q.shape[-1], q.dtype)
        except (TypeError, ValueError, RuntimeError) as e:
            return f"flashback rejects it ({e})"
        return None

    def forward(self, q, k, v, out, lse, scale, causal) -> None:
        """For q, k, v and scale that `accepts` took in the same call, into out and lse freshly
        allocated by the override: the argument checks and the aliasing check would find
        nothing, so only the launch runs."""
        from . import ops

        ops._run_fwd(q, k, v, out, lse, scale, causal)

    def backward(self, dout, q, k, v, out, lse, dq, dk, dv, scale, causal, deterministic) -> None:
        from . import ops

        # The full check, unlike forward: dout, out and lse come from whoever called the public
        # aten op, and _backward_inputs_decline looks at their shape and dtype only (not their
        # device, nor out's last-dim stride).
        ops._launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, scale, causal, deterministic)

    def accepts_varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale) -> str | None:
        """flashback's varlen argument checks (metadata only), as a reason."""
        from . import _checks, varlen

        try:
            varlen.check_varlen_args(q, k, v, cu_q, cu_k, int(max_q), int(max_k), softmax_scale=scale)
            _checks.check_runtime(q.device, q.shape[-1], q.dtype)
        except (TypeError, ValueError, RuntimeError) as e:
            return f"flashback rejects it ({e})"
        return None

    def varlen_forward(self, q, k, v, cu_q, cu_k, max_q, max_k, out, lse, scale, causal) -> None:
        from . import varlen

        varlen.check_offset_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)
        varlen._run_fwd(q, k, v, cu_q, cu_k, max_q, max_k, out, lse, scale, causal)

    def varlen_backward(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, scale,
                        causal, deterministic) -> None:
        from . import varlen

        varlen.check_offset_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)
        varlen._run_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, scale, causal,
                        deterministic)


@functools.lru_cache(maxsize=None)
def _sm90_with_flashback(index: int) -> bool:
    from . import _lib

    return _lib.is_loadable() and torch.cuda.get_device_capability(index) == (9, 0)


_backend = _Backend()


def _dtype_headdim_decline(query, key, value) -> str | None:
    """Asks flashback's own lists at call time, so what the library learns to serve (head dims,
    dtypes) is served here without a second list to keep in step."""
    from . import _checks

    if any(t.dtype not in _checks.SUPPORTED_DTYPES for t in (query, key, value)):
        return "dtype not supported by flashback"
    d = query.shape[-1]
    if d not in _checks.SUPPORTED_HEADDIMS or key.shape[-1] != d or value.shape[-1] != d:
        return "head dim not supported by flashback"
    return None


def decline_reason(query: Tensor, key: Tensor, value: Tensor, dropout_p: float = 0.0,
                   return_debug_mask: bool = False, scale=None, backward: bool = False) -> str | None:
    """None when flashback serves this SDPA flash call, else why not (the call then falls
    through to PyTorch). Tensors in SDPA's (batch, heads, seqlen, dim) order.
    Under torch.use_deterministic_algorithms a served causal backward runs flashback's
    deterministic mode (ordered dQ adds), a non-causal one falls through (_deterministic_decline);
    the forward is deterministic either way."""
    if dropout_p != 0.0:
        return "dropout"
    if return_debug_mask:
        return "debug mask requested"
    if any(t.dim() != 4 for t in (query, key, value)):
        return "not 4-D"
    reason = _dtype_headdim_decline(query, key, value)
    if reason is not None:
        return reason
    b, hq, sq, _ = query.shape
    if (key.shape != value.shape or key.shape[0] != b or key.shape[1] < 1 or hq % key.shape[1] != 0
            or key.shape[2] < 1 or sq < 1 or b < 1):
        return "shapes"
    if not all(_backend.device_ok(t) for t in (query, key, value)):
        return "not an sm_90 GPU with flashback available"
    if len({t.device for t in (query, key, value)}) != 1:
        return "mixed devices"
    if not all(_backend.layout_ok(_bshd(t)) for t in (query, key, value)):
        return "layout not 128-byte aligned with strides in multiples of 64 elements"
    return _backend.accepts(_bshd(query), _bshd(key), _bshd(value), scale)


def _is_varlen(cum_seq) -> bool:
    return cum_seq is not None and cum_seq.numel() > 0


def _window_is_causal(kwargs: dict) -> bool:
    """FlashAttention's window (left -1 = unlimited, right 0) is causal masking (bottom-right):
    how varlen_attn asks for it."""
    return kwargs.get("window_size_left") in (None, -1) and kwargs.get("window_size_right") == 0


def _unserved_options(kwargs: dict) -> str | None:
    """Options of the flash ops that flashback does not implement (a sliding window, seqused_k,
    ALiBi, a paged KV cache); num_splits is a speed hint and is ignored."""
    if not _window_is_causal(kwargs):
        for name in ("window_size_left", "window_size_right"):
            if kwargs.get(name) not in (None, -1):
                return "sliding window"
    for name in ("seqused_k", "alibi_slopes", "block_table"):
        if kwargs.get(name) is not None:
            return name
    return None


def flash_decline_reason(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p=0.0,
                         return_debug_mask=False, scale=None, **options) -> str | None:
    """Like decline_reason, for aten::_flash_attention_forward / _backward: tensors (b, s, h, d),
    or packed (total, h, d) with int32 offsets cum_seq_q / cum_seq_k."""
    reason = _unserved_options(options)
    if reason is not None:
        return reason
    if not _is_varlen(cum_seq_q):
        if _is_varlen(cum_seq_k):
            return "offsets for k only"
        return decline_reason(*(t.transpose(1, 2) if t.dim() == 4 else t for t in (query, key, value)),
                              dropout_p, return_debug_mask, scale)
    if dropout_p != 0.0:
        return "dropout"
    if return_debug_mask:
        return "debug mask requested"
    if not isinstance(cum_seq_k, torch.Tensor) or any(t.dim() != 3 for t in (query, key, value)):
        return "varlen tensors not 3-D"
    reason = _dtype_headdim_decline(query, key, value)
    if reason is not None:
        return reason
    if not all(_backend.device_ok(t) for t in (query, key, value)):
        return "not an sm_90 GPU with flashback available"
    if not all(_backend.layout_ok(t.unsqueeze(0)) for t in (query, key, value)):
        return "layout not 128-byte aligned with strides in multiples of 64 elements"
    return _backend.accepts_varlen(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, scale)


def _scale(scale, d: int) -> float:
    return float(scale) if scale is not None else d ** -0.5


def _make_forward(orig):
    def forward(keyset, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                *, scale=None):
        if decline_reason(query, key, value, dropout_p, return_debug_mask, scale) is not None:
            kwargs = {} if scale is None else {"scale": scale}
            return orig.call_boxed(keyset, query, key, value, dropout_p, is_causal, return_debug_mask,
                                   **kwargs)
        b, h, sq, d = query.shape
        sk = key.shape[2]
        # Allocated as PyTorch's meta kernel describes them (torch.compile trusts those strides).
        out = torch.empty_like(query)
        lse = torch.empty((b, h, sq), dtype=torch.float32, device=query.device)
        _backend.forward(_bshd(query), _bshd(key), _bshd(value), _bshd(out), lse, _scale(scale, d),
                         bool(is_causal))
        dev = query.device
        rng_state = torch.zeros((2,), dtype=torch.uint64, device=dev)
        unused = torch.zeros((), dtype=torch.uint64, device=dev)
        debug = torch.empty((0,), dtype=query.dtype, device=dev)
        return out, lse, None, None, sq, sk, rng_state, unused, debug

    return forward


def _deterministic_decline(is_causal) -> str | None:
    """Under torch.use_deterministic_algorithms flashback's deterministic backward serves causal
    attention only: its non-causal schedule needs every CTA of a chunk resident at once, which a
    training job's concurrent kernels (NCCL) can prevent for as long as they run."""
    if torch.are_deterministic_algorithms_enabled() and not is_causal:
        return "deterministic non-causal backward"
    return None


def _backward_inputs_decline(grad_out, query, out, logsumexp, lse_shape) -> str | None:
    """What a served backward needs besides q, k, v: dout and out of q's shape and dtype, and
    the fp32 LSE of the forward's shape (any strides: it is made contiguous), all on q's device
    (the kernels would take another device's pointer as their own). Otherwise the call falls
    through (e.g. an LSE merged by a caller in another layout)."""
    for x in (grad_out, out):
        if not isinstance(x, torch.Tensor) or x.shape != query.shape or x.dtype != query.dtype:
            return "dout or out not of q's shape and dtype"
    if (not isinstance(logsumexp, torch.Tensor) or logsumexp.dtype != torch.float32
            or tuple(logsumexp.shape) != tuple(lse_shape)):
        return "logsumexp not fp32 of the forward's shape"
    if any(x.device != query.device for x in (grad_out, out, logsumexp)):
        return "dout, out or logsumexp on another device than q"
    return None


def _make_backward(orig):
    def backward(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                 dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
        # The forward's decision, so a forward that fell through has its backward fall through
        # too. A backward that declines after a served forward is
        # still right: the outputs and LSE are PyTorch's layout and meaning.
        b, h, sq, _ = query.shape if query.dim() == 4 else (0, 0, 0, 0)
        if (decline_reason(query, key, value, dropout_p, False, scale, backward=True) is not None
                or _deterministic_decline(is_causal) is not None
                or _backward_inputs_decline(grad_out, query, out, logsumexp, (b, h, sq)) is not None):
            kwargs = {} if scale is None else {"scale": scale}
            return orig.call_boxed(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                                   max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, **kwargs)
        d = query.shape[-1]
        logsumexp = logsumexp.contiguous()  # context parallel hands over chunks of a merged LSE
        dq, dk, dv = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
        _backend.backward(_bshd(grad_out), _bshd(query), _bshd(key), _bshd(value), _bshd(out), logsumexp,
                          _bshd(dq), _bshd(dk), _bshd(dv), _scale(scale, d), bool(is_causal),
                          torch.are_deterministic_algorithms_enabled())
        return dq, dk, dv

    return backward


def _make_flash_forward(orig):
    def forward(keyset, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                return_debug_mask, **kwargs):
        scale = kwargs.get("scale")
        if flash_decline_reason(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                return_debug_mask, **kwargs) is not None:
            return orig.call_boxed(keyset, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                   is_causal, return_debug_mask, **kwargs)
        d = query.shape[-1]
        is_causal = bool(is_causal) or _window_is_causal(kwargs)
        out = torch.empty_like(query)
        if _is_varlen(cum_seq_q):
            lse = torch.empty((query.shape[1], query.shape[0]), dtype=torch.float32, device=query.device)
            _backend.varlen_forward(query, key, value, cum_seq_q, cum_seq_k, int(max_q), int(max_k), out, lse,
                                    _scale(scale, d), bool(is_causal))
        else:
            b, sq, h, _ = query.shape
            lse = torch.empty((b, h, sq), dtype=torch.float32, device=query.device)
            _backend.forward(query, key, value, out, lse, _scale(scale, d), bool(is_causal))
        dev = query.device
        return (out, lse, torch.zeros((2,), dtype=torch.uint64, device=dev),
                torch.zeros((), dtype=torch.uint64, device=dev), torch.empty((0,), dtype=query.dtype, device=dev))

    return forward


def _make_flash_backward(orig):
    def backward(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                 dropout_p, is_causal, rng_state, unused, **kwargs):
        scale = kwargs.get("scale")
        lse_shape = ((query.shape[1], query.shape[0]) if _is_varlen(cum_seq_q)
                     else (query.shape[0], query.shape[2], query.shape[1]) if query.dim() == 4 else None)
        if (flash_decline_reason(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, False,
                                 **kwargs) is not None
                or _deterministic_decline(bool(is_causal) or _window_is_causal(kwargs)) is not None
                or _backward_inputs_decline(grad_out, query, out, logsumexp, lse_shape) is not None):
            return orig.call_boxed(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                                   max_q, max_k, dropout_p, is_causal, rng_state, unused, **kwargs)
        d = query.shape[-1]
        is_causal = bool(is_causal) or _window_is_causal(kwargs)
        logsumexp = logsumexp.contiguous()
        dq, dk, dv = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
        deterministic = torch.are_deterministic_algorithms_enabled()
        if _is_varlen(cum_seq_q):
            _backend.varlen_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                                     int(max_q), int(max_k), dq, dk, dv, _scale(scale, d), bool(is_causal),
                                     deterministic)
        else:
            _backend.backward(grad_out, query, key, value, out, logsumexp, dq, dk, dv, _scale(scale, d),
                              bool(is_causal), deterministic)
        return dq, dk, dv

    return backward


def _priority_api():
    """(get, set) of PyTorch's global SDPA priority order, or None where this PyTorch has no such
    functions (they are private; newer versions may move them)."""
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    set_ = getattr(torch._C, "_set_sdp_priority_order", None)
    if get is None or set_ is None or not hasattr(torch.nn.attention, "SDPBackend"):
        return None
    return get, set_


def _routes_here() -> bool:
    """Whether putting the flash backend first can help: only on an sm_90 GPU with the library
    loadable; elsewhere flashback serves nothing and PyTorch's order stays as it is."""
    if not torch.cuda.is_available():
        return False
    return _sm90_with_flashback(torch.cuda.current_device())


def _settle_priority_order() -> None:
    """PyTorch fixes its SDPA priority order lazily, at the first backend selection on a CUDA
    device of the process (that is when it moves cuDNN first on H100/H200), overwriting any order
    set before. One selection on tiny tensors, which launches no kernel, makes it settle now, so
    that the order saved is the one PyTorch would use and ours is not overwritten later."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return
    x = torch.zeros((1, 1, 1, 64), dtype=torch.bfloat16,
                    device=torch.device("cuda", torch.cuda.current_device()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            choose(x, x, x)
        except RuntimeError:
            pass  # every backend disabled: PyTorch selects nothing, so it has no order to settle


class _Routing:
    """The SDPA priority order while the provider is active: FLASH_ATTENTION first, the other
    backends in the order PyTorch had. Enable flags are never touched: a backend the user switched
    off stays off, and sdpa_kernel() still runs what it names."""

    def __init__(self, saved: list[int], ours: list[int]):
        self.saved, self.ours = saved, ours

    @classmethod
    def activate(cls) -> "_Routing | None":
        api = _priority_api()
        if api is None or not _routes_here():
            return None
        get, set_ = api
        _settle_priority_order()
        saved = [int(b) for b in get()]
        flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
        ours = [flash] + [b for b in saved if b != flash]
        if ours == saved:
            return None
        set_(ours)
        return cls(saved, ours)

    def restore(self) -> None:
        """Puts the saved order back, unless another order was set since activation: that one
        is newer than ours and stays."""
        api = _priority_api()
        if api is None:
            return
        get, set_ = api
        if [int(b) for b in get()] == self.ours:
            set_(self.saved)


class _Handle:
    """Keeps the override alive; remove() restores PyTorch's kernels and its priority order."""

    def __init__(self, library, routing: _Routing | None = None):
        self.library = library
        self.routing = routing

    def remove(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None
        if self.routing is not None:
            self.routing.restore()
            self.routing = None


def install(dispatch_key: str = "CUDA", route: bool | None = None) -> _Handle:
    """Overrides the SDPA flash ops at `dispatch_key` (CUDA; tests use CPU) and returns the
    handle that removes the override. What the override does not serve goes to the kernel that
    was registered before (captured here, before the override exists). route (default: when the
    key is CUDA) also puts the flash backend first in SDPA's priority order (_Routing)."""
    if not hasattr(torch.library, "get_kernel"):
        raise RuntimeError(f"the flashback SDPA provider needs PyTorch >= 2.9 (torch.library.get_kernel); "
                           f"this is {torch.__version__}")
    try:
        orig_fwd = torch.library.get_kernel(f"aten::{_FWD_OP}", dispatch_key)
        orig_bwd = torch.library.get_kernel(f"aten::{_BWD_OP}", dispatch_key)
    except RuntimeError as e:  # e.g. a CPU-only PyTorch build has no CUDA kernel to fall back to
        raise RuntimeError(f"the flashback SDPA provider found no {dispatch_key} kernel of PyTorch's "
                           f"flash attention to fall back to ({e})") from None
    lib = torch.library.Library("aten", "IMPL", dispatch_key)
    lib.impl(_FWD_OP, _make_forward(orig_fwd), dispatch_key, with_keyset=True)
    lib.impl(_BWD_OP, _make_backward(orig_bwd), dispatch_key, with_keyset=True)
    # The lower-level ops (varlen_attn's route) only where this PyTorch has them with a kernel to
    # fall back to; without them the SDPA route above still works.
    try:
        orig_flash_fwd = torch.library.get_kernel(f"aten::{_FLASH_FWD_OP}", dispatch_key)
        orig_flash_bwd = torch.library.get_kernel(f"aten::{_FLASH_BWD_OP}", dispatch_key)
    except (RuntimeError, AttributeError):
        orig_flash_fwd = orig_flash_bwd = None
    if orig_flash_fwd is not None:
        lib.impl(_FLASH_FWD_OP, _make_flash_forward(orig_flash_fwd), dispatch_key, with_keyset=True)
        lib.impl(_FLASH_BWD_OP, _make_flash_backward(orig_flash_bwd), dispatch_key, with_keyset=True)
    if route is None:
        route = dispatch_key == "CUDA"
    try:
        routing = _Routing.activate() if route else None
    except BaseException:
        lib._destroy()
        raise
    return _Handle(lib, routing)


_DISPATCH_KEY = "CUDA"  # where activate_flash_attention_impl installs the override (tests: CPU)
_ROUTE = None  # install()'s route under activate_flash_attention_impl (None: when the key is CUDA)


def _register_fn():
    return install(_DISPATCH_KEY, route=_ROUTE)


def register() -> bool:
    """Makes "flashback" known to torch.nn.attention (activate_flash_attention_impl). Does not
    activate anything. False when this PyTorch has no provider registry (< 2.10)."""
    attention = torch.nn.attention
    if not hasattr(attention, "register_flash_attention_impl"):
        return False
    try:
        attention.register_flash_attention_impl(NAME, register_fn=_register_fn)
    except Exception as e:  # noqa: BLE001 - importing flashback must not fail over an optional hook
        warnings.warn(f"flashback: could not register the SDPA provider ({type(e).__name__}: {e})")
        return False
    return True
