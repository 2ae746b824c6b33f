"""Checks that need a CUDA GPU (run on the lent H200; skipped in CI)."""
import pytest
import torch

import data
from model import GPT, GPTConfig, check_attention_mask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpt(attention, T=256, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=T, vocab_size=512, n_layer=2, n_head=4, n_embd=128, attention=attention)
    return GPT(cfg).cuda().to(dtype)


def doc_batch(B=4, T=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 512, (B, T), generator=g)
    doc_ids = torch.cumsum(torch.rand(B, T, generator=g) < 0.02, dim=1)   # documents of ~50 tokens
    doc_ids[0] = 0                                                         # one row: a single document
    return idx.cuda(), torch.randint(0, 512, (B, T), generator=g).cuda(), doc_ids.cuda()


def test_flex_matches_sdpa_with_mask_forward_and_grads():
    torch.backends.cuda.matmul.allow_tf32 = False
    idx, tgt, doc_ids = doc_batch()
    out = {}
    for attention in ("sdpa", "flex"):
        m = gpt(attention)
        logits, loss = m(idx, tgt, doc_ids)
        loss.backward()
        out[attention] = (logits.detach(), {n: p.grad for n, p in m.named_parameters()})
    torch.testing.assert_close(out["flex"][0], out["sdpa"][0], rtol=1e-4, atol=1e-4)
    for name, g in out["sdpa"][1].items():
        torch.testing.assert_close(out["flex"][1][name], g, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("attention", ["naive", "sdpa", "flex"])
def test_no_contamination_gpu_bf16(attention):
    m = gpt(attention, dtype=torch.bfloat16)
    a, a2, b = torch.randint(0, 512, (3, 100)).cuda()
    with torch.no_grad():
        alone = m(b[None])[0][0]
        packed = [m(torch.cat([x, b])[None], doc_ids=torch.tensor([[0] * 100 + [1] * 100]).cuda())[0][0, 100:]
                  for x in (a, a2)]
        leak = m(torch.cat([a, b])[None])[0][0, 100:]
    torch.testing.assert_close(packed[0].float(), alone.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(packed[0], packed[1])            # a's tokens cannot change b's logits
    assert (leak.float() - alone.float()).abs().max() > 0.05


def test_flex_block_mask_is_block_diagonal_on_loader_batches(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(200):
        (docs / f"{i}.txt").write_text("x = 1\n" * (1 + (i * 37) % 90))
    data.prepare(str(docs), str(tmp_path / "d"), "byte", val_frac=0.1, workers=2)
    loader = data.Loader(str(tmp_path / "d"), "train", batch_size=4, block_size=1024, device="cuda", seed=0)
    m = gpt("flex", T=1024)
    for _ in range(3):
        b = next(loader)
        check_attention_mask(m.attention_mask(b.doc_ids, 1024, b.x.device), b.doc_ids)
