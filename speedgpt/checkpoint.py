"""
Checkpoints of a speedgpt run: out_dir/ckpt.pt holds everything a resume needs to continue exactly
(weights of the raw module, optimizer, GradScaler, step, RNG states, the loader's position, the
config, the tokenizer metadata, the W&B run id). Written atomically and never with non-finite
weights; read with torch.load(weights_only=True).
"""
import os
import shutil
import tempfile

import torch

from speedgpt.shards import describe_os_error

CKPT_KEYS = ("model", "optimizer", "scaler", "step", "best_val_loss", "config", "meta", "loader", "rng")


def check_out_dir(out_dir):
    """Make `out_dir` if needed and check that this process can write there, before any work. Raises
    ValueError naming the folder and the cause: a file in its place, a read-only filesystem, no
    permission, no space left."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir={out_dir!r} is a file, not a folder")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir) as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ValueError(f"out_dir={out_dir!r} is not writable: {describe_os_error(e)}") from None


def model_state(model, optimizer=None):
    """Full (unsharded) state dicts of the raw module, without _orig_mod. / module. prefixes, on the CPU.
    A collective under FSDP: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=opts)
    return sd if optimizer is None else (sd, get_optimizer_state_dict(model, optimizer, options=opts))


def load_checkpoint(path, required=CKPT_KEYS):
    """The dict save_checkpoint wrote at `path` (on the CPU). Raises FileNotFoundError if there is none,
    ValueError if it cannot be read or lacks a key of `required` (a nanoGPT checkpoint, say); a resume
    needs them all, sampling only model, config and meta."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"checkpoint {path} cannot be read ({type(e).__name__}); is it corrupt?") from e
    missing = [k for k in required if k not in ckpt] if isinstance(ckpt, dict) else list(required)
    if missing:
        raise ValueError(f"{path} is not a speedgpt checkpoint: it lacks {', '.join(missing)}")
    return ckpt


def load_weights(model, ckpt, path):
    """Load the checkpoint's weights into `model`; ValueError (naming `path`) if they do not fit it."""
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ValueError(f"checkpoint {path} does not fit the model: {str(e).splitlines()[0]}") from e


def restore_state(ckpt, model, optimizer, scaler, loader, proc, cfg):
    """Set what a resume continues from the checkpoint `ckpt`: the optimizer's state (unsharded under
    FSDP), the GradScaler's (float16), the loader's position and each rank's random streams. Returns
    lines describing what could not continue as it was (a fresh GradScaler; fresh dropout streams)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    from speedgpt.distributed import restore_rng_states
    set_optimizer_state_dict(model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True))
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


def all_finite(state_dict):
    """True when every floating-point tensor of `state_dict` (nested dicts and lists too) is finite."""
    if isinstance(state_dict, dict):
        return all(all_finite(v) for v in state_dict.values())
    if isinstance(state_dict, (list, tuple)):
        return all(all_finite(v) for v in state_dict)
    if isinstance(state_dict, torch.Tensor) and state_dict.is_floating_point():
        return bool(torch.isfinite(state_dict).all())
    return True


class CheckpointNotWritten(OSError):
    """save_checkpoint could not write the file (a full or read-only disk); the previous one is intact."""


def save_checkpoint(path, ckpt):
    """Write `ckpt` atomically: a temp file, then a rename, so a crash never leaves half a checkpoint and
    the previous one survives until the new one is whole. Refuses (ValueError) weights or optimizer
    moments that are not finite: a diverged run never replaces the last good checkpoint. Raises
    CheckpointNotWritten, naming the path and the cause (no space left, read-only), when it cannot write."""
    if not all_finite(ckpt["model"]) or not all_finite(ckpt["optimizer"]):
        raise ValueError(f"step {ckpt['step']}: the weights or optimizer state are not finite; "
                         f"{path} is not replaced (it holds the last good checkpoint)")
    try:
        torch.save(ckpt, path + ".tmp")
        os.replace(path + ".tmp", path)
    except (OSError, RuntimeError) as e:      # a full disk reaches torch.save as "basic_ios::clear: iostream error"
        if isinstance(e, OSError):
            cause = describe_os_error(e)
        else:
            usage = shutil.disk_usage(os.path.dirname(os.path.abspath(path)))
            cause = (f"no space left on the device ({usage.free / 1e6:,.0f} MB free)" if usage.free < 0.01 * usage.total
                     or usage.free < 256e6 else f"{type(e).__name__}: {str(e).splitlines()[0]}")
        raise CheckpointNotWritten(f"could not write {path}: {cause}") from e
    finally:
        if os.path.exists(path + ".tmp"):      # a failed or interrupted write leaves no stale temp file
            os.remove(path + ".tmp")


def remove_stale_tmp(path):
    """Delete `path`.tmp left by a run killed while saving (SIGKILL, power loss); returns True if there was one."""
    if os.path.exists(path + ".tmp"):
        os.remove(path + ".tmp")
        return True
    return False


def state_is_finite(model, optimizer, device):
    """A 0-dim bool tensor on `device` (no host sync): every parameter and floating optimizer state of
    this rank (its shards under FSDP) is finite. AdamW keeps its step counts on the CPU."""
    state = list(model.parameters()) + [t for s in optimizer.state.values() for t in s.values()
                                        if torch.is_tensor(t) and t.is_floating_point()]
    return torch.stack([torch.isfinite(t.to_local() if hasattr(t, "to_local") else t).all().to(device)
                        for t in state]).all()


DIVERGED = "with a lower learning_rate, or skip such steps (--max_skipped_steps=N)"


def last_good(path, then=DIVERGED):
    """What a stopped run says about `path`: the step it still holds, and how to go on (`then`: after a
    resume from it; the default is for a run that diverged)."""
    if not os.path.exists(path):
        return "no checkpoint was written"
    return f"{path} still holds step {load_checkpoint(path)['step']}: resume from it (--init_from=resume) {then}"
