"""benchmarks/time_to_target.py on the CPU: the corpus of .py files (deduplicated by content), the first
evaluation at or below the target from a run's metrics.jsonl, the protocol's choice of each recipe's best setting and
its table (on made-up runs), a tiny sweep end to end on tokens and on minutes, and the launcher that times nanoGPT's
train.py around its evaluations (a stand-in train.py with the same lines) or refuses a changed one."""
import json
import os
import re
import sys
import types
import warnings
from dataclasses import asdict

import pytest

import configurator
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


def row(recipe, batch, scale, seed, hit_seconds=None, final=3.0, tokens=1000):
    """A run's row as train_run gives it: reached the target at hit_seconds (None: never)."""
    hit = (10, 2.9, tokens, hit_seconds) if hit_seconds is not None else None
    return {"recipe": recipe, "batch_tokens": batch, "lr_scale": scale, "lr": {"learning_rate": 1e-3 * scale},
            "seed": seed, "evals": [(0, 5.0, 0, 0.0), (10, final, tokens, hit_seconds or 9.0)], "hit": hit,
            "final": final, "compile_s": 1.0}


def test_the_best_setting_reaches_the_target_soonest_else_has_the_lowest_final_loss():
    rows = [row("adamw", 256, 1, 1, None, final=2.5), row("adamw", 512, 1, 1, 8.0, final=2.8),
            row("adamw", 256, 2, 1, 6.0, final=2.9, tokens=3000), row("adamw", 512, 2, 1, 6.0, final=2.7, tokens=2000)]
    assert ttt.best(rows) is rows[3]                                  # the fewest seconds; a tie: the fewest tokens
    assert ttt.best(rows, by_time=False) is rows[0]                   # --minutes: the best model, reached or not
    same_work = [row("muon", 256, 1, 1, 4.1, final=2.6), row("muon", 256, 2, 1, 4.0, final=2.7),
                 row("muon", 512, 1, 1, 4.05, final=2.5)]
    assert ttt.best(same_work) is same_work[0]      # at one evaluation of one step size: noise apart, the lower final
    never = [row("muon", 256, 1, 1, final=3.1), row("muon", 512, 1, 1, final=3.0)]
    assert ttt.best(never) is never[1]                                # none reached it: the lowest final loss


def test_a_minutes_run_that_ends_inside_its_warmup_is_named_beside_the_tables():
    """train.py says it in the run's log alone; the tables would show its loss as its recipe's."""
    args = types.SimpleNamespace(minutes=0.5, tokens=2560, warmup_frac=0.2)       # 512 per step: 5 steps, 1 warm-up
    short, long = row("adamw", 256, 1, 1, final=4.0), row("muon", 512, 2, 3, final=3.0)   # at 256: 2 warm-up steps
    short["evals"] = [(0, 5.0, 0, 0.0), (1, 4.0, 256, 30.0)]
    assert ttt.inside_warmup(args, [short, long]) == [
        "note: adamw, 256 tokens per step, lr x1, seed 1: its 0.5 minutes ended at step 1, inside its warm-up (2 "
        "steps): the learning rate never reached its peak; give a smaller --warmup_frac (or --tokens, its scale) or "
        "more --minutes"]
    assert ttt.inside_warmup(types.SimpleNamespace(minutes=0.0, tokens=2560, warmup_frac=0.2), [short]) == []


def test_the_protocol_sweeps_picks_each_recipes_best_runs_its_seeds_and_prints_one_table_last(byte_data, tmp_path,
                                                                                              monkeypatch, capsys):
    """On made-up runs (train_run replaced): the sweep at the first seed, the best setting of each recipe at every
    seed, then one table, mean +- sd over the seeds, printed last and saved with every run's evaluations."""
    seconds = {("adamw", 256, 1.0): 9.0, ("adamw", 512, 1.0): 7.0, ("adamw", 256, 2.0): None, ("adamw", 512, 2.0): 8.0,
               ("muon", 256, 1.0): 3.0, ("muon", 512, 1.0): 4.0, ("muon", 256, 2.0): 5.0, ("muon", 512, 2.0): 6.0}
    later = {("adamw", 512, 1.0, 2): 7.5, ("adamw", 512, 1.0, 3): 8.5}      # the chosen setting's other seeds
    calls = []

    def fake(args, recipe, setting, seed, data_dir):
        key = (recipe, setting["batch_tokens"], setting["lr_scale"])
        calls.append((*key, seed))
        hit = later.get((*key, seed), seconds[key])
        curve = [(0, 5.0, 0, 0.0), (4, 2.0, 1024, hit)] if hit else [(0, 5.0, 0, 0.0), (4, 3.5, 1024, 9.0)]
        return ttt.result(recipe, setting, seed, curve, args.target, 1.5)
    monkeypatch.setattr(ttt, "train_run", fake)
    tiny = "--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=4"
    ttt.main(["--target", "2.5", "--config", "", "--data_dir", str(byte_data), "--batch_tokens", "256,512",
              "--lr_scales", "1,2", "--seeds", "1,2,3", "--tokens", "2048", "--eval_every", "1024", "--train_args",
              tiny, "--out", str(tmp_path)])
    sweep = [(r, b, s, 1) for r in ("adamw", "muon") for b in (256, 512) for s in (1.0, 2.0)]
    assert calls == sweep + [("adamw", 512, 1.0, 2), ("adamw", 512, 1.0, 3),     # each recipe's best, at the other
                             ("muon", 256, 1.0, 2), ("muon", 256, 1.0, 3)]      # seeds
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-4:] == [
        "| recipe | tokens per step | peak lr | reached | time to target, s | tokens to target | final val loss "
        "| compile, s |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
        "| adamw | 512 | learning_rate 0.003 | 3 of 3 | 7.7 ± 0.8 | 1,024 ± 0 | 2.0000 ± 0.0000 | 1.5 ± 0.0 |",
        "| muon | 256 | muon_lr 0.02 | 3 of 3 | 3.0 ± 0.0 | 1,024 ± 0 | 2.0000 ± 0.0000 | 1.5 ± 0.0 |"]
    assert "note: muon's best is at the edge of the sweep (lr_scales 1.0): its optimum may lie beyond; widen " \
           "--lr_scales" in out
    assert "| adamw | 256 | learning_rate 0.006 | not reached |  | 3.5000 |" in out      # every setting of the sweep
    saved = json.loads((tmp_path / "time_to_target.json").read_text())
    assert saved["target"] == 2.5 and len(saved["sweep"]) == 8 and len(saved["runs"]) == 12
    assert saved["table"][0]["train_seconds"] == [7.0, 7.5, 8.5] and saved["table"][0]["seeds"] == [1, 2, 3]
    assert saved["runs"][0]["evals"][1] == {"step": 4, "val_loss": 2.0, "tokens": 1024, "train_seconds": 9.0}


@pytest.mark.slow
@pytest.mark.parametrize("minutes", [None, "0.01"])
def test_a_tiny_sweep_runs_end_to_end(short_data, tmp_path, capsys, minutes):
    """Two recipes, two steps' sizes, two seeds, on the same tokens (or the same minutes of training: train.py's
    time budget): every run's evaluations, the chosen setting at both seeds, the table last. (short_data: a val
    split of a few thousand tokens, each evaluation being all of it.)"""
    tiny = "--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=4 --log_interval=1"
    ttt.main(["--target", "5.0", "--config", "", "--data_dir", str(short_data), "--batch_tokens", "256,512",
              "--lr_scales", "1", "--seeds", "1,2", "--tokens", "2048", "--eval_every", "1024", "--train_args", tiny,
              "--out", str(tmp_path), *(["--minutes", minutes] if minutes else [])])
    out = capsys.readouterr().out.strip().splitlines()
    saved = json.loads((tmp_path / "time_to_target.json").read_text())
    assert [(r["recipe"], r["batch_tokens"], r["seed"]) for r in saved["sweep"]] == \
        [("adamw", 256, 1), ("adamw", 512, 1), ("muon", 256, 1), ("muon", 512, 1)]
    assert len(saved["runs"]) == 6 and [r["recipe"] for r in saved["table"]] == ["adamw", "muon"]
    assert out[-2].startswith("| adamw | ") and out[-1].startswith("| muon | ") and " of 2 | " in out[-1]
    run = saved["runs"][1]                      # adamw at 512 tokens per step: 4 steps, evaluated every 2
    config = json.loads((tmp_path / "adamw_b512_lr1_s1" / "config.json").read_text())
    if minutes:
        assert config["time_budget"] == 0.01 and config["max_iters"] == ttt.MAX_STEPS
        summary = json.loads((tmp_path / "adamw_b512_lr1_s1" / "summary.json").read_text())
        assert summary["train_seconds"] >= 0.6 and run["evals"][-1]["train_seconds"] >= 0.6
    else:
        assert [e["step"] for e in run["evals"]] == [0, 2, 4] and run["evals"][-1]["tokens"] == 2048
        assert (config["max_iters"], config["total_batch_size"], config["eval_interval"]) == (4, 512, 2)
    muon = json.loads((tmp_path / "muon_b256_lr1_s1" / "config.json").read_text())
    assert (muon["optimizer"], muon["lr_schedule"]) == ("muon", "wsd")


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
    with pytest.raises(SystemExit, match=r"^error: run adamw_b256_lr1_s1 failed: .* \(log: "):
        ttt.main(["--target", "3", "--config", "", "--data_dir", str(broken), "--batch_tokens", "256",
                  "--lr_scales", "1", "--tokens", "512", "--eval_every", "256", "--seeds", "1", "--train_args",
                  "--batch_size=4 --block_size=64", "--out", str(tmp_path / "out")])


@pytest.mark.parametrize("argv, message", [
    ([], "--target is missing: give the val loss to reach, a positive number fixed before the runs"),
    (["--target", "nan"], "--target nan: give the val loss to reach"),
    (["--target", "3", "--recipes", "sgd"], "--recipes 'sgd': the recipes are adamw, muon"),
    (["--target", "3", "--seeds", "x"], "--seeds 'x': comma-separated positive integers"),
    (["--target", "3", "--batch_tokens", "0,512"], "--batch_tokens '0,512': comma-separated positive integers"),
    (["--target", "3", "--lr_scales", "1,-2"], "--lr_scales '1,-2': comma-separated positive multiples"),
    (["--target", "3", "--lr_scales", "1e300"], r"--lr_scales '1e300': comma-separated positive multiples \(at most"),
    (["--target", "3", "--tokens", "2048", "--batch_tokens", "256"],
     r"--eval_every's default \(a tenth of --tokens\) 204 is not a positive multiple .*; give --eval_every$"),
    (["--target", "3", "--tokens", "2048", "--batch_tokens", "256", "--eval_every", "4096"],
     "--eval_every 4,096 is more than --tokens 2,048"),
    (["--target", "3", "--config", "config/muon.py"],          # the table would say adamw and the runs train Muon
     r"--config config/muon.py sets optimizer='muon', lr_schedule='wsd', which the recipes set"),
    (["--target", "3", "--config", "", "--batch_tokens", "6144", "--tokens", "12288", "--eval_every", "6144"],
     r"--batch_tokens 6,144 is not a multiple of the preset's micro-batch \(16 x 256 = 4,096 tokens\)"),
    (["--target", "3", "--tokens", "1000000"],
     r"--tokens 1,000,000 is not a positive multiple of --batch_tokens 65,536"),
    (["--target", "3", "--eval_every", "100"], r"--eval_every 100 is not a positive multiple of --batch_tokens 65,536"),
    (["--target", "3", "--minutes", "-1"], "--minutes -1.0: minutes of training per run"),
    (["--target", "3", "--warmup_frac", "1"], r"--warmup_frac 1.0: a share of each run's steps, in \[0, 1\)"),
    (["--target", "3", "--nanogpt", "/nonexistent"], "no nanoGPT train.py in '/nonexistent'"),
    (["--target", "3", "--nanogpt_args=--device=cpu"], r"--nanogpt_args without --nanogpt: .* add --nanogpt PATH"),
    (["--target", "3", "--seeds", "1,2,1"], r"^error: --seeds '1,2,1' gives 1 twice: give each once$"),
    (["--target", "3", "--batch_tokens", "65536,65536"], r"--batch_tokens '65536,65536' gives 65536 twice"),
    (["--target", "3", "--lr_scales", "1,1.0"], r"^error: --lr_scales '1,1.0' gives 1 twice: give each once$"),
    (["--target", "3", "--tokens", "x"], "argument --tokens: invalid int value: 'x' .*--help lists every flag"),
    (["--target", "3", "--train_args=--n_layer=2", "--train_args=--total_batch_size=8"],
     "--train_args sets --total_batch_size, which this script sets"),
    (["--target", "3", "--recipes", "adamw", "--train_args=--n_layer=2 --optimizer=muon"],
     r"--train_args sets --optimizer, which the recipe sets .*: choose it with --recipes"),
    (["--target", "3", "--train_args=--lr_schedule=wsd"], r"--train_args sets --lr_schedule, which the recipe sets"),
    (["--target", "3", "--data_dir", "/nonexistent"], "--data_dir '/nonexistent' is not a prepared folder"),
    (["--target", "3", "--config", "config/none.py"], "the adamw runs: config file 'config/none.py' not found"),
    (["--target", "3", "--config", "", "--batch_tokens", "1000", "--tokens", "2000", "--eval_every", "1000"],
     r"--batch_tokens 1,000 is not a multiple of block_size 256: a step below the preset's micro-batch"),
])
def test_bad_input_is_refused_in_one_line(argv, message, tmp_path):
    """Each refusal comes before the corpus is prepared (nothing in --out but the folder)."""
    with pytest.raises(SystemExit, match=message):
        ttt.main([*argv, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "data").exists()


def test_an_out_that_cannot_be_made_is_named_in_words(tmp_path):
    """An --out that is empty, a file, or under a file: the line gave the OS's bare words ("No such file or
    directory", "File exists") for the folder; it says what is wrong with it, as bench.py and data.py do."""
    (tmp_path / "afile").write_text("")
    for out, message in (("", "--out is empty: give the folder for the corpus"),
                         (str(tmp_path / "afile"), f"--out {tmp_path / 'afile'} is a file, not a folder: choose "),
                         (str(tmp_path / "afile" / "t"), f"cannot create the output folder {tmp_path / 'afile' / 't'}: "
                          f"{tmp_path / 'afile'} is a file, not a folder; choose another --out")):
        with pytest.raises(SystemExit) as e:
            ttt.main(["--target", "3", "--out", out])
        assert str(e.value).startswith("error: " + message), e.value


def test_nanogpt_needs_its_step_and_no_time_budget(tmp_path):
    nanogpt = tmp_path / "nanogpt"
    nanogpt.mkdir()
    (nanogpt / "train.py").write_text("")
    for extra in (["--minutes", "1"], ["--tokens", str(3 * 65536), "--batch_tokens", "65536", "--eval_every", "65536"]):
        with pytest.raises(SystemExit, match=r"--nanogpt runs nanoGPT's train.py at its 524,288 tokens per step"):
            ttt.main(["--target", "3", "--nanogpt", str(nanogpt), *extra, "--out", str(tmp_path / "out")])


def test_a_preset_this_machine_cannot_run_is_refused_before_the_corpus(tmp_path, monkeypatch):
    """config/fast.py's runs are a GPU's work: on a CPU the default command stops before preparing the .py files, in
    one line naming the work and a small run that a CPU trains (whose command runs: test_a_tiny_sweep_runs_end_to_end
    runs its kind). On a CPU that could train it, the presets' FP8 blocks and head are refused, every change at once
    (its largest step is checked first: a GPU-sized run's refusals are gathered)."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^error: on a CPU, every run \(12 layers, n_embd 768, 52,428,800 tokens\) "
                                         r"would train [\d,]+ TFLOP, hours each: this benchmark measures a GPU. "
                                         r"A small run on a CPU \(python train.py prepares data/stdlib_byte first\): "
                                         + re.escape(ttt.CPU_EXAMPLE) + "$"):
        ttt.main(["--target", "3", "--out", str(tmp_path / "out" / "ttt")])
    assert not (tmp_path / "out").exists()                  # refused: no folder left behind, --out's parent too
    monkeypatch.setattr(ttt, "CPU_RUN_FLOP", float("inf"))
    with pytest.raises(SystemExit,
                       match=r"the adamw runs: .*every change it needs, at once: \[1\] fp8=True and fp8_head=True need a "
                             r"GPU.*\[2\] gelu_erf='fast' runs Triton kernels on a CUDA GPU.*\[3\] head_kernel=True "
                             r"runs Triton kernels on a CUDA GPU.*; "
                             r"a small run on a CPU: "):
        ttt.main(["--target", "3", "--out", str(tmp_path / "out" / "ttt")])
    assert not (tmp_path / "out").exists()
    # that line's way out, followed: the largest step's 8 micro-steps are refused on a CPU (train.py's line), and
    # at one micro-batch a step GPT-2 124M at 64 x 1024 does not fit a 24 GB CPU, said before the corpus too (the
    # corpus is GPT-2's tokens, so the estimate needs no prepared folder)
    from speedgpt import memory
    monkeypatch.setattr(memory, "available", lambda device: 24e9)
    followed = ["--target", "3", "--out", str(tmp_path / "out"),
                "--train_args=--fp8=False --fp8_head=False --head_kernel=False --gelu_erf=exact"]
    with pytest.raises(SystemExit, match=r"the adamw runs: on a CPU, a step of 8 micro-steps \(524,288 tokens"):
        ttt.main(followed)
    with pytest.raises(SystemExit, match=r"the adamw runs: this run needs about \d+\.\d GB per process .* 24\.0 GB"):
        ttt.main(followed + ["--batch_tokens", "65536"])
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


def test_resume_takes_the_finished_runs_and_trains_only_the_rest(byte_data, tmp_path, monkeypatch, capsys):
    """A sweep stopped midway (here: the third run fails) and run again with --resume trains only the runs it had
    not finished, and gives the table a whole run would; without --resume, or with other flags or another training
    code, every run trains again."""
    calls, fail_at = [], [3]

    def fake(args, recipe, setting, seed, data_dir):
        calls.append((recipe, setting["batch_tokens"], seed))
        if len(calls) == fail_at[0]:
            sys.exit("error: run failed")
        hit = 1.0 + setting["batch_tokens"] / 256 + seed
        return ttt.result(recipe, setting, seed, [(0, 5.0, 0, 0.0), (4, 2.0, 1024, hit)], args.target, 1.5)
    monkeypatch.setattr(ttt, "train_run", fake)
    argv = ["--target", "2.5", "--config", "", "--data_dir", str(byte_data), "--recipes", "adamw", "--batch_tokens",
            "256,512", "--lr_scales", "1", "--seeds", "1,2", "--tokens", "2048", "--eval_every", "1024",
            "--train_args", "--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=4", "--out",
            str(tmp_path)]
    with pytest.raises(SystemExit):
        ttt.main(argv + ["--resume"])
    assert calls == [("adamw", 256, 1), ("adamw", 512, 1), ("adamw", 256, 2)]
    assert f"note: --resume: no {tmp_path / 'runs.jsonl'} yet (no run of this --out has finished): every run " \
           "trains" in capsys.readouterr().out                 # said, rather than resuming nothing in silence
    with open(tmp_path / "runs.jsonl", "a") as f:
        f.write('{"key": "cut')                          # a line the stop cut short is passed over
    calls.clear()
    fail_at[0] = 0
    ttt.main(argv + ["--resume"])
    assert calls == [("adamw", 256, 2)]                  # only the run that failed
    out = capsys.readouterr().out
    assert "2 finished run(s) in" in out and "1 line(s) that are not a run passed over" in out
    assert "2 of the runs taken from" in out
    calls.clear()
    ttt.main(argv + ["--resume"])                        # the run trained after the cut line was not glued to it
    assert calls == [] and "3 finished run(s) in" in capsys.readouterr().out
    shuffled = argv[:-4] + ["--train_args", "--batch_size=4 --block_size 64", "--train_args",
                            "--n_embd=32 --n_head=2 --n_layer=1", "--out", str(tmp_path)]
    ttt.main(shuffled + ["--resume"])                    # the same settings, given in another order and form
    assert calls == []
    resumed = json.loads((tmp_path / "time_to_target.json").read_text())
    calls.clear()
    ttt.main(argv)                                       # without --resume: all of it again, the same table
    assert len(calls) == 3 and json.loads((tmp_path / "time_to_target.json").read_text()) == resumed
    calls.clear()
    ttt.main(argv[:-2] + ["--out", str(tmp_path), "--resume", "--warmup_frac", "0.1"])   # other flags
    assert len(calls) == 3
    calls.clear()
    monkeypatch.setattr(ttt, "code_hash", lambda: "another")                              # other training code
    ttt.main(argv + ["--resume"])
    assert len(calls) == 3
    calls.clear()
    capsys.readouterr()
    lower = argv[:1] + ["1.0"] + argv[2:] + ["--resume"]                                  # another target: the runs
    ttt.main(lower)                                                                       # are taken, the target
    assert calls == [] and "| adamw | 256 |" in capsys.readouterr().out                  # checked anew: none reach it
    assert json.loads((tmp_path / "time_to_target.json").read_text())["table"][0]["reached"] == 0


def test_resume_tells_other_data_and_other_config_files_apart(byte_data, tmp_path, monkeypatch):
    """The same counts in meta.json over other tokens are other data, and a --config file outside config/ that
    changed is another run: neither is taken from runs.jsonl."""
    import shutil
    calls = []

    def fake(args, recipe, setting, seed, data_dir):
        calls.append(data_dir)
        return ttt.result(recipe, setting, seed, [(0, 5.0, 0, 0.0), (4, 2.0, 1024, 1.0)], args.target, 1.5)
    monkeypatch.setattr(ttt, "train_run", fake)
    other = tmp_path / "other"
    shutil.copytree(byte_data, other)
    shard = sorted(other.glob("train_*.bin"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1                                        # one token's byte: the counts stay the same
    shard.write_bytes(bytes(data))
    config = tmp_path / "mine.py"
    config.write_text("n_layer = 1\n")
    argv = ["--target", "2.5", "--config", str(config), "--recipes", "adamw", "--batch_tokens", "256",
            "--lr_scales", "1", "--seeds", "1", "--tokens", "2048", "--eval_every", "1024", "--train_args",
            "--n_head=2 --n_embd=32 --block_size=64 --batch_size=4", "--out", str(tmp_path / "out"), "--resume"]
    for data_dir in (byte_data, byte_data, other):
        ttt.main(argv + ["--data_dir", str(data_dir)])
    assert calls == [str(byte_data), str(other)]
    config.write_text("n_layer = 2\n")
    ttt.main(argv + ["--data_dir", str(byte_data)])
    assert len(calls) == 3


def test_a_stored_row_that_lacks_what_the_table_needs_is_passed_over(byte_data, tmp_path, monkeypatch, capsys):
    calls = []

    def fake(args, recipe, setting, seed, data_dir):
        calls.append(seed)
        return ttt.result(recipe, setting, seed, [(0, 5.0, 0, 0.0), (4, 2.0, 1024, 1.0)], args.target, 1.5)
    monkeypatch.setattr(ttt, "train_run", fake)
    argv = ["--target", "2.5", "--config", "", "--data_dir", str(byte_data), "--recipes", "adamw", "--batch_tokens",
            "256", "--lr_scales", "1", "--seeds", "1", "--tokens", "2048", "--eval_every", "1024", "--train_args",
            "--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=4", "--out", str(tmp_path), "--resume"]
    ttt.main(argv)
    [entry] = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    wrong, flag = json.loads(json.dumps(entry)), json.loads(json.dumps(entry))
    wrong["row"]["evals"][1][1] = "x"                   # JSON, but not a loss the table can print
    flag["row"]["batch_size"] = "x"                     # nor a micro-batch a run's flags can take
    del entry["row"]["compile_s"]
    (tmp_path / "runs.jsonl").write_bytes(json.dumps(entry).encode() + b"\n\xff\xfe not json\n" +
                                          json.dumps(wrong).encode() + b"\n" + json.dumps(flag).encode() + b"\n")
    ttt.main(argv)
    assert calls == [1, 1] and "4 line(s) that are not a run passed over" in capsys.readouterr().out


def test_the_code_hash_follows_the_training_code(tmp_path):
    for name in ("train.py", "model.py", "data.py", "configurator.py"):
        (tmp_path / name).write_text("x = 1\n")
    for folder in ("speedgpt", "config"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("y = 2\n")
    before = ttt.code_hash(str(tmp_path))
    (tmp_path / "README.md").write_text("docs\n")
    (tmp_path / "config" / "a.py").write_text("# measured: ...\ny = 2\n")
    assert ttt.code_hash(str(tmp_path)) == before        # not training code; a preset counts by what it sets (run_key)
    (tmp_path / "speedgpt" / "a.py").write_text("y = 3\n")
    assert ttt.code_hash(str(tmp_path)) != before


def test_blocks_run_at_each_recipes_best_setting_at_every_seed(byte_data, tmp_path, monkeypatch, capsys):
    """--blocks: each block of BLOCKS named runs at each recipe's best setting (found with GPT-2's block, not swept
    again) at every seed, with its model flags, a row of the table each after its recipe's; its runs are saved."""
    calls = []

    def fake(args, recipe, setting, seed, data_dir):
        calls.append((recipe, setting.get("block"), setting["batch_tokens"], seed))
        argv = ttt.train_argv(args, recipe, setting, seed, data_dir, "o")
        assert all(flag in argv for flag in ttt.BLOCKS.get(setting.get("block"), []))
        hit = 3.0 if setting.get("block") == "rope" else 4.0 if setting["batch_tokens"] == 512 else 6.0
        return ttt.result(recipe, setting, seed, [(0, 5.0, 0, 0.0), (4, 2.0, 1024, hit)], args.target, 1.0)
    monkeypatch.setattr(ttt, "train_run", fake)
    tiny = "--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=4"
    ttt.main(["--target", "2.5", "--config", "", "--data_dir", str(byte_data), "--recipes", "adamw",
              "--batch_tokens", "256,512", "--lr_scales", "1", "--seeds", "1,2", "--tokens", "2048", "--eval_every",
              "1024", "--blocks", "rope,modern", "--train_args", tiny, "--out", str(tmp_path)])
    assert calls == [("adamw", None, 256, 1), ("adamw", None, 512, 1), ("adamw", None, 512, 2),
                     ("adamw", "rope", 512, 1), ("adamw", "rope", 512, 2),
                     ("adamw", "modern", 512, 1), ("adamw", "modern", 512, 2)]
    out = capsys.readouterr().out.strip().splitlines()
    assert [line.split(" | ")[0] for line in out[-3:]] == ["| adamw", "| adamw, rope", "| adamw, modern"]
    assert out[-2].split(" | ")[4] == "3.0 ± 0.0"
    assert "'recipe, block': that setting with the block of --blocks (model flags: rope --rope=True; modern " \
           "--norm=rmsnorm --rope=True --qk_norm=True --activation=relu2 --tie_embeddings=False)" \
        in out[-7]
    saved = json.loads((tmp_path / "time_to_target.json").read_text())
    assert len(saved["runs"]) == 2 + 1 + 4 and [r["recipe"] for r in saved["table"]] == ["adamw", "adamw, rope",
                                                                                      "adamw, modern"]


def test_modern_without_one_block_sets_the_other_four():
    """modern-NAME is the five blocks but NAME: what NAME adds among the others, where alone it may not help."""
    singles = ("rmsnorm", "rope", "qk_norm", "relu2", "untied")
    assert sorted(b for b in ttt.BLOCKS if b.startswith("modern-")) == sorted(f"modern-{b}" for b in singles)
    for name in singles:
        assert ttt.BLOCKS[f"modern-{name}"] == [f for b in singles if b != name for f in ttt.BLOCKS[b]]
    assert ttt.BLOCKS["modern-relu2"] == ["--norm=rmsnorm", "--rope=True", "--qk_norm=True", "--tie_embeddings=False"]


def test_blocks_are_refused_in_one_line_where_unknown_or_set_twice(tmp_path):
    with pytest.raises(SystemExit, match=r"--blocks 'rope,swiglu': the blocks are rmsnorm, rope, qk_norm, relu2, "
                                         r"untied, modern \(all five\) and modern-NAME \(the five without NAME\)$"):
        ttt.main(["--target", "3", "--blocks", "rope,swiglu", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match="--train_args sets --rope, which --blocks sets for its rows: leave it out of "
                                         "--train_args, or --blocks out$"):
        ttt.main(["--target", "3", "--blocks", "rope", "--train_args=--rope=True", "--out", str(tmp_path / "a")])
    preset = tmp_path / "rms.py"                 # a preset that sets a block: its rows "without a block" would not be
    preset.write_text('norm = "rmsnorm"\nrope = True\n')                                             # GPT-2's
    with pytest.raises(SystemExit, match=f"--config {preset} sets norm='rmsnorm', rope=True, which --blocks sets for "
                                         "its rows .*: give a preset of GPT-2's block such as config/fast.py, or leave "
                                         "--blocks out$"):
        ttt.main(["--target", "3", "--config", str(preset), "--blocks", "qk_norm", "--out", str(tmp_path / "a")])
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("block", sorted(ttt.BLOCKS))
def test_every_block_passes_the_presets_fp8_checks(block, monkeypatch):
    """Each block of BLOCKS laid over config/fast.py (the script's default --config) passes its FP8 checks on an FP8
    GPU (stood in for; the kernels' own check is a GPU's): fast.py folds GELU into FP8's casts, which a later
    --activation=relu2 drops (fp8's DETAILS), as the script's preflight would otherwise stop the --blocks rows."""
    import torch
    from configurator import load_config
    from conftest import on
    from speedgpt.features import cast_kernel, fp8
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(cast_kernel, "refuse_unready_kernel", lambda *a: None)       # Triton there, its kernels right
    monkeypatch.setattr(cast_kernel, "verify", lambda *a, **k: None)
    fp8.check(load_config(["--config", "config/fast.py", *ttt.BLOCKS[block]]), on(torch.device("cuda")))


def test_speedrun_preset_is_the_sweeps_winning_run():
    """config/speedrun.py laid over config/fast.py trains what the table measured (its header's numbers): the muon
    recipe at 65,536 tokens per step and its default muon_lr with the five blocks (`--blocks modern`), 12,582,912
    tokens with --warmup_frac 0.2, the settings a run of `time_to_target.py --target 3.3 --tokens 12582912
    --batch_tokens 65536 --blocks modern` gives train.py, but for the folders, seed, evaluation and checkpoints, which
    leave the training as it was."""
    args = types.SimpleNamespace(config="config/fast.py", train_args=[], tokens=12582912, minutes=0.0,
                                 warmup_frac=0.2, eval_every=1048576)
    setting = {"batch_tokens": 65536, "lr_scale": 1.0, "lr": {"muon_lr": 0.02}, "block": "modern"}
    swept = configurator.load_config(ttt.train_argv(args, "muon", setting, 1337, "data", "out"))
    preset = configurator.load_config(["--config", "config/fast.py", "--config", "config/speedrun.py"])
    apart = {"out_dir", "data_dir", "seed", "eval_interval", "eval_tokens", "save_checkpoints", "hellaswag"}
    assert [c.lr_decay_iters or c.max_iters for c in (swept, preset)] == [192, 192]     # 0: max_iters
    differ = {k for k, v in asdict(swept).items() if v != asdict(preset)[k]} - apart - {"lr_decay_iters"}
    assert not differ, f"config/speedrun.py differs from the measured run in {sorted(differ)}"


def test_a_step_below_the_presets_micro_batch_takes_a_smaller_micro_batch():
    """--batch_tokens below config/fast.py's micro-batch of 64 x 1024 (the sweep's note: widen it downwards) runs at
    a micro-batch of that step, which train.py's batch plan takes; the preset's own step and larger keep its 64."""
    from speedgpt.distributed import plan_batch
    args = types.SimpleNamespace(config="config/fast.py", train_args=[], tokens=12582912, minutes=0.0,
                                 warmup_frac=0.2, eval_every=1048576, batch_tokens=[32768, 65536, 131072],
                                 lr_scales=[1.0])
    base = configurator.load_config(ttt.base_argv(args, "muon"))
    runs = {s["batch_tokens"]: configurator.load_config(ttt.train_argv(args, "muon", s, 1, "d", "o"))
            for s in ttt.settings(args, "muon", base)}
    assert {batch: cfg.batch_size for batch, cfg in runs.items()} == {32768: 32, 65536: 64, 131072: 64}
    assert [plan_batch(cfg, 1) for cfg in runs.values()] == [1, 1, 2]


def test_a_flag_given_twice_is_one_warning_line_before_the_runs(byte_data, tmp_path, monkeypatch, capsys):
    """It came as Python's raw warning (file, line and source) from a run's key, and again in every run's log."""
    monkeypatch.setattr(ttt, "train_run", lambda args, recipe, setting, seed, data_dir: ttt.result(
        recipe, setting, seed, [(0, 5.0, 0, 0.0), (4, 2.0, 1024, 1.0)], args.target, 1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # nothing reaches Python's own printing
        ttt.main(["--target", "2.5", "--config", "", "--data_dir", str(byte_data), "--recipes", "adamw",
                  "--batch_tokens", "256", "--lr_scales", "1", "--seeds", "1", "--tokens", "2048", "--eval_every",
                  "1024", "--train_args", "--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=4",
                  "--train_args=--n_layer=2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.count("warning: --n_layer is given 2 times (1, 2): the last, 2, is used\n") == 1, out


def test_the_best_step_below_the_micro_batch_keeps_its_micro_batch_at_every_seed(byte_data, tmp_path, monkeypatch):
    """The sweep's best at a step below the preset's micro-batch (4 x 64 tokens here) runs its other seeds and its
    --blocks rows at that step's micro-batch too, each run's flags through train.py's batch plan."""
    from speedgpt.distributed import plan_batch
    plans = []

    def fake(args, recipe, setting, seed, data_dir):
        plans.append((setting["batch_tokens"], seed, setting.get("block"),
                      plan_batch(configurator.load_config(ttt.train_argv(args, recipe, setting, seed, "d", "o")), 1)))
        hit = 1.0 if setting["batch_tokens"] == 128 else 2.0          # the small step reaches the target first
        return ttt.result(recipe, setting, seed, [(0, 5.0, 0, 0.0), (4, 2.0, 1024, hit)], args.target, 1.0)
    monkeypatch.setattr(ttt, "train_run", fake)
    ttt.main(["--target", "2.5", "--config", "", "--data_dir", str(byte_data), "--recipes", "adamw", "--batch_tokens",
              "128,256", "--lr_scales", "1", "--seeds", "1,2", "--tokens", "2048", "--eval_every", "1024",
              "--blocks", "rope", "--train_args", "--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=4",
              "--out", str(tmp_path)])
    assert plans == [(128, 1, None, 1), (256, 1, None, 1), (128, 2, None, 1), (128, 1, "rope", 1), (128, 2, "rope", 1)]
