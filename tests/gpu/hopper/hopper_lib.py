"""ctypes access to libflashback_hopper_tests.so (the Hopper primitive tests and GEMM example).

The library is built by tests/gpu/hopper/CMakeLists.txt (target flashback_hopper_tests). Its
path comes from $FLASHBACK_HOPPER_TESTS_LIB (relative paths are taken from the repository root),
else build/tests/gpu/hopper/libflashback_hopper_tests.so. Every entry point returns a CUDA error
code (0 = success) and takes raw device pointers.
"""
import ctypes
import os
from ctypes import POINTER, c_int, c_longlong, c_void_p
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_LIB = REPO_ROOT / "build" / "tests" / "gpu" / "hopper" / "libflashback_hopper_tests.so"

_SIGNATURES = {
    "fbh_device_synchronize": [],
    "fbh_exp2_approx": [c_void_p, c_void_p, c_int],
    "fbh_tma_load_store": [c_void_p, c_void_p, c_void_p, c_int, c_int, POINTER(c_longlong),
                           POINTER(c_int), POINTER(c_int), POINTER(c_int), c_int, c_int],
    "fbh_tma_encode": [c_void_p, c_int, c_int, POINTER(c_longlong), POINTER(c_longlong),
                       POINTER(c_int), c_int],
    "fbh_tma_reduce_add": [c_void_p, c_void_p] + [c_int] * 8,
    "fbh_bulk_reduce_add_f32": [c_void_p, c_void_p, c_int, c_int],
    "fbh_ordered_bulk_reduce_add_f32": [c_void_p, c_void_p, c_void_p, c_int, c_int],
    "fbh_last_arrival_sum": [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_int],
    "fbh_bulk_load": [c_void_p, c_void_p, c_int],
    "fbh_tma_multicast": [c_void_p, c_void_p, c_int, c_int, c_int, c_int],
    "fbh_tma_multicast_4d": [c_void_p, c_void_p, c_int, c_int, c_int, c_int, c_longlong],
    "fbh_mbarrier_phases": [c_void_p],
    "fbh_pipeline_copy": [c_void_p, c_void_p, c_int, c_int, c_int],
    "fbh_named_barrier": [c_void_p, c_void_p, c_int],
    "fbh_wgmma": [c_void_p, c_void_p, c_void_p, c_int, c_int, c_int, c_int],
    "fbh_wgmma_supported_n": [POINTER(c_int), c_int],
    "fbh_wgmma_chain": [c_void_p, c_void_p, c_void_p, c_void_p, c_int],
    "fbh_wgmma_f16": [c_void_p, c_void_p, c_void_p, c_int, c_int, c_int, c_int],
    "fbh_wgmma_chain_f16": [c_void_p, c_void_p, c_void_p, c_void_p, c_int],
    "fbh_stmatrix_trans": [c_void_p, c_void_p, c_int],
    "fbh_stmatrix_plain": [c_void_p, c_void_p],
    "fbh_ldmatrix_trans": [c_void_p, c_void_p, c_int],
    "fbh_cluster_dsmem": [c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_int],
    "fbh_cluster_bulk_swap": [c_void_p, c_void_p, c_int],
    "fbh_cluster_pingpong": [c_void_p, c_void_p, c_void_p, c_int, c_int, c_int, c_int, c_int],
    "fbh_setmaxnreg": [c_void_p, c_void_p],
    "fbh_pdl_order": [c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_longlong, c_int],
    "fbh_gemm_bf16_tn": [c_void_p, c_void_p, c_void_p, c_int, c_int, c_int, c_int, c_int, c_void_p],
    "fbh_wgmma_rate": [c_int, c_int, c_int, c_int, c_int, c_void_p, c_void_p],
}


def lib_path() -> Path:
    env = os.environ.get("FLASHBACK_HOPPER_TESTS_LIB")
    path = Path(env) if env else DEFAULT_LIB
    return path if path.is_absolute() else REPO_ROOT / path


def unavailable_reason():
    """Why the GPU tests cannot run here (None if they can)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"needs an sm_90 GPU (H100/H200), got sm_{major}{minor}"
    if not lib_path().exists():
        return (f"test library not built: {lib_path()} "
                "(cmake --build <build> --target flashback_hopper_tests, or set FLASHBACK_HOPPER_TESTS_LIB)")
    return None


_LIB = None


def load():
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(lib_path()))
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = c_int
        _LIB = lib
    return _LIB


def ptr(t):
    return c_void_p(t.data_ptr())


def ints(values, ctype=c_int):
    return (ctype * len(values))(*values)


def check(lib, rc, what):
    """Assert a launch returned 0 and that the device finished without error."""
    assert rc == 0, f"{what}: launch returned CUDA error {rc}"
    rc = lib.fbh_device_synchronize()
    assert rc == 0, f"{what}: kernel failed with CUDA error {rc}"
