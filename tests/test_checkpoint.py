"""speedgpt/checkpoint.py and the writes of a long run (CPU): checkpoint history (keep_checkpoints, the best
one, resume_from an older step), the disk check, torn logs, and a full disk at any write ending the run in one
line."""
import json
import os
import resource
import signal
import subprocess
import sys

import pytest

import train
from conftest import ROOT, read_metrics, tiny_args
from speedgpt import checkpoint


def losses(out_dir):
    return {r["step"]: r["loss"] for r in read_metrics(out_dir) if "loss" in r}


def test_the_last_checkpoints_are_kept_the_latest_and_the_best_named(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=10", "--eval_interval=2", "--keep_checkpoints=2"))
    steps = checkpoint.saved_steps(str(tmp_path))
    assert sorted(steps) == [8, 10]
    assert os.path.samefile(tmp_path / "ckpt.pt", steps[10])
    vals = {r["step"]: r["val_loss"] for r in read_metrics(tmp_path) if "val_loss" in r}
    best = min((v, s) for s, v in vals.items() if s > 0)[1]           # step 0 is evaluated, never saved
    assert checkpoint.step_of(str(tmp_path / "ckpt_best.pt")) == best
    assert checkpoint.load_checkpoint(str(tmp_path / "ckpt_best.pt"))["step"] == best
    assert not list(tmp_path.glob("*.tmp"))


def test_resume_from_an_older_step_continues_as_the_straight_run(byte_data, tmp_path, capsys):
    """resume_from=4 after a run to step 8: steps 4-7 again, with the straight run's losses; metrics.jsonl keeps
    each step once; the rewind is said, and W&B would get a new run."""
    straight = tmp_path / "straight"
    train.main(tiny_args(byte_data, straight, "--max_iters=8", "--eval_interval=2", "--keep_checkpoints=5"))
    want = losses(straight)
    out = tmp_path / "run"
    train.main(tiny_args(byte_data, out, "--max_iters=8", "--eval_interval=2", "--keep_checkpoints=5"))
    capsys.readouterr()
    train.main(tiny_args(byte_data, out, "--max_iters=8", "--eval_interval=2", "--keep_checkpoints=5",
                         "--resume_from=4"))
    text = capsys.readouterr().out
    assert "resume: step 4 is older than the latest checkpoint (step 8): metrics.jsonl's rows after it are dropped, " \
           "W&B gets a new run" in text
    rows = read_metrics(out)
    assert [r["step"] for r in rows if "loss" in r] == list(range(8))
    assert losses(out) == want
    with pytest.raises(FileNotFoundError, match=r"resume_from=3: .* has no checkpoint of step 3 \(its steps: 2, 4, 6, 8"):
        train.main(tiny_args(byte_data, out, "--resume_from=3"))
    with pytest.raises(ValueError, match="resume_from='4' resumes a run: it cannot go with init_from='scratch'"):
        train.main(tiny_args(byte_data, out, "--resume_from=4", "--init_from=scratch"))


def test_the_last_good_step_is_found_without_loading_a_checkpoint(byte_data, tmp_path, monkeypatch):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a whole checkpoint"))
    assert checkpoint.last_good(str(tmp_path / "ckpt.pt")).startswith(f"{tmp_path / 'ckpt.pt'} still holds step 4")


def test_a_disk_too_small_for_the_checkpoints_is_refused_before_any_step(byte_data, tmp_path, monkeypatch):
    import shutil
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage._replace(free=10_000))
    with pytest.raises(ValueError, match=r"has 0.0 GB free but keep_checkpoints=3 needs up to ~0.0 GB .* lower "
                                         r"--keep_checkpoints, or choose another --out_dir"):
        train.main(tiny_args(byte_data, tmp_path))
    assert not (tmp_path / "metrics.jsonl").exists() or not read_metrics(tmp_path)


def test_a_torn_last_metrics_line_is_dropped_on_resume(byte_data, tmp_path, capsys):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 4.1, "lr"')                     # a crash mid-record
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=6", "--init_from=resume"))
    assert f"resume: the last line of {tmp_path / 'metrics.jsonl'} was cut short" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(tmp_path) if "loss" in r] == list(range(6))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    lines.insert(2, "not json")
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl line 3 is not JSON .*: fix or delete that line"):
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=8", "--init_from=resume"))


def run_with_file_limit(args, limit, tmp_path):
    """train.py in a subprocess whose files may not grow past `limit` bytes (RLIMIT_FSIZE: the write that
    passes it fails as a full disk would, EFBIG instead of ENOSPC)."""
    def limit_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)                 # fail the write instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                          preexec_fn=limit_files, env=env, timeout=300)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE as a full disk: Linux")
def test_a_full_disk_while_logging_ends_the_run_in_one_line(byte_data, tmp_path):
    out = tmp_path / "out"
    train.main(tiny_args(byte_data, out, "--max_iters=4"))            # a checkpoint at step 4
    size = (out / "metrics.jsonl").stat().st_size
    p = run_with_file_limit(tiny_args(byte_data, out, "--max_iters=60", "--init_from=resume", "--eval_interval=100"),
                            size + 6000, tmp_path)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"could not write {out / 'metrics.jsonl'}: file too large" in errors[0]
    assert f"{out / 'ckpt.pt'} still holds step 4" in errors[0]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]   # no torn record
    assert rows and rows[-1]["step"] > 4
    summary = out / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE as a full disk: Linux")
def test_a_full_disk_at_a_checkpoint_ends_the_run_in_one_line_and_keeps_the_last_one(byte_data, tmp_path):
    out = tmp_path / "out"
    train.main(tiny_args(byte_data, out, "--max_iters=4"))
    before = (out / "ckpt.pt").read_bytes()
    p = run_with_file_limit(tiny_args(byte_data, out, "--max_iters=8", "--init_from=resume"), 200_000, tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "could not write" in errors[0] and "ckpt_step000008.pt: file too large" in errors[0]
    assert f"{out / 'ckpt.pt'} still holds step 4" in errors[0]
    assert (out / "ckpt.pt").read_bytes() == before and not list(out.glob("*.tmp"))
    summary = json.loads((out / "summary.json").read_text())             # whole, not 0 bytes
    assert summary["stopped"].startswith("error: step 8: could not write")
