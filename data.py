"""
Pre-tokenised, memory-mapped data for speedgpt: prepare a corpus once into binary shards, then stream
(x, y, doc_ids) batches from them.

    python data.py                                   # the Python stdlib sources, byte tokenizer
    python data.py --input corpus/ --out data/mine --tokenizer gpt2
    python data.py --input fineweb/ --out data/fineweb --tokenizer gpt2 --max_tokens 1000000000

speedgpt/corpus.py reads the inputs lazily (folders, text, .jsonl(.gz/.zst), .parquet, Hugging Face datasets)
and tokenises them in worker processes; shards are written as they fill, in bounded memory.

Convention (meta.json "format": 2): every document is stored as [EOT, its tokens...]: the end-of-text
id doubles as the beginning-of-document token (BOS), as in GPT-2 practice, nanochat and llm.c's FineWeb
shards. The BOS belongs to the document it starts, so a document's first token is a target, predicted
from its own BOS; its last token has the next document's BOS as target, always the same id, so the
model learns to end documents and learns nothing of the next one (a split's token stream ends with
one virtual EOT, so its last document ends the same way). doc_ids start a new document at each BOS:
under the document mask no attention or position crosses documents. sample.py starts from one BOS.

Shard format (speedgpt/shards.py; llm.c / modded-nanogpt): a header of 256 int32, then uint16 or uint32
tokens; beside each shard its index (token count, largest id, offset of each BOS), written at
preparation so a loader starts without reading shards; meta.json, written last, lists the shards.
Foreign shards (llm.c's fineweb_train_000001.bin: GPT-2 tokens with EOT before each document, which
is this convention) load as they are, without meta.json: each is scanned once, on first use, and its
index saved beside it when the folder is writable; so do nanoGPT's train.bin / val.bin (and meta.pkl).
"""
from __future__ import annotations   # torch.Tensor annotations without importing torch

import contextlib
import itertools
import json
import os
import random
import signal
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Optional

import numpy as np

from configurator import FlagParser, seed as seed_type
from speedgpt import corpus
from speedgpt.corpus import ByteTokenizer, GPT2Tokenizer, get_tokenizer   # noqa: F401 (data.get_tokenizer is public)
from speedgpt.corpus import interrupt_signal, sigterm_as_interrupt, token_bytes
from speedgpt.shards import (FORMAT, HEADER_BYTES, HEADER_INTS, MAGIC, SHARD_TOKENS,  # noqa: F401 (data.X is public)
                             TOKEN_BYTES, DataError, ShardWriter, describe_os_error, find_shards, index_path,
                             index_tmp_path, load_meta, prepared_folder, read_header, read_index, read_shard,
                             signals_held, write_index, write_shard)

# -----------------------------------------------------------------------------
# preparation

ONLY_EMPTY = "input {source} holds only empty documents: nothing to tokenize; point --input at text"
ONE_DOCUMENT = ("input {source} has 1 document: a train/val split needs at least 2 (a document is a file of a folder, "
                "a line of .jsonl): split it into files in a folder, or prepare it without validation, --val_frac=0")


# below this many tokens a shard, data.py's command line warns (a corpus of billions would be thousands of files)
SMALL_SHARD = 1_000_000


def prepare(input_path, out_dir, tokenizer="byte", val_frac=0.05, seed=1337, workers=None,
            shard_tokens=SHARD_TOKENS, text_field="text", max_tokens=None, encoding="utf-8"):
    """Tokenise the documents of `input_path` (corpus.iter_texts: a folder, a text, JSON lines, JSON or
    parquet file, a Hugging Face dataset, None for this Python's stdlib) in `workers` processes (default:
    one per CPU) and write them to `out_dir` in shards of `shard_tokens` tokens as they fill, then
    meta.json. The folder is prepared beside out_dir and replaces it only when whole (shards.prepared_folder):
    a failure or Ctrl-C leaves an existing out_dir as it was. Each document goes to val with probability
    `val_frac` drawn from `seed` in input order (each split gets one at least), unless the corpus has its
    own validation split: the same shards for a given input and seed, with any number of workers. Memory
    is bounded whatever the corpus size (a few chunks of text in flight; one document is held whole).
    Stops after the document that reaches `max_tokens`; skips empty documents, and binary files in a
    folder (named). Text is decoded per `encoding` (corpus.parse_encoding: undecodable bytes refused, or
    with ":replace" counted in meta.json's replaced_chars). Returns the meta dict. Raises FileNotFoundError /
    ValueError for a missing or unusable input or output, OSError for a disk that cannot be written."""
    from tqdm import tqdm
    tok = get_tokenizer(tokenizer)   # fail here, not inside a worker, when it is unavailable
    if not 0 <= val_frac < 1:
        raise ValueError(f"val_frac must be in [0, 1), got {val_frac}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
    if shard_tokens >= 2**31:      # else a shard that fills up fails to write its header, billions of tokens in
        raise ValueError(f"shard_tokens must be below 2^31 (a shard's header holds its count as an int32, as llm.c "
                         f"reads it), got {shard_tokens:,}: leave it out for 100M tokens a shard")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens} (leave it out for the whole input)")
    input_path, out_dir, workers = (None if input_path is None else str(input_path), str(out_dir),
                                    workers or os.cpu_count())
    source = input_path or f"python stdlib ({corpus.stdlib_path()})"
    if input_path is not None and os.path.realpath(input_path) == os.path.realpath(out_dir):
        raise ValueError(f"--out {out_dir} is the input folder: write the shards elsewhere (a prepared folder "
                         "inside an input folder is skipped, never read as documents)")
    if input_path is None and encoding != "utf-8":
        raise ValueError(f"--encoding={encoding} is for --input: the stdlib sources are read as utf-8:replace")
    if text_field != "text" and not corpus.holds_records(input_path):
        raise ValueError(f"--text_field={text_field} names the field of JSON lines, Parquet or a Hugging Face "
                         f"dataset: {source} holds plain text alone, one document per file; leave --text_field out")
    report = corpus.Report(encoding=encoding)
    docs = corpus.iter_texts(input_path, text_field, report)
    first = next(docs, None)         # a bad input fails here, before out_dir is touched
    if first is None:
        raise ValueError(f"input {source} holds no document" + (f" ({len(report.binary)} binary files skipped)"
                                                                  if report.binary else "")
                         + "".join(f"; {note}" for note in report.all_notes()))
    peeked, texts = [first], [first] if first.text else []     # up to the second non-empty document, so that
    while len(texts) < 2:            # an input of one (or none) says so before tokenizing; empties are skipped
        doc = next(docs, None)
        if doc is None:
            break
        peeked.append(doc)
        texts += [doc] if doc.text else []
    if not texts:
        raise ValueError(ONLY_EMPTY.format(source=source))
    if len(texts) == 1 and val_frac > 0 and texts[0].split is None:
        raise ValueError(ONE_DOCUMENT.format(source=source))
    docs = itertools.chain(peeked[1:], docs)
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    rng, held, total, empty = random.Random(seed), None, 0, 0
    with prepared_folder(out_dir) as tmp, corpus.TokenizerPool(tokenizer, dtype, workers) as pool:
        writers = {s: ShardWriter(tmp, s, shard_tokens, dtype, tok.eot) for s in ("train", "val")}
        with contextlib.ExitStack() as closing:
            with signals_held():    # a Ctrl-C inside tqdm's __init__ leaves a half-built bar: its __del__ raises
                bar = closing.enter_context(tqdm(total=max_tokens, unit="tok", unit_scale=True,
                                                 desc=f"tokenizing ({tokenizer}, {workers} workers)"))
            for tokens, lengths, n_empty, splits in pool.tokenize(itertools.chain([first], docs)):
                empty += n_empty
                ends = np.cumsum(lengths)
                for start, end, split in zip(ends - lengths, ends, splits):
                    total += end - start
                    if split is not None:       # the corpus's own split
                        writers[split].add(tokens[start:end])
                    else:                       # one document held back: the last one makes sure of a val split
                        if held is not None:
                            writers["val" if rng.random() < val_frac else "train"].add(held)
                        held = tokens[start:end]
                    if max_tokens is not None and total >= max_tokens:
                        break
                if max_tokens is not None and total > max_tokens:
                    bar.total = total       # the document that reached max_tokens ran past it: 100%, not 101%
                bar.update(total - bar.n)
                bar.set_postfix(docs=writers["train"].docs + writers["val"].docs + (held is not None), refresh=False)
                if max_tokens is not None and total >= max_tokens:
                    break
        if held is None and writers["train"].docs == 0:
            raise ValueError(ONLY_EMPTY.format(source=source))
        if held is not None:
            if val_frac > 0 and writers["train"].docs + writers["val"].docs == 0:   # max_tokens cut the second
                raise ValueError(f"--max_tokens {max_tokens} ends input {source} inside its first document: a "
                                 "train/val split needs 2; raise --max_tokens, or prepare it with --val_frac=0")
            is_val = rng.random() < val_frac         # the last document: each split gets one at least
            if val_frac > 0 and writers["val"].docs == 0:
                is_val = True
            elif writers["train"].docs == 0:
                is_val = False
            writers["val" if is_val else "train"].add(held)
        for w in writers.values():
            w.close()
        meta = {"tokenizer": tok.name, "vocab_size": tok.vocab_size, "eot_id": tok.eot, "format": FORMAT,
                "input": source, "text_field": text_field, "val_frac": val_frac, "seed": seed, "max_tokens": max_tokens,
                "shards": {s: w.names for s, w in writers.items()}, "empty_docs_skipped": empty,
                "binary_files_skipped": len(report.binary), "encoding": report.encoding,
                "replaced_chars": report.replaced,
                **{f"{s}_{k}": getattr(w, k) for s, w in writers.items() for k in ("tokens", "docs")}}
        np.save(os.path.join(tmp, TOKEN_BYTES), tok.token_bytes().astype(np.uint16))   # no tokenizer files to train
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
    for note in report.all_notes():
        print(f"note: {note}")
    if report.binary:
        print(f"skipped {len(report.binary)} binary files (a NUL byte in their first bytes: not text): "
              + ", ".join(report.binary[:5]) + (", ..." if len(report.binary) > 5 else ""))
    print(f"wrote {out_dir}: train {meta['train_tokens']:,} tokens in {meta['train_docs']} docs, "
          f"val {meta['val_tokens']:,} tokens in {meta['val_docs']} docs"
          + (f" ({empty} empty documents skipped)" if empty else ""))
    if meta["val_docs"] == 1:
        print(f"note: the val split is one document ({meta['val_tokens']:,} tokens): its loss measures that document "
              "alone; a larger --val_frac (or more documents) makes it a sample of the corpus")
    return meta


KEPT_ON_RESUME = ("data_dir", "packing", "document_mask")    # a resumed loader's position is a position in them


def check(cfg, proc=None):
    """train.py's check, before any work: raise FileNotFoundError (the way out named) when cfg.data_dir holds no
    training shards (find_shards), unless it is a stdlib corpus, which train.py prepares on first use; for
    data/stdlib_gpt2 still unprepared, when GPT-2's tokenizer files cannot be had (offline). Returns cfg."""
    name = os.path.basename(str(cfg.data_dir).rstrip("/"))
    if name not in ("stdlib_byte", "stdlib_gpt2"):
        find_shards(cfg.data_dir, "train")
    elif name == "stdlib_gpt2" and not os.path.isfile(os.path.join(cfg.data_dir, "meta.json")):
        get_tokenizer("gpt2")
    return cfg

# -----------------------------------------------------------------------------
# loading

class Batch(NamedTuple):
    x: torch.Tensor        # (B, T) int64 input tokens
    y: torch.Tensor        # (B, T) int64 targets; -1 = no target (padding)
    n_valid: int           # number of targets != -1: the real tokens of this batch
    # with the document mask (packing and document_mask) only, else None: what the model's mask needs
    doc_ids: Optional[torch.Tensor] = None        # (B, T) int64 index of each token's document in its row, from 0
    cu_seqlens: Optional[torch.Tensor] = None     # (L,) int32 document offsets in the flattened batch (varlen)
    position_ids: Optional[torch.Tensor] = None   # (B, T) int64 position of each token within its document

# -----------------------------------------------------------------------------
# varlen attention metadata, built in the loader's thread (numpy), not in the model's forward

VARLEN_MAX_SEQS = 65535      # CUDA's grid limit in y and z, where FlashAttention-2's kernels put the sequence


def varlen_metadata(doc_ids, max_docs=None):
    """doc_ids (B, T) int -> cu_seqlens (n + 1,) int32 and position_ids (B, T) int64, for the n runs of
    equal doc_ids (each one sequence; a row's start always opens one, so no sequence spans two rows):
    cu_seqlens holds the flattened offset of each sequence, then B*T. Its length changes per batch: the
    loader marks it dynamic, so torch.compile compiles once for every length. position_ids restart at 0 at each sequence
    start (model.position_ids' rule). Raises ValueError past max_docs sequences (VARLEN_MAX_SEQS, the varlen kernels'
    limit, where attention='varlen' runs; no limit elsewhere)."""
    B, T = doc_ids.shape
    start = np.ones((B, T), dtype=bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    offsets = np.flatnonzero(start)                                  # ascending flattened starts
    if max_docs is not None and len(offsets) > max_docs:
        raise ValueError(f"a batch of {len(offsets):,} documents exceeds the {max_docs:,} sequences a "
                         "FlashAttention varlen call can take: lower batch_size, or use attention='flex'")
    cu_seqlens = np.append(offsets, B * T).astype(np.int32)
    t = np.arange(T)
    position_ids = t - np.maximum.accumulate(np.where(start, t, 0), axis=1)
    return cu_seqlens, position_ids


def doc_ids_from_tokens(x, eot):
    """(B, T) index of each token's document within its row, from 0: a new document starts at each
    EOT (the BOS convention), and a row that starts mid-document starts with document 0. numpy in, numpy out."""
    ids = np.cumsum(x == eot, axis=1)
    return ids - ids[:, :1]


class Loader:
    """Batches (x, y and, with the document mask, doc_ids) of shape (B, T) from the shards of one split:
    every row once per epoch.

    The split's shards end to end are one token stream, followed by one virtual EOT (the BOS of a next
    document). Its rows, with targets one token further on:
    packing=True: the consecutive block_size windows of the stream (the last < T tokens are never
    read). Documents run across rows; a row starting mid-document starts with that piece at position
    0. doc_ids start a new document at each BOS (doc_ids_from_tokens).
    packing=False: each document cut into block_size pieces, one per row, padded with targets -1: the
    baseline that wastes compute on padding.
    No target is -1 but padding's (see the convention above). The document mask is on with packing and
    `document_mask` both: batches then carry doc_ids, and varlen_metadata's cu_seqlens and position_ids,
    built here in the loader's thread rather than in the step; without it they are None and the model
    attends causally across the whole row. max_docs: the most documents a batch may hold (train.py gives
    VARLEN_MAX_SEQS where attention='varlen' runs), else no limit.

    Without replacement: epoch e visits every row once, in the order np.random.default_rng([seed, e])
    .permutation(n_rows), a fresh order each epoch. All ranks walk one global sequence of rows: each
    call takes the next world_size * B rows, of which rank r keeps [r*B, (r+1)*B), so no two ranks
    read the same row and the rows of an optimizer step are the same for any world size with the same
    global batch. state_dict() is the position in that sequence: a resumed run continues exactly.

    Start-up reads each shard's header and index, never its tokens (read_index). Shards are memory-mapped
    afresh for each batch (a long-lived np.memmap keeps every page it touched resident). The next
    `prefetch` batches are built in a background thread, in pinned memory, and copied non-blocking.
    Raises FileNotFoundError / ValueError for missing, corrupt, incomplete or too-short shards, and for
    a shard holding an id >= vocab_size (when given), naming the shard."""

    def __init__(self, data_dir, split, batch_size, block_size, device="cpu", seed=0,
                 packing=True, document_mask=True, eot=None, rank=0, world_size=1, vocab_size=None,
                 prefetch=2, max_docs=None):
        meta = load_meta(data_dir, verbose=eot is None)
        self.paths = find_shards(data_dir, split)
        self.eot = meta["eot_id"] if eot is None else eot
        if not packing and self.eot < 0:          # nanoGPT's characters (shards.nanogpt_meta)
            raise ValueError(f"{data_dir} has no end-of-text token, so no documents to pad one per row: keep "
                             "packing on")
        import torch      # here, not at the top: data.py prepares a corpus without loading torch
        self.B, self.T, self.device = batch_size, block_size, torch.device(device)
        self.packing, self.document_mask = packing, packing and document_mask
        self.vocab_size, self.split, self.data_dir, self.max_docs = vocab_size, split, data_dir, max_docs
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if type(seed) is not int or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if type(prefetch) is not int or prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1 (batches built ahead), got {prefetch!r}")
        self.rank, self.world_size, self.seed, self._initial_seed, self._prefetch = \
            rank, world_size, seed, seed, prefetch
        sizes = [read_header(p)[0] for p in self.paths]
        # where each shard starts in the stream
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if meta["foreign"] and not all(os.path.isfile(index_path(p)) for p in self.paths):
            print(f"note: indexing the foreign {split} shards of {data_dir} (once: the index is saved beside them)")
        index = [read_index(p, n, self.eot, meta["foreign"], with_starts=not packing)
                 for p, n in zip(self.paths, sizes)]
        # the file that set the vocabulary, named in the refusal: nanoGPT's folders have meta.pkl or none (GPT-2's)
        said = "meta.pkl" if meta["tokenizer"] in ("char", "ids") else "meta.json" \
            if os.path.isfile(os.path.join(data_dir, "meta.json")) else None
        for p, (max_id, _) in zip(self.paths, index):
            if vocab_size is not None and max_id >= vocab_size:
                raise ValueError(f"shard {p} holds token id {max_id}, outside the vocabulary ({vocab_size} ids "
                                 + (f"in {said}): shards and {said} disagree" if said else
                                    "of GPT-2's, assumed for a folder without meta.json or nanoGPT's meta.pkl): its "
                                    "tokens are another tokenizer's; prepare it with data.py"))
        n = int(self.offsets[-1])
        if packing:
            self.n_rows = n // block_size
        else:                    # pieces: piece i of document d starts at doc_starts[d] + (i - piece_starts[d]) * T
            starts = np.concatenate([o + s for o, (_, s) in zip(self.offsets, index)])
            if len(starts) == 0 or starts[0] != 0:     # a stream starting mid-document (foreign shards)
                starts = np.insert(starts, 0, 0)
            self.doc_starts = starts
            self.doc_ends = np.append(self.doc_starts[1:], n)
            pieces = -(-(self.doc_ends - self.doc_starts) // block_size)
            self.piece_ends = np.cumsum(pieces)
            self.piece_starts = self.piece_ends - pieces
            self.n_rows = int(self.piece_ends[-1])
        if self.n_rows == 0:
            val = ", or --eval_tokens=0 (no evaluation)" if split == "val" else ""
            raise ValueError(f"{split} shards in {data_dir} hold {n} tokens, too few for one row of block_size "
                             f"{block_size}: a smaller --block_size, or more data (data.py's --input, --val_frac){val}")
        # An epoch shorter than a batch repeats rows within it (each epoch's order in turn): a valid batch, so a
        # note, not an error (a tiny corpus to overfit is a fair test). Train only: an evaluation gives the
        # rows past the val split no targets (train.py's estimate_loss).
        if split == "train" and rank == 0 and self.n_rows < world_size * batch_size:
            ranks = f" on each of {world_size} ranks" if world_size > 1 else ""
            print(f"note: the train split of {data_dir} holds {self.n_rows:,} rows of block_size={block_size}, fewer "
                  f"than the {world_size * batch_size:,} of one batch (batch_size={batch_size}{ranks}): each batch "
                  "repeats rows; more data, or a smaller batch_size or block_size, avoids it")
        self._orders = {}
        self._pool = ThreadPoolExecutor(1)     # one worker: batches are built in order
        self._pin = self.device.type == "cuda"
        self._futures = deque()
        self.reset()

    def _order(self, seed, epoch):
        """The rows of `epoch` in their shuffled order (two epochs cached: a batch may straddle them)."""
        if (seed, epoch) not in self._orders:
            self._orders = {k: v for k, v in self._orders.items() if k == (seed, epoch - 1)}
            self._orders[seed, epoch] = np.random.default_rng([seed, epoch]).permutation(self.n_rows)
        return self._orders[seed, epoch]

    def _read(self, a, b, maps):
        """Tokens [a, b) of the stream as int64 (past its end: the virtual EOT)."""
        out = np.full(b - a, self.eot, dtype=np.int64)
        s = int(np.searchsorted(self.offsets, a, side="right")) - 1
        pos = a
        while pos < b and s < len(self.paths):
            lo, hi = pos - self.offsets[s], min(b, self.offsets[s + 1]) - self.offsets[s]
            toks = maps[s] if s in maps else maps.setdefault(s, read_shard(self.paths[s]))
            out[pos - a:pos - a + hi - lo] = toks[lo:hi]
            pos, s = self.offsets[s] + hi, s + 1
        return out

    def _produce(self, seed, first):
        """This rank's batch at position `first` of the global sequence of rows."""
        B, T = self.B, self.T
        x = np.full((B, T), self.eot, dtype=np.int64)
        y = np.full((B, T), -1, dtype=np.int64)
        maps = {}
        epochs, rows = np.divmod(np.arange(first + self.rank * B, first + (self.rank + 1) * B), self.n_rows)
        for b, (e, i) in enumerate(zip(epochs, rows)):
            r = int(self._order(seed, int(e))[i])
            if self.packing:
                start, n = r * T, T
            else:
                d = int(np.searchsorted(self.piece_ends, r, side="right"))
                start = int(self.doc_starts[d] + (r - self.piece_starts[d]) * T)
                n = min(T, int(self.doc_ends[d]) - start)
            row = self._read(start, start + n + 1, maps)
            x[b, :n], y[b, :n] = row[:-1], row[1:]
        del maps                                                     # unmap: nothing stays resident
        top = max(int(x.max()), int(y.max()))             # the index said no id >= vocab_size: a changed shard
        if self.vocab_size is not None and top >= self.vocab_size:
            raise DataError(f"a {self.split} batch of {self.data_dir} holds token id {top}, outside the vocabulary "
                             f"({self.vocab_size} ids): a shard changed after its index was written; "
                             "prepare the data again")
        import torch
        tensors = [torch.from_numpy(a) for a in (x, y)]
        if self.document_mask:             # doc_ids, varlen cu_seqlens and positions: here, not in the step
            doc_ids = doc_ids_from_tokens(x, self.eot)
            tensors += [torch.from_numpy(a) for a in (doc_ids, *varlen_metadata(doc_ids, self.max_docs))]
        if self._pin:
            tensors = [t.pin_memory() for t in tensors]
        return tensors, int((y != -1).sum())

    def __iter__(self):
        return self

    def __next__(self):
        """The next Batch, on the loader's device."""
        batch = self.peek()
        self._futures.popleft()
        self._row += self.world_size * self.B      # the position of the batch after this one
        self._submit()
        return batch

    def peek(self):
        """The Batch the next call of next() returns, without moving on (FP8's calibration looks at it first)."""
        import torch
        tensors, n_valid = self._futures[0].result()
        x, y, *mask = (t.to(self.device, non_blocking=True) for t in tensors)
        if mask:                # cu_seqlens' length changes per batch: compiled once, with that length dynamic
            torch._dynamo.maybe_mark_dynamic(mask[1], 0)
        return Batch(x, y, n_valid, *mask)

    def _submit(self):
        self._futures.append(self._pool.submit(self._produce, self.seed, self._ahead))
        self._ahead += self.world_size * self.B

    def state_dict(self):
        """The sampler state to put in a checkpoint: the batches after it are the ones still to come."""
        return {"seed": self.seed, "row": self._row, "rows_per_epoch": self.n_rows}

    def load_state_dict(self, state):
        """Continue from state_dict()'s state. Raises ValueError for a state of other data or of an
        older data.py (which sampled with replacement)."""
        if "row" not in state:
            raise ValueError("the loader state comes from an older data.py (rows drawn with replacement) and "
                             "cannot be continued exactly: start the run afresh")
        if state["rows_per_epoch"] != self.n_rows:
            raise ValueError(f"the loader state is for {state['rows_per_epoch']} rows an epoch, here {self.n_rows}: "
                             "resume on the same data_dir, block_size and packing, or start in another out_dir")
        while self._futures:                       # let the batches in flight finish, then discard them
            self._futures.popleft().result()
        self.seed, self._row = state["seed"], state["row"]
        self._ahead = self._row
        for _ in range(self._prefetch):
            self._submit()

    def reset(self):
        """Back to the first batch (eval uses the same batches every time, so its losses compare)."""
        self.load_state_dict({"seed": self._initial_seed, "row": 0, "rows_per_epoch": self.n_rows})

# -----------------------------------------------------------------------------

def main(argv=None):
    # FlagParser, as every other script: full flag names only (--max_token is no --max_tokens), one-line errors
    parser = FlagParser(prog="data.py", description="Tokenise a corpus into llm.c-format shards.")
    parser.add_argument("--input", default=None, help="a folder (recursive), a text, JSON lines, JSON or parquet file "
                        "(gzip or zstd too), a datasets save_to_disk folder or hf:NAME[:CONFIG]; default: this "
                        "Python's stdlib sources")
    parser.add_argument("--out", default=None, help="output folder (default: data/stdlib_<tokenizer>)")
    parser.add_argument("--tokenizer", default="byte", choices=["byte", "gpt2"])
    parser.add_argument("--text_field", default="text",
                        help="the document's field (JSON) or column (parquet, datasets)")
    parser.add_argument("--val_frac", type=float, default=0.05, help="share of the documents held out for val")
    parser.add_argument("--seed", type=seed_type, default=1337, help="which documents go to val (as train.py's seeds)")
    parser.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: one per CPU)")
    parser.add_argument("--shard_tokens", type=int, default=SHARD_TOKENS, help="tokens per .bin shard file")
    parser.add_argument("--max_tokens", type=int, default=None,
                        help="stop after the document that reaches this many tokens")
    parser.add_argument("--encoding", default="utf-8", help="of text and JSON inputs: a Python codec (latin-1, "
                        "cp1252, ...); add :replace to read bytes that do not decode as U+FFFD, counted")
    args = parser.parse_args(argv)
    if args.out == "":
        parser.error("--out is empty: give the folder the shards go to, e.g. --out data/mine")
    if args.out is None:
        if args.input is not None:
            parser.error("--out is required with --input: add --out FOLDER, where the shards go")
        args.out = f"data/stdlib_{args.tokenizer}"
    if 0 < args.shard_tokens < SMALL_SHARD:    # legal (tests use tiny shards) but a corpus becomes thousands of files
        print(f"warning: --shard_tokens={args.shard_tokens:,} writes a file every {args.shard_tokens:,} tokens, each "
              f"with a 1 KiB header; leave it out for {SHARD_TOKENS:,} tokens a shard", file=sys.stderr)
    try:
        with sigterm_as_interrupt():
            prepare(args.input, args.out, args.tokenizer, args.val_frac, args.seed, args.workers,
                    args.shard_tokens, args.text_field, args.max_tokens, args.encoding)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    except OSError as e:
        if e.errno is None:                        # our own FileNotFoundError (a missing input): its message says it
            raise SystemExit(f"error: {e}")
        # a write that failed (a full disk, the folder removed): the temp folder it was in is internal, not named
        raise SystemExit(f"error: cannot write the output folder {args.out}: {describe_os_error(e)}; "
                         f"{args.out} is as it was before; free space there, or choose another --out")
    except KeyboardInterrupt as e:                 # Ctrl-C, or SIGTERM through sigterm_as_interrupt
        signum = interrupt_signal(e)
        print(f"{'interrupted' if signum == signal.SIGINT else 'stopped (SIGTERM)'}: {args.out} is as it was before "
              "(a preparation replaces it only when whole); run the command again", file=sys.stderr)
        sys.exit(128 + signum)

if __name__ == "__main__":
    main()
