"""
speedgpt's helpers: what train.py, model.py and data.py lean on, one feature or one job per module.

  attention.py                 the attention kernels (flex, varlen, FA3) and the document mask: masks, positions, checks
  mask_check.py                the packing guarantee, checked against an independent reference (tests, check_mask)
  features/                    what changes how the model trains, one flag per module, one protocol
                               (features/__init__.py): FP8, the fused head, activation checkpointing, compile, DDP/FSDP
  optim.py                     the optimizer (AdamW, Muon) and the learning-rate schedule (cosine, WSD, constant)
  budget.py                    the training clock and the time budget: a run of N minutes of training (time_budget)
  evaluation.py                validation loss, bits per byte and time to a target loss (eval_tokens, target_val_loss)
  memory.py                    whether a run fits the device's memory: the estimate and its check (memory_check)
  distributed.py               processes and devices (torchrun), the batch plan, signals, agreement
  checkpoint.py                out_dir's checkpoints: written atomically, read safely, their history
  resume.py                    a resume, in one place: which checkpoint, which config, which state continues
  measure.py                   MFU and its peak-FLOPs table, the metrics logger, the profiler
  hellaswag.py                 HellaSwag at each evaluation and in eval.py: the file, its checks, scoring (hellaswag)
  corpus.py                    data.py's input readers, tokenizers and parallel tokenisation
  shards.py                    the token shard format (llm.c's), its index and meta.json; nanoGPT's train.bin, meta.pkl
  nanogpt.py                   nanoGPT's config keys, defaults and checkpoints, read as ours (docs/nanogpt.md)

A feature module holds its flag's check (what GPU, package or shape it needs) and its apply: dropping a
feature is deleting its module in features/, its entry in train.py's FEATURES and its config keys.
"""


def refuse_unused(cfg, keys, what, way):
    """Raise ValueError if cfg (a configurator.Config) sets any of `keys` away from its default while the feature
    they belong to is off, in one line naming every such key: "KEY=VALUE would do nothing: it is WHAT. Add WAY, or
    leave KEY out" ("Leave KEY out" alone where way is None: the feature cannot run here either; "K1=V1 and K2=V2
    would do nothing: each is WHAT ..." for several). The features' checks share it (fp8, fused_ce, optimizer=muon)."""
    unused = [k for k in keys if getattr(cfg, k) != type(cfg).__dataclass_fields__[k].default]
    if unused:
        said, out = " and ".join(f"{k}={getattr(cfg, k)!r}" for k in unused), " and ".join(unused)
        raise ValueError(f"{said} would do nothing: {'it' if len(unused) == 1 else 'each'} is {what}. " +
                         (f"Add {way}, or leave {out} out" if way else f"Leave {out} out"))


class Refusals:
    """train.py's row of feature checks: call(check, *args) runs one and returns what it returns. Where the run
    is plainly meant for another machine (`gather`: a GPU preset or GPU flags on a CPU), a check's refusal (ValueError,
    OSError) is kept in `found` instead of raised, and raise_all() raises them together in one line: every
    change named at once, not one per try."""

    def __init__(self, gather):
        self.gather, self.found = gather, []

    def __call__(self, check, *args):
        try:
            return check(*args)
        except (ValueError, OSError) as e:
            if not self.gather:
                raise
            self.found.append(e)

    def raise_all(self, what, otherwise=None, said=None):
        """Raise what was found (the caller may add a ValueError of its own): one refusal as it is; several as a
        ValueError "WHAT: every change it needs, at once: [1] ...; [2] ...[; or OTHERWISE]". said: a way out that
        OTHERWISE gives once for all (memory.cpu_way_out's), taken out of each refusal that offers it too."""
        if len(self.found) == 1:
            raise self.found[0]
        if self.found:
            def trim(text):
                return text.replace(f"; or, {said}", "").replace(f"{said}, or ", "") if said else text
            listed = "; ".join(f"[{i}] {trim(str(e)).rstrip('.')}" for i, e in enumerate(self.found, 1))
            raise ValueError(f"{what}: every change it needs, at once: {listed}" + (f"; or {otherwise}" if otherwise
                                                                                    else ""))


def refuse_unready_kernel(flags, device, verify, way_out, said=None):
    """Raise ValueError, in one line ending with `way_out`, unless the Triton kernels of `flags` (keys set True: one
    name, or several in a tuple; said: how the line names them, for a key set to another value) can run on
    `device`: a CUDA GPU, Triton installed, and verify(device) (a run of the kernels against the PyTorch math there)
    returning None rather than what differs. The features' own kernels share it (head_kernel, cast_kernel.FLAGS:
    fp8_cast_kernel, fp8_gelu_cast, fp8_norm_cast, and gelu_erf='fast')."""
    import importlib.util
    flags = (flags,) if isinstance(flags, str) else tuple(flags)
    said = said or " and ".join(f"{f}=True" for f in flags)
    if device.type != "cuda":
        raise ValueError(f"{said} {'run' if len(flags) > 1 else 'runs'} Triton kernels on a CUDA GPU; this run is on "
                         f"{device.type}: {way_out}")
    if importlib.util.find_spec("triton") is None:
        raise ValueError(f"{said} {'need' if len(flags) > 1 else 'needs'} Triton (pip install triton); {way_out}")
    problem = verify(device)
    if problem:
        raise ValueError(f"{said}: {problem}; {way_out}")
