"""
Does a new numerics path (an FP8 recipe, a kernel, a scaling) train as well as the one it replaces? Each recipe,
for each seed, trains a preset for --steps optimizer steps of one micro-batch each from the same start, and the
validation loss on the same tokens is compared: the difference of the recipes' means against the seed-to-seed
spread (the largest difference between two seeds of one recipe).

    python benchmarks/loss_check.py --config config/gpt2-medium.py --base=--fp8=False --candidate=
    python benchmarks/loss_check.py --config config/fast.py --base=--fp8_head=False --candidate= --steps 300

--base and --candidate are train.py flags (space-separated; written --base="--a=1 --b=2", with the "=", since they
start with dashes) added to the preset; every run also gets --total_batch_size=0, this script's --batch_size, a
warm-up of a tenth of the steps, a cosine decay to --steps, one evaluation at the end on --eval_tokens tokens, and
no checkpoints. Prints a line as each run finishes, then one row per run (val loss, median tokens/s) and the
verdict; the first run that fails stops it, in one line with that run's error, and no run starts after it (the ones
under way are stopped, as on Ctrl-C or SIGTERM). Logs and run folders go to --out (each run's folder made afresh).
--parallel N runs N at a time on the same device (a GPU with room for N: each run's compile and evaluation then
overlap the others' training); the losses are the same as one at a time, tokens/s are not reported (shared).
"""
import argparse
import concurrent.futures
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from speedgpt.measure import error_line  # noqa: E402


RUNNING = set()          # the train.py processes under way
LOCK = threading.Lock()  # held while a process starts or all are stopped
STOPPED = threading.Event()   # set by the first run that fails (and by a signal): no run starts after it


class Stopped(Exception):
    """A run not started because another failed first."""


def stop_all():
    """Stop every train.py process under way, and start no other."""
    with LOCK:
        STOPPED.set()
        for proc in RUNNING:
            proc.kill()


def train_argv(config, flags, seed, args, out_dir):
    """train.py's flags for one run."""
    return [*([f"--config={config}"] if config else []), "--total_batch_size=0", f"--batch_size={args.batch_size}",
            f"--max_iters={args.steps}", f"--warmup_iters={max(1, args.steps // 10)}", f"--lr_decay_iters={args.steps}",
            f"--eval_interval={args.steps}", f"--eval_tokens={args.eval_tokens}",
            "--save_checkpoints=False", "--hellaswag=off", f"--seed={seed}", f"--out_dir={out_dir}", *flags.split()]


def train(config, flags, seed, args, out_dir):
    """(val loss, median tokens/s) of one run in a fresh out_dir; exits in one line if it failed (its log:
    out_dir + '.log'), having stopped the runs under way; raises Stopped if another run failed first."""
    cmd = [sys.executable, "train.py", *train_argv(config, flags, seed, args, out_dir)]
    with LOCK:
        if STOPPED.is_set():
            raise Stopped(out_dir)
        shutil.rmtree(out_dir, ignore_errors=True)          # never a summary left by an earlier invocation
        log = open(out_dir + ".log", "w")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        RUNNING.add(proc)
    try:
        rc = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        stop_all()
        sys.exit(f"error: run {os.path.basename(out_dir)} took over --timeout {args.timeout} s (log: {out_dir}.log)")
    finally:
        with LOCK:
            RUNNING.discard(proc)
        log.close()
    if STOPPED.is_set():                                # killed because another run failed
        raise Stopped(out_dir)
    summary = os.path.join(out_dir, "summary.json")
    if rc != 0 or not os.path.isfile(summary):
        stop_all()
        sys.exit(f"error: run {os.path.basename(out_dir)} failed: {error_line(out_dir + '.log').removeprefix('error: ')} "
                 f"(log: {out_dir}.log; a flag it names goes in --base and --candidate, or choose another --config)")
    with open(summary) as f:
        s = json.load(f)
    return s["val_loss"], s.get("median_tokens_per_sec")


def verdict(losses):
    """The line comparing {"base": [val losses], "candidate": [...]}: the means' difference against the largest
    seed-to-seed difference within one recipe."""
    mean = {k: sum(v) / len(v) for k, v in losses.items()}
    spread = max(max(v) - min(v) for v in losses.values())
    diff = mean["candidate"] - mean["base"]
    where = "within" if abs(diff) <= spread else ("better than" if diff < 0 else "outside")
    return (f"candidate - base: {diff:+.4f} (means {mean['candidate']:.4f} / {mean['base']:.4f}); seed-to-seed "
            f"spread {spread:.4f}: {where} the spread")


def main(argv=None):
    head, rest = __doc__.strip().split("\n\n", 1)
    p = argparse.ArgumentParser(description=head, epilog=rest, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config/gpt2-medium.py", help="the preset; '' for train.py's defaults")
    p.add_argument("--base", default="--fp8=False", help="train.py flags of the reference recipe")
    p.add_argument("--candidate", default="", help="train.py flags of the recipe checked")
    p.add_argument("--seeds", default="1337,1338")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--eval_tokens", type=int, default=1048576)
    p.add_argument("--timeout", type=int, default=1800, help="seconds each run may take")
    p.add_argument("--out", default="bench_out/loss_check")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time on the device (tokens/s then not reported)")
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        sys.exit(f"error: --seeds {args.seeds!r}: comma-separated integers, e.g. --seeds 1337,1338")
    if len(set(seeds)) < 2 or len(set(seeds)) != len(seeds):
        sys.exit("error: --seeds needs two or more different seeds (the spread is between seeds), e.g. --seeds 1337,1338")
    if min(args.steps, args.batch_size, args.eval_tokens, args.timeout, args.parallel) < 1:
        sys.exit("error: --steps, --batch_size, --eval_tokens, --timeout and --parallel must be positive")
    if args.base.split() == args.candidate.split():
        sys.exit("error: --base and --candidate are the same flags: nothing to compare")
    from configurator import load_config
    for name, flags in (("base", args.base), ("candidate", args.candidate)):   # a typo now, not after the runs before
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                load_config(train_argv(args.config, flags, seeds[0], args, args.out))
        except (ValueError, TypeError, FileNotFoundError) as e:
            sys.exit(f"error: --{name} {flags!r} with --config {args.config!r}: {e}")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        sys.exit(f"error: cannot create --out {args.out}: {e.strerror}; choose another --out")
    rows = ["| recipe | flags | seed | val loss | tok/s |", "|---|---|---:|---:|---:|"]
    losses = {"base": [], "candidate": []}
    # alternated, so a slow stretch of the machine hits both alike
    runs = [(name, flags, seed) for seed in seeds for name, flags in (("base", args.base), ("candidate", args.candidate))]

    def row(run, result):
        (name, flags, seed), (loss, tps) = run, result
        speed = "– (shared device)" if args.parallel > 1 else f"{tps:,.0f}" if tps else "– (no timed steps)"
        return f"| {name} | `{flags or '(the preset)'}` | {seed} | {loss:.4f} | {speed} |"

    def on_term(signum, frame):                     # raised in this thread: the except below stops the runs
        print("stopped (SIGTERM): the runs under way were stopped; their folders are incomplete", file=sys.stderr)
        sys.exit(128 + signum)

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            futures = {pool.submit(train, args.config, flags, seed, args,
                                   os.path.join(os.path.abspath(args.out), f"{name}_{seed}")): (name, flags, seed)
                       for name, flags, seed in runs}
            try:
                for done in concurrent.futures.as_completed(futures):
                    if isinstance(done.exception(), Stopped):
                        continue                    # the failing run's own error comes through its future
                    name, _, seed = futures[done]           # progress; a failed run exits here, in one line
                    print(f"finished: {name}, seed {seed}, val loss {done.result()[0]:.4f}", flush=True)
            except BaseException:
                stop_all()                          # nothing more starts; the runs under way are killed
                for f in futures:
                    f.cancel()
                raise
    except KeyboardInterrupt:
        sys.exit("stopped (Ctrl-C): the runs under way were stopped; their folders are incomplete")
    finally:
        signal.signal(signal.SIGTERM, before)
        STOPPED.clear()                             # main() called again in one process (tests) starts afresh
    for future, run in futures.items():             # the table in the order of the runs
        rows.append(row(run, future.result()))
        losses[run[0]].append(future.result()[0])
    print("\n".join(rows))
    if args.steps < 100:
        print(f"note: {args.steps} steps, a warm-up of {max(1, args.steps // 10)}: too few for the losses to mean much "
              "(the protocol is 300)")
    print(verdict(losses))


if __name__ == "__main__":
    main()
