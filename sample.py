"""
Generate text from a checkpoint, decoding with the checkpoint's tokenizer.

    python sample.py                                   # out/ckpt.pt, prompt "def "
    python sample.py --out_dir=out-fast --start="Once upon a time" --num_samples=3 --top_k=50
    python sample.py --start=""                        # a whole document, from its first token

Each sample starts a document (the prompt follows one end-of-text token, as every training document
does) and stops where the model ends it (its next end-of-text), or after max_new_tokens.
"""
import argparse
import os
import re
import sys

import torch

from data import get_tokenizer
from model import GPT, GPTConfig
from speedgpt.checkpoint import load_checkpoint, load_weights


def load_model(out_dir, device):
    """(GPT in eval mode on `device`, tokenizer metadata) of out_dir/ckpt.pt, for sampling and evaluation
    (eval.py): no dropout, no FP8 head. Without the document mask, attention varlen (bf16/fp16 kernels
    only) and flex on the CPU become sdpa, the same math. Raises FileNotFoundError (no checkpoint) or
    ValueError (unreadable, or weights that do not fit), each in one line."""
    path = f"{out_dir}/ckpt.pt"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}: train first (python train.py --out_dir={out_dir})")
    ckpt = load_checkpoint(path, required=("model", "config", "meta"))   # no optimizer state needed
    cfg, meta = ckpt["config"], ckpt["meta"]
    attention = "sdpa" if cfg["attention"] == "varlen" or \
        (cfg["attention"] == "flex" and not str(device).startswith("cuda")) else cfg["attention"]
    model = GPT(GPTConfig.from_dict(cfg, meta["vocab_size"], attention=attention, dropout=0.0, fp8_head=False))
    load_weights(model, ckpt, path)
    return model.eval().to(device), meta


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="out", help="folder holding ckpt.pt")
    parser.add_argument("--start", default="def ", help="prompt; FILE:path reads it from a file")
    parser.add_argument("--num_samples", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top_k", type=int, default=50, help="0: sample from the whole vocabulary")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.temperature <= 0 or args.top_k < 0 or args.max_new_tokens < 1 or args.num_samples < 1:
        parser.error("need --temperature > 0, --top_k >= 0, --max_new_tokens >= 1, --num_samples >= 1")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        parser.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA GPU is available")
    if args.start.startswith("FILE:") and not os.path.isfile(args.start[5:]):
        parser.error(f"prompt file {args.start[5:]} not found")
    torch.manual_seed(args.seed)
    try:
        model, meta = load_model(args.out_dir, args.device)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}")
    try:
        tok = get_tokenizer(meta["tokenizer"])
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
    # an empty prompt is that one token. A sample ends where the model ends the document.
    eot, prompt = meta["eot_id"], tok.encode(start)
    idx = torch.tensor([[eot] + prompt], device=args.device)
    block_size = model.config.block_size
    if idx.size(1) > block_size:
        print(f"note: the prompt is {idx.size(1):,} tokens (with its end-of-text), longer than block_size="
              f"{block_size}: the model sees only its last {block_size} tokens", file=sys.stderr)
    for _ in range(args.num_samples):
        new = model.generate(idx, args.max_new_tokens, args.temperature, args.top_k or None)[0, idx.size(1):].tolist()
        print(tok.decode(prompt + (new[:new.index(eot)] if eot in new else new)))
        print("-" * 60)


if __name__ == "__main__":
    main()
