"""
Which of a GPT-2 block's Linear layers gain from FP8, per kind and width: torchao's Float8Linear, tensorwise
and rowwise, against bf16 autocast, forward + backward, each compiled with the op that feeds it in the
model (so torch.compile can fuse the amax and cast passes into it, as it does inside the compiled GPT):

  qkv        LayerNorm (fp32 residual in) -> Linear C -> 3C
  attn_proj  attention output (bf16)      -> Linear C -> C
  fc         LayerNorm (fp32 residual in) -> Linear C -> 4C
  mlp_proj   GELU of fc's output (bf16)   -> Linear 4C -> C

at each GPT-2 size's width and the tokens of its side-by-side micro-batch (124M: 768 and 64 x 1024 tokens;
350M: 1024, 32 x 1024; 774M: 1280, 16 x 1024; 1.5B: 1600, 16 x 1024). Weights are float32 parameters
as in training (autocast casts them). Timing: CUDA events, median of --iters calls after 5 warm-up calls.
One profiled call per variant counts its kernels: Triton kernels are the fused elementwise / reduction
work (LayerNorm, GELU, and for FP8 the amax and casts), the rest are the GEMMs (cuBLAS / CUTLASS).

    python benchmarks/fp8_linears.py [--widths 768,1024,1280,1600] [--iters 20] [--json rows.jsonl]

Needs a GPU of compute capability 8.9+ (Ada, Hopper) and torchao.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from speedgpt.measure import cuda_time_ms  # noqa: E402

TOKENS = {768: 64 * 1024, 1024: 32 * 1024, 1280: 16 * 1024, 1600: 16 * 1024}    # side_by_side.sh's micro-batches
KINDS = ("qkv", "attn_proj", "fc", "mlp_proj")


def layer(kind, C, recipe):
    """(module, input dtype): the Linear of `kind` at width C behind the op that feeds it, compiled;
    recipe 'bf16' (autocast) or a torchao Float8Linear recipe ('tensorwise', 'rowwise')."""
    fan_in, fan_out = {"qkv": (C, 3 * C), "attn_proj": (C, C), "fc": (C, 4 * C), "mlp_proj": (4 * C, C)}[kind]
    pre = {"qkv": nn.LayerNorm(C, bias=False), "fc": nn.LayerNorm(C, bias=False), "attn_proj": nn.Identity(),
           "mlp_proj": nn.GELU()}[kind]
    m = nn.Sequential(pre, nn.Linear(fan_in, fan_out, bias=False)).cuda()
    if recipe == "rowwise_bf16_wgrad":                   # speedgpt/features/fp8.py's own: no torchao
        from speedgpt.features.fp8 import RowwiseFloat8Linear
        m[1].__class__ = RowwiseFloat8Linear
    elif recipe != "bf16":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe))
    return torch.compile(m), (torch.float32 if kind in ("qkv", "fc") else torch.bfloat16), (fan_in, fan_out)


def measure(kind, C, recipe, iters):
    """Median ms of forward + backward, and (kernels, Triton kernels, Triton ms) of one profiled call."""
    m, dtype, (fan_in, fan_out) = layer(kind, C, recipe)
    n = TOKENS[C]
    x = torch.randn(n, fan_in, device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(n, fan_out, device="cuda", dtype=torch.bfloat16)

    def step():
        x.grad = None
        for p in m.parameters():
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        y.backward(gy)
    ms = cuda_time_ms(step, warmup=5, iters=iters)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    triton = [e for e in kernels if e.name.startswith("triton")]
    flops = 6 * n * fan_in * fan_out
    return dict(kind=kind, width=C, fan_in=fan_in, fan_out=fan_out, tokens=n, recipe=recipe, ms=round(ms, 4),
                tflops=round(flops / ms / 1e9, 1), kernels=len(kernels), triton_kernels=len(triton),
                triton_ms=round(sum(e.device_time for e in triton) / 1e3, 4))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="768,1024,1280,1600")
    ap.add_argument("--recipes", default="bf16,tensorwise,rowwise,rowwise_bf16_wgrad",
                    help="bf16 first; torchao's recipe names, and rowwise_bf16_wgrad (speedgpt/features/fp8.py's)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default="", help="also write every row as JSON lines here")
    args = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 256      # one compiled graph per variant
    rows, recipes = [], args.recipes.split(",")
    others = [r for r in recipes if r != "bf16"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; fwd+bwd ms (TFLOP/s) and speedup vs bf16; "
          "then per FP8 recipe: kernels / Triton kernels / Triton ms of one call")
    print("| width | kind | in -> out | tokens | bf16 ms | " + " | ".join(f"{r} ms | x" for r in others) + " | "
          + " | ".join(f"{r} kernels" for r in others) + " |")
    print("|---:|---|---|---:|---:|" + "---:|---:|" * len(others) + "---|" * len(others))
    for C in map(int, args.widths.split(",")):
        for kind in KINDS:
            r = {}
            for rec in recipes:
                try:
                    r[rec] = measure(kind, C, rec, args.iters)
                except Exception as e:        # a recipe that cannot run here: say why, keep the others
                    print(f"  {kind} {C} {rec}: failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
            rows += r.values()
            b = r["bf16"]
            cols = [f"{r[x]['ms']:.3f} ({r[x]['tflops']:.0f}) | {b['ms'] / r[x]['ms']:.2f}x" if x in r else " | "
                    for x in others]
            kern = [f"{r[x]['kernels']}/{r[x]['triton_kernels']}/{r[x]['triton_ms']:.3f}" if x in r else ""
                    for x in others]
            print(f"| {C} | {kind} | {b['fan_in']} -> {b['fan_out']} | {b['tokens']:,} | {b['ms']:.3f} ({b['tflops']:.0f}) | "
                  + " | ".join(cols) + " | " + " | ".join(kern) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
