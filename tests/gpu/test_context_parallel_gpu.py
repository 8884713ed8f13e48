"""Context parallelism on the flashback provider, on 2 GPUs: PyTorch's ring attention
(torch.distributed.tensor.experimental.context_parallel) runs every ring step's SDPA flash op,
forward and backward, on flashback's kernels; the unsharded output and gradients meet the
correctness bar of the single-GPU reference. Skipped (with the reason) on fewer than 2 GPUs.
NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0)."""
import os
import socket

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="context parallel needs 2 GPUs"),
    pytest.mark.skipif(not hasattr(torch.nn.attention, "activate_flash_attention_impl"),
                       reason="this PyTorch has no flash-attention provider registry (< 2.10)"),
    pytest.mark.skipif(os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0"),
                       reason="FLASHBACK_FORCE_REFERENCE is set: nothing runs on the Hopper kernels"),
]

B, H, S, D = 1, 8, 8192, 256


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, causal, results):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, context_parallel_unshard

    import flashback

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cuda", (world,))
        _cp_options.enable_load_balance = causal  # PyTorch balances causal masks only
        gen = torch.Generator(device="cuda").manual_seed(2026)  # the same tensors on every rank
        q, k, v, dout = (torch.randn(B, H, S, D, generator=gen, device="cuda").to(torch.bfloat16)
                         for _ in range(4))
        torch.nn.attention.activate_flash_attention_impl("flashback")
        flash = [torch.nn.attention.SDPBackend.FLASH_ATTENTION]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with context_parallel(mesh, buffers=[q, k, v, dout], buffer_seq_dims=[2, 2, 2, 2]):
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                with torch.nn.attention.sdpa_kernel(flash):
                    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                out.backward(dout)
                local = [out.detach()] + [t.grad for t in leaves]
            torch.cuda.synchronize()
        names = {e.name for e in prof.events()}
        full = context_parallel_unshard(mesh, local, [2, 2, 2, 2])
        if rank == 0:
            results.put(dict(
                fwd_kernel=any("fwd_sm90_kernel" in n for n in names),
                bwd_kernel=any("bwd_sm90_kernel" in n for n in names),
                tensors=[t.cpu() for t in full]))
        flashback.last_forward_path()  # the library stays loaded until the group is torn down
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_context_parallel_on_flashback_matches_one_gpu(causal):
    import torch.multiprocessing as mp

    from reference import attention_ref, check_close

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = mp.start_processes(_worker, args=(2, _free_port(), causal, results), nprocs=2, join=False,
                               start_method="spawn")
    got = results.get(timeout=600)  # before joining: a child exits only once its queue is read
    while not procs.join():
        pass
    assert got["fwd_kernel"] and got["bwd_kernel"], "flashback's kernels did not run in the ring"
    out, dq, dk, dv = (t.cuda() for t in got["tensors"])

    gen = torch.Generator(device="cuda").manual_seed(2026)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
    refs = []
    for upcast in (True, False):
        dtype = torch.float32 if upcast else torch.bfloat16
        leaves = [t.transpose(1, 2).to(dtype).requires_grad_() for t in (q, k, v)]
        o, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
        g = torch.autograd.grad(o, leaves, dout.transpose(1, 2).to(dtype))
        refs.append([o.detach().transpose(1, 2)] + [x.transpose(1, 2) for x in g])
    for name, ours, r32, rlp in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), *refs):
        check_close(name, ours, r32, rlp)
