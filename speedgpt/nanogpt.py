"""
karpathy/nanoGPT's files, read as they are (docs/nanogpt.md has the table).

Config keys: configurator.load_config hands each key of nanoGPT's train.py that speedgpt spells or counts
otherwise to translate(), which returns our keys and the note saying what the key became (KEYS), said by settle()
once every source is read: as in nanoGPT, eval_only and decay_lr=False win over max_iters and warmup_iters; one of
our own keys set otherwise beside it in the same place is refused, and from a later place it wins. A key of
nanoGPT's sample.py or bench.py given to train.py is refused, naming the flag to use (ELSEWHERE). A config file
that sets one of nanoGPT's own keys is nanoGPT's: the keys it leaves out take nanoGPT's defaults (DEFAULTS, from
its train.py), as they would there, except the machine's (device, dtype, compile), which stay ours.
Checkpoints: nanoGPT's ckpt.pt (model, model_args, iter_num, ...) for init_from=<path>: its shape (start_config)
and its weights under our names (load_model); its optimizer state does not carry over (checkpoint.load_checkpoint
refuses a resume from it). speedgpt's own ckpt.pt is taken there too, for its weights only.
Data folders (train.bin, val.bin and meta.pkl: nanoGPT's prepare.py) are read by speedgpt/shards.py.
Imports no torch at parse time: configurator.py imports this module.
"""
import os
import re
import warnings


class Note(UserWarning):
    """A notice about how a key was read, not a warning: train.py prints it as `note: ...`, once."""


def note(message):
    warnings.warn(message, Note, stacklevel=4)


class PerBatch:
    """A count of micro-batches (nanoGPT's eval_iters, gradient_accumulation_steps) that becomes our count of
    tokens, n x batch_size x block_size, once those are final (resolve)."""

    def __init__(self, key, n):
        self.key, self.n = key, n


def _typed(key, value, want, where, least=0):
    if type(value) is not want or (want is int and value < least):
        raise TypeError(f"nanoGPT's config key {key!r} ({where}) must be {want.__name__}"
                        + (f" >= {least}" if want is int else "") + f", got {value!r}"
                        + (": give True or False" if want is bool else ""))
    return value


def _dataset(value, where):
    path = f"data/{_typed('dataset', value, str, where)}"
    return {"data_dir": path}, f"dataset={value!r} -> data_dir={path!r} (nanoGPT's data/<dataset>; its train.bin, " \
                               "val.bin and meta.pkl are read as they are)"


def _decay_lr(value, where):
    if _typed("decay_lr", value, bool, where):
        return {"lr_schedule": "cosine"}, "decay_lr=True: lr_schedule=cosine, as nanoGPT's (warmup_iters, then " \
                                          "cosine down to min_lr at lr_decay_iters)"
    return {"lr_schedule": "constant", "warmup_iters": 0}, \
        "decay_lr=False -> lr_schedule='constant', warmup_iters=0 (learning_rate at every step, as nanoGPT's)"


def _eval_only(value, where):
    if _typed("eval_only", value, bool, where):
        return {"max_iters": 0, "save_checkpoints": False}, \
            "eval_only=True -> max_iters=0, save_checkpoints=False (one evaluation, then the run ends)"
    return {}, "eval_only=False: the run trains (max_iters steps)"


def _always_save(value, where):
    _typed("always_save_checkpoint", value, bool, where)
    return {}, f"always_save_checkpoint={value}: speedgpt writes ckpt.pt at each evaluation and keeps the best " \
               "apart (ckpt_best.pt, nanoGPT's only-when-better checkpoint); --save_checkpoints=False writes none"


def _backend(value, where):
    _typed("backend", value, str, where)
    return {}, f"backend={value!r}: the process group's backend follows the device (NCCL on GPUs, gloo on the CPU)"


def _per_batch(key):
    def read(value, where):
        least = 1 if key == "gradient_accumulation_steps" else 0
        return {OURS[key]: PerBatch(key, _typed(key, value, int, where, least))}, None      # said by resolve()
    return read


# nanoGPT's train.py keys that speedgpt reads otherwise -> (value, where) -> ({our key: value}, the note). Its other
# keys (out_dir, eval_interval, batch_size, n_layer, learning_rate, min_lr, warmup_iters, lr_decay_iters, beta1,
# device, dtype, compile, wandb_log, ...) are ours too, with the same meaning.
OURS = {"eval_iters": "eval_tokens", "gradient_accumulation_steps": "total_batch_size"}
KEYS = {"dataset": _dataset, "gradient_accumulation_steps": _per_batch("gradient_accumulation_steps"),
        "eval_iters": _per_batch("eval_iters"), "eval_only": _eval_only, "always_save_checkpoint": _always_save,
        "decay_lr": _decay_lr, "backend": _backend}
# keys of nanoGPT's other scripts, which a user may hand train.py: where they belong here
ELSEWHERE = {**dict.fromkeys(("start", "num_samples", "max_new_tokens", "temperature", "top_k"), "sample.py"),
             "real_data": "bench.py"}
# nanoGPT's train.py defaults (GPT-2 124M on OpenWebText), beneath a config file of nanoGPT's
DEFAULTS = dict(out_dir="out", eval_interval=2000, log_interval=1, eval_iters=200, init_from="scratch",
                wandb_log=False, wandb_project="owt", wandb_run_name="gpt2", dataset="openwebtext",
                gradient_accumulation_steps=40, batch_size=12, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                dropout=0.0, bias=False, learning_rate=6e-4, max_iters=600000, weight_decay=0.1, beta1=0.9,
                beta2=0.95, grad_clip=1.0, warmup_iters=2000, lr_decay_iters=600000, min_lr=6e-5)
# the machine's keys, which keep speedgpt's defaults beneath a config file of nanoGPT's: nanoGPT's value on a GPU
MACHINE = {"device": None, "dtype": "bfloat16", "compile": True}


def translate(key, value, where):
    """({our key: value}, its note or None) for nanoGPT's `key` (one of KEYS) set to `value` in `where` (a file or
    'command line'); settle() says the note. Raises TypeError for a value of the wrong type."""
    ours, said = KEYS[key](value, where)
    return ours, said and f"nanoGPT's {said}"


def settle(key, value, where, said, update, others):
    """Say the note of nanoGPT's `key`=`value` (set in `where`; `update`: our keys it sets) once every source is
    read; return those of its keys it sets after all. `others`: {a key of `update`: [(another key that set it, its
    value, where, whether after this one)]}. Against a key nanoGPT has too (max_iters beside eval_only, warmup_iters
    beside decay_lr=False) it wins wherever that stands, as in nanoGPT, where it makes the other one not count.
    Against a key of ours alone, another value in the same place is two spellings of one setting: refused
    (ValueError); from a later place (the command line after a file) ours wins, and the note says so."""
    moot, wins = [], []
    for ours, sets in others.items():
        for other, v, place, after in sets:
            if v == update[ours]:
                continue
            if ours in DEFAULTS:
                moot.append(f"{other}={v!r} ({place})")
            elif place == where:
                raise ValueError(f"{key}={value!r} (nanoGPT's) and {other}={v!r} ({where}) both set {ours}: give one "
                                 "of them")
            elif after:
                wins.append(f"{other}={v!r} ({place})")
    moot, wins = list(dict.fromkeys(moot)), list(dict.fromkeys(wins))
    if said:
        note(said + (f"; {', '.join(moot)} beside it {'does' if len(moot) == 1 else 'do'} not count, as in nanoGPT"
                     if moot else "") +
             (f"; {', '.join(wins)}, given after it, {'wins' if len(wins) == 1 else 'win'}" if wins else ""))
    elif wins:                    # a PerBatch: resolve() says its note where nothing replaced it
        note(f"nanoGPT's {key}={value!r} ({where}) is replaced by {', '.join(wins)}, given after it")
    return {ours: update[ours] for ours in others if ours in DEFAULTS}


def check_eval_only(cfg, theirs):
    """Raise ValueError where nanoGPT's eval_only=True (in `theirs`: {nanoGPT's key: value} read) cannot do what it
    says, one evaluation of the model the run starts from: with no evaluation (eval_tokens=0), or on a resumed
    run, whose checkpoint is past max_iters=0 (its weights and shape load with init_from=<its ckpt.pt>)."""
    if not theirs.get("eval_only"):
        return
    if cfg.eval_tokens == 0:
        raise ValueError("eval_only=True evaluates once, and eval_tokens=0 (or eval_iters=0) evaluates nothing: "
                         "give eval_tokens > 0, or leave eval_only out")
    if cfg.init_from == "resume" or cfg.resume_from:
        from speedgpt.checkpoint import resolve_resume     # the file a resume would read, or why there is none
        path = resolve_resume(cfg.out_dir, cfg.resume_from)
        raise ValueError(f"eval_only=True with a resume: a resumed run trains on from its checkpoint. To evaluate "
                         f"the checkpoint, start from its weights in another folder: --init_from={path} "
                         f"--out_dir=OTHER_FOLDER, without init_from=resume and resume_from")


def refusal(key, where):
    """The one line for a key of nanoGPT's sample.py or bench.py given to train.py, or None for any other key."""
    if key in ELSEWHERE:
        return f"{key!r} ({where}) is a flag of {ELSEWHERE[key]} (as in nanoGPT), not of train.py: python " \
               f"{ELSEWHERE[key]} --{key}=... (python {ELSEWHERE[key]} --help lists its flags)"
    return None


def defaults(path, given, ours, init_from):
    """{our key: value} of nanoGPT's DEFAULTS for the keys config file `path` (nanoGPT's) and the rest of the command
    line leave out (`given`: the nanoGPT and our keys they set), translated; a note lists those that differ from
    `ours` (Config's defaults). Weights to start from (`init_from` not scratch) bring their own shape."""
    out, differ = {}, []
    for key, value in DEFAULTS.items():
        if key in given or OURS.get(key) in given or (key == "dataset" and "data_dir" in given) or \
                (init_from != "scratch" and key in ("n_layer", "n_head", "n_embd", "bias")):
            continue
        update = KEYS[key](value, "nanoGPT's default")[0] if key in KEYS else {key: value}
        out.update(update)
        if key in KEYS or ours.get(key) != value:
            differ.append(f"{key}={value}")
    same = "each the same as speedgpt's"
    kept = [k for k in MACHINE if k not in given]          # a machine key given on the command line is no default
    gpu = [f"--{k}={MACHINE[k]}" for k in kept if MACHINE[k] is not None]
    names = ", ".join(kept[:-1]) + " and " + kept[-1] if len(kept) > 1 else "".join(kept)
    machine = "" if not kept else f"; {names} keep{'s' * (len(kept) == 1)} speedgpt's default{'s' * (len(kept) > 1)} " \
        f"({', '.join(str(ours[k]) for k in kept)}" + (f"; on a GPU nanoGPT's: {' '.join(gpu)}" if gpu else "") + ")"
    note(f"{path} is nanoGPT's: the keys it leaves out take nanoGPT's defaults "
         f"({', '.join(differ) or same}){machine}")
    return out


def resolve(values, config_defaults):
    """`values` with each PerBatch made tokens (x batch_size x block_size, the final ones) and said in one note."""
    for ours, v in list(values.items()):
        if isinstance(v, PerBatch):
            b, t = (values.get(k, config_defaults[k]) for k in ("batch_size", "block_size"))
            values[ours] = v.n * b * t
            what = "the val split's first tokens, the same at each evaluation" if ours == "eval_tokens" else \
                "tokens per optimizer step for the whole job, whatever the number of processes"
            note(f"nanoGPT's {v.key}={v.n} -> {ours}={v.n * b * t:,} ({v.n} x batch_size {b} x block_size {t}: {what})")
    return values

# -----------------------------------------------------------------------------
# checkpoints

# nanoGPT's model_args -> our GPTConfig keys; the rest of its architecture is fixed, and ours by default
FIXED = dict(activation="gelu", norm="layernorm", rope=False, qk_norm=False, tie_embeddings=True)
SHAPE = ("n_layer", "n_head", "n_embd", "block_size", "bias")


def read(path):
    """The checkpoint file `path` (on the CPU; weights_only), nanoGPT's or speedgpt's. Raises ValueError for a file
    that is neither, in one line."""
    import torch
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise ValueError(f"init_from={path!r} cannot be read as a checkpoint ({type(e).__name__}): give nanoGPT's "
                         "ckpt.pt or speedgpt's") from e
    if not isinstance(ckpt, dict) or "model" not in ckpt or not ("model_args" in ckpt or "meta" in ckpt):
        raise ValueError(f"init_from={path!r} is not a checkpoint of nanoGPT (model, model_args) or speedgpt "
                         "(model, config, meta)")
    return ckpt


def shape_of(ckpt):
    """{our model key: value} of a checkpoint read by read(), and its vocabulary's size."""
    if "model_args" in ckpt:
        args = ckpt["model_args"]
        return {**FIXED, **{k: args[k] for k in SHAPE}}, args["vocab_size"]
    from dataclasses import fields
    from model import GPTConfig
    keys = [f.name for f in fields(GPTConfig) if f.name not in ("vocab_size", "dropout", "attention")]   # the run's
    return {k: ckpt["config"][k] for k in keys if k in ckpt["config"]}, ckpt["meta"]["vocab_size"]


def start_config(cfg, explicit):
    """`cfg` with init_from=<checkpoint file>'s shape: a shape key set explicitly (`explicit`) to another value is
    refused, but for a smaller block_size (the position embedding cropped, as nanoGPT's crop_block_size) and
    dropout and attention (no weights of theirs). Raises ValueError in one line."""
    from dataclasses import replace
    shape, _ = shape_of(read(cfg.init_from))
    clash = {k: v for k, v in shape.items()
             if k in explicit and getattr(cfg, k) != v and not (k == "block_size" and getattr(cfg, k) < v)}
    if clash:                     # all at once: a config file of nanoGPT's sets the whole shape
        one = len(clash) == 1
        raise ValueError(f"{', '.join(f'{k}={getattr(cfg, k)!r}' for k in clash)} differ{'s' * one} from the "
                         f"checkpoint's {', '.join(repr(v) for v in clash.values())} (init_from={cfg.init_from}): "
                         f"leave {', '.join(clash)} out to take the checkpoint's"
                         + (", or give a smaller block_size" if "block_size" in clash else "")
                         + f"; where a config file sets {'it' if one else 'them'}, add "
                         f"{' '.join(f'--{k}={v}' for k, v in clash.items())} (the command line beats a config file)")
    return replace(cfg, **{k: v for k, v in shape.items() if not (k == "block_size" and k in explicit)})


def state_dict(ckpt, model):
    """The checkpoint's weights under `model`'s names and shapes: nanoGPT's `_orig_mod.` (compiled) prefixes and
    causal-mask buffers (attn.bias, from a torch without SDPA) gone, its vocabulary rows padded with zeros to
    ours (padded_vocab_size, never sampled), its positions cropped to block_size. Same names otherwise: our
    model.py keeps nanoGPT's (transformer.wte, h.N.attn.c_attn, mlp.c_fc, ln_f, lm_head)."""
    import torch
    want = model.state_dict()
    out = {}
    for name, t in ckpt["model"].items():
        name = re.sub(r"^(_orig_mod\.|module\.)+", "", name)
        if re.fullmatch(r"transformer\.h\.\d+\.attn\.bias", name):
            continue
        if name in want and t.dim() == 2 and t.shape[1] == want[name].shape[1] and t.shape[0] != want[name].shape[0]:
            rows = want[name].shape[0]
            t = t[:rows] if name == "transformer.wpe.weight" else torch.cat([t, t.new_zeros(rows - len(t), t.shape[1])])
        out[name] = t
    return out


def load_model(path, model_cfg):
    """A GPT (float32, on the CPU) of `model_cfg` (its shape start_config's, its vocabulary the data's) holding the
    weights of the checkpoint at `path`. Raises ValueError when the checkpoint's vocabulary does not fit the data's
    (nanoGPT pads GPT-2's 50257 to 50304: both fit) or its weights do not fit the model."""
    from model import GPT
    from speedgpt.checkpoint import load_weights
    ckpt = read(path)
    _, vocab = shape_of(ckpt)
    model = GPT(model_cfg)
    if not model_cfg.vocab_size <= vocab <= model_cfg.padded_vocab_size:
        dataset = (ckpt.get("config") or {}).get("dataset")               # nanoGPT's names its data folder
        raise ValueError(f"init_from={path!r} has a vocabulary of {vocab:,} tokens, the data {model_cfg.vocab_size:,}: "
                         "train on the data it was trained on" +
                         (f" (dataset={dataset!r}: --data_dir=data/{dataset})" if isinstance(dataset, str) else
                          " (--data_dir)"))
    load_weights(model, {"model": state_dict(ckpt, model)}, path)
    return model


def is_checkpoint(init_from):
    """True when init_from names a checkpoint file (not scratch, resume, a GPT-2 name or a Hugging Face folder)."""
    return os.path.isfile(init_from)
