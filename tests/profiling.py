"""Which CUDA kernels a piece of code ran, by name, for the GPU tests that check where a call went
(flashback's kernels or PyTorch's) rather than trusting a path report alone."""
import torch
from torch.autograd import DeviceType

# PyTorch's attention kernels: cuDNN's fused SDPA, its flash-attention 2 copy (pytorch_flash::
# flash_fwd_kernel, flash_bwd_...), the memory-efficient one (fmha_cutlass*, MemEffAttention).
_PYTORCH_ATTENTION = ("cudnn", "pytorch_flash", "flash_fwd", "flash_bwd", "fmha", "memeffattention")


def kernels(fn) -> set:
    """The names of the CUDA kernels that fn() launched (the device is synchronised inside)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == DeviceType.CUDA}


def flashback_kernels(names) -> set:
    """flashback's kernels all live in namespace flashback (Hopper: flashback::sm90::*_sm90_*;
    reference: flashback::ref::reference_*)."""
    return {n for n in names if "flashback" in n}


def pytorch_attention_kernels(names) -> set:
    return {n for n in names if "flashback" not in n and any(p in n.lower() for p in _PYTORCH_ATTENTION)}
