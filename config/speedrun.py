# The recipe that reached a fixed loss fastest in benchmarks/time_to_target.py's sweep at GPT-2 124M, laid over
# config/fast.py: Muon + WSD (config/muon.py) at 65,536 tokens per optimizer step (one micro-batch of 64 x 1024),
# 192 steps (12.6M tokens), the warm-up over the first fifth, the last fifth decaying. Measured on one H100 at
# 6554166 (BENCHMARKS.md, "Optimizers and schedules"; the .py files the script prepares, target val 3.3 fixed before
# the runs): 3.3 in 7.6 +- 1.0 s of training (4.5M tokens, 3 of 3 seeds), final val 2.42; AdamW + cosine at its own
# best of the same sweep took 18.2 s (2 of 3 seeds; the third ended at 3.32), final 3.28. A short run: the sweep
# tried 65,536 to 262,144 tokens a step over 12.6M tokens and says nothing of billions (fast.py's step is GPT-2's).
# Those numbers are time_to_target.py's: its corpus, the whole val split every 16 steps, target 3.3. Here the same
# recipe on fast.py's data; --target_val_loss=3.3 stops at the first evaluation at or below it. Laid over fast.py:
#   python train.py --config config/fast.py --config config/speedrun.py
out_dir = "out-speedrun"
optimizer = "muon"                  # Muon for the blocks' matrices, AdamW for the rest (config/muon.py)
lr_schedule = "wsd"
wsd_decay_frac = 0.2
total_batch_size = 65536           # the smallest step of the sweep and its best for both recipes
max_iters = 192
warmup_iters = 38                   # time_to_target.py's --warmup_frac 0.2 of 192 steps
eval_interval = 48
