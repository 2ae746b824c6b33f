"""
torch.compile (compile=True) and its CUDA-graph mode (cuda_graphs=True, an experiment). Two ways:
  whole model  the forward, loss included, as one graph (the default on one process)
  regional     each transformer block on its own, plus the head and loss (GPT.head): the blocks share
               their code, so one block is compiled and its code reused by every other, and the compile
               time does not grow with depth (PyTorch's regional compilation; torchtitan compiles per
               block). compile_regional=True, and always under FSDP, whose hooks then stay outside the
               compiled graphs.
"""
import torch


def check(cfg, device, world):
    """Raise ValueError naming the keys unless the compile flags can work together: compile_regional
    needs compile; cuda_graphs needs compile=True (whole model), a CUDA GPU and one process (CUDA graphs
    of the compiled forward and backward; no torchrun)."""
    if cfg.compile_regional and not cfg.compile:
        raise ValueError("compile_regional=True chooses how the model is compiled: it needs compile=True")
    if not cfg.cuda_graphs:
        return
    if cfg.compile_regional:
        raise ValueError("cuda_graphs=True records the whole compiled model as one graph: use it without "
                         "compile_regional")
    if not cfg.compile:
        raise ValueError("config key 'cuda_graphs' needs compile=True: the CUDA graphs are torch.compile's "
                         "(mode 'reduce-overhead')")
    if device.type != "cuda" or world > 1:
        raise ValueError("cuda_graphs=True is a one-GPU experiment: it needs a CUDA GPU and no torchrun")


def apply(model, regional=False, cuda_graphs=False):
    """torch.compile `model` (a GPT) in place (nn.Module.compile), so the state dict keeps its names (no
    _orig_mod.). regional: each transformer block, and the head with its loss, compiled on their own;
    otherwise the whole model is one graph. cuda_graphs: mode="reduce-overhead", Inductor's CUDA graph
    trees: each compiled forward and backward is recorded once and replayed with one launch; the inputs
    are copied into the graph's static buffers at each call. Needs stable_grads(model)."""
    if not regional:
        model.compile(mode="reduce-overhead" if cuda_graphs else None)
        return
    for block in model.transformer.h:
        block.compile()
    model.head = torch.compile(model.head)     # an instance attribute: the state dict is unchanged


def stable_grads(model):
    """Give every parameter a zero .grad allocated outside any CUDA graph, for cuda_graphs=True. A
    replayed backward writes its gradients into the graph's own memory, which the next replay
    overwrites: with gradient accumulation, .grad must be a buffer of its own that each micro-step adds
    into, zeroed in place (optimizer.zero_grad(set_to_none=False)) rather than freed between steps."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
