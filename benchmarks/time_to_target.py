"""
Time to a target validation loss, the field's measure of a trainer (modded-nanogpt: time to 3.28 on FineWeb):
our recipes, and optionally karpathy/nanoGPT's own train.py, on the same tokens, scored by the same evaluator.

    python benchmarks/time_to_target.py                                   # AdamW + cosine vs Muon + WSD, two seeds
    python benchmarks/time_to_target.py --nanogpt ../nanoGPT --target 1.6 --max_iters 200

1. The corpus: every .py file of this Python installation (its standard library, site-packages and the folders
   on sys.path outside this repository), one document each, files deduplicated by content hash: hundreds of MB of
   real text with no download. Prepared once with the GPT-2 tokenizer into --out/data (or give --data_dir).
2. Each recipe of --runs (adamw: config/fast.py as shipped; muon: the same with config/muon.py laid over it,
   Muon + WSD), for each seed, for --max_iters steps (the schedules' horizon; the warm-up fast.py's
   100 steps, at most a fifth of the run), evaluating every
   --eval_interval steps on the whole val split (the same tokens for every run and seed).
3. With --nanogpt: nanoGPT's train.py (once: its seed is fixed in its file) on the same train tokens (flat uint16 train.bin / val.bin written from our
   shards), the same tokens per step, learning rate and schedule as config/fast.py; at each of its evaluations a
   copy of its weights is kept, and afterwards each copy is scored by our evaluator on our val tokens (without our
   document mask and per-document positions, as it was trained). Its file is run unedited: a launcher times its
   loop around its evaluations and keeps the copies (LAUNCHER below); --nanogpt_args adds flags of its own
   (on a CPU: --nanogpt_args="--device=cpu --compile=False --dtype=float32" and a small shape, with the same
   shape in --train_args for ours).

The target is --target, or by default the highest final val loss of the runs (so every run reaches it). Each row:
the first evaluation at or below it, its step, tokens, and seconds of training (compile included, evaluations
left out; ours from metrics.jsonl's val rows). Prints a Markdown table (BENCHMARKS.md, "Optimizers and schedules"),
then every run's evaluations, also written to --out/curves.json.
Needs a CUDA GPU for the presets' speed; --config and --train_args let it run anywhere (tests/test_time_to_target.py).
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from speedgpt.measure import error_line  # noqa: E402
RECIPES = {"adamw": [], "muon": ["--config=config/muon.py"]}     # muon: Muon + WSD laid over --config
LAUNCHER = r'''import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
snapshots, clock = {snapshots!r}, {{"start": None, "paused": 0.0, "since": None, "rows": []}}
src = open("train.py").read()
anchors = ("t0 = time.time()\nlocal_iter_num = 0", "        losses = estimate_loss()\n")
missing = [a for a in anchors if a not in src]
if missing:
    sys.exit(f"error: nanoGPT's train.py has changed (no {{missing[0].strip()!r}}): use the pinned commit")
def _tt_start():
    clock["start"] = time.perf_counter()
def _tt_eval(iter_num, raw_model, tokens, model_args):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    now = time.perf_counter()
    if iter_num > 0:
        path = os.path.join(snapshots, f"iter{{iter_num:06d}}.pt")
        torch.save({{"model": {{k.removeprefix("_orig_mod."): v for k, v in raw_model.state_dict().items()}},
                    "model_args": model_args}}, path)
        clock["rows"].append({{"step": iter_num, "tokens": iter_num * tokens, "path": path,
                              "train_seconds": now - clock["start"] - clock["paused"]}})
        with open(os.path.join(snapshots, "rows.json"), "w") as f:
            json.dump(clock["rows"], f)
    clock["since"] = now
def _tt_resume():
    clock["paused"] += time.perf_counter() - clock["since"]
src = src.replace(anchors[0], "_tt_start()\n" + anchors[0])
src = src.replace(anchors[1], "        _tt_eval(iter_num, raw_model, tokens_per_iter, model_args)\n" + anchors[1]
                  + "        _tt_resume()\n")
sys.argv = ["train.py", *{argv!r}]
exec(compile(src, "train.py", "exec"), {{"__name__": "__main__", "_tt_start": _tt_start, "_tt_eval": _tt_eval,
                                       "_tt_resume": _tt_resume}})
'''


def python_files(roots=None):
    """[(path, bytes)] of every .py file under `roots` (default: this Python's library folders and sys.path
    outside ROOT), sorted by path, the first of each content kept."""
    if roots is None:
        paths = sysconfig.get_paths()
        roots = {paths[k] for k in ("stdlib", "purelib", "platlib")} | set(sys.path)
        roots = {os.path.realpath(r) for r in roots if r and os.path.isdir(r)}
        roots = {r for r in roots if not r.startswith(os.path.realpath(ROOT))}
    seen, out = set(), []
    for path in sorted({os.path.join(d, f) for r in roots for d, _, fs in os.walk(r) for f in fs if f.endswith(".py")}):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        digest = hashlib.sha256(data).digest()
        if digest not in seen:
            seen.add(digest)
            out.append((path, data))
    return out


def prepare_corpus(out, roots=None, tokenizer="gpt2", val_frac=0.01):
    """Write the .py files as JSON lines and prepare them with data.py into out/data; returns that folder."""
    data_dir = os.path.join(out, "data")
    if os.path.isfile(os.path.join(data_dir, "meta.json")):
        return data_dir
    files = python_files(roots)
    corpus = os.path.join(out, "python_files.jsonl")
    with open(corpus, "w") as f:
        for _, data in files:
            f.write(json.dumps({"text": data.decode("utf-8", errors="replace")}) + "\n")
    print(f"corpus: {len(files):,} distinct .py files, {sum(len(d) for _, d in files) / 1e6:,.1f} MB", flush=True)
    subprocess.run([sys.executable, "data.py", "--input", corpus, "--out", data_dir, "--tokenizer", tokenizer,
                    "--val_frac", str(val_frac)], cwd=ROOT, check=True)
    return data_dir


def evals(out_dir):
    """[(step, val_loss, tokens, train_seconds)] of a run's metrics.jsonl."""
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(r["step"], r["val_loss"], r.get("tokens"), r.get("train_seconds")) for r in rows if "val_loss" in r]


def warmup(args):
    """Warm-up steps of every run: config/fast.py's 100, at most a fifth of a short run."""
    return min(100, max(1, args.max_iters // 5))


def first_at_or_below(rows, target):
    """The first (step, val_loss, tokens, train_seconds) of `rows` past step 0 with val_loss <= target, or None."""
    return next((r for r in rows if r[0] > 0 and r[1] is not None and r[1] <= target), None)


def flat_bins(data_dir, out):
    """nanoGPT's train.bin / val.bin (flat uint16 tokens) from our shards, and for a vocabulary other than
    GPT-2's its meta.pkl (nanoGPT pads GPT-2's to 50,304 without one); returns the folder."""
    import pickle
    from data import load_meta, read_shard
    from speedgpt.shards import find_shards
    meta = load_meta(data_dir)
    if meta["tokenizer"] != "gpt2":
        with open(os.path.join(out, "meta.pkl"), "wb") as f:
            pickle.dump({"vocab_size": meta["vocab_size"]}, f)
    for split in ("train", "val"):
        with open(os.path.join(out, f"{split}.bin"), "wb") as f:
            for path in find_shards(data_dir, split):
                f.write(np.asarray(read_shard(path), dtype=np.uint16).tobytes())
    return out


def launch_nanogpt(nanogpt, argv, run_dir):
    """nanoGPT's train.py with `argv`, through LAUNCHER; returns its evaluations' rows (step, tokens, seconds of
    training, the path of the weights' copy), [] when it made none (its log: run_dir/train.log)."""
    snapshots = os.path.abspath(os.path.join(run_dir, "snapshots"))
    shutil.rmtree(snapshots, ignore_errors=True)        # never the rows of an earlier invocation
    os.makedirs(snapshots)
    launcher = os.path.join(run_dir, "launch_train.py")
    with open(launcher, "w") as f:
        f.write(LAUNCHER.format(snapshots=snapshots, argv=argv))
    with open(os.path.join(run_dir, "train.log"), "w") as log:
        subprocess.run([sys.executable, os.path.abspath(launcher)], cwd=os.path.abspath(nanogpt), stdout=log,
                       stderr=subprocess.STDOUT)
    rows = os.path.join(snapshots, "rows.json")
    if not os.path.isfile(rows):
        return []
    with open(rows) as f:
        return json.load(f)


def nanogpt_run(nanogpt, data_dir, out, args):
    """nanoGPT's train.py on our data (config/fast.py's step, learning rate and schedule); its evaluations'
    copies scored by our evaluator: [(step, val_loss, tokens, train_seconds)]."""
    run_dir = os.path.join(out, "nanogpt")
    os.makedirs(run_dir, exist_ok=True)
    bins = flat_bins(data_dir, run_dir)
    argv = [f"--dataset={os.path.abspath(bins)}", f"--out_dir={os.path.abspath(run_dir)}", "--batch_size=64",
            "--gradient_accumulation_steps=8", f"--max_iters={args.max_iters}", f"--lr_decay_iters={args.max_iters}",
            f"--warmup_iters={warmup(args)}", "--learning_rate=6e-4", "--min_lr=6e-5", f"--eval_interval={args.eval_interval}",
            "--eval_iters=1", "--always_save_checkpoint=False", "--log_interval=10", *" ".join(args.nanogpt_args).split()]
    return [(r["step"], score(r["path"], data_dir), r["tokens"], r["train_seconds"])
            for r in launch_nanogpt(nanogpt, argv, run_dir)]


def score(weights, data_dir):
    """Our evaluator's val loss of a nanoGPT snapshot (its state dict and model_args) on our whole val split,
    without the document mask (it was trained on the plain token stream)."""
    import torch
    from contextlib import nullcontext
    from data import Loader, load_meta
    from model import GPT, GPTConfig
    from speedgpt.evaluation import estimate_loss
    device = "cuda" if torch.cuda.is_available() else "cpu"
    meta = load_meta(data_dir)
    snapshot = torch.load(weights, map_location="cpu", weights_only=True)
    shape = {k: snapshot["model_args"][k] for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "bias")}
    model = GPT(GPTConfig(**shape))
    state = snapshot["model"]
    for key in ("transformer.wte.weight", "lm_head.weight"):     # our table pads the vocabulary to a multiple of 64
        rows = model.state_dict()[key].size(0) - state[key].size(0)
        state[key] = torch.nn.functional.pad(state[key], (0, 0, 0, rows))
    model.load_state_dict(state)
    model.to(device)
    loader = Loader(data_dir, "val", batch_size=16, block_size=shape["block_size"], device=device, seed=1, packing=True,
                    document_mask=False, eot=meta["eot_id"], vocab_size=meta["vocab_size"])
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else nullcontext()
    token_bytes = torch.ones(meta["vocab_size"], device=device)
    return estimate_loss(model, loader, loader.n_rows, ctx, token_bytes)[0]


def curves_table(curves):
    """Every run's evaluations as Markdown rows (val loss, then training seconds, per evaluated step): the table
    says where each run crossed the target, these say how it got there."""
    steps = sorted({r[0] for curve in curves.values() for r in curve if r[0] > 0})
    rows = ["| run | " + " | ".join(map(str, steps)) + " |", "|---|" + "---:|" * len(steps)]
    for (name, seed), curve in curves.items():
        at = {r[0]: r for r in curve}
        for label, i, spec in (("val loss", 1, ".4f"), ("seconds", 3, ".1f")):
            cells = (format(at[s][i], spec) if s in at and at[s][i] is not None else "" for s in steps)
            rows.append(f"| {name} {seed}, {label} | " + " | ".join(cells) + " |")
    return rows


# train.py flags each run gets from this script's own settings: --train_args may not set them
OWN_KEYS = ("config", "data_dir", "out_dir", "max_iters", "lr_decay_iters", "warmup_iters", "seed", "eval_interval",
            "eval_tokens", "save_checkpoints", "hellaswag")


class Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, as every refusal of this script
        sys.exit(f"error: {message} (python benchmarks/time_to_target.py --help lists every flag)")


class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def train_argv(args, name, seed, data_dir, out_dir):
    """train.py's flags for recipe `name` at `seed`: the preset, this script's settings, the recipe, --train_args."""
    return [*([f"--config={args.config}"] if args.config else []), f"--data_dir={os.path.abspath(data_dir)}",
            f"--out_dir={os.path.abspath(out_dir)}", f"--max_iters={args.max_iters}", f"--lr_decay_iters={args.max_iters}",
            f"--seed={seed}", f"--warmup_iters={warmup(args)}", f"--eval_interval={args.eval_interval}",
            "--eval_tokens=1000000000", "--save_checkpoints=False", "--hellaswag=off", *RECIPES[name],
            *" ".join(args.train_args).split()]


def preflight(args, runs, seeds, data_dir):
    """Check every run's flags as train.py does (its check_flags: keys, values, this device) before the corpus is
    prepared and the first run starts; exits in one line naming the problem."""
    import contextlib
    import io
    import warnings
    import torch
    import train
    from configurator import load_config
    from speedgpt import memory
    from speedgpt.distributed import Proc
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    for name in runs:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                cfg = load_config(train_argv(args, name, seeds[0], data_dir, os.path.join(args.out, f"{name}_{seeds[0]}")))
                resolved = train.check_flags(cfg, Proc(0, 0, 1, device))
                if not os.path.isfile(os.path.join(data_dir, "meta.json")):   # the corpus to come: GPT-2's tokens
                    memory.check(resolved, memory.GPT2_VOCAB, device)          # (check_flags skips a missing folder)
        except (ValueError, TypeError, FileNotFoundError) as e:
            sys.exit(f"error: the {name} runs: {e} (train.py's flags go through --train_args; without a CUDA GPU: "
                     "--config '' and a small model there)")


def main(argv=None):
    head, rest = __doc__.strip().split("\n\n", 1)
    p = Parser(description=head, epilog=rest, allow_abbrev=False, formatter_class=Help)
    p.add_argument("--runs", default="adamw,muon", help="comma-separated recipes: " + ", ".join(RECIPES))
    p.add_argument("--seeds", default="1337,1338", help="comma-separated: each recipe runs once per seed")
    p.add_argument("--target", type=float, default=0.0, help="val loss; 0: the highest final val loss of the runs")
    p.add_argument("--max_iters", type=int, default=150, help="optimizer steps of every run (the schedules' horizon)")
    p.add_argument("--eval_interval", type=int, default=10, help="steps between evaluations (the whole val split)")
    p.add_argument("--config", default="config/fast.py", help="our preset; '' for train.py's defaults")
    p.add_argument("--data_dir", default="", help="a prepared folder instead of the .py files of this Python")
    p.add_argument("--train_args", action="append", default=[], help="more train.py flags for our runs, "
                   "space-separated: --train_args=\"--a=1 --b=2\" (with the =: they start with dashes); repeats add up")
    p.add_argument("--nanogpt", help="a clone of karpathy/nanoGPT: its train.py on the same tokens (GPT-2 124M)")
    p.add_argument("--nanogpt_args", action="append", default=[], help="more flags for nanoGPT's train.py, "
                   "space-separated: --nanogpt_args=\"--device=cpu --compile=False --n_layer=2\" (with the =)")
    p.add_argument("--out", default="bench_out/time_to_target", help="the corpus, the runs' folders and logs")
    args = p.parse_args(argv)
    runs = list(dict.fromkeys(r.strip() for r in args.runs.split(",") if r.strip()))     # each recipe once
    if not runs or any(r not in RECIPES for r in runs):
        sys.exit(f"error: --runs {args.runs!r}: the recipes are {', '.join(RECIPES)}")
    if args.nanogpt and not os.path.isfile(os.path.join(args.nanogpt, "train.py")):
        sys.exit(f"error: no nanoGPT train.py in {args.nanogpt!r}: give --nanogpt PATH (a clone of karpathy/nanoGPT)")
    for key in ("max_iters", "eval_interval"):
        if getattr(args, key) < 1:
            sys.exit(f"error: --{key} {getattr(args, key)}: give a positive number of steps")
    if args.eval_interval > args.max_iters:
        sys.exit(f"error: --eval_interval {args.eval_interval} is longer than the run (--max_iters {args.max_iters}): "
                 "the table would have one evaluation, the last; give an --eval_interval of a few steps")
    if not math.isfinite(args.target) or args.target < 0:
        sys.exit(f"error: --target {args.target}: a finite val loss, or 0 for the highest final one of the runs")
    own = [a.split("=")[0] for a in " ".join(args.train_args).split() if a.startswith("--") and a[2:].split("=")[0] in OWN_KEYS]
    if own:
        sys.exit(f"error: --train_args sets {own[0]}, which this script sets for every run: use its own flag "
                 "(--config, --data_dir, --out, --max_iters, --eval_interval, --seeds), the same for every trainer")
    try:
        seeds = list(dict.fromkeys(int(s) for s in args.seeds.split(",") if s.strip()))
    except ValueError:
        sys.exit(f"error: --seeds {args.seeds!r}: comma-separated integers, e.g. --seeds 1337,1338")
    if not seeds:
        sys.exit("error: --seeds is empty: give one or more, e.g. --seeds 1337,1338")
    if args.data_dir and not os.path.isfile(os.path.join(args.data_dir, "meta.json")):
        sys.exit(f"error: --data_dir {args.data_dir!r} is not a prepared folder (no meta.json): prepare one with "
                 "data.py (docs/data.md), or leave --data_dir out for the .py files of this Python")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        sys.exit(f"error: cannot create --out {args.out}: {e.strerror}; choose another --out")
    preflight(args, runs, seeds, args.data_dir or os.path.join(args.out, "data"))
    data_dir = args.data_dir or prepare_corpus(args.out)
    curves = {}
    for name in runs:
        for seed in seeds:
            out_dir = os.path.join(args.out, f"{name}_{seed}")
            cmd = [sys.executable, "train.py", *train_argv(args, name, seed, data_dir, out_dir)]
            shutil.rmtree(out_dir, ignore_errors=True)      # never the metrics of an earlier invocation
            with open(out_dir + ".log", "w") as log:
                rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
            if rc != 0:                                     # the next runs would fail alike (data, device, flags)
                sys.exit(f"error: run {name} seed {seed} failed: {error_line(out_dir + '.log').removeprefix('error: ')} "
                         f"(log: {out_dir}.log)")
            curves[f"ours, {name}", seed] = evals(out_dir)
            print(f"{name} seed {seed}: final val {curves[f'ours, {name}', seed][-1][1]:.4f}", flush=True)
    if args.nanogpt:
        curves["nanoGPT train.py", 1337] = nanogpt_run(args.nanogpt, data_dir, args.out, args)
    if args.nanogpt and not curves["nanoGPT train.py", 1337]:
        sys.exit(f"error: nanoGPT's train.py made no evaluation: {error_line(os.path.join(args.out, 'nanogpt', 'train.log'))}"
                 f" (log: {os.path.join(args.out, 'nanogpt', 'train.log')})")
    finals = [c[-1][1] for c in curves.values() if c]
    target = args.target or (max(finals) if finals else 0.0)
    rows = [f"Target val loss {target:.4f} ({'given' if args.target else 'the highest final'}); {args.max_iters} steps, "
            f"evaluated every {args.eval_interval} on the whole val split of {data_dir}", "",
            "| trainer, recipe | seed | reached at step | tokens | training seconds | final val loss |",
            "|---|---:|---:|---:|---:|---:|"]
    for (name, seed), curve in curves.items():
        hit = first_at_or_below(curve, target)
        final = f"{curve[-1][1]:.4f}" if curve else "failed"
        rows.append(f"| {name} | {seed} | " + (f"{hit[0]} | {hit[2]:,.0f} | {hit[3]:.1f} | {final} |" if hit else
                                                f"not reached | | | {final} |"))
    rows += ["", "Each run's evaluations (step: val loss, seconds of training):", "", *curves_table(curves)]
    print("\n".join(rows))
    with open(os.path.join(args.out, "curves.json"), "w") as f:       # the numbers behind both tables
        keys = ("step", "val_loss", "tokens", "train_seconds")
        json.dump({"target": target, "runs": [{"run": name, "seed": seed, "evals": [dict(zip(keys, r)) for r in curve]}
                                              for (name, seed), curve in curves.items()]}, f, indent=1)


if __name__ == "__main__":
    main()
