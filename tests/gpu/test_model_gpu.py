"""A real model on the SDPA provider: a small Llama-style transformer with head dim 128 or 256 (random
init, built from a config with the `transformers` library), forward + backward with PyTorch's
flash kernels and with flashback's behind them; both against the same model in fp32 (math
backend). The bar as in the kernel tests: flashback's error on the per-token losses and on the gradients
is at most twice PyTorch's bf16 flash error, plus 1e-5.

The second test packs several sequences into one row (restarting position ids, FlashAttention's
cu_seqlens offsets handed to the model as keyword arguments, the way transformers' flattening
collator does) and runs attention through `flashback.attention_varlen`, registered as a
transformers attention function. Its loss and gradients are checked against the same sequences
run one at a time (fp32 math reference, PyTorch's bf16 flash as the yardstick)."""
import contextlib
import copy
import os

import pytest
import torch

import flashback
from profiling import flashback_kernels, kernels, pytorch_attention_kernels

transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not hasattr(torch.nn.attention, "activate_flash_attention_impl"),
                       reason="this PyTorch has no flash-attention provider registry (< 2.10)"),
    pytest.mark.skipif(os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0"),
                       reason="FLASHBACK_FORCE_REFERENCE is set: nothing runs on the Hopper kernels"),
]
SDPB = torch.nn.attention.SDPBackend


def _model(head_dim=256):
    """hidden size 1024 as 1024 / head_dim query heads, half as many K/V heads (GQA)."""
    heads = 1024 // head_dim
    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=head_dim,
        max_position_embeddings=4096, attn_implementation="sdpa")
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    return transformers.LlamaForCausalLM(config).cuda()


def _grads(model):
    return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])


def _check_bar(loss_fb, loss_pt, loss32, g_fb, g_pt, g32):
    """The kernels' bar on per-token losses and on all parameter gradients: flashback's max abs
    error against fp32 at most twice PyTorch's bf16 flash error, plus 1e-5."""
    assert bool(torch.isfinite(loss_fb).all()) and bool(torch.isfinite(g_fb).all())
    for name, ours, theirs, ref in (("per-token loss", loss_fb, loss_pt, loss32), ("gradient", g_fb, g_pt, g32)):
        err_pt, err_fb = (theirs - ref).abs().max().item(), (ours - ref).abs().max().item()
        assert err_fb <= 2 * err_pt + 1e-5, f"{name} max abs error {err_fb:.3e} vs PyTorch flash {err_pt:.3e}"


def _loss_and_grads(model, ids, backends):
    """backends None: no sdpa_kernel() around the model, as a user runs it."""
    model.zero_grad(set_to_none=True)
    with torch.nn.attention.sdpa_kernel(backends) if backends is not None else contextlib.nullcontext():
        logits = model(input_ids=ids).logits
    # Per-token losses: a vector's max error is a stable measure, a mean's is mostly luck.
    tokens = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(),
                                               reduction="none")
    tokens.mean().backward()
    return tokens.detach(), _grads(model)


@pytest.mark.parametrize("head_dim", [128, 256], ids=["d128", "d256"])
def test_llama_on_the_provider(head_dim):
    model32 = _model(head_dim)
    model = copy.deepcopy(model32).to(torch.bfloat16)
    ids = torch.randint(0, 1024, (2, 2048), device="cuda")
    loss32, g32 = _loss_and_grads(model32, ids, [SDPB.MATH])
    loss_pt, g_pt = _loss_and_grads(model, ids, [SDPB.FLASH_ATTENTION])
    torch.nn.attention.activate_flash_attention_impl("flashback")
    try:
        before = flashback.last_backward_path()
        loss_fb, g_fb = _loss_and_grads(model, ids, [SDPB.FLASH_ATTENTION])
        assert flashback.last_forward_path() == "sm90" and flashback.last_backward_path() == "sm90", \
            (before, flashback.last_forward_path(), flashback.last_backward_path())
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    _check_bar(loss_fb, loss_pt, loss32, g_fb, g_pt, g32)


@pytest.mark.parametrize("head_dim", [128, 256], ids=["d128", "d256"])
def test_llama_sdpa_without_naming_a_backend_runs_on_flashback(head_dim):
    """The model as a user runs it (attn_implementation="sdpa", no sdpa_kernel()): activation
    alone sends its attention, forward and backward, to flashback's Hopper kernels (by kernel
    name), within the bar; after restore it runs exactly the kernels it ran before."""
    model32 = _model(head_dim)
    model = copy.deepcopy(model32).to(torch.bfloat16)
    ids = torch.randint(0, 1024, (2, 2048), device="cuda")
    loss32, g32 = _loss_and_grads(model32, ids, [SDPB.MATH])
    loss_pt, g_pt = _loss_and_grads(model, ids, [SDPB.FLASH_ATTENTION])

    def step():
        return _loss_and_grads(model, ids, None)

    step()  # PyTorch settles its priority order and builds its plans on the first call
    before = kernels(step)
    assert pytorch_attention_kernels(before) and not flashback_kernels(before), sorted(before)
    res = []
    torch.nn.attention.activate_flash_attention_impl("flashback")
    try:
        active = kernels(lambda: res.append(step()))
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    ours = flashback_kernels(active)
    assert any("sm90" in n and "fwd" in n for n in ours) and any("sm90" in n and "bwd" in n for n in ours), \
        sorted(ours)
    assert not pytorch_attention_kernels(active), sorted(pytorch_attention_kernels(active))
    loss_fb, g_fb = res[0]
    _check_bar(loss_fb, loss_pt, loss32, g_fb, g_pt, g32)
    step()
    after = kernels(step)
    assert after == before, f"after restore: {sorted(after ^ before)} differ"


_PACKED_NAME = "packed_varlen_fb"  # transformers treats any name containing "flash" as a FlashAttention build


_PACKED_CALLS = [0]


def _packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: query (1, heads, tokens, d) holding packed sequences."""
    _PACKED_CALLS[0] += 1
    assert "cu_seq_lens_q" in kwargs, f"the packed offsets did not reach attention (kwargs: {sorted(kwargs)})"
    assert query.shape[0] == 1 and dropout == 0.0
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    out = flashback.attention_varlen(q, k, v, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"],
                                     kwargs["max_length_q"], kwargs["max_length_k"], causal=True,
                                     softmax_scale=scaling)
    return out.unsqueeze(0), None


def _use_packed_attention(model):
    transformers.AttentionInterface.register(_PACKED_NAME, _packed_attention)
    masks = getattr(transformers, "AttentionMaskInterface", None)
    if masks is not None:  # the offsets carry the masking; no mask tensor is built
        masks.register(_PACKED_NAME, lambda *args, **kwargs: None)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(_PACKED_NAME)
    else:
        model.config._attn_implementation = _PACKED_NAME


def _next_token_loss(logits, ids, bounds):
    """Per-token next-token cross entropy inside each sequence (never across a boundary)."""
    return torch.cat([torch.nn.functional.cross_entropy(logits[s:e - 1].float(), ids[s + 1:e], reduction="none")
                      for s, e in bounds if e - s > 1])


def _one_at_a_time(model, ids, bounds, backends):
    model.zero_grad(set_to_none=True)
    with torch.nn.attention.sdpa_kernel(backends):
        logits = torch.cat([model(input_ids=ids[None, s:e]).logits[0] for s, e in bounds])
    tokens = _next_token_loss(logits, ids, bounds)
    tokens.mean().backward()
    return tokens.detach(), _grads(model)


@pytest.mark.skipif(not hasattr(transformers, "AttentionInterface"),
                    reason="this transformers has no AttentionInterface (< 4.48)")
def test_llama_packed_varlen_batch_matches_one_sequence_at_a_time():
    lengths = [1000, 1, 17, 1030]
    bounds, start = [], 0
    for n in lengths:
        bounds.append((start, start + n))
        start += n
    model32 = _model()
    model_pt = copy.deepcopy(model32).to(torch.bfloat16)
    model_fb = copy.deepcopy(model_pt)
    _use_packed_attention(model_fb)
    ids = torch.randint(0, 1024, (start,), device="cuda")
    loss32, g32 = _one_at_a_time(model32, ids, bounds, [SDPB.MATH])
    loss_pt, g_pt = _one_at_a_time(model_pt, ids, bounds, [SDPB.FLASH_ATTENTION])

    cu = torch.tensor([0] + [e for _, e in bounds], dtype=torch.int32, device="cuda")
    positions = torch.cat([torch.arange(e - s, device="cuda") for s, e in bounds])[None]
    model_fb.zero_grad(set_to_none=True)
    _PACKED_CALLS[0] = 0
    logits = model_fb(input_ids=ids[None], position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                      max_length_q=max(lengths), max_length_k=max(lengths)).logits[0]
    # Every layer's attention went through the packed function (not a mask rebuilt for SDPA).
    assert _PACKED_CALLS[0] == model_fb.config.num_hidden_layers, _PACKED_CALLS[0]
    assert flashback.last_forward_path() == "sm90", flashback.last_forward_path()
    loss_fb = _next_token_loss(logits, ids, bounds)
    loss_fb.mean().backward()
    assert flashback.last_backward_path() == "sm90", flashback.last_backward_path()
    loss_fb, g_fb = loss_fb.detach(), _grads(model_fb)

    _check_bar(loss_fb, loss_pt, loss32, g_fb, g_pt, g32)
