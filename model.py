"""
A GPT-2 language model in one file, after karpathy/nanoGPT.

Attention runs one of four backends, chosen at construction (GPTConfig.attention): `naive` (the
materialised (T, T) scores: the baseline) and `sdpa` (F.scaled_dot_product_attention: FlashAttention on
the GPU) are written out below; `flex` (FlexAttention) and `varlen` (FlashAttention's variable-length
kernels) call speedgpt/attention.py, which also builds the document mask.

Packing: pass doc_ids (B, T) and no token attends to another document, and positions restart at 0 at
each document start (a document is a run of equal ids). One mask is built per forward and shared by
every layer. Every backend receives q, k and v from one split of c_attn's output (CausalSelfAttention),
so a change to q and k (rotary embeddings, QK-norm) is made once, in transform_qk.

The blocks the field trains with besides GPT-2's, each a GPTConfig field, off by default (docs/flags.md): norm
(layernorm | rmsnorm), rope (rotary positions on q and k in place of wpe), qk_norm (RMSNorm of q and k per head),
activation (gelu | gelu_tanh | relu2) and tie_embeddings (the head shares wte's weights: GPT-2's, the default).

The model names its parts: each module that makes a Linear declares its kind in LINEARS, and GPT.block_linears()
lists the blocks' Linears by kind for whoever treats them apart (Muon's matrices in speedgpt/optim.py, FP8's
conversion, the Hugging Face mapping, the memory estimate). A block Linear no LINEARS names is refused at
construction, so a forker's new Linear cannot silently miss any of them.

Sampling (GPT.generate) keeps each layer's keys and values in a KVCache, made per call and handed down
through forward: after the prompt, a new token costs one position.

The model is the architecture only: no training trick is a setting here. A trainer may install a loss
for the head (GPT.head_loss: train.py installs speedgpt/features/fused_ce.py's fused head + cross-entropy, in
bf16 or FP8); it runs inside forward, and checkpoints never see it.
"""
import math
from dataclasses import dataclass, fields
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedgpt import attention

ROPE_BASE = 10000.0       # rotary embeddings' base (theta): RoFormer's and GPT-NeoX's
NORM_EPS = 1e-5           # LayerNorm's default, and RMSNorm's here (Llama's)


class ReLUSquared(nn.Module):
    """relu(x)^2 (So et al. 2021, "Primer"), the MLP activation of modded-nanogpt and nanochat."""

    def forward(self, x):
        return F.relu(x).square()


RESIDUAL_PROJECTIONS = ("attn_proj", "mlp_proj")    # the block Linear kinds that write into the residual stream
ACTIVATIONS = {"gelu": nn.GELU, "gelu_tanh": partial(nn.GELU, approximate="tanh"), "relu2": ReLUSquared}
NORMS = {"layernorm": lambda dim, bias: nn.LayerNorm(dim, eps=NORM_EPS, bias=bias),
         "rmsnorm": lambda dim, bias: nn.RMSNorm(dim, eps=NORM_EPS)}      # no bias: it has no shift to learn


def rotary(x, position_ids):
    """x (B, T, nh, hs) rotated by its positions, position_ids (T,) or (B, T): rotary position embedding (Su et
    al. 2021, RoFormer), each pair (i, i + hs/2) turned by the angle position * ROPE_BASE^(-2i/hs), the
    half-split layout of GPT-NeoX and Llama's Hugging Face port (nanochat's, modded-nanogpt's). A dot product of
    two rotated vectors depends on their positions' difference only. Computed in float32 at least, returned in
    x's dtype."""
    f = torch.promote_types(x.dtype, torch.float32)
    hs = x.size(-1)
    inv_freq = ROPE_BASE ** -(torch.arange(0, hs, 2, device=x.device, dtype=f) / hs)      # (hs/2,)
    angle = position_ids.to(f)[..., None, None] * inv_freq                                 # (B or 1, T, 1, hs/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.to(f).chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


@dataclass
class GPTConfig:
    """The model's settings. The shape has no defaults here: they are the trainer's, in configurator.py
    (Config: the CPU quickstart), and GPT-2's in config/ and hf.py."""
    block_size: int
    vocab_size: int           # the real vocabulary; the embedding is padded up to a multiple of 64
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = False        # biases in Linear layers and LayerNorms (GPT-2 had them)
    attention: str = "sdpa"   # naive | sdpa | flex | varlen
    activation: str = "gelu"  # gelu (exact, erf) | gelu_tanh (the tanh approximation GPT-2 was trained with) | relu2
    norm: str = "layernorm"   # layernorm (GPT-2's) | rmsnorm (no mean, no bias: Zhang & Sennrich 2019)
    rope: bool = False        # rotary position embeddings on q and k (RoFormer) instead of the learned wpe
    qk_norm: bool = False     # RMSNorm of q and k, per head, before attention (OLMo 2, Qwen3)
    tie_embeddings: bool = True   # the output head is the token embedding's matrix (GPT-2's; Press & Wolf 2017)

    @property
    def padded_vocab_size(self):
        return -(-self.vocab_size // 64) * 64   # tensor-core friendly (50257 -> 50304)

    @classmethod
    def from_dict(cls, settings, vocab_size, **overrides):
        """GPTConfig from a mapping with (at least) the shape keys, such as a run's config or a
        checkpoint's: its other keys are ignored, absent optional ones keep their defaults (a checkpoint
        older than `activation` reads as gelu, one older than `rope` as GPT-2's learned positions). Raises
        TypeError when a shape key is missing."""
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in settings.items() if k in known}, "vocab_size": vocab_size, **overrides})


class CausalSelfAttention(nn.Module):
    LINEARS = {"c_attn": "qkv", "c_proj": "attn_proj"}        # its Linears by kind (GPT.block_linears)

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        self.rope = config.rope
        if config.qk_norm:                               # one gain per channel of a head, shared by the heads
            self.q_norm, self.k_norm = (nn.RMSNorm(config.n_embd // config.n_head, eps=NORM_EPS) for _ in range(2))
        self.qk_norm = config.qk_norm
        self.attention = config.attention
        self.flex = attention.compiled_flex_attention() if config.attention == "flex" else None
        self.varlen = attention.causal_varlen_attn() if config.attention == "varlen" else None

    def forward(self, x, mask=None, position_ids=None, kv_cache=None):
        """x (B, T, C); mask from attention.attention_mask: None (causal), a (B, 1, T, T) bool tensor, a
        flex BlockMask, or for varlen cu_seqlens over the B*T flattened tokens; position_ids (T,) or (B, T):
        each token's position in its document (GPT.forward passes them; GPT-2 itself does not use them);
        kv_cache: this layer's KVCache when sampling (GPT.generate), x then continues its positions."""
        B, T, C = x.size()
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)     # packed: q, k, v per head
        q, k, v = qkv.unbind(2)                                                # (B, T, nh, hs) each, views
        q2, k2 = self.transform_qk(q, k, position_ids)
        if kv_cache is not None:
            y = self.attend_cached(q2, k2, v, kv_cache)                        # (B, T, nh, hs)
        else:
            # varlen takes the packed tensor (FA3 then writes c_attn's gradient in place, no concatenation):
            # still valid when transform_qk returned q and k themselves, else re-packed from what it returned
            packed = qkv if q2 is q and k2 is k else None
            y = self.attend(q2, k2, v, mask, packed)                           # (B, T, nh, hs)
        return self.resid_dropout(self.c_proj(y.reshape(B, T, C)))

    def transform_qk(self, q, k, position_ids):
        """The one place where q and k (B, T, nh, hs) change before attention, for every backend (and the KV
        cache, which keeps k as returned here): QK-norm, then rotary embeddings at position_ids, which restart
        at each document, so a packed document is rotated as if it were alone. GPT-2 changes nothing and
        returns q and k themselves. Returns (q, k)."""
        if self.qk_norm:            # in the gain's dtype (float32 under autocast), back in q's (bf16)
            q = self.q_norm(q.to(self.q_norm.weight.dtype)).to(q.dtype)
            k = self.k_norm(k.to(self.k_norm.weight.dtype)).to(k.dtype)
        if self.rope:
            q, k = rotary(q, position_ids), rotary(k, position_ids)
        return q, k

    def attend(self, q, k, v, mask, packed=None):
        """Causal attention (within documents, per `mask`) of q, k, v (B, T, nh, hs) with this layer's
        backend; packed: the (B, T, 3, nh, hs) tensor q, k, v are views of, or None. Returns (B, T, nh, hs)."""
        B, T, nh, hs = q.shape
        if self.attention == "varlen":                   # documents as sequences of the flattened batch
            qkv = packed if packed is not None else torch.stack((q, k, v), dim=2)
            if mask is None:                             # plain causal: each row one sequence
                mask = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=q.device)
            return attention.varlen_attention(qkv.view(B * T, 3, nh, hs), mask, T, self.varlen).view(B, T, nh, hs)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))                          # (B, nh, T, hs)
        dropout_p = self.dropout if self.training else 0.0
        if self.attention == "naive":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))       # (B, nh, T, T)
            if mask is None:
                mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            att = att.masked_fill(~mask, float("-inf"))
            att = F.dropout(F.softmax(att, dim=-1), dropout_p, self.training)
            y = att @ v                                                            # (B, nh, T, hs)
        elif self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)
        else:
            y = attention.flex_attention(q, k, v, mask, self.flex)
        return y.transpose(1, 2)

    def attend_cached(self, q, k, v, kv_cache):
        """Causal attention of T new positions q, k, v (B, T, nh, hs), the ones after kv_cache.length, to
        themselves and to every position kv_cache holds; their k and v join it. SDPA whatever the backend:
        the same math (tests/test_model.py's parity tests), and flex's and varlen's kernels are there for
        training's documents, not for one query at a time. Returns (B, T, nh, hs)."""
        T, start = q.size(1), kv_cache.length
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))                          # (B, nh, T, hs)
        k, v = kv_cache.append(k, v)                                               # (B, nh, start + T, hs)
        # query i, at position start + i, sees keys 0 .. start + i: a single new token sees them all
        mask = None if T == 1 else torch.ones(T, start + T, dtype=torch.bool, device=q.device).tril(start)
        dropout_p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p).transpose(1, 2)


class KVCache:
    """One layer's keys and values (B, nh, block_size, hs) while sampling, so that a new token costs one
    position, not the whole context: GPT.generate makes a list of them (one per layer) per prefill and
    passes it to GPT.forward(kv_cache=...), which hands each layer its own. The keys are cached after
    transform_qk, at the absolute positions GPT.forward gives them. A plain object, never a module's
    state: the state dict and training never see it. Allocated at the first append, in the keys' dtype
    and device; length: the positions filled, the next new token's position."""

    def __init__(self, block_size):
        self.block_size, self.length = block_size, 0
        self.k = self.v = None

    def append(self, k, v):
        """Write k, v (B, nh, T, hs) at positions length .. length + T - 1; returns every cached key and
        value, (B, nh, length + T, hs) views. GPT.forward raises before a write past block_size."""
        if self.k is None:
            B, nh, _, hs = k.shape
            self.k, self.v = (k.new_empty(B, nh, self.block_size, hs) for _ in range(2))
        start, self.length = self.length, self.length + k.size(2)
        self.k[:, :, start:self.length] = k
        self.v[:, :, start:self.length] = v
        return self.k[:, :, :self.length], self.v[:, :, :self.length]


class MLP(nn.Module):
    LINEARS = {"c_fc": "fc", "c_proj": "mlp_proj"}            # its Linears by kind (GPT.block_linears)
    ACT_BETWEEN = {"act": ("c_fc", "c_proj")}       # its activation -> the Linears feeding it and fed (fp8_gelu_cast)

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.act = ACTIVATIONS[config.activation]()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    NORM_FEEDS = {"ln_1": "attn.c_attn", "ln_2": "mlp.c_fc"}      # norm -> the one Linear it feeds (fp8_norm_cast)

    def __init__(self, config):
        super().__init__()
        self.ln_1 = NORMS[config.norm](config.n_embd, config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = NORMS[config.norm](config.n_embd, config.bias)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, position_ids=None, kv_cache=None):
        x = x + self.attn(self.ln_1(x), mask, position_ids, kv_cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        if config.attention not in attention.BACKENDS:
            raise ValueError(f"attention={config.attention!r}: expected one of {attention.BACKENDS}")
        for key, known in (("activation", ACTIVATIONS), ("norm", NORMS)):
            if getattr(config, key) not in known:
                raise ValueError(f"{key}={getattr(config, key)!r}: expected one of {tuple(known)}")
        if config.rope and (config.n_embd // config.n_head) % 2:
            raise ValueError(f"rope=True turns pairs of a head's channels: the head size n_embd / n_head = "
                             f"{config.n_embd // config.n_head} must be even")
        if config.attention in ("flex", "varlen") and config.dropout > 0:
            raise ValueError(f"attention={config.attention!r} has no attention dropout: set dropout=0 or use "
                             "attention='sdpa'")
        self.config = config
        self.head_loss = None              # a trainer's loss for the head (see head()); None: lm_head + cross-entropy
        self._causal_block_masks = {}      # flex: the plain causal BlockMask per (T, device), built once
        V = config.padded_vocab_size
        transformer = dict(wte=nn.Embedding(V, config.n_embd))
        if not config.rope:                                  # learned absolute positions; rotary ones act on q, k
            transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(dict(
            **transformer,
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=NORMS[config.norm](config.n_embd, config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, V, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight   # weight tying (Press & Wolf 2017)
        self.apply(self._init_weights)
        # scaled init of the projections into the residual stream (GPT-2 paper); block_linears() refuses a block
        # Linear of no kind here, before any work
        for _, kind, linear in self.block_linears():
            if kind in RESIDUAL_PROJECTIONS:
                torch.nn.init.normal_(linear.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def block_linears(self):
        """[(name, kind, module)] of every nn.Linear in the transformer blocks, in module order: name as in
        named_modules() ('transformer.h.0.attn.c_attn'), kind as the module holding it declares in its
        LINEARS (qkv, attn_proj, fc, mlp_proj, or a forker's: `LINEARS = {..., "w_gate": "gate"}` on MLP). The
        one list of the blocks' matrices, which Muon's parameter groups, FP8's conversion, the Hugging Face
        mapping and the memory estimate ask, so a Linear declared here reaches all of them. Raises ValueError
        naming a Linear that no LINEARS classifies (GPT.__init__ asks, so a model with one is never built)."""
        out = []
        for path, parent in self.transformer.h.named_modules(prefix="transformer.h"):
            for attr, child in parent.named_children():
                if isinstance(child, nn.Linear):
                    kind = getattr(parent, "LINEARS", {}).get(attr)
                    if kind is None:
                        raise ValueError(f"{path}.{attr} is an nn.Linear of no kind: add \"{attr}\": \"<kind>\" to "
                                         f"{type(parent).__name__}.LINEARS in model.py (a new kind, or one of qkv, "
                                         "attn_proj, fc, mlp_proj), so that Muon, FP8 and the exports know it")
                    out.append((f"{path}.{attr}", kind, child))
        return out

    def num_params(self, non_embedding=True):
        """Parameter count; by default without the embeddings that do no matmul: the position embedding, and
        the token embedding when it is not the head's matrix (tie_embeddings=False)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            lookups = [self.transformer.wpe] if "wpe" in self.transformer else []
            if not self.config.tie_embeddings:
                lookups.append(self.transformer.wte)
            n -= sum(m.weight.numel() for m in lookups)
        return n

    def flops_per_token(self):
        """Training FLOPs per token, forward + backward, at T = block_size:
            6 N + 12 L H Q T
        with N the non-embedding parameters (the head's matmul counted once, tied or not), L layers, H heads,
        Q head size. Source: PaLM (Chowdhery et al. 2022), Appendix B, as in nanoGPT's estimate_mfu.
        Counts full (non-causal, unmasked) attention and no recomputation, by that convention."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size

    def attention_mask(self, doc_ids, T, device, cu_seqlens=None):
        """The mask every layer shares for doc_ids (B, T) or None: see attention.attention_mask."""
        return attention.attention_mask(self.config.attention, doc_ids, T, device, cu_seqlens, self._causal_block_masks)

    def forward(self, idx, targets=None, doc_ids=None, cu_seqlens=None, position_ids=None, kv_cache=None):
        """idx (B, T) int64 tokens; targets (B, T) int64, -1 = ignored; doc_ids (B, T) int64 or None:
        each run of equal ids is one document, positions restart at 0 at each run and no token attends
        outside its run (ids need not increase: [[0,0,1,1,0,0]] is three documents).
        cu_seqlens and position_ids: the loader's precomputed metadata for doc_ids (data.varlen_metadata,
        so the step computes neither); without them they are computed here from doc_ids.
        Returns logits (B, T, padded_vocab_size), -inf at the padded ids >= vocab_size, and the mean
        cross-entropy over targets != -1 (None without targets; 0 when every target is -1), a softmax
        over the real vocabulary only. With a head_loss installed, targets given and gradients on, the loss is
        head_loss's and the logits are None (a fused head never makes them whole).
        kv_cache: sampling only (GPT.generate), a list of one KVCache per layer: idx continues the cached
        positions (its first token at position kv_cache[0].length), one plain causal sequence per row.
        Raises ValueError when the sequence (with the cached positions) is longer than block_size, or
        when kv_cache comes with doc_ids or position_ids."""
        B, T = idx.size()
        start = 0 if kv_cache is None else kv_cache[0].length                   # idx[:, 0]'s position
        if start + T > self.config.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size {self.config.block_size}")
        if kv_cache is not None and (doc_ids is not None or position_ids is not None):
            raise ValueError("kv_cache takes one plain sequence per row: no doc_ids, no position_ids")
        if position_ids is None:                                                 # (T,) or (B, T)
            position_ids = torch.arange(start, start + T, device=idx.device) if doc_ids is None else \
                attention.position_ids(doc_ids)
        mask = None if kv_cache is not None else self.attention_mask(doc_ids, T, idx.device, cu_seqlens)
        x = self.transformer.wte(idx)
        if not self.config.rope:                                                 # GPT-2's learned positions
            x = x + self.transformer.wpe(position_ids)
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, mask, position_ids, None if kv_cache is None else kv_cache[i])
        return self.head(x, targets)

    def head(self, x, targets=None):
        """The final norm, the output head and the loss of hidden states x (B, T, C): see forward().
        A method of its own so that regional compilation (speedgpt/features/compilation.py) compiles it apart.
        head_loss, when a trainer installed one, is called as head_loss(x (B*T, C), lm_head.weight (V, C),
        targets (B*T,), vocab_size) and returns the summed cross-entropy over targets != -1."""
        B, T, _ = x.size()
        x = self.transformer.ln_f(x)
        c = self.config
        if targets is not None and self.head_loss is not None and torch.is_grad_enabled():
            loss_sum = self.head_loss(x.view(B * T, -1), self.lm_head.weight, targets.view(-1), c.vocab_size)
            return None, loss_sum / (targets != -1).sum().clamp(min=1)
        logits = self.lm_head(x)                                                 # (B, T, V)
        # the padded ids are no tokens: keep them out of the softmax. Their rows are 0 in weights from
        # GPT-2 (hf.py), and a logit of 0 in the denominator would change the loss. In place on a
        # (B, T, V - vocab_size) slice: cheap in eager, fused into the cross-entropy under compile.
        logits[..., c.vocab_size:] = float("-inf")
        loss = None
        if targets is not None:
            loss_sum = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                       ignore_index=-1, reduction="sum")
            loss = loss_sum / (targets != -1).sum().clamp(min=1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, progress=None):
        """Append max_new_tokens sampled tokens to idx (B, T): returns (B, T + max_new_tokens). Each is drawn
        from the logits of the last block_size tokens (nanoGPT's crop); the padded vocabulary is never
        sampled. use_cache: keep every layer's keys and values (KVCache), so that after a prefill of the
        prompt each new token costs one position. The positions are absolute (wpe, or rotary): once the context
        outgrows block_size the window moves by one every token, and every key with it, so from there on
        each token is a forward of the last block_size tokens, with or without the cache. The output is
        the same either way (the same logits, up to rounding, and the same random draws in the same order).
        temperature=0 is greedy decoding: the likeliest token each time (argmax; no random draw). progress, when
        given, is called with the count of tokens drawn so far after each one (sample.py's progress line)."""
        block_size, kv_cache = self.config.block_size, None
        for drawn in range(max_new_tokens):
            if kv_cache is not None and kv_cache[0].length < block_size:
                logits, _ = self(idx[:, -1:], kv_cache=kv_cache)                 # one new position
            else:   # the prompt, or a moved window: a cache is made only while it has room for a new token
                room = use_cache and idx.size(1) < block_size
                kv_cache = [KVCache(block_size) for _ in self.transformer.h] if room else None
                logits, _ = self(idx[:, -block_size:], kv_cache=kv_cache)
            logits = logits[:, -1, :self.config.vocab_size]
            if temperature == 0:                    # greedy
                idx_next = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / max(temperature, 1e-6)
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            if progress is not None:
                progress(drawn + 1)
        return idx
