"""
The delayed FP8 recipe's casts as one Triton kernel (fp8_cast_kernel=True; the feature is fp8's, in
speedgpt/features/fp8.py, whose check() checks this flag). With delayed scales (fp8_recipe='tensorwise_delayed')
the scale of a block Linear's input x, and of its output gradient dy, is known before the tensor is, but the step
still takes each one's amax for the next steps' scales. Compiled, that amax is a reduction kernel of its own beside
the cast, reading the whole tensor a second time; here one kernel reads each 2-D tile once, writes it in float8 and
folds the tile's largest |value| into the layer's running max with one atomic max (a float max over values >= 0
is the integer max of their bits, so the order of the tiles does not matter and the amax is exact). The same pass
writes the float8 tensor's transposed copy, which the weight gradient's GEMM takes (torch._scaled_mm wants K-major
operands; Transformer Engine makes it in the cast too), so no transposing kernel of its own runs in the backward.
The transposed store is byte by byte: Triton's vectorized 8-bit transposed store is what ptxas 12.8 and 12.9
mis-lower (softmax_pass.py says how), so the kernel is compiled without assuming the row count a multiple of 16. The
same ptxas versions (the ones Triton 3.6 bundles) mis-lower the byte permutes (PTX prmt) with which Triton changes a
float8 tile's layout in registers and shared memory; ptxas 13.0 compiles both right (TRITON_PTXAS_PATH chooses it).
So each pass is laid out to need none: the passes that write their copy byte by byte run a tile whose float8
layout needs no permutes under Triton 3.6 or 3.9 (BYTE_TILE); a CPU test compiles each for
sm_90 and finds no prmt in its PTX, and verify() checks the bytes on the GPU at hand. GELU's pass (the costliest: its
byte-by-byte layout recomputes the erf) writes the copy as 32-bit words instead (WORDS, below).
Measured alone (benchmarks/fp8_cast.py; benchmarks/results/roofline_notes.md), end to end in BENCHMARKS.md ("The
roofline of a step"). Off by default until it measures faster end to end.

fp8_gelu_cast=True runs the same kernel with the MLP's exact GELU on both sides of it. Forward, in c_proj's input
cast: fp8.convert hands c_proj the pre-activation h (the MLP's act becomes an identity) and the pass casts GELU(h).
Backward, in c_fc's output-gradient cast: c_proj's backward hands on the gradient of GELU's output unchanged and
c_fc's pass, reading it and h (c_fc's own output), casts it times GELU'(h), so GELU's derivative is not a kernel of
its own writing a bf16 tensor that the cast then reads. Inductor already fuses GELU, and GELU's derivative, into
those casts, so what the kernel saves there is the amax's second read and the transposing kernel of the weight
gradient (benchmarks/fp8_cast.py times both), without splitting the LayerNorm's fused cast as fp8_cast_kernel does
for the other layers. GELU and its derivative are computed in float32 and cast once, as compiled code does (no
bfloat16 rounding between them). The backward's pass runs BYTE_TILE: at the square one, Triton changes the float8
tile's layout for the transposed store with byte permutes that Triton's own ptxas mis-lowers (above).

fp8_norm_cast=True does the same for the LayerNorm in front of the qkv and fc Linears, whose casts Inductor fuses
into the LayerNorm kernel (which fp8_cast_kernel's plain cast splits): one program per BLOCK rows holds each whole
row, takes its mean and variance in float32, normalizes, scales and shifts, casts, folds the amax and writes the
transposed copy, and the row statistics the backward takes. fp8.convert makes the Block's norm a pass-through (its
weight and bias stay its own, the checkpoint's keys unchanged) and hands the Linear the residual stream, in its own
dtype (float32 under autocast, as LayerNorm reads it); the Linear's backward runs aten's LayerNorm backward from
those statistics. Its layout change still takes byte permutes: on one H100 verify() refused it under Triton's own
ptxas; under ptxas 13.0 it was right, and 7.8% slower end to end at 124M (benchmarks/results/h100.md), so it stays off.
A version that casts and writes in chunks of 64 columns after the row statistics, whose PTX has no permutes, was
still wrong at 65,536 x 768 under Triton's own ptxas (right at three other shapes, verify()'s among their kind, so
the check at start might not have caught it): it was not kept.

gelu_erf='fast' computes GELU's erf in both GELU passes by Abramowitz and Stegun's 7.1.26 (|error| <= 1.5e-7)
(the bf16 MLP's GELU takes the same formula in speedgpt/features/gelu_pass.py)
instead of libdevice's erff, which holds most of their instructions (benchmarks/results/roofline_notes.md); the
exact path's code is unchanged. Its gain end to end and its loss over 20M tokens against the exact erf's
(benchmarks/loss_check.py): BENCHMARKS.md, "The roofline of a step"; every GPT-2 preset sets it.

cast_amax is a torch custom op, so torch.compile keeps it one opaque call: on a CUDA GPU the Triton kernel,
elsewhere the same math in PyTorch ops (reference: the tests' CPU path). check() refuses the flag where it cannot
run, and runs the kernel once against reference() on the GPU at hand (verify), so that a Triton that miscompiles it
stops the run before it starts instead of training on wrong bytes.
"""
import itertools
from typing import Optional

import torch

from speedgpt import refuse_unready_kernel

BLOCK_M, BLOCK_N = 32, 128       # the tile benchmarks/fp8_cast.py measured without the transposed copy (rows, columns)
# Every pass that writes the transposed copy byte by byte: 32 x 64 tiles, 8 warps. At 64 x 64 and 4 warps Triton 3.6
# changes GELU's derivative's float8 tile's layout for the transposed store with byte permutes (PTX prmt), and Triton
# 3.9 the plain cast's and GELU's too, which the ptxas 12.8 and 12.9 they bundle mis-lower: half the copy's bytes
# were foreign at 65,536 x 768 on one H100 (ptxas 13.0 right). This tile's layout needs none under either, and GELU's
# derivative ran as fast at it (benchmarks/results/h100.md).
BYTE_TILE, BYTE_WARPS = (32, 64), 8
# GELU's forward pass, the row count a multiple of 4 (every training run's tokens), writes the transposed copy as
# 32-bit words: the tile is read as four tiles of every fourth row, each giving one byte of each word, so no float8
# tile changes its layout (the words do, as any float32 transpose) and GELU is computed once per value. Each byte
# comes from PTX's own cvt: taken from Triton's float8 value (a bitcast to uint8), much of the copy was wrong under
# ptxas 12.8, while words made of indices alone were right. Faster for GELU's pass; the other passes ran no faster
# as words (BENCHMARKS.md, "The roofline of a step"). False: bytes for every pass (the A/B's baseline). WORD_TILE:
# (rows, columns, warps).
WORDS = True
WORD_TILE = (64, 128, 4)
_kernel = []                     # the jit function, made once (Triton imported only where the flag is on)
_verified = {}                   # (device, shape, flags) -> verify's answer, once per process


FLAGS = ("fp8_cast_kernel", "fp8_gelu_cast", "fp8_norm_cast")
NORM_WIDTH = 8192                # fp8_norm_cast holds a whole row per program: n_embd at most this


def way_off(cfg, flags):
    """The flags that turn `flags` (of FLAGS, or fp8_precast) off, for a refusal's way out: gelu_erf goes with
    fp8_gelu_cast, since where the MLP's Linears stay FP8 it is then refused as doing nothing (no loop of
    refusals; speedgpt/features/gelu_pass.py)."""
    return " ".join(f"--{f}=False" for f in flags) + \
        (" --gelu_erf=exact" if cfg.gelu_erf != "exact" and "fp8_gelu_cast" in flags else "")


def check(cfg, device):
    """Raise ValueError naming the way out unless the flags of FLAGS set True can run: Triton on a CUDA GPU, and the
    kernels right there (verify). fp8.check refuses them first without fp8 and with another recipe
    than the delayed one (the only one whose scale is known before the cast)."""
    on = [f for f in FLAGS if getattr(cfg, f)]
    fast = cfg.gelu_erf == "fast"
    if on:                    # "add --X=False": a preset may have set X (config/fast.py sets fp8_gelu_cast)
        refuse_unready_kernel(on, device, lambda d: None, f"add {way_off(cfg, on)}")
        wrong = [(f, problem) for f in on if (problem := verify(device, flags=(f,), fast_erf=fast))]
        if wrong and fast and [f for f, _ in wrong] == ["fp8_gelu_cast"] and \
                verify(device, flags=("fp8_gelu_cast",)) is None:      # only the fast erf's passes are wrong
            raise ValueError(f"gelu_erf='fast': {wrong[0][1]}; add --gelu_erf=exact (the exact erf's "
                             "passes are right here)")
        if wrong:             # the way out names only the flags whose kernels are wrong here
            names = [f for f, _ in wrong]
            raise ValueError(f"{' and '.join(f'{f}=True' for f in names)}: {wrong[0][1]}; add "
                             f"{way_off(cfg, names)}" +
                             (f" (the other{'s' if len(on) - len(names) > 1 else ''} passed)"
                              if len(names) < len(on) else "") + ptxas_way_out(device))


def ptxas_way_out(device):
    """The second way out of a wrong kernel: unless the ptxas Triton compiles with for `device` (its own, or the one
    TRITON_PTXAS_PATH names: Triton's choice, read from Triton) is of CUDA 13 already, the advice to name one (13.0
    compiled every kernel here right where Triton 3.6's own 12.8 and 12.9 did not); "" where that cannot be told."""
    try:
        import triton
        blackwell = torch.cuda.get_device_capability(device)[0] >= 10     # Triton's own split (get_ptxas)
        version = (triton.knobs.nvidia.ptxas_blackwell if blackwell else triton.knobs.nvidia.ptxas).version
        if int(version.split(".")[0]) >= 13:
            return ""
    except Exception:         # an older Triton without knobs, a ptxas that cannot say its version
        return ""
    return (f", or set TRITON_PTXAS{'_BLACKWELL' if blackwell else ''}_PATH to a CUDA 13 ptxas (this Triton compiles "
            f"with ptxas {version})")


def kernel():
    """The Triton kernel (jit), made on the first call."""
    if _kernel:
        return _kernel[0]
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n"])
    def cast_amax_kernel(x, h, out, out_t, scale, amax, n, w, FMAX: tl.constexpr, E5M2: tl.constexpr,
                         GELU: tl.constexpr, GELU_GRAD: tl.constexpr, FAST_ERF: tl.constexpr, TRANSPOSE: tl.constexpr,
                         WORDS: tl.constexpr, PTX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        # WORDS: the transposed copy in 32-bit words (out_t an int32 view (w, n / 4), n a multiple of 4), the tile
        # taken as four tiles of every fourth row, each giving one byte of each word
        PARTS: tl.constexpr = 4 if WORDS else 1
        i = tl.arange(0, BLOCK_M // PARTS)[:, None]
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        s = tl.load(scale)
        m = tl.zeros((), tl.float32)
        word = tl.zeros((BLOCK_M // PARTS, BLOCK_N), tl.uint32)
        for j in tl.static_range(PARTS):
            rows = tl.program_id(0) * BLOCK_M + PARTS * i + j
            mask = (rows < n) & (cols < w)
            at = rows.to(tl.int64) * w + cols
            y = tl.load(x + at, mask=mask, other=0.0).to(tl.float32)
            if GELU_GRAD:
                g = tl.load(h + at, mask=mask, other=0.0).to(tl.float32)
            if FAST_ERF:     # gelu_erf='fast': Phi(v) = (1 + erf(v / sqrt 2)) / 2 of GELU's input v by Abramowitz
                # and Stegun's 7.1.26, erf(z) = 1 - t P(t) exp(-z^2), t = 1 / (1 + 0.3275911 z), z >= 0 (|error| <=
                # 1.5e-7), and e = exp(-v^2 / 2), which GELU's derivative takes too (phi(v) = e / sqrt(2 pi)): one
                # exp2 and one reciprocal, where libdevice's erff evaluates two polynomials and selects one
                if GELU:
                    v = y
                else:
                    v = g
                z = tl.abs(v) * 0.7071067811865476
                d = 1.0 + 0.3275911 * z
                if PTX:      # the approximate reciprocal (2 ulp): the error is the formula's, not the division's
                    t = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [d], dtype=tl.float32,
                                                  is_pure=True, pack=1)
                else:
                    t = 1.0 / d
                e = tl.exp2(-1.4426950408889634 * z * z)
                erf = 1.0 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 +
                                                                                          t * 1.061405429)))) * e
                cdf = 0.5 + 0.5 * tl.where(v < 0, -erf, erf)
            if GELU:         # the exact (erf) GELU: benchmarks/fp8_cast.py times the cast fused with its producer
                if FAST_ERF:
                    y = y * cdf
                else:
                    y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
            if GELU_GRAD:    # x is the gradient of GELU(h): times GELU'(h) = Phi(h) + h phi(h), as aten's gelu_backward
                if FAST_ERF:
                    y = y * (cdf + g * 0.3989422804014327 * e)
                else:
                    y = y * (0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476)) +
                             g * 0.3989422804014327 * tl.exp(-0.5 * g * g))
            m = tl.maximum(m, tl.max(tl.max(tl.abs(y), 1), 0))
            y = tl.clamp(y * s, -FMAX, FMAX)                    # saturating, as fp8.saturate
            y8 = y.to(tl.float8e5) if E5M2 else y.to(tl.float8e4nv)
            tl.store(out + at, y8, mask=mask)
            if WORDS:        # the byte, zero-extended to 32 bits: on a GPU (PTX) by PTX's own cvt to a float8 pair
                if PTX:
                    if E5M2:
                        b = tl.inline_asm_elementwise("{ .reg .b16 t; .reg .f32 z; mov.f32 z, 0f00000000; "
                                                      "cvt.rn.satfinite.e5m2x2.f32 t, z, $1; cvt.u32.u16 $0, t; }",
                                                      "=r,r", [y], dtype=tl.uint32, is_pure=True, pack=1)
                    else:
                        b = tl.inline_asm_elementwise("{ .reg .b16 t; .reg .f32 z; mov.f32 z, 0f00000000; "
                                                      "cvt.rn.satfinite.e4m3x2.f32 t, z, $1; cvt.u32.u16 $0, t; }",
                                                      "=r,r", [y], dtype=tl.uint32, is_pure=True, pack=1)
                else:        # Triton's interpreter (no PTX)
                    b = y8.to(tl.uint8, bitcast=True).to(tl.uint32)
                word = word | (b << (8 * j))
            elif TRANSPOSE:                                     # out_t (w, n): element (c, r) at c * n + r
                tl.store(out_t + cols.to(tl.int64) * n + rows, y8, mask=mask)
        tl.atomic_max(amax, m)
        if WORDS:                                               # word (c, r) at c * n / 4 + r
            r4 = tl.program_id(0) * (BLOCK_M // 4) + i
            tl.store(out_t + cols.to(tl.int64) * (n // 4) + r4, word.to(tl.int32, bitcast=True),
                     mask=(r4 < n // 4) & (cols < w))

    @triton.jit(do_not_specialize=["n"])
    def norm_cast_amax_kernel(x, weight, bias, out, out_t, mean, rstd, scale, amax, n, w, eps, FMAX: tl.constexpr,
                              HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr):
        r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rows, cols = r[:, None], tl.arange(0, BLOCK_N)[None, :]
        mask = (rows < n) & (cols < w)
        at = rows.to(tl.int64) * w + cols
        v = tl.load(x + at, mask=mask, other=0.0).to(tl.float32)
        mu = tl.sum(v, 1) / w
        d = tl.where(mask, v - mu[:, None], 0.0)
        rs = 1.0 / tl.sqrt(tl.sum(d * d, 1) / w + eps)            # LayerNorm's biased variance, as aten's
        y = d * rs[:, None]
        if HAS_WEIGHT:
            y = y * tl.load(weight + cols, mask=cols < w, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(bias + cols, mask=cols < w, other=0.0).to(tl.float32)
        tl.store(mean + r, mu, mask=r < n)
        tl.store(rstd + r, rs, mask=r < n)
        tl.atomic_max(amax, tl.max(tl.max(tl.where(mask, tl.abs(y), 0.0), 1), 0))
        y8 = tl.clamp(y * tl.load(scale), -FMAX, FMAX).to(tl.float8e4nv)
        tl.store(out + at, y8, mask=mask)
        tl.store(out_t + cols.to(tl.int64) * n + rows, y8, mask=mask)      # out_t (w, n), byte by byte

    _kernel.extend([cast_amax_kernel, norm_cast_amax_kernel])
    return cast_amax_kernel


def run_norm(x, weight, bias, eps, scale, amax, out=None, block_m=None, num_warps=8):
    """LayerNorm of x (n, w) (weight and bias (w,) or None) times scale cast to e4m3 with saturation, by the Triton
    kernel (a CUDA tensor, or a CPU one under TRITON_INTERPRET=1), its largest magnitude folded into amax in place:
    returns (out (n, w), out_t (w, n) the same bytes transposed, mean (n, 1), rstd (n, 1)) in float32, as aten's
    native_layer_norm gives them. out: the four tensors to write (verify's), else new ones. block_m: rows per
    program (a power of two; by default as many as make 16,384 elements with the row padded to a power of two, at
    most 32: each column of the transposed copy is written in runs of block_m bytes); num_warps: Triton's."""
    x = x.contiguous()
    n, w = x.shape
    if out is None:
        f8 = torch.float8_e4m3fn
        out = (torch.empty((n, w), dtype=f8, device=x.device), torch.empty((w, n), dtype=f8, device=x.device),
               torch.empty((n, 1), device=x.device), torch.empty((n, 1), device=x.device))
    block_n = 1 << (w - 1).bit_length()                          # the next power of two: the whole row
    block_m = block_m or max(1, min(32, 16384 // block_n))
    kernel()
    _kernel[1][(-(-n // block_m),)](x, x if weight is None else weight, x if bias is None else bias, *out, scale,
                                    amax, n, w, eps, FMAX=torch.finfo(torch.float8_e4m3fn).max,
                                    HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_M=block_m,
                                    BLOCK_N=block_n, num_warps=num_warps)
    return tuple(out)


def norm_reference(x, weight, bias, eps, scale, amax):
    """run_norm()'s math in PyTorch ops: aten's native_layer_norm in float32, then the e4m3 cast and its amax."""
    fmax = torch.finfo(torch.float8_e4m3fn).max
    y, mean, rstd = torch.ops.aten.native_layer_norm(x.float(), [x.size(-1)], None if weight is None else
                                                     weight.float(), None if bias is None else bias.float(), eps)
    amax.copy_(torch.maximum(amax, y.abs().amax(dim=-1).amax()))
    return (y * scale).clamp(-fmax, fmax).to(torch.float8_e4m3fn), mean, rstd


def run(x, scale, amax, e5m2=False, gelu=False, transpose=False, block=None, out=None, gelu_input=None,
        num_warps=None, words=None, fast_erf=False):
    """The kernel on x (n, w), a CUDA tensor (or a CPU one under TRITON_INTERPRET=1): returns x (gelu: GELU(x);
    gelu_input h, x's shape: x * GELU'(h), GELU's backward) times scale (a 0-dim float32 tensor) cast to float8
    e4m3 (e5m2) with saturation, and folds its largest magnitude into
    amax (a float32 tensor of one element, a view into a layer's history allowed) in place. transpose: returns
    (out, out_t), out_t (w, n) row-major the same bytes transposed. block: the tile (rows, columns), by default
    BLOCK_M x BLOCK_N, or with transpose BYTE_TILE (with gelu WORD_TILE where n is a multiple of 4, the copy then
    written as words); num_warps: Triton's (by default 4, the tile's own with transpose). words: the copy as words
    (True; n a multiple of 4) or bytes (False) for any pass, overriding the rule above
    (benchmarks/fp8_cast.py --tiles). out: the tensors to write (verify's, filled first), else new ones. fast_erf:
    GELU and its derivative with the fast erf (gelu_erf='fast': Abramowitz and Stegun 7.1.26, |error| <= 1.5e-7)."""
    x = x.contiguous()
    h = x if gelu_input is None else gelu_input.contiguous()
    n, w = x.shape
    dtype = torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn
    if out is None:
        out = (torch.empty((n, w), dtype=dtype, device=x.device),) + \
            ((torch.empty((w, n), dtype=dtype, device=x.device),) if transpose else ())
    if words is None:
        words = WORDS and transpose and gelu and n % 4 == 0
    elif words and not (transpose and n % 4 == 0):
        raise ValueError(f"words=True writes the transposed copy as 32-bit words: it needs transpose=True and a row "
                         f"count that is a multiple of 4 (got {n})")
    if words:
        block_m, block_n, warps = WORD_TILE
        block_m, block_n = block or (block_m, block_n)
    else:
        block_m, block_n = block or (BYTE_TILE if transpose else (BLOCK_M, BLOCK_N))
        warps = BYTE_WARPS if transpose and (block_m, block_n) == BYTE_TILE else 4
    grid = (-(-n // block_m), -(-w // block_n))
    kernel()[grid](x, h, out[0], out[-1].view(torch.int32) if words else out[-1], scale, amax, n, w,
                   FMAX=torch.finfo(dtype).max, E5M2=e5m2, GELU=gelu, GELU_GRAD=gelu_input is not None,
                   FAST_ERF=fast_erf and (gelu or gelu_input is not None), TRANSPOSE=transpose, WORDS=words,
                   PTX=x.is_cuda, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps or warps)
    return tuple(out) if transpose else out[0]


def reference(x, scale, amax, e5m2=False, gelu=False, gelu_input=None):
    """run()'s math in PyTorch ops (fp8.py's cast and its amax as the recipe takes them without this flag; with gelu,
    of the exact GELU of x in float32; with gelu_input, of aten's gelu_backward(x, gelu_input) in float32)."""
    dtype = torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn
    fmax = torch.finfo(dtype).max
    y = torch.nn.functional.gelu(x.float()) if gelu else x.float()
    if gelu_input is not None:
        y = torch.ops.aten.gelu_backward(y, gelu_input.float())
    amax.copy_(torch.maximum(amax, y.abs().amax(dim=-1).amax()))
    return (y * scale).clamp(-fmax, fmax).to(dtype)


@torch.library.custom_op("speedgpt::cast_amax", mutates_args=("amax",))
def cast_amax(x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, row: int, e5m2: bool,
              gelu: bool = False, gelu_input: Optional[torch.Tensor] = None,
              fast_erf: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) (with gelu: the exact GELU of x; with gelu_input h (M, K): x, the gradient of GELU(h), times GELU'(h))
    times scale (0-dim float32) cast to float8 (e5m2, else e4m3) with
    saturation, and its largest magnitude folded into amax[row, 0] (a delayed layer's history:
    fp8.DelayedFloat8Linear.fp8_amax) in place. Returns (x8 (M, K), x8_t (K, M)), both row-major, x8_t the same
    bytes transposed. fast_erf: GELU's erf by run()'s cheaper formula. On a CUDA GPU one Triton kernel (run),
    elsewhere reference() (the exact erf: gelu_erf is refused there)."""
    x8 = reference(x, scale, amax[row, 0:1], e5m2, gelu, gelu_input)
    return x8, x8.t().contiguous()


@cast_amax.register_kernel("cuda")
def _(x, scale, amax, row, e5m2, gelu=False, gelu_input=None, fast_erf=False):
    return run(x, scale, amax[row, 0:1], e5m2, gelu=gelu, transpose=True, gelu_input=gelu_input, fast_erf=fast_erf)


@cast_amax.register_fake
def _(x, scale, amax, row, e5m2, gelu=False, gelu_input=None, fast_erf=False):
    dtype = torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn
    return x.new_empty(x.shape, dtype=dtype), x.new_empty((x.size(1), x.size(0)), dtype=dtype)


@torch.library.custom_op("speedgpt::norm_cast_amax", mutates_args=("amax",))
def norm_cast_amax(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                   scale: torch.Tensor, amax: torch.Tensor, row: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 torch.Tensor, torch.Tensor]:
    """LayerNorm(x) (x (M, K), weight and bias (K,) or None) times scale (0-dim float32) cast to e4m3 with
    saturation, its largest magnitude folded into amax[row, 0] in place. Returns (x8 (M, K), x8_t (K, M), mean (M, 1),
    rstd (M, 1)), the last two float32 as aten's native_layer_norm gives them (its backward takes them). On a CUDA
    GPU one Triton kernel (run_norm), elsewhere norm_reference()."""
    x8, mean, rstd = norm_reference(x, weight, bias, eps, scale, amax[row, 0:1])
    return x8, x8.t().contiguous(), mean, rstd


@norm_cast_amax.register_kernel("cuda")
def _(x, weight, bias, eps, scale, amax, row):
    return run_norm(x, weight, bias, eps, scale, amax[row, 0:1])


@norm_cast_amax.register_fake
def _(x, weight, bias, eps, scale, amax, row):
    m, k = x.shape
    f8 = torch.float8_e4m3fn
    return (x.new_empty((m, k), dtype=f8), x.new_empty((k, m), dtype=f8), x.new_empty((m, 1), dtype=torch.float32),
            x.new_empty((m, 1), dtype=torch.float32))


# which of verify()'s cases each flag's kernels run: (e5m2, gelu, GELU's derivative, scale) for the cast kernel
CASES = {"fp8_cast_kernel": ((False, False, False, 448.0 / 6), (True, False, False, 57344.0 / 6)),
         "fp8_gelu_cast": ((False, True, False, 448.0 / 6), (True, False, True, 57344.0 / 6)), "fp8_norm_cast": ()}


def verify(device, shape=(1000, 1200), flags=FLAGS, fast_erf=False):
    """Run the kernels the flags of `flags` use as training runs them (with the transposed copy): fp8_cast_kernel's
    cast in both float8 formats, fp8_gelu_cast's with GELU in e4m3 and with GELU's derivative in e5m2 (its forward
    and backward), fp8_norm_cast's LayerNorm (_verify_norm), on random bf16 values (a shape its tiles do not divide,
    and two rows more; some values past the range) and compare with reference() (check_pass): None, or a line saying
    what differs. A flag is not refused for a kernel it does not run. fast_erf: GELU's passes with
    the fast erf (gelu_erf='fast'). Leaves the global RNG as it was."""
    flags = (flags,) if isinstance(flags, str) else tuple(flags)
    key = (device, shape, flags, fast_erf)
    if key in _verified:
        return _verified[key]
    gen = torch.Generator(device).manual_seed(0)
    # the shape and two rows more: GELU's pass writes its copy as words where the rows are a multiple of 4 (WORDS)
    rows = (shape[0], shape[0] + 2)
    x_all = (3 * torch.randn((rows[1], shape[1]), device=device, generator=gen)).bfloat16()
    h_all = (3 * torch.randn((rows[1], shape[1]), device=device, generator=gen)).bfloat16()
    problem = None
    for (e5m2, gelu, derivative, scale), n in itertools.product((c for f in flags for c in CASES[f]), rows):
        problem = check_pass(x_all[:n], torch.tensor(scale, device=device), e5m2, gelu,
                             h_all[:n] if derivative else None, fast_erf=fast_erf)
        if problem:
            break
    if problem is None and "fp8_norm_cast" in flags:
        problem = _verify_norm(device, shape, gen)
    _verified[key] = problem
    return problem


def check_pass(x, s, e5m2, gelu, grad, block=None, num_warps=None, words=None, fast_erf=False):
    """run() with the transposed copy on x (bf16; with grad: GELU's derivative at grad) at scale s against
    reference() at the tile (block, num_warps, words: run()'s; None: as shipped): None, or a line saying what
    differs. Each output starts as NaN bytes, so a value the kernel never wrote shows. Without GELU every byte and
    the amax must be equal. With it, Triton's erf and exp and PyTorch's may differ in the last bit (fast_erf: by up
    to 1.5e-7), which moves a byte at a rounding boundary by one float8 step (under 1e-3 of them), and below -3,
    where 1 + erf(h / sqrt 2) cancels in float32, by more: there both stay below the bound GELU (or its derivative)
    has there."""
    device = x.device
    got_amax, want_amax = torch.zeros(1, device=device), torch.zeros(1, device=device)
    want = reference(x, s, want_amax, e5m2, gelu, grad)
    nan = [torch.full(t, 0xFF, dtype=torch.uint8, device=device).view(want.dtype) for t in (x.shape, x.shape[::-1])]
    got, got_t = run(x, s, got_amax, e5m2, gelu=gelu, transpose=True, out=nan, gelu_input=grad, block=block,
                     num_warps=num_warps, words=words, fast_erf=fast_erf)
    moved = (got.view(torch.uint8) != want.view(torch.uint8))
    transposed = (got_t.view(torch.uint8) != got.view(torch.uint8).t()).sum().item()
    wrong = transposed
    if gelu or grad is not None:
        sane = (x if gelu else grad) > -3
        # the cancelled tail: |GELU(x)| <= 0.0041 there, |GELU'(h)| <= 0.0119 (each a quarter added for rounding,
        # and one smallest subnormal, which a smaller value may round up to)
        tail = s * 1.25 * (0.0041 if gelu else 0.0119 * x.float().abs()) + (2 ** -16 if e5m2 else 2 ** -9)
        far = (_code(got) - _code(want)).abs()[sane].max().item() > 1 or moved[sane].float().mean() > 1e-3
        wrong += int(far) + int(not bool((got.float().abs() <= tail)[~sane].all())) + \
            int(not torch.allclose(got_amax, want_amax, rtol=1e-6))
    else:
        wrong += moved.sum().item() + int(not torch.equal(got_amax, want_amax))
    if not wrong:
        return None
    import triton
    what = " after GELU" if gelu else " times GELU's derivative" if grad is not None else ""
    what += " with gelu_erf='fast'" if fast_erf and what else ""
    return (f"Triton {triton.__version__} compiled the cast kernel wrongly on this GPU ({'e5m2' if e5m2 else 'e4m3'}"
            f"{what} at {x.shape[0]} x {x.shape[1]}: {_bytes(moved.sum().item())} from the PyTorch cast, "
            f"{transposed} in the transposed copy from the bytes transposed, amax {got_amax.item():.6g} against "
            f"{want_amax.item():.6g})")


def _verify_norm(device, shape, gen):
    """verify() for run_norm: a float32 residual stream (an offset, a spread, some values past the range after the
    norm), a weight and a bias, against norm_reference(). The two take the row's sums in different orders, so the
    normalized values may differ in float32's last bits, which moves a byte at a rounding boundary by one e4m3 step
    (under 1e-3 of them); the row statistics and the amax within 1e-5."""
    x = 3 * torch.randn(shape, device=device, generator=gen) + 1
    weight = 1 + 0.2 * torch.randn(shape[1], device=device, generator=gen)
    bias = 0.1 * torch.randn(shape[1], device=device, generator=gen)
    s = torch.tensor(448.0 / 4, device=device)
    got_amax, want_amax = torch.zeros(1, device=device), torch.zeros(1, device=device)
    want, want_mean, want_rstd = norm_reference(x, weight, bias, 1e-5, s, want_amax)
    nan = [torch.full(t, 0xFF, dtype=torch.uint8, device=device).view(want.dtype) for t in (shape, shape[::-1])] + \
        [torch.full((shape[0], 1), float("nan"), device=device) for _ in range(2)]
    got, got_t, mean, rstd = run_norm(x, weight, bias, 1e-5, s, got_amax, out=nan)
    moved = got.view(torch.uint8) != want.view(torch.uint8)
    transposed = (got_t.view(torch.uint8) != got.view(torch.uint8).t()).sum().item()
    steps = (_code(got) - _code(want)).abs().max().item()
    wrong = transposed or steps > 1 or moved.float().mean() > 1e-3 or \
        not all(torch.allclose(a, b, rtol=1e-5) for a, b in ((mean, want_mean), (rstd, want_rstd),
                                                              (got_amax, want_amax)))
    if not wrong:
        return None
    import triton
    return (f"Triton {triton.__version__} compiled the LayerNorm cast kernel wrongly on this GPU ("
            f"{_bytes(moved.sum().item())} from the PyTorch LayerNorm and cast, by up to {steps} e4m3 steps, "
            f"{transposed} in the transposed copy from the bytes transposed, amax {got_amax.item():.6g} against "
            f"{want_amax.item():.6g})")


def _bytes(n):
    """'1 byte differs', '3 bytes differ'."""
    return f"{n} byte differs" if n == 1 else f"{n} bytes differ"


def _code(t):
    """float8 bytes (sign and magnitude) as ordered integers: neighbouring values differ by one."""
    b = t.view(torch.uint8).int()
    return torch.where(b >= 128, 128 - b, b)
