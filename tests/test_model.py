"""model.py on the CPU: naive and sdpa attention agree, the loss (ignored targets, the padded vocabulary kept out
of the softmax), flops per token, bad construction refused, gelu_tanh, sampling with a KV cache; the model's list
of its parts (block_linears) and who asks it; the blocks beside GPT-2's (norm, rope, qk_norm, relu2,
tie_embeddings): each its formula, through every CPU backend, compile, FP8 and the fused head, trained and resumed."""
import math
import re
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import configurator
import model
import sample
import train
from conftest import (assert_same_outputs, outputs_and_grads, read_metrics, rotary_reference, set_qk_blocks,
                      tiny_args)
from model import GPT, GPTConfig, KVCache
from speedgpt import memory, optim
from speedgpt.checkpoint import load_checkpoint


def tiny(attention="sdpa", **kw):
    torch.manual_seed(0)
    cfg = dict(block_size=64, vocab_size=100, n_layer=2, n_head=4, n_embd=32, attention=attention)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg)).double()


@pytest.mark.parametrize("with_docs", [False, True])
def test_naive_sdpa_parity(with_docs):
    """Same weights, same input: naive (materialised T x T) and sdpa give the same logits and grads."""
    idx = torch.randint(0, 100, (3, 64))
    tgt = torch.randint(0, 100, (3, 64))
    doc_ids = torch.cumsum(torch.rand(3, 64) < 0.1, dim=1) if with_docs else None
    naive, sdpa = (outputs_and_grads(tiny(attention), idx, tgt, doc_ids) for attention in ("naive", "sdpa"))
    assert_same_outputs(naive, sdpa, rtol=1e-9, atol=1e-9, grad_rtol=1e-8, grad_atol=1e-10)


def test_ignored_targets():
    m = tiny()
    idx, tgt = torch.randint(0, 100, (2, 64)), torch.randint(0, 100, (2, 64))
    tgt[0, 10:] = -1
    tgt[1, :5] = -1
    logits, loss = m(idx, tgt)
    keep = tgt != -1
    manual = F.cross_entropy(logits[keep], tgt[keep])
    torch.testing.assert_close(loss, manual)
    # an ignored target's value cannot change the loss
    tgt2 = tgt.clone()
    tgt2[~keep] = -1
    assert torch.equal(m(idx, tgt2)[1], loss)
    all_ignored = torch.full_like(tgt, -1)
    assert m(idx, all_ignored)[1].item() == 0.0


def test_vocab_padding_and_init_loss():
    m = tiny(vocab_size=257)
    assert m.lm_head.weight.shape[0] == 320 and m.config.padded_vocab_size % 64 == 0
    assert m.transformer.wte.weight is m.lm_head.weight           # tied
    logits, loss = m(torch.randint(0, 257, (4, 64)), torch.randint(0, 257, (4, 64)))
    assert abs(loss.item() - math.log(257)) < 0.05                 # about uniform over the real ids at init
    assert torch.isneginf(logits[..., 257:]).all() and torch.isfinite(logits[..., :257]).all()


def test_padded_ids_stay_out_of_the_softmax():
    """Zero rows for the padded ids (as in weights from GPT-2) give logit 0, which must not enter the
    loss: it equals the cross-entropy over the real vocabulary, and no padded id is ever sampled."""
    m = tiny(vocab_size=70)                                        # padded to 128
    with torch.no_grad():
        m.lm_head.weight[70:] = 0
        m.lm_head.weight[70:, 0] = 50.0                            # padded ids that would dominate
    idx, tgt = torch.randint(0, 70, (2, 64)), torch.randint(0, 70, (2, 64))
    logits, loss = m(idx, tgt)
    real = F.linear(m.transformer.ln_f(m.transformer.h[1](m.transformer.h[0](
        m.transformer.wte(idx) + m.transformer.wpe(torch.arange(64))))), m.lm_head.weight[:70])
    torch.testing.assert_close(logits[..., :70], real)
    torch.testing.assert_close(loss, F.cross_entropy(real.view(-1, 70), tgt.view(-1)))
    loss.backward()
    assert m.lm_head.weight.grad[70:].abs().sum() == 0             # the padded rows learn nothing
    assert (m.generate(idx[:, :4], 20, top_k=None) < 70).all()


def test_temperature_zero_is_greedy():
    """temperature=0: each new token is the likeliest after its context (argmax), and no random number is drawn."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=70, block_size=32, n_layer=2, n_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 70, (2, 5))
    rng = torch.get_rng_state()
    out = m.generate(idx, 12, temperature=0)
    assert torch.equal(torch.get_rng_state(), rng)
    for t in range(5, out.size(1)):
        logits, _ = m(out[:, :t])
        assert torch.equal(out[:, t], logits[:, -1, :70].argmax(-1))


def test_flops_per_token_gpt2_124m():
    m = GPT(GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    n = sum(p.numel() for p in m.parameters()) - 1024 * 768
    assert m.num_params() == n and 123e6 < m.num_params() + 1024 * 768 < 125e6
    assert m.flops_per_token() == 6 * n + 12 * 12 * 12 * 64 * 1024


def test_rejects_bad_construction():
    with pytest.raises(ValueError, match="attention"):
        tiny("fast")
    with pytest.raises(ValueError, match="dropout"):
        tiny("flex", dropout=0.1)
    with pytest.raises(ValueError, match="block_size"):
        tiny()(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^norm='batchnorm': expected one of " + re.escape(str(tuple(model.NORMS)))):
        tiny(norm="batchnorm")
    with pytest.raises(ValueError, match=r"^rope=True turns pairs .* n_embd / n_head = 5 must be even$"):
        tiny(n_embd=20, rope=True)


def test_gelu_tanh_is_the_tanh_approximation():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    m = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=1, n_embd=8, activation="gelu_tanh")).double()
    # GPT-2's gelu (Hendrycks & Gimpel 2016)
    want = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)))
    torch.testing.assert_close(m.transformer.h[0].mlp.act(x), want)
    assert (F.gelu(x) - want).abs().max() > 1e-4                # the exact gelu is another function


# -----------------------------------------------------------------------------
# sampling with a KV cache (GPT.generate(use_cache=True))

def sampler(attention="sdpa", rope=False):
    """A float64 model with block_size 16 whose output depends on positions (attention sharpened, position
    embeddings scaled up), rotary embeddings (rope=True) instead of them when `rope`; eval mode."""
    m = tiny(attention, block_size=16, rope=rope).eval()
    with torch.no_grad():
        for block in m.transformer.h:
            block.attn.c_attn.weight.mul_(20)
        if not rope:
            m.transformer.wpe.weight.mul_(5)
    return m


def generate_counting(m, idx, *args, **kwargs):
    """(m.generate(idx, ...), the number of positions of each forward it ran)."""
    lengths = []
    hook = m.transformer.wte.register_forward_pre_hook(lambda module, inputs: lengths.append(inputs[0].size(1)))
    try:
        return m.generate(idx, *args, **kwargs), lengths
    finally:
        hook.remove()


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_kv_cache_greedy_ids_match_past_block_size(attention, rope):
    """Greedy ids are the same with and without the cache, past block_size too, also with rotary embeddings
    (the cached keys go through transform_qk at their absolute positions). With the cache, the prompt is one
    forward and each token after it one position until the context fills block_size; from there the window
    moves every token and each is a forward of block_size positions, as without the cache."""
    m = sampler(attention, rope)
    idx = torch.randint(0, 100, (2, 3), generator=torch.Generator().manual_seed(1))
    plain, plain_lengths = generate_counting(m, idx, 60, top_k=1, use_cache=False)
    cached, cached_lengths = generate_counting(m, idx, 60, top_k=1)        # use_cache=True by default
    assert plain_lengths == [min(3 + i, 16) for i in range(60)]
    assert cached_lengths == [3] + [1] * 13 + [16] * 46
    assert torch.equal(cached, plain), (cached, plain)


@pytest.mark.parametrize("rope", [False, True])
def test_kv_cache_logits_match_the_full_forward(rope):
    """A prefill, a chunk of 4 positions, then one position at a time give the logits of one forward of the
    whole sequence, at every position; with rotary embeddings too, and those change the logits."""
    m = sampler(rope=rope)
    idx = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, _ = m(idx)
        kv_cache = [KVCache(16) for _ in m.transformer.h]
        pieces = [m(idx[:, :5], kv_cache=kv_cache)[0], m(idx[:, 5:9], kv_cache=kv_cache)[0]]
        pieces += [m(idx[:, t:t + 1], kv_cache=kv_cache)[0] for t in range(9, 16)]
        with pytest.raises(ValueError, match="exceeds block_size 16"):      # the cache is full
            m(idx[:, :1], kv_cache=kv_cache)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-10)
    if rope:
        set_qk_blocks(m, rope=False, qk_norm=False)
        with torch.no_grad():
            assert (m(idx)[0] - full)[..., :100].abs().max() > 1e-3          # the rotation is applied


def test_kv_cache_top_k_sampling_draws_the_same_ids():
    """top_k sampling from one seed gives the same ids with and without the cache, past block_size: the
    same distributions, the same random draws in the same order (another seed draws other ids)."""
    m = sampler()
    idx = torch.randint(0, 100, (2, 3), generator=torch.Generator().manual_seed(1))
    draws = []
    for seed, use_cache in ((0, False), (0, True), (1, True)):
        torch.manual_seed(seed)
        draws.append(m.generate(idx, 60, temperature=1.5, top_k=20, use_cache=use_cache))
    assert torch.equal(draws[1], draws[0])
    assert not torch.equal(draws[2], draws[0])


def test_kv_cache_stays_out_of_the_model_and_training():
    """Sampling with the cache adds nothing to the state dict and leaves a training step's loss, logits and
    gradients bit for bit as they were; the cache refuses packed batches."""
    m = tiny(dropout=0.0)
    idx, tgt = torch.randint(0, 100, (2, 64)), torch.randint(0, 100, (2, 64))
    state = {k: v.clone() for k, v in m.state_dict().items()}
    before = outputs_and_grads(m, idx, tgt)
    m.zero_grad(set_to_none=True)
    m.eval().generate(idx[:, :4], 70)
    assert m.state_dict().keys() == state.keys() and all(torch.equal(m.state_dict()[k], v) for k, v in state.items())
    after = outputs_and_grads(m.train(), idx, tgt)
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    assert all(torch.equal(after[2][n], g) for n, g in before[2].items())
    with pytest.raises(ValueError, match="no doc_ids"):
        m(idx[:, :8], doc_ids=torch.zeros(2, 8, dtype=torch.long), kv_cache=[KVCache(64) for _ in m.transformer.h])


# -----------------------------------------------------------------------------
# the model names its parts: GPT.block_linears, asked by Muon, FP8, the memory estimate (and hf.py)

KINDS = (("attn.c_attn", "qkv"), ("attn.c_proj", "attn_proj"), ("mlp.c_fc", "fc"), ("mlp.c_proj", "mlp_proj"))


def test_block_linears_are_the_blocks_linears_by_kind():
    m = tiny()
    assert [(name, kind) for name, kind, _ in m.block_linears()] == \
        [(f"transformer.h.{i}.{name}", kind) for i in range(2) for name, kind in KINDS]
    assert all(linear is m.get_submodule(name) for name, _, linear in m.block_linears())


class SwiGLU(model.MLP):
    """A forker's SwiGLU MLP (Shazeer 2020): one more Linear, declared with a kind of its own and nothing else."""
    LINEARS = {**model.MLP.LINEARS, "w_gate": "gate"}

    def __init__(self, config):
        super().__init__(config)
        self.w_gate = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.dropout(self.c_proj(F.silu(self.w_gate(x)) * self.c_fc(x)))


def test_a_block_linear_of_no_kind_is_refused_when_the_model_is_built(monkeypatch):
    class Undeclared(SwiGLU):
        LINEARS = model.MLP.LINEARS
    monkeypatch.setattr(model, "MLP", Undeclared)
    with pytest.raises(ValueError, match=r'^transformer\.h\.0\.mlp\.w_gate is an nn.Linear of no kind: add "w_gate": '
                                         r'"<kind>" to Undeclared\.LINEARS in model\.py \(.*\), so that Muon, FP8 and '
                                         r"the exports know it$"):
        tiny()


def test_a_forkers_linear_declared_with_a_kind_reaches_muon_fp8_and_the_estimate(monkeypatch):
    """SwiGLU's w_gate, declared in its LINEARS only: Muon takes it, FP8's default (fp8_layers=all) converts it and
    fp8_layers can name its kind, the memory estimate counts it among the block matrices; the model trains."""
    from speedgpt.features import fp8            # a feature: imported where used, so a fork can delete it
    monkeypatch.setattr(model, "MLP", SwiGLU)
    m = tiny()
    gates = {f"transformer.h.{i}.mlp.w_gate" for i in range(2)}
    muon = optim.param_groups(m, configurator.Config(optimizer="muon"))[0]
    assert muon["muon"] and {id(m.get_submodule(g).weight) for g in gates} <= {id(p) for p in muon["params"]}
    assert len(muon["params"]) == 2 * 5
    cfg = configurator.Config(n_layer=2, n_head=4, n_embd=32, fp8=True, fp8_recipe="tensorwise_fused", fp8_min_dim=32)
    assert fp8.layer_kinds(replace(cfg, fp8_layers="gate"), [k for _, k, _ in m.block_linears()]) == ("gate",)
    assert memory.n_params(cfg, 100)[1] == 2 * (12 + 4) * 32 ** 2
    assert gates <= set(fp8.convert(m.float(), cfg))
    assert type(m.transformer.h[1].mlp.w_gate) is fp8.TensorwiseFloat8Linear
    idx = torch.randint(0, 100, (2, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = m(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and m.transformer.h[0].mlp.w_gate.weight.grad.abs().sum() > 0


# -----------------------------------------------------------------------------
# the blocks beside GPT-2's: each its formula

BLOCKS = {"rmsnorm": dict(norm="rmsnorm"), "rope": dict(rope=True), "qk_norm": dict(qk_norm=True),
          "relu2": dict(activation="relu2"), "untied": dict(tie_embeddings=False)}
ALL_BLOCKS = {k: v for flags in BLOCKS.values() for k, v in flags.items()}


def test_rmsnorm_is_x_over_its_rms_times_the_gain():
    """norm=rmsnorm (Zhang & Sennrich 2019): x * rsqrt(mean(x^2) + eps) * w, in every norm of the model, with no
    bias even where bias=True gives the Linears theirs."""
    m = tiny(norm="rmsnorm", bias=True)
    norms = [m.transformer.h[0].ln_1, m.transformer.h[1].ln_2, m.transformer.ln_f]
    assert all([n for n, _ in norm.named_parameters()] == ["weight"] for norm in norms)
    assert m.transformer.h[0].attn.c_attn.bias is not None
    x = torch.randn(3, 5, 32, dtype=torch.float64) * 3 + 1
    w = torch.randn(32, dtype=torch.float64)
    for norm in norms:
        with torch.no_grad():
            norm.weight.copy_(w)
        torch.testing.assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w)
    layernorm = tiny().transformer.ln_f
    assert (layernorm(x) - norms[0](x) / w).abs().max() > 0.1               # LayerNorm subtracts the mean


def test_rope_is_the_rotation_at_each_documents_positions(monkeypatch):
    """rope=True: q and k rotated (RoFormer) as the hand-written reference rotates them, at positions that restart
    per document ((B, T)) or run on ((T,)); a packed batch rotates each document from position 0; a rotated q.k
    depends on the positions' difference only; no wpe."""
    m = tiny(rope=True)
    rotated_at = []
    monkeypatch.setattr(model, "rotary", lambda x, pos: rotated_at.append(pos) or x)
    m(torch.tensor([[5, 6, 7, 8, 9]]), doc_ids=torch.tensor([[0, 0, 0, 1, 1]]))
    assert len(rotated_at) == 2 * 2 and all(p.tolist() == [[0, 1, 2, 0, 1]] for p in rotated_at)   # q, k per layer
    monkeypatch.undo()
    assert "wpe" not in m.transformer and not any("wpe" in key for key in m.state_dict())
    attn = m.transformer.h[0].attn
    q, k = (torch.randn(2, 12, 4, 8, dtype=torch.float64) for _ in range(2))
    for pos in (torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2], list(range(12))]), torch.arange(12)):
        got_q, got_k = attn.transform_qk(q, k, pos)
        torch.testing.assert_close(got_q, rotary_reference(q, pos), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got_k, rotary_reference(k, pos), rtol=1e-12, atol=1e-12)
    one_q, one_k = q[:1, :1].expand(1, 12, 4, 8), k[:1, :1].expand(1, 12, 4, 8)        # the same vectors everywhere
    rq, rk = attn.transform_qk(one_q, one_k, torch.arange(12))
    score = torch.einsum("bqhd,bkhd->bhqk", rq, rk)[0, 0]                                   # (T, T)
    torch.testing.assert_close(score[7, 5], score[3, 1], rtol=1e-12, atol=1e-12)
    assert (score[7, 5] - score[7, 6]).abs() > 1e-3


def test_qk_norm_is_the_rmsnorm_of_each_heads_q_and_k_before_the_rotation():
    m = tiny(qk_norm=True, rope=True)
    attn = m.transformer.h[0].attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 2)
        attn.k_norm.weight.uniform_(0.5, 2)
    q, k = (5 * torch.randn(2, 12, 4, 8, dtype=torch.float64) for _ in range(2))
    pos = torch.arange(12)

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g
    got_q, got_k = attn.transform_qk(q, k, pos)
    torch.testing.assert_close(got_q, rotary_reference(rms(q, attn.q_norm.weight), pos))
    torch.testing.assert_close(got_k, rotary_reference(rms(k, attn.k_norm.weight), pos))


def test_relu2_is_relu_squared():
    """activation=relu2 (So et al. 2021, Primer): the MLP is c_proj(relu(c_fc(x))^2)."""
    mlp = tiny(activation="relu2").transformer.h[0].mlp
    x = torch.linspace(-3, 3, 101, dtype=torch.float64)
    torch.testing.assert_close(mlp.act(x), torch.where(x > 0, x * x, 0.0))
    h = torch.randn(2, 5, 32, dtype=torch.float64)
    torch.testing.assert_close(mlp(h), mlp.c_proj(torch.relu(mlp.c_fc(h)) ** 2))


def test_untied_embedding_and_head_are_two_parameters_the_optimizer_sees():
    """tie_embeddings=False: wte and lm_head are two Parameters, both in the optimizer's groups, each once; the
    head's matmul is counted once in flops_per_token as when tied (wte is a lookup), rope drops wpe's parameters."""
    m, tied = tiny(tie_embeddings=False), tiny()
    assert m.transformer.wte.weight is not m.lm_head.weight
    assert not torch.equal(m.transformer.wte.weight, m.lm_head.weight)
    groups = optim.param_groups(m, configurator.Config())
    seen = [id(p) for g in groups for p in g["params"]]
    assert {id(m.transformer.wte.weight), id(m.lm_head.weight)} <= set(seen)
    assert len(seen) == len(set(seen)) == len(list(m.parameters())) == len(list(tied.parameters())) + 1
    assert m.num_params(non_embedding=False) == tied.num_params(non_embedding=False) + 128 * 32   # 100 -> 128 rows
    assert m.flops_per_token() == tied.flops_per_token() == tiny(rope=True).flops_per_token()
    assert tiny(rope=True).num_params(non_embedding=False) == tied.num_params(non_embedding=False) - 64 * 32


# -----------------------------------------------------------------------------
# the blocks through every CPU backend, compile, FP8, the fused head; trained, resumed, reloaded


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    idx, tgt = torch.randint(0, 100, (3, 64), generator=g), torch.randint(0, 100, (3, 64), generator=g)
    return idx, tgt, torch.cumsum(torch.rand(3, 64, generator=g) < 0.1, dim=1)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")   # eager flex: the CPU's only
@pytest.mark.parametrize("blocks", BLOCKS)
def test_each_block_is_the_same_model_through_every_cpu_backend(blocks):
    """With packed documents: naive, sdpa and varlen (its CPU reference) give the same logits, loss and gradients;
    flex (forward only on the CPU) the same logits (tests/test_gpu.py: flex and varlen on the GPU)."""
    idx, tgt, doc_ids = batch()
    naive = outputs_and_grads(tiny("naive", **BLOCKS[blocks]), idx, tgt, doc_ids)
    for attention in ("sdpa", "varlen"):
        assert_same_outputs(outputs_and_grads(tiny(attention, **BLOCKS[blocks]), idx, tgt, doc_ids), naive,
                            rtol=1e-9, atol=1e-9, grad_rtol=1e-8, grad_atol=1e-10)
    with torch.no_grad():
        logits, loss = tiny("flex", **BLOCKS[blocks])(idx, tgt, doc_ids)
    torch.testing.assert_close(logits, naive[0], rtol=1e-9, atol=1e-9)


def test_every_block_compiles_as_one_graph_with_the_eager_results():
    """All the blocks at once under torch.compile(fullgraph=True) (aot_eager: the CPU-quick backend, the same
    graph capture): no graph break, and the eager loss and gradients."""
    idx, tgt, doc_ids = batch()
    m = tiny(**ALL_BLOCKS)
    eager = outputs_and_grads(m, idx, tgt, doc_ids)
    m.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    try:
        _, loss = torch.compile(m, backend="aot_eager", fullgraph=True)(idx, tgt, doc_ids)
        loss.backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(loss.detach(), eager[1], rtol=1e-12, atol=0)
    for name, p in m.named_parameters():
        torch.testing.assert_close(p.grad, eager[2][name], rtol=1e-10, atol=1e-12, msg=lambda s: f"{name}: {s}")


def test_the_fused_head_takes_the_untied_head_with_every_block():
    """fused_ce's head loss is given lm_head.weight: with an untied head (and every other block) it gives the
    plain head's loss and gradients, wte's included."""
    from speedgpt.features.fused_ce import FusedHeadLoss
    idx, tgt, doc_ids = batch()
    plain = outputs_and_grads(tiny(**ALL_BLOCKS), idx, tgt, doc_ids)
    m = tiny(**ALL_BLOCKS)
    m.head_loss = FusedHeadLoss(40)                             # what fused_ce.apply does
    fused = outputs_and_grads(m, idx, tgt, doc_ids)
    assert fused[0] is None and fused[2]["lm_head.weight"].abs().sum() > 0
    assert_same_outputs(fused, plain, rtol=1e-12, atol=0, grad_rtol=1e-10, grad_atol=1e-13)


def test_fp8_converts_the_block_linears_with_every_block():
    """FP8 finds the block Linears through block_linears with every block on (never the untied head), and the
    converted model trains a step under bf16 autocast (float8 emulated on the CPU)."""
    from speedgpt.features import fp8
    m = tiny(**ALL_BLOCKS).float()
    names = fp8.convert(m, configurator.Config(fp8=True, fp8_recipe="tensorwise_fused", fp8_min_dim=32))
    assert names == [name for name, _, _ in m.block_linears()] and len(names) == 8
    assert type(m.lm_head) is nn.Linear and type(m.transformer.h[0].attn.c_attn) is fp8.TensorwiseFloat8Linear
    idx, tgt, doc_ids = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = m(idx, tgt, doc_ids)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in m.parameters())


FLAGS = {"rmsnorm": ("norm", "rmsnorm", "layernorm"), "rope": ("rope", True, False),
         "qk_norm": ("qk_norm", True, False), "relu2": ("activation", "relu2", "gelu"),
         "untied": ("tie_embeddings", False, True)}


@pytest.mark.parametrize("blocks", FLAGS)
def test_each_block_trains_resumes_exactly_and_reloads(byte_data, tmp_path, blocks):
    """train.py with the block: the loss falls; a resume that does not name the flag rebuilds the checkpoint's model
    and continues with the uninterrupted run's losses; naming the other value is refused; sample.py's loader
    rebuilds it too. The untied checkpoint holds both matrices."""
    key, value, other = FLAGS[blocks]
    common = ["--max_iters=6", "--lr_decay_iters=6", "--eval_interval=3", "--learning_rate=1e-2"]
    train.main(tiny_args(byte_data, tmp_path / "full", f"--{key}={value}", *common))
    train.main(tiny_args(byte_data, tmp_path / "part", f"--{key}={value}", *common, "--max_iters=3"))
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--init_from=resume"))
    full, part = ({r["step"]: r["loss"] for r in read_metrics(tmp_path / run) if "loss" in r}
                  for run in ("full", "part"))
    assert sorted(part) == sorted(full) == list(range(6)) and full[5] < full[0]
    assert [part[s] for s in range(3, 6)] == [full[s] for s in range(3, 6)]
    with pytest.raises(ValueError, match=f"config key '{key}'={other!r} differs from the checkpoint's {value!r}"):
        train.main(tiny_args(byte_data, tmp_path / "part", *common, f"--{key}={other}", "--init_from=resume"))
    ckpt = load_checkpoint(str(tmp_path / "part" / "ckpt.pt"))
    assert ckpt["config"][key] == value
    reloaded, _ = sample.load_model(str(tmp_path / "part"), "cpu")
    assert getattr(reloaded.config, key) == value
    if blocks == "untied":
        assert not torch.equal(ckpt["model"]["lm_head.weight"], ckpt["model"]["transformer.wte.weight"])
