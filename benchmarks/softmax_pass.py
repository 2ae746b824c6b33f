"""
The FP8 head's softmax pass alone: speedgpt/features/softmax_pass.py's Triton kernels (head_kernel=True), each
tile shape of a sweep, against the same math in PyTorch ops compiled by torch.compile (what the head runs
without the flag), and the floor: the pass's bytes at the bandwidth of a plain device-to-device copy
measured in the same process.

    python benchmarks/softmax_pass.py [--rows 65536,16384] [--vocab 50304] [--sweep] [--iters 20]

The pass reads the bf16 logits (n, V) and writes softmax - one-hot in float8 e5m2 twice (row-major and
transposed): 4 bytes per logit at least, 6 with the row statistics' own read (row_stats, then grad_fp8).
Each variant's output is compared with the compiled PyTorch ops' (loss, and the float8 bytes that differ).
Timing: CUDA events, the median of --iters calls after warm-up (speedgpt.measure.cuda_time_ms).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from speedgpt.features import softmax_pass  # noqa: E402
from speedgpt.features.fp8 import E5M2_MAX                       # noqa: E402
from speedgpt.measure import cuda_time_ms               # noqa: E402

# --sweep: every tile shape here is timed alone (BLOCK_M, BLOCK_V, num_warps, variant: softmax_pass.py)
SWEEP_STATS = softmax_pass.STATS_CONFIGS + ((4, 256, 4, 0), (16, 256, 16, 0), (4, 1024, 4, 0), (8, 256, 8, 1))
SWEEP_GRAD = softmax_pass.GRAD_CONFIGS + ((128, 64, 4, 0), (64, 128, 4, 1), (32, 256, 4, 1), (128, 128, 8, 1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="65536,16384", help="comma-separated row counts (fused_ce_chunk)")
    p.add_argument("--vocab", type=int, default=50304, help="V, the padded vocabulary (columns)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="also time each tile shape of SWEEP_STATS / SWEEP_GRAD")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: softmax_pass.py times CUDA kernels: it needs a GPU")
    V, vocab = args.vocab, args.vocab - 47
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = cuda_time_ms(lambda: dst.copy_(src), iters=10)
    bw = 2 * src.numel() / copy_ms / 1e9                                       # TB/s, read + write
    del src, dst
    print(f"copy bandwidth (read + write, 2 GiB): {bw:.2f} TB/s; V = {V:,}, vocab_size = {vocab:,}", flush=True)
    compiled = torch.compile(lambda logits, y, vocab: softmax_pass.reference(logits, y, vocab, E5M2_MAX))
    rows_out = []
    for n in (int(r) for r in args.rows.split(",")):
        torch.manual_seed(0)
        logits = (4 * torch.randn(n, V, device="cuda")).bfloat16()
        y = torch.randint(0, vocab, (n,), device="cuda")
        y[::97] = -1
        floor = lambda b: b / (bw * 1e9)                                     # ms for b bytes at the copy rate
        b4, b6 = 4 * n * V, 6 * n * V
        ref = compiled(logits, y, vocab)
        ms_ref = cuda_time_ms(lambda: compiled(logits, y, vocab), iters=args.iters)
        rows_out.append((n, "torch.compile (PyTorch ops)", ms_ref, floor(b4), ""))
        print(f"n={n:,}: torch.compile {ms_ref:.3f} ms (floor {floor(b4):.3f} at 4 bytes/logit, "
              f"{floor(b6):.3f} at 6)", flush=True)

        def compare(out):
            loss_err = ((out[0] - ref[0]).abs().max() / ref[0].abs().max()).item()
            bad = [(out[i].view(torch.uint8) != ref[i].view(torch.uint8)).sum().item() for i in (1, 2)]
            steps = max((out[i].float() - ref[i].float()).abs().max().item() for i in (1, 2))
            t_ok = torch.equal(out[2].view(torch.uint8), out[1].view(torch.uint8).t())
            return f"loss rel {loss_err:.1e}, bytes differing per million: g8 {bad[0] / n / V * 1e6:.1f}, " \
                   f"g8t {bad[1] / n / V * 1e6:.1f} (largest gap {steps:g}), transposed copy exact: {t_ok}"

        softmax_pass.run(logits, y, vocab, E5M2_MAX)                  # the autotuned op: its configs chosen
        ms = cuda_time_ms(lambda: softmax_pass.run(logits, y, vocab, E5M2_MAX), iters=args.iters)
        out = tuple(torch.empty_like(t) for t in ref)
        for t in out:                                                  # NaN first: an unwritten value shows
            t.view(torch.uint8).fill_(0xFF)
        out = softmax_pass.run(logits, y, vocab, E5M2_MAX, out=out)
        stats, grad, _ = softmax_pass.kernels()
        best = f"stats {stats.best_config.kwargs} w{stats.best_config.num_warps}, " \
               f"grad {grad.best_config.kwargs} w{grad.best_config.num_warps}"
        rows_out.append((n, "Triton kernels (head_kernel), autotuned", ms, floor(b4), best))
        print(f"  kernels {ms:.3f} ms ({best}); {compare(out)}", flush=True)
        if args.sweep:
            lse = torch.empty(n, device="cuda")
            loss = torch.empty(n, device="cuda")
            g8 = torch.empty((n, V), dtype=torch.uint8, device="cuda")
            g8t = torch.empty((V, n), dtype=torch.uint8, device="cuda")
            for c in SWEEP_STATS:
                k = softmax_pass.kernels((c,), (SWEEP_GRAD[0],))[0]
                try:
                    f = lambda: k[(-(-n // c[0]),)](logits, y, loss, lse, n, V, vocab)
                    t = cuda_time_ms(f, iters=args.iters)
                    print(f"  row_stats {c}: {t:.3f} ms, {2 * n * V / t / 1e9:.2f} TB/s", flush=True)
                except Exception as e:              # a shape that does not compile here
                    print(f"  row_stats {c}: failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            for c in SWEEP_GRAD:
                k = softmax_pass.kernels((SWEEP_STATS[0],), (c,))[1]
                try:
                    f = lambda: k[(-(-n // c[0]) * -(-V // c[1]),)](logits, y, lse, g8, g8t, n, V, vocab, E5M2_MAX)
                    t = cuda_time_ms(f, iters=args.iters)
                    print(f"  grad_fp8 {c}: {t:.3f} ms, {4 * n * V / t / 1e9:.2f} TB/s", flush=True)
                except Exception as e:
                    print(f"  grad_fp8 {c}: failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        del logits, ref, out
        torch.cuda.empty_cache()
    print("\n| rows | variant | ms | floor ms | time / floor | note |\n|---:|---|---:|---:|---:|---|")
    for n, name, ms, fl, note in rows_out:
        print(f"| {n:,} | {name} | {ms:.3f} | {fl:.3f} | {ms / fl:.2f}x | {note} |")


if __name__ == "__main__":
    main()
