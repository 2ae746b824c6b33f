"""
The job around the training loop: this process's rank, world size and device (torchrun or a single
process), the batch plan (micro-steps per process from a batch size in tokens), data parallelism
(parallelism = ddp | fsdp: its check and its wrapping of the model), SIGINT/SIGTERM handling, and the
per-step agreement between ranks (loss, divergence, signals).
"""
import os
import signal
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


def print0(*args, **kwargs):
    """print on rank 0 only."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs, flush=True)


class RunStopped(Exception):
    """The run stopped before max_iters on purpose (divergence, a signal) after saving what can be
    saved; `exit_code` is the process's exit status."""
    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Proc:
    """This process's place in the job."""
    rank: int
    local_rank: int
    world: int
    device: torch.device

    @property
    def master(self):
        return self.rank == 0


def device_problem(device):
    """Why `device` (cpu, cuda, cuda:N or mps: a script's --device, its form checked by the caller) cannot run on
    this machine, in words, or None."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        return "no CUDA GPU is available"
    if device == "mps" and not torch.backends.mps.is_available():
        return "Apple's MPS backend is not available here"
    return None


def setup_processes(cfg):
    """Rank, world size and device (resolve_device); the process group when several processes run (torchrun sets
    WORLD_SIZE, RANK, LOCAL_RANK): NCCL with GPU LOCAL_RANK each, or gloo on the CPU. One process
    (WORLD_SIZE unset or 1) needs no process group. Raises resolve_device's ValueError."""
    proc = resolve_device(cfg)
    if proc.device.type == "cuda":
        torch.cuda.set_device(proc.device)
    if proc.world > 1:
        cuda = proc.device.type == "cuda"
        dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=proc.device if cuda else None)
    return proc


def resolve_device(cfg, env=None):
    """The Proc of this process (launch environment `env`, default os.environ: torchrun's WORLD_SIZE, RANK,
    LOCAL_RANK) with no side effect: what setup_processes starts, and what a script checks a run's flags against
    before running it (benchmarks/ab.py). Raises ValueError for an incomplete launch environment, a GPU device
    without CUDA, or more processes per node than visible GPUs."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", 1))
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if world > 1 and missing:
        raise ValueError(f"WORLD_SIZE={world} but {', '.join(missing)} not set: launch several processes with torchrun")
    rank, local_rank = int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0))
    cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ValueError(f"device={cfg.device!r} but {why}: run on the CPU with --device=cpu (or leave --device out: "
                         "auto picks a GPU when there is one)")
    # Apple's GPU (Metal), after CUDA: untested on real hardware; the features that need CUDA refuse it in
    # their checks, as they refuse the CPU (flex, varlen, FP8, compile_tuning, sdpa_backend)
    mps = cfg.device == "mps" or (cfg.device == "auto" and not cuda and world == 1
                                  and torch.backends.mps.is_available())
    if mps and not torch.backends.mps.is_available():
        raise ValueError("device='mps' but Apple's MPS backend is not available here (it needs an Apple silicon Mac "
                         "and torch built with MPS): use --device=cpu")
    if mps and world > 1:
        raise ValueError("device='mps' runs one process (MPS has no process-group backend): launch it without "
                         "torchrun, or use --device=cpu (gloo)")
    if cuda and world > 1:
        per_node, n_gpus = int(env.get("LOCAL_WORLD_SIZE", world)), torch.cuda.device_count()
        if per_node > n_gpus:
            raise ValueError(f"{per_node} processes per node but {n_gpus} visible GPU(s): use torchrun "
                             f"--nproc_per_node={n_gpus} or fewer (or --device=cpu, gloo on the CPU)")
        device = torch.device("cuda", local_rank)
    elif cuda:
        device = torch.device(cfg.device if ":" in cfg.device else "cuda:0")
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"device={cfg.device!r} but only {torch.cuda.device_count()} GPU(s) are visible")
    else:
        device = torch.device("mps" if mps else "cpu")
    return Proc(rank, local_rank, world, device)


def check(cfg, proc):
    """Raise ValueError for a dtype that proc.device cannot compute in: bfloat16 on a GPU without it (before
    Ampere), or on Apple's MPS before macOS 14; and for tf32 off a CUDA GPU, where it does nothing. Returns cfg."""
    device = proc.device
    if cfg.tf32 and device.type != "cuda":
        raise ValueError(f"tf32=True lets an NVIDIA GPU's float32 matmuls run in TF32; on {device.type} it would do "
                         "nothing: leave it out")
    if cfg.dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"dtype='bfloat16' is not supported on {torch.cuda.get_device_name(device)}; use float16")
    if cfg.dtype == "bfloat16" and device.type == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise ValueError("dtype='bfloat16' on MPS needs macOS 14 or newer; use float16, or float32")
    return cfg


def plan_batch(cfg, world, kept=False):
    """Micro-steps per process and optimizer step: total_batch_size tokens for the whole job (0: one
    micro-batch per process) over batch_size x block_size tokens per micro-batch and `world`
    processes (llm.c's total_batch_size). Raises ValueError when it does not divide (`kept`: a resume's
    total_batch_size is the checkpoint's, which the user may never have set)."""
    micro = cfg.batch_size * cfg.block_size * world
    total = cfg.total_batch_size or micro
    if total % micro:
        raise ValueError(f"total_batch_size={total:,} tokens" + (" (the checkpoint's: a resume keeps its step)" if kept
                                                                  else "") +
                         f" is not a multiple of batch_size x block_size x processes = {cfg.batch_size} x "
                         f"{cfg.block_size} x {world} = {micro:,}: change batch_size or total_batch_size")
    return total // micro


def seed_rank_stream(seed, rank):
    """Give rank `rank` a random stream of its own (dropout), after the initial weights were made the same on
    every rank from `seed`: rank 0 keeps the seed's stream, so a single process is unchanged; rank r > 0
    reseeds from (seed, r). The data order does not use these streams (the loader has its own)."""
    if rank:
        torch.manual_seed(seed * 1_000_003 + rank)


def rng_states(proc):
    """[(cpu, cuda) RNG states] of every rank, rank 0's first (a collective: every rank calls it)."""
    mine = (torch.get_rng_state(), torch.cuda.get_rng_state(proc.device) if proc.device.type == "cuda" else None)
    if proc.world == 1:
        return [mine]
    states = [None] * proc.world
    dist.all_gather_object(states, mine)
    return states


def restore_rng_states(rng, proc, seed, step):
    """Set this rank's RNG states from a checkpoint's `rng` ({"ranks": rng_states()}; older checkpoints
    hold rank 0's only). At the world size it was saved with, each rank continues its own stream exactly;
    a rank it did not have gets a fresh stream from (seed, rank, step). Returns whether every rank's
    stream is the saved one."""
    ranks = rng.get("ranks") or [(rng["cpu"], rng["cuda"])]
    if proc.rank < len(ranks):
        cpu, cuda = ranks[proc.rank]
        torch.set_rng_state(cpu)
        if proc.device.type == "cuda" and cuda is not None:
            torch.cuda.set_rng_state(cuda, proc.device)
    else:
        seed_rank_stream(seed + step, proc.rank)
    return len(ranks) == proc.world


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM (what schedulers send before preemption) only set a flag: the loop
    finishes its optimizer step, saves a checkpoint and stops. A Ctrl-C after either aborts a single
    process at once (a repeated SIGTERM does not: schedulers repeat it). Under torchrun the ranks agree on
    the step through the loop's per-step all-reduce, and repeated signals are ignored (torchrun forwards its
    own signal to every worker, and kills them after 30 s)."""

    def __init__(self, distributed):
        self.signum, self.distributed = 0, distributed
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        else:
            self.previous = {}

    def handle(self, signum, frame):
        if self.signum and signum == signal.SIGINT and not self.distributed:   # after a SIGTERM too
            raise KeyboardInterrupt
        if not self.signum:
            print0(f"{signal.Signals(signum).name}: stopping at the end of this step or the next, then saving a "
                   "checkpoint" + ("" if self.distributed else " (Ctrl-C again: abort without saving)"))
            self.signum = signum

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def failed_after_signal(error, signum, checkpoint_note):
    """The RunStopped for `error`, raised in the step a SIGINT/SIGTERM (`signum`) arrived in. A signal sent to the
    whole process group (plain `timeout`, `kill -- -PGID`, a scheduler that signals every process) reaches
    torch.compile's compiler processes too, and a step that was compiling then fails instead of finishing;
    a compiler killed mid-write can also leave a cut-short file in the compile cache. `checkpoint_note`:
    what the last checkpoint holds (checkpoint.last_good). Exit code 128 + signum, as for a clean stop."""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return RunStopped(f"{signal.Signals(signum).name}: the step in progress failed after the signal "
                      f"({type(error).__name__}: {first}); {checkpoint_note}. A signal sent to the whole process "
                      "group also stops torch.compile's compiler processes: send it to the trainer alone (kill PID, "
                      "timeout --foreground), and if the next compile fails with 'file too short', delete the compile "
                      "cache (TORCHINDUCTOR_CACHE_DIR, by default /tmp/torchinductor_$USER)", 128 + signum)


def exit_status(main, setup_done, data_error, out_of_memory_line):
    """Run main() for train.py's command line; return the process's exit status, every early end in one
    line on stderr: a RunStopped (divergence, a signal, a failed write) its own status; bad input or a failed
    write in setup (ValueError, TypeError, OSError before setup_done(), or a `data_error` met in training) 1,
    printed once per node (the other ranks wait a moment, as torchrun stops every worker when one exits);
    out of memory (CUDA's, the CPU allocator's, numpy's: out_of_memory_line(e) names it) that line, as
    sys.exit prints a string; a signal before the loop's own handler 128 + its number. Anything else keeps
    its traceback: after setup, an error is a bug."""
    import sys
    try:
        main()
        return 0
    except RunStopped as e:
        print0(e, file=sys.stderr)
        return e.exit_code
    except (ValueError, TypeError, OSError) as e:      # OSError: a write in setup (a full disk, a read-only folder)
        if setup_done() and not isinstance(e, data_error):
            raise
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        else:
            time.sleep(3)
        return 1
    except (RuntimeError, MemoryError) as e:
        line = out_of_memory_line(e)
        if line is None:
            raise
        return line
    except KeyboardInterrupt as e:             # setup or data preparation (SIGTERM there arrives as one)
        from speedgpt.corpus import interrupt_signal
        signum = interrupt_signal(e)
        print(f"{signal.Signals(signum).name}: " + ("aborted at once (a second Ctrl-C)" if setup_done() else
                                                    "stopped before training, without saving"), file=sys.stderr)
        return 128 + signum


def agree(loss, grad_norm, signum, proc, fp16):
    """Every rank's view of the step, with one host sync (and one all-reduce under torchrun): the job's
    mean loss (a float), whether any rank saw a non-finite loss or gradient norm (float16: an
    overflowing gradient is the GradScaler's to skip, not divergence), and the signal any rank got."""
    bad = ~torch.isfinite(loss) if fp16 else ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
    flags = torch.tensor([signum == signal.SIGINT, signum == signal.SIGTERM], dtype=torch.float32)
    v = torch.cat([loss.float().view(1), bad.float().view(1), flags.to(loss.device, non_blocking=True)])
    if proc.world > 1:
        dist.all_reduce(v)
    loss, n_bad, n_int, n_term = v.tolist()
    return loss / proc.world, n_bad > 0, signal.SIGINT if n_int else signal.SIGTERM if n_term else 0


def on_every_rank(ok, proc):
    """True when the 0-dim tensor `ok` is true on every rank (one host sync; a MIN all-reduce under torchrun)."""
    v = ok.float()
    if proc.world > 1:
        dist.all_reduce(v, op=dist.ReduceOp.MIN)
    return bool(v.item())


def on_rank0(proc, fn, *args):
    """fn(*args) on rank 0 only (out_dir's lock, a write there) and its result (None on the other ranks). Under
    torchrun every rank learns whether it refused (a ValueError, TypeError or OSError; one MIN all-reduce) and
    raises too, so every rank stops here with rank 0's one line (exit_status prints it once), where the others
    ran on into a collective that failed with a traceback of its own when rank 0 left."""
    error, result = None, None
    if proc.master:
        try:
            result = fn(*args)
        except (ValueError, TypeError, OSError) as e:
            error = e
    if proc.world > 1 and not on_every_rank(torch.tensor(error is None, device=proc.device), proc):
        leave(proc, True)     # every rank is here: the group goes now (left to the exit, gloo's threads can abort it)
        raise error or ValueError("rank 0 refused the run (its line above says why)")
    if error is not None:
        raise error
    return result


def leave(proc, clean):
    """Leave the process group (several processes only). When every rank gets here together (`clean`),
    a barrier and a short sleep first: the sleep releases the GIL so gloo's worker threads can free the
    tensors of the last collectives (which needs the GIL); destroying the group while one of them
    waits for it (DDP's reducer holds the group until the model is freed) deadlocks the exit."""
    if proc.world == 1:
        return
    if clean:
        dist.barrier()
        time.sleep(0.05)
    dist.destroy_process_group()
