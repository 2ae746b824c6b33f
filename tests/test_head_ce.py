"""benchmarks/head_ce.py on the CPU: its variants of the head and cross-entropy (fused_ce's LinearCrossEntropy,
the cross-entropy alone) give its baseline's (model.py's) loss and gradients."""
import torch


def test_head_ce_benchmark_variants_match_the_model_loss():
    """benchmarks/head_ce.py's variants with gradients made in the forward (fused_ce, chunk by chunk;
    the cross-entropy alone) against its baseline (model.py's loss), with ignored targets and a chunk
    that does not divide the tokens."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import head_ce
    torch.manual_seed(0)
    y = torch.randint(0, 11, (20,))
    y[::3] = -1
    grads = []
    ce_alone = lambda h, w, y: head_ce.CrossEntropyGradInForward.apply(h @ w.t(), y, 11) / (y != -1).sum()
    for loss_fn in (head_ce.loss_baseline, head_ce.fused_loss(7, 11), ce_alone):
        h = torch.randn(20, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
        w = torch.randn(11, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
        loss = loss_fn(h, w, y)
        (3 * loss).backward()
        grads.append((loss, h.grad, w.grad))
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
