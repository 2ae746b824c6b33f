"""speedgpt/features/cast_kernel.py (fp8_cast_kernel) on the CPU: the delayed layer goes through the custom op in
its forward and backward and gives the step of the PyTorch ops (the op's CPU path is its reference), eager and
compiled; the flag is refused where it cannot work; the Triton kernel in Triton's interpreter. Its bytes on a GPU:
tests/test_gpu.py."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import configurator
from conftest import ROOT, on
from speedgpt.features import cast_kernel, fp8


def delayed_layer(kernel):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16)
    m = torch.nn.Module()
    m.mlp = torch.nn.Module()
    m.mlp.c_fc = lin
    m.block_linears = lambda: [("mlp.c_fc", "fc", lin)]                # what a GPT answers (model.py)
    cfg = configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32, fp8_cast_kernel=kernel)
    fp8.convert(m, cfg)
    lin.fp8_amax[:, 1] = torch.tensor([2.0, 1e-3])                     # a history: scales known before the cast
    lin.fp8_scaled = True
    return lin


@pytest.mark.parametrize("compiled", [False, True])
def test_the_kernel_path_gives_the_step_of_the_pytorch_ops(compiled, monkeypatch):
    """With fp8_cast_kernel the layer casts x in its forward and dy in its backward through cast_amax (e4m3 row 0,
    e5m2 row 1 of the history), the weight gradient taking the transposed copies it makes, and its output, both
    gradients and the amax the step recorded are those of the layer without the flag, bit for bit; values past the
    scale's range saturate alike."""
    calls = []
    reference = cast_kernel.reference

    def counted(x, scale, amax, e5m2=False):
        calls.append(e5m2)
        return reference(x, scale, amax, e5m2)
    monkeypatch.setattr(cast_kernel, "reference", counted)
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(32, 64, generator=g)).bfloat16()                 # past 2.0: some values saturate
    dy = torch.randn(32, 96, generator=g).bfloat16()
    outs = []
    for kernel in (False, True):
        lin = delayed_layer(kernel)
        xi = x.clone().requires_grad_()
        y = (torch.compile(lin) if compiled else lin)(xi)
        y.backward(dy)
        outs.append((y, xi.grad, lin.weight.grad, lin.fp8_amax))
    assert calls == [False, True]
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    amax = outs[1][3]
    assert amax[0, 0] == x.abs().max() and amax[1, 0] == dy.abs().max()
    assert torch.equal(amax[:, 1], torch.tensor([2.0, 1e-3]))             # the history untouched


def test_evaluation_records_nothing_and_skips_the_kernel(monkeypatch):
    monkeypatch.setattr(cast_kernel, "reference", lambda *a: pytest.fail("the op ran in evaluation"))
    lin = delayed_layer(True).eval()
    with torch.no_grad():
        lin(torch.randn(8, 64).bfloat16())
    assert (lin.fp8_amax[:, 0] == 0).all()


def test_the_flag_is_refused_where_it_would_do_nothing_or_cannot_run():
    with pytest.raises(ValueError, match="fp8_cast_kernel=True would do nothing with fp8_recipe='tensorwise_fused'"):
        fp8.check(configurator.Config(fp8=True, fp8_recipe="tensorwise_fused", fp8_cast_kernel=True), on("cpu"))
    with pytest.raises(ValueError, match="this run is on the CPU: add --fp8=False and leave out fp8_cast_kernel$"):
        fp8.check(configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_cast_kernel=True), on("cpu"))
    with pytest.raises(ValueError, match="fp8_cast_kernel=True runs Triton kernels on a CUDA GPU; this run is on "
                                         "cpu: leave fp8_cast_kernel out"):
        cast_kernel.check(configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_cast_kernel=True),
                          torch.device("cpu"))
    with pytest.raises(ValueError, match="fp8_cast_kernel"):              # a detail of fp8: nothing without it
        fp8.check(configurator.Config(fp8_cast_kernel=True), on("cpu"))
    cast_kernel.check(configurator.Config(), torch.device("cpu"))          # off: nothing to check


def test_the_kernel_in_the_interpreter():
    """run() in Triton's interpreter, both float8 formats, on tiles that do not divide the shape, its amax a view into
    row 1 of a layer's history: the amax is x's largest |value| folded into what was there, the rest of the history
    untouched, every value cast as reference() casts it, to the interpreter's float8 rounding (not a GPU's: the bytes
    are compared on a GPU only), the transposed copy the same bytes transposed, and the same bytes without it."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs Triton (for its interpreter)")
    code = (f"import sys; sys.path[:0] = [{ROOT!r}]; import torch\n"
            "from speedgpt.features import cast_kernel\n"
            "torch.manual_seed(0)\n"
            "x = (torch.randn(70, 200) * 2).bfloat16()\n"
            "for e5m2 in (False, True):\n"
            "    hist = torch.full((2, 17), 0.5)\n"
            "    scale = torch.tensor((57344.0 if e5m2 else 448.0) / 4)\n"
            "    out, out_t = cast_kernel.run(x, scale, hist[1, 0:1], e5m2, transpose=True, block=(16, 64))\n"
            "    assert out_t.shape == (200, 70) and torch.equal(out_t.view(torch.uint8), out.view(torch.uint8).t())\n"
            "    assert torch.equal(cast_kernel.run(x, scale, torch.zeros(1), e5m2).view(torch.uint8), "
            "out.view(torch.uint8))\n"
            "    want_hist = torch.full((2, 17), 0.5); want = cast_kernel.reference(x, scale, want_hist[1, 0:1], e5m2)\n"
            "    assert torch.equal(hist, want_hist), (hist, want_hist)\n"
            "    a, w = out.float(), want.float()\n"   # the interpreter does not round float8 as a GPU does
            "    assert out.dtype == want.dtype and ((a * w) >= 0).all() and ((a - w).abs() <= 0.5 * "
            "torch.maximum(a.abs(), w.abs()) + 2 ** -6).all(), e5m2\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
