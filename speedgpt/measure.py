"""
What train.py measures and records with: the peak-FLOPs table and MFU, the training clock (Timer: a
device sync before each reading, warm-up and evaluation left out), the metrics logger (console,
metrics.jsonl and W&B, continued across a resume) and the profiler output. The tokens it times are
counted in train.py's loop (real tokens only).
"""
import errno
import json
import math
import os
import statistics
import time
import warnings

import torch

from speedgpt.distributed import RunStopped, print0

PEAK_FLOPS = {   # dense FLOP/s by device-name substring (first match wins) and precision; NVIDIA datasheets
    "H100 PCIe": dict(bf16=756e12, tf32=378e12, fp32=51e12, fp8=1513e12),
    "H100 NVL": dict(bf16=835e12, tf32=418e12, fp32=60e12, fp8=1671e12),
    "H100": dict(bf16=989e12, tf32=494.5e12, fp32=67e12, fp8=1979e12),   # SXM
    "H200": dict(bf16=989e12, tf32=494.5e12, fp32=67e12, fp8=1979e12),   # SXM; same chip as the H100 SXM
    "GH200": dict(bf16=989e12, tf32=494.5e12, fp32=67e12, fp8=1979e12),
    "A100": dict(bf16=312e12, tf32=156e12, fp32=19.5e12),
    "L40S": dict(bf16=362e12, tf32=183e12, fp32=91.6e12, fp8=733e12),
    "L4": dict(bf16=121e12, tf32=60e12, fp32=30.3e12, fp8=242e12),
    "RTX 4090": dict(bf16=165e12, tf32=82.6e12, fp32=82.6e12),   # its FP8 rate with float32 accumulation: unlisted
}


def check(cfg, proc):
    """Raise ValueError unless the logging settings can work: wandb_log=True needs the wandb package. Returns cfg."""
    import importlib.util
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ValueError("wandb_log=True needs the wandb package: pip install wandb (offline: WANDB_MODE=offline), "
                         "or add --wandb_log=False")
    return cfg


def peak_flops_for(device, cfg, precision=None):
    """Peak dense FLOP/s of `device` at the run's precision (bf16 for bfloat16/float16 and for FP8,
    whose MFU is reported against the bf16 peak, as the peers report theirs; tf32 or fp32 for float32), or
    cfg.peak_flops when set; precision='fp8': the FP8 peak (for mfu_fp8; the table's only, never the
    override). None when unknown (a CPU, a GPU missing from PEAK_FLOPS, or without that precision)."""
    if cfg.peak_flops > 0 and precision is None:
        return cfg.peak_flops
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    precision = precision or ("bf16" if cfg.dtype != "float32" else ("tf32" if cfg.tf32 else "fp32"))
    for key, table in PEAK_FLOPS.items():
        if key in name:
            return table.get(precision)
    if precision != "fp8":
        print0(f"warning: no peak FLOP/s known for {name!r}; MFU is null (set --peak_flops=...)")
    return None


def mfu(flops_per_token, tokens_per_sec, peak):
    """Model FLOPs utilisation: flops_per_token * tokens_per_sec / peak (PaLM, Chowdhery et al. 2022,
    Appendix B). Counts real tokens only; recomputation is not counted. None without a peak."""
    return None if not peak else flops_per_token * tokens_per_sec / peak


def ideal_seconds_per_token(flops_per_token, fp8_flops_per_token, peak, fp8_peak):
    """The seconds a token's FLOPs take at the hardware's peaks: those that run in FP8 at the FP8 peak, the rest
    at `peak` (the run's precision). tokens/s times this is mfu_fp8: how far a step is from the hardware, where
    mfu keeps the peers' convention (every FLOP at the bf16 peak), which an FP8 step can pass. Equal to mfu's
    flops_per_token / peak without FP8 FLOPs; None without a peak, or with FP8 FLOPs and no FP8 peak."""
    if not peak or (fp8_flops_per_token and not fp8_peak):
        return None
    return (flops_per_token - fp8_flops_per_token) / peak + (fp8_flops_per_token / fp8_peak if fp8_peak else 0.0)


def sync(device):
    """Wait for the GPU's queued work: before every reading of the clock (CUDA calls are asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":          # Apple's GPU queues its work too
        torch.mps.synchronize()


def cuda_time_ms(fn, warmup=5, iters=20, device=None):
    """Median milliseconds of fn() on the current CUDA stream, by CUDA events, after `warmup` calls: the
    microbenchmarks' clock (benchmarks/attention.py, head_ce.py, roofline.py). With a CPU `device`, the host
    clock instead (for the CPU smoke tests of those scripts)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device is not None and torch.device(device).type == "cpu":
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def start_profile(device):
    """A started torch.profiler over the CPU and, on a GPU, CUDA, with each operation's input shapes (which
    benchmarks/roofline.py reads); write_profile stops and writes it."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                          if device.type == "cuda" else [])
    prof = torch.profiler.profile(activities=activities, record_shapes=True)
    prof.start()
    return prof


def remove_profile(out_dir):
    """Delete out_dir's profile.txt and profile_trace.json.gz, a profiled run's, before it writes its own."""
    for name in ("profile.txt", "profile_trace.json.gz"):
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))


def write_profile(prof, device, out_dir):
    """Stop torch.profiler `prof` and write out_dir/profile.txt (ops by self GPU time, or CPU time on
    the CPU) and out_dir/profile_trace.json.gz (Chrome trace: chrome://tracing or ui.perfetto.dev;
    benchmarks/profile_summary.py sums its GPU kernels by kind)."""
    sync(device)
    with warnings.catch_warnings():       # "Profiler clears events at the end of each cycle": one cycle here
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        prof.stop()
        if int(os.environ.get("RANK", 0)) == 0:
            key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
            with open(os.path.join(out_dir, "profile.txt"), "w") as f:
                f.write(prof.key_averages().table(sort_by=key, row_limit=60))
            prof.export_chrome_trace(os.path.join(out_dir, "profile_trace.json.gz"))
            print0(f"profile of one step written to {out_dir}/profile.txt and profile_trace.json.gz")


class Timer:
    """The training clock, in one place. It starts (after a device sync) once `warmup` optimizer steps of
    this process are done, so compilation and allocator warm-up are never timed; it is paused around
    evaluation and checkpoints; it is read, with a sync, only when a step is logged, so the steps in
    between are timed as a group with no extra sync. Tokens are counted by the caller (real ones only)."""

    def __init__(self, device, warmup):
        self.device, self.warmup, self.done = device, warmup, 0
        self.clock, self.busy, self.tokens, self.steps = None, 0.0, 0, 0

    def step_begins(self):
        """Call before each optimizer step: starts the clock when the warm-up steps are over."""
        if self.done == self.warmup:
            sync(self.device)
            self.clock, self.busy, self.tokens, self.steps = time.perf_counter(), 0.0, 0, 0

    def step_ends(self, tokens):
        """Call after each optimizer step with its real tokens (an int, or a device tensor: no sync)."""
        self.done += 1
        if self.clock is not None:
            self.tokens, self.steps = self.tokens + tokens, self.steps + 1

    def pause(self):
        """Stop counting time (evaluation, checkpoints): sync, then bank the time so far."""
        sync(self.device)
        if self.clock is not None:
            self.busy += time.perf_counter() - self.clock

    def resume(self):
        sync(self.device)
        if self.clock is not None:
            self.clock = time.perf_counter()

    def read(self):
        """(tokens_per_sec, step_ms) over the steps since the last read, or None before the clock starts."""
        if self.clock is None or self.steps == 0:
            return None
        sync(self.device)
        now = time.perf_counter()
        self.busy += now - self.clock
        result = float(self.tokens) / self.busy, 1000 * self.busy / self.steps
        self.clock, self.busy, self.tokens, self.steps = now, 0.0, 0, 0
        return result


def duration(seconds):
    """'1h02m', '3m05s' or '12s': a time left or taken, for people."""
    seconds = max(0, int(round(seconds)))
    h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def eta_seconds(cfg, step, step_ms, train_seconds=None):
    """Seconds of training left after `step` (evaluations and checkpoints not counted): max_iters' remaining steps
    at `step_ms` each, or under time_budget what is left of the budget after `train_seconds` of the training
    clock (speedgpt/budget.py), whichever ends the run first."""
    left = (cfg.max_iters - step - 1) * step_ms / 1000
    if cfg.time_budget and train_seconds is not None:
        left = min(left, 60 * cfg.time_budget - train_seconds)
    return max(0.0, left)


def size(n_bytes):
    """A size for people, in the unit that shows its digits (powers of 10, as BENCHMARKS.md's GB): '1.5 GB',
    '31.2 MB', '10.0 kB'; never '0.0 GB' for a small model."""
    return f"{n_bytes / 1e9:.1f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:.1f} MB" if n_bytes >= 1e6 \
        else f"{n_bytes / 1e3:.1f} kB"


def summary_line(summary):
    """The run's last line: steps, median tokens/s and MFU, best validation loss, the last HellaSwag
    acc_norm (when scored), where things went."""
    tps, mfu_ = summary.get("median_tokens_per_sec"), summary.get("median_mfu")
    parts = [f"{'stopped' if summary.get('stopped') else 'done'}: {summary['steps']:,} steps",
             f"median {tps:,.0f} tok/s" if tps else "no timed steps",
             f"mfu {100 * mfu_:.1f}%" if mfu_ else "mfu n/a",
             f"first step {summary['first_step_s']:.1f} s" if summary.get("first_step_s") else "no step",
             f"best val loss {summary['best_val_loss']:.4f}" if summary.get("best_val_loss") is not None
             else "no validation",
             *([f"hellaswag acc_norm {summary['hellaswag_acc_norm']:.4f}"] if summary.get("hellaswag_acc_norm")
               is not None else []),
             *([("target val loss reached at step {step:,}: {tokens:,} tokens, {train_seconds:.1f} s of training "
                 "(compile and evaluation apart)").format(**summary["target_reached"]) if summary.get("target_reached")
                else "target val loss not reached"] if summary.get("target_val_loss") else []),
             f"checkpoint {summary['checkpoint']}" + (f" (step {summary['checkpoint_step']:,})" if summary.get(
                 "checkpoint_step") not in (None, summary["steps"]) else "") if summary.get("checkpoint")
             else "no checkpoint",
             f"metrics {summary['metrics']} (plot: python plot.py {os.path.dirname(summary['metrics'])})"]
    return " | ".join(parts)


def write_json(path, obj):
    """Write `obj` as JSON to `path` atomically: a temp file, fsync, a rename (never a half-written file)."""
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(obj, f, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    finally:
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")


def strict(record):
    """`record` with every non-finite float replaced by None, so json.dumps writes strict JSON (null, not NaN)."""
    if isinstance(record, dict):
        return {k: strict(v) for k, v in record.items()}
    return None if isinstance(record, float) and not math.isfinite(record) else record


def append_record(path, record):
    """Append `record` to the JSON-lines file `path` as one line, after a newline if its last line was cut short (a
    stop while writing), so the new line is never glued to the fragment (which read_records passes over)."""
    with open(path, "a+b") as f:
        cut = False
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            cut = f.read(1) != b"\n"
        f.write((("\n" if cut else "") + json.dumps(record) + "\n").encode())


def read_records(path):
    """The records of a JSON-lines file of results that runs append to as they finish (bench.py's rows.jsonl,
    time_to_target.py's runs.jsonl), passing over lines that are not a JSON object (cut by a stop, or not UTF-8):
    (records, the numbers of the lines passed over)."""
    records, bad = [], []
    with open(path, errors="replace") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                records.append(record)
            else:
                bad.append(i)
    return records, bad


def read_metrics(path):
    """The records of a metrics.jsonl (or any JSON-lines file), and a note (or None): a last line cut short by a
    crash or a full disk (no newline, not JSON) is dropped and named. Raises ValueError naming the file and line
    for a broken line elsewhere (bytes that are not UTF-8 included)."""
    with open(path, errors="replace") as f:
        lines = f.read().split("\n")
    records, note = [], None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if any(rest.strip() for rest in lines[i + 1:]):
                raise ValueError(f"{path} line {i + 1} is not JSON ({e}): fix or delete that line") from None
            note = f"the last line of {path} was cut short (a run stopped while writing it): dropped"
    return records, note


def order(record):
    """Where a record of metrics.jsonl falls in its history: (step, True for a training step's row), as a step's
    evaluation is logged before its training row."""
    return record["step"], "loss" in record


def wandb_holds_through(run, continued_id, marker):
    """order() of the last record of metrics.jsonl the W&B run `run` surely holds; the later ones are sent
    (again). Nothing, (-1, True), for a run other than `continued_id` (a new one); online, W&B's own count: every
    step before run.starting_step (the step its next log takes); offline, where W&B cannot say, `marker`'s: the
    last record logged before W&B last finished cleanly (out_dir/wandb.json), or nothing without one."""
    if continued_id is None or run.id != continued_id:
        return -1, True
    if not getattr(run, "offline", True):
        return run.starting_step - 1, True
    return (marker["step"], marker["train"]) if marker and marker.get("id") == run.id else (-1, True)


class MetricsLogger:
    """Writes each record (a dict with "step") to out_dir/metrics.jsonl and W&B, and each training step's
    line to the console; on rank 0 only (`master`), as strict JSON. A resumed run continues the same
    file and the same W&B run: the file keeps the records of the steps before `resume_step` (so every
    step appears once, though a killed run may have logged past its last checkpoint). The evaluation made
    at `resume_step` itself, before its checkpoint was saved, is kept unless the resumed run evaluates that
    step again (it does not when its eval_interval no longer falls there). `rewound`: a resume from an older
    checkpoint (resume_from): the records after it, of the abandoned steps, move to metrics.abandoned.jsonl,
    and W&B, which cannot rewind a run, gets a new one. W&B is sent every record from the first step it may
    lack (wandb_holds_through): the kept ones at the start (those a killed process had logged but W&B lost, the
    history for a new W&B run), then the new ones; out_dir/wandb.json records the last step logged when W&B
    finished cleanly. A write that fails (a full disk) stops the run in one line."""

    def __init__(self, cfg, master, resume_step=None, wandb_run_id=None, flops_per_token=0, peak=None, world=1,
                 device=torch.device("cpu"), last_good="", rewound=False, ideal_s=None):
        self.master, self.wandb, self.wandb_through = master, None, (-1, True)
        self.last_good = last_good                        # what a write failure says about the checkpoints
        self.failed = False                               # a write failed (and said so): close() stays quiet
        self.cfg, self.flops_per_token, self.peak, self.world, self.device = cfg, flops_per_token, peak, world, device
        self.ideal_s = ideal_s                            # ideal_seconds_per_token: mfu_fp8 = tokens/s x this
        self.timed = []                                   # (tokens_per_sec, mfu, mfu_fp8) of each timed interval
        self.first_step_s = None                          # the first step's wall time, compilation included
        self.path = os.path.join(cfg.out_dir, "metrics.jsonl")
        self.marker = os.path.join(cfg.out_dir, "wandb.json")  # order() of the last record at W&B's clean finish
        self.held = []                                    # resume_step's evaluation, until recomputed or kept
        self.last = (-1, True)                            # order() of the last record of metrics.jsonl
        if not master:
            return
        kept = []
        if resume_step is not None and os.path.exists(self.path):
            old, note = read_metrics(self.path)
            if note:
                print0(f"resume: {note}")
            kept = [r for r in old if r["step"] < resume_step]
            self.held = [r for r in old if r["step"] == resume_step and "loss" not in r]
            abandoned = [r for r in old if r["step"] >= resume_step and r not in self.held] if rewound else []
            if abandoned:
                aside = os.path.join(cfg.out_dir, "metrics.abandoned.jsonl")
                self.write(lambda: self._rewrite(abandoned, aside, append=True), aside)
                print0(f"resume: metrics.jsonl's {len(abandoned)} records of the abandoned steps "
                       f"{abandoned[0]['step']} to {abandoned[-1]['step']} moved to {aside}")
        self.write(lambda: self._rewrite(kept))
        self.last = max((order(r) for r in kept + self.held), default=(-1, True))
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if cfg.wandb_log:
            import wandb
            from dataclasses import asdict
            self.wandb = wandb
            continued = wandb_run_id if wandb_run_id and not rewound else None    # its id is in the checkpoint
            same_run = {"id": continued, "resume": "allow"} if continued else {}
            try:
                wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None, config=asdict(cfg), **same_run)
            except Exception as e:           # an unwritable folder, no login online: before any step
                os.close(self.fd)
                raise ValueError(f"W&B could not start ({type(e).__name__}: {e}); its files go to WANDB_DIR (now "
                                 f"{os.environ.get('WANDB_DIR') or os.getcwd()}): point it at a writable folder, set "
                                 "WANDB_MODE=offline, or add --wandb_log=False") from None
            self.wandb_through = wandb_holds_through(wandb.run, continued, self._read_marker())
            resend = [r for r in kept if order(r) > self.wandb_through]
            if resend:
                why = ("a new W&B run" if wandb.run.id != continued else "by W&B's own count"
                       if not getattr(wandb.run, "offline", True) else "offline, W&B cannot say what it saved: "
                       "the records since it last finished cleanly")
                print0(f"resume: sending W&B's run {wandb.run.id} the {len(resend)} records of metrics.jsonl of steps "
                       f"{resend[0]['step']} to {resend[-1]['step']} it lacks ({why})")
            for r in resend:
                self._send(r)

    def _rewrite(self, records, path=None, append=False):
        path = path or self.path
        if append and os.path.exists(path):
            records = read_metrics(path)[0] + records
        with open(path + ".tmp", "w") as f:              # rewritten whole, then renamed: never half a file
            f.writelines(json.dumps(r) + "\n" for r in records)
        os.replace(path + ".tmp", path)

    def _read_marker(self):
        try:
            with open(self.marker) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _send(self, record):
        """`record` to W&B, unless W&B holds it (wandb_through)."""
        if self.wandb is not None and order(record) > self.wandb_through:
            self.write(lambda: self.wandb.log({k: v for k, v in record.items() if k != "step"}, step=record["step"]),
                       "the W&B run's files")

    def _flush_held(self):
        try:
            for r in self.held:              # nothing logged since the resume (close() sends them to W&B)
                self._append(r)
        finally:
            os.close(self.fd)

    def _append(self, record):
        """One record as one line, in one write: a write that fails part-way (a full disk) is cut back, so
        the file never ends in half a record."""
        line = (json.dumps(record, allow_nan=False) + "\n").encode()
        end = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            done = 0
            while done < len(line):          # a short write: the next one raises the real cause
                n = os.write(self.fd, line[done:])
                if n == 0:
                    raise OSError(errno.ENOSPC, "no space left on the device")
                done += n
        except OSError:
            try:
                os.ftruncate(self.fd, end)
            except OSError:
                pass
            raise

    def write(self, fn, what=None):
        """Run fn(), a write to out_dir; a failure (a full disk, a read-only or lost mount) stops the run in one
        line naming the file, the cause and the last good checkpoint (RunStopped, exit status 1)."""
        try:
            return fn()
        except OSError as e:
            from speedgpt.shards import describe_os_error
            self.failed = True
            raise RunStopped(f"error: could not write {what or self.path}: {describe_os_error(e)}; "
                             f"{self.last_good() if callable(self.last_good) else self.last_good}", 1) from None

    @property
    def wandb_run_id(self):
        return self.wandb.run.id if self.wandb is not None else None

    def log(self, record):
        if not self.master:
            return
        if self.held:          # the first record since the resume: resume_step's evaluation again, or not
            if not (record["step"] == self.held[0]["step"] and "loss" not in record):
                for r in self.held:
                    self.write(lambda r=r: self._append(r))
                    self._send(r)
            self.held = []
        record = strict(record)
        self.write(lambda: self._append(record))
        self.last = order(record)
        self._send(record)

    def step(self, step, loss, rates, grad_norm, pad_frac, timing, train_seconds=None):
        """Log one training step: `rates` the learning rates the optimizer set ({"lr": ..., and any other group's
        by its name: optim.set_lr}); `timing` is (tokens_per_sec, step_ms) from Timer.read(), or None while
        the clock has not started; tokens/s is for the whole job, MFU per GPU (mfu()). `train_seconds`: the
        training clock's reading (speedgpt/budget.py), which ends a run under time_budget."""
        record = {"step": step, "loss": loss, **rates, "step_ms": None, "tokens_per_sec": None, "mfu": None,
                  "mfu_fp8": None, "mem_gb": None, "pad_frac": pad_frac, "grad_norm": float(grad_norm)}
        if timing is not None:
            tps = timing[0]
            record.update(step_ms=timing[1], tokens_per_sec=tps, tokens_per_sec_per_gpu=tps / self.world,
                          mfu=mfu(self.flops_per_token, tps / self.world, self.peak),
                          mfu_fp8=None if self.ideal_s is None else tps / self.world * self.ideal_s)
            self.timed.append((tps, record["mfu"], record["mfu_fp8"]))
        if self.device.type == "cuda":
            record["mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        self.log_step(record, train_seconds)

    def summary(self, steps, val_loss, best_val_loss):
        """The run's summary: optimizer steps done, last and best validation loss, median tokens/s and MFU
        over the timed intervals, peak GPU memory, and where the checkpoint and the metrics are."""
        def median(xs):
            xs = [x for x in xs if x is not None]
            return statistics.median(xs) if xs else None
        cuda, ckpt = self.device.type == "cuda", os.path.join(self.cfg.out_dir, "ckpt.pt")
        return {"steps": steps, "val_loss": val_loss, "best_val_loss": best_val_loss,
                "median_tokens_per_sec": median(t for t, _, _ in self.timed),
                "median_mfu": median(m for _, m, _ in self.timed),
                "median_mfu_fp8": median(m for _, _, m in self.timed), "timed_intervals": len(self.timed),
                "mem_gb": torch.cuda.max_memory_allocated(self.device) / 1e9 if cuda else None,
                "checkpoint": ckpt if os.path.isfile(ckpt) else None, "metrics": self.path,
                "first_step_s": self.first_step_s}

    def log_step(self, record, train_seconds=None):
        """A training step's record: to the console as one line (with the time left, eta_seconds), then to the
        file and W&B."""
        r, total = record, self.cfg.max_iters
        timing = "warm-up (untimed)"
        if r["tokens_per_sec"]:
            timing = (f"{r['step_ms']:.1f} ms | {r['tokens_per_sec']:,.0f} tok/s | mfu "
                      + (f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a")
                      + f" | eta {duration(eta_seconds(self.cfg, r['step'], r['step_ms'], train_seconds))}")
        if self.master:
            groups = "".join(f" ({k[:-3]} {v:.2e})" for k, v in r.items() if k.endswith("_lr"))   # muon_lr: (muon ...)
            print(f"step {r['step']}/{total} | loss {r['loss']:.4f} | lr {r['lr']:.2e}{groups} | {timing} | "
                  f"pad {r['pad_frac']:.3f}"
                  + (f" | mem {size(r['mem_gb'] * 1e9)}" if r["mem_gb"] else ""), flush=True)
        self.log(record)

    def close(self, summary=None, exit_code=0):
        """Write out_dir/summary.json (strict JSON) and print the run's summary line when there is a
        summary; close the file and the W&B run. A write that fails here (a full disk) after a run that
        ended well raises RunStopped (one line naming the file, the cause and the last good checkpoint; exit
        status 1); after a run that already failed (exit_code != 0, its line said) it stays quiet."""
        if not self.master:
            return
        from speedgpt.shards import describe_os_error
        error, held = None, self.held
        summary_path = os.path.join(self.cfg.out_dir, "summary.json")
        for path, fn in ((self.path, self._flush_held),
                         (summary_path, lambda: summary is not None and write_json(summary_path, strict(summary)))):
            try:
                fn()
            except OSError as e:
                error = error or f"could not write {path}: {describe_os_error(e)}"
        if summary is not None:
            print(summary_line(summary), flush=True)
        if self.wandb is not None:
            try:
                for r in held:
                    if order(r) > self.wandb_through:
                        self.wandb.log({k: v for k, v in r.items() if k != "step"}, step=r["step"])
                if summary:
                    self.wandb.summary.update({k: v for k, v in strict(summary).items() if v is not None})
                run_id = self.wandb.run.id
                self.wandb.finish(exit_code=exit_code)
                write_json(self.marker, {"id": run_id, "step": self.last[0], "train": self.last[1]})   # all held
            except Exception as e:           # its files or its service: the run itself is saved
                error = error or f"could not finish the W&B run: {type(e).__name__}: {e}"
        if error and exit_code == 0 and not self.failed:
            self.failed = True
            raise RunStopped(f"error: {error}; {self.last_good() if callable(self.last_good) else self.last_good}", 1)


def error_line(log_path):
    """The line that says why a train.py process failed, from its log (bench.py and benchmarks/ scripts):
    its last `error: ` line, else its last line that is not a warning."""
    with open(log_path, errors="replace") as f:
        lines = [l for l in f.read().strip().splitlines() if l.strip() and not l.startswith("warning: ")]
    errors = [l for l in lines if l.startswith("error: ")]
    return (errors or lines or ["no output"])[-1]
