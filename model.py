"""
A GPT-2 language model in one file, after karpathy/nanoGPT.

Attention has four backends, chosen at construction:
  naive   materialises the (T, T) score matrix, softmax, then @ V: the baseline
  sdpa    F.scaled_dot_product_attention: FlashAttention on the GPU when the mask is plain causal
  flex    FlexAttention with a BlockMask (GPU only: FlexAttention has no backward on the CPU)
  varlen  FlashAttention's variable-length kernel: each document is a sequence of its own, given by
          cu_seqlens over the flattened batch (FA3 when flash_attn_interface imports, else PyTorch's FA2)

Packing: pass doc_ids (B, T) and no token attends to another document and positions restart at
0 at each document start (a document is a run of equal ids: document_runs). One mask is built per
forward and shared by every layer. The mask function `document_causal_mask` is the single source of
truth for naive, sdpa and flex; varlen's segments are the same runs (`varlen_cu_seqlens`). masks.py
checks what each backend really applies against a reference built independently.
"""
import importlib.util
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fused_ce import LinearCrossEntropy

ATTENTION_BACKENDS = ("naive", "sdpa", "flex", "varlen")
ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}   # name -> nn.GELU(approximate=...)


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257   # real vocabulary; the embedding is padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False        # biases in Linear layers and LayerNorms (GPT-2 had them)
    attention: str = "sdpa"   # naive | sdpa | flex | varlen
    activation: str = "gelu"  # gelu (exact, erf) | gelu_tanh (the tanh approximation GPT-2 was trained with)

    @property
    def padded_vocab_size(self):
        return -(-self.vocab_size // 64) * 64   # tensor-core friendly (50257 -> 50304)

# -----------------------------------------------------------------------------
# masks and positions from document ids

def document_causal_mask(doc_ids, q_idx, kv_idx, b=0):
    """True where query q_idx may attend to key kv_idx: causal and within one document.
    doc_ids (B, T) int; indices broadcast. The mask_mod of FlexAttention and the dense masks
    below are both this function, so every backend applies the same rule."""
    return (q_idx >= kv_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])


def dense_attention_mask(doc_ids):
    """(B, 1, T, T) bool mask for doc_ids (B, T): block-diagonal over documents and causal."""
    B, T = doc_ids.shape
    t = torch.arange(T, device=doc_ids.device)
    b = torch.arange(B, device=doc_ids.device)[:, None, None]
    return document_causal_mask(doc_ids, t[None, :, None], t[None, None, :], b)[:, None]


def document_runs(doc_ids):
    """(B, T) index of each token's run of equal doc_ids within its row, from 0. The attention mask is
    built from runs, so each run is its own document whatever its id: doc_ids [[0,0,1,1,0,0]] are
    three documents, and the last two tokens do not see the first two (no check, no host sync)."""
    changed = (doc_ids[:, 1:] != doc_ids[:, :-1]).long()
    return torch.cat([torch.zeros_like(doc_ids[:, :1]), changed], dim=1).cumsum(dim=1)


def position_ids(doc_ids):
    """(B, T) position of each token within its document: restarts at 0 where doc_ids changes."""
    B, T = doc_ids.shape
    t = torch.arange(T, device=doc_ids.device).expand(B, T)
    is_start = torch.ones_like(doc_ids, dtype=torch.bool)
    is_start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return t - torch.where(is_start, t, 0).cummax(dim=1).values


FLEX_BLOCK = 128   # FlexAttention's default tile; BLOCK_SIZE=64 masks fail to lower on the H200


@torch.compiler.disable   # built eagerly, once per batch, outside the compiled graph
def flex_block_mask(doc_ids):
    """FlexAttention BlockMask for doc_ids (B, T), shared by every layer.

    When T is a multiple of 128 the block structure is computed directly from each block's smallest
    and largest document id, in a few small kernels: a (query block, key block) pair is empty unless
    it is causal and the two id ranges overlap; it is full (no mask_mod runs) only when both blocks
    lie inside one and the same document, strictly below the diagonal; otherwise it is partial and
    document_causal_mask decides per token. This is exact for any doc_ids (range overlap is a
    superset of sharing a document) and skips create_block_mask's dense (B, T, T) evaluation of the
    mask_mod (measured at ~2 ms per batch on the H200, ../shared/GPU.md; the new path's own cost is
    not yet measured). Other lengths use create_block_mask."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask
    B, T = doc_ids.shape
    mask_mod = lambda b, h, q, kv: document_causal_mask(doc_ids, q, kv, b)
    if T % FLEX_BLOCK:
        return create_block_mask(mask_mod, B, None, T, T, device=doc_ids.device)
    blocks = doc_ids.view(B, T // FLEX_BLOCK, FLEX_BLOCK)
    lo, hi = blocks.amin(-1), blocks.amax(-1)                                    # (B, nb)
    nb = lo.size(1)
    causal = torch.ones(nb, nb, dtype=torch.bool, device=doc_ids.device).tril()  # key block <= query block
    overlap = (lo[:, None, :] <= hi[:, :, None]) & (hi[:, None, :] >= lo[:, :, None])   # (B, q block, kv block)
    single = lo == hi
    full = (causal.tril(-1) & single[:, :, None] & single[:, None, :] & (lo[:, :, None] == lo[:, None, :]))
    partial = causal & overlap & ~full

    def ordered(dense):                 # (B, nb, nb) bool -> counts (B, 1, nb), indices (B, 1, nb, nb)
        idx = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True)
        return dense.sum(-1, dtype=torch.int32)[:, None], idx.to(torch.int32)[:, None]
    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(kv_num_blocks=kv_num, kv_indices=kv_idx, full_kv_num_blocks=full_num,
                                    full_kv_indices=full_idx, BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mod, seq_lengths=(T, T))


_compiled_flex = None

def compiled_flex_attention():
    """flex_attention under torch.compile (eager flex_attention is a slow reference implementation),
    built once. Called at model construction, not in forward: a global assigned inside forward is a
    side effect that activation checkpointing's traced region refuses, which sends the whole forward
    back to eager (measured on the H200: half the tokens/s)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_attention(q, k, v, block_mask, compiled):
    """FlexAttention with `compiled` (from compiled_flex_attention()) on the GPU, eager on the CPU.
    At head size 64, 8 warps per tile instead of the default: forward + backward per layer 1.08 -> 0.89 ms
    (B=16, stories batches) and 1.38 -> 1.25 ms (B=32, stdlib) on the H200 (BENCHMARKS.md, attention)."""
    if not q.is_cuda:
        from torch.nn.attention.flex_attention import flex_attention as eager
        return eager(q, k, v, block_mask=block_mask)
    options = {"num_warps": 8} if q.size(-1) == 64 else None
    return compiled(q, k, v, block_mask=block_mask, kernel_options=options)

# -----------------------------------------------------------------------------
# varlen: documents as variable-length sequences (FlashAttention's varlen kernels)

def varlen_cu_seqlens(doc_ids):
    """cu_seqlens (min(B*T, 65535) + 1,) int32 for doc_ids (B, T): the flattened offset of every run of
    equal doc_ids (a row's start always opens one), ascending, then B*T repeated (empty sequences). The
    torch twin of data.varlen_metadata for callers without the loader's (tests, generate): sync-free, of
    a fixed shape, but long (slower kernels). 65,535 sequences at most: FlashAttention-2's grid limit."""
    B, T = doc_ids.shape
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    flat = torch.arange(B * T, device=doc_ids.device)
    offsets = torch.sort(torch.where(start.flatten(), flat, B * T)).values[:min(B * T, 65535)]   # starts, then B*T
    return torch.cat([offsets, offsets.new_full((1,), B * T)]).to(torch.int32)


def causal_varlen_attn():
    """The varlen kernel: fa3.fa3_varlen_attn (FA3's kernels called directly: one split, packed qkv)
    once varlen_kernel() has found FA3, else torch.nn.attention.varlen.varlen_attn (PyTorch's
    FlashAttention-2; is_causal=True in torch 2.10, window_size=(-1, 0) from 2.11) taking the packed qkv,
    or None where torch has none. Both are custom ops with fake implementations and registered
    backwards, so torch.compile traces them without a graph break. Called (qkv (N, 3, nh, hs),
    cu_seqlens, max_seqlen)."""
    if (_varlen_kernel_name or "").startswith("FA3"):
        from fa3 import fa3_varlen_attn
        return fa3_varlen_attn
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    causal = dict(window_size=(-1, 0)) if "window_size" in inspect.signature(varlen_attn).parameters else dict(is_causal=True)
    return lambda qkv, cu, max_seqlen: varlen_attn(*qkv.unbind(1), cu, cu, max_seqlen, max_seqlen, **causal)


_varlen_kernel_name = None

def varlen_kernel(device):
    """Pick the kernel behind attention='varlen' on `device` (once per process) and return its name: FA3
    where `flash_attn_interface` imports (FA3's hopper/ build, or ../shared/tools/fa3.sh) and loads
    torch.ops.flash_attn_3 on a 9.x GPU (fa3.py); else PyTorch's FA2. Per layer at B=64, T=1024 on the
    H200 (../shared/GPU.md): FA3 varlen 1.61-1.72 ms, flex 1.93-2.14, FA2 varlen 2.12-2.28 (fwd + bwd).
    Raises ValueError where neither runs (CPU, older torch or GPU)."""
    global _varlen_kernel_name
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("attention='varlen' needs a CUDA GPU: FlashAttention's varlen kernels do not run on the "
                         "CPU. Use attention='sdpa' (a boolean document mask) or 'naive' on the CPU")
    cc = torch.cuda.get_device_capability(device)
    if _varlen_kernel_name is None and (causal_varlen_attn() is None or cc < (8, 0)):
        raise ValueError(f"attention='varlen' needs torch >= 2.10 and compute capability 8.0+, not torch "
                         f"{torch.__version__} on sm_{cc[0]}{cc[1]}: use attention='flex'")
    if _varlen_kernel_name is None:
        why = "no flash_attn_interface" if importlib.util.find_spec("flash_attn_interface") is None else \
            f"needs compute capability 9.x, not {cc[0]}.{cc[1]}" if cc[0] != 9 else None
        if why is None:
            try:
                import flash_attn_interface  # noqa: F401  (registers torch.ops.flash_attn_3)
                from fa3 import fa3_loaded
                why = None if fa3_loaded() else "flash_attn_interface loaded no torch.ops.flash_attn_3.fwd/bwd"
            except (ImportError, OSError, RuntimeError) as e:
                why = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        _varlen_kernel_name = "FA3 (torch.ops.flash_attn_3: one split, packed qkv)" if why is None else \
            f"FA2 (torch varlen_attn; no FA3: {why})"
    return _varlen_kernel_name


def resolve_attention(name, device, masked, dtype="bfloat16"):
    """'auto' -> the fastest backend installed for what is trained: with the document mask (`masked`),
    'varlen' where FA3 runs and `dtype` is bfloat16 or float16 (FlashAttention takes no float32), else
    'flex' on a GPU (PyTorch's FA2 varlen lost to flex on the H200), else 'sdpa'; without the mask
    'sdpa' (FlashAttention's causal kernel). Other names are returned as they are."""
    if name != "auto":
        return name
    if not masked or torch.device(device).type != "cuda":
        return "sdpa"
    if dtype == "float32":
        return "flex"
    try:
        return "varlen" if varlen_kernel(device).startswith("FA3") else "flex"
    except ValueError:
        return "flex"


def varlen_attention(qkv, cu_seqlens, max_seqlen, kernel):
    """Causal attention within each sequence [cu_seqlens[i], cu_seqlens[i+1]) of the flattened batch:
    qkv (N, 3, nh, hs), N = B*T (c_attn's output, packed); cu_seqlens (S+1,) int32 rising from 0 to N
    (repeats: empty sequences); max_seqlen a Python int >= the longest sequence (no host sync). Returns
    (N, nh, hs). `kernel`: causal_varlen_attn(). On CPU tensors the reference below: SDPA on each
    sequence on its own, a Python loop with a host sync, for tests and sample.py (train.py refuses
    varlen on the CPU)."""
    if qkv.device.type != "cpu":
        return kernel(qkv, cu_seqlens, max_seqlen)
    bounds = cu_seqlens.tolist()
    return torch.cat([F.scaled_dot_product_attention(*qkv[s:e].permute(1, 2, 0, 3), is_causal=True).transpose(0, 1)
                      for s, e in zip(bounds[:-1], bounds[1:]) if e > s])

# -----------------------------------------------------------------------------
# the model

class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        self.attention = config.attention
        self.flex = compiled_flex_attention() if config.attention == "flex" else None
        self.varlen = causal_varlen_attn() if config.attention == "varlen" else None

    def forward(self, x, mask):
        """x (B, T, C); mask None (causal), a (B, 1, T, T) bool tensor, a flex BlockMask, or for varlen
        cu_seqlens over the B*T flattened tokens."""
        B, T, C = x.size()
        qkv = self.c_attn(x)
        if self.attention == "varlen":                   # no transpose, no split: (B*T, 3, nh, hs), packed
            if mask is None:                             # plain causal: each row one sequence
                mask = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=x.device)
            y = varlen_attention(qkv.view(B * T, 3, self.n_head, C // self.n_head), mask, T, self.varlen)
            return self.resid_dropout(self.c_proj(y.reshape(B, T, C)))
        q, k, v = qkv.split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        dropout_p = self.dropout if self.training else 0.0
        if self.attention == "naive":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))       # (B, nh, T, T)
            if mask is None:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf"))
            att = F.dropout(F.softmax(att, dim=-1), dropout_p, self.training)
            y = att @ v                                                            # (B, nh, T, hs)
        elif self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)
        else:
            y = flex_attention(q, k, v, mask, self.flex)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=ACTIVATIONS[config.activation])
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        if config.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention={config.attention!r}: expected one of {ATTENTION_BACKENDS}")
        if config.activation not in ACTIVATIONS:
            raise ValueError(f"activation={config.activation!r}: expected one of {tuple(ACTIVATIONS)}")
        if config.attention in ("flex", "varlen") and config.dropout > 0:
            raise ValueError(f"attention={config.attention!r} has no attention dropout: set dropout=0 or use attention='sdpa'")
        self.config = config
        self._causal_block_masks = {}
        self.fused_ce_chunk = 0            # > 0: training losses through LinearCrossEntropy, this many tokens a chunk
        self.fused_ce_fp8 = False          # its matmuls in float8 (fp8_head with fused_ce)
        V = config.padded_vocab_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight   # weight tying (Press & Wolf 2017)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():            # scaled residual init (GPT-2 paper)
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding=True):
        """Parameter count; position embeddings left out by default (they do no matmul)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self):
        """Training FLOPs per token, forward + backward, at T = block_size:
            6 N + 12 L H Q T
        with N the non-embedding parameters (the tied head's matmul counted once), L layers, H heads,
        Q head size. Source: PaLM (Chowdhery et al. 2022), Appendix B, as in nanoGPT's estimate_mfu.
        Counts full (non-causal, unmasked) attention and no recomputation, by that convention."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size

    def attention_mask(self, doc_ids, T, device, cu_seqlens=None):
        """The mask every layer shares: for naive/sdpa None (plain causal) without doc_ids, else a
        (B, 1, T, T) bool tensor; for flex a BlockMask (the causal one built once and cached); for
        varlen None without doc_ids, else `cu_seqlens` (the loader's) or varlen_cu_seqlens(doc_ids).
        Each run of equal doc_ids is one document (document_runs)."""
        if self.config.attention == "varlen":
            return cu_seqlens if cu_seqlens is not None or doc_ids is None else varlen_cu_seqlens(doc_ids)
        doc_ids = None if doc_ids is None else document_runs(doc_ids)
        if self.config.attention != "flex":
            return None if doc_ids is None else dense_attention_mask(doc_ids)
        if doc_ids is None:
            if (T, device) not in self._causal_block_masks:
                self._causal_block_masks[(T, device)] = flex_block_mask(torch.zeros(1, T, dtype=torch.long, device=device))
            return self._causal_block_masks[(T, device)]
        return flex_block_mask(doc_ids)

    def positions(self, doc_ids, T, device):
        """(T,) 0..T-1 without doc_ids, else (B, T) positions restarting at each document (position_ids)."""
        return torch.arange(T, device=device) if doc_ids is None else position_ids(doc_ids)

    def forward(self, idx, targets=None, doc_ids=None, cu_seqlens=None, position_ids=None):
        """idx (B, T) int64 tokens; targets (B, T) int64, -1 = ignored; doc_ids (B, T) int64 or None:
        each run of equal ids is one document, positions restart at 0 at each run and no token attends
        outside its run (ids need not increase: [[0,0,1,1,0,0]] is three documents).
        cu_seqlens and position_ids: the loader's precomputed metadata for doc_ids (data.varlen_metadata,
        so the step computes neither); without them they are computed here from doc_ids.
        Returns logits (B, T, padded_vocab_size), -inf at the padded ids >= vocab_size, and the mean
        cross-entropy over targets != -1 (None without targets; 0 when every target is -1), a softmax
        over the real vocabulary only. With fused_ce_chunk > 0, targets and gradients on, the logits
        are None (LinearCrossEntropy never keeps them). Raises ValueError when T > block_size."""
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = self.positions(doc_ids, T, idx.device) if position_ids is None else position_ids   # (T,) or (B, T)
        mask = self.attention_mask(doc_ids, T, idx.device, cu_seqlens)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x, mask)
        x = self.transformer.ln_f(x)
        if targets is not None and self.fused_ce_chunk and torch.is_grad_enabled():   # fused_ce: no logits
            loss_sum = LinearCrossEntropy.apply(x.view(B * T, -1), self.lm_head.weight, targets.view(-1),
                                                self.config.vocab_size, self.fused_ce_chunk, self.fused_ce_fp8)
            return None, loss_sum / (targets != -1).sum().clamp(min=1)
        logits = self.lm_head(x)                                                 # (B, T, V)
        # the padded ids are no tokens: keep them out of the softmax. Their rows are 0 in weights from
        # GPT-2 (hf.py), and a logit of 0 in the denominator would change the loss. In place on a
        # (B, T, V - vocab_size) slice: cheap in eager, fused into the cross-entropy under compile;
        # a copy where the head is torchao's Float8Linear (a custom Function's output: no in-place).
        if type(self.lm_head) is nn.Linear:
            logits[..., self.config.vocab_size:] = float("-inf")
        else:
            padded = torch.arange(logits.size(-1), device=logits.device) >= self.config.vocab_size
            logits = logits.masked_fill(padded, float("-inf"))
        loss = None
        if targets is not None:
            loss_sum = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                       ignore_index=-1, reduction="sum")
            loss = loss_sum / (targets != -1).sum().clamp(min=1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Append max_new_tokens sampled tokens to idx (B, T); the padded vocabulary is never sampled."""
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :self.config.vocab_size] / max(temperature, 1e-6)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
