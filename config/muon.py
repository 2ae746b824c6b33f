# Muon for the blocks' matrices (the embeddings, head and gains stay on AdamW) and a warmup-stable-decay schedule,
# laid over a size preset. Measured at 124M (one H100; BENCHMARKS.md, "Optimizers and schedules"): each recipe at its
# best of a small sweep (peak lr 0.5x, 1x, 2x; 65,536 tokens per step, the best of those tried), runs of 13.1M tokens,
# three seeds, a target of val 3.3 fixed before the runs: Muon + WSD reached it in 9.3 s of training (5.2M tokens),
# AdamW + cosine in 20.7 +- 1.3 s (12.2M); final val 2.45 against 3.26. Muon's seeds ran at muon_lr 0.01; the default
# here, 0.02, reached 3.3 at the same evaluation with a lower final loss (2.39, one seed). The full sweep (four step
# sizes, 52.4M tokens a run) and the other sizes are not measured yet. Train it; the measurement:
#   python train.py --config config/fast.py --config config/muon.py --total_batch_size=65536
#   python benchmarks/time_to_target.py --target 3.3 --tokens 13107200 --batch_tokens 65536,262144 --lr_scales 0.5,1,2
# Muon's learning rate and momentum are its flags' defaults (muon_lr, muon_momentum: docs/flags.md).
optimizer = "muon"
lr_schedule = "wsd"
wsd_decay_frac = 0.2                # the last fifth of the run decays linearly to min_lr
