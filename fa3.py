"""
FlashAttention-3's variable-length kernels (Hopper), called directly as one torch custom op.

torch.ops.flash_attn_3.fwd / .bwd come from `flash_attn_interface` (FlashAttention's hopper/ build, or
../shared/tools/fa3.sh on the lent H200). model.py uses this op for attention='varlen' where FA3 loads,
instead of torch's varlen_attn route (activate_flash_attention_impl("FA3")), for two measured reasons
(BENCHMARKS.md, issue 17): that route lets FA3 split the keys of fast.py's batches and pay a combine
kernel per call (39 of 1,028 GPU ms per step on the H200; torch 2.11's varlen_attn takes no
num_splits), and it returns separate dq, dk, dv that the backward concatenates into c_attn's gradient
(13 ms per step). Here: one split, and q, k, v read from and dq, dk, dv written into c_attn's packed
(N, 3, nh, hs) layout, as FlashAttention's own qkvpacked functions do.

A custom op with a fake implementation and a registered backward: torch.compile traces it without a
graph break, and the meta device runs it (tests/test_packing.py traces the model that way on the CPU).
"""
import torch
from torch import Tensor


@torch.library.custom_op("speedgpt::fa3_varlen_qkvpacked", mutates_args=())
def fa3_varlen_qkvpacked(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int) -> tuple[Tensor, Tensor]:
    """Causal attention within each sequence [cu_seqlens[i], cu_seqlens[i+1]) of N flattened tokens.
    qkv (N, 3, nh, hs) bf16/fp16 on a 9.x GPU (any strides with the last dimension contiguous);
    cu_seqlens (S+1,) int32 from 0 rising to N (repeats: empty sequences); max_seqlen a Python int >=
    the longest sequence. Returns out (N, nh, hs) and the softmax log-sum-exp (nh, N) float32 (kept for
    the backward). Raises RuntimeError where torch.ops.flash_attn_3 is not loaded."""
    q, k, v = qkv.unbind(1)
    out, lse, *_ = torch.ops.flash_attn_3.fwd(
        q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen, softmax_scale=q.size(-1) ** -0.5, is_causal=True, num_splits=1)
    return out, lse


@fa3_varlen_qkvpacked.register_fake
def _(qkv, cu_seqlens, max_seqlen):
    N, _, nh, hs = qkv.shape
    return qkv.new_empty(N, nh, hs), qkv.new_empty(nh, N, dtype=torch.float32)


@torch.library.custom_op("speedgpt::fa3_varlen_qkvpacked_backward", mutates_args=())
def fa3_varlen_qkvpacked_backward(dout: Tensor, qkv: Tensor, out: Tensor, lse: Tensor, cu_seqlens: Tensor,
                                  max_seqlen: int) -> Tensor:
    """Gradient of fa3_varlen_qkvpacked's out: dqkv (N, 3, nh, hs), dq, dk and dv written in place by
    FA3's backward (no concatenation afterwards)."""
    q, k, v = qkv.unbind(1)
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    torch.ops.flash_attn_3.bwd(
        dout.contiguous(), q, k, v, out, lse, *dqkv.unbind(1), cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen, softmax_scale=q.size(-1) ** -0.5, is_causal=True,
        deterministic=torch.are_deterministic_algorithms_enabled())
    return dqkv


@fa3_varlen_qkvpacked_backward.register_fake
def _(dout, qkv, out, lse, cu_seqlens, max_seqlen):
    return torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)


def _setup_context(ctx, inputs, output):
    qkv, cu_seqlens, max_seqlen = inputs
    ctx.save_for_backward(qkv, output[0], output[1], cu_seqlens)
    ctx.max_seqlen = max_seqlen


def _backward(ctx, dout, dlse):
    qkv, out, lse, cu_seqlens = ctx.saved_tensors
    return fa3_varlen_qkvpacked_backward(dout, qkv, out, lse, cu_seqlens, ctx.max_seqlen), None, None


fa3_varlen_qkvpacked.register_autograd(_backward, setup_context=_setup_context)


def fa3_varlen_attn(qkv, cu_seqlens, max_seqlen):
    """out (N, nh, hs) of fa3_varlen_qkvpacked (see there for shapes and errors)."""
    return fa3_varlen_qkvpacked(qkv, cu_seqlens, max_seqlen)[0]


def fa3_loaded():
    """True when torch.ops.flash_attn_3 has forward and backward kernels (after `import flash_attn_interface`)."""
    return hasattr(torch.ops, "flash_attn_3") and hasattr(torch.ops.flash_attn_3, "fwd") and \
        hasattr(torch.ops.flash_attn_3, "bwd")
