"""
torch.compile (compile=True), two ways:
  whole model  the forward, loss included, as one graph (the default on one process); evaluation (no gradients)
               goes through the regional graphs below, which compile in a fraction of the time
  regional     each transformer block on its own, plus the head and loss (GPT.head): the blocks share
               their code, so one block is compiled and its code reused by every other, and the compile
               time does not grow with depth (PyTorch's regional compilation; torchtitan compiles per
               block). compile_regional=True, and always under FSDP, whose hooks then stay outside the
               compiled graphs.
compile_tuning=True turns on Inductor's coordinate-descent tuner: each generated Triton kernel (the fused
elementwise and reduction kernels around the GEMMs) has its block sizes and warps chosen by timing them on
this GPU instead of by heuristics (modded-nanogpt does the same). The first compile takes longer.
"""
import torch


DETAILS = {"compile": ("compile_regional", "compile_tuning")}      # what means nothing without the flag


def check(cfg, proc):
    """Raise ValueError unless the compile flags can work together: compile_regional and compile_tuning need
    compile, and compile_tuning a CUDA device (proc.device), the tuner being Triton's. Returns cfg."""
    device = proc.device
    if cfg.compile_tuning and device is not None and device.type != "cuda":     # first: compile=True would not help
        raise ValueError(f"compile_tuning=True tunes the Triton kernels compiled for a GPU; on {device.type} it "
                         "would do nothing: leave it out")
    what = {"compile_regional": "chooses how the model is compiled", "compile_tuning": "tunes the compiled kernels"}
    need = [k for k in what if getattr(cfg, k) and not cfg.compile]
    if need:
        raise ValueError(" and ".join(f"{k}=True {what[k]}" for k in need) + (": they need" if len(need) > 1 else
                         ": it needs") + f" compile=True: add --compile=True, or leave {' and '.join(need)} out")
    return cfg


def apply(model, cfg, proc):
    """compile=True: torch.compile `model` (a GPT) in place (compile_model). Regional under FSDP, whose hooks then
    stay outside the compiled graphs. Returns None (nothing to print)."""
    if cfg.compile:
        fsdp = proc.world > 1 and cfg.parallelism == "fsdp"
        compile_model(model, regional=cfg.compile_regional or fsdp, tuning=cfg.compile_tuning)


def compile_model(model, regional=False, tuning=False):
    """torch.compile `model` (a GPT) in place (nn.Module.compile), so the state dict keeps its names (no
    _orig_mod.). regional: each transformer block, and the head with its loss, compiled on their own;
    otherwise the whole model is one graph where gradients are on, and evaluation runs the regional graphs.
    tuning: Inductor's coordinate-descent tuner for this process."""
    if tuning:
        import torch._inductor.config as inductor_config
        inductor_config.coordinate_descent_tuning = True
    allow_autograd_functions_in_cache()
    for block in model.transformer.h:
        block.compile()
    model.head = torch.compile(model.head)     # an instance attribute: the state dict is unchanged
    if not regional:
        model.compile()
        whole = model._compiled_call_impl      # what nn.Module.compile() installs for __call__

        def call(*args, **kwargs):
            """With gradients, the whole model's graph (the blocks' and the head's own compilations are inlined
            into it); without (evaluation), the regional graphs: one block's, reused by every block, and the
            head's. Evaluation is another graph either way (no gradients); compiling it whole took a second full
            compile of the model at launch, before the first step, for a few evaluations' worth of speed."""
            return (whole if torch.is_grad_enabled() else model._call_impl)(*args, **kwargs)
        model._compiled_call_impl = call


def allow_autograd_functions_in_cache():
    """Let AOTAutograd's cache keep graphs that hold an autograd.Function (the fused head's, FP8's, FlashAttention-3's
    interface). torch passes such graphs by, out of caution (autograd_cache_allow_custom_autograd_functions), so a
    warm launch, a resume above all, traced and partitioned the whole model's forward and backward again. The
    function's forward and backward are traced into the graph the cache key is computed from: a change to either
    misses the cache (tests/test_first_step.py)."""
    import torch._functorch.config as functorch_config
    if hasattr(functorch_config, "autograd_cache_allow_custom_autograd_functions"):
        functorch_config.autograd_cache_allow_custom_autograd_functions = True
