"""benchmarks/fp8_cast.py on the CPU: every producer and way runs, and the ways that share torchao's scale agree."""
import os
import sys

import torch

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import fp8_cast  # noqa: E402


def test_the_dynamic_ways_give_torchaos_cast_and_the_script_prints_every_row(capsys):
    x = torch.randn(64, 32, dtype=torch.bfloat16) * torch.linspace(0.1, 4, 64, dtype=torch.bfloat16)[:, None]
    for name, (make, _) in fp8_cast.producers(32).items():
        ways = fp8_cast.ways(make)
        want = ways["dynamic"](x, None).float()
        assert torch.equal(ways["dynamic, per row"](x, None).float(), want), name     # max is exact in any order
        y8, amax = ways["delayed + amax"](x, torch.tensor(448.0 / 5))
        assert y8.dtype == fp8_cast.E4M3 and torch.equal(amax, make(x).abs().max())
    rows = fp8_cast.main(["--device", "cpu", "--eager", "--tokens", "64", "--width", "32", "--iters", "1"])
    assert len(rows) == 3 * 8 and all(r["ms"] > 0 for r in rows)
    assert capsys.readouterr().out.count("\n| ") == len(rows)


def test_bad_sizes_and_producers_are_one_line():
    import pytest
    with pytest.raises(SystemExit, match="--tokens 0, --iters -1: each must be at least 1"):
        fp8_cast.main(["--device", "cpu", "--eager", "--tokens", "0", "--iters", "-1"])
    with pytest.raises(SystemExit, match="unknown foo; the producers are"):
        fp8_cast.main(["--device", "cpu", "--eager", "--producers", "gelu,foo"])
