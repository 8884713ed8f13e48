"""The SDPA provider's routing without a GPU: activation puts PyTorch's flash backend first in the
SDPA priority order (so a plain scaled_dot_product_attention call reaches the overridden flash op),
and removal puts back exactly what was there: the order, the enable flags, the kernels. The real
priority functions of torch._C are used (they are process-wide state, also on a CPU build); what
needs a GPU (is this an sm_90 device, PyTorch's lazy choice of its order) is stood in for. The
GPU side is tests/gpu/test_sdpa_provider_gpu.py (plain calls, kernels by name in the profiler)."""
import pytest
import torch

from flashback import sdpa

FLASH, EFFICIENT, MATH, CUDNN = 1, 2, 0, 3
needs_registry = pytest.mark.skipif(not hasattr(torch.nn.attention, "register_flash_attention_impl"),
                                    reason="this PyTorch has no flash-attention provider registry (< 2.10)")
needs_get_kernel = pytest.mark.skipif(not hasattr(torch.library, "get_kernel"),
                                      reason="this PyTorch has no torch.library.get_kernel (< 2.9)")
needs_priority = pytest.mark.skipif(sdpa._priority_api() is None,
                                    reason="this PyTorch has no SDPA priority order functions")
# What H100/H200 runs with PyTorch 2.11 once the order is settled: cuDNN first.
CUDNN_FIRST = [CUDNN, FLASH, EFFICIENT, MATH, 4]
FLAGS = ("cudnn", "flash", "mem_efficient", "math", "overrideable")


def _flags():
    return {name: getattr(torch._C, f"_get_{name}_sdp_enabled")() for name in FLAGS
            if hasattr(torch._C, f"_get_{name}_sdp_enabled")}


def _set_flags(flags):
    for name, on in flags.items():
        getattr(torch._C, f"_set_sdp_use_{name}")(on)


def _order():
    return list(torch._C._get_sdp_priority_order())


@pytest.fixture
def sdp_state():
    """PyTorch's process-wide SDPA state as it was, put back after the test whatever it did."""
    order, flags = _order(), _flags()
    set_order = torch._C._set_sdp_priority_order  # a test may hide it (monkeypatch undoes that later)
    yield
    set_order(order)
    _set_flags(flags)


class _PyTorchFlashStandIn:
    """Plays PyTorch's own CPU kernel of the SDPA flash op (there is none on CPU); counts calls."""

    def __init__(self):
        self.calls = 0
        self.lib = torch.library.Library("aten", "IMPL", "CPU")
        self.lib.impl("_scaled_dot_product_flash_attention", self.forward, "CPU")
        self.lib.impl("_scaled_dot_product_flash_attention_backward", self.backward, "CPU")

    def forward(self, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        self.calls += 1
        z = torch.zeros((2,), dtype=torch.uint64)
        return (torch.zeros_like(q), torch.zeros(q.shape[:3]), None, None, q.shape[2], k.shape[2], z,
                torch.zeros((), dtype=torch.uint64), torch.empty(0, dtype=q.dtype))

    def backward(self, *args, **kwargs):
        raise AssertionError("not used here")

    def close(self):
        self.lib._destroy()


@pytest.fixture
def routed(monkeypatch, sdp_state):
    """activate_flash_attention_impl installs at the CPU key with routing on, as if on an sm_90
    GPU whose PyTorch settled on cuDNN first; the settle step is recorded, not run."""
    torch_kernel = _PyTorchFlashStandIn()
    settled = []
    monkeypatch.setattr(sdpa, "_DISPATCH_KEY", "CPU")
    monkeypatch.setattr(sdpa, "_ROUTE", True)
    monkeypatch.setattr(sdpa, "_routes_here", lambda: True)
    monkeypatch.setattr(sdpa, "_settle_priority_order", lambda: settled.append(_order()))
    torch._C._set_sdp_priority_order(CUDNN_FIRST)
    yield torch_kernel, settled
    if hasattr(torch.nn.attention, "restore_flash_attention_impl"):
        torch.nn.attention.restore_flash_attention_impl(_raise_warn=False)
    torch_kernel.close()


def _calls_of_the_stand_in(torch_kernel):
    q = torch.randn(1, 2, 8, 64).to(torch.float32)  # fp32: flashback never serves it
    before = torch_kernel.calls
    torch.ops.aten._scaled_dot_product_flash_attention(q, q, q)
    return torch_kernel.calls - before


@needs_registry
@needs_get_kernel
@needs_priority
def test_activation_puts_flash_first_and_restore_puts_back_exactly(routed):
    torch_kernel, settled = routed
    flags = _flags()
    torch.nn.attention.activate_flash_attention_impl("flashback")
    assert settled == [CUDNN_FIRST]  # settled before the order was read
    assert _order() == [FLASH, CUDNN, EFFICIENT, MATH, 4]
    assert _flags() == flags
    assert _calls_of_the_stand_in(torch_kernel) == 1  # declined: falls through to PyTorch's kernel
    torch.nn.attention.restore_flash_attention_impl()
    assert _order() == CUDNN_FIRST
    assert _flags() == flags
    assert torch.library.get_kernel("aten::_scaled_dot_product_flash_attention", "CPU") is not None
    assert _calls_of_the_stand_in(torch_kernel) == 1


@needs_registry
@needs_get_kernel
@needs_priority
@pytest.mark.parametrize("disabled", ["flash", "cudnn", "math"])
def test_enable_flags_are_never_touched(routed, disabled):
    """A backend switched off stays off while active and after: a user who turned off flash
    keeps PyTorch's choice (flashback does not switch it back on)."""
    _set_flags({disabled: False})
    flags = _flags()
    torch.nn.attention.activate_flash_attention_impl("flashback")
    assert _flags() == flags
    torch.nn.attention.restore_flash_attention_impl()
    assert _flags() == flags and _order() == CUDNN_FIRST


@needs_registry
@needs_get_kernel
@needs_priority
def test_sdpa_kernel_inside_activation_leaves_the_routing_in_place(routed):
    """sdpa_kernel() saves and restores the order itself (set_priority=True); on exit the
    provider's order is back, and restore then finds it and puts PyTorch's back."""
    torch.nn.attention.activate_flash_attention_impl("flashback")
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH,
                                         torch.nn.attention.SDPBackend.CUDNN_ATTENTION], set_priority=True):
        assert _order()[:2] == [MATH, CUDNN]
    assert _order() == [FLASH, CUDNN, EFFICIENT, MATH, 4]
    torch.nn.attention.restore_flash_attention_impl()
    assert _order() == CUDNN_FIRST


@needs_registry
@needs_get_kernel
@needs_priority
def test_an_order_set_while_active_is_kept_by_restore(routed):
    torch.nn.attention.activate_flash_attention_impl("flashback")
    mine = [MATH, EFFICIENT, FLASH, CUDNN, 4]
    torch._C._set_sdp_priority_order(mine)
    torch.nn.attention.restore_flash_attention_impl()
    assert _order() == mine


@needs_registry
@needs_get_kernel
@needs_priority
def test_activating_twice_restores_pytorchs_order(routed):
    """activate_flash_attention_impl restores the active provider before installing again, so
    the second activation saves PyTorch's order, not the provider's."""
    torch.nn.attention.activate_flash_attention_impl("flashback")
    torch.nn.attention.activate_flash_attention_impl("flashback")
    assert _order() == [FLASH, CUDNN, EFFICIENT, MATH, 4]
    torch.nn.attention.restore_flash_attention_impl()
    assert _order() == CUDNN_FIRST


@needs_registry
@needs_get_kernel
@needs_priority
def test_no_routing_where_flashback_serves_nothing(routed, monkeypatch):
    monkeypatch.setattr(sdpa, "_routes_here", lambda: False)
    torch_kernel, settled = routed
    torch.nn.attention.activate_flash_attention_impl("flashback")
    assert _order() == CUDNN_FIRST and settled == []
    torch.nn.attention.restore_flash_attention_impl()
    assert _order() == CUDNN_FIRST


@needs_get_kernel
@needs_priority
def test_flash_already_first_changes_nothing(routed):
    order = [FLASH, EFFICIENT, MATH, CUDNN, 4]
    torch._C._set_sdp_priority_order(order)
    handle = sdpa.install("CPU", route=True)
    assert handle.routing is None and _order() == order
    handle.remove()
    assert _order() == order


@needs_get_kernel
def test_order_settled_lazily_is_the_one_saved(routed, monkeypatch):
    """PyTorch reports its built-in order until the first CUDA selection settles it (to cuDNN
    first on H100/H200); the provider must save and restore the settled order, and set its own
    after settling, or the first SDPA call would overwrite it."""
    state = {"order": [FLASH, EFFICIENT, MATH, CUDNN, 4], "settled": False}

    def settle():
        if not state["settled"]:
            state["order"], state["settled"] = list(CUDNN_FIRST), True

    def set_order(order):
        state["order"] = list(order)

    monkeypatch.setattr(sdpa, "_priority_api", lambda: (lambda: list(state["order"]), set_order))
    monkeypatch.setattr(sdpa, "_settle_priority_order", settle)
    handle = sdpa.install("CPU", route=True)
    assert state["order"] == [FLASH, CUDNN, EFFICIENT, MATH, 4]
    settle()  # the first real selection: already settled, changes nothing
    assert state["order"] == [FLASH, CUDNN, EFFICIENT, MATH, 4]
    handle.remove()
    assert state["order"] == CUDNN_FIRST
    handle.remove()  # idempotent
    assert state["order"] == CUDNN_FIRST


@needs_get_kernel
def test_without_priority_functions_only_the_kernels_are_installed(routed, monkeypatch):
    torch_kernel, settled = routed
    monkeypatch.delattr(torch._C, "_set_sdp_priority_order")
    assert sdpa._priority_api() is None
    handle = sdpa.install("CPU", route=True)
    assert handle.routing is None and settled == []
    handle.remove()


@needs_get_kernel
def test_a_failed_routing_removes_the_kernels_again(routed, monkeypatch):
    torch_kernel, _ = routed

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(sdpa, "_settle_priority_order", broken)
    with pytest.raises(RuntimeError, match="boom"):
        sdpa.install("CPU", route=True)
    assert _order() == CUDNN_FIRST
    assert _calls_of_the_stand_in(torch_kernel) == 1


def test_settle_makes_one_selection_and_swallows_no_viable_backend(monkeypatch):
    seen = []

    def choose(q, k, v, *args, **kwargs):
        seen.append((q.shape, q.dtype, q.device))
        raise RuntimeError("No viable backend for scaled_dot_product_attention was found.")

    monkeypatch.setattr(torch, "_fused_sdp_choice", choose)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **kw: real_zeros(*a, **kw))  # no GPU here
    sdpa._settle_priority_order()
    assert seen == [(torch.Size([1, 1, 1, 64]), torch.bfloat16, torch.device("cpu"))]
