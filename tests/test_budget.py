"""speedgpt/budget.py and train.py's time budget on the CPU: the clock (evaluations and the first step's compile left
out), a run that ends at its budget with its final evaluation and checkpoint, the learning rate on the clock, a
resume that continues the clock and honours the budget's total, every rank on rank 0's clock, and the refusals.
Most of these run on a fake clock: each step takes the seconds the test says, so nothing depends on the load."""
import os
import subprocess
import sys

import pytest
import torch

import train
from configurator import help_text, load_config
from conftest import ROOT, read_metrics, sigterm_in_step, tiny_args
from speedgpt import budget, optim
from speedgpt.distributed import Proc


@pytest.fixture
def fake_clock(monkeypatch):
    """budget's clock made a counter that only a training step moves: the first step of each start takes 10 s
    (its compile), every later one 1 s; evaluations and checkpoints take none."""
    t = {"now": 100.0, "calls": 0}
    real = train.forward_backward

    def step(*args, **kwargs):
        t["now"] += 10.0 if t["calls"] == 0 else 1.0
        t["calls"] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(budget, "now", lambda: t["now"])
    monkeypatch.setattr(train, "forward_backward", step)
    return t


def budget_args(data, out, *extra):
    # 0.1 min = 6 s of training: steps of 1 s on the fake clock
    return tiny_args(data, out, "--time_budget=0.1", "--max_iters=1000", "--warmup_iters=2", "--eval_interval=4",
                     *extra)


def lrs(out_dir):
    return {r["step"]: r["lr"] for r in read_metrics(out_dir) if "loss" in r}


def test_the_clock_leaves_out_evaluations_and_counts_the_first_step_at_the_seconds(monkeypatch):
    t = {"now": 0.0}
    monkeypatch.setattr(budget, "now", lambda: t["now"])
    clock = budget.Clock(before=7.0)           # a resumed run: the checkpoint's 7 s
    assert clock.compile_s() is None
    clock.pause()                               # the evaluation before the first step
    t["now"] += 50.0
    clock.resume()
    t["now"] += 12.0                            # the first step: 2 s of work, 10 s of compile
    assert clock.step_done() == 7.0             # not counted until a second step says what a step takes
    t["now"] += 2.0
    assert clock.step_done() == 7.0 + 2.0 + 2.0            # the first step at the second's 2 s
    assert clock.compile_s() == 10.0
    t["now"] += 4.0
    assert clock.pause() == 15.0                # an evaluation's reading, the clock stopped
    t["now"] += 100.0
    clock.resume()
    t["now"] += 2.0
    assert clock.step_done() == 17.0
    fast_first = budget.Clock()                 # a first step faster than the second: counted whole, never less
    t["now"] += 1.0
    fast_first.step_done()
    t["now"] += 2.0
    assert fast_first.step_done() == 3.0 and fast_first.compile_s() == 0.0


def test_under_torchrun_every_rank_takes_rank_0s_clock(monkeypatch):
    """Ranks whose clocks differ (rank 1's reads 5 s more) take the same seconds, rank 0's: the same learning rate,
    the same last step."""
    t = {"now": 0.0}
    monkeypatch.setattr(budget, "now", lambda: t["now"])
    sent = []

    def broadcast(tensor, src):                 # what torch.distributed gives every rank: rank 0's tensor
        sent.append(tensor.item())
        tensor.fill_(sent[0])
    monkeypatch.setattr(budget.dist, "broadcast", broadcast)
    proc = Proc(1, 1, 2, torch.device("cpu"))
    clock = budget.Clock(proc=proc)
    t["now"] = 1.0
    clock.step_done()
    t["now"] = 2.0
    sent[:] = [2.0]                             # rank 0's reading after its second step
    assert clock.step_done() == 2.0 and sent[-1] == 2.0     # this rank read 2.0 too here; now it differs:
    t["now"] = 8.0
    sent[:] = [3.0]
    assert clock.step_done() == 3.0
    assert budget.Clock(proc=Proc(0, 0, 1, torch.device("cpu"))).proc is None       # one process: no collective


def test_a_budgeted_run_ends_at_its_budget_on_the_clock_and_its_rate_follows_it(byte_data, tmp_path, fake_clock,
                                                                              capsys):
    summary = train.main(budget_args(byte_data, tmp_path))
    # seconds before each step: 0, 0 (the first step not yet counted), then 2, 3, 4, 5; at 6 the budget is spent
    seconds = {0: 0.0, 1: 0.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 5.0}
    cfg = load_config(budget_args(byte_data, tmp_path))
    assert lrs(tmp_path) == {s: optim.lr_at(s, cfg, seconds=x) for s, x in seconds.items()}
    assert summary["steps"] == 6 and summary["train_seconds"] == 6.0 and summary["compile_s"] == 9.0
    vals = [(r["step"], r["train_seconds"]) for r in read_metrics(tmp_path) if "val_loss" in r]
    assert vals == [(0, 0.0), (4, 4.0), (6, 6.0)]           # the final evaluation, at the budget
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert (ckpt["step"], ckpt["train_seconds"], ckpt["tokens"]) == (6, 6.0, 6 * 4 * 64)
    assert "step 6: time_budget=0.1 min spent (0.10 min of training): the last evaluation" in capsys.readouterr().out


def test_a_max_iters_that_ends_the_budget_early_is_said_once_its_rate_is_known(byte_data, tmp_path, fake_clock,
                                                                               capsys):
    """1 s a step against a budget of 6 s: max_iters=4 ends the run after about 4 s (0.07 min), said after this
    start's first timing_warmup steps, besides the end's line; max_iters=1000 is a bound the budget comes first to."""
    train.main(budget_args(byte_data, tmp_path, "--max_iters=4"))
    out = capsys.readouterr().out
    assert out.count("warning: at this rate max_iters=4 ends the run after about 0.07 of time_budget=0.1 min, before "
                     "its learning rate has decayed: give a larger --max_iters") == 1
    assert "max_iters=4 reached after 0.07 of time_budget=0.1 min" in out
    train.main(budget_args(byte_data, tmp_path / "bound"))
    assert "warning: at this rate" not in capsys.readouterr().out


def test_a_constant_rate_cut_short_by_max_iters_names_no_decay(byte_data, tmp_path, fake_clock, capsys):
    """lr_schedule=constant has no decay: max_iters before the budget leaves the budget unspent, and says so."""
    train.main(budget_args(byte_data, tmp_path, "--max_iters=4", "--lr_schedule=constant"))
    out = capsys.readouterr().out
    assert out.count("warning: at this rate max_iters=4 ends the run after about 0.07 of time_budget=0.1 min, before "
                     "its budget is spent: give a larger --max_iters") == 1
    assert "max_iters=4 reached after 0.07 of time_budget=0.1 min: the budget was not spent" in out
    assert "its decay" not in out and "has decayed" not in out


def test_a_budget_that_ends_inside_the_warm_up_is_said_once_its_rate_is_known(byte_data, tmp_path, fake_clock,
                                                                              capsys):
    """1 s a step against a budget of 6 s: warmup_iters=20 would not end before the budget does (near step 6)."""
    train.main(budget_args(byte_data, tmp_path, "--warmup_iters=20"))
    out = capsys.readouterr().out
    assert out.count("warning: at this rate time_budget=0.1 min ends the run near step 6, inside its warm-up "
                     "(warmup_iters=20 steps): the learning rate never reaches its peak; give a smaller "
                     "--warmup_iters (or a larger budget)") == 1
    assert "step 6: time_budget=0.1 min spent (0.10 min of training): the last evaluation (warning: inside its " \
           "warm-up, warmup_iters=20 steps" in out            # said at the end too: a rate may come too late


def test_a_resume_continues_the_clock_and_honours_the_budgets_total(byte_data, tmp_path, fake_clock, capsys):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train.main(budget_args(byte_data, whole))
    fake_clock["calls"] = 0                                # a new process: its first step compiles again
    train.main(budget_args(byte_data, cut, "--max_iters=3"))
    assert torch.load(cut / "ckpt.pt", weights_only=True)["train_seconds"] == 3.0
    assert "max_iters=3 reached after 0.05 of time_budget=0.1 min" in capsys.readouterr().out
    fake_clock["calls"] = 0
    summary = train.main(budget_args(byte_data, cut, "--init_from=resume"))
    # the resumed clock starts at the checkpoint's 3 s: steps 3, 4, 5 at 3, 3 (its first step, not yet counted), 5 s
    cfg = load_config(budget_args(byte_data, cut))
    resumed, straight = lrs(cut), lrs(whole)
    assert resumed[3] == straight[3] == optim.lr_at(3, cfg, seconds=3.0)
    assert resumed[4] == optim.lr_at(4, cfg, seconds=3.0) == straight[3]     # the same rate at the same elapsed time
    assert resumed[5] == straight[5] and sorted(resumed) == sorted(straight)
    assert summary["steps"] == 6 and summary["train_seconds"] == 6.0        # the budget's total, across the resume
    ckpt = torch.load(cut / "ckpt.pt", weights_only=True)
    assert (ckpt["step"], ckpt["train_seconds"], ckpt["tokens"]) == (6, 6.0, 6 * 4 * 64)
    # tokens and seconds in the evaluation records continue too (time to a target across a resume)
    # (step 4's evaluation comes after the resumed first step, which counts once a second one has run)
    assert [(r["step"], r["train_seconds"]) for r in read_metrics(cut) if "val_loss" in r] == \
        [(0, 0.0), (3, 3.0), (4, 3.0), (6, 6.0)]
    capsys.readouterr()
    assert train.main(budget_args(byte_data, cut, "--init_from=resume"))["finished"]
    assert "has spent its 0.10 of time_budget=0.1 min; to train on, give a larger --time_budget" \
        in capsys.readouterr().out
    capsys.readouterr()
    train.main(budget_args(byte_data, cut, "--init_from=resume", "--time_budget=0.15"))     # more time: more steps
    assert "resume: time_budget 0.1 -> 0.15 (set explicitly: the decay stretches over the larger budget, so the " \
           "rate goes back to an earlier point of its curve)" in capsys.readouterr().out
    assert torch.load(cut / "ckpt.pt", weights_only=True)["step"] > 6


def test_a_signal_in_the_step_that_spends_the_budget_resumes_to_its_final_evaluation(byte_data, tmp_path, fake_clock,
                                                                                    monkeypatch):
    """A SIGTERM during step 5, whose end spends the 6 s budget, saves step 6 before the final evaluation; the resume
    the stop's line asks for makes it (at 6 s, as the uninterrupted run's), where it used to say the budget was spent
    and end without the run's last val loss."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    done = train.main(budget_args(byte_data, whole))
    real = sigterm_in_step(monkeypatch, 5)
    fake_clock["calls"] = 0
    with pytest.raises(train.RunStopped, match="SIGTERM: stopped after step 5"):
        train.main(budget_args(byte_data, cut))
    monkeypatch.setattr(optim, "set_lr", real)
    resumed = train.main(budget_args(byte_data, cut, "--init_from=resume"))
    assert "finished" not in resumed and resumed["val_loss"] == done["val_loss"]
    vals = [(r["step"], r["train_seconds"]) for r in read_metrics(cut) if "val_loss" in r]
    assert vals == [(0, 0.0), (4, 4.0), (6, 6.0)]


def test_a_tiny_budget_on_the_real_clock_ends_the_run_with_its_evaluation_and_checkpoint(byte_data, tmp_path):
    summary = train.main(tiny_args(byte_data, tmp_path, "--time_budget=0.02", "--max_iters=100000",
                                   "--eval_interval=100000", "--warmup_iters=0"))
    assert 1 < summary["steps"] < 100000 and summary["train_seconds"] >= 1.2
    vals = [r for r in read_metrics(tmp_path) if "val_loss" in r]
    assert vals[-1]["step"] == summary["steps"] and vals[-1]["train_seconds"] >= 1.2
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == summary["steps"]
    assert ckpt["train_seconds"] == pytest.approx(summary["train_seconds"], abs=1e-3)
    # the last step began under the budget (its rate is above the floor the budget's end reaches): the run
    # overshoots by at most one step, however slow the machine
    assert lrs(tmp_path)[summary["steps"] - 1] > 3e-4


@pytest.mark.parametrize("args, match", [
    (["--time_budget=-1"], r"'time_budget' must be >= 0, got -1.0 \(0 turns it off\)"),
    (["--time_budget=5", "--lr_decay_iters=300"],
     r"^time_budget=5 decays the learning rate over the budget's training time: lr_decay_iters=300 would be a "
     r"second horizon; leave it out \(or --lr_decay_iters=0\)$"),
])
def test_a_budget_that_cannot_be_meant_is_refused_in_one_line(byte_data, tmp_path, args, match):
    with pytest.raises(ValueError, match=match):
        train.main(tiny_args(byte_data, tmp_path, *args))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_resume_given_a_budget_leaves_its_step_horizon(byte_data, tmp_path, capsys):
    """A step-scheduled run resumed with --time_budget decays over the budget, which counts the seconds trained
    already: the checkpoint's lr_decay_iters is dropped, not refused as a second horizon; the resume says where the
    rate goes (back up, for a run that had decayed over its steps) and how to keep the steps' decay."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    done = torch.load(tmp_path / "ckpt.pt", weights_only=True)["train_seconds"]
    assert done > 0                                 # a run without a budget keeps the clock too
    capsys.readouterr()
    budget = (done + 0.6) / 60
    summary = train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=100000",
                                   f"--time_budget={budget}", "--eval_interval=100000"))
    cfg = load_config(tiny_args(byte_data, tmp_path, "--max_iters=100000", f"--time_budget={budget}"))
    steps = load_config(tiny_args(byte_data, tmp_path, "--max_iters=4", "--lr_decay_iters=4"))
    assert f"resume: the learning rate runs on time_budget from here, not on steps: " \
           f"{optim.lr_at(4, cfg, seconds=done):.2e} at {done / 60:.2f} of time_budget={budget:g} min (the steps' " \
           f"decay had it at {optim.lr_at(4, steps):.2e}), down to min_lr={cfg.min_lr:g} when it is spent (to keep " \
           "the decay over steps, leave out --time_budget)" in capsys.readouterr().out
    # summary.json keeps train_seconds to the millisecond: the budget's end may round down below it by up to 0.5 ms
    assert 4 < summary["steps"] < 100000 and summary["train_seconds"] >= done + 0.6 - 5e-4


def test_a_resume_that_turns_the_budget_off_is_refused_unless_it_names_a_step_horizon(byte_data, tmp_path,
                                                                                      fake_clock, capsys):
    """A budgeted run's rate ran on its clock: turned off at a resume, the decay would restart over the run's large
    max_iters, back near the peak. Refused in one line before any step, unless --lr_decay_iters names the horizon;
    then the resume says where the rate goes on that horizon (up from the budget's min_lr, which it used to leave
    unsaid), as a resume onto a budget does."""
    train.main(budget_args(byte_data, tmp_path))
    with pytest.raises(ValueError, match=r"^time_budget=0: this run's learning rate ran on its time_budget=0.1 "
                                         r"minutes of training, .*--lr_decay_iters=N$"):
        train.main(budget_args(byte_data, tmp_path, "--init_from=resume", "--time_budget=0", "--max_iters=20"))
    with pytest.raises(ValueError, match=r"^time_budget=0: "):          # 0: the run's max_iters again, not a horizon
        train.main(budget_args(byte_data, tmp_path, "--init_from=resume", "--time_budget=0", "--lr_decay_iters=0"))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 6
    fake_clock["calls"] = 0
    capsys.readouterr()
    train.main(budget_args(byte_data, tmp_path, "--init_from=resume", "--time_budget=0", "--max_iters=8",
                           "--lr_decay_iters=8"))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 8
    steps = load_config(budget_args(byte_data, tmp_path, "--time_budget=0", "--max_iters=8", "--lr_decay_iters=8"))
    assert f"resume: the learning rate runs on steps from here, not on time_budget: {optim.lr_at(6, steps):.2e} at " \
           f"step 6 (the budget's decay had it at {steps.min_lr:.2e}), down to min_lr={steps.min_lr:g} at " \
           "lr_decay_iters=8 (a smaller --lr_decay_iters starts lower on the curve)" in capsys.readouterr().out


def test_a_resume_that_ends_before_the_decay_says_where_the_rate_stops(byte_data, tmp_path, capsys):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=12"))       # keeps steps 4, 8 and 12 (eval_interval=4)
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path, "--resume_from=4", "--max_iters=6"))
    cfg = load_config(tiny_args(byte_data, tmp_path, "--max_iters=6", "--warmup_iters=2", "--lr_decay_iters=12"))
    assert f"resume: the run ends at max_iters=6 before its decay does (lr_decay_iters=12): the learning rate of " \
           f"its last step is {optim.lr_at(5, cfg):.2e}, not min_lr={cfg.min_lr} (add --lr_decay_iters=6 to decay " \
           "by then)" in capsys.readouterr().out


def test_help_shows_the_flag():
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "--time_budget=0.0" in out and "minutes of training" in out
    assert out == help_text() + "\n"


@pytest.mark.slow
def test_a_budget_under_torchrun_stops_every_rank_after_the_same_step(short_data, tmp_path):
    """Two CPU processes (gloo, DDP) on rank 0's clock: both end at the budget, together, with one checkpoint."""
    args = tiny_args(short_data, tmp_path, "--batch_size=2", "--total_batch_size=512", "--time_budget=0.02",
                     "--max_iters=100000", "--eval_interval=100000", "--device=cpu")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "train.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert 1 < ckpt["step"] < 100000 and ckpt["train_seconds"] >= 1.2
    assert f"step {ckpt['step']}: time_budget=0.02 min spent" in proc.stdout
