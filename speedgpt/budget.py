"""
The training clock, and the time budget it serves (time_budget: "the best model in N minutes").

The clock counts a run's seconds of training: wall time with evaluations and checkpoints left out (paused
around them, as modded-nanogpt stops its clock around validation) and the first step's compilation left out
too. The first step of each start (and of each resume) counts at the second step's time, not its own: the
excess (compile_s, in summary.json) is compilation and allocator warm-up, so a cold compile cache does not
eat a budget and a warm one gains nothing (modded-nanogpt, too, keeps its compile warm-up out of its timed
region). Until a second step has run, the first counts nothing. A resumed run continues the seconds
of its checkpoint. Every evaluation record's train_seconds (time to a target) is this clock's.

With time_budget=M (minutes) the run ends at the first step boundary where the clock reaches M, with its
final evaluation and checkpoint as at max_iters (which stays an upper bound), and the learning rate's decay
runs on the clock instead of on steps (speedgpt/optim.py's lr_at); a resume honours the budget's total.
"""
import time

import torch
import torch.distributed as dist

from speedgpt.distributed import print0

now = time.perf_counter          # the clock's source; tests set a fake one


KEPT_ON_RESUME = ("time_budget",)    # a resume keeps the checkpoint's unless set explicitly (speedgpt/resume.py)


def check(cfg, proc):
    """Raise ValueError (one line, the way out) for a time budget that cannot be meant: a decay horizon in steps
    beside it (lr_decay_iters; the budget is the horizon). Negative values are configurator.py's. Returns cfg."""
    if cfg.time_budget and cfg.lr_decay_iters:
        raise ValueError(f"time_budget={cfg.time_budget:g} decays the learning rate over the budget's training time: "
                         f"lr_decay_iters={cfg.lr_decay_iters} would be a second horizon; leave it out (or "
                         "--lr_decay_iters=0)")
    return cfg


def spent(cfg, seconds):
    """True when cfg.time_budget is on and `seconds` of training have reached it."""
    return cfg.time_budget > 0 and seconds >= 60 * cfg.time_budget


def describe(cfg, seconds):
    """Where `seconds` of training stand against the budget, for people: '4.98 of time_budget=5 min'."""
    return f"{seconds / 60:.2f} of time_budget={cfg.time_budget:g} min"


def describe_end(cfg, seconds, step=None):
    """The line of a budgeted run's end after `seconds` at `step`: the budget spent (inside the warm-up, said: the
    rate may end before warn_at_rate can tell), or max_iters first (the decay unfinished)."""
    if spent(cfg, seconds):
        return f"time_budget={cfg.time_budget:g} min spent ({seconds / 60:.2f} min of training): the last evaluation" + \
            (f" (warning: inside its warm-up, warmup_iters={cfg.warmup_iters:,} steps: the learning rate never reached "
             "its peak; give a smaller --warmup_iters or a larger budget)"
             if step is not None and step < min(cfg.warmup_iters, cfg.max_iters) else "")
    undone = "the budget was not spent" if constant(cfg) else "the learning rate had not finished its decay"
    return f"max_iters={cfg.max_iters} reached after {describe(cfg, seconds)}: {undone} (give a larger --max_iters)"


def constant(cfg):
    """True for lr_schedule=constant, which has no decay for max_iters to cut short: only the budget's last minutes."""
    return cfg.lr_schedule == "constant"


def warn_at_rate(cfg, step, steps, seconds, before):
    """Print (rank 0) a warning once `steps` steps of this start, up to `step`, have taken the clock from `before` to
    `seconds`, for each way the budgeted run goes wrong at that rate: max_iters ends it before its budget, the decay
    unfinished (said again at the end: describe_end); or the budget ends it inside its warm-up (warmup_iters
    counts steps, not time), the learning rate never at its peak. Returns the lines."""
    if not cfg.time_budget:
        return []
    rate = (seconds - before) / max(steps, 1)                      # seconds per step
    end, lines = seconds + (cfg.max_iters - step) * rate, []
    if end < 0.95 * 60 * cfg.time_budget:
        lines.append(f"warning: at this rate max_iters={cfg.max_iters} ends the run after about {describe(cfg, end)}, "
                     f"before {'its budget is spent' if constant(cfg) else 'its learning rate has decayed'}: give a "
                     "larger --max_iters (under a budget, only a bound)")
    last = step + (60 * cfg.time_budget - seconds) / rate if rate > 0 else None     # the step the budget ends at
    if last is not None and last < min(cfg.warmup_iters, cfg.max_iters):
        lines.append(f"warning: at this rate time_budget={cfg.time_budget:g} min ends the run near step {int(last):,}, "
                     f"inside its warm-up (warmup_iters={cfg.warmup_iters:,} steps): the learning rate never reaches "
                     f"its peak; give a smaller --warmup_iters (or a larger budget)")
    for line in lines:
        print0(line)
    return lines


class Clock:
    """A run's seconds of training (see the module's docstring). `before`: the seconds of the checkpoint the run
    continues (0 for a new run). With `proc` (a distributed.Proc of several processes: give it under a time
    budget), each step's reading is rank 0's, sent to every rank, so all take the same learning rate and stop
    after the same step."""

    def __init__(self, before=0.0, proc=None):
        self.before, self.proc = before, proc if proc is not None and proc.world > 1 else None
        self.started, self.paused, self.pause_at = now(), 0.0, None
        self.first = self.second = None        # the wall seconds of this start's first and second steps

    def _wall(self):
        return now() - self.started - self.paused

    def compile_s(self):
        """The first step's seconds beyond the second's (compilation, warm-up), left out of the clock; the whole
        first step until the second has run; None before any step."""
        if self.first is None:
            return None
        return self.first if self.second is None else max(0.0, self.first - self.second)

    def seconds(self, wall=None):
        """Seconds of training so far (this start's wall time read now unless given, less compile_s, plus `before`)."""
        wall = self._wall() if wall is None else wall
        return self.before + wall - (self.compile_s() or 0.0)

    def pause(self):
        """Stop the clock (evaluation, checkpoints: after the device is synced); returns the seconds so far."""
        self.pause_at = now()
        return self.seconds(self.pause_at - self.started - self.paused)

    def resume(self):
        self.paused += now() - self.pause_at

    def step_done(self):
        """Call after each optimizer step's host sync: returns the seconds of training so far, the same on every
        rank when the clock was given a `proc`."""
        wall = self._wall()
        if self.first is None:
            self.first = wall
        elif self.second is None:
            self.second = wall - self.first
        seconds = self.seconds(wall)
        if self.proc is not None:            # one small collective per step, after a sync: the device is idle here
            t = torch.tensor([seconds], dtype=torch.float64, device=self.proc.device)
            dist.broadcast(t, 0)
            seconds = t.item()
        return seconds
