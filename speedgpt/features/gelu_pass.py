"""
GELU's erf made cheaper (gelu_erf='fast'): Abramowitz and Stegun's 7.1.26, erf(z) = 1 - t P(t) exp(-z^2) with
t = 1 / (1 + 0.3275911 z) for z >= 0 (|error| <= 1.5e-7, below bf16's rounding of GELU's output): one exp2 and one
reciprocal, where libdevice's erff, which the exact GELU of Inductor's kernels and of ours calls, evaluates two
polynomials and selects one, and makes those kernels instruction-bound (benchmarks/results/roofline_notes.md, "What
holds our GELU pass").

Where fp8_gelu_cast carries GELU into its FP8 casts, those passes take the formula (speedgpt/features/cast_kernel.py).
Every other MLP whose exact GELU feeds a plain (bf16) Linear, the whole bf16 path (--fp8=False), gets two Triton
passes of its own here, in place of Inductor's GELU kernels:

  forward   y = h Phi(h): reads h, writes y, which the Linear multiplies
  backward  dh = dy' (Phi(h) + h phi(h)) with dy' = dy W, and y again: reads h and dy', writes dh and y, which the
            weight gradient dW = dy^T y takes; only h is kept for the backward, as Inductor's partition keeps it

apply() swaps that Linear's class for GeluLinear (its parameters and state-dict keys stay the Linear's) and makes
the activation an identity: GELU and the Linear are one autograd function, so the backward pass makes y again
instead of keeping it (a custom op is opaque to torch.compile's partition, which would otherwise keep both). The
passes are torch custom ops, one opaque call each under torch.compile. Needs Triton and a CUDA GPU (check() refuses
the flag otherwise); check() runs both passes once against PyTorch's exact GELU on the GPU at hand (verify), and
tests/test_gpu.py compares them with it.
"""
import torch
import torch.nn.functional as F

from speedgpt import refuse_unready_kernel
from speedgpt.features import exact_gelus

BLOCK = 1024                     # elements per program: 8 per thread at 4 warps, one 16-byte load of bf16 each
SQRT_HALF = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327


def check(cfg, proc):
    """Raise ValueError naming the way out where gelu_erf='fast' would do nothing (another activation; no GELU that
    an FP8 cast or a pass here takes) or cannot run (not a CUDA GPU, no Triton, a pass wrong there: verify).
    Returns cfg."""
    if cfg.gelu_erf != "fast":
        return cfg
    if cfg.activation != "gelu":
        raise ValueError(f"gelu_erf='fast' would do nothing: it is the exact GELU's erf, and activation="
                         f"{cfg.activation!r} has none. Leave gelu_erf out, or add --activation=gelu")
    from dataclasses import replace
    from speedgpt.features import fp8
    meta = fp8.meta_model(cfg)
    converted = {id(m) for _, m in fp8.eligible_linears(meta, cfg)} if cfg.fp8 else set()
    in_casts = fp8.gelu_fed(meta, cfg) if cfg.fp8 and cfg.fp8_gelu_cast else []
    passes = served(meta, lambda linear: id(linear) not in converted)
    if not in_casts and not passes:
        # the casts' way in only where fp8_gelu_cast would then find a GELU (its own refusal next is no way out)
        cast = fp8.gelu_fed(meta, replace(cfg, fp8_recipe="tensorwise_delayed", fp8_gelu_cast=True))
        raise ValueError("gelu_erf='fast' would do nothing: every MLP's GELU feeds an FP8 Linear whose cast does not "
                         "take it in. " + (("Add --fp8_gelu_cast=True" if cfg.fp8_recipe == "tensorwise_delayed" else
                                            "Use --fp8_recipe=tensorwise_delayed --fp8_gelu_cast=True") +
                                           " (its casts take the fast erf), or --gelu_erf=exact" if cast else
                                           "Add --gelu_erf=exact"))
    # this module's kernels verified only where they will run (the casts' are cast_kernel's); off a GPU refused either
    # way, so a preset's refusal there names it with fp8's, not after --fp8=False
    refuse_unready_kernel("gelu_erf", proc.device, verify if passes else lambda device: None, "add --gelu_erf=exact",
                          said="gelu_erf='fast'")
    return cfg


def served(model, plain=lambda linear: True):
    """[(owner, act name, consumer)]: each module whose ACT_BETWEEN ({its activation: (the Linear feeding it, the
    Linear it feeds)}, model.py's MLP) names an exact GELU feeding a plain nn.Linear (for which plain() holds, on a
    meta model: not one fp8 will convert): what apply() swaps."""
    return [(owner, act_name, consumer) for owner, act_name, _, consumer in exact_gelus(model)
            if type(consumer) is torch.nn.Linear and plain(consumer)]


def apply(model, cfg, proc):
    """gelu_erf='fast': after fp8's swap, each exact GELU feeding a plain Linear becomes this module's passes
    (GeluLinear). Returns the line to print, or None."""
    if cfg.gelu_erf != "fast":
        return None
    mlps = served(model)
    for owner, act_name, consumer in mlps:
        setattr(owner, act_name, torch.nn.Identity())
        consumer.__class__ = GeluLinear
    in_casts = sum(getattr(m, "fp8_gelu", False) and m.fp8_fast_erf for m in model.modules())   # one c_proj each
    said = ([f"{len(mlps)} MLPs' GELU passes (speedgpt/features/gelu_pass.py)"] if mlps else []) + \
        ([f"{in_casts} MLPs' FP8 casts (fp8_gelu_cast)"] if in_casts else [])
    return "gelu_erf: the fast erf in " + " and ".join(said)


def reference(h, dy=None):
    """The passes' math in PyTorch ops, in float32: GELU(h) by the fast erf, or with dy, (dy times GELU'(h), GELU(h)).
    The passes' own, off a GPU (and the tests' reference for the formula)."""
    v = h.float()
    z = v.abs() * SQRT_HALF
    t = 1.0 / (1.0 + 0.3275911 * z)
    e = torch.exp(-z * z)
    erf = 1.0 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))) * e
    cdf = 0.5 + 0.5 * torch.where(v < 0, -erf, erf)
    if dy is None:
        return v * cdf
    return dy.float() * (cdf + v * INV_SQRT_2PI * e), v * cdf


_kernels = []


def kernels():
    """(forward, backward): the two Triton kernels (jit), made on the first call. Their helper fast_cdf is made a
    module global: a kernel finds the functions it calls among its module's globals, not in a closure."""
    global fast_cdf
    if _kernels:
        return _kernels
    import triton
    import triton.language as tl

    @triton.jit
    def fast_cdf(v, PTX: tl.constexpr):
        # (Phi(v), exp(-v^2 / 2)): the normal's cdf by 7.1.26 and the exponential GELU's derivative takes too
        z = tl.abs(v) * 0.7071067811865476
        d = 1.0 + 0.3275911 * z
        if PTX:      # the approximate reciprocal (2 ulp): the error is the formula's, not the division's
            t = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [d], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:        # Triton's interpreter (no PTX)
            t = 1.0 / d
        e = tl.exp2(-1.4426950408889634 * z * z)
        erf = 1.0 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 +
                                                                                  t * 1.061405429)))) * e
        return 0.5 + 0.5 * tl.where(v < 0, -erf, erf), e

    # n specialized (Triton's rule: whether it is a multiple of 16), so the mask keeps the loads and stores 16 bytes
    # wide: a GPT's tensors (tokens x 4 n_embd) are, and compile once
    @triton.jit
    def forward_kernel(h, y, n, PTX: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        v = tl.load(h + i, mask=mask, other=0.0).to(tl.float32)
        cdf, e = fast_cdf(v, PTX)
        tl.store(y + i, (v * cdf).to(y.dtype.element_ty), mask=mask)

    @triton.jit
    def backward_kernel(h, dy, dh, y, n, PTX: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        v = tl.load(h + i, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(dy + i, mask=mask, other=0.0).to(tl.float32)
        cdf, e = fast_cdf(v, PTX)
        tl.store(dh + i, (g * (cdf + v * 0.3989422804014327 * e)).to(dh.dtype.element_ty), mask=mask)
        tl.store(y + i, (v * cdf).to(y.dtype.element_ty), mask=mask)

    _kernels.extend([forward_kernel, backward_kernel])
    return _kernels


def run(h, dy=None, block=BLOCK):
    """The Triton passes on h (and dy, h's shape) of a CUDA GPU (CPU tensors under TRITON_INTERPRET=1): GELU(h), or
    with dy, (dy times GELU'(h), GELU(h)), each in h's dtype."""
    h = h.contiguous()
    n, grid = h.numel(), (-(-h.numel() // block),)
    forward_kernel, backward_kernel = kernels()
    y = torch.empty_like(h)
    if dy is None:
        forward_kernel[grid](h, y, n, PTX=h.is_cuda, BLOCK=block, num_warps=4)
        return y
    dh = torch.empty_like(h)
    backward_kernel[grid](h, dy.contiguous(), dh, y, n, PTX=h.is_cuda, BLOCK=block, num_warps=4)
    return dh, y


@torch.library.custom_op("speedgpt::gelu_fast", mutates_args=())
def gelu_fast(h: torch.Tensor) -> torch.Tensor:
    """GELU(h) with the fast erf, in h's dtype: the forward pass on a CUDA GPU, reference() elsewhere."""
    return run(h) if h.is_cuda else reference(h).to(h.dtype)


@gelu_fast.register_fake
def _(h):
    return torch.empty_like(h)


@torch.library.custom_op("speedgpt::gelu_fast_backward", mutates_args=())
def gelu_fast_backward(h: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dy times GELU'(h), GELU(h)) with the fast erf, in h's dtype: the backward pass on a CUDA GPU, reference()
    elsewhere."""
    if h.is_cuda:
        return run(h, dy)
    dh, y = reference(h, dy)
    return dh.to(h.dtype), y.to(h.dtype)


@gelu_fast_backward.register_fake
def _(h, dy):
    return torch.empty_like(h), torch.empty_like(h)


class _GeluLinear(torch.autograd.Function):
    """F.linear(GELU(h), w, b) keeping only h: the backward makes GELU(h) again in the pass that takes its
    derivative. w and b come in the matmul's dtype."""

    @staticmethod
    def forward(ctx, h, w, b):
        ctx.save_for_backward(h, w)
        ctx.bias = b is not None
        return F.linear(gelu_fast(h), w, b)

    @staticmethod
    def backward(ctx, dout):
        h, w = ctx.saved_tensors
        d2 = dout.reshape(-1, dout.size(-1))
        dh, y = gelu_fast_backward(h, (d2 @ w).view(h.shape))
        dw = d2.t() @ y.reshape(-1, y.size(-1))
        return dh, dw, d2.sum(0) if ctx.bias else None


class GeluLinear(torch.nn.Linear):
    """nn.Linear fed by GELU of its input (apply() swaps a Linear's class to it): the two as _GeluLinear, in the
    autocast dtype where autocast is on (h's dtype otherwise)."""

    def forward(self, h):
        dt = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
        with torch.autocast(h.device.type, enabled=False):
            return _GeluLinear.apply(h.to(dt), self.weight.to(dt), None if self.bias is None else self.bias.to(dt))


_verified = {}                   # (device, shape) -> verify's answer, once per process


def verify(device, shape=(1000, 1200)):
    """Run both passes on random bf16 values of `shape` (some large, some zero) and compare with PyTorch's exact
    GELU and its derivative in float32: None, or a line saying what differs by more than a bf16 ulp of the value
    plus the formula's error. Leaves the global RNG as it was."""
    if (device, shape) in _verified:
        return _verified[device, shape]
    gen = torch.Generator(device).manual_seed(0)
    h = (3 * torch.randn(shape, device=device, generator=gen)).bfloat16()
    h.view(-1)[:7] = torch.tensor([0.0, -0.0, 12.0, -12.0, 40.0, -40.0, 1e-3])
    dy = torch.randn(shape, device=device, generator=gen).bfloat16()
    hf = h.float().requires_grad_()
    want_y = F.gelu(hf)
    want_dh, = torch.autograd.grad(want_y, hf, dy.float())
    y = run(h)
    dh, y2 = run(h, dy)
    problem = None
    for name, got, want, times in (("GELU(h)", y, want_y, 1), ("GELU(h) of the backward pass", y2, want_y, 1),
                                   ("GELU's derivative times dy", dh, want_dh, dy.float().abs())):
        # one bf16 ulp of the value (at most 2^-7 of it: a GPU rounds to nearest, Triton's interpreter truncates)
        # and the formula's 1.5e-7 in erf, times what multiplies it: a wrong kernel is off by far more
        bound = want.detach().abs() * 2 ** -7 + 1e-7 * (1 + h.float().abs()) * times
        off = (got.float() - want.detach()).abs() > bound
        if off.any():
            k = int(off.view(-1).nonzero()[0])
            problem = (f"the GELU pass of gelu_erf='fast' gives {name} = {got.view(-1)[k].item():.6g} at h = "
                       f"{h.view(-1)[k].item():.6g}, PyTorch's exact GELU {want.view(-1)[k].item():.6g}")
            break
    _verified[device, shape] = problem
    return problem
