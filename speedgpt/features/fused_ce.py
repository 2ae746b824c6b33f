"""
The fused head (fused_ce=True): GPT's output head and its cross-entropy as one autograd Function, the
gradients made in the forward. The plain path (model.py: logits = lm_head(x), then F.cross_entropy) keeps the
(tokens, vocab) logits for the backward and passes over them twice, softmax in the forward and
softmax - one-hot in the backward; here each chunk of tokens is turned into logits, loss and both
gradients at once, and the backward only scales what the forward stored (its speed and memory:
BENCHMARKS.md). With fp8_head the three matmuls run in float8 (speedgpt/features/fp8.py's fp8_mm), and with
head_kernel the softmax pass between them runs as speedgpt/features/softmax_pass.py's Triton kernels (in FP8 or
bf16).

The trainer installs it on the model (install(): model.head_loss), so it runs inside the model's forward,
where FSDP has gathered the head's weight and compilation sees it, and the model's config and checkpoints
never know of it.
"""
import torch

from speedgpt import refuse_unused
from speedgpt.features import softmax_pass


DETAILS = {"fused_ce": ("fused_ce_chunk", "head_kernel")}      # what means nothing without the flag


def check(cfg, proc):
    """Raise ValueError for fused_ce=True with dtype='float16': the head's gradients are made in the
    forward, outside the GradScaler's loss scaling (validated in bfloat16 and float32 only); for a
    fused_ce_chunk or head_kernel without fused_ce, where they would do nothing, or a chunk below 1; and for
    head_kernel where its kernels cannot run (softmax_pass.check). Returns cfg."""
    if cfg.fused_ce_chunk <= 0:
        raise ValueError(f"config key 'fused_ce_chunk' must be positive, got {cfg.fused_ce_chunk}")
    if not cfg.fused_ce:
        refuse_unused(cfg, ("fused_ce_chunk",), "the chunk of the fused head and loss", "--fused_ce=True")
        if proc.device.type != "cuda":         # off a GPU its own refusal first: fused_ce=True would not help
            softmax_pass.check(cfg, proc.device)
        refuse_unused(cfg, ("head_kernel",), "the fused head's softmax pass", "--fused_ce=True")
    if cfg.fused_ce and cfg.dtype == "float16":
        raise ValueError("fused_ce=True with dtype='float16' is not supported: it makes the head's gradients in the "
                         "forward, outside the GradScaler's loss scaling, and was validated in bfloat16 and "
                         "float32 only (config/fast.py sets fused_ce=True: add --fused_ce=False for float16)")
    softmax_pass.check(cfg, proc.device)
    return cfg


class FusedHeadLoss:
    """GPT.head_loss for fused_ce: head_loss(h (N, C), w (V, C), y (N,), vocab_size) -> the summed
    cross-entropy of h @ w.T over y != -1, by LinearCrossEntropy in chunks of `chunk` tokens, its matmuls in
    float8 when fp8 (fp8_head)."""

    def __init__(self, chunk, fp8=False, kernel=False):
        self.chunk, self.fp8, self.kernel = chunk, fp8, kernel

    def __call__(self, h, w, y, vocab_size):
        return LinearCrossEntropy.apply(h, w, y, vocab_size, self.chunk, self.fp8, self.kernel)

    def __repr__(self):
        return f"FusedHeadLoss(chunk={self.chunk}, fp8={self.fp8}, kernel={self.kernel})"


def apply(model, cfg, proc=None):
    """Install the fused head on `model` (a GPT) when cfg.fused_ce: model.head_loss = FusedHeadLoss(
    cfg.fused_ce_chunk, cfg.fp8_head). Returns a line saying what was installed, or None."""
    if not cfg.fused_ce:
        return None
    check_same_loss(model)
    model.head_loss = FusedHeadLoss(cfg.fused_ce_chunk, cfg.fp8_head, cfg.head_kernel)
    return f"fused_ce: head + cross-entropy in chunks of {cfg.fused_ce_chunk:,} tokens, matmuls in " + \
        ("float8 (tensorwise)" if cfg.fp8_head else cfg.dtype) + \
        (", softmax pass in Triton (speedgpt/features/softmax_pass.py)" if cfg.head_kernel else "")


def memory(model, cfg, parts):
    """What fused_ce changes in the memory estimate (speedgpt/memory.py's Parts, of `model`: a GPT of cfg's shape on
    the meta device): no (tokens, vocab) logits kept, but one chunk's (fused_ce_chunk, padded vocab) float32
    temporaries (about 4 uncompiled, 1 compiled: the measured peaks grow by about 4 bytes per element of the chunk)
    plus the gradients it stores, of the hidden states (in the autocast dtype) and of the weight (float32). The way
    out it names where the head holds much of the step: a smaller chunk; off, the flag itself (not with float16,
    which check() refuses)."""
    if not cfg.fused_ce:
        parts.head_way_out = "--fused_ce=True (no logits kept)" if cfg.dtype != "float16" else ""
        return
    V, C = model.config.padded_vocab_size, model.config.n_embd
    chunk = min(cfg.fused_ce_chunk, parts.tokens)
    stored = parts.tokens * C * (2 if cfg.dtype in ("bfloat16", "float16") else 4) + V * C * 4
    parts.head, parts.head_compiled = chunk * V * 4 * 4 + stored, chunk * V * 4 * 1 + stored
    parts.head_way_out = "a smaller --fused_ce_chunk"


def check_same_loss(model, tokens=8, scale=256):
    """Raise ValueError unless `model`'s own head (GPT.head without a head_loss: lm_head, then cross-entropy) gives
    the loss this module computes, on `tokens` random hidden states, eager, in the weights' dtype. The fused head
    makes the logits itself, so a fork's change to them in model.py (a soft cap, a temperature) would otherwise be
    trained without, silently. The head's weight is multiplied by `scale` (a power of 2: undone exactly) for the
    check: at init the logits are near 0, where a soft cap is the identity; TF32 is off, so the two agree."""
    w = model.lm_head.weight
    gen = torch.Generator(w.device).manual_seed(0)                  # not the run's RNG
    x = torch.randn(1, tokens, w.size(1), device=w.device, dtype=w.dtype, generator=gen)
    y = torch.randint(0, model.config.vocab_size, (1, tokens), device=w.device, generator=gen)
    before, tf32 = model.head_loss, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.no_grad():
            w.mul_(scale)
        model.head_loss = None
        plain = model.head(x, y)[1]
        model.head_loss = FusedHeadLoss(tokens)
        with torch.enable_grad():
            fused = model.head(x, y)[1]
    finally:
        model.head_loss, torch.backends.cuda.matmul.allow_tf32 = before, tf32
        with torch.no_grad():
            w.div_(scale)
    tol = 1e-4 if w.dtype in (torch.float32, torch.float64) else 2e-2
    if not torch.allclose(plain.float(), fused.float(), rtol=tol, atol=tol):
        raise ValueError(f"fused_ce=True computes the head as lm_head and cross-entropy, but this model's head gives "
                         f"another loss ({plain.item():.4f}, fused {fused.item():.4f}, its weight x {scale}; a change "
                         "to the logits in model.py's GPT.head?): make it in speedgpt/features/fused_ce.py too, or "
                         "add --fused_ce=False")


def head_ce_chunk(h, w, y, vocab_size, fp8=False, w8=None, kernel=False):
    """The summed cross-entropy of the logits h @ w.T over targets y != -1, and its gradients.
    h (n, C) and w (V, C) in the compute dtype, y (n,) int64 with -1 ignored; the softmax runs in
    float32 (float64 for float64 inputs) over the first vocab_size columns (the padded ids are no
    tokens). The gradient of the logits is softmax - one-hot (zero rows for ignored targets).
    fp8=True: the three matmuls in float8 (speedgpt.features.fp8.fp8_mm; h and w in e4m3, the logits' gradient in e5m2);
    w8 = (cast_rhs(w.t()), cast_rhs(w)): the weight already cast, as LinearCrossEntropy does once for all chunks.
    kernel=True (on a CUDA GPU): the softmax pass runs as speedgpt/features/softmax_pass.py's Triton kernels, which
    write the float8 gradient in both layouts at once (fp8), or the gradient once in the logits' dtype.
    Returns (loss: 0-dim, grad_h (n, C) in h's dtype, grad_w (V, C)), the gradients of the sum
    itself; loss and grad_w in float32 (float64)."""
    acc = torch.promote_types(h.dtype, torch.float32)
    if fp8:
        from speedgpt.features.fp8 import E5M2_MAX, fp8_mm
        w_t8, w_8 = w8 or (w.t(), w)
        logits = fp8_mm(h, w_t8, out_dtype=h.dtype, fast_accum=True)                 # (n, V)
        if kernel:              # g in e5m2, scaled by E5M2_MAX: |softmax - one-hot| <= 1
            loss, g8, g8t = torch.ops.speedgpt.softmax_grad_fp8(logits, y, vocab_size, E5M2_MAX)
            scale = torch.full((), E5M2_MAX, dtype=torch.float32, device=h.device)
            return (loss.to(acc).sum(), fp8_mm((g8, scale), w_8, out_dtype=h.dtype),
                    fp8_mm((g8t, scale), h, out_dtype=acc))
        logits = logits.to(acc)
    else:
        logits = h @ w.t()                                                         # (n, V)
        if kernel:
            loss, g = torch.ops.speedgpt.softmax_grad(logits, y, vocab_size)
            return loss.to(acc).sum(), g @ w, (g.t() @ h).to(acc)
        logits = logits.to(acc)
    col = torch.arange(w.size(0), device=h.device)
    logits = logits.masked_fill(col >= vocab_size, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    valid = y != -1
    loss = torch.where(valid, lse - logits.gather(1, y.clamp(min=0)[:, None])[:, 0], 0.0).sum()
    g = (torch.exp(logits - lse[:, None]) - (col == y[:, None]).to(acc)) * valid[:, None]
    if fp8:                     # g lies in [-1, 1] (softmax - one-hot): its scale is known, no amax pass
        return (loss, fp8_mm(g, w_8, out_dtype=h.dtype, a_amax=1.0),
                fp8_mm(g.t(), h, out_dtype=acc, a_amax=1.0))
    g = g.to(h.dtype)
    return loss, g @ w, (g.t() @ h).to(acc)


class LinearCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of h @ w.T, both gradients computed in the forward, `chunk` tokens at a
    time: each chunk's logits are made, turned into softmax - one-hot and consumed by the two gradient
    matmuls at once, so no (tokens, V) tensor is kept for the backward, and the softmax pass over the
    logits is made once instead of twice (forward and backward). The backward only scales the stored
    gradients. The idea of Liger-Kernel's fused linear cross-entropy (Hsu et al. 2024), here in plain
    PyTorch ops for torch.compile to fuse.

    apply(h, w, y, vocab_size, chunk, fp8=False): h (N, C) hidden states, w (V, C) the head's weight,
    y (N,) int64 targets in [0, vocab_size) or -1 (ignored; other negative values are not checked and
    count as id 0), vocab_size <= V the real vocabulary (columns beyond it are padding, outside the
    softmax), chunk > 0 tokens per chunk. Matmuls in the autocast dtype when autocast is on, else h's;
    fp8=True (the fp8_head flag) runs the three in float8 instead (speedgpt.features.fp8.fp8_mm: torchao's tensorwise
    scaling, torch._scaled_mm). Returns the 0-dim sum over targets != -1 of the cross-entropy in nats
    (float32; float64 for float64 inputs). The gradient work is done even under torch.no_grad(): call it
    only when training. Raises what the matmuls raise on mismatched shapes, and ValueError for chunk = 0."""

    @staticmethod
    def forward(ctx, h, w, y, vocab_size, chunk, fp8=False, kernel=False):
        on = torch.is_autocast_enabled(h.device.type)
        dtype = torch.get_autocast_dtype(h.device.type) if on else h.dtype
        hc, wc = h.to(dtype), w.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)
        grad_h = torch.empty_like(hc)
        grad_w = torch.zeros(w.shape, dtype=acc, device=w.device)
        loss = torch.zeros((), dtype=acc, device=h.device)
        w8 = None
        if fp8:                           # the weight cast to float8 once, in both layouts, for every chunk
            from speedgpt.features.fp8 import cast_rhs
            w8 = cast_rhs(wc.t()), cast_rhs(wc)
        for s in range(0, h.size(0), chunk):
            loss_c, grad_h[s:s + chunk], grad_w_c = head_ce_chunk(hc[s:s + chunk], wc, y[s:s + chunk], vocab_size,
                                                                  fp8, w8, kernel)
            loss = loss + loss_c          # out of place: the in-place version gave wrong results compiled
            grad_w = grad_w + grad_w_c    # on the GPU (torch 2.11; tests/test_gpu.py -k fused) though not on the CPU
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = h.dtype, w.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        grad_h, grad_w = ctx.saved_tensors
        return (grad_h * grad).to(ctx.dtypes[0]), (grad_w * grad).to(ctx.dtypes[1]), None, None, None, None, None
