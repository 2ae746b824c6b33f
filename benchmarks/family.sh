#!/bin/bash
# The GPT-2 family side by side with nanoGPT, one GPU: for each size, the peer's bench.py and this size's
# preset (config/fast.py at 124M, config/gpt2-medium|large|xl.py above) in one side_by_side.sh call each,
# then one table row: size, batch, peer tok/s, ours, ratio, MFU, peak memory, first step (compile included).
# Above 124M both sides run one optimizer step per micro-batch at T=1024 (side_by_side.sh); the peer at its
# batch (64 at 124M, 32 at 350M, 16 above), ours at its preset's. MFU is against the dense bf16 peak, FP8 or not.
#   SIZES="124m 1558m" ITERS=20 bash benchmarks/family.sh          # needs .peers/side_by_side.sh (BENCHMARKS.md)
set -u
out=${OUT:-/tmp/family}; mkdir -p "$out"
rows=()
for size in ${SIZES:-124m 350m 774m 1558m}; do
  case $size in
    124m) preset=config/fast.py; runs="nano64 mask"; peer_b=64 ;;
    350m) preset=config/gpt2-medium.py; runs="peer mask"; peer_b=32 ;;
    774m) preset=config/gpt2-large.py; runs="peer mask"; peer_b=16 ;;
    1558m) preset=config/gpt2-xl.py; runs="peer mask"; peer_b=16 ;;
    *) echo "sizes are 124m 350m 774m 1558m"; exit 2 ;;
  esac
  b=$(sed -nE 's/^batch_size = ([0-9]+).*/\1/p' "$preset")
  args="--config $preset --batch_size=$b"; [ "$size" = 124m ] && args=""     # 124m: side_by_side runs fast.py as is
  log="$out/$size.txt"
  SIZE=$size RUNS="$runs" ITERS=${ITERS:-20} OURS_ARGS="$args ${EXTRA:-}" OUT="$out/$size" \
    bash .peers/side_by_side.sh > "$log" 2>&1
  cat "$log"
  peer=$(sed -nE "s/^nanoGPT bench.py batch $peer_b: .*, ([0-9]+) tok\/s$/\1/p" "$log")
  rows+=("$(python3 - "$size" "$peer_b" "$b" "${peer:-0}" <<'PY'
import json, sys
size, peer_b, b, peer = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    s = json.load(open("/tmp/side_by_side_runs/mask/summary.json"))
except (OSError, ValueError):
    print(f"| {size} | {peer_b} / {b} | {peer:,} | failed | | | | |"); sys.exit()
ours = s["median_tokens_per_sec"]
ratio = f"{ours / peer:.3f}x" if peer else "?"
print(f"| {size} | {peer_b} / {b} | {peer:,} | {round(ours):,} | {ratio} | {100 * s['median_mfu']:.1f}% | "
      f"{s['mem_gb']:.1f} | {s['first_step_s']:.1f} s |")
PY
)")
  rm -f /tmp/side_by_side_runs/mask/summary.json
done
echo "| size | batch (peer / ours) | peer tok/s | ours tok/s | ratio | MFU | peak GB | first step |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
