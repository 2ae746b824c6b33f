"""configurator.py on the CPU. Its command line, without data: `--key=value` and `--key value` alike in
load_config (train.py) and in FlagParser (sample.py, eval.py, hf.py, bench.py), bare bools, values that start
with --, and the closest known name for a misspelled one; config files; the schedule's checks. The config of
a resume (short train.py runs): the schedule kept unless a schedule key is set, the shape taken from the
checkpoint, a changed shape or activation refused, and only the lines that apply printed."""
import json
import re
import subprocess
import sys
import warnings

import pytest
import torch

import bench
import configurator
import eval as eval_script
import hf
import sample
import train
from conftest import ROOT, on, read_metrics, tiny_args

HELP = "(python train.py --help lists every key)"


def test_both_forms_give_the_same_config():
    eq = configurator.load_config(["--config=config/fast.py", "--n_layer=2", "--compile=False", "--out_dir=o",
                                   "--min_lr=-0.0", "--wandb_run_name="])
    space = configurator.load_config(["--config", "config/fast.py", "--n_layer", "2", "--compile", "False",
                                      "--out_dir", "o", "--min_lr", "-0.0", "--wandb_run_name", ""])
    assert eq == space
    assert (eq.n_layer, eq.compile, eq.out_dir, eq.n_embd) == (2, False, "o", 768)   # n_embd: config/fast.py's


def test_a_flag_given_twice_with_two_values_takes_the_last_and_says_so():
    with pytest.warns(UserWarning, match=r"^--learning_rate is given 3 times \(1e-3, 2e-3, 1e-3\): the last, 1e-3, "
                                         r"is used$"):
        cfg = configurator.load_config(["--learning_rate=1e-3", "--learning_rate", "2e-3", "--learning_rate=1e-3"])
    assert cfg.learning_rate == 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # the same value twice, or once: nothing to say
        assert configurator.load_config(["--compile", "--compile=True", "--n_layer=2"]).compile
        assert configurator.load_config(["--learning_rate=1e-3", "--learning_rate=0.001"]).learning_rate == 1e-3


def test_the_other_scripts_say_a_flag_given_twice_too(capsys):
    """sample.py, eval.py, hf.py, bench.py (FlagParser) took the last value silently, where train.py says it."""
    with pytest.raises(SystemExit):
        sample.main(["--top_k", "5", "--top_k=7", "--device=cpu", "--out_dir=/nonexistent"])
    assert capsys.readouterr().err.startswith("warning: --top_k is given 2 times (5, 7): the last, 7, is used\n")
    parser = configurator.FlagParser(prog="x")
    parser.add_argument("--more", action="append", default=[])                # each use adds: nothing to say
    assert parser.parse_args(["--more=a", "--more", "b"]).more == ["a", "b"] and capsys.readouterr().err == ""
    with pytest.raises(SystemExit):                    # a command's flags: said once, by the command's parser
        hf.main(["export", "--out_dir=a", "--out_dir=/nonexistent"])
    assert capsys.readouterr().err == "warning: --out_dir is given 2 times (a, /nonexistent): the last, " \
                                      "/nonexistent, is used\n"


def test_a_bare_bool_is_true_and_only_a_bool_may_be_bare():
    assert configurator.load_config(["--tf32"]).tf32 is True
    cfg = configurator.load_config(["--tf32", "--n_layer", "2", "--fused_adamw"])    # before a flag, at the end
    assert (cfg.tf32, cfg.n_layer, cfg.fused_adamw) == (True, 2, True)
    assert configurator.load_config(["--tf32", "False"]).tf32 is False
    with pytest.raises(TypeError, match=r"config key 'tf32' \(command line\) must be bool, got 'yes' \(str\): "
                                        r"give True or False"):
        configurator.load_config(["--tf32", "yes"])                   # as --tf32=yes
    with pytest.raises(ValueError, match=r"^--n_layer needs a value: --n_layer=VALUE or --n_layer VALUE$"):
        configurator.load_config(["--n_layer"])


def test_a_number_with_leading_zeros_names_them():
    """Python's literals refuse 02 (an int) and read 0.5 or 00 fine: the refusal says what is wrong with 02."""
    with pytest.raises(TypeError, match=r"must be int, got '02' \(str\): Python's numbers take no leading zeros, "
                                        r"give 2$"):
        configurator.load_config(["--max_iters=02"])
    with pytest.raises(TypeError, match=r"must be float, got '007' \(str\): .*, give 7$"):
        configurator.load_config(["--learning_rate=007"])
    assert configurator.load_config(["--max_iters=00"]).max_iters == 0
    with pytest.raises(TypeError, match=r"must be int, got 'two' \(str\)$"):
        configurator.load_config(["--max_iters=two"])


def test_a_value_that_starts_with_dashes_is_never_swallowed():
    with pytest.raises(ValueError, match=r"^--out_dir needs a value: --out_dir=VALUE or --out_dir VALUE "
                                         r"\('--n_layer=2' is a flag: a value that starts with -- takes the = form\)$"):
        configurator.load_config(["--out_dir", "--n_layer=2"])
    with pytest.raises(ValueError, match="^--config needs a file path"):
        configurator.load_config(["--config", "--n_layer=2"])
    assert configurator.load_config(["--out_dir=--x"]).out_dir == "--x"   # the = form says it is one
    with pytest.raises(ValueError, match=r"^cannot parse argument 'n_layer=2': use --key=value or --key value "
                                         r"\(a config file: --config FILE or FILE.py\)$"):
        configurator.load_config(["n_layer=2"])
    with pytest.warns(UserWarning, match="nanoGPT's eval_iters=0 -> eval_tokens=0"):    # nanoGPT's key, space form
        assert configurator.load_config(["--eval_iters", "0"]).eval_tokens == 0


@pytest.mark.parametrize("argv, message", [
    (["--max_iter=5"], f"unknown config key 'max_iter' (command line): did you mean max_iters? {HELP}"),
    (["--max_iter", "5"], f"unknown config key 'max_iter' (command line): did you mean max_iters? {HELP}"),
    (["--compil"], f"unknown config key 'compil' (command line): did you mean compile? {HELP}"),
    (["--lr=1e-3"], f"unknown config key 'lr' (command line): did you mean learning_rate? {HELP}"),
    (["--seq_len=512"], f"unknown config key 'seq_len' (command line): did you mean block_size? {HELP}"),
    (["--xyzzy=1"], "unknown config key 'xyzzy' (command line): python train.py --help lists every key"),
    # difflib's closest would be tie_embeddings, muon_lr, norm, n_head: wrong ways out
    (["--rotary_embeddings"], f"unknown config key 'rotary_embeddings' (command line): did you mean rope? {HELP}"),
    (["--untied_head"], f"unknown config key 'untied_head' (command line): did you mean tie_embeddings=False? {HELP}"),
    (["--muon"], f"unknown config key 'muon' (command line): it is a value: did you mean optimizer=muon? {HELP}"),
    (["--rmsnorm"], f"unknown config key 'rmsnorm' (command line): it is a value: did you mean norm=rmsnorm? {HELP}"),
    (["--auto"], "unknown config key 'auto' (command line): it is a value: did you mean attention=auto or "
                 f"sdpa_backend=auto or hellaswag=auto? {HELP}"),
])
def test_an_unknown_key_names_the_closest(argv, message):
    with pytest.raises(ValueError) as e:
        configurator.load_config(argv)
    assert str(e.value) == message


def test_a_flag_of_data_py_given_to_train_py_says_so():
    """--tokenizer=gpt2 is how data.py prepares a corpus; train.py reads the tokenizer from the folder's meta.json."""
    with pytest.raises(ValueError) as e:
        configurator.load_config(["--tokenizer=gpt2"])
    assert str(e.value) == ("'tokenizer' (command line) is a flag of data.py, not of train.py: prepare the data with "
                            "it (python data.py --tokenizer=... --input CORPUS --out data/NAME), then train on it with "
                            "--data_dir=data/NAME")
    assert configurator.load_config(["--device=mps"]).device == "mps"


def test_an_unknown_key_in_a_config_file_names_the_closest(tmp_path):
    (tmp_path / "c.py").write_text("learning_rat = 1e-3\n")
    with pytest.raises(ValueError) as e:
        configurator.load_config(["--config", str(tmp_path / "c.py")])
    assert str(e.value) == (f"unknown config key 'learning_rat' ({tmp_path / 'c.py'}): did you mean learning_rate? "
                            f"{HELP}")


def test_train_says_it_in_one_line():
    proc = subprocess.run([sys.executable, "train.py", "--max_iter", "5"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        f"error: unknown config key 'max_iter' (command line): did you mean max_iters? {HELP}"], proc.stderr


def run_script(main, argv, capsys):
    """(exit status, stderr) of a script's main(argv) that must stop on bad input."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("main, argv, line", [
    (sample.main, ["--temprature=0.5"], "error: unknown flag '--temprature': did you mean --temperature? "
                                        "(python sample.py --help lists every flag)"),
    (sample.main, ["--temp", "0.5"], "error: unknown flag '--temp': did you mean --temperature? "   # no abbreviations
                                     "(python sample.py --help lists every flag)"),
    (eval_script.main, ["--out_dri", "x"], "error: unknown flag '--out_dri': did you mean --out_dir? "
                                           "(python eval.py --help lists every flag)"),
    (hf.main, ["export", "--out_dr=x"], "error: unknown flag '--out_dr': did you mean --out_dir? "
                                        "(python hf.py export --help lists every flag)"),
    (bench.main, ["--step", "1"], "error: unknown flag '--step': did you mean --steps? "
                                  "(python bench.py --help lists every flag)"),
    (bench.main, ["--xyzzy"], "error: unknown flag '--xyzzy': python bench.py --help lists every flag"),
    (bench.main, ["--n_layer=2"], "error: --n_layer is train.py's: give it after `--` (python bench.py ... -- "
                                  "--n_layer=2)"),
    (sample.main, ["--start", "--num_samples=1"], "error: --start needs a value: --start=VALUE or --start VALUE "
                                                  "(a value that starts with -- takes the = form)"),
    (bench.main, ["--resume", "yes"], "error: argument --resume: must be True or False, got 'yes'"),
    (sample.main, ["stray"], "error: cannot parse argument 'stray': use --key=value or --key value"),
])
def test_scripts_refuse_a_bad_flag_in_one_line(main, argv, line, capsys):
    code, err = run_script(main, argv, capsys)
    assert code == 2 and err.splitlines() == [line], err


def test_scripts_take_the_space_form(tmp_path, capsys):
    """Each script reads `--key value` as `--key=value`: the value reaches the script (which then stops
    on the missing checkpoint or the file given as a folder, naming it)."""
    none = tmp_path / "none"
    code, err = run_script(eval_script.main, ["--out_dir", str(none), "--device", "cpu"], capsys)
    assert code == 1 and err.splitlines() == [f"error: no checkpoint at {none}/ckpt.pt: train first "
                                              f"(python train.py --out_dir={none})"], err
    for main, argv in ((sample.main, ["--out_dir", str(none), "--device", "cpu", "--start", "-x", "--top_k", "0"]),
                       (hf.main, ["export", "--out_dir", str(none)])):
        with pytest.raises(SystemExit, match=f"^error: no checkpoint at {none}/ckpt.pt"):   # the exit message
            main(argv)
    (tmp_path / "file").write_text("")
    code, err = run_script(bench.main, ["--no_loo", "--out", str(tmp_path / "file"), "--steps", "1"], capsys)
    assert code == 2 and err.splitlines() == [f"error: --out {tmp_path / 'file'} is a file, not a folder"], err


@pytest.mark.parametrize("argv, value", [([], False), (["--flag"], True), (["--flag=True"], True),
                                         (["--flag=False"], False), (["--flag", "False"], False),
                                         (["--flag", "--n=3"], True)])
def test_flag_parser_bools_as_train_py(argv, value):
    parser = configurator.FlagParser(prog="x.py")
    parser.add_bool("--flag")
    parser.add_argument("--n", type=int, default=0)
    assert parser.parse_args(argv).flag is value


def test_config_file_errors(tmp_path):
    (tmp_path / "c.py").write_text("n_layer = 2\nlearning_rat = 1e-3\n")
    with pytest.raises(ValueError, match=r"unknown config key 'learning_rat' \(.*c.py\)"):
        configurator.load_config(["--config", str(tmp_path / "c.py")])
    (tmp_path / "s.py").write_text("batch_size = \n")
    with pytest.raises(ValueError, match="s.py.* does not run: SyntaxError"):
        configurator.load_config(["--config", str(tmp_path / "s.py")])
    (tmp_path / "d.py").write_text("batch_size = '8'\n")
    with pytest.raises(TypeError, match="'batch_size'"):
        configurator.load_config(["--config", str(tmp_path / "d.py")])
    cfg = configurator.load_config(["--config", "config/fast.py", "--batch_size=4", "--learning_rate=1"])
    assert (cfg.n_layer, cfg.batch_size, cfg.learning_rate, cfg.compile) == (12, 4, 1.0, True)
    cfg = configurator.load_config(["--batch_size=4", "--config", "config/fast.py"])    # an override beats
    assert (cfg.n_layer, cfg.batch_size) == (12, 4)                                     # the file, wherever
    (tmp_path / "m.py").write_text("import math\nlearning_rate = math.sqrt(1e-6)\n")    # modules are no keys
    assert configurator.load_config(["--config", str(tmp_path / "m.py")]).learning_rate == 1e-3
    (tmp_path / "e.jsonl").write_text('{"text": "hello"}\n')                           # runs, sets nothing
    with pytest.raises(ValueError, match=r"e.jsonl.* is JSON: config files are Python assignments"):
        configurator.load_config(["--config", str(tmp_path / "e.jsonl")])
    (tmp_path / "n.py").write_text('"""a docstring only"""\nimport os\n')
    with pytest.raises(ValueError, match=r"n.py.* sets no key: config files are Python assignments, one key each"):
        configurator.load_config(["--config", str(tmp_path / "n.py")])
    with pytest.raises(ValueError, match=r"'keep_checkpoints' must be positive, got 0 \(to keep none, "
                                         r"--save_checkpoints=False\)"):
        configurator.load_config(["--keep_checkpoints=0"])
    with pytest.raises(ValueError, match=r"'target_val_loss' must be >= 0, got -1.0 \(0 turns it off\)"):
        configurator.load_config(["--target_val_loss=-1"])


def test_a_seed_out_of_range_is_one_line_in_train_py_and_sample_py(tmp_path, capsys):
    """torch.manual_seed takes seeds below 2**64, and a run on several processes seeds rank r from seed x 1,000,003
    + r (a resume on more processes from (seed + step) x 1,000,003 + r): seeds stop at 2**32 - 1, which leaves
    that room, in train.py and sample.py alike, refused in one line naming seed and its range (not torch's
    "Overflow when unpacking long long", after the data is prepared, or sample.py's traceback)."""
    from speedgpt.distributed import seed_rank_stream
    assert configurator.load_config(["--seed=4294967295"]).seed == configurator.SEED_MAX == 2**32 - 1
    with torch.random.fork_rng():                                # the largest seed, a billion steps on: no overflow
        seed_rank_stream(configurator.SEED_MAX + 10**9, 1023)
    for seed in ("99999999999999999999", "4294967296", "-1"):
        with pytest.raises(ValueError, match=rf"^config key 'seed' must be a whole number in \[0, 4294967295\] "
                                             rf"\(2\*\*32 - 1\), got {seed}$"):
            configurator.load_config([f"--seed={seed}"])
        code, err = run_script(sample.main, [f"--out_dir={tmp_path}", "--device=cpu", f"--seed={seed}"], capsys)
        assert code == 2 and err.splitlines() == [f"error: argument --seed: must be a whole number in [0, "
                                                  f"4294967295] (2**32 - 1), got {seed!r}"], err


def test_a_bad_value_from_a_config_file_names_the_file(tmp_path):
    """A value out of range that a config file set (a fork's preset) names that file, where the fix goes; one set
    on the command line, or on the command line over the file, does not."""
    preset = tmp_path / "mine.py"
    preset.write_text("seed = -3\nbatch_size = 0\n")
    with pytest.raises(ValueError, match=rf"^config key 'batch_size' \(set in {re.escape(str(preset))}\) must be "
                                         r"positive, got 0$"):
        configurator.load_config(["--config", str(preset)])
    with pytest.raises(ValueError, match=rf"^config key 'seed' \(set in {re.escape(str(preset))}\) must be a whole"):
        configurator.load_config(["--config", str(preset), "--batch_size=4"])
    with pytest.raises(ValueError, match=r"^config key 'seed' must be a whole"):
        configurator.load_config(["--config", str(preset), "--batch_size=4", "--seed=-1"])
    preset.write_text("device = 'gpu'\nn_embd = 33\nout_dir = ''\n")     # the checks past the ranges name it too
    with pytest.raises(ValueError, match=rf"^n_embd=33 must be divisible by n_head=4 \(set in {re.escape(str(preset))}"):
        configurator.load_config(["--config", str(preset)])
    with pytest.raises(ValueError, match=rf"^config key 'device' \(set in {re.escape(str(preset))}\) must be auto"):
        configurator.load_config(["--config", str(preset), "--n_embd=32"])
    with pytest.raises(ValueError, match=rf"^config key 'out_dir' \(set in {re.escape(str(preset))}\) must not be"):
        configurator.load_config(["--config", str(preset), "--n_embd=32", "--device=cpu"])


@pytest.mark.parametrize("args, match", [
    (["--min_lr=1e-2", "--learning_rate=1e-3"], "min_lr=0.01 is above learning_rate=0.001"),
    (["--warmup_iters=100", "--lr_decay_iters=50"], "lr_decay_iters=50 must exceed warmup_iters=100"),
    (["--grad_accum_steps=4"], "'grad_accum_steps' .* is not a setting: it is derived: set total_batch_size"),
])
def test_schedule_and_batch_errors(args, match):
    with pytest.raises(ValueError, match=match):
        configurator.load_config(args)


def test_warmup_longer_than_the_run_is_a_warning(byte_data, tmp_path, capsys):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=2", "--warmup_iters=30"))
    assert "warning: warmup_iters=30 >= max_iters=2: the learning rate never reaches" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# the config of a resume (resume_config, resume_changes)


def lrs(out_dir):
    return {r["step"]: r["lr"] for r in read_metrics(out_dir) if "lr" in r}


def test_resume_keeps_the_schedule_unless_a_schedule_key_is_set(byte_data, tmp_path, capsys):
    args = ["--max_iters=20", "--eval_interval=10", "--warmup_iters=2", "--eval_tokens=256"]
    train.main(tiny_args(byte_data, tmp_path / "a", *args))
    train.main(tiny_args(byte_data, tmp_path / "a", *args, "--max_iters=40", "--init_from=resume"))
    lr = lrs(tmp_path / "a")
    assert lr[19] <= lr[18] and all(lr[s] == pytest.approx(3e-4) for s in range(20, 40))   # min_lr: no jump
    out = capsys.readouterr().out
    assert "resume: max_iters 20 -> 40" in out and "decays until lr_decay_iters=20, then stays at min_lr" in out
    # an explicit schedule key wins, and the change is printed
    train.main(tiny_args(byte_data, tmp_path / "b", *args))
    train.main(tiny_args(byte_data, tmp_path / "b", *args, "--max_iters=40", "--lr_decay_iters=40",
                         "--init_from=resume"))
    assert "resume: lr_decay_iters 20 -> 40 (set explicitly)" in capsys.readouterr().out
    train.main(tiny_args(byte_data, tmp_path / "c", *args, "--max_iters=40", "--lr_decay_iters=40"))
    assert lrs(tmp_path / "b")[25] == lrs(tmp_path / "c")[25]


def test_resume_refuses_another_shape_but_not_another_dropout(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with pytest.raises(ValueError, match="'n_embd'=48 differs from the checkpoint's 32"):
        train.main(tiny_args(byte_data, tmp_path, "--n_embd=48", "--init_from=resume"))
    with pytest.raises(ValueError, match=r"^config key 'n_embd'=48 differs from the checkpoint's 32; 'activation'="
                                         r"'relu2' differs from the checkpoint's 'gelu'; 'norm'='rmsnorm' differs from "
                                         r"the checkpoint's 'layernorm': the model and its optimizer cannot change on resume"):
        train.main(tiny_args(byte_data, tmp_path, "--n_embd=48", "--norm=rmsnorm", "--activation=relu2",
                             "--init_from=resume"))                       # every change at once, not one per try
    with pytest.raises(ValueError, match=r"^config key 'optimizer'='muon' differs from the checkpoint's 'adamw'; "
                                         r"'n_layer'=3 differs from the checkpoint's 2: .*; --optimizer=adamw resumes "
                                         r"with the checkpoint's optimizer\)$"):
        train.main(tiny_args(byte_data, tmp_path, "--n_layer=3", "--optimizer=muon", "--init_from=resume"))
    train.main(tiny_args(byte_data, tmp_path, "--dropout=0.1", "--init_from=resume"))


def test_resume_refuses_a_changed_activation_and_reads_old_checkpoints(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with pytest.raises(ValueError, match="'activation'='gelu_tanh' differs from the checkpoint's 'gelu'"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=6", "--activation=gelu_tanh"))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    del ckpt["config"]["activation"]                          # a checkpoint from before the key
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="'activation'='gelu_tanh' differs from the checkpoint's 'gelu'"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=6", "--activation=gelu_tanh"))
    assert train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=6"))["val_loss"] is not None


def test_the_model_keys_are_gptconfigs_fields_each_a_flag_with_its_default():
    """MODEL_KEYS (what a checkpoint's model is rebuilt from) is derived from GPTConfig: every field but the
    data's vocab_size, each a key of Config with GPTConfig's default, so a new field of the model cannot be
    forgotten by a resume, sample.py or eval.py. The flag parser stays free of torch (data.py, plot.py)."""
    from dataclasses import MISSING, fields
    from model import GPTConfig
    ours = {f.name: f.default for f in fields(configurator.Config)}
    theirs = [f for f in fields(GPTConfig) if f.name != "vocab_size"]
    assert configurator.MODEL_KEYS == tuple(f.name for f in theirs)
    assert {"norm", "rope", "qk_norm", "tie_embeddings"} <= set(configurator.MODEL_KEYS)
    for f in theirs:
        assert f.name in ours and f.default in (MISSING, ours[f.name]), f.name
    code = "import sys, configurator; configurator.load_config(['--rope=True']); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_a_short_run_resumes_and_a_resume_takes_the_shape(byte_data, tmp_path, capsys):
    """A run shorter than its warm-up (the schedule never decays) resumes with the same command; shape keys
    not given again come from the checkpoint."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--warmup_iters=30", "--n_embd=48", "--n_head=4"))
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=6", "--warmup_iters=30", "--n_embd=48", "--n_head=4",
                         "--init_from=resume"))
    assert json.load(open(tmp_path / "config.json"))["lr_decay_iters"] == 0     # never resolved: still in warm-up
    assert "decays until" not in capsys.readouterr().out                        # it decays to the end of the run
    summary = train.main([a for a in tiny_args(byte_data, tmp_path, "--max_iters=40", "--warmup_iters=30",
                                               "--init_from=resume") if not a.startswith(("--n_embd", "--n_head"))])
    cfg = json.load(open(tmp_path / "config.json"))
    assert summary["val_loss"] is not None and cfg["n_embd"] == 48 and cfg["lr_decay_iters"] == 40


def test_resume_messages_name_only_what_applies(byte_data, tmp_path, capsys):
    """A resume checks the schedule it continues with, not the command's defaults (no warm-up warning
    from a default warmup_iters the checkpoint replaces), and '(set explicitly)' marks only keys the
    command set."""
    short = [a for a in tiny_args(byte_data, tmp_path / "a", "--max_iters=3") if not a.startswith("--warmup_iters")]
    train.main(short + ["--warmup_iters=2"])
    capsys.readouterr()
    # default warmup_iters=30
    train.main([a.replace("--max_iters=3", "--max_iters=8") for a in short] + ["--init_from=resume"])
    out = capsys.readouterr().out
    assert "resume: max_iters 3 -> 8 (set explicitly)" in out and "warning: warmup_iters" not in out
    assert out.count("(set explicitly)") == 1                   # max_iters alone: the default warmup_iters is not
    # a run that ended in warm-up (lr_decay_iters unresolved), resumed with another warm-up
    train.main(tiny_args(byte_data, tmp_path / "b", "--max_iters=3", "--warmup_iters=30"))
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path / "b", "--max_iters=8", "--warmup_iters=1", "--init_from=resume"))
    out = capsys.readouterr().out
    assert "resume: warmup_iters 30 -> 1 (set explicitly)" in out
    assert "resume: lr_decay_iters 0 -> 8 (0 resolved: decay to the end of the run)" in out


def test_a_resume_reads_the_checkpoints_data_and_optimizer_unless_set(byte_data, tmp_path, capsys):
    """data_dir, packing, document_mask, batch_size and the optimizer with its settings are the run's:
    `--init_from=resume` alone continues on them (the loader's position is a position in that data) instead of
    the defaults."""
    first = tiny_args(byte_data, tmp_path, "--max_iters=4", "--packing=False", "--optimizer=muon",
                      "--muon_batched=False", "--muon_momentum=0.9", "--batch_size=2")
    train.main(first)
    again = [a for a in tiny_args(byte_data, tmp_path, "--max_iters=6", "--init_from=resume")
             if not a.startswith(("--data_dir=", "--batch_size="))]     # the micro-batch too: 2, not the default 16
    summary = train.main(again)
    assert summary["val_loss"] is not None
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["data_dir"], cfg["packing"], cfg["optimizer"], cfg["batch_size"]) == (str(byte_data), False, "muon", 2)
    assert (cfg["muon_batched"], cfg["muon_momentum"]) == (False, 0.9)
    out = capsys.readouterr().out
    assert "resume: data_dir" not in out and "muon_batched False -> True" not in out


def test_turning_fp8_off_on_the_command_line_drops_the_presets_fp8_details():
    """gpt2-medium.py sets fp8_recipe for its FP8 blocks: --fp8=False turns them off without being refused
    for a recipe that would do nothing; a recipe given on the command line too stays (and fp8.check refuses it)."""
    from configurator import load_config
    off = load_config(["--config", "config/gpt2-medium.py", "--fp8=False"])
    assert (off.fp8, off.fp8_recipe, off.fp8_head) == (False, "tensorwise", True)
    assert load_config(["--config", "config/gpt2-medium.py"]).fp8_recipe == "tensorwise_delayed"
    both = load_config(["--config", "config/gpt2-medium.py", "--fp8=False", "--fp8_recipe=rowwise_bf16_wgrad"])
    assert both.fp8_recipe == "rowwise_bf16_wgrad"


def test_a_later_activation_drops_the_presets_gelu_cast():
    """config/fast.py folds GELU into FP8's casts (fp8_gelu_cast); a later --activation=relu2 drops that detail as
    --fp8=False drops FP8's ("activation=gelu" in fp8's DETAILS), --activation=gelu keeps it, and fp8_gelu_cast
    given beside relu2 stays (fp8.check refuses it)."""
    from configurator import load_config
    assert load_config(["--config", "config/fast.py"]).fp8_gelu_cast is True
    assert load_config(["--config", "config/fast.py", "--activation=relu2"]).fp8_gelu_cast is False
    assert load_config(["--config", "config/fast.py", "--activation=gelu"]).fp8_gelu_cast is True
    assert load_config(["--config", "config/fast.py", "--activation=relu2", "--fp8_gelu_cast=True"]).fp8_gelu_cast


def test_a_later_config_file_turning_fp8_off_drops_the_earlier_files_fp8_details(tmp_path):
    """config/fast.py sets fp8_recipe and fp8_min_dim; a file laid over it with fp8 = False (a GPU without FP8) drops
    them as --fp8=False does; a detail set in that same file, or on the command line, stays (fp8.check refuses it)."""
    from configurator import load_config
    off = tmp_path / "no_fp8.py"
    off.write_text("fp8 = False\nfp8_head = False\n")
    cfg = load_config(["--config", "config/fast.py", "--config", str(off)])
    assert (cfg.fp8, cfg.fp8_recipe, cfg.fp8_min_dim, cfg.fp8_head, cfg.head_kernel) == \
        (False, "tensorwise", 1024, False, True)          # head_kernel is the fused head's, bf16 or FP8
    both = tmp_path / "both.py"
    both.write_text("fp8 = False\nfp8_min_dim = 512\n")
    assert load_config(["--config", "config/fast.py", "--config", str(both)]).fp8_min_dim == 512
    assert load_config(["--config", "config/fast.py", "--config", str(off), "--fp8_min_dim=256"]).fp8_min_dim == 256
    on_again = load_config(["--config", "config/fast.py", "--config", str(off), "--fp8=True"])   # on in the end
    assert (on_again.fp8, on_again.fp8_recipe) == (True, "tensorwise_delayed")


def test_a_norm_or_activation_added_to_model_py_is_a_choice_without_touching_configurator(monkeypatch):
    """norm and activation take their choices from model.py's NORMS and ACTIVATIONS: a forker's new norm is one
    entry there, and a value neither holds is refused at parse time, in one line naming the choices. Parsing
    other keys stays free of torch (the test above)."""
    import torch.nn as nn
    import model
    import re
    with pytest.raises(ValueError, match=r"'norm' \(command line\) must be one of "
                                         + re.escape(str(tuple(model.NORMS))) + ", got 'a_forks_norm'"):
        configurator.load_config(["--norm=a_forks_norm"])
    monkeypatch.setitem(model.NORMS, "a_forks_norm", lambda dim, bias: nn.Identity())
    monkeypatch.setitem(model.ACTIVATIONS, "a_forks_act", nn.SiLU)
    cfg = configurator.load_config(["--norm=a_forks_norm", "--activation=a_forks_act"])
    assert (cfg.norm, cfg.activation) == ("a_forks_norm", "a_forks_act")
    with pytest.raises(ValueError, match=r"'activation' \(command line\) must be one of \(.*'a_forks_act'\)"):
        configurator.load_config(["--activation=swish"])


def test_help_lists_every_key_with_its_whole_comment():
    """--help: one line per Config field, its comment's aligned continuation lines joined (fp8_recipe's values run
    onto a second line in the source), and how several --config files combine."""
    from dataclasses import fields
    from configurator import Config, help_text
    lines = help_text().splitlines()
    assert "several in order, the later winning" in lines[0]
    assert len(lines) == 1 + len(fields(Config))
    recipe = next(line for line in lines if line.lstrip().startswith("--fp8_recipe="))
    assert recipe.rstrip().endswith("tensorwise_fused | tensorwise_delayed (speedgpt/features/fp8.py's)")


def test_help_with_a_config_shows_its_values_and_refuses_a_missing_one(capsys):
    """train.py --config FILE --help lists the values FILE (and any flags) set, each with its default; one that is
    not there is refused as a run would be: --help reads the preset."""
    import train
    train.main(["--config", "config/fast.py", "--batch_size=32", "--help"])
    lines = capsys.readouterr().out.splitlines()
    line = {ln.split("=")[0].strip(): ln for ln in lines[1:]}
    assert line["--batch_size"].startswith("  --batch_size=32 ") and line["--batch_size"].endswith("[default 16]")
    assert line["--fp8"].startswith("  --fp8=True ") and line["--fp8"].endswith("[default False]")
    assert "[default" not in line["--seed"] and "each with its default" in lines[0]
    with pytest.raises(FileNotFoundError, match="config file 'config/nope.py' not found"):
        train.main(["--config", "config/nope.py", "--help"])


def test_a_resume_that_leaves_wsd_drops_its_decay_share():
    """A WSD run resumed with --lr_schedule=cosine: the checkpoint's wsd_decay_frac is not kept (it would do nothing,
    and optim.check would refuse it as set), while a resume that stays on WSD keeps it."""
    from dataclasses import asdict
    from configurator import Config
    from speedgpt.resume import resume_config
    from speedgpt import optim
    saved = asdict(Config(lr_schedule="wsd", wsd_decay_frac=0.3, max_iters=100))
    left, _ = resume_config(Config(lr_schedule="cosine", max_iters=100), {"lr_schedule"}, saved)
    assert (left.lr_schedule, left.wsd_decay_frac) == ("cosine", Config().wsd_decay_frac)
    optim.check(left, on("cpu"))
    stayed, _ = resume_config(Config(max_iters=200), {"max_iters"}, saved)
    assert (stayed.lr_schedule, stayed.wsd_decay_frac) == ("wsd", 0.3)


def test_a_later_constant_schedule_drops_the_presets_decay_and_refuses_one_set_with_it(tmp_path):
    """lr_schedule=constant has no floor and no horizon: config/fast.py's min_lr (a config file's lr_decay_iters) set
    before a later --lr_schedule=constant goes, as a feature's details do, so the preset fine-tunes at a constant rate;
    set with it or after it, optim.check refuses it as doing nothing."""
    from speedgpt import optim
    default = configurator.Config()
    cfg, explicit = configurator.load_config(["--config", "config/fast.py", "--lr_schedule=constant"],
                                             with_explicit=True)
    assert (cfg.lr_schedule, cfg.min_lr) == ("constant", default.min_lr) and "min_lr" not in explicit
    assert optim.check(cfg, on("cpu")) == cfg
    (tmp_path / "decay.py").write_text("lr_decay_iters = 400\nmin_lr = 1e-5\n")
    cfg = configurator.load_config(["--config", str(tmp_path / "decay.py"), "--lr_schedule=constant"])
    assert (cfg.lr_decay_iters, cfg.min_lr) == (default.lr_decay_iters, default.min_lr)
    assert configurator.load_config(["--config", str(tmp_path / "decay.py")]).min_lr == 1e-5      # cosine: it stays
    (tmp_path / "both.py").write_text("lr_schedule = 'constant'\nlr_decay_iters = 400\n")
    for argv in (["--config", str(tmp_path / "both.py")], ["--config", str(tmp_path / "decay.py"),
                                                           "--lr_schedule=constant", "--min_lr=2e-5"]):
        with pytest.raises(ValueError, match=r" would do nothing: .* Add --lr_schedule=cosine or --lr_schedule=wsd"):
            optim.check(configurator.load_config(argv), on("cpu"))


def test_document_mask_without_packing_is_refused_unless_packing_came_later(tmp_path):
    """document_mask=True with packing=False would do nothing (each row is one document): refused when set with or
    after packing=False; a config file's document_mask=True is dropped by a later --packing=False."""
    with pytest.raises(ValueError, match=r"^document_mask=True masks the documents packing puts in one row; .* "
                                         r"leave out document_mask, or leave out packing=False "
                                         r"\(packing on, the mask applies\)$"):
        configurator.load_config(["--packing=False", "--document_mask=True"])
    preset = tmp_path / "masked.py"
    preset.write_text("document_mask = True\n")
    cfg = configurator.load_config(["--config", str(preset), "--packing=False"])
    assert (cfg.packing, cfg.document_mask) == (False, True)      # the default; the run makes it False (attention)
    assert configurator.load_config(["--document_mask=False", "--packing=False"]).document_mask is False


def test_a_missing_config_file_names_the_ones_beside_it():
    """--config config/nope.py (or nope.py): the line names the presets in config/, so the user sees the right
    name."""
    for given in ("config/nope.py", "nope.py"):         # no folder given: config/'s (not the scripts beside it)
        with pytest.raises(FileNotFoundError, match=rf"^config file '{given}' not found \(there are "
                                                    r"config/baseline.py, .*config/fast.py, "):
            configurator.load_config(["--config", given])



def test_a_resumed_constant_schedule_is_not_said_to_decay(byte_data, tmp_path, capsys):
    """A constant schedule resumed past its first max_iters: no line about a decay it does not have."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--lr_schedule=constant"))
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=6", "--init_from=resume"))
    out = capsys.readouterr().out
    assert "decays until" not in out and "before its decay" not in out


def test_a_resumed_constant_schedule_refuses_a_decay_setting_given_with_it(byte_data, tmp_path):
    """min_lr or lr_decay_iters given on a resume of a constant run would do nothing: refused as a new run does."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--lr_schedule=constant"))
    for flag in ("--min_lr=1e-4", "--lr_decay_iters=20"):
        with pytest.raises(ValueError, match=rf"^{flag[2:].split('=')[0]}=.* would do nothing: it is a setting of a "
                                             r"decaying schedule"):
            train.main(tiny_args(byte_data, tmp_path, "--max_iters=6", "--init_from=resume", flag))


def test_a_block_flag_with_gpt2_weights_is_refused(tmp_path):
    """--init_from=gpt2 (or a Hugging Face folder) with --rope=True trained GPT-2's blocks, the flag replaced with a
    note, where a checkpoint file with the same flag is refused. Refused in one line naming every such flag, before
    any download; GPT-2's own blocks, and the GELU variants its weights take, pass."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for init in ("gpt2", str(folder)):
        with pytest.raises(ValueError, match=rf"^init_from='{re.escape(init)}' loads GPT-2's blocks, which "
                                             r"rope=True, qk_norm=True, activation='relu2' would change: .* leave "
                                             r"them out .*init_from=scratch$"):
            configurator.load_config([f"--init_from={init}", "--rope=True", "--qk_norm=True", "--activation=relu2"])
        with pytest.raises(ValueError, match=r"which norm='rmsnorm', tie_embeddings=False would change"):
            configurator.load_config([f"--init_from={init}", "--norm=rmsnorm", "--tie_embeddings=False"])
        for fine in ([], ["--activation=gelu_tanh"]):
            assert configurator.load_config([f"--init_from={init}", *fine]).init_from == init
    with pytest.raises(ValueError, match="loads GPT-2's blocks"):
        configurator.load_config(["--config", "config/fast.py", "--config", "config/speedrun.py", "--init_from=gpt2"])
    assert configurator.load_config(["--rope=True"]).rope                      # from scratch: any block


def test_a_wandb_name_without_wandb_log_is_refused_on_the_command_line():
    """--wandb_project=y --wandb_run_name=x without wandb_log trained with both doing nothing, unsaid. Given on the
    command line they are refused in one line; a config file's (nanoGPT's set them beside wandb_log=False) stay."""
    with pytest.raises(ValueError, match=r"^--wandb_project and --wandb_run_name name the W&B run, but "
                                         r"wandb_log=False logs none: add --wandb_log=True, or leave them out$"):
        configurator.load_config(["--wandb_project=y", "--wandb_run_name=x"])
    with pytest.raises(ValueError, match=r"^--wandb_run_name names the W&B run"):
        configurator.load_config(["--wandb_log=False", "--wandb_run_name=x"])
    assert configurator.load_config(["--wandb_log=True", "--wandb_run_name=x"]).wandb_run_name == "x"
