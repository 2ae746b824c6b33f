"""
Validation: the loss and bits per byte of a fixed set of validation tokens, the same whatever the world size
and micro-batch (eval_tokens), and time to a target loss (target_val_loss: the field's measure of a trainer,
as modded-nanogpt's time to a FineWeb val loss of 3.28). HellaSwag, the other evaluation in the loop, is
speedgpt/hellaswag.py.
"""
import math

import torch
import torch.distributed as dist

# a resume keeps the run's unless set (speedgpt/resume.py): the default's would measure other rows, whose losses
# ckpt_best.pt and target_val_loss would then compare with the run's own
KEPT_ON_RESUME = ("eval_tokens",)


def eval_rows(cfg, val_loader):
    """Rows of each evaluation: eval_tokens in whole rows, at most the val split's."""
    return min(-(-cfg.eval_tokens // cfg.block_size), val_loader.n_rows)


def small_split_note(cfg, val_loader):
    """The note for a val split smaller than eval_tokens: each evaluation is all of it."""
    return (f"note: eval_tokens={cfg.eval_tokens:,} but the val split of {cfg.data_dir} holds "
            f"{val_loader.n_rows:,} rows of block_size={cfg.block_size} ({val_loader.n_rows * cfg.block_size:,} "
            "tokens): each evaluation is all of them")


@torch.no_grad()
def estimate_loss(model, loader, rows, ctx, token_bytes):
    """(mean loss per real token, bits per byte) over the first `rows` rows of the val loader's fixed order,
    all ranks together: the same tokens every time, whatever the world size and micro-batch. Bits per
    byte is the same loss sum, in bits, over the UTF-8 bytes of the same targets (`token_bytes`: (vocab,)
    bytes per id; end-of-text is 0 bytes, its loss counted; None for ids whose text is unknown, whose bits per
    byte are None). Every rank runs the same number of forwards (FSDP gathers weights in each); rows past `rows`
    get no targets."""
    model.eval()
    loader.reset()
    wide = torch.float32 if loader.device.type == "mps" else torch.float64  # MPS has no float64
    totals = torch.zeros(3, dtype=wide, device=loader.device)      # (loss sum, real tokens, their bytes)
    per_call = loader.world_size * loader.B
    for call in range(-(-rows // per_call)):
        b = next(loader)
        inside = rows - (call * per_call + loader.rank * loader.B)           # this batch's rows in the set
        if inside < loader.B:
            b = b._replace(y=b.y.clone())
            b.y[max(inside, 0):] = -1
        with ctx:
            _, loss = model(b.x, b.y, b.doc_ids, b.cu_seqlens, b.position_ids)
        n = (b.y != -1).sum()
        n_bytes = n if token_bytes is None else torch.where(b.y != -1, token_bytes[b.y.clamp(min=0)], 0).sum()
        totals += torch.stack([loss.to(wide) * n, n.to(wide), n_bytes.to(wide)])
    if dist.is_initialized():
        dist.all_reduce(totals)
    model.train()
    bpb = None if token_bytes is None else (totals[0] / math.log(2) / totals[2].clamp(min=1)).item()
    return (totals[0] / totals[1].clamp(min=1)).item(), bpb


def check(cfg, proc):
    """Raise ValueError unless the evaluation settings can work: target_val_loss needs evaluations. Returns cfg."""
    if cfg.target_val_loss and not cfg.eval_tokens:
        raise ValueError(f"target_val_loss={cfg.target_val_loss} stops at the first evaluation at or below it: it "
                         "needs eval_tokens > 0")
    return cfg


def target_reached(cfg, val_loss, step, train_seconds, tokens):
    """When target_val_loss is set and the evaluation of `step` is at or below it: a dict of where it was
    reached (step, real tokens trained, seconds of training: speedgpt/budget.py's clock, which leaves out the
    evaluations, the checkpoints and the first step's compile), else None."""
    if not cfg.target_val_loss or val_loss is None or val_loss > cfg.target_val_loss:
        return None
    return {"step": step, "val_loss": val_loss, "tokens": int(tokens), "train_seconds": round(train_seconds, 3)}


def describe_target(reached):
    """One phrase for target_reached's dict."""
    return (f"target val loss reached ({reached['val_loss']:.4f}) at step {reached['step']:,}: {reached['tokens']:,} "
            f"tokens, {reached['train_seconds']:.1f} s of training (compile and evaluation apart)")


def reached_before(cfg, ckpt):
    """For a resume of the checkpoint `ckpt` saved where its run reached its target_val_loss: when this run's
    target_val_loss counts as reached there too (set, and at or above that val loss), the phrase saying so and
    how to train on (the run is finished: nothing to train, nothing to write); else None."""
    reached = ckpt.get("target_reached")
    if not cfg.target_val_loss or not reached or reached["val_loss"] > cfg.target_val_loss:
        return None
    return (f"reached target_val_loss={cfg.target_val_loss} at step {reached['step']:,} (val loss "
            f"{reached['val_loss']:.4f}; {reached['tokens']:,} tokens, {reached['train_seconds']:.1f} s of training: "
            "summary.json); to train on, give a lower --target_val_loss (0: none, to max_iters)")
