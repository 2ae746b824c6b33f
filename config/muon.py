# Muon for the blocks' matrices (the embeddings, head and gains stay on AdamW) and a warmup-stable-decay schedule,
# laid over a size preset. At 124M it reached the validation loss AdamW + cosine ends 100 steps at in under a third
# of the time (BENCHMARKS.md, "Optimizers and schedules"):
#   python train.py --config config/fast.py --config config/muon.py
#   python benchmarks/time_to_target.py              # measures it again: AdamW + cosine against this
# Muon's learning rate and momentum are its flags' defaults (muon_lr, muon_momentum: docs/flags.md).
optimizer = "muon"
lr_schedule = "wsd"
wsd_decay_frac = 0.2                # the last fifth of the run decays linearly to min_lr
