"""
KellerJordan/modded-nanogpt's speedrun trainer on our tokens, to a target val loss: its row for the table of
benchmarks/time_to_target.py, in that table's format, beside our recipes'.

    git clone https://github.com/KellerJordan/modded-nanogpt ../modded-nanogpt
    python benchmarks/vs_modded.py --modded ../modded-nanogpt --data_dir data/fineweb --target 3.28

1. Our data folder (GPT-2 tokens, prepared by data.py) as the files modded-nanogpt reads: each train shard and the
   whole val split in llm.c's format (256 int32 of header: magic 20240520, version 1, token count; then uint16
   tokens) as DATA_PATH/data/fineweb10B/fineweb_{train,val}_NNNNNN.bin. Its evaluation reads the first val_tokens of
   the val file (10,485,760 at modded-nanogpt f411b3d, read from its train_gpt.py), so a val split shorter than that
   is refused; so is a train split its schedule would run out of (it does not loop over the data).
2. A temporary copy of the checkout's top-level .py files; the user's checkout is never touched. Into the copy goes
   a module named `kernels`: train_gpt.py fetches FlashAttention-3 from Hugging Face's kernel hub (`get_kernel`),
   which needs internet; the stand-in hands it the locally installed `flash_attn_interface` instead. --val_every
   and --modded_steps edit one line of the copy's Hyperparameters each, printed; nothing else is changed: one GPU
   needs no edit (its world size 1 gives 8 micro-batches per step, the 8 GPUs' batch), the data path none
   (DATA_PATH).
3. `torchrun --standalone --nproc_per_node=1 train_gpt.py` in the copy, --runs times. From each log: the val loss
   at every evaluation and modded-nanogpt's own training clock there (its evaluations and its compile warm-up kept
   out, as its record rules require); the tokens up to each evaluation from its schedule (TRAINING_STAGES: the
   tokens per step grow by stage); the compile, the seconds from its "Compiling model" line to its "Resetting
   Model" line as they arrived. Its val loss is its own evaluator's on the first val_tokens of the same val split
   (all positions, no document mask), ours scores the whole split with the mask.

Prints one table in time_to_target.py's format (time and tokens to --target, the same number given there) and
writes it with every evaluation to --out/vs_modded.json. Needs a CUDA GPU (modded-nanogpt's kernels are Triton and
FlashAttention-3: Hopper), its requirements (torch, triton, tiktoken) and FlashAttention-3 (`flash_attn_interface`:
build FlashAttention's `hopper/` directory, github.com/Dao-AILab/flash-attention: `cd hopper && python setup.py
install`).
"""
import argparse
import ast
import json
import math
import operator
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from itertools import accumulate

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
from time_to_target import first_at_or_below, table  # noqa: E402
from vs_llmc import check_shard  # noqa: E402
from speedgpt.measure import error_line  # noqa: E402
from speedgpt.shards import find_shards, load_meta, read_header, read_shard, write_shard  # noqa: E402

GPT2_EOT = 50256                 # GPT-2's <|endoftext|>: the document start modded-nanogpt's loader aligns rows to
HYPERPARAMETERS = ("val_tokens", "val_batch_size", "num_scheduled_iterations", "num_extension_iterations",
                   "val_loss_every")
SERVED = {"kernels-community/flash-attn3": "flash_attn_interface"}   # hub kernel -> the attribute the stand-in gives
SHIM = '''"""Stands in for the `kernels` package (Hugging Face's kernel hub, which downloads its kernels) on a machine
without internet: get_kernel gives FlashAttention-3's locally installed flash_attn_interface for the one kernel
train_gpt.py asks for. Written by speedgpt's benchmarks/vs_modded.py into a copy of the checkout."""
import types

import flash_attn_interface

SERVED = {served!r}


def get_kernel(repo_id, *args, **kwargs):
    if repo_id not in SERVED:
        raise ImportError(f"this stand-in for the kernel hub serves {{sorted(SERVED)}} only, not {{repo_id!r}}")
    return types.SimpleNamespace(**{{SERVED[repo_id]: flash_attn_interface}})
'''
# train_gpt.py's print0 lines, word for word: an evaluation, and the warm-up's first and last line
VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:(\S+) train_time:(\d+)ms step_avg:\S+ms$", re.MULTILINE)
COMPILING, RESETTING = "Compiling model and warming up kernels", "Resetting Model"
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}


def number(node, names=None):
    """The number an expression of numbers, `names` and + - * / // ** stands for; ValueError for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in (names or {}):
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -number(node.operand, names)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](number(node.left, names), number(node.right, names))
    raise ValueError(f"not a number: {ast.unparse(node)}")


def read_settings(source):
    """What this script needs of train_gpt.py's `source`, read without running it (it needs the GPU at import):
    the Hyperparameters fields of HYPERPARAMETERS, grad_accum_steps at one GPU, and each of TRAINING_STAGES'
    (duration, batch_size, train_max_seq_len), duration None for the last (the extension). ValueError naming what
    is missing: a train_gpt.py of another shape."""
    tree = ast.parse(source)
    hyper = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Hyperparameters"), None)
    fields = {n.target.id: n.value for n in (hyper.body if hyper else [])
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None}
    assigns = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Name)}
    missing = [k for k in HYPERPARAMETERS if k not in fields] + \
        [k for k in ("grad_accum_steps", "TRAINING_STAGES") if k not in assigns]
    if missing:
        raise ValueError(f"no {missing[0]}")
    out = {k: number(fields[k]) for k in HYPERPARAMETERS}
    out["grad_accum_steps"] = number(assigns["grad_accum_steps"], {"world_size": 1})
    out["stages"] = []
    for call in getattr(assigns["TRAINING_STAGES"], "elts", []):
        kw = {k.arg: k.value for k in getattr(call, "keywords", [])}
        if "batch_size" not in kw or "train_max_seq_len" not in kw:
            raise ValueError("a TrainingStage without batch_size or train_max_seq_len")
        duration = kw.get("duration")
        out["stages"].append((None if duration is None or getattr(duration, "value", 0) is None else
                              number(duration), number(kw["batch_size"]), number(kw["train_max_seq_len"])))
    if len(out["stages"]) < 2 or any(d is None for d, _, _ in out["stages"][:-1]):
        raise ValueError("TRAINING_STAGES is not stages with a duration each, then the extension")
    return out


def tokens_per_step(settings):
    """[tokens of step k] for every step of train_gpt.py's run (all GPUs, all micro-batches: a stage's
    batch_size). The stages' bounds as its TrainingSchedule sets them: the cumulative durations times
    num_scheduled_iterations, rounded; the last stage takes the num_extension_iterations after."""
    n, stages = settings["num_scheduled_iterations"], settings["stages"]
    ends = [0, *(round(c * n) for c in accumulate(d for d, _, _ in stages[:-1])),
            n + settings["num_extension_iterations"]]
    if ends[-2] != n:
        raise ValueError(f"TRAINING_STAGES' durations add up to {ends[-2] / n:g} of the schedule, not 1")
    return [batch for (_, batch, _), a, b in zip(stages, ends, ends[1:]) for _ in range(a, b)]


def train_offer(shards, settings):
    """A lower bound on the tokens train_gpt.py's loader can take from `shards` (arrays of GPT-2 tokens, EOT
    before each document), counted by its rules: every row starts at a document start and stops at the stage's
    train_max_seq_len, so a document gives at least min(its length, the shortest such); a micro-batch cuts its
    last document short (at most that much lost per micro-batch); a shard's tail too short for the largest
    micro-batch is skipped."""
    steps = tokens_per_step(settings)
    row = min(s[2] for s in settings["stages"])
    micro = max(steps) // settings["grad_accum_steps"]
    offer = 0
    for tokens in shards:
        starts = np.flatnonzero(np.asarray(tokens) == GPT2_EOT)
        lengths = np.diff(np.append(starts, len(tokens)))
        offer += int(np.minimum(lengths, row).sum()) - micro
    return offer - len(steps) * settings["grad_accum_steps"] * row


def set_field(source, name, value):
    """`source` with Hyperparameters' `name: int = ...` line set to `value`, and (the line, the new line);
    ValueError when there is not exactly one such line."""
    pattern = re.compile(rf"^(\s+{name}\s*:\s*int\s*=\s*)([^#\n]*?)(\s*(#.*)?)$", re.MULTILINE)
    found = pattern.findall(source)
    if len(found) != 1:
        raise ValueError(f"{len(found)} lines `{name}: int = ...`, not one")
    line = pattern.search(source)
    new = f"{line.group(1)}{value}"
    return source[:line.start()] + new + source[line.end():], (line.group(0).strip(), new.strip())


def kernel_requests(source):
    """[(hub kernel, attribute)] of train_gpt.py's get_kernel('...', ...).attribute calls, and the attributes it
    takes of flash_attn_interface."""
    calls = re.findall(r"get_kernel\(\s*['\"]([^'\"]+)['\"][^)]*\)\.(\w+)", source)
    return calls, sorted(set(re.findall(r"\bflash_attn_interface\.(\w+)", source)))


def make_copy(modded, dest, edits):
    """The checkout's top-level .py files copied to `dest` (train_gpt.py reads its kernels' files beside it),
    Hyperparameters set by `edits` ({name: value}), the kernels stand-in written beside them. Returns the edits as
    (line, new line)."""
    os.makedirs(dest, exist_ok=True)
    for name in sorted(os.listdir(modded)):
        if name.endswith(".py") and os.path.isfile(os.path.join(modded, name)):
            shutil.copy(os.path.join(modded, name), os.path.join(dest, name))
    path = os.path.join(dest, "train_gpt.py")
    with open(path) as f:
        source = f.read()
    done = []
    for name, value in edits.items():
        source, change = set_field(source, name, value)
        done.append(change)
    with open(path, "w") as f:
        f.write(source)
    with open(os.path.join(dest, "kernels.py"), "w") as f:
        f.write(SHIM.format(served=SERVED))
    return done


def write_data(data_dir, dest, settings):
    """Our prepared `data_dir` as train_gpt.py's files under dest/data/fineweb10B: one per train shard, the val
    split as one file; each checked by llm.c's loader rules (vs_llmc.check_shard), which train_gpt.py's follows.
    Exits in one line, before writing, for data it cannot train or evaluate on."""
    meta = load_meta(data_dir, verbose=False)
    if meta["tokenizer"] != "gpt2" or meta["eot_id"] != GPT2_EOT:
        sys.exit(f"error: {data_dir} holds {meta['tokenizer']} tokens: modded-nanogpt's model is GPT-2's "
                 "vocabulary; prepare it with data.py --tokenizer gpt2")
    val = find_shards(data_dir, "val")
    need = settings["val_tokens"] + 2    # + the last target, + the token its loader wants left before a file's end
    held = sum(read_header(p)[0] for p in val)
    if held < need:
        sys.exit(f"error: the val split of {data_dir} holds {held:,} tokens; modded-nanogpt evaluates on "
                 f"{settings['val_tokens']:,} (its val_tokens) and reads {need:,}: prepare the data with a larger "
                 "--val_frac (python data.py ... --val_frac F)")
    train = find_shards(data_dir, "train")
    planned, offer = sum(tokens_per_step(settings)), train_offer([read_shard(p) for p in train], settings)
    if offer < planned:
        sys.exit(f"error: modded-nanogpt's schedule trains {planned:,} tokens, and its loader (rows from document "
                 f"starts, cut at {min(s[2] for s in settings['stages']):,} tokens) can take at most about "
                 f"{max(offer, 0):,} of the train split of {data_dir}: prepare more data, or shorten its schedule "
                 "with --modded_steps")
    folder = os.path.join(dest, "data", "fineweb10B")
    os.makedirs(folder, exist_ok=True)
    written = [(os.path.join(folder, "fineweb_val_000000.bin"), np.concatenate([read_shard(p) for p in val]))]
    written += [(os.path.join(folder, f"fineweb_train_{i:06d}.bin"), read_shard(p)) for i, p in enumerate(train)]
    for path, tokens in written:
        write_shard(path, np.asarray(tokens))
        why = check_shard(path, 1)
        if why:
            sys.exit(f"error: {path}: {why}")
    return [p for p, _ in written]


def launch(copy_dir, data_root, log_path, timeout):
    """torchrun --standalone --nproc_per_node=1 train_gpt.py in `copy_dir`, its output into `log_path` line by
    line; after `timeout` seconds torchrun is sent SIGTERM, which it passes to its worker (in a session of its own),
    and its group SIGKILL 30 s later. Returns (return code or None when stopped so, the output, compile seconds:
    from its COMPILING line to its RESETTING line as they arrived, or None)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "train_gpt.py"]
    env = dict(os.environ, DATA_PATH=os.path.abspath(data_root), PYTHONUNBUFFERED="1")
    seen, lines, stopped = {}, [], []
    with open(log_path, "w") as log, subprocess.Popen(cmd, cwd=copy_dir, env=env, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True,
                                                      start_new_session=True) as proc:
        def stop():
            stopped.append(True)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        watchdog = threading.Timer(timeout, stop)
        watchdog.start()
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                lines.append(line)
                for mark in (COMPILING, RESETTING):
                    if line.startswith(mark):
                        seen.setdefault(mark, time.perf_counter())
        finally:
            watchdog.cancel()
        rc = proc.wait()
    compile_s = seen[RESETTING] - seen[COMPILING] if len(seen) == 2 else None
    return None if stopped else rc, "".join(lines), compile_s


def evaluations(text, steps):
    """[(step, val_loss, tokens, train_seconds)] of train_gpt.py's log `text`, tokens summed from `steps`
    (tokens_per_step). ValueError when the log's step count is not the schedule's (a train_gpt.py of another
    schedule than the one read)."""
    done = [0, *accumulate(steps)]
    rows = []
    for step, total, loss, ms in VAL_LINE.findall(text):
        if int(total) != len(steps):
            raise ValueError(f"its log counts {int(total):,} steps, its schedule as read {len(steps):,}")
        rows.append((int(step), float(loss), done[int(step)], int(ms) / 1000))
    return rows


def modded_row(label, steps, runs, target):
    """The row of time_to_target.table for `runs` [(evaluations, compile seconds)] against `target`."""
    hits = [first_at_or_below(curve, target) for curve, _ in runs]
    return {"recipe": label, "batch_tokens": f"{min(steps):,}-{max(steps):,}" if min(steps) < max(steps) else
            steps[0], "lr": {}, "lr_scale": None, "seeds": [f"run {i + 1}" for i in range(len(runs))],
            "reached": sum(1 for h in hits if h), "train_seconds": [h[3] for h in hits if h],
            "tokens": [h[2] for h in hits if h], "final": [c[-1][1] if c else None for c, _ in runs],
            "compile_s": [s for _, s in runs]}


def positive(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: a positive integer")
    return value


class Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, as every refusal of this script
        sys.exit(f"error: {message} (python benchmarks/vs_modded.py --help lists every flag)")


def main(argv=None):
    head, rest = __doc__.strip().split("\n\n", 1)
    p = Parser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modded", help="a clone of KellerJordan/modded-nanogpt (its train_gpt.py); never edited")
    p.add_argument("--data_dir", help="our prepared folder of GPT-2 tokens (data.py --tokenizer gpt2): the one "
                   "time_to_target.py's runs used")
    p.add_argument("--target", type=float, help="the val loss to reach, as given to time_to_target.py (required)")
    p.add_argument("--runs", type=positive, default=1, help="runs of train_gpt.py (its seed is not fixed)")
    p.add_argument("--val_every", type=positive, help="steps between its evaluations (its val_loss_every; "
                   "default: as shipped)")
    p.add_argument("--modded_steps", type=positive, help="its num_scheduled_iterations (default: as shipped): "
                   "a shorter schedule, for a train split that cannot feed the whole one")
    p.add_argument("--out", default="bench_out/vs_modded", help="the logs and vs_modded.json")
    p.add_argument("--timeout", type=positive, default=3600, help="seconds each run may take")
    args = p.parse_args(argv)
    if args.target is None:
        sys.exit("error: --target is missing: give the val loss to reach, fixed before the runs (the one given to "
                 "time_to_target.py), e.g. --target 3.5")
    if not math.isfinite(args.target) or args.target <= 0:
        sys.exit(f"error: --target {args.target}: give the val loss to reach, a positive number fixed before the runs "
                 "(the one given to time_to_target.py), e.g. --target 3.5")
    if not args.modded:
        sys.exit("error: --modded is missing: give --modded PATH, a clone of "
                 "https://github.com/KellerJordan/modded-nanogpt")
    script = os.path.join(args.modded, "train_gpt.py")
    if not os.path.isfile(script):
        sys.exit(f"error: no train_gpt.py in {args.modded!r}: give --modded PATH, a clone of "
                 "https://github.com/KellerJordan/modded-nanogpt")
    if not args.data_dir:
        sys.exit("error: --data_dir is missing: give our prepared GPT-2 folder (python data.py --input CORPUS "
                 "--out DIR --tokenizer gpt2)")
    if not os.path.isdir(args.data_dir):
        sys.exit(f"error: --data_dir {args.data_dir!r} is not a folder: give our prepared GPT-2 folder "
                 "(python data.py --input CORPUS --out DIR --tokenizer gpt2)")
    edits = {k: v for k, v in (("val_loss_every", args.val_every),
                               ("num_scheduled_iterations", args.modded_steps)) if v}
    with open(script) as f:
        source = f.read()
    try:
        for name, value in edits.items():
            source = set_field(source, name, value)[0]
        settings = read_settings(source)
        steps = tokens_per_step(settings)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        sys.exit(f"error: {script} is not the train_gpt.py this script reads ({e}): use modded-nanogpt at f411b3d "
                 "or a commit of the same shape")
    calls, used = kernel_requests(source)
    odd = [f"{r}.{a}" for r, a in calls if SERVED.get(r) != a]
    if odd:
        sys.exit(f"error: train_gpt.py asks the kernel hub for {odd[0]}, which the stand-in does not serve (it gives "
                 f"{', '.join(f'{r}.{a}' for r, a in SERVED.items())}): use modded-nanogpt at f411b3d")
    import torch
    if not torch.cuda.is_available():
        sys.exit("error: modded-nanogpt's train_gpt.py needs a CUDA GPU (its Triton and FlashAttention-3 kernels; "
                 "a Hopper GPU such as the H100 or H200): run this on one")
    try:
        import flash_attn_interface
    except ImportError as e:
        sys.exit(f"error: modded-nanogpt's attention is FlashAttention-3, and flash_attn_interface does not import "
                 f"({e}): build FlashAttention's hopper/ directory (github.com/Dao-AILab/flash-attention: cd hopper "
                 "&& python setup.py install)")
    lacking = [a for a in used if not hasattr(flash_attn_interface, a)]
    if lacking:
        sys.exit(f"error: the installed flash_attn_interface has no {lacking[0]}, which train_gpt.py calls: "
                 "install a newer FlashAttention-3 (its hopper/ directory)")
    os.makedirs(args.out, exist_ok=True)
    label = "modded-nanogpt train_gpt.py" + (f", {args.modded_steps:,} scheduled steps" if args.modded_steps else "")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "modded-nanogpt")
        for old, new in make_copy(args.modded, copy, edits):
            print(f"modded-nanogpt (a copy in {copy}): `{old}` -> `{new}`", flush=True)
        write_data(args.data_dir, copy, settings)
        print(f"modded-nanogpt: {len(steps):,} steps, {sum(steps):,} tokens; torchrun --standalone "
              "--nproc_per_node=1 train_gpt.py", flush=True)
        for i in range(args.runs):
            log = os.path.join(os.path.abspath(args.out), f"modded_run{i + 1}.log")
            rc, text, compile_s = launch(copy, copy, log, args.timeout)
            try:
                curve = evaluations(text, steps)
            except ValueError as e:
                sys.exit(f"error: modded-nanogpt run {i + 1}: {e} (log: {log})")
            own = os.path.join(copy, "logs")        # its own log (its code, versions, nvidia-smi): kept beside ours
            for name in sorted(os.listdir(own)) if os.path.isdir(own) else []:
                shutil.move(os.path.join(own, name), os.path.join(args.out, f"modded_run{i + 1}_{name}"))
            if rc != 0 or not curve:
                why = f"stopped after --timeout {args.timeout} s" if rc is None else error_line(log)
                sys.exit(f"error: modded-nanogpt run {i + 1} failed: {why} (log: {log})")
            runs.append((curve, compile_s))
            print(f"modded-nanogpt run {i + 1}: final val {curve[-1][1]:.4f}", flush=True)
    row = modded_row(label, steps, runs, args.target)
    with open(os.path.join(args.out, "vs_modded.json"), "w") as f:
        keys = ("step", "val_loss", "tokens", "train_seconds")
        json.dump({"target": args.target, "data_dir": os.path.abspath(args.data_dir), "edits": edits,
                   "tokens_per_step": steps, "table": [row],
                   "runs": [{"evals": [dict(zip(keys, e)) for e in c], "compile_s": s} for c, s in runs]}, f,
                  indent=1)
    print(f"\nTarget val loss {args.target:.4f}; modded-nanogpt's train_gpt.py on {args.data_dir}, one GPU (8 "
          "micro-batches a step), its own evaluator on its val_tokens; seconds of its training clock (compile "
          "apart, its own column); mean ± sd over the runs\n")
    print("\n".join(table([row])))
    return row


if __name__ == "__main__":
    main()
