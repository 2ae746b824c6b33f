"""benchmarks/gelu.py: the cheaper erf's GELU against torch's exact one, and the script's table on the CPU."""
import os
import sys

import torch
import torch.nn.functional as F

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gelu  # noqa: E402


def test_abramowitz_stegun_gelu_matches_the_exact_one_and_its_gradient():
    """The script's A&S row (gelu_pass.reference's formula in PyTorch ops, tests/test_gelu_pass.py) through autograd."""
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    xf = x.float().requires_grad_()
    y = gelu.GeluAS.apply(xf)
    dx, = torch.autograd.grad(y.sum(), xf)
    xr = x.clone().requires_grad_()
    dr, = torch.autograd.grad(F.gelu(xr).sum(), xr)
    assert (y.double() - F.gelu(x)).abs().max() < 1e-6 and (dx.double() - dr).abs().max() < 1e-6


def test_the_script_prints_a_row_per_shape_and_variant(capsys):
    rows = gelu.main(["--device", "cpu", "--eager", "--shapes", "64x128,32x256", "--iters", "1"])
    assert [(r["shape"], r["gelu"]) for r in rows] == [(s, v) for s in ("64x128", "32x256") for v in gelu.VARIANTS]
    assert all(r["fwd_ms"] > 0 and r["err_y"] < 0.05 for r in rows)
    assert all(r["err_dx"] < 0.1 for r in rows if r["gelu"] != "tanh")
    assert capsys.readouterr().out.count("\n| ") == len(rows)        # after the header and its rule


def test_bad_shapes_and_counts_are_one_line():
    import pytest
    for argv, msg in ((["--shapes", "64x"], "give tokens x width"), (["--shapes", "0x128"], "give tokens x width"),
                      (["--shapes", "64x128", "--iters", "0"], "time at least one call"),
                      (["--device", "bogus"], "give cuda, cuda:N or cpu")):
        with pytest.raises(SystemExit, match=msg):
            gelu.main(["--device", "cpu", "--eager", *argv])
