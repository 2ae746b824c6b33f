"""speedgpt/evaluation.py: time to a target validation loss (target_val_loss) on the CPU."""
import json

import pytest

import train
from conftest import read_metrics, tiny_args


def test_the_run_stops_at_the_first_evaluation_at_or_below_the_target(byte_data, tmp_path, capsys):
    args = ["--max_iters=12", "--eval_interval=2", "--save_checkpoints=False"]
    train.main(tiny_args(byte_data, tmp_path / "full", *args))
    vals = {r["step"]: r["val_loss"] for r in read_metrics(tmp_path / "full") if "val_loss" in r}
    first = next(s for s in sorted(vals) if s > 0 and vals[s] < min(vals[t] for t in vals if t < s))
    target = vals[first]                                  # reached exactly there, not before
    assert all(v > target for s, v in vals.items() if s < first)
    capsys.readouterr()
    summary = train.main(tiny_args(byte_data, tmp_path / "target", *args, f"--target_val_loss={target}"))
    out = capsys.readouterr().out
    reached = summary["target_reached"]
    assert summary["steps"] == first and reached["step"] == first and reached["val_loss"] == target
    assert reached["tokens"] == first * 4 * 64                             # batch 4 x block 64, packed: no padding
    assert reached["train_seconds"] > 0
    assert f"step {first}: target val loss reached ({target:.4f}) at step {first}" in out
    assert f"target val loss reached at step {first}: {first * 256:,} tokens" in out.splitlines()[-1]
    saved = json.loads((tmp_path / "target" / "summary.json").read_text())
    assert saved["target_reached"] == reached and saved["target_val_loss"] == target
    assert max(r["step"] for r in read_metrics(tmp_path / "target")) == first


def test_a_target_never_reached_says_so(byte_data, tmp_path, capsys):
    summary = train.main(tiny_args(byte_data, tmp_path, "--max_iters=2", "--target_val_loss=0.01",
                                   "--save_checkpoints=False"))
    assert summary["target_reached"] is None and summary["steps"] == 2
    assert "target val loss not reached" in capsys.readouterr().out.splitlines()[-1]


def test_a_target_without_evaluations_is_refused(byte_data, tmp_path):
    with pytest.raises(ValueError, match=r"target_val_loss=3.0 stops at the first evaluation .*: it needs eval_tokens > 0"):
        train.main(tiny_args(byte_data, tmp_path, "--target_val_loss=3.0", "--eval_tokens=0"))
