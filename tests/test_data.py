import json
import os

import numpy as np
import pytest
import torch

import data

DOCS = ["def f(x):\n    return x + 1\n", "print('<|endoftext|> is just text here')\n",
        "naïve café ☕ — unicode\n", "x", "a" * 500, "class A:\n    pass\n"]


def _write_docs(folder, docs):
    os.makedirs(folder, exist_ok=True)
    for i, d in enumerate(docs):
        with open(os.path.join(folder, f"doc{i}.txt"), "w", encoding="utf-8") as f:
            f.write(d)


def _all_tokens(out):
    return [np.asarray(data.read_shard(p)) for s in ("train", "val") for p in data.find_shards(out, s)]


def _split_docs(tokens, eot):
    docs, cur = [], []
    for t in tokens:
        if t == eot:
            docs.append(cur)
            cur = []
        else:
            cur.append(int(t))
    assert cur == [], "every document must end with end-of-text"
    return docs


@pytest.mark.parametrize("tokenizer", ["byte", "gpt2"])
def test_round_trip(tmp_path, tokenizer):
    try:
        tok = data.get_tokenizer(tokenizer)
    except FileNotFoundError as e:
        pytest.skip(f"GPT-2 tokenizer files unavailable: {e}")
    _write_docs(tmp_path / "in", DOCS)
    meta = data.prepare(str(tmp_path / "in"), str(tmp_path / "out"), tokenizer, val_frac=0.3, seed=1, workers=2)
    assert meta["eot_id"] == tok.eot and meta["vocab_size"] == tok.vocab_size
    decoded = []
    for toks in _all_tokens(tmp_path / "out"):
        decoded += [tok.decode(d) for d in _split_docs(toks, tok.eot)]
    # document count equals end-of-text count; the literal "<|endoftext|>" stayed ordinary text
    assert meta["train_docs"] + meta["val_docs"] == len(DOCS) == len(decoded)
    assert sorted(decoded) == sorted(DOCS)
    assert meta["val_docs"] >= 1 and meta["train_docs"] >= 1
    saved = json.load(open(tmp_path / "out" / "meta.json"))
    assert saved["tokenizer"] == tokenizer and saved["train_tokens"] + saved["val_tokens"] == sum(map(len, _all_tokens(tmp_path / "out")))


def test_split_is_deterministic_and_by_document(tmp_path):
    _write_docs(tmp_path / "in", [f"document number {i}\n" * (i + 1) for i in range(40)])
    a = data.prepare(str(tmp_path / "in"), str(tmp_path / "a"), "byte", val_frac=0.25, seed=7, workers=2)
    data.prepare(str(tmp_path / "in"), str(tmp_path / "b"), "byte", val_frac=0.25, seed=7, workers=1)
    for split in ("train", "val"):
        (pa,), (pb,) = data.find_shards(tmp_path / "a", split), data.find_shards(tmp_path / "b", split)
        assert np.array_equal(data.read_shard(pa), data.read_shard(pb))
    assert 0 < a["val_docs"] < 40


def test_jsonl_and_single_file(tmp_path):
    with open(tmp_path / "d.jsonl", "w") as f:
        for d in DOCS:
            f.write(json.dumps({"text": d, "title": "t"}) + "\n")
    meta = data.prepare(str(tmp_path / "d.jsonl"), str(tmp_path / "j"), "byte", val_frac=0.3, seed=1, workers=1)
    assert meta["train_docs"] + meta["val_docs"] == len(DOCS)
    (tmp_path / "one.txt").write_text("hello world")
    meta = data.prepare(str(tmp_path / "one.txt"), str(tmp_path / "o"), "byte", val_frac=0.0, workers=1)
    assert meta["train_docs"] == 1 and meta["train_tokens"] == len("hello world") + 1
    with open(tmp_path / "bad.jsonl", "w") as f:
        f.write('{"body": "no text field"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        data.prepare(str(tmp_path / "bad.jsonl"), str(tmp_path / "x"), "byte", workers=1)
    with open(tmp_path / "num.jsonl", "w") as f:
        f.write('{"text": "ok"}\n{"text": 5}\n')
    with pytest.raises(ValueError, match="num.jsonl:2: 'text' must be a string"):
        data.prepare(str(tmp_path / "num.jsonl"), str(tmp_path / "x"), "byte", workers=1)


def test_uint32_shards_never_wrap(tmp_path):
    small, big = np.array([0, 65535, 7]), np.array([0, 65536, 70000, 2**31])
    data.write_shard(str(tmp_path / "train_000000.bin"), small)
    data.write_shard(str(tmp_path / "train_000001.bin"), big)
    assert data.read_header(str(tmp_path / "train_000000.bin")) == (3, np.uint16)
    assert data.read_header(str(tmp_path / "train_000001.bin")) == (4, np.uint32)
    assert np.array_equal(data.read_shard(str(tmp_path / "train_000001.bin")), big)
    assert np.array_equal(data.read_shard(str(tmp_path / "train_000000.bin")), small)


def test_corrupt_and_missing_shards(tmp_path):
    good = str(tmp_path / "train_000000.bin")
    data.write_shard(good, np.arange(100))
    raw = open(good, "rb").read()
    cases = {"truncated": raw[:-10], "header": raw[:100], "magic": b"\0" * 4 + raw[4:],
             "version": raw[:4] + np.int32(9).tobytes() + raw[8:]}
    for name, content in cases.items():
        path = str(tmp_path / f"{name}_train_000000.bin")
        open(path, "wb").write(content)
        with pytest.raises(ValueError, match=path.replace(".", r"\.")):
            data.read_header(path)
    with pytest.raises(ValueError, match="truncated"):
        data.read_header(str(tmp_path / "truncated_train_000000.bin"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.find_shards(str(tmp_path / "nowhere"), "train")
    with pytest.raises(FileNotFoundError, match="no val"):
        data.find_shards(str(tmp_path), "val")
    with pytest.raises(FileNotFoundError):
        data.prepare(str(tmp_path / "missing_input"), str(tmp_path / "o"), "byte")


def test_llmc_fineweb_shard_loads_as_is(tmp_path):
    """A shard written the way llm.c's fineweb.py writes it (no meta.json, llm.c's file name)."""
    toks = np.random.default_rng(0).integers(0, 50257, size=5000).astype(np.uint16)
    toks[::97] = 50256
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    for split in ("train", "val"):
        with open(tmp_path / f"fineweb_{split}_000000.bin", "wb") as f:
            f.write(header.tobytes())
            f.write(toks.tobytes())
    loader = data.Loader(str(tmp_path), "train", batch_size=3, block_size=32, seed=0, document_mask=False)
    b = next(loader)
    assert loader.eot == 50256 and b.x.shape == (3, 32) and b.x.dtype == torch.int64
    for row_x, row_y in zip(b.x.numpy(), b.y.numpy()):
        start = next(i for i in range(len(toks) - 32) if np.array_equal(toks[i:i + 32], row_x))
        assert np.array_equal(toks[start + 1:start + 33], row_y)


def test_loader_batches_doc_ids_and_state(byte_data):
    kw = dict(batch_size=4, block_size=128, seed=3)
    # the prefetch depth changes when batches are built, never which batches come
    a, b = data.Loader(str(byte_data), "train", prefetch=5, **kw), data.Loader(str(byte_data), "train", prefetch=1, **kw)
    eot = a.eot
    batches = [next(a) for _ in range(3)]
    for x in batches:
        y = next(b)
        assert torch.equal(x.x, y.x) and torch.equal(x.y, y.y)
    first = batches[0]
    assert first.x.shape == first.y.shape == first.doc_ids.shape == (4, 128)
    assert torch.equal(first.x[:, 1:][first.y[:, :-1] != -1], first.y[:, :-1][first.y[:, :-1] != -1])
    # doc_ids: +1 right after each end-of-text; the EOT's own target (across the boundary) is -1
    for xb in batches:
        for row, ids, tgt in zip(xb.x, xb.doc_ids, xb.y):
            expected = torch.cumsum((row == eot).long(), 0) - (row == eot).long()
            assert torch.equal(ids, expected) and ids[0] == 0
            assert (tgt[row == eot] == -1).all()
            assert xb.n_valid == int((xb.y != -1).sum())
    # the sampler state replays the same stream
    state = a.state_dict()
    after = [next(a) for _ in range(2)]
    c = data.Loader(str(byte_data), "train", prefetch=3, **kw)
    c.load_state_dict(state)
    for x in after:
        assert torch.equal(x.x, next(c).x)
    # reset(): back to the first batch
    a.reset()
    assert torch.equal(next(a).x, first.x)


def test_padded_loader(byte_data):
    T = 2048
    loader = data.Loader(str(byte_data), "train", batch_size=16, block_size=T, seed=0, packing=False)
    toks = np.concatenate([np.asarray(data.read_shard(p)) for p in loader.paths])
    n_docs = int((toks == loader.eot).sum())
    # the pieces cover every in-document target exactly once: each token but a document's first
    assert loader.pieces[:, 2].sum() == len(toks) - n_docs and loader.pieces[:, 2].max() <= T
    saw_padding = False
    for _ in range(4):
        b = next(loader)
        assert b.n_valid == int((b.y != -1).sum())
        for x, y, ids in zip(b.x, b.y, b.doc_ids):
            n = int((y != -1).sum())
            assert (y[:n] != -1).all() and (y[n:] == -1).all()       # real tokens first, then padding
            assert (ids[:n] == 0).all() and (ids[n:] == 1).all()
            assert not (x[:n] == loader.eot).any()                   # one document per row
            saw_padding |= n < T
    assert saw_padding


def test_ids_outside_the_vocabulary_are_refused(tmp_path):
    for split in ("train", "val"):
        data.write_shard(str(tmp_path / f"{split}_000000.bin"), np.full(1000, 280))
    loader = data.Loader(str(tmp_path), "train", batch_size=2, block_size=16, eot=256, vocab_size=257)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        next(loader)
