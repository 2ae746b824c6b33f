"""
Activation checkpointing (grad_checkpointing = full | selective): recompute each transformer block in
the backward pass instead of keeping its activations, to fit a larger micro-batch (what each costs and
saves: BENCHMARKS.md, memory).
"""
from functools import partial

import torch

from speedgpt import attention


def check(cfg, proc):
    """Nothing to refuse: every mode runs on every device and backend (configurator checks the mode's name).
    Returns cfg."""
    return cfg


def apply(model, cfg, proc):
    """grad_checkpointing full | selective: recompute `model`'s blocks (checkpoint_blocks). Returns None."""
    if cfg.grad_checkpointing != "none":
        checkpoint_blocks(model, cfg.grad_checkpointing)


def memory(model, cfg, parts):
    """What grad_checkpointing changes in the memory estimate (speedgpt/memory.py's Parts, of `model`: a GPT of
    cfg's shape on the meta device). 'full' keeps each block's input (Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models", section 4: 2sbh per layer in 16-bit; here 4sbh, the residual stream
    being float32 under autocast) and, recomputing one block at a time, one layer's activations besides; 'selective'
    keeps the matmul and attention outputs: about half (measured: BENCHMARKS.md, Memory). The way out it names,
    short of 'full': 'full'."""
    C, L = model.config.n_embd, model.config.n_layer
    if cfg.grad_checkpointing == "full":
        parts.blocks = parts.tokens * (4 * C * L + parts.kept)       # the inputs kept, one block recomputed
    elif cfg.grad_checkpointing == "selective":
        parts.blocks = parts.tokens * parts.kept * L * 0.5
    if cfg.grad_checkpointing != "full":
        parts.blocks_way_out = "use --grad_checkpointing=full"


def checkpoint_blocks(model, mode):
    """Recompute each block of `model` (a GPT) in the backward pass. "full" keeps only the block's input;
    "selective" keeps matmul and attention outputs (every backend's: attention.saved_ops) and recomputes the
    cheap elementwise ops (PyTorch's selective activation checkpointing). Non-reentrant, so dropout masks are
    replayed exactly. Patches each block's forward, so state-dict keys are unchanged. Raises ValueError for another
    mode."""
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    if mode not in ("full", "selective"):
        raise ValueError(f"grad_checkpointing={mode!r}: expected 'full' or 'selective'")
    ops = torch.ops.aten
    save = {ops.mm.default, ops.addmm.default, ops.bmm.default, ops._scaled_mm.default} | attention.saved_ops()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    for block in model.transformer.h:
        forward = block.forward
        if mode == "full":
            block.forward = partial(checkpoint, forward, use_reentrant=False)
        else:
            block.forward = partial(checkpoint, forward, use_reentrant=False,
                                    context_fn=partial(create_selective_checkpoint_contexts, policy))
