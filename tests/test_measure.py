"""speedgpt/measure.py on the CPU: the metrics file (every key, tokens/s and MFU, each step and evaluation once
across a resume, a torn last line dropped, a full disk while logging in one line, summary.json and config.json
that cannot be written), W&B offline (and one that cannot start), and the profiler's table and trace."""
import json
import os
import shutil
import signal
import sys
import time

import pytest
import torch

import train
from conftest import read_metrics, run_with_file_limit, tiny_args
from model import GPT, GPTConfig


def test_the_clock_waits_for_apples_gpu(monkeypatch):
    """sync() before each reading of the clock: MPS queues its work as CUDA does (patched in: no Mac here)."""
    from speedgpt import measure
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("mps"))
    measure.sync(torch.device("cpu"))
    measure.sync(torch.device("mps"))
    assert calls == ["mps"]


def test_metrics_timing_and_checkpoint(byte_data, tmp_path):
    summary = train.main(tiny_args(byte_data, tmp_path, "--peak_flops=1e12"))
    rows = [r for r in read_metrics(tmp_path) if "loss" in r]
    for key in ("step", "loss", "lr", "step_ms", "tokens_per_sec", "mfu", "mem_gb", "pad_frac"):
        assert all(key in r for r in rows)
    assert rows[0]["tokens_per_sec"] is None                        # warm-up step: untimed
    timed = [r for r in rows if r["tokens_per_sec"] is not None]
    assert len(timed) == 7 and all(r["mfu"] > 0 for r in timed)
    fpt = GPT(GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=2, n_embd=32)).flops_per_token()
    for r in timed:
        assert r["mfu"] == pytest.approx(fpt * r["tokens_per_sec"] / 1e12)
        assert r["mfu_fp8"] == pytest.approx(r["mfu"])                 # no FLOP in FP8: the same figure
    assert summary["median_tokens_per_sec"] in [r["tokens_per_sec"] for r in timed]
    assert summary["median_mfu_fp8"] == pytest.approx(summary["median_mfu"])
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 8 and set(ckpt) >= {"model", "optimizer", "loader", "rng", "config", "meta"}
    assert not os.path.exists(tmp_path / "ckpt.pt.tmp")
    assert json.load(open(tmp_path / "config.json"))["n_embd"] == 32


def test_resume_keeps_the_checkpoint_steps_evaluation_once(byte_data, tmp_path):
    """The evaluation a run made at its last step, before saving, stays in metrics.jsonl after a resume:
    once, whether the resumed run evaluates that step again (same eval_interval) or not (another)."""
    common = ["--max_iters=8", "--lr_decay_iters=8", "--eval_interval=4"]
    for name, resume in (("same", ["--eval_interval=4"]), ("other", ["--eval_interval=100"])):
        train.main(tiny_args(byte_data, tmp_path / name, *common))
        before = [r for r in read_metrics(tmp_path / name) if "val_loss" in r]
        train.main(tiny_args(byte_data, tmp_path / name, *common, *resume, "--max_iters=10", "--init_from=resume"))
        evals = {}
        for r in read_metrics(tmp_path / name):
            if "val_loss" in r:
                evals.setdefault(r["step"], []).append(r["val_loss"])
        assert [r["step"] for r in before] == [0, 4, 8] and evals[8] == [before[-1]["val_loss"]], (name, evals)
        assert sorted(evals) == [0, 4, 8, 10]


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


def _train_subprocess(args):
    import subprocess
    from conftest import ROOT
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_summary_that_cannot_be_written_ends_a_finished_run_non_zero_in_one_line(byte_data, tmp_path):
    """The run trains to the end and saves its checkpoint, but summary.json cannot be written (here a folder
    stands in its place, as a full disk would fail the write): exit status 1, one line naming the file, the
    cause and the checkpoint that holds the run, no traceback."""
    out = tmp_path / "out"
    (out / "summary.json").mkdir(parents=True)
    p = _train_subprocess(tiny_args(byte_data, out, "--max_iters=4"))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"could not write {out / 'summary.json'}:" in errors[0], p.stderr[-2000:]
    assert f"{out / 'ckpt.pt'} still holds step 4" in errors[0]
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [0, 1, 2, 3]


def test_a_config_that_cannot_be_written_is_refused_before_any_step(byte_data, tmp_path):
    out = tmp_path / "out"
    (out / "config.json").mkdir(parents=True)
    p = _train_subprocess(tiny_args(byte_data, out))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = [line for line in p.stderr.splitlines() if line.strip() and not line.startswith("warning")]
    assert len(lines) == 1 and lines[0].startswith("error:") and "config.json" in lines[0], p.stderr[-2000:]
    assert not (out / "ckpt.pt").exists()


def test_wandb_log_without_wandb_is_refused_before_any_write(byte_data, tmp_path, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r"wandb_log=True needs the wandb package: pip install wandb .* "
                                         r"or add --wandb_log=False"):
        train.main(tiny_args(byte_data, tmp_path / "out", "--wandb_log=True"))
    assert not (tmp_path / "out" / "config.json").exists()


def test_wandb_that_cannot_start_is_refused_before_any_step(byte_data, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="W&B is in requirements.txt; this machine lacks it")

    def unwritable(**kwargs):
        raise PermissionError(13, "Permission denied", "wandb")
    monkeypatch.setattr(wandb, "init", unwritable)
    with pytest.raises(ValueError, match=r"W&B could not start \(PermissionError: .*\); its files go to WANDB_DIR .*"
                                         r"--wandb_log=False"):
        train.main(tiny_args(byte_data, tmp_path, "--wandb_log=True"))
    assert not (tmp_path / "ckpt.pt").exists()


def test_wandb_offline_records_metrics(byte_data, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B is in requirements.txt; this machine lacks it")
    from wandb_reader import history, record_types
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    train.main(tiny_args(byte_data, tmp_path / "out", "--wandb_log=True", "--peak_flops=1e12", "--wandb_run_name=t"))
    import time
    import wandb
    wandb.teardown()                  # stop the W&B service so it closes (flushes) the run's log
    for _ in range(240):              # and give a loaded machine time to finish writing it (returns when it has)
        rows = history(tmp_path)
        steps = [r for r in rows if "tokens_per_sec" in r]
        if len(steps) >= 8:
            break
        time.sleep(0.5)
    assert [r["_step"] for r in steps] == list(range(8)), (rows, record_types(tmp_path))
    timed = [r for r in steps if r["tokens_per_sec"] is not None]
    assert len(timed) == 7 and all(r["tokens_per_sec"] > 0 and r["mfu"] > 0 for r in timed)
    assert any("val_loss" in r for r in rows)


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """(out_dir, train.py flags) of a run that logs to W&B offline, its files under tmp_path; skipped without W&B."""
    pytest.importorskip("wandb", reason="W&B is in requirements.txt; this machine lacks it")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    return tmp_path / "out", ["--wandb_log=True", "--eval_interval=4"]


@pytest.mark.slow
def test_metrics_and_wandb_continue_across_a_resume(byte_data, tmp_path, offline_wandb):
    """Killed after step 6 with a checkpoint at step 4, then resumed: each step once in metrics.jsonl,
    one W&B run id, each step's training row and each evaluation sent to W&B exactly once (the resumed
    step's training row too, though W&B already holds that step's evaluation)."""
    from wandb_reader import runs
    out, args = offline_wandb
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
    for _ in range(240):                # the W&B service may still be writing its logs (minutes on a loaded machine)
        found = runs(tmp_path)
        if len(found) == 3 and sum(len(h) for _, h in found) >= 8 + 3:
            break
        time.sleep(0.5)
    assert len({run_id for run_id, _ in found}) == 1, [r for r, _ in found]
    rows = [r for _, h in found for r in h]                 # W&B merges what is logged at one step into one row
    assert sorted(r["_step"] for r in rows if "loss" in r) == list(range(8)), rows        # every step once
    assert sorted(r["_step"] for r in rows if "val_loss" in r) == [0, 4, 7, 8], rows     # 7: the "killed" run's end


@pytest.mark.slow
def wait_stopped(pid, timeout=60):
    """Return once every thread of process `pid` is stopped (SIGSTOP takes effect when each thread leaves the kernel);
    where /proc is missing (macOS), after a pause."""
    tasks = f"/proc/{pid}/task"
    if not os.path.isdir(tasks):
        time.sleep(1)
        return
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            states = [open(f"{tasks}/{t}/stat").read().rsplit(")", 1)[1].split()[0] for t in os.listdir(tasks)]
        except OSError:                                # a thread ended while listed
            continue
        if all(state in "tTZX" for state in states):          # stopped, or a thread that ended
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within {timeout} s")


def test_wandb_gets_again_what_a_killed_run_logged_but_never_saved(byte_data, tmp_path, offline_wandb):
    """A run that ends W&B cleanly at step 4; a resume killed by SIGKILL (the OOM killer) some steps past its
    checkpoint, its W&B service dying with it and losing what it buffered; the next resume sends W&B every record
    of metrics.jsonl after step 4's evaluation (offline, W&B cannot say which of them it saved): the resumed W&B
    run starts at step 4's training row, and the three together hold every step and evaluation."""
    import subprocess
    from conftest import ROOT
    from speedgpt import checkpoint
    from wandb_reader import runs
    out, args = offline_wandb
    train.main(tiny_args(byte_data, out, *args, "--max_iters=4"))
    killed = subprocess.Popen([sys.executable, "train.py", *tiny_args(byte_data, out, *args, "--max_iters=100000",
                                                                      "--init_from=resume")],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"})   # its own service
    try:
        # killed once it has logged steps past its checkpoint, seen with the run stopped (SIGSTOP): a run left going
        # between the look and the kill can save again and leave nothing logged past its checkpoint
        deadline = time.time() + 300                  # a loaded machine: the start (torch, W&B) can take minutes
        while True:
            assert killed.poll() is None and time.time() < deadline, "the resumed run ended before it was killed"
            if any(r["step"] >= 14 for r in read_metrics(out, running=True)):
                killed.send_signal(signal.SIGSTOP)
                wait_stopped(killed.pid)              # a system call under way (the checkpoint's rename) ends first
                start = checkpoint.step_of(str(out / "ckpt.pt"))
                if start >= 8 and any(r["step"] > start for r in read_metrics(out, running=True)):
                    break
                killed.send_signal(signal.SIGCONT)
            time.sleep(0.05)
    finally:
        killed.kill()
        killed.wait()
    train.main(tiny_args(byte_data, out, *args, f"--max_iters={start + 4}", "--init_from=resume"))
    rows = read_metrics(out)
    assert [r["step"] for r in rows if "loss" in r] == list(range(start + 4))
    import wandb
    wandb.teardown()
    for _ in range(240):                # the W&B service may still be writing its logs (minutes on a loaded machine)
        found = runs(tmp_path)
        if len(found) == 3 and sum(1 for r in found[-1][1] if "loss" in r) >= start:
            break
        time.sleep(0.5)
    seen = [(run_id, len(h), [r.get("_step") for r in h][:3], [r.get("_step") for r in h][-3:]) for run_id, h in found]
    assert len({run_id for run_id, _ in found}) == 1, seen
    resumed = found[-1][1]
    assert [r["_step"] for r in resumed if "loss" in r] == list(range(4, start + 4)), (start, seen)
    assert [r["_step"] for r in resumed if "val_loss" in r] == list(range(8, start + 5, 4)), resumed
    every = [r for _, h in found for r in h]
    assert {r["_step"] for r in every if "loss" in r} == set(range(start + 4))
    assert {r["_step"] for r in every if "val_loss" in r} == set(range(0, start + 5, 4))


def test_wandb_online_is_sent_from_its_own_step_count():
    """Online, W&B says how far the run it resumed goes (starting_step): what it lacks is sent from there; a new
    run lacks everything; offline, the marker of W&B's last clean finish counts, when it is of the same run."""
    from types import SimpleNamespace
    from speedgpt.measure import wandb_holds_through
    online = SimpleNamespace(id="abc", offline=False, starting_step=6)
    offline = SimpleNamespace(id="abc", offline=True, starting_step=0)
    assert wandb_holds_through(online, "abc", {"id": "abc", "step": 2, "train": True}) == (5, True)
    assert wandb_holds_through(online, None, None) == (-1, True)
    assert wandb_holds_through(offline, "abc", {"id": "abc", "step": 4, "train": False}) == (4, False)
    assert wandb_holds_through(offline, "abc", {"id": "xyz", "step": 4, "train": False}) == (-1, True)
    assert wandb_holds_through(offline, "abc", None) == (-1, True)


def test_profile_writes_a_table_and_a_trace(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--profile=True", "--timing_warmup=2", "--max_iters=4"))
    table = (tmp_path / "profile.txt").read_text()
    assert "aten::" in table and "Self CPU" in table
    import gzip, json
    trace = json.load(gzip.open(tmp_path / "profile_trace.json.gz"))
    assert any(e.get("name", "").startswith("aten::mm") for e in trace["traceEvents"])


def test_mfu_fp8_counts_the_flops_that_ran_in_fp8_at_the_fp8_peak():
    """mfu_fp8: the FLOPs of the FP8 GEMMs (every converted block Linear's three, two for rowwise_bf16_wgrad,
    and the head's three with fp8_head) at the FP8 peak, the rest at the run's; the same as mfu without FP8,
    and None where FP8 FLOPs run on a GPU without a known FP8 peak."""
    import configurator
    from speedgpt.features import fp8
    from speedgpt.measure import ideal_seconds_per_token
    assert ideal_seconds_per_token(100, 0, 10.0, None) == 10.0
    assert ideal_seconds_per_token(100, 60, 10.0, 20.0) == pytest.approx(40 / 10 + 60 / 20)
    assert ideal_seconds_per_token(100, 60, 10.0, None) is None and ideal_seconds_per_token(100, 0, None, 20.0) is None
    for recipe, gemms in (("tensorwise_delayed", 6), ("rowwise_bf16_wgrad", 4)):
        for head in (False, True):
            cfg = configurator.Config(n_layer=2, n_head=2, n_embd=32, block_size=16, fp8=True, fp8_recipe=recipe,
                                      fp8_min_dim=32, fp8_head=head)
            model = GPT(GPTConfig.from_dict(vars(cfg), 257))
            assert fp8.fp8_flops_per_token(model, cfg) == 6 * model.lm_head.weight.numel() * head
            fp8.convert(model, cfg)
            blocks = sum(m.weight.numel() for m in model.transformer.h.modules() if isinstance(m, torch.nn.Linear))
            assert fp8.fp8_flops_per_token(model, cfg) == gemms * blocks + 6 * model.lm_head.weight.numel() * head


def test_the_eta_ends_where_the_time_budget_does(tmp_path, capsys):
    """The step line's eta: max_iters' remaining steps at this pace, or under time_budget what is left of the
    budget on the training clock, whichever ends the run first."""
    from configurator import Config
    from speedgpt.measure import MetricsLogger, eta_seconds

    def eta(**settings):
        logger = MetricsLogger(Config(out_dir=str(tmp_path), **settings), master=True)
        capsys.readouterr()
        logger.step(9, 2.5, {"lr": 1e-3}, 1.0, 0.0, timing=(1000.0, 100.0), train_seconds=30.0)   # 100 ms a step
        logger.close()
        return capsys.readouterr().out.split(" | eta ")[1].split(" | ")[0]
    assert eta(max_iters=1000) == "1m39s"                         # 990 steps left at 100 ms
    assert eta(max_iters=1000, time_budget=1.0) == "30s"          # 60 s of budget, 30 s of it spent
    assert eta(max_iters=20, time_budget=1.0) == "1s"             # max_iters comes first: 10 steps left
    assert eta_seconds(Config(time_budget=0.25), 9, 100.0, train_seconds=20.0) == 0.0   # spent: nothing left


def test_append_record_starts_a_new_line_only_after_a_cut_one(tmp_path):
    from speedgpt.measure import append_record, read_records
    path = tmp_path / "rows.jsonl"
    append_record(path, {"a": 1})
    append_record(path, {"a": 2})
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'                 # no blank lines between whole records
    with open(path, "a") as f:
        f.write('{"a": 3')                                            # cut by a stop
    append_record(path, {"a": 4})
    assert read_records(path) == ([{"a": 1}, {"a": 2}, {"a": 4}], [3])
