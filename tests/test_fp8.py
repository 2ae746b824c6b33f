"""speedgpt/features/fp8.py on the CPU: the rowwise recipe's math (float8 operands multiplied in float32, as
torch._scaled_mm does on the GPU: tests/test_gpu.py compares the two), its conversion, and its refusals; the
conversion of exactly the eligible layers (torchao's recipes, fp8_layers) and the checks (a preset on the CPU,
a resume's shapes); fp8_mm against torchao's Float8Linear, bit for bit (the CPU build of torch runs float8
matmuls). The fused head in float8 (fp8_head) is in tests/test_fused_ce.py."""
from dataclasses import replace

import pytest
import torch

import configurator
import train
from configurator import load_config
from conftest import build_preset as build
from conftest import on
from conftest import poison_step, read_metrics, tiny_args
from model import GPT, GPTConfig
from speedgpt.features import fp8


def test_rowwise_cast_scales_each_row_to_the_float8_range():
    t = torch.randn(64, 96) * torch.logspace(-3, 3, 64)[:, None]      # rows of very different magnitudes
    t[5] = 0                                                          # a row of zeros stays exact
    t8, scale = fp8.rowwise_cast(t)
    assert t8.dtype == torch.float8_e4m3fn and scale.shape == (64, 1)
    assert torch.equal(t8.float().abs().amax(-1)[torch.arange(64) != 5], torch.full((63,), 448.0))
    back = t8.float() * scale
    assert torch.equal(back[5], torch.zeros(96))
    assert ((back - t).norm(dim=-1) / t.norm(dim=-1).clamp(min=1e-30))[torch.arange(64) != 5].max() < 0.05


def against_bf16(cls):
    """A 64 -> 96 Linear swapped to `cls` and the same nn.Linear, both run under bf16 autocast on one input and
    output gradient: relative differences (output, input gradient, weight gradient), and the fp8 Linear."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 96, bias=False)
    lin = torch.nn.Linear(64, 96, bias=False)
    lin.load_state_dict(ref.state_dict())
    lin.__class__ = cls
    x = torch.randn(4, 32, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    gy = torch.randn(4, 32, 96)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_ref = lin(x), ref(x2)
    y.backward(gy)
    y_ref.backward(gy)
    assert y.dtype == torch.bfloat16 and y.shape == (4, 32, 96) and lin.weight.grad.dtype == torch.float32
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    return rel(y, y_ref), rel(x.grad, x2.grad), rel(lin.weight.grad, ref.weight.grad)


def test_rowwise_linear_is_close_to_bf16_and_keeps_the_weight_gradient_in_bf16():
    """Forward and input gradient through float8 (a few percent off bf16), the weight gradient a bf16 matmul of
    the same operands as nn.Linear's (equal to it up to bf16 rounding of the output gradient's path)."""
    y, dx, dw = against_bf16(fp8.RowwiseFloat8Linear)
    assert 1e-3 < y < 0.06 and 1e-3 < dx < 0.06 and dw < 1e-2                 # float8, not bf16; bf16


def test_tensorwise_fused_linear_is_close_to_bf16_with_one_scale_per_tensor():
    """fp8_recipe='tensorwise_fused' on the CPU (float8 operands multiplied in float32): near bf16 in the
    output and both gradients, and its cast takes torchao's tensorwise scale (fp8_max over the whole tensor's
    amax, here found per row first) with the saturating round trip within float8's precision."""
    torch.manual_seed(0)
    t = torch.randn(32, 64) * torch.linspace(0.1, 10, 32)[:, None]
    t8, inv = fp8.tensorwise_cast(t)
    assert t8.dtype == torch.float8_e4m3fn and inv.shape == () and inv.dtype == torch.float32
    assert torch.isclose(inv, t.abs().max() / 448.0) and t8.float().abs().max() == 448.0
    assert ((t8.float() * inv - t).abs() <= t.abs() / 16 + inv).all()            # e4m3: 3 mantissa bits
    g8, _ = fp8.tensorwise_cast(t, torch.float8_e5m2)
    assert g8.dtype == torch.float8_e5m2 and g8.float().abs().max() == 57344.0
    assert all(1e-3 < r < 0.08 for r in against_bf16(fp8.TensorwiseFloat8Linear))   # float8, not bf16


def delayed_linear(n_in=64, n_out=96, **settings):
    torch.manual_seed(0)
    lin = torch.nn.Linear(n_in, n_out, bias=False)
    m = torch.nn.Module()
    m.mlp = torch.nn.Module()
    m.mlp.c_fc = lin
    m.block_linears = lambda: [("mlp.c_fc", "fc", lin)]                # what a GPT answers (model.py)
    cfg = configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32, fp8_layers="fc", **settings)
    assert fp8.convert(m, cfg) == ["mlp.c_fc"]
    return m, lin


def test_delayed_scales_come_from_the_history_each_step_rolls():
    """fp8_recipe='tensorwise_delayed': without history (calibrate()'s pass) it casts like tensorwise_fused;
    end_step after an applied step shifts the step's amax of the input and the output gradient (the max over its
    micro-batches) into the history; later steps scale by the history's largest amax, values past it saturating;
    evaluation records nothing; and the history travels in the layer's state dict (its extra state)."""
    m, lin = delayed_linear()
    assert type(lin) is fp8.DelayedFloat8Linear and not lin.fp8_scaled and lin.fp8_amax.shape == (2, 17)
    ref = torch.nn.Linear(64, 96, bias=False)
    ref.load_state_dict(lin.state_dict(), strict=False)
    ref.__class__ = fp8.TensorwiseFloat8Linear
    [hook] = fp8.step_hooks(m, configurator.Config())
    xs = [torch.randn(32, 64) * s for s in (1.0, 3.0)]
    gy = torch.randn(32, 96)
    for i, x in enumerate(xs):                                        # two micro-batches of step 0
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        y, y_ref = lin(x1), ref(x2)
        (y * gy * (i + 1)).sum().backward()
        (y_ref * gy * (i + 1)).sum().backward()
        assert torch.equal(y, y_ref) and torch.equal(x1.grad, x2.grad)       # dynamic scales: tensorwise_fused's
    bf = lambda t: t.to(torch.bfloat16).float()                       # the layer computes in bf16
    x_amax = max(bf(x).abs().max() for x in xs)
    assert lin.fp8_amax[0, 0] == x_amax and lin.fp8_amax[1, 0] == bf(2 * gy).abs().max()
    hook(True)
    lin.fp8_scaled = True                                             # as calibrate() leaves it
    assert (lin.fp8_amax[:, 0] == 0).all() and lin.fp8_amax[0, 1] == x_amax
    assert lin.fp8_amax[1, 1] == bf(2 * gy).abs().max() and (lin.fp8_amax[:, 2:] == 0).all()
    big = torch.randn(32, 64) * 10                                   # past the history's range: saturates
    y = lin(big)
    x8 = (bf(big) * (448.0 / x_amax)).clamp(-448, 448).to(torch.float8_e4m3fn)
    w8, ws = fp8.tensorwise_cast(lin.weight.to(torch.bfloat16))
    want = fp8.scaled_mm(x8, x_amax / 448.0, w8.t(), ws, torch.bfloat16)
    assert torch.allclose(y.float(), want.float(), rtol=1e-2, atol=1e-2)
    assert lin.fp8_amax[0, 0] == bf(big).abs().max()
    lin.eval()
    with torch.no_grad():
        lin(torch.randn(32, 64) * 100)
    assert lin.fp8_amax[0, 0] == bf(big).abs().max()                  # evaluation records nothing
    hook(True)
    state = m.state_dict()
    assert torch.equal(state["mlp.c_fc._extra_state"], lin.fp8_amax)
    m2, lin2 = delayed_linear()
    m2.load_state_dict(state)
    assert lin2.fp8_scaled and torch.equal(lin2.fp8_amax, lin.fp8_amax)


def test_a_non_finite_or_zero_amax_never_enters_the_history():
    """Transformer Engine's rule: a step whose amax is inf, NaN or 0 keeps the layer's last good scales (its
    history unchanged), a skipped step (applied=False) only resets the running max, and the steps after either
    scale as if the bad step had never been; a checkpoint's non-finite history is not taken (the layer is left
    to calibrate() again), and a good one is."""
    m, lin = delayed_linear()
    [hook] = fp8.step_hooks(m, configurator.Config())
    lin.fp8_amax[:, 1] = torch.tensor([2.0, 0.5])
    lin.fp8_scaled = True
    good = lin.fp8_amax.clone()
    for bad in (float("inf"), float("nan"), 0.0):
        for applied in (True, False):
            lin.fp8_amax[0, 0], lin.fp8_amax[1, 0] = bad, 0.25       # one row bad: that row keeps its history
            hook(applied)
            want = good.clone()
            if applied:
                want[1] = torch.cat([torch.zeros(1), torch.tensor([0.25]), good[1, 1:-1]])
            assert torch.equal(lin.fp8_amax, want), (bad, applied, lin.fp8_amax)
            lin.fp8_amax.copy_(good)
    x = torch.randn(32, 64, requires_grad=True)
    x_bad = x.detach().clone()
    x_bad[3, 5] = float("nan")                                         # a NaN activation, then a NaN gradient
    y = lin(x_bad.requires_grad_())
    y.sum().backward()
    assert lin.fp8_amax[0, 0].isnan() and y.isnan().any()
    hook(False)                                                        # the trainer skips that step
    assert torch.equal(lin.fp8_amax, good)
    y = lin(x)
    (y * float("inf")).sum().backward()                               # an inf gradient
    hook(True)
    assert torch.equal(lin.fp8_amax[1], good[1]) and lin.fp8_amax[0, 1] == x.to(torch.bfloat16).abs().max()
    m2, lin2 = delayed_linear()
    state = {"mlp.c_fc.weight": lin.weight.detach(), "mlp.c_fc._extra_state": torch.full((2, 17), float("nan"))}
    m2.load_state_dict(state)
    assert not lin2.fp8_scaled and lin2.fp8_bad_history and (lin2.fp8_amax == 0).all()
    m2.load_state_dict({**state, "mlp.c_fc._extra_state": good})
    assert lin2.fp8_scaled and not lin2.fp8_bad_history and torch.equal(lin2.fp8_amax, good)


def test_calibrate_gives_the_first_history_and_leaves_the_run_as_it_was(byte_data):
    """calibrate() fills each DelayedFloat8Linear's first history entry from one eager micro-batch (dynamic scales,
    the plain head), so no compiled step sees a layer without history; it leaves gradients, RNG, mode and the
    installed head as they were, and does nothing once every layer has a history."""
    import data
    from speedgpt.features import fused_ce
    cfg = configurator.Config(n_layer=2, n_head=2, n_embd=32, block_size=64, fp8=True,
                              fp8_recipe="tensorwise_delayed", fp8_min_dim=32, fused_ce=True)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_dict(vars(cfg), 257))
    fp8.convert(model, cfg)
    fused_ce.apply(model, cfg)
    head = model.head_loss
    model.eval()
    batch = next(data.Loader(str(byte_data), "train", batch_size=4, block_size=64))
    rng = torch.get_rng_state()
    note = fp8.calibrate(model, batch, torch.autocast("cpu", dtype=torch.bfloat16))
    assert "no amax history yet" in note and "256 tokens" in note
    mods = [m for _, m in fp8.delayed_linears(model)]
    assert len(mods) == 8 and all(m.fp8_scaled for m in mods)
    assert all((m.fp8_amax[:, 0] == 0).all() and (m.fp8_amax[:, 1] > 0).all() for m in mods)
    assert all(p.grad is None for p in model.parameters()) and not model.training and model.head_loss is head
    assert torch.equal(torch.get_rng_state(), rng)
    assert fp8.calibrate(model, batch, torch.autocast("cpu", dtype=torch.bfloat16)) is None


def test_delayed_scales_compile_and_are_refused_with_float16_loss_scaling(hopper):
    """The recipe under torch.compile: the amax recorded in the forward and the backward (no graph break), the
    same outputs and amaxes as eager (bf16 weights and input: Inductor would otherwise skip the rounding to bf16
    before the cast, as it may for any fused cast); float16's moving loss scale is refused in one line."""
    from torch._dynamo.utils import counters
    (_, lin), (_, eager) = delayed_linear(), delayed_linear()
    lin.to(torch.bfloat16), eager.to(torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    counters.clear()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.compile(lin)(x1)
    y.float().sum().backward()
    assert not counters["graph_break"], dict(counters["graph_break"])
    y_eager = eager(x2)
    y_eager.float().sum().backward()
    assert torch.equal(y, y_eager) and torch.equal(lin.fp8_amax, eager.fp8_amax)
    assert lin.fp8_amax[0, 0] == x.abs().max() and lin.fp8_amax[1, 0] == 1.0
    with pytest.raises(ValueError, match="tensorwise_delayed' with dtype=float16: .* --dtype=bfloat16"):
        fp8.check(configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", dtype="float16"), hopper)


def precast_pair():
    """Two delayed layers of the same weights and history, the second with fp8_precast, both calibrated."""
    m, lin = delayed_linear()
    m2, lin2 = delayed_linear(fp8_precast=True)
    cfg = configurator.Config(fp8_precast=True)
    assert torch.equal(lin.weight, lin2.weight)
    assert lin.fp8_precast is None and [t.shape for t in lin2.fp8_precast] == [(3,), (96, 64), (64, 96)]
    for layer in (lin, lin2):
        layer.fp8_amax[:, 1] = torch.tensor([2.5, 0.75])
        layer.fp8_scaled = True
    return (m, lin), (m2, lin2), cfg


@pytest.mark.parametrize("precast", [False, True])
def test_every_scale_handed_to_scaled_mm_is_a_tensor_of_its_own(precast, monkeypatch):
    """cuBLAS's float8 matmul (CUBLAS_STATUS_NOT_SUPPORTED) and Inductor's lowering of torch._scaled_mm refuse a
    scale that is a view at an offset into another tensor, as fp8_precast's inverse scales once were: every scale
    of the three GEMMs, forward and backward, starts its own storage of one float32."""
    seen = []
    real = fp8.scaled_mm

    def record(a8, a_scale, b8, b_scale, *args, **kwargs):
        seen.extend([a_scale, b_scale])
        return real(a8, a_scale, b8, b_scale, *args, **kwargs)
    monkeypatch.setattr(fp8, "scaled_mm", record)
    (m, lin), (m2, lin2), cfg = precast_pair()
    layer, model = (lin2, m2) if precast else (lin, m)
    [hook] = fp8.step_hooks(model, cfg)
    hook(True)
    x = torch.randn(32, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x).float().sum().backward()
    assert len(seen) == 6
    assert all(s.dim() == 0 and s.storage_offset() == 0 and s.untyped_storage().nbytes() == 4 for s in seen), \
        [(s.storage_offset(), s.untyped_storage().nbytes()) for s in seen]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_precast_weights_and_scales_give_exactly_the_casts_made_in_the_step(compiled):
    """fp8_precast=True: the float8 weight, its transposed copy and the scales, made once per step by the step hook
    (cast_weight), give the layer's output and both gradients bit for bit as the casts made inside every
    micro-batch do, step after step as the weights change; stale copies (no hook after a change) would not: the
    layer does read them. Compiled: both layers and the hook's cast_weight (Inductor's float8 cast on the CPU
    rounds a few values unlike eager's, the same in both), equal to float32 rounding."""
    (m, lin), (m2, lin2), cfg = precast_pair()
    [hook] = fp8.step_hooks(m, cfg)
    [hook2] = fp8.step_hooks(m2, replace(cfg, compile=compiled))
    hook(True), hook2(True)                                     # the first entry: both histories roll alike
    run = [torch.compile(layer) if compiled else layer for layer in (lin, lin2)]
    for step in range(3):
        x = torch.randn(32, 64) * (step + 1)
        gy = torch.randn(32, 96)
        outs = []
        for layer in run:
            x1 = x.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = layer(x1)
            (y.float() * gy).sum().backward()
            outs.append((y, x1.grad, layer.weight.grad))
        for a, b in zip(*outs):
            if compiled:        # the CPU's float32 emulation of the float8 matmul may round otherwise when compiled
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * a.abs().max().item())
            else:
                assert torch.equal(a, b), step
        for layer in (lin, lin2):
            with torch.no_grad():
                layer.weight -= 0.05 * layer.weight.grad.sign()   # an optimizer step
            layer.weight.grad = None
        hook(True), hook2(True)
        assert torch.equal(lin.fp8_amax, lin2.fp8_amax)
    with torch.no_grad():
        lin.weight.mul_(3), lin2.weight.mul_(3)                 # changed, and no hook for lin2: its copies are stale
    x = torch.randn(32, 64)
    assert not torch.equal(run[0](x), run[1](x))
    if compiled:                # one graph for every weight shape: a Parameter's shape would be static (a recompile)
        _, lin3 = delayed_linear(32, 48, fp8_precast=True)
        with torch._dynamo.config.patch(error_on_recompile=True):
            fp8.precast([lin3], fp8.precaster(True))
    torch._dynamo.reset()


def test_a_compiled_block_keeps_no_bf16_input_of_its_delayed_linears_for_the_backward():
    """What a compiled GPT with delayed FP8 Linears keeps from its forward for the backward (its graphs' saved
    tensors, seen by saved-tensor hooks): none of those Linears' bf16 inputs, (tokens, in_features), only what their
    float8 casts need. With the amax folded in before the cast (84bb89c to bf01b54), Inductor's partition kept every
    one of them: 7 bytes per token and width in each GPT-2 block on the GPU, 11 GB more at 350M (BENCHMARKS.md, "A
    long run"). The two (tokens, n_embd) tensors the bf16 head keeps for its own backward remain."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=96, n_layer=2, n_head=2, n_embd=64))
    assert len(fp8.convert(model, configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32))) == 8
    for _, _, layer in model.block_linears():
        layer.fp8_amax[:, 1] = torch.tensor([4.0, 1e-3])
        layer.fp8_scaled = True                                 # the history's scales, as after the first step
    saved = []

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t
    compiled, x = torch.compile(model), torch.randint(0, 96, (2, 64))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = compiled(x, x)
    loss.backward()
    inputs = [s for s in saved if s[0] == torch.bfloat16 and s[1] in ((128, 64), (128, 256))]
    assert len(saved) > 8 and len(inputs) <= 2, inputs          # 10 before: the 8 Linears' inputs too
    torch._dynamo.reset()


def test_a_run_with_precast_weights_trains_and_resumes_exactly_as_without(byte_data, tmp_path, monkeypatch):
    """train.py with tensorwise_delayed (float8 emulated on the CPU), two micro-batches per step: fp8_precast=True
    gives the losses of fp8_precast=False step for step, and its resume continues them exactly."""
    monkeypatch.setattr(fp8, "check", lambda cfg, device: None)
    common = ["--max_iters=6", "--lr_decay_iters=6", "--eval_interval=3", "--fp8=True", "--fp8_min_dim=32",
              "--fp8_recipe=tensorwise_delayed", "--total_batch_size=512", "--dtype=bfloat16"]
    train.main(tiny_args(byte_data, tmp_path / "off", *common))
    train.main(tiny_args(byte_data, tmp_path / "on", *common, "--fp8_precast=True"))
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--fp8_precast=True", "--max_iters=3"))
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--fp8_precast=True", "--init_from=resume"))
    losses = lambda d: [r["loss"] for r in read_metrics(tmp_path / d) if "loss" in r]
    assert len(losses("off")) == 6 and losses("on") == losses("off") == losses("part")


def test_precast_is_refused_where_it_would_do_nothing_or_could_not_work(hopper):
    gpu = torch.device("cuda")
    with pytest.raises(ValueError, match="fp8_precast=True would do nothing with fp8_recipe='tensorwise_fused'"):
        fp8.check(configurator.Config(fp8=True, fp8_recipe="tensorwise_fused", fp8_precast=True), on(gpu))
    with pytest.raises(ValueError, match="where FSDP holds only a shard of it: use --parallelism=ddp"):
        fp8.check(configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_precast=True,
                                      parallelism="fsdp"), on(gpu, world=2))
    with pytest.raises(ValueError, match="fp8_precast=True would do nothing: .* Add --fp8=True, or leave fp8_precast"):
        fp8.check(configurator.Config(fp8_precast=True), on(gpu))
    # the fused recipe's way out turns precast off too: not into the refusal above
    with pytest.raises(ValueError, match="dtype=float16: .* use --dtype=bfloat16, or --fp8_recipe=tensorwise_fused "
                                         "--fp8_precast=False$"):
        fp8.check(configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_precast=True, dtype="float16"),
                  on(gpu))


def test_a_delayed_run_resumes_exactly_with_its_amax_history(byte_data, tmp_path, monkeypatch, capsys):
    """train.py with tensorwise_delayed, its float8 matmuls emulated on the CPU (fp8.check, which refuses a CPU,
    let through): a run stopped and resumed gives the losses of the run straight through, step for step (the
    checkpoint carries the amax histories, as the layers' extra state; without them the resumed step would scale
    from a new calibration)."""
    monkeypatch.setattr(fp8, "check", lambda cfg, device: None)
    common = ["--max_iters=8", "--lr_decay_iters=8", "--eval_interval=4", "--fp8=True",
              "--fp8_recipe=tensorwise_delayed", "--fp8_min_dim=32"]
    train.main(tiny_args(byte_data, tmp_path / "full", *common))
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--max_iters=4"))
    ckpt = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=True)
    histories = [v for k, v in ckpt["model"].items() if k.endswith("._extra_state")]
    assert len(histories) == 2 * 4 and all(h[:, 1].min() > 0 for h in histories)
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--init_from=resume"))
    assert "amax history" not in capsys.readouterr().out
    full = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "full") if "loss" in r}
    part = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "part") if "loss" in r}
    assert sorted(part) == sorted(full) == list(range(8))
    for step in range(4, 8):
        assert part[step] == full[step], f"step {step}: resumed {part[step]} vs uninterrupted {full[step]}"


def test_the_amax_history_is_the_layers_state_in_every_checkpoint_reader(byte_data, tmp_path, monkeypatch, capsys):
    """The histories travel as the FP8 layers' extra state: sample.py's plain model leaves them out; an older
    checkpoint's separate fp8_scaling dict is read as that state (its resume continues exactly); a checkpoint whose
    history is not finite is resumed with the first step's scales calibrated again, and says so."""
    import sample
    from speedgpt.checkpoint import load_checkpoint
    monkeypatch.setattr(fp8, "check", lambda cfg, device: None)
    common = ["--max_iters=4", "--eval_interval=2", "--fp8=True", "--fp8_recipe=tensorwise_delayed", "--fp8_min_dim=32"]
    train.main(tiny_args(byte_data, tmp_path / "full", *common))
    train.main(tiny_args(byte_data, tmp_path / "run", *common, "--max_iters=2"))
    model, _ = sample.load_model(str(tmp_path / "run"), "cpu")
    assert not any(k.endswith("_extra_state") for k in model.state_dict())
    path = tmp_path / "run" / "ckpt.pt"
    ckpt = torch.load(path, weights_only=True)
    keys = [k for k in ckpt["model"] if k.endswith("._extra_state")]
    old = {**ckpt, "model": {k: v for k, v in ckpt["model"].items() if k not in keys},
           "fp8_scaling": {k[:-len("._extra_state")]: ckpt["model"][k] for k in keys}}
    torch.save(old, path)
    assert all(torch.equal(load_checkpoint(str(path))["model"][k], ckpt["model"][k]) for k in keys)
    capsys.readouterr()
    train.main(tiny_args(byte_data, tmp_path / "run", *common, "--init_from=resume"))
    assert "amax history" not in capsys.readouterr().out
    losses = lambda d: [r["loss"] for r in read_metrics(tmp_path / d) if "loss" in r]
    assert losses("run") == losses("full")
    ckpt["model"][keys[0]] = torch.full_like(ckpt["model"][keys[0]], float("nan"))
    (tmp_path / "bad").mkdir()
    torch.save(ckpt, tmp_path / "bad" / "ckpt.pt")
    train.main(tiny_args(byte_data, tmp_path / "bad", *common, "--init_from=resume", "--max_iters=3"))
    assert "the checkpoint's amax history is not finite: the first step's scales come from" in capsys.readouterr().out


@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_a_delayed_run_survives_a_non_finite_step(byte_data, tmp_path, monkeypatch, capsys, value):
    """An inf or NaN injected into a step's activations and gradients (float8 emulated on the CPU): the run skips
    that step (max_skipped_steps=1) and trains on, its amax histories finite, and its losses follow the dynamic
    recipe's (tensorwise_fused) under the same injection as they do without one. Before the histories were
    guarded, every step after the injection was non-finite and the run stopped."""
    monkeypatch.setattr(fp8, "check", lambda cfg, device: None)
    calls = poison_step(monkeypatch, 3, value)
    common = ["--max_iters=10", "--eval_interval=5", "--fp8=True", "--fp8_min_dim=32", "--max_skipped_steps=1",
              "--dtype=bfloat16"]
    losses = {}
    for recipe in ("tensorwise_delayed", "tensorwise_fused"):
        capsys.readouterr()
        calls.clear()
        train.main(tiny_args(byte_data, tmp_path / recipe, *common, f"--fp8_recipe={recipe}"))
        assert capsys.readouterr().out.count("update skipped (1 of at most 1)") == 1, recipe
        losses[recipe] = [r["loss"] for r in read_metrics(tmp_path / recipe) if "loss" in r]
    delayed, fused = losses["tensorwise_delayed"], losses["tensorwise_fused"]
    assert len(delayed) == 10 and all(torch.isfinite(torch.tensor(delayed[4:])))
    rel = [abs(a - b) / b for a, b in zip(delayed[4:], fused[4:])]
    assert max(rel) < 0.03, (delayed, fused)
    ckpt = torch.load(tmp_path / "tensorwise_delayed" / "ckpt.pt", weights_only=True)
    histories = [v for k, v in ckpt["model"].items() if k.endswith("._extra_state")]
    assert len(histories) == 8 and all(torch.isfinite(h).all() and (h[:, 1:].amax(1) > 0).all() for h in histories)


def test_the_rowwise_recipe_converts_the_eligible_linears_without_torchao(monkeypatch):
    """fp8_recipe='rowwise_bf16_wgrad' swaps the class of the eligible block Linears (state-dict keys unchanged,
    the head never) and needs no torchao; the model still trains a step on the CPU."""
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else object())
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))
    keys = list(m.state_dict())
    cfg = configurator.Config(fp8=True, fp8_recipe="rowwise_bf16_wgrad", fp8_min_dim=32, fp8_layers="fc,mlp_proj")
    names = fp8.convert(m, cfg)
    assert sorted(names) == [f"transformer.h.{i}.mlp.{k}" for i in range(2) for k in ("c_fc", "c_proj")]
    assert type(m.transformer.h[0].mlp.c_fc) is fp8.RowwiseFloat8Linear
    assert type(m.transformer.h[0].attn.c_attn) is torch.nn.Linear and type(m.lm_head) is torch.nn.Linear
    assert list(m.state_dict()) == keys
    idx = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = m(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and m.transformer.h[0].mlp.c_fc.weight.grad is not None


def test_the_rowwise_recipe_is_refused_where_it_cannot_run(monkeypatch):
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"fp8=True needs a GPU of compute capability 8.9 .* add --fp8=False and "
                                         r"leave out fp8_recipe where the command line gives them$"):
        fp8.check(configurator.Config(fp8=True, fp8_recipe="rowwise_bf16_wgrad"), on(cpu))
    monkeypatch.setattr(fp8, "capability", lambda device: (9, 0))
    with pytest.raises(ValueError, match="fp8_recipe='rowwise_bf16_wgrad' would do nothing"):
        fp8.check(configurator.Config(fp8_head=True, fused_ce=True, fp8_recipe="rowwise_bf16_wgrad"), on(cpu))
    with pytest.raises(ValueError, match="fp8_recipe"):
        configurator.load_config(["--fp8_recipe=rowwise_bf16"])


@pytest.mark.parametrize("argv", [["--n_embd=512", "--n_head=8"],
                                  ["--n_embd=776", "--n_head=8", "--fp8_head=False"]])
def test_a_shape_fp8_would_convert_nothing_in_is_refused_by_check(argv, monkeypatch):
    """config/fast.py made narrower (or not a multiple of 16 wide) on an FP8 GPU: refused by check, before the data
    and the model, not later by convert; bench.py's FP8 blocks rung asks block_width_ok the same."""
    import importlib.util
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    cfg = load_config(["--config", "config/fast.py", *argv])
    assert not fp8.block_width_ok(cfg)
    with pytest.raises(ValueError, match=r"^fp8=True but no Linear layer is eligible: .* fp8_min_dim=768 .* or add "
                                         r"--fp8=False$"):
        fp8.check(cfg, on(torch.device("cuda")))
    monkeypatch.setattr(fp8.cast_kernel, "verify", lambda *a, **k: None)    # fp8_gelu_cast's kernel: run on a GPU only
    fp8.check(load_config(["--config", "config/fast.py"]), on(torch.device("cuda")))       # 768: converts


def test_fp8_converts_exactly_the_eligible_layers():
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear
    m = GPT(GPTConfig(block_size=64, vocab_size=1000, n_layer=2, n_head=4, n_embd=512))
    m.transformer.h[0].attn.c_proj = torch.nn.Linear(512, 256, bias=False)    # narrower than fp8_min_dim
    m.transformer.h[1].mlp.c_proj = torch.nn.Linear(2048, 504, bias=False)    # 504: not a multiple of 16
    converted = fp8.convert(m, configurator.Config(fp8=True, fp8_min_dim=512))
    expected = ["transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj",
                "transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj", "transformer.h.1.mlp.c_fc"]
    assert sorted(converted) == expected                                      # never the output head
    assert sorted(n for n, mod in m.named_modules() if isinstance(mod, Float8Linear)) == expected
    assert m.lm_head.weight is m.transformer.wte.weight
    with pytest.raises(ValueError, match="no Linear layer is eligible"):
        fp8.convert(GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32)),
                    configurator.Config(fp8=True))


def test_fp8_layers_picks_the_kinds_to_convert(hopper):
    """fp8_layers converts the kinds it names (one kind at a time measures FP8 per kind end to end), refuses an
    unknown kind naming the kinds, and is refused without fp8=True (it would do nothing)."""
    pytest.importorskip("torchao")
    for layers, ends in (("fc,mlp_proj", ("mlp.c_fc", "mlp.c_proj")), ("qkv", ("attn.c_attn",)),
                         (" attn_proj ", ("attn.c_proj",))):
        cfg = load_config(["--config", "config/gpt2-large.py", f"--fp8_layers={layers}", "--fp8_gelu_cast=False"])
        _, model = build("config/gpt2-large.py")
        names = fp8.convert(model, cfg)
        assert sorted(names) == sorted(f"transformer.h.{i}.{e}" for i in range(cfg.n_layer) for e in ends)
    gpu = torch.device("cuda")                              # an FP8 GPU (hopper stands in for one)
    for bad, message in (("fc,mlp", "unknown kind mlp; the kinds are qkv, attn_proj, fc, mlp_proj"),
                         (",", "no kind; the kinds are")):
        with pytest.raises(ValueError, match=f"fp8_layers={bad!r}: {message}"):
            fp8.check(load_config(["--config", "config/gpt2-large.py", f"--fp8_layers={bad}"]), on(gpu))
    with pytest.raises(ValueError, match=r"fp8_layers='fc' would do nothing: .* Add --fp8=True"):
        fp8.check(load_config(["--config", "config/fast.py", "--fp8=False", "--fp8_layers=fc"]), on(gpu))


def test_a_preset_on_the_cpu_names_the_way_out():
    cfg = load_config(["--config", "config/gpt2-xl.py"])
    with pytest.raises(ValueError, match=r"fp8=True and fp8_head=True need a GPU .* add --fp8=False --fp8_head=False"):
        fp8.check(cfg, on(torch.device("cpu")))


def test_resume_checks_fp8_shapes_of_the_checkpoint(byte_data, tmp_path, hopper):
    """A resumed run takes n_embd from the checkpoint when it is not set: fp8_head's multiple-of-16 check
    sees that shape (40), not the command's default (128), and refuses before any work (on an FP8 GPU, stood in
    for: on the CPU the device's refusal comes first)."""
    train.main(tiny_args(byte_data, tmp_path, "--n_embd=40", "--n_head=4", "--max_iters=2"))
    shapeless = [a for a in tiny_args(byte_data, tmp_path, "--max_iters=4")
                 if not a.startswith(("--n_embd", "--n_head"))]
    with pytest.raises(ValueError, match=r"fp8_head=True needs n_embd \(40\)"):
        train.main(shapeless + ["--init_from=resume", "--fp8_head=True", "--fused_ce=True"])


def test_fp8_mm_is_torchao_float8_linear_tensorwise():
    """fp8.fp8_mm follows torchao's tensorwise recipe bit for bit: the head's forward and grad-input
    matmuls equal Float8Linear's (a gradient of amax 1, the bound fp8_mm assumes for softmax -
    one-hot), the grad-weight one too in bf16 (fused_ce keeps it in float32). CPU float8 matmul."""
    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear
    torch.manual_seed(0)
    h = torch.randn(256, 64, dtype=torch.bfloat16, requires_grad=True)
    lin = torch.nn.Linear(64, 512, bias=False).bfloat16()
    head = Float8Linear.from_float(lin, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    out = head(h)
    g = torch.randn(256, 512, dtype=torch.bfloat16)
    g = g / g.abs().max()
    out.backward(g)
    w = lin.weight.detach()
    assert torch.equal(fp8.fp8_mm(h.detach(), w.t(), torch.bfloat16, fast_accum=True), out)
    assert torch.equal(fp8.fp8_mm(g, w, torch.bfloat16, a_amax=1.0), h.grad)
    assert torch.equal(fp8.fp8_mm(g.t(), h.detach(), torch.bfloat16, a_amax=1.0), head.weight.grad)
    exact = g.float() @ w.float()
    assert not torch.equal(h.grad.float(), exact)                           # FP8 did round
    torch.testing.assert_close(h.grad.float(), exact, rtol=0.3, atol=0.3 * exact.abs().mean().item())


def test_the_head_without_fused_ce_hears_the_device_first(monkeypatch):
    """fp8_head=True without fused_ce: on a CPU the refusal is the GPU's (fused_ce=True would not help there), on an
    FP8 GPU it is fused_ce's; head_kernel alike (fused_ce.check)."""
    from speedgpt.features import fused_ce
    cfg = configurator.Config(fp8_head=True)
    with pytest.raises(ValueError, match=r"^fp8_head=True needs a GPU of compute capability 8.9 .* the CPU"):
        fp8.check(cfg, on("cpu"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with pytest.raises(ValueError, match=r"^fp8_head=True runs the fused head's matmuls in float8: it needs "
                                         r"fused_ce=True .*--fp8_head=False$"):
        fp8.check(cfg, on(torch.device("cuda")))
    with pytest.raises(ValueError, match=r"^head_kernel=True runs Triton kernels on a CUDA GPU; this run is on cpu"):
        fused_ce.check(configurator.Config(head_kernel=True), on("cpu"))
    with pytest.raises(ValueError, match=r"^head_kernel=True would do nothing: .* Add --fused_ce=True"):
        fused_ce.check(configurator.Config(head_kernel=True), on(torch.device("cuda")))
