"""
The LM head + cross-entropy, forward + backward, at config/fast.py's micro-batch: 65,536 tokens x 768 ->
50,304 in bf16 autocast, with the float32 weight and hidden state of model.py's training step. What each
way of computing the loss costs, per micro-batch (fast.py runs 8 per optimizer step).

    python benchmarks/head_ce.py [--tokens 65536] [--n_embd 768] [--vocab 50304] [--iters 20]

Variants (each checked against the compiled baseline: loss and both gradients, relative error printed):
  GEMMs only         the three bf16 matmuls alone (logits, grad of the hidden state, grad of the weight): the floor
  compiled baseline  model.py's loss path under torch.compile: F.linear, then F.cross_entropy(sum) / count
  fused_ce, chunk N  fused_ce.py's LinearCrossEntropy (config fused_ce): the loss and both gradients computed in the
                     forward, N tokens at a time (Liger-Kernel's fused linear cross-entropy does this), each chunk's
                     logits -> softmax - one-hot -> two GEMMs; the backward only scales the stored gradients
  fused_ce in FP8    the same with its three matmuls in float8 (fp8_head + fused_ce: fused_ce.fp8_mm, torchao's
                     tensorwise scaling, torch._scaled_mm); with head_kernel, its softmax pass in Triton
  FP8 head           torchao Float8Linear (tensorwise / rowwise) for the head, then the compiled cross-entropy;
                     tensorwise also with the cross-entropy's gradient made in its forward (CrossEntropyGradInForward)
Timing: CUDA events, median of --iters calls after 5 warm-up calls, gradients set to None before each call
(as the optimizer's zero_grad does). Measured before on the H200 (BENCHMARKS.md): GEMMs 22.4 ms, compiled
baseline 30.7, liger-kernel 32.0, cut-cross-entropy 44.5, FP8 tensorwise 26.1, rowwise 29.8.
"""
import argparse
import importlib.util
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from speedgpt.measure import cuda_time_ms as time_ms        # noqa: E402
from speedgpt.features.fused_ce import LinearCrossEntropy            # noqa: E402


def loss_baseline(h, w, y):
    """model.py's loss: (tokens, C) hidden, (V, C) weight, (tokens,) targets with -1 ignored."""
    return F.cross_entropy(F.linear(h, w), y, ignore_index=-1, reduction="sum") / (y != -1).sum().clamp(min=1)


def fused_loss(chunk, vocab_size, fp8=False, kernel=False):
    """train.py's fused_ce path: LinearCrossEntropy, `chunk` tokens at a time (fp8: fp8_head's float8 matmuls;
    kernel: their softmax pass in speedgpt/features/softmax_pass.py's Triton kernels, head_kernel)."""
    return lambda h, w, y: (LinearCrossEntropy.apply(h, w, y, vocab_size, chunk, fp8, kernel)
                            / (y != -1).sum().clamp(min=1))


class CrossEntropyGradInForward(torch.autograd.Function):
    """The cross-entropy alone (for a head that is not a plain matmul, e.g. torchao's Float8Linear):
    the softmax - one-hot gradient made in the forward, stored in the logits' dtype, scaled in the
    backward (where torch.compile may fuse the scaling into the FP8 cast of the head's backward)."""

    @staticmethod
    def forward(ctx, logits, y, vocab_size):
        col = torch.arange(logits.size(1), device=logits.device)
        acc = torch.promote_types(logits.dtype, torch.float32)
        lf = logits.to(acc).masked_fill(col >= vocab_size, float("-inf"))
        lse = torch.logsumexp(lf, dim=-1)
        valid = y != -1
        loss = torch.where(valid, lse - lf.gather(1, y.clamp(min=0)[:, None])[:, 0], 0.0).sum()
        g = ((torch.exp(lf - lse[:, None]) - (col == y[:, None]).to(acc)) * valid[:, None]).to(logits.dtype)
        ctx.save_for_backward(g)
        return loss

    @staticmethod
    def backward(ctx, grad):
        return ctx.saved_tensors[0] * grad, None, None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--only", default="", help="run only the variants whose name contains one of these "
                   "|-separated strings (the first variant timed is the reference of the errors)")
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
    for chunk in (8192, 16384, 32768, 65536):
        variants.append((f"fused_ce, chunk {chunk} (fused_ce.LinearCrossEntropy)", None,
                         torch.compile(fused_loss(chunk, V))))
    try:
        from torchao.float8 import Float8LinearConfig
        for chunk in (16384, 65536):
            variants.append((f"fused_ce in FP8 (fp8_head), chunk {chunk}", None,
                             torch.compile(fused_loss(chunk, V, fp8=True))))
            if importlib.util.find_spec("triton") is not None:
                import speedgpt.features.softmax_pass  # noqa: F401  (registers the kernels' op)
                variants.append((f"fused_ce in FP8, chunk {chunk}, softmax pass in Triton (head_kernel)", None,
                                 torch.compile(fused_loss(chunk, V, fp8=True, kernel=True))))
        from torchao.float8.float8_linear import Float8Linear
        for recipe in ("tensorwise", "rowwise"):
            lin = torch.nn.Linear(C, V, bias=False, device="cuda")
            lin.weight = w                                                   # the same Parameter, as tying keeps it
            fp8 = Float8Linear.from_float(lin, config=Float8LinearConfig.from_recipe_name(recipe))
            ce = lambda h, w, y, fp8=fp8: (F.cross_entropy(fp8(h), y, ignore_index=-1, reduction="sum")
                                           / (y != -1).sum().clamp(min=1))
            variants.append((f"FP8 {recipe} head + compiled CE (torchao)", None, torch.compile(ce)))
            if recipe == "tensorwise":
                ce_fwd = lambda h, w, y, fp8=fp8: (CrossEntropyGradInForward.apply(fp8(h), y, V)
                                                   / (y != -1).sum().clamp(min=1))
                variants.append(("FP8 tensorwise head + CE gradient in the forward", None, torch.compile(ce_fwd)))
    except ImportError as e:
        print(f"FP8 variants not run: {e}")

    if args.only:
        variants = [v for v in variants if any(word in v[0] for word in args.only.split("|"))]
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
