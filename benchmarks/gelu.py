"""
GELU's forward and backward alone, compiled, at the MLP's shapes: how close Inductor's kernels come to the copy rate,
and how much of the gap is the exact GELU's erf (libdevice's, fp32).

    python benchmarks/gelu.py                  # the MLP of 124M and 350M at 64 x 1024 tokens, of 774M at 32 x 1024
    python benchmarks/gelu.py --device cpu --eager --shapes 256x512 --iters 2    # the smoke test (tests/test_gelu.py)

Four ways to compute it, each torch.compile'd: exact (F.gelu, erf), tanh (F.gelu(approximate='tanh'), a different
function: GPT-2 was trained with it), and the exact GELU with erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7,
fewer instructions than libdevice's erf; its backward written out, not differentiated through the polynomial),
gelu_erf='fast''s own Triton passes with that erf (speedgpt/features/gelu_pass.py; off a GPU, its PyTorch ops). For
each: milliseconds per call, the share of a plain copy's rate its bytes reach (forward: read x, write y; backward:
read x and dy, write dx), and the largest difference from float32's exact GELU. A Markdown table.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from speedgpt.features import gelu_pass  # noqa: E402
from speedgpt.measure import cuda_time_ms  # noqa: E402



class GeluAS(torch.autograd.Function):
    """x * Phi(x) with Phi by Abramowitz & Stegun 7.1.26 in PyTorch ops (gelu_pass.reference, float32), which
    Inductor compiles into its own kernels; the backward is Phi(x) + x * phi(x), written out."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return gelu_pass.reference(x).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return gelu_pass.reference(x, dy)[0].to(x.dtype)


class GeluPass(torch.autograd.Function):
    """gelu_erf='fast''s own Triton passes (speedgpt/features/gelu_pass.py): its backward writes GELU(x) too, as in
    training (the weight gradient's operand), one tensor more than the other rows' backward here."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return gelu_pass.gelu_fast(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return gelu_pass.gelu_fast_backward(x, dy)[0]


VARIANTS = {"exact": F.gelu, "tanh": lambda t: F.gelu(t, approximate="tanh"), "erf A&S 7.1.26": GeluAS.apply,
            "Triton pass (gelu_erf='fast')": GeluPass.apply}


def measure(shape, device, iters, compiled=True, dtype=torch.bfloat16):
    """Rows (dicts) for one (tokens, width) shape: each variant's forward and backward ms, their share of the copy
    rate, and their largest differences from float32's exact GELU and its gradient."""
    torch.manual_seed(0)
    x = torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)
    out = torch.empty_like(x)
    copy = cuda_time_ms(lambda: out.copy_(x.detach()), 3, iters, device)   # reads and writes one x
    ref = F.gelu(x.float())
    ref_dx, = torch.autograd.grad(ref, x, dy.float())
    rows = []
    for name, f in VARIANTS.items():
        g = torch.compile(f) if compiled else f
        fwd = cuda_time_ms(lambda: g(x.detach()), 3, iters, device)
        both = cuda_time_ms(lambda: torch.autograd.grad(g(x), x, dy), 3, iters, device)
        y = g(x)
        dx, = torch.autograd.grad(y, x, dy)
        rows.append({"shape": "x".join(map(str, shape)), "gelu": name, "fwd_ms": fwd, "bwd_ms": both - fwd,
                     "fwd_copy": copy / fwd, "bwd_copy": 1.5 * copy / max(both - fwd, 1e-9),
                     "err_y": (y.float() - ref).abs().max().item(), "err_dx": (dx.float() - ref_dx).abs().max().item()})
    return rows


def parse_shapes(text):
    """[(tokens, width)] from "65536x3072,65536x4096"; SystemExit in one line for anything else."""
    try:
        shapes = [tuple(int(n) for n in s.split("x")) for s in text.split(",") if s.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise SystemExit(f"error: --shapes {text!r}: give tokens x width of positive numbers, comma-separated "
                         "(e.g. 65536x3072,65536x4096)")
    return shapes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shapes", default="65536x3072,65536x4096,32768x5120", help="tokens x width, comma-separated")
    p.add_argument("--device", default="cuda")
    p.add_argument("--iters", type=int, default=50, help="timed calls (the median is taken)")
    p.add_argument("--eager", action="store_true", help="without torch.compile (the smoke test)")
    args = p.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    if args.iters < 1:
        raise SystemExit(f"error: --iters {args.iters}: time at least one call")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise SystemExit(f"error: --device {args.device!r}: give cuda, cuda:N or cpu") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device: add --device cpu (the CPU's rates say nothing of a GPU's)")
    rows = [r for s in shapes for r in measure(s, device, args.iters, not args.eager)]
    print("| tokens x width | GELU | forward ms | backward ms | forward / copy rate | backward / copy rate "
          "| max diff y | max diff dx |\n|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['gelu']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | {r['fwd_copy']:.2f} | "
              f"{r['bwd_copy']:.2f} | {r['err_y']:.1e} | {r['err_dx']:.1e} |")
    return rows


if __name__ == "__main__":
    main()
