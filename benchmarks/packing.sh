#!/usr/bin/env bash
# Padded vs packed (with and without the document mask), GPT-2 124M, block_size 1024, bf16 + compile,
# on two varied-length corpora. Usage: bash benchmarks/packing.sh [OUT_DIR] [STEPS] [BATCH]
# Needs the GPT-2 tokenizer (TIKTOKEN_CACHE_DIR offline); a .jsonl of stories at $STORIES is the second corpus.
set -uo pipefail
out=${1:-bench_out/packing}; steps=${2:-20}; batch=${3:-16}
stories=${STORIES:-data_sources/stories.jsonl}
mkdir -p "$out"
[ -d data/stdlib_gpt2 ] || python data.py --tokenizer gpt2
corpora="data/stdlib_gpt2"
if [ -f "$stories" ]; then
  [ -d data/stories_gpt2 ] || python data.py --input "$stories" --out data/stories_gpt2 --tokenizer gpt2
  corpora="$corpora data/stories_gpt2"
fi
common="--config config/fast.py --batch_size=$batch --total_batch_size=0 --max_iters=$((steps + 5)) --timing_warmup=5"
common="$common --eval_tokens=0 --save_checkpoints=False"
for d in $corpora; do
  for variant in "padded:--packing=False --attention=sdpa" \
                 "packed_mask_flex:--packing=True --document_mask=True --attention=flex" \
                 "packed_nomask:--packing=True --document_mask=False --attention=sdpa"; do
    name=$(basename $d)_${variant%%:*}
    python train.py $common --data_dir=$d ${variant#*:} --out_dir=$out/$name > $out/$name.log 2>&1
    echo "$name: $(tail -1 $out/$name.log)"
  done
done
python - "$out" <<'PY'
import json, glob, os, sys
print("| run | real tok/s | MFU | pad frac |")
print("|---|---:|---:|---:|")
for s in sorted(glob.glob(f"{sys.argv[1]}/*/summary.json")):
    m = json.load(open(s)); rows = [json.loads(l) for l in open(os.path.dirname(s) + "/metrics.jsonl")]
    pad = sum(r["pad_frac"] for r in rows if "pad_frac" in r) / max(1, sum("pad_frac" in r for r in rows))
    print(f"| {os.path.basename(os.path.dirname(s))} | {m['median_tokens_per_sec']:,.0f} | "
          f"{100*m['median_mfu']:.1f}% | {pad:.3f} |")
PY
