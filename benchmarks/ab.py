"""
Tokens/s of train.py under two or more sets of flags, measured as this project measures a change end to end: each
run a fresh process (its own compile), the variants alternated round by round (A B, then B A: a slow stretch of the
machine hits each alike), each run's median tokens/s over its timed steps (summary.json: warm-up and evaluations
left out), then per variant the mean over its runs, their spread and the ratio to the first variant. One table last.

    python benchmarks/ab.py --config config/fast.py exact=--gelu_erf=exact fast=--gelu_erf=fast
    python benchmarks/ab.py --config config/gpt2-large.py --rounds 2 shipped= rows=--compile_persistent_rows=2048 \\
        -- --batch_size=32
    python benchmarks/ab.py --config '' --steps 2 --warmup 1 --rounds 1 a= b=--n_embd=48 -- --n_layer=2 \\
        --n_head=2 --n_embd=32 --block_size=64 --batch_size=4          # the smoke test, on a CPU

A variant is NAME=FLAGS: train.py flags, space-separated (empty: the preset as it is). Flags after -- go to every
variant, before its own (a variant's flag replaces the shared flag of the same key). Each variant is checked as
train.py checks a run on this machine, before the first run.
Every run trains --warmup + --steps optimizer steps of one micro-batch each (--total_batch_size=0: the equal work of
a peer's bench.py; give --total_batch_size after -- for the preset's own step), with no evaluation and no
checkpoint, into --out/NAME_rROUND. The first run that fails stops the comparison in one line with its error. Rows
go to --out/rows.jsonl as each run ends, the table to --out/ab.md. A ratio is only meaningful within one invocation:
runs on different machines, or machine starts, differ by a few percent (BENCHMARKS.md, "How the numbers are measured").
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import flag_keys, without_keys  # noqa: E402
from speedgpt.corpus import interrupt_signal, run_child, sigterm_as_interrupt  # noqa: E402
from speedgpt.measure import append_record, error_line  # noqa: E402

OWN = ("out_dir", "max_iters", "timing_warmup", "eval_tokens", "save_checkpoints")   # set by ab.py for every run


def variants(specs, parser):
    """[(name, [flags])] of NAME=FLAGS arguments, in order; parser.error for a malformed or repeated name, fewer
    than two, or a flag ab.py sets itself."""
    out = []
    for spec in specs:
        name, eq, flags = spec.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            parser.error(f"variant {spec!r}: give NAME=FLAGS (a name of letters, digits, '_', '.', '-'; FLAGS may be "
                         "empty, as base=)")
        if name in [n for n, _ in out]:
            parser.error(f"variant name {name!r} given twice: each variant needs its own name")
        out.append((name, shlex.split(flags)))
    if len(out) < 2:
        parser.error(f"{len(out)} variant given: compare two or more, e.g. base= fast=--gelu_erf=fast")
    return out


def owned(flags):
    """The keys of OWN that `flags` set (a run's own settings: a variant giving one would not be measured as said)."""
    return sorted({f[2:].split("=")[0] for f in flags if f.startswith("--")} & set(OWN))


def train_argv(name, r, flags, args):
    """train.py's arguments for variant `name` (its `flags`) in round `r` (from 0)."""
    return [*(["--config", args.config] if args.config else []), "--total_batch_size=0",
            *without_keys(args.extra, flag_keys(flags)), *flags,        # a variant's flag replaces the shared one
            f"--out_dir={os.path.join(args.out, f'{name}_r{r + 1}')}", f"--max_iters={args.warmup + args.steps}",
            f"--timing_warmup={args.warmup}", "--eval_tokens=0", "--save_checkpoints=False"]


def refusal(name, flags, args):
    """train.py's refusal of variant `name` on this machine (its flags, and every check but the data's, which a
    run prepares), or None: said before the first run, not after the variants before it have run."""
    import contextlib
    import io
    import warnings

    import train
    from configurator import GivenTwice, load_config
    from speedgpt.distributed import resolve_device
    try:
        with warnings.catch_warnings(record=True) as said, contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("always")
            cfg = load_config(train_argv(name, 0, flags, args))
            # one process, as each run is: its device checked as train.py's start checks it
            train.check_flags(cfg, resolve_device(cfg, env={}), skip=(train.data,))
    except (ValueError, TypeError, FileNotFoundError) as e:
        return str(e)
    # a flag given twice, before the runs (the table would measure the last value unsaid); the schedule's warnings
    # of a benchmark's short run, in its log alone
    for line in dict.fromkeys(str(w.message) for w in said if issubclass(w.category, GivenTwice)):
        print(f"warning: variant {name}: {line}", flush=True)
    return None


def run_one(name, r, flags, args):
    """One fresh train.py process of variant `name` in round `r`; its row (tokens/s, MFU, peak GB, first step), or
    a row with the error line."""
    out_dir = os.path.join(args.out, f"{name}_r{r + 1}")
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *train_argv(name, r, flags, args)]
    os.makedirs(out_dir, exist_ok=True)
    log = os.path.join(out_dir, "stdout.log")
    print(f"=== {name}, round {r + 1}: {shlex.join(cmd[1:])}", flush=True)
    with open(log, "w") as f:
        code = run_child(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)    # a signal stops it with ab.py
    row = {"variant": name, "round": r + 1, "command": shlex.join(cmd), "ok": code == 0}
    if code != 0:
        return {**row, "error": error_line(log), "log": log}
    with open(os.path.join(out_dir, "summary.json")) as f:
        s = json.load(f)
    row.update(tokens_per_sec=s["median_tokens_per_sec"], mfu=s.get("median_mfu"), mem_gb=s.get("mem_gb"),
               first_step_s=s.get("first_step_s"))
    print(f"{row['tokens_per_sec']:,.0f} tok/s", flush=True)
    return row


def table(rows, names):
    """The Markdown table: per variant its runs' tokens/s in round order, mean, spread ((max - min) / mean) and the
    ratio of its mean to the first variant's."""
    runs = {n: [r["tokens_per_sec"] for r in rows if r["variant"] == n] for n in names}
    first = statistics.mean(runs[names[0]])
    out = ["| variant | tok/s, each round | mean | spread | against " + names[0] + " | MFU | peak GB |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for n in names:
        mean = statistics.mean(runs[n])
        last = [r for r in rows if r["variant"] == n][-1]
        mfu = f"{100 * last['mfu']:.1f}%" if last.get("mfu") is not None else ""
        gb = f"{last['mem_gb']:.1f}" if last.get("mem_gb") is not None else ""
        out.append(f"| {n} | {' / '.join(f'{t:,.0f}' for t in runs[n])} | {mean:,.0f} | "
                   f"{(max(runs[n]) - min(runs[n])) / mean:.1%} | {mean / first:.3f}x | {mfu} | {gb} |")
    return "\n".join(out)


def main(argv=None):
    from configurator import FlagParser
    parser = FlagParser(prog="ab.py", description=__doc__.split("\n\n")[0],
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config/fast.py", help="the preset every variant starts from ('': "
                        "train.py's defaults)")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them (compile, allocator)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, the order reversed each round")
    parser.add_argument("--out", default="bench_out/ab", help="folder for the runs, rows.jsonl and ab.md")
    parser.add_argument("variants", nargs="*", help="NAME=FLAGS, two or more; after --: flags for every variant")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.extra = argv[cut + 1:]
    bad = [f"--{k} {v} (at least {lo})" for k, v, lo in (("steps", args.steps, 1), ("warmup", args.warmup, 1),
                                                        ("rounds", args.rounds, 1)) if v < lo]
    if bad:
        parser.error("; ".join(bad))
    if not args.out:
        parser.error("--out is empty: give the folder for the runs and the table, e.g. --out bench_out/ab")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out} is a file, not a folder")
    if args.config and not os.path.isfile(args.config):
        parser.error(f"config file {args.config} " + ("is a folder, not a file" if os.path.isdir(args.config) else
                                                      "not found"))
    named = variants(args.variants, parser)
    for name, flags in [("after --", args.extra), *named]:
        if owned(flags):
            parser.error(f"{name}: ab.py sets {', '.join(owned(flags))} itself on every run; leave "
                         f"{'it' if len(owned(flags)) == 1 else 'them'} out (--steps and --warmup set the run's "
                         "length)")
    for name, flags in named:              # every variant checked as train.py will, before the first run
        said = refusal(name, flags, args)
        if said:
            parser.error(f"variant {name}: {said}")
    os.makedirs(args.out, exist_ok=True)
    names, rows = [n for n, _ in named], []
    try:
        with sigterm_as_interrupt():       # SIGTERM as Ctrl-C: run_child stops the run under way
            for r in range(args.rounds):
                for name, flags in (named if r % 2 == 0 else named[::-1]):
                    row = run_one(name, r, flags, args)
                    append_record(os.path.join(args.out, "rows.jsonl"), row)
                    if not row["ok"]:
                        said = row["error"].removeprefix("error: ")
                        sys.exit(f"error: variant {name}, round {r + 1} failed: {said} (log: {row['log']})")
                    rows.append(row)
    except KeyboardInterrupt as e:
        print(f"ab.py: stopped; the finished runs are in {os.path.join(args.out, 'rows.jsonl')}", file=sys.stderr)
        sys.exit(128 + interrupt_signal(e))
    md = table(rows, names)
    with open(os.path.join(args.out, "ab.md"), "w") as f:
        f.write(md + "\n")
    print(f"\n{args.config or 'train.py defaults'}, {args.steps} timed steps after {args.warmup}, {args.rounds} "
          f"round(s) alternated; one optimizer step per micro-batch unless given after --:\n")
    print(md)


if __name__ == "__main__":
    main()
