"""
Data parallelism over the processes torchrun starts (parallelism = ddp | fsdp): the last transform of the model,
a wrapper around it (speedgpt/features/__init__.py), and what it changes in the memory estimate (memory).
Processes, devices and signals: speedgpt/distributed.py.
"""
import torch
import torch.distributed as dist


def check(cfg, proc):
    """Raise ValueError naming the keys for a parallelism that cannot run: FSDP needs torchrun (several
    processes) and bfloat16 or float32 (float16 would need a sharded GradScaler). Returns cfg."""
    world = proc.world
    if cfg.parallelism == "fsdp" and world == 1:
        raise ValueError("parallelism='fsdp' shards the model over several processes: launch with torchrun "
                         "(torchrun --nproc_per_node=N train.py ...), or leave parallelism out on one process")
    if cfg.parallelism == "fsdp" and cfg.dtype == "float16":
        raise ValueError("parallelism='fsdp' with dtype='float16' is not supported (it needs a sharded GradScaler); "
                         "use bfloat16")
    return cfg


def memory(model, cfg, parts):
    """What the wrapper changes in the memory estimate (speedgpt/memory.py's Parts) with parts.world > 1 processes:
    FSDP shards the weights, their gradients and the optimizer state by world (the gathered block or two is left
    out: small next to them); DDP adds its gradient buckets, a copy of the gradients (gradient_as_bucket_view is
    off), and names FSDP as the way out."""
    if parts.world == 1:
        return
    if cfg.parallelism == "fsdp":
        parts.params, parts.grads, parts.optimizer = (b // parts.world for b in (parts.params, parts.grads,
                                                                                 parts.optimizer))
    else:
        parts.grads += parts.params
        parts.weights_way_out = "--parallelism=fsdp (shards the weights)"


def wrap(model, cfg, proc):
    """Wrap `model` (a GPT) for data parallelism. Returns (model, grad_sync): DDP (one all-reduce per
    optimizer step) or FSDP2 (fully_shard per block then the root, parameters in param_dtype and fp32
    gradient reduction); grad_sync(bool) turns gradient sync on or off, so it runs on the last
    micro-step only. One process: (model, None)."""
    if proc.world == 1:
        return model, None
    parallelism, device, local_rank = cfg.parallelism, proc.device, proc.local_rank
    param_dtype = getattr(torch, cfg.dtype)
    if parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        return model, lambda on: setattr(model, "require_backward_grad_sync", on)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    # the run's device (gloo on a CPU, even beside a GPU)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model, model.set_requires_gradient_sync
