"""
speedgpt's single-file trainer. The defaults are the CPU quickstart: a small byte-level GPT on this
Python's standard library sources (prepared on first use).

    python train.py                                          # CPU quickstart
    python train.py --help                                   # every flag, its type, default and meaning
    python train.py --config config/fast.py                  # GPT-2 124M, every speed flag on, one GPU
    torchrun --standalone --nproc_per_node=8 train.py --config config/fast.py

main() tells a run as a row of named stages: the config and its checks (each feature checks its own
flags: speedgpt/<feature>.py), processes and device, checkpoint, data, the model and its transforms
(FP8, activation checkpointing, compile, DDP/FSDP, in that order), optimizer, logging; then train()
runs the loop. Each flag is resolved once, in its stage, so the loop reads the same with every flag off.
Non-finite steps are never applied; SIGINT/SIGTERM save and exit non-zero; a resume continues exactly.
"""
import math
import os
import signal
import sys
import uuid
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.distributed as dist

import data
from configurator import MODEL_KEYS, help_text, load_config, non_defaults
from data import DataError, Loader, load_meta, prepare, sigterm_as_interrupt, token_bytes
from model import GPT, GPTConfig
from speedgpt import (Refusals, attention, budget, checkpoint, distributed, evaluation, hellaswag, measure, memory,
                      nanogpt, optim, resume)
from speedgpt.features import activation_checkpointing, compilation, fp8, fused_ce, gelu_pass, parallel
from speedgpt.evaluation import describe_target, estimate_loss, eval_rows, target_reached
from speedgpt.checkpoint import (DIVERGED, BackgroundWrite, Branch, check_disk, checkpoint_bytes, finish_write,
                                 last_good, linked_step, load_weights, lock_out_dir, save_run, start_branch,
                                 unlock_out_dir)
from speedgpt.distributed import (Proc, RunStopped, StopSignals, agree, exit_status, failed_after_signal, leave,
                                  on_rank0, plan_batch, print0, seed_rank_stream, setup_processes)
from speedgpt.mask_check import check_attention_mask
from speedgpt.measure import (MetricsLogger, Timer, ideal_seconds_per_token, peak_flops_for, remove_profile,
                              start_profile, write_json, write_profile)

# The features, in the order they transform the model (torchtitan's: FP8 conversion, the fused head's loss,
# activation checkpointing, compile), then DDP/FSDP wraps it (parallel). Each answers check(cfg, proc) -> cfg and
# apply(model, cfg, proc), and the optional calls (prepare, step_hooks, grad_hooks, memory)
# speedgpt/features/__init__.py lists. A feature added is a module there and an entry here; a feature removed, the
# reverse (and its keys in configurator.py).
FEATURES = (fp8, gelu_pass, fused_ce, activation_checkpointing, compilation)
TRANSFORMS = (*FEATURES, parallel)     # every transform, in order: the memory estimate asks each what it changes
# every check before any work, in this order: the attention backend first (it resolves 'auto'), HellaSwag last
# (hellaswag='on' may download its file)
CHECKS = (attention, distributed, *TRANSFORMS, evaluation, measure, optim, budget, memory, data, checkpoint,
          hellaswag)
_setup_done = False        # errors after setup are bugs, not bad input: they keep their traceback
PT_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# -----------------------------------------------------------------------------
# the stages of a run, in the order main() calls them

def check_flags(cfg, proc, skip=()):
    """Every module's check of its flags for this device and launch (CHECKS, each check(cfg, proc) -> cfg; memory's
    is given FEATURES besides), before any work: ValueError naming the keys and the way out. Returns `cfg` with what
    the flags resolve to (attention='auto' -> a backend, printed; document_mask False without packing), so every
    later stage reads one answer. A run off a CUDA GPU hears all its refusals in one line (a GPU preset on a CPU,
    memory.cpu_way_out, with the way to the quickstart's size), not one per try. skip: modules of CHECKS whose check
    the caller makes later (benchmarks/time_to_target.py checks its runs before it prepares their data)."""
    cpu_way = memory.cpu_way_out(cfg, proc.device)                            # a GPU preset on a CPU: its way out
    gpu_sized = bool(cpu_way)
    refuse = Refusals(gather=gpu_sized or proc.device.type != "cuda")        # GPU flags off a GPU: all at once
    asked = cfg.attention
    cfg = refuse(attention.check, cfg, proc) or cfg
    if asked == "auto" and not refuse.found:
        print0(f"attention: auto -> {cfg.attention}")
    if cfg.attention == "varlen" and not refuse.found:
        print0(f"attention: varlen through {attention.varlen_kernel(proc.device)}")
    for module in CHECKS[1:]:
        if module in skip or (module is checkpoint and refuse.found):   # it makes out_dir: not for a refused run
            continue
        if module is hellaswag:                    # it may download its file: what is refused comes first
            slow = memory.cpu_slow_work(cfg, proc.device, proc.world, bool(refuse.found))   # its steps: on their own
            if slow:
                refuse.found.append(ValueError(slow))
            if gpu_sized:
                refuse.raise_all(f"a GPU-sized run (steps of {cfg.total_batch_size:,} tokens) on the CPU",
                                 "train on a CPU at the quickstart's size (python train.py)", said=cpu_way)
            refuse.raise_all(f"this run on {attention.DEVICE_NAMES.get(proc.device.type, proc.device.type)}")
            refuse.gather = False                  # its own refusal, and any after it, as they come
        features = (TRANSFORMS,) if module is memory else ()   # the estimate counts what each transform keeps
        cfg = refuse(module.check, cfg, proc, *features) or cfg
    return cfg


def build_data(cfg, proc, grad_accum_steps, ckpt):
    """Tokenizer metadata, the train / val loaders and, for bits per byte, the UTF-8 bytes of each token id
    (val and bytes only with eval_tokens > 0). The stdlib corpora are prepared on first use. Each rank
    keeps its own rows of one shared stream."""
    name = os.path.basename(cfg.data_dir.rstrip("/"))
    unfinished = not os.path.isfile(os.path.join(cfg.data_dir, "meta.json"))
    if proc.master and unfinished and name in ("stdlib_byte", "stdlib_gpt2"):
        print0(f"{cfg.data_dir} is missing or unfinished (no meta.json): preparing the Python stdlib corpus there")
        with sigterm_as_interrupt():          # SIGTERM cleans up as Ctrl-C does: workers and temp folder gone
            prepare(None, cfg.data_dir, tokenizer=name.split("_")[1])
    if proc.world > 1:
        dist.barrier()
    meta = load_meta(cfg.data_dir)
    if ckpt is not None and unfinished:       # prepared just now: settle found no tokens to hold the checkpoint's to
        resume.refuse_other_data(checkpoint.resolve_resume(cfg.out_dir, cfg.resume_from), ckpt, cfg.data_dir)
    args = dict(batch_size=cfg.batch_size, block_size=cfg.block_size, device=proc.device, packing=cfg.packing,
                document_mask=cfg.document_mask, eot=meta["eot_id"], rank=proc.rank, world_size=proc.world,
                vocab_size=meta["vocab_size"], max_docs=data.VARLEN_MAX_SEQS if cfg.attention == "varlen" else None)
    train_loader = Loader(cfg.data_dir, "train", seed=cfg.seed, prefetch=grad_accum_steps, **args)
    val_loader = Loader(cfg.data_dir, "val", seed=cfg.seed + 1, **args) if cfg.eval_tokens > 0 else None
    counts = None if val_loader is None else token_bytes(cfg.data_dir, meta)    # None: ids whose text is unknown
    counts = None if counts is None else torch.as_tensor(counts, device=proc.device)
    if val_loader is not None and eval_rows(cfg, val_loader) * cfg.block_size < cfg.eval_tokens:
        print0(evaluation.small_split_note(cfg, val_loader))
    return meta, train_loader, val_loader, counts


def build_model(cfg, meta, proc, ckpt, train_loader):
    """The GPT (or GPT-2's weights through Hugging Face for init_from=gpt2* or a folder, whose shape then replaces
    the config's), then each feature's transform in FEATURES' order, then the checkpoint's weights and each module's
    own state when resuming, the features' preparation before the first step (FP8's first amax history, from the
    loader's first batch), and DDP/FSDP's wrapper. Returns (cfg, raw_model, model, grad_sync): the raw module owns
    the weights; grad_sync(bool) turns gradient sync on or off (None in a single process)."""
    torch.manual_seed(cfg.seed)        # same initial weights on every rank
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.tf32
    if proc.device.type == "cuda":
        attention.select_sdpa_backend(cfg.sdpa_backend)
    model_cfg = GPTConfig.from_dict(asdict(cfg), meta["vocab_size"])
    if cfg.init_from in ("scratch", "resume"):
        raw_model = GPT(model_cfg).to(proc.device)
    elif nanogpt.is_checkpoint(cfg.init_from):    # a checkpoint file (nanoGPT's, or ours): its shape is cfg's already
        raw_model = nanogpt.load_model(cfg.init_from, model_cfg).to(proc.device)
    else:
        from hf import load_hf_gpt2
        raw_model = load_hf_gpt2(cfg.init_from, model_cfg).to(proc.device)
        cfg = replace(cfg, **{k: getattr(raw_model.config, k) for k in MODEL_KEYS})     # saved in checkpoints
    for feature in FEATURES:
        said = feature.apply(raw_model, cfg, proc)
        if said:
            print0(said)
    if ckpt is not None:                   # after the transforms: FP8's layers load their amax histories too
        load_weights(raw_model, ckpt, os.path.join(cfg.out_dir, "ckpt.pt"))
    seed_rank_stream(cfg.seed, proc.rank)  # the same weights, but each rank's own dropout
    for feature in [f for f in FEATURES if hasattr(f, "prepare")]:
        said = feature.prepare(raw_model, train_loader.peek(), cfg)
        if said:
            print0(said)
    model, grad_sync = parallel.wrap(raw_model, cfg, proc)
    return cfg, raw_model, model, grad_sync


def build_optimizer(cfg, raw_model, proc, ckpt, train_loader):
    """The optimizer (speedgpt/optim.py: its groups, learning rates and schedule), the autocast context, the
    GradScaler (float16 only) and, when resuming, the saved state of all of them, of the loader and of the
    RNGs. Returns (optimizer, ctx, scaler, start_step, best_val)."""
    optimizer = optim.build(raw_model, cfg, proc.device)
    print0(optim.describe(optimizer, cfg))
    ctx = autocast(cfg, proc.device)
    scaler = torch.amp.GradScaler(proc.device.type, enabled=cfg.dtype == "float16")
    if ckpt is None:
        return optimizer, ctx, scaler, 0, None
    for line in resume.restore_state(ckpt, raw_model, optimizer, scaler, train_loader, proc, cfg):
        print0(f"resume: {line}")
    return optimizer, ctx, scaler, ckpt["step"], ckpt["best_val_loss"]


def autocast(cfg, device):
    """The autocast context of cfg.dtype on `device`: nullcontext for float32."""
    return nullcontext() if cfg.dtype == "float32" else torch.autocast(device.type, dtype=PT_DTYPE[cfg.dtype])


def settle_out_dir(cfg, raw_model):
    """Rank 0's part of start_logging: out_dir locked, config.json written, the disk checked for checkpoints."""
    lock_out_dir(cfg.out_dir)           # a new folder: locked now (an existing one was before the checks)
    if cfg.profile:
        remove_profile(cfg.out_dir)         # never leave an old profile looking current
    write_json(os.path.join(cfg.out_dir, "config.json"), asdict(cfg))
    if cfg.save_checkpoints:            # refused here, before any step, when the disk cannot hold them
        writes = cfg.max_iters // cfg.eval_interval + 2     # the most it writes: its evaluations', the last, a signal's
        print0(check_disk(cfg.out_dir, checkpoint_bytes(raw_model.num_params(non_embedding=False)),
                          cfg.keep_checkpoints, writes))


def start_logging(cfg, proc, raw_model, grad_accum_steps, ckpt):
    """Print the config's non-default keys and save it whole (out_dir/config.json); returns the metrics
    logger (console, metrics.jsonl, W&B; tokens/s and MFU), which a resumed run continues."""
    os.makedirs(os.path.realpath(cfg.out_dir), exist_ok=True)     # a link to a folder not made yet: made there
    on_rank0(proc, settle_out_dir, cfg, raw_model)
    changed = ", ".join(f"{k}={v}" for k, v in non_defaults(cfg).items())
    print0(f"config: {changed or 'the defaults'} (set or derived; the rest default; all in {cfg.out_dir}/config.json)")
    flops_per_token, peak = raw_model.flops_per_token(), peak_flops_for(proc.device, cfg)
    fp8_flops = sum(f.fp8_flops_per_token(raw_model, cfg) for f in FEATURES if hasattr(f, "fp8_flops_per_token"))
    ideal_s = ideal_seconds_per_token(flops_per_token, fp8_flops, peak, peak_flops_for(proc.device, cfg, "fp8"))
    tokens = cfg.batch_size * cfg.block_size * grad_accum_steps * proc.world
    print0(f"{raw_model.num_params() / 1e6:.2f}M parameters | {flops_per_token / 1e6:.1f} MFLOP/token | "
           f"device {proc.device} x {proc.world} | grad_accum_steps {grad_accum_steps} per process | "
           f"{tokens:,} tokens per step | peak " + (f"{peak / 1e12:.1f} TFLOP/s" if peak else "n/a (no MFU)"))
    return MetricsLogger(cfg, proc.master, ckpt and ckpt["step"], ckpt and ckpt.get("wandb_run_id"), flops_per_token,
                         peak, proc.world, proc.device, lambda: last_good(os.path.join(cfg.out_dir, "ckpt.pt"),
                                                                          "once the disk has room"),
                         rewound=bool(ckpt and ckpt.get("rewound")), ideal_s=ideal_s)

# -----------------------------------------------------------------------------
# what a step is made of

def forward_backward(model, batches, n_global, ctx, scaler, grad_sync=None):
    """Accumulate the gradient of one optimizer step over micro-`batches` (a list of data.Batch).
    Each micro-batch's mean loss is weighted by its real tokens over n_global (the step's real
    tokens, divided by the world size under data parallelism, which averages), so 4 micro-batches
    of 2 rows give the gradient of 1 batch of 8 even when padding differs between them.
    grad_sync(bool) turns DDP/FSDP gradient sync on for the last micro-step only.
    Returns the step's mean loss per real token (a detached 0-dim tensor: no host sync)."""
    loss_sum = 0.0
    for i, b in enumerate(batches):
        if grad_sync is not None:
            grad_sync(i == len(batches) - 1)
        with ctx:
            _, loss = model(b.x, b.y, b.doc_ids, b.cu_seqlens, b.position_ids)    # without the mask: None, None, None
            loss = loss * (b.n_valid / n_global)
        scaler.scale(loss).backward()
        loss_sum = loss_sum + loss.detach()
    return loss_sum

# -----------------------------------------------------------------------------
# the run and its loop

@dataclass
class Run:
    """What the stages built and the loop keeps: all that a step, an evaluation or a checkpoint needs."""
    cfg: object
    proc: Proc
    meta: dict
    raw_model: torch.nn.Module          # owns the weights; checkpoints hold its state dict
    model: torch.nn.Module              # raw_model as trained: compiled in place, wrapped by DDP or FSDP
    grad_sync: object                   # grad_sync(bool): gradient sync on or off (DDP/FSDP), or None
    optimizer: torch.optim.Optimizer
    ctx: object                         # autocast context, or nullcontext for float32
    scaler: torch.amp.GradScaler
    train_loader: Loader
    val_loader: Loader
    logger: MetricsLogger
    grad_accum_steps: int
    start_step: int
    best_val: float = None
    val_loss: float = None
    step: int = 0                       # optimizer steps done so far
    token_bytes: torch.Tensor = None    # (vocab_size,) UTF-8 bytes of each token id: val bits per byte (None: no text)
    hellaswag: object = None            # speedgpt.hellaswag.HellaSwag, scored at each evaluation; None when off
    after_step: list = field(default_factory=list)  # hook(applied: bool) after each step, applied or skipped
    before_update: list = field(default_factory=list)   # hook() on the final gradients, before each applied update
    val_bpb: float = None
    hellaswag_acc_norm: float = None
    evaluated: int = None               # the step of the last evaluation
    tokens: float = 0                   # real tokens trained so far (the job's under torchrun; a resume continues them)
    train_seconds: float = 0.0          # seconds of training so far, the same on every rank (speedgpt/budget.py)
    clock: budget.Clock = None          # the clock of train_seconds, started by train()
    target: dict = None                 # where target_val_loss was reached (evaluation.target_reached)
    writer: BackgroundWrite = field(default_factory=BackgroundWrite)    # async_checkpoint's write in flight
    branch: Branch = None               # out_dir's history this run continues: files it replaces, ckpt_best's loss
    saved: bool = False                 # this process wrote a checkpoint (an earlier run's may be in out_dir)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)   # in each checkpoint; a resume keeps it

    @property
    def ckpt_path(self):
        return os.path.join(self.cfg.out_dir, "ckpt.pt")

    def last_good(self, then=DIVERGED):
        """What a stopped run says of ckpt.pt (checkpoint.last_good), once a background write has ended: only
        this run's (written, or resumed from), not an earlier run's that init_from=scratch left in out_dir."""
        self.writer.wait()
        if not (self.saved or self.cfg.init_from == "resume") and os.path.exists(self.ckpt_path):
            return f"no checkpoint of this run was written ({self.ckpt_path} is an earlier run's)"
        return last_good(self.ckpt_path, then)

    def summary(self):
        """The run's summary (MetricsLogger.summary), with the last bits per byte and HellaSwag acc_norm."""
        return {**self.logger.summary(self.step, self.val_loss, self.best_val), "val_bpb": self.val_bpb,
                "hellaswag_acc_norm": self.hellaswag_acc_norm, "target_val_loss": self.cfg.target_val_loss or None,
                "target_reached": self.target, "train_seconds": round(self.train_seconds, 3),
                "compile_s": self.clock and self.clock.compile_s(), "time_budget": self.cfg.time_budget or None,
                # ckpt.pt, when neither saved nor resumed from, is an earlier run's; its step, as it may be behind
                **({"checkpoint_step": linked_step(self.ckpt_path)} if self.saved or self.cfg.init_from == "resume"
                   else {"checkpoint": None})}

    def evaluate(self, step, train_seconds):
        """Validation loss and bits per byte at `step` (and HellaSwag when on), logged with the training
        seconds and real tokens so far (time to a target: benchmarks/time_to_target.py); RunStopped when the
        loss is not finite (nothing is saved then)."""
        self.val_loss, self.val_bpb = estimate_loss(self.model, self.val_loader, eval_rows(self.cfg, self.val_loader),
                                                    self.ctx, self.token_bytes)
        if not math.isfinite(self.val_loss):
            raise RunStopped(f"error: step {step}: the validation loss is {self.val_loss}: the run diverged; "
                             f"{self.last_good()}", 1)
        self.best_val = self.val_loss if self.best_val is None else min(self.best_val, self.val_loss)
        self.evaluated = step
        bpb = "" if self.val_bpb is None else f" ({self.val_bpb:.4f} bits/byte)"     # None: no text to count
        print0(f"step {step}: val loss {self.val_loss:.4f}{bpb}")
        record = {"step": step, "val_loss": self.val_loss, "val_bpb": self.val_bpb,
                  "train_seconds": round(train_seconds, 3), "tokens": int(self.tokens)}
        if self.hellaswag is not None:
            record.update(self.hellaswag.evaluate(self.model, self.ctx))
            self.hellaswag_acc_norm = record["hellaswag_acc_norm"]
            print0(f"step {step}: {hellaswag.describe(record)}")
        self.logger.log(record)

    def save(self, step, background=False, stopped=False):
        """Write the checkpoint of `step` (speedgpt/checkpoint.py's save_run: every rank calls it); `stopped`: after a
        signal, between steps (no evaluation)."""
        save_run(self, step, background, stopped)
        self.saved = True


def train(run, stop):
    """The loop: optimizer steps start_step .. max_iters - 1, or until time_budget's minutes of training;
    validation and a checkpoint every eval_interval steps and at the end. Returns the summary; raises
    RunStopped on divergence (max_skipped_steps exceeded) or after a signal."""
    cfg, proc, device = run.cfg, run.proc, run.proc.device
    timer, skipped = Timer(device, cfg.timing_warmup), 0
    clock = run.clock = budget.Clock(run.train_seconds, proc if cfg.time_budget else None)   # agreed under a budget
    tokens_per_step = cfg.batch_size * cfg.block_size * run.grad_accum_steps     # per process, padding included
    for step in range(run.start_step, cfg.max_iters + 1):
        last_step = step == cfg.max_iters or budget.spent(cfg, run.train_seconds)
        if step % cfg.eval_interval == 0 or last_step:
            timer.pause()                       # evaluation and checkpoints are not training time
            train_seconds = clock.pause()
            if last_step and cfg.time_budget:
                print0(f"step {step}: {budget.describe_end(cfg, run.train_seconds, step)}")
            if cfg.eval_tokens > 0:
                run.evaluate(step, train_seconds)
            run.target = target_reached(cfg, run.val_loss, step, train_seconds, run.tokens)   # saved with it
            if cfg.save_checkpoints and (step > run.start_step or last_step):
                run.save(step, background=cfg.async_checkpoint and not last_step)   # the last one before the end
            clock.resume()
            timer.resume()
            if run.target:
                print0(f"step {step}: {describe_target(run.target)}")
                break
        if last_step:
            break
        timer.step_begins()
        profiled = cfg.profile and step - run.start_step == cfg.timing_warmup - 1   # the last warm-up step
        prof = start_profile(device) if profiled else None
        rates = optim.set_lr(run.optimizer, step, cfg, run.train_seconds)
        batches = [next(run.train_loader) for _ in range(run.grad_accum_steps)]
        n_valid = sum(b.n_valid for b in batches)
        # every micro-batch's loss is weighted by its share of the real tokens of the whole step, so
        # accumulation (and data parallelism) gives the gradient of one big batch
        n_global, step_tokens = n_valid, n_valid
        if proc.world > 1:                      # a tensor: no host sync
            step_tokens = torch.tensor(float(n_valid), device=device)
            dist.all_reduce(step_tokens)
            n_global = step_tokens / proc.world # DDP and FSDP average gradients over ranks
        loss = forward_backward(run.model, batches, n_global, run.ctx, run.scaler, run.grad_sync)
        if cfg.check_mask:                      # debug flag: off, this costs nothing
            for b in batches:
                mask = run.raw_model.attention_mask(b.doc_ids, cfg.block_size, device, b.cu_seqlens)
                check_attention_mask(mask, b.doc_ids)
        grad_norm = optim.clip_grad_norm(run.raw_model, run.optimizer, run.scaler, cfg.grad_clip)
        loss, nonfinite, signum = agree(loss, grad_norm, stop.signum, proc, cfg.dtype == "float16")
        run.train_seconds = clock.step_done()   # agree() synced: the step's wall time is done
        if step == run.start_step:              # the first step's wall time, compile included
            run.logger.first_step_s = clock.first
        if nonfinite:                           # never applied to the weights
            skipped += 1
            if skipped <= cfg.max_skipped_steps:        # else the run stops below, in one line
                print0(f"step {step}: loss {loss:.4g}, gradient norm {float(grad_norm):.4g}: not finite, update "
                       f"skipped ({skipped} of at most {cfg.max_skipped_steps})")
            run.scaler.update()
        else:
            for hook in run.before_update:      # gradients summed, averaged over ranks, unscaled, clipped, finite
                hook()
            run.scaler.step(run.optimizer)
            run.scaler.update()
        for hook in run.after_step:             # fp8's amax history: a new entry, or none for a skipped step
            hook(not nonfinite)
        run.optimizer.zero_grad(set_to_none=True)
        run.step = step + 1
        if prof is not None:
            write_profile(prof, device, cfg.out_dir)
        timer.step_ends(step_tokens)
        run.tokens += step_tokens
        if cfg.time_budget and run.step - run.start_step == max(2, cfg.timing_warmup):   # this start's rate known
            budget.warn_at_rate(cfg, run.step, run.step - run.start_step, run.train_seconds, clock.before)
        if step % cfg.log_interval == 0 or step == cfg.max_iters - 1 or signum or nonfinite:
            run.logger.step(step, loss, rates, grad_norm, 1 - n_valid / tokens_per_step, timer.read(),
                            run.train_seconds)
        if skipped > cfg.max_skipped_steps:
            raise RunStopped(f"error: step {step}: the loss or gradient norm is not finite: the run diverged; "
                             f"{run.last_good()}", 1)
        if signum:
            name = signal.Signals(signum).name
            done = f"{name}: stopped after step {step} ({step + 1:,} steps done)"
            if not cfg.save_checkpoints:
                raise RunStopped(f"{done}; no checkpoint (save_checkpoints=False)", 128 + signum)
            run.save(step + 1, stopped=True)
            raise RunStopped(f"{done} with a checkpoint in {run.ckpt_path}; continue with the same command and "
                             "--init_from=resume", 128 + signum)
    finish_write(run)                           # target_val_loss's stop may leave one in flight
    return run.summary()

# -----------------------------------------------------------------------------

def main(argv=None):
    """Train per the command line `argv` (default sys.argv[1:]); returns the summary dict (None for
    --help). Bad input raises ValueError / TypeError / FileNotFoundError before any work; divergence and
    SIGINT/SIGTERM raise RunStopped after saving what can be saved."""
    try:
        return run_command(argv)
    finally:              # out_dir's lock goes however the run ends: a caller that goes on (a notebook) may train there
        unlock_out_dir()


def run_command(argv):
    """main's body: out_dir locked (lock_out_dir) from before the checks to the end."""
    global _setup_done
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:      # with --config: its values, so a preset is read (and checked) too
        rest = [a for a in argv if a not in ("--help", "-h")]
        print(help_text(load_config(rest) if rest else None))
        return None
    with warnings.catch_warnings(record=True) as caught:     # printed once, on rank 0
        warnings.simplefilter("always")
        cfg, explicit = load_config(argv, with_explicit=True)
        proc = setup_processes(cfg)
        on_rank0(proc, lock_out_dir, cfg.out_dir)    # one run at a time in out_dir, before a file there is read or gone
        cfg, ckpt = resume.settle(cfg, explicit, proc, check_flags)   # refuse what cannot work, before any work
        grad_accum_steps = plan_batch(cfg, proc.world)
    for w in {str(w.message): w for w in caught}.values():       # each once; nanoGPT's keys as read: notes
        print0(f"{'note' if issubclass(w.category, nanogpt.Note) else 'warning'}: {w.message}")
    if ckpt is not None and ckpt["finished"]:        # nothing to do, nothing written
        print0(f"this run is finished: {resume.resume_path(cfg, explicit)[1]} {ckpt['finished']}")
        leave(proc, True)
        return {"finished": True, "step": ckpt["step"], "best_val_loss": ckpt["best_val_loss"]}
    said = memory.report(cfg, proc, TRANSFORMS)        # after every check: a refused run prints only its refusal
    if said:
        print0(said)
    meta, train_loader, val_loader, token_bytes = build_data(cfg, proc, grad_accum_steps, ckpt)
    hellaswag_eval = hellaswag.build(cfg, meta, cfg.block_size, proc)     # None when off
    cfg, raw_model, model, grad_sync = build_model(cfg, meta, proc, ckpt, train_loader)
    optimizer, ctx, scaler, start_step, best_val = build_optimizer(cfg, raw_model, proc, ckpt, train_loader)
    logger = start_logging(cfg, proc, raw_model, grad_accum_steps, ckpt)
    run = Run(cfg, proc, meta, raw_model, model, grad_sync, optimizer, ctx, scaler, train_loader, val_loader,
              logger, grad_accum_steps, start_step, best_val, step=start_step, token_bytes=token_bytes,
              hellaswag=hellaswag_eval, after_step=[h for f in FEATURES if hasattr(f, "step_hooks")
                                                     for h in f.step_hooks(raw_model, cfg)],
              before_update=[h for f in FEATURES if hasattr(f, "grad_hooks") for h in f.grad_hooks(raw_model, cfg)],
              branch=start_branch(cfg.out_dir, ckpt, proc.master),
              **{k: ckpt[k] for k in ("train_seconds", "tokens", "run_id") if ckpt and k in ckpt})   # a resume keeps
    del ckpt                           # its memory is not needed for training
    _setup_done, stop, summary, exit_code, clean = True, StopSignals(proc.world > 1), None, 1, False
    try:
        summary, exit_code, clean = train(run, stop), 0, True
        return summary
    except RunStopped as e:            # every rank stops at the same step
        summary = {**run.summary(), "stopped": str(e)}
        exit_code, clean = e.exit_code, True
        raise
    except KeyboardInterrupt:          # a second Ctrl-C (StopSignals): abort now, without saving
        stopped = RunStopped(f"SIGINT: aborted at once (a second Ctrl-C) with {run.step:,} steps done, without saving; "
                             f"{run.last_good('with the same command')}", 128 + signal.SIGINT)
        summary, exit_code = {**run.summary(), "stopped": str(stopped)}, stopped.exit_code
        raise stopped from None
    except Exception as e:             # after a signal: likely torch.compile's compilers, signalled with the trainer
        if not stop.signum:
            raise
        stopped = failed_after_signal(e, stop.signum, run.last_good("with the same command"))
        summary, exit_code = {**run.summary(), "stopped": str(stopped)}, stopped.exit_code
        raise stopped from e
    finally:
        stop.restore()
        run.writer.wait()                          # never leave with a checkpoint half written
        try:
            logger.close(summary, exit_code)       # writes summary.json and prints the run's last line
        finally:
            leave(proc, clean)


if __name__ == "__main__":        # every way a run ends early, in one line and an exit status
    sys.exit(exit_status(main, lambda: _setup_done, DataError, memory.out_of_memory_line))
