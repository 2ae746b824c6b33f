"""
speedgpt side by side with karpathy/llm.c's CUDA trainer and nanoGPT's bench.py: GPT-2 124M, one GPU, one run.

    git clone https://github.com/karpathy/llm.c ../llm.c
    git clone https://github.com/NVIDIA/cudnn-frontend ../cudnn-frontend   # header-only: llm.c's cuDNN attention
    git clone https://github.com/karpathy/nanoGPT ../nanoGPT
    python benchmarks/vs_llmc.py --llmc ../llm.c --nanogpt ../nanoGPT [--llmc_batches 16,32,64]

In this order, each in its own process: llm.c's build (`make train_gpt2cu USE_CUDNN=1 CUDNN_FRONTEND_PATH=...
NO_MULTI_GPU=1`; if that fails, once more without cuDNN, and the table says so; `--build_only` stops after it, no
GPU, data or nanoGPT needed, and a later `--no_build` run times that binary instead of building again), nanoGPT's
bench.py at --batch (benchmarks/vs_nanogpt.py's peer), llm.c at each of --llmc_batches, then ours (config/fast.py
with --total_batch_size=0) at --batch. Every side takes one optimizer step per micro-batch of B x 1024 tokens
(llm.c: -d B*T).

llm.c trains GPT-2 124M from scratch (-e d12: bf16, its own kernels; GPT-2's biases kept; causal attention over
whole rows, no document mask, as nanoGPT's bench.py) on our data/stdlib_gpt2 (prepared here if missing): our shards
are llm.c's format already (speedgpt/shards.py writes GPT-2 tokens as version 1, uint16), so no copies are made;
each is checked by llm.c's own loader rules first, and one it would refuse stops the script before any run. Its
tokens/s: B*T over the median of its per-step milliseconds after the first WARMUP steps (not its printed tok/s: an
EMA over every step but the first). nanoGPT's from its own "time per iteration"; ours the median of summary.json.

Prints one Markdown table: side, micro-batch, tok/s, ratio to ours (the side's tok/s over ours). Logs go to --out.
Needs a CUDA GPU, nvcc and cuDNN: the system's, or NVIDIA's Python wheels that torch's CUDA build brings
(nvidia-cudnn-cu13, nvidia-cublas), which build_env points the build at.
"""
import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_nanogpt import ROOT, gpu_check, ours, peer, run, run_status  # noqa: E402

T = 1024
WARMUP = 5                       # steps left out of llm.c's median, as vs_nanogpt.ours' --timing_warmup=5
LLMC_MAGIC, LLMC_VERSION = 20240520, 1     # llmc/dataloader.h: GPT-2 shards, uint16 tokens after 256 int32
# one line per step, from train_gpt2.cu's printf0("step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e |
# %.2f ms | %.1f%% bf16 MFU | %.0f tok/s\n"); its MFU is negative on a GPU missing from its table (the H200)
STEP = re.compile(r"^step\s+(\d+)/\d+ \| loss .*\| ([0-9.]+) ms \| \S+% bf16 MFU \| [0-9.]+ tok/s\s*$", re.MULTILINE)
HOW = ".how"                     # beside the binary: how --build_only built it (cuDNN or not), for --no_build
LINKED = ("cublas", "cublasLt", "cudnn", "nvidia-ml", "nvrtc")   # what llm.c's Makefile links, and nvrtc (below)
HEADERS = ("cublas_v2.h", "cudnn.h")
# llm.c (to its last commit) passes cudaMemAdvise a device ordinal, which CUDA 13 replaced by a cudaMemLocation: this
# overload, which nvcc includes before each file (NVCC_APPEND_FLAGS), maps the one onto the other (as the unmerged
# karpathy/llm.c#850 does in its source). It changes nothing llm.c computes.
CUDA13_SHIM = """#include <cuda_runtime.h>
#if defined(__cplusplus) && CUDART_VERSION >= 13000
static inline cudaError_t cudaMemAdvise(const void* ptr, size_t count, cudaMemoryAdvise advice, int device) {
    cudaMemLocation location = {};
    location.type = device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    location.id = device == cudaCpuDeviceId ? 0 : device;
    return cudaMemAdvise(ptr, count, advice, location);
}
#endif
"""


def check_shard(path, min_tokens):
    """Why llm.c's GPT-2 loader (llmc/dataloader.h, dataloader_load_shard_) would refuse the shard at `path`, or
    None: it wants a header of 256 int32 (magic 20240520, version 1, token count), exactly that many uint16 tokens
    after it, and at least `min_tokens` (B*T+1: one micro-batch and its last target)."""
    header = np.fromfile(path, dtype="<i4", count=256)
    if len(header) < 256 or header[0] != LLMC_MAGIC:
        return "not an llm.c shard (no magic 20240520)"
    if header[1] != LLMC_VERSION:
        return f"version {header[1]}: llm.c's GPT-2 loader reads version 1 (uint16 tokens) only"
    n = int(header[2])
    if os.path.getsize(path) != 256 * 4 + 2 * n:
        return f"{os.path.getsize(path)} bytes, not the 1024 + 2 x {n} its header promises"
    return f"{n} tokens, fewer than one micro-batch ({min_tokens})" if n < min_tokens else None


def llmc_data(data_dir, batch):
    """(train, val) glob patterns of our shards for llm.c's -i and -j at micro-batch `batch`. The val split falls
    back to the train shards when one of its shards is too short (llm.c evaluates only outside its timed steps).
    Exits with one line when a train shard is one llm.c would refuse."""
    patterns = {}
    for split in ("train", "val"):
        pattern = os.path.join(os.path.abspath(data_dir), f"{split}_*.bin")
        shards = sorted(glob.glob(pattern))
        why = [(p, check_shard(p, batch * T + 1)) for p in shards] or [(pattern, "no such shards")]
        bad = [(p, w) for p, w in why if w]
        if bad and split == "train":
            sys.exit(f"error: llm.c cannot read {bad[0][0]}: {bad[0][1]}; prepare {data_dir} with data.py "
                     "--tokenizer gpt2, or lower --llmc_batches")
        patterns[split] = patterns["train"] if bad else pattern
    return patterns["train"], patterns["val"]


def system_lib_dirs():
    """Folders of the shared libraries the dynamic linker knows (ldconfig -p), then the driver's usual ones."""
    try:
        known = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        known = ""
    dirs = [os.path.dirname(p) for p in re.findall(r"=> (\S+)$", known, re.MULTILINE)]
    return list(dict.fromkeys(dirs + ["/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]))


def build_env(tmp, site_dirs=None, lib_dirs=None):
    """The environment for llm.c's make and its runs. NVIDIA's wheels (those torch's CUDA build installs, found
    under `site_dirs`, default sys.path) hold cuBLAS and cuDNN with versioned names only (libcudnn.so.9), which
    `-lcudnn` does not find, and the driver's libnvidia-ml.so.1 (searched in `lib_dirs`, default
    system_lib_dirs()) often has no plain name either: links with the plain names go into tmp/lib (LIBRARY_PATH),
    the wheels' headers into CPATH, the libraries' folders into LD_LIBRARY_PATH. CUDA13_SHIM goes to every nvcc
    call. llm.c's Makefile refuses USE_CUDNN=1 unless cudnn-frontend/include lies in $HOME or the checkout,
    whatever CUDNN_FRONTEND_PATH says: HOME is tmp, where build() links the frontend."""
    roots = [os.path.join(d, "nvidia", "*") for d in (sys.path if site_dirs is None else site_dirs) if d]
    lib_dirs = system_lib_dirs() if lib_dirs is None else lib_dirs
    links = os.path.join(tmp, "lib")
    os.makedirs(links, exist_ok=True)
    paths = {"CPATH": [], "LIBRARY_PATH": [links], "LD_LIBRARY_PATH": []}
    for h in HEADERS:
        found = sorted(f for r in roots for f in glob.glob(os.path.join(r, "include", h)))
        paths["CPATH"] += [os.path.dirname(found[0])] if found else []
    for lib in LINKED:
        found = sorted(f for r in roots for f in glob.glob(os.path.join(r, "lib", f"lib{lib}.so.*")))
        found = found or sorted(f for d in lib_dirs for f in glob.glob(os.path.join(d, f"lib{lib}.so.*")))
        if found:
            os.symlink(found[0], os.path.join(links, f"lib{lib}.so"))
            paths["LD_LIBRARY_PATH"].append(os.path.dirname(found[0]))
    with open(os.path.join(tmp, "llmc_cuda13.h"), "w") as f:
        f.write(CUDA13_SHIM)
    env = dict(os.environ, HOME=tmp)
    env["NVCC_APPEND_FLAGS"] = " ".join(filter(None, [os.environ.get("NVCC_APPEND_FLAGS"),
                                                      f"-include {os.path.join(tmp, 'llmc_cuda13.h')}"]))
    for k, v in paths.items():
        env[k] = os.pathsep.join(dict.fromkeys(v + [p for p in [os.environ.get(k)] if p]))
    return env


def build(llmc, frontend, env, out, timeout):
    """Build llm.c's train_gpt2cu in its checkout `llmc`: with cuDNN's attention when `frontend` (a cudnn-frontend
    checkout) is given, and without cuDNN when it is not or that build fails. Returns (binary or None, how); `how`
    is also written beside a built binary (HOW), for --no_build."""
    attempts = [([], "no cuDNN (no cudnn-frontend: --cudnn_frontend)", env)]
    if frontend:
        os.symlink(os.path.abspath(frontend), os.path.join(env["HOME"], "cudnn-frontend"))
        # newer frontends compile some kernels at run time (cudnn_frontend/experimental): they need NVRTC linked
        nvrtc = " -lnvrtc" if os.path.exists(os.path.join(env["HOME"], "lib", "libnvrtc.so")) else ""
        attempts = [(["USE_CUDNN=1", f"CUDNN_FRONTEND_PATH={os.path.abspath(frontend)}/include"], "cuDNN",
                     dict(env, NVCC_APPEND_FLAGS=env["NVCC_APPEND_FLAGS"] + nvrtc)),
                    ([], "no cuDNN (its cuDNN build failed: build_cudnn.log)", env)]
    binary = os.path.join(os.path.abspath(llmc), "train_gpt2cu")
    for flags, how, make_env in attempts:
        cmd = ["make", "train_gpt2cu", *flags, "NO_MULTI_GPU=1"]
        print(f"llm.c: {' '.join(cmd)}", flush=True)
        for stale in (binary, binary + HOW):
            if os.path.exists(stale):
                os.remove(stale)            # a binary left from before must not pass for this build
        _, code = run_status(cmd, llmc, os.path.join(out, "build_cudnn.log" if flags else "build.log"), timeout,
                             make_env)
        if code == 0 and os.path.isfile(binary):   # make's status too: a failed link can leave a file behind
            with open(binary + HOW, "w") as f:      # what a later --no_build run's table says of this binary
                f.write(how + "\n")
            return binary, how
    return None, attempts[-1][1]


def llmc_tokens_per_sec(text, batch):
    """tok/s of llm.c's log `text` at micro-batch `batch` (one micro-batch per step): B*T over the median
    milliseconds of the steps after the first WARMUP; 0 when it logged none of them."""
    ms = [float(m) for step, m in STEP.findall(text) if int(step) > WARMUP]
    return round(batch * T / (statistics.median(ms) / 1e3)) if ms else 0


def llmc(binary, data, batch, steps, extra, env, log, timeout):
    """llm.c training GPT-2 124M from scratch (-e d12) for `steps` steps of one micro-batch of `batch` x T: tok/s
    (0 if it failed). Validation at the first and last step only (-v), on one batch (-m); no samples (-s 0)."""
    train, val = data
    cmd = [binary, "-i", train, "-j", val, "-e", "d12", "-b", str(batch), "-t", str(T), "-d", str(batch * T),
           "-x", str(steps), "-v", str(steps + 1), "-m", "1", "-s", "0", *extra]
    return llmc_tokens_per_sec(run(cmd, os.path.dirname(binary), log, timeout, env), batch)


def table(rows):
    """Markdown lines of rows (side, micro-batch, tok/s or 0, log) with the ratio to ours, the last row."""
    ours_tps = rows[-1][2]
    out = ["| side | micro-batch | tok/s | ratio to ours |", "|---|---:|---:|---:|"]
    for side, batch, tps, log in rows:
        cells = f"{tps:,} | {tps / ours_tps:.3f}x" if tps and ours_tps else (f"{tps:,} | n/a" if tps else
                                                                             f"failed (see {log}) |")
        out.append(f"| {side} | {batch} | {cells} |")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--llmc", help="a clone of karpathy/llm.c (its train_gpt2.cu and Makefile)")
    p.add_argument("--cudnn_frontend", help="a clone of NVIDIA/cudnn-frontend (default: cudnn-frontend in or "
                   "beside --llmc, or in $HOME); without one llm.c builds without cuDNN")
    p.add_argument("--nanogpt", help="a clone of karpathy/nanoGPT (its bench.py and model.py)")
    p.add_argument("--batch", type=int, default=64, help="micro-batch of ours and nanoGPT (config/fast.py's)")
    p.add_argument("--llmc_batches", default="16,32,64", help="llm.c's micro-batches (comma-separated)")
    p.add_argument("--iters", type=int, default=30, help=f"steps of llm.c and ours ({WARMUP} of them warm-up)")
    p.add_argument("--data_dir", default="data/stdlib_gpt2", help="our shards, for llm.c and ours")
    p.add_argument("--llmc_args", default="", help="extra train_gpt2cu flags (space-separated), e.g. '-r 0 -ge 2'")
    p.add_argument("--ours_args", default="", help="extra train.py flags for our run (space-separated)")
    p.add_argument("--out", default="bench_out/vs_llmc", help="folder for the logs and our run folder")
    p.add_argument("--timeout", type=int, default=900, help="seconds each process (the build too) may take")
    p.add_argument("--build_only", action="store_true", help="build llm.c in --llmc and stop (no runs, no GPU "
                   "needed): a later --no_build run times it, and a failed build shows before that run")
    p.add_argument("--no_build", action="store_true", help="time the train_gpt2cu an earlier --build_only left in "
                   "--llmc instead of building it again")
    args = p.parse_args(argv)
    if not args.llmc:
        sys.exit("error: --llmc is missing: give --llmc PATH, a clone of https://github.com/karpathy/llm.c")
    if not os.path.isfile(os.path.join(args.llmc, "train_gpt2.cu")):
        sys.exit(f"error: no train_gpt2.cu in {args.llmc!r}: give --llmc PATH, a clone of "
                 "https://github.com/karpathy/llm.c")
    if not args.build_only and not args.nanogpt:
        sys.exit("error: --nanogpt is missing: give --nanogpt PATH, a clone of https://github.com/karpathy/nanoGPT")
    if not args.build_only and not os.path.isfile(os.path.join(args.nanogpt, "bench.py")):
        sys.exit(f"error: no nanoGPT bench.py in {args.nanogpt!r}: give --nanogpt PATH, a clone of "
                 "https://github.com/karpathy/nanoGPT")
    try:
        batches = [int(b) for b in args.llmc_batches.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        sys.exit(f"error: --llmc_batches {args.llmc_batches!r}: positive integers, comma-separated, e.g. 16,32,64")
    if args.batch < 1:
        sys.exit(f"error: --batch {args.batch}: a positive micro-batch, e.g. 64 (config/fast.py's)")
    near = [os.path.join(args.llmc, "cudnn-frontend"), os.path.join(args.llmc, "..", "cudnn-frontend"),
            os.path.expanduser("~/cudnn-frontend")]                 # llm.c's Makefile looks in the first and last
    frontend = args.cudnn_frontend or next((d for d in near if os.path.isdir(d)), None)
    if frontend and not os.path.isfile(os.path.join(frontend, "include", "cudnn_frontend.h")):
        sys.exit(f"error: no include/cudnn_frontend.h in {frontend}: give --cudnn_frontend PATH, a clone of "
                 "https://github.com/NVIDIA/cudnn-frontend")
    if args.build_only and args.no_build:
        sys.exit("error: --build_only and --no_build together: build with the first, time with the second")
    built = os.path.join(args.llmc, "train_gpt2cu")
    if args.no_build and not (os.path.isfile(built) and os.path.isfile(built + HOW)):
        sys.exit(f"error: --no_build, but no train_gpt2cu and {os.path.basename(built) + HOW} in {args.llmc}: "
                 "build it there first with --build_only")
    if args.iters <= WARMUP or args.timeout < 1:
        sys.exit(f"error: --iters {args.iters} / --timeout {args.timeout}: more than {WARMUP} steps (the warm-up left "
                 "out) and a positive number of seconds")
    if not args.build_only:
        gpu_check("vs_llmc.py", args.ours_args)
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)
    if args.build_only:
        with tempfile.TemporaryDirectory() as tmp:
            binary, how = build(args.llmc, frontend, build_env(tmp), out, args.timeout)
        if not binary:
            logs = [p for p in (os.path.join(out, n) for n in ("build_cudnn.log", "build.log")) if os.path.isfile(p)]
            lines = [line for line in open(logs[-1]).read().splitlines() if line.strip()] if logs else []
            lines = [line for line in lines if not line.startswith("make")] or lines     # the compiler's, not make's
            sys.exit(f"error: llm.c did not build: {lines[-1].strip() if lines else 'no output'} (the make output: "
                     f"{', '.join(logs)}); it needs nvcc and CUDA's cuBLAS, see llm.c's README")
        print(f"llm.c: built, {how}: {built}; time it with --no_build")
        return []
    data_dir = os.path.join(ROOT, args.data_dir)
    if not os.path.isfile(os.path.join(data_dir, "meta.json")) and args.data_dir == "data/stdlib_gpt2":
        print(f"preparing {args.data_dir} (the stdlib sources, GPT-2 tokens)", flush=True)
        prep = os.path.join(out, "prep.log")
        text, code = run_status([sys.executable, "data.py", "--tokenizer", "gpt2"], ROOT, prep, args.timeout)
        if code != 0:
            lines = [line for line in text.splitlines() if line.strip()]
            sys.exit(f"error: preparing {args.data_dir} failed: {lines[-1] if lines else 'no output'} ({prep})")
    data = {b: llmc_data(data_dir, b) for b in batches}
    with tempfile.TemporaryDirectory() as tmp:
        env = build_env(tmp)
        if args.no_build:
            binary, how = os.path.abspath(built), open(built + HOW).read().strip()
        else:
            binary, how = build(args.llmc, frontend, env, out, args.timeout)
        rows = [("nanoGPT bench.py", args.batch, peer(args.nanogpt, "124m", args.batch,
                                                       os.path.join(out, "nanogpt.log"), args.timeout), "nanogpt.log")]
        print(f"nanoGPT bench.py batch {args.batch}: {rows[0][2]:,} tok/s", flush=True)
        for b in batches:
            log = os.path.join(out, f"llmc_b{b}.log")
            tps = llmc(binary, data[b], b, args.iters, args.llmc_args.split(), env, log, args.timeout) if binary else 0
            print(f"llm.c batch {b}: {tps:,} tok/s", flush=True)
            rows.append((f"llm.c train_gpt2cu, {how}", b, tps, os.path.basename(log) if binary else "build.log"))
    s = ours("124m", args.batch, args.iters, ["--total_batch_size=0", f"--data_dir={data_dir}",
                                              *args.ours_args.split()], os.path.join(out, "ours"),
             os.path.join(out, "ours.log"), args.timeout)
    tps = round(s["median_tokens_per_sec"]) if s else 0
    print(f"ours batch {args.batch}: {tps:,} tok/s", flush=True)
    rows.append(("ours: config/fast.py --total_batch_size=0", args.batch, tps, "ours.log"))
    print(f"\nGPT-2 124M, T={T}, one optimizer step per micro-batch; logs in {out}\n")
    print("\n".join(table(rows)))
    if not any(r[2] for r in rows):
        sys.exit(f"error: every run failed: see the logs in {out}")
    return rows


if __name__ == "__main__":
    main()
