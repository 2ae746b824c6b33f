"""
From a corpus to token arrays, for data.py's preparation: the input readers (every document read
lazily, so a corpus of any size is never held in memory), the tokenizers, and the parallel,
order-keeping tokenisation.

    for where, text in corpus.iter_texts("dump.jsonl.gz"):     # where: "dump.jsonl.gz:17", for errors
        ...

The kind of input is chosen by its path (`text_field` names the field or column of the document):
  a folder                           each file under it (recursive, sorted, hidden files skipped), read
                                     by its own kind below; a Hugging Face `save_to_disk` folder is a dataset
  *.jsonl, *.jsonl.gz, *.jsonl.zst   one JSON object per line (.zst needs the zstandard package)
  *.parquet                          the text_field column, one row group at a time (pyarrow)
  hf:NAME or hf:NAME:CONFIG          the train split of a Hugging Face hub dataset, streamed (`datasets`, online)
  any other file                     one document (UTF-8; undecodable bytes become U+FFFD)
  None                               this Python's standard library: each .py file one document

A UTF-8 byte-order mark at the start of a file is dropped. An unpaired UTF-16 surrogate (JSON allows
"\\ud800") becomes U+FFFD in both tokenizers, as tiktoken does it. Errors name the file and line
(or row) and the problem.
"""
import gzip
import io
import json
import os
import signal
import sysconfig
from collections import deque
from multiprocessing import Pool

import numpy as np

JSONL = (".jsonl", ".jsonl.gz", ".jsonl.zst")

# -----------------------------------------------------------------------------
# input readers

def stdlib_path():
    return sysconfig.get_paths()["stdlib"]


def iter_texts(path, text_field="text"):
    """Return an iterator of (where, text) over the documents of `path` (see the module docstring):
    `where` ("file:line", "file row N") names a document in error messages, `text` is a str.
    Raises FileNotFoundError at once for a missing path; ValueError, while iterating, for a record
    without a string `text_field` (naming the file and line or row) or when the optional package a
    kind needs (pyarrow, zstandard, datasets) is missing (naming the package)."""
    if path is None:
        return _stdlib()
    if path.startswith("hf:"):
        return _hf_dataset(path[3:], text_field)
    if not os.path.exists(path):
        raise FileNotFoundError(f"input {path} does not exist")
    if os.path.isdir(path) and _is_saved_dataset(path):
        return _hf_dataset(path, text_field)
    if os.path.isdir(path):
        return _folder(path, text_field)
    return _file(path, text_field)


def _stdlib():
    for root, dirs, files in os.walk(stdlib_path()):
        dirs[:] = sorted(d for d in dirs if d != "site-packages")   # walk in a fixed order
        for name in sorted(files):
            if name.endswith(".py"):
                yield from _text_file(os.path.join(root, name))


def _prepared(folder):
    """True for a folder data.py wrote (meta.json beside token shards): never read as documents."""
    return os.path.isfile(os.path.join(folder, "meta.json")) and any(n.endswith(".bin") for n in os.listdir(folder))


def _folder(path, text_field):
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not _prepared(os.path.join(root, d)))
        for name in sorted(files):
            if not name.startswith("."):
                yield from _file(os.path.join(root, name), text_field)


def _file(path, text_field):
    if path.endswith(JSONL):
        return _jsonl(path, text_field)
    if path.endswith(".parquet"):
        return _parquet(path, text_field)
    return _text_file(path)


def _text_file(path):
    with open(path, encoding="utf-8-sig", errors="replace") as f:   # utf-8-sig: drops a BOM
        yield path, f.read()


def _require(package, why):
    try:
        return __import__(package)
    except ImportError:
        raise ValueError(f"{why} needs the {package} package: pip install {package}") from None


def _open_lines(path):
    """The file at `path` as a binary stream, decompressed by its suffix."""
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".zst"):
        zstandard = _require("zstandard", f"reading {path}")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def _lines(path):
    """(line number, bytes) of the file at `path`, decompressed; ValueError naming the file and line
    where a .gz or .zst stream is truncated or corrupt."""
    lineno = 0
    with _open_lines(path) as f:
        try:
            for lineno, line in enumerate(f, 1):
                yield lineno, line
        except (EOFError, OSError, RuntimeError) as e:           # gzip.BadGzipFile is an OSError
            raise ValueError(f"{path}: not readable after line {lineno} ({type(e).__name__}: {e}); is it truncated?") from None
        except Exception as e:                                    # zstandard.ZstdError
            if type(e).__module__.startswith("zstandard"):
                raise ValueError(f"{path}: not readable after line {lineno} ({type(e).__name__}: {e})") from None
            raise


def _jsonl(path, text_field):
    for lineno, line in _lines(path):
        line = line.decode("utf-8", errors="replace")
        if lineno == 1:
            line = line.removeprefix("\ufeff")            # a BOM would make line 1 invalid JSON
        if not line.strip():
            continue
        try:
            text = json.loads(line)[text_field]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: expected a JSON object with a {text_field!r} field ({e!r})") from None
        if not isinstance(text, str):
            raise ValueError(f"{path}:{lineno}: {text_field!r} must be a string, got {type(text).__name__}")
        yield f"{path}:{lineno}", text


def _parquet(path, text_field):
    _require("pyarrow", f"reading {path}")
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:   # pyarrow raises its own ArrowInvalid for a file that is not parquet
        raise ValueError(f"{path}: not a readable parquet file ({e})") from None
    names = pf.schema_arrow.names
    if text_field not in names:
        raise ValueError(f"{path}: no column {text_field!r} (columns: {', '.join(names)}); choose one with --text_field")
    row = 0
    for g in range(pf.num_row_groups):            # one row group in memory at a time
        for text in pf.read_row_group(g, columns=[text_field]).column(0).to_pylist():
            if not isinstance(text, str):
                raise ValueError(f"{path} row {row}: {text_field!r} must be a string, got {type(text).__name__}")
            yield f"{path} row {row}", text
            row += 1


def _is_saved_dataset(path):
    return os.path.isfile(os.path.join(path, "dataset_dict.json")) or (
        os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json")))


def _hf_dataset(name, text_field):
    """A local save_to_disk folder (memory-mapped Arrow, iterated as a stream) or `NAME[:CONFIG]` on
    the hub (streaming=True: nothing is downloaded ahead). A DatasetDict gives its 'train' split."""
    datasets = _require("datasets", f"reading the Hugging Face dataset {name}")
    if os.path.isdir(name):
        ds = datasets.load_from_disk(name)
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise ValueError(f"{name}: the saved DatasetDict has no 'train' split (splits: {', '.join(ds)})")
            ds = ds["train"]
        if text_field not in ds.column_names:
            raise ValueError(f"{name}: no column {text_field!r} (columns: {', '.join(ds.column_names)}); choose one with --text_field")
        ds = ds.select_columns([text_field]).to_iterable_dataset()
    else:
        repo, _, config = name.partition(":")
        try:
            ds = datasets.load_dataset(repo, config or None, split="train", streaming=True)
        except Exception as e:       # offline, a typo in the name, a gated dataset...
            raise ValueError(f"cannot open the Hugging Face dataset hf:{name}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    for row, record in enumerate(ds):
        if text_field not in record:
            raise ValueError(f"{name} row {row}: no field {text_field!r} (fields: {', '.join(record)}); choose one with --text_field")
        text = record[text_field]
        if not isinstance(text, str):
            raise ValueError(f"{name} row {row}: {text_field!r} must be a string, got {type(text).__name__}")
        yield f"{name} row {row}", text

# -----------------------------------------------------------------------------
# tokenizers

def _replace_surrogates(text):
    """`text` with each unpaired UTF-16 surrogate (JSON's "\\ud800") replaced by U+FFFD, as tiktoken's
    encode_ordinary does it, so that both tokenizers see the same text."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class ByteTokenizer:
    """UTF-8 bytes 0-255 plus end-of-text 256. Needs no download."""
    name, vocab_size, eot = "byte", 257, 256

    def encode(self, text):
        return self.encode_array(text).tolist()

    def encode_array(self, text):
        """1-D uint8 array of the UTF-8 bytes of `text`."""
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:
            raw = _replace_surrogates(text).encode("utf-8")
        return np.frombuffer(raw, dtype=np.uint8)

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """tiktoken's GPT-2 BPE; end-of-text is id 50256. Offline: set TIKTOKEN_CACHE_DIR."""
    name, vocab_size, eot = "gpt2", 50257, 50256

    def __init__(self):
        import tiktoken
        try:
            self.enc = tiktoken.get_encoding("gpt2")
        except Exception as e:   # no network and no cache
            raise FileNotFoundError(
                "could not load tiktoken's GPT-2 files (%s). Offline, point TIKTOKEN_CACHE_DIR at a folder "
                "holding them, or use byte-level data (data.py --tokenizer byte; train.py --data_dir=data/stdlib_byte)"
                % str(e).splitlines()[0][:200]) from e

    def encode(self, text):
        # encode_ordinary: a literal "<|endoftext|>" inside a document is plain text, never id 50256
        return self.enc.encode_ordinary(text)

    def encode_array(self, text):
        """1-D uint32 array of encode(text), built without a Python list: 14% faster (6.2M tokens per
        CPU-second against 5.5M on this project's 2-core CPU; tiktoken >= 0.9)."""
        try:
            return self.enc.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:    # unlike encode_ordinary, encode_to_numpy has no fallback
            return self.enc.encode_to_numpy(_replace_surrogates(text), disallowed_special=())

    def decode(self, ids):
        return self.enc.decode([i for i in ids if i < self.vocab_size])


def get_tokenizer(name):
    """Return the tokenizer called `name` ("byte" or "gpt2"). Raises ValueError for other names."""
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    raise ValueError(f"unknown tokenizer {name!r}: expected 'byte' or 'gpt2'")


# -----------------------------------------------------------------------------
# parallel tokenisation

_worker = None   # (tokenizer, token dtype) of a tokenisation worker process

def _init_worker(name, dtype):
    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the parent's: it stops the pool (a worker
    _worker = (get_tokenizer(name), dtype)            # killed mid-task can hang Pool.terminate)


def _tokenize_chunk(chunk):
    """[(where, text), ...] -> (tokens, lengths, n_empty): each non-empty document as [EOT, ids...],
    all concatenated (one array pickles back to the parent much faster than many)."""
    tok, dtype = _worker
    parts, lengths = [], []
    for where, text in chunk:
        try:
            ids = tok.encode_array(text)
        except Exception as e:
            raise ValueError(f"{where}: cannot tokenise this document ({type(e).__name__}: {e})") from None
        if len(ids):
            parts += [np.array([tok.eot], dtype=dtype), ids.astype(dtype, copy=False)]
            lengths.append(len(ids) + 1)
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return tokens, np.array(lengths, dtype=np.int64), len(chunk) - len(lengths)


def tokenized_chunks(docs, tokenizer, dtype, workers, chunk_chars=1 << 20):
    """Tokenise `docs` (an iterator of (where, text)) with the tokenizer called `tokenizer` in `workers`
    processes. Yields (tokens, lengths, n_empty) for consecutive chunks of about chunk_chars characters,
    in input order whatever the number of workers: `tokens` (1-D, `dtype`) holds each non-empty document
    as [EOT, ids...] end to end, `lengths` (int64) their lengths in tokens, n_empty the empty documents
    left out. At most 2 * workers chunks are read ahead, so memory stays bounded (Pool.imap would read
    the whole input ahead). Raises ValueError naming a document that cannot be tokenised."""
    with Pool(workers, initializer=_init_worker, initargs=(tokenizer, dtype)) as pool:
        pending, chunk, size = deque(), [], 0
        for doc in docs:
            chunk.append(doc)
            size += len(doc[1])
            if size >= chunk_chars:
                pending.append(pool.apply_async(_tokenize_chunk, (chunk,)))
                chunk, size = [], 0
                if len(pending) >= 2 * workers:
                    yield pending.popleft().get()
        if chunk:
            pending.append(pool.apply_async(_tokenize_chunk, (chunk,)))
        while pending:
            yield pending.popleft().get()
