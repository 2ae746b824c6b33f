"""
Time to a target validation loss, the field's measure of a trainer (modded-nanogpt: time to 3.28 on FineWeb), by a
protocol fair to every recipe: each at its own best setting, found by the same sweep, against a target fixed before
the runs, over several seeds. One command, one table.

    python benchmarks/time_to_target.py --target 3.74                # AdamW + cosine against Muon + WSD, GPT-2 124M
    python benchmarks/time_to_target.py --target 3.74 --minutes 1.5  # at a fixed wall clock: the best model in 1.5 min

1. The corpus: every .py file of this Python installation (its standard library, site-packages and the folders
   on sys.path outside this repository), one document each, files deduplicated by content hash: hundreds of MB of
   real text with no download. Prepared once with the GPT-2 tokenizer into --out/data (or give --data_dir).
2. The target, --target: a validation loss fixed before the runs (never one run's endpoint, which would make that
   run the yardstick). Every evaluation is on the whole val split, the same tokens for every run.
3. The sweep, at the first of --seeds: for each recipe of --recipes (adamw: --config as shipped, AdamW + cosine; muon:
   config/muon.py laid over it, Muon + WSD), every tokens per optimizer step of --batch_tokens (train.py's
   total_batch_size; a step below the preset's micro-batch is one micro-batch of that many rows) with every peak
   learning rate of --lr_scales (times the recipe's own: learning_rate for adamw, muon_lr for muon; min_lr keeps
   its share), each run on the same --tokens (its steps follow, and its schedule's horizon), warming up over
   --warmup_frac of its steps and evaluated every --eval_every tokens.
   With --minutes M, each run trains M minutes of training time instead (train.py's time_budget: the schedule
   decays over the time, max_iters only a bound), with the warm-up and evaluations of the --tokens runs.
4. The best setting of each recipe: the one that reached the target in the fewest seconds of training (then the
   fewest tokens; among runs at its tokens per step that reached it at the same evaluation, whose seconds differ
   by noise alone, the lowest final val loss); when none did, the lowest final val loss. With --minutes: the lowest
   final val loss.
5. That setting at the other seeds (the sweep's run is the first seed's). The table: per recipe, how many seeds
   reached the target, and the seconds and tokens to it and the final val loss, each as mean +- standard deviation.
6. With --blocks, the blocks the field trains besides GPT-2's (BLOCKS: one model flag each, all of them, or all
   but one: modern-relu2), each at every seed at each recipe's best setting for GPT-2's block (not swept again): a
   row per recipe and block.

Seconds are train.py's training clock (speedgpt/budget.py): evaluations and checkpoints apart, and the first step's
compile too (counted at the second step's time), so a cold compile cache robs no run; the compile is a column of
its own. Prints the sweep, then the table, last; writes both tables' rows and every run's evaluations to
--out/time_to_target.json. Every finished run is also appended to --out/runs.jsonl; --resume takes each run found
there with the same flags, data, training code and device (its evaluations checked against this --target) instead
of training it again, so a sweep longer than one sitting (28 runs by default) continues where it stopped. --nanogpt
adds karpathy/nanoGPT's own train.py on the same tokens (its AdamW + cosine at
config/fast.py's step and learning rate, one run: its seed is fixed in its file), each evaluation's copy of its
weights scored by our evaluator on our val tokens (without the document mask, as it was trained); its file is run
unedited, a launcher times its loop around its evaluations (LAUNCHER below), its seconds include its compile.
Needs a CUDA GPU for the presets' speed; --config and --train_args let it run anywhere (tests/test_time_to_target.py).
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import configurator  # noqa: E402
from speedgpt.corpus import sigterm_as_interrupt  # noqa: E402
from speedgpt.measure import append_record, error_line, read_records  # noqa: E402
# each recipe: the config laid over --config, and the peak learning rate its sweep scales
RECIPES = {"adamw": ([], "learning_rate"), "muon": ([f"--config={os.path.join(ROOT, 'config', 'muon.py')}"], "muon_lr")}
NANOGPT_STEP = 64 * 1024 * 8                # tokens per step of nanoGPT's GPT-2 124M config: config/fast.py's
MAX_STEPS = 10**9                           # --minutes: train.py's max_iters, a bound the time budget ends before
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
    """nanoGPT's train.py on our data (config/fast.py's step, learning rate and schedule) on --tokens; its evaluations'
    copies scored by our evaluator: [(step, val_loss, tokens, train_seconds)]."""
    run_dir = os.path.join(out, "nanogpt")
    os.makedirs(run_dir, exist_ok=True)
    bins = flat_bins(data_dir, run_dir)
    steps = args.tokens // NANOGPT_STEP
    argv = [f"--dataset={os.path.abspath(bins)}", f"--out_dir={os.path.abspath(run_dir)}", "--batch_size=64",
            "--gradient_accumulation_steps=8", f"--max_iters={steps}", f"--lr_decay_iters={steps}",
            f"--warmup_iters={round(args.warmup_frac * steps)}", "--learning_rate=6e-4", "--min_lr=6e-5",
            f"--eval_interval={args.eval_every // NANOGPT_STEP}", "--eval_iters=1", "--always_save_checkpoint=False",
            "--log_interval=10", *" ".join(args.nanogpt_args).split()]
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


# train.py flags each run gets from this script's own settings: --train_args may not set them (learning_rate, min_lr
# and muon_lr it may: they centre the sweep)
RECIPE_KEYS = ("optimizer", "lr_schedule", "wsd_decay_frac")     # what a recipe is: --recipes chooses them
# --blocks: GPT-2's block with one change of the field's (model.py's GPTConfig fields; docs/flags.md), and "modern",
# all of them at once (modded-nanogpt's and nanochat's block has each)
BLOCKS = {"rmsnorm": ["--norm=rmsnorm"], "rope": ["--rope=True"], "qk_norm": ["--qk_norm=True"],
          "relu2": ["--activation=relu2"],
          "untied": ["--tie_embeddings=False"]}
BLOCKS["modern"] = [flag for flags in BLOCKS.values() for flag in flags]
# "modern-NAME": the five without NAME, which says what NAME adds among the others (alone it may differ: relu2 and
# untied ended higher than GPT-2's block alone, BENCHMARKS.md)
BLOCKS.update({f"modern-{name}": [flag for other, flags in BLOCKS.items() if other not in (name, "modern")
                                  for flag in flags] for name in list(BLOCKS)[:-1]})
BLOCK_KEYS = (*configurator.GPT2_BLOCKS, "activation")      # the model flags of BLOCKS: GPT-2's value is its block's
OWN_KEYS = ("config", "data_dir", "out_dir", "max_iters", "lr_decay_iters", "warmup_iters", "seed", "eval_interval",
            "eval_tokens", "save_checkpoints", "hellaswag", "total_batch_size", "time_budget", "target_val_loss")


class Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, as every refusal of this script
        sys.exit(f"error: {message} (python benchmarks/time_to_target.py --help lists every flag)")


class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def base_argv(args, recipe):
    """train.py's flags every run of `recipe` shares: the preset, the recipe's config, --train_args."""
    preset = [f"--config={args.config}"] if args.config else []
    return [*preset, *RECIPES[recipe][0], *" ".join(args.train_args).split()]


def settings(args, recipe, base):
    """The sweep of `recipe`: [{"batch_tokens", "lr_scale", "lr": {key: value}}] (a --blocks row's setting adds
    "block": its name in BLOCKS), the peak learning rates `base`'s
    (a train.py Config) times each scale; for adamw min_lr keeps its share of learning_rate. A step smaller than the
    preset's micro-batch (a whole number of rows) gets "batch_size", the micro-batch of that step: the sweep can go
    below the preset's micro-batch without --train_args changing every run's."""
    key = RECIPES[recipe][1]
    out = []
    for batch in args.batch_tokens:
        for scale in args.lr_scales:
            lr = {key: getattr(base, key) * scale}
            if key == "learning_rate":
                lr["min_lr"] = base.min_lr * scale
            out.append({"batch_tokens": batch, "lr_scale": scale, "lr": lr})
            if batch < base.batch_size * base.block_size and batch % base.block_size == 0:
                out[-1]["batch_size"] = batch // base.block_size
    return out


def train_argv(args, recipe, setting, seed, data_dir, out_dir):
    """train.py's flags for one run: `setting` of `recipe` at `seed`, on --tokens (or --minutes of training)."""
    batch = setting["batch_tokens"]
    steps = args.tokens // batch
    length = ([f"--max_iters={MAX_STEPS}", f"--time_budget={args.minutes}", "--lr_decay_iters=0"] if args.minutes else
              [f"--max_iters={steps}", f"--lr_decay_iters={steps}"])
    base = base_argv(args, recipe)
    if "batch_size" in setting:          # the setting's micro-batch replaces --train_args' (no flag given twice)
        base = configurator.without_keys(base, {"batch_size"})
    return [*base, f"--data_dir={os.path.abspath(data_dir)}",
            f"--out_dir={os.path.abspath(out_dir)}", f"--total_batch_size={batch}", *length,
            *([f"--batch_size={setting['batch_size']}"] if "batch_size" in setting else []),
            f"--warmup_iters={round(args.warmup_frac * steps)}",
            f"--eval_interval={args.eval_every // batch}", f"--seed={seed}", "--eval_tokens=1000000000",
            "--save_checkpoints=False", "--hellaswag=off", *(f"--{k}={v!r}" for k, v in setting["lr"].items()),
            *BLOCKS.get(setting.get("block"), [])]


def run_name(recipe, setting, seed):
    block = f"_{setting['block']}" if setting.get("block") else ""
    return f"{recipe}{block}_b{setting['batch_tokens']}_lr{setting['lr_scale']:g}_s{seed}"


def train_run(args, recipe, setting, seed, data_dir):
    """One train.py process (a fresh one: nothing carried over but the compile cache); exits in one line if it fails.
    Returns its row: the setting, the seed, its evaluations [(step, val_loss, tokens, train_seconds)], the first
    at or below the target (or None), the final val loss and the first step's compile (summary.json's compile_s)."""
    out_dir = os.path.join(args.out, run_name(recipe, setting, seed))
    shutil.rmtree(out_dir, ignore_errors=True)          # never the metrics of an earlier invocation
    with open(out_dir + ".log", "w") as log:
        cmd = [sys.executable, "train.py", *train_argv(args, recipe, setting, seed, data_dir, out_dir)]
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:                                         # the next runs would fail alike (data, device, flags)
        sys.exit(f"error: run {run_name(recipe, setting, seed)} failed: "
                 f"{error_line(out_dir + '.log').removeprefix('error: ')} (log: {out_dir}.log)")
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    curve = evals(out_dir)
    return result(recipe, setting, seed, curve, args.target, summary.get("compile_s"))


# what a run's result depends on besides its flags: the training code (a changed file makes every stored run stale).
# Not config/: run_key holds what a preset sets, so a new preset or a header's numbers keep the stored runs.
CODE = ("train.py", "model.py", "data.py", "configurator.py", "speedgpt")


def code_hash(root=ROOT):
    """sha256 of the training code's files (CODE under root: their paths and contents)."""
    h = hashlib.sha256()
    for entry in CODE:
        top = os.path.join(root, entry)
        paths = [top] if os.path.isfile(top) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs if f.endswith(".py"))
        for path in paths:
            with open(path, "rb") as f:
                h.update(os.path.relpath(path, root).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def device_name():
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def data_hash(data_dir):
    """sha256 of a prepared folder: its meta.json's counts and settings (not where it was read from) and every
    shard's bytes, so that other tokens under the same counts are another data set."""
    from speedgpt.shards import find_shards
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = {k: v for k, v in json.load(f).items() if k != "input"}
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    for split in ("train", "val"):
        try:
            paths = find_shards(data_dir, split)
        except FileNotFoundError:       # train.py's own check says what is missing, in the run's one line
            paths = []
        for path in paths:
            with open(path, "rb") as f:
                h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()


def run_key(args, recipe, setting, seed, data, code, device):
    """What identifies a run for --resume: the settings its train.py flags resolve to (configurator's Config, so the
    order and the form of --train_args do not matter, and each --config file counts by what it sets; the run and data
    folders left out: the data count by data_hash, `data`), the training code's hash and the device; a hex digest.
    The target is not in it: a run's evaluations are kept, and the target is checked anew."""
    import contextlib
    import dataclasses
    import io
    import warnings
    from configurator import load_config
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # preflight said them
        cfg = dataclasses.asdict(load_config(train_argv(args, recipe, setting, seed, "", "")))
    settings = {k: v for k, v in sorted(cfg.items()) if k not in ("out_dir", "data_dir")}
    return hashlib.sha256(json.dumps([settings, data, code, device], default=str).encode()).hexdigest()


# a run's setting: settings()'s keys (batch_size only below the preset's micro-batch); a --blocks row adds "block"
SETTING = ("batch_tokens", "batch_size", "lr_scale", "lr")


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Store:
    """--out/runs.jsonl: every finished run of ours, one line each (its key and its row), appended as it ends. With
    resume, a run whose key is there is taken from it instead of trained again: a sweep stopped midway (a timeout,
    a lost machine) continues where it stopped, and any change to the flags, the data, the code or the device
    trains anew. A taken run's evaluations are checked against this invocation's target."""

    ROW = ("recipe", "batch_tokens", "lr_scale", "lr", "seed", "evals", "compile_s")

    def __init__(self, path, resume):
        self.path, self.rows, self.reused = path, {}, 0
        if not (resume and os.path.isfile(path)):
            return
        entries, cut = read_records(path)
        bad = len(cut)
        for entry in entries:
            row = entry.get("row")
            if not (isinstance(entry.get("key"), str) and isinstance(row, dict) and all(k in row for k in self.ROW)
                    and isinstance(row["evals"], list) and isinstance(row["lr"], dict)
                    and all(isinstance(e, list) and len(e) == 4 and all(map(number, e)) for e in row["evals"])
                    and all(map(number, (row["batch_tokens"], row["lr_scale"], row["seed"], *row["lr"].values())))
                    and (row["compile_s"] is None or number(row["compile_s"])) and isinstance(row["recipe"], str)
                    and (type(row.get("batch_size", 1)) is int and row.get("batch_size", 1) > 0)   # it sets a flag
                    and isinstance(row.get("block", ""), str)):
                bad += 1                    # not a row this script wrote whole
                continue
            row["evals"] = [tuple(e) for e in row["evals"]]
            self.rows[entry["key"]] = row
        print(f"--resume: {len(self.rows)} finished run(s) in {path}" +
              (f"; {bad} line(s) that are not a run passed over (cut by a stop?)" if bad else ""), flush=True)

    def run(self, key, train, target):
        """The stored row of `key` (its evaluations checked against `target`), or train() stored first."""
        if key in self.rows:
            self.reused += 1
            r = self.rows[key]
            return result(r["recipe"], {k: r[k] for k in (*SETTING, "block") if k in r},
                          r["seed"], r["evals"], target, r["compile_s"])
        row = train()
        append_record(self.path, {"key": key, "row": row})
        return row


def result(recipe, setting, seed, curve, target, compile_s):
    """A run's row (train_run's) from its evaluations."""
    return {"recipe": recipe, **setting, "seed": seed, "evals": curve, "hit": first_at_or_below(curve, target),
            "final": curve[-1][1] if curve else None, "compile_s": compile_s}


def best(rows, by_time=True):
    """The best of one recipe's sweep rows: by_time, the one that reached the target in the fewest seconds (then the
    fewest tokens), or, when none did, the lowest final val loss; else (--minutes) the lowest final val loss.
    Runs at the fastest one's tokens per step that reached the target at its evaluation did the same steps to get
    there: their seconds differ by the GPU's noise alone, so the lowest final val loss picks among them. Ties keep the
    earlier row (the sweep's order)."""
    def final(r):
        return math.inf if r["final"] is None else r["final"]
    reached = [r for r in rows if r["hit"]]
    if by_time and reached:
        fastest = min(reached, key=lambda r: (r["hit"][3], r["hit"][2]))
        return min((r for r in reached if (r["batch_tokens"], r["hit"][2]) == (fastest["batch_tokens"],
                                                                              fastest["hit"][2])), key=final)
    return min(rows, key=final)


def spread(xs, spec):
    """'mean +- sd' of xs (the sample standard deviation; one value: the value), formatted with spec; '' for none."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return ""
    return format(statistics.mean(xs), spec) + (f" ± {format(statistics.stdev(xs), spec)}" if len(xs) > 1 else "")


def lr_text(setting):
    return ", ".join(f"{k} {v:.3g}" for k, v in setting["lr"].items() if k != "min_lr")


def sweep_table(rows):
    """Every setting of the sweep, one row each: where it reached the target, and its final val loss."""
    out = ["| recipe | tokens per step | peak lr | time to target, s | tokens to target | final val loss |",
           "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        hit = f"{r['hit'][3]:.1f} | {r['hit'][2]:,}" if r["hit"] else "not reached | "
        out.append(f"| {r['recipe']} | {r['batch_tokens']:,} | {lr_text(r)} | {hit} | {r['final']:.4f} |")
    return out


def final_rows(seeded, nanogpt=None):
    """The table's rows: per recipe (its best setting's runs, one per seed), seeds that reached the target, seconds
    and tokens to it and the final val loss as mean +- sd, and the first step's compile; nanoGPT's run last."""
    out = []
    for recipe, runs in seeded.items():
        hits = [r["hit"] for r in runs if r["hit"]]
        out.append({"recipe": recipe, "batch_tokens": runs[0]["batch_tokens"], "lr": runs[0]["lr"],
                    "lr_scale": runs[0]["lr_scale"], "seeds": [r["seed"] for r in runs], "reached": len(hits),
                    "train_seconds": [h[3] for h in hits], "tokens": [h[2] for h in hits],
                    "final": [r["final"] for r in runs], "compile_s": [r["compile_s"] for r in runs]})
    if nanogpt is not None:
        out.append({"recipe": "nanoGPT train.py", "batch_tokens": NANOGPT_STEP, "lr": {"learning_rate": 6e-4},
                    "lr_scale": None, "seeds": ["fixed"], "reached": int(bool(nanogpt["hit"])),
                    "train_seconds": [nanogpt["hit"][3]] if nanogpt["hit"] else [],
                    "tokens": [nanogpt["hit"][2]] if nanogpt["hit"] else [], "final": [nanogpt["final"]],
                    "compile_s": [None]})
    return out


def table(rows):
    """The Markdown table of final_rows (and of benchmarks/vs_modded.py's row: its tokens per step a range, text,
    and its learning rates its own)."""
    out = ["| recipe | tokens per step | peak lr | reached | time to target, s | tokens to target | final val loss "
           "| compile, s |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        compile_s = spread(r["compile_s"], ".1f") or ("in the time" if r["recipe"].startswith("nanoGPT") else "")
        batch = r["batch_tokens"] if isinstance(r["batch_tokens"], str) else f"{r['batch_tokens']:,}"
        cells = [r["recipe"], batch, lr_text(r) or "its own", f"{r['reached']} of {len(r['seeds'])}",
                 spread(r["train_seconds"], ".1f"), spread(r["tokens"], ",.0f"), spread(r["final"], ".4f"), compile_s]
        out.append("| " + " | ".join(cells) + " |")
    return out


def edges(args, chosen):
    """Lines for each recipe whose best setting sits at an edge of a swept axis of several values: its optimum may lie
    beyond it."""
    out = []
    for recipe, r in chosen.items():
        for axis, value, flag in (("lr_scales", r["lr_scale"], "--lr_scales"),
                                  ("batch_tokens", r["batch_tokens"], "--batch_tokens")):
            values = getattr(args, axis)
            if len(values) > 1 and value in (min(values), max(values)):
                out.append(f"note: {recipe}'s best is at the edge of the sweep ({axis} {value:,}): its optimum may lie "
                           f"beyond; widen {flag}")
    return out


def inside_warmup(args, runs):
    """Lines for each --minutes run whose budget ended inside its warm-up (train.py says it in the run's log alone):
    its learning rate never reached its peak, so its loss says little of its recipe."""
    out = []
    for r in runs if args.minutes else []:
        warmup, last = round(args.warmup_frac * (args.tokens // r["batch_tokens"])), r["evals"][-1][0]
        if last < warmup:
            out.append(f"note: {r['recipe']}{', ' + r['block'] if r.get('block') else ''}, {r['batch_tokens']:,} "
                       f"tokens per step, lr x{r['lr_scale']:g}, seed {r['seed']}: its {args.minutes:g} minutes ended "
                       f"at step {last:,}, inside its warm-up ({warmup:,} steps): the learning rate never reached its "
                       "peak; give a smaller --warmup_frac (or --tokens, its scale) or more --minutes")
    return out


def ints(text, flag):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        sys.exit(f"error: {flag} {text!r}: comma-separated positive integers")
    return once(values, text, flag)


def once(values, text, flag):
    """`values` (parsed from `text`), or exit in one line naming one given twice: a repeat would run one setting
    or seed as if it were two (a seed's spread of one run)."""
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        sys.exit(f"error: {flag} {text!r} gives {twice:g} twice: give each once")
    return values


CPU_RUN_FLOP = 1e14     # a run's training FLOPs above which a CPU (memory.CPU_FLOP_PER_SEC) takes a quarter hour
CPU_EXAMPLE = ("python benchmarks/time_to_target.py --target 4 --config '' --data_dir data/stdlib_byte --recipes adamw "
               "--batch_tokens 256 --lr_scales 1 --seeds 1 --tokens 20480 --eval_every 4096 "
               "--train_args=\"--n_layer=2 --n_head=2 --n_embd=64 --block_size=64 --batch_size=4\"")


def preflight(args, recipes, data_dir):
    """Check every run's flags as train.py does (its check_flags: keys, values, this device; the batch plan) before the
    corpus is prepared and the first run starts; exits in one line naming the problem. Returns {recipe: its sweep}."""
    import contextlib
    import io
    import warnings
    from dataclasses import replace
    import torch
    import train
    from configurator import Config, load_config
    from speedgpt import memory
    from speedgpt.distributed import Proc, plan_batch
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    vocab = memory.vocab_size(data_dir) if os.path.isfile(os.path.join(data_dir, "meta.json")) else memory.GPT2_VOCAB
    sweeps, said = {}, {}
    for recipe in recipes:
        try:
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("always")
                plain = load_config(base_argv(args, "adamw"))          # the preset and --train_args alone
                given = [f"{k}={getattr(plain, k)!r}" for k in RECIPE_KEYS if getattr(plain, k) != getattr(Config, k)]
                if given:                   # else the table would name one recipe and the runs train another
                    sys.exit(f"error: --config {args.config} sets {', '.join(given)}, which the recipes set (adamw: "
                             "AdamW with a cosine schedule; muon: config/muon.py): give a size preset such as "
                             "config/fast.py and choose the recipe with --recipes")
                blocks = [f"{k}={getattr(plain, k)!r}" for k in BLOCK_KEYS if getattr(plain, k) != getattr(Config, k)]
                if blocks and args.blocks:  # else the rows named GPT-2's block would train another
                    sys.exit(f"error: --config {args.config} sets {', '.join(blocks)}, which --blocks sets for its "
                             "rows (the rows without a block are GPT-2's): give a preset of GPT-2's block such as "
                             "config/fast.py, or leave --blocks out")
                base = load_config(base_argv(args, recipe))
                flop = memory.meta_model(base, vocab).flops_per_token() * args.tokens
                if device.type == "cpu" and flop > CPU_RUN_FLOP:    # a GPU's work: said before its refusals
                    sys.exit(f"error: on a CPU, every run ({base.n_layer} layers, n_embd {base.n_embd}, "
                             f"{args.tokens:,} tokens) would train {flop / 1e12:,.0f} TFLOP, hours each: this "
                             "benchmark measures a GPU. A small run on a CPU (python train.py prepares "
                             f"data/stdlib_byte first): {CPU_EXAMPLE}")
                rows, micro = base.block_size, base.batch_size * base.block_size
                for step in args.batch_tokens:          # whole rows a micro-batch, whole micro-batches a step
                    if step % (rows if step < micro else micro):
                        sys.exit(f"error: --batch_tokens {step:,} is not a multiple of " + (
                            f"block_size {rows:,}: a step below the preset's micro-batch ({base.batch_size} x {rows:,} "
                            "tokens) runs as one micro-batch of whole rows" if step < micro else
                            f"the preset's micro-batch ({base.batch_size} x {rows:,} = {micro:,} tokens): give "
                            "multiples of it (or of a smaller --train_args=--batch_size)"))
                sweeps[recipe] = settings(args, recipe, base)
                # the largest step first: a GPU-sized step on a CPU gets every refusal in one line (train.py's)
                for setting in sorted(sweeps[recipe], key=lambda setting: -setting["batch_tokens"]):
                    # out_dir: --out itself, whose writability stands for its runs' (check_flags makes the folder)
                    cfg = load_config(train_argv(args, recipe, setting, args.seeds[0], data_dir, args.out))
                    # evaluation's size is this script's: train.py's advice to shrink it on a CPU would name a flag
                    # --train_args may not set
                    resolved = train.check_flags(replace(cfg, eval_tokens=min(cfg.eval_tokens, 65536)),
                                                 Proc(0, 0, 1, device), skip=(train.data,))    # the corpus to come
                    plan_batch(resolved, 1)
                    if not os.path.isfile(os.path.join(data_dir, "meta.json")):   # the corpus to come: GPT-2's
                        memory.fits(resolved, memory.GPT2_VOCAB, device,          # tokens (check_flags skips it)
                                    features=train.TRANSFORMS)
                largest = max(sweeps[recipe], key=lambda setting: setting["batch_tokens"])
                for block in args.blocks:            # at any setting of the sweep: the best is not known yet
                    cfg = load_config(train_argv(args, recipe, {**largest, "block": block}, args.seeds[0], data_dir,
                                                 args.out))
                    train.check_flags(replace(cfg, eval_tokens=min(cfg.eval_tokens, 65536)), Proc(0, 0, 1, device),
                                      skip=(train.data,))
        except (ValueError, TypeError, FileNotFoundError) as e:
            sys.exit(f"error: the {recipe} runs: {e} (train.py's flags go through --train_args" +
                     ("" if device.type == "cuda" else f"; a small run on a CPU: {CPU_EXAMPLE}") + ")")
        said.update(dict.fromkeys(str(w.message) for w in caught))
    for line in said:           # once here, as train.py says them (a flag given twice, a schedule): not in every run's
        print(f"warning: {line}", flush=True)                                                           # log alone
    return sweeps


def main(argv=None):
    head, rest = __doc__.strip().split("\n\n", 1)
    p = Parser(description=head, epilog=rest, allow_abbrev=False, formatter_class=Help)
    p.add_argument("--target", type=float, help="the val loss to reach, fixed before the runs (required)")
    p.add_argument("--recipes", default="adamw,muon", help="comma-separated: " + ", ".join(RECIPES))
    p.add_argument("--batch_tokens", default="65536,131072,262144,524288",
                   help="tokens per optimizer step to sweep (train.py's total_batch_size), comma-separated: "
                   "multiples of the preset's micro-batch, or below it multiples of block_size (a smaller micro-batch)")
    p.add_argument("--lr_scales", default="0.5,1,2", help="peak learning rates to sweep, as multiples of each "
                   "recipe's own (adamw: learning_rate, with min_lr; muon: muon_lr), comma-separated")
    p.add_argument("--tokens", type=int, default=100 * 524288, help="tokens of every run (a multiple of every "
                   "--batch_tokens); with --minutes, the scale of the warm-up and of --eval_every only")
    p.add_argument("--minutes", type=float, default=0.0, help="train every run this many minutes of training time "
                   "instead of --tokens (train.py's time_budget), and pick the lowest final val loss; 0: off")
    p.add_argument("--seeds", default="1337,1338,1339", help="comma-separated: the sweep at the first, the best "
                   "setting of each recipe at all of them")
    p.add_argument("--eval_every", type=int, default=0, help="tokens between evaluations (a multiple of every "
                   "--batch_tokens); 0: a tenth of --tokens")
    p.add_argument("--warmup_frac", type=float, default=0.2, help="each run's warm-up, a share of its steps "
                   "at --tokens (a fifth: the first comparison's 20 of 100)")
    p.add_argument("--blocks", default="", help="comma-separated, of " + ", ".join(b for b in BLOCKS if "-" not in b)
                   + " (all five) and modern-NAME (the five without NAME): each block at each recipe's best setting, "
                   "at every seed, a row of the table; '': GPT-2's block alone")
    p.add_argument("--config", default="config/fast.py", help="our preset; '' for train.py's defaults")
    p.add_argument("--data_dir", default="", help="a prepared folder instead of the .py files of this Python")
    p.add_argument("--train_args", action="append", default=[], help="more train.py flags for our runs, "
                   "space-separated: --train_args=\"--a=1 --b=2\" (with the =: they start with dashes); repeats add up")
    p.add_argument("--nanogpt", help="a clone of karpathy/nanoGPT: its train.py on the same tokens (GPT-2 124M)")
    p.add_argument("--nanogpt_args", action="append", default=[], help="more flags for nanoGPT's train.py, "
                   "space-separated: --nanogpt_args=\"--device=cpu --compile=False --n_layer=2\" (with the =)")
    p.add_argument("--out", default="bench_out/time_to_target", help="the corpus, the runs' folders and logs")
    p.add_argument("--resume", action="store_true", help="take each run already in --out/runs.jsonl with the same "
                   "flags, data, training code and device instead of training it again (a stopped sweep continues)")
    args = p.parse_args(argv)
    if args.target is None or not math.isfinite(args.target) or args.target <= 0:
        given = "--target is missing" if args.target is None else f"--target {args.target}"
        sys.exit(f"error: {given}: give the val loss to reach, a positive number fixed before the runs "
                 "(never one run's endpoint), e.g. --target 3.5")
    recipes = list(dict.fromkeys(r.strip() for r in args.recipes.split(",") if r.strip()))     # each recipe once
    if not recipes or any(r not in RECIPES for r in recipes):
        sys.exit(f"error: --recipes {args.recipes!r}: the recipes are {', '.join(RECIPES)}")
    if args.nanogpt_args and not args.nanogpt:
        sys.exit("error: --nanogpt_args without --nanogpt: they are flags for nanoGPT's train.py; add --nanogpt PATH "
                 "(a clone of karpathy/nanoGPT), or leave them out")
    if args.nanogpt and not os.path.isfile(os.path.join(args.nanogpt, "train.py")):
        sys.exit(f"error: no nanoGPT train.py in {args.nanogpt!r}: give --nanogpt PATH (a clone of karpathy/nanoGPT)")
    args.blocks = list(dict.fromkeys(b.strip() for b in args.blocks.split(",") if b.strip()))
    if any(b not in BLOCKS for b in args.blocks):
        sys.exit(f"error: --blocks {','.join(args.blocks)!r}: the blocks are "
                 f"{', '.join(b for b in BLOCKS if '-' not in b)} (all five) and modern-NAME (the five without NAME)")
    args.batch_tokens = sorted(ints(args.batch_tokens, "--batch_tokens"))
    args.seeds = ints(args.seeds, "--seeds")
    raw_scales = args.lr_scales
    try:
        args.lr_scales = sorted(once([float(v) for v in args.lr_scales.split(",") if v.strip()], raw_scales,
                                     "--lr_scales"))
    except ValueError:
        args.lr_scales = []
    if not args.lr_scales or not all(math.isfinite(v) and 0 < v <= 1e6 for v in args.lr_scales):
        sys.exit(f"error: --lr_scales {raw_scales!r}: comma-separated positive multiples (at most 1e6) of each "
                 "recipe's learning rate, e.g. 0.5,1,2")
    default_eval = not args.eval_every
    args.eval_every = args.eval_every or args.tokens // 10
    for flag, value in (("--tokens", args.tokens), ("--eval_every", args.eval_every)):
        odd = [b for b in args.batch_tokens if value <= 0 or value % b]
        if odd:
            given = "--eval_every's default (a tenth of --tokens)" if flag == "--eval_every" and default_eval else flag
            sys.exit(f"error: {given} {value:,} is not a positive multiple of --batch_tokens {odd[0]:,}: every run "
                     "takes whole steps on the same tokens" + ("; give --eval_every" if given != flag else ""))
    if args.eval_every > args.tokens and not args.minutes:
        sys.exit(f"error: --eval_every {args.eval_every:,} is more than --tokens {args.tokens:,}: no evaluation "
                 "before the last; give at most --tokens")
    if args.tokens // args.eval_every > 1000:
        sys.exit(f"error: --eval_every {args.eval_every:,}: more than 1,000 evaluations of --tokens {args.tokens:,}")
    if not math.isfinite(args.minutes) or args.minutes < 0:
        sys.exit(f"error: --minutes {args.minutes}: minutes of training per run, or 0 for --tokens")
    if not 0 <= args.warmup_frac < 1:
        sys.exit(f"error: --warmup_frac {args.warmup_frac}: a share of each run's steps, in [0, 1)")
    if args.nanogpt and (args.minutes or args.tokens % NANOGPT_STEP or args.eval_every % NANOGPT_STEP):
        sys.exit(f"error: --nanogpt runs nanoGPT's train.py at its {NANOGPT_STEP:,} tokens per step on --tokens: give "
                 "--tokens and --eval_every multiples of it, without --minutes (its train.py has no time budget)")
    given = [a.split("=")[0] for a in " ".join(args.train_args).split() if a.startswith("--")]
    own = [a for a in given if a[2:] in OWN_KEYS]
    if own:
        sys.exit(f"error: --train_args sets {own[0]}, which this script sets for every run: use its own flag "
                 "(--config, --data_dir, --out, --tokens, --minutes, --batch_tokens, --eval_every, --warmup_frac, "
                 "--seeds)")
    recipe = [a for a in given if a[2:] in RECIPE_KEYS]
    if recipe:                          # else the table would name one recipe and the runs train another
        sys.exit(f"error: --train_args sets {recipe[0]}, which the recipe sets (adamw: AdamW with a cosine schedule; "
                 "muon: config/muon.py, Muon with WSD): choose it with --recipes")
    block = [a for a in given if a[2:] in BLOCK_KEYS]
    if block and args.blocks:           # else a row would be named for one block and train another
        sys.exit(f"error: --train_args sets {block[0]}, which --blocks sets for its rows: leave it out of "
                 "--train_args, or --blocks out")
    if args.data_dir and not os.path.isfile(os.path.join(args.data_dir, "meta.json")):
        sys.exit(f"error: --data_dir {args.data_dir!r} is not a prepared folder (no meta.json): prepare one with "
                 "data.py (docs/data.md), or leave --data_dir out for the .py files of this Python")
    if not args.out:                          # else makedirs('') said "No such file or directory"
        sys.exit("error: --out is empty: give the folder for the corpus, the runs and the logs, e.g. "
                 "--out bench_out/time_to_target")
    if os.path.exists(args.out) and not os.path.isdir(args.out):      # else makedirs said "File exists"
        sys.exit(f"error: --out {args.out} is a file, not a folder: choose another --out")
    made = os.path.abspath(args.out)          # the highest folder of --out this run creates (None: it exists)
    while not os.path.exists(os.path.dirname(made)):
        made = os.path.dirname(made)
    made = None if os.path.exists(made) else made
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:                      # where and why in words, as bench.py and data.py say it
        from speedgpt.shards import folder_creation_error
        sys.exit(f"error: {folder_creation_error(args.out, e, '--out')}")
    if os.path.isdir(os.path.join(args.out, "runs.jsonl")):
        sys.exit(f"error: {os.path.join(args.out, 'runs.jsonl')} is a folder, where the runs are kept: move it or "
                 "choose another --out")
    try:
        sweeps = preflight(args, recipes, args.data_dir or os.path.join(args.out, "data"))
    except SystemExit:                        # refused: leave no empty folder behind
        if made and not any(files for _, _, files in os.walk(made)):
            shutil.rmtree(made)
        raise
    data_dir = args.data_dir or prepare_corpus(args.out)
    store = Store(os.path.join(args.out, "runs.jsonl"), args.resume)
    if args.resume and not os.path.isfile(store.path):
        print(f"note: --resume: no {store.path} yet (no run of this --out has finished): every run trains", flush=True)
    identity = (data_hash(data_dir), code_hash(), device_name())

    def run(recipe, setting, seed):
        key = run_key(args, recipe, setting, seed, *identity)
        return store.run(key, lambda: train_run(args, recipe, setting, seed, data_dir), args.target)
    swept, chosen, seeded = [], {}, {}
    for recipe in recipes:                  # the sweep, at the first seed
        rows = []
        for setting in sweeps[recipe]:
            r = run(recipe, setting, args.seeds[0])
            rows.append(r)
            print(f"sweep: {recipe}, {setting['batch_tokens']:,} tokens per step, {lr_text(setting)}: final val "
                  f"{r['final']:.4f}" + (f", the target at {r['hit'][3]:.1f} s" if r["hit"] else ""), flush=True)
        swept += rows
        chosen[recipe] = best(rows, by_time=not args.minutes)
    for recipe, top in chosen.items():      # the best setting at every seed
        setting = {k: top[k] for k in SETTING if k in top}
        seeded[recipe] = [top] + [run(recipe, setting, seed) for seed in args.seeds[1:]]
        print(f"seeds: {recipe} done", flush=True)
        for block in args.blocks:           # each block at that setting, every seed
            seeded[f"{recipe}, {block}"] = [run(recipe, {**setting, "block": block}, seed) for seed in args.seeds]
            print(f"blocks: {recipe}, {block} done", flush=True)
    nanogpt = None
    if args.nanogpt:
        curve = nanogpt_run(args.nanogpt, data_dir, args.out, args)
        if not curve:
            log = os.path.join(args.out, "nanogpt", "train.log")
            sys.exit(f"error: nanoGPT's train.py made no evaluation: {error_line(log)} (log: {log})")
        nanogpt = result("nanoGPT train.py", {}, None, curve, args.target, None)
    rows = final_rows(seeded, nanogpt)
    # each run once: a recipe's first seed ran in the sweep; a block's did not
    ours = [*swept, *(r for rs in seeded.values() for r in (rs if rs[0].get("block") else rs[1:]))]
    runs = [*ours, *([nanogpt] if nanogpt else [])]
    length = f"{args.minutes:g} minutes of training" if args.minutes else f"{args.tokens:,} tokens"
    pick = "the lowest final val loss" if args.minutes else "the fewest seconds to the target"
    reused = [f"{store.reused} of the runs taken from {store.path} (--resume: the same flags, data, code and "
              "device)", ""] if store.reused else []
    lines = [f"The sweep at seed {args.seeds[0]}: every run {length}, evaluated every {args.eval_every:,} tokens on "
             f"the whole val split of {data_dir}", "", *sweep_table(swept), "", *edges(args, chosen),
             *inside_warmup(args, ours), *reused,
             f"Target val loss {args.target:.4f}, fixed before the runs; each recipe at its best setting of the sweep "
             f"({pick}), seeds {', '.join(map(str, args.seeds))}; every run {length}; seconds of training (compile "
             "apart, its own column); mean ± sd" + ("; 'recipe, block': that setting with the block of --blocks "
                                                    "(model flags: " + "; ".join(f"{b} {' '.join(BLOCKS[b])}" for b in
                                                                                 args.blocks) + ")"
                                                    if args.blocks else ""), "", *table(rows)]
    with open(os.path.join(args.out, "time_to_target.json"), "w") as f:      # the numbers behind both tables
        keys = ("step", "val_loss", "tokens", "train_seconds")
        json.dump({"target": args.target, "tokens": args.tokens, "minutes": args.minutes or None,
                   "eval_every": args.eval_every, "seeds": args.seeds, "table": rows,
                   "sweep": [{k: v for k, v in r.items() if k != "evals"} for r in swept],
                   "runs": [{**{k: v for k, v in r.items() if k != "evals"},
                             "evals": [dict(zip(keys, e)) for e in r["evals"]]} for r in runs]}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    try:
        with sigterm_as_interrupt():     # SIGTERM as Ctrl-C: subprocess.run kills the run's train.py, no orphan
            main()
    except KeyboardInterrupt:
        sys.exit("stopped: every run that finished is in --out's runs.jsonl; the same command with --resume takes "
                 "them and trains the rest")
