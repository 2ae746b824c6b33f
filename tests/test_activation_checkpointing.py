"""speedgpt/features/activation_checkpointing.py on the CPU: full and selective checkpointing give the loss and gradients
of none (dropout on), recompute what each mode should, and keep every checkpointed block compiled."""
import pytest
import torch

from conftest import assert_same_outputs, outputs_and_grads
from conftest import tiny_gpt as tiny
from speedgpt.features import activation_checkpointing


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
            activation_checkpointing.checkpoint_blocks(m, mode)
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
    activation_checkpointing.checkpoint_blocks(m, mode)
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
            activation_checkpointing.checkpoint_blocks(m, mode)
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
