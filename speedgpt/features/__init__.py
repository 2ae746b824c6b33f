"""
The features: each flag that changes how the model trains (not what it is), one module each, every one answering
the same calls, as torchtitan's converters do. train.py lists them once, in the order they apply (FEATURES), and
its stages loop over that list:

  check(cfg, proc) -> cfg          before any work: refuse, in one line naming the way out, what cannot work on
                                   this device (proc.device) and launch (proc.world); return cfg with what the flags
                                   resolve to. Every module train.py checks answers it (train.CHECKS)
  apply(model, cfg, proc) -> line  transform the raw GPT in place when the flag is on; a line to print, or None
  prepare(model, batch, cfg)       optional: once, before the first step, after a checkpoint's state is loaded,
                                   eagerly even where the model is compiled (FP8's first amax history)
  step_hooks(model, cfg) -> [hook] optional: hook(applied) after every optimizer step, applied or skipped
  grad_hooks(model, cfg) -> [hook] optional: hook() before every update the optimizer applies, on its final
                                   gradients (.grad of model's parameters: accumulated, averaged over ranks,
                                   unscaled, clipped, finite; a skipped step calls none); what changes them, as
                                   gradient noise would, does it here
  fp8_flops_per_token(model, cfg)  optional: the FLOPs per token that run in FP8 (measure.py's mfu_fp8)
  memory(model, cfg, parts)        optional: change memory.Parts (the weights' state, one micro-batch's bytes per
                                   token per layer kept for the backward, the blocks' bytes, the head's, a way out
                                   for the refusal) by what the flag changes, for the memory estimate; on a model of
                                   cfg's shape on the meta device, in train.TRANSFORMS' order (FEATURES, then
                                   parallel.py's, the one answer of the wrapper besides check and wrap)
  DETAILS                          optional: {flag, or "key=value": keys that mean nothing without it} (configurator
                                   drops a preset's when a later setting turns it off, and refuses the rest)

  fp8.py                        FP8 training: block Linears (fp8) and the fused head's matmuls (fp8_head)
  softmax_pass.py               the fused head's softmax pass in Triton (head_kernel; checked by fused_ce.check)
  cast_kernel.py                the delayed FP8 casts with their amax in one Triton pass (fp8_cast_kernel, and
                                fp8_gelu_cast with the MLP's GELU, and its derivative, in them, fp8_norm_cast
                                with the LayerNorm in them; fp8.check)
  gelu_pass.py                  GELU's erf made cheaper (gelu_erf='fast'): in FP8's casts (cast_kernel.py), else as
                                Triton passes of its own around the Linear it feeds
  fused_ce.py                   the output head and cross-entropy as one function (fused_ce)
  activation_checkpointing.py   recompute blocks in the backward (grad_checkpointing)
  compilation.py                torch.compile, whole model or per block (compile, compile_regional, compile_tuning,
                                compile_persistent_rows)
  parallel.py                   DDP / FSDP (parallelism): the last transform, a wrapper (wrap) rather than apply

Bookkeeping (speedgpt/checkpoint.py, measure.py, memory.py, evaluation.py, resume.py, distributed.py) never imports
a feature: it handles whatever state it is given (a module's extra state, an optimizer's groups, the FLOPs and the
bytes the features report). tests/test_layout.py holds the project to that.
"""
import torch


def exact_gelus(model):
    """[(owner, act name, producer, consumer)]: each exact GELU between two Linears, as a module's ACT_BETWEEN
    ({its activation: (the Linear feeding it, the Linear it feeds)}, model.py's MLP) names them; what fp8's
    fp8_gelu_cast (fp8.gelu_fed) and gelu_pass's passes (gelu_pass.served) each take the ones they can of."""
    return [(owner, act_name, getattr(owner, producer), getattr(owner, consumer))
            for owner in model.modules()
            for act_name, (producer, consumer) in getattr(owner, "ACT_BETWEEN", {}).items()
            if type(getattr(owner, act_name)) is torch.nn.GELU and getattr(owner, act_name).approximate == "none"]
