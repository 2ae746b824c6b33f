"""
The packing guarantee, checked (tests, and check_mask=True): the (B, T, T) attention mask a backend
really applies (a dense bool mask, a FlexAttention BlockMask including which blocks it skips, or
varlen's cu_seqlens), compared with a mask built independently from doc_ids (a causal block per run
of equal ids). Tests run it on hand-built and loader batches for every backend; train.py runs it on
every batch with check_mask=True.
"""
import torch

def reference_mask(doc_ids):
    """(B, T, T) bool mask built independently of attention.document_causal_mask: a lower-triangular block for
    each run of equal doc_ids, nothing else. The truth the backends are checked against."""
    B, T = doc_ids.shape
    ref = torch.zeros(B, T, T, dtype=torch.bool)
    for b, row in enumerate(doc_ids.tolist()):
        start = 0
        for t in range(1, T + 1):
            if t == T or row[t] != row[start]:
                ref[b, start:t, start:t] = torch.ones(t - start, t - start, dtype=torch.bool).tril()
                start = t
    return ref


def effective_mask(mask, doc_ids):
    """The (B, T, T) bool mask a backend really applies. For a BlockMask: the mask_mod inside partial
    blocks, everything inside full blocks (no mask_mod runs there), nothing elsewhere."""
    B, T = doc_ids.shape
    if mask is None:
        return torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
    if isinstance(mask, torch.Tensor) and mask.dim() == 1:
        return varlen_effective_mask(mask, B, T)
    if isinstance(mask, torch.Tensor):
        return mask[:, 0].cpu()

    def blocks(num, idx):                  # (B, 1, nq) counts and (B, 1, nq, nk) indices -> token mask
        nk = -(-T // mask.BLOCK_SIZE[1])
        valid = torch.arange(idx.size(-1), device=idx.device) < num[..., None]
        dense = torch.zeros(*idx.shape[:-1], nk + 1, dtype=torch.bool, device=idx.device)
        dense.scatter_(-1, torch.where(valid, idx, nk).long(), True)
        dense = dense[..., :nk].repeat_interleave(mask.BLOCK_SIZE[0], -2).repeat_interleave(mask.BLOCK_SIZE[1], -1)
        return dense[:, 0, :T, :T].expand(B, T, T).cpu()

    t = torch.arange(T, device=doc_ids.device)
    b = torch.arange(B, device=doc_ids.device)[:, None, None]
    mod = mask.mask_mod(b, 0, t[None, :, None], t[None, None, :]).expand(B, T, T).cpu()
    full = blocks(mask.full_kv_num_blocks, mask.full_kv_indices) if mask.full_kv_num_blocks is not None else False
    return full | (blocks(mask.kv_num_blocks, mask.kv_indices) & mod)


def varlen_effective_mask(cu_seqlens, B, T):
    """The (B, T, T) bool mask varlen attention applies for cu_seqlens: causal within each sequence.
    Raises AssertionError if the offsets do not rise from 0 to B*T or a sequence spans two rows."""
    cu = cu_seqlens.tolist()
    assert cu[0] == 0 and cu[-1] == B * T and all(a <= b for a, b in zip(cu, cu[1:])), \
        f"cu_seqlens must rise from 0 to B*T = {B * T}, got {cu[:4]}...{cu[-2:]}"
    out = torch.zeros(B, T, T, dtype=torch.bool)
    for s, e in zip(cu, cu[1:]):
        if e > s:
            b, i, j = s // T, s % T, s % T + e - s
            assert j <= T, f"cu_seqlens sequence [{s}, {e}) spans rows {b} and {b + 1}"
            out[b, i:j, i:j] = torch.ones(j - i, j - i, dtype=torch.bool).tril()
    return out


def check_attention_mask(mask, doc_ids):
    """Assert that `mask` (None, a (B, 1, T, T) bool tensor, a BlockMask or cu_seqlens, as from
    attention.attention_mask) lets each token attend exactly to itself and the earlier tokens of its own
    document. Raises AssertionError naming the first wrong (row, query, key)."""
    got, want = effective_mask(mask, doc_ids), reference_mask(doc_ids.cpu())
    bad = (got != want).nonzero()
    if len(bad):
        b, i, j = bad[0].tolist()
        raise AssertionError(f"attention mask is wrong at row {b}, query {i}, key {j}: "
                             f"{'attends across a document boundary' if got[b, i, j] else 'blocks its own document'} "
                             f"(doc_ids {doc_ids[b, i].item()} and {doc_ids[b, j].item()}); {len(bad)} wrong entries")
