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
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import FlagParser              # noqa: E402
from model import GPT, GPTConfig                 # noqa: E402


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
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--n_head", type=int, default=12)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--vocab_size", type=int, default=50257)
    p.add_argument("--max_new_tokens", type=int, default=500)
    p.add_argument("--prompt_tokens", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1, help="timed runs per mode; the median counts")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
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
