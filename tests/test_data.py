"""data.py and corpus.py on the CPU: every input kind, the BOS convention in the shards, interrupted
preparations, the sampler without replacement, and the errors for bad data."""
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from speedgpt import corpus
import data
from conftest import ROOT, tiny_args

DOCS = ["def f(x):\n    return x + 1\n", "print('<|endoftext|> is just text here')\n",
        "naïve café ☕ — unicode\n", "x", "a" * 500, "class A:\n    pass\n"]


def _write_docs(folder, docs):
    os.makedirs(folder, exist_ok=True)
    for i, d in enumerate(docs):
        with open(os.path.join(folder, f"doc{i:03d}.txt"), "w", encoding="utf-8") as f:
            f.write(d)


def _write_jsonl(path, docs, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d, "title": "t"}) + "\n")


def _stream(out, split):
    """A split's tokens, all shards end to end."""
    return np.concatenate([np.asarray(data.read_shard(p)) for p in data.find_shards(out, split)])


def _split_docs(tokens, eot):
    """Documents of a stream under the BOS convention: each starts with end-of-text."""
    assert len(tokens) == 0 or tokens[0] == eot, "every document must start with end-of-text"
    starts = np.flatnonzero(tokens == eot)
    return [tokens[a + 1:b].tolist() for a, b in zip(starts, np.append(starts[1:], len(tokens)))]


@pytest.mark.parametrize("tokenizer", ["byte", "gpt2"])
def test_round_trip_and_index(tmp_path, tokenizer):
    try:
        tok = data.get_tokenizer(tokenizer)
    except FileNotFoundError as e:
        pytest.skip(f"GPT-2 tokenizer files unavailable: {e}")
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


def test_every_input_kind_gives_the_same_shards(tmp_path):
    """A folder of text files, .jsonl, .jsonl.gz, .jsonl.zst, .parquet (several row groups), a folder of
    parquet files and a datasets save_to_disk folder holding the same texts give the same shards."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    zstandard, datasets = pytest.importorskip("zstandard"), pytest.importorskip("datasets")
    docs = [f"doc {i}: " + "word " * (i % 13) for i in range(30)] + DOCS
    _write_docs(tmp_path / "folder", docs)
    _write_jsonl(tmp_path / "d.jsonl", docs)
    _write_jsonl(tmp_path / "d.jsonl.gz", docs, gzip.open)
    (tmp_path / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress((tmp_path / "d.jsonl").read_bytes()))
    pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), tmp_path / "d.parquet", row_group_size=7)
    (tmp_path / "pq").mkdir()
    for i in range(0, len(docs), 10):
        pq.write_table(pa.table({"text": docs[i:i + 10]}), tmp_path / "pq" / f"part_{i:03d}.parquet")
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "hf"))
    inputs = ["folder", "d.jsonl", "d.jsonl.gz", "d.jsonl.zst", "d.parquet", "pq", "hf"]
    for name in inputs:
        data.prepare(str(tmp_path / name), str(tmp_path / f"out_{name}"), "byte", val_frac=0.2, seed=3, workers=2,
                     shard_tokens=300)
    for split in ("train", "val"):
        ref = _stream(tmp_path / "out_folder", split)
        for name in inputs[1:]:
            assert np.array_equal(_stream(tmp_path / f"out_{name}", split), ref), name
    assert json.load(open(tmp_path / "out_hf" / "meta.json"))["train_docs"] + \
        json.load(open(tmp_path / "out_hf" / "meta.json"))["val_docs"] == len(docs)


def test_text_field_and_max_tokens(tmp_path):
    with open(tmp_path / "d.jsonl", "w") as f:
        for i in range(100):
            f.write(json.dumps({"body": f"document {i:03d}"}) + "\n")     # 12 bytes + BOS = 13 tokens
    meta = data.prepare(str(tmp_path / "d.jsonl"), str(tmp_path / "o"), "byte", val_frac=0.0, workers=1,
                        text_field="body", max_tokens=100)
    assert meta["train_docs"] == 8 and meta["train_tokens"] == 104      # stops after the document reaching 100
    with pytest.raises(ValueError, match=r"d.jsonl:1: expected a JSON object with a 'text' field"):
        data.prepare(str(tmp_path / "d.jsonl"), str(tmp_path / "x"), "byte", workers=1)


def test_text_edge_cases(tmp_path):
    """A lone surrogate is U+FFFD in both tokenizers; a BOM starting a .jsonl or a text file is dropped;
    the errors that remain name the file and line."""
    (tmp_path / "s.jsonl").write_text('{"text": "x \\ud800 y"}\n{"text": "fine"}\n')
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "first"}\n{"text": "second"}\n')
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfhello")
    texts = [d.text for d in corpus.iter_texts(str(tmp_path / "s.jsonl"))]
    assert texts[0] == "x \ud800 y"
    tokenizers = [data.get_tokenizer("byte")]
    try:
        tokenizers.append(data.get_tokenizer("gpt2"))
    except FileNotFoundError:
        pass                                  # offline without the GPT-2 files: the byte path still runs
    for tok in tokenizers:   # encode, and encode_array as preparation calls it
        assert tok.encode(texts[0]) == tok.encode_array(texts[0]).tolist() == tok.encode("x \ufffd y"), tok.name
    data.prepare(str(tmp_path / "s.jsonl"), str(tmp_path / "s"), "byte", val_frac=0, workers=1)
    assert _split_docs(_stream(tmp_path / "s", "train"), 256)[0] == list("x \ufffd y".encode())
    assert [d.text for d in corpus.iter_texts(str(tmp_path / "bom.jsonl"))] == ["first", "second"]
    assert [d.text for d in corpus.iter_texts(str(tmp_path / "bom.txt"))] == ["hello"]
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n\n{"text": "unterminated\n')
    with pytest.raises(ValueError, match="bad.jsonl:3: expected a JSON object"):
        data.prepare(str(tmp_path / "bad.jsonl"), str(tmp_path / "x"), "byte", workers=1)
    (tmp_path / "num.jsonl").write_text('{"text": "ok"}\n{"text": 5}\n')
    with pytest.raises(ValueError, match="num.jsonl:2: 'text' must be a string"):
        data.prepare(str(tmp_path / "num.jsonl"), str(tmp_path / "x"), "byte", workers=1)
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"body": ["a"]}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"p.parquet: no column 'text' \(columns: body\)"):
        data.prepare(str(tmp_path / "p.parquet"), str(tmp_path / "x"), "byte", workers=1)
    pq.write_table(pa.table({"text": ["a", None]}), tmp_path / "n.parquet")
    with pytest.raises(ValueError, match="n.parquet row 1: 'text' must be a string, got NoneType"):
        data.prepare(str(tmp_path / "n.parquet"), str(tmp_path / "x"), "byte", workers=1)


def test_hub_dataset_unreachable_is_a_one_line_error(tmp_path):
    """hf:NAME streams from the Hugging Face hub; offline (as in CI) that is one line naming the dataset."""
    pytest.importorskip("datasets")
    proc = subprocess.run([sys.executable, "data.py", "--input", "hf:nobody/no_such_dataset",
                           "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode != 0 and not (tmp_path / "o").exists()
    assert proc.stderr.strip().startswith("error: cannot open the Hugging Face dataset hf:nobody/no_such_dataset")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_reading_stays_bounded():
    """The tokenisation reads at most 2 chunks per worker ahead of what it has handed back."""
    read = []

    def docs():
        for i in range(1000):
            read.append(i)
            yield corpus.Document(f"doc{i}", "0123456789")
    chunks = corpus.tokenized_chunks(docs(), "byte", np.uint16, workers=1, chunk_chars=10)
    tokens, lengths, _, splits = next(chunks)
    assert tokens.tolist() == [256] + list(b"0123456789") and lengths.tolist() == [11] and splits == [None]
    assert len(read) <= 3
    chunks.close()


def _folder_state(folder):
    """{file name: bytes} of a folder: what "exactly as it was" compares."""
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder))}


def test_a_failed_preparation_leaves_the_old_folder_as_it_was(tmp_path):
    """Preparing over a good folder from an input that fails part way (a bad line after shards were
    written; a parquet whose text is null at row 30) leaves the good folder byte for byte, and no temp
    folder beside it; it still loads. A preparation that succeeds replaces it whole."""
    good = [f"document {i} " * 15 for i in range(40_000)]                # 8 MB: several 1 MB chunks
    _write_jsonl(tmp_path / "good.jsonl", good)
    _write_jsonl(tmp_path / "bad.jsonl", good)
    with open(tmp_path / "bad.jsonl", "a") as f:
        f.write("not json\n")
    out, kw = tmp_path / "out", dict(val_frac=0.1, workers=2, shard_tokens=500_000)
    data.prepare(str(tmp_path / "good.jsonl"), str(out), "byte", **kw)
    before = _folder_state(out)
    with pytest.raises(ValueError, match="bad.jsonl:40001"):
        data.prepare(str(tmp_path / "bad.jsonl"), str(out), "byte", **kw)
    assert _folder_state(out) == before and sorted(os.listdir(tmp_path)) == ["bad.jsonl", "good.jsonl", "out"]
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": good[:30] + [None] + good[:10]}), tmp_path / "n.parquet", row_group_size=8)
    with pytest.raises(ValueError, match="n.parquet row 30: 'text' must be a string, got NoneType"):
        data.prepare(str(tmp_path / "n.parquet"), str(out), "byte", **kw)
    assert _folder_state(out) == before and next(data.Loader(str(out), "train", 2, 16)).x.shape == (2, 16)
    data.prepare(str(tmp_path / "good.jsonl"), str(out), "byte", **{**kw, "max_tokens": 1000})
    assert json.load(open(out / "meta.json"))["max_tokens"] == 1000 and _folder_state(out) != before
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files data.py did not write .notes.txt."):
        data.prepare(str(tmp_path / "good.jsonl"), str(out), "byte", **kw)


@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory):
    """~60 MB of JSON lines: a preparation that lasts several seconds with one worker."""
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    _write_jsonl(path, [f"line {i} " * 50 for i in range(180_000)])
    return path


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
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        cmd = [sys.executable, "data.py", "--input", str(tmp_path / "big.jsonl"), "--out", str(out),
               "--workers=1", "--shard_tokens=100000"]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)           # its own process group, like a terminal's job
        deadline = time.time() + 60
        while not (tmp_path / ".out.preparing").is_dir() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(random.Random(attempt).uniform(0, 1.5))        # a random moment: starting, tokenising, writing
        sent = time.time()
        signum = signal.SIGKILL if attempt == 5 else signal.SIGINT
        os.killpg(proc.pid, signum)
        err = proc.communicate(timeout=30)[1]
        took = time.time() - sent
    finally:
        for b in busy:
            b.kill()
            b.wait()
    if signum == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        data.prepare(str(tmp_path / "big.jsonl"), str(out), "byte", workers=1, max_tokens=10_000)   # cleans up
    else:
        if proc.returncode == 0:
            pytest.skip("data.py finished before the signal")
        assert proc.returncode == 130, err[-2000:]
        assert err.strip().splitlines()[-1].startswith("interrupted: ") and "Traceback" not in err, err[-2000:]
        assert took < 10, f"data.py took {took:.1f} s to stop"
    assert _folder_state(out) == before
    assert sorted(os.listdir(tmp_path)) == ["big.jsonl", "out"]


def _stat(pid):
    """The fields of /proc/PID/stat after the command name (which may hold spaces): [state, ppid, ...];
    None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _processes_under(pid):
    """{pid: start time} of every process below `pid`: its children and theirs (a fork server's workers).
    The start time (field 22 of /proc/PID/stat) tells a process from a later one given the same pid."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p)) is not None}
    below, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, s in stats.items():
            if int(s[1]) == parent and child not in below:
                below[child] = s[19]
                frontier.append(child)
    return below


def _alive(processes, within=0.0):
    """The processes of `processes` ({pid: start time}) still running after at most `within` seconds,
    polled: a zombie has ended (a container's init may never reap it)."""
    end = time.time() + within
    while True:
        left = {p: t for p, t in processes.items() if (s := _stat(p)) is not None and s[19] == t and s[0] != "Z"}
        if not left or time.time() >= end:
            return left
        time.sleep(0.05)


def _once_writing(proc, tmp, log, within=120):
    """The processes under `proc` once its preparation has written into its temp folder `tmp`: its
    workers start before the first chunk is tokenised, so all of them exist by then. `log`: its stderr."""
    end = time.time() + within
    while True:
        try:
            if os.listdir(tmp):
                return _processes_under(proc.pid)
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"ended with {proc.returncode} before writing: {log.read_text()[-2000:]}")
        assert time.time() < end, f"nothing written into {tmp} after {within} s"
        time.sleep(0.02)


def _kill(processes):
    """SIGKILL whatever of `processes` still runs: a failing test leaves no stray worker either."""
    for pid in _alive(processes):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="finds the workers in /proc")
@pytest.mark.parametrize("signum, group", [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGKILL, False)],
                         ids=["SIGTERM", "SIGTERM-to-group", "SIGKILL"])
def test_a_stopped_preparation_leaves_no_worker_and_no_temp_folder(tmp_path, big_jsonl, signum, group):
    """SIGTERM (kill PID, timeout, docker stop; to the whole process group, as Slurm sends it) or SIGKILL
    to data.py mid-preparation: its tokenizer workers end within seconds, instead of running on, reparented.
    SIGTERM takes Ctrl-C's way out: status 143, one line, no temp folder and no output folder left. A
    SIGKILL leaves the temp folder (a killed process cleans nothing), which the next preparation removes."""
    os.symlink(big_jsonl, tmp_path / "big.jsonl")
    out, tmp = tmp_path / "out", tmp_path / ".out.preparing"
    log = tmp_path / "stderr"
    with open(log, "w") as stderr:                     # a file: a stray worker would hold a pipe open
        proc = subprocess.Popen([sys.executable, "data.py", "--input", str(tmp_path / "big.jsonl"), "--out", str(out),
                                 "--workers=2"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    below = {}
    try:
        below = _once_writing(proc, tmp, log)
        assert len(below) >= 2, below                   # the two workers
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        proc.wait(timeout=60)
        left = _alive(below, within=20)
    finally:
        proc.kill()
        _kill(below)
    err = log.read_text()
    assert not left, f"{len(left)} of data.py's {len(below)} worker processes still run 20 s after {signum.name}"
    if signum == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err[-2000:]
        assert err.strip().splitlines()[-1].startswith("stopped (SIGTERM): "), err[-2000:]
        assert sorted(os.listdir(tmp_path)) == ["big.jsonl", "stderr"]      # no temp folder, nothing half-written
    else:
        assert proc.returncode == -signal.SIGKILL and tmp.is_dir()
        data.prepare(str(tmp_path / "big.jsonl"), str(out), "byte", workers=1, max_tokens=10_000)
        assert sorted(os.listdir(tmp_path)) == ["big.jsonl", "out", "stderr"]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="finds the workers in /proc")
@pytest.mark.parametrize("caller", ["train.py", "threaded"])
def test_a_program_preparing_in_process_takes_its_workers_with_it(tmp_path, big_jsonl, caller):
    """data.prepare() inside another program: train.py preparing the stdlib corpus on first use, SIGTERM
    (it cleans up as Ctrl-C does: status 143, one line, no temp folder; its workers are forked, train.py their
    parent), and a program that runs a thread, SIGKILL (its workers come from a fork server, their parent,
    which outlives them otherwise). The workers, and the fork server and resource tracker with them, end
    within seconds; the output folder is never written.
    train.py's "stdlib" is big_jsonl here: the real one is prepared in a second, too soon to be stopped
    mid-way for sure."""
    if caller == "train.py":
        out = tmp_path / "stdlib_byte"
        script = ("import runpy, sys; from speedgpt import corpus; read = corpus.iter_texts; "
                  f"corpus.iter_texts = lambda path, *a: read({str(big_jsonl)!r}, *a); "
                  f"sys.argv = ['train.py', *{tiny_args(out, tmp_path / 'run', '--device=cpu')!r}]; "
                  "runpy.run_path('train.py', run_name='__main__')")
        cmd, signum = [sys.executable, "-c", script], signal.SIGTERM
    else:
        out = tmp_path / "out"
        script = ("import sys, threading, time; threading.Thread(target=time.sleep, args=(600,), daemon=True).start(); "
                  f"import data; data.prepare({str(big_jsonl)!r}, {str(out)!r}, 'byte', workers=2)")
        cmd, signum = [sys.executable, "-c", script], signal.SIGKILL
    log = tmp_path / "stderr"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    below = {}
    try:
        below = _once_writing(proc, tmp_path / f".{out.name}.preparing", log)
        if caller == "threaded":                      # the case it is meant to be
            assert any(b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes() for p in below), below
        proc.send_signal(signum)
        proc.wait(timeout=60)
        left = _alive(below, within=20)
    finally:
        proc.kill()
        _kill(below)
    assert not left, f"{len(left)} of the {len(below)} processes under {caller} still run 20 s after {signum.name}"
    assert not out.exists()
    if caller == "threaded":
        assert proc.returncode == -signum
    else:
        assert proc.returncode == 128 + signum, log.read_text()[-2000:]
        assert log.read_text().strip().splitlines()[-1] == "SIGTERM: stopped before training, without saving"
        assert not (tmp_path / f".{out.name}.preparing").exists()


def test_files_are_read_for_what_they_are(tmp_path):
    """Compression by content, kinds by name in any case: corpus.json.gz is a JSON array, UPPER.JSONL and
    x.ndjson JSON lines, data.json JSON lines; binary files in a folder (a saved dataset's .arrow, an image,
    a .pyc) are skipped and named, a save_to_disk folder inside the folder is read as a dataset."""
    docs = ["first doc", "second doc", "third doc"]
    folder = tmp_path / "in"
    folder.mkdir()
    with gzip.open(folder / "corpus.json.gz", "wt") as f:
        json.dump([{"text": d} for d in docs], f)
    _write_jsonl(folder / "UPPER.JSONL", docs)
    _write_jsonl(folder / "data.json", docs)
    (folder / "plain.txt.gz").write_bytes(gzip.compress(b"a gzipped text file"))
    (folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(100))
    (folder / "mod.pyc").write_bytes(b"\xa7\r\r\n\0\0\0\0" + bytes(50))
    texts = [d.text for d in corpus.iter_texts(str(folder / "corpus.json.gz"))]
    assert texts == docs
    (tmp_path / "crlf.txt").write_bytes(b"line one\r\nline two\rthree")        # text: universal newlines
    assert [d.text for d in corpus.iter_texts(str(tmp_path / "crlf.txt"))] == ["line one\nline two\nthree"]
    report = corpus.Report()
    got = [d.text for d in corpus.iter_texts(str(folder), report=report)]
    assert got == docs * 3 + ["a gzipped text file"]             # in sorted order: UPPER, corpus, data, plain
    assert sorted(os.path.basename(p) for p in report.binary) == ["image.png", "mod.pyc"]
    with pytest.raises(ValueError, match="image.png is a binary file"):
        corpus.iter_texts(str(folder / "image.png"))
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["from the dataset"]}).save_to_disk(str(folder / "saved"))
    meta = data.prepare(str(folder), str(tmp_path / "o"), "byte", val_frac=0.2, workers=1)
    assert meta["train_docs"] + meta["val_docs"] == 3 * 3 + 1 + 1 and meta["binary_files_skipped"] == 2
    decoded = [bytes(d).decode() for s in ("train", "val") for d in _split_docs(_stream(tmp_path / "o", s), 256)]
    assert "from the dataset" in decoded and not any("\0" in d for d in decoded)


def test_a_dataset_dict_uses_its_own_validation_split(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": [f"train {i}" for i in range(20)]}),
                               "validation": datasets.Dataset.from_dict({"text": ["val a", "val b"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    meta = data.prepare(str(tmp_path / "dd"), str(tmp_path / "o"), "byte", val_frac=0.5, workers=1)
    assert (meta["train_docs"], meta["val_docs"]) == (20, 2)
    val = [bytes(d).decode() for d in _split_docs(_stream(tmp_path / "o", "val"), 256)]
    assert val == ["val a", "val b"]
    assert "the dataset's own 'validation' split (2 documents) is the val split" in capsys.readouterr().out
    datasets.DatasetDict({"train": dd["train"], "test": dd["validation"]}).save_to_disk(str(tmp_path / "tt"))
    meta = data.prepare(str(tmp_path / "tt"), str(tmp_path / "o2"), "byte", val_frac=0.2, workers=1)
    assert meta["train_docs"] + meta["val_docs"] == 20
    assert "without a validation split (splits: train, test)" in capsys.readouterr().out


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


def test_older_or_incomplete_meta_json_is_refused(byte_data, tmp_path):
    import shutil
    folder = tmp_path / "d"
    shutil.copytree(byte_data, folder)
    meta = json.load(open(folder / "meta.json"))
    json.dump({**meta, "format": 1}, open(folder / "meta.json", "w"))
    with pytest.raises(ValueError, match=f"format 1 .* older data.py.*python data.py --input {meta['input']} "
                                         f"--out {folder} --tokenizer byte"):
        data.Loader(str(folder), "train", 2, 16)
    json.dump({**meta, "shards": {"train": [], "val": []}}, open(folder / "meta.json", "w"))
    with pytest.raises(ValueError, match="does not list the shards in the folder .*train_000000.bin"):
        data.load_meta(folder)
    json.dump(meta, open(folder / "meta.json", "w"))
    shutil.copy(folder / "train_000000.bin", folder / "fineweb_train_000001.bin")     # a foreign shard mixed in
    with pytest.raises(ValueError, match="does not list the shards in the folder .*fineweb_train_000001.bin"):
        data.Loader(str(folder), "train", 2, 16)
    os.remove(folder / "fineweb_train_000001.bin")
    os.remove(folder / "train_000000.idx.npz")
    with pytest.raises(ValueError, match="train_000000.bin has no index"):
        data.Loader(str(folder), "train", 2, 16)


def _foreign_shards(folder, toks):
    """Shards as llm.c's fineweb.py writes them: no meta.json, its file names, EOT before each document."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    for split in ("train", "val"):
        with open(folder / f"fineweb_{split}_000000.bin", "wb") as f:
            f.write(header.tobytes())
            f.write(toks.astype(np.uint16).tobytes())


def test_llmc_fineweb_shard_loads_as_is(tmp_path):
    toks = np.random.default_rng(0).integers(0, 50256, size=5000)
    toks[::97] = 50256
    _foreign_shards(tmp_path, toks)
    loader = data.Loader(str(tmp_path), "train", batch_size=3, block_size=32, seed=0)
    assert (tmp_path / "fineweb_train_000000.idx.npz").exists()      # indexed on first use, saved beside
    b = next(loader)
    assert loader.eot == 50256 and b.x.shape == (3, 32) and b.x.dtype == torch.int64 and b.n_valid == 3 * 32
    for row_x, row_y, ids in zip(b.x.numpy(), b.y.numpy(), b.doc_ids.numpy()):
        start = next(i for i in range(0, len(toks) - 32, 32) if np.array_equal(toks[i:i + 32], row_x))
        assert np.array_equal(toks[start + 1:start + 33], row_y)
        assert np.array_equal(ids, np.cumsum(row_x == 50256) - (row_x[0] == 50256))   # a BOS opens a document
    padded = data.Loader(str(tmp_path), "train", batch_size=4, block_size=256, seed=0, packing=False)
    assert padded.n_rows == len(np.flatnonzero(toks == 50256)) + (toks[0] != 50256)   # one piece per document


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
        f"outside the vocabulary (50257 ids in meta.json): shards and meta.json disagree"]


def test_data_dir_given_a_corpus_file_suggests_a_command_that_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "corpus.jsonl", [f"story {i} " * 30 for i in range(50)])
    with pytest.raises(FileNotFoundError) as e:
        data.Loader("corpus.jsonl", "train", 2, 16)
    command, data_dir = str(e.value).split("`")[1], str(e.value).rsplit("--data_dir=", 1)[1]
    assert command.startswith("python data.py ")
    subprocess.run([sys.executable, os.path.join(ROOT, "data.py"), *command.split()[2:]], check=True,
                   capture_output=True)
    assert next(data.Loader(data_dir, "train", 2, 16)).x.shape == (2, 16)
    data.write_shard(str(tmp_path / "train_000000.bin"), np.arange(10))
    with pytest.raises(FileNotFoundError, match=r"pass the folder that holds this shard: --data_dir=\."):
        data.find_shards("train_000000.bin", "train")


def test_bad_streams_prepared_folders_and_out_equal_to_input(tmp_path):
    """A truncated .gz names the file; a folder data.py prepared inside an input folder is not read as
    documents; --out equal to --input is refused."""
    _write_jsonl(tmp_path / "a.jsonl", [f"document {i} " * 30 for i in range(2000)])
    raw = gzip.compress((tmp_path / "a.jsonl").read_bytes())
    (tmp_path / "t.jsonl.gz").write_bytes(raw[:len(raw) // 2])
    with pytest.raises(ValueError, match=r"t.jsonl.gz: not readable after line \d+ .*truncated"):
        data.prepare(str(tmp_path / "t.jsonl.gz"), str(tmp_path / "o1"), "byte", workers=1)
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(5):
        (texts / f"{i}.txt").write_text(f"text number {i}\n" * 20)
    first = data.prepare(str(texts), str(texts / "tok"), "byte", workers=1, val_frac=0.2)
    again = data.prepare(str(texts), str(texts / "tok2"), "byte", workers=1, val_frac=0.2)
    assert again["train_tokens"] + again["val_tokens"] == first["train_tokens"] + first["val_tokens"]
    with pytest.raises(ValueError, match="is the input folder"):
        data.prepare(str(texts), str(texts), "byte", workers=1)


def test_a_disk_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    """data.py onto a read-only filesystem: one line naming the cause, the output folder as it was."""
    import errno
    from speedgpt import shards
    _write_docs(tmp_path / "in", DOCS)

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", path)
    monkeypatch.setattr(shards.os, "makedirs", read_only)
    monkeypatch.setattr(sys, "argv", ["data.py", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match=r"^error: cannot write .*\.o\.preparing: read-only filesystem; "
                                         r".*o is as it was"):
        data.main()
    assert not (tmp_path / "o").exists()
