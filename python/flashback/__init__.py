"""flashback: attention training kernels for NVIDIA Hopper (sm_90), with a thin PyTorch front.

    import flashback
    out = flashback.attention(q, k, v, causal=True)   # (batch, seqlen, nheads, headdim), bf16
    out = flashback.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k)  # packed
    out = flashback.flash_attn_func(q, k, v, causal=True)   # FlashAttention 2's signature
"""
from ._checks import SUPPORTED_HEADDIMS
from ._lib import FlashbackError, LibraryNotFoundError
from .interface import attention, attention_backward, attention_forward
from .varlen import attention_varlen
from . import flash_attn_interface
from .flash_attn_interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                                   flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                                   flash_attn_varlen_qkvpacked_func)
from . import sdpa as _sdpa

# Makes "flashback" known to torch.nn.attention.activate_flash_attention_impl; activates nothing.
_sdpa.register()

__version__ = "0.1.0"

__all__ = [
    "attention", "attention_forward", "attention_backward", "attention_varlen", "is_available", "last_forward_path",
    "last_backward_path", "last_backward_kernel", "build_commit",
    "flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_interface",
    "SUPPORTED_HEADDIMS", "FlashbackError", "LibraryNotFoundError", "__version__",
]


def is_available() -> bool:
    """True when the native library loads and the current CUDA device is an sm_90 GPU."""
    import torch

    from . import _checks, _lib

    if not torch.cuda.is_available() or not _lib.is_loadable():
        return False
    return _checks._device_error(torch.cuda.current_device()) is None


def build_commit() -> str:
    """The short git commit the loaded native library was built from ("-dirty" appended when
    tracked files differed from it; "unknown" outside a git checkout)."""
    from . import _lib

    return _lib.load().flashback_build_commit().decode("utf-8", "replace")


def last_forward_path() -> str:
    """Which kernels the last forward of this process ran: "sm90" (the Hopper forward) or
    "reference: <why the Hopper path declined>"; "" before any forward."""
    from . import _lib

    return _lib.load().flashback_last_forward_path().decode("utf-8", "replace")


def last_backward_path() -> str:
    """Which kernels the last backward of this process ran: "sm90" (the Hopper backward) or
    "reference: <why the Hopper path declined>" (e.g. "reference: a tensor is not 128-byte
    aligned"); "" before any backward. Call it after the backward has been launched (through
    autograd too). Set FLASHBACK_LOG_PATH=1 to have the library print each distinct path once to
    stderr."""
    from . import _lib

    return _lib.load().flashback_last_backward_path().decode("utf-8", "replace")


def last_backward_kernel() -> str:
    """Which form of the Hopper backward the last backward of this process ran: "pair" (CTAs in
    2-CTA clusters that swap dS, head dim 256 from 1024 query rows per CTA, i.e. seqlen_q x
    nheads / nheads_k), "pair, last wave split" (the same with the grid's partial last wave split
    by query range, where the build's config does that) or "single" (one CTA per K/V block); ""
    before any backward or when the reference kernels ran."""
    from . import _lib

    return _lib.load().flashback_last_backward_kernel().decode("utf-8", "replace")
