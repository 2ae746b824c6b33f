"""The model transforms and the fused head, on the CPU: activation checkpointing, FP8 (conversion and the
fused head's float8 matmuls, which the CPU build of torch can run), fused_ce."""
import pytest
import torch

import configurator
from conftest import assert_same_outputs, outputs_and_grads
from model import GPT, GPTConfig
from speedgpt import activation_checkpointing, fp8
from speedgpt.fused_ce import FusedHeadLoss, LinearCrossEntropy


def tiny(attention="sdpa", dropout=0.1, vocab_size=64, **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, vocab_size=vocab_size, n_layer=3, n_head=2, n_embd=32, dropout=dropout,
                         attention=attention, **kw)).double()


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("with_docs", [False, True])
def test_checkpointing_gradients_equal(attention, with_docs):
    """none / full / selective: same loss and gradients, with dropout on (the recomputation replays
    the same dropout masks)."""
    idx, tgt = torch.randint(0, 64, (2, 32)), torch.randint(0, 64, (2, 32))
    doc_ids = torch.cumsum(torch.rand(2, 32) < 0.15, dim=1) if with_docs else None
    results = {}
    for mode in ("none", "full", "selective"):
        m = tiny(attention).train()
        if mode != "none":
            activation_checkpointing.apply(m, mode)
        torch.manual_seed(123)                           # the same dropout masks in every run
        results[mode] = outputs_and_grads(m, idx, tgt, doc_ids)
    assert results["none"][1] != tiny(attention, dropout=0.0)(idx, tgt, doc_ids)[1]   # dropout really on
    for mode in ("full", "selective"):
        assert_same_outputs(results[mode], results["none"], rtol=0, atol=0, grad_rtol=1e-12, grad_atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["naive", "sdpa", "flex"])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointed_blocks_stay_compiled(attention, mode):
    """Under torch.compile every checkpointed block must be traced (one checkpoint region per layer in
    the graphs), not sent back to eager. A side effect in forward (it once assigned a global when flex
    first ran) makes Dynamo drop the whole block loop to eager: half the tokens/s on the H200.
    Parameters are frozen so FlexAttention may trace on the CPU (it has no backward there)."""
    import torch._dynamo as dynamo
    m = tiny(attention, dropout=0.0).float().requires_grad_(False)
    activation_checkpointing.apply(m, mode)
    idx = torch.randint(0, 64, (2, 32))
    doc_ids = torch.cumsum(torch.rand(2, 32) < 0.15, dim=1)
    dynamo.reset()
    explained = dynamo.explain(m)(idx, idx, doc_ids)
    regions = [n for g in explained.graphs for n in g.graph.nodes if "checkpoint" in str(n.target)]
    assert len(regions) == m.config.n_layer, explained.break_reasons


def test_what_each_mode_recomputes():
    """Ops run during backward: full recomputes the matmuls and GELUs of the forward, selective
    recomputes the GELUs but keeps the matmul outputs, none recomputes nothing."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            self.ops[name] = self.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    def backward_ops(mode):
        m = tiny(dropout=0.0)
        if mode != "none":
            activation_checkpointing.apply(m, mode)
        _, loss = m(torch.randint(0, 64, (2, 32)), torch.randint(0, 64, (2, 32)))
        with Count() as c:
            loss.backward()
        return c.ops
    none, full, sel = backward_ops("none"), backward_ops("full"), backward_ops("selective")
    assert none.get("gelu", 0) == 0 and full["gelu"] == sel["gelu"] == 3          # one per block
    # full reruns 3 of each block's 4 matmuls (the last one's output is not needed: recomputation
    # stops early) and its attention; selective reruns neither
    attn = "_scaled_dot_product_flash_attention_for_cpu"
    assert full["mm"] - none["mm"] == 3 * 3 and full[attn] == 3
    assert sel["mm"] == none["mm"] and sel.get(attn, 0) == 0


def test_fp8_converts_exactly_the_eligible_layers():
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear
    m = GPT(GPTConfig(block_size=64, vocab_size=1000, n_layer=2, n_head=4, n_embd=512))
    m.transformer.h[0].attn.c_proj = torch.nn.Linear(512, 256, bias=False)    # narrower than fp8_min_dim
    m.transformer.h[1].mlp.c_proj = torch.nn.Linear(2048, 504, bias=False)    # 504: not a multiple of 16
    converted = fp8.convert(m, configurator.Config(fp8=True, fp8_min_dim=512))
    expected = ["transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj",
                "transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj", "transformer.h.1.mlp.c_fc"]
    assert sorted(converted) == expected                                      # never the output head
    assert sorted(n for n, mod in m.named_modules() if isinstance(mod, Float8Linear)) == expected
    assert m.lm_head.weight is m.transformer.wte.weight
    with pytest.raises(ValueError, match="no Linear layer is eligible"):
        fp8.convert(GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32)),
                    configurator.Config(fp8=True))


def test_fused_ce_gives_the_plain_loss_and_gradients():
    """fused_ce (LinearCrossEntropy, gradients made in the forward, chunk by chunk): the loss and every
    gradient of the plain path, with ignored targets, a padded vocabulary (61 -> 64: the padded ids stay
    out of the softmax) and chunks that do not divide the tokens; no logits in training; in eval
    (no gradients) the plain path with its logits."""
    torch.manual_seed(0)
    idx, tgt = torch.randint(0, 61, (2, 32)), torch.randint(0, 61, (2, 32))
    tgt[0, ::3] = -1
    doc_ids = torch.cumsum(torch.rand(2, 32) < 0.15, dim=1)
    out = {}
    for chunk in (0, 24, 64):
        m = tiny(dropout=0.0, vocab_size=61)
        if chunk:                                   # what train.py's fused_ce.install does
            m.head_loss = FusedHeadLoss(chunk)
        out[chunk] = outputs_and_grads(m, idx, tgt, doc_ids)
        assert (out[chunk][0] is None) == (chunk > 0)
        with torch.no_grad():
            logits, eval_loss = m(idx, tgt, doc_ids)
        assert logits.shape == (2, 32, 64) and torch.isinf(logits[..., 61:]).all()
        torch.testing.assert_close(eval_loss, out[0][1], rtol=1e-12, atol=0)
    for chunk in (24, 64):
        assert_same_outputs(out[chunk], out[0], rtol=1e-12, atol=0, grad_rtol=1e-10, grad_atol=1e-13)


def test_fp8_mm_is_torchao_float8_linear_tensorwise():
    """fp8.fp8_mm follows torchao's tensorwise recipe bit for bit: the head's forward and grad-input
    matmuls equal Float8Linear's (a gradient of amax 1, the bound fp8_mm assumes for softmax -
    one-hot), the grad-weight one too in bf16 (fused_ce keeps it in float32). CPU float8 matmul."""
    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear
    torch.manual_seed(0)
    h = torch.randn(256, 64, dtype=torch.bfloat16, requires_grad=True)
    lin = torch.nn.Linear(64, 512, bias=False).bfloat16()
    head = Float8Linear.from_float(lin, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    out = head(h)
    g = torch.randn(256, 512, dtype=torch.bfloat16)
    g = g / g.abs().max()
    out.backward(g)
    w = lin.weight.detach()
    assert torch.equal(fp8.fp8_mm(h.detach(), w.t(), torch.bfloat16, fast_accum=True), out)
    assert torch.equal(fp8.fp8_mm(g, w, torch.bfloat16, a_amax=1.0), h.grad)
    assert torch.equal(fp8.fp8_mm(g.t(), h.detach(), torch.bfloat16, a_amax=1.0), head.weight.grad)
    exact = g.float() @ w.float()
    assert not torch.equal(h.grad.float(), exact)                           # FP8 did round
    torch.testing.assert_close(h.grad.float(), exact, rtol=0.3, atol=0.3 * exact.abs().mean().item())


def test_fused_ce_in_fp8_is_close_to_bf16():
    """fp8_head with fused_ce: LinearCrossEntropy's matmuls in float8 (torchao's tensorwise scaling)
    give the bf16 path's loss and gradients within FP8 rounding, not exactly (CPU float8 matmul)."""
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    h = torch.randn(300, 64, requires_grad=True)
    w = torch.nn.Parameter(0.1 * torch.randn(512, 64))
    y = torch.randint(0, 500, (300,))
    y[::7] = -1
    out = []
    for in_fp8 in (False, True):
        h.grad = w.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = LinearCrossEntropy.apply(h, w, y, 500, 128, in_fp8)
        loss.backward()
        out.append((loss.item(), h.grad.clone(), w.grad.clone()))
    assert out[0][0] != out[1][0] and abs(out[0][0] - out[1][0]) < 2e-3 * out[0][0]
    for a, b in zip(out[0][1:], out[1][1:]):
        assert not torch.equal(a, b) and (a - b).norm() < 0.06 * a.norm()


def test_fused_ce_in_fp8_casts_the_weight_once_with_the_same_result():
    """LinearCrossEntropy casts the head's weight to float8 once for all chunks (fp8.cast_rhs, both
    layouts); each chunk then gives exactly what head_ce_chunk gives when it casts the weight itself."""
    pytest.importorskip("torchao")
    from speedgpt.fused_ce import head_ce_chunk
    torch.manual_seed(0)
    h = torch.randn(256, 64, dtype=torch.bfloat16)
    w = (0.1 * torch.randn(512, 64)).bfloat16()
    y = torch.randint(0, 500, (256,))
    w8 = fp8.cast_rhs(w.t()), fp8.cast_rhs(w)
    assert w8[0][0].dtype == torch.float8_e4m3fn and w8[0][0].stride() == (1, 64)     # column-major (64, 512)
    for s in (0, 128):
        once = head_ce_chunk(h[s:s + 128], w, y[s:s + 128], 500, True, w8)
        each = head_ce_chunk(h[s:s + 128], w, y[s:s + 128], 500, True)
        for a, b in zip(once, each):
            assert torch.equal(a, b)
