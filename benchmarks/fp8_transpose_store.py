"""
The softmax pass's transposed float8 store, alone: which way of writing a tile and its transpose in 8 bits
Triton compiles correctly on this GPU, with which ptxas (triton-lang/triton#11111: a kernel that stores an
8-bit tile and its tl.trans() gets foreign bytes in the transposed copy; ptxas 12.9, which Triton bundles for
Hopper, shows it, and 13.x does not, per the report).

    python benchmarks/fp8_transpose_store.py [--rows 4096,65536] [--iters 3]
    TRITON_PTXAS_PATH=.../ptxas-blackwell python benchmarks/fp8_transpose_store.py      # another ptxas
    compute-sanitizer --tool racecheck python benchmarks/fp8_transpose_store.py --rows 1024 --iters 1

Each kernel is grad_fp8 of speedgpt/features/softmax_pass.py (softmax - one-hot, scaled, cast to e5m2, stored row-major and
transposed), in two forms:
  trans8   the tile cast to 8 bits, then that 8-bit tile transposed and stored (the pattern of the report)
  trans32  the float32 tile transposed, then cast (the same bytes: the cast is elementwise); what
           softmax_pass.py runs
each with Triton free to assume the row count is a multiple of 16 (specialized) or not. The outputs start as
0xFF (NaN in e5m2), so a byte the kernel never wrote shows. The row-major copy is checked against PyTorch's
math on its first rows (more than one float8 step off, or unwritten: exp's rounding may cross a rounding boundary),
the transposed copy against the row-major one, byte for byte. Prints one row per
variant, tile shape and row count: the bytes that differ and the kernel's time (triton.testing.do_bench, ms);
and the ptxas Triton used.
"""
import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from speedgpt.features import softmax_pass  # noqa: E402

SCALE = 57344.0


def build(wide, specialize):
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["vocab"] if specialize else ["n", "vocab"])
    def grad(logits, y, lse, g8, g8t, n, V, vocab, scale, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
             WIDE: tl.constexpr):
        pid = tl.program_id(0)
        n_vblocks = tl.cdiv(V, BLOCK_V)
        pm, pv = pid // n_vblocks, pid % n_vblocks
        rows = pm * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pv * BLOCK_V + tl.arange(0, BLOCK_V)
        r, c = rows[:, None], cols[None, :]
        x = tl.load(logits + r.to(tl.int64) * V + c, mask=(r < n) & (c < V))
        x = tl.where(c < vocab, x.to(tl.float32), float("-inf"))
        t = tl.load(y + r, mask=r < n, other=-1).to(tl.int32)
        lse2 = tl.load(lse + r, mask=r < n, other=0.0) * 1.4426950408889634
        g = tl.exp2(x * 1.4426950408889634 - lse2)
        g = tl.where(c == t, g - 1.0, g)
        g = tl.where(t != -1, g * scale, 0.0)
        b = g.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        tl.store(g8 + r.to(tl.int64) * V + c, b, mask=(r < n) & (c < V))
        if WIDE:
            bt = tl.trans(g).to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        else:
            bt = tl.trans(b)
        tl.store(g8t + cols.to(tl.int64)[:, None] * n + rows[None, :], bt,
                 mask=(cols < V)[:, None] & (rows < n)[None, :])
    return grad


def ptxas_used():
    """The ptxas Triton compiles with here: TRITON_PTXAS_PATH, else the one it bundles; and its version line."""
    import triton
    path = os.environ.get("TRITON_PTXAS_PATH") or \
        os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except OSError as e:
        out = f"cannot run: {e}"
    return path, out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="4096,65536", help="comma-separated row counts")
    p.add_argument("--vocab", type=int, default=50304, help="V, the padded vocabulary (columns)")
    p.add_argument("--iters", type=int, default=3, help="launches per case (a race may show only sometimes)")
    p.add_argument("--dump", default="", help="a folder: write the PTX of each trans8 kernel there")
    p.add_argument("--variants", default="trans8,trans32", help="comma-separated: trans8, trans32")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: fp8_transpose_store.py runs Triton kernels: it needs a GPU")
    import triton
    path, version = ptxas_used()
    print(f"triton {triton.__version__}, ptxas {path}: {version}")
    V, vocab = args.vocab, args.vocab - 47
    row_stats = softmax_pass.kernels()[0]
    rows_out = []
    for n in map(int, args.rows.split(",")):
        gen = torch.Generator("cuda").manual_seed(0)
        logits = (4 * torch.randn(n, V, device="cuda", generator=gen)).bfloat16()
        y = torch.randint(0, vocab, (n,), device="cuda", generator=gen)
        y[::7] = -1
        loss, lse = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        row_stats[lambda a: (-(-n // a["BLOCK_M"]),)](logits, y, loss, lse, n, V, vocab)
        check_rows = min(n, 1024)
        _, ref8, _ = softmax_pass.reference(logits[:check_rows], y[:check_rows], vocab, SCALE)
        g8 = torch.empty(n, V, dtype=torch.uint8, device="cuda")
        g8t = torch.empty(V, n, dtype=torch.uint8, device="cuda")
        for wide in [w for w, name in ((False, "trans8"), (True, "trans32")) if name in args.variants.split(",")]:
            for specialize in (True, False):
                kernel = build(wide, specialize)
                for bm, bv, warps, _ in softmax_pass.GRAD_CONFIGS:
                    bad_t = bad_r = 0
                    for _ in range(args.iters):
                        g8.fill_(0xFF)
                        g8t.fill_(0xFF)
                        grid = (-(-n // bm) * -(-V // bv),)
                        compiled = kernel[grid](logits, y, lse, g8, g8t, n, V, vocab, SCALE, BLOCK_M=bm, BLOCK_V=bv,
                                                WIDE=wide, num_warps=warps)
                        bad_t = max(bad_t, int((g8t != g8.t()).sum()))
                        a, want = g8[:check_rows].view(torch.float8_e5m2).float(), ref8.float()
                        step = torch.clamp(0.25 * torch.maximum(a.abs(), want.abs()), min=2.0 ** -16)   # one e5m2 step
                        bad_r = max(bad_r, int((((a - want).abs() > step) | a.isnan()).sum()))
                    from triton.testing import do_bench
                    ms = do_bench(lambda: kernel[grid](logits, y, lse, g8, g8t, n, V, vocab, SCALE, BLOCK_M=bm,
                                                       BLOCK_V=bv, WIDE=wide, num_warps=warps), warmup=5, rep=20)
                    name = f"{'trans32' if wide else 'trans8'}{'' if specialize else ' n-generic'}"
                    if args.dump and not wide:
                        os.makedirs(args.dump, exist_ok=True)
                        with open(os.path.join(args.dump, f"trans8_{bm}x{bv}_w{warps}_"
                                               f"{'spec' if specialize else 'generic'}_{n}.ptx"), "w") as f:
                            f.write(compiled.asm["ptx"])
                    rows_out.append((name, f"{bm}x{bv} w{warps}", n, bad_t, bad_r, ms))
        del logits, g8, g8t, ref8
        torch.cuda.empty_cache()
    print(f"\n{'variant':<18} {'tile':<12} {'rows':>7} {'transposed bytes off':>21} {'row-major bytes off':>20} "
          f"{'ms':>7}")
    for name, tile, n, bad_t, bad_r, ms in rows_out:
        print(f"{name:<18} {tile:<12} {n:>7,} {bad_t:>21,} {bad_r:>20,} {ms:>7.3f}")


if __name__ == "__main__":
    main()
