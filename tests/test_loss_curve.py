"""A short CPU run's losses against a stored result, as torchtitan's loss_compare.py --assert-equal does:
a refactor that changes what the trainer computes fails here at once.

The run is the quickstart's model, optimizer and schedule (train.py's defaults) on the committed tiny
Shakespeare text (byte tokenizer, so the data is the same on every machine), for its first 30 steps.
The stored losses came from this test's own run; on the build of torch and the CPU kind they were
recorded with, every loss must match to the last bit. The run uses one CPU thread: a sum split over
threads rounds differently with their number. Elsewhere (another torch, another CPU's kernels)
floating-point sums round differently, so there the losses must agree to 1e-4 relative.

    python -m pytest tests/test_loss_curve.py              # compare
    UPDATE_LOSS_CURVE=1 python -m pytest tests/test_loss_curve.py   # re-record, after a change meant to alter them
"""
import json
import os

import pytest
import torch

import data
import train
from conftest import ROOT, read_metrics

STORED = os.path.join(ROOT, "tests", "loss_curve.json")
ARGS = ["--max_iters=30", "--lr_decay_iters=500", "--eval_interval=10", "--eval_tokens=16384", "--log_interval=1",
        "--device=cpu"]        # with lr_decay_iters=500 the schedule is the 500-step quickstart's


def environment():
    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability()}


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_quickstart_losses_match_the_stored_run(tmp_path, one_thread):
    data.prepare(os.path.join(ROOT, "data_sources", "shakespeare"), str(tmp_path / "data"), "byte", workers=1)
    train.main([f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}", *ARGS])
    rows = read_metrics(tmp_path / "out")
    got = {"loss": [r["loss"] for r in rows if "loss" in r],
           "val_loss": [r["val_loss"] for r in rows if "val_loss" in r]}
    assert len(got["loss"]) == 30 and len(got["val_loss"]) == 4
    if os.environ.get("UPDATE_LOSS_CURVE"):
        with open(STORED, "w") as f:
            json.dump({"args": ARGS, **environment(), **got}, f, indent=1)
        pytest.skip(f"recorded {STORED}")
    stored = json.load(open(STORED))
    assert stored["args"] == ARGS, "the stored run used other arguments: re-record it (UPDATE_LOSS_CURVE=1)"
    exact = {"torch": stored["torch"], "cpu": stored["cpu"]} == environment()
    for key in ("loss", "val_loss"):
        for i, (a, b) in enumerate(zip(got[key], stored[key], strict=True)):
            if exact:
                assert a == b, f"{key} #{i}: {a!r}, stored {b!r} (same torch and CPU kind: must be bit-equal)"
            else:
                assert a == pytest.approx(b, rel=1e-4), f"{key} #{i}: {a!r}, stored {b!r} ({environment()} vs {stored})"
