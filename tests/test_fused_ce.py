"""speedgpt/features/fused_ce.py on the CPU: LinearCrossEntropy (the head and its cross-entropy fused, gradients made in
the forward, chunk by chunk) gives the plain head's loss and gradients, and in float8 (fp8_head: the CPU build
of torch runs float8 matmuls) comes close to bf16, casting the weight once; train.py with fused_ce trains step
for step as the plain head does. The GPU checks are in tests/test_gpu.py."""
import pytest
import torch

import configurator
import train
from conftest import assert_same_outputs, outputs_and_grads, read_metrics, tiny_args
from conftest import tiny_gpt as tiny
from speedgpt.features import fp8, fused_ce
from speedgpt.features.fused_ce import FusedHeadLoss, LinearCrossEntropy


def test_fused_ce_gives_the_plain_loss_and_gradients():
    """fused_ce (LinearCrossEntropy, gradients made in the forward, chunk by chunk): the loss and every
    gradient of the plain path, with ignored targets, a padded vocabulary (61 -> 64: the padded ids stay
    out of the softmax) and chunks that do not divide the tokens; no logits in training; in eval
    (no gradients) the plain path with its logits."""
    torch.manual_seed(0)
    idx, tgt = torch.randint(0, 61, (2, 32)), torch.randint(0, 61, (2, 32))
    tgt[0, ::3] = -1
    doc_ids = torch.cumsum(torch.rand(2, 32) < 0.15, dim=1)
    out = {}
    for chunk in (0, 24, 64):
        m = tiny(dropout=0.0, vocab_size=61)
        if chunk:                                   # what fused_ce.apply does
            m.head_loss = FusedHeadLoss(chunk)
        out[chunk] = outputs_and_grads(m, idx, tgt, doc_ids)
        assert (out[chunk][0] is None) == (chunk > 0)
        with torch.no_grad():
            logits, eval_loss = m(idx, tgt, doc_ids)
        assert logits.shape == (2, 32, 64) and torch.isinf(logits[..., 61:]).all()
        torch.testing.assert_close(eval_loss, out[0][1], rtol=1e-12, atol=0)
    for chunk in (24, 64):
        assert_same_outputs(out[chunk], out[0], rtol=1e-12, atol=0, grad_rtol=1e-10, grad_atol=1e-13)


def test_fused_ce_in_fp8_is_close_to_bf16():
    """fp8_head with fused_ce: LinearCrossEntropy's matmuls in float8 (torchao's tensorwise scaling)
    give the bf16 path's loss and gradients within FP8 rounding, not exactly (CPU float8 matmul)."""
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    h = torch.randn(300, 64, requires_grad=True)
    w = torch.nn.Parameter(0.1 * torch.randn(512, 64))
    y = torch.randint(0, 500, (300,))
    y[::7] = -1
    out = []
    for in_fp8 in (False, True):
        h.grad = w.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = LinearCrossEntropy.apply(h, w, y, 500, 128, in_fp8)
        loss.backward()
        out.append((loss.item(), h.grad.clone(), w.grad.clone()))
    assert out[0][0] != out[1][0] and abs(out[0][0] - out[1][0]) < 2e-3 * out[0][0]
    for a, b in zip(out[0][1:], out[1][1:]):
        assert not torch.equal(a, b) and (a - b).norm() < 0.06 * a.norm()


def test_fused_ce_in_fp8_casts_the_weight_once_with_the_same_result():
    """LinearCrossEntropy casts the head's weight to float8 once for all chunks (fp8.cast_rhs, both
    layouts); each chunk then gives exactly what head_ce_chunk gives when it casts the weight itself."""
    pytest.importorskip("torchao")
    from speedgpt.features.fused_ce import head_ce_chunk
    torch.manual_seed(0)
    h = torch.randn(256, 64, dtype=torch.bfloat16)
    w = (0.1 * torch.randn(512, 64)).bfloat16()
    y = torch.randint(0, 500, (256,))
    w8 = fp8.cast_rhs(w.t()), fp8.cast_rhs(w)
    assert w8[0][0].dtype == torch.float8_e4m3fn and w8[0][0].stride() == (1, 64)     # column-major (64, 512)
    for s in (0, 128):
        once = head_ce_chunk(h[s:s + 128], w, y[s:s + 128], 500, True, w8)
        each = head_ce_chunk(h[s:s + 128], w, y[s:s + 128], 500, True)
        for a, b in zip(once, each):
            assert torch.equal(a, b)


def test_fused_ce_chunk_is_used_and_gives_the_plain_losses(byte_data, tmp_path, capsys):
    """fused_ce with fused_ce_chunk=40 (chunks that do not divide a micro-batch's 256 tokens) trains
    step for step as the plain head does (float32), and the chunk is the one printed and set."""
    plain = tiny_args(byte_data, tmp_path / "plain", "--max_iters=4")
    fused = tiny_args(byte_data, tmp_path / "fused", "--max_iters=4", "--fused_ce=True", "--fused_ce_chunk=40")
    train.main(plain)
    train.main(fused)
    assert "fused_ce: head + cross-entropy in chunks of 40 tokens, matmuls in float32" in capsys.readouterr().out
    a, b = ([r["loss"] for r in read_metrics(tmp_path / d) if "loss" in r] for d in ("plain", "fused"))
    assert len(a) == len(b) == 4
    for step, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) < 1e-5, f"step {step}: plain {x} vs fused_ce {y}"


@pytest.mark.parametrize("cap", [None, 30.0])
def test_a_change_to_the_logits_the_fused_head_does_not_make_is_refused(monkeypatch, cap):
    """A fork's soft cap on the logits in GPT.head (model.py's head with the one line a fork adds): the fused head
    makes its logits itself and would train without it, silently; fused_ce.apply compares the two heads' losses
    first and refuses in one line. The same head without the cap installs, and the weights come back bit for bit."""
    import torch.nn.functional as F
    import model
    from model import GPT, GPTConfig
    head = model.GPT.head

    def forked(self, x, targets=None):
        if targets is not None and self.head_loss is not None and torch.is_grad_enabled():
            return head(self, x, targets)
        logits = self.lm_head(self.transformer.ln_f(x))
        if cap:
            logits = cap * torch.tanh(logits / cap)                     # the fork's line
        logits[..., self.config.vocab_size:] = float("-inf")
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1, reduction="sum")
        return logits, loss / (targets != -1).sum().clamp(min=1)

    monkeypatch.setattr(model.GPT, "head", forked)
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=100))
    weights = {k: v.clone() for k, v in m.state_dict().items()}
    cfg = configurator.Config(fused_ce=True)
    if cap is None:
        assert fused_ce.apply(m, cfg) and isinstance(m.head_loss, fused_ce.FusedHeadLoss)
    else:
        with pytest.raises(ValueError, match=r"another loss .* model.py's GPT.head\?\): make it in "
                                             r"speedgpt/features/fused_ce.py too, or add --fused_ce=False"):
            fused_ce.apply(m, cfg)
        assert m.head_loss is None
    assert all(torch.equal(v, weights[k]) for k, v in m.state_dict().items())
