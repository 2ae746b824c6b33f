"""speedgpt/softmax_pass.py on the CPU: its flag's refusals (the kernels need Triton on a CUDA GPU), and, where
Triton is installed, the kernels' layout and masking run by Triton's interpreter (TRITON_INTERPRET=1) against
the PyTorch reference. The interpreter does not round float8 as the GPU does, so the bytes themselves are
compared on the GPU only (tests/test_gpu.py::test_softmax_pass_kernels_give_the_pytorch_math)."""
import importlib.util
import subprocess
import sys

import pytest
import torch

import configurator
from conftest import ROOT
from speedgpt import fp8, softmax_pass


def test_the_kernel_flag_is_refused_where_it_cannot_run():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"fp8_head_kernel=True would do nothing: .* Add --fp8_head=True"):
        fp8.check(configurator.Config(fp8_head_kernel=True), cpu)
    with pytest.raises(ValueError, match=r"fp8_head_kernel=True needs Triton on a CUDA GPU .* --fp8_head_kernel=False"):
        softmax_pass.check(configurator.Config(fp8_head=True, fused_ce=True, fp8_head_kernel=True), cpu)
    # fp8_head's own refusal comes first on the CPU, and names both flags' way out through fp8_head
    with pytest.raises(ValueError, match=r"fp8_head=True needs a GPU of compute capability 8.9"):
        fp8.check(configurator.Config(fp8_head=True, fused_ce=True, fp8_head_kernel=True), cpu)


def test_train_refuses_the_kernel_flag_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "train.py", "--fp8_head_kernel=True", f"--out_dir={tmp_path / 'o'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == ["error: fp8_head_kernel=True would do nothing: it is the FP8 head's "
                                               "softmax pass. Add --fp8_head=True (and fused_ce=True), or leave "
                                               "fp8_head_kernel out"]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (for its interpreter)")
@pytest.mark.parametrize("n, V, vocab", [(48, 320, 300), (37, 320, 320), (16, 64, 50)])
def test_the_kernels_layout_and_masks_in_the_interpreter(n, V, vocab, monkeypatch):
    """Both row_stats variants and both grad_fp8 orders, in tiles that do not divide the rows or the
    vocabulary: each row's loss, g8t exactly g8 transposed, zero rows for ignored targets and zero padded
    columns, and each value within the interpreter's float8 rounding of the reference."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    logits = (3 * torch.randn(n, V)).bfloat16()
    y = torch.randint(0, vocab, (n,))
    y[::7] = -1
    ref_loss, ref8, _ = softmax_pass.reference(logits, y, vocab, 57344.0)
    for stats in ((4, 64, 4, 0), (4, 64, 4, 1), (2, 32, 4, 1)):
        for grad in ((16, 64, 4, 1), (16, 64, 4, 0), (32, 32, 4, 1)):
            loss, g8, g8t = softmax_pass.run(logits, y, vocab, 57344.0, softmax_pass.kernels((stats,), (grad,)))
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
            assert torch.equal(g8t.view(torch.uint8), g8.view(torch.uint8).t()), (stats, grad)
            a, b = g8.float(), ref8.float()
            assert (a[y == -1] == 0).all() and (a[:, vocab:] == 0).all()
            tiny = (b.abs() < 2 ** -14) * b.abs()          # below e5m2's normal range, the interpreter may give 0
            assert ((a * b) >= 0).all() and ((a - b).abs() <= 0.5 * torch.maximum(a.abs(), b.abs()) + tiny).all()
