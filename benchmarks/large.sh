#!/usr/bin/env bash
# config/large.py (~1.3B): bf16 vs FP8 (both compiled), loss over the first STEPS steps, tokens/s, MFU,
# peak memory. Usage: bash benchmarks/large.sh [OUT_DIR] [STEPS] [BATCH]
set -uo pipefail
out=${1:-bench_out/large}; steps=${2:-200}; batch=${3:-4}
mkdir -p "$out"
common="--config config/large.py --batch_size=$batch --total_batch_size=0 --max_iters=$steps --timing_warmup=5"
common="$common --eval_tokens=0 --save_checkpoints=False --warmup_iters=20"
for variant in "bf16:--fp8=False" "fp8_tensorwise:--fp8=True --fp8_recipe=tensorwise" \
               "fp8_rowwise:--fp8=True --fp8_recipe=rowwise"; do
  name=${variant%%:*}
  [ -n "${VARIANTS:-}" ] && [[ " $VARIANTS " != *" $name "* ]] && continue
  python train.py $common ${variant#*:} --out_dir=$out/$name > $out/$name.log 2>&1
  echo "$name: $(tail -1 $out/$name.log)"
done
python - "$out" <<'PY'
import json, glob, os, sys
runs = {os.path.basename(os.path.dirname(s)): s for s in sorted(glob.glob(f"{sys.argv[1]}/*/summary.json"))}
print("| run | real tok/s | MFU (bf16 peak) | peak mem GB | mean loss, steps 0-49 | 50-99 | 100-149 | 150-199 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name, s in runs.items():
    m = json.load(open(s)); rows = [json.loads(l) for l in open(os.path.dirname(s) + "/metrics.jsonl")]
    loss = {r["step"]: r["loss"] for r in rows if "loss" in r}
    means = [sum(loss[i] for i in range(a, a + 50) if i in loss) / max(1, sum(i in loss for i in range(a, a + 50)))
             for a in (0, 50, 100, 150)]
    print(f"| {name} | {m['median_tokens_per_sec']:,.0f} | {100*m['median_mfu']:.1f}% | {m['mem_gb']:.1f} | "
          + " | ".join(f"{x:.3f}" for x in means) + " |")
PY
