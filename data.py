"""
Pre-tokenised, memory-mapped data for speedgpt.

Prepare a corpus once into binary shards, then stream (x, y, doc_ids) batches from them:

    python data.py                                   # the Python stdlib sources, byte tokenizer
    python data.py --input corpus/ --out data/mine --tokenizer gpt2
    python data.py --input stories.jsonl --out data/stories --tokenizer gpt2

Shard format (llm.c / modded-nanogpt): a header of 256 int32 (magic 20240520, version, token
count), then the tokens. Version 1 stores uint16 tokens; version 2 stores uint32 for vocabularies
that do not fit in 16 bits. llm.c's FineWeb shards (version 1) load as they are.

Convention: every document is followed by one end-of-text token (EOT), which belongs to the
document it ends. In a packed row, doc_ids counts the EOTs before each position, so the EOT is the
last token of its document and the next token opens a new one.
"""
import argparse
import glob
import json
import os
import random
import sysconfig
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pool
from typing import NamedTuple, Optional

import numpy as np
import torch

MAGIC = 20240520
VERSION_DTYPE = {1: np.uint16, 2: np.uint32}
LLMC_LLAMA3 = (20240801, 7)   # llm.c's uint32 shards for Llama 3 tokens: readable too
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
SHARD_TOKENS = 100_000_000    # tokens per shard, as llm.c

# -----------------------------------------------------------------------------
# tokenizers

class ByteTokenizer:
    """UTF-8 bytes 0-255 plus end-of-text 256. Needs no download."""
    name, vocab_size, eot = "byte", 257, 256

    def encode(self, text):
        return list(text.encode("utf-8"))

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
# shards

def write_shard(path, tokens):
    """Write 1-D int `tokens` to `path` in the llm.c format: uint16 (version 1) when every id fits,
    else uint32 (version 2); never wraps. Written to a temp file and renamed."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**32):
        raise ValueError(f"{path}: token ids must lie in [0, 2^32)")
    version = 1 if (tokens.size == 0 or tokens.max() < 2**16) else 2
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = MAGIC, version, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(VERSION_DTYPE[version]).tobytes())
    os.replace(tmp, path)


def read_header(path):
    """Validate the shard at `path` and return (n_tokens, numpy dtype).
    Raises FileNotFoundError or ValueError naming the file and what is wrong."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"shard {path} does not exist")
    size = os.path.getsize(path)
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
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n,))


def find_shards(data_dir, split):
    """Sorted shard paths of `split` ("train" or "val") in `data_dir`: ours are train_000000.bin,
    llm.c's fineweb_train_000000.bin. Raises FileNotFoundError when there are none."""
    if not os.path.isdir(data_dir):
        what = "is a file, not a folder" if os.path.isfile(data_dir) else "does not exist"
        raise FileNotFoundError(f"data folder {data_dir!r} {what}: prepare it with "
                                f"`python data.py --input PATH --out {data_dir}`")
    paths = sorted(glob.glob(os.path.join(data_dir, f"*{split}_*.bin")))
    if not paths:
        raise FileNotFoundError(f"no {split}_*.bin shards in {data_dir}")
    return paths


def load_meta(data_dir):
    """meta.json of a prepared folder; shards without one (llm.c, modded-nanogpt FineWeb) are GPT-2.
    Raises FileNotFoundError for a folder without train shards, ValueError for a corrupt meta.json."""
    path = os.path.join(data_dir, "meta.json")
    find_shards(data_dir, "train")     # a missing folder is an error before any guessing
    if not os.path.exists(path):
        print(f"note: {data_dir} has no meta.json; assuming GPT-2 tokens (as llm.c's FineWeb shards)")
        return {"tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    try:
        with open(path) as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); prepare the folder again with data.py") from e
    missing = [k for k in ("tokenizer", "vocab_size", "eot_id") if k not in meta] if isinstance(meta, dict) else ["all keys"]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}; prepare the folder again with data.py")
    return meta

# -----------------------------------------------------------------------------
# preparation

def stdlib_path():
    return sysconfig.get_paths()["stdlib"]


def iter_documents(path):
    """Yield the documents of `path`: ("file", p) for each file under a folder (recursive, sorted)
    or for a single file; ("text", s) for each line's "text" field of a .jsonl file. `path=None`
    means the embedded default corpus: this Python's standard library, each .py file one document.
    Raises FileNotFoundError for a missing path, ValueError for a malformed .jsonl line."""
    if path is None:
        for r, dirs, files in os.walk(stdlib_path()):
            dirs[:] = sorted(d for d in dirs if d != "site-packages")   # walk in a fixed order
            for name in sorted(files):
                if name.endswith(".py"):
                    yield ("file", os.path.join(r, name))
    elif os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if not name.startswith("."):
                    yield ("file", os.path.join(root, name))
    elif path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        text = json.loads(line)["text"]
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        raise ValueError(f"{path}:{lineno}: expected a JSON object with a 'text' field ({e!r})")
                    if not isinstance(text, str):
                        raise ValueError(f"{path}:{lineno}: 'text' must be a string, got {type(text).__name__}")
                    yield ("text", text)
    elif os.path.isfile(path):
        yield ("file", path)
    else:
        raise FileNotFoundError(f"input {path} does not exist")


_worker_tok = None

def _init_worker(name):
    global _worker_tok
    _worker_tok = get_tokenizer(name)


def _tokenize(doc):
    kind, value = doc
    if kind == "file":
        with open(value, encoding="utf-8", errors="replace") as f:
            value = f.read()
    ids = _worker_tok.encode(value)
    ids.append(_worker_tok.eot)
    return np.array(ids, dtype=np.uint32)


def prepare(input_path, out_dir, tokenizer="byte", val_frac=0.05, seed=1337, workers=None,
            shard_tokens=SHARD_TOKENS):
    """Tokenise every document of `input_path` (a folder, a .jsonl, a text file, or None for the
    stdlib sources) in parallel, split train/val by whole documents (each goes to val with
    probability `val_frac`, drawn from `seed`), and write shards plus meta.json to `out_dir`.
    Returns the meta dict. Raises FileNotFoundError / ValueError for a missing or unusable input."""
    from tqdm import tqdm
    tok = get_tokenizer(tokenizer)   # fail here, not inside a worker, when it is unavailable
    if not 0 <= val_frac < 1:
        raise ValueError(f"val_frac must be in [0, 1), got {val_frac}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"output {out_dir} exists and is not a folder")
    docs = list(iter_documents(input_path))
    source = input_path or f"python stdlib ({stdlib_path()})"
    if len(docs) < 2 and val_frac > 0:
        raise ValueError(f"input {source} has {len(docs)} document(s): a train/val split needs at least 2")
    rng = random.Random(seed)
    is_val = [rng.random() < val_frac for _ in docs]
    if val_frac > 0 and not any(is_val):
        is_val[-1] = True         # a val split always exists when one is asked for
    if all(is_val):
        is_val[0] = False
    os.makedirs(out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(out_dir, "*.bin")):
        os.remove(old)            # never mix shards of two preparations
    stats = {s: {"tokens": 0, "docs": 0, "shards": 0} for s in ("train", "val")}
    buf = {s: [] for s in stats}
    buffered = {s: 0 for s in stats}

    def flush(split, final=False):
        while buffered[split] >= shard_tokens or (final and buffered[split] > 0):
            toks = np.concatenate(buf[split])
            write_shard(os.path.join(out_dir, f"{split}_{stats[split]['shards']:06d}.bin"), toks[:shard_tokens])
            stats[split]["shards"] += 1
            buf[split] = [toks[shard_tokens:]]
            buffered[split] = len(buf[split][0])

    with Pool(workers or os.cpu_count(), initializer=_init_worker, initargs=(tokenizer,)) as pool:
        results = pool.imap(_tokenize, docs, chunksize=16)   # keeps document order: deterministic
        for ids, val in tqdm(zip(results, is_val), total=len(docs), desc=f"tokenizing ({tokenizer})", unit="doc"):
            split = "val" if val else "train"
            buf[split].append(ids)
            buffered[split] += len(ids)
            stats[split]["tokens"] += len(ids)
            stats[split]["docs"] += 1
            flush(split)
    for split in stats:
        flush(split, final=True)
    meta = {"tokenizer": tok.name, "vocab_size": tok.vocab_size, "eot_id": tok.eot, "input": source,
            "val_frac": val_frac, "seed": seed,
            **{f"{s}_{k}": v for s in stats for k, v in stats[s].items()}}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"wrote {out_dir}: train {stats['train']['tokens']:,} tokens in {stats['train']['docs']} docs, "
          f"val {stats['val']['tokens']:,} tokens in {stats['val']['docs']} docs")
    return meta

# -----------------------------------------------------------------------------
# loading

class Batch(NamedTuple):
    x: torch.Tensor        # (B, T) int64 input tokens
    y: torch.Tensor        # (B, T) int64 targets; -1 = no target (padding, or across a document boundary)
    doc_ids: torch.Tensor  # (B, T) int64 index of each token's document within its row, from 0
    n_valid: int           # number of targets != -1: the real tokens of this batch
    # with packing and the document mask only (else None), from varlen_metadata:
    cu_seqlens: Optional[torch.Tensor] = None     # (L,) int32 document offsets in the flattened batch, padded
    position_ids: Optional[torch.Tensor] = None   # (B, T) int64 position of each token within its document

# -----------------------------------------------------------------------------
# varlen attention metadata, built in the loader's thread (numpy), not in the model's forward

VARLEN_TOKENS_PER_DOC = 128  # cu_seqlens is sized for documents of this mean length; 0: exact (see varlen_capacity)
VARLEN_MAX_SEQS = 65535      # CUDA's grid limit in y and z, where FlashAttention-2's kernels put the sequence


def varlen_capacity(B, T, n_seqs=0):
    """The fixed length of a (B, T) batch's padded cu_seqlens: room for B*T // VARLEN_TOKENS_PER_DOC + B
    sequences (documents averaging VARLEN_TOKENS_PER_DOC tokens, each row cut once more), plus one: 577
    at B=64, T=1024, where the stdlib and stories corpora hold ~90-350. A fixed length keeps torch.compile
    from recompiling and CUDA graphs valid; each padding entry is an empty sequence, which costs the
    kernels launched-then-idle blocks, so the room is kept small (benchmarks/attention.py prices it). A
    batch of n_seqs > room doubles it until they fit (a new shape: one recompile), up to B*T.
    VARLEN_TOKENS_PER_DOC = 0: no padding, n_seqs + 1 (a new length each batch: torch.compile recompiles
    once with the length dynamic; CUDA graphs would re-record). Raises ValueError past VARLEN_MAX_SEQS."""
    if n_seqs > VARLEN_MAX_SEQS:
        raise ValueError(f"a batch of {n_seqs:,} documents exceeds the {VARLEN_MAX_SEQS:,} sequences a FlashAttention "
                         "varlen call can take: lower batch_size, or use attention='flex'")
    if VARLEN_TOKENS_PER_DOC == 0:
        return n_seqs + 1
    room = min(B * T // VARLEN_TOKENS_PER_DOC + B, B * T, VARLEN_MAX_SEQS)
    while room < n_seqs:
        room = min(2 * room, B * T, VARLEN_MAX_SEQS)
    return room + 1


def varlen_metadata(doc_ids):
    """doc_ids (B, T) int -> cu_seqlens (varlen_capacity(B, T, n),) int32 and position_ids (B, T) int64.
    Each run of equal doc_ids in a row is one sequence (a row's start always opens one, so no sequence
    spans two rows); cu_seqlens holds the flattened offset of each of the n sequences, then B*T repeated
    (empty sequences). position_ids restart at 0 at each sequence start (model.position_ids' rule)."""
    B, T = doc_ids.shape
    start = np.ones((B, T), dtype=bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    offsets = np.flatnonzero(start)                                  # ascending flattened starts
    cu_seqlens = np.full(varlen_capacity(B, T, len(offsets)), B * T, dtype=np.int32)
    cu_seqlens[:len(offsets)] = offsets
    t = np.arange(T)
    position_ids = t - np.maximum.accumulate(np.where(start, t, 0), axis=1)
    return cu_seqlens, position_ids


def doc_ids_from_tokens(x, eot):
    """(B, T) document index of each token within its row: the number of EOTs strictly before it,
    so an EOT is the last token of its document. numpy in, numpy out."""
    is_eot = (x == eot)
    return np.cumsum(is_eot, axis=1) - is_eot


class Loader:
    """Random (x, y, doc_ids) batches of shape (B, T) from the shards of one split.

    packing=True: each row is a window of the token stream at a random offset, so documents are
    joined by EOT and fill the row; with document_mask=True the target at each EOT (the next
    document's first token) is -1, so no loss target crosses a boundary.
    packing=False: each row holds one document, or one block_size piece of a longer one, padded
    with targets -1 (the baseline that wastes compute on padding).

    Offsets come from a torch.Generator seeded with `seed`; state_dict() returns its state before the
    next batch, so a resumed run sees the same batches. Under data parallelism every rank draws the
    same stream of world_size micro-batches per call and keeps micro-batch number `rank`: ranks
    read different data, and the rows of one optimizer step are the same for any world size. Shards are memory-mapped afresh for each
    batch (a long-lived np.memmap keeps every page it touched resident). The next `prefetch` batches
    are built in a background thread while the current ones train, in pinned memory, and copied
    non-blocking (train.py prefetches a whole optimizer step, so the GPU never waits for the loader).
    Raises FileNotFoundError / ValueError for missing, corrupt or too-short shards."""

    def __init__(self, data_dir, split, batch_size, block_size, device="cpu", seed=0,
                 packing=True, document_mask=True, eot=None, rank=0, world_size=1, vocab_size=None,
                 prefetch=2):
        self.paths = find_shards(data_dir, split)
        self.sizes = np.array([read_header(p)[0] for p in self.paths])
        self.B, self.T, self.device = batch_size, block_size, torch.device(device)
        self.packing, self.document_mask = packing, document_mask
        self.rank, self.world_size, self.vocab_size = rank, world_size, vocab_size
        self.eot = load_meta(data_dir)["eot_id"] if eot is None else eot
        if packing:
            self.windows = np.maximum(self.sizes - block_size, 0)   # valid start offsets per shard
            if self.windows.sum() == 0:
                raise ValueError(f"{split} shards in {data_dir} hold {self.sizes.max()} tokens at most: "
                                 f"too few for block_size {block_size} (need {block_size + 1})")
        else:
            self.pieces = self._index_pieces()
        self.gen = torch.Generator().manual_seed(seed)
        self._initial = self.gen.get_state()
        self._pool = ThreadPoolExecutor(1)     # one worker: batches are drawn in order, deterministically
        self._pin = self.device.type == "cuda"
        if type(prefetch) is not int or prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1 (batches built ahead), got {prefetch!r}")
        self._prefetch = prefetch
        self._futures = deque()
        self.load_state_dict({"rng": self._initial})

    def _index_pieces(self):
        """(n, 3) int64 array of (shard, start, length): each document cut into block_size pieces,
        where a piece's inputs are tokens [start, start+length) and its targets one further."""
        rows = []
        for s, path in enumerate(self.paths):
            toks = read_shard(path)
            ends = np.flatnonzero(toks == self.eot)                  # last target index of each doc
            if len(toks) and (len(ends) == 0 or ends[-1] != len(toks) - 1):
                ends = np.append(ends, len(toks) - 1)                # a document cut by the shard's end
            starts = np.concatenate([[0], ends[:-1] + 1])
            n_targets = ends - starts
            keep = n_targets > 0
            starts, n_targets = starts[keep], n_targets[keep]
            counts = -(-n_targets // self.T)
            first = np.repeat(starts, counts)
            j = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            p = first + j * self.T
            length = np.minimum(self.T, np.repeat(starts + n_targets, counts) - p)
            rows.append(np.stack([np.full_like(p, s), p, length], axis=1))
            del toks
        pieces = np.concatenate(rows) if rows else np.zeros((0, 3), dtype=np.int64)
        if len(pieces) == 0:
            raise ValueError(f"shards {self.paths} hold no document with a target")
        return pieces

    def _produce(self):
        B, T = self.B, self.T
        x = np.full((B, T), self.eot, dtype=np.int64)
        y = np.full((B, T), -1, dtype=np.int64)
        maps = {}
        if self.packing:
            weights = torch.from_numpy(self.windows.astype(np.float64))
            for i in range(B * self.world_size):   # row by row: 4 batches of 2 rows = 1 batch of 8
                s = torch.multinomial(weights, 1, generator=self.gen).item()
                off = torch.randint(int(self.windows[s]), (1,), generator=self.gen).item()
                b = i - self.rank * B
                if not 0 <= b < B:
                    continue                           # another rank's row
                toks = maps[s] if s in maps else maps.setdefault(s, read_shard(self.paths[s]))
                row = np.asarray(toks[off:off + T + 1], dtype=np.int64)
                x[b], y[b] = row[:-1], row[1:]
            doc_ids = doc_ids_from_tokens(x, self.eot)
            if self.document_mask:
                y[x == self.eot] = -1      # the EOT's target opens another document
        else:
            idx = [torch.randint(len(self.pieces), (1,), generator=self.gen).item() for _ in range(B * self.world_size)]
            idx = idx[self.rank * B:(self.rank + 1) * B]
            doc_ids = np.ones((B, T), dtype=np.int64)             # padding: a document of its own
            for b, (s, p, n) in enumerate(self.pieces[idx]):
                toks = maps[s] if s in maps else maps.setdefault(s, read_shard(self.paths[s]))
                row = np.asarray(toks[p:p + n + 1], dtype=np.int64)
                x[b, :n], y[b, :n], doc_ids[b, :n] = row[:-1], row[1:], 0
        del maps                                                  # unmap: nothing stays resident
        if self.vocab_size is not None and max(x.max(), y.max()) >= self.vocab_size:
            raise ValueError(f"token id {max(x.max(), y.max())} in the shards {self.paths} is outside the "
                             f"vocabulary ({self.vocab_size} ids in meta.json): shards and meta.json disagree")
        n_valid = int((y != -1).sum())
        state = self.gen.get_state()
        tensors = [torch.from_numpy(a) for a in (x, y, doc_ids)]
        if self.packing and self.document_mask:   # varlen cu_seqlens and positions: here, not in the step
            tensors += [torch.from_numpy(a) for a in varlen_metadata(doc_ids)]
        if self._pin:
            tensors = [t.pin_memory() for t in tensors]
        return tensors, n_valid, state

    def __iter__(self):
        return self

    def __next__(self):
        """The next Batch, on the loader's device."""
        tensors, n_valid, state = self._futures.popleft().result()
        self._state = state                        # generator state before the batch after this one
        self._futures.append(self._pool.submit(self._produce))
        x, y, doc_ids, *varlen = (t.to(self.device, non_blocking=True) for t in tensors)
        return Batch(x, y, doc_ids, n_valid, *varlen)

    def state_dict(self):
        """The sampler state to put in a checkpoint: the batches after it are the ones still to come."""
        return {"rng": self._state.clone()}

    def load_state_dict(self, state):
        while self._futures:                       # let the batches in flight finish, then discard them
            self._futures.popleft().result()
        self.gen.set_state(state["rng"])
        self._state = state["rng"]
        self._futures.extend(self._pool.submit(self._produce) for _ in range(self._prefetch))

    def reset(self):
        """Back to the first batch (eval uses the same batches every time, so its losses compare)."""
        self.load_state_dict({"rng": self._initial})

# -----------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description="Tokenise a corpus into llm.c-format shards.")
    parser.add_argument("--input", default=None, help="folder of text files (recursive), .jsonl with a "
                        "'text' field, or one text file; default: this Python's stdlib sources")
    parser.add_argument("--out", default=None, help="output folder (default: data/stdlib_<tokenizer>)")
    parser.add_argument("--tokenizer", default="byte", choices=["byte", "gpt2"])
    parser.add_argument("--val_frac", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    if args.out is None:
        if args.input is not None:
            parser.error("--out is required with --input")
        args.out = f"data/stdlib_{args.tokenizer}"
    try:
        prepare(args.input, args.out, args.tokenizer, args.val_frac, args.seed, args.workers)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}")


if __name__ == "__main__":
    main()
