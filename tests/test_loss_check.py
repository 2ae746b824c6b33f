"""benchmarks/loss_check.py on the CPU: the verdict against the seed-to-seed spread, two tiny recipes end to end
(the same seed gives the same loss, so the spread is between seeds), and bad input refused in one line."""
import os
import re
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import loss_check  # noqa: E402


def test_the_verdict_compares_the_means_with_the_seed_spread():
    assert loss_check.verdict({"base": [2.60, 2.62], "candidate": [2.61, 2.63]}).endswith(
        "spread 0.0200: within the spread")
    assert "+0.1000" in loss_check.verdict({"base": [2.60, 2.62], "candidate": [2.70, 2.72]})
    assert loss_check.verdict({"base": [2.60, 2.62], "candidate": [2.70, 2.72]}).endswith("outside the spread")
    assert loss_check.verdict({"base": [2.60, 2.62], "candidate": [2.50, 2.52]}).endswith("better than the spread")


def test_two_recipes_two_seeds_end_to_end(byte_data, tmp_path, capsys):
    tiny = f"--data_dir={byte_data} --n_layer=1 --n_head=2 --n_embd=32 --block_size=64"
    loss_check.main(["--config", "", f"--base={tiny}", f"--candidate={tiny} --optimizer=muon", "--steps", "4",
                     "--batch_size", "4", "--eval_tokens", "512", "--seeds", "1,2", "--out", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    runs = [line for line in out if line.startswith("| base |") or line.startswith("| candidate |")]
    assert len(runs) == 4 and "failed" not in "".join(runs)                 # the table, once
    assert sum(line.startswith("finished: ") for line in out) == 4          # a line per run as it ends
    assert out[-1].startswith("candidate - base: ") and "seed-to-seed spread" in out[-1]
    assert out[-2] == "note: 4 steps, a warm-up of 1: too few for the losses to mean much (the protocol is 300)"
    assert all(re.search(r"\| [1-9][\d,]* \|$", r) for r in runs), runs      # the 4th step is timed (warm-up 3)


def test_parallel_runs_give_the_losses_of_one_at_a_time(byte_data, tmp_path, capsys):
    """--parallel 2: the same val losses as the runs one at a time (each its own process and seed), the table in
    the runs' order, no tokens/s (the device was shared); a failing run still stops it in one line."""
    tiny = f"--data_dir={byte_data} --n_layer=1 --n_head=2 --n_embd=32 --block_size=64"
    args = ["--config", "", f"--base={tiny}", f"--candidate={tiny} --optimizer=muon", "--steps", "2", "--batch_size",
            "4", "--eval_tokens", "512", "--seeds", "1,2"]
    tables = {}
    for parallel in ("1", "2"):
        loss_check.main([*args, "--parallel", parallel, "--out", str(tmp_path / parallel)])
        out = capsys.readouterr().out.splitlines()
        table = out[out.index("| recipe | flags | seed | val loss | tok/s |") + 2:][:4]
        tables[parallel] = [r.split(" | ")[:4] for r in table]
        assert [r[0] + r[2] for r in tables[parallel]] == ["| base1", "| candidate1", "| base2", "| candidate2"]
    assert tables["1"] == tables["2"]
    # one at a time, a failed run is the last to start; two at a time, it stops the one under way beside it
    # (100,000 steps: it would run for minutes) and no later run starts
    none = f"--data_dir={tmp_path / 'none'}"          # a failure train.py alone finds (a typo is refused before runs)
    with pytest.raises(SystemExit, match=r"^error: run base_1 failed: .*/none"):
        loss_check.main([*args[:2], f"--base={tiny} {none}", *args[3:], "--out", str(tmp_path / "bad1")])
    assert not (tmp_path / "bad1" / "candidate_1.log").exists()
    long = [*args[:2], f"--base={tiny}", f"--candidate={tiny} {none}", "--steps", "100000", *args[6:]]
    with pytest.raises(SystemExit, match=r"^error: run candidate_1 failed: .*/none"):
        loss_check.main([*long, "--parallel", "2", "--out", str(tmp_path / "bad2")])
    bad = tmp_path / "bad2"
    assert not loss_check.RUNNING and not (bad / "base_1" / "summary.json").exists()
    assert not (bad / "base_2.log").exists() and not (bad / "candidate_2.log").exists(), sorted(os.listdir(bad))


def test_a_run_too_short_to_time_says_so_instead_of_zero(byte_data, tmp_path, capsys):
    tiny = f"--data_dir={byte_data} --n_layer=1 --n_head=2 --n_embd=32 --block_size=64"
    loss_check.main(["--config", "", f"--base={tiny}", f"--candidate={tiny} --lr_schedule=wsd", "--steps", "2", "--batch_size", "4",
                     "--eval_tokens", "512", "--seeds", "1,2", "--out", str(tmp_path)])
    runs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| base |")]
    assert runs and all(r.endswith("| – (no timed steps) |") for r in runs), runs


def test_a_failed_run_stops_it_in_one_line_and_no_earlier_result_is_reused(byte_data, tmp_path):
    tiny = f"--data_dir={byte_data} --n_layer=1 --n_head=2 --n_embd=32 --block_size=64"
    args = ["--config", "", f"--base={tiny}", "--steps", "2", "--batch_size", "4", "--eval_tokens", "512", "--seeds",
            "1,2", "--out", str(tmp_path)]
    loss_check.main([*args, f"--candidate={tiny} --optimizer=muon"])
    with pytest.raises(SystemExit, match=r"^error: run candidate_1 failed: .*/none.* \(log: "
                       r".*; a flag it names goes in --base and --candidate, or choose another --config\)$"):
        loss_check.main([*args, f"--candidate={tiny} --data_dir={tmp_path / 'none'}"])    # found by train.py alone
    assert not (tmp_path / "candidate_1" / "summary.json").exists()          # the earlier run's is gone


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "1"], "--seeds needs two or more different seeds"),
    (["--seeds", "1,1"], "--seeds needs two or more different seeds"),
    (["--seeds", "abc"], "--seeds 'abc': comma-separated integers"),
    (["--timeout", "0"], "must be positive"),
    (["--parallel", "0"], "must be positive"),
    (["--out", "/proc/x/y"], "cannot create --out /proc/x/y"),
    (["--steps", "0"], "must be positive"),
    (["--base=--fp8=False", "--candidate=--fp8=False"], "the same flags: nothing to compare"),
])
def test_bad_input_is_refused_in_one_line(argv, message):
    with pytest.raises(SystemExit, match=message):
        loss_check.main(argv)


def test_a_flag_train_py_refuses_is_named_before_any_run(tmp_path, monkeypatch):
    """A typo in --candidate was found by its first run, after the base run before it had trained (minutes of a
    GPU preset): both recipes' flags are read as train.py reads them before the first run starts."""
    monkeypatch.setattr(loss_check.subprocess, "Popen", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(SystemExit, match=r"^error: --candidate '--optimizr=muon' with --config '': unknown config key "
                                         r"'optimizr' \(command line\)"):
        loss_check.main(["--config", "", "--base=--optimizer=adamw", "--candidate=--optimizr=muon", "--out",
                         str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
