"""
Sampling speed with and without the KV cache (GPT.generate's use_cache): tokens/s of generating
--max_new_tokens tokens after a short prompt, for a checkpoint or a freshly initialised model of a given
shape, on the CPU or the GPU. Prints a markdown table (BENCHMARKS.md, "Sampling with a KV cache").

    python benchmarks/sample_speed.py                                     # GPT-2 124M's shape, 500 tokens
    python benchmarks/sample_speed.py --n_layer 4 --n_head 4 --n_embd 128 --block_size 256 --vocab_size 256
    python benchmarks/sample_speed.py --out_dir out --max_new_tokens 200  # a checkpoint, as sample.py loads it

Greedy decoding (top_k 1), float32, eval mode, as sample.py samples; the prompt is --prompt_tokens random
ids. Each mode runs once untimed (8 tokens: allocator, kernels), then --repeats timed runs, of which the
median counts; on the GPU the clock is read after torch.cuda.synchronize(). tokens/s counts the new
tokens of every row. With the cache a new token costs one position until the context reaches block_size;
past it every token is a forward of block_size positions either way (GPT.generate says why), so a
--max_new_tokens beyond block_size dilutes the speed-up. The last column says whether the two modes
chose the same ids (a random model's near-ties may flip in float32; tests/test_model.py compares in float64).
"""
import argparse
import itertools
import os
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import FlagParser              # noqa: E402
from model import GPT, GPTConfig                 # noqa: E402
from sample import whole                         # noqa: E402
from speedgpt.distributed import device_problem  # noqa: E402

SHAPE = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")       # a new model's; a checkpoint has its own


def build_model(args):
    """The model to sample from: args.out_dir's checkpoint (sample.load_model) or a new one of args' shape."""
    if args.out_dir:
        from sample import load_model
        try:
            return load_model(args.out_dir, args.device)[0]
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"error: {e}")
    torch.manual_seed(0)
    config = GPTConfig(block_size=args.block_size, vocab_size=args.vocab_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd)
    return GPT(config).to(args.device).eval()


def timed_generate(model, idx, max_new_tokens, use_cache):
    """(ids (B, T + max_new_tokens), seconds) of one greedy generate; synchronized on the GPU."""
    sync = torch.cuda.synchronize if idx.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = model.generate(idx, max_new_tokens, top_k=1, use_cache=use_cache)
    sync()
    return out, time.perf_counter() - t0


def main(argv=None):
    p = FlagParser(prog="benchmarks/sample_speed.py", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="", help="folder holding ckpt.pt; empty: a new model of the shape below")
    # whole numbers >= 1: n_layer -3 built a model of no blocks and timed it, repeats or prompt_tokens 0 ended in a
    # traceback
    p.add_argument("--n_layer", type=whole(1), default=12)
    p.add_argument("--n_head", type=whole(1), default=12)
    p.add_argument("--n_embd", type=whole(1), default=768)
    p.add_argument("--block_size", type=whole(1), default=1024)
    p.add_argument("--vocab_size", type=whole(1), default=50257)
    p.add_argument("--max_new_tokens", type=whole(1), default=500)
    p.add_argument("--prompt_tokens", type=whole(1), default=1)
    p.add_argument("--batch_size", type=whole(1), default=1)
    p.add_argument("--repeats", type=whole(1), default=1, help="timed runs per mode; the median counts")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda | cuda:N | mps")
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    given = {a.split("=", 1)[0] for a in itertools.takewhile(lambda a: a != "--", argv)}
    shape = [f"--{k}" for k in SHAPE if f"--{k}" in given]
    if args.out_dir and shape:            # the checkpoint's shape is timed: they were dropped, unsaid
        p.error(f"{', '.join(shape)} would do nothing with --out_dir, whose checkpoint has its own shape: leave "
                f"{'them' if len(shape) > 1 else 'it'} out, or leave out --out_dir to time a new model of that shape")
    if not args.out_dir and args.n_embd % args.n_head:
        p.error(f"--n_embd {args.n_embd} must be a multiple of --n_head {args.n_head} (the head size)")
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", args.device):
        p.error(f"--device must be cpu, cuda, cuda:N or mps, got {args.device!r}")
    if device_problem(args.device):
        p.error(f"--device {args.device}: {device_problem(args.device)} (time the CPU: --device cpu)")
    model = build_model(args)
    c = model.config
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, c.vocab_size, (args.batch_size, args.prompt_tokens), generator=g).to(args.device)
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else \
        f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.out_dir or 'new model'}: n_layer {c.n_layer}, n_head {c.n_head}, n_embd {c.n_embd}, block_size "
          f"{c.block_size}, vocab {c.vocab_size}, attention {c.attention} | {where} | torch {torch.__version__} | "
          f"batch {args.batch_size}, prompt {args.prompt_tokens} tokens, {args.max_new_tokens} new tokens")
    ids, seconds = {}, {}
    for use_cache in (False, True):
        model.generate(idx, 8, top_k=1, use_cache=use_cache)                # warm-up, untimed
        runs = [timed_generate(model, idx, args.max_new_tokens, use_cache) for _ in range(args.repeats)]
        ids[use_cache], seconds[use_cache] = runs[0][0], statistics.median(s for _, s in runs)
    new_tokens = args.batch_size * args.max_new_tokens
    differ = (ids[True] != ids[False]).any(0).nonzero()
    same = "yes" if differ.numel() == 0 else f"no: from new token {differ[0].item() - args.prompt_tokens}"
    print("\n| KV cache | seconds | tokens/s | speed-up | same ids |\n|---|---:|---:|---:|---|")
    for use_cache in (False, True):
        print(f"| {'on' if use_cache else 'off'} | {seconds[use_cache]:.2f} | {new_tokens / seconds[use_cache]:,.1f} | "
              f"{seconds[False] / seconds[use_cache]:.1f}x | {same if use_cache else ''} |")


if __name__ == "__main__":
    main()
