"""
Generate text from a checkpoint, decoding with the checkpoint's tokenizer.

    python sample.py                                   # out/ckpt.pt, prompt "def "
    python sample.py --out_dir=out-fast --start="Once upon a time" --num_samples=3 --top_k=50
    python sample.py --start=""                        # a whole document, from its first token
    python sample.py --out_dir out-fast --top_k 0      # the space form too; top_k 0: the whole vocabulary
    python sample.py --kv_cache=False                  # no KV cache: the whole context per token
    python sample.py --temperature=0                   # greedy: the likeliest token each time (the same every run)
    python sample.py --init_from=gpt2 --start="Hello"  # OpenAI's GPT-2 through transformers, as nanoGPT's sample.py

Each sample starts a document (the prompt follows one end-of-text token, as every training document
does) and stops where the model ends it (its next end-of-text), or after max_new_tokens.
"""
import argparse
import math
from contextlib import nullcontext
import os
import re
import sys
import time

import torch

from configurator import HF_GPT2, FlagParser, seed
from model import GPT, GPTConfig
from speedgpt.checkpoint import checkpoint_file, load_checkpoint, load_weights, no_checkpoint
from speedgpt.corpus import get_tokenizer, tokenizer_for
from speedgpt.distributed import device_problem

TOKENIZER_OF_VOCAB = {50257: "gpt2", 257: "byte"}        # a Hugging Face model's vocabulary -> our tokenizer
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(out_dir, device):
    """(GPT in eval mode on `device`, tokenizer metadata) of out_dir/ckpt.pt, for sampling and evaluation
    (eval.py): no dropout, no FP8 head. Without the document mask, attention varlen (bf16/fp16 kernels
    only) and flex on the CPU become sdpa, the same math. Raises FileNotFoundError (no checkpoint) or
    ValueError (unreadable, or weights that do not fit), each in one line."""
    path = checkpoint_file(out_dir)
    if not os.path.isfile(path):
        raise FileNotFoundError(no_checkpoint(out_dir))
    ckpt = load_checkpoint(path, required=("model", "config", "meta"))   # no optimizer state needed
    cfg, meta = ckpt["config"], ckpt["meta"]
    attention = "sdpa" if cfg["attention"] == "varlen" or \
        (cfg["attention"] == "flex" and not str(device).startswith("cuda")) else cfg["attention"]
    model = GPT(GPTConfig.from_dict(cfg, meta["vocab_size"], attention=attention, dropout=0.0))
    load_weights(model, ckpt, path)
    return model.eval().to(device), meta


def load_hf(name_or_path, device):
    """(GPT in eval mode on `device`, tokenizer metadata) of a Hugging Face GPT-2 (hf.py: a gpt2* name or a
    folder), as nanoGPT's sample.py --init_from=gpt2-xl. Raises ValueError / FileNotFoundError in one line
    (transformers missing, offline and not cached, a vocabulary that is neither GPT-2's nor bytes)."""
    from hf import load_hf_gpt2
    model = load_hf_gpt2(name_or_path)
    name = TOKENIZER_OF_VOCAB.get(model.config.vocab_size)
    if name is None:
        raise ValueError(f"{name_or_path} has a {model.config.vocab_size:,}-token vocabulary: sample.py decodes GPT-2 "
                         "BPE (50,257) and byte-level (257) models")
    return model.eval().to(device), {"tokenizer": name, "eot_id": get_tokenizer(name).eot}


def source_error(init_from):
    """The one line for an --init_from that names no model sample.py reads (nanoGPT's flag: resume, the default,
    is --out_dir's checkpoint), or None for a good one."""
    if init_from == "resume" or init_from in HF_GPT2:
        return None
    if os.path.isfile(os.path.join(init_from, "ckpt.pt")):     # a run's folder: its config.json is train.py's, not HF's
        return f"--init_from {init_from} is a training run's folder: sample its checkpoint with --out_dir={init_from}"
    if os.path.isfile(os.path.join(init_from, "config.json")):
        return None
    if os.path.isfile(init_from):                       # a checkpoint file: --out_dir takes it
        return f"--init_from {init_from} is a file: sample from a checkpoint file with --out_dir={init_from}"
    return f"--init_from must be resume (the checkpoint in --out_dir), {', '.join(HF_GPT2)} or a Hugging Face " \
        f"GPT-2 folder (config.json), got {init_from!r}"


def temperature(text):
    """float(text) if it is a finite number >= 0 (0: greedy), else argparse's one-line error: nan passes a
    `>= 0` check and ends in multinomial's traceback, and inf flattens the distribution into noise."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0: greedy, the likeliest token), got {text!r}")
    return value


def whole(least, note=""):
    """An argparse type: int(text) for a whole number >= `least` (`note` says what the least one means)."""
    def check(text):
        if not re.fullmatch(r"[+]?\d+", text.strip()) or int(text) < least:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {least}{note}, got {text!r}")
        return int(text)
    return check


class Progress:
    """A line on stderr every EVERY seconds while a sample is drawn (a long --max_new_tokens on a CPU takes
    minutes, the text comes only at its end): how many of its tokens, and how fast."""
    EVERY, CLOCK = 5.0, staticmethod(time.perf_counter)

    def __init__(self, sample, samples, tokens):
        self.sample, self.samples, self.tokens = sample, samples, tokens
        self.start = self.last = self.CLOCK()

    def __call__(self, drawn):
        now = self.CLOCK()
        if now - self.last >= self.EVERY and drawn < self.tokens:
            self.last = now
            print(f"sample {self.sample + 1}/{self.samples}: {drawn:,} of {self.tokens:,} tokens "
                  f"({drawn / (now - self.start):,.1f} tokens/s)", file=sys.stderr, flush=True)


def main(argv=None):
    parser = FlagParser(prog="sample.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="", help="folder holding ckpt.pt, or a checkpoint file "
                        "(a kept step: out/ckpt_step000500.pt); default out")
    parser.add_argument("--start", default="def ", help="prompt; FILE:path reads it from a file")
    parser.add_argument("--num_samples", type=whole(1), help="samples to draw (default 2; 1 with --temperature=0, "
                        "where every sample is the same)")
    parser.add_argument("--max_new_tokens", type=whole(1), default=300)
    parser.add_argument("--temperature", type=temperature, default=0.8,
                        help="a finite number >= 0; 0: greedy (the likeliest token each time; no top_k)")
    parser.add_argument("--top_k", type=whole(0, " (0: the whole vocabulary)"),
                        help="sample from the k likeliest tokens (default 50); 0: from the whole vocabulary")
    parser.add_bool("--kv_cache", help="keep each layer's keys and values so that a new token costs one position; "
                    "False recomputes the whole context per token (the same samples, up to rounding)")
    parser.set_defaults(kv_cache=True)       # add_bool's flags default to False
    parser.add_argument("--seed", type=seed, default=1337, help="a whole number in [0, 2**32 - 1], as train.py's")
    parser.add_argument("--device", default="auto", help="auto (a CUDA GPU, else Apple's MPS, else the CPU: "
                        "train.py's default) | cpu | cuda | cuda:N | mps")
    # nanoGPT's sample.py flags: a nanoGPT user's command runs unchanged
    parser.add_argument("--init_from", default="resume", help="resume: the checkpoint in --out_dir; or "
                        f"{', '.join(HF_GPT2)} or a Hugging Face GPT-2 folder (through transformers, as eval.py)")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES), help="autocast precision, as eval.py's")
    parser.add_bool("--compile", help="taken for nanoGPT's command lines; sampling runs uncompiled either way")
    args = parser.parse_args(argv)
    args.num_samples = args.num_samples or (1 if args.temperature == 0 else 2)
    if args.temperature == 0 and args.top_k is not None:       # greedy takes the argmax, which no top_k changes
        parser.error(f"--top_k {args.top_k} would do nothing at --temperature 0, which is greedy (the likeliest token "
                     "each time): leave out --top_k, or give a --temperature above 0 to sample from the top_k "
                     "likeliest tokens")
    args.top_k = 50 if args.top_k is None else args.top_k
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", args.device):
        parser.error(f"--device must be auto, cpu, cuda, cuda:N or mps, got {args.device!r}")
    if device_problem(args.device):
        parser.error(f"--device {args.device}: {device_problem(args.device)} (sample on the CPU: --device cpu)")
    if args.start == "FILE:":
        parser.error("--start=FILE: names no file: give the prompt file after it (--start=FILE:prompt.txt)")
    if args.start.startswith("FILE:") and not os.path.isfile(args.start[5:]):
        # a folder exists, so "not found" would send the user looking for it (configurator.py's wording)
        parser.error(f"prompt file {args.start[5:]} "
                     + ("is a folder, not a file" if os.path.isdir(args.start[5:]) else
                        "is not a regular file (a device or a pipe): give a text file" if os.path.exists(args.start[5:])
                        else "not found"))
    if source_error(args.init_from):
        parser.error(source_error(args.init_from))
    if args.out_dir and args.init_from != "resume":     # one model is sampled: say which instead of ignoring one
        parser.error(f"--out_dir {args.out_dir} and --init_from {args.init_from} name two models: give one of them")
    args.out_dir = args.out_dir or "out"
    if args.compile:      # each new token is a new shape (a new length, or a longer KV cache): it would recompile
        print("note: --compile=True: sample.py samples uncompiled, as nanoGPT's did (its generate called the model "
              "it had compiled, uncompiled)", file=sys.stderr)
    torch.manual_seed(args.seed)
    try:
        model, meta = load_model(args.out_dir, args.device) if args.init_from == "resume" else \
            load_hf(args.init_from, args.device)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}")
    try:
        tok = tokenizer_for(meta)
    except (ValueError, FileNotFoundError) as e:         # offline without the GPT-2 files
        raise SystemExit(f"error: {e}")
    start = args.start
    if start.startswith("FILE:"):
        try:
            start = open(start[5:], encoding="utf-8").read()
        except UnicodeDecodeError as e:
            raise SystemExit(f"error: prompt file {start[5:]} is not UTF-8 text (byte {e.object[e.start]:#04x} at "
                             f"offset {e.start}): convert it to UTF-8 first")
    # every training document starts with end-of-text (data.py's convention), so the prompt does too:
    # an empty prompt is that one token. A sample ends where the model ends the document. nanoGPT's character
    # vocabulary has no end-of-text (eot_id -1): the prompt alone, as nanoGPT's sample.py
    eot = meta["eot_id"]
    try:
        prompt = tok.encode(start)
    except ValueError as e:               # a character the vocabulary lacks
        raise SystemExit(f"error: the prompt: {e}")
    if eot < 0 and not prompt:
        raise SystemExit("error: this model's character vocabulary has no end-of-text to start a sample from: give "
                         "a prompt (--start, as nanoGPT's \\n)")
    idx = torch.tensor([[eot] * (eot >= 0) + prompt], device=args.device)
    block_size = model.config.block_size
    if idx.size(1) > block_size:
        print(f"note: the prompt is {idx.size(1):,} tokens (with its end-of-text), longer than block_size="
              f"{block_size}: the model sees only its last {block_size} tokens", file=sys.stderr)
    ctx = nullcontext() if args.dtype == "float32" else torch.autocast(torch.device(args.device).type,
                                                                      dtype=DTYPES[args.dtype])
    for i in range(args.num_samples):
        with ctx:
            new = model.generate(idx, args.max_new_tokens, args.temperature, args.top_k or None,
                                 use_cache=args.kv_cache, progress=Progress(i, args.num_samples, args.max_new_tokens))
        new = new[0, idx.size(1):].tolist()
        print(tok.decode(prompt + (new[:new.index(eot)] if eot in new else new)))
        print("-" * 60)


if __name__ == "__main__":
    main()
