"""Validation bits per byte (train.estimate_loss) against a direct count: the model's own probability of
each target, document by document, over the UTF-8 bytes of the texts themselves."""
import math
from contextlib import nullcontext

import numpy as np
import pytest
import torch

import data
import train
from model import GPT, GPTConfig

TEXTS = ["héllo wörld, ünïcode ✓ 日本語", "def f(x):\n    return x * 2\n", "naïve café: «quotes» — dash",
         "plain ascii text, nothing more", "emoji 🙂 and a tab\there", "Ωμέγα and ÅÄÖ, 中文字"]


def val_documents(out, tok):
    """The val split's documents, decoded: the shards' tokens cut at each end-of-text (BOS)."""
    stream = np.concatenate([data.read_shard(p) for p in data.find_shards(str(out), "val")]).tolist()
    docs, current = [], None
    for t in stream:
        if t == tok.eot:
            if current is not None:
                docs.append(current)
            current = []
        else:
            current.append(t)
    return [tok.decode(d) for d in docs + [current]]


@torch.no_grad()
@pytest.mark.parametrize("tokenizer", ["byte", "gpt2"])
def test_bits_per_byte_is_the_direct_count(tmp_path, tokenizer):
    """estimate_loss's bits per byte = sum over targets of -log2 p / the UTF-8 bytes of the val texts, the
    probabilities from the model run on each document alone ([EOT] + its tokens, targets its tokens and
    the next EOT, whose loss counts and whose bytes are 0); its loss is the same sum in nats per target."""
    src = tmp_path / "src"
    src.mkdir()
    for i, text in enumerate(TEXTS):
        (src / f"{i}.txt").write_text(text, encoding="utf-8")
    data.prepare(str(src), str(tmp_path / "d"), tokenizer, val_frac=0.5, seed=0, workers=1)
    tok = data.get_tokenizer(tokenizer)
    docs = val_documents(tmp_path / "d", tok)
    assert docs and all(d in TEXTS for d in docs)            # the val split holds some of the texts, whole
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=32))
    # padded batches: each document (< 64 tokens) is one row, its targets its tokens and the next BOS
    loader = data.Loader(str(tmp_path / "d"), "val", batch_size=2, block_size=64, packing=False,
                         vocab_size=tok.vocab_size)
    table = torch.as_tensor(tok.token_bytes())
    loss, bpb = train.estimate_loss(model, loader, loader.n_rows, nullcontext(), table)
    model.eval()
    nats, targets = 0.0, 0
    for text in docs:
        ids = [tok.eot] + tok.encode(text)
        logp = model(torch.tensor([ids]))[0][0, :, :tok.vocab_size].double().log_softmax(-1)    # (T, V)
        y = ids[1:] + [tok.eot]
        nats -= logp[torch.arange(len(ids)), torch.tensor(y)].sum().item()
        targets += len(y)
    n_bytes = sum(len(text.encode("utf-8")) for text in docs)
    assert bpb == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    assert loss == pytest.approx(nats / targets, rel=1e-5)
    assert loader.n_rows == len(docs)


def test_token_bytes_tables():
    """Each id's UTF-8 bytes: GPT-2's add up to the text's bytes (tokens holding parts of characters
    included); the byte tokenizer's are 1; end-of-text is 0 in both, and only it."""
    for name in ("byte", "gpt2"):
        tok = data.get_tokenizer(name)
        table = tok.token_bytes()
        assert table.shape == (tok.vocab_size,) and table[tok.eot] == 0 and (np.delete(table, tok.eot) >= 1).all()
        for text in TEXTS:
            assert table[tok.encode(text)].sum() == len(text.encode("utf-8"))
    assert (data.get_tokenizer("byte").token_bytes()[:256] == 1).all()
