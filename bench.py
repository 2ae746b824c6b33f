"""
The itemised speedup: train.py's real tokens/s after each change, one fresh process per rung.

    python bench.py                                    # config/fast.py's model on this GPU
    python bench.py --config config/large.py --start 2 --steps 30 --batch_size 4
    python bench.py --steps 2 --no_loo --batch_size 4 --out bench_cpu \\
        -- --n_layer=2 --n_head=2 --n_embd=64 --block_size=64  # CPU
    python bench.py --resume --out bench_out                # continue a bench that was cut short
    python bench.py --find_max_batch --config config/large.py --batch_size 4 -- --grad_checkpointing=full

The ladder adds one change per rung to the one before; the leave-one-out pass removes one change
from the all-on configuration, so the attribution does not depend on the ladder's order. Every rung
trains on the same prepared data (the config's data_dir) and runs the real trainer. Output, under
--out: bench.md (the table, also printed), bench.json and bench.csv (every number), bench.png
(a bar chart, when matplotlib is installed), rows.jsonl (a line per finished rung, for --resume).
"""
import argparse
import csv
import dataclasses
import gc
import itertools
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import warnings

import torch

from speedgpt import nanogpt
from speedgpt.corpus import interrupt_signal, run_child, sigterm_as_interrupt
from speedgpt.measure import append_record, error_line, read_records

# each rung: (name, overrides added to the rung before); the baseline sets every speed flag off
LADDER = [
    ("baseline", dict(dtype="float32", tf32=False, compile=False, attention="naive", fused_adamw=False,
                      packing=False, fused_ce=False, fp8=False, fp8_head=False, gelu_erf="exact")),
    ("+ bf16 autocast", dict(dtype="bfloat16")),
    ("+ torch.compile", dict(compile=True)),
    ("+ FlashAttention (sdpa)", dict(attention="sdpa")),
    ("+ fused AdamW", dict(fused_adamw=True)),
    ("+ packing, document mask", dict(packing=True, document_mask=True, attention="MASKED")),
    ("+ fused head + cross-entropy", dict(fused_ce=True, head_kernel="KERNEL")),   # its softmax pass in Triton
                                                                                  # where Triton and a GPU are
    ("+ FP8 head", dict(fp8_head=True)),               # the fused head's matmuls in float8
    # every block Linear in float8, with the config's recipe and fp8_min_dim (config/fast.py: delayed scales, 768
    # wide); skipped for a config that keeps its blocks in bf16
    ("+ FP8 blocks", dict(fp8=True)),
    # GELU's erf as one exp2 and a reciprocal, in FP8's casts or, with bf16 blocks, our Triton passes; skipped where
    # it cannot run (no Triton on a CUDA GPU, no GELU, FP8 blocks whose casts do not take GELU in)
    ("+ GELU's fast erf", dict(gelu_erf="fast")),
]
# leave-one-out from all-on: what each change is undone to
UNDO = {"bf16 autocast": dict(dtype="float32", tf32=False), "torch.compile": dict(compile=False),
        "attention kernel": dict(attention="naive"), "fused AdamW": dict(fused_adamw=False),
        "packing": dict(packing=False, document_mask=False, attention="sdpa"),    # the mask is packing's
        # the FP8 head and the Triton softmax pass are the fused head's
        "fused cross-entropy": dict(fused_ce=False, fp8_head=False, head_kernel=False),
        "FP8 head": dict(fp8_head=False), "FP8 blocks": dict(fp8=False), "GELU's fast erf": dict(gelu_erf="exact")}


DEFAULT_CONFIG = "config/fast.py"
# the docstring's CPU line, a bench that fits in a CPU's memory: named (cpu_example) when a rung does not fit
CPU_BENCH = ("--steps", "2", "--no_loo", "--batch_size", "4", "--out", "bench_cpu")
CPU_SIZE = ("--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64")
CPU_EXAMPLE = shlex.join(["python", "bench.py", *CPU_BENCH, "--", *CPU_SIZE])


def loo_key(name):
    """A --loo name as matched: case, spaces, '-' and '_' aside."""
    return "".join(c for c in name.lower() if c not in " -_")


def cpu_example(args):
    """CPU_EXAMPLE for this bench: with the user's own --config and train.py flags after -- (args.extra), all but
    the model size the example sets, so the run it suggests is theirs made small."""
    import configurator
    typed = {f.name: f.type for f in dataclasses.fields(configurator.Config)}
    flags = configurator.split_flags(args.extra, lambda k: k in typed and typed[k] is not bool)   # --key value too
    sized = {f.split("=")[0] for f in CPU_SIZE}
    kept = [f"--{k}" if v is None else f"--{k}={v}" for k, v in flags if f"--{k}" not in sized]
    config = [] if args.config == DEFAULT_CONFIG else ["--config", args.config]
    return shlex.join(["python", "bench.py", *config, *CPU_BENCH, "--", *CPU_SIZE, *kept])


def failed_line(row, args, cuda):
    """The one line for a rung that failed: train.py's error without its own "error: ", its log, and for a
    run that does not fit in memory bench.py's way out (a smaller --batch_size of bench.py's, or on a CPU
    the small example): train.py's advice names its --batch_size and --attention, which bench.py sets
    itself on every rung and refuses after --."""
    line = f"error: rung {row['rung']!r} failed: {row['error'].removeprefix('error: ')} (log: {row['log']})"
    if "lower --batch_size" in row["error"]:       # speedgpt/memory.py's estimate and its out-of-memory line
        line += f"; in bench.py: --batch_size below {args.batch_size}" + \
            ("" if cuda else f", or on a CPU: {cpu_example(args)}")
    return line


def fp8_supported(torchao=False):
    """A GPU of compute capability 8.9+, with torchao installed where `torchao`: the FP8 head's rung (and its
    leave-one-out row) runs (its matmuls are this project's own); the FP8 blocks' needs torchao for torchao's recipes
    only."""
    import importlib.util
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
            and (not torchao or importlib.util.find_spec("torchao") is not None))


def settings(args, extra):
    """What a rung's numbers depend on besides its flags: a row is reused by --resume only if these match."""
    return json.dumps([args.config, args.steps, args.warmup, extra])


def finished_rungs(args, extra):
    """{rung name: row} of the rows.jsonl under --out with the same settings (for --resume), else {}."""
    path = os.path.join(args.out, "rows.jsonl")
    if not args.resume:
        return {}
    if not os.path.exists(path):
        print(f"note: --resume: no {path} to take rungs from (is --out the earlier bench's?): every rung runs")
        return {}
    rows, bad = read_records(path)
    if bad:
        print(f"note: {path}: line(s) {', '.join(map(str, bad))} are not a row (cut by a stop?): passed over")
    done = {r["rung"]: r for r in rows if r.get("ok") and "rung" in r and r.get("settings") == settings(args, extra)}
    if not done:
        print(f"note: --resume: no finished rung in {path} ran with these settings (config, steps, warm-up, "
              "train.py flags): every rung runs")
    return done


# the keys bench.py sets on every run it starts (rung_flags and --batch_size): given after -- they are refused
RUN_KEYS = ("batch_size", "total_batch_size", "max_iters", "timing_warmup", "eval_tokens", "save_checkpoints",
            "out_dir")


def rung_flags(name, overrides, args):
    """train.py's flags (after --config and those after --) for the rung or row `name` with the ladder's
    `overrides`: a timed run with no evaluation and no checkpoint, into its own folder under --out."""
    out_dir = os.path.join(args.out, "runs",
                           name.strip("+ ").replace(" ", "_").replace(",", "").replace("(", "").replace(")", ""))
    return {**overrides, "max_iters": args.steps + args.warmup, "timing_warmup": args.warmup, "log_interval": 1,
            "eval_tokens": 0, "save_checkpoints": False, "out_dir": out_dir}


def run_rung(name, overrides, args, extra, done=None):
    """One fresh train.py process; returns its medians (tokens/s, step ms, MFU), peak memory and padding.
    A rung already in `done` (from --resume) is not run again."""
    if done and name in done:
        print(f"\n=== {name}: reused from {args.out}/rows.jsonl ({done[name]['tokens_per_sec']:,.0f} tok/s)",
              flush=True)
        return dict(done[name])
    flags = rung_flags(name, overrides, args)
    out_dir = flags["out_dir"]
    cmd = [sys.executable, "train.py", "--config", args.config, *extra] + [f"--{k}={v}" for k, v in flags.items()]
    print(f"\n=== {name}\n{' '.join(cmd)}", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "stdout.log"), "w") as log:
        returncode = run_child(cmd, stdout=log, stderr=subprocess.STDOUT)     # a signal kills it with bench.py
    row = {"rung": name, "ok": returncode == 0, "command": " ".join(cmd), "settings": settings(args, extra)}
    if returncode != 0:
        log = os.path.join(out_dir, "stdout.log")
        return {**row, "error": error_line(log), "log": log}
    summary = json.load(open(os.path.join(out_dir, "summary.json")))
    steps = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
    steps = [s for s in steps if s.get("tokens_per_sec")]
    # the median as summary.json takes tokens/s's (statistics.median: the mean of the middle two of an even count)
    row.update(tokens_per_sec=summary["median_tokens_per_sec"], step_ms=statistics.median(s["step_ms"] for s in steps),
               mfu=summary["median_mfu"], mem_gb=summary["mem_gb"],
               pad_frac=sum(s["pad_frac"] for s in steps) / len(steps), timed_steps=len(steps))
    print(f"{row['tokens_per_sec']:,.0f} tok/s", flush=True)
    append_record(os.path.join(args.out, "rows.jsonl"), row)        # survives an interrupted bench
    return row


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def table(rows, title, ratio_name):
    lines = [f"### {title}", "",
             f"| rung | real tok/s | step ms | MFU | mem GB | pad frac | {ratio_name} | x vs baseline |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['rung']} | {r.get('error', 'skipped')} | | | | | | |")
            continue
        lines.append(f"| {r['rung']} | {r['tokens_per_sec']:,.0f} | {r['step_ms']:.1f} | "
                     f"{fmt(r['mfu'] and 100 * r['mfu'], '.1f')}"
                     f"{'%' if r['mfu'] else ''} | {fmt(r['mem_gb'], '.1f')} | {r['pad_frac']:.3f} | "
                     f"{fmt(r.get('x_prev'), '.2f')} | {fmt(r.get('x_base'), '.2f')} |")
    return "\n".join(lines)


def fp8_blocks_skipped(cfg):
    """Why the FP8 blocks rung cannot run for `cfg` (the config and the arguments after --) here, or None."""
    from speedgpt.features import fp8
    torchao = cfg.fp8_recipe not in fp8.OWN_RECIPES
    if not cfg.fp8:
        return "the config keeps its blocks in bf16 (fp8=False)"
    if not fp8.block_width_ok(cfg):
        return f"no block Linear is eligible (n_embd={cfg.n_embd}, fp8_min_dim={cfg.fp8_min_dim})"
    if not fp8_supported(torchao):
        defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
        unused = [f"{k}={getattr(cfg, k)!r}" for k in fp8.DETAILS["fp8"] if getattr(cfg, k) != defaults[k]]
        return "FP8 needs a GPU of compute capability 8.9+" + (f" and torchao ({cfg.fp8_recipe})" if torchao else "") \
            + (f", so {', '.join(unused)} {'goes' if len(unused) == 1 else 'go'} unmeasured" if unused else "")
    return None


def fast_erf_skipped(cfg, fp8_blocks_skip):
    """Why the fast erf's rung cannot run for `cfg` (the config and the arguments after --) here, or None;
    fp8_blocks_skip: fp8_blocks_skipped(cfg)."""
    import importlib.util
    if cfg.activation != "gelu":
        return f"activation={cfg.activation!r} has no GELU"
    if not torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return "its passes are Triton kernels on a CUDA GPU"
    if cfg.fp8 and not fp8_blocks_skip and not (cfg.fp8_gelu_cast and cfg.fp8_recipe == "tensorwise_delayed"):
        return "the config's FP8 blocks take GELU into no cast (fp8_gelu_cast, with fp8_recipe='tensorwise_delayed')"
    return None


def config_skips(cfg):
    """{rung name: why it is skipped} of the rungs that `cfg` (the config and the arguments after --) skips here."""
    fp8 = fp8_blocks_skipped(cfg)
    return {"+ FP8 blocks": fp8, "+ GELU's fast erf": fast_erf_skipped(cfg, fp8)}


def placeholders(cuda):
    """LADDER's placeholders on this machine: the document mask's fastest backend (varlen where FA3 runs, else flex;
    sdpa on the CPU, where FlexAttention has no backward) and whether the fused head's Triton kernels run."""
    import importlib.util
    from speedgpt.attention import resolve_attention
    return {"MASKED": resolve_attention("auto", "cuda" if cuda else "cpu", document_mask=True),
            "KERNEL": cuda and importlib.util.find_spec("triton") is not None}


def rung_config(start, cuda):
    """train.py's overrides of the ladder's rung `start` (1 = the baseline): every change up to it."""
    config, marks = {}, placeholders(cuda)
    for name, change in LADDER[:start]:
        config.update({k: marks.get(v, v) if isinstance(v, str) else v for k, v in change.items()})
    return config


CPU_RUNG_FLOP = 1e13     # a rung's training FLOPs above which a CPU (about 1e11 FLOP/s) takes a quarter hour or more


def first_rung_refusal(args, extra):
    """None, or the line refusing the bench before any rung runs: on a CPU, a model whose every rung trains more than
    CPU_RUNG_FLOP (config/fast.py's GPT-2 124M: the ladder is a GPU's); or a first rung that does not fit this
    machine's memory (speedgpt/memory.py's estimate, the one train.py refuses with: the float32 baseline with its
    naive T x T attention holds the most)."""
    import types

    import configurator
    import train
    from speedgpt import memory
    cuda = torch.cuda.is_available()
    flags = [f"--{k}={v}" for k, v in rung_config(args.start, cuda).items()]
    with warnings.catch_warnings():              # main() printed them
        warnings.simplefilter("ignore")
        cfg = configurator.load_config(["--config", args.config, *extra, *flags])
    try:
        vocab = memory.vocab_size(cfg.data_dir)
    except ValueError as e:                      # a broken nanoGPT meta.pkl: train.py's own line
        return str(e)
    flop = memory.meta_model(cfg, vocab).flops_per_token() * cfg.batch_size * \
        cfg.block_size * (args.steps + args.warmup)
    if not cuda and flop > CPU_RUNG_FLOP:
        return (f"on a CPU, every rung of {args.config}'s model ({cfg.n_layer} layers, n_embd {cfg.n_embd}) would "
                f"train {flop / 1e12:,.0f} TFLOP ({args.steps + args.warmup} steps of {args.batch_size} x "
                f"{cfg.block_size} tokens): hours for the ladder; the ladder measures a GPU. On a CPU: "
                f"{cpu_example(args)}")
    try:
        proc = types.SimpleNamespace(device=torch.device("cuda" if cuda else "cpu"), world=1)
        memory.report(cfg, proc, train.TRANSFORMS)
    except ValueError as e:
        name = LADDER[args.start - 1][0].strip("+ ")
        said = str(e).split(" available: ")[0] + " available"    # train.py's advice names flags bench.py sets itself
        return (f"the {name} rung at --batch_size {args.batch_size} does not fit: {said}; in bench.py: --batch_size "
                f"below {args.batch_size}" + ("" if cuda else f", or on a CPU: {cpu_example(args)}"))
    return None


def plan(args, skips=None):
    """What bench() runs: [(rung name, train.py's overrides, why it is skipped or None)] of the ladder from --start,
    and [(row name, overrides)] of the leave-one-out rows (--loo) from all on; skips: {rung name: why this config
    skips it here} (config_skips)."""
    cuda, config, ladder, skips = torch.cuda.is_available(), {}, [], skips or {}
    marks = placeholders(cuda)
    for i, (name, change) in enumerate(LADDER, start=1):
        config = {**config, **{k: marks.get(v, v) if isinstance(v, str) else v for k, v in change.items()}}
        skip = skips.get(name) or ("FP8 needs a GPU of compute capability 8.9+" if "FP8" in name and
                                   not fp8_supported() else None)
        if i >= args.start:
            ladder.append((name, dict(config), skip))
    all_on = {**config, "fp8": config["fp8"] and not skips.get("+ FP8 blocks"),
              "fp8_head": config["fp8_head"] and fp8_supported(),
              "gelu_erf": "exact" if skips.get("+ GELU's fast erf") else "fast"}
    loo = []
    for change, undo in UNDO.items():
        if change not in (args.loo or ()) or \
                change == "FP8 head" and not all_on["fp8_head"] or change == "FP8 blocks" and not all_on["fp8"] or \
                change == "GELU's fast erf" and all_on["gelu_erf"] == "exact":
            continue
        loo_config = {**all_on, **undo}
        if loo_config["dtype"] == "float32" and loo_config["attention"] == "varlen":
            loo_config["attention"] = "flex"       # FlashAttention's varlen kernels take bf16/fp16 only
        loo.append((f"all on - {change}", loo_config))
    return ladder, loo


def dropped_rows(asked, ladder, leave_one_out):
    """A note for each leave-one-out row asked for (--loo) that plan() drops, with its rung's reason: said, not
    silently gone (on a CPU: the FP8 rows and the fast erf's)."""
    why, kept = {name: skip for name, _, skip in ladder}, {name for name, _ in leave_one_out}
    return [f"note: --loo {change!r} skipped: {why.get('+ ' + change) or 'the change is off in the all-on runs'}"
            for change in asked or () if f"all on - {change}" not in kept]


def rung_refusal(args, extra, skips=None):
    """None, or the line refusing the bench before any rung runs because train.py would refuse one of the rungs
    plan() runs, with the flags it gets (rung_flags): its every check for this device but the data's, the output
    folder's (make_out's) and the memory estimate's (first_rung_refusal's, with bench.py's advice). A config
    file's setting of a feature that a later rung turns on and this device cannot run, say, or one a rung's own
    flags make do nothing. On a GPU the checks run in a child process: some run Triton kernels (verify), and the
    CUDA memory they take would stay taken in this one while every rung runs."""
    if torch.cuda.is_available():
        import multiprocessing
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(_rung_refusal, (args, extra, skips))
    return _rung_refusal(args, extra, skips)


def _rung_refusal(args, extra, skips):
    import contextlib
    import io
    import re
    import warnings

    import configurator
    import train
    from speedgpt import checkpoint
    from speedgpt.distributed import Proc
    ladder, loo = plan(args, skips)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    owned = set(RUN_KEYS) | {k for _, c in LADDER for k in c} | {k for c in UNDO.values() for k in c}
    for name, config, skip in [*ladder, *((n, c, None) for n, c in loo)]:
        if skip:
            continue
        flags = [f"--{k}={v}" for k, v in rung_flags(name, config, args).items()]
        try:       # quietly: the rung says its notes, warnings and "attention: ..." lines when it runs
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                cfg = configurator.load_config(["--config", args.config, *extra, *flags])
                train.check_flags(cfg, Proc(0, 0, 1, device), skip=(train.memory, train.data, train.checkpoint))
                checkpoint.check_settings(cfg)          # its folder: --out's, which make_out checks
        except (ValueError, TypeError) as e:
            mine = sorted(set(re.findall(r"\b(\w+) ?[=<>]", str(e))) & owned)     # a way out bench.py refuses
            return f"the rung {name!r} would be refused: {e}" + (
                f" (bench.py sets {', '.join(mine)} itself: leave the refused setting out of {args.config})"
                if mine else "")
        if cfg.init_from == "resume" or cfg.resume_from:
            return f"bench.py's rungs each train afresh: leave init_from='resume' and resume_from out of {args.config}"
        moved = [k for k, v in rung_flags(name, config, args).items() if getattr(cfg, k) != v]
        if moved:                # nanoGPT's eval_only, say, makes max_iters 0 wherever it stands
            k = moved[0]
            return f"{args.config} makes {k}={getattr(cfg, k)!r}, where bench.py's rung {name!r} sets " \
                   f"{k}={rung_flags(name, config, args)[k]!r}: leave the setting that does it out of {args.config}"
    return None


def bench(args, extra, skips=None):
    """The ladder, then the leave-one-out pass; skips: {rung name: why it is skipped} (config_skips)."""
    cuda = torch.cuda.is_available()
    done = finished_rungs(args, extra)
    if not args.resume and os.path.exists(os.path.join(args.out, "rows.jsonl")):
        os.remove(os.path.join(args.out, "rows.jsonl"))             # a new bench starts its rows afresh
    ladder, leave_one_out = plan(args, skips)
    for line in dropped_rows(args.loo, ladder, leave_one_out):
        print(line)
    rungs = []
    for name, config, skip in ladder:
        if skip:
            rungs.append({"rung": name, "ok": False, "error": f"skipped: {skip}"})
            continue
        rungs.append(run_rung(name, config, args, extra, done))
        if not rungs[-1]["ok"]:                     # every later rung builds on this one: stop here
            raise SystemExit(failed_line(rungs[-1], args, cuda))
    ok = [r for r in rungs if r["ok"]]
    for prev, r in zip([None] + ok, ok):
        r["x_prev"] = prev and r["tokens_per_sec"] / prev["tokens_per_sec"]
        r["x_base"] = r["tokens_per_sec"] / ok[0]["tokens_per_sec"]
    loo = []
    if ok:
        full = ok[-1]
        for name, loo_config in leave_one_out:
            r = run_rung(name, loo_config, args, extra, done)
            if not r["ok"]:
                raise SystemExit(failed_line(r, args, cuda))
            r["x_prev"] = full["tokens_per_sec"] / r["tokens_per_sec"]    # what this change is worth
            r["x_base"] = r["tokens_per_sec"] / ok[0]["tokens_per_sec"]
            loo.append(r)
    # report
    md = [f"## bench: {args.config} {' '.join(extra)}", "",
          f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}, "
          f"{args.steps} timed steps after {args.warmup} warm-up steps per rung (medians)", "",
          table(rungs, "Ladder: each rung adds one change", "x vs previous")]
    gains = [r for r in ok if r.get("x_prev")]
    if gains:
        best = max(gains, key=lambda r: r["x_prev"])
        md += ["", f"Total speedup: {ok[-1]['tokens_per_sec'] / ok[0]['tokens_per_sec']:.2f}x "
               f"({ok[0]['rung']} -> {ok[-1]['rung']}). Largest single gain on the ladder: "
               f"{best['rung']} ({best['x_prev']:.2f}x)."
               + ("" if cuda else " On a CPU: the speed features are GPU features (no FlashAttention, no fused "
                  "kernels; bf16 is emulated), so these numbers are a smoke test and say nothing about a GPU.")]
    if loo:
        md += ["", table(loo, "Leave-one-out: all on, minus one change", "all-on / this")]
        worth = [r for r in loo if r["ok"]]
        if worth:
            top = max(worth, key=lambda r: r["x_prev"])
            md += ["", f"Largest single gain by leave-one-out: {top['rung'].replace('all on - ', '')} "
                   f"(all on is {top['x_prev']:.2f}x faster than without it)."]
    text = "\n".join(md)
    print("\n" + text)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(text + "\n")
    rows = rungs + loo
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(rows, f, indent=1)
    keys = ["rung", "ok", "tokens_per_sec", "step_ms", "mfu", "mem_gb", "pad_frac", "x_prev", "x_base", "timed_steps",
            "error", "command"]
    with open(os.path.join(args.out, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    chart(rows, rungs, f"{os.path.basename(args.config)} on {torch.cuda.get_device_name() if cuda else 'cpu'}",
          os.path.join(args.out, "bench.png"))
    return rows


def chart(rows, ladder, title, path):
    """The rows that ran as a bar chart of real tokens/s at `path` (the ladder's rungs blue, the
    leave-one-out rows gray). Returns whether it drew one: without matplotlib, the one output that needs
    it, it says so and draws none."""
    shown = [r for r in rows if r["ok"]]
    try:
        from matplotlib.figure import Figure      # not pyplot: no display, no backend, no global figure list
    except ImportError:
        print(f"matplotlib is not installed: no {os.path.basename(path)} (pip install matplotlib)")
        return False
    if not shown:
        return False
    fig = Figure(figsize=(9, 0.5 * len(shown) + 1.5))
    ax = fig.subplots()
    ax.barh([r["rung"] for r in shown][::-1], [r["tokens_per_sec"] for r in shown][::-1],
            color=["tab:blue" if r in ladder else "tab:gray" for r in shown][::-1])
    ax.set_xlabel("real tokens / s")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def find_max_batch(args, extra):
    """Largest micro-batch that trains without running out of GPU memory: doubling from --batch_size,
    then bisection until the answer is within 1/8 (each try is a few steps, recompiling for the shape).
    Runs train.main in this process (compiled graphs are reused; memory is freed between tries)."""
    import train

    def fits(b):
        argv = ["--config", args.config, *extra, f"--batch_size={b}", "--total_batch_size=0", "--max_iters=3",
                "--timing_warmup=2", "--eval_tokens=0", "--save_checkpoints=False", f"--out_dir={args.out}/max_batch",
                "--memory_check=False"]          # the search measures what fits; the estimate would refuse first
        try:
            summary = train.main(argv)
            print(f"batch {b}: fits, {summary['mem_gb']:.1f} GB, {summary['median_tokens_per_sec'] or 0:,.0f} tok/s "
                  "(one timed step)", flush=True)
            return True
        except torch.OutOfMemoryError:
            print(f"batch {b}: out of memory", flush=True)
            return False
        finally:                         # a fresh compile per try: no eager fallback after many recompiles
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    lo, hi = 0, args.batch_size             # doubling from --batch_size, then bisection to within 1/8
    while hi <= args.max_batch and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, args.max_batch + 1)         # lo = 0: --batch_size itself did not fit, bisect below it
    while hi - lo > max(1, lo // 8):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    print(f"largest micro-batch that fits: {lo}" + (f" (out of memory at {hi})" if hi <= args.max_batch else "")
          + f" ({args.config} {' '.join(extra)})")
    return lo


def make_out(out, parser):
    """Make --out, or end in train.py's one line for a folder that cannot be made (a file in the path, no room)."""
    from speedgpt.shards import folder_creation_error
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        parser.error(str(folder_creation_error(out, e, "--out")))


def main(argv=None):
    import configurator
    from configurator import FlagParser
    parser = FlagParser(prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                        passes_on=[f.name for f in dataclasses.fields(configurator.Config)])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the preset whose flags the ladder turns on")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per rung")
    parser.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps per rung (compile)")
    parser.add_argument("--start", type=int, default=1, help="first ladder rung to run (1 = baseline)")
    parser.add_bool("--no_loo", help="skip the leave-one-out pass (as --loo none)")
    parser.add_argument("--loo", help="the changes the leave-one-out pass removes, comma-separated "
                        f"({', '.join(UNDO)}), or all (the default), or none")
    parser.add_bool("--resume", help="reuse the rungs already in OUT/rows.jsonl that ran with the same "
                    "config, steps, warm-up and arguments (a bench cut short continues)")
    parser.add_argument("--batch_size", type=int, default=16, help="micro-batch of every rung (the float32 "
                        "baseline's naive (T, T) attention must fit: 34 GB at 16 x 1024 for GPT-2 124M)")
    parser.add_argument("--out", default="bench_out", help="folder for the table (bench.md), its numbers and "
                        "rows.jsonl")
    parser.add_bool("--find_max_batch", help="report the largest micro-batch that fits")
    parser.add_argument("--max_batch", type=int, default=512, help="the largest micro-batch --find_max_batch tries")
    parser.add_argument("extra", nargs="*", help="after --: train.py overrides for every rung, e.g. -- --n_layer=6 "
                        "--data_dir=data/stories_gpt2")
    args = parser.parse_args(argv)
    if args.no_loo and args.loo is not None:     # one of them would be silently dropped
        parser.error(f"--no_loo and --loo {args.loo!r} both given: keep --loo to choose the leave-one-out rows, or "
                     "--no_loo (as --loo none) to skip the pass")
    if not os.path.isfile(args.config):       # a folder exists: say so, as train.py does (configurator.py)
        parser.error(f"config file {args.config} "
                     + ("is a folder, not a file" if os.path.isdir(args.config) else "not found"))
    named = [c.strip() for c in (args.loo or "").split(",") if c.strip()]    # a trailing comma names nothing
    if args.loo is not None and not named:
        parser.error(f"--loo {args.loo!r} names no change: give some of {', '.join(UNDO)}, or all, or none")
    by_key = {loo_key(c): c for c in UNDO}                                   # "fp8_blocks" is "FP8 blocks"
    word = [c.lower() for c in named]
    args.loo = [] if args.no_loo or word == ["none"] else list(UNDO) if args.loo is None or word == ["all"] else \
        [by_key.get(loo_key(c), c) for c in named]
    unknown = [c for c in args.loo if c not in UNDO]
    if unknown:
        parser.error(f"--loo: unknown change {unknown[0]!r}; the changes are: {', '.join(UNDO)}")
    bad = [f"--{k} {v} (at least {lo})" for k, v, lo in (("steps", args.steps, 1), ("warmup", args.warmup, 0),
                                                        ("start", args.start, 1)) if v < lo]
    bad += [f"--start {args.start} (the ladder has {len(LADDER)} rungs)"] if args.start > len(LADDER) else []
    if bad:
        parser.error("; ".join(bad))
    # the options of the mode not run would do nothing: --max_batch bounds only the search (and it refused a ladder's
    # --batch_size above it); the search reads none of the ladder's
    own = {a.split("=", 1)[0] for a in itertools.takewhile(lambda a: a != "--", sys.argv[1:] if argv is None else argv)}
    if args.find_max_batch:
        idle = sorted(own & {"--steps", "--warmup", "--start", "--loo"}
                      | {f"--{k}" for k in ("no_loo", "resume") if getattr(args, k)})
    else:
        idle = sorted(own & {"--max_batch"})
    if idle:
        parser.error(f"{', '.join(idle)} would do nothing " + ("with --find_max_batch, which runs no ladder: leave "
                     "them out" if args.find_max_batch else "without --find_max_batch, the search it bounds: add "
                     "--find_max_batch or leave it out"))
    if args.batch_size < 1 or args.find_max_batch and args.batch_size > args.max_batch:
        parser.error("need 1 <= --batch_size" + (f" <= --max_batch, got {args.batch_size} and {args.max_batch}"
                                                  if args.find_max_batch else f", got {args.batch_size}"))
    # keys bench.py sets itself on every run: an override after -- would silently undo the measurement
    runs = set(RUN_KEYS)
    owned = runs if args.find_max_batch else runs | {"log_interval"} | {k for _, c in LADDER for k in c} | \
        {k for c in UNDO.values() for k in c}
    given = {a[2:].split("=", 1)[0] for a in args.extra if a.startswith("--")}
    mine = sorted(given & {a.dest for a in parser._actions} - {f.name for f in dataclasses.fields(configurator.Config)})
    if mine:                     # `the same command with --resume`, appended: train.py named its resume_from instead
        parser.error(f"--{mine[0]} after -- goes to train.py: it is bench.py's own option, give it before --")
    clash = sorted(given & (owned | {"config"}))
    details = sorted(given & {k for f, keys in configurator.FEATURE_DETAILS.items() for k in keys if f in owned})
    if clash:
        parser.error(f"bench.py sets {', '.join(clash)} itself on every run; use its own options "
                     "(--config, --batch_size, --steps, --warmup, --out) or leave them out")
    if details and not args.find_max_batch:
        parser.error(f"{details[0]} after -- would reach the rungs that turn its feature off (the baseline turns "
                     "them all off), which refuse it as doing nothing: set it in a config file of your own, "
                     "given to --config")
    if not args.out:             # else makedirs('') failed as "/work does not take new folders", the cwd's parent
        parser.error("--out is empty: give the folder for the table and the runs, e.g. --out bench_out")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out} is a file, not a folder")
    try:                         # the config and the extra arguments, checked before any rung runs
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            cfg = configurator.load_config(["--config", args.config, f"--batch_size={args.batch_size}", *args.extra])
    except (ValueError, TypeError, FileNotFoundError) as e:
        parser.error(str(e))
    for w in said:                # as train.py prints them (each rung's log has them too)
        print(f"{'note' if issubclass(w.category, nanogpt.Note) else 'warning'}: {w.message}")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"device={cfg.device!r} but no CUDA GPU is available")
    if args.find_max_batch and not torch.cuda.is_available():
        parser.error("--find_max_batch measures GPU memory: it needs a CUDA GPU")
    if args.find_max_batch:
        make_out(args.out, parser)
        find_max_batch(args, args.extra)
        return
    extra = ["--total_batch_size=0", f"--batch_size={args.batch_size}", *args.extra]
    stdlib = not torch.cuda.is_available() and not any(a.split("=")[0] == "--data_dir" for a in args.extra)
    extra += ["--data_dir=data/stdlib_byte"] if stdlib else []
    skips = config_skips(cfg)
    refused = first_rung_refusal(args, extra) or rung_refusal(args, extra, skips)
    if refused:
        parser.error(refused)
    make_out(args.out, parser)
    if stdlib:
        print("no GPU: the rungs train on the byte-level stdlib corpus (data/stdlib_byte, no download); "
              "give -- --data_dir=... for other data")
    try:
        with sigterm_as_interrupt():     # SIGTERM as Ctrl-C: run_child kills the rung's train.py, no orphan
            bench(args, extra, skips)
    except KeyboardInterrupt as e:       # 128 + the signal's number, as train.py and data.py exit
        signum = interrupt_signal(e)
        print(f"stopped ({signal.Signals(signum).name}): the rung under way was stopped; the rungs that finished are "
              f"in {os.path.join(args.out, 'rows.jsonl')}, and the same command with --resume (before its --) takes "
              "them", file=sys.stderr)
        sys.exit(128 + signum)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:            # during the checks (no rung ran) or --find_max_batch's search
        print("stopped (SIGINT)", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
