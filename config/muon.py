# Muon for the blocks' matrices (the embeddings, head and gains stay on AdamW) and a warmup-stable-decay schedule,
# laid over a size preset. Measured at 124M (one H100; BENCHMARKS.md, "Optimizers and schedules"): each recipe at its
# best of one sweep (65,536, 131,072 and 262,144 tokens per step x peak lr 0.5x, 1x, 2x; runs of 12.6M tokens), three
# seeds, a target of val 3.3 fixed before the runs: Muon + WSD (65,536, muon_lr 0.02, the default) reached it in
# 7.6 +- 1.0 s of training (4.5M tokens), AdamW + cosine (65,536, 6e-4) in 18.2 s in 2 of 3 seeds; final val 2.42
# against 3.28. This file sets no step: laid over fast.py it trains at fast.py's 524,288 tokens a step, which the
# sweep did not run; config/speedrun.py is the measured run (its step), with the field's blocks (faster still). Longer
# runs and the other sizes are not measured. The measurement:
#   python benchmarks/time_to_target.py --target 3.3 --tokens 12582912 --eval_every 1048576 \
#       --batch_tokens 65536,131072,262144 --lr_scales 0.5,1,2
# Muon's learning rate and momentum are its flags' defaults (muon_lr, muon_momentum: docs/flags.md).
optimizer = "muon"
lr_schedule = "wsd"
wsd_decay_frac = 0.2                # the last fifth of the run decays linearly to min_lr
