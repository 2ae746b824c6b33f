"""speedgpt/distributed.py on the CPU. torchrun with 2 CPU processes (gloo): DDP and FSDP2 give the
single-process result. One process: a signal saves a checkpoint the run resumes from exactly, a step that fails
after a signal names the process group, the launch environment, and the batch plan (every README command's)."""
import json
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
from conftest import ROOT, losses, on, read_metrics, tiny_args
from speedgpt import checkpoint
from speedgpt import distributed
from speedgpt.distributed import plan_batch, setup_processes

# -----------------------------------------------------------------------------
# torchrun with gloo: each of these tests starts several processes, so each is marked slow (the
# one-process tests at the end are not)


def torchrun(args, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py",
           *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def common(data_dir, out_dir, *extra):
    # 512 tokens = 4 micro-batches of 2 x 64
    return tiny_args(data_dir, out_dir, "--batch_size=2", "--total_batch_size=512", "--max_iters=2",
                     "--eval_interval=2", "--dropout=0.0", "--device=cpu", *extra)


@pytest.mark.slow
@pytest.mark.parametrize("parallelism, nproc, extra", [("ddp", 2, ()), ("ddp", 4, ()), ("fsdp", 2, ()),
                                                        ("fsdp", 2, ("--fused_ce=True",))])
def test_one_optimizer_step_equals_single_process(short_data, tmp_path, parallelism, nproc, extra):
    """Same global batch (2 rows x 4 micro-steps): N ranks x 4/N micro-steps == 1 process x 4. Padded
    rows make the micro-batches' real-token counts differ, so the loss weighting is exercised. With
    fused_ce the sharded run's head gradient comes from LinearCrossEntropy, the single run's from autograd."""
    train.main(common(short_data, tmp_path / "single", "--packing=False"))
    out = torchrun(common(short_data, tmp_path / "multi", "--packing=False", f"--parallelism={parallelism}", *extra),
                   nproc)
    assert f"grad_accum_steps {4 // nproc} per process" in out and f"x {nproc} |" in out
    single = torch.load(tmp_path / "single" / "ckpt.pt", weights_only=True)
    multi = torch.load(tmp_path / "multi" / "ckpt.pt", weights_only=True)
    assert set(single["model"]) == set(multi["model"])                   # no module. prefixes
    for name, p in single["model"].items():
        torch.testing.assert_close(multi["model"][name], p, rtol=1e-5, atol=1e-6, msg=name)
    losses = [[r["loss"] for r in read_metrics(d) if "loss" in r] for d in (tmp_path / "single", tmp_path / "multi")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.slow
def test_fsdp_writes_a_checkpoint_in_the_background(short_data, tmp_path):
    """async_checkpoint (the default) under FSDP: a checkpoint before the last (written from a thread) failed with
    'Attempted to access the data pointer on an invalid python storage' (own_copy read the storage of FSDP's
    sharded DTensor parameters), a traceback at the first evaluation; the last one, written in the loop, passed."""
    torchrun(common(short_data, tmp_path, "--parallelism=fsdp", "--max_iters=4", "--lr_decay_iters=4"))
    assert {r["step"] for r in read_metrics(tmp_path) if "val_loss" in r} == {0, 2, 4}
    assert torch.load(tmp_path / "ckpt_step000002.pt", weights_only=True)["step"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_distributed_resume_continues_exactly(short_data, tmp_path, optimizer):
    """With dropout, each rank has a random stream of its own (the same initial weights, other dropout
    masks); the checkpoint keeps every rank's stream, so a resume at the same world size is exact. Muon's
    momentum, whole on every rank while the Newton-Schulz work is split, resumes exactly too."""
    args = ["--max_iters=4", "--lr_decay_iters=4", "--eval_interval=2", "--dropout=0.1",
            f"--optimizer={optimizer}"]
    torchrun(common(short_data, tmp_path / "full", *args))
    torchrun(common(short_data, tmp_path / "part", *args, "--max_iters=2"))
    rng = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=True)["rng"]["ranks"]
    assert len(rng) == 2 and not torch.equal(rng[0][0], rng[1][0])
    torchrun(common(short_data, tmp_path / "part", *args, "--init_from=resume"))
    full = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "full") if "loss" in r}
    part = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "part") if "loss" in r}
    assert sorted(part) == [0, 1, 2, 3] and all(part[s] == full[s] for s in (2, 3))


@pytest.mark.slow
def test_world_size_must_divide_the_batch(short_data, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           *common(short_data, tmp_path, "--total_batch_size=384")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "total_batch_size=384 tokens is not a multiple of batch_size x block_size" \
        " x processes = 2 x 64 x 2 = 256" in out, out
    assert out.count("error: total_batch_size") == 1 and \
        "Traceback (most recent call last)" not in out.split("error:")[0]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="no flock: out_dir is not locked on Windows")
def test_an_out_dir_another_run_holds_is_refused_under_torchrun_in_one_line(short_data, tmp_path):
    """Rank 0 holds out_dir's lock; under torchrun every rank learns of its refusal and stops with it, where the
    other ranks ran on into a barrier that failed with a traceback of its own once rank 0 left."""
    import fcntl
    (tmp_path / "run").mkdir()
    fd = os.open(tmp_path / "run", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)                      # the run that trains there
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
               *map(str, common(short_data, tmp_path / "run"))]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.close(fd)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count("error: another run is training in out_dir=") == 1, out[-3000:]
    assert "[rank1]" not in out and "Traceback" not in out.split("error:")[0], out[-3000:]
    assert "terminate called" not in out and "SIGABRT" not in out, out[-3000:]     # gloo's threads at exit, 1 in 6
    assert os.listdir(tmp_path / "run") == []


@pytest.mark.slow
def test_sigterm_under_torchrun_stops_every_rank_at_one_step(short_data, tmp_path):
    """torchrun forwards SIGTERM to its workers: they agree on a step, rank 0 saves, the resume matches."""
    import signal
    import time
    args = ["--max_iters=60", "--lr_decay_iters=60", "--eval_interval=30"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           *map(str, common(short_data, tmp_path / "cut", *args))]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 300
    while not (tmp_path / "cut" / "metrics.jsonl").exists() or len(read_metrics(tmp_path / "cut", running=True)) < 3:
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert err.count("SIGTERM: stopped after step") == 1, err[-3000:]
    step = torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)["step"]
    torchrun(common(short_data, tmp_path / "cut", *args, "--init_from=resume"))
    torchrun(common(short_data, tmp_path / "full", *args))
    cut, full = ({r["step"]: r["loss"] for r in read_metrics(d) if "loss" in r}
                 for d in (tmp_path / "cut", tmp_path / "full"))
    assert sorted(cut) == list(range(60)) and 0 < step < 60
    assert cut == pytest.approx(full, rel=1e-6)


@pytest.mark.slow
def test_validation_is_the_same_for_any_launch(short_data, tmp_path):
    """The same weights give the same validation loss on 1 or 2 processes and at any micro-batch: the same
    val rows are evaluated (eval_tokens: 1,000 tokens are 16 rows of 64, which no batch here divides),
    split between the ranks. Before, the rows evaluated were eval_iters x batch_size x processes."""
    base = ["--max_iters=0", "--eval_tokens=1000", "--device=cpu"]
    one = train.main(tiny_args(short_data, tmp_path / "a", *base, "--batch_size=4"))["val_loss"]
    small = train.main(tiny_args(short_data, tmp_path / "b", *base, "--batch_size=3"))["val_loss"]
    torchrun(tiny_args(short_data, tmp_path / "c", *base, "--batch_size=3"))
    two = json.load(open(tmp_path / "c" / "summary.json"))["val_loss"]
    assert small == pytest.approx(one, rel=1e-6) and two == pytest.approx(one, rel=1e-6)


@pytest.mark.slow
def test_a_resume_on_fewer_processes_keeps_the_step(short_data, tmp_path, capsys):
    """total_batch_size=0 (one micro-batch per process) on 2 processes, resumed on 1: the step keeps the
    checkpoint's 2 x 2 x 64 tokens (2 micro-steps here), so the run goes on as it would have on 2."""
    args = ["--batch_size=2", "--max_iters=4", "--lr_decay_iters=4", "--eval_interval=2", "--dropout=0.0",
            "--device=cpu", "--packing=False"]                    # total_batch_size: the default, 0
    torchrun(tiny_args(short_data, tmp_path / "two", *args))
    torchrun(tiny_args(short_data, tmp_path / "cut", *args, "--max_iters=2"))
    shutil.copytree(tmp_path / "cut", tmp_path / "asked")
    capsys.readouterr()
    train.main(tiny_args(short_data, tmp_path / "cut", *args, "--init_from=resume"))
    assert "total_batch_size=0 keeps the checkpoint's step of 256 tokens" in capsys.readouterr().out
    train.main(tiny_args(short_data, tmp_path / "asked", *args, "--init_from=resume", "--total_batch_size=0"))
    assert "total_batch_size=0 makes a step 128 tokens here; the checkpoint's steps were 256" in capsys.readouterr().out
    two, cut = ({r["step"]: r["loss"] for r in read_metrics(tmp_path / d) if "loss" in r} for d in ("two", "cut"))
    assert sorted(cut) == [0, 1, 2, 3] and [cut[s] for s in (2, 3)] == pytest.approx([two[s] for s in (2, 3)], rel=1e-5)


@pytest.mark.slow
def test_muon_under_ddp_equals_single_process_and_fsdp_is_refused(short_data, tmp_path):
    """optimizer=muon works under DDP, each rank orthogonalising its share of the matrices (the updates
    all-gathered; tests/test_optim.py: the single process's step bit for bit on the same gradients): the
    single-process result; FSDP, which shards the matrices Newton-Schulz needs whole, is refused in one line.
    torch.optim.Muon runs Newton-Schulz in bfloat16, which turns the all-reduce's last-bit differences into a
    few percent of a matrix's update (measured: 1.7-3.0%), and the next AdamW step follows them (0.01-0.06%):
    so the updates are compared, each to within 10% (Muon) or 0.5% (AdamW). A rank that stepped on its own
    gradient, or skipped the sync, would be off by about 100%."""
    from model import GPT, GPTConfig
    args = ("--packing=False", "--optimizer=muon", "--lr_schedule=wsd")       # 2 steps, as the AdamW test above
    train.main(common(short_data, tmp_path / "single", *args))
    out = torchrun(common(short_data, tmp_path / "multi", *args))
    assert "Newton-Schulz split over 2 processes (4-4 matrices each)" in out, out
    single, multi = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True) for d in ("single", "multi"))
    torch.manual_seed(single["config"]["seed"])                              # the initial weights, as train.py
    start = GPT(GPTConfig.from_dict(single["config"], single["meta"]["vocab_size"])).state_dict()
    for name, p in single["model"].items():
        ours, theirs = p - start[name], multi["model"][name] - start[name]
        bound = 0.1 if name.endswith(".weight") and p.dim() == 2 and ".h." in name else 5e-3   # Muon's matrices
        assert (theirs - ours).norm() <= bound * ours.norm(), (name, ((theirs - ours).norm() / ours.norm()).item())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           *map(str, common(short_data, tmp_path / "fsdp", "--optimizer=muon", "--parallelism=fsdp"))]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0 and "error: optimizer='muon' needs whole matrices for its Newton-Schulz step, and " \
                                   "FSDP shards them: use --parallelism=ddp, or --optimizer=adamw" in proc.stderr


# -----------------------------------------------------------------------------
# one CPU process: signals, the launch environment, the batch plan


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_a_checkpoint_and_resume_matches(byte_data, tmp_path, signum):
    """The cut run starts in a process of its own and resumes in this one, so both use one thread: with two,
    a loaded machine's BLAS may split a sum differently from one process to the next (the last bits of a loss
    then differ, in steps before the cut too)."""
    common = ["--max_iters=300", "--eval_interval=100", "--lr_decay_iters=300", "--dropout=0.1"]
    cmd = [sys.executable, "train.py", *map(str, tiny_args(byte_data, tmp_path / "cut", *common))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _signal_and_resume(byte_data, tmp_path, signum, common, cmd)
    finally:
        torch.set_num_threads(threads)


def _signal_and_resume(byte_data, tmp_path, signum, common, cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while not (tmp_path / "cut" / "metrics.jsonl").exists() or len(read_metrics(tmp_path / "cut", running=True)) < 2:
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(random.uniform(0, 1.0))                  # a random moment of the training
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, (out[-2000:], err)
    m = re.search(r"stopped after step (\d+) \([\d,]+ steps done\) with a checkpoint in .*ckpt.pt; continue with "
                  r"the same command and --init_from=resume", err)
    assert m and "Traceback" not in err, err
    assert torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)["step"] == int(m.group(1)) + 1
    assert not os.path.exists(tmp_path / "cut" / "ckpt.pt.tmp")
    train.main(tiny_args(byte_data, tmp_path / "cut", *common, "--init_from=resume"))
    train.main(tiny_args(byte_data, tmp_path / "whole", *common))
    steps = [r["step"] for r in read_metrics(tmp_path / "cut") if "loss" in r]
    assert steps == list(range(300))                    # every step once
    assert losses(tmp_path / "cut") == losses(tmp_path / "whole")


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_a_second_ctrl_c_aborts_at_once_in_one_line_naming_the_last_checkpoint(byte_data, tmp_path, monkeypatch,
                                                                                first):
    """Ctrl-C after Ctrl-C, or after a SIGTERM (timeout, a scheduler): the message of the first promised it."""
    set_lr = train.optim.set_lr

    def ctrl_c_twice_at_step_6(optimizer, step, cfg, *args):
        if step == 6:
            os.kill(os.getpid(), first)
            os.kill(os.getpid(), signal.SIGINT)
        return set_lr(optimizer, step, cfg, *args)
    monkeypatch.setattr(train.optim, "set_lr", ctrl_c_twice_at_step_6)
    with pytest.raises(train.RunStopped, match=r"^SIGINT: aborted at once \(a second Ctrl-C\) with 6 steps done, without "
                                               r"saving; .*ckpt.pt still holds step 4: resume from it") as e:
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=12"))
    assert e.value.exit_code == 130 and sorted(checkpoint.saved_steps(str(tmp_path))) == [4]


def test_a_second_ctrl_c_names_no_checkpoint_of_an_earlier_run(byte_data, tmp_path, monkeypatch):
    """--init_from=scratch over an earlier run's ckpt.pt, aborted before its first save: the stop line and the
    summary name no checkpoint (the earlier run's is not this run's to resume); after a save, they name it."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))                    # the earlier run: step 4
    set_lr = train.optim.set_lr

    def ctrl_c_twice_at(step_at):
        def f(optimizer, step, cfg, *args):
            if step == step_at:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
            return set_lr(optimizer, step, cfg, *args)
        return f
    monkeypatch.setattr(train.optim, "set_lr", ctrl_c_twice_at(2))
    with pytest.raises(train.RunStopped, match=r"with 2 steps done, without saving; no checkpoint of this run was "
                                               r"written \(.*ckpt.pt is an earlier run's\)$"):
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=12", "--init_from=scratch"))
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["checkpoint"] is None and summary["steps"] == 2
    monkeypatch.setattr(train.optim, "set_lr", ctrl_c_twice_at(6))
    with pytest.raises(train.RunStopped, match=r"with 6 steps done, without saving; .*ckpt.pt still holds step 4: "):
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=12", "--init_from=scratch"))
    assert json.load(open(tmp_path / "summary.json"))["checkpoint"].endswith("ckpt.pt")


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


def test_device_auto_is_cuda_then_mps_then_the_cpu(monkeypatch):
    """Apple's MPS (patched in: no Mac here) is picked after CUDA and named by --device=mps; a one-process launch."""
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert setup_processes(configurator.Config()).device == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert setup_processes(configurator.Config()).device == torch.device("mps")
    assert setup_processes(configurator.Config(device="mps")).device == torch.device("mps")
    assert setup_processes(configurator.Config(device="cpu")).device == torch.device("cpu")


def test_a_device_that_is_not_here_names_the_way_out(monkeypatch):
    """--device=cuda without a GPU, --device=mps without Apple's MPS or under torchrun: one line, --device=cpu."""
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^device='cuda' but (this torch is a CPU build|no CUDA GPU is visible): "
                                         r"run on the CPU with --device=cpu \(or leave --device out"):
        setup_processes(configurator.Config(device="cuda"))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^device='mps' but Apple's MPS backend is not available here .*: use "
                                         r"--device=cpu$"):
        setup_processes(configurator.Config(device="mps"))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="x", MASTER_PORT="1").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=r"^device='mps' runs one process .*: launch it without torchrun, or use "
                                         r"--device=cpu \(gloo\)$"):
        setup_processes(configurator.Config(device="mps"))


def test_bfloat16_on_mps_needs_macos_14(monkeypatch):
    cfg = configurator.Config(dtype="bfloat16")
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: (major, minor) <= (13, 5))
    with pytest.raises(ValueError, match=r"^dtype='bfloat16' on MPS needs macOS 14 or newer; use float16, or float32$"):
        distributed.check(cfg, on("mps"))
    distributed.check(configurator.Config(dtype="float16"), on("mps"))
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: True)
    distributed.check(cfg, on("mps"))


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
    nanogpt = os.environ.get("NANOGPT_DIR")            # docs/nanogpt.md's commands read a nanoGPT checkout's files
    for world, args in cmds:
        args = [a for a in args if not a.startswith("--init_from=../nanoGPT/")]      # a run's checkpoint: its shape
        if any("../nanoGPT/" in a for a in args):
            if not nanogpt:
                continue
            args = [a.replace("../nanoGPT", nanogpt) for a in args]
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
