"""benchmarks/first_step.py: a cold and a warm launch per preset and mode, read from each run's summary.json."""
import os
import sys

import pytest

from conftest import ROOT, tiny_args

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import first_step  # noqa: E402


def test_a_cold_and_a_warm_launch_give_one_row(byte_data, tmp_path, capsys):
    """Two train.py processes (eager, on the CPU) sharing one cache folder: the row has both first steps, no
    recompile, the tokens/s of each; a launch train.py refuses is a row that says why."""
    extra = [a for a in tiny_args(byte_data, tmp_path) if not a.startswith(("--out_dir", "--max_iters"))]
    rows = first_step.main(["--presets", "", "--modes", "eager", "--steps", "3", "--", *extra, "--device=cpu"])
    (preset, mode, cold, warm), = rows
    assert (preset, mode) == ("", "eager")
    for run in (cold, warm):
        assert run["first_step_s"] > 0 and run["wall_s"] > run["first_step_s"] and run["recompiles"] == 0
        assert run["tokens_per_sec"] > 0 and run["mem_gb"] is None
        assert all(v == 0 for v in run["compile_s"].values())        # eager: torch's compile account is empty
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("| defaults | eager | ")
    assert out.rstrip().endswith("| nothing compiled |")
    rows = first_step.main(["--presets", "", "--modes", "eager", "--steps", "1", "--", *extra, "--n_head=3"])
    assert "failed: " in capsys.readouterr().out.splitlines()[-1] and "error" in rows[0][2]


@pytest.mark.parametrize("argv, says", [
    (["--modes", "nested"], "--modes: unknown nested; the modes are whole, regional, eager"),
    (["--modes", ","], "--modes: none given; the modes are whole, regional, eager"),
    (["--steps", "0"], "--steps 0: a launch needs at least one optimizer step"),
    (["--presets", "config/fast.py,config/nope.py"], "--presets: config/nope.py not found"),
])
def test_bad_input_is_one_line_before_any_launch(capsys, argv, says):
    with pytest.raises(SystemExit):
        first_step.main(argv)
    assert says in capsys.readouterr().err


def test_a_compiled_launch_accounts_for_its_compile_and_the_warm_one_hits_the_caches(byte_data, tmp_path, capsys):
    """Whole-model compile on the CPU: the cold launch's account has every phase and its total holds them; the warm
    launch finds its graphs in AOTAutograd's cache (no tracing of the joint graph again) and says so in its cell."""
    extra = [a for a in tiny_args(byte_data, tmp_path) if not a.startswith(("--out_dir", "--max_iters"))]
    (_, _, cold, warm), = first_step.main(["--presets", "", "--modes", "whole", "--steps", "1", "--", *extra,
                                           "--device=cpu", "--compile=True", "--eval_tokens=0"])
    c = cold["compile_s"]
    assert min(c["trace"], c["AOTAutograd"], c["inductor fwd"], c["inductor bwd"]) > 0, c
    assert c["all"] >= c["trace"] + c["AOTAutograd"] + c["inductor fwd"] + c["inductor bwd"] - 0.1, c
    assert cold["cache_counts"].get("aot_autograd.autograd_cache_miss", 0) >= 1
    assert warm["cache_counts"].get("aot_autograd.autograd_cache_hit", 0) >= 1, warm["cache_counts"]
    assert warm["compile_s"]["AOTAutograd"] == 0 and warm["compile_s"]["all"] < c["all"]
    hits = warm["cache_counts"]["aot_autograd.autograd_cache_hit"]
    assert capsys.readouterr().out.rstrip().endswith(f"| {warm['compile_s']['all']:.1f}; {hits} / 0 / 0 |")
