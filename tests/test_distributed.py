"""torchrun with 2 CPU processes (gloo): DDP and FSDP2 give the single-process result."""
import os
import subprocess
import sys

import pytest
import torch

import train
from conftest import ROOT, read_metrics, tiny_args


def torchrun(args, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py", *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def common(data_dir, out_dir, *extra):
    return tiny_args(data_dir, out_dir, "--batch_size=2", "--grad_accum_steps=4", "--max_iters=2", "--eval_interval=2",
                     "--dropout=0.0", *extra)


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_one_optimizer_step_equals_single_process(short_data, tmp_path, parallelism):
    """Same global batch (2 rows x 4 micro-steps): 2 ranks x 2 micro-steps == 1 process x 4. Padded
    rows make the micro-batches' real-token counts differ, so the loss weighting is exercised."""
    train.main(common(short_data, tmp_path / "single", "--packing=False"))
    out = torchrun(common(short_data, tmp_path / "multi", "--packing=False", f"--parallelism={parallelism}"))
    assert "grad_accum_steps 2 per process" in out and "x 2 |" in out
    single = torch.load(tmp_path / "single" / "ckpt.pt", weights_only=True)
    multi = torch.load(tmp_path / "multi" / "ckpt.pt", weights_only=True)
    assert set(single["model"]) == set(multi["model"])                   # no module. prefixes
    for name, p in single["model"].items():
        torch.testing.assert_close(multi["model"][name], p, rtol=1e-5, atol=1e-6, msg=name)
    losses = [[r["loss"] for r in read_metrics(d) if "loss" in r] for d in (tmp_path / "single", tmp_path / "multi")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_distributed_resume_continues_exactly(short_data, tmp_path):
    args = ["--max_iters=4", "--lr_decay_iters=4", "--eval_interval=2"]
    torchrun(common(short_data, tmp_path / "full", *args))
    torchrun(common(short_data, tmp_path / "part", *args, "--max_iters=2"))
    torchrun(common(short_data, tmp_path / "part", *args, "--init_from=resume"))
    full = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "full") if "loss" in r}
    part = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "part") if "loss" in r}
    assert sorted(part) == [0, 1, 2, 3] and all(part[s] == full[s] for s in (2, 3))


def test_world_size_must_divide_grad_accum(short_data, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           *common(short_data, tmp_path, "--grad_accum_steps=3")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "not divisible by the 2 processes" in proc.stdout + proc.stderr
