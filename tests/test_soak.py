"""benchmarks/soak.py on the CPU: a run that train.py refuses stops the soak in one line; a misspelt soak.py option
is soak.py's to refuse."""
import os
import subprocess
import sys

from conftest import ROOT


def test_a_refused_run_stops_the_soak_in_one_line(tmp_path):
    """A flag train.py refuses (or config/fast.py on a CPU): the soak ran all four runs, then ended in a traceback
    on the first run's missing metrics.jsonl. It stops after the first, in one line, and claims nothing."""
    proc = subprocess.run([sys.executable, "benchmarks/soak.py", "--config=", f"--out={tmp_path / 's'}", "--",
                           "--no_such_flag=1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: the uninterrupted run (seed 1337) failed, "
                                                           "train.py exit ")
    assert "spread" not in proc.stdout and not os.path.exists(tmp_path / "s" / "straight_1338")


def test_a_misspelt_soak_option_is_refused_by_soak_py(tmp_path):
    """--stop_stp (--stop_step misspelt) went on to train.py, whose error named train.py's keys; --step was taken as
    --steps. Either is refused by soak.py, naming its own flags, before any run; a train.py key given before --
    still goes to train.py (here one it refuses, in either form)."""
    for typo, meant in ((["--stop_stp=100"], "--stop_step"), (["--step", "20"], "--steps")):
        proc = subprocess.run([sys.executable, "benchmarks/soak.py", "--config=", f"--out={tmp_path / 's'}", *typo,
                               "--", "--n_layer=1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
            f"error: unknown flag {typo[0].split('=')[0]!r} (neither soak.py's nor train.py's): did you mean {meant}? "
            "(soak.py's flags: --config, --steps, --bad_step, --stop_step, --out; train.py's go after --)"], proc.stderr
        assert not os.path.exists(tmp_path / "s")
    for given in (["--n_layer=0"], ["--n_layer", "0"]):
        proc = subprocess.run([sys.executable, "benchmarks/soak.py", "--config=", f"--out={tmp_path / 's'}", *given],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        err = proc.stderr.strip().splitlines()
        assert "error: config key 'n_layer' must be positive, got 0" in err and err[-1].startswith(
            "error: the uninterrupted run (seed 1337) failed"), proc.stderr[-2000:]


def test_a_bad_value_of_its_own_is_one_line_with_the_values(tmp_path):
    """--steps abc printed argparse's usage block above its error; --steps 0 named the rule but not the values given.
    Each is one line before any run, the second with --bad_step, --stop_step and --steps as given."""
    for given, line in ((["--steps", "abc"], "error: argument --steps: invalid int value: 'abc'"),
                        (["--steps=0"], "error: need 0 <= --bad_step < --stop_step < --steps - 1, got --bad_step 60, "
                                        "--stop_step 120, --steps 0")):
        proc = subprocess.run([sys.executable, "benchmarks/soak.py", "--config=", f"--out={tmp_path / 's'}", *given],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode in (1, 2) and proc.stderr.strip().splitlines() == [line], proc.stderr
        assert not os.path.exists(tmp_path / "s")


def test_a_relative_out_from_another_folder(tmp_path, byte_data):
    """The runs go from the repository's root and were read back from the caller's folder: a relative --out given
    elsewhere was trained under the root and read as missing, every row nan and the soak refused though each run
    exited 0. --out is the caller's folder's, as any path given on its command line."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--config=", "--out=s",
                           "--steps=6", "--bad_step=1", "--stop_step=3", "--", "--n_layer=1", "--n_head=2",
                           "--n_embd=32", "--block_size=32", "--batch_size=2", "--eval_tokens=256",
                           f"--data_dir={byte_data}"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the seeds' spread" in proc.stdout and not os.path.exists(os.path.join(ROOT, "s"))
    assert os.path.isfile(tmp_path / "s" / "soak" / "metrics.jsonl")


def test_an_out_that_cannot_be_made_names_out(tmp_path):
    """--out under a file: train.py's error named its own --out_dir and the soak blamed "the train.py flags"; soak.py
    makes the folder first and names its --out, before any run."""
    (tmp_path / "f").write_text("")
    proc = subprocess.run([sys.executable, "benchmarks/soak.py", "--config=", f"--out={tmp_path / 'f' / 's'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: cannot create the output folder {tmp_path / 'f' / 's'}: {tmp_path / 'f'} is a file, not a folder; "
        "choose another --out"], proc.stderr


def test_an_interrupted_soak_is_one_line_and_128_plus_the_signal(tmp_path, byte_data):
    """SIGTERM (or Ctrl-C) while a run trains: soak.py ended in a traceback from subprocess.run's wait. It ends
    in one line and 128 + the signal's number, as bench.py and train.py, its run's train.py stopped with it."""
    import signal
    import time
    proc = subprocess.Popen([sys.executable, "benchmarks/soak.py", "--config=", f"--out={tmp_path / 's'}", "--",
                             "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=2",
                             "--eval_tokens=256", f"--data_dir={byte_data}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240          # the first run has logged a step: it is training
    while not os.path.isfile(tmp_path / "s" / "straight_1337" / "metrics.jsonl") and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("stopped (SIGTERM): the run under way was stopped; "), err[-2000:]
    assert not os.path.exists(tmp_path / "s" / "straight_1338")
