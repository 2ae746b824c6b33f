"""
speedgpt's single-file trainer. The defaults are the CPU quickstart: a small byte-level GPT on this
Python's standard library sources (prepared on first use).

    python train.py                                          # CPU quickstart
    python train.py --config config/fast.py                  # GPT-2 124M, every speed flag on, one GPU
    python train.py --config config/fast.py --batch_size=16 --compile=False
    torchrun --standalone --nproc_per_node=8 train.py --config config/fast.py

Flags, types and defaults: configurator.py (Config). Every flag is resolved once at setup into an
object (autocast context, GradScaler, compiled or plain model, attention backend), so the training
loop reads the same with every flag off.
"""
import json
import math
import os
import statistics
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict

import torch
import torch.distributed as dist

from configurator import MODEL_KEYS, load_config
from data import Loader, load_meta, prepare
from model import GPT, GPTConfig, check_attention_mask
from measure import mfu, peak_flops_for, sync, write_profile
from transforms import apply_activation_checkpointing, apply_compile, apply_fp8, apply_parallelism, check_fp8

# -----------------------------------------------------------------------------
# helpers

_rank = int(os.environ.get("RANK", 0))
_setup_done = False        # errors after setup are bugs, not bad input: they keep their traceback

def print0(*args, **kwargs):
    if _rank == 0:
        print(*args, **kwargs, flush=True)


def get_lr(step, cfg):
    """Linear warmup for warmup_iters, then cosine decay to min_lr at lr_decay_iters (nanoGPT)."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    if step >= decay_iters:
        return cfg.min_lr
    ratio = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def make_optimizer(model, cfg, device):
    """AdamW with weight decay on matrices (dim >= 2) only; fused kernel when cfg.fused_adamw,
    else PyTorch's default implementation."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    extra = {"fused": True} if cfg.fused_adamw else {}
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), **extra)


def model_state(model, optimizer=None):
    """Full (unsharded) state dicts of the raw module, without _orig_mod. / module. prefixes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=opts)
    return sd if optimizer is None else (sd, get_optimizer_state_dict(model, optimizer, options=opts))


CKPT_KEYS = ("model", "optimizer", "scaler", "step", "best_val_loss", "config", "meta", "loader", "rng")


def load_checkpoint(path):
    """The dict save_checkpoint wrote at `path` (on the CPU). Raises FileNotFoundError if there is none,
    ValueError if it cannot be read or is not a speedgpt checkpoint (a nanoGPT one, say)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"checkpoint {path} cannot be read ({type(e).__name__}); is it corrupt?") from e
    missing = [k for k in CKPT_KEYS if k not in ckpt] if isinstance(ckpt, dict) else list(CKPT_KEYS)
    if missing:
        raise ValueError(f"{path} is not a speedgpt checkpoint: it lacks {', '.join(missing)}")
    return ckpt


def load_weights(model, ckpt, path):
    """Load the checkpoint's weights into `model`; ValueError (naming `path`) if they do not fit it."""
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ValueError(f"checkpoint {path} does not fit the model: {str(e).splitlines()[0]}") from e


def save_checkpoint(path, ckpt):
    """Write atomically: a temp file, then rename, so a crash never leaves half a checkpoint."""
    torch.save(ckpt, path + ".tmp")
    os.replace(path + ".tmp", path)


@torch.no_grad()
def estimate_loss(model, loader, eval_iters, ctx, use_doc_ids):
    """Mean loss per real token over the same eval_iters batches every time (all ranks together)."""
    model.eval()
    loader.reset()
    totals = torch.zeros(2, dtype=torch.float64, device=loader.device)      # (loss sum, real tokens)
    for _ in range(eval_iters):
        b = next(loader)
        with ctx:
            _, loss = model(b.x, b.y, b.doc_ids if use_doc_ids else None)
        totals += torch.stack([loss.double() * b.n_valid, torch.tensor(float(b.n_valid), device=loader.device)])
    if dist.is_initialized():
        dist.all_reduce(totals)
    model.train()
    return (totals[0] / totals[1].clamp(min=1)).item()


def select_sdpa_backend(name):
    """Let F.scaled_dot_product_attention run only the `name` ('flash' | 'cudnn') kernel, process-wide,
    so a shape it cannot take fails ('No available kernel') instead of falling back to a slower one;
    'auto' turns every kernel back on (PyTorch's default: it picks per call)."""
    b = torch.backends.cuda
    b.enable_flash_sdp(name in ("auto", "flash"))
    b.enable_cudnn_sdp(name in ("auto", "cudnn"))
    b.enable_mem_efficient_sdp(name == "auto")
    b.enable_math_sdp(name == "auto")


def forward_backward(model, batches, n_global, ctx, scaler, use_doc_ids, grad_sync=None):
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
            _, loss = model(b.x, b.y, b.doc_ids if use_doc_ids else None)
            loss = loss * (b.n_valid / n_global)
        scaler.scale(loss).backward()
        loss_sum = loss_sum + loss.detach()
    return loss_sum

# -----------------------------------------------------------------------------

def main(argv=None):
    """Train per the command line `argv` (default sys.argv[1:]). Returns a summary dict."""
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    # distributed setup: torchrun sets RANK / LOCAL_RANK / WORLD_SIZE
    global _rank, _setup_done
    ddp = int(os.environ.get("RANK", -1)) != -1
    _rank, world, local_rank = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])) if ddp else (0, 1, 0)
    if cfg.device == "auto":
        device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={cfg.device!r} but no CUDA GPU is available")
    if ddp:
        if device.type == "cuda":
            device = torch.device(f"cuda:{local_rank}")
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None)
    master = _rank == 0
    if cfg.grad_accum_steps % world:
        raise ValueError(f"grad_accum_steps={cfg.grad_accum_steps} is not divisible by the {world} processes")
    grad_accum_steps = cfg.grad_accum_steps // world
    tokens_per_step = cfg.batch_size * cfg.block_size * grad_accum_steps * world
    # refuse what cannot work before any work is done
    if cfg.attention == "flex" and device.type != "cuda":
        raise ValueError("attention='flex' needs a CUDA GPU: FlexAttention has no backward pass on the CPU. "
                         "Use attention='sdpa' (a boolean document mask) or 'naive' on the CPU")
    if cfg.parallelism == "fsdp" and not ddp:
        raise ValueError("parallelism='fsdp' needs torchrun (several processes)")
    if cfg.parallelism == "fsdp" and cfg.dtype == "float16":
        raise ValueError("parallelism='fsdp' with dtype='float16' is not supported (it needs a sharded GradScaler); use bfloat16")
    if cfg.dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"dtype='bfloat16' is not supported on {torch.cuda.get_device_name(device)}; use float16")
    if cfg.sdpa_backend != "auto" and device.type != "cuda":
        raise ValueError(f"sdpa_backend={cfg.sdpa_backend!r} picks a GPU kernel: use sdpa_backend='auto' on the CPU")
    if device.type == "cuda":
        select_sdpa_backend(cfg.sdpa_backend)
    if cfg.fp8:
        check_fp8(device)
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ValueError(f"out_dir={cfg.out_dir!r} is a file, not a folder")
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    if cfg.init_from == "resume" and not os.path.isfile(ckpt_path):
        raise FileNotFoundError(f"init_from='resume' but {ckpt_path} does not exist")
    if cfg.packing and not cfg.document_mask:
        warnings.warn("packing=True with document_mask=False: tokens attend across document boundaries")

    # data: the two stdlib corpora are prepared on first use
    if master and not os.path.isdir(cfg.data_dir) and os.path.basename(cfg.data_dir.rstrip("/")) in ("stdlib_byte", "stdlib_gpt2"):
        print0(f"{cfg.data_dir} is missing: preparing the Python stdlib corpus there")
        prepare(None, cfg.data_dir, tokenizer=cfg.data_dir.rstrip("/").rsplit("_", 1)[1])
    if ddp:
        dist.barrier()
    meta = load_meta(cfg.data_dir)
    loader_args = dict(batch_size=cfg.batch_size, block_size=cfg.block_size, device=device,
                       packing=cfg.packing, document_mask=cfg.document_mask, eot=meta["eot_id"])
    loader_args.update(rank=_rank, world_size=world)   # each rank keeps its own rows of one shared stream
    loader_args.update(vocab_size=meta["vocab_size"])
    train_loader = Loader(cfg.data_dir, "train", seed=cfg.seed, prefetch=grad_accum_steps, **loader_args)
    val_loader = Loader(cfg.data_dir, "val", seed=cfg.seed + 1, **loader_args) if cfg.eval_iters > 0 else None
    use_doc_ids = cfg.packing and cfg.document_mask
    check_mask = cfg.check_mask and use_doc_ids

    # model, optimizer, precision
    torch.manual_seed(cfg.seed)        # same initial weights on every rank
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.tf32
    ckpt = None
    if cfg.init_from == "resume":
        ckpt = load_checkpoint(ckpt_path)
        if ckpt["meta"]["vocab_size"] != meta["vocab_size"]:
            raise ValueError(f"checkpoint {ckpt_path} has vocabulary {ckpt['meta']['vocab_size']} "
                             f"({ckpt['meta']['tokenizer']}) but {cfg.data_dir} has {meta['vocab_size']} ({meta['tokenizer']})")
        if ckpt["step"] > cfg.max_iters:
            raise ValueError(f"checkpoint {ckpt_path} is at step {ckpt['step']}, past max_iters={cfg.max_iters}")
        if cfg.profile and ckpt["step"] + cfg.timing_warmup > cfg.max_iters:
            raise ValueError(f"profile=True profiles step {ckpt['step'] + cfg.timing_warmup - 1} of this resumed run: "
                             f"max_iters={cfg.max_iters} ends before it")
        saved = {"activation": "gelu", **ckpt["config"]}          # [hf] checkpoints older than the key: gelu
        for k in MODEL_KEYS:
            if saved[k] != getattr(cfg, k):
                raise ValueError(f"config key {k!r}={getattr(cfg, k)!r} differs from the checkpoint's {saved[k]!r}")
    model_cfg = GPTConfig(vocab_size=meta["vocab_size"], **{k: getattr(cfg, k) for k in MODEL_KEYS})
    if cfg.init_from in ("scratch", "resume"):
        raw_model = GPT(model_cfg).to(device)
    else:   # [hf] GPT-2 weights through Hugging Face (hf.py): their shape replaces the config's, and is saved
        from hf import load_hf_gpt2
        raw_model = load_hf_gpt2(cfg.init_from, model_cfg).to(device)
        for k in MODEL_KEYS:
            setattr(cfg, k, getattr(raw_model.config, k))
    if ckpt is not None:
        load_weights(raw_model, ckpt, ckpt_path)
    flops_per_token = raw_model.flops_per_token()
    pt_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.dtype]
    # the transforms, in this order: FP8 conversion, activation checkpointing, compile, DDP/FSDP
    if cfg.fp8:
        converted = apply_fp8(raw_model, cfg, device)
        print0(f"fp8: {len(converted)} Linear layers converted ({cfg.fp8_recipe}); the rest stay bf16")
    if cfg.grad_checkpointing != "none":
        apply_activation_checkpointing(raw_model, cfg.grad_checkpointing)
    if cfg.compile:
        apply_compile(raw_model, per_block=ddp and cfg.parallelism == "fsdp")
    model = apply_parallelism(raw_model, cfg.parallelism, pt_dtype, device, local_rank) if ddp else raw_model
    grad_sync = None                   # DDP/FSDP: sync gradients on the last micro-step only
    if ddp and cfg.parallelism == "ddp":
        grad_sync = lambda on: setattr(model, "require_backward_grad_sync", on)
    elif ddp:
        grad_sync = model.set_requires_gradient_sync
    optimizer = make_optimizer(raw_model, cfg, device)
    ctx = nullcontext() if cfg.dtype == "float32" else torch.autocast(device.type, dtype=pt_dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.dtype == "float16")
    start_step, best_val = 0, None
    if ckpt is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(raw_model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True))
        scaler.load_state_dict(ckpt["scaler"])
        start_step, best_val = ckpt["step"], ckpt["best_val_loss"]
        train_loader.load_state_dict(ckpt["loader"])
        torch.set_rng_state(ckpt["rng"]["cpu"])
        if device.type == "cuda" and ckpt["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
        ckpt = None                    # free the memory
    peak = peak_flops_for(device, cfg)

    # logging
    os.makedirs(cfg.out_dir, exist_ok=True)
    if master:
        for name in ("profile.txt", "profile_trace.json.gz") if cfg.profile else ():
            if os.path.exists(os.path.join(cfg.out_dir, name)):    # never leave an old profile looking current
                os.remove(os.path.join(cfg.out_dir, name))
        print0(json.dumps(asdict(cfg), indent=1))
        with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
            json.dump(asdict(cfg), f, indent=1)
    print0(f"{raw_model.num_params() / 1e6:.2f}M parameters | {flops_per_token / 1e6:.1f} MFLOP/token | "
           f"device {device} x {world} | grad_accum_steps {grad_accum_steps} per process | "
           f"{tokens_per_step:,} tokens per step | peak " + (f"{peak / 1e12:.1f} TFLOP/s" if peak else "n/a (no MFU)"))
    # a resumed run appends; a run from scratch starts the file afresh
    metrics_file = open(os.path.join(cfg.out_dir, "metrics.jsonl"), "a" if cfg.init_from == "resume" else "w") if master else None
    wandb = None
    if cfg.wandb_log and master:
        import wandb
        wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None, config=asdict(cfg))

    def log(record):
        if master:
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
            if wandb is not None:
                wandb.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    # ---------------------------------------------------------------- training
    _setup_done = True
    timed = []                                 # (tokens_per_sec, mfu) of each timed interval
    clock, busy, interval_tokens, interval_steps = None, 0.0, 0, 0
    val_loss = None
    for step in range(start_step, cfg.max_iters + 1):
        last_step = step == cfg.max_iters
        if (step % cfg.eval_interval == 0 or last_step) and (cfg.eval_iters > 0 or cfg.save_checkpoints):
            sync(device)                        # stop the clock: eval is not training time
            if clock is not None:
                busy += time.perf_counter() - clock
            if cfg.eval_iters > 0:
                val_loss = estimate_loss(model, val_loader, cfg.eval_iters, ctx, use_doc_ids)
                best_val = val_loss if best_val is None else min(best_val, val_loss)
                print0(f"step {step}: val loss {val_loss:.4f}")
                log({"step": step, "val_loss": val_loss})
            if cfg.save_checkpoints and (step > start_step or last_step):
                sd, osd = model_state(raw_model, optimizer)      # a collective under FSDP: every rank
                if master:
                    save_checkpoint(ckpt_path, {
                        "model": sd, "optimizer": osd, "scaler": scaler.state_dict(), "step": step,
                        "best_val_loss": best_val, "config": asdict(cfg), "meta": meta, "loader": train_loader.state_dict(),
                        "rng": {"cpu": torch.get_rng_state(),
                                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}})
            sync(device)
            if clock is not None:
                clock = time.perf_counter()
        if last_step:
            break
        if step - start_step == cfg.timing_warmup:
            sync(device)                        # start the clock: warm-up (compile) is over
            clock, busy, interval_tokens, interval_steps = time.perf_counter(), 0.0, 0, 0

        prof = None                             # profile=True: the last warm-up step, outside the clock
        if cfg.profile and step - start_step == cfg.timing_warmup - 1:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                          + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []))
            prof.start()
        lr = get_lr(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batches = [next(train_loader) for _ in range(grad_accum_steps)]
        n_valid = sum(b.n_valid for b in batches)
        # every micro-batch's loss is weighted by its share of the real tokens of the whole step, so
        # accumulation (and data parallelism) gives the gradient of one big batch
        n_global, step_tokens = n_valid, n_valid
        if ddp:                                # a tensor: no host sync
            step_tokens = torch.tensor(float(n_valid), device=device)
            dist.all_reduce(step_tokens)
            n_global = step_tokens / world     # DDP and FSDP average gradients over ranks
        loss_sum = forward_backward(model, batches, n_global, ctx, scaler, use_doc_ids, grad_sync)
        if check_mask:                         # debug flag: off, this costs nothing
            for b in batches:
                check_attention_mask(raw_model.attention_mask(b.doc_ids, cfg.block_size, device), b.doc_ids)
        if cfg.grad_clip > 0:
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if prof is not None:
            write_profile(prof, device, cfg.out_dir)

        # timing: the clock runs from the end of the warm-up steps; sync only when reading it
        if clock is not None:
            interval_tokens += step_tokens
            interval_steps += 1
        if step % cfg.log_interval == 0 or step == cfg.max_iters - 1:
            record = {"step": step, "loss": None, "lr": lr, "step_ms": None, "tokens_per_sec": None,
                      "mfu": None, "mem_gb": None, "pad_frac": 1 - n_valid / (tokens_per_step / world)}
            if ddp:
                dist.all_reduce(loss_sum)      # the job's mean loss
                loss_sum = loss_sum / world
            record["loss"] = float(loss_sum)   # .item(): a host sync, on log steps only
            if cfg.grad_clip > 0:
                record["grad_norm"] = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            if clock is not None and interval_steps > 0:
                sync(device)
                now = time.perf_counter()
                busy += now - clock
                tps = float(interval_tokens) / busy
                record.update(step_ms=1000 * busy / interval_steps, tokens_per_sec=tps,
                              tokens_per_sec_per_gpu=tps / world, mfu=mfu(flops_per_token, tps / world, peak))
                timed.append((tps, record["mfu"]))
                clock, busy, interval_tokens, interval_steps = now, 0.0, 0, 0
            if device.type == "cuda":
                record["mem_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
            print0(f"step {step} | loss {record['loss']:.4f} | lr {lr:.2e} | " + (
                f"{record['step_ms']:.1f} ms | {record['tokens_per_sec']:,.0f} tok/s | mfu "
                + (f"{100 * record['mfu']:.1f}%" if record["mfu"] is not None else "n/a")
                if record["tokens_per_sec"] else "warm-up (untimed)") + f" | pad {record['pad_frac']:.3f}"
                + (f" | mem {record['mem_gb']:.1f} GB" if record["mem_gb"] else ""))
            log(record)

    # ---------------------------------------------------------------- summary
    def median(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None
    summary = {"val_loss": val_loss, "best_val_loss": best_val, "median_tokens_per_sec": median(t for t, _ in timed),
               "median_mfu": median(m for _, m in timed), "timed_intervals": len(timed),
               "mem_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}
    if summary["median_tokens_per_sec"] is not None:
        print0(f"median over {len(timed)} timed intervals: {summary['median_tokens_per_sec']:,.0f} tok/s"
               + (f", mfu {100 * summary['median_mfu']:.1f}%" if summary["median_mfu"] is not None else ""))
    if master:
        with open(os.path.join(cfg.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        metrics_file.close()
        if wandb is not None:
            wandb.summary.update({k: v for k, v in summary.items() if v is not None})
            wandb.finish()
    if ddp:
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    try:
        main()
    except (ValueError, TypeError, FileNotFoundError) as e:   # bad input: one clear line, no traceback
        if _setup_done:
            raise
        raise SystemExit(f"error: {e}")
