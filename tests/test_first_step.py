"""benchmarks/first_step.py: a cold and a warm launch per preset and mode, read from each run's summary.json."""
import json
import os
import subprocess
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
    (["--modes", "eager", "--", "--compile=True"], "--compile after --: first_step.py sets it itself (--modes)"),
    (["--", "--out_dir=/tmp/x"], "--out_dir after --: first_step.py sets it itself (each launch writes to a folder"),
    (["--", "--max_iters=0"], "--max_iters after --: first_step.py sets it itself (--steps)"),
])
def test_bad_input_is_one_line_before_any_launch(capsys, argv, says):
    with pytest.raises(SystemExit):
        first_step.main(argv)
    assert says in capsys.readouterr().err


@pytest.mark.slow
def test_a_compiled_launch_accounts_for_its_compile_and_the_warm_one_hits_the_caches(byte_data, tmp_path, capsys):
    """Whole-model compile on the CPU, the fused head (an autograd.Function) in the graph: the cold launch's account
    has every phase and its total holds them; the warm launch finds its graph in AOTAutograd's cache (no tracing
    of the joint graph again), says so in its cell, and trains exactly as the cold one did."""
    extra = [a for a in tiny_args(byte_data, tmp_path) if not a.startswith(("--out_dir", "--max_iters"))]
    extra += ["--device=cpu", "--fused_ce=True", "--eval_tokens=0"]
    cold, warm = (first_step.launch("", "whole", str(tmp_path / "caches"), str(tmp_path / name), 2, extra)
                  for name in ("cold", "warm"))
    c = cold["compile_s"]
    assert min(c["trace"], c["AOTAutograd"], c["inductor fwd"], c["inductor bwd"]) > 0, c
    assert c["all"] >= c["trace"] + c["AOTAutograd"] + c["inductor fwd"] + c["inductor bwd"] - 0.1, c
    assert cold["cache_counts"].get("aot_autograd.autograd_cache_miss", 0) >= 1, cold["cache_counts"]
    assert warm["cache_counts"].get("aot_autograd.autograd_cache_hit", 0) >= 1, warm["cache_counts"]
    assert warm["compile_s"]["AOTAutograd"] == 0 and warm["compile_s"]["all"] < c["all"]
    losses = [[r["loss"] for r in map(json.loads, open(tmp_path / name / "metrics.jsonl")) if "loss" in r]
              for name in ("cold", "warm")]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
    hits = warm["cache_counts"]["aot_autograd.autograd_cache_hit"]
    print(first_step.table([("", "whole", cold, warm)]))
    assert capsys.readouterr().out.rstrip().endswith(f"| {warm['compile_s']['all']:.1f}; {hits} / 0 / 0 |")


@pytest.mark.slow
def test_a_changed_autograd_function_misses_the_cache(tmp_path):
    """AOTAutograd's cache with autograd.Functions allowed (allow_autograd_functions_in_cache): the same function
    hits, and a function whose backward changed misses, whatever its name, so a cached graph never runs old code."""
    script = tmp_path / "run.py"
    script.write_text(f"""import sys, torch
sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(tmp_path)!r})
from speedgpt.features.compilation import allow_autograd_functions_in_cache
from torch._dynamo.utils import counters
from fn import F
allow_autograd_functions_in_cache()
torch.manual_seed(0)
lin = torch.nn.Linear(4, 4)
torch.compile(lambda x: F.apply(lin(x)).sum(), fullgraph=True)(torch.randn(3, 4)).backward()
print(lin.bias.grad[0].item(), dict(counters["aot_autograd"]))
""")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    out = []
    for scale in (2, 2, 3):
        (tmp_path / "fn.py").write_text(f"""import torch
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * {scale}
""")
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        grad, counts = proc.stdout.strip().splitlines()[-1].split(" ", 1)
        out.append((float(grad), "autograd_cache_hit" in counts, "autograd_cache_miss" in counts))
    assert out == [(6.0, False, True), (6.0, True, False), (9.0, False, True)]
