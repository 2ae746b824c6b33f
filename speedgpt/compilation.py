"""
torch.compile (compile=True) and its CUDA-graph mode (cuda_graphs=True, an experiment): the whole model,
loss included, as one graph, or each transformer block on its own under FSDP (torchtitan's way: FSDP's
hooks stay outside the compiled graphs).
"""
import torch


def check(cfg, device, world):
    """Raise ValueError naming the keys unless cuda_graphs can run: it needs compile=True, a CUDA GPU and
    one process (CUDA graphs of the compiled forward and backward; no torchrun)."""
    if not cfg.cuda_graphs:
        return
    if not cfg.compile:
        raise ValueError("config key 'cuda_graphs' needs compile=True: the CUDA graphs are torch.compile's (mode 'reduce-overhead')")
    if device.type != "cuda" or world > 1:
        raise ValueError("cuda_graphs=True is a one-GPU experiment: it needs a CUDA GPU and no torchrun")


def apply(model, per_block=False, cuda_graphs=False):
    """torch.compile `model` (a GPT) in place (nn.Module.compile), so the state dict keeps its names (no
    _orig_mod.). per_block compiles each transformer block on its own; otherwise the whole model is one
    graph. cuda_graphs: mode="reduce-overhead", Inductor's CUDA graph trees: each compiled forward and
    backward is recorded once and replayed with one launch; the inputs are copied into the graph's
    static buffers at each call. Needs stable_grads(model)."""
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
