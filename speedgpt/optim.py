"""
The optimizer and its learning-rate schedule, in one place (nanoGPT's configure_optimizers, nanochat's
optim.py): train.py calls build() once and set_lr() before every step. To add an optimizer or a schedule,
edit this module and its keys in configurator.py.

  optimizer=adamw  AdamW over every parameter: weight decay on matrices (dim >= 2) only (nanoGPT).
  optimizer=muon   Muon (torch.optim.Muon: momentum, then Newton-Schulz orthogonalisation of the update) for the
                   transformer blocks' matrices (the weights of model.GPT.block_linears(), whatever their kind),
                   each one matrix as the model holds it (c_attn's q, k and v together, 3C x C); AdamW for the
                   rest: the token embedding and the output head (one tied matrix by default), the position
                   embedding, the norms' gains and any biases. The recipe of modded-nanogpt (Jordan et al.
                   2024, github.com/KellerJordan/modded-nanogpt) and nanochat (Karpathy 2025,
                   github.com/karpathy/nanochat), which keep embeddings and the head on Adam: muon_lr 0.02
                   (nanochat's matrix_lr), momentum 0.95 with Nesterov, no weight decay on the Muon matrices.
                   Needs one process or DDP (FSDP shards the matrices that Newton-Schulz needs whole).

  lr_schedule=cosine  linear warm-up for warmup_iters, cosine decay to min_lr at lr_decay_iters (nanoGPT).
  lr_schedule=wsd     warm-up, then the peak held ("stable"), then a linear decay to min_lr over the last
                      wsd_decay_frac of lr_decay_iters (warmup-stable-decay, the "trapezoidal" schedule of
                      Hägele et al. 2024, modded-nanogpt's and nanochat's).
  lr_schedule=constant  warm-up, then the peak to the end (nanoGPT's decay_lr=False, with warmup_iters=0 there):
                      for fine-tuning; min_lr and lr_decay_iters do not apply (set, they are refused: check).
  time_budget=M       either shape over M minutes of training time instead of lr_decay_iters steps (lr_at;
                      the clock and the run's end: speedgpt/budget.py); the warm-up stays in steps.

  muon_batched=True   the same update, with the Newton-Schulz iterations of every matrix of one shape run
                      together as batched matmuls (modded-nanogpt batches them too): a few dozen kernels per
                      shape and step instead of per matrix. The default: it measured faster than torch.optim.Muon
                      (BENCHMARKS.md, Optimizers); --muon_batched=False runs torch.optim.Muon itself.
                      Under DDP it also splits the Newton-Schulz work over the processes (BatchedMuon): with
                      GPT-2 124M on 8 GPUs each orthogonalises 6 of the 48 matrices (docs/multi-gpu.md), where
                      torch.optim.Muon runs all 48 on every process.

Each group's peak learning rate is the config's (muon_lr for Muon's, learning_rate for the rest), read at every
step, so a resume that changes it takes effect; the schedule gives every group the same shape, and
min_lr / learning_rate is the floor's share of every peak.
"""
import math
from collections import Counter

import torch
import torch.distributed as dist

from speedgpt import refuse_unused


# the schedule's and the optimizer's keys: a resume keeps the checkpoint's unless set explicitly (speedgpt/resume.py),
# so extending max_iters keeps the decay horizon the run started with, and the optimizer its settings
KEPT_ON_RESUME = ("learning_rate", "min_lr", "warmup_iters", "lr_decay_iters", "lr_schedule", "wsd_decay_frac",
                  "muon_lr", "muon_momentum", "muon_batched", "weight_decay", "beta1", "beta2")


def check(cfg, proc):
    """Raise ValueError naming the keys unless the optimizer settings can work: muon under FSDP (its
    matrices are sharded), a decay fraction outside (0, 1], a non-positive muon_lr; and for a setting of Muon's or
    of WSD's while that is off, or min_lr or lr_decay_iters under lr_schedule=constant (it would do nothing), and
    an lr_schedule this module has no shape for. Returns cfg."""
    if cfg.optimizer == "muon" and proc.world > 1 and cfg.parallelism == "fsdp":
        raise ValueError("optimizer='muon' needs whole matrices for its Newton-Schulz step, and FSDP shards them: "
                         "use --parallelism=ddp, or --optimizer=adamw")
    if not 0 < cfg.wsd_decay_frac <= 1:
        raise ValueError(f"wsd_decay_frac={cfg.wsd_decay_frac}: the share of lr_decay_iters spent decaying, in (0, 1]")
    if cfg.muon_lr <= 0:
        raise ValueError(f"muon_lr={cfg.muon_lr} must be positive "
                         f"({type(cfg).__dataclass_fields__['muon_lr'].default} by default)")
    if not 0 <= cfg.muon_momentum < 1:
        raise ValueError(f"muon_momentum={cfg.muon_momentum}: Muon's momentum is a fraction in [0, 1) "
                         "(0.95 by default)")
    decayed(0.0, cfg, cfg.learning_rate, cfg.min_lr)       # a schedule without a shape here: refused before any work
    if cfg.optimizer != "muon":
        refuse_unused(cfg, ("muon_lr", "muon_momentum", "muon_batched"), "a setting of Muon's", "--optimizer=muon")
    if cfg.lr_schedule != "wsd":
        refuse_unused(cfg, ("wsd_decay_frac",), "the share of a WSD schedule spent decaying",
                      "--lr_schedule=wsd")
    # a resume is left out: it resolves lr_decay_iters for every schedule (speedgpt/resume.py's resolve_decay), and
    # refuses the keys given explicitly there
    if cfg.lr_schedule == "constant" and cfg.init_from != "resume":
        refuse_constant_decay(cfg)
    return cfg


def refuse_constant_decay(cfg):
    """Raise ValueError where cfg sets min_lr or lr_decay_iters away from their defaults: under lr_schedule=constant
    they would do nothing."""
    refuse_unused(cfg, ("min_lr", "lr_decay_iters"), "a setting of a decaying schedule (constant holds "
                  "learning_rate from the warm-up's end)", "--lr_schedule=cosine or --lr_schedule=wsd")


def param_groups(model, cfg):
    """The parameter groups of `model` (a GPT), each a dict with "params", "weight_decay" and, for
    optimizer=muon, "muon": True on the group of block matrices Muon takes (the model names them:
    GPT.block_linears). Each parameter once (the tied embedding / head is one Parameter)."""
    params = [p for p in model.parameters() if p.requires_grad]
    muon = [m.weight for _, _, m in model.block_linears() if m.weight.requires_grad] if cfg.optimizer == "muon" else []
    taken = {id(p) for p in muon}
    rest = [p for p in params if id(p) not in taken]
    groups = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    if muon:
        groups.insert(0, {"params": muon, "weight_decay": 0.0, "muon": True})
    return groups


def build(model, cfg, device):
    """The optimizer of `model` per cfg (see the module's docstring) with every group at its peak learning rate
    (set_lr sets the step's). AdamW's fused kernel when cfg.fused_adamw. Returns a torch.optim.Optimizer."""
    groups = param_groups(model, cfg)
    adamw = dict(lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), **({"fused": True} if cfg.fused_adamw else {}))
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, **adamw)
    if cfg.optimizer != "muon":          # a choice added to configurator.CHOICES, its optimizer not yet here
        raise ValueError(f"optimizer={cfg.optimizer!r} has no optimizer in speedgpt/optim.py's build()")
    return MuonAdamW([g for g in groups if g.get("muon")], [g for g in groups if not g.get("muon")],
                     dict(lr=cfg.muon_lr, momentum=cfg.muon_momentum, nesterov=True, weight_decay=0.0), adamw,
                     muon_class=BatchedMuon if cfg.muon_batched else torch.optim.Muon)


def peak_lr(group, cfg):
    """A parameter group's peak learning rate: muon_lr for Muon's, learning_rate for AdamW's."""
    return cfg.muon_lr if group.get("muon") else cfg.learning_rate


def describe(optimizer, cfg):
    """One line naming each group's optimizer, peak learning rate, weight decay and parameter count."""
    parts, muon = [], getattr(optimizer, "_muon", None)
    for g in optimizer.param_groups:
        n = sum(p.numel() for p in g["params"])
        if n:
            what = f"Muon{' batched' if cfg.muon_batched else ''} (the block matrices; c_attn as one 3C x C matrix)" \
                if g.get("muon") else \
                "AdamW (gains, biases)" if not g["weight_decay"] else \
                "AdamW (matrices)" if cfg.optimizer == "adamw" else "AdamW (the embeddings and head)"
            parts.append(f"{what} lr {peak_lr(g, cfg):g} weight decay {g['weight_decay']:g}, "
                         f"{len(g['params'])} tensors {n / 1e6:.2f}M")
            if g.get("muon") and getattr(muon, "world", 1) > 1:
                shares = muon.shares()
                parts[-1] += f", Newton-Schulz split over {muon.world} processes ({min(shares)}-{max(shares)} " \
                             f"matrices each)"
    return f"optimizer: {cfg.optimizer}, lr_schedule {cfg.lr_schedule}: " + "; ".join(parts)


def lr_at(step, cfg, peak=None, seconds=0.0):
    """The learning rate at optimizer step `step` (from 0) of a group whose peak is `peak` (default
    cfg.learning_rate): warm-up, then cfg.lr_schedule's shape down to peak * min_lr / learning_rate at
    lr_decay_iters (0: max_iters). With cfg.time_budget (minutes) the decay runs on training time instead:
    `seconds` of training before this step over the budget's take the place of step / lr_decay_iters (floor at
    the budget), and the warm-up, still warmup_iters steps (it protects the first updates, whatever they take),
    caps the decay's rate: the lower of the two, so no state beyond (step, seconds) is needed and a resume, which
    continues both (speedgpt/budget.py), gives the same rate at the same elapsed time."""
    peak = cfg.learning_rate if peak is None else peak
    floor = cfg.min_lr if peak == cfg.learning_rate else peak * cfg.min_lr / cfg.learning_rate
    if cfg.time_budget:
        ramp = peak * (step + 1) / (cfg.warmup_iters + 1) if step < cfg.warmup_iters else peak
        return min(ramp, decayed(min(1.0, seconds / (60 * cfg.time_budget)), cfg, peak, floor))
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if step < cfg.warmup_iters:
        return peak * (step + 1) / (cfg.warmup_iters + 1)
    if cfg.lr_schedule == "constant":
        return peak
    if step >= decay_iters:
        return floor
    if cfg.lr_schedule == "wsd":
        start = decay_iters - max(1, round(cfg.wsd_decay_frac * decay_iters))
        if step < max(start, cfg.warmup_iters):
            return peak
        return floor + (peak - floor) * (decay_iters - step) / max(1, decay_iters - max(start, cfg.warmup_iters))
    return decayed((step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters), cfg, peak, floor)


def decayed(x, cfg, peak, floor):
    """The rate at the share x (in [0, 1]) of the decay's horizon: cosine from peak to floor, or for WSD the peak
    held, then linear to floor over the last wsd_decay_frac."""
    if cfg.lr_schedule == "constant":
        return peak
    if cfg.lr_schedule == "wsd":
        return peak if x <= 1 - cfg.wsd_decay_frac else floor + (peak - floor) * (1 - x) / cfg.wsd_decay_frac
    if cfg.lr_schedule == "cosine":
        return floor + 0.5 * (1.0 + math.cos(math.pi * x)) * (peak - floor)
    # a choice added to configurator.CHOICES whose shape is not here yet: refused (check() asks at start), where
    # falling through to cosine would train on a schedule nobody chose
    raise ValueError(f"lr_schedule={cfg.lr_schedule!r} has no shape in speedgpt/optim.py: add it to decayed() "
                     "(lr_at's step schedule reaches it too)")


def set_lr(optimizer, step, cfg, seconds=0.0):
    """Set every group's learning rate for `step` (after `seconds` of training: a time budget's schedule).
    Returns the rates the logs show: {"lr": the groups at cfg.learning_rate's peak (AdamW's), "muon_lr": the
    Muon matrices' with optimizer=muon}."""
    rates = {"lr": lr_at(step, cfg, seconds=seconds)}
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg, peak_lr(group, cfg), seconds)
        if group.get("muon"):
            rates["muon_lr"] = group["lr"]
    return rates


def clip_grad_norm(model, optimizer, scaler, grad_clip):
    """Unscale (float16), then the global gradient norm of `model`, clipped to grad_clip when > 0 (a 0-dim
    tensor, also under FSDP: no host sync). The norm is computed even without clipping: divergence is caught
    by it."""
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class MuonAdamW(torch.optim.Optimizer):
    """Muon for some parameter groups and AdamW for the others, as one torch.optim.Optimizer: one param_groups
    list and one state dict, so the GradScaler, torch.distributed.checkpoint's state dicts and checkpoints
    treat it as any optimizer. step() runs torch.optim.Muon on the first groups and torch.optim.AdamW on the
    others, both over this optimizer's own groups and state."""

    def __init__(self, muon_groups, adamw_groups, muon_kwargs, adamw_kwargs, muon_class=torch.optim.Muon):
        self._muon = muon_class(muon_groups, **muon_kwargs)
        self._adamw = torch.optim.AdamW(adamw_groups, **adamw_kwargs)
        super().__init__(self._muon.param_groups + self._adamw.param_groups, {})
        self._link()

    def _link(self):
        n = len(self._muon.param_groups)
        self._muon.param_groups, self._adamw.param_groups = self.param_groups[:n], self.param_groups[n:]
        self._muon.state = self._adamw.state = self.state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)      # new group dicts and a new state: link the two again
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        self._muon.step()
        self._adamw.step()
        return loss


def orthogonalize(g, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's Newton-Schulz iteration (its _zeropower_via_newtonschulz: bfloat16, the wide
    orientation, each matrix scaled to Frobenius norm 1 first) over a batch of matrices g (k, A, B)."""
    a, b, c = ns_coefficients
    x = g.bfloat16()
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def muon_lr_scale(shape, adjust_lr_fn):
    """torch.optim.Muon's learning-rate adjustment for a matrix of `shape` (A, B)."""
    A, B = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, A / B))
    return 0.2 * math.sqrt(max(A, B)) if adjust_lr_fn == "match_rms_adamw" else 1.0


def owned(rank, world, n, dealt):
    """The indices (of 0..n-1) of the matrices of one shape that process `rank` of `world` orthogonalises, when
    `dealt` matrices of earlier shapes went before them: every matrix, shape after shape, is dealt round the
    processes like a card (matrix i to rank (dealt + i) % world), so the shares of one shape differ by at most
    one matrix and the remainders of successive shapes go to different ranks. One process owns them all."""
    return range((rank - dealt) % world, n, world)


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon's update (momentum, Nesterov, Newton-Schulz, decoupled weight decay, the shape's
    learning-rate scale), with the matrices of one shape stacked and orthogonalised together, and the
    elementwise steps as foreach ops over each shape's list. The same state (one momentum buffer per matrix),
    so a checkpoint of either loads in the other.

    Under DDP with several processes the Newton-Schulz work is split over the ranks, as nanochat's DistMuon and
    modded-nanogpt split it: DDP has averaged the gradients before step(), so every rank holds the same
    gradients and updates every momentum buffer (elementwise, cheap) alike; each rank orthogonalises only the
    matrices owned() gives it, and one all-gather per shape (bfloat16, the Newton-Schulz output's dtype) hands
    every rank every update. The weights and the state stay the same on every rank and the same as one process's,
    bit for bit on the CPU (tests/test_optim.py); a checkpoint does not depend on the world size. The process
    group is the one that exists when the optimizer is built (train.py builds it after setup_processes)."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        split = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if split else (0, 1)

    def shares(self):
        """The number of matrices each rank orthogonalises per step (a list by rank), as step() deals them
        when every matrix has a gradient."""
        counts = [0] * self.world
        for group in self.param_groups:
            dealt = 0
            for n in Counter(tuple(p.shape) for p in group["params"]).values():     # in step()'s order
                for rank in range(self.world):
                    counts[rank] += len(owned(rank, self.world, n, dealt))
                dealt += n
        return counts

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            mu, dealt, gathering = group["momentum"], 0, []
            by_shape = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                by_shape.setdefault(tuple(p.shape), []).append(p)
            for shape, params in by_shape.items():
                grads = [p.grad for p in params]
                bufs = [self.state[p]["momentum_buffer"] for p in params]
                torch._foreach_lerp_(bufs, grads, 1 - mu)
                mine = owned(self.rank, self.world, len(params), dealt)     # all of them, in one process
                update = self._orthogonalised(group, [grads[i] for i in mine], [bufs[i] for i in mine]) \
                    if mine else None
                if self.world == 1:
                    self._apply(group, shape, params, update)
                else:       # each shape's all-gather runs while the next shape is orthogonalised
                    gathering.append(self._all_gather(group, params, update, dealt))
                    if len(gathering) == 2:                   # at most two shapes' buffers at a time
                        gathering.pop(0)()
                dealt += len(params)
            for finish in gathering:
                finish()
        return loss

    @staticmethod
    def _orthogonalised(group, grads, bufs):
        """Newton-Schulz of the (Nesterov) momentum of some matrices of one shape: (k, *shape), bfloat16."""
        update = torch._foreach_lerp(grads, bufs, group["momentum"]) if group["nesterov"] else bufs
        return orthogonalize(torch.stack(update), group["ns_coefficients"], group["ns_steps"], group["eps"])

    def _all_gather(self, group, params, update, dealt):
        """Start the all-gather of the orthogonalised updates of `params` (n matrices of one shape, `dealt`
        matrices dealt before them), of which this rank holds its share `update` (k, *shape; None: k = 0).
        Returns the function that waits for it and applies all n updates."""
        n, shape, device = len(params), params[0].shape, params[0].device
        per_rank = -(-n // self.world)                   # ceil: the largest share; a smaller one is padded
        send = torch.zeros(per_rank, *shape, dtype=torch.bfloat16, device=device)
        if update is not None:
            send[:len(update)] = update
        received = torch.empty(self.world * per_rank, *shape, dtype=torch.bfloat16, device=device)
        # torch 2.13 renamed it all_gather_single (the old name forwards there, warning once per process); the
        # requirements reach back to torch 2.11, which has the old name only
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        work = gather(received, send, async_op=True)

        def finish():
            work.wait()
            i = torch.arange(n, device=device)          # matrix i: the (i // world)-th of rank (dealt + i) % world's
            self._apply(group, shape, params, received.view(self.world, per_rank, *shape)[(dealt + i) % self.world,
                                                                                         i // self.world])
        return finish

    @staticmethod
    def _apply(group, shape, params, update):
        """Decoupled weight decay, then the orthogonalised `update` (n, *shape) at the shape's learning rate."""
        lr, wd = float(group["lr"]), group["weight_decay"]
        if wd:
            torch._foreach_mul_(params, 1 - lr * wd)
        torch._foreach_add_(params, update.to(params[0].dtype).unbind(0),
                            alpha=-lr * muon_lr_scale(shape, group["adjust_lr_fn"]))
