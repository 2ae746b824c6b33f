r"""
Attention forward + backward at GPT-2 124M's shape, per backend, on the document ids of real packed
batches: what each attention choice costs per layer, and what the FlexAttention BlockMask costs to build.

    python benchmarks/attention.py --data_dir data/stories_gpt2 [--batch_size 16] [--block_size 1024]
    python benchmarks/attention.py --data_dir data/stdlib_gpt2 --batch_size 64 --match 'causal \(auto|model.py|varlen'

The max-autotune variant lets Inductor time its own list of flex kernel configurations; its choices
(AUTOTUNE tables) go to stderr. Each variant: 5 warm-up calls, then the median of 20 timed forward +
backward calls (CUDA events).
A variant that fails (a kernel that does not support the shape or the mask) prints its error.
varlen variants: q, k, v packed as (B*T, 3, H, D) (c_attn's layout) with cu_seqlens exactly as long as the
batch's documents, as the loader gives it, and padded to 4x that, to price empty sequences; PyTorch's FA2
(torch varlen_attn), then FA3 where flash_attn_interface imports
(speedgpt/attention.py: one split; then torch's own FA3 route, activate_flash_attention_impl, which also reroutes SDPA's
flash path, so those variants run last). --match keeps the variants whose name matches a regular expression.
"""
import argparse
import re
import sys
import os
import time

import numpy as np

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data import Loader, varlen_metadata                   # noqa: E402
from speedgpt.measure import cuda_time_ms as time_ms        # noqa: E402
from speedgpt.attention import causal_varlen_attn, dense_attention_mask, flex_block_mask, varlen_kernel  # noqa: E402




def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--n_head", type=int, default=12)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--match", default="", help="regular expression: run only the variants whose name it finds")
    args = p.parse_args(argv)
    # one line, as head_ce.py's, for a machine without the GPU (pin_memory's traceback) and for bad input
    if not torch.cuda.is_available():
        raise SystemExit("error: attention.py times CUDA kernels: it needs a GPU")
    bad = [f"--{k} {getattr(args, k)}" for k in ("batch_size", "block_size", "n_head", "head_dim")
           if getattr(args, k) < 1]
    if bad:
        raise SystemExit(f"error: {', '.join(bad)}: must be at least 1")
    try:
        re.compile(args.match)
    except re.error as e:
        raise SystemExit(f"error: --match {args.match!r} is not a regular expression ({e})")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, T, D = args.batch_size, args.n_head, args.block_size, args.head_dim
    try:
        doc_ids = next(Loader(args.data_dir, "train", B, T, device="cuda", seed=0)).doc_ids
    except (FileNotFoundError, ValueError) as e:         # no such folder, data too short for a row, ...
        raise SystemExit(f"error: {e}")
    docs_per_row = (doc_ids[:, -1] - doc_ids[:, 0] + 1).float().mean().item()
    print(f"B={B} H={H} T={T} D={D}, {docs_per_row:.1f} documents per row ({args.data_dir})")
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    dense = dense_attention_mask(doc_ids)
    causal_bm = flex_block_mask(torch.zeros(1, T, dtype=torch.long, device="cuda"))
    doc_bm = flex_block_mask(doc_ids)

    def sdpa(mask=None, backend=None):
        def run():
            with sdpa_kernel([backend]) if backend is not None else torch.enable_grad():
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None).backward(g)
        return run

    def flex(bm, mode=None, **opts):
        fa = torch.compile(flex_attention, dynamic=False, mode=mode)
        return lambda: fa(q, k, v, block_mask=bm, kernel_options=opts or None).backward(g)

    variants = [
        ("sdpa causal (auto: flash)", sdpa()),
        ("sdpa causal, cuDNN", sdpa(backend=SDPBackend.CUDNN_ATTENTION)),
        ("sdpa + dense document mask (auto)", sdpa(dense)),
        ("sdpa + dense document mask, cuDNN", sdpa(dense, SDPBackend.CUDNN_ATTENTION)),
        ("flex causal", flex(causal_bm)),
        ("flex document mask", flex(doc_bm)),
        ("flex document mask, ROWS_GUARANTEED_SAFE", flex(doc_bm, ROWS_GUARANTEED_SAFE=True)),
        ("flex document mask, USE_TMA", flex(doc_bm, USE_TMA=True)),
        ("flex document mask, BLOCK_N=64", flex(doc_bm, BLOCK_M=128, BLOCK_N=64)),
        ("flex document mask, num_warps=8 (attention.py)", flex(doc_bm, num_warps=8)),
        ("flex document mask, num_warps=8, bwd_num_stages=2", flex(doc_bm, num_warps=8, bwd_num_stages=2)),
        ("flex document mask, fwd_num_warps=8 only", flex(doc_bm, fwd_num_warps=8)),
        ("flex document mask, num_warps=8, num_stages=2", flex(doc_bm, num_warps=8, num_stages=2)),
        ("flex document mask, max-autotune (winner printed on stderr)", flex(doc_bm, "max-autotune-no-cudagraphs")),
        ("flex document mask, BACKEND=FLASH", flex(doc_bm, BACKEND="FLASH")),
    ]
    # varlen: (B*T, H, D) leaves; cu_seqlens exact, as the loader gives it, and padded with 3x as many empty
    # sequences (what a fixed length would cost)
    qkv = torch.stack([t.detach().transpose(1, 2).reshape(B * T, H, D) for t in (q, k, v)], 1).requires_grad_(True)
    gv = g.transpose(1, 2).reshape(B * T, H, D)
    exact, _ = varlen_metadata(doc_ids.cpu().numpy())
    n_seqs = len(exact) - 1
    cus = {"exact": exact, f"padded to {4 * len(exact)} entries": np.append(exact, np.full(3 * len(exact), B * T))}
    cus = {k: torch.from_numpy(v.astype(np.int32)).cuda() for k, v in cus.items()}
    attn = causal_varlen_attn()

    def varlen(cu, attn=attn):                     # None: this torch has no torch.nn.attention.varlen
        return (lambda: attn(qkv, cu, T).backward(gv)) if attn else None
    variants += [(f"varlen FA2 (torch varlen_attn), cu_seqlens {k}", varlen(cu)) for k, cu in cus.items()]
    print(f"{n_seqs} sequences in the batch")
    print("| variant | fwd+bwd ms per layer |\n|---|---:|")

    def run(variants):
        for name, fn in variants:
            if not re.search(args.match, name):
                continue
            torch._dynamo.reset()                  # each variant compiles afresh (no recompile limit, no stale cache)
            if fn is None:
                print(f"| {name} | not run: this torch has no torch.nn.attention.varlen |", flush=True)
                continue
            try:
                print(f"| {name} | {time_ms(fn):.3f} |", flush=True)
            except Exception as e:                 # a kernel that cannot take this shape/mask
                print(f"| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} |", flush=True)
    run(variants)
    try:
        kernel = varlen_kernel("cuda")
    except ValueError as e:
        kernel = str(e)
    if kernel.startswith("FA3"):
        fa3 = causal_varlen_attn()                 # attention.py's: torch.ops.flash_attn_3 direct, one split
        run([(f"varlen FA3 (attention.py, one split), cu_seqlens {k}", varlen(cu, fa3)) for k, cu in cus.items()])
        from torch.nn.attention import activate_flash_attention_impl
        activate_flash_attention_impl("FA3")       # last: reroutes SDPA's flash path too
        run([(f"varlen FA3 (torch route, splits chosen by FA3), cu_seqlens {k}", varlen(cu)) for k, cu in cus.items()]
            + [("sdpa causal (FA3 dense)", sdpa())])
    else:
        print(f"| varlen FA3 | not run: {kernel} |")
    t0 = time.perf_counter()
    for _ in range(20):
        varlen_metadata(doc_ids.cpu().numpy())
    print(f"\nvarlen metadata per batch, numpy in the loader's thread (no GPU work): "
          f"{(time.perf_counter() - t0) / 20 * 1e3:.2f} ms")
    compiled_cbm = lambda: create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (doc_ids[b, qi] == doc_ids[b, ki]),
                                             B, None, T, T, device="cuda", _compile=True)
    print(f"\nBlockMask build per batch: flex_block_mask {time_ms(lambda: flex_block_mask(doc_ids)):.3f} ms, "
          f"create_block_mask(_compile=True) {time_ms(compiled_cbm):.3f} ms, "
          f"dense bool mask {time_ms(lambda: dense_attention_mask(doc_ids)):.3f} ms")


if __name__ == "__main__":
    main()
