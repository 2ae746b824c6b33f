"""configurator.py's command line, on the CPU without data: `--key=value` and `--key value` alike in
load_config (train.py) and in FlagParser (sample.py, eval.py, hf.py, bench.py), bare bools, values that
start with --, and the closest known name for a misspelled one."""
import subprocess
import sys

import pytest

import bench
import configurator
import eval as eval_script
import hf
import sample
from conftest import ROOT

HELP = "(python train.py --help lists every key)"


def test_both_forms_give_the_same_config():
    eq = configurator.load_config(["--config=config/fast.py", "--n_layer=2", "--compile=False", "--out_dir=o",
                                   "--min_lr=-0.0", "--wandb_run_name="])
    space = configurator.load_config(["--config", "config/fast.py", "--n_layer", "2", "--compile", "False",
                                      "--out_dir", "o", "--min_lr", "-0.0", "--wandb_run_name", ""])
    assert eq == space
    assert (eq.n_layer, eq.compile, eq.out_dir, eq.n_embd) == (2, False, "o", 768)   # n_embd: config/fast.py's


def test_a_bare_bool_is_true_and_only_a_bool_may_be_bare():
    assert configurator.load_config(["--tf32"]).tf32 is True
    cfg = configurator.load_config(["--tf32", "--n_layer", "2", "--fused_adamw"])    # before a flag, at the end
    assert (cfg.tf32, cfg.n_layer, cfg.fused_adamw) == (True, 2, True)
    assert configurator.load_config(["--tf32", "False"]).tf32 is False
    with pytest.raises(TypeError, match=r"config key 'tf32' \(command line\) must be bool, got 'yes'"):
        configurator.load_config(["--tf32", "yes"])                   # as --tf32=yes
    with pytest.raises(ValueError, match=r"^--n_layer needs a value: --n_layer=VALUE or --n_layer VALUE$"):
        configurator.load_config(["--n_layer"])


def test_a_value_that_starts_with_dashes_is_never_swallowed():
    with pytest.raises(ValueError, match=r"^--out_dir needs a value: --out_dir=VALUE or --out_dir VALUE "
                                         r"\('--n_layer=2' is a flag: a value that starts with -- takes the = form\)$"):
        configurator.load_config(["--out_dir", "--n_layer=2"])
    with pytest.raises(ValueError, match="^--config needs a file path"):
        configurator.load_config(["--config", "--n_layer=2"])
    assert configurator.load_config(["--wandb_run_name=--x"]).wandb_run_name == "--x"   # the = form says it is one
    with pytest.raises(ValueError, match=r"^cannot parse argument 'n_layer=2': use --key=value or --key value$"):
        configurator.load_config(["n_layer=2"])
    assert configurator.load_config(["--eval_iters", "0"]).eval_tokens == 0              # a legacy key, space form


@pytest.mark.parametrize("argv, message", [
    (["--max_iter=5"], f"unknown config key 'max_iter' (command line): did you mean max_iters? {HELP}"),
    (["--max_iter", "5"], f"unknown config key 'max_iter' (command line): did you mean max_iters? {HELP}"),
    (["--compil"], f"unknown config key 'compil' (command line): did you mean compile? {HELP}"),
    (["--xyzzy=1"], "unknown config key 'xyzzy' (command line): python train.py --help lists every key"),
])
def test_an_unknown_key_names_the_closest(argv, message):
    with pytest.raises(ValueError) as e:
        configurator.load_config(argv)
    assert str(e.value) == message


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
