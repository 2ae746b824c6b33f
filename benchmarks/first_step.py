"""
The first step of each preset from empty compile caches (cold) and from the caches that run left (warm): how long a
launch waits before it trains, how many graphs it compiled, whether anything recompiled, and the speed it then
trains at. One process per line, `python train.py` with fresh TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR folders,
then the same command with the same folders.

    python benchmarks/first_step.py                                  # the presets below, whole model and regional
    python benchmarks/first_step.py --presets config/fast.py --modes whole -- --max_iters=8
    python benchmarks/first_step.py --presets "" --modes eager --steps 2 -- --device=cpu ...   # tests/test_first_step.py

train.py's own flags go after `--`.

A mode is a way to compile: whole (the model as one graph, --compile=True --compile_regional=False: config/fast.py
as shipped), regional (--compile=True --compile_regional=True: each block compiled once and reused, the larger
presets as shipped) or eager (--compile=False, the baseline without compilation). The mode and --steps are this
script's: --compile, --compile_regional, --max_iters and --out_dir after `--` are refused. "Recompiles" counts
torch's `Recompiling` log lines (TORCH_LOGS=recompiles): one per graph beyond the first of a function, the
evaluation's graph included (another grad mode). first_step_s and the median tokens/s are summary.json's
(speedgpt/measure.py). Where a compiled launch's time goes is torch's own account
(torch._dynamo.utils.compile_times, written at exit) over every graph of the launch, the evaluation's too: all of
it, and of that Dynamo's tracing, AOTAutograd (the joint graph and its partition into forward and backward), the
forward's and the backward's Inductor compile, and of those two the wait for the kernels' compiler (Triton's on a
GPU, the C++ compiler on a CPU); the first step's rest is our own kernels' autotuning, the data and the step itself
(the evaluation's graph is compiled before the first step, at step 0's evaluation). Markdown table last; the exit
status is 1 when a launch failed (its row says why; a failed cold launch is not repeated warm).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = "config/fast.py,config/gpt2-medium.py,config/gpt2-large.py,config/gpt2-xl.py"
MODES = {"whole": ["--compile=True", "--compile_regional=False"],
         "regional": ["--compile=True", "--compile_regional=True"], "eager": ["--compile=False"]}
# train.py settings this script makes itself, and how to change them here instead
OWN = {"max_iters": "--steps", "out_dir": "each launch writes to a folder of its own",
       "compile": "--modes", "compile_regional": "--modes"}
# train.py run as __main__, torch's compile account written at exit to $FIRST_STEP_TIMES (nothing when nothing compiled)
WRAPPER = """import atexit, json, os, runpy, sys
def dump():
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None:
        keys, values = utils.compile_times(repr="csv")
        account = {k: sum(float(x) for x in v.split(",")) for k, v in zip(keys, values)}
        for group in ("aot_autograd", "inductor"):     # the caches' hits, misses and bypasses, as counts
            for k, v in utils.counters[group].items():
                if "cache" in k:
                    account[f"{group}.{k}"] = v
        with open(os.environ["FIRST_STEP_TIMES"], "w") as f:
            json.dump(account, f)
atexit.register(dump)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# (column, seconds from torch's compile_times account, summed over every graph). Dynamo's compile_inner holds the
# tracing, AOTAutograd and the forward's Inductor compile; the backward's is compiled lazily, at the first backward
# (backward._backward_impl), outside it, unless the graph has dynamic shapes that the backward saves (fast.py's
# cu_seqlens): then AOTAutograd compiles the backward at once, inside create_aot_dispatcher_function, and the
# AOTAutograd column leaves it out
FWD, BWD = "compile_fx.<locals>.fw_compiler_base", "compile_fx.<locals>.bw_compiler"
PHASES = [("all", lambda a: a.get("_compile.compile_inner", 0.0) + a.get("backward._backward_impl", 0.0)),
          ("trace", lambda a: a.get("bytecode_tracing", 0.0)),
          ("AOTAutograd", lambda a: max(0.0, a.get("create_aot_dispatcher_function", 0.0) - a.get(FWD, 0.0)
                                        - max(0.0, a.get(BWD, 0.0) - a.get("backward._backward_impl", 0.0)))),
          ("inductor fwd", lambda a: a.get(FWD, 0.0)), ("inductor bwd", lambda a: a.get(BWD, 0.0)),
          ("compiler wait", lambda a: a.get("async_compile.wait", 0.0))]


def launch(preset, mode, caches, out_dir, steps, extra):
    """One train.py process of `preset` (a config file, or '' for the defaults) compiled as `mode`, its caches in
    `caches`: a dict of wall_s, first_step_s, tokens_per_sec, mem_gb, recompiles, or error (the last line it
    printed) when it failed."""
    times = out_dir + "_compile_times.json"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(caches, "inductor"),
           "TRITON_CACHE_DIR": os.path.join(caches, "triton"), "TORCH_LOGS": "recompiles", "FIRST_STEP_TIMES": times}
    cmd = [sys.executable, "-c", WRAPPER, os.path.join(ROOT, "train.py"), *([f"--config={preset}"] if preset else []),
           "--save_checkpoints=False", "--wandb_log=False", *extra, f"--max_iters={steps}", f"--out_dir={out_dir}",
           *MODES[mode]]                   # last: the mode and the steps are this script's (OWN refuses them in extra)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    compile_s, cache_counts = {}, {}
    if os.path.isfile(times):
        with open(times) as f:
            account = json.load(f)
        compile_s = {name: part(account) for name, part in PHASES}
        cache_counts = {k: v for k, v in account.items() if k.startswith(("aot_autograd.", "inductor."))}
    return {"wall_s": wall, "first_step_s": summary["first_step_s"], "tokens_per_sec": summary["median_tokens_per_sec"],
            "mem_gb": summary["mem_gb"], "recompiles": (proc.stdout + proc.stderr).count("Recompiling"),
            "compile_s": compile_s, "cache_counts": cache_counts}


def phases(compile_s):
    """The PHASES' seconds of one launch ('all / trace / AOTAutograd / ...'), or that it compiled nothing."""
    if not any(compile_s.values()):
        return "nothing compiled"
    return " / ".join(f"{compile_s.get(name, 0.0):.1f}" for name, _ in PHASES)


def warm_compile(launch):
    """The warm launch's compile seconds and what AOTAutograd's cache did ('hit / miss / bypass' graphs): a
    bypassed or missed graph is traced and partitioned again on every launch, however warm the caches."""
    if not any(launch["compile_s"].values()):
        return "nothing compiled"
    counts = [launch["cache_counts"].get(f"aot_autograd.autograd_cache_{k}", 0) for k in ("hit", "miss", "bypass")]
    return f"{launch['compile_s']['all']:.1f}; {' / '.join(map(str, counts))}"


def table(rows):
    """Markdown: one line per preset and mode, cold beside warm, and where the cold launch's compile time went."""
    fmt = lambda v, spec: "" if v is None else format(v, spec)
    speed = lambda launch: "n/a" if launch["tokens_per_sec"] is None else f"{launch['tokens_per_sec']:,.0f}"
    out = ["| preset | compile | first step cold (s) | warm (s) | launch to the end, cold (s) | recompiles cold / warm "
           f"| tok/s cold / warm | GB | cold launch, every graph: {' / '.join(name for name, _ in PHASES)} (s) "
           "| warm launch: compile (s); AOTAutograd cache hit / miss / bypass |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for preset, mode, cold, warm in rows:
        if "error" in cold or "error" in warm:
            out.append(f"| {preset or 'defaults'} | {mode} | failed: {cold.get('error') or warm['error']} "
                       "| | | | | | | |")
            continue
        out.append(f"| {preset or 'defaults'} | {mode} | {fmt(cold['first_step_s'], '.1f')} "
                   f"| {fmt(warm['first_step_s'], '.1f')} "
                   f"| {cold['wall_s']:.1f} | {cold['recompiles']} / {warm['recompiles']} "
                   f"| {speed(cold)} / {speed(warm)} "
                   f"| {fmt(cold['mem_gb'], '.1f')} "
                   f"| {phases(cold['compile_s'])} | {warm_compile(warm)} |")
    return "\n".join(out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    head, rest = __doc__.strip().split("\n\n", 1)
    p = argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=PRESETS, help="config files, comma-separated ('' : train.py's defaults)")
    p.add_argument("--modes", default="whole,regional", help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per launch (tokens/s needs a few past "
                   "timing_warmup)")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    modes = list(dict.fromkeys(m for m in args.modes.split(",") if m))
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        p.error(f"--modes: {'unknown ' + ', '.join(unknown) if unknown else 'none given'}; the modes are "
                f"{', '.join(MODES)}")
    if args.steps < 1:
        p.error(f"--steps {args.steps}: a launch needs at least one optimizer step (8 by default)")
    presets = list(dict.fromkeys(x for x in args.presets.split(",") if x)) or [""]
    own = [key for key in (a[2:].split("=")[0] for a in extra if a.startswith("--")) if key in OWN]
    if own:
        p.error(f"--{own[0]} after --: first_step.py sets it itself ({OWN[own[0]]}); leave it out")
    missing = [x for x in presets if x and not os.path.isfile(os.path.join(ROOT, x))]
    if missing:
        p.error(f"--presets: {', '.join(missing)} not found (config files, relative to {ROOT})")
    rows = []
    for preset in presets:
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="first_step_") as tmp:
                cold = launch(preset, mode, tmp, os.path.join(tmp, "cold"), args.steps, extra)
                warm = cold if "error" in cold else launch(preset, mode, tmp, os.path.join(tmp, "warm"), args.steps,
                                                           extra)
            rows.append((preset, mode, cold, warm))
            print(json.dumps({"preset": preset, "mode": mode, "cold": cold, "warm": warm}), flush=True)
    print(table(rows))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    from speedgpt.corpus import sigterm_as_interrupt
    try:
        with sigterm_as_interrupt():     # SIGTERM as Ctrl-C: subprocess.run kills the launch under way, no orphan
            rows = main()
        sys.exit(1 if any("error" in cold or "error" in warm for _, _, cold, warm in rows) else 0)
    except KeyboardInterrupt:
        sys.exit("stopped: the launch under way was stopped; the rows above are the launches that finished")
