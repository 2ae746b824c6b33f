"""benchmarks/fp8_cast.py on the CPU: every producer and way runs, and the ways that share torchao's scale agree."""
import os
import sys

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import fp8_cast  # noqa: E402


def test_the_dynamic_ways_give_torchaos_cast_and_the_script_prints_every_row(capsys):
    x = torch.randn(64, 32, dtype=torch.bfloat16) * torch.linspace(0.1, 4, 64, dtype=torch.bfloat16)[:, None]
    for name, (make, _, _) in fp8_cast.producers(32).items():
        ways = fp8_cast.ways(make)
        want = ways["dynamic"](x, None).float()
        assert torch.equal(ways["dynamic, per row"](x, None).float(), want), name     # max is exact in any order
        y8, amax = ways["delayed + amax"](x, torch.tensor(448.0 / 5))
        assert y8.dtype == fp8_cast.E4M3 and torch.equal(amax, make(x).abs().max())
    rows = fp8_cast.main(["--device", "cpu", "--eager", "--tokens", "64", "--width", "32", "--iters", "1"])
    assert len(rows) == 4 * 10 and all(r["ms"] > 0 for r in rows)          # the Triton way needs a GPU
    assert capsys.readouterr().out.count("\n| ") == len(rows)


def test_bad_sizes_and_producers_are_one_line():
    with pytest.raises(SystemExit, match="--tokens 0, --iters -1: each must be at least 1"):
        fp8_cast.main(["--device", "cpu", "--eager", "--tokens", "0", "--iters", "-1"])
    with pytest.raises(SystemExit, match="unknown foo; the producers are"):
        fp8_cast.main(["--device", "cpu", "--eager", "--producers", "gelu,foo"])
    with pytest.raises(SystemExit, match="^error: --device 'foo': cuda, cuda:N or cpu$"):
        fp8_cast.main(["--device", "foo", "--eager"])


def test_the_amax_read_back_from_the_float8_bytes():
    """amax_of_float8: the largest |y| to e4m3's precision (3 mantissa bits), the sign bit ignored; a saturated cast
    gives FP8_MAX / scale, the least the amax can be."""
    torch.manual_seed(0)
    y = (torch.rand(256, 64) * 2 - 1) * 10
    y[7, 5] = -11.3                                       # the largest magnitude, negative
    scale = torch.tensor(fp8_cast.FP8_MAX / 16.0)
    got = fp8_cast.amax_of_float8(fp8_cast.cast(y, scale), scale)
    assert abs(got.item() - 11.3) <= 11.3 / 16
    assert abs(fp8_cast.amax_of_float8(fp8_cast.cast(y, scale * 100), scale * 100).item() - 0.16) < 1e-6


def test_the_byte_by_byte_row_turns_the_words_off_for_its_call_alone():
    """The gelu row "byte by byte" times cast_kernel with WORDS off, and leaves it as it was, after an error too."""
    from speedgpt.features import cast_kernel
    assert cast_kernel.WORDS and fp8_cast.bytes_only(lambda: cast_kernel.WORDS) is False and cast_kernel.WORDS
    with pytest.raises(ZeroDivisionError):
        fp8_cast.bytes_only(lambda: 1 / 0)
    assert cast_kernel.WORDS
