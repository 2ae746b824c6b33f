"""
speedgpt side by side with karpathy/nanoGPT's own bench.py: one GPU, one run, equal micro-batch.

    git clone https://github.com/karpathy/nanoGPT ../nanoGPT        # or: --fetch ../nanoGPT (the pinned commit)
    python benchmarks/vs_nanogpt.py --nanogpt ../nanoGPT                          # GPT-2 124M: config/fast.py
    python benchmarks/vs_nanogpt.py --nanogpt ../nanoGPT --sizes 124m,350m,774m,1558m   # the family table

For each size, in this order and in one process each: nanoGPT's bench.py (random tokens, bf16 autocast,
torch.compile, FlashAttention through SDPA, fused AdamW, no document mask) at our preset's micro-batch (and at
--peer_batches too: the ratio is to the peer's best), then our preset (config/fast.py at 124M as shipped;
config/gpt2-medium|large|xl.py above, with --total_batch_size=0: one optimizer step per micro-batch, as the
peer's bench.py takes). nanoGPT's bench.py hard-codes GPT-2 124M's shape; for the larger sizes a launcher
gives its GPTConfig the size's n_layer, n_head and n_embd and changes nothing else (its file is not edited).

Each side's number: real tokens/s. The peer's from its own "time per iteration" (20 iterations after 10 of
burn-in); ours the median of the timed steps (summary.json: compile warm-up left out, the device synchronised
before the clock). Prints one Markdown row per size: micro-batch, peer, ours, ratio, MFU (ours, against the
dense bf16 peak), peak memory, first step (compile included). Logs go to --out. Needs a CUDA GPU, the GPT-2
tokenizer's files (tiktoken; offline: TIKTOKEN_CACHE_DIR) for data/stdlib_gpt2, which train.py prepares on
first use, and, for FP8 presets, torchao (requirements-extra.txt).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NANOGPT_URL = "https://github.com/karpathy/nanoGPT.git"
NANOGPT_COMMIT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"   # the commit our published numbers ran against
SIZES = {  # name: (n_layer, n_head, n_embd, our preset, its micro-batch)
    "124m": (12, 12, 768, "config/fast.py", 64),
    "350m": (24, 16, 1024, "config/gpt2-medium.py", 64),
    "774m": (36, 20, 1280, "config/gpt2-large.py", 32),
    "1558m": (48, 25, 1600, "config/gpt2-xl.py", 32),
}
LAUNCHER = '''import runpy, sys
sys.path.insert(0, {root!r})
import model                                    # nanoGPT's model.py
_config = model.GPTConfig
model.GPTConfig = lambda **kw: _config(**{{**kw, "n_layer": {L}, "n_head": {H}, "n_embd": {C}}})
sys.argv = ["bench.py", "--real_data=False", "--batch_size={B}"]
runpy.run_path("bench.py", run_name="__main__")
'''


def fetch(dest):
    """Clone nanoGPT into `dest` at NANOGPT_COMMIT (needs git and the internet)."""
    try:
        if not os.path.isdir(dest):
            subprocess.run(["git", "clone", "-q", NANOGPT_URL, dest], check=True)
        subprocess.run(["git", "-C", dest, "checkout", "-q", NANOGPT_COMMIT], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"error: could not fetch nanoGPT into {dest} ({e}): clone {NANOGPT_URL} yourself and give "
                 "--nanogpt PATH")


def peer(nanogpt, size, batch, log, timeout):
    """nanoGPT bench.py's tokens/s at `batch` x 1024 tokens, from its 'time per iteration' (0 if it failed)."""
    L, H, C = SIZES[size][:3]
    with tempfile.TemporaryDirectory() as tmp:
        launcher = os.path.join(tmp, "launch_bench.py")
        with open(launcher, "w") as f:
            f.write(LAUNCHER.format(root=os.path.abspath(nanogpt), L=L, H=H, C=C, B=batch))
        out = run([sys.executable, launcher], os.path.abspath(nanogpt), log, timeout)
    ms = re.findall(r"time per iteration: ([0-9.]+)ms", out)
    return round(batch * 1024 / (float(ms[-1]) / 1e3)) if ms else 0


def ours(size, batch, iters, extra, out_dir, log, timeout):
    """Our preset's summary.json (median tokens/s, MFU, peak memory, first step), or None if it failed."""
    preset = SIZES[size][3]
    args = [f"--config={preset}", f"--max_iters={iters}", "--timing_warmup=5", "--eval_tokens=0",
            "--save_checkpoints=False", f"--out_dir={out_dir}", f"--batch_size={batch}"]
    if size != "124m":
        args.append("--total_batch_size=0")
    run([sys.executable, "train.py", *args, *extra], ROOT, log, timeout)
    path = os.path.join(out_dir, "summary.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def run(cmd, cwd, log, timeout, env=None):
    """Run cmd in cwd (in the environment `env`, default ours), its output to the file `log`; returns the output
    (also on failure or timeout)."""
    return run_status(cmd, cwd, log, timeout, env)[0]


def run_status(cmd, cwd, log, timeout, env=None):
    """run(), and the exit status: (output, returncode), returncode None when it timed out or could not start."""
    code = None
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
        out, code = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + f"\n(killed after {timeout} s)"
    except OSError as e:                      # no such program (make, nvcc, a binary that was not built)
        out = f"could not start {cmd[0]}: {e}"
    with open(log, "w") as f:
        f.write(out)
    return out, code


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--nanogpt", help="a clone of karpathy/nanoGPT (its bench.py and model.py)")
    p.add_argument("--fetch", metavar="DIR", help="clone nanoGPT at the pinned commit into DIR first (online)")
    p.add_argument("--sizes", default="124m", help="comma-separated: " + ", ".join(SIZES))
    p.add_argument("--batch", type=int, default=0, help="micro-batch of both sides (default: the preset's)")
    p.add_argument("--peer_batches", default="", help="more micro-batches for the peer (comma-separated); the "
                   "ratio is to its best run")
    p.add_argument("--iters", type=int, default=20, help="our optimizer steps (5 of them warm-up)")
    p.add_argument("--ours_args", default="", help="extra train.py flags for our runs (space-separated)")
    p.add_argument("--out", default="bench_out/vs_nanogpt", help="folder for the logs and our run folders")
    p.add_argument("--timeout", type=int, default=900, help="seconds each process may take")
    args = p.parse_args(argv)
    if not args.nanogpt and not args.fetch:
        sys.exit(f"error: --nanogpt is missing: give --nanogpt PATH (a clone of {NANOGPT_URL}) or --fetch DIR")

    def check_clone():
        if not os.path.isfile(os.path.join(args.nanogpt, "bench.py")):
            sys.exit(f"error: no nanoGPT bench.py in {args.nanogpt!r}: give --nanogpt PATH (a clone of {NANOGPT_URL}) "
                     "or --fetch DIR")
    if not args.fetch:
        check_clone()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad or not sizes:
        sys.exit(f"error: --sizes {args.sizes!r}: unknown {', '.join(bad) or 'empty'}; the sizes are {', '.join(SIZES)}")
    if args.batch < 0:
        sys.exit(f"error: --batch {args.batch}: a positive micro-batch (0, the default: each preset's)")
    try:
        peer_batches = [int(x) for x in args.peer_batches.split(",") if x.strip()]
    except ValueError:
        peer_batches = [0]
    if min(peer_batches, default=1) < 1:
        sys.exit(f"error: --peer_batches {args.peer_batches!r}: positive micro-batches, comma-separated, e.g. 16,64")
    if args.iters < 6 or args.timeout < 1:
        sys.exit(f"error: --iters {args.iters} / --timeout {args.timeout}: at least 6 steps (5 of them warm-up) and "
                 "a positive number of seconds")
    gpu_check("vs_nanogpt.py", args.ours_args)
    if args.fetch:                            # online, after every check that needs no clone
        fetch(args.fetch)
        args.nanogpt = args.nanogpt or args.fetch
        check_clone()
    os.makedirs(args.out, exist_ok=True)
    rows = ["| size | micro-batch | peer tok/s | ours tok/s | ratio | MFU | peak GB | first step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    measured = []
    for size in sizes:
        batch = args.batch or SIZES[size][4]
        peer_runs = {b: peer(args.nanogpt, size, b, os.path.join(args.out, f"peer_{size}_b{b}.log"), args.timeout)
                     for b in dict.fromkeys([batch] + peer_batches)}
        for b, tps in peer_runs.items():
            print(f"{size}: nanoGPT bench.py batch {b}: {tps:,} tok/s" + ("" if tps else " (failed: see its log)"),
                  flush=True)
        s = ours(size, batch, args.iters, args.ours_args.split(), os.path.join(args.out, f"ours_{size}"),
                 os.path.join(args.out, f"ours_{size}.log"), args.timeout)
        best = max(peer_runs.values())
        measured.append(s is not None or best > 0)
        if s is None:
            rows.append(f"| {size} | {batch} | {best:,} | failed (see {args.out}/ours_{size}.log) | | | | |")
            continue
        tps = s["median_tokens_per_sec"]
        print(f"{size}: ours {tps:,.0f} tok/s", flush=True)
        ratio = f"{tps / best:.3f}x" if best else "n/a"
        peer_col = " / ".join(f"{v:,} (B={b})" for b, v in peer_runs.items()) if len(peer_runs) > 1 else f"{best:,}"
        rows.append(f"| {size} | {batch} | {peer_col} | {tps:,.0f} | {ratio} | {100 * (s.get('median_mfu') or 0):.1f}% | "
                    f"{s.get('mem_gb') or 0:.1f} | {s.get('first_step_s') or 0:.0f} s |")
    print("\n".join(rows))
    if not any(measured):
        sys.exit(f"error: every run failed: see the logs in {args.out}")


def gpu_check(script, ours_args):
    """Exit in one line on a machine without a CUDA GPU, before anything is written: the peers and the presets run
    there. --ours_args with --device=cpu lets the script itself run on a CPU (its tests, with stand-in peers)."""
    import torch
    if not torch.cuda.is_available() and "--device=cpu" not in ours_args.split():
        sys.exit(f"error: {script} times trainers on a CUDA GPU, and this machine has none: run it on one")


if __name__ == "__main__":
    main()
