"""Context-parallel scaling: attention forward + backward of one long sequence on 1 GPU (a plain
SDPA call) and sharded over 2 GPUs with PyTorch's context parallel (ring attention over the SDPA
flash op, causal with PyTorch's load balancer), with flashback behind the SDPA flash backend
(the provider) and with PyTorch's own flash kernel.

    python benchmarks/bench_context_parallel.py                  # 32768 tokens, 8 heads, d 256
    python benchmarks/bench_context_parallel.py --seqlen 65536 --iters 10

Times are the median over --iters calls after 2 warm-up calls, per rank, then the slowest rank.
TFLOP/s use the benchmark's convention (forward 4 b s^2 h d, halved when causal; backward 2.5x).
"Ring overhead" is the 2-GPU time minus half the 1-GPU time: what the ring adds over a perfect
split (the exchange of K/V chunks that is not hidden behind compute, the LSE merges, the extra
launches). Needs 2 GPUs for the 2-GPU rows; NCCL's NVLink multicast is left off."""
import argparse
import os
import socket
import statistics

import torch

HEADDIM = 256


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flops(seqlen, nheads, causal):
    fwd = 4 * seqlen * seqlen * nheads * HEADDIM * (0.5 if causal else 1.0)
    return 3.5 * fwd  # forward + backward (2.5x)


def _worker(rank, world, port, args, results):
    import torch.distributed as dist
    import torch.nn.functional as F

    import flashback  # registers the provider

    torch.cuda.set_device(rank)
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import _cp_options

        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        mesh = init_device_mesh("cuda", (world,))
    flash = [torch.nn.attention.SDPBackend.FLASH_ATTENTION]
    rows = []
    try:
        for impl in ("flashback", "pytorch_flash"):
            if impl == "flashback":
                torch.nn.attention.activate_flash_attention_impl("flashback")
            for causal in (True, False):
                gen = torch.Generator(device="cuda").manual_seed(2026)
                shape = (1, args.nheads, args.seqlen, HEADDIM)
                q, k, v, dout = (torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
                                 for _ in range(4))

                def step():
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                    with torch.nn.attention.sdpa_kernel(flash):
                        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                    out.backward(dout)

                def timed():
                    times = []
                    for i in range(args.iters + 2):
                        if world > 1:
                            dist.barrier()
                        torch.cuda.synchronize()
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        step()
                        end.record()
                        torch.cuda.synchronize()
                        if i >= 2:
                            times.append(start.elapsed_time(end))
                    return statistics.median(times)

                if world > 1:
                    _cp_options.enable_load_balance = causal
                    with context_parallel(mesh, buffers=[q, k, v, dout], buffer_seq_dims=[2, 2, 2, 2]):
                        ms = timed()
                    slowest = torch.tensor([ms], device="cuda")
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                    ms = slowest.item()
                else:
                    ms = timed()
                # Which kernels the last ring step ran (a declined chunk would fall through to
                # PyTorch's flash kernel without a word).
                paths = (flashback.last_forward_path(), flashback.last_backward_path())
                rows.append((impl, causal, ms, paths))
            if impl == "flashback":
                torch.nn.attention.restore_flash_attention_impl()
    finally:
        if world > 1:
            dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def run(world, args):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = mp.start_processes(_worker, args=(world, _free_port(), args, results), nprocs=world,
                               join=False, start_method="spawn")
    rows = results.get(timeout=1200)
    procs.join()
    for impl, causal, _, paths in rows:
        if impl == "flashback" and paths != ("sm90", "sm90"):
            print(f"WARNING: {world} GPU(s), causal={causal}: the flashback row ran {paths}, not sm90")
    return {(impl, causal): ms for impl, causal, ms, _ in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int, default=32768, help="tokens of the one sequence (all ranks)")
    ap.add_argument("--nheads", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if not hasattr(torch.nn.attention, "activate_flash_attention_impl"):
        raise SystemExit("this PyTorch has no flash-attention provider registry (< 2.10)")
    worlds = [1, 2] if torch.cuda.device_count() >= 2 else [1]
    got = {w: run(w, args) for w in worlds}
    print(f"{torch.cuda.get_device_name()} x{max(worlds)}  torch {torch.__version__}  "
          f"1 sequence of {args.seqlen} tokens, {args.nheads} heads, head dim {HEADDIM}, bf16, "
          f"forward + backward, median of {args.iters}")
    print(f"{'impl':14s} {'causal':6s} {'1 GPU ms':>9s} {'TFLOP/s':>8s} " +
          (f"{'2 GPUs ms':>10s} {'speedup':>8s} {'ring overhead ms':>17s}" if 2 in got else ""))
    for impl in ("flashback", "pytorch_flash"):
        for causal in (True, False):
            one = got[1][(impl, causal)]
            line = f"{impl:14s} {str(causal):6s} {one:9.2f} {_flops(args.seqlen, args.nheads, causal) / one / 1e9:8.1f} "
            if 2 in got:
                two = got[2][(impl, causal)]
                line += f"{two:10.2f} {one / two:8.2f} {two - one / 2:17.2f}"
            print(line)


if __name__ == "__main__":
    main()
