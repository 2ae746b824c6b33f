"""
The memory check (memory_check=True): estimate what one training step holds per process, and refuse, before
any work, a run that clearly cannot fit on its device, in one line naming the way out. Without it such a run
is found out late: on a CPU the machine swaps for minutes before the kernel kills it, with no checkpoint.

    est = estimate(cfg, vocab_size, world, features)    # bytes by part: Estimate.describe() says them (measure.size)
    line = fits(cfg, vocab_size, device, world, features)   # ValueError when est.total > MARGIN x available(device)

This module counts the model's own step in one process (its weights, optimizer state, blocks, attention and head);
the transforms (train.TRANSFORMS, which the callers pass: the features, then the data-parallel wrapper) report what
they change, each through its memory(model, cfg, parts) (speedgpt/features/__init__.py), on the Parts below: this
module reads none of their keys.

The estimate is a model of the peak, not a measurement: within 0.7x-1.2x of each peak measured on a GPU
(torch.cuda.max_memory_allocated: the table in tests/test_memory.py, from BENCHMARKS.md "Memory" and
benchmarks/results/; below 0.8x only two at 350M, of a feature whose memory() says why) and of a CPU step's; with
MARGIN it refuses only what clearly cannot fit.
"""
import json
import os
from dataclasses import dataclass, replace

import torch

from speedgpt.measure import size

MARGIN = 0.9             # refuse above this share of the device's memory: the allocator's fragmentation, the
                         # CUDA context, the evaluation and the data loader live beside the step
MEMINFO = "/proc/meminfo"
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max",                      # cgroup v2
                 "/sys/fs/cgroup/memory/memory.limit_in_bytes")    # cgroup v1
CPU_FLOP_PER_SEC = 1e11  # what a CPU of a few cores trains at, about: the scale of "slow" on one (cpu_slow_work)
CPU_STEP_FLOP = 10 * CPU_FLOP_PER_SEC   # a step's training FLOPs above which its micro-steps on a CPU are slow
GPT2_VOCAB = 50257       # shards.load_meta's assumption for a folder of foreign shards, and the larger tokenizer
# OpenAI's GPT-2 (init_from names, configurator.HF_GPT2): (n_layer, n_head, n_embd), as their config.json on the
# Hugging Face hub. Their weights replace the config's shape only once read (hf.py), after this check
GPT2_SHAPES = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
               "gpt2-xl": (48, 25, 1600)}


@dataclass(frozen=True)
class Estimate:
    """Bytes per process of one training step, by part (estimate())."""
    params: int          # the float32 weights (FSDP: this rank's shard)
    grads: int           # their float32 gradients, and DDP's bucket copy of them
    optimizer: int       # AdamW's two moments, Muon's one momentum buffer on the block matrices
    activations: int     # what the blocks keep for the backward, attention's T x T scores and its mask
    head: int            # the output head: the logits and their gradient (or what a feature's head keeps)
    activations_way_out: str = ""   # a flag that shrinks the activations, as a feature names it (Parts)
    head_way_out: str = ""          # one that shrinks the head's
    weights_way_out: str = ""       # one that shrinks the weights, gradients and optimizer state

    @property
    def weights(self):
        """params + grads + optimizer: what does not depend on the micro-batch."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self):
        return self.weights + self.activations + self.head

    def describe(self):
        """One line: '36.0 GB per process (weights + optimizer 2.0 GB, activations 20.6 GB, head 13.4 GB)', each
        size in its own unit (measure.size: MB for a small model)."""
        return (f"{size(self.total)} per process (weights + optimizer {size(self.weights)}, "
                f"activations {size(self.activations)}, head {size(self.head)})")


@dataclass
class Parts:
    """The step's state and one micro-batch's activations and head as estimate() counts them for the model alone in
    one process, for each transform's memory(model, cfg, parts) (speedgpt/features/__init__.py) to change by what
    it changes, in train.TRANSFORMS' order; estimate() then adds them up. Bytes per process."""
    tokens: int                 # the micro-batch's: batch_size x block_size
    world: int                  # processes in the job
    params: int                 # the float32 weights, their float32 gradients and the optimizer's float32 state,
    grads: int                  # of the whole model in one process (a wrapper that shards them, or adds a copy,
    optimizer: int              # changes them: speedgpt/features/parallel.py)
    per_layer: float            # bytes per token per layer the blocks keep for the backward (block_bytes_per_token,
                                # in the run's dtype), attention's scores aside
    scores: int                 # bytes per token per layer attention keeps besides: attention='naive''s T x T scores
    head: int                   # the output head's bytes: the logits and what their gradient needs
    head_compiled: int          # the head's bytes where its graph is compiled (its elementwise passes fused)
    device: torch.device = None     # where the step runs (fits()'): a feature refused there is counted off; None:
                                    # as the config asks
    blocks: float = None        # the blocks' bytes, where a feature changes how many layers keep what (it sets them
                                # from kept); None: every layer keeps `kept` for every token
    blocks_way_out: str = ""    # a flag that shrinks the blocks' bytes, for fits()' refusal ("use --key=value")
    head_way_out: str = ""      # one that shrinks the head's, named where the head is over a quarter of the step
    weights_way_out: str = ""   # one that shrinks params, grads and optimizer, named where they outweigh the blocks

    @property
    def kept(self):
        """Bytes per token per layer the blocks keep for the backward: per_layer and attention's scores."""
        return self.per_layer + self.scores


def meta_model(cfg, vocab_size=GPT2_VOCAB):
    """model.GPT of `cfg`'s shape (a Config: its model keys) on the meta device, before any data or weights: its
    parameters' shapes and its block_linears(), with no memory and no initialisation (the estimate counts them;
    the features' checks and memory() read the kinds of block Linear). Its attention is sdpa: the parameters do not
    depend on it."""
    from model import GPT, GPTConfig
    with torch.device("meta"):
        return GPT(GPTConfig.from_dict(vars(cfg), vocab_size, attention="sdpa"))


def n_params(cfg, vocab_size, model=None):
    """Parameters of model.GPT for `cfg`'s shape, counted on `model` (default meta_model(cfg, vocab_size)): the
    vocabulary padded as GPTConfig pads it, a tied embedding and head once, whatever the blocks hold. Returns
    (all parameters, those in the block matrices: the weights of block_linears(), Muon's)."""
    model = meta_model(cfg, vocab_size) if model is None else model
    return model.num_params(non_embedding=False), sum(m.weight.numel() for _, _, m in model.block_linears())


def block_bytes_per_token(model):
    """Bytes the blocks of `model` (a GPT, on the meta device will do) keep per token for the backward in 16-bit
    autocast, averaged per layer: the 34 C of Korthikanti et al. 2022 (section 4) for GPT-2's block, read from
    the model's own Linears (block_linears) so that a forker's MLP width or new Linear counts. The parts, per
    layer: the input of every block Linear (its weight's gradient needs it) and the output of every one that
    does not write into the residual stream (attention keeps q, k and v; the activation its input), 2 bytes
    each; the two norms' inputs, 2 C each; the two dropout masks, C each. GPT-2's block: 14 C + 14 C + 4 C + 2 C.
    rope and qk_norm each add a second q and k (4 C): attention keeps the transformed ones, and the split's
    output stays for v (as torch's saved-tensor hooks count them on the CPU, tests/test_memory.py).
    Assumed, not read from the model: the activation keeps no more than its input and output (GELU, relu2:
    relu's output is the square's input), and a norm keeps its input (rmsnorm is counted as LayerNorm; eager,
    its float32 intermediates are kept besides, and qk_norm's too); a forker's gated MLP keeps its product too."""
    from model import RESIDUAL_PROJECTIONS
    C, L = model.config.n_embd, model.config.n_layer
    linears = sum(m.in_features + (m.out_features if kind not in RESIDUAL_PROJECTIONS else 0)
                  for _, kind, m in model.block_linears())
    per_layer = 2 * linears / L + 4 * C + 2 * C
    return per_layer + 4 * C * (model.config.rope + model.config.qk_norm)


def estimate(cfg, vocab_size, world=1, features=(), device=None):
    """Bytes per process of one training step of `cfg` (a resolved Config: attention not 'auto'; 'auto' is
    counted as 'sdpa', the larger of its answers) on a vocabulary of `vocab_size` ids, with `world` processes, and
    the `features` (train.TRANSFORMS: each one's memory(), where it has one, changes the Parts in that order; none:
    the model alone) on `device` (fits()': None, as cfg asks). An Estimate of int bytes by part. The parts, the
    model's own (what each feature changes: its memory()'s docstring):

    weights: float32 parameters, their float32 gradients and the optimizer's float32 state (AdamW: 2 moments;
        optimizer='muon': 1 momentum buffer on the block matrices, AdamW's 2 on the rest), in one process (with
        world > 1 the data-parallel wrapper's memory() shards them, or adds its copy: speedgpt/features/parallel.py).
    activations of one micro-batch (batch_size x block_size tokens): per layer per token 34 C bytes in 16-bit
        autocast for GPT-2's block (block_bytes_per_token: from the model's Linears), plus 5 n_head T bytes for
        attention='naive''s T x T scores (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
        Transformer Models", section 4: sbh(34 + 5as/h) bytes per layer). float32 doubles the 34 C (the scores stay:
        under autocast the softmax runs in float32 anyway, and the ladder measured about the same peak for float32
        as for bf16, BENCHMARKS.md). sdpa and naive with the document mask add one (B, 1, T, T) bool mask.
    head: the (tokens, padded vocab) logits: in float32 with the log-softmax and the gradients of both (16 bytes an
        element: measured on the CPU, and the ladder's eager rungs); where its graph is compiled, 6 bytes an element
        (measured at 124M, this head).
    """
    tokens, L, T = cfg.batch_size * cfg.block_size, cfg.n_layer, cfg.block_size
    half = cfg.dtype in ("bfloat16", "float16")
    model = meta_model(cfg, vocab_size)
    V = model.config.padded_vocab_size
    n, in_matrices = n_params(cfg, vocab_size, model)
    adam = n - in_matrices if cfg.optimizer == "muon" else n
    parts = Parts(tokens=tokens, world=world, params=4 * n, grads=4 * n, optimizer=8 * adam + 4 * (n - adam),
                  per_layer=block_bytes_per_token(model) * (1 if half else 2),
                  scores=5 * cfg.n_head * T if cfg.attention == "naive" else 0,
                  head=tokens * V * 16, head_compiled=tokens * V * 6, device=device)
    for feature in features:                # in train.TRANSFORMS' order: a later one reads what the earlier left
        if hasattr(feature, "memory"):
            feature.memory(model, cfg, parts)
    blocks = tokens * parts.kept * L if parts.blocks is None else parts.blocks
    masked = cfg.attention in ("naive", "sdpa", "auto") and cfg.packing and cfg.document_mask
    activations = blocks + (cfg.batch_size * T * T if masked else 0)
    return Estimate(int(parts.params), int(parts.grads), int(parts.optimizer), int(activations), int(parts.head),
                    parts.blocks_way_out, parts.head_way_out, parts.weights_way_out)


def _read_int(path, field=None):
    """The integer in file `path` (the value of `field`, for a 'Name: value kB' file such as /proc/meminfo, in
    bytes); None when the file, the field or a number is missing ('max': no cgroup limit)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    if field is None:
        return int(text) if text.strip().isdigit() else None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field and value.split() and value.split()[0].isdigit():
            return int(value.split()[0]) * (1024 if value.strip().endswith("kB") else 1)
    return None


def available(device):
    """Bytes of memory a run on `device` (a torch.device or its name) may use, or None where it cannot be read.
    A GPU: its total memory (torch.cuda.get_device_properties); Apple's MPS: Metal's recommended working set.
    The CPU: the machine's available memory (MemAvailable in /proc/meminfo: free memory plus what the kernel
    can reclaim; else os.sysconf's available pages), capped on Linux by the cgroup's memory limit (cgroup v2
    memory.max, v1 memory.limit_in_bytes), since a container's /proc/meminfo reports the host's memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "mps":            # unified memory: what Metal recommends one process's GPU work stays under
        return torch.mps.recommended_max_memory()
    free = _read_int(MEMINFO, "MemAvailable")
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):       # no sysconf (Windows) or no such name (macOS)
            free = None
    limits = [n for n in (_read_int(p) for p in CGROUP_LIMITS) if n is not None]
    return min([free] * (free is not None) + limits) if free is not None or limits else None


def vocab_size(data_dir):
    """The vocabulary a run on `data_dir` will train on, before its data is prepared: meta.json's vocab_size;
    without one, the tokenizer of the stdlib corpus it names (stdlib_byte, stdlib_gpt2: prepared on first
    use), else GPT-2's, as shards.load_meta assumes for foreign shards (and the larger of the tokenizers); nanoGPT's
    meta.pkl's size for its character vocabulary (a broken one: shards.nanogpt_meta's ValueError, which train.py's
    check then says before the memory line)."""
    if not os.path.isfile(os.path.join(data_dir, "meta.json")) and os.path.isfile(os.path.join(data_dir, "meta.pkl")):
        from speedgpt.shards import nanogpt_meta
        return nanogpt_meta(data_dir, verbose=False)["vocab_size"]
    try:
        with open(os.path.join(data_dir, "meta.json")) as f:
            size = json.load(f)["vocab_size"]
        if type(size) is int and size > 0:
            return size
    except (OSError, ValueError, KeyError, TypeError):      # none, or broken: load_meta will say so later
        pass
    from speedgpt.corpus import ByteTokenizer
    return ByteTokenizer.vocab_size if os.path.basename(str(data_dir).rstrip("/")) == "stdlib_byte" else GPT2_VOCAB


def fits(cfg, vocab_size, device, world=1, features=()):
    """Refuse, before any work, a run of `cfg` (resolved: check_flags' config) on a vocabulary of `vocab_size`
    whose estimate() with `features` (train.TRANSFORMS) exceeds MARGIN of available(device) (a torch.device), with
    `world` processes in the job; on the CPU torchrun's LOCAL_WORLD_SIZE processes share the machine's memory.
    Raises ValueError in one line: the estimate by part, the memory there and the way out (and
    --memory_check=False). Returns a one-line description of the estimate otherwise ('not checked' with
    memory_check=False, or memory that cannot be read)."""
    device = torch.device(device)
    est = estimate(cfg, vocab_size, world, features, device)
    if not cfg.memory_check:
        return f"memory: about {est.describe()}; not checked (memory_check=False)"
    have = available(device)
    if have is None:
        return f"memory: about {est.describe()}; not checked (the memory of {device} cannot be read)"
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    need = est.total * sharing
    where = f"the {size(have)} {device} has available" if device.type == "cpu" else f"the {size(have)} of {device}"
    if need <= MARGIN * have:
        return f"memory: about {est.describe()}" + (f" x {sharing} processes" if sharing > 1 else "") + \
            f"; fits in {where}"
    rows, partial = divmod(cfg.total_batch_size, cfg.block_size * world)        # a step's rows, per process
    smaller = ([] if partial else [b for b in range(cfg.batch_size - 1, 0, -1) if rows % b == 0] if rows else
               [cfg.batch_size >> i for i in range(1, cfg.batch_size.bit_length())])   # else halving it
    fit = next((b for b in smaller if estimate(replace(cfg, batch_size=b), vocab_size, world, features,
                                               device).total * sharing <= MARGIN * have), None)
    keeps = "total_batch_size keeps the step's tokens" if cfg.total_batch_size else \
        "with total_batch_size=0 the step shrinks with it: give --total_batch_size to keep it"
    ways = [f"lower --batch_size ({f'{fit} fits; ' if fit else ''}{keeps})", "or --block_size"]
    if est.activations_way_out:             # the features' (Parts)
        ways.append(f"or {est.activations_way_out}")
    if cfg.attention == "naive":
        ways.append("or --attention=sdpa (no T x T scores)")
    if 4 * est.head > est.total and est.head_way_out:
        ways.append(f"or {est.head_way_out}")
    shard = [f"or {est.weights_way_out}"] if est.weights_way_out and est.weights > est.activations else []
    ways += shard
    if cpu_way_out(cfg, device):     # a GPU preset: lowering the batch will not do, and alone it splits the step
        ways = [cpu_way_out(cfg, device),          # into micro-steps that cpu_slow_work refuses: the two together
                f"or lower --batch_size{f' ({fit} fits)' if fit else ''} or --block_size, and add --total_batch_size=0 "
                "(one micro-batch a step: on a CPU, a step this size of several is refused)"] + ways[2:]
    if est.weights * sharing > MARGIN * have:   # no micro-batch helps (init_from=gpt2-xl on a small machine)
        ways = [f"the weights, gradients and optimizer state alone ({size(est.weights)}) do not fit: a smaller "
                "model (a smaller init_from, or --n_layer, --n_embd)"] + shard
    processes = f" ({sharing} processes on this machine: {size(need)})" if sharing > 1 else ""
    raise ValueError(f"this run needs about {est.describe()}{processes}, more than {MARGIN:.0%} of {where}: "
                     f"{', '.join(ways)}; --memory_check=False skips this check")


def cpu_way_out(cfg, device):
    """The way out for a GPU-sized run (steps of 65,536 tokens or more: config/speedrun.py's too) on the CPU, for a
    refusal's line: the quickstart's size; '' elsewhere."""
    if device.type != "cpu" or cfg.total_batch_size < 65536:
        return ""
    return f"on a CPU, the quickstart's size (python train.py; these steps are {cfg.total_batch_size:,} tokens)"


def cpu_slow_work(cfg, device, world, refused):
    """The refusal line for what a GPU-sized run (cpu_way_out) would do slowly on the CPU, '' for nothing: a step of
    several micro-steps per process (plan_batch's) and over CPU_STEP_FLOP, refused on its own, since SIGINT/SIGTERM
    wait for a step's end (a GPU preset's micro-batch takes minutes there, a shrunk one's thousands of micro-steps
    hours; a small model's step of as many tokens, seconds); evaluations of
    more than 65,536 tokens, named beside it or any other refusal (`refused`: train.py's check_flags found one)."""
    if not cpu_way_out(cfg, device):
        return ""
    # rounded up: a step of partial micro-batches is plan_batch's refusal
    steps = -(-cfg.total_batch_size // (cfg.batch_size * cfg.block_size * world))
    if steps > 1 and step_flop(cfg, world) <= CPU_STEP_FLOP:   # a small model's step of many tokens takes seconds
        steps = 1
    slow_eval = cfg.eval_tokens > 65536 and (refused or steps > 1)
    evals = f"evaluations of {cfg.eval_tokens:,}"
    if steps > 1:
        return (f"on a CPU, a step of {steps:,} micro-steps ({cfg.total_batch_size:,} tokens in micro-batches of "
                f"{cfg.batch_size} x {cfg.block_size}{f' x {world} processes' if world > 1 else ''}) is slow, and a "
                f"Ctrl-C or SIGTERM waits for its end{f' ({evals} tokens are slow too)' if slow_eval else ''}: add "
                "--total_batch_size=0 (one optimizer step per micro-batch) or a --total_batch_size below 65,536" +
                (", and --eval_tokens=16384" if slow_eval else ""))
    if slow_eval:
        return (f"on a CPU, steps of {cfg.total_batch_size:,} tokens and {evals} are slow (a GPU preset's "
                "micro-batch alone takes minutes): add --eval_tokens=16384")
    return ""


def step_flop(cfg, world=1):
    """One process's training FLOPs in a step of `cfg` (model.GPT.flops_per_token on the vocabulary of its data_dir
    times its tokens); infinite where its shape or data cannot say yet (another check refuses them)."""
    try:
        return meta_model(weights_shape(cfg), vocab_size(cfg.data_dir)).flops_per_token() * cfg.total_batch_size / world
    except Exception:        # a shape the model refuses, a broken meta.pkl: their own checks say so
        return float("inf")


def out_of_memory_line(e):
    """The one line for an out-of-memory error `e` (CUDA's OutOfMemoryError, the CPU allocator's, numpy's
    MemoryError), naming the way out; None when `e` is another error."""
    import torch
    if not isinstance(e, (torch.OutOfMemoryError, MemoryError)) and "can't allocate memory" not in str(e):
        return None
    return (f"error: out of memory: {(str(e).splitlines() or [type(e).__name__])[0]}: lower --batch_size "
            "(total_batch_size keeps the step's tokens), or --block_size, or use --grad_checkpointing=full; sdpa and "
            "naive with the document mask build a batch_size x block_size^2 mask")


def weights_shape(cfg):
    """`cfg` with the shape its init_from's GPT-2 weights will bring (n_layer, n_head, n_embd; bias): OpenAI's
    (GPT2_SHAPES) or a Hugging Face folder's config.json. Otherwise `cfg`: scratch and resume are cfg's shape, and
    a checkpoint file's is cfg's already (nanogpt.start_config)."""
    hf_config = os.path.join(str(cfg.init_from), "config.json")
    if cfg.init_from in GPT2_SHAPES:
        n_layer, n_head, n_embd = GPT2_SHAPES[cfg.init_from]
    elif os.path.isfile(hf_config):
        with open(hf_config) as f:
            c = json.load(f)
        n_layer, n_head, n_embd = c.get("n_layer", 12), c.get("n_head", 12), c.get("n_embd", 768)   # GPT2Config's
    else:
        return cfg
    return replace(cfg, n_layer=n_layer, n_head=n_head, n_embd=n_embd, bias=True)


def check(cfg, proc, features):
    """train.py's check: refuses a run that does not fit (report), with the run's `features` (train.TRANSFORMS: its
    check_flags passes them). Returns cfg."""
    report(cfg, proc, features)
    return cfg


def report(cfg, proc, features):
    """fits() on the vocabulary of cfg.data_dir, with the run's `features` (train.TRANSFORMS): its line (train.py
    prints it once every check has passed, so that a refused run prints only its refusal), or None where data_dir
    holds no data (missing, or without meta.json and shards) and is not a corpus prepared on first use: train.py
    then refuses the folder in its own line, the mistake to fix first. Raises fits()' ValueError."""
    name = os.path.basename(str(cfg.data_dir).rstrip("/"))
    has_data = os.path.isdir(cfg.data_dir) and any(n == "meta.json" or n.endswith(".bin")
                                                   for n in os.listdir(cfg.data_dir))
    if has_data or name in ("stdlib_byte", "stdlib_gpt2"):
        return fits(weights_shape(cfg), vocab_size(cfg.data_dir), proc.device, proc.world, features)
    return None
