"""
Model transforms, applied by train.py to a built GPT in this fixed order (as torchtitan does):
FP8 conversion, activation checkpointing, compile, then DDP/FSDP wrapping. Each is a function of
the model and the config; optional dependencies are imported only when their flag is on.
"""
import importlib.util

import torch


def check_fp8(device, cfg):
    """Raise ValueError unless `device` can train in FP8: a GPU of compute capability 8.9 or newer,
    with torchao installed. train.py calls it before any work (data, model) is done; the message names
    the flags asking (cfg.fp8, cfg.fp8_head) and how to turn them off."""
    keys = [k for k in ("fp8", "fp8_head") if getattr(cfg, k)]
    asking = " and ".join(f"{k}=True" for k in keys) + (" needs" if len(keys) == 1 else " need")
    off = " ".join(f"--{k}=False" for k in keys) + (" (config/fast.py sets fp8_head=True)" if cfg.fp8_head else "")
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        where = "the CPU" if device.type != "cuda" else f"{torch.cuda.get_device_name(device)} (sm_{''.join(map(str, torch.cuda.get_device_capability(device)))})"
        raise ValueError(f"{asking} a GPU of compute capability 8.9 or newer (Ada, Hopper); this run is on "
                         f"{where}: add {off}")
    if importlib.util.find_spec("torchao") is None:
        raise ValueError(f"{asking} torchao: pip install torchao, or add {off}")


def apply_fp8(model, cfg, device):
    """Swap nn.Linear layers for torchao Float8Linear (dynamic scaling, cfg.fp8_recipe): with cfg.fp8
    the block Linears with both dimensions divisible by 16 and at least cfg.fp8_min_dim wide (on the
    H200 FP8 lost to bf16 at width 768 and won from 2048); with cfg.fp8_head the output head, whatever
    its width (768 -> 50,304 on GPT-2: head + cross-entropy 30.7 -> 26.1 ms per 65,536 tokens, +3.1%
    tokens/s on config/fast.py, ../shared/GPU.md). Returns the converted names. Raises ValueError on a
    CPU or a GPU below compute capability 8.9, or without torchao."""
    check_fp8(device, cfg)
    return convert_fp8(model, cfg)


def convert_fp8(model, cfg):
    """The conversion itself, without the device check (tests call it on the CPU). The head's weight
    stays tied to the embedding: Float8Linear.from_float keeps the same Parameter object."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise ValueError(f"{'fp8' if cfg.fp8 else 'fp8_head'}=True needs torchao: pip install torchao") from e
    converted = []

    def eligible(module, fqn):
        if fqn == "lm_head":
            ok = cfg.fp8_head and not cfg.fused_ce         # fused_ce does the head's matmuls itself
        else:
            ok = (cfg.fp8 and module.in_features % 16 == 0 and module.out_features % 16 == 0
                  and min(module.in_features, module.out_features) >= cfg.fp8_min_dim)
        if ok:
            converted.append(fqn)
        return ok
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(cfg.fp8_recipe), module_filter_fn=eligible)
    if cfg.fp8 and converted in ([], ["lm_head"]):
        raise ValueError(f"fp8=True but no Linear layer is eligible: all are narrower than fp8_min_dim={cfg.fp8_min_dim} "
                         "(FP8 loses to bf16 on narrow layers); lower fp8_min_dim to convert them anyway")
    return converted


def apply_activation_checkpointing(model, mode):
    """Recompute each transformer block in the backward pass. "full" keeps only the block's input;
    "selective" keeps matmul and attention outputs and recomputes the cheap elementwise ops
    (PyTorch's selective activation checkpointing). Non-reentrant, so dropout masks are replayed
    exactly. Patches each block's forward, so state-dict keys are unchanged."""
    from functools import partial
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    ops = torch.ops.aten
    save = {ops.mm.default, ops.addmm.default, ops.bmm.default, ops._scaled_mm.default,
            ops._scaled_dot_product_flash_attention.default, ops._scaled_dot_product_efficient_attention.default,
            ops._scaled_dot_product_cudnn_attention.default, ops._scaled_dot_product_flash_attention_for_cpu.default}
    if hasattr(torch.ops, "torch_attn") and hasattr(torch.ops.torch_attn, "_varlen_attn"):   # attention='varlen'
        save.add(torch.ops.torch_attn._varlen_attn.default)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    for block in model.transformer.h:
        forward = block.forward
        if mode == "full":
            block.forward = partial(checkpoint, forward, use_reentrant=False)
        elif mode == "selective":
            block.forward = partial(checkpoint, forward, use_reentrant=False,
                                    context_fn=partial(create_selective_checkpoint_contexts, policy))


def apply_compile(model, per_block=False, cuda_graphs=False):
    """torch.compile in place (nn.Module.compile), so the state dict keeps its names (no _orig_mod.).
    per_block compiles each transformer block on its own (torchtitan's way under FSDP, whose hooks
    then stay outside the compiled graphs); otherwise the whole model, loss included, is one graph.
    cuda_graphs: mode="reduce-overhead", Inductor's CUDA graph trees: each compiled forward and backward
    is recorded once and replayed with one launch; the inputs (tokens, targets, doc_ids, cu_seqlens,
    positions) are copied into the graph's static buffers at each call. Needs stable_grads(model)."""
    for module in (model.transformer.h if per_block else [model]):
        module.compile(mode="reduce-overhead" if cuda_graphs else None)


def stable_grads(model):
    """Give every parameter a zero .grad allocated outside any CUDA graph, for cuda_graphs=True. A
    replayed backward writes its gradients into the graph's own memory, which the next replay
    overwrites: with gradient accumulation, .grad must be a buffer of its own that each micro-step adds
    into, zeroed in place (optimizer.zero_grad(set_to_none=False)) rather than freed between steps."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)


def apply_parallelism(model, parallelism, param_dtype, device, ddp_local_rank):
    """Wrap for data parallelism: DDP (one all-reduce per optimizer step) or FSDP2 (fully_shard per
    block then the root, parameters in param_dtype and fp32 gradient reduction)."""
    if parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[ddp_local_rank] if device.type == "cuda" else None)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))   # the run's device (gloo on a CPU, even beside a GPU)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def select_sdpa_backend(name):
    """Let F.scaled_dot_product_attention run only the `name` ('flash' | 'cudnn') kernel, process-wide,
    so a shape it cannot take fails ('No available kernel') instead of falling back to a slower one;
    'auto' turns every kernel back on (PyTorch's default: it picks per call)."""
    b = torch.backends.cuda
    b.enable_flash_sdp(name in ("auto", "flash"))
    b.enable_cudnn_sdp(name in ("auto", "cudnn"))
    b.enable_mem_efficient_sdp(name == "auto")
    b.enable_math_sdp(name == "auto")
