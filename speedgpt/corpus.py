"""
From a corpus to token arrays, for data.py's preparation: the input readers (every document read
lazily, so a corpus of any size is never held in memory), the tokenizers, the parallel,
order-keeping tokenisation, and sigterm_as_interrupt (a preparation stopped by SIGTERM cleans up as Ctrl-C).

    for doc in corpus.iter_texts("dump.jsonl.gz"):     # doc.where: "dump.jsonl.gz:17", for errors
        ...                                            # doc.text; doc.split: None, or the corpus's own

Each file is read for what it is (`text_field` names the field or column of the document), by the reader
READERS holds for the end of its name (any case): a new kind of file is one reader there.
  a folder                      each file under it (recursive, sorted, hidden ones skipped), read by its
                                own kind below; a Hugging Face `save_to_disk` folder in it is a dataset;
                                binary files (a NUL byte in their first 8 KB: images, .pyc, .arrow) and
                                files of a kind no reader takes (NOT_READ) are skipped and listed in `report`
  JSON lines                    names ending .jsonl or .ndjson: one JSON object per line
  JSON                          names ending .json: an array of records (or of strings), or JSON lines
  parquet                       names ending .parquet, or the PAR1 magic: the text column, one row group
                                at a time (pyarrow)
  a table (.csv, .tsv)          refused (NOT_READ): its documents would be rows, the text one column; read
                                whole as text it would train on the other columns and the delimiters
  a save_to_disk folder         a Hugging Face dataset (`datasets`); a DatasetDict gives its train split,
                                and its validation split (validation, valid or val), when it has one, as
                                the val documents
  hf:NAME or hf:NAME:CONFIG     the train split of a Hugging Face hub dataset, streamed (online)
  any other file                one document of text (source code, prose, markup with its tags)
  None                          this Python's standard library: each .py file one document (utf-8:replace)
Compression is read from the content, not the name: gzip and zstandard (zstandard package) streams are
decompressed, and their .gz / .zst suffix is dropped before the name says the kind (corpus.json.gz is
JSON). Text, JSON and JSON lines are decoded as `encoding` says (parse_encoding: UTF-8 by default; bytes that
do not decode are refused, naming the file and line, or with ":replace" become U+FFFD, counted in the Report).
A UTF-8 byte-order mark at the start of a file is dropped. An unpaired UTF-16 surrogate (JSON
allows "\\ud800") becomes U+FFFD in both tokenizers, as tiktoken does it. Errors name the file and line
(or row) and the problem.
"""
import codecs
import errno
import functools
import gzip
import io
import json
import os
import queue
import signal
import stat
import sys
import sysconfig
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np

from speedgpt.shards import HOLD, TOKEN_BYTES, describe_os_error, signals_held

GZIP_MAGIC, ZSTD_MAGIC, PARQUET_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd", b"PAR1"
COMPRESSED = (".gz", ".gzip", ".zst", ".zstd")         # dropped from a compressed file's name before its kind
VALIDATION_SPLITS = ("validation", "valid", "val")     # a DatasetDict's own validation split, by these names
BINARY_PROBE = 8192                                     # bytes looked at for a NUL: text never has one
NEWLINE = b"\n"

# -----------------------------------------------------------------------------
# input readers


class Document(NamedTuple):
    where: str                       # names the document in errors: "file:line", "file row N"
    text: str
    split: Optional[str] = None      # "train" or "val" when the corpus has its own split, else None


@dataclass
class Report:
    """What a reading skipped or decided, for data.py to tell: binary files skipped, files of a kind no reader
    takes skipped (NOT_READ), notes, and the characters that did not decode in `encoding` (parse_encoding) and
    became U+FFFD (":replace"), with their files."""
    binary: list = field(default_factory=list)
    unread: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    encoding: str = "utf-8"
    replaced: int = 0
    replaced_in: list = field(default_factory=list)

    def all_notes(self):
        """The notes, then one on the files of no reader and one on the replaced characters, if any."""
        n, name = len(self.replaced_in), parse_encoding(self.encoding)[0]
        unread = [f"skipped {len(self.unread)} files of a kind no reader takes: " + ", ".join(self.unread[:5])
                  + (", ..." if len(self.unread) > 5 else "") + f"; {ADD_A_READER}"] if self.unread else []
        return self.notes + unread + ([f"{self.replaced:,} characters that are not {name} replaced by U+FFFD "
                                       f"(--encoding={self.encoding}) in {n} files: " + ", ".join(self.replaced_in[:5])
                              + (", ..." if n > 5 else "")] if self.replaced else [])


@functools.lru_cache(maxsize=None)
def parse_encoding(spec):
    """(codec, replace) of an --encoding: a Python codec name (utf-8, latin-1, cp1252, ...), with ":replace" to
    turn what does not decode into U+FFFD instead of refusing it. Raises ValueError for anything else."""
    name, _, mode = spec.partition(":")
    try:
        codecs.lookup(name)
    except LookupError:
        mode = "unknown encoding"
    else:
        try:
            newline = "\n".encode(name)
        except (LookupError, UnicodeError):     # a codec of bytes to bytes or str to str (hex, rot13): no text
            mode = "not a text encoding"
        else:
            if b"\0" in newline:      # UTF-16 / UTF-32: each file would be skipped as binary, its lines split wrong
                raise ValueError(f"--encoding={spec!r}: {name} text holds NUL bytes, which mark a binary file here: "
                                 f"convert the corpus to UTF-8 first (iconv -f {name} -t utf-8)")
    if mode not in ("", "replace"):
        what = mode if mode in ("unknown encoding", "not a text encoding") else "unknown mode " + repr(mode)
        raise ValueError(f"--encoding={spec!r}: {what}; "
                         "give a Python codec (utf-8, latin-1, cp1252, ...), optionally with :replace")
    return name, mode == "replace"


_replaced = [0]      # characters replaced so far by the "speedgpt.replace" error handler (the main thread decodes)


def _replace_counted(error):
    """errors="replace" for decoding (one U+FFFD for each undecodable sequence, as Python's own), counted."""
    _replaced[0] += 1
    return "\ufffd", error.end


codecs.register_error("speedgpt.replace", _replace_counted)


def _decode(raw, where, report, bom=True, lines=True):
    """The bytes `raw` of `where` (a file, or "file:line") as text in report.encoding (a UTF-8 byte-order mark
    dropped when `bom`). Undecodable bytes raise ValueError naming the place (its line too, when `lines`: `raw`
    is a whole file) and the way out, or, with ":replace", become U+FFFD, counted in `report`."""
    name, replace = parse_encoding(report.encoding)
    codec = "utf-8-sig" if bom and codecs.lookup(name).name == "utf-8" else name
    try:
        return raw.decode(codec)
    except UnicodeDecodeError as e:
        if not replace:
            line = f":{raw.count(NEWLINE, 0, e.start) + 1}" if lines else ""
            raise ValueError(f"{where}{line}: byte 0x{raw[e.start]:02x} (at byte {e.start:,}) is not {name} text: give "
                             f"the corpus's encoding with --encoding (e.g. --encoding=latin-1), or "
                             f"--encoding={name}:replace to read what does not decode as U+FFFD (counted)") from None
    before = _replaced[0]
    text = raw.decode(codec, "speedgpt.replace")
    report.replaced += _replaced[0] - before
    path = where.rsplit(":", 1)[0] if not lines else where
    if path not in report.replaced_in[-1:]:
        report.replaced_in.append(path)
    return text


def stdlib_path():
    return sysconfig.get_paths()["stdlib"]


def iter_texts(path, text_field="text", report=None):
    """Return an iterator of Documents over `path` (see the module docstring). `report` (a Report)
    collects the binary files a folder skips and notes such as a dataset's own validation split.
    Raises FileNotFoundError at once for a missing path, ValueError at once for a single input file that
    is binary; ValueError, while iterating, for a record without a string `text_field` (naming the file
    and line or row) or when the optional package a kind needs (pyarrow, zstandard, datasets) is missing
    (naming the package)."""
    report = report if report is not None else Report()
    parse_encoding(report.encoding)              # a bad --encoding fails here, before anything is read
    if path is None:
        report.encoding = "utf-8:replace"        # Python sources; a few stdlib test files are in other encodings
        return _stdlib(report)
    if path.startswith("hf:"):
        return _hf_dataset(path[3:], text_field, report)
    if not os.path.exists(path):
        raise FileNotFoundError(f"input {path} does not exist: give a text, .jsonl or .parquet file, a folder of "
                                "them, or hf:NAME for a Hugging Face dataset (docs/data.md)")
    if os.path.isdir(path) and (_prepared(path) or os.path.isfile(os.path.join(path, "train.bin"))):
        raise ValueError(f"input {path} is prepared data already (token shards, ours or nanoGPT's train.bin), not a "
                         f"corpus: train on it as it is, python train.py --data_dir={path}")
    if os.path.isdir(path) and _is_saved_dataset(path):
        return _hf_dataset(path, text_field, report)
    if os.path.isdir(path):
        return _folder(path, text_field, report)
    try:
        kind, _ = file_kind(path)
    except OSError as e:
        raise _input_error(path, e) from None
    if kind == "binary":
        raise ValueError(f"input {path} is a binary file (a NUL byte in its first {BINARY_PROBE // 1024} KB), "
                         "not text, JSON or parquet")
    if kind in NOT_READ and kind not in READERS:
        raise ValueError(f"input {path}: {kind} files are {NOT_READ[kind]}, not text, and no reader takes them; "
                         f"{ADD_A_READER}")
    return _file(path, text_field, report)


def _stdlib(report):
    for root, dirs, files in os.walk(stdlib_path()):
        dirs[:] = sorted(d for d in dirs if d != "site-packages")   # walk in a fixed order
        for name in sorted(files):
            if name.endswith(".py"):
                yield from _text_file(os.path.join(root, name), None, report)


def _prepared(folder):
    """True for a folder data.py wrote (meta.json beside token shards): never read as documents."""
    return os.path.isfile(os.path.join(folder, "meta.json")) and any(n.endswith(".bin") for n in os.listdir(folder))


def _input_error(path, e):
    """ValueError naming the input `path` that could not be opened or read (OSError `e`: a broken link, no
    permission, a failing disk), so that data.py does not report it as a failed write of the output folder."""
    path = getattr(e, "filename", None) or path
    if os.path.islink(path) and not os.path.exists(path):
        why = f"a broken symbolic link (to {os.readlink(path)})"
    else:
        why = "it is gone (deleted, or a lost mount)" if e.errno == errno.ENOENT else describe_os_error(e)
    return ValueError(f"input {path} cannot be read: {why}; fix it, or move it out of the input folder")


def _walk_error(e):
    """os.walk's onerror: a folder of the input that cannot be listed stops the preparation (os.walk would skip
    it, and its documents with it, without a word)."""
    raise _input_error(e.filename, e) from None


def _first_visit(folder, seen):
    """True, adding it to `seen`, for a folder whose real path `seen` does not hold (a link cycle, or a folder linked
    twice, is read once)."""
    real = os.path.realpath(folder)
    return real not in seen and not seen.add(real)


def _folder(path, text_field, report):
    seen = {os.path.realpath(path)}      # a linked folder is read (os.walk skips it without a word), each one once
    for root, dirs, files in os.walk(path, onerror=_walk_error, followlinks=True):
        dirs[:] = [d for d in sorted(dirs) if not d.startswith(".") and not _prepared(os.path.join(root, d))
                   and _first_visit(os.path.join(root, d), seen)]
        datasets = [d for d in dirs if _is_saved_dataset(os.path.join(root, d))]
        dirs[:] = [d for d in dirs if d not in datasets]
        for name in sorted(files):
            if not name.startswith("."):
                yield from _file(os.path.join(root, name), text_field, report)
        for d in datasets:                          # after the files beside them, in sorted order
            yield from _hf_dataset(os.path.join(root, d), text_field, report)


def holds_records(path):
    """Whether `path` (iter_texts') holds a document with fields, which text_field names: a file READERS takes, a
    Hugging Face dataset (hf:NAME, or a saved one), or a folder with either inside, found as _folder walks it.
    False for the stdlib (None) and plain text; True where it cannot tell (iter_texts then says what is wrong)."""
    if path is None:
        return False
    try:
        if path.startswith("hf:") or os.path.isdir(path) and _is_saved_dataset(path):
            return True
        if not os.path.isdir(path):
            return file_kind(path)[0] in READERS
        seen = {os.path.realpath(path)}
        for root, dirs, files in os.walk(path, followlinks=True):
            dirs[:] = [d for d in sorted(dirs) if not d.startswith(".") and not _prepared(os.path.join(root, d))
                       and _first_visit(os.path.join(root, d), seen)]
            if any(_is_saved_dataset(os.path.join(root, d)) for d in dirs) or \
                    any(not f.startswith(".") and file_kind(os.path.join(root, f))[0] in READERS for f in files):
                return True
    except (OSError, ValueError):
        return True
    return False


def compression(path):
    """'gzip', 'zstd' or None for the file at `path`, from its first bytes."""
    with open(path, "rb") as f:
        head = f.read(4)
    return "gzip" if head[:2] == GZIP_MAGIC else "zstd" if head == ZSTD_MAGIC else None


def file_kind(path):
    """(kind, compression) of the file at `path`: kind the suffix of READERS or NOT_READ its name ends with (in
    any case, a compression suffix dropped), '.parquet' for the PAR1 magic whatever the name, else 'binary' (a
    NUL byte in its first BINARY_PROBE bytes) or 'text'. Raises ValueError for a FIFO, socket or device: opening
    one waits for a writer (forever, in a folder), and its probed bytes would be gone before the reading."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        what = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ValueError(f"input {path} is {what}, not a file: data.py reads a file more than once; write its "
                         "content to a file, or move it out of the input folder")
    packed = compression(path)
    name = path.lower()
    if packed:
        for suffix in COMPRESSED:
            name = name.removesuffix(suffix)
    else:
        with open(path, "rb") as f:
            if f.read(4) == PARQUET_MAGIC:
                return ".parquet", None
    for suffix in sorted((*READERS, *NOT_READ), key=len, reverse=True):     # .jsonl before .json's like
        if name.endswith(suffix):
            return suffix, packed
    with _open_stream(path, packed) as f:
        head = f.read(BINARY_PROBE)
    return ("binary" if b"\0" in head else "text"), packed


def _file(path, text_field, report):
    try:
        kind, packed = file_kind(path)
        if kind in READERS:
            yield from READERS[kind](path, packed, text_field, report)
        elif kind in NOT_READ:
            report.unread.append(path)
        elif kind == "binary":
            report.binary.append(path)
        else:
            yield from _text_file(path, packed, report)
    except OSError as e:                # reading, never writing: one line naming this file
        raise _input_error(path, e) from None


def _require(package, why):
    try:
        return __import__(package)
    except ImportError:
        raise ValueError(f"{why} needs the {package} package: pip install {package}") from None


def _open_stream(path, packed):
    """The file at `path` as a binary stream, decompressed (`packed`: 'gzip', 'zstd' or None)."""
    if packed == "gzip":
        return gzip.open(path, "rb")
    if packed == "zstd":
        return io.BufferedReader(_ZstdStream(path, _require("zstandard", f"reading {path}")))
    return open(path, "rb")


class _ZstdStream(io.RawIOBase):
    """The zstandard file at `path` (one frame, or several end to end) as a raw binary stream. Raises EOFError
    where the file ends inside a frame, as gzip does: zstandard's stream_reader returns what it decoded so far
    as if it were all, so a truncated download was prepared as half its text without a word."""

    def __init__(self, path, zstandard):
        self._file, self._new = open(path, "rb"), zstandard.ZstdDecompressor().decompressobj
        self._frame, self._fed, self._out = self._new(), False, b""

    def readable(self):
        return True

    def readinto(self, buffer):
        while not self._out:
            rest = b""
            if self._frame.eof:                  # a frame ended: the next one starts in what it left over
                rest, self._frame, self._fed = self._frame.unused_data, self._new(), False
            data = rest or self._file.read(1 << 16)
            if not data:
                if self._fed:
                    raise EOFError("the file ends inside a zstandard frame")
                return 0
            self._out, self._fed = self._frame.decompress(data), True
        n = min(len(buffer), len(self._out))
        buffer[:n], self._out = self._out[:n], self._out[n:]
        return n

    def close(self):
        self._file.close()
        super().close()


def _unreadable(path, e, after):
    """ValueError naming `path` for a truncated or corrupt compressed stream (`after`: where it broke)."""
    if isinstance(e, (EOFError, OSError, RuntimeError)) or type(e).__module__.startswith("zstandard"):
        return ValueError(f"{path}: not readable{' ' * bool(after)}{after} ({type(e).__name__}: {e}); is it truncated?")
    return None


def _read_all(path, packed):
    with _open_stream(path, packed) as f:
        try:
            return f.read()
        except Exception as e:                    # gzip.BadGzipFile is an OSError; zstandard.ZstdError
            raise (_unreadable(path, e, "") or e) from None


def _text_file(path, packed, report):
    text = _decode(_read_all(path, packed), path, report)
    yield Document(path, text.replace("\r\n", "\n").replace("\r", "\n"))     # universal newlines, as open() reads


def _lines(path, packed):
    """(line number, bytes) of the file at `path`, decompressed; ValueError naming the file and line
    where a .gz or .zst stream is truncated or corrupt."""
    lineno = 0
    with _open_stream(path, packed) as f:
        try:
            for lineno, line in enumerate(f, 1):
                yield lineno, line
        except Exception as e:
            error = _unreadable(path, e, f"after line {lineno}")
            if error is None:
                raise
            raise error from None


def _record_text(record, text_field, where):
    """The document of one JSON record: its string `text_field` (or the record itself, a string)."""
    if isinstance(record, str):
        return record
    if not isinstance(record, dict) or text_field not in record:
        texts = [k for k, v in record.items() if isinstance(v, str)] if isinstance(record, dict) else []
        raise ValueError(f"{where}: expected a JSON object with a {text_field!r} field, got "
                         + (f"fields {', '.join(record)}" if isinstance(record, dict) else type(record).__name__)
                         + (f": name the documents' field with --text_field (--text_field={texts[0]}?)" if texts else ""))
    if not isinstance(record[text_field], str):
        raise ValueError(f"{where}: {text_field!r} must be a string, got {type(record[text_field]).__name__}")
    return record[text_field]


def _jsonl(path, packed, text_field, report):
    for lineno, line in _lines(path, packed):
        line = _decode(line, f"{path}:{lineno}", report, bom=lineno == 1, lines=False)   # a BOM: invalid JSON
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: expected a JSON object with a {text_field!r} field ({e!r})") from None
        yield Document(f"{path}:{lineno}", _record_text(record, text_field, f"{path}:{lineno}"))


def _json(path, packed, text_field, report):
    """A .json file: an array of records (held whole: JSON has no streaming form), or JSON lines."""
    raw = _decode(_read_all(path, packed), path, report)
    if raw.lstrip().startswith("["):
        try:
            records = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        for i, record in enumerate(records):
            yield Document(f"{path} record {i}", _record_text(record, text_field, f"{path} record {i}"))
        return
    try:                                          # one object, perhaps pretty-printed over many lines
        yield Document(path, _record_text(json.loads(raw), text_field, path))
        return
    except json.JSONDecodeError:
        pass
    yield from _jsonl(path, packed, text_field, report)   # JSON lines named .json


def _parquet(path, packed, text_field, report):
    if packed:
        raise ValueError(f"{path}: a {packed}-compressed parquet file: parquet compresses its own columns; "
                         "decompress it")
    _require("pyarrow", f"reading {path}")
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:   # pyarrow raises its own ArrowInvalid for a file that is not parquet
        raise ValueError(f"{path}: not a readable parquet file ({e})") from None
    names = pf.schema_arrow.names
    if text_field not in names:
        raise ValueError(f"{path}: no column {text_field!r} (columns: {', '.join(names)}); "
                         "choose one with --text_field")
    row = 0
    for g in range(pf.num_row_groups):            # one row group in memory at a time
        for text in pf.read_row_group(g, columns=[text_field]).column(0).to_pylist():
            if not isinstance(text, str):
                raise ValueError(f"{path} row {row}: {text_field!r} must be a string, got {type(text).__name__}")
            yield Document(f"{path} row {row}", text)
            row += 1


# The readers of a file, by the end of its name (lower case, after any compression suffix is dropped): each a
# function of (path, compression: 'gzip', 'zstd' or None, text_field, report) yielding Documents. A new kind of
# input (CSV rows, WARC records, HTML with its tags stripped) is one entry here; a file whose name no entry ends
# is one document of text, unless it is binary.
READERS = {".jsonl": _jsonl, ".ndjson": _jsonl, ".json": _json, ".parquet": _parquet}
# Kinds with documents inside, which no reader above takes yet: refused as an input, skipped (and named) in a
# folder, rather than read as text (a table read whole would train on its delimiters and other columns). A
# reader in READERS wins over an entry here.
NOT_READ = {".csv": "tables of comma-separated rows", ".tsv": "tables of tab-separated rows"}
ADD_A_READER = ("add a reader to READERS in speedgpt/corpus.py (a function of (path, packed, text_field, report) "
                "yielding Documents), or convert them to JSON lines or parquet with a text field")


def _is_saved_dataset(path):
    return os.path.isfile(os.path.join(path, "dataset_dict.json")) or (
        os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json")))


def _hub_unreachable():
    """Why the Hugging Face hub cannot be reached, or None: its host's name does not resolve (no network). Asked
    first, so that an offline machine gets one line at once rather than the hub client's retries, a line each for
    about 30 s. None where the hub's cache answers offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) or a proxy
    resolves names instead of this machine."""
    import socket
    import urllib.parse
    env = {k.lower(): v for k, v in os.environ.items()}
    if any(env.get(k, "0") not in ("", "0") for k in ("hf_hub_offline", "hf_datasets_offline")) or \
            any(env.get(k) for k in ("https_proxy", "http_proxy", "all_proxy")):
        return None
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname
    try:
        socket.getaddrinfo(host, 443)
    except OSError as e:
        return f"{host} does not resolve ({e.strerror or e}): no network"
    return None


def _hf_dataset(name, text_field, report):
    """A local save_to_disk folder (memory-mapped Arrow, iterated as a stream) or `NAME[:CONFIG]` on the
    hub (streaming=True: nothing is downloaded ahead; its train split). A saved DatasetDict gives its
    'train' split, and its own validation split (VALIDATION_SPLITS) as the val documents when it has one
    (noted in `report`)."""
    datasets = _require("datasets", f"reading the Hugging Face dataset {name}")
    if os.path.isdir(name):
        ds, splits = datasets.load_from_disk(name), [(None, None)]
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise ValueError(f"{name}: the saved DatasetDict has no 'train' split (splits: {', '.join(ds)})")
            val = next((s for s in VALIDATION_SPLITS if s in ds), None)
            if val:
                report.notes.append(f"{name}: the dataset's own {val!r} split ({len(ds[val]):,} documents) is the val "
                                    "split; its 'train' split is train (val_frac does not apply to them)")
                splits = [("train", ds["train"]), ("val", ds[val])]
            else:
                report.notes.append(f"{name}: a DatasetDict without a validation split (splits: {', '.join(ds)}): "
                                    "its 'train' split is read, and val is drawn from it by val_frac")
                splits = [(None, ds["train"])]
        else:
            splits = [(None, ds)]
        for split, part in splits:
            if text_field not in part.column_names:
                raise ValueError(f"{name}: no column {text_field!r} (columns: {', '.join(part.column_names)}); "
                                 "choose one with --text_field")
            where = name if split is None else f"{name} {split}"
            yield from _records(part.select_columns([text_field]).to_iterable_dataset(), text_field, where, split)
        return
    repo, _, config = name.partition(":")
    unreachable = _hub_unreachable()
    if unreachable:
        raise ValueError(f"cannot open the Hugging Face dataset hf:{name}: {unreachable}; on a machine with a "
                         "network, save it with the datasets library (save_to_disk) and give that folder to --input")
    try:
        ds = datasets.load_dataset(repo, config or None, split="train", streaming=True)
    except Exception as e:       # offline, a typo in the name, a gated dataset...
        raise ValueError(f"cannot open the Hugging Face dataset hf:{name}: {type(e).__name__}: {e}") from None
    yield from _records(ds, text_field, name, None)


def _records(ds, text_field, where, split):
    for row, record in enumerate(ds):
        if text_field not in record:
            raise ValueError(f"{where} row {row}: no field {text_field!r} (fields: {', '.join(record)}); "
                             "choose one with --text_field")
        text = record[text_field]
        if not isinstance(text, str):
            raise ValueError(f"{where} row {row}: {text_field!r} must be a string, got {type(text).__name__}")
        yield Document(f"{where} row {row}", text, split)

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

    def token_bytes(self):
        """(vocab_size,) int64: the UTF-8 bytes each id stands for, 1 for ids 0-255 and 0 for end-of-text
        (the denominator of bits per byte: train.py's estimate_loss)."""
        return np.append(np.ones(256, dtype=np.int64), 0)


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
                % str(e).splitlines()[0]) from e

    def encode(self, text):
        # encode_ordinary: a literal "<|endoftext|>" inside a document is plain text, never id 50256
        return self.enc.encode_ordinary(text)

    def encode_array(self, text):
        """1-D uint32 array of encode(text), built without a Python list (faster than encode's list; tiktoken
        >= 0.9)."""
        try:
            return self.enc.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:    # unlike encode_ordinary, encode_to_numpy has no fallback
            return self.enc.encode_to_numpy(_replace_surrogates(text), disallowed_special=())

    def decode(self, ids):
        return self.enc.decode([i for i in ids if i < self.vocab_size])

    def token_bytes(self):
        """(vocab_size,) int64: the bytes of each BPE token (tiktoken's decode_single_token_bytes; a token
        may hold part of a UTF-8 character), 0 for end-of-text, which stands for no text."""
        return np.array([len(self.enc.decode_single_token_bytes(i)) for i in range(self.eot)] + [0], dtype=np.int64)


class CharTokenizer:
    """nanoGPT's character vocabulary (data/shakespeare_char's meta.pkl, as shards.nanogpt_meta reads it): id i is
    the character chars[i]. No end-of-text: eot is -1, never an id."""
    name, eot = "char", -1

    def __init__(self, chars):
        self.chars, self.vocab_size = list(chars), len(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text):
        """Raises ValueError naming the first character the vocabulary lacks."""
        missing = next((c for c in text if c not in self.stoi), None)
        if missing is not None:
            raise ValueError(f"{missing!r} is not in the data's {self.vocab_size}-character vocabulary (meta.pkl)")
        return [self.stoi[c] for c in text]

    def encode_array(self, text):
        return np.array(self.encode(text), dtype=np.uint16)

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids if 0 <= i < self.vocab_size)

    def token_bytes(self):
        """(vocab_size,) int64: each character's UTF-8 bytes (bits per byte's denominator)."""
        return np.array([len(c.encode("utf-8")) for c in self.chars], dtype=np.int64)


def tokenizer_for(meta):
    """The tokenizer of a data folder's (or a checkpoint's) metadata: get_tokenizer's, or the character vocabulary
    that a nanoGPT folder's meta carries. Raises ValueError, with the way out, for ids whose text is unknown (a
    meta.pkl of a vocab_size alone): nothing encodes a prompt into them or decodes them."""
    if meta["tokenizer"] == "ids":
        raise ValueError("the model's tokens are ids whose text is unknown (its data's meta.pkl held a vocab_size "
                         "and no itos): no tokenizer encodes a prompt or decodes a sample; train on data that has one "
                         "(a meta.pkl with itos and stoi, as nanoGPT's shakespeare_char/prepare.py writes; GPT-2 "
                         "tokens: no meta.pkl; other text: data.py)")
    return CharTokenizer(meta["chars"]) if meta["tokenizer"] == "char" else get_tokenizer(meta["tokenizer"])


def get_tokenizer(name):
    """Return the tokenizer called `name` ("byte" or "gpt2"). Raises ValueError for other names."""
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    raise ValueError(f"unknown tokenizer {name!r}: expected 'byte' or 'gpt2'")


# -----------------------------------------------------------------------------
# parallel tokenisation

def _tokenize_chunk(tok, dtype, chunk):
    """[Document, ...] -> (tokens, lengths, n_empty, splits): each non-empty document as [EOT, ids...],
    all concatenated (one array pickles back to the parent much faster than many), with each one's
    length and split (None: for data.py to draw)."""
    parts, lengths, splits = [], [], []
    for doc in chunk:
        try:
            ids = tok.encode_array(doc.text)
        except Exception as e:
            raise ValueError(f"{doc.where}: cannot tokenise this document ({type(e).__name__}: {e})") from None
        if len(ids):
            parts += [np.array([tok.eot], dtype=dtype), ids.astype(dtype, copy=False)]
            lengths.append(len(ids) + 1)
            splits.append(doc.split)
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return tokens, np.array(lengths, dtype=np.int64), len(chunk) - len(lengths), splits


PR_SET_PDEATHSIG = 1        # <linux/prctl.h>


def _exit_when_closed(sentinel):
    import multiprocessing.connection
    multiprocessing.connection.wait([sentinel])     # ready at EOF: the parent has exited
    os._exit(1)


def _end_with_parent():
    """End this worker when the process that started it ends, however it ends (a SIGKILL too, after which
    nothing of that process cleans up): else the worker waits on its queue forever, reparented. Two ways,
    as neither covers every start method. On Linux the kernel sends the worker SIGKILL when its parent
    dies (prctl PR_SET_PDEATHSIG): under fork that is the starting process, at once. Under forkserver the
    parent is the fork server, which outlives a dead client while the workers hold its descriptor, and
    spawn (macOS) has no prctl: for them a thread also waits on multiprocessing's sentinel of the starting
    process (a pipe it holds open: EOF once it has exited, at once if it already has), then exits the worker."""
    if sys.platform == "linux":
        import ctypes
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):          # no prctl in this libc: the thread below still ends us
            pass
    import multiprocessing
    import threading
    threading.Thread(target=_exit_when_closed, args=(multiprocessing.parent_process().sentinel,),
                     daemon=True).start()


def _worker_main(tasks, results, tokenizer, dtype):
    """A tokenisation worker: chunks from `tasks` (None: stop), ("ok", result) or ("error", message) to
    `results`. Ctrl-C is the parent's: it came blocked from the parent and is ignored here. SIGTERM came
    blocked too, and under fork with data.py's handler: here it is the default again, so that a SIGTERM
    to the whole process group ends a worker at once, without a traceback, while data.py cleans up. The
    worker ends with its parent (_end_with_parent)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    _end_with_parent()
    try:
        tok = get_tokenizer(tokenizer)
    except Exception as e:
        results.put(("error", f"{type(e).__name__}: {e}"))
        return
    while (chunk := tasks.get()) is not None:
        try:
            results.put(("ok", _tokenize_chunk(tok, dtype, chunk)))
        except ValueError as e:
            results.put(("error", str(e)))


class TokenizerPool:
    """`workers` processes tokenising chunks of documents with the tokenizer called `tokenizer`, in input
    order. Each worker has a queue of its own in and out, and chunks go round-robin, so the parent never
    takes a lock a worker may hold: stopping (an error, Ctrl-C) kills the workers and returns at once,
    where multiprocessing.Pool's terminate can wait forever on a lock held by a worker killed mid-task.
    A worker ends with this process too when nothing here runs to stop it (SIGKILL): _end_with_parent.
    The workers start when the pool is made, before the caller starts threads of its own (a progress
    bar's): forked on Linux when this process has no other thread, else from a fork server (a fork beside
    other threads, as in a test run or the trainer, can deadlock the child; a script that calls this then
    needs Python's `if __name__ == "__main__":` guard), spawned elsewhere. Use as a context manager;
    tokenize() yields the results."""

    def __init__(self, tokenizer, dtype, workers):
        import multiprocessing
        import threading
        linux = sys.platform == "linux"
        method = ("fork" if threading.active_count() == 1 else "forkserver") if linux else "spawn"
        ctx = multiprocessing.get_context(method)
        self.workers, self.pending = [], deque()    # pending: the worker of each chunk in flight, in input order
        try:
            with signals_held():                # workers start with Ctrl-C and SIGTERM blocked (_worker_main)
                for _ in range(workers):
                    tasks, results = ctx.Queue(), ctx.Queue()
                    proc = ctx.Process(target=_worker_main, args=(tasks, results, tokenizer, dtype), daemon=True)
                    proc.start()
                    self.workers.append((proc, tasks, results))
        except BaseException:                   # an interrupt held off while they started
            self.close()
            raise

    def _put(self, w, chunk):
        """Queue `chunk` for worker w, not cut by a signal (signals_held): a queue's first put starts its feeder
        thread and makes its multiprocessing Finalize objects, and one cut in its __init__ raises at exit."""
        with signals_held():
            self.workers[w][1].put(chunk)

    def _result(self, w):
        proc, _, results = self.workers[w]
        while True:
            try:
                status, value = results.get(timeout=1)
                break
            except queue.Empty:
                if not proc.is_alive():
                    why = "killed: out of memory?" if proc.exitcode == -9 else f"exit code {proc.exitcode}"
                    raise RuntimeError(f"a tokenisation worker died ({why})") from None
        if status == "error":
            raise ValueError(value)
        return value

    def tokenize(self, docs, chunk_chars=1 << 20):
        """Tokenise `docs` (an iterator of Documents). Yields (tokens, lengths, n_empty, splits) for
        consecutive chunks of about chunk_chars characters, in input order whatever the number of workers:
        `tokens` (1-D) holds each non-empty document as [EOT, ids...] end to end, `lengths` (int64) their
        lengths in tokens, n_empty the empty documents left out, `splits` each document's own split or
        None. At most 2 chunks per worker are read ahead, so memory stays bounded. Raises ValueError
        naming a document that cannot be tokenised."""
        self.pending = pending = deque()
        chunk, size, n = [], 0, 0
        for doc in docs:
            chunk.append(doc)
            size += len(doc.text)
            if size >= chunk_chars:
                self._put(n % len(self.workers), chunk)
                pending.append(n % len(self.workers))
                chunk, size, n = [], 0, n + 1
                if len(pending) >= 2 * len(self.workers):
                    yield self._result(pending.popleft())
        if chunk:
            self._put(n % len(self.workers), chunk)
            pending.append(n % len(self.workers))
        while pending:
            yield self._result(pending.popleft())

    def close(self, clean=False):
        """Stop the workers: asked to finish when `clean` and no chunk is in flight (a worker with a result
        nobody reads would not finish), killed otherwise; never waits on a queue. Not cut by a signal
        (signals_held): stopped half-way, a queue's feeder thread, blocked writing to a dead worker, would
        be joined at exit forever."""
        with signals_held():
            for _, tasks, _ in self.workers:
                tasks.cancel_join_thread()        # a chunk still in its pipe is not waited for, at exit either
            clean = clean and not self.pending
            for proc, tasks, _ in self.workers:
                if clean and proc.is_alive():
                    tasks.put(None)
            for proc, tasks, results in self.workers:
                proc.join(timeout=10 if clean else 0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
                tasks.close()
                results.close()

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        self.close(clean=kind is None)


def tokenized_chunks(docs, tokenizer, dtype, workers, chunk_chars=1 << 20):
    """TokenizerPool(tokenizer, dtype, workers).tokenize(docs, chunk_chars), the pool closed after."""
    with TokenizerPool(tokenizer, dtype, workers) as pool:
        yield from pool.tokenize(docs, chunk_chars)


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def sigterm_as_interrupt():
    """Inside the block SIGTERM raises KeyboardInterrupt(SIGTERM), as Ctrl-C raises KeyboardInterrupt(SIGINT)
    (unless Ctrl-C is ignored, as in a background job), so a preparation stopped by kill, timeout, Slurm or
    docker stop unwinds as Ctrl-C's does (its workers stopped, its temp folder removed). Once: from the first
    signal on, both are ignored until the process ends, so a second one (plain `timeout` signals the process,
    then its group; Ctrl-C pressed twice) never cuts that cleanup, which is bounded. The previous handlers
    afterwards when no signal came. The main thread only."""
    previous = {s: signal.getsignal(s) for s in INTERRUPTS}
    ours = [s for s in INTERRUPTS if s == signal.SIGTERM or previous[s] is signal.default_int_handler]
    for s in ours:
        signal.signal(s, _interrupt)
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:                                  # stopping: deaf to a second signal (as the handler made it)
        if interrupted:
            _ignore(ours)
        else:
            for s in ours:
                signal.signal(s, previous[s])


def run_child(cmd, **kwargs):
    """subprocess.run(cmd, **kwargs)'s exit status, for an entry script inside sigterm_as_interrupt: a signal that
    comes while the child starts (forked, its Popen not yet returned: the interrupt would leave no handle to stop
    it) is deferred until Popen returns; then any exception while it runs (that signal's KeyboardInterrupt) kills
    the child and waits for it, so none outlives the script. Deferred, not blocked as in signals_held: a blocked
    mask would pass to the child, deaf to SIGINT and SIGTERM."""
    import subprocess
    import threading
    main = threading.current_thread() is threading.main_thread()
    HOLD["depth"] += main
    try:
        proc = subprocess.Popen(cmd, **kwargs)
    finally:
        HOLD["depth"] -= main
    try:
        if main and HOLD["depth"] == 0 and HOLD["signum"] is not None:
            signum, HOLD["signum"] = HOLD["signum"], None
            raise KeyboardInterrupt(signum)
        return proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def interrupt_signal(e):
    """The signal number a KeyboardInterrupt `e` stands for: sigterm_as_interrupt's carries it as its argument;
    Python's own Ctrl-C carries none, SIGINT's. An entry script exits with 128 + it, as a shell reports a process a
    signal stopped."""
    return e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT


def _interrupt(signum, frame):
    """sigterm_as_interrupt's handler: ignore SIGINT and SIGTERM from now on, then raise what Ctrl-C raises
    (KeyboardInterrupt(signum)), at once or, inside shards.signals_held, when its block ends."""
    _ignore([s for s in INTERRUPTS if signal.getsignal(s) is _interrupt])
    if HOLD["depth"]:
        HOLD["signum"] = HOLD["signum"] or signum
        return
    raise KeyboardInterrupt(signum)


RACE_REPORTS = {f"Signal {int(s)} ignored due to race condition" for s in INTERRUPTS}


def _ignore(signals):
    """SIG_IGN for `signals`, for good: the process is stopping (SIG_IGN, unlike a handler that does nothing,
    outlasts the interpreter's teardown, which puts back SIG_DFL for Python handlers). A second signal that
    another thread's C handler records just as the main thread sets SIG_IGN is then reported by Python, with
    a traceback on stderr, as "Signal 2 ignored due to race condition" (through sys.unraisablehook, once the
    handler it was recorded for is gone). That signal is the one meant to be ignored: its report is dropped,
    every other report passes to the hook that was there."""
    if not getattr(sys.unraisablehook, "drops_ignored_interrupts", False):
        passed_on = sys.unraisablehook

        def hook(report):
            if not (isinstance(report.exc_value, OSError) and str(report.exc_value) in RACE_REPORTS):
                passed_on(report)
        hook.drops_ignored_interrupts = True
        sys.unraisablehook = hook
    for s in signals:
        signal.signal(s, signal.SIG_IGN)


def token_bytes(data_dir, meta):
    """(vocab_size,) int64: the UTF-8 bytes each token id stands for (bits per byte's denominator), from the
    folder's token_bytes.npy, which data.py writes at preparation so that training on GPT-2 tokens needs no
    tokenizer files; from the tokenizer for a folder prepared before that, or foreign shards. None for ids whose
    text is unknown (nanoGPT's meta.pkl of a vocab_size alone): no bits per byte."""
    if meta["tokenizer"] == "ids":
        return None
    path = os.path.join(str(data_dir), TOKEN_BYTES)
    if os.path.isfile(path):
        counts = np.load(path)
        if counts.shape == (meta["vocab_size"],):
            return counts.astype(np.int64)
    return tokenizer_for(meta).token_bytes()
