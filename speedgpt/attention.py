"""
Attention kernels and the document mask, for model.py's CausalSelfAttention.

Backends (config key `attention`; `auto` is resolved once, at start, by resolve_attention):
  naive   the materialised (T, T) scores, softmax, then @ V: the baseline (model.py, inline)
  sdpa    F.scaled_dot_product_attention: FlashAttention on the GPU when the mask is plain causal (inline)
  flex    FlexAttention with a BlockMask (flex_block_mask; GPU only: FlexAttention has no CPU backward)
  varlen  FlashAttention's variable-length kernels, each document a sequence of its own given by
          cu_seqlens over the flattened batch: FA3's kernels as the custom op below where
          `flash_attn_interface` loads them, else PyTorch's FA2 varlen_attn

The document mask (packing=True, document_mask=True): the model gets doc_ids (B, T), and no token attends
to another document; positions restart at 0 at each document start. A document is a run of equal ids
(document_runs). One mask is built per forward (attention_mask) and shared by every layer; the rule
`document_causal_mask` is the single source of truth for naive, sdpa and flex, and varlen's sequences
are the same runs (varlen_cu_seqlens; the loader builds them in its thread: data.varlen_metadata).
speedgpt/mask_check.py checks what each backend really applies against an independent reference.

check() refuses, before any work, what a backend cannot do on the run's device; select_sdpa_backend()
pins SDPA to one kernel (the sdpa_backend flag).
"""
import importlib.util
import inspect
import warnings
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

BACKENDS = ("naive", "sdpa", "flex", "varlen")

# -----------------------------------------------------------------------------
# the flags: checked and resolved once, before any work


DEVICE_NAMES = {"cpu": "the CPU", "mps": "Apple's MPS"}      # for messages


def check(cfg, proc):
    """`cfg` with attention='auto' resolved (printed by the caller) and document_mask made False
    without packing (it masks packed rows only). Raises ValueError naming the keys for what cannot run
    on proc.device: flex or varlen on a CPU, varlen in float32, an sdpa_backend kernel
    that cannot take the run, check_mask without the document mask. Warns (UserWarning) about packing
    without the mask: documents then attend across their boundaries."""
    device = proc.device
    cfg = replace(cfg, document_mask=cfg.packing and cfg.document_mask)
    if cfg.sdpa_backend != "auto":
        if cfg.attention != "sdpa":
            on = DEVICE_NAMES.get(device.type, device.type)
            gpu = f", and attention={cfg.attention!r} needs a CUDA GPU: use 'sdpa' or 'naive' on {on}" \
                if cfg.attention in ("flex", "varlen") else f" (on {on} it picks no kernel)"
            gpu = "" if device.type == "cuda" else gpu
            raise ValueError(f"sdpa_backend={cfg.sdpa_backend!r} applies to attention='sdpa' only, "
                             f"not {cfg.attention!r}: leave sdpa_backend out{gpu}")
        if device.type != "cuda":       # first: off a GPU, the dtype and mask changes below would not help
            raise ValueError(f"sdpa_backend={cfg.sdpa_backend!r} picks a CUDA kernel: "
                             f"use sdpa_backend='auto' on {DEVICE_NAMES.get(device.type, device.type)}")
        if cfg.dtype == "float32":
            raise ValueError(f"sdpa_backend={cfg.sdpa_backend!r} kernels take bfloat16 or float16: set dtype, or "
                             "sdpa_backend='auto'")
        if cfg.sdpa_backend == "flash" and cfg.document_mask:
            raise ValueError("sdpa_backend='flash' takes no attention mask: use it with packing=False or "
                             "document_mask=False")
    if cfg.check_mask and not cfg.document_mask:
        raise ValueError("check_mask=True checks the document mask: it needs packing=True and document_mask=True")
    if cfg.attention == "varlen":         # the device first: on a CPU, setting dtype would not help
        varlen_kernel(device)             # FA3 or FA2, chosen once; a one-line error where neither runs
    if cfg.attention == "varlen" and cfg.dtype == "float32":
        raise ValueError("attention='varlen' (FlashAttention) takes bfloat16 or float16: set dtype, or "
                         "use attention='sdpa'")
    if cfg.attention == "auto":
        cfg = replace(cfg, attention=resolve_attention("auto", device, cfg.document_mask, cfg.dtype))
    if cfg.attention == "flex" and device.type != "cuda":
        on = DEVICE_NAMES.get(device.type, device.type)
        raise ValueError(f"attention='flex' needs a CUDA GPU: FlexAttention has no backward pass on {on}. "
                         f"Use attention='sdpa' (a boolean document mask) or 'naive' on {on}")
    if cfg.packing and not cfg.document_mask:
        warnings.warn("packing=True with document_mask=False: tokens attend across document boundaries")
    return cfg


def resolve_attention(name, device, document_mask, dtype="bfloat16"):
    """'auto' -> the fastest backend installed for what is trained: with the document mask, 'varlen'
    where FA3 runs and `dtype` is bfloat16 or float16 (FlashAttention takes no float32), else 'flex' on
    a GPU (PyTorch's FA2 varlen lost to flex on the H200: BENCHMARKS.md), else 'sdpa'; without the
    mask 'sdpa' (FlashAttention's causal kernel). Other names are returned as they are."""
    if name != "auto":
        return name
    if not document_mask or torch.device(device).type != "cuda":
        return "sdpa"
    if dtype == "float32":
        return "flex"
    try:
        return "varlen" if varlen_kernel(device).startswith("FA3") else "flex"
    except ValueError:
        return "flex"


def select_sdpa_backend(name):
    """Let F.scaled_dot_product_attention run only the `name` ('flash' | 'cudnn') kernel, process-wide,
    so a shape it cannot take fails ('No available kernel') instead of falling back to a slower one;
    'auto' turns every kernel back on (PyTorch's default: it picks per call)."""
    b = torch.backends.cuda
    b.enable_flash_sdp(name in ("auto", "flash"))
    b.enable_cudnn_sdp(name in ("auto", "cudnn"))
    b.enable_mem_efficient_sdp(name == "auto")
    b.enable_math_sdp(name == "auto")

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


def attention_mask(backend, doc_ids, T, device, cu_seqlens=None, cache=None):
    """The mask every layer of one forward shares. For naive / sdpa: None (plain causal) without doc_ids,
    else a (B, 1, T, T) bool tensor. For flex: a BlockMask (the causal one built once per (T, device)
    and kept in `cache`, a dict). For varlen: None without doc_ids, else `cu_seqlens` (the loader's) or
    varlen_cu_seqlens(doc_ids). Each run of equal doc_ids is one document (document_runs)."""
    if backend == "varlen":
        return cu_seqlens if cu_seqlens is not None or doc_ids is None else varlen_cu_seqlens(doc_ids)
    doc_ids = None if doc_ids is None else document_runs(doc_ids)
    if backend != "flex":
        return None if doc_ids is None else dense_attention_mask(doc_ids)
    if doc_ids is None:
        if (T, device) not in cache:
            cache[(T, device)] = flex_block_mask(torch.zeros(1, T, dtype=torch.long, device=device))
        return cache[(T, device)]
    return flex_block_mask(doc_ids)

# -----------------------------------------------------------------------------
# flex: FlexAttention with a BlockMask

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
    mask_mod (a dense pass per batch). Other lengths use create_block_mask."""
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
                                    full_kv_indices=full_idx, BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(T, T))


_compiled_flex = None


def compiled_flex_attention():
    """flex_attention under torch.compile (eager flex_attention is a slow reference implementation),
    built once. Called at model construction, not in forward: a global assigned inside forward is a
    side effect that activation checkpointing's traced region refuses, which sends the whole forward
    back to eager (BENCHMARKS.md, attention)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_attention(q, k, v, block_mask, compiled):
    """FlexAttention of q, k, v (B, nh, T, hs) with `compiled` (from compiled_flex_attention()) on the
    GPU, eager on the CPU (forward only there). At head size 64, 8 warps per tile instead of the
    default: it measured faster (BENCHMARKS.md, attention)."""
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


_varlen_kernel_name = None


def varlen_kernel(device):
    """Pick the kernel behind attention='varlen' on `device` (once per process) and return its name: FA3
    where `flash_attn_interface` imports (FlashAttention's hopper/ build) and loads torch.ops.flash_attn_3
    on a 9.x GPU; else PyTorch's FA2 (FA3 varlen measured fastest, then flex, then FA2 varlen:
    BENCHMARKS.md, attention). Raises ValueError where neither runs (CPU, older torch or GPU)."""
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
                why = None if fa3_loaded() else "flash_attn_interface loaded no torch.ops.flash_attn_3.fwd/bwd"
            except (ImportError, OSError, RuntimeError) as e:
                why = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        _varlen_kernel_name = "FA3 (torch.ops.flash_attn_3: one split, packed qkv)" if why is None else \
            f"FA2 (torch varlen_attn; no FA3: {why})"
    return _varlen_kernel_name


def causal_varlen_attn():
    """The varlen kernel: fa3_varlen_attn (FA3's kernels called directly: one split, packed qkv) once
    varlen_kernel() has found FA3, else torch.nn.attention.varlen.varlen_attn (PyTorch's FlashAttention-2;
    is_causal=True in torch 2.10, window_size=(-1, 0) from 2.11) taking the packed qkv, or None where
    torch has none. Both are custom ops with fake implementations and registered backwards, so
    torch.compile traces them without a graph break. Called (qkv (N, 3, nh, hs), cu_seqlens, max_seqlen)."""
    if (_varlen_kernel_name or "").startswith("FA3"):
        return fa3_varlen_attn
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    causal = dict(window_size=(-1, 0)) if "window_size" in inspect.signature(varlen_attn).parameters else \
        dict(is_causal=True)
    return lambda qkv, cu, max_seqlen: varlen_attn(*qkv.unbind(1), cu, cu, max_seqlen, max_seqlen, **causal)


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
# FlashAttention-3's varlen kernels (Hopper), called directly as one torch custom op
#
# torch.ops.flash_attn_3.fwd / .bwd come from `flash_attn_interface`. This op is used instead of torch's
# own route to FA3 (activate_flash_attention_impl("FA3") under varlen_attn) for two measured reasons
# (BENCHMARKS.md): that route lets FA3 split the keys of fast.py's batches and pay a combine kernel per
# call (torch 2.11's varlen_attn takes no num_splits), and it returns separate dq, dk, dv that the backward
# concatenates into c_attn's gradient.
# Here: one split, and q, k, v read from and dq, dk, dv written into c_attn's packed (N, 3, nh, hs)
# layout, as FlashAttention's own qkvpacked functions do. A custom op with a fake implementation and a
# registered backward: torch.compile traces it without a graph break, and the meta device runs it
# (tests/test_packing.py traces the model that way on the CPU).


@torch.library.custom_op("speedgpt::fa3_varlen_qkvpacked", mutates_args=())
def fa3_varlen_qkvpacked(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int) -> tuple[Tensor, Tensor]:
    """Causal attention within each sequence [cu_seqlens[i], cu_seqlens[i+1]) of N flattened tokens.
    qkv (N, 3, nh, hs) bf16/fp16 on a 9.x GPU (any strides with the last dimension contiguous);
    cu_seqlens (S+1,) int32 from 0 rising to N (repeats: empty sequences); max_seqlen a Python int >=
    the longest sequence. Returns out (N, nh, hs) and the softmax log-sum-exp (nh, N) float32 (kept for
    the backward). Raises RuntimeError where torch.ops.flash_attn_3 is not loaded."""
    q, k, v = qkv.unbind(1)
    out, lse, *_ = torch.ops.flash_attn_3.fwd(
        q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen, softmax_scale=q.size(-1) ** -0.5, is_causal=True, num_splits=1)
    return out, lse


@fa3_varlen_qkvpacked.register_fake
def _(qkv, cu_seqlens, max_seqlen):
    N, _, nh, hs = qkv.shape
    return qkv.new_empty(N, nh, hs), qkv.new_empty(nh, N, dtype=torch.float32)


@torch.library.custom_op("speedgpt::fa3_varlen_qkvpacked_backward", mutates_args=())
def fa3_varlen_qkvpacked_backward(dout: Tensor, qkv: Tensor, out: Tensor, lse: Tensor, cu_seqlens: Tensor,
                                  max_seqlen: int) -> Tensor:
    """Gradient of fa3_varlen_qkvpacked's out: dqkv (N, 3, nh, hs), dq, dk and dv written in place by
    FA3's backward (no concatenation afterwards)."""
    q, k, v = qkv.unbind(1)
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    torch.ops.flash_attn_3.bwd(
        dout.contiguous(), q, k, v, out, lse, *dqkv.unbind(1), cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen, softmax_scale=q.size(-1) ** -0.5, is_causal=True,
        deterministic=torch.are_deterministic_algorithms_enabled())
    return dqkv


@fa3_varlen_qkvpacked_backward.register_fake
def _(dout, qkv, out, lse, cu_seqlens, max_seqlen):
    return torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)


def _setup_context(ctx, inputs, output):
    qkv, cu_seqlens, max_seqlen = inputs
    ctx.save_for_backward(qkv, output[0], output[1], cu_seqlens)
    ctx.max_seqlen = max_seqlen


def _backward(ctx, dout, dlse):
    qkv, out, lse, cu_seqlens = ctx.saved_tensors
    return fa3_varlen_qkvpacked_backward(dout, qkv, out, lse, cu_seqlens, ctx.max_seqlen), None, None


fa3_varlen_qkvpacked.register_autograd(_backward, setup_context=_setup_context)


def fa3_varlen_attn(qkv, cu_seqlens, max_seqlen):
    """out (N, nh, hs) of fa3_varlen_qkvpacked (see there for shapes and errors)."""
    return fa3_varlen_qkvpacked(qkv, cu_seqlens, max_seqlen)[0]


def saved_ops():
    """The attention ops of every backend whose outputs selective activation checkpointing keeps instead of
    recomputing them in the backward (speedgpt/features/activation_checkpointing.py): SDPA's kernels, FlexAttention,
    PyTorch's FA2 varlen and this module's FA3 op. A backend added here is saved there too."""
    aten = torch.ops.aten
    ops = {aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
           aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
           torch.ops.speedgpt.fa3_varlen_qkvpacked.default}
    if hasattr(torch.ops, "torch_attn") and hasattr(torch.ops.torch_attn, "_varlen_attn"):   # FA2 varlen
        ops.add(torch.ops.torch_attn._varlen_attn.default)
    if hasattr(torch.ops.higher_order, "flex_attention"):
        ops.add(torch.ops.higher_order.flex_attention)
    return ops


def fa3_loaded():
    """True when torch.ops.flash_attn_3 has forward and backward kernels (after `import flash_attn_interface`)."""
    return hasattr(torch.ops, "flash_attn_3") and hasattr(torch.ops.flash_attn_3, "fwd") and \
        hasattr(torch.ops.flash_attn_3, "bwd")
