"""
speedgpt's configuration: every flag of train.py with its type, default and one line of help (Config),
and the loader for config files and `--key=value` (or `--key value`) overrides (load_config), which refuses
an unknown key (naming the closest known one), a wrong type, a bad choice or an impossible schedule before
any work is done. What a flag needs of the GPU, the packages and the shapes is checked by the feature's
own module (train.py's check_flags). FlagParser gives the other scripts (sample.py, eval.py, hf.py,
bench.py) the same flag syntax and the same one-line errors.

    from configurator import load_config
    cfg = load_config(["--config", "config/fast.py", "--batch_size=32"])   # or "--batch_size", "32"
    cfg = load_config(["config/fast.py", "--batch_size=32"])                # a FILE.py alone: nanoGPT's form
    python train.py --help                             # every flag: type, default, help (help_text)

Config files (config/*.py) are plain Python assignments of these keys, as in nanoGPT. nanoGPT's own config
files and keys load too (dataset, gradient_accumulation_steps, eval_iters, ...): speedgpt/nanogpt.py translates
them, each with a note.
"""
import argparse
import ast
import difflib
import glob
import os
import re
import sys
import types
import warnings
from dataclasses import dataclass, fields

from speedgpt import nanogpt


@dataclass
class Config:
    # I/O
    out_dir: str = "out"                   # the run's folder: ckpt.pt, metrics.jsonl, summary.json, config.json
    data_dir: str = "data/stdlib_byte"     # prepared shards (data.py); stdlib_byte, stdlib_gpt2: made on first use
    init_from: str = "scratch"             # scratch | resume (out_dir/ckpt.pt) | gpt2[-medium|-large|-xl] | a HF folder
                                           # | a checkpoint file to start from (nanoGPT's ckpt.pt, or ours)
    eval_interval: int = 100               # validation (and a checkpoint) every this many steps, and at the end
    eval_tokens: int = 40960               # validation tokens: the val split's first rows, for any launch; 0: none
    hellaswag: str = "off"                 # off | on: HellaSwag at each evaluation, fetched once | auto: on if on disk
    hellaswag_path: str = ""               # HellaSwag's val jsonl; empty: data/hellaswag/hellaswag_val.jsonl, the cache
    hellaswag_examples: int = 0            # score HellaSwag's first N examples at each evaluation; 0: all 10,042
    save_checkpoints: bool = True          # write out_dir/ckpt.pt at each evaluation
    target_val_loss: float = 0.0           # stop at the first evaluation at or below this val loss; 0: off
    keep_checkpoints: int = 3              # step-numbered checkpoints kept (ckpt_stepN.pt); ckpt.pt: the latest
    async_checkpoint: bool = True          # write checkpoints in a thread: the loop waits for the CPU copy only
    resume_from: str = ""                  # a step (of a kept checkpoint) or a checkpoint path to resume from
    log_interval: int = 10                 # a console line and a metrics record every this many steps
    timing_warmup: int = 3                 # steps after start/resume left out of tokens/s (compile, caches)
    wandb_log: bool = False                # log to Weights & Biases (pip install wandb; offline: WANDB_MODE=offline)
    wandb_project: str = "speedgpt"        # W&B project
    wandb_run_name: str = ""               # W&B run name; empty: W&B picks one
    # data
    batch_size: int = 16                   # micro-batch, sequences per process
    block_size: int = 256                  # sequence length, tokens
    total_batch_size: int = 0              # tokens per optimizer step, whole job; 0: one micro-batch per process
    packing: bool = True                   # documents fill every row; False: one document per row, padded
    document_mask: bool = True             # with packing: no attention or position across documents
    check_mask: bool = False               # debug: assert each batch's attention mask is block-diagonal and causal
    profile: bool = False                  # torch.profiler over the last warm-up step: out_dir/profile.txt and a trace
    # model
    n_layer: int = 4                       # transformer blocks
    n_head: int = 4                        # attention heads
    n_embd: int = 128                      # width
    dropout: float = 0.0                   # dropout probability, in [0, 1)
    bias: bool = False                     # biases in Linear layers and LayerNorms (GPT-2 had them)
    activation: str = "gelu"               # the MLP's, a key of model.py's ACTIVATIONS: gelu (exact) | gelu_tanh
                                           # (GPT-2's tanh approximation) | relu2 (relu(x)^2)
    norm: str = "layernorm"                # a key of model.py's NORMS: layernorm (GPT-2's) | rmsnorm (no mean
                                           # subtraction, no bias: Llama's)
    rope: bool = False                     # rotary position embeddings on q and k, in place of learned positions (wpe)
    qk_norm: bool = False                  # RMSNorm of each head's q and k before attention (OLMo 2, Qwen3)
    tie_embeddings: bool = True            # the output head is the token embedding's matrix (GPT-2's); False: its own
    attention: str = "sdpa"                # naive | sdpa | flex | varlen | auto (the fastest installed, at start)
    sdpa_backend: str = "auto"             # auto | flash | cudnn: the only kernel attention='sdpa' may use (GPU)
    # optimizer and schedule (speedgpt/optim.py): AdamW, linear warmup then cosine decay to min_lr
    optimizer: str = "adamw"               # adamw | muon (the block matrices on Muon, the rest on AdamW)
    lr_schedule: str = "cosine"            # cosine | wsd (warmup, stable, then a linear decay: wsd_decay_frac)
                                           # | constant (warmup, then learning_rate to the end)
    wsd_decay_frac: float = 0.2            # lr_schedule=wsd: the share of lr_decay_iters spent decaying
    muon_lr: float = 0.02                  # optimizer=muon: peak learning rate of the Muon matrices
    muon_momentum: float = 0.95            # optimizer=muon: Muon's (Nesterov) momentum
    muon_batched: bool = True              # optimizer=muon: the Newton-Schulz step of each shape's matrices batched
    learning_rate: float = 3e-3            # peak learning rate (AdamW's groups)
    min_lr: float = 3e-4                   # learning rate after the decay (none with lr_schedule=constant)
    warmup_iters: int = 30                 # linear warmup steps
    lr_decay_iters: int = 0                # cosine decay until this step; 0: max_iters of the run that started
                                           # (none with lr_schedule=constant)
    max_iters: int = 500                   # optimizer steps (with time_budget: the most)
    time_budget: float = 0.0               # minutes of training (evaluations, checkpoints and the first step's compile
                                           # apart): the run ends there and the decay runs on it (speedgpt/budget.py)
                                           # instead of on lr_decay_iters; a resume continues its clock; 0: off
    weight_decay: float = 0.1              # AdamW weight decay, matrices only
    beta1: float = 0.9                     # AdamW beta1
    beta2: float = 0.95                    # AdamW beta2
    grad_clip: float = 1.0                 # clip the global gradient norm to this; 0: off
    fused_adamw: bool = False              # the fused AdamW kernel
    max_skipped_steps: int = 0             # non-finite steps skipped (no update) before the run stops
    # system
    device: str = "auto"                   # auto (cuda if available, else mps, else cpu) | cpu | cuda | cuda:N | mps
    dtype: str = "float32"                 # float32 | bfloat16 | float16 (float16 adds a GradScaler)
    memory_check: bool = True              # refuse a run whose estimated memory exceeds the device's; False: try anyway
    tf32: bool = False                     # TF32 matmuls in float32
    compile: bool = False                  # torch.compile the model
    compile_regional: bool = False         # compile one block, reused by all (and the head): compile time flat in depth
    compile_tuning: bool = False           # Inductor times tile sizes of each generated kernel (longer first compile)
    compile_persistent_rows: int = 0       # rows of up to this many values (<= 16384) kept whole in reductions (GPU)
    seed: int = 1337                       # initial weights, data order, dropout; 0 to 2**32 - 1
    peak_flops: float = 0.0                # FLOP/s for MFU; 0: the GPU's entry in speedgpt/measure.py's PEAK_FLOPS
    grad_checkpointing: str = "none"       # none | full | selective: recompute blocks in the backward (less memory)
    fp8: bool = False                      # float8 training of the block Linears at least fp8_min_dim wide
    fp8_recipe: str = "tensorwise"         # tensorwise | rowwise (torchao) | rowwise_bf16_wgrad | tensorwise_fused |
                                           # tensorwise_delayed (speedgpt/features/fp8.py's)
    fp8_min_dim: int = 1024                # skip Linear layers narrower than this (FP8 loses there)
    fp8_layers: str = "all"                # which block Linears fp8 converts: all, or kinds (qkv,attn_proj,fc,mlp_proj)
    fp8_precast: bool = False              # tensorwise_delayed: float8 weights and scales once per step, off the graph
    fp8_cast_kernel: bool = False          # tensorwise_delayed: each cast and its amax in one Triton pass (GPU)
    fp8_gelu_cast: bool = False            # tensorwise_delayed: the MLP's GELU (and its derivative) in the casts (GPU)
    fp8_norm_cast: bool = False            # tensorwise_delayed: the LayerNorm before qkv and fc in their casts (GPU)
    gelu_erf: str = "exact"                # exact | fast: GELU's erf in our Triton passes (fast: 1.5e-7 off)
    fp8_head: bool = False                 # the fused head's matmuls in float8 (needs fused_ce; Ada/Hopper)
    head_kernel: bool = False              # the fused head's softmax pass in Triton (speedgpt/features/softmax_pass.py)
    fused_ce: bool = False                 # the head + cross-entropy as one function, gradients in the forward
    fused_ce_chunk: int = 16384            # tokens per chunk of fused_ce (memory against speed: docs/flags.md)
    parallelism: str = "ddp"               # ddp | fsdp, under torchrun


CHOICES = dict(attention=("naive", "sdpa", "flex", "varlen", "auto"), sdpa_backend=("auto", "flash", "cudnn"),
               dtype=("float32", "bfloat16", "float16"), grad_checkpointing=("none", "full", "selective"),
               fp8_recipe=("tensorwise", "rowwise", "rowwise_bf16_wgrad", "tensorwise_fused",
                           "tensorwise_delayed"), parallelism=("ddp", "fsdp"), gelu_erf=("exact", "fast"),
               hellaswag=("off", "on", "auto"),
               optimizer=("adamw", "muon"), lr_schedule=("cosine", "wsd", "constant"))
DERIVED = "it is derived: set total_batch_size, the tokens per optimizer step for the whole job"
# data.py's flags, which a newcomer gives train.py: the prepared folder's meta.json holds what they chose
DATA_PY_FLAGS = ("tokenizer", "input", "val_frac", "text_field", "shard_tokens", "max_tokens", "workers")
RENAMED = {"grad_accum_steps": DERIVED,     # nanoGPT's gradient_accumulation_steps: speedgpt/nanogpt.py
           "fp8_head_kernel": "it is head_kernel now (the fused head's softmax pass in Triton, FP8 or bf16)",
           "fp8_gelu_erf": "it is gelu_erf now (fast: the cheaper erf in FP8's casts and the bf16 MLP's GELU passes)"}
ALIASES = {"lr": "learning_rate", "wd": "weight_decay", "bs": "batch_size", "micro_batch_size": "batch_size",
           "seq_len": "block_size", "sequence_length": "block_size", "context_length": "block_size",
           "num_iterations": "max_iters", "steps": "max_iters", "warmup_steps": "warmup_iters",
           # difflib would answer tie_embeddings, n_embd or n_head for these, or nothing
           "rotary": "rope", "rotary_embeddings": "rope", "pos_emb": "rope", "position_embedding": "rope",
           "untied_head": "tie_embeddings=False", "untie_embeddings": "tie_embeddings=False",
           "time_limit": "time_budget", "minutes": "time_budget"}
HF_GPT2 = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")   # init_from names: OpenAI's GPT-2 on the Hugging Face hub
# the model settings GPT-2 has and its weights and format can hold no other value of: {key: (GPT-2's value, what GPT-2
# has)}; its activation is any GELU (hf.py's tables)
GPT2_BLOCKS = {"norm": ("layernorm", "LayerNorm"), "rope": (False, "learned absolute positions (wpe)"),
               "qk_norm": (False, "no QK-norm"), "tie_embeddings": (True, "the output head tied to the embedding")}
MODEL_CHOICES = {"activation": "ACTIVATIONS", "norm": "NORMS"}   # keys whose choices are model.py's tables, by name
# the largest seed: torch.manual_seed takes seeds below 2**64, and a run on several processes seeds rank r from
# seed x 1,000,003 + r (speedgpt/distributed.py's seed_rank_stream; a resume on more processes from (seed + step) x
# 1,000,003 + r), which 2**32 - 1 keeps below 2**64 for any step; sample.py's --seed takes the same range
SEED_MAX = 2**32 - 1
SEEDS = f"a whole number in [0, {SEED_MAX}] (2**32 - 1)"


def choices(key):
    """The values `key` may take, or None for any: CHOICES', or for activation and norm the keys of model.py's
    ACTIVATIONS and NORMS (a norm added there is a choice here). model.py (and torch) is imported only when one
    of these is set, as in model_keys."""
    if key in MODEL_CHOICES:
        import model
        return tuple(getattr(model, MODEL_CHOICES[key]))
    return CHOICES.get(key)


def seed(text):
    """An argparse type for another script's --seed (sample.py's): int(text) in train.py's range of seeds (SEED_MAX),
    else argparse's one-line error: torch.manual_seed's own is a traceback."""
    if not re.fullmatch(r"[+]?\d+", text.strip()) or int(text) > SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be {SEEDS}, got {text!r}")
    return int(text)


def model_keys():
    """The model's keys: GPTConfig's fields but vocab_size (the data's), each a key of Config. A checkpoint's config
    holds them, and a resume, sample.py and eval.py rebuild the model it was trained with from them. Derived, so a
    new field of GPTConfig is never left out; model.py (and torch with it) is imported here only, so that data.py
    and plot.py parse their flags without torch."""
    from model import GPTConfig
    return tuple(f.name for f in fields(GPTConfig) if f.name != "vocab_size")


def feature_details():
    """{a feature's flag, or "key=value": its keys that mean nothing without it (the flag False, the key another
    value)}, each feature's DETAILS (speedgpt/features/): a feature removed takes its keys with it. Imported here
    only (torch with it), as model_keys."""
    import importlib
    import pkgutil
    import speedgpt.features as features
    details = {}
    for info in pkgutil.iter_modules(features.__path__):
        details.update(getattr(importlib.import_module(f"speedgpt.features.{info.name}"), "DETAILS", {}))
    return details


def __getattr__(name):
    """configurator.MODEL_KEYS: model_keys(), and FEATURE_DETAILS: feature_details(), derived when first asked for
    (PEP 562), not kept by hand."""
    if name == "MODEL_KEYS":
        return model_keys()
    if name == "FEATURE_DETAILS":
        return feature_details()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def help_text(cfg=None):
    """Every flag of Config, one per line: `--key=value  type  help`, the help being the comment beside the field in
    this file, with the comment lines aligned under it; the value is cfg's (the config files and flags given with
    --help), the default's where cfg leaves it or is None. Raises AssertionError for a field without one."""
    import inspect
    lines, notes, last = inspect.getsource(Config).splitlines(), {}, None
    for line in lines:
        m = re.match(r"\s+(\w+): \w+ = .*?#\s*(.*)$", line)
        more = re.match(r"\s+#\s*(.*)$", line)
        if m:
            notes[m.group(1)], last = m.group(2), (m.group(1), line.rindex("#", 0, m.start(2)))
        elif more and last and line.index("#") == last[1]:        # the field's comment goes on
            notes[last[0]] += " " + more.group(1)
        else:
            last = None
    out = ["train.py's flags (--key=value or --key value; a bare --key of a bool: True; --config FILE, or FILE.py "
           "alone, applies a config file first, several in order, the later winning; nanoGPT's config files and keys "
           "load too: docs/nanogpt.md). Defaults: the CPU quickstart"
           + ("; the values the config and flags given set are shown, each with its default." if cfg else ".")]
    for f in fields(Config):
        assert f.name in notes, f"Config.{f.name} has no help comment"
        value = f.default if cfg is None else getattr(cfg, f.name)
        note = notes[f.name] + ("" if value == f.default else f" [default {f.default}]")
        out.append(f"  --{f.name}={value}".ljust(32) + f" {f.type.__name__:5}  {note}")
    return "\n".join(out)


def non_defaults(cfg):
    """{key: value} of `cfg`'s keys that differ from Config's defaults (what a run prints at start)."""
    defaults = Config()
    return {f.name: getattr(cfg, f.name) for f in fields(Config) if getattr(cfg, f.name) != getattr(defaults, f.name)}


def did_you_mean(name, known, help_command):
    """The end of an unknown-name error: 'did you mean X? (HELP)' with X the one of `known` that `name`
    begins (an abbreviation, which argparse used to take) or else the closest (difflib's ratio >= 0.6),
    else just HELP. The whole list (train.py has some 60 keys) would bury the one the user meant."""
    longer = [k for k in known if k.startswith(name)]
    close = longer if len(longer) == 1 else difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]}? ({help_command})" if close else help_command


def _unknown(key, where):
    """The one line for a key Config does not have, with the closest one it has (data.py's flags: said so)."""
    if nanogpt.refusal(key, where):
        return nanogpt.refusal(key, where)
    if key in DATA_PY_FLAGS:
        return (f"{key!r} ({where}) is a flag of data.py, not of train.py: prepare the data with it (python data.py "
                f"--{key}=... --input CORPUS --out data/NAME), then train on it with --data_dir=data/NAME")
    if key in ALIASES:                          # the short names other trainers use, which difflib cannot match
        return (f"unknown config key {key!r} ({where}): did you mean {ALIASES[key]}? (python train.py --help lists "
                "every key)")
    flags = [f"{k}={key}" for k in (*CHOICES, *MODEL_CHOICES) if key in choices(k)]
    if flags:                                   # --muon, --rmsnorm: a value given as a key (difflib: muon_lr, norm)
        return (f"unknown config key {key!r} ({where}): it is a value: did you mean {' or '.join(flags)}? "
                "(python train.py --help lists every key)")
    return f"unknown config key {key!r} ({where}): " + did_you_mean(key, [f.name for f in fields(Config)],
                                                                    "python train.py --help lists every key")


def split_flags(argv, takes_value):
    """[(key, value or None)] of a command line of `--key=value` and `--key value` flags, in order. The space
    form takes the next argument as the value unless it starts with `--` (another flag, never swallowed as a
    value: `--key=--x` says it is one); then, or at the end, the value is None when takes_value(key) is
    False (a bool: a bare --compile means True) and a ValueError naming both forms when it is True. A word
    that is no flag is a ValueError too, but for a FILE.py, taken as ("config", FILE.py) (nanoGPT's
    `train.py config/train_gpt2.py`), also after a bool, which then is True."""
    out, args = [], list(argv)
    while args:
        arg = args.pop(0)
        if arg.endswith(".py") and not arg.startswith("-"):
            out.append(("config", arg))
            continue
        if not arg.startswith("--") or arg == "--":
            raise ValueError(f"cannot parse argument {arg!r}: use --key=value or --key value (a config file: "
                             "--config FILE or FILE.py)")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if args and not args[0].startswith("--") and (key == "config" or takes_value(key)
                                                          or not args[0].endswith(".py")):
                value = args.pop(0)
            elif takes_value(key):
                then = f" ({args[0]!r} is a flag: a value that starts with -- takes the = form)" if args else ""
                raise ValueError(f"--{key} needs a value: --{key}=VALUE or --{key} VALUE{then}")
            else:
                value = None
        out.append((key, value))
    return out


class GivenTwice(UserWarning):
    """load_config's warning for a key the command line gives two values (given_twice)."""


def given_twice(flags):
    """A line for each key that `flags` ([(key, text of its value)], in order) sets to two different values (an
    edited command line): the last one wins, as in nanoGPT, but said. The same value twice (1e-3 and 0.001) is
    nothing to say."""
    def value(text):
        try:
            return repr(ast.literal_eval(text))
        except (ValueError, SyntaxError):
            return text
    out = []
    for key in dict.fromkeys(k for k, _ in flags):
        texts = [t for k, t in flags if k == key]
        if len({value(t) for t in texts}) > 1:
            out.append(f"--{key} is given {len(texts)} times ({', '.join(texts)}): the last, {texts[-1]}, is used")
    return out


def without_keys(argv, keys):
    """`argv` (train.py's flags) without those that set one of `keys`, in the --key=value form: a script that lays
    its own flags over a user's drops the user's, instead of giving train.py a key twice."""
    return [f"--{k}" if v is None else f"--{k}={v}" for k, v in split_flags(argv, lambda k: False) if k not in keys]


def flag_keys(argv):
    """The keys `argv` (train.py's flags) sets."""
    return {k for k, _ in split_flags(argv, lambda k: False)}


class FlagParser(argparse.ArgumentParser):
    """argparse with train.py's flag rules, for the other scripts: `--key=value` and `--key value`, names
    in full (no abbreviations: `--temp` is not --temperature), bools as train.py's (add_bool), an unknown
    flag answered with the closest known one, and every error one line, `error: ...` on stderr, exit
    status 2 (argparse's, for a usage error), without the usage block."""

    def __init__(self, *args, passes_on=(), hints=None, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.passes_on = set(passes_on)      # keys given to train.py after `--` (bench.py's): named so when before it
        self.hints = hints or {}             # {an unknown flag users try: the way out}, where the closest name misleads

    def add_bool(self, name, help=None):
        """A bool flag as train.py takes one: --name (True), --name=True/False or --name True/False."""
        def boolean(text):
            if text not in ("True", "False"):
                raise argparse.ArgumentTypeError(f"must be True or False, got {text!r}")
            return text == "True"
        return self.add_argument(name, nargs="?", const=True, default=False, type=boolean, help=help)

    def parse_known_args(self, args=None, namespace=None):
        # `--key value` becomes `--key=value` here, by load_config's rule (split_flags: the next argument is the
        # value unless it starts with --), since argparse would take `--temperature -inf` or `--start -x` for
        # two flags. Strict here rather than in parse_args: a subcommand's parser (hf.py export) parses
        # through this, so it names its own flags and its own --help.
        args, joined = list(sys.argv[1:] if args is None else args), []
        takes = {o for a in self._actions if a.nargs != 0 for o in a.option_strings}    # not -h, not store_true
        while args:
            arg = args.pop(0)
            if arg == "--":                # the rest are positional (bench.py's train.py overrides)
                joined += [arg, *args]
                break
            joined.append(f"{arg}={args.pop(0)}" if arg in takes and args and not args[0].startswith("--") else arg)
        given = joined[:joined.index("--")] if "--" in joined else joined
        commands = any(isinstance(a, argparse._SubParsersAction) for a in self._actions)   # its command's says it
        repeatable = {o[2:] for a in self._actions if isinstance(a, (argparse._AppendAction, argparse._CountAction))
                      for o in a.option_strings}          # given again on purpose: each use adds
        pairs = [(a[2:].partition("=")[0], a.partition("=")[2] or "True") for a in given if a.startswith("--")]
        for line in [] if commands else given_twice([(k, v) for k, v in pairs if k not in repeatable]):
            print(f"warning: {line}", file=sys.stderr)
        namespace, extra = super().parse_known_args(joined, namespace)
        if extra:
            word = extra[0]
            if not word.startswith("--"):
                self.error(f"cannot parse argument {word!r}: use --key=value or --key value")
            if word[2:].split("=")[0] in self.passes_on:
                self.error(f"{word.split('=')[0]} is train.py's: give it after `--` (python {self.prog} ... -- {word})")
            if word.split("=")[0] in self.hints:
                self.error(f"unknown flag {word.split('=')[0]!r}: {self.hints[word.split('=')[0]]}")
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
            self.error(f"unknown flag {word.split('=')[0]!r}: "
                       + did_you_mean(word.split("=")[0], known, f"python {self.prog} --help lists every flag"))
        return namespace, extra

    def error(self, message):
        m = re.fullmatch(r"argument (--\w+): expected one argument", message)
        if m:                          # argparse's words for a missing value: none, or a flag next
            message = (f"{m[1]} needs a value: {m[1]}=VALUE or {m[1]} VALUE (a value that starts with -- takes "
                       "the = form)")
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _typed(key, value, where):
    """Check `value` against Config's type for `key`; ints are accepted for floats."""
    known = {f.name: f.type for f in fields(Config)}
    if key in RENAMED:
        raise ValueError(f"config key {key!r} ({where}) is not a setting: {RENAMED[key]}")
    if key not in known:
        raise ValueError(_unknown(key, where))
    want = known[key]
    if want is float and type(value) is int:
        value = float(value)
    if want is float and str(value).lower().lstrip("+-") in ("nan", "inf", "infinity"):   # a float or its text
        raise ValueError(f"config key {key!r} ({where}) must be a finite number, got {value!r}")
    if type(value) is not want:
        raise TypeError(f"config key {key!r} ({where}) must be {want.__name__}, got {value!r} ({type(value).__name__})"
                        + (": give True or False" if want is bool else "")
                        + (f": Python's numbers take no leading zeros, give {value.lstrip('0') or '0'}"
                           if want in (int, float) and isinstance(value, str) and re.fullmatch(r"0\d+", value)
                           else ""))
    allowed = choices(key)
    if allowed is not None and value not in allowed:
        raise ValueError(f"config key {key!r} ({where}) must be one of {allowed}, got {value!r}")
    return value


def load_config(argv, with_explicit=False):
    """Config from `--config FILE` (plain Python assignments; several files apply in order) and then the
    `--key=value` or `--key value` overrides (in order; a bare `--key` of a bool is True), wherever they
    stand on the command line: an override always beats a config file. With with_explicit=True, returns
    (config, the set of keys some file or override set). Raises FileNotFoundError for a missing config
    file, and ValueError / TypeError naming an unknown key (and the closest known one), a missing value,
    a wrong type, a bad choice or an impossible combination. Warns (UserWarning) about a schedule a user
    could mean, such as warm-up longer than the run."""
    files, overrides, known = [], [], {f.name: f.type for f in fields(Config)}
    for key, raw in split_flags(argv, lambda key: key in known and known[key] is not bool):
        if key == "config":
            if not raw:
                raise ValueError("--config needs a file path, e.g. --config config/fast.py")
            files.append(raw)
        elif key not in known and key not in RENAMED and key not in nanogpt.KEYS:      # before any config file runs
            raise ValueError(_unknown(key, "command line"))
        else:
            overrides.append((key, "True" if raw is None else raw))     # a bare bool flag: True
    for line in given_twice(overrides):
        warnings.warn(line, GivenTwice)
    values, setter = {}, {}          # setter: key -> the source that set it last (files in order, then overrides)
    theirs, given = None, set()      # the first config file of nanoGPT's; every key set, nanoGPT's too
    placed, theirs_set = {}, {}      # our key -> [(a key that set it, its value, where)]; nanoGPT's keys read

    def assign(key, value, where, i):        # one key of file i (or the command line: len(files)) set
        if key in nanogpt.KEYS:
            update, said = nanogpt.translate(key, value, where)
            theirs_set[key] = (value, where, said, update)
        else:
            update = {key: _typed(key, value, where)}
        values.update(update)
        given.update([key, *update])
        setter.update(dict.fromkeys(update, i))
        for k in update:
            placed.setdefault(k, []).append((key, value, where))
    for i, path in enumerate(files):
        if not os.path.isfile(path):
            presets = sorted(glob.glob(os.path.join(os.path.dirname(path) or "config", "*.py")))[:12]
            raise FileNotFoundError(f"config file {path!r} "
                                    + ("is a folder, not a file" if os.path.isdir(path) else "not found")
                                    + (f" (there are {', '.join(presets)})" if presets and not os.path.isdir(path)
                                       else ""))
        ns, how = {}, "config files are Python assignments, one key each (n_layer = 12), as config/*.py"
        if path.endswith((".json", ".jsonl")):      # a run's config.json is its record, not a config file
            raise ValueError(f"config file {path!r} is JSON: {how}; a run's config.json is a record of it")
        try:
            with open(path) as f:
                exec(compile(f.read(), path, "exec"), {}, ns)
        except Exception as e:        # a syntax error or a bad name in the file
            raise ValueError(f"config file {path!r} does not run: {type(e).__name__}: {e}") from e
        keys = [k for k, v in ns.items() if not k.startswith("_") and not isinstance(v, types.ModuleType)]
        if not keys:                  # `import math` is no key; a file that sets none is a mistake
            raise ValueError(f"config file {path!r} sets no key: {how}")
        theirs = theirs or (path if any(k in nanogpt.KEYS for k in keys) else None)
        for k in keys:
            assign(k, ns[k], path, i)
    for key, raw in overrides:
        want = {f.name: f.type for f in fields(Config)}.get(key)
        try:
            value = raw if want is str else ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        assign(key, value, "command line", len(files))
    for key, (value, where, said, update) in theirs_set.items():     # the keys it sets, set elsewhere too
        others = {}
        for k in update:
            mine = max(i for i, (o, _, w) in enumerate(placed[k]) if o == key and w == where)
            others[k] = [(o, v, w, i > mine) for i, (o, v, w) in enumerate(placed[k]) if o != key]
        values.update(nanogpt.settle(key, value, where, said, update, others))
    # --fp8=False on gpt2-medium.py (or a later --config file setting it): the fp8_recipe set before goes too,
    # else it would be refused as doing nothing; so does fast.py's fp8_gelu_cast with a later --activation=relu2
    # ("activation=gelu" in fp8's DETAILS); a detail set with or after the feature's setting stays (refused)
    for feature, details in (feature_details() if files else {}).items():   # only a file sets before another
        key, _, needs = feature.partition("=")
        if key in setter and (values.get(key) != needs if needs else values.get(key) is False):
            for detail in details:
                if setter.get(detail, len(files) + 1) < setter[key]:
                    values.pop(detail, None)
    if values.get("packing") is False and values.get("document_mask") is True:    # each row is one document then
        if setter["document_mask"] >= setter["packing"]:
            raise ValueError("document_mask=True masks the documents packing puts in one row; with packing=False "
                             "each row holds one document: leave out document_mask, or leave out packing=False "
                             "(packing on, the mask applies)")
        values.pop("document_mask")                                      # a preset's, before packing=False
    explicit, defaults = set(values), {f.name: f.default for f in fields(Config)}
    if theirs:                       # beneath a config file of nanoGPT's: its defaults, as there
        values = {**nanogpt.defaults(theirs, given, defaults, values.get("init_from", "scratch")), **values}
    # lr_schedule=constant has no floor and no horizon: a min_lr or lr_decay_iters set before it (config/fast.py's
    # beneath a later --lr_schedule=constant) goes, as a feature's details do, and so do nanoGPT's defaults and those
    # its decay_lr=False leaves unread in the same place (as there); ours set with it or after it stay (optim.check)
    if values.get("lr_schedule") == "constant":
        at, theirs_too = setter["lr_schedule"], placed["lr_schedule"][-1][0] == "decay_lr"
        for key in ("min_lr", "lr_decay_iters"):
            if setter.get(key, -1) < at or theirs_too and setter[key] == at:
                values.pop(key, None)
                explicit.discard(key)
    cfg = Config(**nanogpt.resolve(values, defaults))
    idle = [k for k in ("wandb_project", "wandb_run_name")          # a name given, other than the default
            if setter.get(k) == len(files) and getattr(cfg, k) != defaults[k]] if not cfg.wandb_log else []
    if idle:                         # a config file's may stand unused (nanoGPT's set them beside wandb_log=False)
        raise ValueError(f"{' and '.join(f'--{k}' for k in idle)} name{'s' if len(idle) == 1 else ''} the W&B run, "
                         "but wandb_log=False logs none: add --wandb_log=True, or leave "
                         f"{'it' if len(idle) == 1 else 'them'} out")
    nanogpt.check_eval_only(cfg, {k: v[0] for k, v in theirs_set.items()})
    positive = ("batch_size", "block_size", "n_layer", "n_head", "n_embd", "eval_interval", "log_interval",
                "keep_checkpoints")                    # a feature's own keys: its check (speedgpt/features/)
    way_out = {"keep_checkpoints": " (to keep none, --save_checkpoints=False)",
               "eval_interval": " (to turn evaluation off, --eval_tokens=0)"}
    def set_in(*keys):               # a config file's bad value names the file: a preset or a fork's may hold it
        files = dict.fromkeys(placed[k][-1][2] for k in keys if k in placed and placed[k][-1][2] != "command line")
        return f" (set in {', '.join(files)})" if files else ""

    def bad(key):
        return f"config key {key!r}{set_in(key)}"
    for key in positive:
        if getattr(cfg, key) <= 0:
            raise ValueError(f"{bad(key)} must be positive, got {getattr(cfg, key)}"
                             + way_out.get(key, ""))
    for key in ("max_iters", "eval_tokens", "timing_warmup", "warmup_iters", "lr_decay_iters",
                "total_batch_size", "max_skipped_steps", "hellaswag_examples"):
        if getattr(cfg, key) < 0:
            raise ValueError(f"{bad(key)} must be >= 0, got {getattr(cfg, key)}")
    if not 0 <= cfg.seed <= SEED_MAX:           # before any work: torch.manual_seed would refuse it only at the model
        raise ValueError(f"{bad('seed')} must be {SEEDS}, got {cfg.seed}")
    if cfg.n_embd % cfg.n_head:
        raise ValueError(f"n_embd={cfg.n_embd} must be divisible by n_head={cfg.n_head}{set_in('n_embd', 'n_head')}")
    if not 0 <= cfg.dropout < 1:
        raise ValueError(f"{bad('dropout')} must be in [0, 1), got {cfg.dropout}")
    for key in ("learning_rate", "min_lr", "weight_decay", "grad_clip", "peak_flops", "target_val_loss", "time_budget"):
        if getattr(cfg, key) < 0:
            off = " (0 turns it off)" if key in ("grad_clip", "target_val_loss", "time_budget") else ""
            raise ValueError(f"{bad(key)} must be >= 0, got {getattr(cfg, key)}{off}")
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, key) < 1:
            raise ValueError(f"{bad(key)} (AdamW) must be in [0, 1), got {getattr(cfg, key)}")
    if cfg.init_from != "resume":        # a resume checks the schedule it continues with (resume_config)
        check_schedule(cfg)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", cfg.device):
        raise ValueError(f"{bad('device')} must be auto, cpu, cuda, cuda:N or mps, got {cfg.device!r}")
    if not cfg.out_dir:
        raise ValueError(f"{bad('out_dir')} must not be empty")
    if not cfg.data_dir:
        raise ValueError(f"{bad('data_dir')} must not be empty: give the folder data.py prepared "
                         "(--data_dir=data/NAME)")
    run = os.path.join(cfg.init_from, "ckpt.pt")
    if os.path.isdir(cfg.init_from) and not os.path.isfile(run):
        from speedgpt.checkpoint import newest_kept
        run = (newest_kept(cfg.init_from) or (None, None))[1]   # a folder that lost its ckpt.pt: its newest kept one
    if os.path.isdir(cfg.init_from) and run:                     # a run's folder: its config.json is ours, not HF's
        raise ValueError(f"init_from={cfg.init_from!r} is a training run's folder: start from its checkpoint, "
                         f"--init_from={run} (or another kept file there), or continue the run with "
                         f"--init_from=resume --out_dir={cfg.init_from}")
    weights = os.path.isfile(os.path.join(cfg.init_from, "config.json")) or nanogpt.is_checkpoint(cfg.init_from)
    if cfg.init_from.endswith(".pt") and not os.path.exists(cfg.init_from):
        raise ValueError(f"init_from={cfg.init_from!r}: no such checkpoint file")
    if cfg.init_from not in ("scratch", "resume", *HF_GPT2) and not weights:
        raise ValueError(f"{bad('init_from')} must be scratch, resume, {', '.join(HF_GPT2)}, a Hugging Face "
                         f"GPT-2 folder (with config.json) or a checkpoint file (nanoGPT's ckpt.pt, or ours), got "
                         f"{cfg.init_from!r}"
                         + (" (a folder without config.json)" if os.path.isdir(cfg.init_from) else ""))
    gpt2_weights = cfg.init_from in HF_GPT2 or os.path.isfile(os.path.join(cfg.init_from, "config.json"))
    other = [f"{k}={getattr(cfg, k)!r}" for k, (gpt2, _) in GPT2_BLOCKS.items() if getattr(cfg, k) != gpt2]
    other += [f"activation={cfg.activation!r}"] if gpt2_weights and not cfg.activation.startswith("gelu") else []
    if gpt2_weights and other:     # else GPT-2's blocks replaced them, the flags doing nothing but a note
        raise ValueError(f"init_from={cfg.init_from!r} loads GPT-2's blocks, which {', '.join(other)} would change: "
                         "its weights hold no such block; leave them out (a preset that sets them, such as "
                         "config/speedrun.py, too), or train them with init_from=scratch")
    if cfg.profile and cfg.timing_warmup < 2:
        raise ValueError("profile=True profiles the last warm-up step: it needs timing_warmup >= 2 "
                         "(the first step pays for compilation and allocator warm-up)")
    if cfg.profile and cfg.max_iters < cfg.timing_warmup:
        raise ValueError(f"profile=True profiles step timing_warmup - 1 = {cfg.timing_warmup - 1}: "
                         f"max_iters={cfg.max_iters} ends before it")
    return (cfg, explicit) if with_explicit else cfg


def check_schedule(cfg):
    """Refuse a learning-rate schedule that cannot be meant (ValueError naming the keys); warn about one
    a short run (a benchmark) could mean. lr_decay_iters=0 stands for max_iters."""
    decays = cfg.lr_schedule != "constant"      # a constant rate has no floor and no decay horizon
    decay = (cfg.lr_decay_iters or cfg.max_iters) if decays else cfg.max_iters
    if decays and cfg.min_lr > cfg.learning_rate:
        raise ValueError(f"min_lr={cfg.min_lr} is above learning_rate={cfg.learning_rate}: the schedule decays to "
                         f"min_lr; give --min_lr at most {cfg.learning_rate}"
                         + (" (a tenth of it, as GPT-2's recipes)" if cfg.learning_rate else ""))
    if decays and cfg.lr_decay_iters and cfg.lr_decay_iters <= cfg.warmup_iters < cfg.max_iters:
        raise ValueError(f"lr_decay_iters={cfg.lr_decay_iters} must exceed warmup_iters={cfg.warmup_iters}: "
                         "the rate would fall from its peak to min_lr in one step")
    if cfg.max_iters and decay <= cfg.warmup_iters:
        warnings.warn(f"warmup_iters={cfg.warmup_iters} >= max_iters={cfg.max_iters}: the learning rate never reaches "
                      f"learning_rate={cfg.learning_rate} and never decays (fine for a benchmark, not for training)",
                      stacklevel=3)
