"""speedgpt/features/softmax_pass.py on the CPU: its flag's refusals (the kernels need Triton on a CUDA GPU), and, where
Triton is installed, the kernels' layout and masking run by Triton's interpreter (TRITON_INTERPRET=1) against
the PyTorch reference. The interpreter does not round float8 as the GPU does, so the bytes themselves are
compared on the GPU only (tests/test_gpu.py::test_softmax_pass_kernels_give_the_pytorch_math)."""
import importlib.util
import subprocess
import sys

import pytest
import torch

import configurator
from conftest import ROOT, on
from speedgpt.features import fp8, fused_ce, softmax_pass


def test_the_kernel_flag_is_refused_where_it_cannot_run():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"head_kernel=True would do nothing: it is the fused head's softmax pass. "
                                         r"Add --fused_ce=True, or leave head_kernel out"):
        fused_ce.check(configurator.Config(head_kernel=True), on(torch.device("cuda")))   # off a GPU: the GPU's
    # in FP8 and in bf16 alike, it needs a CUDA GPU, and Triton there
    for fp8_head in (True, False):
        with pytest.raises(ValueError, match=r"^head_kernel=True runs Triton kernels on a CUDA GPU; this run is on "
                                             r"cpu: add --head_kernel=False$"):
            fused_ce.check(configurator.Config(fp8_head=fp8_head, fused_ce=True, head_kernel=True), on(cpu))
    import importlib.util
    real = importlib.util.find_spec
    try:
        importlib.util.find_spec = lambda name, *a: None if name == "triton" else real(name, *a)
        with pytest.raises(ValueError, match=r"^head_kernel=True needs Triton \(pip install triton\); add "
                                             r"--head_kernel=False$"):
            softmax_pass.check(configurator.Config(fused_ce=True, head_kernel=True), torch.device("cuda"))
    finally:
        importlib.util.find_spec = real
    # fp8_head's own refusal names the way out through fp8_head
    with pytest.raises(ValueError, match=r"fp8_head=True needs a GPU of compute capability 8.9"):
        fp8.check(configurator.Config(fp8_head=True, fused_ce=True, head_kernel=True), on(cpu))


def test_train_refuses_the_kernel_flag_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "train.py", "--head_kernel=True", "--device=cpu",
                          f"--out_dir={tmp_path / 'o'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == ["error: head_kernel=True runs Triton kernels on a CUDA GPU; this run "
                                               "is on cpu: add --head_kernel=False"]   # fused_ce=True would not help
    # the flag's old name: one line naming the new one
    out = subprocess.run([sys.executable, "train.py", "--fp8_head_kernel=True", f"--out_dir={tmp_path / 'o'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "it is head_kernel now" in out.stderr.strip().splitlines()[-1]


def test_a_gpu_whose_triton_miscompiles_the_kernels_is_refused_in_one_line(monkeypatch):
    """check() runs verify() on the GPU at hand (tests/test_gpu.py runs it for real); what it reports stops
    the run with the way out."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(softmax_pass, "verify", lambda device: "Triton 9.9 compiled ... (tile shapes ...: 37% of "
                                                               "the bytes of g8t differ)")
    cfg = configurator.Config(fp8_head=True, fused_ce=True, head_kernel=True)
    with pytest.raises(ValueError) as e:
        softmax_pass.check(cfg, torch.device("cuda"))
    assert str(e.value) == ("head_kernel=True: Triton 9.9 compiled ... (tile shapes ...: 37% of the bytes of g8t "
                            "differ); add --head_kernel=False")
    monkeypatch.setattr(softmax_pass, "verify", lambda device: None)
    softmax_pass.check(cfg, torch.device("cuda"))


def test_compare_accepts_float8_rounding_and_names_anything_else():
    """verify()'s judge, on the CPU: the reference itself passes; a few values one e5m2 step off (exp rounding
    across a boundary, also among subnormals) pass; misplaced bytes, an unwritten (NaN) value, a value two
    steps off, a wrong loss or a transposed copy that is not the transpose are each named."""
    torch.manual_seed(0)
    n, V, vocab = 64, 256, 250
    logits = (4 * torch.randn(n, V)).bfloat16()
    y = torch.randint(0, vocab, (n,))
    y[::7] = -1
    ref = softmax_pass.reference(logits, y, vocab, 57344.0)
    assert softmax_pass.compare(ref, ref) is None

    def with_bytes(i, edit):                     # a copy of ref with output i's uint8 view edited in place
        out = [t.clone() for t in ref]
        edit(out[i].view(torch.uint8))
        if i == 1:                               # keep the transposed copy consistent unless testing it
            out[2] = out[1].t().contiguous()
        return out

    big = (ref[1].float().abs() > 1).nonzero()[0].tolist()
    sub = ((ref[1].float().abs() > 0) & (ref[1].float().abs() < 2 ** -14)).nonzero()

    def step_at(r, c):                           # the next float8 code: one step further from zero
        return lambda u: u.__setitem__((r, c), u[r, c] + 1)
    assert softmax_pass.compare(with_bytes(1, step_at(*big)), ref) is None
    if len(sub):
        assert softmax_pass.compare(with_bytes(1, step_at(*sub[0].tolist())), ref) is None
    assert "of the bytes of g8 differ" in softmax_pass.compare(with_bytes(1, lambda u: u.copy_(u.roll(1, 1))), ref)
    unwritten = with_bytes(1, lambda u: u[big[0], big[1]].fill_(0xFF))
    assert "more than one float8 step off" in softmax_pass.compare(unwritten, ref)
    assert "more than one float8 step off" in softmax_pass.compare(
        with_bytes(1, lambda u: u.__setitem__(tuple(big), u[big[0], big[1]] + 4)), ref)
    assert "the transposed copy" in softmax_pass.compare(with_bytes(2, step_at(*big[::-1])), ref)
    out = [t.clone() for t in ref]
    out[0][0] += 0.01
    assert softmax_pass.compare(out, ref) == "1 row losses differ"
    # the bf16 pass's (loss, g): one bfloat16 step apart passes; two steps, or an unwritten (NaN) value, do not
    loss, g, _ = softmax_pass.reference(logits, y, vocab, 1.0, torch.bfloat16)
    assert softmax_pass.compare((loss, g), (loss, g)) is None
    i = tuple((g.float().abs() > 0.01).nonzero()[0].tolist())
    for codes, problem in ((1, None), (2, "1 values of g more than one step off")):
        bumped = g.clone()
        bumped.view(torch.int16)[i] += codes
        assert softmax_pass.compare((loss, bumped), (loss, g)) == problem
    g_nan = g.clone()
    g_nan[0, 0] = float("nan")
    assert softmax_pass.compare((loss, g_nan), (loss, g)) == "1 values of g more than one step off"


def in_interpreter(call):
    """Run `call` (Python code using this module's helpers as t) in Triton's interpreter (conftest.in_interpreter)."""
    from conftest import in_interpreter
    in_interpreter(f"import test_softmax_pass as t; {call}")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (for its interpreter)")
@pytest.mark.parametrize("n, V, vocab", [(48, 320, 300), (37, 320, 320), (16, 64, 50)])
def test_the_kernels_layout_and_masks_in_the_interpreter(n, V, vocab):
    """Both row_stats variants and both grad_fp8 orders, in tiles that do not divide the rows or the
    vocabulary: each row's loss, g8t exactly g8 transposed, zero rows for ignored targets and zero padded
    columns, and each value within the interpreter's float8 rounding of the reference; and the bf16 pass
    (grad_rows) within one bfloat16 step of the reference, every value written."""
    in_interpreter(f"t.layout_and_masks({n}, {V}, {vocab})")


def layout_and_masks(n, V, vocab):
    torch.manual_seed(0)
    logits = (3 * torch.randn(n, V)).bfloat16()
    y = torch.randint(0, vocab, (n,))
    y[::7] = -1
    ref_loss, ref8, _ = softmax_pass.reference(logits, y, vocab, 57344.0)
    for stats in ((4, 64, 4, 0), (4, 64, 4, 1), (2, 32, 4, 1)):
        for grad in ((16, 64, 4, 1), (16, 64, 4, 0), (32, 32, 4, 1)):
            loss, g8, g8t = softmax_pass.run(logits, y, vocab, 57344.0,
                                             softmax_pass.kernels((stats,), (grad,), (grad,)))
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
            assert torch.equal(g8t.view(torch.uint8), g8.view(torch.uint8).t()), (stats, grad)
            a, b = g8.float(), ref8.float()
            assert (a[y == -1] == 0).all() and (a[:, vocab:] == 0).all()
            tiny = (b.abs() < 2 ** -14) * b.abs()          # below e5m2's normal range, the interpreter may give 0
            assert ((a * b) >= 0).all() and ((a - b).abs() <= 0.5 * torch.maximum(a.abs(), b.abs()) + tiny).all()
    # the bf16 head's pass (the same grad kernel, FP8=False): one row-major copy in the logits' dtype
    ref_loss, ref_g, _ = softmax_pass.reference(logits, y, vocab, 1.0, torch.bfloat16)
    for grad in ((16, 64, 4, 1), (16, 64, 4, 0), (8, 128, 4, 1)):
        out = (torch.full((n,), float("nan")), torch.full_like(logits, float("nan")))
        loss, g = softmax_pass.run(logits, y, vocab, 1.0, softmax_pass.kernels((stats,), (grad,), (grad,)), out,
                                   fp8=False)
        assert g.dtype == torch.bfloat16 and g.shape == logits.shape
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        assert softmax_pass.compare((loss, g), (ref_loss, ref_g)) is None, grad
        assert (g[y == -1] == 0).all() and (g[:, vocab:] == 0).all()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (for its interpreter)")
def test_verify_runs_every_tile_shape_once_and_leaves_the_rng_alone():
    """verify()'s launches in Triton's interpreter: one comparison per (row_stats, grad_fp8) shape and per
    grad_rows shape, on outputs
    the kernels wrote in full (the interpreter's float8 rounding is not the GPU's, so the bytes are judged
    here only by what it gets right: the losses and the transposed copy), the answer kept per device, and the
    global RNG as it was."""
    in_interpreter("t.verify_in_interpreter()")


def verify_in_interpreter():
    seen = []

    def judge(out, ref):
        seen.append(len(ref))
        torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-5)
        if len(ref) == 3:
            assert torch.equal(out[2].view(torch.uint8), out[1].view(torch.uint8).t())
        assert not out[1].float().isnan().any()
        return None
    softmax_pass.compare = judge
    rng = torch.get_rng_state()
    cpu = torch.device("cpu")
    assert softmax_pass.verify(cpu, n=32, V=320, vocab=300) is None
    assert seen == [3] * len(softmax_pass.STATS_CONFIGS) * len(softmax_pass.GRAD_CONFIGS) + \
        [2] * len(softmax_pass.ROWS_CONFIGS)
    assert torch.equal(torch.get_rng_state(), rng)
    softmax_pass.compare = lambda out, ref: "2% of the bytes of g8t differ"
    assert softmax_pass.verify(cpu, n=32, V=320, vocab=300) is None          # once per process and device
    softmax_pass._verified.clear()
    assert softmax_pass.verify(cpu, n=32, V=320, vocab=300).endswith("(tile shapes (8, 256, 8, 0) and "
                                                                      "(128, 64, 4, 1): 2% of the bytes of g8t differ)")


@pytest.mark.parametrize("config", softmax_pass.GRAD_CONFIGS, ids=lambda c: "x".join(map(str, c)))
def test_grad_fp8_compiles_without_byte_permutes(config):
    """grad_fp8 at each tile shape it is tuned over, launched as run() launches it (arguments recorded; n a multiple
    of 16, as fast.py's 65,536-row chunk) and compiled for a Hopper GPU: its PTX has no byte permute (prmt). With n
    specialized, Triton vectorizes the transposed 8-bit store through shared memory and 112 byte permutes at 128 x 64,
    which the ptxas Triton 3.6 bundles (12.8, 12.9) mis-lower: about 3 bytes in 8 of the copy were foreign on an H100
    and an H200, none with ptxas 13.0 (benchmarks/results/long_run_h200.md; the cast kernel's GELU derivative showed
    the same, test_cast_kernel.py)."""
    pytest.importorskip("triton", reason="needs Triton (its compiler)")
    from conftest import Launch, hopper_ptx
    built = Launch(), Launch(), Launch()
    n, V = 1024, 1024                                  # V, like 50,304, a multiple of 16 (Triton may take it so)
    softmax_pass.run(torch.zeros(n, V, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.long), V - 24, 1.0,
                     built=built)
    jit = softmax_pass.kernels()[1].fn
    bm, bv, warps, variant = config
    bound = {**dict(zip([p.name for p in jit.params], built[1].args)), **built[1].kwargs, "BLOCK_M": bm,
             "BLOCK_V": bv, "VARIANT": variant}
    ptx = hopper_ptx(jit, bound, warps)
    assert "st.global" in ptx and "prmt" not in ptx, ptx.count("prmt")
