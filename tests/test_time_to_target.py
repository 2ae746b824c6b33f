"""benchmarks/time_to_target.py on the CPU: the corpus of .py files (deduplicated by content), the first
evaluation at or below the target from a run's metrics.jsonl, two tiny recipes end to end, and the launcher that
times nanoGPT's train.py around its evaluations (a stand-in train.py with the same lines) or refuses a changed one."""
import json
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import time_to_target as ttt  # noqa: E402


def test_python_files_keep_one_file_of_each_content(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("print(1)\n")
    (tmp_path / "a" / "copy.py").write_text("print(1)\n")
    (tmp_path / "a" / "y.py").write_text("print(2)\n")
    (tmp_path / "a" / "notes.txt").write_text("not python\n")
    files = ttt.python_files([str(tmp_path)])
    assert [os.path.basename(p) for p, _ in files] == ["copy.py", "y.py"]           # sorted; x.py repeats copy.py
    assert [d for _, d in files] == [b"print(1)\n", b"print(2)\n"]


def test_the_first_evaluation_at_or_below_the_target_counts():
    rows = [(0, 5.0, 0, 0.0), (10, 3.0, 100, 1.5), (20, 2.4, 200, 3.0), (30, 2.5, 300, 4.5)]
    assert ttt.first_at_or_below(rows, 2.5) == (20, 2.4, 200, 3.0)
    assert ttt.first_at_or_below(rows, 6.0) == (10, 3.0, 100, 1.5)                 # step 0 never counts
    assert ttt.first_at_or_below(rows, 1.0) is None


def test_two_recipes_train_and_the_table_names_where_each_reached_the_target(byte_data, tmp_path, capsys):
    tiny = "--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=4 --log_interval=1"
    ttt.main(["--config", "", "--data_dir", str(byte_data), "--seeds", "1", "--max_iters", "4", "--eval_interval", "2",
              "--train_args", tiny, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    rows = ttt.evals(str(tmp_path / "adamw_1"))
    assert [r[0] for r in rows] == [0, 2, 4] and all(r[3] is not None and r[2] >= 0 for r in rows)
    assert rows[2][2] > rows[1][2] > 0                                             # tokens grow
    target = max(ttt.evals(str(tmp_path / name))[-1][1] for name in ("adamw_1", "muon_1"))
    assert f"Target val loss {target:.4f} (the highest final)" in out
    assert "| ours, adamw | 1 |" in out and "| ours, muon | 1 |" in out and "not reached" not in out
    # every evaluation, printed and in curves.json: the path to the target, not only where it was crossed
    assert "| run | 2 | 4 |" in out and f"| ours, adamw 1, val loss | {rows[1][1]:.4f} | {rows[2][1]:.4f} |" in out
    assert f"| ours, adamw 1, seconds | {rows[1][3]:.1f} | {rows[2][3]:.1f} |" in out
    saved = json.loads((tmp_path / "curves.json").read_text())
    assert saved["target"] == target and [r["run"] for r in saved["runs"]] == ["ours, adamw", "ours, muon"]
    assert saved["runs"][0]["evals"] == [dict(step=r[0], val_loss=r[1], tokens=r[2], train_seconds=r[3]) for r in rows]
    config = json.loads((tmp_path / "muon_1" / "config.json").read_text())
    assert (config["optimizer"], config["lr_schedule"], config["max_iters"]) == ("muon", "wsd", 4)


FAKE_TRAIN = '''import time
import torch
raw_model = torch.nn.Linear(2, 2)
tokens_per_iter = 8
def estimate_loss():
    time.sleep(0.05)
    return {"val": 1.0}
t0 = time.time()
local_iter_num = 0
for iter_num in range(0, 7):
    model_args = dict(n_layer=1)
    if iter_num % 3 == 0:
        losses = estimate_loss()
    time.sleep(0.01)
'''


def test_the_launcher_keeps_a_copy_and_the_training_time_at_each_evaluation(tmp_path):
    nanogpt = tmp_path / "nanogpt"
    nanogpt.mkdir()
    (nanogpt / "train.py").write_text(FAKE_TRAIN)
    rows = ttt.launch_nanogpt(str(nanogpt), ["--x=1"], str(tmp_path / "run"))
    assert [(r["step"], r["tokens"]) for r in rows] == [(3, 24), (6, 48)]          # iteration 0: nothing trained
    assert 0 < rows[0]["train_seconds"] <= rows[1]["train_seconds"]
    assert all(os.path.isfile(r["path"]) for r in rows)


def test_a_changed_nanogpt_train_py_is_refused_in_one_line(tmp_path):
    nanogpt = tmp_path / "nanogpt"
    nanogpt.mkdir()
    (nanogpt / "train.py").write_text(FAKE_TRAIN.replace("        losses = estimate_loss()\n", "        pass\n"))
    assert ttt.launch_nanogpt(str(nanogpt), [], str(tmp_path / "run")) == []
    log = (tmp_path / "run" / "train.log").read_text().strip().splitlines()
    assert log == ["error: nanoGPT's train.py has changed (no 'losses = estimate_loss()'): use the pinned commit"]


def test_a_failed_run_stops_it_in_one_line(byte_data, tmp_path):
    """A run that fails after the checks (here: its data folder holds no val split) ends the benchmark in one line."""
    broken = tmp_path / "data"
    broken.mkdir()
    (broken / "meta.json").write_text((byte_data / "meta.json").read_text())
    with pytest.raises(SystemExit, match=r"^error: run adamw seed 1 failed: .* \(log: "):
        ttt.main(["--config", "", "--data_dir", str(broken), "--seeds", "1", "--out", str(tmp_path / "out")])


@pytest.mark.parametrize("argv, message", [
    (["--runs", "sgd"], "--runs 'sgd': the recipes are adamw, muon"),
    (["--seeds", "x"], "--seeds 'x': comma-separated integers"),
    (["--nanogpt", "/nonexistent"], "no nanoGPT train.py in '/nonexistent'"),
    (["--max_iters", "0"], "--max_iters 0: give a positive number of steps"),
    (["--eval_interval", "-2"], "--eval_interval -2: give a positive number of steps"),
    (["--eval_interval", "8", "--max_iters", "4"], r"--eval_interval 8 is longer than the run \(--max_iters 4\)"),
    (["--target", "nan"], "--target nan: a finite val loss"),
    (["--max_iters", "x"], "argument --max_iters: invalid int value: 'x' .*--help lists every flag"),
    (["--train_args=--n_layer=2", "--train_args=--out_dir=/tmp/x"], "--train_args sets --out_dir, which this script sets"),
    (["--data_dir", "/nonexistent"], "--data_dir '/nonexistent' is not a prepared folder"),
    (["--config", "config/none.py"], "the adamw runs: config file 'config/none.py' not found"),
])
def test_bad_input_is_refused_in_one_line(argv, message, tmp_path):
    """Each refusal comes before the corpus is prepared (nothing in --out but the folder)."""
    with pytest.raises(SystemExit, match=message):
        ttt.main([*argv, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "data").exists()


def test_a_preset_this_machine_cannot_run_is_refused_before_the_corpus(tmp_path, monkeypatch):
    """config/fast.py's FP8 blocks and head need a GPU: on a CPU the default command stops before preparing the .py files."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit,
                       match=r"the adamw runs: a GPU-sized run \(steps of 524,288 tokens\) on the CPU: every change "
                             r"it needs, at once: \[1\] fp8=True and fp8_head=True need a GPU.*without a CUDA GPU: "
                             r"--config ''"):
        ttt.main(["--out", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "data").exists()
    # that line's way out, followed: GPT-2 124M at 64 x 1024 does not fit a 24 GB CPU, said before the corpus too
    # (the corpus is GPT-2's tokens, so the estimate needs no prepared folder)
    from speedgpt import memory
    monkeypatch.setattr(memory, "available", lambda device: 24e9)
    with pytest.raises(SystemExit, match=r"the adamw runs: this run needs about \d+\.\d GB per process .* 24\.0 GB"):
        ttt.main(["--out", str(tmp_path / "out"), "--train_args=--fp8=False --fp8_head=False"])
    assert not (tmp_path / "out" / "data").exists()


def test_a_nanogpt_snapshot_is_scored_by_our_evaluator_on_our_val_tokens(byte_data, tmp_path):
    """A snapshot in nanoGPT's layout (its vocabulary unpadded, model_args beside the weights) scores what our
    own model with those weights scores on the whole val split without the document mask."""
    import torch
    from data import Loader
    from model import GPT, GPTConfig
    from speedgpt.evaluation import estimate_loss
    torch.manual_seed(0)
    args = dict(n_layer=1, n_head=2, n_embd=32, block_size=64, bias=False, vocab_size=257, dropout=0.0)
    model = GPT(GPTConfig(**{k: v for k, v in args.items() if k != "dropout"}))
    theirs = {k: (v[:257] if k in ("transformer.wte.weight", "lm_head.weight") else v)
              for k, v in model.state_dict().items()}
    torch.save({"model": theirs, "model_args": args}, tmp_path / "iter000010.pt")
    loader = Loader(str(byte_data), "val", batch_size=16, block_size=64, seed=1, document_mask=False, eot=256,
                    vocab_size=257)
    want = estimate_loss(model, loader, loader.n_rows, __import__("contextlib").nullcontext(), torch.ones(257))[0]
    assert abs(ttt.score(str(tmp_path / "iter000010.pt"), str(byte_data)) - want) < 1e-6
