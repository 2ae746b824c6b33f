#!/bin/bash
# Issue 17 on one GPU, in one call: config/fast.py's tokens/s with each new speed flag, each variant its own
# train.py process (a fresh compile), plus the attention and head + cross-entropy microbenchmarks. Prints a
# table of tokens/s, MFU, memory and the ratio to a baseline run of the same call (BASE) and to the peer.
#
#   bash benchmarks/speed.sh                              # mask varlen varlen_fp8head varlen_fp8head_graphs
#   RUNS="attention head_ce mask varlen" bash benchmarks/speed.sh                     # kernels first
#   RUNS="mask varlen_fp8head varlen_graphs varlen_fp8head_graphs" bash benchmarks/speed.sh
#   RUNS="mask varlen varlen_padded nomask" bash benchmarks/speed.sh                  # cu_seqlens padding
#   STORIES=.carry/stories.jsonl RUNS="long_dense long_varlen long_flex" bash benchmarks/speed.sh
#
# On a GPU machine without a network, carry .carry (tiktoken_cache: the GPT-2 BPE files; fa3: a FlashAttention-3
# build with its fa3.sh installer; stories.jsonl for the long runs) and .whl (a torchao wheel for fp8_head:
# pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl torchao==0.18.0).
# A train.py process costs ~60-90 s of compile plus ~1 s per step (cuda_graphs adds the recording): keep
# RUNS to ~5 processes per call, or ~3 with the two microbenchmarks, to stay under ~9 minutes.
#
# RUNS items (train.py runs of config/fast.py, ITERS steps after timing_warmup=5, no eval, no checkpoint).
# Every run passes --fp8_head=False first (the bf16 head; fast.py turns FP8 on), so only the
# runs that name --fp8_head=True use FP8:
#   mask                    flex with the document mask (fast.py with fused_ce in bf16, but flex)
#   varlen                  attention=varlen (FA3 when .carry/fa3 is installed, else PyTorch's FA2; printed)
#   varlen_padded           varlen with cu_seqlens padded to a fixed length (data.varlen_capacity: 577 entries at
#                           B=64), as cuda_graphs needs it; the default is exact (one recompile, length dynamic)
#   auto                    attention=auto (varlen where FA3 runs, else flex)
#   nomask                  sdpa, document_mask=False: attention across documents, as the peer trains
#   varlen_fp8head          + the FP8 (torchao tensorwise) output head instead of fused_ce
#   varlen_graphs           + CUDA graphs (compile mode reduce-overhead)
#   varlen_fp8head_graphs   both
#   varlen_fusedce          + fused_ce: the head + cross-entropy as one function, gradients in the forward
#   varlen_plaince          varlen with fused_ce=False (config/fast.py turns fused_ce on)
#   varlen_fusedce_graphs   + fused_ce + CUDA graphs
#   varlen_fusedce_fp8      + fused_ce with its matmuls in float8 (--fp8_head=True with fused_ce)
#   mask_fp8head            flex + the FP8 head (where FA3 is missing)
#   long_dense, long_varlen, long_flex   block_size=4096 on the stories corpus (STORIES, prepared into
#                           data/stories_gpt2), 16 x 4096 tokens per micro-batch: dense causal attention
#                           without the mask against the document mask through varlen and flex
#   loss_bf16, loss_fp8head, loss_fusedce, loss_bf16_seed2   200 steps of fast.py at 65,536 tokens per step
#                           (one micro-batch) (SEED, default 1337; loss_bf16_seed2: 1338), val loss at step 200:
#                           the FP8 head and fused_ce against the plain bf16 head, next to bf16 against bf16 with
#                           another seed (the noise). `RUNS=loss_table` prints the table.
#   attention               benchmarks/attention.py at fast.py's micro-batch (B=64) on data/stdlib_gpt2: flash
#                           causal, flex (model.py's options), varlen FA2 / FA3 with exact and padded cu_seqlens
#   head_ce                 benchmarks/head_ce.py: LM head + cross-entropy variants, 65,536 tokens
# Other knobs: ITERS (default 25), RUNS_DIR (logs, default /tmp/speed_runs: one per concurrent speed.sh), ARGS
# (extra train.py flags for every run), BASE (the run the ratios divide by, default mask), PEER (the peer's
# tokens/s, default 518000: nanoGPT bench.py batch 64 on the H200, BENCHMARKS.md; the peers' side-by-side
# script measures it in the same call), ATTN_MATCH (attention.py --match).
# Output: $OUT/speed.md (the table), $OUT/speed_logs.txt (each run's last lines), $OUT/micro.txt (the
# microbenchmarks); full logs in /tmp/speed_runs.
set -u
export PYTHONUNBUFFERED=1
for d in .carry/tiktoken_cache; do   # a copy of the GPT-2 BPE files beside the repository (offline machines)
  [ -d "$d" ] && { export TIKTOKEN_CACHE_DIR=$(cd "$d" && pwd); break; }
done
if ! python3 -c "import torchao" 2>/dev/null && ls .whl/*.whl > /dev/null 2>&1; then   # torchao (fp8_head), carried
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import torch, flash_attn_interface" 2>/dev/null ||
  { [ -f .carry/fa3/fa3.sh ] && source .carry/fa3/fa3.sh install; }  # FA3 for varlen
out=${OUT:-/tmp/speed_out}; runs=${RUNS_DIR:-/tmp/speed_runs}; mkdir -p "$out" "$runs"
: > "$out/speed_logs.txt"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
python3 -c "import torch, flash_attn_interface" 2>/dev/null && echo "flash_attn_interface: importable" ||
  echo "flash_attn_interface: not importable (varlen runs FA2)"
[ -d data/stdlib_gpt2 ] || python3 data.py --tokenizer gpt2 > "$runs/prep.log" 2>&1
stories=${STORIES:-.carry/stories.jsonl}

train() {  # name, flags...: config/fast.py for ITERS steps; PADDED=1 pads cu_seqlens without cuda_graphs
  local name=$1; shift
  local launch=(python3 train.py)
  [ -n "${PADDED:-}" ] && launch=(python3 -c "import runpy, sys, data; f = data.varlen_metadata; \
data.varlen_metadata = lambda d, padded=False: f(d, True); sys.argv[0] = 'train.py'; \
runpy.run_path('train.py', run_name='__main__')")
  echo "=== $name: $*${PADDED:+ (cu_seqlens padded)}"
  timeout -k 30 420 "${launch[@]}" --config config/fast.py --fp8_head=False --max_iters=$((${ITERS:-25} + 5)) \
      --timing_warmup=5 --eval_tokens=0 --save_checkpoints=False --out_dir="$runs/$name" "$@" ${ARGS:-} \
      > "$runs/$name.log" 2>&1
  echo "rc=$? $(grep -E 'attention:|fp8:|median over' "$runs/$name.log" | tr '\n' ' ')"
  { echo "=== $name: $*"; grep -v '^ *$' "$runs/$name.log" | grep -v '^step [0-9]' | tail -n 12;
    grep '^step ' "$runs/$name.log" | tail -n 2; } >> "$out/speed_logs.txt"
  echo "$name|$*${PADDED:+ (cu_seqlens padded)}" >> "$runs/done.txt"
}

long() {  # name, flags...: the stories corpus at block_size 4096, 16 rows per micro-batch (65,536 tokens)
  if [ ! -d data/stories_gpt2 ]; then
    [ -f "$stories" ] || { echo "=== $1: skipped: no $stories (set STORIES)"; return; }
    python3 data.py --input "$stories" --out data/stories_gpt2 --tokenizer gpt2 > "$runs/prep_stories.log" 2>&1
  fi
  local name=$1; shift
  train "$name" --data_dir=data/stories_gpt2 --block_size=4096 --batch_size=16 --total_batch_size=524288 "$@"
}

loss() {  # name, flags...: 200 steps at an eighth of fast.py's batch, every step logged, val loss at the end
  local name=$1; shift
  echo "=== $name: $*"
  timeout -k 30 400 python3 train.py --config config/fast.py --fp8_head=False --max_iters=200 --total_batch_size=65536 \
      --eval_interval=200 --eval_tokens=524288 --save_checkpoints=False --out_dir="$runs/$name" "$@" \
      > "$runs/$name.log" 2>&1
  echo "rc=$? $(grep -E 'fp8:|val loss' "$runs/$name.log" | tail -n 2 | tr '\n' ' ')"
}

rm -f "$runs/done.txt"
for r in ${RUNS:-mask varlen varlen_fp8head varlen_fp8head_graphs}; do
  case $r in
    mask) train mask --attention=flex ;;
    varlen) train varlen --attention=varlen ;;
    varlen_padded) PADDED=1 train varlen_padded --attention=varlen ;;
    auto) train auto --attention=auto ;;
    nomask) train nomask --attention=sdpa --document_mask=False ;;
    varlen_fp8head) train varlen_fp8head --attention=varlen --fp8_head=True --fused_ce=False ;;
    varlen_graphs) train varlen_graphs --attention=varlen --cuda_graphs=True ;;
    varlen_plaince) train varlen_plaince --attention=varlen --fused_ce=False ;;
    varlen_fusedce) train varlen_fusedce --attention=varlen --fused_ce=True ;;
    varlen_fusedce_fp8) train varlen_fusedce_fp8 --attention=varlen --fused_ce=True --fp8_head=True ;;
    varlen_fusedce_graphs) train varlen_fusedce_graphs --attention=varlen --fused_ce=True --cuda_graphs=True ;;
    varlen_fp8head_graphs) train varlen_fp8head_graphs --attention=varlen --fp8_head=True --fused_ce=False \
      --cuda_graphs=True ;;
    mask_fp8head) train mask_fp8head --attention=flex --fp8_head=True --fused_ce=False ;;
    loss_bf16) loss loss_bf16 --seed=${SEED:-1337} --fused_ce=False ;;
    loss_fp8head) loss loss_fp8head --seed=${SEED:-1337} --fp8_head=True --fused_ce=False ;;
    loss_bf16_seed2) loss loss_bf16_seed2 --seed=$((${SEED:-1337} + 1)) --fused_ce=False ;;
    loss_fusedce) loss loss_fusedce --seed=${SEED:-1337} --fused_ce=True ;;
    loss_fusedce_fp8) loss loss_fusedce_fp8 --seed=${SEED:-1337} --fused_ce=True --fp8_head=True ;;
    loss_table)
      python3 - "$runs" <<'PY' | tee -a "$out/loss.md"
import json, os, sys
runs = sys.argv[1]
def read(name):
    rows = [json.loads(l) for l in open(os.path.join(runs, name, "metrics.jsonl"))]
    train = {r["step"]: r["loss"] for r in rows if "loss" in r}
    val = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    return train, val[-1] if val else None
got = {n: read(n) for n in ("loss_bf16", "loss_fp8head", "loss_fusedce", "loss_fusedce_fp8", "loss_bf16_seed2")
       if os.path.isfile(os.path.join(runs, n, "metrics.jsonl"))}
base = got.get("loss_bf16")
print("| run | mean train loss, steps 150-199 | val loss, step 200 | "
      "mean abs difference per step vs loss_bf16, steps 100-199 |\n|---|---:|---:|---:|")
for name, (train, val) in got.items():
    late = [train[s] for s in range(150, 200) if s in train]
    diff = [abs(train[s] - base[0][s]) for s in range(100, 200) if base and s in train and s in base[0]]
    print(f"| {name} | {sum(late) / len(late):.4f} | {val:.4f} | "
          + (f"{sum(diff) / len(diff):.4f} |" if diff and name != "loss_bf16" else "|"))
PY
      ;;
    long_dense) long long_dense --attention=sdpa --document_mask=False ;;
    long_varlen) long long_varlen --attention=varlen ;;
    long_flex) long long_flex --attention=flex ;;
    attention)
      echo "=== attention.py (B=64, stdlib_gpt2)"
      timeout -k 30 400 python3 benchmarks/attention.py --data_dir data/stdlib_gpt2 --batch_size 64 \
          --match "${ATTN_MATCH:-causal \(auto|num_warps=8 \(model|varlen|FA3 dense}" 2>&1 |
          grep -v '^W\|Warning' | tee -a "$out/micro.txt" ;;
    head_ce)
      echo "=== head_ce.py"
      timeout -k 30 400 python3 benchmarks/head_ce.py 2>&1 | grep -v '^W\|Warning' | tee -a "$out/micro.txt" ;;
    *) echo "unknown run $r" ;;
  esac
done

[ -f "$runs/done.txt" ] && python3 - "$runs" "${BASE:-mask}" "${PEER:-518000}" <<'PY' | tee "$out/speed.md"
import json, os, sys
runs, base, peer = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows = []
for line in open(os.path.join(runs, "done.txt")):
    name, flags = line.rstrip("\n").split("|", 1)
    try:
        s = json.load(open(os.path.join(runs, name, "summary.json")))
    except (OSError, ValueError):
        s = {}
    kernel = next((l.split("attention: ", 1)[1].strip() for l in open(os.path.join(runs, name + ".log"))
                   if "attention: varlen through" in l), "")
    rows.append((name, flags, s.get("median_tokens_per_sec"), s.get("median_mfu"), s.get("mem_gb"), kernel))
refs = {False: base, True: "long_dense"}          # the long runs (T=4096) divide by long_dense
refs = {k: next((r[2] for r in rows if r[0] == v and r[2]), None) for k, v in refs.items()}
print(f"| run | flags | real tok/s | MFU | mem GB | x {base} (long: x long_dense) | x peer ({peer:,.0f}) |\n"
      "|---|---|---:|---:|---:|---:|---:|")
for name, flags, tps, mfu, mem, kernel in rows:
    if not tps:
        print(f"| {name} | {flags} | failed: see speed_logs.txt | | | | |")
        continue
    ref = refs[name.startswith("long")]
    print(f"| {name} | {flags}{' (' + kernel + ')' if kernel else ''} | {tps:,.0f} | "
          f"{f'{100 * mfu:.1f}%' if mfu else 'n/a'} | {f'{mem:.1f}' if mem else 'n/a'} | "
          + (f"{tps / ref:.3f}" if ref else "") + f" | {tps / peer:.3f} |")
PY
exit 0
