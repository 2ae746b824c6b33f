"""
One FP8 cast of a block Linear's input, alone and compiled with the op that makes it, in each way of finding its
scale: how many passes over the activations each costs, and so which way a recipe should take.

    python benchmarks/fp8_cast.py [--producers gelu]   # 774M's shapes: 32 x 1024 tokens, 1280 wide (MLP 5120)
    python benchmarks/fp8_cast.py --device cpu --eager --tokens 64 --width 32 --iters 1   # the smoke test
    python benchmarks/fp8_cast.py --tiles [--tokens 65536 --width 768]   # our GELU passes at each tile of TILES
    python benchmarks/fp8_cast.py --tiles --fast_erf     # each tile with the fast erf too (gelu_erf='fast')

--tiles times fp8_gelu_cast's two passes (GELU's forward, e4m3; its derivative, e5m2; the transposed copy written,
as words or byte by byte) at each tile of TILES, each first checked against the PyTorch reference at the shape
timed (cast_kernel.check_pass: a tile ptxas compiles wrongly prints what differs instead of a time). The tile that
ships is cast_kernel's WORD_TILE (forward) and BYTE_TILE, BYTE_WARPS (backward). On a CPU it runs in Triton's
interpreter (TRITON_INTERPRET=1), whose float8 rounding is not a GPU's: there only the transposed copy is checked
(the bytes transposed), and the times say nothing of a GPU's.

Producers (what makes the tensor cast): `layernorm` (LayerNorm of a bf16 residual, the qkv and fc inputs), `gelu`
(GELU of the fc output, mlp_proj's input, 4x wide), `plain` (a bf16 tensor as is: the attention output),
`gelu_backward` (GELU's derivative times the gradient of its output, fc's output gradient, 4x wide: two inputs
read, stacked as one tensor of twice the rows; the backward casts it to e5m2, here e4m3 as the others, the same
bytes). Ways:

  bf16 out              the producer alone, writing bf16: what the step pays without FP8
  dynamic               torchao's tensorwise cast: amax = max |y| over the tensor, then y * (448 / amax) to e4m3
  dynamic, per row      the same scale with the amax taken per row, then over rows (fp8_recipe=tensorwise_fused)
  dynamic, two graphs   per-row amax in one compiled call, the cast in a second (nothing for Inductor to merge)
  rowwise               one scale per row (fp8_recipe=rowwise_bf16_wgrad): the amax is the producer's own row
  delayed + amax        the scale given (the previous step's amax), the cast and this step's amax in one call
  delayed + amax, transposed too
                        the same and the float8 copy transposed, which the weight gradient's GEMM takes (the
                        backward's dy and, with fp8_cast_kernel, the forward's input)
  delayed + row amax    the same, the amax kept per row (a vector out; its max taken later)
  delayed, no amax      the cast alone at a given scale: the floor of any delayed recipe
  delayed, amax of the float8 (two graphs)
                        the cast at a given scale, then this step's amax from the float8 bytes (1 byte per element
                        read, the value known to e4m3's precision; a saturated cast says only "at least")
  delayed + amax, Triton (ours)
                        the producer, the cast and the amax in one kernel of our own (speedgpt/features/
                        cast_kernel.py, the flag fp8_cast_kernel: 2-D tiles, each tile's max folded in with one
                        atomic max), for gelu, plain and gelu_backward; needs Triton on a GPU; and the same
                        with the transposed copy written in the same pass (what fp8_cast_kernel and
                        fp8_gelu_cast run in training; gelu's as 32-bit words, as shipped, and byte by
                        byte, as the other passes write it); for layernorm fp8_norm_cast's kernel (whole rows, the
                        transposed copy and the row statistics; as it ships, and at 32 rows a program). Every
                        input here is bf16; in training the LayerNorm reads the float32 residual stream

Each row: milliseconds per call (median, CUDA events), and the producer's bytes (its inputs read, one byte per
element written) over that time as a share of a plain copy's rate measured here. A Markdown table.
"""
import argparse
import importlib.util
import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from speedgpt.features import cast_kernel  # noqa: E402
from speedgpt.measure import cuda_time_ms  # noqa: E402

E4M3 = torch.float8_e4m3fn
FP8_MAX = 448.0


def producers(width):
    """{name: (function of the input tensor, its width, inputs stacked in it)}: the ops that make the tensors a
    block Linear casts. gelu_backward's input is the gradient of GELU's output over GELU's input (2 x rows)."""
    return {"layernorm": (lambda x: F.layer_norm(x, (x.size(-1),)), width, 1), "gelu": (F.gelu, 4 * width, 1),
            "plain": (lambda x: x, width, 1),
            "gelu_backward": (lambda x: torch.ops.aten.gelu_backward(*x.chunk(2)), 4 * width, 2)}


def cast(y, scale):
    """y * scale to e4m3, saturating (torchao's to_fp8_saturated)."""
    return (y.float() * scale).clamp(-FP8_MAX, FP8_MAX).to(E4M3)


def ways(make):
    """{way: function(input, scale) -> output(s)} for the producer `make` (the two-graph way: measure())."""
    def dynamic(x, s):
        y = make(x)
        return cast(y, FP8_MAX / y.abs().max().float().clamp(min=1e-12))

    def per_row(x, s):
        y = make(x)
        return cast(y, FP8_MAX / y.abs().amax(dim=-1).amax().float().clamp(min=1e-12))

    def rowwise(x, s):
        y = make(x)
        return cast(y, FP8_MAX / y.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12))

    def delayed_amax(x, s):
        y = make(x)
        return cast(y, s), y.abs().max()

    def delayed_amax_transposed(x, s):
        y = make(x)
        y8 = cast(y, s)
        return y8, y8.t().contiguous(), y.abs().max()

    def delayed_row_amax(x, s):
        y = make(x)
        return cast(y, s), y.abs().amax(dim=-1)

    return {"bf16 out": lambda x, s: make(x), "dynamic": dynamic, "dynamic, per row": per_row, "rowwise": rowwise,
            "delayed + amax": delayed_amax, "delayed + amax, transposed too": delayed_amax_transposed,
            "delayed + row amax": delayed_row_amax,
            "delayed, no amax": lambda x, s: cast(make(x), s)}


def amax_of_float8(y8, scale):
    """The amax of the tensor y8 = cast(y, scale) was cast from, read from y8's bytes: e4m3's magnitude orders as its
    low 7 bits do, so the largest byte is the largest |y8|; divided by scale (to e4m3's precision; a saturated
    y8 says only that the amax is at least FP8_MAX / scale)."""
    top = (y8.view(torch.uint8) & 0x7F).amax()
    return top.view(E4M3).float() / scale


def bytes_only(f):
    """f() with cast_kernel's transposed copy written byte by byte (WORDS off)."""
    words, cast_kernel.WORDS = cast_kernel.WORDS, False
    try:
        return f()
    finally:
        cast_kernel.WORDS = words


def measure(tokens, width, device, iters, compiled=True, names=None):
    """Rows (dicts): producer, way, ms, share of the copy rate; for the producers `names` (default all)."""
    torch.manual_seed(0)
    compile_ = torch.compile if compiled else (lambda f: f)
    rows = []
    for pname, (make, w, inputs) in producers(width).items():
        if names and pname not in names:
            continue
        x = torch.randn(inputs * tokens, w, device=device, dtype=torch.bfloat16)
        scale = torch.tensor(FP8_MAX / 5.0, device=device)
        out = torch.empty_like(x)
        copy = cuda_time_ms(lambda: out.copy_(x), 3, iters, device)          # 4 bytes per element moved
        fns = {name: compile_(f) for name, f in ways(make).items()}
        row_amax = compile_(lambda x: make(x).abs().amax(dim=-1))
        cast_rows = compile_(lambda x, r: cast(make(x), FP8_MAX / r.amax().float().clamp(min=1e-12)))
        fns["dynamic, two graphs"] = lambda x, s: cast_rows(x, row_amax(x))
        cast_only, of_float8 = compile_(lambda x, s: cast(make(x), s)), compile_(amax_of_float8)
        fns["delayed, amax of the float8 (two graphs)"] = lambda x, s: of_float8(cast_only(x, s), s)
        triton = device.type == "cuda" and importlib.util.find_spec("triton")
        if pname == "layernorm" and triton:     # fp8_norm_cast's kernel: it always writes the transposed copy
            amax = torch.zeros((), device=device)
            fns["delayed + amax, transposed too, Triton (ours)"] = \
                lambda x, s: cast_kernel.run_norm(x, None, None, 1e-5, s, amax)
            fns["delayed + amax, transposed too, Triton (ours), 32 rows a program, 16 warps"] = \
                lambda x, s: cast_kernel.run_norm(x, None, None, 1e-5, s, amax, block_m=32, num_warps=16)
        if pname != "layernorm" and triton:
            amax = torch.zeros((), device=device)
            ours = dict(gelu=pname == "gelu")
            if pname == "gelu_backward":      # x[:tokens] the gradient, x[tokens:] GELU's input: contiguous halves
                ours = dict(gelu_input=x[tokens:])
            fns["delayed + amax, Triton (ours)"] = lambda x, s: cast_kernel.run(x[:tokens], s, amax, **ours)
            fns["delayed + amax, transposed too, Triton (ours)"] = \
                lambda x, s: cast_kernel.run(x[:tokens], s, amax, transpose=True, **ours)
            if pname == "gelu":               # its copy as shipped is 32-bit words; byte by byte as the other passes
                fns["delayed + amax, transposed too, Triton (ours), byte by byte"] = \
                    lambda x, s: bytes_only(lambda: cast_kernel.run(x[:tokens], s, amax, transpose=True, **ours))
        for name, f in fns.items():
            ms = cuda_time_ms(lambda: f(x, scale), 3, iters, device)
            written = 2 if name == "bf16 out" or "transposed too" in name else 1      # bytes per element
            rows.append({"producer": pname, "shape": f"{tokens}x{w}", "way": name, "ms": ms,
                         "copy_share": copy * (2 * inputs + written) / (4 * inputs) / ms})
    return rows


# (pass, words, (rows, columns), warps): the ones that ship first; rows a multiple of 4 (and rows / 4 a power of 2)
# with words
TILES = [("gelu", True, (64, 128), 4), ("gelu", True, (64, 128), 8), ("gelu", True, (128, 128), 8),
         ("gelu", True, (128, 64), 4), ("gelu", True, (32, 128), 4), ("gelu", True, (64, 256), 8),
         ("gelu", True, (128, 256), 8), ("gelu", True, (256, 128), 8), ("gelu", False, (64, 64), 4),
         ("gelu", False, (32, 64), 8),
         ("gelu_backward", False, (32, 64), 8), ("gelu_backward", False, (32, 64), 4),
         ("gelu_backward", False, (64, 64), 8), ("gelu_backward", False, (32, 128), 8),
         ("gelu_backward", False, (16, 128), 4), ("gelu_backward", True, (64, 128), 4),
         ("gelu_backward", True, (64, 128), 8), ("gelu_backward", True, (128, 128), 8),
         ("gelu_backward", True, (32, 128), 4), ("gelu_backward", True, (128, 64), 4)]


def tile_check(device):
    """check_pass's signature: on a GPU check_pass itself; in Triton's interpreter (a CPU), whose float8 rounding is
    not a GPU's, the transposed copy alone against the bytes transposed."""
    if device.type == "cuda":
        return cast_kernel.check_pass

    def copy_only(x, s, e5m2, gelu, grad, block, warps, words, fast_erf=False):
        out, out_t = cast_kernel.run(x, s, torch.zeros(1), e5m2, gelu=gelu, transpose=True, gelu_input=grad,
                                     block=block, num_warps=warps, words=words, fast_erf=fast_erf)
        n = (out_t.view(torch.uint8) != out.view(torch.uint8).t()).sum().item()
        return f"{n} bytes of the transposed copy differ from the bytes transposed" if n else None
    return copy_only


def tiles(tokens, width, device, iters, erfs=(False,)):
    """Rows (dicts) of TILES at tokens x 4 width, each tile once per entry of erfs (fast_erf: False, True): pass,
    tile, warps, words, erf, ms (None where tile_check found the bytes wrong), share of the copy rate, what differs."""
    torch.manual_seed(0)
    w, rows = 4 * width, []
    x, h = ((3 * torch.randn(tokens, w, device=device)).bfloat16() for _ in range(2))
    out = torch.empty_like(x)
    copy = cuda_time_ms(lambda: out.copy_(x), 3, iters, device)
    amax = torch.zeros(1, device=device)
    for (name, words, block, warps), fast in itertools.product(TILES, erfs):
        e5m2, grad = name == "gelu_backward", h if name == "gelu_backward" else None
        s = torch.tensor(57344.0 / 6 if e5m2 else 448.0 / 6, device=device)
        erf = {"fast_erf": True} if fast else {}
        kw = dict(gelu=grad is None, gelu_input=grad, block=block, num_warps=warps, words=words, **erf)
        problem = tile_check(device)(x, s, e5m2, grad is None, grad, block, warps, words, **erf)
        ms = None if problem else cuda_time_ms(lambda: cast_kernel.run(x, s, amax, e5m2, transpose=True, **kw),
                                               3, iters, device)
        moved = 2 + (2 if grad is not None else 0) + 2           # bytes per element: read, read h, two float8 out
        rows.append({"pass": name, "shape": f"{tokens}x{w}", "block": block, "tile": f"{block[0]} x {block[1]}",
                     "warps": warps, "words": words, "erf": "fast" if fast else "exact", "ms": ms,
                     "copy_share": ms and copy * moved / 4 / ms, "problem": problem})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tokens", type=int, default=32 * 1024)
    p.add_argument("--width", type=int, default=1280, help="n_embd (GELU's input is 4x this)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--iters", type=int, default=20, help="timed calls (the median is taken)")
    p.add_argument("--eager", action="store_true", help="without torch.compile (the smoke test)")
    p.add_argument("--producers", default="layernorm,gelu,plain,gelu_backward",
                   help="comma-separated: " + ", ".join(producers(1)))
    p.add_argument("--tiles", action="store_true", help="our GELU passes at each tile of TILES, --tokens a multiple "
                   "of 4 (needs Triton; on a CPU its interpreter, TRITON_INTERPRET=1)")
    p.add_argument("--fast_erf", action="store_true", help="with --tiles: each tile with the fast erf "
                   "(gelu_erf='fast') too, a row after the exact erf's")
    args = p.parse_args(argv)
    bad = [f"--{k} {getattr(args, k)}" for k in ("tokens", "width", "iters") if getattr(args, k) < 1]
    if bad:
        raise SystemExit(f"error: {', '.join(bad)}: each must be at least 1")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "cpu"):
        raise SystemExit(f"error: --device {args.device!r}: cuda, cuda:N or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device: add --device cpu (the CPU's rates say nothing of a GPU's)")
    names = [n.strip() for n in args.producers.split(",") if n.strip()]
    unknown = sorted(set(names) - set(producers(1)))
    if unknown or not names:
        raise SystemExit(f"error: --producers {args.producers!r}: unknown {', '.join(unknown) or 'empty'}; "
                         f"the producers are {', '.join(producers(1))}")
    if args.fast_erf and not args.tiles:
        raise SystemExit("error: --fast_erf times our GELU passes with the fast erf (gelu_erf='fast'): add "
                         "--tiles")
    if args.tiles:
        given = [f for f, on in (("--producers", args.producers != p.get_default("producers")),
                                 ("--eager", args.eager)) if on]
        if given:
            raise SystemExit("error: --tiles times the two GELU passes alone, not compiled: drop "
                             + " and ".join(given))
        if args.tokens % 4:
            raise SystemExit(f"error: --tokens {args.tokens}: --tiles writes the forward's copy as 32-bit words, four "
                             "rows each: give a multiple of 4 (every training run's micro-batch is)")
        if not importlib.util.find_spec("triton"):
            raise SystemExit("error: --tiles times our Triton kernels: pip install triton (CUDA builds of torch bring "
                             "it; on a CPU add TRITON_INTERPRET=1 for its interpreter)")
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("error: --tiles on a CPU runs Triton's interpreter: set TRITON_INTERPRET=1 (its times "
                             "and float8 rounding say nothing of a GPU's), or run it on a CUDA GPU")
        rows = tiles(args.tokens, args.width, device, args.iters, (False, True) if args.fast_erf else (False,))
        if device.type == "cpu":
            print("Triton's interpreter: the transposed copy checked, not the bytes; times not a GPU's")
        shipped = {("gelu", cast_kernel.WORD_TILE[:2], cast_kernel.WORD_TILE[2], True),
                   ("gelu_backward", cast_kernel.BYTE_TILE, cast_kernel.BYTE_WARPS, False)}
        print("| pass | rows x columns | tile (rows x columns) | warps | transposed copy | erf | ms | share of the "
              "copy rate |\n|---|---|---|---:|---|---|---:|---:|")
        for r in rows:
            mark = " (ships)" if (r["pass"], r["block"], r["warps"], r["words"]) in shipped else ""
            cells = (f"{r['ms']:.3f} | {r['copy_share']:.2f}" if r["ms"] is not None else
                     f"wrong: {r['problem']} |")
            print(f"| {r['pass']} | {r['shape']} | {r['tile']}{mark} | {r['warps']} | "
                  f"{'words' if r['words'] else 'bytes'} | {r['erf']} | {cells} |")
        return rows
    rows = measure(args.tokens, args.width, device, args.iters, not args.eager, names)
    print("| producer | tokens x width | way | ms | share of the copy rate |\n|---|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['producer']} | {r['shape']} | {r['way']} | {r['ms']:.3f} | {r['copy_share']:.2f} |")
    return rows


if __name__ == "__main__":
    main()
