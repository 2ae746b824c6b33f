"""
HellaSwag (Zellers et al. 2019, https://arxiv.org/abs/1905.07830) in the loop, completion style, as
llm.c's dev/data/hellaswag.py and karpathy's build-nanogpt score it: a quality number beside the loss.

Each example is a context and four endings, one of them right (its label). Each ending is scored as a
continuation of the context by the model's loss on the ending's tokens only: `acc_norm` (the headline)
picks the ending of lowest mean loss per token (the argmax of mean log-probability), `acc` the lowest
summed loss. Chance is 25%; OpenAI's GPT-2 124M scores about 29.5% acc_norm (docs/evaluation.md).

    hellaswag=on     score the validation set (10,042 examples) at every evaluation, downloaded on first use
    hellaswag=auto   on where the file is already there, else off, in one line that says why
    python eval.py --out_dir out-fast      # a checkpoint alone; --init_from gpt2 for OpenAI's weights

Rendering: context = tokenize(ctx), each ending = tokenize(" " + ending), each row context + ending,
with the run's tokenizer (speedgpt/corpus.py): GPT-2 BPE, or the byte tokenizer, which reads the same
text as its UTF-8 bytes (one token per byte), so a byte-level model is scored on the same task. No
end-of-text is put before the context (llm.c puts none), so GPT-2's numbers compare with llm.c's.

The file is HellaSwag's own jsonl (one example per line: ind, activity_label, ctx_a, ctx_b, ctx, split,
split_type, label, endings, source_id), by default data/hellaswag/hellaswag_val.jsonl relative to the
working directory, fetched from URL on first use; hellaswag_path names a file on a machine without internet.
"""
import json
import os
import shutil
import time
import urllib.request
from dataclasses import replace

import torch
import torch.distributed as dist

from speedgpt.corpus import get_tokenizer
from speedgpt.distributed import print0
from speedgpt.measure import sync

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"   # 10,042 examples
CACHE = os.path.join("data", "hellaswag", "hellaswag_val.jsonl")     # relative to the working directory
FIELDS = ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "split", "split_type", "label", "endings", "source_id")
LENGTH_STEP = 64        # rows are padded to a multiple of this (at most block_size): few shapes for a compiled model

# -----------------------------------------------------------------------------
# the file

def download(path, url):
    """Fetch `url` to `path` through a temporary file beside it, renamed when whole, so a failed or
    interrupted download leaves no file. Raises FileNotFoundError saying how to fetch it by hand and
    where to put it when the download fails (no internet, say)."""
    tmp, folder = f"{path}.{os.getpid()}.tmp", os.path.dirname(path) or "."
    made = not os.path.isdir(folder)
    print0(f"hellaswag: downloading {url} to {path}")
    try:
        os.makedirs(folder, exist_ok=True)
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f)
        os.replace(tmp, path)
    except (OSError, ValueError) as e:            # urllib's URLError and timeouts are OSErrors
        raise FileNotFoundError(
            f"hellaswag: could not download {url} ({type(e).__name__}: {e}). "
            f"Fetch it by hand where there is internet (curl -L -o hellaswag_val.jsonl {url}) and put it at "
            f"{os.path.abspath(path)}, or pass --hellaswag_path=FILE (train.py: --hellaswag=off trains without it)"
        ) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        if made and os.path.isdir(folder) and not os.listdir(folder):     # a failed download leaves no folder
            os.rmdir(folder)


def load(path, limit=0):
    """The examples of HellaSwag jsonl file `path` (blank lines skipped), its first `limit` (0: all), each a
    dict of FIELDS. Every line read is checked: ValueError naming the file and line for one that is not
    JSON, lacks a field, has no context, not 4 string endings or a label outside 0-3."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()          # at line breaks only: str.splitlines() also splits at U+2028
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e}): is it HellaSwag's jsonl?") from None
    examples = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {i}"
        try:
            ex = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} is not JSON ({e}): is the file HellaSwag's jsonl, and whole?") from None
        missing = [k for k in FIELDS if k not in ex] if isinstance(ex, dict) else ["all fields"]
        if missing:
            raise ValueError(f"{where} lacks {', '.join(missing)}: not a HellaSwag example (fields: "
                             f"{', '.join(FIELDS)})")
        endings, label = ex["endings"], ex["label"]
        if not isinstance(endings, list) or len(endings) != 4 or not all(isinstance(e, str) for e in endings):
            raise ValueError(f"{where}: endings must be a list of 4 strings, got {endings!r}")
        if type(label) is not int or not 0 <= label < 4:
            raise ValueError(f"{where}: label must be 0, 1, 2 or 3 (the right ending), got {label!r}")
        if not isinstance(ex["ctx"], str) or not ex["ctx"]:
            raise ValueError(f"{where}: ctx must be a non-empty string, got {ex['ctx']!r}")
        examples.append(ex)
        if len(examples) == limit:
            break
    if not examples:
        raise ValueError(f"{path} holds no HellaSwag example")
    return examples


def fetch(path, proc):
    """The file to read: `path`, or "" for CACHE, downloaded there when missing (by rank 0, the other ranks
    waiting, as train.py prepares data). Raises FileNotFoundError for a given path that is not a file, or
    a download that fails (download())."""
    if path:
        if os.path.isdir(path):
            raise FileNotFoundError(f"hellaswag_path={path!r} is a folder: name HellaSwag's jsonl file in it")
        if os.path.exists(path) and not os.path.isfile(path):      # /dev/null, a pipe: nothing to read examples from
            raise FileNotFoundError(f"hellaswag_path={path!r} is not a regular file: name HellaSwag's jsonl file, or "
                                    f"leave hellaswag_path empty to download it to {CACHE}")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"hellaswag_path={path!r}: no such file; leave hellaswag_path empty to download "
                                    f"HellaSwag's validation set to {CACHE} (train.py: or --hellaswag=off)")
        return path
    if proc.master and not os.path.isfile(CACHE):
        download(CACHE, URL)
    if proc.world > 1:
        dist.barrier()
    return CACHE


# nanoGPT's tokens that HellaSwag's text cannot be put in (shards.nanogpt_meta's), by tokenizer: what they are
NO_HELLASWAG = {"char": "nanoGPT's characters (meta.pkl)", "ids": "ids whose text is unknown (meta.pkl: a vocab_size "
                "alone)"}


def refuse_characters(tokenizer, what, way_out):
    """Raise ValueError in one line where `tokenizer` (of `what`: a data folder or a checkpoint) is nanoGPT's
    character vocabulary (its meta.pkl), or ids whose text is unknown: HellaSwag's text holds characters such a
    vocabulary lacks (ids stand for no text we know), and get_tokenizer, which knows neither, would say only
    "unknown tokenizer". `way_out`: what to do instead."""
    if tokenizer in NO_HELLASWAG:
        raise ValueError(f"HellaSwag cannot score {what}: its tokens are {NO_HELLASWAG[tokenizer]}, and "
                         f"HellaSwag's text needs GPT-2 BPE or byte-level tokens: {way_out}")


def data_tokenizer(data_dir):
    """The tokenizer of the data folder `data_dir`, or None where it is not there yet (the stdlib's, prepared on
    first use) or not readable (data.py's checks say why)."""
    from speedgpt.shards import load_meta
    try:
        return load_meta(data_dir, verbose=False)["tokenizer"]
    except (FileNotFoundError, ValueError):
        return None


def check(cfg, proc):
    """Resolve the hellaswag flags once, before any work: `cfg` with hellaswag 'on' or 'off' and
    hellaswag_path the file to read. 'auto' is on only where the file is already there (else one line
    says it is off and why); 'on' downloads it to the cache if needed. The file is read and checked
    here (load()). HellaSwag runs at each evaluation, so eval_tokens=0 turns it off. Raises
    FileNotFoundError / ValueError naming the file and the way out."""
    if cfg.hellaswag == "off":
        for key in ("hellaswag_path", "hellaswag_examples"):        # a setting never silently ignored
            if getattr(cfg, key):
                raise ValueError(f"{key}={getattr(cfg, key)!r} is set but hellaswag='off' would not read it: "
                                 f"add --hellaswag=on (or auto), or leave {key} out")
        return cfg
    path = cfg.hellaswag_path or CACHE
    if cfg.eval_tokens == 0:
        if cfg.hellaswag == "on":
            raise ValueError("hellaswag='on' scores at each evaluation, and eval_tokens=0 turns evaluation off: set "
                             "eval_tokens > 0, or hellaswag='off'")
        print0("hellaswag: auto -> off (eval_tokens=0: no evaluation)")
        return replace(cfg, hellaswag="off")
    tokenizer = data_tokenizer(cfg.data_dir)
    if tokenizer in NO_HELLASWAG:                   # before the file is fetched for nothing
        if cfg.hellaswag == "auto":
            print0(f"hellaswag: auto -> off ({cfg.data_dir} holds {NO_HELLASWAG[tokenizer]}; "
                   "HellaSwag needs GPT-2 BPE or byte-level tokens)")
            return replace(cfg, hellaswag="off")
        refuse_characters(tokenizer, cfg.data_dir, "leave hellaswag off (the validation loss measures such a model)")
    if cfg.hellaswag == "auto" and not os.path.isfile(path):
        print0(f"hellaswag: auto -> off (no file at hellaswag_path={path!r})" if cfg.hellaswag_path else
               f"hellaswag: auto -> off (no {path}; --hellaswag=on downloads it, --hellaswag_path=FILE reads one)")
        return replace(cfg, hellaswag="off")
    path = fetch(cfg.hellaswag_path, proc)
    load(path, cfg.hellaswag_examples)
    return replace(cfg, hellaswag="on", hellaswag_path=path)


def build(cfg, meta, block_size, proc):
    """train.py's HellaSwag for a model of `block_size` on data of `meta`'s tokenizer, or None when
    check() resolved it off. Each forward holds batch_size rows (batch_size // 4 examples, at least 1)."""
    if cfg.hellaswag != "on":
        return None
    examples = load(cfg.hellaswag_path, cfg.hellaswag_examples)
    hs = HellaSwag(examples, get_tokenizer(meta["tokenizer"]), block_size, proc.device, proc.rank, proc.world,
                   max(1, cfg.batch_size // 4))
    print0(f"hellaswag: {len(examples):,} examples of {cfg.hellaswag_path} at each evaluation ({meta['tokenizer']} "
           f"tokens" + (f"; {hs.cut} rows longer than block_size={block_size} keep their end" if hs.cut else "") + ")")
    return hs

# -----------------------------------------------------------------------------
# rendering and scoring

def render(example, tok):
    """(context ids, [ids of each of the 4 endings]): tok.encode(ctx), tok.encode(" " + ending)."""
    return tok.encode(example["ctx"]), [tok.encode(" " + e) for e in example["endings"]]


def make_batch(rendered, block_size, pad_id, rows):
    """x, y (rows, L) int64 for the rendered examples, 4 rows each (context + ending), then empty rows up to
    `rows`: x a row's tokens but its last, y the next token where it is an ending's, else -1. L is the
    longest row rounded up to a multiple of LENGTH_STEP, at most block_size. A row longer than block_size + 1
    tokens keeps its last block_size + 1 (the context's start is cut): its ending is scored whole when
    it has at most block_size tokens, else its last block_size tokens."""
    full = [(ctx + end, len(end)) for ctx, ends in rendered for end in ends]
    longest = max((len(r) - 1 for r, _ in full), default=1)
    L = min(block_size, -(-longest // LENGTH_STEP) * LENGTH_STEP)
    x = torch.full((rows, L), pad_id, dtype=torch.long)
    y = torch.full((rows, L), -1, dtype=torch.long)
    for i, (row, n_end) in enumerate(full):
        row = row[-(L + 1):]
        x[i, :len(row) - 1] = torch.tensor(row[:-1])
        n = min(n_end, len(row) - 1)
        y[i, len(row) - 1 - n:len(row) - 1] = torch.tensor(row[-n:])
    return x, y


@torch.no_grad()
def ending_losses(model, x, y, ctx):
    """Summed loss in nats (float32) and count of the scored targets of each row of x, y (R, L) (y != -1),
    shapes (R,): from the model's full logits (GPT.forward without targets: (R, L, V), -inf at padded
    ids), log-softmax in float32, under the autocast context `ctx`."""
    with ctx:
        logits, _ = model(x)
    logp = logits.float().log_softmax(-1)                                      # (R, L, V)
    nll = -logp.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)           # (R, L)
    scored = y != -1
    return torch.where(scored, nll, 0.0).sum(1), scored.sum(1)


class HellaSwag:
    """The examples of one rank (r takes examples r, r + world_size, ...), rendered with tokenizer `tok`
    for a model of `block_size`, and their scoring in batches of `batch_size` examples on `device`."""

    def __init__(self, examples, tok, block_size, device, rank=0, world_size=1, batch_size=8):
        self.block_size, self.device, self.batch_size = block_size, torch.device(device), batch_size
        self.pad_id = tok.eot                  # any id: padding is never a target
        mine = examples[rank::world_size]
        self.rendered, self.labels = [render(e, tok) for e in mine], torch.tensor([e["label"] for e in mine])
        # every rank runs as many forwards as rank 0, which has the most examples: FSDP gathers the
        # weights in each forward (DDP may broadcast buffers), so one rank's extra forward would hang
        per_rank = -(-len(examples) // world_size)
        # a batch pads to 4 x batch_size rows (a fixed shape): more examples than a rank has would only add
        # empty rows, and eval.py --batch_size=100000 on 8 examples ran out of memory on them
        self.batch_size = batch_size = max(1, min(batch_size, per_rank))
        self.n_batches = -(-per_rank // batch_size)
        self.cut = sum(len(c) + len(e) - 1 > block_size for c, ends in self.rendered for e in ends)   # rows cut

    def losses(self, model, ctx):
        """(sum, count), each (this rank's examples, 4): each ending's summed loss in nats and its scored
        tokens. Each forward has 4 x batch_size rows, padded to a multiple of LENGTH_STEP tokens, so a
        compiled model sees a few shapes only and recompiles no more than for those."""
        sums, counts = [], []
        for k in range(self.n_batches):
            part = self.rendered[k * self.batch_size:(k + 1) * self.batch_size]
            x, y = make_batch(part, self.block_size, self.pad_id, 4 * self.batch_size)
            s, n = ending_losses(model, x.to(self.device), y.to(self.device), ctx)
            sums.append(s[:4 * len(part)].view(-1, 4))
            counts.append(n[:4 * len(part)].view(-1, 4))
        return torch.cat(sums), torch.cat(counts)

    def counts(self, model, ctx):
        """(right by mean loss, right by summed loss, examples) of this rank: an int64 tensor (MPS has no float64)."""
        sums, n = self.losses(model, ctx)
        labels = self.labels.to(sums.device)
        norm, total = (sums / n).argmin(1), sums.argmin(1)       # the lowest loss wins (first of ties)
        n = torch.tensor(len(labels), device=labels.device)
        return torch.stack([(norm == labels).sum(), (total == labels).sum(), n]).long()

    def evaluate(self, model, ctx):
        """Score `model` (in eval mode, then back to its mode before) on every rank's examples together:
        {"hellaswag_acc_norm", "hellaswag_acc", "hellaswag_n", "hellaswag_s"}, the counts all-reduced
        when a process group is up, so any world size gives the same score; hellaswag_s the seconds taken."""
        sync(self.device)
        start, training = time.perf_counter(), model.training
        model.eval()
        try:
            totals = self.counts(model, ctx).to(self.device)
        finally:
            model.train(training)
        if dist.is_initialized():
            dist.all_reduce(totals)
        right_norm, right, n = totals.tolist()
        sync(self.device)
        return {"hellaswag_acc_norm": right_norm / n, "hellaswag_acc": right / n, "hellaswag_n": int(n),
                "hellaswag_s": time.perf_counter() - start}


def describe(result):
    """One line of evaluate()'s `result`, for the console."""
    return (f"hellaswag acc_norm {result['hellaswag_acc_norm']:.4f} | acc {result['hellaswag_acc']:.4f} | "
            f"{result['hellaswag_n']:,} examples | {result['hellaswag_s']:.2f} s")
