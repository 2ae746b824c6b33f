"""speedgpt/optim.py: the schedules' shapes, the parameter groups of each optimizer, Muon + AdamW as one
optimizer whose state resumes exactly, Muon's Newton-Schulz split over processes (torchrun with gloo: this
file is also its worker), and fused AdamW stepping as the default one (CPU)."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import configurator
from conftest import on, tiny_model
from model import GPT, GPTConfig
from speedgpt import optim


def tiny():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))


def test_cosine_is_nanogpts_schedule():
    """Warm-up from lr / (warmup + 1), cosine to min_lr at lr_decay_iters, min_lr after: nanoGPT's get_lr,
    written out again here."""
    cfg = configurator.Config(learning_rate=6e-4, min_lr=6e-5, warmup_iters=10, lr_decay_iters=100, max_iters=120)
    for step in range(120):
        if step < 10:
            want = 6e-4 * (step + 1) / 11
        elif step >= 100:
            want = 6e-5
        else:
            ratio = (step - 10) / 90
            want = 6e-5 + 0.5 * (1 + math.cos(math.pi * ratio)) * (6e-4 - 6e-5)
        assert optim.lr_at(step, cfg) == want


def test_wsd_warms_up_holds_then_decays_linearly():
    cfg = configurator.Config(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, lr_decay_iters=100, max_iters=100,
                              lr_schedule="wsd", wsd_decay_frac=0.2)
    lrs = [optim.lr_at(s, cfg) for s in range(101)]
    assert lrs[:10] == sorted(lrs[:10]) and lrs[9] < 1e-3
    assert lrs[10:80] == [1e-3] * 70                                  # stable
    decay = lrs[80:101]
    assert decay == sorted(decay, reverse=True) and decay[-1] == 1e-4
    steps = [a - b for a, b in zip(decay, decay[1:])]
    assert max(steps) - min(steps) < 1e-12                             # linear
    # a group with another peak has the same shape, its floor the same share of its peak
    assert optim.lr_at(50, cfg, peak=0.02) == 0.02 and optim.lr_at(100, cfg, peak=0.02) == pytest.approx(0.002)


def test_constant_warms_up_then_holds_the_peak_to_the_end():
    """lr_schedule=constant (nanoGPT's decay_lr=False, there with no warm-up): no floor and no horizon, so a min_lr
    above learning_rate is no contradiction, in steps or on a time budget (optim.check refuses a min_lr or
    lr_decay_iters given with it, as doing nothing)."""
    cfg = configurator.load_config(["--lr_schedule=constant", "--learning_rate=3e-5", "--min_lr=6e-5",
                                    "--warmup_iters=4", "--lr_decay_iters=10", "--max_iters=50"])
    assert [optim.lr_at(s, cfg) for s in range(50)] == [3e-5 * (s + 1) / 5 for s in range(4)] + [3e-5] * 46
    with pytest.raises(ValueError, match="^min_lr=6e-05 and lr_decay_iters=10 would do nothing"):
        optim.check(cfg, on("cpu"))
    budget = configurator.Config(lr_schedule="constant", learning_rate=1e-3, warmup_iters=0, time_budget=1.0)
    assert optim.lr_at(9, budget, seconds=59.0) == optim.lr_at(9, budget, seconds=90.0) == 1e-3
    with pytest.raises(ValueError, match="min_lr=6e-05 is above learning_rate=3e-05"):
        configurator.load_config(["--learning_rate=3e-5", "--min_lr=6e-5"])      # cosine decays to it


def test_a_schedule_chosen_but_not_written_is_refused_not_run_as_cosine(monkeypatch):
    """A value added to configurator.CHOICES' lr_schedule without its shape here: check() refuses it before any
    work, naming where the shape goes, and lr_at refuses it after the warm-up rather than falling through to
    cosine."""
    monkeypatch.setitem(configurator.CHOICES, "lr_schedule", (*configurator.CHOICES["lr_schedule"], "linear"))
    cfg = configurator.load_config(["--lr_schedule=linear", "--warmup_iters=2", "--max_iters=10"])
    with pytest.raises(ValueError, match=r"^lr_schedule='linear' has no shape in speedgpt/optim\.py: add it to "
                                         r"decayed\(\)"):
        optim.check(cfg, on("cpu"))
    assert optim.lr_at(0, cfg) == cfg.learning_rate / 3                 # the warm-up is every schedule's
    with pytest.raises(ValueError, match="has no shape"):
        optim.lr_at(5, cfg)


def test_a_time_budget_decays_on_the_seconds_trained_and_warms_up_in_steps():
    """time_budget=1 (60 s): the decay's share is seconds / 60, whatever the step; the warm-up's ramp (steps) caps it;
    past the budget, the floor. Without a budget the seconds change nothing."""
    cfg = configurator.Config(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=10**6, time_budget=1.0)
    for step in (10, 500, 90000):                                       # past warm-up: the step does not matter
        assert optim.lr_at(step, cfg, seconds=0.0) == 1e-3
        assert optim.lr_at(step, cfg, seconds=30.0) == pytest.approx(5.5e-4)     # cosine's midpoint
        assert optim.lr_at(step, cfg, seconds=60.0) == optim.lr_at(step, cfg, seconds=600.0) == 1e-4
    curve = [optim.lr_at(50, cfg, seconds=s) for s in range(61)]
    assert curve == sorted(curve, reverse=True) and len(set(curve)) == 61
    assert optim.lr_at(0, cfg, seconds=0.0) == 1e-3 / 11                 # the ramp, in steps
    assert optim.lr_at(9, cfg, seconds=50.0) == optim.lr_at(10, cfg, seconds=50.0) < 1e-3 * 10 / 11   # decay caps it
    wsd = configurator.Config(learning_rate=1e-3, min_lr=1e-4, warmup_iters=0, time_budget=1.0, lr_schedule="wsd")
    assert optim.lr_at(7, wsd, seconds=47.9) == 1e-3                     # stable until the last fifth of the time
    assert optim.lr_at(7, wsd, seconds=54.0) == pytest.approx(5.5e-4)    # linear over it
    assert optim.lr_at(7, wsd, seconds=54.0, peak=0.02) == pytest.approx(0.011)   # another peak, the same shape
    steps = configurator.Config(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, lr_decay_iters=100)
    assert [optim.lr_at(s, steps, seconds=999.0) for s in range(120)] == [optim.lr_at(s, steps) for s in range(120)]


def test_adamw_groups_decay_matrices_only_and_muon_takes_the_block_matrices():
    m = tiny()
    adamw = optim.param_groups(m, configurator.Config())
    assert [len(g["params"]) for g in adamw] == [2 + 4 * 2, 2 * 2 + 1]           # wte, wpe + block matrices; gains
    muon = optim.param_groups(m, configurator.Config(optimizer="muon"))
    by_id = {id(p): n for n, p in m.named_parameters()}
    names = [[by_id[id(p)] for p in g["params"]] for g in muon]
    kinds = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")                # GPT.block_linears
    assert muon[0]["muon"] and sorted(names[0]) == sorted(f"transformer.h.{i}.{k}.weight" for i in range(2)
                                                          for k in kinds)
    assert sorted(names[1]) == ["transformer.wpe.weight", "transformer.wte.weight"]  # the tied head: one tensor
    assert all(p.dim() == 1 for p in muon[2]["params"])
    seen = [id(p) for g in muon for p in g["params"]]
    assert len(seen) == len(set(seen)) == len(list(m.parameters()))


def train_steps(m, opt, cfg, steps, start=0):
    losses = []
    for step in range(start, start + steps):
        optim.set_lr(opt, step, cfg)
        g = torch.Generator().manual_seed(step)
        idx = torch.randint(0, 64, (4, 16), generator=g)
        _, loss = m(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("batched", [False, True])
def test_muon_with_adamw_learns_and_resumes_exactly(batched):
    """Muon on the block matrices and AdamW on the rest, as one optimizer: the loss falls, each group gets its
    own learning rate, and a state dict taken mid-run continues the run exactly (muon_batched too)."""
    cfg = configurator.Config(optimizer="muon", lr_schedule="wsd", learning_rate=1e-2, min_lr=1e-3, warmup_iters=2,
                              max_iters=12, lr_decay_iters=12, muon_batched=batched)
    m = tiny()
    opt = optim.build(m, cfg, torch.device("cpu"))
    assert isinstance(opt, torch.optim.Optimizer)
    straight = train_steps(m, opt, cfg, 12)
    assert straight[-1] < straight[0]
    assert [g["lr"] for g in opt.param_groups] == [optim.lr_at(11, cfg, 0.02)] + [optim.lr_at(11, cfg)] * 2
    first = tiny()
    opt1 = optim.build(first, cfg, torch.device("cpu"))
    head = train_steps(first, opt1, cfg, 6)
    state = {"model": {k: v.clone() for k, v in first.state_dict().items()}, "opt": opt1.state_dict()}
    resumed = tiny()
    resumed.load_state_dict(state["model"])
    opt2 = optim.build(resumed, cfg, torch.device("cpu"))
    opt2.load_state_dict(state["opt"])
    assert head + train_steps(resumed, opt2, cfg, 6, start=6) == straight
    assert any("momentum_buffer" in s for s in opt2.state.values()) and any("exp_avg" in s for s in opt2.state.values())


def test_batched_muon_is_torchs_muon_step_for_step():
    """BatchedMuon (muon_batched) against torch.optim.Muon on matrices of three shapes (wide, tall, square; two
    of each), with weight decay and both learning-rate adjustments: the same parameters after five steps, to
    bfloat16's rounding of the Newton-Schulz matmuls, and the same state, so either loads the other's."""
    torch.manual_seed(0)
    shapes = [(8, 24), (24, 8), (16, 16)] * 2
    for adjust in (None, "match_rms_adamw"):
        start = [torch.randn(s) for s in shapes]
        grads = [[torch.randn(s) for s in shapes] for _ in range(5)]
        runs = []
        for cls in (torch.optim.Muon, optim.BatchedMuon):
            params = [torch.nn.Parameter(p.clone()) for p in start]
            opt = cls(params, lr=0.05, weight_decay=0.1, momentum=0.9, adjust_lr_fn=adjust)
            for g in grads:
                for p, gi in zip(params, g):
                    p.grad = gi.clone()
                opt.step()
            runs.append((params, opt))
        (ref, ref_opt), (got, got_opt) = runs
        moved = max((r - s).abs().max().item() for r, s in zip(ref, start))
        diff = max((r - g).abs().max().item() for r, g in zip(ref, got))
        assert moved > 0.1 and diff < 2e-2 * moved, (adjust, moved, diff)
        for r, g in zip(ref, got):
            torch.testing.assert_close(ref_opt.state[r]["momentum_buffer"], got_opt.state[g]["momentum_buffer"])
        swapped = optim.BatchedMuon([torch.nn.Parameter(p.detach().clone()) for p in ref], lr=0.05)
        swapped.load_state_dict(ref_opt.state_dict())
        assert all("momentum_buffer" in st for st in swapped.state.values()) and len(swapped.state) == len(shapes)


def muon_steps(steps=3):
    """Weights, optimizer state, the describe() line and the matrices orthogonalised here after `steps` Muon +
    AdamW steps (optim.build, as train.py) of a 3-layer GPT (4 shapes of 3 matrices) on seeded gradients that
    every process draws alike, as DDP's averaged gradients are alike. One thread: the CPU's matmuls then add
    up in one order in every process."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=3, n_head=2, n_embd=32))
    cfg = configurator.Config(optimizer="muon", learning_rate=1e-2)
    opt = optim.build(m, cfg, torch.device("cpu"))
    real, threads, orthogonalised = optim.orthogonalize, torch.get_num_threads(), []

    def counting(g, *args):
        orthogonalised.append(len(g))
        return real(g, *args)
    optim.orthogonalize = counting
    torch.set_num_threads(1)
    try:
        for step in range(steps):
            optim.set_lr(opt, step, cfg)
            g = torch.Generator().manual_seed(step)
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
    finally:
        optim.orthogonalize = real
        torch.set_num_threads(threads)
    return dict(model=m.state_dict(), optimizer=opt.state_dict(), describe=optim.describe(opt, cfg),
                orthogonalised=sum(orthogonalised))


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_muon_split_over_processes_equals_one_process(tmp_path, nproc):
    """Under torchrun (gloo, the CPU) each process orthogonalises its share of the 12 matrices (6 or 3 per step,
    not all 12), and every process ends with the weights and optimizer state of one process, bit for bit."""
    from conftest import ROOT
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", __file__,
           str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FutureWarning" not in proc.stderr, proc.stderr[-3000:]     # a deprecated collective warns once per rank
    one = muon_steps()
    assert one["orthogonalised"] == 3 * 12 and "Newton-Schulz split" not in one["describe"]
    for rank in range(nproc):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got["orthogonalised"] == 3 * 12 // nproc, (rank, got["orthogonalised"])
        assert f"Newton-Schulz split over {nproc} processes ({12 // nproc}-{12 // nproc} matrices each)" \
            in got["describe"]
        for name, p in one["model"].items():
            assert torch.equal(got["model"][name], p), (rank, name)
        assert got["optimizer"]["param_groups"] == one["optimizer"]["param_groups"]
        state = one["optimizer"]["state"]
        assert sorted(got["optimizer"]["state"]) == sorted(state)
        assert any("momentum_buffer" in s for s in state.values())
        for i, s in state.items():
            assert all(torch.equal(got["optimizer"]["state"][i][k], v) for k, v in s.items()), (rank, i)


def test_the_deal_of_matrices_to_processes():
    """owned() gives each matrix to one rank, shape after shape round the ranks, so the shares differ by at most
    one matrix; BatchedMuon.shares() counts them: GPT-2 124M's 48 block matrices (4 shapes, 12 layers) on 8
    processes, 6 each. A shape with fewer matrices than ranks leaves some ranks without one."""
    for world, counts in ((8, [12] * 4), (4, [3] * 4), (3, [2, 5, 1]), (5, [7, 7, 7])):
        mine = [[list(optim.owned(r, world, n, sum(counts[:s]))) for s, n in enumerate(counts)] for r in range(world)]
        for s, n in enumerate(counts):
            assert sorted(i for r in range(world) for i in mine[r][s]) == list(range(n))     # each matrix once
        shares = [sum(map(len, m)) for m in mine]
        assert max(shares) - min(shares) <= 1, (world, counts, shares)
    assert [list(optim.owned(r, 3, 1, 7)) for r in range(3)] == [[], [0], []]
    assert list(optim.owned(0, 1, 5, 3)) == [0, 1, 2, 3, 4]                                # one process: all
    C = 768
    gpt2 = [torch.nn.Parameter(torch.empty(s, device="meta")) for _ in range(12)
            for s in ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C))]
    muon = optim.BatchedMuon(gpt2, lr=0.02)
    assert muon.world == 1 and muon.shares() == [48]
    muon.world = 8
    assert muon.shares() == [6] * 8


def test_orthogonalize_gives_near_orthogonal_rows():
    """The batched Newton-Schulz makes each matrix's singular values about 1 (0.5-1.5, as the quintic's
    coefficients intend), wide and tall alike, each matrix on its own scale."""
    torch.manual_seed(0)
    for shape in ((3, 16, 48), (3, 48, 16)):
        g = torch.randn(shape) * torch.tensor([1e-3, 1.0, 1e3]).view(3, 1, 1)
        sv = torch.linalg.svdvals(optim.orthogonalize(g, (3.4445, -4.7750, 2.0315), 5, 1e-7).float())
        assert sv.min() > 0.3 and sv.max() < 1.6, sv


def test_describe_names_each_group():
    m = tiny()
    line = optim.describe(optim.build(m, configurator.Config(optimizer="muon"), torch.device("cpu")),
                          configurator.Config(optimizer="muon"))
    assert line.startswith("optimizer: muon, lr_schedule cosine: Muon batched (the block matrices; c_attn as one 3C x C "
                           "matrix)")
    assert "AdamW (the embeddings and head) lr 0.003" in line and "AdamW (gains, biases)" in line


@pytest.mark.slow
def test_muon_with_wsd_is_no_worse_than_adamw_on_the_quickstart_data(tmp_path):
    """The same steps and tokens on the quickstart's corpus (the stdlib sources, byte tokenizer), a small
    model: Muon + WSD's val loss within 0.02 of AdamW + cosine's, or below (BENCHMARKS.md: the quickstart
    itself, 200 steps, 2.08 against 2.44)."""
    import train
    from conftest import ROOT
    data_dir = os.path.join(ROOT, "data", "stdlib_byte")    # made on first use, as by the quickstart
    common = [f"--data_dir={data_dir}", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64",
              "--batch_size=8", "--max_iters=150", "--eval_interval=150", "--eval_tokens=16384", "--log_interval=50",
              "--save_checkpoints=False"]
    adamw = train.main([*common, f"--out_dir={tmp_path / 'adamw'}"])["val_loss"]
    muon = train.main([*common, f"--out_dir={tmp_path / 'muon'}", "--optimizer=muon", "--lr_schedule=wsd"])["val_loss"]
    assert muon < adamw + 0.02, (muon, adamw)


def test_fused_adamw_matches_default():
    cfgs = [configurator.Config(fused_adamw=f, learning_rate=1e-2) for f in (False, True)]
    models = [tiny_model(), tiny_model()]
    opts = [optim.build(m, c, torch.device("cpu")) for m, c in zip(models, cfgs)]
    assert opts[1].defaults["fused"] and not opts[0].defaults.get("fused")
    assert [len(g["params"]) for g in opts[0].param_groups] == [2 * 4 + 1 + 1, 2 * 2 + 1]  # matrices / vectors
    for step in range(5):
        for m, o in zip(models, opts):
            g = torch.Generator().manual_seed(step)      # the same gradients for both
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            o.step()
    for p, q in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_muon_run_logs_its_matrices_learning_rate(byte_data, tmp_path, capsys):
    """With optimizer=muon each step's line and record carry the Muon group's rate beside AdamW's, the one
    set_lr gave that group (its own peak, muon_lr, on the same schedule)."""
    import train
    from conftest import read_metrics, tiny_args
    train.main(tiny_args(byte_data, tmp_path, "--optimizer=muon", "--lr_schedule=wsd", "--max_iters=6"))
    saved = json.loads((tmp_path / "config.json").read_text())
    cfg = configurator.Config(**{k: v for k, v in saved.items() if k in configurator.Config.__dataclass_fields__})
    rows = [r for r in read_metrics(tmp_path) if "loss" in r and "val_loss" not in r]
    assert [r["step"] for r in rows] == list(range(6))
    assert all(r["muon_lr"] == pytest.approx(optim.lr_at(r["step"], cfg, 0.02)) for r in rows)
    assert rows[3]["muon_lr"] == pytest.approx(0.02) and rows[3]["lr"] == pytest.approx(cfg.learning_rate)
    assert "(muon 2.00e-02)" in capsys.readouterr().out


if __name__ == "__main__":          # a process of test_muon_split_over_processes_equals_one_process
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.save(muon_steps(), os.path.join(sys.argv[1], f"rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()
