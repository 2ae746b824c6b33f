"""
The shard format of speedgpt's data (llm.c / modded-nanogpt): a header of 256 int32 (magic 20240520,
version, token count), then the tokens, uint16 (version 1) or uint32 (version 2); beside each shard
NAME.bin its index NAME.idx.npz (token count, largest id, offset of each BOS), written at preparation so
that a loader starts without reading shards; meta.json, written last, lists the shards. data.py writes
(ShardWriter: a split's documents, into shards as they fill) and reads through these functions (and re-exports
them: data.read_shard etc.).

nanoGPT's data folders read as they are (its data/*/prepare.py): train.bin and val.bin, the split's uint16 tokens
with no header, and for a character vocabulary meta.pkl ({'vocab_size', 'itos', 'stoi'}; a vocab_size alone: ids
whose text is unknown, which train but neither decode nor give bits per byte); without meta.pkl the
tokens are GPT-2's. No document boundaries are stored there: GPT-2's end-of-text (50256, which nanoGPT's
openwebtext puts after each document) splits documents for the document mask; a character vocabulary has none.
"""
import contextlib
import errno
import glob
import json
import operator
import os
import pickle
import re
import shutil
import signal
from contextlib import contextmanager

import numpy as np

MAGIC = 20240520
VERSION_DTYPE = {1: np.uint16, 2: np.uint32}
LLMC_LLAMA3 = (20240801, 7)   # llm.c's uint32 shards for Llama 3 tokens: readable too
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
SHARD_TOKENS = 100_000_000    # tokens per shard, as llm.c
TOKEN_BYTES = "token_bytes.npy"   # beside meta.json: each token id's UTF-8 bytes (token_bytes)
FORMAT = 2                    # meta.json "format": 2 = EOT before each document (1 put it after)
OUR_SHARD = re.compile(r"(train|val)_\d{6}\.bin")
NANOGPT_SPLIT = re.compile(r"(train|val)\.bin")   # nanoGPT's: the split's uint16 tokens, no header
NANOGPT_VOCAB = "meta.pkl"                       # nanoGPT's character vocabulary, beside them
OUR_FILE = re.compile(r"((train|val)_\d{6}\.(bin|idx\.npz)|meta\.json|token_bytes\.npy)(\.\d+)?(\.tmp)?")

# -----------------------------------------------------------------------------
# shards and their index

def write_shard(path, tokens):
    """Write 1-D int `tokens` to `path` in the llm.c format: uint16 (version 1) when every id fits,
    else uint32 (version 2); never wraps. Written to a temp file and renamed. No index: see read_index."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**32):
        raise ValueError(f"{path}: token ids must lie in [0, 2^32)")
    version = 1 if (tokens.size == 0 or tokens.max() < 2**16) else 2
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = MAGIC, version, len(tokens)
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(VERSION_DTYPE[version]).tobytes())
    os.replace(path + ".tmp", path)


def read_header(path):
    """Validate the shard at `path` and return (n_tokens, numpy dtype).
    Raises FileNotFoundError or ValueError naming the file and what is wrong."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"shard {path} does not exist")
    size = os.path.getsize(path)
    if headerless(path):
        if size % 2:
            raise ValueError(f"{path} has an odd number of bytes ({size}): not nanoGPT's uint16 tokens (truncated?)")
        return size // 2, np.uint16
    if size < HEADER_BYTES:
        raise ValueError(f"shard {path} is corrupt: {size} bytes, shorter than its 1024-byte header")
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    magic, version, n = int(header[0]), int(header[1]), int(header[2])
    if (magic, version) == LLMC_LLAMA3:
        dtype = np.uint32
    elif magic != MAGIC:
        raise ValueError(f"shard {path} is corrupt or not a token shard: magic {magic}, expected {MAGIC}")
    elif version not in VERSION_DTYPE:
        raise ValueError(f"shard {path} has unknown version {version} (known: 1 = uint16, 2 = uint32)")
    else:
        dtype = VERSION_DTYPE[version]
    expected = HEADER_BYTES + n * np.dtype(dtype).itemsize
    if size != expected:
        raise ValueError(f"shard {path} is truncated or corrupt: header says {n} tokens "
                         f"({expected} bytes) but the file has {size} bytes")
    return n, dtype


def read_shard(path):
    """Return the tokens of a shard as a read-only memmap (1-D). Drop it when done: see Loader."""
    n, dtype = read_header(path)
    if n == 0:          # an empty nanoGPT val.bin (no header): mmap refuses an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=0 if headerless(path) else HEADER_BYTES, shape=(n,))


def headerless(path):
    """True for nanoGPT's train.bin / val.bin: tokens from the first byte (ours and llm.c's have a header)."""
    return bool(NANOGPT_SPLIT.fullmatch(os.path.basename(path)))


class DataError(ValueError):
    """Bad data met after setup, in the loader's thread (a shard changed after its index was written):
    train.py reports it in one line, as bad input found at setup."""


def index_path(shard):
    return shard[:-len(".bin")] + ".idx.npz"


def index_tmp_path(shard):
    """The temp file write_index writes before its rename: per process, as torchrun ranks may index a
    foreign shard at once."""
    return f"{index_path(shard)}.{os.getpid()}.tmp"


def write_index(shard, n_tokens, max_id, doc_starts, eot):
    """Write the index of `shard` beside it (NAME.idx.npz; temp file, then rename): its token count,
    largest id (-1 if empty), end-of-text id, and doc_starts, the offset of each BOS (int64, ascending)."""
    tmp = index_tmp_path(shard)
    with signals_held(), open(tmp, "wb") as f:   # Ctrl-C inside savez's zip write would leave zipfile's errors instead
        np.savez(f, n_tokens=n_tokens, max_id=max_id, eot=eot, doc_starts=np.asarray(doc_starts, dtype=np.int64))
    os.replace(tmp, index_path(shard))


class ShardWriter:
    """Streams the documents of one split into shards of `shard_tokens` tokens, a document running on
    into the next shard as in llm.c. A shard's header and index are written when it is full (or at
    close); data.prepare() writes into a folder of its own until the whole preparation is done."""

    def __init__(self, out_dir, split, shard_tokens, dtype, eot):
        self.out_dir, self.split, self.shard_tokens, self.dtype, self.eot = out_dir, split, shard_tokens, dtype, eot
        self.names, self.tokens, self.docs, self.f = [], 0, 0, None

    def add(self, ids):
        """Append one document: 1-D `ids` of self.dtype, starting with its BOS."""
        self.docs, self.tokens = self.docs + 1, self.tokens + len(ids)
        while len(ids):
            if self.f is None:
                self.path = os.path.join(self.out_dir, f"{self.split}_{len(self.names):06d}.bin")
                self.f = open(self.path, "wb")
                self.f.write(bytes(HEADER_BYTES))          # filled in when the shard is complete
                self.n, self.max_id, self.starts = 0, -1, []
            if ids[0] == self.eot:
                self.starts.append(self.n)
            part, ids = ids[:self.shard_tokens - self.n], ids[self.shard_tokens - self.n:]
            self.f.write(part.tobytes())
            self.n, self.max_id = self.n + len(part), max(self.max_id, int(part.max()))
            if self.n == self.shard_tokens:
                self.close()

    def close(self):
        """Complete the current shard, if any."""
        if self.f is not None:
            header = np.zeros(HEADER_INTS, dtype=np.int32)
            header[:3] = MAGIC, 1 if self.dtype == np.uint16 else 2, self.n
            self.f.seek(0)
            self.f.write(header.tobytes())
            self.f.close()
            self.f = None
            write_index(self.path, self.n, self.max_id, self.starts, self.eot)
            self.names.append(os.path.basename(self.path))


HOLD = {"depth": 0, "signum": None}       # signals_held's blocks open, and the signal one of them deferred


@contextmanager
def signals_held():
    """SIGINT and SIGTERM held off inside the block (delivered when it ends), for short writes and cleanups an
    interrupt must not cut in two: blocked in this thread where the platform can (pthread_sigmask), and, for the
    handlers of corpus.sigterm_as_interrupt (Python runs them in the main thread, whichever thread the kernel
    hands a signal to), deferred: its KeyboardInterrupt is raised when the outermost block of the main thread
    ends (only the main thread defers: it is the one the handler interrupts)."""
    import threading
    mask, main = hasattr(signal, "pthread_sigmask"), threading.current_thread() is threading.main_thread()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if mask else None
    HOLD["depth"] += main
    try:
        yield
    finally:
        HOLD["depth"] -= main
        if mask:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if main and HOLD["depth"] == 0 and HOLD["signum"] is not None:
            signum, HOLD["signum"] = HOLD["signum"], None
            raise KeyboardInterrupt(signum)


def read_index(shard, n_tokens, eot, foreign, with_starts=True):
    """(max_id, doc_starts or None) of `shard`, which holds n_tokens, from its index. A foreign shard
    without a matching index is scanned now (one pass over its tokens) and its index saved beside it when
    the folder is writable. Raises ValueError, naming the shard, when one of our
    shards lacks a matching index (an interrupted or mixed preparation)."""
    path = index_path(shard)
    if os.path.isfile(path):
        try:
            with np.load(path) as z:
                if int(z["n_tokens"]) == n_tokens and int(z["eot"]) == eot:
                    return int(z["max_id"]), (z["doc_starts"] if with_starts else None)
        except (ValueError, KeyError, OSError, EOFError) as e:      # np.load of a damaged .npz
            raise ValueError(f"index {path} is corrupt ({type(e).__name__}); "
                             "prepare the folder again with data.py") from None
    if not foreign:
        raise ValueError(f"shard {shard} has no index matching it ({os.path.basename(path)}): an interrupted or "
                         f"mixed preparation? Prepare the folder again with data.py")
    toks = read_shard(shard)
    max_id, starts = (int(toks.max()) if len(toks) else -1), np.flatnonzero(toks == eot)
    try:
        write_index(shard, n_tokens, max_id, starts, eot)
    except OSError:                   # a read-only folder: the index lives in memory only
        pass
    return max_id, starts


def describe_os_error(e):
    """One phrase for an OSError from writing a file: the cause a user can act on."""
    causes = {errno.EROFS: "read-only filesystem", errno.ENOSPC: "no space left on the device",
              errno.EACCES: "permission denied", errno.EDQUOT: "disk quota exceeded",
              errno.EFBIG: "file too large (the file-size limit, ulimit -f)", errno.EIO: "input/output error (a lost "
              "or failing disk or mount)", errno.ESTALE: "stale file handle (a lost network mount)",
              errno.ENOENT: "the folder is gone (a lost mount, or deleted)"}
    return causes.get(e.errno, e.strerror or str(e))


def folder_creation_error(folder, e, flag, near=None):
    """The one-line ValueError for an output `folder` that os.makedirs could not create (OSError `e`): it
    names the folder the user chose by `flag` (never a temp folder beside it), where and why it failed in
    words (`near`: by default the deepest part of its path that exists), and the way out. A folder that exists
    is said to be not writable: data.py's preparation writes beside it (its temp folder) and replaces it."""
    near = near or (folder if os.path.isfile(folder) else os.path.dirname(os.path.abspath(folder)))  # a file there
    while not os.path.exists(near):          # the deepest part of the path that exists: where mkdir failed
        near = os.path.dirname(near)
    if not os.path.isdir(near):
        why = f"{near} is a file, not a folder"
    elif e.errno == errno.ENOENT:            # mkdir in a folder that exists: /proc, /sys and the like take none
        why = f"{near} does not take new folders"
    else:
        why = f"{describe_os_error(e)} in {near}"
    fix = f", or fix the permissions of {near}" if e.errno in (errno.EACCES, errno.EPERM) else ""
    what = f"output folder {folder} is not writable" if os.path.isdir(folder) else \
        f"cannot create the output folder {folder}"
    return ValueError(f"{what}: {why}; choose another {flag}{fix}")


@contextmanager
def prepared_folder(out_dir):
    """Yield a new, empty folder beside `out_dir` (.NAME.preparing) to prepare into. When the block ends
    without an error it replaces out_dir, as checkpoints are written: two renames, with Ctrl-C held off
    between them; a failure or an interrupt removes it and leaves out_dir exactly as it was. A folder left
    by a process killed mid-way is cleaned up (or, between the two renames, put back) first. Raises
    ValueError for an out_dir that is a file or holds anything data.py does not write, or that cannot be
    created or, existing, written (naming out_dir and --out, not the temp folder), and OSError for a
    later write that fails.
    An out_dir that is a symbolic link is prepared where it points (the link stays: a folder linked to a larger
    disk gets the shards there). One preparation at a time per folder (preparation_lock): another one would take
    this one's temp folder for a killed run's and remove it."""
    shown = out_dir = os.path.normpath(out_dir)          # the user's name, in messages
    try:
        os.stat(out_dir)
    except OSError as e:        # new or dangling is fine (made where it points); a loop of links points nowhere
        if e.errno == errno.ELOOP:
            raise ValueError(f"output {shown} is a loop of symbolic links: remove it, or choose another "
                             "--out") from None
    out_dir = os.path.realpath(out_dir)
    parent, name = os.path.split(out_dir)
    tmp, old = os.path.join(parent, f".{name}.preparing"), os.path.join(parent, f".{name}.old")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"output {shown} exists and is not a folder: choose another --out")
    # out_dir is replaced by a new folder at the end: the shell that ran data.py from inside it would be left in
    # the old one, deleted, and see nothing of what was written
    if os.path.commonpath([os.path.realpath(os.getcwd()), out_dir]) == out_dir:
        raise ValueError(f"output {shown} is the current folder or holds it, and a preparation replaces it with a "
                         "new folder: run data.py from its parent with --out NAME")
    # the replacement is a rename of out_dir, which a mount point refuses (EBUSY) once the whole preparation is done
    if os.path.ismount(out_dir):
        raise ValueError(f"output {shown} is a mount point, and a preparation replaces its folder by a rename, which "
                         f"a mount point refuses: choose a folder inside it (--out {os.path.join(shown, 'NAME')})")
    if os.path.isdir(out_dir):
        foreign = sorted(n for n in os.listdir(out_dir) if not OUR_FILE.fullmatch(n))
        if foreign:
            raise ValueError(f"output {shown} holds files data.py did not write ({', '.join(foreign[:3])}"
                             f"{', ...' if len(foreign) > 3 else ''}): prepare into a new folder, or empty this one")
        # the old out_dir is removed once replaced: a read-only one (its files not removable) was replaced all the
        # same and stayed, hidden, as .NAME.old; its parent's writes (lock, temp folder) say the same when they fail
        if not os.access(out_dir, os.W_OK):
            read_only = hasattr(os, "statvfs") and os.statvfs(out_dir).f_flag & os.ST_RDONLY
            raise folder_creation_error(shown, OSError(errno.EROFS if read_only else errno.EACCES, ""), "--out",
                                        near=out_dir)
    with preparation_lock(parent, name, shown):
        if os.path.isdir(out_dir) and os.listdir(out_dir):
            print(f"note: {shown} holds prepared data: it is replaced once this preparation is whole (a run "
                  "trained on it resumes only on the same data: keep it by preparing into another --out)", flush=True)
        elif not os.path.exists(out_dir) and os.path.isdir(old):   # killed between the two renames: it goes back
            os.rename(old, out_dir)
        for stale in (tmp, old):
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.makedirs(tmp)
        except OSError as e:
            raise folder_creation_error(shown, e, "--out") from None
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _replace(tmp, out_dir, old)


@contextmanager
def preparation_lock(parent, name, shown):
    """Hold `parent`/.NAME.lock (flock) for the block; ValueError naming `shown` (the --out) at once when another
    process holds it: a second preparation into the same folder would remove the first one's temp folder as a
    killed run's, and the two would write into one folder. The kernel drops the lock of a process that dies, so a
    killed preparation's lock file never blocks the next. Removed at the end; no lock where fcntl is missing."""
    try:
        import fcntl
    except ImportError:                      # not POSIX: no lock
        yield
        return
    path = os.path.join(parent, f".{name}.lock")
    while True:
        try:
            os.makedirs(parent, exist_ok=True)          # --out data/new, where data/ is not made yet
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise folder_creation_error(shown, e, "--out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(f"output {shown} is being prepared by another data.py now (it holds {path}): wait for "
                             "it to finish, or choose another --out") from None
        except OSError:                      # a filesystem without locks (ENOLCK): prepared unlocked, as before
            break
        try:                                 # the file locked is still the one at `path` (not unlinked by a
            same = os.stat(path).st_ino == os.fstat(fd).st_ino     # holder that finished meanwhile): else again
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    HELD_LOCKS[("data", path)] = fd
    try:
        yield
    finally:
        HELD_LOCKS.pop(("data", path), None)
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


# the flocks this process holds, {(kind, path): descriptor}: preparation_lock's ("data") and
# checkpoint.lock_out_dir's ("out_dir")
HELD_LOCKS = {}


def _drop_held_locks():
    """In a forked child (a tokenizer or compile worker), close its copies of the held locks and forget them: a
    flock lasts while any copy is open, so a worker that outlived a killed data.py or train.py would keep its
    folder refused to the next one. The parent's locks stay as they are."""
    for fd in HELD_LOCKS.values():
        os.close(fd)
    HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_held_locks)


def _replace(tmp, out_dir, old):
    """prepared_folder's end: tmp becomes out_dir, the old out_dir (if any) removed."""
    with signals_held():
        if os.path.isdir(out_dir):
            os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if os.path.isdir(old):
                os.rename(old, out_dir)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)


# nanoGPT's data/<dataset> folders, each written by its data/<dataset>/prepare.py: their tokens
NANOGPT_DATASETS = {"shakespeare_char": "characters", "shakespeare": "gpt2", "openwebtext": "gpt2"}


def nanogpt_folder_hint(data_dir):
    """(where nanoGPT makes it, data.py's --tokenizer for it) for a missing data/<dataset> of nanoGPT's
    (NANOGPT_DATASETS, as its dataset key names them), for the error's line; ('', '') for another folder."""
    name = os.path.basename(os.path.normpath(data_dir))
    if name not in NANOGPT_DATASETS or os.path.normpath(data_dir) != os.path.join("data", name):
        return "", ""
    return f"nanoGPT's dataset={name!r} is the folder its data/{name}/prepare.py writes: run that in nanoGPT and " \
           f"copy it here (cp -r ../nanoGPT/data/{name} data/); or ", \
        " --tokenizer gpt2" if NANOGPT_DATASETS[name] == "gpt2" else ""


def tokenizer_flag(data_dir):
    """The --tokenizer a preparation hint for `data_dir` needs: the presets' folders say it in their names
    (data/stdlib_gpt2, data/shakespeare_gpt2)."""
    return " --tokenizer gpt2" if os.path.basename(str(data_dir).rstrip("/")).endswith("gpt2") else ""


def find_shards(data_dir, split):
    """Sorted shard paths of `split` ("train" or "val") in `data_dir`: ours are train_000000.bin,
    llm.c's fineweb_train_000000.bin. Raises FileNotFoundError when there are none (for a corpus file
    given instead of a folder, with the data.py command that prepares it)."""
    data_dir = str(data_dir)
    if os.path.isfile(data_dir):
        if data_dir.endswith(".bin"):
            hint = f"pass the folder that holds this shard: --data_dir={os.path.dirname(data_dir) or '.'}"
        else:
            out = os.path.join("data", os.path.basename(data_dir).split(".")[0] or "corpus")
            hint = f"prepare it with `python data.py --input {data_dir} --out {out}`, then pass --data_dir={out}"
        raise FileNotFoundError(f"data folder {data_dir!r} is a file, not a folder: {hint}")
    tok = tokenizer_flag(data_dir)
    if not os.path.isdir(data_dir):
        theirs, their_tok = nanogpt_folder_hint(data_dir)      # nanoGPT's data/<dataset>
        raise FileNotFoundError(f"data folder {data_dir!r} does not exist: {theirs}prepare it with "
                                f"`python data.py --input CORPUS --out {data_dir}{their_tok or tok}`")
    paths = sorted(glob.glob(os.path.join(glob.escape(data_dir), f"*{split}_*.bin")))
    if not paths and os.path.isfile(os.path.join(data_dir, f"{split}.bin")):       # nanoGPT's folder
        paths = [os.path.join(data_dir, f"{split}.bin")]
    names = [] if paths else [n for n in os.listdir(data_dir) if not n.startswith(".")]
    prepared = sorted(n for n in names if os.path.isfile(os.path.join(data_dir, n, "meta.json")))
    if prepared:              # the folder above prepared data (data/ itself)
        raise FileNotFoundError(f"data folder {data_dir!r} holds no shards but prepared data folder"
                                f"{'s' * (len(prepared) > 1)} of its own: pass one, --data_dir="
                                + " or ".join(os.path.join(data_dir, n) for n in prepared[:3])
                                + (", ..." if len(prepared) > 3 else ""))
    if names and not any(n.endswith(".bin") or OUR_FILE.fullmatch(n) for n in names):    # a corpus, not shards
        out = os.path.join("data", os.path.basename(os.path.normpath(data_dir)))
        out += "_tokens" if os.path.realpath(out) == os.path.realpath(data_dir) else ""
        raise FileNotFoundError(f"data folder {data_dir!r} holds no shards but {len(names)} other "
                                f"file{'s' * (len(names) > 1)} "
                                f"({', '.join(sorted(names)[:3])}{', ...' if len(names) > 3 else ''}): if it is a "
                                f"corpus, prepare it with `python data.py --input {data_dir} --out {out}{tok}`, "
                                f"then pass --data_dir={out}")
    if not paths:
        hint = " (prepared with --val_frac=0? then train with --eval_tokens=0)" if split == "val" else \
            (f": prepare it with `python data.py --input CORPUS --out {data_dir}{tok}` "
             "(an interrupted preparation leaves none)")
        raise FileNotFoundError(f"no {split}_*.bin shards in {data_dir}{hint}")
    return paths


# what names the tokens a folder holds (data.py's meta.json): another value of one is other data. Not how the input
# was named or read (input, encoding, text_field, max_tokens): the same corpus given as ./corpus or /abs/corpus, or
# re-prepared on another machine, holds the same tokens, and another corpus, cut or field shows in the counts
DATA_IDENTITY = ("tokenizer", "vocab_size", "val_frac", "seed", "train_tokens", "val_tokens", "train_docs", "val_docs")


def other_data(saved, meta):
    """["key old -> new"] for each key of DATA_IDENTITY where `meta` (a folder's) is not the data of `saved` (the
    meta a checkpoint keeps): a folder prepared again, from another input or with other settings. Keys one of them
    lacks (foreign shards, an older meta.json) are not compared."""
    return [f"{k} {saved[k]!r} -> {meta[k]!r}" for k in DATA_IDENTITY
            if k in saved and k in meta and saved[k] != meta[k]]


def load_meta(data_dir, verbose=True):
    """meta.json of a prepared folder, with "foreign": True for a folder of foreign shards (none named
    like ours, train_000000.bin), which needs no meta.json: without one its tokens are GPT-2's.
    Raises FileNotFoundError for a folder without train shards; ValueError for shards of ours without
    meta.json (an interrupted preparation), or a corrupt, incomplete or older-format meta.json."""
    data_dir = str(data_dir)
    find_shards(data_dir, "train")     # a missing folder is an error before any guessing
    path = os.path.join(data_dir, "meta.json")
    shards = sorted(n for n in os.listdir(data_dir) if n.endswith(".bin"))
    ours = [n for n in shards if OUR_SHARD.fullmatch(n)]
    again = f"prepare the folder again: python data.py --input CORPUS --out {data_dir}{tokenizer_flag(data_dir)}"
    if not os.path.exists(path):
        if ours:
            raise ValueError(f"{data_dir} holds shards ({ours[0]}, ...) but no meta.json: their preparation "
                             f"did not finish; {again}")
        if "train.bin" in shards:
            return nanogpt_meta(data_dir, verbose)
        if verbose:
            print(f"note: {data_dir} has no meta.json; assuming GPT-2 tokens (as llm.c's FineWeb shards)")
        return {"tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256, "foreign": True}
    try:
        with open(path) as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); {again}") from e
    missing = [k for k in ("tokenizer", "vocab_size", "eot_id") if k not in meta] if isinstance(meta, dict) else \
        ["all keys"]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}; {again}")
    if meta["tokenizer"] not in ("byte", "gpt2") or type(meta["vocab_size"]) is not int \
            or type(meta["eot_id"]) is not int or not 0 <= meta["eot_id"] < meta["vocab_size"]:
        raise ValueError(f"{path} has tokenizer {meta['tokenizer']!r}, vocab_size {meta['vocab_size']!r}, eot_id "
                         f"{meta['eot_id']!r}: expected byte or gpt2 and integers with eot_id < vocab_size; {again}")
    if "input" in meta:              # the command that made it, for the messages below
        given = "" if str(meta["input"]).startswith("python stdlib") else f" --input {meta['input']}"
        again = f"prepare the folder again: python data.py{given} --out {data_dir} --tokenizer {meta['tokenizer']}"
    meta["foreign"] = not ours
    if ours:
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path} is format {meta.get('format', 1)} (1: end-of-text after each document, from an "
                             f"older data.py); this one reads format {FORMAT} (end-of-text before each document): "
                             f"{again}")
        listed = meta.get("shards")
        listed = sorted(listed.get("train", []) + listed.get("val", [])) if isinstance(listed, dict) else None
        if listed != shards:
            odd = sorted(set(listed or []) ^ set(shards))
            raise ValueError(f"{path} does not list the shards in the folder "
                             f"({', '.join(odd[:3]) or 'no shard list'}); {again}")
    return meta


# numpy's numbers: a prepare.py that computed vocab_size with numpy (ids.max() + 1) pickles a numpy int, which
# numpy rebuilds from its dtype and bytes, running no other code (numpy.core before numpy 2, numpy._core since)
NUMPY_NUMBERS = {("numpy", "dtype"), ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}


class _PlainUnpickler(pickle.Unpickler):
    """pickle's reader for data only: dicts, strings and numbers (numpy's too) load, no other class or function
    (a pickle that names one could run code)."""

    def find_class(self, module, name):
        if (module, name) in NUMPY_NUMBERS:
            return np.dtype if name == "dtype" else getattr(getattr(np, "_core", None) or np.core, "multiarray").scalar
        raise pickle.UnpicklingError(f"it names {module}.{name}, and nanoGPT's meta.pkl holds plain dicts")


def nanogpt_meta(data_dir, verbose=True):
    """The tokenizer metadata of nanoGPT's folder `data_dir` (train.bin, val.bin): from meta.pkl, a character
    vocabulary ({"tokenizer": "char", "chars": [each id's character], "eot_id": -1: none}), or for a vocab_size
    alone ids whose text is unknown ({"tokenizer": "ids"}: they train, but give no bits per byte and no samples);
    else GPT-2's (as nanoGPT's openwebtext and shakespeare). Says in one line which, and what it means for document
    boundaries. Raises ValueError for a meta.pkl that is not nanoGPT's."""
    path = os.path.join(data_dir, NANOGPT_VOCAB)
    if not os.path.isfile(path):
        if verbose:
            print(f"note: {data_dir} is nanoGPT's (train.bin, val.bin, no meta.pkl): GPT-2 tokens; no document "
                  "boundaries are stored, so documents are split at end-of-text (50256) for the document mask")
        return {"tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256, "foreign": True}
    try:
        with open(path, "rb") as f:
            vocab = _PlainUnpickler(f).load()
        size = operator.index(vocab["vocab_size"])
        # nanoGPT's train.py reads vocab_size alone, so a meta.pkl of nothing else (another tokenizer's ids) trains
        chars = [vocab["itos"][i] for i in range(size)] if "itos" in vocab else None
        if chars is not None and not all(type(c) is str for c in chars):
            raise TypeError("itos maps ids to something else than strings")
    except Exception as e:       # unreadable, another pickle, a vocabulary with gaps
        raise ValueError(f"{path} is not nanoGPT's character vocabulary ({{'vocab_size', 'itos', 'stoi'}}: "
                         f"{type(e).__name__}: {e}): prepare the folder again with its prepare.py") from None
    if chars is None:
        if verbose:
            print(f"note: {data_dir} is nanoGPT's (train.bin, val.bin, meta.pkl: a vocab_size of {size} and no itos): "
                  "ids whose text is unknown, so no bits per byte, HellaSwag or samples; no document boundaries are "
                  "known (no end-of-text token), so each row is one stretch of tokens. GPT-2's tokens? Move meta.pkl "
                  "away: a folder without one is GPT-2's, with its text")
        return {"tokenizer": "ids", "vocab_size": size, "eot_id": -1, "foreign": True}
    if verbose:
        print(f"note: {data_dir} is nanoGPT's (train.bin, val.bin, meta.pkl: {size} characters): no document "
              "boundaries are known (no end-of-text token), so each row is one stretch of text")
    return {"tokenizer": "char", "vocab_size": size, "eot_id": -1, "chars": chars, "foreign": True}
