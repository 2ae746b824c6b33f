# Muon for the blocks' matrices (the embeddings, head and gains stay on AdamW) and a warmup-stable-decay schedule,
# laid over a size preset. Whether it reaches a loss sooner than AdamW + cosine is not measured yet: the one comparison
# run (124M, one setting each: AdamW at 524,288 tokens per step and fast.py's lr 6e-4 for 100 steps) starved AdamW of
# optimizer steps (BENCHMARKS.md, "Optimizers and schedules"). The fair one, each recipe at its best of a sweep over
# tokens per step and learning rate, three seeds, a target fixed before the runs, is the second command (not run yet):
#   python train.py --config config/fast.py --config config/muon.py
#   python benchmarks/time_to_target.py --target 3.74
# Muon's learning rate and momentum are its flags' defaults (muon_lr, muon_momentum: docs/flags.md).
optimizer = "muon"
lr_schedule = "wsd"
wsd_decay_frac = 0.2                # the last fifth of the run decays linearly to min_lr
