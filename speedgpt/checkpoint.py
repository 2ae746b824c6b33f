"""
Checkpoints of a speedgpt run. Each one holds everything a resume needs to continue exactly (weights of the
raw module, optimizer, GradScaler, step, RNG states, the loader's position, the config, the tokenizer
metadata, the W&B run id, the seconds and tokens trained so far), written atomically (a temp file, fsync,
rename) and never with non-finite weights; read with torch.load(weights_only=True).

In out_dir (keep_checkpoints=N):
  ckpt_step000250.pt  one file per saved step; the N latest are kept, older ones deleted
  ckpt.pt             the latest of them (a hard link: no second copy), what init_from=resume, sample.py,
                      eval.py and hf.py read
  ckpt_best.pt        the one of the lowest validation loss so far (a hard link), kept apart from the N
out_dir holds one history: a resume from an older checkpoint (resume_from) abandons the steps after it, and a
new run the run it replaces; their files go once the run has written its first checkpoint (Branch).
With async_checkpoint the file is written by a thread from a CPU copy while training goes on (one write in
flight; the last checkpoint of a run, and one after a signal, are written before the run ends).
"""
import errno
import glob
import math
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass

import torch

from speedgpt import refuse_unused
from speedgpt.measure import size
from speedgpt.shards import HELD_LOCKS, describe_os_error

CKPT_KEYS = ("model", "optimizer", "scaler", "step", "best_val_loss", "config", "meta", "loader", "rng")
KEPT_ON_RESUME = ("keep_checkpoints",)    # a resume keeps the run's unless set: the default's would prune its steps


def check(cfg, proc=None):
    """train.py's check: out_dir can be written (check_out_dir, on the first process only: the one that writes
    there, and none other races it making and removing the folder); keep_checkpoints and async_checkpoint are
    refused without checkpoints (they would do nothing). Returns cfg."""
    check_settings(cfg)
    if os.path.realpath(cfg.out_dir) == os.path.realpath(cfg.data_dir):   # checkpoints and metrics among the shards
        raise ValueError(f"out_dir={cfg.out_dir!r} is the data_dir: the run would write its checkpoints and metrics "
                         "among the shards; choose another --out_dir")
    if proc is None or proc.master:
        check_out_dir(cfg.out_dir)
        taken = sorted(os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(cfg.out_dir), "ckpt*.pt"))
                       if os.path.isdir(p))           # ckpt.pt, ckpt_best.pt, a step's ckpt_step000250.pt
        if cfg.save_checkpoints and taken:      # else the run trains, then fails to write its first checkpoint
            raise ValueError(f"{os.path.join(cfg.out_dir, taken[0])} is a folder, where the run writes a checkpoint: "
                             "move it away, or choose another --out_dir")
    elif os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ValueError(f"out_dir={cfg.out_dir!r} is a file, not a folder: choose another --out_dir")
    return cfg


def check_settings(cfg):
    """check()'s part that reads no folder: keep_checkpoints and async_checkpoint without checkpoints do nothing."""
    if not cfg.save_checkpoints:
        refuse_unused(cfg, ("keep_checkpoints", "async_checkpoint"), "a setting of the checkpoints",
                      "--save_checkpoints=True")


def check_out_dir(out_dir):
    """Check that this process can make and write `out_dir`, before any work, and leave nothing behind: the folders
    made to try are removed again (the run makes out_dir when it starts writing), so a command refused by a later
    check leaves no empty folder. Raises ValueError naming the folder, the cause (a file in its place, a read-only
    filesystem, no permission, no space left) and the way out."""
    from speedgpt.shards import folder_creation_error
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir={out_dir!r} is a file, not a folder: choose another --out_dir")
    made = os.path.realpath(out_dir)    # the highest folder this makes (None: out_dir exists); a link's target, made
    while not os.path.exists(os.path.dirname(made)):      # where it points (out -> /scratch/out), as data.py's --out
        made = os.path.dirname(made)
    made = None if os.path.exists(made) else made
    try:
        os.makedirs(os.path.realpath(out_dir), exist_ok=True)     # makedirs of a link to no folder: 'File exists'
    except OSError as e:
        raise folder_creation_error(out_dir, e, "--out_dir") from None
    try:
        with tempfile.TemporaryFile(dir=out_dir) as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ValueError(f"out_dir={out_dir!r} is not writable: {describe_os_error(e)}; choose another --out_dir") \
            from None
    finally:
        leaf = os.path.realpath(out_dir)
        while made and os.path.isdir(leaf) and not os.listdir(leaf):     # only the empty folders it made
            os.rmdir(leaf)
            if leaf == made:
                break
            leaf = os.path.dirname(leaf)


def lock_out_dir(out_dir):
    """Hold an exclusive lock on the folder `out_dir` while this process trains there (flock on the folder itself:
    no file is made, and the lock goes with the process however it ends), so that a second run started into it is
    refused before it reads or removes anything there: two runs would rotate and relink each other's checkpoints
    and replace each other's metrics, and both end "done". Raises ValueError naming the folder and the way out.
    Does nothing where out_dir is not a folder yet (train.py calls it again once it makes the folder) or where its
    filesystem has no locks. A process holds one such lock: a call for another folder, or unlock_out_dir(),
    releases it."""
    try:
        import fcntl
    except ImportError:                        # Windows: no flock
        return
    path = os.path.abspath(out_dir)
    if ("out_dir", path) in HELD_LOCKS or not os.path.isdir(path):
        return
    unlock_out_dir()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:                            # a folder that cannot be opened: its check says why, if it matters
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ValueError(f"another run is training in out_dir={out_dir!r} (it holds the folder's lock): wait "
                             "for it to end (or stop it), or choose another --out_dir") from None
        return                                 # no locks on this filesystem (some network or FUSE ones)
    HELD_LOCKS[("out_dir", path)] = fd      # closed in a forked worker (shards.HELD_LOCKS)


def unlock_out_dir():
    """Release lock_out_dir's lock, if this process holds one (its descriptor closed)."""
    for key in [k for k in HELD_LOCKS if k[0] == "out_dir"]:
        os.close(HELD_LOCKS.pop(key))


def model_state(model, optimizer=None, cpu=True):
    """Full (unsharded) state dicts of the raw module, without _orig_mod. / module. prefixes, on the CPU
    (cpu=False: where they live, the live tensors themselves when unsharded). A collective under FSDP:
    every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=cpu)
    sd = get_model_state_dict(model, options=opts)
    tied = {}                 # the tied embedding / head: offloaded key by key it would be two copies in the file
    for name, p in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    for first, *rest in tied.values():
        for name in rest:
            if first in sd and name in sd:
                sd[name] = sd[first]
    return sd if optimizer is None else (sd, get_optimizer_state_dict(model, optimizer, options=opts))


def checkpoint_file(out_dir):
    """The checkpoint sampling and evaluation read: out_dir/ckpt.pt, or out_dir itself when it names a file (a kept
    step, out/ckpt_step000500.pt, when ckpt.pt is damaged or a run's earlier model is wanted; a .pt name that is
    not there is that file, so the error names it)."""
    bare = out_dir.rstrip("/" + os.sep) or out_dir      # run/ckpt.pt/ names the file (a folder's slash typed on)
    named = os.path.isfile(bare) or (bare.endswith(".pt") and not os.path.isdir(bare))
    return bare if named else os.path.join(out_dir, "ckpt.pt")


def newest_kept(out_dir):
    """(what out_dir keeps besides ckpt.pt, the newest of it, its step): the step files ('steps 2, 4', by step
    number), else ckpt_best.pt (step None); None where it keeps neither."""
    steps, best = saved_steps(out_dir), os.path.join(out_dir, "ckpt_best.pt")
    if steps:
        return f"steps {', '.join(map(str, sorted(steps)))}", steps[max(steps)], max(steps)
    return ("ckpt_best.pt", best, None) if os.path.isfile(best) else None


def no_checkpoint(out_dir):
    """The line for sampling or evaluating a checkpoint that is not there (checkpoint_file(out_dir)): a run to
    train first, or a kept checkpoint of the folder to name instead (its newest step, else ckpt_best.pt), or, where
    out_dir names a step's file, the steps its folder keeps."""
    path = checkpoint_file(out_dir)
    if path != out_dir:
        kept = newest_kept(out_dir)
        if kept:
            return f"no checkpoint at {path}, but the folder keeps {kept[0]}: name one, --out_dir={kept[1]}"
        if os.path.isfile(os.path.join(out_dir, "config.json")) and not os.path.isfile(os.path.join(out_dir,
                                                                                            "metrics.jsonl")):
            return (f"no checkpoint at {path}: {out_dir} holds a Hugging Face model (config.json, as hf.py export "
                    f"writes): read it with --init_from={out_dir}")
        return f"no checkpoint at {path}: train first (python train.py --out_dir={out_dir})"
    kept = ", ".join(str(s) for s in sorted(saved_steps(os.path.dirname(path) or ".")))
    return f"no checkpoint at {path}: " + (f"its folder keeps the steps {kept}" if kept else "its folder keeps no step")


def load_checkpoint(path, required=CKPT_KEYS, missing=""):
    """The dict save_checkpoint wrote at `path` (on the CPU). Raises FileNotFoundError if there is none,
    ValueError if it cannot be read or lacks a key of `required` (a nanoGPT checkpoint, say); a resume
    needs them all, sampling only model, config and meta. `missing`: what the missing file's error adds."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}{missing}")
    def corrupt(why):
        others = [(s, p) for s, p in sorted(saved_steps(os.path.dirname(path) or ".").items())
                  if not os.path.samefile(p, path)]
        hint = (f" The kept steps {', '.join(str(s) for s, _ in others)} may still load (train.py "
                f"--resume_from={others[-1][0]}; sample.py and eval.py --out_dir={others[-1][1]})" if others else "")
        return ValueError(f"checkpoint {path} {why}; is it corrupt?{hint}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        with open(path, "rb") as f:             # torch.save writes a zip archive (an old one: a pickle)
            if not path.endswith(".pt") and f.read(2) not in (b"PK", b"\x80\x02"):     # config.json, train.bin
                raise ValueError(f"{path} is not a checkpoint (torch.save did not write it): give a run's folder or "
                                 "its ckpt.pt or ckpt_stepNNNNNN.pt") from None
        raise corrupt(f"cannot be read ({type(e).__name__})") from e
    missing = [k for k in required if k not in ckpt] if isinstance(ckpt, dict) else list(required)
    if missing and isinstance(ckpt, dict) and "model_args" in ckpt:      # nanoGPT's: its weights start a run
        dataset = (ckpt.get("config") or {}).get("dataset")               # the data it was trained on, by name
        raise ValueError(f"{path} is nanoGPT's checkpoint: start a run from its weights with train.py "
                         f"--init_from={path}" + (f" --data_dir=data/{dataset}" if isinstance(dataset, str) else "") +
                         " --out_dir=NEW_FOLDER (its optimizer state, grouped otherwise, and its data position do not "
                         "carry over); that run's own checkpoints then resume, sample and evaluate")
    if missing:
        raise ValueError(f"{path} is not a speedgpt checkpoint: it lacks {', '.join(missing)}")
    # save_checkpoint never writes non-finite weights or moments: such a file was damaged after it was written (its
    # bytes loaded, their values did not), and a run from it would stop at once as "diverged", pointing back at it.
    # A module's own state (FP8's amax history) is its module's to judge: fp8 calibrates a non-finite one again
    weights = {k: v for k, v in ckpt["model"].items() if not k.endswith(EXTRA)}
    if not all_finite(weights) or not all_finite(ckpt.get("optimizer", {})):
        raise corrupt("holds weights or optimizer moments that are not finite, which no run saves")
    for name, state in ckpt.pop("fp8_scaling", {}).items():   # older checkpoints kept the extra state apart
        ckpt["model"].setdefault(f"{name}.{EXTRA}", state)
    return ckpt


def extra_states(model):
    """{state-dict key: value} of the modules of `model` that keep state of their own beside their weights
    (nn.Module.get_extra_state: an FP8 layer's amax history). Checkpoints carry it; it is no part of the
    architecture, so load_weights takes it where both sides have it and leaves it out where one lacks it."""
    return {f"{name}.{EXTRA}" if name else EXTRA: m.get_extra_state() for name, m in model.named_modules()
            if type(m).get_extra_state is not torch.nn.Module.get_extra_state}


EXTRA = "_extra_state"        # nn.Module's state-dict key for get_extra_state


def load_weights(model, ckpt, path):
    """Load the checkpoint's weights into `model`, and the modules' extra state (extra_states) where the
    checkpoint has it; ValueError naming `path` and the keys that differ (mismatch) if the weights do not fit it."""
    own = extra_states(model)
    state = {k: v for k, v in ckpt["model"].items() if not k.endswith(EXTRA) or k in own}
    state.update({k: v for k, v in own.items() if k not in state})     # a layer the checkpoint has none for
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        why = mismatch(state, model.state_dict()) or " ".join(str(e).split())
        raise ValueError(f"checkpoint {path} does not fit the model: {why}") from e


def mismatch(saved, wanted, show=4):
    """The keys of state dicts `saved` (a checkpoint's) and `wanted` (a model's) that differ, in words: another
    shape, missing from the checkpoint, or not in the model; the first `show`, then how many more. '' if none."""
    def shape(t):
        return tuple(t.shape) if hasattr(t, "shape") else type(t).__name__
    diffs = [f"{k} has shape {shape(saved[k])} in the checkpoint, {shape(v)} in the model"
             for k, v in wanted.items() if k in saved and shape(saved[k]) != shape(v)]
    diffs += [f"{k} is missing from the checkpoint" for k in wanted if k not in saved]
    diffs += [f"{k} is in the checkpoint, not in the model" for k in saved if k not in wanted]
    more = f"; and {len(diffs) - show} more keys that differ" if len(diffs) > show else ""
    return "; ".join(diffs[:show]) + more



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


STEP_FILE = re.compile(r"ckpt_step(\d+)\.pt$")


def step_path(out_dir, step):
    """out_dir/ckpt_stepNNNNNN.pt: the checkpoint of `step`."""
    return os.path.join(out_dir, f"ckpt_step{step:06d}.pt")


def saved_steps(out_dir):
    """{step: path} of the step-numbered checkpoints in out_dir (from their names: nothing is loaded)."""
    found = {}
    for path in glob.glob(os.path.join(glob.escape(out_dir), "ckpt_step*.pt")):
        m = STEP_FILE.search(os.path.basename(path))
        if m:
            found[int(m.group(1))] = path
    return found


def linked_step(path):
    """The step of the step file `path` (ckpt.pt) is a hard link of, or None (none, or a copy where the filesystem has
    no hard links): nothing is loaded, so a file being written or damaged cannot fail it."""
    if not os.path.isfile(path):
        return None
    return next((s for s, p in saved_steps(os.path.dirname(path) or ".").items() if os.path.samefile(p, path)), None)


def run_id_of(path):
    """The run_id of the checkpoint at `path` (memory-mapped: nothing of its tensors is loaded), or None: written
    before checkpoints carried one, or unreadable."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("run_id")
    except Exception:                          # a damaged file says nothing of its run; loading it says why
        return None


def step_of(path):
    """The step a checkpoint file holds, from the step-numbered file it is (or is a hard link of), without
    loading it; None when no such file matches (a checkpoint written before step files, or copied)."""
    m = STEP_FILE.search(os.path.basename(path))
    if m:
        return int(m.group(1))
    for step, other in saved_steps(os.path.dirname(path) or ".").items():
        try:
            if os.path.samefile(path, other):
                return step
        except OSError:
            pass
    return None


def _fsync_dir(folder):
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:                            # a filesystem whose folders cannot be opened (rare): skip
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link(src, dst):
    """Make `dst` name the file `src` atomically (a hard link then a rename; a copy where links fail)."""
    tmp = dst + ".tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    try:
        os.link(src, tmp)
    except OSError:                            # no hard links here (some network or FUSE filesystems)
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def write_cause(e, path):
    """Why writing `path` failed, in words: an OSError's errno named, or, for the RuntimeError a full disk
    gives torch.save ("basic_ios::clear: iostream error"), the free space."""
    if isinstance(e, OSError):
        return describe_os_error(e)
    usage = shutil.disk_usage(os.path.dirname(os.path.abspath(path)) or ".")
    if usage.free < 0.01 * usage.total or usage.free < 256e6:
        return f"no space left on the device ({usage.free / 1e6:,.0f} MB free)"
    try:
        import resource
        if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
            return describe_os_error(OSError(errno.EFBIG, "File too large"))
    except (ImportError, ValueError, OSError):
        pass
    return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def save_checkpoint(path, ckpt, keep=1, best=False, stale=()):
    """Write `ckpt` (a dict with "step") as out_dir/ckpt_stepNNNNNN.pt, atomically (a temp file, fsync, a
    rename, so a crash never leaves half a checkpoint), `path` (out_dir/ckpt.pt) pointed at it first (a crash
    between the two never leaves ckpt.pt older than a step file, which a resume takes for a rewind, whose newer
    steps it removes), and out_dir/ckpt_best.pt too when `best`; then delete the files of `stale` (another
    history's: Branch), saying so, and keep the `keep` latest step files. Refuses (ValueError) weights or
    optimizer moments that are not finite: a diverged run never replaces the last good checkpoint. Raises
    CheckpointNotWritten, naming the path and the cause (no space left, read-only), when it cannot write; the
    previous checkpoints are then intact, the stale ones too."""
    if not all_finite(ckpt["model"]) or not all_finite(ckpt["optimizer"]):
        raise ValueError(f"step {ckpt['step']}: the weights or optimizer state are not finite; "
                         f"{path} is not replaced (it holds the last good checkpoint)")
    out_dir = os.path.dirname(path) or "."
    target = step_path(out_dir, ckpt["step"])
    try:
        with open(target + ".tmp", "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        _link(target + ".tmp", path)
        os.replace(target + ".tmp", target)
        if best:
            _link(target, os.path.join(out_dir, "ckpt_best.pt"))
        _fsync_dir(out_dir)
    except (OSError, RuntimeError) as e:      # a full disk reaches torch.save as "basic_ios::clear: iostream error"
        raise CheckpointNotWritten(f"could not write {target}: {write_cause(e, target)}") from None
    finally:
        for tmp in (target + ".tmp", path + ".tmp"):
            if os.path.exists(tmp):            # a failed or interrupted write leaves no stale temp file
                os.remove(tmp)
    gone = [p for p in stale if os.path.exists(p) and not (best and os.path.basename(p) == "ckpt_best.pt")]
    for old in gone:
        if old != target:                      # a step file of the same name is this run's now
            os.remove(old)
    if gone:
        steps = ", ".join(str(s) for s in sorted(step_of(p) for p in gone if STEP_FILE.search(p)))
        best_too = any(os.path.basename(p) == "ckpt_best.pt" for p in gone)
        print(f"removed the checkpoints of the abandoned steps {steps}"
              + (" and their ckpt_best.pt" if best_too else "") if steps else "removed the abandoned ckpt_best.pt",
              flush=True)
    for _, old in sorted(saved_steps(out_dir).items())[:-keep]:     # one history: the lowest steps are the oldest
        os.remove(old)                         # ckpt_best.pt, a link of its own, keeps its data


def remove_stale_tmp(path):
    """Delete the .tmp files left in `path`'s folder by a run killed while saving (SIGKILL, power loss);
    returns True if there was one."""
    stale = glob.glob(os.path.join(glob.escape(os.path.dirname(path) or "."), "ckpt*.pt.tmp"))
    for tmp in stale:
        os.remove(tmp)
    return bool(stale)


@dataclass
class Branch:
    """out_dir's history as a run continues it, for save_run: `stale`, the files of another history (the steps
    a resume from an older checkpoint abandons, or the run a new one replaces), deleted once this run's first
    checkpoint is written; `best`, the validation loss of the checkpoint ckpt_best.pt holds (inf: none), which
    an evaluation must match or beat to take its place."""
    stale: list
    best: float = math.inf


def checkpoint_step(path):
    """The step of the checkpoint at `path`: from its step file's name (step_of), else read from the file
    memory-mapped (nothing of its tensors is loaded)."""
    step = step_of(path)
    return step if step is not None else torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"]



def start_branch(out_dir, ckpt, master=True):
    """The Branch a run continues in out_dir, from its checkpoint `ckpt` (None for a new run); called once the
    run is set up, so a refused command changes nothing. A rewound resume (rewind_notes) points ckpt.pt at its
    checkpoint and ckpt_best.pt at the best it kept (or removes it) now; the abandoned files stay until the
    first new checkpoint is written. Files are touched on rank 0 (`master`) only."""
    best_path = os.path.join(out_dir, "ckpt_best.pt")
    if ckpt is None:                           # a new run replaces what out_dir holds
        stale = list(saved_steps(out_dir).values()) + ([best_path] if os.path.exists(best_path) else [])
        return Branch(stale if master else [])
    branch = Branch([p for s, p in sorted(saved_steps(out_dir).items()) if s > ckpt["step"]] if master else [],
                    math.inf if ckpt["best_val_loss"] is None else ckpt["best_val_loss"])
    plan = ckpt.get("rewound")
    if not master or not plan:
        return branch
    latest = os.path.join(out_dir, "ckpt.pt")
    if not (os.path.exists(latest) and os.path.samefile(plan["path"], latest)):
        _link(plan["path"], latest)
    if plan["best"] is None and os.path.exists(best_path):
        os.remove(best_path)
        branch.best = math.inf
    elif plan["best"] != "keep":
        _link(plan["best"][0], best_path)
        branch.best = plan["best"][1]
    return branch


def resolve_resume(out_dir, resume_from):
    """The checkpoint a resume reads: out_dir/ckpt.pt (the latest) for resume_from='', else the step file of
    resume_from (a step number) or the file it names, inside out_dir (a file name as `ls out_dir` shows it:
    ckpt_step000012.pt, even where the current folder, another run's, has one of that name) or else as a path.
    Raises FileNotFoundError naming the steps there are."""
    if not resume_from:
        return os.path.join(out_dir, "ckpt.pt")
    steps = saved_steps(out_dir)
    have = ", ".join(map(str, sorted(steps))) or "none"
    if not resume_from.isdigit():
        for path in (os.path.join(out_dir, resume_from), resume_from):
            if os.path.isfile(path):
                return path
        if os.path.isdir(resume_from):         # a run's folder: it is out_dir, not a checkpoint
            raise FileNotFoundError(f"resume_from={resume_from!r} is a folder: resume the run there with "
                                    f"--out_dir={resume_from} --init_from=resume, or name a checkpoint file in it")
        raise FileNotFoundError(f"resume_from={resume_from!r}: no such checkpoint file, as a path or in {out_dir} "
                                f"(its steps: {have}; --resume_from=STEP resumes one)")
    if int(resume_from) not in steps:
        raise FileNotFoundError(f"resume_from={resume_from}: {out_dir} has no checkpoint of step {int(resume_from)} "
                                f"(its steps: {have}; keep_checkpoints sets how many are kept)")
    return steps[int(resume_from)]


def checkpoint_bytes(n_params):
    """Bytes of one checkpoint of a model of n_params float32 parameters, at most: the weights, AdamW's two
    moments (Muon keeps one), and a little for the rest."""
    return 12 * n_params + (1 << 20)


def check_disk(out_dir, ckpt_bytes, keep, writes=None):
    """(line to print, or raise ValueError): the disk use of keep_checkpoints=keep checkpoints of ckpt_bytes
    each, + ckpt_best.pt (which may be one more), + the next one while it is written (the oldest is deleted
    after it), against the free space of out_dir, counting the step files already there as space the run
    will reuse. `writes`: the most checkpoints the run can write (None: no bound), so a keep_checkpoints larger
    ("keep them all") counts the files there will be, not the count asked for."""
    there = saved_steps(out_dir)
    need = ckpt_bytes * (min(keep, len(there) + (writes or keep)) + 2)
    have = sum(os.path.getsize(p) for p in there.values())
    free = shutil.disk_usage(out_dir).free
    line = (f"checkpoints: ~{size(ckpt_bytes)} each, keeping {keep} (keep_checkpoints) and the best "
            f"(ckpt_best.pt), one more while written: up to ~{size(need)} in {out_dir} ({size(free)} free)")
    if need - have > free:
        raise ValueError(f"{out_dir} has {size(free)} free but keep_checkpoints={keep} needs up to ~{size(need)} "
                         f"({size(ckpt_bytes)} per checkpoint, the best and the one being written): free space, "
                         "lower --keep_checkpoints, or choose another --out_dir")
    return line


def state_is_finite(model, optimizer, device):
    """A 0-dim bool tensor on `device` (no host sync): every parameter, floating optimizer state and
    floating extra state of a module (an FP8 layer's amax history) of this rank (its shards under FSDP) is
    finite. AdamW keeps its step counts on the CPU."""
    state = list(model.parameters()) + [t for s in optimizer.state.values() for t in s.values()
                                        if torch.is_tensor(t) and t.is_floating_point()] + \
        [t for t in extra_states(model).values() if torch.is_tensor(t) and t.is_floating_point()]
    return torch.stack([torch.isfinite(t.to_local() if hasattr(t, "to_local") else t).all().to(device)
                        for t in state]).all()


DIVERGED = "with a lower learning_rate, or skip such steps (--max_skipped_steps=N)"


def last_good(path, then=DIVERGED):
    """What a stopped run says about `path`: the step it still holds (from its step file's name: nothing
    is loaded), and how to go on (`then`: after a resume from it; the default is for a run that diverged)."""
    if not os.path.exists(path):
        return "no checkpoint was written"
    return f"{path} still holds step {checkpoint_step(path)}: resume from it (--init_from=resume) {then}"


class BackgroundWrite:
    """At most one checkpoint write in flight, in a thread (async_checkpoint): the loop waits only for the
    copy of the state to the CPU, not for the disk (a 1.5B checkpoint is ~19 GB). A failed write is kept
    for wait(), which the next save, the end of the run and any stop call first."""

    def __init__(self):
        self.thread, self.error, self.step = None, None, None
        self.buffers = {}                      # own_copy's pinned CPU tensors, reused by every write

    def start(self, path, ckpt, keep, best, stale=()):
        self.wait()
        self.step = ckpt["step"]
        self.thread = threading.Thread(target=self._write, args=(path, ckpt, keep, best, stale),
                                       name=f"checkpoint step {ckpt['step']}")
        self.thread.start()

    def _write(self, path, ckpt, keep, best, stale):
        try:
            save_checkpoint(path, ckpt, keep=keep, best=best, stale=stale)
        except Exception as e:                 # kept for the loop: a thread's traceback would reach nobody
            self.error = e if isinstance(e, CheckpointNotWritten) else \
                CheckpointNotWritten(f"could not write the checkpoint of step {ckpt['step']}: {write_cause(e, path)}")

    def wait(self):
        """Block until the write in flight (if any) ends; returns its failure (then forgotten), or None."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        error, self.error = self.error, None
        return error


def own_copy(ckpt, model, optimizer, buffers):
    """`ckpt` with every tensor on the CPU and sharing no memory with the live weights or optimizer state,
    so training can go on while a thread writes it. A GPU tensor is copied into a pinned CPU buffer kept in
    `buffers` for the next write (a pinned copy runs at the bus's speed; a fresh pageable one is several
    times slower: BENCHMARKS.md, "Checkpoints"); a CPU tensor of the live state is cloned; the rest is kept."""
    def storage(t):      # FSDP's parameters and moments are DTensors: their memory is the local shard's
        return (t.to_local() if hasattr(t, "to_local") else t).untyped_storage().data_ptr()
    live = {storage(t) for t in model.parameters()}
    live |= {storage(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)}
    cuda, seen = False, {}                     # seen: one copy of a tensor held twice (the tied embedding / head)

    def copy(x, key):
        if torch.is_tensor(x) and (x.data_ptr(), x.shape, x.dtype, x.device) in seen:
            return seen[x.data_ptr(), x.shape, x.dtype, x.device]
        if torch.is_tensor(x):
            seen[x.data_ptr(), x.shape, x.dtype, x.device] = y = own(x, key)
            return y
        if isinstance(x, dict):
            return {k: copy(v, key + (k,)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(copy(v, key + (i,)) for i, v in enumerate(x))
        return x

    def own(x, key):
        nonlocal cuda
        if x.device.type != "cpu":
            buf = buffers.get(key)
            if buf is None or buf.shape != x.shape or buf.dtype != x.dtype:
                buf = buffers[key] = torch.empty(x.shape, dtype=x.dtype, pin_memory=x.is_cuda)
            cuda |= x.is_cuda
            return buf.copy_(x, non_blocking=x.is_cuda)           # pinned: one synchronize below
        return x.clone() if x.untyped_storage().data_ptr() in live else x
    out = copy(ckpt, ())
    if cuda:
        torch.cuda.synchronize()               # the copies are done before training touches the state again
    return out


def finish_write(run):
    """Wait for `run`'s background checkpoint write (every rank calls it); raise RunStopped on every rank,
    in one line naming the checkpoint and the last good one, if it failed."""
    from speedgpt.distributed import RunStopped, on_every_rank
    failed_step = run.writer.step
    error = run.writer.wait() if run.proc.master else None
    if not on_every_rank(torch.tensor(error is None, device=run.proc.device), run.proc):
        raise RunStopped(f"error: step {failed_step}: {error or 'rank 0 could not write the checkpoint'} (written in "
                         f"the background; the run stopped at step {run.step}); "
                         f"{last_good(run.ckpt_path, 'once the disk has room')}", 1)


def save_run(run, step, background=False, stopped=False):
    """Write the checkpoint of train.py's Run `run` after `step` optimizer steps (every rank calls it: a
    collective under FSDP), ckpt_best.pt too when this step's evaluation is the best so far; with
    `background`, in a thread from a CPU copy (BackgroundWrite), else before returning. Non-finite
    weights or optimizer moments, or a write that fails on rank 0 (this one, or the background write
    before it), raise RunStopped on every rank in one line naming the last good checkpoint; nothing is
    written then."""
    from dataclasses import asdict
    from speedgpt.distributed import RunStopped, on_every_rank, rng_states
    device, proc, cfg, path = run.proc.device, run.proc, run.cfg, run.ckpt_path
    finish_write(run)
    if not on_every_rank(state_is_finite(run.raw_model, run.optimizer, device), proc):
        raise RunStopped(f"error: step {step}: the weights are not finite: the run diverged; {last_good(path)}", 1)
    sharded = proc.world > 1 and cfg.parallelism == "fsdp"       # gathered to rank 0's CPU, never whole on a GPU
    sd, osd = model_state(run.raw_model, run.optimizer, cpu=not background or sharded)
    rng, error = rng_states(proc), None
    if proc.master:
        best = run.evaluated == step and run.val_loss <= run.branch.best      # ckpt_best.pt's, or none yet (inf)
        stale, run.branch.stale = run.branch.stale, []                      # once: the first checkpoint's
        if best:
            run.branch.best = run.val_loss
        ckpt = {"model": sd, "optimizer": osd, "scaler": run.scaler.state_dict(), "step": step,
                "best_val_loss": run.best_val, "config": asdict(cfg), "meta": run.meta, "target_reached": run.target,
                "loader": run.train_loader.state_dict(), "wandb_run_id": run.logger.wandb_run_id,
                "tokens_per_step": cfg.batch_size * cfg.block_size * run.grad_accum_steps * proc.world,
                "train_seconds": run.train_seconds, "tokens": int(run.tokens),      # the clock a resume continues
                "run_id": run.run_id,                        # which run wrote it, wherever its out_dir moved
                "stopped": stopped,          # after a signal: at max_iters or the budget's end, the end still to make
                "rng": {"cpu": rng[0][0], "cuda": rng[0][1], "ranks": rng}}
        if background:
            run.writer.start(path, own_copy(ckpt, run.raw_model, run.optimizer, run.writer.buffers),
                             cfg.keep_checkpoints, best, stale)
        else:
            try:
                save_checkpoint(path, ckpt, keep=cfg.keep_checkpoints, best=best, stale=stale)
            except CheckpointNotWritten as e:
                error = e
    if not on_every_rank(torch.tensor(error is None, device=device), proc):   # every rank stops together
        raise RunStopped(f"error: step {step}: {error or 'rank 0 could not write the checkpoint'}; "
                         f"{last_good(path, 'once the disk has room')}", 1)
