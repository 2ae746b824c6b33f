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


def test_the_tile_sweep_marks_the_tiles_that_ship_and_prints_a_wrong_tile_instead_of_its_time(monkeypatch, capsys):
    """--tiles: one row per entry of TILES, the two that ship (cast_kernel's WORD_TILE, BYTE_TILE at BYTE_WARPS)
    marked and first of their pass; a tile whose bytes check_pass finds wrong prints what differs and no time; each
    checked at the scale and format of its pass. The kernel is stood in for (it needs Triton on a GPU)."""
    import importlib.util
    from speedgpt.features import cast_kernel
    checked = []

    def check_pass(x, s, e5m2, gelu, grad, block, warps, words, fast_erf=False):
        checked.append((e5m2, gelu, grad is not None, s.item()))
        erfs.append(fast_erf)
        return "3 bytes differ" if block == (128, 256) else None
    erfs = []
    monkeypatch.setattr(fp8_cast, "tile_check", lambda device: check_pass)
    monkeypatch.setattr(cast_kernel, "run", lambda x, *a, **k: x.add(1))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else
                        find_spec(name, *a))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows = fp8_cast.main(["--device", "cpu", "--tiles", "--tokens", "8", "--width", "4", "--iters", "1"])
    out = capsys.readouterr().out.splitlines()[1:]                 # after the interpreter's line
    assert len(rows) == len(fp8_cast.TILES) and out[2:] and len(out) == 2 + len(rows)
    marked = [line for line in out if "(ships)" in line]
    assert len(marked) == 2 and marked == [out[2], out[2 + [r["pass"] for r in rows].index("gelu_backward")]]
    assert f"| {cast_kernel.WORD_TILE[0]} x {cast_kernel.WORD_TILE[1]} (ships) | {cast_kernel.WORD_TILE[2]} | words" \
        in marked[0]
    wrong = [line for line in out if "wrong: 3 bytes differ" in line]
    assert len(wrong) == 1 and "128 x 256" in wrong[0] and [r["ms"] for r in rows].count(None) == 1
    scale = lambda v: torch.tensor(v).item()                      # float32, as the sweep makes it
    assert set(checked) == {(False, True, False, scale(448.0 / 6)), (True, False, True, scale(57344.0 / 6))}
    # --fast_erf: each tile twice, the exact erf's row then the fast erf's, each checked with its erf
    erfs.clear()
    fast = fp8_cast.main(["--device", "cpu", "--tiles", "--fast_erf", "--tokens", "8", "--width", "4", "--iters", "1"])
    out = capsys.readouterr().out.splitlines()[3:]
    assert [r["erf"] for r in fast] == ["exact", "fast"] * len(fp8_cast.TILES) and erfs == [False, True] * len(
        fp8_cast.TILES)
    assert [line.split(" | ")[5] for line in out] == [r["erf"] for r in fast] and sum("(ships)" in o for o in out) == 4


def test_the_tile_sweeps_refusals_are_one_line(monkeypatch):
    """Without Triton, on a CPU without the interpreter, with rows the forward's words cannot take, with the
    producers' flags, on a device other than a GPU or the CPU: one line each, naming the way out."""
    import importlib.util
    find_spec = importlib.util.find_spec
    tiles = ["--device", "cpu", "--tiles"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    with pytest.raises(SystemExit, match="^error: --tiles times our Triton kernels: pip install triton .*"
                                         "TRITON_INTERPRET=1"):
        fp8_cast.main(tiles)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else
                        find_spec(name, *a))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit, match="^error: --tiles on a CPU runs Triton's interpreter: set TRITON_INTERPRET=1"):
        fp8_cast.main(tiles)
    with pytest.raises(SystemExit, match="^error: --tokens 66: --tiles .* give a multiple of 4"):
        fp8_cast.main(tiles + ["--tokens", "66"])
    with pytest.raises(SystemExit, match="^error: --tiles times the two GELU passes alone, not compiled: drop "
                                         "--producers and --eager$"):
        fp8_cast.main(tiles + ["--producers", "gelu", "--eager"])
    with pytest.raises(SystemExit, match="^error: --fast_erf times our GELU passes .*: add --tiles$"):
        fp8_cast.main(["--device", "cpu", "--fast_erf"])
    for device in ("mps", "meta"):
        with pytest.raises(SystemExit, match=f"^error: --device '{device}': cuda, cuda:N or cpu$"):
            fp8_cast.main(["--device", device, "--eager"])
