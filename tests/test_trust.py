"""Runs you can trust (CPU): divergence, signals, resume with changed settings, metrics and W&B across
a resume, launch environments and the batch plan."""
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import configurator
import train
from conftest import ROOT, read_metrics, tiny_args
from speedgpt.distributed import plan_batch, setup_processes


def strict_json(path):
    """Parse a JSON or JSON-lines file, refusing NaN / Infinity (Python's json accepts them by default)."""
    def refuse(name):
        raise ValueError(f"{path}: {name} is not JSON")
    with open(path) as f:
        if str(path).endswith(".json"):
            return [json.load(f, parse_constant=refuse)]
        return [json.loads(line, parse_constant=refuse) for line in f if line.strip()]


def losses(out_dir):
    return {r["step"]: r["loss"] for r in read_metrics(out_dir) if "loss" in r}


def cli(args, env=None, **kw):
    return subprocess.run([sys.executable, "train.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, **kw)

# -----------------------------------------------------------------------------
# divergence


def test_divergence_never_reaches_the_weights_or_the_checkpoint(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    good = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    bad = ["--init_from=resume", "--learning_rate=1e30", "--min_lr=1e30", "--grad_clip=0"]
    with pytest.raises(train.RunStopped, match=r"step \d+: the loss or gradient norm is not finite: the run diverged; "
                                               r".*ckpt.pt still holds step 4") as e:
        train.main(tiny_args(byte_data, tmp_path, *bad))
    assert e.value.exit_code == 1
    kept = torch.load(tmp_path / "ckpt.pt", weights_only=True)        # the last good checkpoint survives
    assert kept["step"] == 4 and kept["best_val_loss"] == good["best_val_loss"]
    for name, p in good["model"].items():
        assert torch.equal(kept["model"][name], p), name
    summary = strict_json(tmp_path / "summary.json")[0]             # strict JSON: null, never NaN
    assert "diverged" in summary["stopped"]
    rows = strict_json(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == list(range(4)) + [4, 5]
    assert rows[-1]["loss"] is None and rows[-2]["loss"] > 0        # step 5's NaN loss, written as null

    # the command line: a non-zero exit and one line naming the step, no traceback
    proc = cli(tiny_args(byte_data, tmp_path, *bad))
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"^error: step \d+: the loss or gradient norm is not finite", proc.stderr, re.M), proc.stderr
    assert "Traceback" not in proc.stderr


def test_skipped_steps_are_bounded(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    bad = ["--init_from=resume", "--learning_rate=1e30", "--min_lr=1e30", "--grad_clip=0", "--max_iters=20",
           "--eval_interval=100"]
    with pytest.raises(train.RunStopped, match="diverged"):
        train.main(tiny_args(byte_data, tmp_path, *bad, "--max_skipped_steps=3"))
    rows = [r for r in strict_json(tmp_path / "metrics.jsonl") if "loss" in r]
    # step 4 applies a huge but finite update; steps 5, 6, 7 are skipped; step 8 is one too many
    assert [r["step"] for r in rows][-5:] == [4, 5, 6, 7, 8]
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 4

# -----------------------------------------------------------------------------
# signals


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_a_checkpoint_and_resume_matches(byte_data, tmp_path, signum):
    common = ["--max_iters=300", "--eval_interval=100", "--lr_decay_iters=300", "--dropout=0.1"]
    cmd = [sys.executable, "train.py", *map(str, tiny_args(byte_data, tmp_path / "cut", *common))]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "cut" / "metrics.jsonl").exists() or len(read_metrics(tmp_path / "cut")) < 2:
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(random.uniform(0, 1.0))                  # a random moment of the training
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, (out[-2000:], err)
    m = re.search(r"stopped after step (\d+) with a checkpoint in .*ckpt.pt; continue with the same command and "
                  r"--init_from=resume", err)
    assert m and "Traceback" not in err, err
    assert torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)["step"] == int(m.group(1)) + 1
    assert not os.path.exists(tmp_path / "cut" / "ckpt.pt.tmp")
    train.main(tiny_args(byte_data, tmp_path / "cut", *common, "--init_from=resume"))
    train.main(tiny_args(byte_data, tmp_path / "whole", *common))
    steps = [r["step"] for r in read_metrics(tmp_path / "cut") if "loss" in r]
    assert steps == list(range(300))                    # every step once
    assert losses(tmp_path / "cut") == losses(tmp_path / "whole")


def test_a_step_that_fails_after_a_signal_names_the_process_group(byte_data, tmp_path, monkeypatch):
    """A SIGTERM sent to the whole process group (plain `timeout`) also kills torch.compile's compiler
    processes, and the step being compiled fails: the run stops with the signal's exit code and one line that
    says why and how to signal the trainer alone. The same error with no signal propagates as it is."""
    real, calls, handler = train.forward_backward, [], signal.getsignal(signal.SIGTERM)

    def compile_killed(*args, signal_first=True):
        calls.append(1)
        if len(calls) == 3:
            if signal_first:
                os.kill(os.getpid(), signal.SIGTERM)     # the handler only sets the flag
            raise RuntimeError("CppCompileError: C++ compile error\n(the compiler was killed)")
        return real(*args)
    monkeypatch.setattr(train, "forward_backward", compile_killed)
    with pytest.raises(train.RunStopped) as e:
        train.main(tiny_args(byte_data, tmp_path / "a", "--eval_interval=2"))
    assert e.value.exit_code == 128 + signal.SIGTERM
    msg = str(e.value)
    assert msg.startswith("SIGTERM: the step in progress failed after the signal (RuntimeError: CppCompileError: "
                          "C++ compile error); ") and "the whole process group" in msg and "timeout --foreground" in msg
    assert f"{tmp_path / 'a' / 'ckpt.pt'} still holds step 2" in msg            # the checkpoint of step 2 is kept
    assert json.load(open(tmp_path / "a" / "summary.json"))["stopped"] == msg
    calls.clear()
    monkeypatch.setattr(train, "forward_backward", lambda *a: compile_killed(*a, signal_first=False))
    with pytest.raises(RuntimeError, match="CppCompileError"):
        train.main(tiny_args(byte_data, tmp_path / "b", "--eval_interval=2"))
    assert signal.getsignal(signal.SIGTERM) is handler                       # the trainer's handler is gone


def test_stale_or_interrupted_save_leaves_no_tmp(byte_data, tmp_path, monkeypatch):
    from speedgpt import checkpoint
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    (tmp_path / "ckpt.pt.tmp").write_bytes(b"half a checkpoint")          # a run killed while saving
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=8", "--init_from=resume"))
    assert not (tmp_path / "ckpt.pt.tmp").exists()
    before = (tmp_path / "ckpt.pt").read_bytes()

    def interrupted_save(obj, f):
        f.write(b"partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint.torch, "save", interrupted_save)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(str(tmp_path / "ckpt.pt"), ckpt)
    assert not list(tmp_path.glob("*.tmp")) and (tmp_path / "ckpt.pt").read_bytes() == before


def test_checkpoint_with_non_finite_weights_is_refused(tmp_path):
    from speedgpt import checkpoint
    ckpt = {"model": {"w": torch.tensor([1.0, float("nan")])}, "optimizer": {}, "step": 3}
    with pytest.raises(ValueError, match="step 3: the weights or optimizer state are not finite"):
        checkpoint.save_checkpoint(str(tmp_path / "ckpt.pt"), ckpt)
    assert not os.listdir(tmp_path)

# -----------------------------------------------------------------------------
# resume with changed settings


def lrs(out_dir):
    return {r["step"]: r["lr"] for r in read_metrics(out_dir) if "lr" in r}


def test_resume_keeps_the_schedule_unless_a_schedule_key_is_set(byte_data, tmp_path, capsys):
    args = ["--max_iters=20", "--eval_interval=10", "--warmup_iters=2", "--eval_tokens=256"]
    train.main(tiny_args(byte_data, tmp_path / "a", *args))
    train.main(tiny_args(byte_data, tmp_path / "a", *args, "--max_iters=40", "--init_from=resume"))
    lr = lrs(tmp_path / "a")
    assert lr[19] <= lr[18] and all(lr[s] == pytest.approx(3e-4) for s in range(20, 40))   # min_lr: no jump
    out = capsys.readouterr().out
    assert "resume: max_iters 20 -> 40" in out and "decays until lr_decay_iters=20, then stays at min_lr" in out
    # an explicit schedule key wins, and the change is printed
    train.main(tiny_args(byte_data, tmp_path / "b", *args))
    train.main(tiny_args(byte_data, tmp_path / "b", *args, "--max_iters=40", "--lr_decay_iters=40",
                         "--init_from=resume"))
    assert "resume: lr_decay_iters 20 -> 40 (set explicitly)" in capsys.readouterr().out
    train.main(tiny_args(byte_data, tmp_path / "c", *args, "--max_iters=40", "--lr_decay_iters=40"))
    assert lrs(tmp_path / "b")[25] == lrs(tmp_path / "c")[25]


@pytest.mark.parametrize("first, then", [("float32", "float16"), ("float16", "bfloat16")])
def test_resume_with_another_precision(byte_data, tmp_path, first, then, capsys):
    train.main(tiny_args(byte_data, tmp_path, f"--dtype={first}", "--max_iters=4"))
    summary = train.main(tiny_args(byte_data, tmp_path, f"--dtype={then}", "--init_from=resume"))
    assert math.isfinite(summary["val_loss"])
    assert f"resume: dtype '{first}' -> '{then}'" in capsys.readouterr().out


def test_resume_refuses_another_shape_but_not_another_dropout(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with pytest.raises(ValueError, match="'n_embd'=48 differs from the checkpoint's 32"):
        train.main(tiny_args(byte_data, tmp_path, "--n_embd=48", "--init_from=resume"))
    train.main(tiny_args(byte_data, tmp_path, "--dropout=0.1", "--init_from=resume"))


@pytest.mark.slow
def test_metrics_and_wandb_continue_across_a_resume(byte_data, tmp_path, monkeypatch):
    """Killed after step 6 with a checkpoint at step 4, then resumed: each step once in metrics.jsonl,
    one W&B run id, each step's training row and each evaluation sent to W&B exactly once (the resumed
    step's training row too, though W&B already holds that step's evaluation)."""
    pytest.importorskip("wandb", reason="W&B is in requirements.txt; this machine lacks it")
    from wandb_reader import runs
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    out = tmp_path / "out"
    args = ["--wandb_log=True", "--eval_interval=4"]
    train.main(tiny_args(byte_data, out, *args, "--max_iters=4"))
    shutil.copy(out / "ckpt.pt", tmp_path / "step4.pt")
    train.main(tiny_args(byte_data, out, *args, "--max_iters=7", "--init_from=resume"))     # logs 4, 5, 6
    for f in out.glob("ckpt*.pt"):                                                        # ... then "killed":
        f.unlink()                                                                        # no later checkpoint
    shutil.copy(tmp_path / "step4.pt", out / "ckpt.pt")
    train.main(tiny_args(byte_data, out, *args, "--max_iters=8", "--init_from=resume"))
    rows = read_metrics(out)
    assert [r["step"] for r in rows if "loss" in r] == list(range(8))
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 4, 8]
    import wandb
    wandb.teardown()
    for _ in range(60):                 # the W&B service may still be writing its logs
        found = runs(tmp_path)
        if len(found) == 3 and sum(len(h) for _, h in found) >= 8 + 3:
            break
        time.sleep(0.5)
    assert len({run_id for run_id, _ in found}) == 1, [r for r, _ in found]
    rows = [r for _, h in found for r in h]                 # W&B merges what is logged at one step into one row
    assert sorted(r["_step"] for r in rows if "loss" in r) == list(range(8)), rows        # every step once
    assert sorted(r["_step"] for r in rows if "val_loss" in r) == [0, 4, 7, 8], rows     # 7: the "killed" run's end

# -----------------------------------------------------------------------------
# launch and the batch plan


def test_launch_environment(byte_data, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")                 # one process, LOCAL_RANK unset: no process group
    summary = train.main(tiny_args(byte_data, tmp_path, "--max_iters=2", "--device=cpu"))
    assert summary["val_loss"] is not None
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="WORLD_SIZE=2 but LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set: .*torchrun"):
        train.main(tiny_args(byte_data, tmp_path, "--device=cpu"))


def test_more_processes_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for k, v in dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="x",
                     MASTER_PORT="1").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=r"2 processes per node but 1 visible GPU\(s\): "
                                         r"use torchrun --nproc_per_node=1"):
        setup_processes(configurator.Config())


def readme_commands():
    """(world size, train.py arguments) of every train.py command in the bash blocks of the README and docs/."""
    import glob
    text = "".join(open(p).read() for p in [os.path.join(ROOT, "README.md"),
                                            *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))])
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].split()
            if "train.py" not in line:
                continue
            opts = dict(re.match(r"--(\w+)=(\d+)", a).groups() for a in line
                        if re.match(r"--(nproc_per_node|nnodes)=\d+", a))
            world = int(opts.get("nproc_per_node", 1)) * int(opts.get("nnodes", 1)) if line[0] == "torchrun" else 1
            cmds.append((world, line[line.index("train.py") + 1:]))
    return cmds


def test_every_readme_command_plans_its_batch():
    cmds = readme_commands()
    assert any(w == 16 for w, _ in cmds) and any(w == 8 for w, _ in cmds) and any(w == 1 for w, _ in cmds)
    for world, args in cmds:
        cfg = configurator.load_config([a for a in args if not a.startswith("--init_from=gpt2")])   # no download
        assert plan_batch(cfg, world) >= 1
        if cfg.total_batch_size:
            assert plan_batch(cfg, world) * cfg.batch_size * cfg.block_size * world == cfg.total_batch_size


def test_batch_plan():
    cfg = configurator.load_config(["--config", "config/fast.py"])
    assert [plan_batch(cfg, w) for w in (1, 2, 4, 8)] == [8, 4, 2, 1]
    with pytest.raises(ValueError, match=r"total_batch_size=524,288 tokens is not a multiple of "
                                         r"batch_size x block_size x processes = 64 x 1024 x 16 = 1,048,576"):
        plan_batch(cfg, 16)
    assert plan_batch(configurator.Config(), 3) == 1                    # 0: one micro-batch per process


@pytest.mark.parametrize("args, match", [
    (["--min_lr=1e-2", "--learning_rate=1e-3"], "min_lr=0.01 is above learning_rate=0.001"),
    (["--warmup_iters=100", "--lr_decay_iters=50"], "lr_decay_iters=50 must exceed warmup_iters=100"),
    (["--grad_accum_steps=4"], "'grad_accum_steps' .* is not a setting: it is derived: set total_batch_size"),
])
def test_schedule_and_batch_errors(args, match):
    with pytest.raises(ValueError, match=match):
        configurator.load_config(args)


def test_warmup_longer_than_the_run_is_a_warning(byte_data, tmp_path, capsys):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=2", "--warmup_iters=30"))
    assert "warning: warmup_iters=30 >= max_iters=2: the learning rate never reaches" in capsys.readouterr().out


def test_a_short_run_resumes_and_a_resume_takes_the_shape(byte_data, tmp_path, capsys):
    """A run shorter than its warm-up (the schedule never decays) resumes with the same command; shape keys
    not given again come from the checkpoint."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--warmup_iters=30", "--n_embd=48", "--n_head=4"))
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=6", "--warmup_iters=30", "--n_embd=48", "--n_head=4",
                         "--init_from=resume"))
    assert json.load(open(tmp_path / "config.json"))["lr_decay_iters"] == 0     # never resolved: still in warm-up
    assert "decays until" not in capsys.readouterr().out                        # it decays to the end of the run
    summary = train.main([a for a in tiny_args(byte_data, tmp_path, "--max_iters=40", "--warmup_iters=30",
                                               "--init_from=resume") if not a.startswith(("--n_embd", "--n_head"))])
    cfg = json.load(open(tmp_path / "config.json"))
    assert summary["val_loss"] is not None and cfg["n_embd"] == 48 and cfg["lr_decay_iters"] == 40


def test_resume_messages_name_only_what_applies(byte_data, tmp_path, capsys):
    """A resume checks the schedule it continues with, not the command's defaults (no warm-up warning
    from a default warmup_iters the checkpoint replaces), and '(set explicitly)' marks only keys the
    command set."""
    short = [a for a in tiny_args(byte_data, tmp_path / "a", "--max_iters=3") if not a.startswith("--warmup_iters")]
    train.main(short + ["--warmup_iters=2"])
    capsys.readouterr()
    # default warmup_iters=30
    train.main([a.replace("--max_iters=3", "--max_iters=8") for a in short] + ["--init_from=resume"])
    out = capsys.readouterr().out
    assert "resume: max_iters 3 -> 8" in out and "warning: warmup_iters" not in out and "(set explicitly)" not in out
    # a run that ended in warm-up (lr_decay_iters unresolved), resumed with another warm-up
    train.main(tiny_args(byte_data, tmp_path / "b", "--max_iters=3", "--warmup_iters=30"))
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path / "b", "--max_iters=8", "--warmup_iters=1", "--init_from=resume"))
    out = capsys.readouterr().out
    assert "resume: warmup_iters 30 -> 1 (set explicitly)" in out
    assert "resume: lr_decay_iters 0 -> 8 (0 resolved: decay to the end of the run)" in out


# -----------------------------------------------------------------------------
# the disk


def test_a_full_disk_while_saving_stops_in_one_line_and_keeps_the_checkpoint(byte_data, tmp_path, monkeypatch):
    """torch.save on a full disk fails with "basic_ios::clear: iostream error": the run stops with one line
    naming the path and the cause, and the previous checkpoint survives, with no temp file beside it."""
    from speedgpt import checkpoint
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    before = (tmp_path / "ckpt.pt").read_bytes()

    def full_disk(obj, f):
        f.write(b"part of a checkpoint")
        raise RuntimeError("basic_ios::clear: iostream error")
    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    monkeypatch.setattr(train, "check_disk", lambda *a: "checkpoints: (the disk check: tests/test_checkpoint.py)")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 10**12, 0))
    with pytest.raises(train.RunStopped, match=r"^error: step 8: could not write .*ckpt_step000008.pt: "
                                               r"no space left on the device "
                                               r"\(0 MB free\); .*ckpt.pt still holds step 4: resume from it") as e:
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=8", "--init_from=resume"))
    assert e.value.exit_code == 1 and "\n" not in str(e.value)
    assert (tmp_path / "ckpt.pt").read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def test_an_out_dir_that_cannot_be_written_is_refused_before_any_work(byte_data, tmp_path, monkeypatch):
    import errno
    import tempfile
    from speedgpt import checkpoint

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(checkpoint.tempfile, "TemporaryFile", read_only)
    never = tmp_path / "never" / "stdlib_byte"          # would be prepared on first use
    with pytest.raises(ValueError, match=r"out_dir='.*/o' is not writable: read-only filesystem"):
        train.main(tiny_args(never, tmp_path / "o"))
    assert not never.exists()
    monkeypatch.setattr(checkpoint.tempfile, "TemporaryFile", tempfile.TemporaryFile)
    monkeypatch.setattr(checkpoint.os, "makedirs",
                        lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
    with pytest.raises(ValueError, match="is not writable: no space left on the device"):
        train.main(tiny_args(byte_data, tmp_path / "o2"))
