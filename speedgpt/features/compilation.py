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
compile_persistent_rows=N lets Inductor keep a whole row of up to N values in registers in its row reductions
(persistent reductions), where it does so up to 1,024 (0: its own rule). A LayerNorm 1,280 wide (774M) or 1,600 (1.5B)
is otherwise a looped reduction that reads its float32 input twice, once for the statistics and once to normalize
and cast (the generated kernels, benchmarks/results/roofline_notes.md, "774M's LayerNorm kernels loop over the row");
at 768 (124M) it is one pass already. Off until it measures faster end to end.
"""
import torch


DETAILS = {"compile": ("compile_regional", "compile_tuning", "compile_persistent_rows")}   # nothing without it
PERSISTENT_ROWS_MAX = 16384      # Inductor's own ceiling for a persistent row (1,024 x 16, with its multi-kernel)


def check(cfg, proc):
    """Raise ValueError unless the compile flags can work together: compile_regional and compile_tuning need
    compile, and compile_tuning and compile_persistent_rows a CUDA device (proc.device), both being about the
    Triton kernels Inductor generates there. Returns cfg."""
    device = proc.device
    rows = cfg.compile_persistent_rows
    for flag, what in (("compile_tuning", "tunes"), ("compile_persistent_rows", "lays out")):
        if getattr(cfg, flag) and device is not None and device.type != "cuda":     # first: no value would help
            raise ValueError(f"{flag}={getattr(cfg, flag)} {what} the Triton kernels compiled for a GPU; on "
                             f"{device.type} it would do nothing: leave it out")
    if not 0 <= rows <= PERSISTENT_ROWS_MAX:
        raise ValueError(f"compile_persistent_rows={rows}: the widest row Inductor's reductions keep whole, from 1 to "
                         f"{PERSISTENT_ROWS_MAX:,} values (0: Inductor's own 1,024); try 2048")
    what = {"compile_regional": "chooses how the model is compiled", "compile_tuning": "tunes the compiled kernels",
            "compile_persistent_rows": "lays out the compiled kernels"}
    need = [k for k in what if getattr(cfg, k) and not cfg.compile]
    if need:
        raise ValueError(" and ".join(f"{k}={getattr(cfg, k)} {what[k]}" for k in need)
                         + (": they need" if len(need) > 1 else ": it needs")
                         + f" compile=True: add --compile=True, or leave {' and '.join(need)} out")
    return cfg


def apply(model, cfg, proc):
    """compile=True: torch.compile `model` (a GPT) in place (compile_model). Regional under FSDP, whose hooks then
    stay outside the compiled graphs. Returns None (nothing to print)."""
    if cfg.compile:
        fsdp = proc.world > 1 and cfg.parallelism == "fsdp"
        compile_model(model, regional=cfg.compile_regional or fsdp, tuning=cfg.compile_tuning,
                      persistent_rows=cfg.compile_persistent_rows)


def memory(model, cfg, parts):
    """What compile changes in the memory estimate (speedgpt/memory.py's Parts), whole or regional: the head keeps
    what its compiled graph keeps (parts.head_compiled, as the head's owner counts it: Inductor fuses its
    elementwise passes). The blocks are counted as they are eager."""
    if cfg.compile or cfg.compile_regional:
        parts.head = parts.head_compiled


def compile_model(model, regional=False, tuning=False, persistent_rows=0):
    """torch.compile `model` (a GPT) in place (nn.Module.compile), so the state dict keeps its names (no
    _orig_mod.). regional: each transformer block, and the head with its loss, compiled on their own;
    otherwise the whole model is one graph where gradients are on, and evaluation runs the regional graphs.
    tuning: Inductor's coordinate-descent tuner for this process. persistent_rows: persistent_rows_choices."""
    if tuning:
        import torch._inductor.config as inductor_config
        inductor_config.coordinate_descent_tuning = True
    if persistent_rows:
        use_persistent_rows(persistent_rows)
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


def use_persistent_rows(width):
    """Inductor's heuristics for this process with persistent_rows_choices(width): through its config, which its
    compile cache's key includes (a changed width compiles anew), and for this thread, which already holds the
    heuristics if anything was compiled before."""
    import functools
    import torch._inductor.config as inductor_config
    from torch._inductor.virtualized import V
    inductor_config.inductor_choices_class = functools.partial(persistent_rows_choices, width)
    V.set_choices_handler(persistent_rows_choices(width))


def persistent_rows_choices(width):
    """Inductor's heuristics (its documented extension point, a subclass of InductorChoices), but a row reduction
    (Inductor's INNER hint: each row's values contiguous) of at most `width` values is persistent: the whole row
    in registers, each value read once. Inductor's own rule keeps rows of up to 1,024 so; past it a reduction loops
    over the row, and a LayerNorm reads its input once for the statistics and again to normalize. Other reductions
    are Inductor's. A function, not a class, so that Inductor is imported only when asked for."""
    import torch._inductor.config as inductor_config
    from torch._inductor.choices import InductorChoices
    from torch._inductor.runtime.hints import ReductionHint
    from torch._inductor.virtualized import V

    class PersistentRows(InductorChoices):
        def should_use_persistent_reduction(self, features, cooperative_reduction):
            if (inductor_config.triton.persistent_reductions and not cooperative_reduction
                    and features.get_reduction_hint() == ReductionHint.INNER
                    and V.graph.sizevars.statically_known_leq(features.reduction_numel, width)):
                return True
            return super().should_use_persistent_reduction(features, cooperative_reduction)

        def uuid(self):              # the compile cache's key (torch 2.13 asks for it)
            return f"speedgpt.persistent_rows={width}"
    return PersistentRows()
