"""
The LM head + cross-entropy, forward + backward, at config/fast.py's micro-batch: 65,536 tokens x 768 ->
50,304 in bf16 autocast, with the float32 weight and hidden state of model.py's training step. What each
way of computing the loss costs, per micro-batch (fast.py runs 8 per optimizer step).

    python benchmarks/head_ce.py [--tokens 65536] [--n_embd 768] [--vocab 50304] [--iters 20]

Variants (each checked against the compiled baseline: loss and both gradients, relative error printed):
  GEMMs only         the three bf16 matmuls alone (logits, grad of the hidden state, grad of the weight): the floor
  compiled baseline  model.py's loss path under torch.compile: F.linear, then F.cross_entropy(sum) / count
  chunked N          a custom autograd Function that computes the loss and both gradients chunk by chunk of N
                     tokens in the forward (Liger-Kernel's fused linear cross-entropy does this), each chunk's
                     logits -> softmax - one-hot -> two GEMMs compiled as one function: the (tokens, vocab)
                     float32 logits never exist and the backward only scales the stored gradients
  FP8 head           torchao Float8Linear (tensorwise / rowwise) for the head, then the compiled cross-entropy
Timing: CUDA events, median of --iters calls after 5 warm-up calls, gradients set to None before each call
(as the optimizer's zero_grad does). Measured before on the H200 (../shared/GPU.md): GEMMs 22.4 ms, compiled
baseline 30.7, liger-kernel 32.0, cut-cross-entropy 44.5, FP8 tensorwise 26.1, rowwise 29.8.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from measure import cuda_time_ms as time_ms                 # noqa: E402


def loss_baseline(h, w, y):
    """model.py's loss: (tokens, C) hidden, (V, C) weight, (tokens,) targets with -1 ignored."""
    return F.cross_entropy(F.linear(h, w), y, ignore_index=-1, reduction="sum") / (y != -1).sum().clamp(min=1)


def ce_chunk(h, w, y):
    """One chunk: the summed cross-entropy of logits h @ w.T and its gradients with respect to h and w
    (softmax minus one-hot; zero rows for ignored targets). h (n, C), w (V, C), both in the compute dtype."""
    logits = (h @ w.t()).to(torch.promote_types(h.dtype, torch.float32))     # (n, V), float32 for bf16
    lse = torch.logsumexp(logits, dim=-1)
    valid = y != -1
    target_logit = logits.gather(1, y.clamp(min=0)[:, None])[:, 0]
    loss = torch.where(valid, lse - target_logit, 0.0).sum()
    one_hot = torch.arange(w.size(0), device=y.device)[None, :] == y[:, None]
    g = ((torch.exp(logits - lse[:, None]) - one_hot.to(logits.dtype)) * valid[:, None].to(logits.dtype)).to(h.dtype)
    return loss, g @ w, g.t() @ h                                            # loss, (n, C), (V, C)


class ChunkedLinearCE(torch.autograd.Function):
    """mean cross-entropy of (h @ w.T) over targets != -1, with both gradients computed in the forward,
    `chunk` tokens at a time in `dtype` (the weight's gradient accumulated in float32)."""

    @staticmethod
    def forward(ctx, h, w, y, chunk, dtype, step):
        hc, wc = h.to(dtype), w.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)                     # float32 sums for bf16
        gh = torch.empty_like(hc)
        gw = torch.zeros_like(w, dtype=acc)
        loss = torch.zeros((), dtype=acc, device=h.device)
        for s in range(0, h.size(0), chunk):
            l, gh[s:s + chunk], gw_c = step(hc[s:s + chunk], wc, y[s:s + chunk])
            loss += l
            gw += gw_c
        count = (y != -1).sum().clamp(min=1)
        ctx.save_for_backward(gh, gw, count)
        ctx.h_dtype, ctx.w_dtype = h.dtype, w.dtype
        return loss / count

    @staticmethod
    def backward(ctx, grad):
        gh, gw, count = ctx.saved_tensors
        scale = grad / count
        return (gh * scale).to(ctx.h_dtype), (gw * scale).to(ctx.w_dtype), None, None, None, None


def chunked_loss(chunk, dtype=torch.bfloat16, step=ce_chunk):
    return lambda h, w, y: ChunkedLinearCE.apply(h, w, y, chunk, dtype, step)




def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: head_ce.py times CUDA kernels: it needs a GPU")
    N, C, V = args.tokens, args.n_embd, args.vocab
    torch.manual_seed(0)
    h = torch.randn(N, C, device="cuda", requires_grad=True)                 # ln_f's output: float32
    w = torch.nn.Parameter(0.02 * torch.randn(V, C, device="cuda"))         # the tied weight: float32
    y = torch.randint(0, 50257, (N,), device="cuda").clamp(max=V - 1)
    y[::97] = -1                                                             # ignored targets, as at each EOT
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)

    def step(loss_fn, weight=None):
        def run():
            h.grad = w.grad = None
            with autocast:
                loss = loss_fn(h, w if weight is None else weight, y)
            loss.backward()
            return loss
        return run

    hb, wb = h.detach().bfloat16(), w.detach().bfloat16()
    gl = torch.randn(N, V, device="cuda", dtype=torch.bfloat16)

    def gemms():
        hb @ wb.t(), gl @ wb, gl.t() @ hb

    variants = [("GEMMs only (floor)", gemms, None),
                ("compiled baseline (model.py)", None, torch.compile(loss_baseline))]
    compiled_chunk = torch.compile(ce_chunk)
    for chunk in (8192, 16384, 65536):
        variants.append((f"chunked {chunk}, gradients in the forward", None, chunked_loss(chunk, step=compiled_chunk)))
    try:
        from torchao.float8 import Float8LinearConfig
        from torchao.float8.float8_linear import Float8Linear
        for recipe in ("tensorwise", "rowwise"):
            lin = torch.nn.Linear(C, V, bias=False, device="cuda")
            lin.weight = w                                                   # the same Parameter, as tying keeps it
            fp8 = Float8Linear.from_float(lin, config=Float8LinearConfig.from_recipe_name(recipe))
            ce = lambda h, w, y, fp8=fp8: F.cross_entropy(fp8(h), y, ignore_index=-1, reduction="sum") / (y != -1).sum().clamp(min=1)
            variants.append((f"FP8 {recipe} head + compiled CE (torchao)", None, torch.compile(ce)))
    except ImportError as e:
        print(f"FP8 variants not run: {e}")

    print(f"{N:,} tokens x {C} -> {V:,}, bf16 autocast, forward + backward, median of {args.iters}")
    ref = None
    rows = []
    for name, raw, loss_fn in variants:
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        try:
            fn = raw or step(loss_fn)
            ms = time_ms(fn, iters=args.iters)
            check = ""
            if loss_fn is not None:
                loss = fn()
                got = (loss.item(), h.grad.clone(), w.grad.clone())
                if ref is None:
                    ref = got
                else:
                    rel = lambda a, b: ((a - b).norm() / b.norm()).item()
                    check = (f"loss {abs(got[0] - ref[0]) / abs(ref[0]):.1e}, grad h {rel(got[1], ref[1]):.1e}, "
                             f"grad w {rel(got[2], ref[2]):.1e}")
            rows.append((name, f"{ms:.2f}", check))
        except Exception as e:                     # a variant that cannot run here
            rows.append((name, "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"))
        print(f"  {rows[-1][0]}: {rows[-1][1]} ms {rows[-1][2]}", flush=True)
    print("\n| variant | ms fwd+bwd | relative error vs compiled baseline |\n|---|---:|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
