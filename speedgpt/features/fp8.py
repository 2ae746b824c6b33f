"""
FP8 training, one feature in one module (torchtitan's float8 converter: check, then convert):

  fp8=True       the block Linears at least fp8_min_dim wide become torchao Float8Linear (dynamic scaling,
                 fp8_recipe tensorwise or rowwise), or with fp8_recipe='rowwise_bf16_wgrad' this module's own
                 RowwiseFloat8Linear (per-row scales, its casts fused into the kernels that produce their
                 inputs), or with 'tensorwise_fused' its TensorwiseFloat8Linear (torchao's tensorwise
                 scales in plain ops, below), or with 'tensorwise_delayed' its DelayedFloat8Linear (the same
                 with delayed scales); never the output head. The block Linears are the model's own list,
                 model.GPT.block_linears(), by kind; fp8_layers picks the kinds (qkv, attn_proj, fc, mlp_proj
                 and any a fork declares; default all). Which recipe wins at which width: BENCHMARKS.md, FP8.
  fp8_head=True  the fused head's three matmuls (speedgpt/features/fused_ce.py, so fused_ce=True) run in float8
                 through fp8_mm below: torchao's tensorwise scaling in plain ops (no torchao needed), e4m3
                 for the hidden states and the weight, e5m2 for softmax - one-hot. Evaluation keeps the
                 bf16 head.

check() refuses what cannot work, before any work: a CPU or a GPU below compute capability 8.9, no
torchao for torchao's recipes, shapes torch._scaled_mm cannot take, combinations that would do nothing.
"""
import functools
import importlib.util

import torch

from speedgpt import refuse_unused
from speedgpt.features import cast_kernel, exact_gelus
from speedgpt.memory import cpu_way_out, meta_model

ALL_KINDS = "all"        # fp8_layers' default: every kind of block Linear the model has


def layer_kinds(cfg, kinds):
    """The kinds of block Linear fp8 converts: cfg.fp8_layers, 'all' (every one of `kinds`, those the model has:
    model.GPT.block_linears) or kinds among them, comma-separated. Raises ValueError naming the unknown kinds and
    the known ones, or an empty list."""
    kinds = list(dict.fromkeys(kinds))
    if cfg.fp8_layers.strip() == ALL_KINDS:
        return tuple(kinds)
    picked = [k.strip() for k in cfg.fp8_layers.split(",") if k.strip()]
    unknown = [k for k in picked if k not in kinds]
    if unknown or not picked:
        raise ValueError(f"fp8_layers={cfg.fp8_layers!r}: " + (f"unknown kind {', '.join(unknown)}" if unknown
                         else "no kind") + f"; the kinds are {', '.join(kinds)} (comma-separated; default all)")
    return tuple(picked)


def eligible_linears(model, cfg):
    """[(name, module)] of the block Linears of `model` (a GPT: block_linears) that fp8 converts: of the kinds
    cfg.fp8_layers picks (layer_kinds), both dimensions multiples of 16 (torch._scaled_mm) and the narrower at
    least cfg.fp8_min_dim. Raises layer_kinds' ValueError."""
    linears = model.block_linears()
    kinds = layer_kinds(cfg, [kind for _, kind, _ in linears])
    return [(name, m) for name, kind, m in linears if kind in kinds and m.in_features % 16 == 0
            and m.out_features % 16 == 0 and min(m.in_features, m.out_features) >= cfg.fp8_min_dim]


def block_width_ok(cfg):
    """Whether fp8 would convert any block Linear of a model of cfg's shape (eligible_linears of one on the meta
    device, before any is built)."""
    return bool(eligible_linears(meta_model(cfg), cfg))


def none_eligible(cfg):
    return (f"fp8=True but no Linear layer is eligible: every one of fp8_layers={cfg.fp8_layers!r} is narrower "
            f"than fp8_min_dim={cfg.fp8_min_dim} (FP8 loses to bf16 on narrow layers) or not a multiple of 16 wide; "
            "lower fp8_min_dim to convert them anyway, or add --fp8=False")


# the keys that mean nothing without the flag
DETAILS = {"fp8": ("fp8_recipe", "fp8_layers", "fp8_min_dim", "fp8_precast", *cast_kernel.FLAGS),
           "activation=gelu": ("fp8_gelu_cast", "gelu_erf"), "norm=layernorm": ("fp8_norm_cast",)}
# gelu_erf is not fp8_gelu_cast's detail: without it the bf16 MLPs' GELU passes take it (speedgpt/features/gelu_pass.py)


def check(cfg, proc):
    """Raise ValueError naming the flags and the way out unless the run's FP8 settings can work on
    proc.device: fp8_head needs fused_ce; fp8_recipe='rowwise' needs fp8 (the head is
    tensorwise only); the head's matmul shapes (n_embd, batch_size * block_size, fused_ce_chunk) must be
    multiples of 16; FP8 needs a GPU of compute capability 8.9+ (Ada, Hopper), and torchao for its recipes
    (tensorwise, rowwise). Called again on resume, where the shape may come from the checkpoint.
    Returns cfg."""
    device = proc.device
    if cfg.fp8_min_dim < 0:
        raise ValueError(f"config key 'fp8_min_dim' must be >= 0, got {cfg.fp8_min_dim}")
    cc = capability(device)
    capable = cc is not None and cc >= (8, 9)     # else no FP8 here: a refusal never says "add --fp8=True"

    def where():
        return f"{torch.cuda.get_device_name(device)} (sm_{cc[0]}{cc[1]})" if cc else \
            {"cpu": "the CPU", "mps": "Apple's GPU (MPS)"}.get(device.type, device.type)
    if cfg.fp8_layers != ALL_KINDS:
        layer_kinds(cfg, [kind for _, kind, _ in meta_model(cfg).block_linears()])
        if not cfg.fp8:
            raise ValueError(f"fp8_layers={cfg.fp8_layers!r} would do nothing: it picks the block Linears fp8=True "
                             "converts. " + ("Add --fp8=True, or leave fp8_layers out" if capable else
                                             f"FP8 needs a GPU of compute capability 8.9 or newer (this run is on "
                                             f"{where()}): leave fp8_layers out"))
    # fp8_recipe with fp8_head alone: refused below, worded for the head; and where the head cannot run either, the
    # device's refusal below names the head and these details at once (not one per try)
    if not cfg.fp8 and not (cfg.fp8_head and not capable):
        blocks_only = (() if cfg.fp8_head else ("fp8_recipe",)) + ("fp8_min_dim", "fp8_precast",
                                                                   *cast_kernel.FLAGS)
        refuse_unused(cfg, blocks_only, "a setting of the block Linears' FP8" + ("" if capable else
                      f", which needs a GPU of compute capability 8.9 or newer (this run is on {where()})"),
                      "--fp8=True" if capable else None)
    if not (cfg.fp8 or cfg.fp8_head):
        return cfg
    if not capable:               # first: on this device the settings below would not help (no loop of refusals)
        keys = [k for k in ("fp8", "fp8_head") if getattr(cfg, k)]
        presets = " and ".join(f"{k}=True" for k in keys)
        defaults = type(cfg).__dataclass_fields__
        extras = [k for k in DETAILS["fp8"] if getattr(cfg, k) != defaults[k].default]
        off = " ".join(f"--{k}=False" for k in keys) + \
            (f" and leave out {', '.join(extras)} where the command line gives them" if extras else "") + \
            (f" (config/fast.py and config/gpt2-*.py set {presets}; --fp8=False drops their other FP8 settings)"
             if cfg.fp8_head else "")
        cpu = cpu_way_out(cfg, device)
        raise ValueError(f"{presets} {'needs' if len(keys) == 1 else 'need'} a GPU of compute capability 8.9 or "
                         f"newer (Ada, Hopper); this run is on {where()}: add {off}" + (f"; or, {cpu}" if cpu else ""))
    if cfg.fp8_precast and cfg.fp8_recipe != "tensorwise_delayed":
        raise ValueError(f"fp8_precast=True would do nothing with fp8_recipe={cfg.fp8_recipe!r}: it makes the delayed "
                         "recipe's scales and float8 weights once per step. Add --fp8_recipe=tensorwise_delayed, or "
                         "leave fp8_precast out")
    for flag in cast_kernel.FLAGS:
        if getattr(cfg, flag) and cfg.fp8_recipe != "tensorwise_delayed":
            raise ValueError(f"{flag}=True would do nothing with fp8_recipe={cfg.fp8_recipe!r}: only delayed "
                             f"scales are known before the cast. Add --fp8_recipe=tensorwise_delayed, or "
                             f"{cast_kernel.way_off(cfg, [flag])}")
    if cfg.fp8_gelu_cast and cfg.fp8 and cfg.fp8_recipe == "tensorwise_delayed" and block_width_ok(cfg):
        refuse_unfed_gelu(meta_model(cfg), cfg)         # none eligible at all: fp8's own refusal below says so
    if cfg.fp8_norm_cast and cfg.fp8 and cfg.fp8_recipe == "tensorwise_delayed" and block_width_ok(cfg) and \
            not norm_fed(meta_model(cfg), cfg):
        why = (f"norm={cfg.norm!r} is not LayerNorm: use --norm=layernorm" if cfg.norm != "layernorm" else
               f"n_embd={cfg.n_embd} is wider than the kernel's whole row ({cast_kernel.NORM_WIDTH})"
               if cfg.n_embd > cast_kernel.NORM_WIDTH else
               f"neither the qkv nor the fc Linear ({cfg.n_embd} wide in) is converted with fp8_layers="
               f"{cfg.fp8_layers!r} and fp8_min_dim={cfg.fp8_min_dim}: convert them (qkv or fc in fp8_layers, "
               f"fp8_min_dim at most {cfg.n_embd})")
        raise ValueError(f"fp8_norm_cast=True folds the LayerNorm into the cast of the FP8 Linear it feeds, and {why}, "
                         "or add --fp8_norm_cast=False")
    if cfg.fp8_precast and proc.world > 1 and cfg.parallelism == "fsdp":
        raise ValueError("fp8_precast=True casts each whole weight after the optimizer step, where FSDP holds only "
                         "a shard of it: use --parallelism=ddp, or leave fp8_precast out")
    if cfg.fp8 and cfg.fp8_recipe == "tensorwise_delayed" and cfg.dtype == "float16":
        delayed_only = [k for k in ("fp8_precast", *cast_kernel.FLAGS) if getattr(cfg, k)]   # refused with fused
        raise ValueError("fp8_recipe='tensorwise_delayed' with dtype=float16: the loss scale moves the gradients' "
                         "amax from step to step, which scales from earlier steps cannot follow; use --dtype=bfloat16"
                         ", or --fp8_recipe=tensorwise_fused" + (f" {cast_kernel.way_off(cfg, delayed_only)}"
                                                                 if delayed_only else ""))
    if cfg.fp8_head and not cfg.fp8 and cfg.fp8_recipe != "tensorwise":
        raise ValueError(f"fp8_recipe={cfg.fp8_recipe!r} would do nothing: the FP8 head is tensorwise only, and "
                         f"fp8=False converts no block. Add --fp8=True for {cfg.fp8_recipe} blocks, "
                         "or leave fp8_recipe out")
    if cfg.fp8_head and (cfg.n_embd % 16 or cfg.batch_size * cfg.block_size % 16 or cfg.fused_ce_chunk % 16):
        raise ValueError(f"fp8_head=True needs n_embd ({cfg.n_embd}), batch_size * block_size "
                         f"({cfg.batch_size * cfg.block_size}) and fused_ce_chunk ({cfg.fused_ce_chunk}) "
                         "to be multiples of 16 (float8 matmul shapes), or add --fp8_head=False")
    if cfg.fp8_head and not cfg.fused_ce:          # after the device: off a GPU, fused_ce=True would not help
        raise ValueError("fp8_head=True runs the fused head's matmuls in float8: it needs fused_ce=True "
                         "(config/fast.py sets both), or add --fp8_head=False")
    if cfg.fp8 and cfg.fp8_recipe not in OWN_RECIPES and importlib.util.find_spec("torchao") is None:
        raise ValueError(f"fp8_recipe={cfg.fp8_recipe!r} is torchao's: pip install torchao, or use one of this "
                         f"project's recipes ({', '.join(OWN_RECIPES)}: --fp8_recipe=tensorwise_delayed)")
    if cfg.fp8 and not block_width_ok(cfg):
        raise ValueError(none_eligible(cfg))
    cast_kernel.check(cfg, device)
    return cfg


def apply(model, cfg, proc):
    """fp8=True: convert `model`'s eligible block Linears in place (convert). Returns the line to print, or None."""
    if not cfg.fp8:
        return None
    return f"fp8: {len(convert(model, cfg))} Linear layers converted ({cfg.fp8_recipe}); the rest stay {cfg.dtype}"


def prepare(model, batch, cfg):
    """Before the first step, once the checkpoint's state is loaded: the first amax history of the delayed
    layers that have none (calibrate), eagerly even where the model is already compiled, under cfg.dtype's
    autocast; then, with fp8_precast, their first float8 weights and scales (precast, compiled here where the model
    is, so that no step waits for it). Returns the line to print, or None."""
    from contextlib import nullcontext
    ctx = nullcontext() if cfg.dtype == "float32" else torch.autocast(batch.x.device.type, getattr(torch, cfg.dtype))
    with torch.compiler.set_stance("force_eager"):
        said = calibrate(model, batch, ctx)
    mods = [m for _, m in delayed_linears(model) if m.fp8_precast is not None]
    if mods:
        precast(mods, precaster(cfg.compile))
    return said


def convert(model, cfg):
    """Swap the block Linears of `model` (a GPT) that fp8 converts (eligible_linears: the kinds cfg.fp8_layers
    picks, both dimensions divisible by 16 and at least cfg.fp8_min_dim wide) for torchao Float8Linear
    (cfg.fp8_recipe) or this module's own (OWN_RECIPES: rowwise_bf16_wgrad, tensorwise_fused, tensorwise_delayed);
    never the output head (the fused head has its own float8 matmuls). Returns the converted names. Raises
    ValueError without torchao or when no layer is eligible. No device check: check() does that (tests
    convert on the CPU)."""
    chosen = {name: m for name, m in eligible_linears(model, cfg) if type(m) is torch.nn.Linear}   # not twice
    if not chosen:
        raise ValueError(none_eligible(cfg))
    if cfg.fp8_recipe in OWN_RECIPES:                   # ours (below): no torchao
        for module in chosen.values():
            module.__class__ = OWN_RECIPES[cfg.fp8_recipe]
            if module.__class__ is DelayedFloat8Linear:
                device = module.weight.device
                module.fp8_amax = torch.zeros(2, 1 + AMAX_HISTORY, device=device)
                module.fp8_scaled = module.fp8_bad_history = False
                module.fp8_cast_kernel = cfg.fp8_cast_kernel
                module.fp8_gelu = module.fp8_gelu_out = False
                if cfg.fp8_precast:
                    n, k = module.weight.shape
                    module.fp8_precast = (torch.ones(3, device=device),
                                          torch.zeros(n, k, dtype=torch.float8_e4m3fn, device=device),
                                          torch.zeros(k, n, dtype=torch.float8_e4m3fn, device=device))
    else:
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError as e:
            raise ValueError("fp8=True needs torchao: pip install torchao") from e
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(cfg.fp8_recipe),
                                   module_filter_fn=lambda module, fqn: fqn in chosen)
    if cfg.fp8_gelu_cast:                   # after the swap: gelu_fed asks for the delayed layers
        fed = gelu_fed(model, cfg)
        if not fed:
            raise ValueError("fp8_gelu_cast=True: no MLP's exact GELU lies between two FP8 Linears of this model "
                             "(the first without bias)")
        for owner, act_name, producer, consumer in fed:
            setattr(owner, act_name, torch.nn.Identity())
            producer.fp8_gelu_out, consumer.fp8_gelu = True, True
            producer.fp8_fast_erf = consumer.fp8_fast_erf = cfg.gelu_erf == "fast"
    if cfg.fp8_norm_cast:
        fed = norm_fed(model, cfg)
        if not fed:
            raise ValueError("fp8_norm_cast=True: no LayerNorm of this model feeds an FP8 Linear alone")
        for norm, linear in fed:
            norm.__class__ = FoldedLayerNorm
            linear.fp8_norm = (norm,)           # a tuple: not a submodule of the Linear (its keys stay the norm's)
    return list(chosen)


def capability(device):
    """(major, minor): the compute capability of a CUDA device, else None (no float8 matmuls there)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def refuse_unfed_gelu(meta, cfg):
    """Raise ValueError with the way out where fp8_gelu_cast would find no GELU between two delayed FP8 Linears in
    `meta`, a model of cfg's shape (gelu_fed): another activation, a Linear not converted, or c_fc's bias."""
    if gelu_fed(meta, cfg):
        return
    mlp, ids = next(m for m in meta.modules() if hasattr(m, "ACT_BETWEEN")), \
        {id(m) for _, m in eligible_linears(meta, cfg)}
    missing = [name for name in next(iter(mlp.ACT_BETWEEN.values())) if id(getattr(mlp, name)) not in ids]
    said = " and ".join(f"{n} ({getattr(mlp, n).in_features} -> {getattr(mlp, n).out_features})" for n in missing)
    why = (f"activation={cfg.activation!r} is not the exact GELU: use --activation=gelu"
           if cfg.activation != "gelu" else
           f"the MLP's {said} {'is' if len(missing) == 1 else 'are'} not converted with fp8_layers="
           f"{cfg.fp8_layers!r} and fp8_min_dim={cfg.fp8_min_dim}: convert {'it' if len(missing) == 1 else 'them'} "
           f"({' and '.join(mlp.LINEARS[n] for n in missing)} in fp8_layers, fp8_min_dim at most {cfg.n_embd})"
           if missing else "bias=True puts c_fc's bias between its matmul and GELU: use --bias=False")
    raise ValueError(f"fp8_gelu_cast=True folds the MLP's GELU into the casts of the FP8 Linears around it, and "
                     f"{why}, or add {cast_kernel.way_off(cfg, ['fp8_gelu_cast'])}")


class FoldedLayerNorm(torch.nn.LayerNorm):
    """fp8_norm_cast: a LayerNorm whose work the FP8 Linear it feeds does (convert swaps the class, so its weight,
    bias and state-dict keys stay): it hands on its input as it is."""

    def forward(self, x):
        return x


def norm_fed(model, cfg):
    """[(norm, linear)]: each LayerNorm that a module's NORM_FEEDS ({its norm: the path of the one Linear that takes
    its output}, model.py's Block: ln_1 -> attn.c_attn, ln_2 -> mlp.c_fc) names, feeding a Linear that is (or, before
    convert swaps it, would be) a delayed FP8 layer, at most cast_kernel.NORM_WIDTH wide: fp8_norm_cast's pairs."""
    if cfg.fp8_recipe != "tensorwise_delayed":
        return []
    eligible = {id(m) for _, m in eligible_linears(model, cfg)}
    out = []
    for owner in model.modules():
        for norm_name, path in getattr(owner, "NORM_FEEDS", {}).items():
            norm, linear = getattr(owner, norm_name), owner.get_submodule(path)
            if type(norm) is torch.nn.LayerNorm and norm.normalized_shape == (linear.in_features,) and \
                    linear.in_features <= cast_kernel.NORM_WIDTH and \
                    (isinstance(linear, DelayedFloat8Linear) or id(linear) in eligible):
                out.append((norm, linear))
    return out


def gelu_fed(model, cfg):
    """[(owner, act name, producer, consumer)]: each module whose ACT_BETWEEN ({its activation: (the Linear that
    feeds it, the Linear it feeds)}, model.py's MLP: {"act": ("c_fc", "c_proj")}) names an exact GELU between two
    Linears that are (or, before convert swaps them, would be) delayed FP8 layers, the producer without bias (it
    would sit between the matmul and GELU): fp8_gelu_cast's triples. On a meta model before convert, the eligible
    Linears stand for the swapped ones."""
    if cfg.fp8_recipe != "tensorwise_delayed":
        return []
    eligible = {id(m) for _, m in eligible_linears(model, cfg)}
    delayed = lambda m: isinstance(m, DelayedFloat8Linear) or id(m) in eligible
    return [(owner, act_name, producer, consumer) for owner, act_name, producer, consumer in exact_gelus(model)
            if delayed(producer) and delayed(consumer) and producer.bias is None]


def tensor_scale(t, dtype=torch.float8_e4m3fn):
    """torchao's tensorwise scale of t (float8_utils.tensor_to_scale): scale_for its amax."""
    return scale_for(t.abs().amax(), dtype)


def scale_for(amax, dtype=torch.float8_e4m3fn):
    """torchao's tensorwise scale for `amax` (a 0-dim tensor): fp8_max / amax, the amax clamped to 1e-12 and the
    division in float64, returned as a 0-dim float32 tensor."""
    return (torch.finfo(dtype).max / amax.double().clamp(min=1e-12)).float()


def saturate(t, scale, dtype=torch.float8_e4m3fn):
    """t * scale cast to `dtype` with saturation (torchao's to_fp8_saturated): values past the range become its max."""
    fmax = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype)


def cast_rhs(b):
    """b (k, n) cast once for use as fp8_mm's right operand: (b8, b_scale), b8 column-major e4m3 with the
    tensorwise scale fp8_max / amax (tensor_scale). The fused head casts its weight so once per micro-batch, in
    both layouts, instead of once per chunk and matmul."""
    scale = tensor_scale(b)
    return saturate(b, scale).t().contiguous().t(), scale


E5M2_MAX = 57344.0       # torch.finfo(torch.float8_e5m2).max


def fp8_mm(a, b, out_dtype, fast_accum=False, a_amax=None):
    """a (m, k) @ b (k, n) in float8 with torchao's tensorwise dynamic scaling, the recipe of its Float8Linear, in
    plain PyTorch ops: each operand scaled by fp8_max / amax (tensor_scale) and cast with saturation; e4m3 for
    operands without a known bound (activations, weights), e5m2 for a gradient (a_amax given: |a| <= a_amax, so no
    amax pass over it). b may also be cast_rhs(b), already cast, and a (a8, a_scale): a8 row-major float8 with
    a ~= a8 / a_scale (softmax_pass.py's gradient). The product runs in torch._scaled_mm with the inverse scales,
    as torchao's addmm_float8_unwrapped calls it; _scaled_mm wants `a` row-major and `b` column-major, and both are
    laid out so here. fast_accum: Hopper's fast FP8 accumulation (torchao uses it for the forward GEMM only).
    Returns (m, n) in out_dtype (bfloat16 or float32). Needs a GPU of compute capability 8.9+ or a CPU build of
    torch with float8 _scaled_mm; raises what torch._scaled_mm raises otherwise (k and n must be multiples of 16
    on the GPU). tests/test_fp8.py checks it against torchao's Float8Linear bit for bit."""
    b8, b_scale = b if isinstance(b, tuple) else cast_rhs(b)                                   # column-major
    if isinstance(a, tuple):
        a8, a_scale = a
    else:
        if a_amax is None:
            a_dtype, a_scale = torch.float8_e4m3fn, tensor_scale(a)
        else:
            a_dtype = torch.float8_e5m2
            a_scale = torch.full((), torch.finfo(a_dtype).max / a_amax, dtype=torch.float32, device=a.device)
        a8 = saturate(a, a_scale, a_dtype).contiguous()                                      # row-major
    return torch._scaled_mm(a8, b8, scale_a=a_scale.reciprocal(), scale_b=b_scale.reciprocal(), out_dtype=out_dtype,
                            use_fast_accum=fast_accum)


# -----------------------------------------------------------------------------
# fp8_recipe='rowwise_bf16_wgrad': this project's own FP8 Linear, in plain PyTorch ops for torch.compile
#
# torchao's Float8Linear casts each operand in passes of its own (an amax reduction over the whole tensor,
# then the cast), and the weight gradient needs float8 copies of the input and the output gradient
# transposed (torch._scaled_mm takes only K-major operands). Here every activation is scaled per row (per
# token): the row's amax is a reduction over the row the producing kernel already walks (LayerNorm, GELU,
# LayerNorm's backward), so torch.compile fuses amax and cast into it and no pass of its own is made. The
# forward and the input-gradient GEMMs run in float8 (e4m3, rowwise scales); the weight gradient, whose K is
# the token count, stays a bf16 GEMM, so nothing is transposed (torchao's recipe 'rowwise_with_gw_hp' makes
# the same choice).

FP8_MAX = 448.0          # torch.finfo(torch.float8_e4m3fn).max


def rowwise_cast(t):
    """t (M, K) -> (t8 (M, K) float8_e4m3fn, scale (M, 1) float32) with t ~= t8 * scale: each row divided by
    its largest magnitude / 448 (rows of zeros get scale 1/448 * 1e-12, exact zeros). Saturating cast."""
    amax = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    t8 = (t.float() * (FP8_MAX / amax)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return t8, amax / FP8_MAX


def scaled_mm(a8, a_scale, b8, b_scale, out_dtype, fast_accum=True):
    """(a8 * a_scale) @ (b8 * b_scale) in out_dtype: a8 (M, K) row-major with a_scale (M, 1), b8 (K, N)
    column-major with b_scale (1, N), float32 scales (or both 0-dim: tensorwise). On a GPU torch._scaled_mm,
    by default with Hopper's fast accumulation: its rowwise kernel (CUTLASS's) is much slower without it, as
    torchao notes in addmm_float8_unwrapped, and the tensorwise cuBLAS kernel at unit scales with the scales
    applied to its output measured slower still (BENCHMARKS.md, FP8). On the CPU the same product in float32,
    for the tests (torch's CPU float8 matmul takes no rowwise scales)."""
    if a8.device.type != "cuda":
        return ((a8.float() * a_scale) @ (b8.float() * b_scale)).to(out_dtype)
    return torch._scaled_mm(a8, b8, scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype, use_fast_accum=fast_accum)


class _RowwiseLinear(torch.autograd.Function):
    """y = x @ w.T with the forward and the input gradient in float8 (rowwise scales), the weight gradient in
    x's dtype. x (M, K) and w (N, K) in bf16 (or fp16); K and N multiples of 16 on the GPU."""

    @staticmethod
    def forward(ctx, x, w):
        x8, xs = rowwise_cast(x)
        w8, ws = rowwise_cast(w)                                          # per output channel
        ctx.save_for_backward(x, w)
        return scaled_mm(x8, xs, w8.t(), ws.t(), x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy8, dys = rowwise_cast(dy)
        wt8, wts = rowwise_cast(w.t().contiguous())                       # (K, N): per input channel
        return scaled_mm(dy8, dys, wt8.t(), wts.t(), dy.dtype), dy.t() @ x


# -----------------------------------------------------------------------------
# fp8_recipe='tensorwise_fused': torchao's tensorwise recipe (one scale per tensor, fp8_max / amax; e4m3 for
# the input and the weight, e5m2 for the output gradient; all three GEMMs in float8, fast accumulation in the
# forward only) in plain PyTorch ops, compiled with the block's own kernels. The amax is taken per row and
# then over the rows (max is exact in any order, so the scales are torchao's), written so that the per-row
# part can join the kernel that makes the tensor (LayerNorm, GELU); Inductor still gives most amaxes a pass
# of their own (benchmarks/results/profiles_h200.md): delayed scales would free the cast from waiting on it.
# The backward keeps the float8 input and transposes the float8 copies the weight gradient needs. It measured
# faster than torchao's Float8Linear at 1280 and 1600 wide, slower than the rowwise recipe at 1024
# (BENCHMARKS.md, FP8).


def tensorwise_cast(t, dtype=torch.float8_e4m3fn, amax=None):
    """t (M, K) -> (t8 (M, K) in dtype, inv_scale 0-dim float32) with t ~= t8 * inv_scale: torchao's
    tensorwise scale (fp8_max / amax, the amax clamped to 1e-12, computed in float64), saturating cast.
    amax: the amax to scale by (a 0-dim tensor: tensorwise_delayed's, from earlier steps), else t's own."""
    scale = scale_for(t.abs().amax(dim=-1).amax() if amax is None else amax, dtype)
    return saturate(t, scale, dtype), scale.reciprocal()


class _TensorwiseLinear(torch.autograd.Function):
    """y = x @ w.T with all three GEMMs in float8, tensorwise scales. x (M, K) and w (N, K) in bf16 (or fp16);
    M, K and N multiples of 16 on the GPU."""

    @staticmethod
    def forward(ctx, x, w):
        x8, xs = tensorwise_cast(x)
        w8, ws = tensorwise_cast(w)
        ctx.save_for_backward(x8, xs, w8, ws)
        return scaled_mm(x8, xs, w8.t(), ws, x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x8, xs, w8, ws = ctx.saved_tensors
        dy8, dys = tensorwise_cast(dy, torch.float8_e5m2)
        return tensorwise_grads(dy8, dys, x8, xs, w8, ws, dy.dtype)


def tensorwise_grads(dy8, dys, x8, xs, w8, ws, dtype, w8_col=None, dy8_t=None, x8_col=None):
    """(dx, dw) of y = x @ w.T from the float8 operands and their inverse scales, both GEMMs in float8 without
    fast accumulation (torchao's choice for the gradients): dx = dy @ w, dw = dy.T @ x. The copies the GEMMs want
    made here unless given: w8_col w8 laid out column-major (fp8_precast's copy), dy8_t dy8 transposed (N, M)
    row-major and x8_col x8 column-major (fp8_cast_kernel makes both in its cast; x8 may then be None)."""
    w8_col = w8.t().contiguous().t() if w8_col is None else w8_col
    dy8_t = dy8.t().contiguous() if dy8_t is None else dy8_t
    x8_col = x8.t().contiguous().t() if x8_col is None else x8_col
    dx = scaled_mm(dy8, dys, w8_col, ws, dtype, fast_accum=False)
    dw = scaled_mm(dy8_t, dys, x8_col, xs, dtype, fast_accum=False)
    return dx, dw


class RowwiseFloat8Linear(torch.nn.Linear):
    """nn.Linear whose matmul is _RowwiseLinear in the autocast dtype (bf16 without autocast); convert()
    swaps a Linear's class to it, so its parameters and state-dict keys stay those of the Linear."""
    matmul = _RowwiseLinear
    fp8_norm = None              # fp8_norm_cast (the delayed layer): (the LayerNorm it folds,); x is its input

    def forward(self, x):
        dt = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else torch.bfloat16
        with torch.autocast(x.device.type, enabled=False):
            x2 = x.reshape(-1, x.size(-1))
            y = self.mm(x2 if self.fp8_norm else x2.to(dt), self.weight.to(dt))      # the norm reads it as it is
            y = y.view(*x.shape[:-1], -1)
            return y if self.bias is None else y + self.bias.to(dt)

    def mm(self, x, w):
        return self.matmul.apply(x, w)


class TensorwiseFloat8Linear(RowwiseFloat8Linear):
    """The same swap, with _TensorwiseLinear (fp8_recipe='tensorwise_fused')."""
    matmul = _TensorwiseLinear


# -----------------------------------------------------------------------------
# fp8_recipe='tensorwise_delayed': tensorwise_fused with delayed scales (Transformer Engine's default recipe):
# the input's and the output gradient's scales come from the largest amax of the last AMAX_HISTORY optimizer
# steps, so a cast no longer waits for its own tensor's amax and can join the kernel that makes the tensor; this
# step's amax is still taken (as a running max over the step's micro-batches) and shifted into the history after
# the step (end_step), all-reduced (max) over the ranks so every rank scales alike at any world size. Values past
# the scale's range saturate. The weight keeps its dynamic scale (a small tensor).
# A long run must survive a bad step, so, as Transformer Engine does, a step whose amax is not finite or is zero
# never enters the history: the layer keeps its last good scales, and a skipped step (a non-finite loss or
# gradient) only resets the running max. Before the first step there is no history: calibrate() fills its first
# entry from one micro-batch run eagerly with dynamic scales, so every compiled step scales the same way (one
# compilation, no recompile when the history appears). The history is each layer's own state (its state dict's
# _extra_state, which DDP does not broadcast), so a checkpoint carries it and a resume is exact.
# config/fast.py (with fp8_min_dim=768), gpt2-medium.py, gpt2-large.py and gpt2-xl.py use it: faster, and its loss
# within bf16's seed spread (BENCHMARKS.md, FP8).

AMAX_HISTORY = 16        # optimizer steps of amax kept: a spike raises the scale's amax for this many steps


class _DelayedLinear(torch.autograd.Function):
    """_TensorwiseLinear with delayed scales. amax (2, 1 + AMAX_HISTORY) float32, rows x and dy: column 0 this
    step's running max, the rest the history, newest first. scaled=False (calibrate() only): dynamic scales;
    track=False (evaluation): nothing recorded. kernel (fp8_cast_kernel): each tracked cast and its amax in one
    Triton pass (delayed_cast). fp8_gelu_cast pairs two layers around the MLP's exact GELU. gelu (c_proj): x is the
    pre-activation h and the layer multiplies GELU(h): in training its cast runs GELU in the same Triton pass;
    calibrating or evaluating, GELU runs first, as the MLP ran it; its backward returns the gradient of GELU's
    output, leaving GELU's derivative to the layer that made h. gelu_out (c_fc, without bias): the layer's output
    is h, and the gradient it receives is GELU's output's: its backward multiplies it by GELU'(h) (h saved: the
    output itself), in training inside its gradient's cast. norm_eps (fp8_norm_cast; else None): x is the residual
    stream and the layer multiplies LayerNorm(x) (weight norm_w, bias norm_b: the norm's own parameters); in
    training the norm runs in its cast's Triton pass (cast_kernel.norm_cast_amax), otherwise first, as aten's
    LayerNorm; the backward runs aten's LayerNorm backward from the row statistics and returns the gradients of x
    and of the norm's parameters. With fp8_precast, scales, w8 and w8_t are precast()'s, made once per optimizer
    step: scales (3,) float32, the scales of x, dy and the weight; w8 (N, K) the weight in e4m3 and w8_t (K, N) its
    transposed copy (the input gradient's operand); without it (None) the scales and the weight's cast are made
    here, in every micro-batch's graph. The inverse scales torch._scaled_mm takes are computed here either way: a
    view into `scales` (an offset into another tensor) is refused by cuBLAS (NOT_SUPPORTED) and by Inductor's
    lowering of _scaled_mm, which on the GPU want each scale a tensor of its own."""

    @staticmethod
    def forward(ctx, x, w, amax, scaled, track, kernel, gelu, gelu_out, fast_erf, norm_eps, norm_w, norm_b, scales, w8,
                w8_t):
        fused = track and scaled            # the scales known before the cast: GELU or the norm can join it
        r = stats = None
        if norm_eps is not None:
            r = x
            if not fused:
                x, *stats = torch.ops.aten.native_layer_norm(r, [r.size(-1)], norm_w, norm_b, norm_eps)
                x = x.to(w.dtype)                 # as the Linear took LayerNorm's output
        if gelu and not fused:
            x = torch.nn.functional.gelu(x)
        if scales is None:
            scale = scale_for(amax[0, 1:].amax() if scaled else x.abs().amax(dim=-1).amax())
            w8, ws = tensorwise_cast(w)
        else:
            scale, ws = scales[0], scales[2].reciprocal()
        if r is not None and fused:
            x8, x8_t, *stats = cast_kernel.norm_cast_amax(r, norm_w, norm_b, norm_eps, scale, amax, 0)
        else:
            x8, x8_t = delayed_cast(x, scale, amax, 0, track, kernel, gelu=gelu and fused, fast_erf=fast_erf)
        xs = scale.reciprocal()
        y = scaled_mm(x8, xs, w8.t(), ws, w.dtype)
        ctx.save_for_backward(x8 if x8_t is None else x8_t, xs, w8 if scales is None else w8_t, ws, scales,
                              y if gelu_out else None, r, norm_w, norm_b, *(stats or (None, None)))
        ctx.amax, ctx.scaled, ctx.track, ctx.kernel, ctx.x_transposed = amax, scaled, track, kernel, x8_t is not None
        ctx.fast_erf = fast_erf
        return y

    @staticmethod
    def backward(ctx, dy):
        x8, xs, w8, ws, scales, h, r, norm_w, norm_b, mean, rstd = ctx.saved_tensors
        amax, e5m2, fused = ctx.amax, torch.float8_e5m2, ctx.track and ctx.scaled
        if h is not None and not fused:                             # d GELU(h) / dh, as autograd takes it
            dy, h = torch.ops.aten.gelu_backward(dy, h), None
        if scales is None:
            scale = scale_for(amax[1, 1:].amax() if ctx.scaled else dy.abs().amax(dim=-1).amax(), e5m2)
        else:
            scale = scales[1]
        (dy8, dy8_t), dys = delayed_cast(dy, scale, amax, 1, ctx.track, ctx.kernel, e5m2, gelu_input=h,
                                         fast_erf=ctx.fast_erf), \
            scale.reciprocal()
        w8_col = None if scales is None else w8.t()                 # w8_t (K, N) seen as (N, K) column-major
        x8, x8_col = (None, x8.t()) if ctx.x_transposed else (x8, None)        # x8_t (K, M) seen column-major
        dx, dw = tensorwise_grads(dy8, dys, x8, xs, w8, ws, dy.dtype, w8_col, dy8_t, x8_col)
        dnw = dnb = None
        if r is not None:                                           # LayerNorm's backward, as autograd runs it
            dx, dnw, dnb = torch.ops.aten.native_layer_norm_backward(
                dx.to(r.dtype), r, [r.size(-1)], mean, rstd, norm_w, norm_b,
                [True, norm_w is not None, norm_b is not None])
        return dx, dw, *[None] * 8, dnw, dnb, None, None, None


def delayed_cast(t, scale, amax, row, track, kernel, dtype=torch.float8_e4m3fn, gelu=False, gelu_input=None,
                 fast_erf=False):
    """(t8, t8_t): t (M, K) cast to dtype at `scale` (a 0-dim float32 tensor), saturating; with track, t's amax
    folded into amax[row, 0] (the step's running max) too. kernel (fp8_cast_kernel): both in one pass,
    cast_kernel.cast_amax (one Triton kernel on the GPU), which writes t8_t (K, M), the transposed copy the weight
    gradient takes, in the same pass; otherwise t8_t is None (tensorwise_grads transposes), and Inductor compiles
    the cast and a reduction for the amax. fp8_gelu_cast (with track): gelu, t is GELU's input; gelu_input h, t is
    the gradient of GELU(h): cast_amax casts GELU(t), or t * GELU'(h), computed in the same pass, kernel or not;
    fast_erf (gelu_erf='fast'): with the kernel's cheaper erf."""
    if track and (kernel or gelu or gelu_input is not None):
        return cast_kernel.cast_amax(t, scale, amax, row, dtype == torch.float8_e5m2, gelu, gelu_input, fast_erf)
    t8 = saturate(t, scale, dtype)        # cast first: with the amax folded in before it, Inductor's partition
    if track:                             # kept t itself for the backward too (test_fp8.py, the saved tensors)
        amax[row, 0] = torch.maximum(amax[row, 0], t.abs().amax(dim=-1).amax().float())
    return t8, None


class DelayedFloat8Linear(RowwiseFloat8Linear):
    """The same swap, with _DelayedLinear (fp8_recipe='tensorwise_delayed'). convert() gives it fp8_amax (a plain
    tensor attribute, not a buffer: DDP would broadcast rank 0's running max over the others'; it travels in the
    state dict as the layer's extra state) and fp8_scaled (whether the history holds a good step: False only until
    calibrate() or a checkpoint's history sets it, before the model is compiled). With fp8_precast it also has
    fp8_precast, (scales, w8, w8_t) as _DelayedLinear takes them, which precast() fills in place (the compiled
    graph reads these very tensors) after each optimizer step; until the history holds a good step they are not
    used. Without it, fp8_precast is None."""
    matmul = _DelayedLinear
    fp8_precast = None
    fp8_cast_kernel = False
    fp8_gelu = False             # fp8_gelu_cast, c_proj: x is GELU's input (convert made the MLP's act an identity)
    fp8_gelu_out = False         # fp8_gelu_cast, c_fc: the output is GELU's input (its derivative in the backward)
    fp8_fast_erf = False         # gelu_erf='fast': those passes' erf by the kernel's cheaper formula

    def mm(self, x, w):
        cast = self.fp8_precast if self.fp8_precast is not None and self.fp8_scaled else (None, None, None)
        norm = (self.fp8_norm[0].eps, self.fp8_norm[0].weight, self.fp8_norm[0].bias) if self.fp8_norm else \
            (None, None, None)
        return self.matmul.apply(x, w, self.fp8_amax, self.fp8_scaled, self.training and torch.is_grad_enabled(),
                                 self.fp8_cast_kernel, self.fp8_gelu, self.fp8_gelu_out, self.fp8_fast_erf, *norm,
                                 *cast)

    def get_extra_state(self):
        return self.fp8_amax.detach().clone()

    def set_extra_state(self, state):
        """A checkpoint's history. One that is not finite (a checkpoint of a run before its history was guarded) is
        not taken: the layer is left uncalibrated, and calibrate() says so and scales its first step afresh."""
        if state.shape != self.fp8_amax.shape:
            raise ValueError(f"an amax history of shape {tuple(state.shape)}, this layer keeps "
                             f"{tuple(self.fp8_amax.shape)}")
        good = bool(torch.isfinite(state).all())
        self.fp8_amax.copy_(state if good else torch.zeros_like(state))
        self.fp8_amax[:, 0] = 0                     # the running max starts afresh with the next step
        self.fp8_scaled = good and bool((state[:, 1:].amax(dim=1) > 0).all())
        self.fp8_bad_history = not good


def delayed_linears(model):
    """[(name, module)] of model's DelayedFloat8Linear layers."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, DelayedFloat8Linear)]


def end_step(mods, applied):
    """After each optimizer step of train.py's loop, applied or skipped (non-finite): the running amax of each
    DelayedFloat8Linear in `mods` (the max over the step's micro-batches), all-reduced (max) over the ranks, becomes
    the newest entry of its history (the oldest drops out) where the step was applied and its amax is finite and
    non-zero; otherwise that history is left as it was (its scale is the last good one). The running max starts
    again at 0 either way. No host sync: the choice is made on the device."""
    if not mods:
        return
    state = torch.stack([m.fp8_amax for m in mods])                       # (layers, 2, 1 + AMAX_HISTORY)
    current = state[:, :, :1].nan_to_num(nan=float("inf"), posinf=float("inf"))   # a NaN on any rank: rejected on all
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(current, op=torch.distributed.ReduceOp.MAX)
    zero = torch.zeros_like(current)
    good = torch.isfinite(current) & (current > 0) & applied
    rolled = torch.where(good, torch.cat([zero, current, state[:, :, 1:-1]], dim=-1),
                         torch.cat([zero, state[:, :, 1:]], dim=-1))
    torch._foreach_copy_([m.fp8_amax for m in mods], list(rolled.unbind(0)))


def step_hooks(model, cfg):
    """[hook(applied)] for train.py to call after each optimizer step: end_step over model's DelayedFloat8Linear
    layers, then with fp8_precast their new float8 weights and scales (precast, compiled where the model is);
    [] without them."""
    mods = [m for _, m in delayed_linears(model)]
    if not mods:
        return []
    cast = precaster(cfg.compile) if mods[0].fp8_precast is not None else None

    def hook(applied):
        end_step(mods, applied)
        if cast is not None:
            precast(mods, cast)
    return [hook]


# fp8_precast: the float8 copies of each delayed layer's weight and its scales, made once per optimizer step, outside
# the step's graph. The weights change only at the optimizer step, yet every micro-batch's graph cast each again (an
# amax pass, the cast and, in the backward, the transposed copy), and every micro-batch derived the same scales from
# the same history: Transformer Engine, too, computes its scales once, where the history changes. The step's graph
# is the smaller for it (less to compile), and with several micro-batches per step the cast runs once instead of
# once each. Off by default until it measures faster on the GPU (BENCHMARKS.md, "A long run"). The copies cost 2 bytes
# per converted weight, which memory() below does not count.


def cast_weight(w, history, scales, w8, w8_t):
    """Fill one layer's precast tensors in place from its weight and amax history: scales (3,), fp8_max / amax for
    x and dy from the history's largest amax and for the weight from its own (the weight in bf16, as the layer's
    forward casts it: the recipe refuses float16), w8 the weight in e4m3 and w8_t its transposed copy: exactly what
    _DelayedLinear computes without them (tests/test_fp8.py)."""
    wb = w.to(torch.bfloat16)
    x_amax, dy_amax = history[:, 1:].amax(dim=1)
    scale = torch.stack([scale_for(x_amax), scale_for(dy_amax, torch.float8_e5m2),
                         scale_for(wb.abs().amax(dim=-1).amax())])                 # tensorwise_cast's, in one
    scales.copy_(scale)
    w8.copy_(saturate(wb, scale[2]))
    w8_t.copy_(w8.t())


@functools.cache
def precaster(compiled):
    """cast_weight, compiled or not. Compiled with dynamic shapes: one graph serves every weight shape (a graph of
    all the layers at once, or one per shape, took several times longer to compile). precast() passes it the weights
    detached: Dynamo keeps a Parameter's shape static, which would compile it once per shape."""
    return torch.compile(cast_weight, dynamic=True) if compiled else cast_weight


def precast(mods, cast=cast_weight):
    """Refresh the precast tensors of the DelayedFloat8Linear layers `mods` from their weights and histories, with
    `cast` (cast_weight or precaster()'s compiled copy of it), without autograd."""
    with torch.no_grad():
        for m in mods:
            cast(m.weight.detach(), m.fp8_amax, *m.fp8_precast)


def calibrate(model, batch, ctx, tokens=8192):
    """The first entry of the amax histories of model's DelayedFloat8Linear layers that have none (a new run, or a
    checkpoint without a good history), from one forward and backward of the first rows of `batch` (a data.Batch,
    about `tokens` tokens), eager, with dynamic scales, through the plain head (the dy reaching the blocks is the
    same), under `ctx` (autocast). Call it on the raw model before compiling it, on every rank (the amax is
    all-reduced): then no compiled step ever sees a layer without history. Leaves the gradients, the RNG and the
    model's mode as they were. Returns a line for the log, or None when nothing needed it."""
    mods = [m for _, m in delayed_linears(model)]
    if not mods or all(m.fp8_scaled for m in mods):
        return None
    bad = any(getattr(m, "fp8_bad_history", False) for m in mods)
    rows = max(1, min(batch.x.size(0), tokens // batch.x.size(1)))
    pick = lambda t: None if t is None else t[:rows]
    head_loss, training = model.head_loss, model.training
    devices = [batch.x.device] if batch.x.is_cuda else []
    grads = [p.grad for p in model.parameters()]
    try:
        model.head_loss = None
        model.train()
        with torch.random.fork_rng(devices=devices), ctx:
            _, loss = model(batch.x[:rows], batch.y[:rows], pick(batch.doc_ids), None, pick(batch.position_ids))
        loss.backward()
    finally:
        model.head_loss = head_loss
        model.train(training)
        for p, g in zip(model.parameters(), grads):
            p.grad = g
    end_step(mods, True)
    for m in mods:
        m.fp8_scaled = True
    why = "the checkpoint's amax history is not finite" if bad else "no amax history yet"
    return f"fp8: {why}: the first step's scales come from one micro-batch of {rows * batch.x.size(1):,} tokens " \
           "(dynamic scales, eager)"


def fp8_flops_per_token(model, cfg):
    """Training FLOPs per token that run in float8 (forward + backward, GPT.flops_per_token's convention: 6 per
    weight of a Linear, 2 per GEMM): every converted block Linear's three GEMMs (the rowwise_bf16_wgrad recipe's two:
    its weight gradient is bf16), and with fp8_head the head's three (6 V C). For mfu_fp8 (speedgpt/measure.py)."""
    flops = 6 * model.lm_head.weight.numel() if cfg.fp8_head else 0
    for m in model.modules():
        if isinstance(m, RowwiseFloat8Linear) or type(m).__name__ == "Float8Linear":       # ours, or torchao's
            flops += (4 if type(m) is RowwiseFloat8Linear else 6) * m.weight.numel()
    return flops


# torchao's tensorwise Float8Linear, compiled, keeps the block Linears' inputs in float8: the measured peaks
# at 350M and 774M (benchmarks/results/family_side_by_side_h200.md, "block FP8") shrink as if the block
# activations were about this share of bf16's; this module's tensorwise_fused and tensorwise_delayed keep them in
# float8 too (the same peaks measured). The rowwise recipes keep bf16 inputs for the backward.
TENSORWISE_ACTIVATIONS = 0.63
FLOAT8_INPUTS = ("tensorwise", "tensorwise_fused", "tensorwise_delayed")     # the recipes that keep float8 inputs


def memory(model, cfg, parts):
    """What fp8 changes in the memory estimate (speedgpt/memory.py's Parts, of `model`: a GPT of cfg's shape on the
    meta device): tensorwise FP8 (FLOAT8_INPUTS) on every block Linear (fp8_layers all, or every kind block_linears
    has; n_embd a multiple of 16 and at least fp8_min_dim) keeps float8 inputs: TENSORWISE_ACTIVATIONS of the
    blocks' bytes per token (the 34 C). fp8_gelu_cast adds a byte per input of mlp_proj (the transposed copy its
    weight gradient takes, made in the forward's cast: +2.3 GB measured at 124M, 32.1 GB). Off a CUDA GPU
    (parts.device) it counts as off: check() refuses it there in one line with the memory check's refusal (all at
    once off a GPU), which so sizes the run that line asks for. The estimate's two peaks below 0.8x of those
    measured are FP8's at 350M: the rowwise recipe's of 3f9797b, and bf01b54's, whose compiled graph kept each FP8
    Linear's input twice (BENCHMARKS.md "A long run")."""
    if not cfg.fp8 or (parts.device is not None and parts.device.type != "cuda"):
        return
    C, L = model.config.n_embd, model.config.n_layer
    every_kind = cfg.fp8_layers.strip() == ALL_KINDS or \
        {k.strip() for k in cfg.fp8_layers.split(",")} >= {kind for _, kind, _ in model.block_linears()}
    if cfg.fp8_recipe in FLOAT8_INPUTS and C >= cfg.fp8_min_dim and C % 16 == 0 and every_kind:
        parts.per_layer *= TENSORWISE_ACTIVATIONS
    if cfg.fp8_gelu_cast:       # mlp_proj keeps its input's transposed float8 copy too, made in the cast
        parts.per_layer += sum(m.in_features for _, kind, m in model.block_linears() if kind == "mlp_proj") / L


# fp8_recipe -> this module's Linear class (the other recipes are torchao's)
OWN_RECIPES = {"rowwise_bf16_wgrad": RowwiseFloat8Linear, "tensorwise_fused": TensorwiseFloat8Linear,
               "tensorwise_delayed": DelayedFloat8Linear}
