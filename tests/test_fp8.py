"""speedgpt/fp8.py on the CPU: the rowwise recipe's math (float8 operands multiplied in float32, as
torch._scaled_mm does on the GPU: tests/test_gpu.py compares the two), its conversion, and its refusals."""
import pytest
import torch

import configurator
from model import GPT, GPTConfig
from speedgpt import fp8


def test_rowwise_cast_scales_each_row_to_the_float8_range():
    t = torch.randn(64, 96) * torch.logspace(-3, 3, 64)[:, None]      # rows of very different magnitudes
    t[5] = 0                                                          # a row of zeros stays exact
    t8, scale = fp8.rowwise_cast(t)
    assert t8.dtype == torch.float8_e4m3fn and scale.shape == (64, 1)
    assert torch.equal(t8.float().abs().amax(-1)[torch.arange(64) != 5], torch.full((63,), 448.0))
    back = t8.float() * scale
    assert torch.equal(back[5], torch.zeros(96))
    assert ((back - t).norm(dim=-1) / t.norm(dim=-1).clamp(min=1e-30))[torch.arange(64) != 5].max() < 0.05


def test_rowwise_linear_is_close_to_bf16_and_keeps_the_weight_gradient_in_bf16():
    """Forward and input gradient through float8 (a few percent off bf16), the weight gradient a bf16 matmul of
    the same operands as nn.Linear's (equal to it up to bf16 rounding of the output gradient's path)."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 96, bias=False)
    lin = torch.nn.Linear(64, 96, bias=False)
    lin.load_state_dict(ref.state_dict())
    lin.__class__ = fp8.RowwiseFloat8Linear
    x = torch.randn(4, 32, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    gy = torch.randn(4, 32, 96)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_ref = lin(x), ref(x2)
    y.backward(gy)
    y_ref.backward(gy)
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    assert y.dtype == torch.bfloat16 and y.shape == (4, 32, 96)
    assert 1e-3 < rel(y, y_ref) < 0.06 and 1e-3 < rel(x.grad, x2.grad) < 0.06     # float8, not bf16
    assert rel(lin.weight.grad, ref.weight.grad) < 1e-2 and lin.weight.grad.dtype == torch.float32


def test_the_rowwise_recipe_converts_the_eligible_linears_without_torchao(monkeypatch):
    """fp8_recipe='rowwise_bf16_wgrad' swaps the class of the eligible block Linears (state-dict keys unchanged,
    the head never) and needs no torchao; the model still trains a step on the CPU."""
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else object())
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))
    keys = list(m.state_dict())
    cfg = configurator.Config(fp8=True, fp8_recipe="rowwise_bf16_wgrad", fp8_min_dim=32, fp8_layers="fc,mlp_proj")
    names = fp8.convert(m, cfg)
    assert sorted(names) == [f"transformer.h.{i}.mlp.{k}" for i in range(2) for k in ("c_fc", "c_proj")]
    assert type(m.transformer.h[0].mlp.c_fc) is fp8.RowwiseFloat8Linear
    assert type(m.transformer.h[0].attn.c_attn) is torch.nn.Linear and type(m.lm_head) is torch.nn.Linear
    assert list(m.state_dict()) == keys
    idx = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = m(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and m.transformer.h[0].mlp.c_fc.weight.grad is not None


def test_the_rowwise_recipe_is_refused_where_it_cannot_run():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"fp8=True needs a GPU of compute capability 8.9 .* add --fp8=False"):
        fp8.check(configurator.Config(fp8=True, fp8_recipe="rowwise_bf16_wgrad"), cpu)
    with pytest.raises(ValueError, match="fp8_recipe='rowwise_bf16_wgrad' would do nothing"):
        fp8.check(configurator.Config(fp8_head=True, fused_ce=True, fp8_recipe="rowwise_bf16_wgrad"), cpu)
    with pytest.raises(ValueError, match="fp8_recipe"):
        configurator.load_config(["--fp8_recipe=rowwise_bf16"])
