"""Loading the native library and calling its C API through ctypes.

The binding is ctypes on purpose: the native library has no Python or PyTorch ABI in it, so one
build works with any PyTorch the user upgrades to. This module imports nothing from torch.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import threading

_LIB_NAME = "libflashback.so"
_HERE = pathlib.Path(__file__).resolve().parent


class LibraryNotFoundError(RuntimeError):
    """The native library could not be found or loaded."""


class FlashbackError(RuntimeError):
    """A call into the native library returned an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# Mirror of include/flashback/flashback.h. flashback_params_sizes() lets us check the copy.
class Strides(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("row", ctypes.c_int64), ("head", ctypes.c_int64)]


_SHAPE_FIELDS = [(n, ctypes.c_int) for n in ("batch", "seqlen_q", "seqlen_k", "nheads", "nheads_k", "headdim")]


# Variable-length batches: int32 device offsets (NULL = dense) and the packed row counts.
_VARLEN_FIELDS = [("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                  ("total_q", ctypes.c_int), ("total_k", ctypes.c_int)]


class FwdParams(ctypes.Structure):
    _fields_ = (
        [(n, ctypes.c_void_p) for n in ("q", "k", "v", "out", "lse")]
        + [(n + "_strides", Strides) for n in ("q", "k", "v", "out")]
        + _SHAPE_FIELDS
        + [("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int), ("dtype", ctypes.c_int),
           ("stream", ctypes.c_void_p)]
        + _VARLEN_FIELDS
    )


class BwdParams(ctypes.Structure):
    _fields_ = (
        [(n, ctypes.c_void_p) for n in ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv")]
        + [(n + "_strides", Strides) for n in ("q", "k", "v", "out", "dout", "dq", "dk", "dv")]
        + _SHAPE_FIELDS
        + [("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int),
           ("deterministic", ctypes.c_int), ("dtype", ctypes.c_int),
           ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
           ("stream", ctypes.c_void_p)]
        + _VARLEN_FIELDS
    )


DTYPE_BF16 = 0
DTYPE_FP16 = 1


def dtype_code(dtype) -> int:
    """The C API's flashback_dtype of a torch dtype (bf16 or fp16; checked before)."""
    import torch

    return DTYPE_FP16 if dtype == torch.float16 else DTYPE_BF16
STATUS_SUCCESS = 0

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def candidate_paths() -> list[pathlib.Path]:
    """Where the library is looked for, in order: $FLASHBACK_LIBRARY, the installed package,
    and the build/ folder of a source checkout (for development without installing)."""
    paths = []
    env = os.environ.get("FLASHBACK_LIBRARY")
    if env:
        paths.append(pathlib.Path(env))
    paths.append(_HERE / _LIB_NAME)
    paths.append(_HERE.parent.parent / "build" / _LIB_NAME)
    return paths


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    try:
        return _bind_symbols(lib)
    except AttributeError as e:  # a function this package calls is missing: an older library
        raise LibraryNotFoundError(f"{lib._name} does not match this Python package ({e}); reinstall flashback") from e


def _bind_symbols(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.flashback_attention_forward.argtypes = [ctypes.POINTER(FwdParams)]
    lib.flashback_attention_forward.restype = ctypes.c_int
    lib.flashback_attention_backward.argtypes = [ctypes.POINTER(BwdParams)]
    lib.flashback_attention_backward.restype = ctypes.c_int
    lib.flashback_bwd_workspace_size.argtypes = [ctypes.POINTER(BwdParams)]
    lib.flashback_bwd_workspace_size.restype = ctypes.c_size_t
    lib.flashback_headdim_supported.argtypes = [ctypes.c_int]
    lib.flashback_headdim_supported.restype = ctypes.c_int
    lib.flashback_supports.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.flashback_supports.restype = ctypes.c_int
    lib.flashback_sm90_supports.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.flashback_sm90_supports.restype = ctypes.c_int
    lib.flashback_check_device.argtypes = [ctypes.c_int]
    lib.flashback_check_device.restype = ctypes.c_int
    lib.flashback_last_error.argtypes = []
    lib.flashback_last_error.restype = ctypes.c_char_p
    lib.flashback_version.argtypes = []
    lib.flashback_version.restype = ctypes.c_char_p
    lib.flashback_build_commit.argtypes = []
    lib.flashback_build_commit.restype = ctypes.c_char_p
    lib.flashback_last_forward_path.argtypes = []
    lib.flashback_last_forward_path.restype = ctypes.c_char_p
    lib.flashback_last_backward_path.argtypes = []
    lib.flashback_last_backward_path.restype = ctypes.c_char_p
    lib.flashback_last_backward_kernel.argtypes = []
    lib.flashback_last_backward_kernel.restype = ctypes.c_char_p
    lib.flashback_debug_bwd_timeline.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.flashback_debug_bwd_timeline.restype = ctypes.c_int
    lib.flashback_debug_bwd_split_plan.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_int)] * 2
    lib.flashback_debug_bwd_split_plan.restype = None
    lib.flashback_params_sizes.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
    lib.flashback_params_sizes.restype = None
    fwd, bwd = ctypes.c_size_t(), ctypes.c_size_t()
    lib.flashback_params_sizes(ctypes.byref(fwd), ctypes.byref(bwd))
    if (fwd.value, bwd.value) != (ctypes.sizeof(FwdParams), ctypes.sizeof(BwdParams)):
        raise LibraryNotFoundError(
            f"{lib._name} does not match this Python package: params structs are "
            f"{fwd.value}/{bwd.value} bytes there, {ctypes.sizeof(FwdParams)}/"
            f"{ctypes.sizeof(BwdParams)} here; reinstall flashback")
    return lib


# A library that load() returns instead of the global one while `using` holds it (one thread:
# the benchmark's --builds times two builds in one process, call by call).
_override: ctypes.CDLL | None = None


def load_file(path) -> ctypes.CDLL:
    """A build of the library at `path`, bound and checked against this package, loaded beside
    the one load() returns (ctypes loads each file into its own namespace) and not made the
    default. For A/B timing of builds of one tree in one process; use it with `using`."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise LibraryNotFoundError(f"{path} (not found)")
    try:
        return _bind(ctypes.CDLL(str(path.resolve())))
    except OSError as e:
        raise LibraryNotFoundError(f"{path} ({e})") from e


class using:
    """Context manager: every call into the native library inside it goes to `lib` (from
    load_file). Not thread-safe, and a tensor's backward must run under the build that ran its
    forward (the saved LSE and the workspace sizes are the build's)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib, self.saved = lib, None

    def __enter__(self) -> ctypes.CDLL:
        global _override
        self.saved, _override = _override, self.lib
        return self.lib

    def __exit__(self, *exc) -> None:
        global _override
        _override = self.saved


def load() -> ctypes.CDLL:
    """The loaded library; raises LibraryNotFoundError saying where it looked."""
    global _lib
    if _override is not None:
        return _override
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidate_paths():
            if not path.is_file():
                tried.append(f"{path} (not found)")
                continue
            try:
                _lib = _bind(ctypes.CDLL(str(path)))
                return _lib
            except OSError as e:
                tried.append(f"{path} ({e})")
        raise LibraryNotFoundError(
            "flashback's native library (libflashback.so) was not found or could not be "
            "loaded; install the package with `pip install .` or set FLASHBACK_LIBRARY. "
            "Tried: " + "; ".join(tried))


def is_loadable() -> bool:
    try:
        load()
        return True
    except LibraryNotFoundError:
        return False


def last_error(lib: ctypes.CDLL) -> str:
    return lib.flashback_last_error().decode("utf-8", "replace")


def check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != STATUS_SUCCESS:
        raise FlashbackError(status, f"flashback {what}: {last_error(lib)}")
