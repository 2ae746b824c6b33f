"""model.py on the CPU: naive and sdpa attention agree, the loss (ignored targets, the padded vocabulary kept out
of the softmax), flops per token, bad construction refused, gelu_tanh, and sampling with a KV cache."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same_outputs, outputs_and_grads, rotary_qk
from model import GPT, CausalSelfAttention, GPTConfig, KVCache


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


def test_gelu_tanh_is_the_tanh_approximation():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    m = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=1, n_embd=8, activation="gelu_tanh")).double()
    # GPT-2's gelu (Hendrycks & Gimpel 2016)
    want = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)))
    torch.testing.assert_close(m.transformer.h[0].mlp.gelu(x), want)
    assert (F.gelu(x) - want).abs().max() > 1e-4                # the exact gelu is another function


# -----------------------------------------------------------------------------
# sampling with a KV cache (GPT.generate(use_cache=True))

def sampler(attention="sdpa", rope=False, monkeypatch=None):
    """A float64 model with block_size 16 whose output depends on positions (attention sharpened, position
    embeddings scaled up), rotary embeddings through transform_qk when `rope`; eval mode."""
    if rope:
        monkeypatch.setattr(CausalSelfAttention, "transform_qk", rotary_qk)
    m = tiny(attention, block_size=16).eval()
    with torch.no_grad():
        for block in m.transformer.h:
            block.attn.c_attn.weight.mul_(20)
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
def test_kv_cache_greedy_ids_match_past_block_size(attention, rope, monkeypatch):
    """Greedy ids are the same with and without the cache, past block_size too, also with rotary embeddings
    (the cached keys go through transform_qk at their absolute positions). With the cache, the prompt is one
    forward and each token after it one position until the context fills block_size; from there the window
    moves every token and each is a forward of block_size positions, as without the cache."""
    m = sampler(attention, rope, monkeypatch)
    idx = torch.randint(0, 100, (2, 3), generator=torch.Generator().manual_seed(1))
    plain, plain_lengths = generate_counting(m, idx, 60, top_k=1, use_cache=False)
    cached, cached_lengths = generate_counting(m, idx, 60, top_k=1)        # use_cache=True by default
    assert plain_lengths == [min(3 + i, 16) for i in range(60)]
    assert cached_lengths == [3] + [1] * 13 + [16] * 46
    assert torch.equal(cached, plain), (cached, plain)


@pytest.mark.parametrize("rope", [False, True])
def test_kv_cache_logits_match_the_full_forward(rope, monkeypatch):
    """A prefill, a chunk of 4 positions, then one position at a time give the logits of one forward of the
    whole sequence, at every position; with rotary embeddings too, and those change the logits."""
    m = sampler(rope=rope, monkeypatch=monkeypatch)
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
        monkeypatch.undo()
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
