"""A real model on the SDPA provider: a small Llama-style transformer with head dim 256 (random
init, built from a config with the `transformers` library), forward + backward with PyTorch's
flash kernels and with flashback's behind them; both against the same model in fp32 (math
backend). The bar as in the kernel tests: flashback's error on the loss and on the gradients
is at most twice PyTorch's bf16 flash error, plus 1e-5."""
import copy
import os

import pytest
import torch

import flashback

transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not hasattr(torch.nn.attention, "activate_flash_attention_impl"),
                       reason="this PyTorch has no flash-attention provider registry (< 2.10)"),
    pytest.mark.skipif(os.environ.get("FLASHBACK_FORCE_REFERENCE", "0") not in ("", "0"),
                       reason="FLASHBACK_FORCE_REFERENCE is set: nothing runs on the Hopper kernels"),
]
SDPB = torch.nn.attention.SDPBackend


def _model():
    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=256, max_position_embeddings=4096,
        attn_implementation="sdpa")
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    return transformers.LlamaForCausalLM(config).cuda()


def _loss_and_grads(model, ids, backends):
    model.zero_grad(set_to_none=True)
    with torch.nn.attention.sdpa_kernel(backends):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return loss.detach().float(), grads


def test_llama_head_dim_256_on_the_provider():
    model32 = _model()
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
    assert torch.isfinite(loss_fb) and bool(torch.isfinite(g_fb).all())
    err_loss_pt, err_loss_fb = (loss_pt - loss32).abs().item(), (loss_fb - loss32).abs().item()
    assert err_loss_fb <= 2 * err_loss_pt + 1e-5, f"loss error {err_loss_fb:.3e} vs PyTorch flash {err_loss_pt:.3e}"
    err_pt, err_fb = (g_pt - g32).abs().max().item(), (g_fb - g32).abs().max().item()
    assert err_fb <= 2 * err_pt + 1e-5, f"gradient max abs error {err_fb:.3e} vs PyTorch flash {err_pt:.3e}"
