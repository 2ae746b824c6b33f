"""speedgpt/checkpoint.py on the CPU: checkpoint history (keep_checkpoints, the best one, resume_from an older
step), the disk check, a full disk at a checkpoint ending the run in one line; resume (exact, in another
precision, refusing a mismatched, corrupt or foreign checkpoint); saves interrupted or of non-finite weights
leaving no temp file, and an out_dir that cannot be written refused before any work."""
import json
import math
import os
import re
import shutil
import sys

import pytest
import torch

import configurator
import train
from conftest import losses, read_metrics, run_with_file_limit, tiny_args
from speedgpt import checkpoint


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
    assert "resume: step 4 is older than the latest checkpoint (step 8): the steps after it are abandoned: " in text
    assert "metrics.jsonl's later records move to metrics.abandoned.jsonl, W&B gets a new run" in text
    rows = read_metrics(out)
    assert [r["step"] for r in rows if "loss" in r] == list(range(8))
    assert losses(out) == want
    with pytest.raises(FileNotFoundError, match=r"resume_from=3: .* has no checkpoint of step 3 \(its steps: 2, 4, 6, 8"):
        train.main(tiny_args(byte_data, out, "--resume_from=3"))
    kept = tmp_path / "step6.pt"                       # a path: a checkpoint kept elsewhere, resumed into out_dir
    shutil.copy(out / "ckpt_step000006.pt", kept)
    train.main(tiny_args(byte_data, out, "--max_iters=8", "--eval_interval=2", "--keep_checkpoints=5",
                         f"--resume_from={kept}"))
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == list(range(8)) and losses(out) == want
    with pytest.raises(FileNotFoundError, match=r"resume_from='.*/nothing.pt': no such checkpoint file, as a path "
                                                 r"or in .* \(its steps: 2, 4, 6, 8; --resume_from=STEP resumes one\)$"):
        train.main(tiny_args(byte_data, out, f"--resume_from={tmp_path / 'nothing.pt'}"))
    assert checkpoint.resolve_resume(str(out), "ckpt_step000006.pt") == str(out / "ckpt_step000006.pt")  # as ls shows
    with pytest.raises(FileNotFoundError, match=rf"^resume_from='{re.escape(str(out))}' is a folder: resume the run "
                                                rf"there with --out_dir={re.escape(str(out))} --init_from=resume, or "
                                                r"name a checkpoint file in it$"):
        checkpoint.resolve_resume(str(tmp_path / "elsewhere"), str(out))
    with pytest.raises(ValueError, match="resume_from='4' resumes a run: it cannot go with init_from='scratch'"):
        train.main(tiny_args(byte_data, out, "--resume_from=4", "--init_from=scratch"))


def test_a_resume_from_an_older_step_keeps_it_and_leaves_one_history(byte_data, tmp_path, capsys, monkeypatch):
    """A run to step 12 keeps steps 8, 10, 12 (the best is 12's); --resume_from=8 with another eval_interval (saves at
    9 and 12). Stopped before its first checkpoint, the run has already made step 8 the latest and the best, and keeps
    the abandoned files until it writes one; resumed again, it removes them at its first checkpoint (said once): step 8
    survives the rotation, metrics.jsonl holds one history and the abandoned records sit in metrics.abandoned.jsonl,
    and ckpt_best.pt is this history's best."""
    out = tmp_path / "run"
    common = ["--max_iters=12", "--keep_checkpoints=3"]
    train.main(tiny_args(byte_data, out, *common, "--eval_interval=2"))
    before = read_metrics(out)
    assert sorted(checkpoint.saved_steps(str(out))) == [8, 10, 12] and checkpoint.step_of(str(out / "ckpt_best.pt")) == 12
    capsys.readouterr()

    def killed(*args, **kwargs):                       # the first step of the resumed run never ends
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(train, "forward_backward", killed)
        with pytest.raises(train.RunStopped):
            train.main(tiny_args(byte_data, out, *common, "--eval_interval=3", "--resume_from=8"))
    said = capsys.readouterr().out
    assert "resume: step 8 is older than the latest checkpoint (step 12): the steps after it are abandoned" in said
    assert "metrics.abandoned.jsonl" in said and "removed the checkpoints" not in said
    step8 = str(out / "ckpt_step000008.pt")
    assert os.path.samefile(out / "ckpt.pt", step8) and os.path.samefile(out / "ckpt_best.pt", step8)
    assert sorted(checkpoint.saved_steps(str(out))) == [8, 10, 12]            # nothing deleted before a new one
    abandoned = [json.loads(line) for line in (out / "metrics.abandoned.jsonl").read_text().splitlines()]
    assert abandoned == [r for r in before if r["step"] > 8 or (r["step"] == 8 and "loss" in r)]

    train.main(tiny_args(byte_data, out, *common, "--eval_interval=3", "--init_from=resume"))      # the same branch
    said = capsys.readouterr().out
    assert said.count("removed the checkpoints of the abandoned steps 10, 12") == 1, said
    steps = checkpoint.saved_steps(str(out))
    assert sorted(steps) == [8, 9, 12] and os.path.samefile(out / "ckpt.pt", steps[12])
    rows = read_metrics(out)
    assert [r["step"] for r in rows if "loss" in r] == list(range(12))
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 2, 4, 6, 8, 9, 12]
    assert [json.loads(line) for line in (out / "metrics.abandoned.jsonl").read_text().splitlines()] == abandoned
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r and r["step"] in steps}
    best = min(val, key=val.get)
    assert os.path.samefile(out / "ckpt_best.pt", steps[best]), (val, checkpoint.load_checkpoint(
        str(out / "ckpt_best.pt"))["step"])
    assert checkpoint.resolve_resume(str(out), "8") == step8                 # still there to resume from
    with pytest.raises(FileNotFoundError, match="resume_from=10: .* has no checkpoint of step 10"):
        checkpoint.resolve_resume(str(out), "10")


@pytest.mark.parametrize("flag", ["--keep_checkpoints=5", "--async_checkpoint=False"])
def test_checkpoint_settings_without_checkpoints_are_refused(byte_data, tmp_path, flag):
    """keep_checkpoints or async_checkpoint with save_checkpoints=False would do nothing: one line, no step."""
    key = flag[2:].split("=")[0]
    with pytest.raises(ValueError, match=f"^{key}=.* would do nothing: it is a setting of the checkpoints. Add "
                                         f"--save_checkpoints=True, or leave {key} out$"):
        train.main(tiny_args(byte_data, tmp_path, "--save_checkpoints=False", flag))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_the_last_good_step_is_found_without_loading_a_checkpoint(byte_data, tmp_path, monkeypatch):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a whole checkpoint"))
    assert checkpoint.last_good(str(tmp_path / "ckpt.pt")).startswith(f"{tmp_path / 'ckpt.pt'} still holds step 4")


def test_a_disk_too_small_for_the_checkpoints_is_refused_before_any_step(byte_data, tmp_path, monkeypatch):
    import shutil
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage._replace(free=10_000))
    with pytest.raises(ValueError, match=r"has 10.0 kB free but keep_checkpoints=3 needs up to ~[1-9][0-9.]* MB "
                                         r"\([0-9.]+ MB per checkpoint.* lower --keep_checkpoints, or choose another "
                                         r"--out_dir"):
        train.main(tiny_args(byte_data, tmp_path))
    assert not (tmp_path / "metrics.jsonl").exists() or not read_metrics(tmp_path)


def test_keeping_every_checkpoint_counts_the_ones_the_run_writes(byte_data, tmp_path, monkeypatch):
    """keep_checkpoints=1000000 ("keep them all") of a run that writes two (steps 4 and 8): the disk check
    counts the files there can be, not a million of them, which it refused on a disk of a GB as needing a TB."""
    import shutil
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage._replace(free=10**9))
    train.main(tiny_args(byte_data, tmp_path, "--keep_checkpoints=1000000"))
    assert sorted(checkpoint.saved_steps(str(tmp_path))) == [4, 8]


def test_the_disk_use_of_the_checkpoints_is_printed_at_start(byte_data, tmp_path, capsys):
    """keep_checkpoints step files, the best one apart, and one more while the next is written."""
    import re
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=1", "--keep_checkpoints=2"))
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("checkpoints: ~"))
    each, total = (float(x) for x in re.search(r"~([0-9.]+) MB each, .* up to ~([0-9.]+) MB", line).groups())
    assert "keeping 2 (keep_checkpoints) and the best" in line and total == pytest.approx(4 * each, abs=0.11)
    assert each > 1                                          # a tiny model's size, in a unit that shows it
    weights = torch.load(tmp_path / "ckpt.pt", weights_only=True)["model"].values()
    n_params = sum({t.data_ptr(): t.numel() for t in weights}.values())       # the tied head counted once
    assert os.path.getsize(tmp_path / "ckpt.pt") <= checkpoint.checkpoint_bytes(n_params)   # an upper bound


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


def test_resume_continues_exactly(byte_data, tmp_path):
    common = ["--max_iters=16", "--lr_decay_iters=16", "--eval_interval=8", "--dropout=0.1"]
    train.main(tiny_args(byte_data, tmp_path / "full", *common))
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--max_iters=8"))
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--init_from=resume"))
    full = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "full") if "loss" in r}
    part = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "part") if "loss" in r}
    assert sorted(part) == sorted(full) == list(range(16))
    for step in range(8, 16):
        assert part[step] == full[step], f"step {step}: resumed {part[step]} vs uninterrupted {full[step]}"


@pytest.mark.parametrize("first, then", [("float32", "float16"), ("float16", "bfloat16")])
def test_resume_with_another_precision(byte_data, tmp_path, first, then, capsys):
    train.main(tiny_args(byte_data, tmp_path, f"--dtype={first}", "--max_iters=4"))
    summary = train.main(tiny_args(byte_data, tmp_path, f"--dtype={then}", "--init_from=resume"))
    assert math.isfinite(summary["val_loss"])
    assert f"resume: dtype '{first}' -> '{then}'" in capsys.readouterr().out


def test_resume_refuses_a_mismatched_or_corrupt_checkpoint(byte_data, short_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with pytest.raises(ValueError, match="past max_iters=2"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=2"))
    (tmp_path / "ckpt.pt").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot be read"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume"))
    with pytest.raises(ValueError, match=r"config.json is not a checkpoint \(torch.save did not write it\): give a "
                                         r"run's folder or its ckpt.pt or ckpt_stepNNNNNN.pt$"):
        checkpoint.load_checkpoint(str(tmp_path / "config.json"))            # sample.py --out_dir=out/config.json


def test_foreign_or_mismatched_checkpoint(byte_data, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    torch.save({"model": {}, "iter_num": 5}, out / "ckpt.pt")            # a nanoGPT-style checkpoint
    with pytest.raises(ValueError, match="not a speedgpt checkpoint: it lacks optimizer, scaler, step"):
        train.main(tiny_args(byte_data, out, "--init_from=resume"))
    # a real one, then damage its weights
    train.main(tiny_args(byte_data, out, "--max_iters=4", "--init_from=scratch"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["model"]["lm_head.weight"] = ckpt["model"]["lm_head.weight"][:, :16]
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(ValueError, match=r"does not fit the model: lm_head.weight has shape \(320, 16\) in the "
                                         r"checkpoint, \(320, 32\) in the model$"):
        train.main(tiny_args(byte_data, out, "--init_from=resume"))


def test_weights_that_do_not_fit_name_a_few_keys_then_a_count():
    from conftest import tiny_model
    model = tiny_model()
    saved = dict(model.state_dict())
    for key in [k for k in saved if k.startswith("transformer.h.1.")][:6]:
        saved["old." + key] = saved.pop(key)
    with pytest.raises(ValueError) as e:
        checkpoint.load_weights(model, {"model": saved}, "ckpt.pt")
    said = str(e.value)
    assert said.startswith("checkpoint ckpt.pt does not fit the model: transformer.h.1.") and "\n" not in said
    assert said.count("missing from the checkpoint") + said.count("not in the model") == 4, said
    assert said.endswith("and 8 more keys that differ"), said


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


def full_disk_at(monkeypatch, step=None):
    """torch.save as on a full disk ("basic_ios::clear: iostream error", part of the file written) for the
    checkpoint of `step` (None: every one), the free space reported as 0."""
    save = checkpoint.torch.save

    def full_disk(obj, f):
        if step is not None and not (isinstance(obj, dict) and obj.get("step") == step):
            return save(obj, f)
        f.write(b"part of a checkpoint")
        raise RuntimeError("basic_ios::clear: iostream error")
    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    monkeypatch.setattr(train, "check_disk", lambda *a: "checkpoints: (the disk check: tests/test_checkpoint.py)")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 10**12, 0))


def test_a_full_disk_while_saving_stops_in_one_line_and_keeps_the_checkpoint(byte_data, tmp_path, monkeypatch):
    """torch.save on a full disk fails with "basic_ios::clear: iostream error": the run stops with one line
    naming the path and the cause, and the previous checkpoint survives, with no temp file beside it."""
    from speedgpt import checkpoint
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    before = (tmp_path / "ckpt.pt").read_bytes()

    full_disk_at(monkeypatch)
    with pytest.raises(train.RunStopped, match=r"^error: step 8: could not write .*ckpt_step000008.pt: "
                                               r"no space left on the device "
                                               r"\(0 MB free\); .*ckpt.pt still holds step 4: resume from it") as e:
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=8", "--init_from=resume"))
    assert e.value.exit_code == 1 and "\n" not in str(e.value)
    assert (tmp_path / "ckpt.pt").read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def test_a_background_write_holds_the_state_of_its_step_and_the_sync_write_equals_it(byte_data, tmp_path):
    """async_checkpoint: the thread writes a copy of the state at its step (training goes on meanwhile and
    must not reach into it), so its file equals the file a synchronous write of the same run makes."""
    for mode in ("True", "False"):
        train.main(tiny_args(byte_data, tmp_path / mode, "--max_iters=8", f"--async_checkpoint={mode}"))
    bg, fg = (checkpoint.load_checkpoint(str(tmp_path / m / "ckpt_step000004.pt")) for m in ("True", "False"))
    for key in ("model", "optimizer"):
        flat_bg, flat_fg = (torch.utils._pytree.tree_leaves(c[key]) for c in (bg, fg))
        assert len(flat_bg) == len(flat_fg) > 0
        assert all(torch.equal(a, b) if torch.is_tensor(a) else a == b for a, b in zip(flat_bg, flat_fg))
    assert bg["step"] == 4 and bg["loader"] == fg["loader"]


def test_own_copy_shares_nothing_with_the_live_state_but_keeps_a_tied_tensor_one():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sd = model.state_dict()
    ckpt = {"model": sd, "tied": {"again": sd["weight"]}, "optimizer": opt.state_dict(), "step": 3}
    copied = checkpoint.own_copy(ckpt, model, opt, {})
    assert copied["model"]["weight"] is copied["tied"]["again"]                       # one copy, as saved
    for live, mine in ((sd["weight"], copied["model"]["weight"]),
                       (opt.state[model.weight]["exp_avg"], copied["optimizer"]["state"][0]["exp_avg"])):
        assert torch.equal(live, mine) and live.untyped_storage().data_ptr() != mine.untyped_storage().data_ptr()
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not torch.equal(copied["model"]["weight"], model.weight)


def test_a_failed_background_write_stops_the_run_at_the_next_save_in_one_line(byte_data, tmp_path, monkeypatch):
    full_disk_at(monkeypatch, step=8)
    with pytest.raises(train.RunStopped, match=r"^error: step 8: could not write .*ckpt_step000008.pt: no space left "
                                               r"on the device \(0 MB free\) \(written in the background; the run "
                                               r"stopped at step 12\); .*ckpt.pt still holds step 4: resume") as e:
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=16"))
    assert e.value.exit_code == 1 and "\n" not in str(e.value)
    assert sorted(checkpoint.saved_steps(str(tmp_path))) == [4] and not list(tmp_path.glob("*.tmp"))
    assert json.loads((tmp_path / "summary.json").read_text())["stopped"].startswith("error: step 8: could not")


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
    with pytest.raises(ValueError, match=r"cannot create the output folder .*/o2: no space left on the device in .*; "
                                         r"choose another --out_dir"):
        train.main(tiny_args(byte_data, tmp_path / "o2"))


def test_a_corrupt_ckpt_pt_points_at_the_kept_checkpoints(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=8"))
    (tmp_path / "ckpt.pt").unlink()
    (tmp_path / "ckpt.pt").write_bytes(b"garbage")              # a file of its own, not the step file's link
    import sample
    kept = tmp_path / "ckpt_step000008.pt"
    with pytest.raises(ValueError, match=r"cannot be read \(UnpicklingError\); is it corrupt\? The kept steps 4, 8 may "
                                         rf"still load \(train.py --resume_from=8; sample.py and eval.py "
                                         rf"--out_dir={re.escape(str(kept))}\)$"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=10"))
    # sampling takes a kept step's file as its out_dir (ckpt.pt is damaged): that step's model
    model, _ = sample.load_model(str(kept), "cpu")
    want = checkpoint.load_checkpoint(str(kept))["model"]
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items() if k in want)
    with pytest.raises(ValueError, match="is it corrupt"):
        sample.load_model(str(tmp_path), "cpu")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at .*ckpt_step000009.pt: its folder keeps the steps "
                                                r"4, 8$"):                  # the file it names, not a folder's ckpt.pt
        sample.load_model(str(tmp_path / "ckpt_step000009.pt"), "cpu")


def test_an_out_dir_that_is_the_data_dir_is_refused(tmp_path):
    """The run's checkpoints, metrics and config among the prepared shards: refused, by any spelling of the folder."""
    Config = configurator.Config
    for out in (str(tmp_path), str(tmp_path) + "/", str(tmp_path / "." / "")):
        with pytest.raises(ValueError, match=r"is the data_dir: the run would write its checkpoints and metrics among "
                                             r"the shards; choose another --out_dir$"):
            checkpoint.check(Config(data_dir=str(tmp_path), out_dir=out))
    assert checkpoint.check(Config(data_dir=str(tmp_path), out_dir=str(tmp_path / "out"))) is not None


def test_resume_from_a_file_name_is_out_dirs_file_before_the_current_folders(tmp_path, monkeypatch):
    """--resume_from=ckpt.pt run from inside another run's folder names out_dir's ckpt.pt, as `ls out_dir` shows it,
    not the current folder's (which the resume then refused as another folder's run); a path that is not in out_dir
    is read as given."""
    out, here = tmp_path / "out", tmp_path / "another_run"
    out.mkdir()
    here.mkdir()
    for folder in (out, here):
        (folder / "ckpt.pt").write_bytes(b"")
    (here / "backup.pt").write_bytes(b"")
    monkeypatch.chdir(here)
    assert checkpoint.resolve_resume(str(out), "ckpt.pt") == str(out / "ckpt.pt")
    assert checkpoint.resolve_resume(str(out), "backup.pt") == "backup.pt"


def test_a_checkpoint_damaged_into_nan_weights_is_refused_as_corrupt(byte_data, tmp_path):
    """Bytes flipped inside a tensor still load, as NaN: refused as corrupt, pointing at the kept steps, not resumed
    into a first step that stops as "diverged" and sends the user back to the same file."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=8"))
    ckpt = checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt"))
    ckpt["model"]["transformer.wte.weight"][0, :4] = float("nan")
    (tmp_path / "ckpt.pt").unlink()                             # a file of its own, not the step file's link
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match=r"ckpt.pt holds weights or optimizer moments that are not finite, which no "
                                         r"run saves; is it corrupt\? The kept steps 4, 8 may still load \(train.py "
                                         r"--resume_from=8;"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=10"))
    train.main(tiny_args(byte_data, tmp_path, "--resume_from=8", "--max_iters=10"))     # the way out works
    assert checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 10


def test_a_second_run_into_an_out_dir_in_use_is_refused(byte_data, tmp_path):
    """While a run trains in out_dir (a train.py process here), a second one there, new or a resume, is refused in
    one line before it reads or removes anything: two runs at once each rotated and relinked the other's
    checkpoints and replaced its metrics, and both ended "done". Once the first ends, the folder is free again."""
    import subprocess
    import time
    from conftest import ROOT
    first = subprocess.Popen([sys.executable, "train.py", *tiny_args(byte_data, tmp_path, "--max_iters=100000",
                                                                     "--eval_interval=5")],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (tmp_path / "ckpt.pt").exists():              # it trains and has saved a checkpoint
            assert time.time() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.05)
        for extra in ("--init_from=scratch", "--init_from=resume"):
            with pytest.raises(ValueError, match=r"^another run is training in out_dir='.*' \(it holds the folder's "
                                                 r"lock\): wait for it to end \(or stop it\), or choose another "
                                                 r"--out_dir$"):
                train.main(tiny_args(byte_data, tmp_path, "--max_iters=100000", "--eval_interval=5", extra))
        assert first.poll() is None                             # untouched: it trains on
    finally:
        first.terminate()
        _, err = first.communicate(timeout=120)
    assert "SIGTERM: stopped after step" in err
    step = checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt"))["step"]
    summary = train.main(tiny_args(byte_data, tmp_path, "--eval_interval=5", "--init_from=resume",
                                   f"--max_iters={step + 2}"))
    assert summary["steps"] == step + 2


def test_a_save_cut_short_never_leaves_ckpt_pt_behind_a_step_file(byte_data, tmp_path, monkeypatch, capsys):
    """ckpt.pt takes the new checkpoint before its step file gets its name: a run killed between the two (a moment
    with hard links, a whole copy where the filesystem has none) leaves ckpt.pt at the newest step, so
    --init_from=resume continues from it; the other way round, ckpt.pt one step behind a step file looked like a
    rewind, and the resume removed the newest checkpoint."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--eval_interval=2", "--keep_checkpoints=5"))
    ckpt = checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt"))
    ckpt["step"], target, rename = 6, checkpoint.step_path(str(tmp_path), 6), os.replace

    def killed_at_the_step_files_rename(src, dst):
        if dst == target:
            raise KeyboardInterrupt("killed")
        rename(src, dst)
    monkeypatch.setattr(checkpoint.os, "replace", killed_at_the_step_files_rename)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(str(tmp_path / "ckpt.pt"), ckpt, keep=5)
    monkeypatch.undo()
    assert checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 6 and not os.path.exists(target)
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=8", "--eval_interval=2", "--keep_checkpoints=5",
                         "--init_from=resume"))
    out = capsys.readouterr().out
    assert "abandoned" not in out and sorted(checkpoint.saved_steps(str(tmp_path))) == [2, 4, 8], out


def test_a_refused_run_leaves_its_out_dir_unlocked(byte_data, tmp_path):
    """A run refused after it locked out_dir (here: nothing to resume there) lets the lock go with its refusal, not
    with its process: a notebook or a test that goes on may train there next, and another process too."""
    import fcntl
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume"))
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)            # raises BlockingIOError while the run holds it
    finally:
        os.close(fd)


def test_a_forked_worker_holds_no_copy_of_the_out_dir_lock(tmp_path):
    """A process forked while a run holds out_dir's lock (a tokenizer or compile worker) closes its copy of the
    descriptor: once the run lets go (or is killed), the folder is free though the worker lives on."""
    import fcntl
    import time
    checkpoint.lock_out_dir(str(tmp_path))
    ready, say = os.pipe()
    child = os.fork()
    if child == 0:                                              # the worker (the fork's hooks have run): outlives
        os.write(say, b"1")                                     # the run's lock
        time.sleep(5)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"1"
        checkpoint.unlock_out_dir()
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)        # raises BlockingIOError while a copy is open
        finally:
            os.close(fd)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
        os.close(ready)
        os.close(say)


def test_an_out_dir_that_cannot_be_made_names_why(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=r"cannot create the output folder .*afile/sub: .*afile is a file, not a folder; "
                                         r"choose another --out_dir"):
        checkpoint.check_out_dir(str(tmp_path / "afile" / "sub"))


def test_an_out_dir_linked_to_a_folder_not_made_yet_is_made_where_it_points(byte_data, tmp_path):
    """out -> /scratch/out before /scratch/out exists: makedirs on the link said 'File exists'; the run now writes
    where the link points (as data.py's --out), the link stays, and a refused command leaves no folder there."""
    (tmp_path / "out").symlink_to(tmp_path / "scratch" / "out")
    with pytest.raises(FileNotFoundError, match="no such file"):        # refused after out_dir's check
        train.main(tiny_args(byte_data, tmp_path / "out", "--hellaswag=on", f"--hellaswag_path={tmp_path}/none"))
    assert not (tmp_path / "scratch").exists()
    train.main(tiny_args(byte_data, tmp_path / "out", "--max_iters=2", "--eval_interval=2"))
    assert (tmp_path / "out").is_symlink() and (tmp_path / "scratch" / "out" / "ckpt.pt").is_file()


def test_a_folder_where_the_run_writes_its_checkpoint_is_refused_before_any_work(tmp_path):
    for name in ("ckpt.pt", "ckpt_best.pt", "ckpt_step000002.pt"):
        (tmp_path / name).mkdir()
        with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / name))} is a folder, where the run writes a "
                                             "checkpoint: move it away, or choose another --out_dir$"):
            checkpoint.check(configurator.Config(out_dir=str(tmp_path)))
        checkpoint.check(configurator.Config(out_dir=str(tmp_path), save_checkpoints=False))     # it writes none
        (tmp_path / name).rmdir()


def test_a_checkpoint_from_before_the_pure_model_still_resumes_and_loads(byte_data, tmp_path):
    """Checkpoints written before the model lost its training flags carry them in their config (cuda_graphs,
    fused_ce, fp8_head, fused_ce_chunk): sample.py and eval.py load the weights with the plain head, and a
    resume continues as the same checkpoint without those keys does."""
    import sample
    for name in ("old", "new"):
        train.main(tiny_args(byte_data, tmp_path / name, "--max_iters=4"))
    ckpt = torch.load(tmp_path / "old" / "ckpt.pt", weights_only=True)
    ckpt["config"].update(cuda_graphs=False, fused_ce=True, fp8_head=False, fused_ce_chunk=16384)
    torch.save(ckpt, tmp_path / "old" / "ckpt.pt")
    model, meta = sample.load_model(str(tmp_path / "old"), "cpu")
    assert model.head_loss is None and not hasattr(model.config, "fused_ce")
    idx = torch.zeros(1, 8, dtype=torch.long)
    new_model, _ = sample.load_model(str(tmp_path / "new"), "cpu")
    assert torch.equal(model(idx)[0], new_model(idx)[0])
    for name in ("old", "new"):
        train.main(tiny_args(byte_data, tmp_path / name, "--max_iters=8", "--init_from=resume"))
    assert losses(tmp_path / "old") == losses(tmp_path / "new")


def test_a_refused_run_leaves_no_out_dir_behind(byte_data, tmp_path):
    """out_dir's check makes the folder to try writing there and removes what it made, so a run refused by a later
    check or by the batch plan (which comes after the checks) leaves no empty folder; one that starts makes it."""
    out = tmp_path / "new" / "out"
    with pytest.raises(ValueError, match="total_batch_size"):
        train.main(tiny_args(byte_data, out, "--total_batch_size=1000"))
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError, match="total_batch_size"):
        train.main(tiny_args(byte_data, tmp_path / "kept", "--total_batch_size=1000"))
    assert (tmp_path / "kept").is_dir()                                  # a folder that was there stays
    train.main(tiny_args(byte_data, out, "--max_iters=1", "--eval_tokens=0"))
    assert (out / "summary.json").is_file()


def test_a_checkpoint_file_named_with_a_trailing_slash_is_that_file(tmp_path):
    """`--out_dir=run/ckpt.pt/` (a slash typed on, as after a folder) read run/ckpt.pt/ckpt.pt: 'no checkpoint'.
    The file is meant; a folder keeps its own ckpt.pt, with or without the slash."""
    (tmp_path / "ckpt.pt").write_bytes(b"")
    assert checkpoint.checkpoint_file(f"{tmp_path}/ckpt.pt/") == f"{tmp_path}/ckpt.pt"
    assert checkpoint.checkpoint_file(f"{tmp_path}/ckpt_step000004.pt/") == f"{tmp_path}/ckpt_step000004.pt"
    assert checkpoint.checkpoint_file(f"{tmp_path}/") == f"{tmp_path}/ckpt.pt"
    assert checkpoint.checkpoint_file(str(tmp_path)) == f"{tmp_path}/ckpt.pt"
