"""speedgpt/evaluation.py on the CPU: time to a target validation loss (target_val_loss), and validation bits
per byte (estimate_loss) against a direct count: the model's own probability of each target, document by
document, over the UTF-8 bytes of the texts themselves."""
import json
import math
from contextlib import nullcontext

import numpy as np
import pytest
import torch

import data
import train
from conftest import TEXTS, gpt2_tokenizer, read_metrics, tiny_args
from model import GPT, GPTConfig


def test_the_run_stops_at_the_first_evaluation_at_or_below_the_target(byte_data, tmp_path, capsys):
    args = ["--max_iters=12", "--eval_interval=2", "--save_checkpoints=False"]
    train.main(tiny_args(byte_data, tmp_path / "full", *args))
    vals = {r["step"]: r["val_loss"] for r in read_metrics(tmp_path / "full") if "val_loss" in r}
    first = next(s for s in sorted(vals) if s > 0 and vals[s] < min(vals[t] for t in vals if t < s))
    target = vals[first]                                  # reached exactly there, not before
    assert all(v > target for s, v in vals.items() if s < first)
    capsys.readouterr()
    summary = train.main(tiny_args(byte_data, tmp_path / "target", *args, f"--target_val_loss={target}"))
    out = capsys.readouterr().out
    reached = summary["target_reached"]
    assert summary["steps"] == first and reached["step"] == first and reached["val_loss"] == target
    assert reached["tokens"] == first * 4 * 64                             # batch 4 x block 64, packed: no padding
    assert reached["train_seconds"] > 0
    assert f"step {first}: target val loss reached ({target:.4f}) at step {first}" in out
    assert f"target val loss reached at step {first}: {first * 256:,} tokens" in out.splitlines()[-1]
    saved = json.loads((tmp_path / "target" / "summary.json").read_text())
    assert saved["target_reached"] == reached and saved["target_val_loss"] == target
    assert max(r["step"] for r in read_metrics(tmp_path / "target")) == first


def test_a_target_never_reached_says_so(byte_data, tmp_path, capsys):
    summary = train.main(tiny_args(byte_data, tmp_path, "--max_iters=2", "--target_val_loss=0.01",
                                   "--save_checkpoints=False"))
    assert summary["target_reached"] is None and summary["steps"] == 2
    assert "target val loss not reached" in capsys.readouterr().out.splitlines()[-1]


def test_a_target_without_evaluations_is_refused(byte_data, tmp_path):
    with pytest.raises(ValueError, match=r"target_val_loss=3.0 stops at the first evaluation .*: it needs eval_tokens > 0"):
        train.main(tiny_args(byte_data, tmp_path, "--target_val_loss=3.0", "--eval_tokens=0"))


# -----------------------------------------------------------------------------
# bits per byte


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
    tok = data.get_tokenizer(tokenizer) if tokenizer == "byte" else gpt2_tokenizer()
    src = tmp_path / "src"
    src.mkdir()
    for i, text in enumerate(TEXTS):
        (src / f"{i}.txt").write_text(text, encoding="utf-8")
    data.prepare(str(src), str(tmp_path / "d"), tokenizer, val_frac=0.5, seed=0, workers=1)
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
