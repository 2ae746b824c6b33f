"""
The delayed FP8 recipe's casts as one Triton kernel (fp8_cast_kernel=True; the feature is fp8's, in
speedgpt/features/fp8.py, whose check() checks this flag). With delayed scales (fp8_recipe='tensorwise_delayed')
the scale of a block Linear's input x, and of its output gradient dy, is known before the tensor is, but the step
still takes each one's amax for the next steps' scales. Compiled, that amax is a reduction kernel of its own beside
the cast, reading the whole tensor a second time; here one kernel reads each 2-D tile once, writes it in float8 and
folds the tile's largest |value| into the layer's running max with one atomic max (a float max over values >= 0
is the integer max of their bits, so the order of the tiles does not matter and the amax is exact). Measured alone
(benchmarks/fp8_cast.py; BENCHMARKS.md, "The roofline of a step"). Off by default until it measures faster end to
end.

cast_amax is a torch custom op, so torch.compile keeps it one opaque call: on a CUDA GPU the Triton kernel,
elsewhere the same math in PyTorch ops (reference: the tests' CPU path). check() refuses the flag where it cannot
run, and runs the kernel once against reference() on the GPU at hand (verify), so that a Triton that miscompiles it
stops the run before it starts instead of training on wrong bytes.
"""
import importlib.util

import torch

BLOCK_M, BLOCK_N = 32, 128       # the tile benchmarks/fp8_cast.py measured (rows, columns)
_kernel = []                     # the jit function, made once (Triton imported only where the flag is on)
_verified = {}                   # device -> verify's answer, once per process


def check(cfg, device):
    """Raise ValueError naming the way out unless fp8_cast_kernel=True can run: the delayed recipe (the only one whose
    scale is known before the cast), Triton on a CUDA GPU, and the kernel right there (verify)."""
    if not cfg.fp8_cast_kernel:
        return
    if cfg.fp8_recipe != "tensorwise_delayed":
        raise ValueError(f"fp8_cast_kernel=True would do nothing with fp8_recipe={cfg.fp8_recipe!r}: only delayed "
                         "scales are known before the cast. Add --fp8_recipe=tensorwise_delayed, or leave "
                         "fp8_cast_kernel out")
    if device.type != "cuda":
        raise ValueError(f"fp8_cast_kernel=True runs a Triton kernel on a CUDA GPU; this run is on {device.type}: "
                         "leave fp8_cast_kernel out")
    if importlib.util.find_spec("triton") is None:
        raise ValueError("fp8_cast_kernel=True needs Triton (pip install triton); or leave fp8_cast_kernel out")
    problem = verify(device)
    if problem:
        raise ValueError(f"fp8_cast_kernel=True: {problem}; leave fp8_cast_kernel out")


def kernel():
    """The Triton kernel (jit), made on the first call."""
    if _kernel:
        return _kernel[0]
    import triton
    import triton.language as tl

    @triton.jit
    def cast_amax_kernel(x, out, scale, amax, n, w, FMAX: tl.constexpr, E5M2: tl.constexpr, GELU: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        mask = (rows < n) & (cols < w)
        at = rows.to(tl.int64) * w + cols
        y = tl.load(x + at, mask=mask, other=0.0).to(tl.float32)
        if GELU:             # the exact (erf) GELU: benchmarks/fp8_cast.py times the cast fused with its producer
            y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
        tl.atomic_max(amax, tl.max(tl.max(tl.abs(y), 1), 0))
        y = tl.clamp(y * tl.load(scale), -FMAX, FMAX)          # saturating, as fp8.saturate
        if E5M2:
            tl.store(out + at, y.to(tl.float8e5), mask=mask)
        else:
            tl.store(out + at, y.to(tl.float8e4nv), mask=mask)

    _kernel.append(cast_amax_kernel)
    return cast_amax_kernel


def run(x, scale, amax, e5m2=False, gelu=False, block_m=BLOCK_M, block_n=BLOCK_N, out=None):
    """The kernel on x (n, w), a CUDA tensor (or a CPU one under TRITON_INTERPRET=1): returns x (or GELU(x)) times
    scale (a 0-dim float32 tensor) cast to float8 e4m3 (e5m2) with saturation, and folds its largest magnitude into
    amax (a float32 tensor of one element, a view into a layer's history allowed) in place. out: the float8 tensor
    to write (verify's, filled first), else a new one."""
    x = x.contiguous()
    n, w = x.shape
    dtype = torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn
    out = torch.empty(x.shape, dtype=dtype, device=x.device) if out is None else out
    grid = (-(-n // block_m), -(-w // block_n))
    kernel()[grid](x, out, scale, amax, n, w, FMAX=torch.finfo(dtype).max, E5M2=e5m2, GELU=gelu,
                   BLOCK_M=block_m, BLOCK_N=block_n)
    return out


def reference(x, scale, amax, e5m2=False):
    """run()'s math in PyTorch ops (fp8.py's cast and its amax as the recipe takes them without this flag)."""
    dtype = torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn
    fmax = torch.finfo(dtype).max
    amax.copy_(torch.maximum(amax, x.abs().amax(dim=-1).amax().float()))
    return (x.float() * scale).clamp(-fmax, fmax).to(dtype)


@torch.library.custom_op("speedgpt::cast_amax", mutates_args=("amax",))
def cast_amax(x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, row: int, e5m2: bool) -> torch.Tensor:
    """x (M, K) times scale (0-dim float32) cast to float8 (e5m2, else e4m3) with saturation, and x's largest
    magnitude folded into amax[row, 0] (a delayed layer's history: fp8.DelayedFloat8Linear.fp8_amax) in place. On
    a CUDA GPU one Triton kernel (run), elsewhere reference()."""
    return reference(x, scale, amax[row, 0:1], e5m2)


@cast_amax.register_kernel("cuda")
def _(x, scale, amax, row, e5m2):
    return run(x, scale, amax[row, 0:1], e5m2)


@cast_amax.register_fake
def _(x, scale, amax, row, e5m2):
    return torch.empty_like(x, dtype=torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn)


def verify(device, shape=(1000, 1200)):
    """Run the kernel in both float8 formats on random bf16 values (a shape its tiles do not divide, some values
    past the range) and compare with reference(): None, or a line saying what differs. Each output starts as NaN
    bytes, so a value the kernel never wrote shows. Leaves the global RNG as it was."""
    if device in _verified:
        return _verified[device]
    gen = torch.Generator(device).manual_seed(0)
    x = (3 * torch.randn(shape, device=device, generator=gen)).bfloat16()
    problem = None
    for e5m2, scale in ((False, 448.0 / 6), (True, 57344.0 / 6)):
        s = torch.tensor(scale, device=device)
        got_amax, want_amax = torch.zeros(1, device=device), torch.zeros(1, device=device)
        want = reference(x, s, want_amax, e5m2)
        got = run(x, s, got_amax, e5m2, out=torch.full(shape, 0xFF, dtype=torch.uint8, device=device).view(want.dtype))
        if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)) or not torch.equal(got_amax, want_amax):
            import triton
            problem = (f"Triton {triton.__version__} compiled the cast kernel wrongly on this GPU ("
                       f"{'e5m2' if e5m2 else 'e4m3'}: {(got.view(torch.uint8) != want.view(torch.uint8)).sum().item()}"
                       f" bytes differ, amax {got_amax.item():.6g} against {want_amax.item():.6g})")
            break
    _verified[device] = problem
    return problem
