"""speedgpt/resume.py on the CPU: what a resume continues. (The config a resume takes is also tested in
tests/test_configurator.py, the checkpoint files in tests/test_checkpoint.py, exact continuation in
tests/test_train.py and tests/test_distributed.py.)"""
import train
from conftest import sigterm_in_step, tiny_args
from speedgpt import resume


def test_a_resume_trains_with_the_optimizer_settings_it_says(byte_data, tmp_path, monkeypatch):
    """The optimizer's settings are kept from the checkpoint unless set (as the schedule is), and one set explicitly
    on resume is the one the optimizer uses: a saved state dict brings its groups' old settings back, which used to
    win over the config while the resume printed 'weight_decay 0.5 -> 0.1'."""
    seen = []
    restore = resume.restore_state

    def recording(ckpt, model, optimizer, *args):
        notes = restore(ckpt, model, optimizer, *args)
        seen.append([(g["weight_decay"], g["betas"]) for g in optimizer.param_groups])
        return notes
    monkeypatch.setattr(resume, "restore_state", recording)
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--weight_decay=0.5", "--beta2=0.99"))
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=6", "--init_from=resume"))
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=8", "--init_from=resume", "--weight_decay=0.2",
                         "--beta1=0.8"))
    assert seen[0] == [(0.5, (0.9, 0.99)), (0.0, (0.9, 0.99))]          # the checkpoint's, as not set
    assert seen[1] == [(0.2, (0.8, 0.99)), (0.0, (0.8, 0.99))]          # set on resume: the config's


def test_a_resume_keeps_the_runs_max_iters_unless_given(byte_data, tmp_path, capsys):
    """max_iters is the run's: a resume without it continues to the checkpoint's (a finished run says so and trains
    nothing), not to the default's 500; --max_iters given trains on."""
    common = [a for a in tiny_args(byte_data, tmp_path) if not a.startswith("--max_iters")]
    train.main(common + ["--max_iters=4"])
    assert train.main(common + ["--init_from=resume"])["finished"]
    assert "is at step 4 = max_iters; to train on, give a larger --max_iters" in capsys.readouterr().out
    assert train.main(common + ["--init_from=resume", "--max_iters=6"])["steps"] == 6


def test_a_resume_keeps_the_runs_count_of_kept_checkpoints(byte_data, tmp_path, capsys):
    """keep_checkpoints is the run's: a resume without it must not prune the run's older steps down to the default's
    3; with --save_checkpoints=False the saved count is dropped (it would be refused as doing nothing), and the
    last line says ckpt.pt holds the step it resumed from, not this run's last."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=20", "--eval_interval=2", "--keep_checkpoints=8"))
    kept = sorted(p.name for p in tmp_path.glob("ckpt_step*.pt"))
    assert len(kept) == 8
    train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=24", "--eval_interval=2"))
    after = sorted(p.name for p in tmp_path.glob("ckpt_step*.pt"))
    assert len(after) == 8 and after[-1] == "ckpt_step000024.pt"
    capsys.readouterr()
    summary = train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=26", "--eval_interval=2",
                                   "--save_checkpoints=False"))
    assert summary["checkpoint_step"] == 24 and f"checkpoint {tmp_path / 'ckpt.pt'} (step 24) | " in \
        capsys.readouterr().out


def test_resume_from_another_folders_checkpoint_leaves_this_folders_run_alone(byte_data, tmp_path):
    """resume_from a file of the run in folder a, into folder b that holds a run of its own: refused before anything
    changes, where it used to take b's history as its past, remove b's later steps and name b's step as its best.
    Into a new folder it resumes; a's own file kept elsewhere resumes into a (tests/test_checkpoint.py)."""
    import os
    import pytest
    train.main(tiny_args(byte_data, tmp_path / "a", "--max_iters=8", "--keep_checkpoints=5"))
    train.main(tiny_args(byte_data, tmp_path / "b", "--max_iters=8", "--seed=9"))
    before = sorted(os.listdir(tmp_path / "b"))
    with pytest.raises(ValueError, match=r"^resume_from='.*/a/ckpt_step000004.pt' is a checkpoint of the run in .*/a, "
                                         r"but .*/b holds another run \(steps 4, 8\), whose later steps this resume "
                                         r"would remove: resume it in its own folder \(--out_dir=.*/a\), or in a new "
                                         r"--out_dir$"):
        train.main(tiny_args(byte_data, tmp_path / "b", f"--resume_from={tmp_path / 'a' / 'ckpt_step000004.pt'}"))
    assert sorted(os.listdir(tmp_path / "b")) == before
    summary = train.main(tiny_args(byte_data, tmp_path / "c", f"--resume_from={tmp_path / 'a' / 'ckpt_step000004.pt'}"))
    assert summary["steps"] == 8


def test_a_runs_own_file_kept_elsewhere_resumes_though_its_out_dir_was_relative(byte_data, tmp_path, monkeypatch):
    """A run's checkpoints carry its run_id, which a resume keeps: a file of its own copied elsewhere resumes into
    its folder from any working folder, though the out_dir it was saved with ("rel") is relative, and the same folder
    moved resumes too; the other folder's run (another run_id) is still refused."""
    import os
    import shutil
    import pytest
    monkeypatch.chdir(tmp_path)
    train.main(tiny_args(byte_data, "rel", "--max_iters=8", "--keep_checkpoints=5"))
    backup = tmp_path / "backup.pt"
    shutil.copy(tmp_path / "rel" / "ckpt_step000004.pt", backup)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")                   # "rel" from here would be elsewhere/rel
    shutil.move(tmp_path / "rel", tmp_path / "moved")
    assert train.main(tiny_args(byte_data, tmp_path / "moved", f"--resume_from={backup}"))["steps"] == 8
    train.main(tiny_args(byte_data, tmp_path / "other", "--max_iters=8", "--seed=9"))
    with pytest.raises(ValueError, match=r"is a checkpoint of the run in rel, but .*/other holds another run"):
        train.main(tiny_args(byte_data, tmp_path / "other", f"--resume_from={backup}"))
    assert os.path.isfile(tmp_path / "other" / "ckpt_step000008.pt")


def test_a_resume_whose_kept_step_does_not_divide_says_it_is_the_checkpoints(byte_data, tmp_path):
    """A resume keeps the checkpoint's tokens per optimizer step (here 256 = 4 x 64, which the first run made of
    total_batch_size=0); a batch_size that does not divide it names that number as the checkpoint's, which the user
    never set, and is refused before any step."""
    import pytest
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with pytest.raises(ValueError, match=r"^total_batch_size=256 tokens \(the checkpoint's: a resume keeps its step\) "
                                         r"is not a multiple of batch_size x block_size x processes = 3 x 64 x 1 = "
                                         r"192: change batch_size or total_batch_size$"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--batch_size=3"))


def test_a_resume_validates_on_the_runs_rows_and_refuses_another_seed(byte_data, tmp_path):
    """The seed and eval_tokens choose the validation rows: a resume that leaves them out keeps the checkpoint's, so
    the step it resumes at scores as the uninterrupted run did (the defaults' swapped in other rows under the same
    val loss, which ckpt_best.pt compared with the run's best, while the data order went on as the checkpoint's);
    another seed given is refused before anything in out_dir changes."""
    import os
    import pytest
    from conftest import read_metrics
    def args(out, *extra):
        return [a for a in tiny_args(byte_data, out, *extra) if not a.startswith("--eval_tokens")]
    train.main(args(tmp_path / "a", "--max_iters=8", "--lr_decay_iters=8", "--seed=5", "--eval_tokens=256"))
    train.main(args(tmp_path / "b", "--max_iters=4", "--lr_decay_iters=8", "--seed=5", "--eval_tokens=256"))
    before = {p: os.path.getmtime(tmp_path / "b" / p) for p in os.listdir(tmp_path / "b")}
    with pytest.raises(ValueError, match=r"^seed=7 differs from the checkpoint's 5: a resume continues the run's data "
                                         r"order, dropout and validation rows, which its seed chose; leave seed unset "
                                         r"\(no --seed, none in a config file\), or start a new run from its weights in a new folder \(--init_from=.*/b/"
                                         r"ckpt.pt --out_dir=NEW_FOLDER\)$"):
        train.main(args(tmp_path / "b", "--init_from=resume", "--max_iters=8", "--seed=7"))
    assert {p: os.path.getmtime(tmp_path / "b" / p) for p in os.listdir(tmp_path / "b")} == before
    train.main(args(tmp_path / "b", "--init_from=resume", "--max_iters=8"))
    def val(out):
        return [(r["step"], r["val_loss"]) for r in read_metrics(out) if "val_loss" in r]
    def loss(out):
        return [(r["step"], r["loss"]) for r in read_metrics(out) if "loss" in r]
    assert val(tmp_path / "b") == val(tmp_path / "a") and loss(tmp_path / "b") == loss(tmp_path / "a")


def test_a_run_stopped_by_a_signal_in_its_last_step_resumes_to_its_final_evaluation(byte_data, tmp_path, monkeypatch):
    """A SIGTERM during the last step (preemption) saves the checkpoint of step max_iters before the final
    evaluation; the resume its line asks for makes that evaluation and checkpoint, as the uninterrupted run did,
    where it used to say the run was finished: its final val loss, ckpt_best.pt and summary.json never came."""
    import json
    import pytest
    from speedgpt import checkpoint, optim
    done = train.main(tiny_args(byte_data, tmp_path / "a"))                  # max_iters=8, evaluated every 4
    real = sigterm_in_step(monkeypatch, 7)
    with pytest.raises(train.RunStopped, match="SIGTERM: stopped after step 7"):
        train.main(tiny_args(byte_data, tmp_path / "b"))
    monkeypatch.setattr(optim, "set_lr", real)
    resumed = train.main(tiny_args(byte_data, tmp_path / "b", "--init_from=resume"))
    assert "finished" not in resumed and resumed["val_loss"] == done["val_loss"]
    assert json.load(open(tmp_path / "b" / "summary.json"))["val_loss"] == done["val_loss"]
    assert checkpoint.checkpoint_step(str(tmp_path / "b" / "ckpt_best.pt")) == 8
    assert train.main(tiny_args(byte_data, tmp_path / "b", "--init_from=resume"))["finished"]    # now it is
