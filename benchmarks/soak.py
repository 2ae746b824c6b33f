"""
A long run's accidents in one short run: a config (default config/fast.py) trained with checkpoints, one injected
non-finite step (NaN gradients at --bad_step, which the run skips: max_skipped_steps=1), a SIGTERM at --stop_step
(the run saves and exits), and a resume with the same command; beside it the same config uninterrupted, with no
injection, for two seeds. Prints one row per run: its final validation loss, the steps it skipped, whether every step
is in metrics.jsonl exactly once and the loss finite; and whether the interrupted run ends within the two seeds'
spread.

    python benchmarks/soak.py [--steps 200] [--bad_step 60] [--stop_step 120] [-- train.py flags]

The injection is made outside the model (the loss weight of that step is NaN), so a compiled model is not
recompiled by it; tests/test_fp8.py and tests/test_gpu.py inject into activations and gradients inside the model.
Each run is a fresh process (`python train.py`, or this script with --leg for the interrupted one).
"""
import argparse
import json
import math
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)         # train.py's modules
from speedgpt.corpus import interrupt_signal, run_child, sigterm_as_interrupt  # noqa: E402


def leg(bad_step, stop_step, argv):
    """train.py's main with `argv`, NaN gradients at step bad_step and a SIGTERM to itself during stop_step."""
    import train
    from data import DataError
    from speedgpt import memory
    from speedgpt.distributed import exit_status
    real, calls = train.forward_backward, []

    def injected(model, batches, n_global, *args, **kwargs):
        step = len(calls)
        calls.append(step)
        if step == stop_step:
            os.kill(os.getpid(), signal.SIGTERM)        # the loop saves after this step and exits
        return real(model, batches, float("nan") if step == bad_step else n_global, *args, **kwargs)
    train.forward_backward = injected
    sys.argv = ["train.py", *argv]
    sys.exit(exit_status(train.main, lambda: train._setup_done, DataError, memory.out_of_memory_line))


def records(out_dir):
    """The run's metrics.jsonl records; none where it wrote none (it failed before its first step)."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def parse(p, argv):
    """soak.py's options (parsed by `p`) and train.py's flags of `argv`: those after `--`, and before it the flags
    that are train.py's keys. A misspelt soak.py option (--stop_stp) is refused here in one line naming soak.py's
    flags: passed on, it met train.py's error, which names train.py's."""
    import dataclasses

    from configurator import Config, did_you_mean
    from speedgpt import nanogpt
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = p.parse_known_args(argv[:cut])
    keys = {f.name for f in dataclasses.fields(Config)} | set(nanogpt.KEYS)
    unknown = [a.split("=")[0] for a in extra if a.startswith("--") and a[2:].split("=")[0] not in keys]
    if unknown:
        own = [o for a in p._actions for o in a.option_strings if o not in ("-h", "--help", "--leg")]
        raise SystemExit(f"error: unknown flag {unknown[0]!r} (neither soak.py's nor train.py's): "
                         + did_you_mean(unknown[0], own, f"soak.py's flags: {', '.join(own)}; train.py's go after --"))
    return args, extra + argv[cut + 1:]


def main():
    # no abbreviations (--step is not --steps), as configurator.FlagParser: an unknown flag is named, not guessed
    from configurator import FlagParser

    class Parser(argparse.ArgumentParser):   # train.py's flags pass through (parse), errors one line as theirs
        error = FlagParser.error

    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--config", default="config/fast.py", help="a config file; empty: train.py's defaults")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--bad_step", type=int, default=60)
    p.add_argument("--stop_step", type=int, default=120)
    p.add_argument("--out", default="bench_out/soak", help="a folder for the runs' out_dirs")
    p.add_argument("--leg", action="store_true", help=argparse.SUPPRESS)
    args, extra = parse(p, sys.argv[1:])
    if args.leg:
        leg(args.bad_step, args.stop_step, extra)
    if not 0 <= args.bad_step < args.stop_step < args.steps - 1:
        raise SystemExit(f"error: need 0 <= --bad_step < --stop_step < --steps - 1, got --bad_step {args.bad_step}, "
                         f"--stop_step {args.stop_step}, --steps {args.steps}")
    # the runs go from ROOT (cwd=ROOT) and are read back from here: a relative --out from another folder was written
    # under ROOT and read here, every row nan; made here first, so a folder that cannot be made names --out, not the
    # --out_dir of train.py's error
    args.out = os.path.abspath(args.out)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        from speedgpt.shards import folder_creation_error
        raise SystemExit(f"error: {folder_creation_error(args.out, e, '--out')}") from None
    try:
        with sigterm_as_interrupt():     # SIGTERM as Ctrl-C: run_child kills the run's train.py, no orphan
            soak(args, extra)
    except KeyboardInterrupt as e:       # one line, 128 + the signal's number, as bench.py and train.py exit
        signum = interrupt_signal(e)
        print(f"stopped ({signal.Signals(signum).name}): the run under way was stopped; the same command runs the "
              f"soak afresh (its runs' folders in {args.out} start again from scratch)", file=sys.stderr)
        sys.exit(128 + signum)


def soak(args, extra):
    """The two uninterrupted runs, the interrupted one and its resume, then the table."""
    common = (["--config", args.config] if args.config else []) + [
        f"--max_iters={args.steps}", f"--lr_decay_iters={args.steps}", f"--warmup_iters={max(1, args.steps // 10)}",
        f"--eval_interval={max(1, args.steps // 4)}", "--log_interval=1", "--init_from=scratch", *extra]
    rows = []
    for seed in (1337, 1338):
        out = os.path.join(args.out, f"straight_{seed}")
        rc = run_child([sys.executable, "train.py", *common, f"--out_dir={out}", f"--seed={seed}"], cwd=ROOT)
        if rc != 0:          # a flag or config train.py refuses (fast.py on a CPU): the other three runs would too
            raise SystemExit(f"error: the uninterrupted run (seed {seed}) failed, train.py exit {rc} (its error is "
                             "above): no soak without runs that train; fix the config or the train.py flags")
        rows.append((f"uninterrupted, seed {seed}", out, [rc]))
    out = os.path.join(args.out, "soak")
    cmd = [*common, f"--out_dir={out}", "--seed=1337", "--max_skipped_steps=1"]
    first = run_child([sys.executable, __file__, "--leg", f"--bad_step={args.bad_step}",
                       f"--stop_step={args.stop_step}", "--", *cmd], cwd=ROOT)
    resumed = run_child([sys.executable, "train.py", *[a for a in cmd if a != "--init_from=scratch"],
                         "--init_from=resume"], cwd=ROOT)
    rows.append((f"NaN at step {args.bad_step}, SIGTERM at {args.stop_step}, resumed", out, [first, resumed]))
    print(f"\n{'run':<44} {'exit':>9} {'final val loss':>15} {'skipped':>8} {'steps once':>11} {'finite':>7}")
    finals = []
    for name, out, rcs in rows:
        recs = records(out)
        steps = [r["step"] for r in recs if "loss" in r]
        vals = [r["val_loss"] for r in recs if "val_loss" in r]
        skipped = sum(1 for r in recs if "loss" in r and (r["loss"] is None or not math.isfinite(r["loss"])))
        once = sorted(steps) == list(range(args.steps))
        finite = all(r["loss"] is not None and math.isfinite(r["loss"]) for r in recs
                     if "loss" in r and r["step"] > args.bad_step)
        finals.append(vals[-1] if vals else float("nan"))
        print(f"{name:<44} {'/'.join(map(str, rcs)):>9} {finals[-1]:>15.4f} {skipped:>8} {str(once):>11} "
              f"{str(finite):>7}")
    if not all(math.isfinite(f) for f in finals):     # a run without a final val loss: nothing to compare
        raise SystemExit("error: a run above has no final validation loss (exit code in its row; its error is "
                         "above): no verdict on the spread")
    lo, hi = min(finals[:2]), max(finals[:2])
    spread = hi - lo
    print(f"\nthe interrupted run's final val loss {finals[2]:.4f}; uninterrupted {lo:.4f} .. {hi:.4f} (spread "
          f"{spread:.4f}): {'within' if lo - spread <= finals[2] <= hi + spread else 'OUTSIDE'} the seeds' spread "
          "(widened by the spread on each side)")


if __name__ == "__main__":
    main()
