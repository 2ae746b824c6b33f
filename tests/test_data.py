"""data.py on the CPU: preparation (the BOS convention in the shards, a deterministic split by document,
text_field and max_tokens, its notes, Ctrl-C, a disk that cannot be written, an --out that cannot be created,
its flags) and the loader (batches, doc_ids
and state, padding, every row once per epoch without replacement, ids outside the vocabulary)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import torch

import data
import train
from conftest import (DOCS, ROOT, _folder_state, _foreign_shards, _split_docs, _stream, _write_docs, gpt2_tokenizer,
                      tiny_args)


def test_training_on_gpt2_tokens_needs_no_tokenizer_files(tmp_path, monkeypatch):
    """prepare() keeps each token id's UTF-8 bytes beside meta.json (token_bytes.npy), so a run on GPT-2 tokens
    computes bits per byte without tiktoken's files; a folder prepared before that reads the tokenizer's."""
    tok = gpt2_tokenizer()
    _write_docs(tmp_path / "in", [f"{i} {d} " * 20 for i, d in enumerate(DOCS * 4)])
    data.prepare(str(tmp_path / "in"), str(tmp_path / "d"), "gpt2", val_frac=0.3, seed=1, workers=1)
    meta = data.load_meta(str(tmp_path / "d"))
    assert np.array_equal(data.token_bytes(str(tmp_path / "d"), meta), tok.token_bytes())

    def offline(self):
        raise FileNotFoundError("could not load tiktoken's GPT-2 files (offline)")
    monkeypatch.setattr(data.GPT2Tokenizer, "__init__", offline)
    summary = train.main(tiny_args(tmp_path / "d", tmp_path / "out", "--max_iters=2"))
    assert summary["val_bpb"] > 0
    os.remove(tmp_path / "d" / data.TOKEN_BYTES)                  # a folder prepared before token_bytes.npy
    with pytest.raises(FileNotFoundError, match="tiktoken's GPT-2 files"):
        data.token_bytes(str(tmp_path / "d"), meta)
    monkeypatch.undo()
    assert np.array_equal(data.token_bytes(str(tmp_path / "d"), meta), tok.token_bytes())


@pytest.mark.parametrize("tokenizer", ["byte", "gpt2"])
def test_round_trip_and_index(tmp_path, tokenizer):
    tok = data.get_tokenizer(tokenizer) if tokenizer == "byte" else gpt2_tokenizer()
    _write_docs(tmp_path / "in", DOCS + [""])            # an empty document is skipped
    meta = data.prepare(str(tmp_path / "in"), str(tmp_path / "out"), tokenizer, val_frac=0.3, seed=1, workers=2)
    assert meta["eot_id"] == tok.eot and meta["vocab_size"] == tok.vocab_size and meta["format"] == 2
    decoded = [tok.decode(d) for s in ("train", "val") for d in _split_docs(_stream(tmp_path / "out", s), tok.eot)]
    # one end-of-text before each document; the literal "<|endoftext|>" stayed ordinary text
    assert meta["train_docs"] + meta["val_docs"] == len(DOCS) == len(decoded) and meta["empty_docs_skipped"] == 1
    assert sorted(decoded) == sorted(DOCS)
    assert meta["val_docs"] >= 1 and meta["train_docs"] >= 1
    saved = json.load(open(tmp_path / "out" / "meta.json"))
    assert saved["train_tokens"] + saved["val_tokens"] == sum(len(_stream(tmp_path / "out", s))
                                                              for s in ("train", "val"))
    for path in data.find_shards(tmp_path / "out", "train"):   # the index written at preparation
        toks = np.asarray(data.read_shard(path))
        max_id, starts = data.read_index(path, len(toks), tok.eot, foreign=False)
        assert max_id == toks.max() and np.array_equal(starts, np.flatnonzero(toks == tok.eot))


def test_split_is_deterministic_and_by_document(tmp_path):
    _write_docs(tmp_path / "in", [f"document number {i}\n" * (i + 1) for i in range(40)])
    a = data.prepare(str(tmp_path / "in"), str(tmp_path / "a"), "byte", val_frac=0.25, seed=7, workers=2,
                     shard_tokens=1000)
    data.prepare(str(tmp_path / "in"), str(tmp_path / "b"), "byte", val_frac=0.25, seed=7, workers=1, shard_tokens=1000)
    assert len(a["shards"]["train"]) > 3                  # documents run on across shards
    for split in ("train", "val"):
        for pa, pb in zip(data.find_shards(tmp_path / "a", split), data.find_shards(tmp_path / "b", split),
                          strict=True):
            assert np.array_equal(data.read_shard(pa), data.read_shard(pb))
    assert 0 < a["val_docs"] < 40


def test_text_field_and_max_tokens(tmp_path, capsys):
    with open(tmp_path / "d.jsonl", "w") as f:
        for i in range(100):
            f.write(json.dumps({"body": f"document {i:03d}"}) + "\n")     # 12 bytes + BOS = 13 tokens
    meta = data.prepare(str(tmp_path / "d.jsonl"), str(tmp_path / "o"), "byte", val_frac=0.0, workers=1,
                        text_field="body", max_tokens=100)
    assert meta["train_docs"] == 8 and meta["train_tokens"] == 104      # stops after the document reaching 100
    bar = capsys.readouterr().err.split("\r")[-1]
    assert "100%" in bar and "104/104" in bar, bar      # the bar ends full at the tokens written, never 104/100
    with pytest.raises(ValueError, match=r"d.jsonl:1: expected a JSON object with a 'text' field, got fields body: "
                                         r"name the documents' field with --text_field \(--text_field=body\?\)$"):
        data.prepare(str(tmp_path / "d.jsonl"), str(tmp_path / "x"), "byte", workers=1)
    # a field named for plain text (one file, or the stdlib) did nothing, unsaid: refused before any tokenizing
    (tmp_path / "txt" / "sub").mkdir(parents=True)
    (tmp_path / "txt" / "sub" / "plain.txt").write_text("a plain document")
    for source in (str(tmp_path / "txt" / "sub" / "plain.txt"), str(tmp_path / "txt"), None):
        with pytest.raises(ValueError, match=r"^--text_field=body names the field of JSON lines, Parquet or a Hugging "
                                             r"Face dataset: .* holds plain text alone, one document per file; leave"):
            data.prepare(source, str(tmp_path / "y"), "byte", workers=1, text_field="body")
        assert not (tmp_path / "y").exists()
    os.replace(tmp_path / "d.jsonl", tmp_path / "txt" / "sub" / "d.jsonl")     # a record file inside: taken
    assert data.prepare(str(tmp_path / "txt"), str(tmp_path / "y"), "byte", val_frac=0.0, workers=1,
                        text_field="body")["train_docs"] == 101


def _signal_data_py(source, out, delay, signum):
    """data.py preparing `source` into `out` in its own process group with Ctrl-C's default handling (a
    terminal's foreground job: a test run started in the background inherits SIGINT ignored, and Python keeps
    it so), with two busy processes beside it; `signum` to the whole group `delay` s after its temp folder
    appears. Returns (the process, its stderr, seconds from the signal to its end)."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        as_in_a_terminal = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                            "sys.argv = sys.argv[1:]; runpy.run_path('data.py', run_name='__main__')")
        cmd = [sys.executable, "-c", as_in_a_terminal, "data.py", "--input", str(source), "--out", str(out),
               "--workers=1", "--shard_tokens=100000"]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        temp, deadline = out.parent / f".{out.name}.preparing", time.time() + 60
        while not temp.is_dir() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        sent = time.time()
        if proc.poll() is None:
            os.killpg(proc.pid, signum)
        err = proc.communicate(timeout=30)[1]
        return proc, err, time.time() - sent
    finally:
        for b in busy:
            b.kill()
            b.wait()


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(6))
def test_ctrl_c_under_load_leaves_the_old_folder_and_ends_at_once(tmp_path, attempt, big_jsonl):
    """Ctrl-C (SIGINT to data.py's whole process group, as a terminal sends it, so the workers get it too)
    at a random moment of a preparation over a good folder, with two busy processes beside it: data.py
    ends within seconds, with status 130 and one line; the good folder is byte for byte as it was, and
    nothing else is left beside it. A SIGKILL leaves a temp folder, which the next preparation removes."""
    import random
    os.symlink(big_jsonl, tmp_path / "big.jsonl")
    out = tmp_path / "out"
    data.prepare(str(tmp_path / "big.jsonl"), str(out), "byte", workers=1, max_tokens=10_000)
    before = _folder_state(out)
    signum = signal.SIGKILL if attempt == 5 else signal.SIGINT
    # a random moment: starting, tokenising, writing; if data.py finished first, once more at the very start
    for delay in (random.Random(attempt).uniform(0, 1.5), 0.0):
        proc, err, took = _signal_data_py(tmp_path / "big.jsonl", out, delay, signum)
        if proc.returncode != 0:
            break
        data.prepare(str(tmp_path / "big.jsonl"), str(out), "byte", workers=1, max_tokens=10_000)   # the good folder again
        before = _folder_state(out)
    if signum == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        data.prepare(str(tmp_path / "big.jsonl"), str(out), "byte", workers=1, max_tokens=10_000)   # cleans up
    else:
        if proc.returncode == 0:
            pytest.skip("data.py finished before the signal, twice")
        assert proc.returncode == 130, err[-2000:]
        assert err.strip().splitlines()[-1].startswith("interrupted: ") and "Traceback" not in err, err[-2000:]
        assert took < 10, f"data.py took {took:.1f} s to stop"
    assert _folder_state(out) == before
    assert sorted(os.listdir(tmp_path)) == ["big.jsonl", "out"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_two_signals_in_quick_succession_never_hang(tmp_path, big_jsonl, signum):
    """Plain `timeout` signals data.py, then its whole process group, at once; Ctrl-C pressed twice does much the
    same. Twelve times, at a random moment of a preparation with two busy processes beside it and a random gap
    between the two: data.py ends within seconds every time, with the first signal's status and line."""
    import random
    rng = random.Random(signum)
    for attempt in range(12):
        out = tmp_path / f"out{attempt}"
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            as_in_a_terminal = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                                "sys.argv = sys.argv[1:]; runpy.run_path('data.py', run_name='__main__')")
            proc = subprocess.Popen([sys.executable, "-c", as_in_a_terminal, "data.py", "--input", str(big_jsonl),
                                     "--out", str(out), "--workers=2"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            temp, deadline = tmp_path / f".{out.name}.preparing", time.time() + 60
            while not temp.is_dir() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 1.0))
            sent = time.time()
            for target in (proc.pid, -proc.pid):            # the process, then its group
                try:
                    os.kill(target, signum)
                except ProcessLookupError:
                    break
                time.sleep(rng.choice([0, 0, 0.001, 0.01, 0.05]))
            try:
                err = proc.communicate(timeout=30)[1]
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"attempt {attempt}: data.py still runs 30 s after two {signum.name}")
        finally:
            for b in busy:
                b.kill()
                b.wait()
        took = time.time() - sent
        if proc.returncode == 0:
            continue                                          # finished before the signals
        assert proc.returncode == 128 + signum and "Traceback" not in err, (attempt, proc.returncode, err[-2000:])
        word = "interrupted: " if signum == signal.SIGINT else "stopped (SIGTERM): "
        assert err.strip().splitlines()[-1].startswith(word) and took < 15, (attempt, took, err[-2000:])
        assert not temp.exists() and not out.exists()


A_SIGNAL_INSIDE_THE_PROGRESS_BARS_INIT = """
import os, runpy, signal, sys
import tqdm.std
free_pos = tqdm.std.tqdm._get_free_pos
def signalled(cls, instance=None):         # SIGTERM inside tqdm's __init__, before it sets the pos its __del__ reads
    os.kill(os.getpid(), signal.SIGTERM)
    return free_pos(instance)
tqdm.std.tqdm._get_free_pos = classmethod(signalled)
sys.argv = sys.argv[1:]
runpy.run_path("data.py", run_name="__main__")
"""


def test_a_signal_inside_the_progress_bars_construction_stops_without_a_traceback(tmp_path):
    """Under CI load a SIGTERM came inside tqdm's __init__: the stop was clean but the half-built bar's __del__
    printed tqdm's AttributeError. The bar is built with the signal held off, so the stop prints its line only."""
    _write_docs(tmp_path / "in", ["one document", "another one", "a third"])
    proc = subprocess.run([sys.executable, "-c", A_SIGNAL_INSIDE_THE_PROGRESS_BARS_INIT, "data.py", "--input",
                           str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--workers=1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("stopped (SIGTERM): "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.preparing").exists()


def test_a_one_document_val_split_is_noted(tmp_path, capsys):
    _write_docs(tmp_path / "in", ["one", "two", "three"])
    meta = data.prepare(str(tmp_path / "in"), str(tmp_path / "o"), "byte", val_frac=0.01, workers=1)
    assert meta["val_docs"] == 1
    assert "note: the val split is one document" in capsys.readouterr().out


def test_a_train_split_smaller_than_a_batch_is_noted(tmp_path, capsys):
    """A train split of fewer rows than one batch (all ranks' rows): each batch repeats rows, and the
    loader says so once, on rank 0. A batch of exactly the split's rows holds each once and says nothing;
    nor does the val split, whose rows past the split an evaluation leaves without targets."""
    import random
    import string
    rng = random.Random(0)
    _write_docs(tmp_path / "in", ["".join(rng.choices(string.ascii_letters, k=100)) for _ in range(8)])   # rows unalike
    out = str(tmp_path / "o")
    data.prepare(str(tmp_path / "in"), out, "byte", val_frac=0.2, seed=0, workers=1)
    n = data.Loader(out, "train", 1, 16).n_rows
    capsys.readouterr()

    def rows(loader):
        return [row.tobytes() for row in next(loader).x.numpy()]
    assert len(set(rows(data.Loader(out, "train", n, 16)))) == n and capsys.readouterr().out == ""
    got = rows(data.Loader(out, "train", n + 3, 16))
    assert len(got) == n + 3 and len(set(got)) == n             # every row, three of them twice
    assert capsys.readouterr().out == (
        f"note: the train split of {out} holds {n} rows of block_size=16, fewer than the {n + 3} of one batch "
        f"(batch_size={n + 3}): each batch repeats rows; more data, or a smaller batch_size or block_size, avoids it\n")
    half = n // 2 + 1                                           # fits one rank, not two
    data.Loader(out, "train", half, 16, rank=1, world_size=2)
    assert capsys.readouterr().out == ""
    data.Loader(out, "train", half, 16, rank=0, world_size=2)
    assert f"fewer than the {2 * half} of one batch (batch_size={half} on each of 2 ranks)" in capsys.readouterr().out
    data.Loader(out, "val", 1000, 16)
    assert capsys.readouterr().out == ""


def test_loader_batches_doc_ids_and_state(short_data):
    kw = dict(batch_size=4, block_size=128, seed=3)
    # the prefetch depth changes when batches are built, never which batches come
    a, b = (data.Loader(str(short_data), "train", prefetch=5, **kw),
            data.Loader(str(short_data), "train", prefetch=1, **kw))
    eot = a.eot
    batches = [next(a) for _ in range(3)]
    for x in batches:
        y = next(b)
        assert torch.equal(x.x, y.x) and torch.equal(x.y, y.y)
    first = batches[0]
    assert first.x.shape == first.y.shape == first.doc_ids.shape == (4, 128)
    assert torch.equal(first.x[:, 1:], first.y[:, :-1])                # packed rows: every position has a target
    saw_end = False
    for xb in batches:
        assert xb.n_valid == xb.x.numel()
        for row, ids, tgt in zip(xb.x, xb.doc_ids, xb.y):
            bos = (row == eot).long()
            assert torch.equal(ids, torch.cumsum(bos, 0) - bos[0]) and ids[0] == 0   # +1 at each BOS
            # the only target that crosses a document boundary is the next document's BOS
            crossing = ids[1:] != ids[:-1]
            assert (tgt[:-1][crossing] == eot).all()
            saw_end |= bool(crossing.any())
    assert saw_end
    # the sampler state replays the same stream
    state = a.state_dict()
    after = [next(a) for _ in range(2)]
    c = data.Loader(str(short_data), "train", prefetch=3, **kw)
    c.load_state_dict(state)
    for x in after:
        assert torch.equal(x.x, next(c).x)
    # reset(): back to the first batch
    a.reset()
    assert torch.equal(next(a).x, first.x)
    with pytest.raises(ValueError, match="older data.py"):
        c.load_state_dict({"rng": torch.Generator().get_state()})


def test_padded_loader(byte_data):
    T = 2048
    loader = data.Loader(str(byte_data), "train", batch_size=16, block_size=T, seed=0, packing=False)
    eot = loader.eot
    saw_padding = saw_end = saw_start = False
    for _ in range(4):
        b = next(loader)
        assert b.n_valid == int((b.y != -1).sum()) and b.doc_ids is None      # no document mask: no doc_ids
        for x, y in zip(b.x, b.y):
            n = int((y != -1).sum())
            assert (y[:n] != -1).all() and (y[n:] == -1).all()       # real tokens first, then padding
            assert not (x[1:n] == eot).any()                         # one document per row
            saw_start |= bool(x[0] == eot)                           # a document's first piece starts with its BOS
            saw_end |= bool(y[n - 1] == eot)                         # and its last one ends with the next BOS
            saw_padding |= n < T
    assert saw_padding and saw_end and saw_start


def _epoch_rows(toks, eot, T, packing):
    """Every row of an epoch, as the bytes of its inputs and last target: the block_size windows of the
    stream, or each document's block_size pieces; the stream ends with a virtual EOT."""
    ext = np.append(toks, eot).astype(np.int64)
    if packing:
        spans = [(i * T, T) for i in range(len(toks) // T)]
    else:
        starts = np.flatnonzero(toks == eot)
        spans = [(p, min(T, e - p)) for s, e in zip(starts, np.append(starts[1:], len(toks))) for p in range(s, e, T)]
    return Counter(ext[a:a + n + 1].tobytes() for a, n in spans)


def _row_keys(batches):
    keys = []
    for b in batches:
        for x, y in zip(b.x.numpy(), b.y.numpy()):
            n = int((y != -1).sum())
            keys.append(np.append(x[:n], y[n - 1]).tobytes())
    return keys


@pytest.mark.parametrize("packing", [True, False])
def test_every_row_once_per_epoch(short_data, packing):
    """Each window (or padded piece) once per epoch, in a fresh order each epoch; 2 ranks read the rows
    of 1 process, and a run resumed from rank 0's state at world size 1 goes on with the same rows."""
    B, T = 5, 64
    one = data.Loader(str(short_data), "train", B, T, seed=4, packing=packing)
    n, calls = one.n_rows, 2 * (one.n_rows // B + 2)           # two epochs and a bit, an even number of calls
    assert n % (2 * B), "an epoch should end inside a batch"
    single = [next(one) for _ in range(calls)]
    ranks = [data.Loader(str(short_data), "train", B, T, seed=4, packing=packing, rank=r, world_size=2)
             for r in range(2)]
    multi = []
    for _ in range(calls // 4):
        multi += [next(ranks[0]), next(ranks[1])]             # one call per rank: 2 * B global rows
    resumed = data.Loader(str(short_data), "train", B, T, seed=4, packing=packing)
    resumed.load_state_dict(ranks[0].state_dict())
    multi += [next(resumed) for _ in range(calls - len(multi))]
    for a, b in zip(single, multi, strict=True):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        assert (a.doc_ids is None) == (not packing) and (not packing or torch.equal(a.doc_ids, b.doc_ids))
    keys = _row_keys(single)
    expected = _epoch_rows(_stream(short_data, "train"), one.eot, T, packing)
    assert sum(expected.values()) == n
    assert Counter(keys[:n]) == Counter(keys[n:2 * n]) == expected
    assert keys[:n] != keys[n:2 * n]                          # a fresh order each epoch


def test_a_shard_changed_after_its_index_is_refused_by_name(byte_data, tmp_path):
    """Ids the index does not know of (the shard rewritten by hand after preparation) would reach the
    embedding as an IndexError (a device assert on a GPU) mid-training: the loader refuses the batch."""
    import shutil
    folder = tmp_path / "d"
    shutil.copytree(byte_data, folder)
    shard = data.find_shards(str(folder), "train")[0]
    n, dtype = data.read_header(shard)
    with open(shard, "r+b") as f:
        f.seek(data.HEADER_BYTES)
        f.write(np.full(n, 300, dtype=dtype).tobytes())
    loader = data.Loader(str(folder), "train", 2, 16, vocab_size=257)
    with pytest.raises(data.DataError, match="holds token id 300, outside the vocabulary .257 ids.: "
                                             "a shard changed after its index"):
        next(loader)
    # train.py meets it in training, after setup: one line, exit 1
    proc = subprocess.run([sys.executable, "train.py",
                           *tiny_args(folder, tmp_path / "o", "--device=cpu", "--eval_tokens=0")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: a train batch of"), proc.stderr[-2000:]


def test_ids_outside_the_vocabulary_are_refused_at_construction(byte_data, tmp_path):
    import shutil
    folder = tmp_path / "d"
    shutil.copytree(byte_data, folder)
    loader = data.Loader(str(folder), "train", 2, 16, vocab_size=257)        # the largest id is 256
    with pytest.raises(ValueError, match="train_000000.bin holds token id 256, outside the vocabulary"):
        data.Loader(str(folder), "train", 2, 16, vocab_size=256)
    del loader
    # foreign shards: indexed on first use, so train.py refuses them at setup, in one line
    toks = np.full(1000, 7)
    toks[::50], toks[500] = 50256, 60000
    (tmp_path / "foreign").mkdir()
    _foreign_shards(tmp_path / "foreign", toks)
    proc = subprocess.run([sys.executable, "train.py", f"--data_dir={tmp_path / 'foreign'}",
                           f"--out_dir={tmp_path / 'o'}",
                           "--n_layer=1", "--n_head=1", "--n_embd=8", "--block_size=16", "--max_iters=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"error: shard {tmp_path}/foreign/fineweb_train_000000.bin holds token id 60000, "
        f"outside the vocabulary (50257 ids of GPT-2's, assumed for a folder without meta.json or nanoGPT's "
        "meta.pkl): its tokens are another tokenizer's; prepare it with data.py"]


def test_a_disk_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """data.py onto a read-only filesystem, or a disk that fills mid-way: one line naming the output folder
    (not the temp folder beside it), the cause and the way out; the output folder as it was."""
    import errno
    from speedgpt import shards
    _write_docs(tmp_path / "in", DOCS)
    out = tmp_path / "o"
    monkeypatch.setattr(sys, "argv", ["data.py", "--input", str(tmp_path / "in"), "--out", str(out)])

    def fail(code):
        def raise_it(path, *args, **kwargs):
            raise OSError(code, os.strerror(code), path)
        return raise_it
    monkeypatch.setattr(shards.os, "makedirs", fail(errno.EROFS))
    with pytest.raises(SystemExit, match=re.escape(f"error: cannot create the output folder {out}: read-only "
                                                   f"filesystem in {tmp_path}; choose another --out")):
        data.main()
    monkeypatch.undo()
    monkeypatch.setattr(sys, "argv", ["data.py", "--input", str(tmp_path / "in"), "--out", str(out)])
    monkeypatch.setattr(shards, "write_index", fail(errno.ENOSPC))     # ShardWriter's
    with pytest.raises(SystemExit, match=re.escape(f"error: cannot write the output folder {out}: no space left on "
                                                   f"the device; {out} is as it was before; free space there, or "
                                                   "choose another --out")) as e:
        data.main()
    assert ".preparing" not in str(e.value) and not out.exists()


def test_an_existing_out_that_cannot_be_written_says_so(tmp_path, monkeypatch, capsys):
    """--out that exists on a read-only filesystem (or in a folder the user cannot write into) said "cannot create
    the output folder"; a read-only --out itself was replaced, its files left hidden beside it (.out.old). Both are
    one line saying it is not writable, before any tokenizing. Simulated: tests may run as root, who ignores
    permission bits (by hand: a read-only bind mount, or mode 0555 as another user)."""
    import errno
    from speedgpt import shards
    _write_docs(tmp_path / "in", DOCS)
    out = tmp_path / "out"
    data.prepare(str(tmp_path / "in"), str(out), "byte", val_frac=0.3, workers=1)
    capsys.readouterr()
    before, argv = _folder_state(out), ["--input", str(tmp_path / "in"), "--out", str(out), "--workers=1"]
    real_open, real_access = os.open, os.access

    def read_only(path, *args, **kwargs):          # the first write beside --out: its lock file
        if str(path).startswith(f"{tmp_path}/.out"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(shards.os, "open", read_only)
    with pytest.raises(SystemExit, match=re.escape(f"error: output folder {out} is not writable: read-only filesystem "
                                                   f"in {tmp_path}; choose another --out") + "$"):
        data.main(argv)
    monkeypatch.undo()
    monkeypatch.setattr(shards.os, "access", lambda path, mode: str(path) != str(out) and real_access(path, mode))
    with pytest.raises(SystemExit, match=re.escape(f"error: output folder {out} is not writable: permission denied "
                                                   f"in {out}; choose another --out, or fix the permissions of {out}")):
        data.main(argv)
    assert _folder_state(out) == before and sorted(os.listdir(tmp_path)) == ["in", "out"]
    assert "tokenizing" not in capsys.readouterr().err


def test_an_out_that_cannot_be_created_is_one_line(tmp_path):
    """--out under a regular file (or on /proc): one line naming --out's folder, why, and the way out."""
    _write_docs(tmp_path / "in", DOCS)
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "sub"
    with pytest.raises(SystemExit, match=re.escape(f"error: cannot create the output folder {out}: {tmp_path}/afile "
                                                   "is a file, not a folder; choose another --out")):
        data.main(["--input", str(tmp_path / "in"), "--out", str(out)])
    assert sorted(os.listdir(tmp_path)) == ["afile", "in"]


def test_one_document_among_empty_ones_is_refused_before_tokenizing(tmp_path, capsys):
    """A .jsonl of one real line and empty ones is one document: refused before any tokenizing, as one line is."""
    lines = [json.dumps({"text": t}) for t in ("", "the one real document", "", "")]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit, match=r"^error: input .*c.jsonl has 1 document: a train/val split needs at least 2"):
        data.main(["--input", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "o"), "--workers=1"])
    assert "tokenizing" not in capsys.readouterr().err and not (tmp_path / "o").exists()
    data.main(["--input", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "o"), "--workers=1", "--val_frac=0"])
    meta = json.load(open(tmp_path / "o" / "meta.json"))
    assert (meta["train_docs"], meta["val_docs"], meta["empty_docs_skipped"]) == (1, 0, 3)
    (tmp_path / "e.jsonl").write_text("\n".join([json.dumps({"text": ""})] * 3) + "\n")
    capsys.readouterr()
    with pytest.raises(SystemExit, match=r"^error: input .*e.jsonl holds only empty documents: nothing to tokenize"):
        data.main(["--input", str(tmp_path / "e.jsonl"), "--out", str(tmp_path / "e"), "--workers=1"])
    assert "tokenizing" not in capsys.readouterr().err and not (tmp_path / "e").exists()


def test_max_tokens_that_ends_inside_the_first_document_says_so(tmp_path):
    """Two documents, --max_tokens reached inside the first: not 'one document', but the flag that cut the second."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("x" * 5000)
    (tmp_path / "in" / "b.txt").write_text("y" * 50)
    with pytest.raises(SystemExit, match=r"^error: --max_tokens 1000 ends input .* inside its first document: a "
                                         r"train/val split needs 2; raise --max_tokens, or .*--val_frac=0$"):
        data.main(["--input", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--workers=1", "--max_tokens=1000"])


@pytest.mark.parametrize("argv, says", [
    (["--max_token=10"], "unknown flag '--max_token': did you mean --max_tokens?"),     # a misspelling
    (["--val", "0.5"], "unknown flag '--val': did you mean --val_frac?"),               # an abbreviation
    (["--in", "x", "--ou", "y"], "unknown flag '--in': did you mean --input?"),
    (["--val_frac=abc"], "argument --val_frac: invalid float value: 'abc'"),
    (["--tokenizer=foo"], "argument --tokenizer: invalid choice: 'foo'"),
    (["--seed=-1"], "argument --seed: must be a whole number in [0, 4294967295]"),       # as train.py's seeds
    (["--input", "x"], "--out is required with --input: add --out FOLDER"),
    (["--out", ""], "--out is empty: give the folder the shards go to"),
])
def test_flags_are_named_in_full_and_refused_in_one_line(tmp_path, monkeypatch, capsys, argv, says):
    """data.py parses flags as every script does (configurator.FlagParser): no abbreviations, the closest
    flag named, one line and exit status 2, before anything is read or written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        data.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {says}") and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == []


def test_both_flag_forms_prepare(tmp_path):
    _write_docs(tmp_path / "in", DOCS)
    data.main([f"--input={tmp_path / 'in'}", "--out", str(tmp_path / "o"), "--val_frac", "0.3", "--workers=1"])
    assert json.load(open(tmp_path / "o" / "meta.json"))["val_frac"] == 0.3


def test_encoding_flag(tmp_path, capsys):
    """--encoding reaches the reader: a Latin-1 file read as Latin-1; a name that is no codec refused in one line
    before anything is written."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes("déjà vu\n".encode("latin-1"))
    data.main(["--input", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--val_frac=0", "--workers=1",
               "--encoding=latin-1"])
    assert _stream(tmp_path / "o", "train")[1:].tolist() == list("déjà vu\n".encode())
    with pytest.raises(SystemExit, match=r"^error: --encoding='utf8:ignore': .*optionally with :replace$"):
        data.main(["--input", str(tmp_path / "in"), "--out", str(tmp_path / "x"), "--encoding=utf8:ignore"])
    assert not (tmp_path / "x").exists()



@pytest.mark.parametrize("encoding, says", [
    ("rot13", "not a text encoding; give a Python codec"),               # was a LookupError traceback
    ("hex:replace", "not a text encoding; give a Python codec"),
    ("utf-16", "utf-16 text holds NUL bytes, which mark a binary file here: convert the corpus to UTF-8 first"),
])
def test_an_encoding_data_py_cannot_read_is_refused_in_one_line(tmp_path, encoding, says):
    """A codec that is not text (rot13, hex) stopped data.py with a LookupError traceback; UTF-16 (any Python codec
    is taken) refused every file of its text as 'a binary file'. Both are named before anything is written."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes("déjà vu\n".encode("utf-16"))
    with pytest.raises(SystemExit, match=rf"^error: --encoding='{encoding}': {says}"):
        data.main(["--input", str(tmp_path / "in"), "--out", str(tmp_path / "o"), f"--encoding={encoding}"])
    assert not (tmp_path / "o").exists()

@pytest.mark.parametrize("argv, says", [
    (["--shard_tokens=0"], "error: shard_tokens must be positive, got 0\n"),
    (["--shard_tokens=2147483648"], "error: shard_tokens must be below 2^31 (a shard's header holds its count as an "
                                    "int32, as llm.c reads it), got 2,147,483,648: leave it out for 100M tokens a "
                                    "shard\n"),     # was an OverflowError once a shard filled, 2^31 tokens in
    (["--max_tokens=-1"], "error: max_tokens must be positive, got -1 (leave it out for the whole input)\n"),
    (["--val_frac=0.1"], "error: input {inp} has 1 document: a train/val split needs at least 2 (a document is a file "
                         "of a folder, a line of .jsonl): split it into files in a folder, or prepare it without "
                         "validation, --val_frac=0\n"),
])
def test_a_bad_value_is_named_alone_with_the_way_out(tmp_path, capsys, argv, says):
    """Each bad value of data.py is named alone (not beside a good one), a single-file corpus with its way out; the
    output folder is not made."""
    (tmp_path / "one.txt").write_text("a single text file, nanoGPT's input.txt")
    with pytest.raises(SystemExit) as e:
        data.main(["--input", str(tmp_path / "one.txt"), "--out", str(tmp_path / "o"), "--workers=1", *argv])
    assert str(e.value) + "\n" == says.format(inp=tmp_path / "one.txt") and not (tmp_path / "o").exists()
    assert "tokenizing" not in capsys.readouterr().err           # refused before any work, not after tokenizing
    data.main(["--input", str(tmp_path / "one.txt"), "--out", str(tmp_path / "o"), "--workers=1", "--val_frac=0"])
    assert json.load(open(tmp_path / "o" / "meta.json"))["val_docs"] == 0


def test_tiny_shards_are_warned_before_tokenizing(tmp_path, capsys):
    """--shard_tokens=10 is legal but writes a file every 10 tokens: said once, first, with the default's way out."""
    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"{i}.txt").write_text(f"document {i} " * 20)
    data.main(["--input", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--workers=1", "--shard_tokens=100"])
    err = capsys.readouterr().err
    assert err.splitlines()[0] == ("warning: --shard_tokens=100 writes a file every 100 tokens, each with a 1 KiB "
                                   "header; leave it out for 100,000,000 tokens a shard"), err
    assert len(list((tmp_path / "o").glob("*train_*.bin"))) > 1
    data.main(["--input", str(tmp_path / "in"), "--out", str(tmp_path / "p"), "--workers=1"])
    assert "warning" not in capsys.readouterr().err


def test_a_split_too_short_for_one_row_names_the_way_out(byte_data):
    n = data.Loader(str(byte_data), "val", 1, 64).n_rows * 64
    with pytest.raises(ValueError, match=rf"^val shards in {byte_data} hold \d+ tokens, too few for one row of "
                                         r"block_size \d+: a smaller --block_size, or more data \(data.py's --input, "
                                         r"--val_frac\), or --eval_tokens=0 \(no evaluation\)$"):
        data.Loader(str(byte_data), "val", 1, 2 * n)


def test_a_loader_state_of_other_data_is_refused_naming_both_ways_out(byte_data):
    state = data.Loader(str(byte_data), "train", 2, 32).state_dict()
    other = data.Loader(str(byte_data), "train", 2, 64)           # another block_size: another number of rows
    with pytest.raises(ValueError, match=rf"^the loader state is for {state['rows_per_epoch']} rows an epoch, here "
                                         rf"{other.n_rows}: resume on the same data_dir, block_size and packing, or "
                                         r"start in another out_dir$"):
        other.load_state_dict(state)


def test_an_input_file_that_cannot_be_read_is_named_not_taken_for_the_output(tmp_path, monkeypatch):
    """A broken link, an unreadable file or a folder that cannot be listed in the input stops the preparation in
    one line naming that input (its open failed with ENOENT, it said the output folder was gone); an existing
    --out stays as it was, and no folder goes unread without a word (os.walk skips it)."""
    _write_docs(tmp_path / "in", DOCS)
    out = tmp_path / "out"
    data.prepare(str(tmp_path / "in"), str(out), "byte", val_frac=0.3, workers=1)
    before = _folder_state(out)
    os.symlink(tmp_path / "nowhere.txt", tmp_path / "in" / "zz_link.txt")
    with pytest.raises(SystemExit, match=re.escape(f"error: input {tmp_path}/in/zz_link.txt cannot be read: a broken "
                                                   f"symbolic link (to {tmp_path}/nowhere.txt); fix it, or move it "
                                                   "out of the input folder")):
        data.main(["--input", str(tmp_path / "in"), "--out", str(out), "--workers=1"])
    os.remove(tmp_path / "in" / "zz_link.txt")
    (tmp_path / "in" / "sub").mkdir()
    (tmp_path / "in" / "sub" / "a.txt").write_text("a document in a folder")
    real = {"builtins.open": open, "os.scandir": os.scandir}
    for patched, where in (("builtins.open", "sub/a.txt"), ("os.scandir", "sub")):   # as mode 000, not as root
        def denied(path, *args, **kwargs):
            if str(path) == f"{tmp_path}/in/{where}":
                raise PermissionError(13, "Permission denied", str(path))
            return real[patched](path, *args, **kwargs)
        monkeypatch.setattr(patched, denied)
        with pytest.raises(SystemExit, match=re.escape(f"error: input {tmp_path}/in/{where} cannot be read: "
                                                       "permission denied; fix it")):
            data.main(["--input", str(tmp_path / "in"), "--out", str(out), "--workers=1"])
        monkeypatch.undo()
    assert _folder_state(out) == before and sorted(os.listdir(tmp_path)) == ["in", "out"]
