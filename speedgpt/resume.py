"""
A resume, decided in one place: which checkpoint (resume_path: init_from=resume, resume_from), which config
continues (resume_config: the checkpoint's shape, and its schedule and data unless set; resume_changes: what
changed), whether the run is finished already, and which state continues (restore_state: the optimizer, the
GradScaler, the loader's position and the RNG streams; the weights and each module's own state load with the model:
checkpoint.load_weights). settle() is train.py's stage: a new run's config, or a resumed one's with its checkpoint.
Files (writing, rotation, the history of out_dir) are speedgpt/checkpoint.py's.
"""
import os
from dataclasses import asdict, replace

import data
from configurator import Config, check_schedule, model_keys
from speedgpt import budget, checkpoint, evaluation, nanogpt, optim
from speedgpt.checkpoint import checkpoint_step, load_checkpoint, remove_stale_tmp, resolve_resume, saved_steps
from speedgpt.distributed import plan_batch, print0
from speedgpt.shards import load_meta, other_data

RUN_STATE_KEYS = ("dropout", "attention")     # model keys a resume may change: the weights do not depend on them


def kept_keys():
    """The keys a resumed run takes from its checkpoint unless set explicitly: the schedule's (optim, budget), the
    data's (the loader's position is a position in them) and the validation's (its rows), as their modules declare
    them, the micro-batch (a step of total_batch_size=0 is one: left out, the default's would change it or be refused
    against it), the count of kept checkpoints (the default's would prune the run's older ones), max_iters (a resume
    continues the run it names; training on past its end is asked for with --max_iters) and the seed (it chose the
    validation rows, which the default's would swap for others under the same val loss: refuse_other_seed)."""
    return optim.KEPT_ON_RESUME + budget.KEPT_ON_RESUME + data.KEPT_ON_RESUME + evaluation.KEPT_ON_RESUME + \
        checkpoint.KEPT_ON_RESUME + ("batch_size", "max_iters", "seed")


def kept_without_latest(out_dir):
    """(what is there, the resume_from that continues it) where out_dir holds a run's kept checkpoints but no
    ckpt.pt (deleted or lost: a new run would remove the rest), else None. The newest step file, else ckpt_best.pt."""
    kept = checkpoint.newest_kept(out_dir)
    return kept and (kept[0], kept[1] if kept[2] is None else str(kept[2]))


def settle(cfg, explicit, proc, check_flags):
    """The run's config, checked (`check_flags(cfg, proc)`: train.py's), and for init_from='resume' the
    checkpoint: the config continues the checkpoint's (its shape, and its schedule unless a schedule key is set
    explicitly; a different shape refused; every change printed; ckpt["finished"]: why a finished run has
    nothing to do). For a new run lr_decay_iters=0 is resolved to max_iters (past warm-up), so a later resume keeps
    this schedule; a new run is refused, when init_from is not given, if out_dir holds a checkpoint it
    would replace. Returns (cfg, checkpoint or None). Raises FileNotFoundError / ValueError for a
    missing, corrupt or mismatched checkpoint."""
    cfg, path = resume_path(cfg, explicit)           # init_from='resume' (resume_from implies it): which file
    latest = os.path.join(cfg.out_dir, "ckpt.pt")
    if remove_stale_tmp(latest):
        print0(f"removed the .tmp files in {cfg.out_dir}, left by a run stopped while saving")
    if cfg.init_from != "resume":
        if nanogpt.is_checkpoint(cfg.init_from):      # a checkpoint file's shape, before the checks (nanoGPT's or ours)
            cfg = nanogpt.start_config(cfg, explicit)
        cfg = check_flags(cfg, proc)
        if cfg.init_from != "scratch":
            from hf import check_tokens
            check_tokens(cfg.init_from, cfg.data_dir)
        replaces = not ("init_from" in explicit and cfg.init_from == "scratch")    # only that says: replace it
        if replaces and not os.path.isfile(latest) and (left := kept_without_latest(cfg.out_dir)):
            raise ValueError(f"{cfg.out_dir} holds a run's checkpoints without its ckpt.pt ({left[0]}), which a new "
                             f"run would remove: continue it with --resume_from={left[1]}" +
                             (" (leaving out --init_from)" if "init_from" in explicit else "") +
                             ", or give the new run another "
                             "--out_dir" + (", or start afresh there with --init_from=scratch (which removes them)"
                                            if cfg.init_from == "scratch" else ""))
        if replaces and os.path.isfile(latest):       # without checkpoints too: its metrics would be replaced
            if cfg.init_from == "scratch":
                raise ValueError(f"{path} holds a run: continue it with --init_from=resume, or start afresh with "
                                 "--init_from=scratch (which replaces it) or another out_dir")
            inside = os.path.dirname(os.path.abspath(cfg.init_from)) == os.path.abspath(cfg.out_dir)
            raise ValueError(f"{path} holds a run, which a new run from {cfg.init_from} would replace (its "
                             "checkpoints and metrics): continue it with --init_from=resume"
                             + (", or from a kept step with --resume_from=STEP" if inside else "")
                             + ", or give the new run another --out_dir"
                             + ("" if inside else f" (rm -rf {cfg.out_dir} to start it there)"))
        if not replaces and not cfg.save_checkpoints and (os.path.isfile(latest) or kept_without_latest(cfg.out_dir)):
            # the old run's files go at the new run's first checkpoint, which never comes: they would stay beside this
            # run's metrics and config.json, and a resume would take both for one history
            raise ValueError(f"{cfg.out_dir} holds a run, which --init_from=scratch replaces at its first checkpoint, "
                             "but save_checkpoints=False writes none: its checkpoints would stay beside this run's "
                             f"metrics; give the new run another --out_dir (or rm -rf {cfg.out_dir} first)")
        return resolve_decay(cfg), None
    left = kept_without_latest(cfg.out_dir) if path == latest else None
    ckpt = load_checkpoint(path, missing=f": resume a kept one with --resume_from={left[1]} ({left[0]})" if left else
                           ": nothing to resume (to start afresh, leave out --init_from=resume)")
    refuse_another_runs(path, ckpt, cfg.out_dir)
    refuse_other_seed(path, cfg, explicit, ckpt["config"])
    cfg, notes = resume_config(cfg, explicit, ckpt["config"], ckpt.get("tokens_per_step"), proc.world)
    refuse_other_data(path, ckpt, cfg.data_dir)
    cfg = check_flags(cfg, proc)                                        # the shape may be the checkpoint's
    plan_batch(cfg, proc.world, kept="total_batch_size" not in explicit)
    if ckpt["step"] > cfg.max_iters:
        raise ValueError(f"checkpoint {path} is at step {ckpt['step']}, past max_iters={cfg.max_iters}: give a larger "
                         "--max_iters, or --resume_from an earlier step")
    if cfg.profile and ckpt["step"] + cfg.timing_warmup > cfg.max_iters:
        raise ValueError(f"profile=True profiles step {ckpt['step'] + cfg.timing_warmup - 1} of this resumed run: "
                         f"max_iters={cfg.max_iters} ends before it")
    # a checkpoint a signal wrote after the last step is not the run's end: its final evaluation (and the checkpoint
    # with it) is still to make, which the resumed loop does at once, as the same command says to resume it
    ended = not ckpt.get("stopped")
    ckpt["finished"] = evaluation.reached_before(cfg, ckpt) or ended and ckpt["step"] == cfg.max_iters and \
        f"is at step {cfg.max_iters:,} = max_iters; to train on, give a larger --max_iters" or \
        ended and budget.spent(cfg, ckpt.get("train_seconds", 0)) and \
        f"has spent its {budget.describe(cfg, ckpt['train_seconds'])}; to train on, give a larger --time_budget"
    if ckpt["finished"]:
        return cfg, ckpt
    print0(f"resume: {path} at step {ckpt['step']:,} of max_iters={cfg.max_iters:,}")
    for line in rewind_notes(ckpt, path, cfg.out_dir) + notes + resume_changes(
            cfg, explicit, ckpt["config"], (ckpt["step"], ckpt.get("train_seconds", 0.0))):
        print0(f"resume: {line}")
    return cfg, ckpt


def refuse_another_runs(path, ckpt, out_dir):
    """Raise ValueError where resume_from names a checkpoint file outside out_dir that another run saved while
    out_dir holds a run of its own: the resume would take that run's history as its past, abandon its later steps
    (their checkpoints removed) and name its best. Runs are told apart by the run_id their checkpoints carry (a
    moved folder, or an out_dir saved as a relative path, is the same run), else, for checkpoints written before
    they carried one, by the config's out_dir. A file of this run kept elsewhere resumes as before."""
    saved = ckpt["config"].get("out_dir")
    if os.path.dirname(os.path.abspath(path)) == os.path.abspath(out_dir) or not saved:
        return
    latest = os.path.join(out_dir, "ckpt.pt")
    kept = checkpoint.newest_kept(out_dir) or (os.path.isfile(latest) and ("ckpt.pt", latest))
    if not kept:
        return
    theirs, ours = ckpt.get("run_id"), checkpoint.run_id_of(latest if os.path.isfile(latest) else kept[1])
    if theirs and ours:
        other = theirs != ours
    else:                                      # a checkpoint from before run_id: the folder it was saved from
        other = os.path.abspath(saved) != os.path.abspath(out_dir)
    if other:
        raise ValueError(f"resume_from={path!r} is a checkpoint of the run in {saved}, but {out_dir} holds another run "
                         f"({kept[0]}), whose later steps this resume would remove: resume it in its own folder "
                         f"(--out_dir={saved}), or in a new --out_dir")


def refuse_other_seed(path, cfg, explicit, saved):
    """Raise ValueError where the seed set explicitly is not the checkpoint's config `saved`'s: a resume continues
    the run's data order and dropout streams (its loader and RNG states), so a new seed would change only the
    validation rows (the val loader's order is the seed's), and the val loss, ckpt_best.pt and target_val_loss would
    compare other rows with the run's while the printed change said the seed was taken."""
    if "seed" in explicit and "seed" in saved and cfg.seed != saved["seed"]:
        raise ValueError(f"seed={cfg.seed} differs from the checkpoint's {saved['seed']}: a resume continues the run's "
                         "data order, dropout and validation rows, which its seed chose; leave seed unset (no --seed, "
                         "none in a config file), or start a new run from its weights in a new folder "
                         f"(--init_from={path} --out_dir=NEW_FOLDER)")


def refuse_other_data(path, ckpt, data_dir):
    """Raise ValueError where data_dir does not hold the tokens the checkpoint's run trained on (its meta): the
    loader resumes at a place in those tokens, which in other data of as many rows would go on silently."""
    try:
        saved, meta = ckpt["meta"], load_meta(data_dir, verbose=False)
    except (FileNotFoundError, ValueError):       # no data there: the loader's own line (the stdlib corpora, prepared
        return                                      # on first use, are held to the checkpoint then: train.build_data)
    if saved["vocab_size"] != meta["vocab_size"]:
        raise ValueError(f"vocab_size {saved['vocab_size']} in the checkpoint, {meta['vocab_size']} in data: "
                         f"give --data_dir data of `python data.py --tokenizer {saved['tokenizer']}`")
    changed = other_data(saved, meta)
    if changed:
        raise ValueError(f"data_dir={data_dir} holds other tokens than this run trained on ({'; '.join(changed)}: "
                         f"prepared again?): resume on the data it trained on, or start a new run from its weights "
                         f"in a new folder (--init_from={path} --out_dir=NEW_FOLDER)")


def resolve_decay(cfg):
    """`cfg` with lr_decay_iters=0 ("until max_iters") made explicit once the run leaves warm-up, so that
    a resume that extends max_iters keeps the decay horizon the run was planned with. Under a time budget
    the horizon is the budget: lr_decay_iters stays 0."""
    if cfg.time_budget:
        return cfg
    return replace(cfg, lr_decay_iters=cfg.lr_decay_iters or (cfg.max_iters if cfg.max_iters > cfg.warmup_iters else 0))




def resume_config(cfg, explicit, saved, saved_tokens=None, world=1):
    """The config a resumed run continues with. `cfg` is this command's config, `explicit` the keys its
    config files and overrides set, `saved` the checkpoint's config (a dict). The model's shape must
    match (ValueError naming the key; dropout and attention may change: the weights do not depend on
    them; shape keys not set explicitly are taken from the checkpoint). The optimizer, the schedule
    (optim's and budget's KEPT_ON_RESUME) and the data (data's: the loader's position is a position in them) are
    the saved
    ones unless set explicitly, so extending max_iters keeps the decay horizon the run started with;
    lr_decay_iters=0 set explicitly means the new max_iters. With total_batch_size=0 (one
    micro-batch per process) a resume on `world` processes keeps the checkpoint's `saved_tokens` per step
    unless total_batch_size is set explicitly. Returns (config, lines to print); resume_changes()
    describes what differs, once the flags are resolved."""
    defaults = Config()          # a key a checkpoint predates has its default (activation: gelu)
    if "optimizer" not in explicit:
        cfg = replace(cfg, optimizer=saved.get("optimizer", "adamw"))
    changed, way = [], ""
    if saved.get("optimizer", "adamw") != cfg.optimizer:      # its state cannot carry over either
        changed.append(f"'optimizer'={cfg.optimizer!r} differs from the checkpoint's {saved.get('optimizer', 'adamw')!r}")
        way = f"; --optimizer={saved.get('optimizer', 'adamw')} resumes with the checkpoint's optimizer"
    for k in model_keys():
        old = saved.get(k, getattr(defaults, k))
        if k not in RUN_STATE_KEYS and k not in explicit:
            cfg = replace(cfg, **{k: old})           # the shape is the checkpoint's (from gpt2, say)
        elif k not in RUN_STATE_KEYS and old != getattr(cfg, k):
            changed.append(f"{k!r}={getattr(cfg, k)!r} differs from the checkpoint's {old!r}")
    if changed:                                      # all at once, not one per try
        raise ValueError(f"config key {'; '.join(changed)}: the model and its optimizer cannot change on resume (start "
                         f"afresh in another out_dir to train another{way})")
    kept = {k: saved[k] for k in kept_keys() if k not in explicit and k in saved}
    if "lr_schedule" in explicit and cfg.lr_schedule != "wsd":     # the saved WSD decay share would do nothing
        kept.pop("wsd_decay_frac", None)
    if "save_checkpoints" in explicit and not cfg.save_checkpoints:     # the saved count would be refused as unused
        kept.pop("keep_checkpoints", None)
    if "time_budget" in explicit and cfg.time_budget:     # the decay runs on the budget now: no step horizon
        kept.pop("lr_decay_iters", None)
    named = "lr_decay_iters" in explicit and cfg.lr_decay_iters > 0       # 0 would be the run's large max_iters again
    if saved.get("time_budget") and not kept.get("time_budget", cfg.time_budget) and not named \
            and kept.get("lr_schedule", cfg.lr_schedule) != "constant":
        raise ValueError(f"time_budget=0: this run's learning rate ran on its time_budget={saved['time_budget']:g} "
                         "minutes of training, and has no step at which a decay over steps would resume it: give "
                         "a larger --time_budget to train on, or set the new horizon with --lr_decay_iters=N")
    if kept.get("lr_decay_iters") == 0 and not kept.get("time_budget", cfg.time_budget):
        # unresolved: an older checkpoint, or a run that ended in warm-up (a time budget's horizon is the budget)
        started = Config(**{k: saved[k] for k in ("max_iters", "warmup_iters")})
        kept["lr_decay_iters"] = resolve_decay(started).lr_decay_iters
    cfg, notes = resolve_decay(replace(cfg, **kept)), []
    check_schedule(cfg)
    if cfg.lr_schedule == "constant":   # optim.check leaves a resume out (lr_decay_iters is resolved): the keys given
        optim.refuse_constant_decay(Config(**{k: getattr(cfg, k) for k in ("min_lr", "lr_decay_iters")
                                              if k in explicit}))
    here = cfg.batch_size * cfg.block_size * world
    if cfg.total_batch_size == 0 and saved_tokens not in (None, here):    # one micro-batch per process: another step
        if "total_batch_size" in explicit:
            notes.append(f"total_batch_size=0 makes a step {here:,} tokens here; the checkpoint's steps were "
                         f"{saved_tokens:,}")
        else:
            cfg = replace(cfg, total_batch_size=saved_tokens)
            notes.append(f"total_batch_size=0 keeps the checkpoint's step of {saved_tokens:,} tokens (one micro-batch "
                         f"per process is {here:,} here); set --total_batch_size to change it")
    return cfg, notes


def resume_changes(cfg, explicit, saved, at=None):
    """Lines describing each key of the resumed run's `cfg` that differs from the checkpoint's config
    `saved`, and where the learning rate goes from here (`at`: the checkpoint's step and seconds of training)."""
    def why(k):
        if k == "time_budget" and 0 < saved[k] < cfg.time_budget and cfg.lr_schedule != "constant":
            return " (set explicitly: the decay stretches over the larger budget, so the rate goes back to an " \
                   "earlier point of its curve)"
        return " (set explicitly)" if k in kept_keys() and k in explicit else \
            " (the decay runs on time_budget)" if k == "lr_decay_iters" and cfg.time_budget else \
            " (0 resolved: decay to the end of the run)" if k == "lr_decay_iters" else ""
    changes = [f"{k} {saved[k]!r} -> {v!r}{why(k)}" for k, v in asdict(cfg).items()
               if k in saved and saved[k] != v and k not in ("init_from", "resume_from")]   # this command's own
    if at and cfg.time_budget and not saved.get("time_budget") and cfg.lr_schedule != "constant":
        steps = Config(**{k: saved[k] for k in asdict(cfg) if k in saved})      # the schedule it ran on
        changes.append(f"the learning rate runs on time_budget from here, not on steps: "
                       f"{optim.lr_at(at[0], cfg, seconds=at[1]):.2e} at {budget.describe(cfg, at[1])} (the steps' "
                       f"decay had it at {optim.lr_at(at[0], steps):.2e}), down to min_lr={cfg.min_lr:g} when it is "
                       "spent (to keep the decay over steps, leave out --time_budget)")
    if at and not cfg.time_budget and saved.get("time_budget") and cfg.lr_schedule != "constant":
        # the other way: a budget's run decayed on its clock (to min_lr once spent), and --lr_decay_iters=N puts the
        # rate back on its step curve, up again for a horizon past this step
        clock = Config(**{k: saved[k] for k in asdict(cfg) if k in saved})      # the schedule it ran on
        changes.append(f"the learning rate runs on steps from here, not on time_budget: {optim.lr_at(at[0], cfg):.2e} "
                       f"at step {at[0]:,} (the budget's decay had it at {optim.lr_at(at[0], clock, seconds=at[1]):.2e}"
                       f"), down to min_lr={cfg.min_lr:g} at lr_decay_iters={cfg.lr_decay_iters:,} (a smaller "
                       "--lr_decay_iters starts lower on the curve)")
    if not cfg.time_budget and cfg.lr_schedule != "constant" and cfg.max_iters < cfg.lr_decay_iters:
        changes.append(f"the run ends at max_iters={cfg.max_iters} before its decay does (lr_decay_iters="
                       f"{cfg.lr_decay_iters}): the learning rate of its last step is "
                       f"{optim.lr_at(cfg.max_iters - 1, cfg):.2e}, not min_lr={cfg.min_lr} (add "
                       f"--lr_decay_iters={cfg.max_iters} to decay by then)")
    if cfg.lr_schedule != "constant" and 0 < cfg.lr_decay_iters < cfg.max_iters:   # 0: still in warm-up, decays to
                                                                                    # its end; constant: no decay
        changes.append(f"the learning rate decays until lr_decay_iters={cfg.lr_decay_iters}, then stays at "
                       f"min_lr={cfg.min_lr} up to max_iters={cfg.max_iters} (set --lr_decay_iters to decay over "
                       "another horizon)")
    return changes


def resume_path(cfg, explicit):
    """(cfg, the checkpoint a resume reads): resume_from (a kept step, or a path) implies init_from='resume';
    the file is out_dir/ckpt.pt (the latest) without resume_from, else resume_from's (resolve_resume). Raises
    ValueError for resume_from with another init_from given explicitly (`explicit`: the keys set)."""
    if cfg.resume_from:
        if "init_from" in explicit and cfg.init_from != "resume":
            raise ValueError(f"resume_from={cfg.resume_from!r} resumes a run: it cannot go with "
                             f"init_from={cfg.init_from!r} (leave init_from out, or set it to resume)")
        cfg = replace(cfg, init_from="resume")
    if cfg.init_from != "resume":
        return cfg, os.path.join(cfg.out_dir, "ckpt.pt")
    return cfg, resolve_resume(cfg.out_dir, cfg.resume_from)




def rewind_notes(ckpt, path, out_dir):
    """Lines a resume prints when `ckpt` (loaded from `path`) is older than out_dir's newest checkpoint
    (resume_from an earlier step): the steps after it are abandoned. Marks ckpt["rewound"] with what
    start_branch does once the run is set up: ckpt.pt names `path`, ckpt_best.pt, when it holds an abandoned
    step, becomes the best kept checkpoint up to ckpt's step by metrics.jsonl's validation losses (or goes);
    the metrics logger moves the abandoned records aside and starts a new W&B run. [] for the newest."""
    def step(path):                            # None for a file that is not there or cannot be read
        try:
            return checkpoint_step(path) if os.path.isfile(path) else None
        except Exception:
            return None
    steps, r = saved_steps(out_dir), ckpt["step"]
    newest = max([*steps, step(os.path.join(out_dir, "ckpt.pt")) or -1], default=-1)
    if r >= newest:
        return []
    said, best_path, best = [f"ckpt.pt names step {r:,} from now on"], os.path.join(out_dir, "ckpt_best.pt"), "keep"
    if (step(best_path) or -1) > r:            # the best is an abandoned step's: the best kept up to r instead
        from speedgpt.measure import read_metrics
        logged = os.path.join(out_dir, "metrics.jsonl")
        val = {x["step"]: x["val_loss"] for x in (read_metrics(logged)[0] if os.path.isfile(logged) else [])
               if x.get("val_loss") is not None and x["step"] <= r}
        kept = sorted((val[s], s) for s in steps if s in val)
        best = (steps[kept[0][1]], kept[0][0]) if kept else None
        said.append(f"ckpt_best.pt step {kept[0][1]:,}'s (val loss {kept[0][0]:.4f}, the best kept up to step {r:,})"
                    if kept else f"ckpt_best.pt none (no kept checkpoint up to step {r:,} has a logged val loss)")
    ckpt["rewound"] = {"path": path, "best": best}
    later = ", ".join(str(s) for s in sorted(steps) if s > r) or "none"
    return [f"step {r:,} is older than the latest checkpoint (step {newest:,}): the steps after it are abandoned: "
            f"{', '.join(said)}; metrics.jsonl's later records move to metrics.abandoned.jsonl, W&B gets a new run "
            f"(it cannot rewind one), and the checkpoints of the later steps ({later}) are removed once this run "
            "has written its first"]


def restore_state(ckpt, model, optimizer, scaler, loader, proc, cfg):
    """Set what a resume continues from the checkpoint `ckpt`: the optimizer's state (unsharded under
    FSDP), the GradScaler's (float16), the loader's position and each rank's random streams (the weights
    and the modules' own state: load_weights). The optimizer's settings (weight decay, betas, momentum) stay this
    run's config's: a saved state dict brings its groups' old ones back, which would train on with the values the
    printed changes said were replaced. Returns lines describing what could not continue as it was (a fresh
    GradScaler; no amax history; fresh dropout streams)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    from speedgpt.distributed import restore_rng_states
    settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    set_optimizer_state_dict(model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True))
    for group, kept in zip(optimizer.param_groups, settings):
        group.update(kept)
    notes = []
    if ckpt["scaler"] and scaler.is_enabled():
        scaler.load_state_dict(ckpt["scaler"])
    elif scaler.is_enabled():          # the checkpoint was not float16: its loss scale starts afresh
        notes.append("a fresh GradScaler for float16 (the checkpoint was trained without one)")
    loader.load_state_dict(ckpt["loader"])
    if not restore_rng_states(ckpt["rng"], proc, cfg.seed, ckpt["step"]) and cfg.dropout > 0:
        notes.append(f"{proc.world} processes where the checkpoint had {len(ckpt['rng'].get('ranks') or [0])}: the "
                     "dropout streams of the ranks it did not have start afresh (the data order is unchanged)")
    return notes
