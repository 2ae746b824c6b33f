"""speedgpt/features/gelu_pass.py (gelu_erf='fast' on the MLPs whose GELU no FP8 cast takes) on the CPU: the swap
gives the step of GELU then Linear (the custom ops' CPU path is the formula in PyTorch ops), eager and compiled,
and keeps the checkpoint keys; the flag is refused where it would do nothing or cannot run; the kernels in
Triton's interpreter and compiled for a Hopper GPU. Their values on a GPU: tests/test_gpu.py."""
import copy
import importlib.util

import pytest
import torch
import torch.nn.functional as F

import configurator
from conftest import Launch, hopper_ptx, in_interpreter, on
from model import GPT, GPTConfig
from speedgpt.features import cast_kernel, fp8, gelu_pass


def test_the_formula_is_the_exact_gelu_and_its_derivative_within_its_error():
    """reference(): Abramowitz and Stegun's 7.1.26 (|erf error| <= 1.5e-7) gives GELU and dy * GELU' within
    1.5e-7 * |h| of float64's exact ones (float32 rounding on top), and GELU(h) again in the backward."""
    h = torch.linspace(-10, 10, 8001, dtype=torch.float64)
    dy = torch.randn_like(h)
    hr = h.clone().requires_grad_()
    want = F.gelu(hr)
    want_dh, = torch.autograd.grad(want, hr, dy)
    y = gelu_pass.reference(h.float()).double()
    dh, y2 = gelu_pass.reference(h.float(), dy.float())
    assert ((y - want).abs() <= 1e-7 * h.abs() + 1e-6 * want.abs() + 1e-7).all()
    assert ((dh.double() - want_dh).abs() <= 2e-7 * dy.abs() * (1 + h.abs()) + 1e-6 * want_dh.abs()).all()
    assert torch.equal(y2.double(), y)


@pytest.mark.parametrize("bias,dtype", [(False, "float32"), (True, "float32"), (False, "bfloat16")])
def test_the_swap_gives_the_step_of_gelu_then_linear_and_keeps_the_checkpoint_keys(bias, dtype):
    """apply() turns each MLP's GELU into an identity and its c_proj into GeluLinear (the fast erf's forward, and in
    the backward GELU's derivative with GELU(h) made again): the loss and every gradient of a small GPT are those of
    the model without it, to the formula's error in float32 (c_proj's bias too), to bf16's rounding under bf16
    autocast; the state dict's keys and values are the same, and a checkpoint of either loads into the other."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=128, bias=bias))
    swapped = copy.deepcopy(model)
    line = gelu_pass.apply(swapped, configurator.Config(gelu_erf="fast"), on("cpu"))
    assert line == "gelu_erf: the fast erf in 2 MLPs' GELU passes (speedgpt/features/gelu_pass.py)"
    assert all(type(b.mlp.act) is torch.nn.Identity and type(b.mlp.c_proj) is gelu_pass.GeluLinear
               for b in swapped.transformer.h)
    assert list(swapped.state_dict()) == list(model.state_dict())
    x, y = torch.randint(0, 128, (4, 32)), torch.randint(0, 128, (4, 32))
    losses, grads = [], []
    for m in (model, swapped):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            _, loss = m(x, y)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad for n, p in m.named_parameters()})
    tol = 1e-5 if dtype == "float32" else 2e-2
    assert abs(losses[0] - losses[1]) <= tol * abs(losses[0])
    for n, g in grads[0].items():
        assert torch.allclose(grads[1][n], g, rtol=tol, atol=tol * g.abs().max().item()), n
    swapped.load_state_dict(model.state_dict())
    model.load_state_dict(swapped.state_dict())


def test_the_swap_compiles_to_the_eager_step():
    """Under torch.compile (the custom ops opaque, their fake shapes) the swapped model is one graph, and its loss and
    gradients are its eager ones."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, bias=False))
    gelu_pass.apply(model, configurator.Config(gelu_erf="fast"), on("cpu"))
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    assert torch._dynamo.explain(model)(x, y).graph_break_count == 0
    out = []
    for m in (model, torch.compile(model)):
        model.zero_grad(set_to_none=True)
        _, loss = m(x, y)
        loss.backward()
        out.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    assert abs(out[0][0] - out[1][0]) < 1e-5
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(out[0][1], out[1][1]))


def test_exact_leaves_the_model_as_it_is():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    assert gelu_pass.apply(model, configurator.Config(), on("cpu")) is None
    assert type(model.transformer.h[0].mlp.act) is torch.nn.GELU


def test_the_flag_is_refused_where_it_would_do_nothing_or_cannot_run(hopper, monkeypatch):
    """One line each, with the way out: another activation; every GELU feeding an FP8 Linear whose cast does not take
    it (the way out, fp8_gelu_cast, then passes); a CPU. FP8 on some Linears only leaves bf16 MLPs to serve."""
    def refused(match, proc=hopper, **kw):
        with pytest.raises(ValueError, match=match):
            gelu_pass.check(configurator.Config(gelu_erf="fast", **kw), proc)

    refused(r"^gelu_erf='fast' would do nothing: it is the exact GELU's erf, and activation='relu2' has none\. "
            r"Leave gelu_erf out, or add --activation=gelu$", activation="relu2")
    wide = dict(fp8=True, n_embd=1024, n_head=16)
    refused(r"^gelu_erf='fast' would do nothing: .* Add --fp8_gelu_cast=True \(its casts take the fast erf\), or "
            r"--gelu_erf=exact$", fp8_recipe="tensorwise_delayed", **wide)
    refused(r"Use --fp8_recipe=tensorwise_delayed --fp8_gelu_cast=True \(its casts take the fast erf\), or "
            r"--gelu_erf=exact$", fp8_recipe="tensorwise", **wide)
    for kw in (dict(bias=True), dict(fp8_layers="mlp_proj")):   # fp8_gelu_cast would refuse them: not offered
        refused(r"whose cast does not take it in\. Add --gelu_erf=exact$", fp8_recipe="tensorwise_delayed", **wide, **kw)
    refused(r"^gelu_erf='fast' runs Triton kernels on a CUDA GPU; this run is on cpu: add --gelu_erf=exact$",
            proc=on("cpu"))
    monkeypatch.setattr(gelu_pass, "verify", lambda device: None)          # the kernels right on the stand-in GPU
    monkeypatch.setattr(cast_kernel, "verify", lambda *a, **kw: None)
    find_spec = importlib.util.find_spec                                   # with Triton there (CI has none)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else
                        find_spec(name, *a))
    for kw in (dict(fp8_recipe="tensorwise_delayed", fp8_gelu_cast=True, **wide),      # the way out above
               dict(fp8_recipe="tensorwise_delayed", fp8_layers="qkv,attn_proj", **wide), {}):
        cfg = configurator.Config(gelu_erf="fast", **kw)
        fp8.check(cfg, hopper)
        assert gelu_pass.check(cfg, hopper) is cfg
    monkeypatch.setattr(gelu_pass, "verify", lambda device: "the GELU pass of gelu_erf='fast' gives GELU(h) = 1")
    refused(r"^gelu_erf='fast': the GELU pass of gelu_erf='fast' gives GELU\(h\) = 1; add --gelu_erf=exact$")
    cfg = configurator.Config(gelu_erf="fast", fp8_recipe="tensorwise_delayed", fp8_gelu_cast=True, **wide)
    assert gelu_pass.check(cfg, hopper) is cfg           # every GELU in the casts: these passes never run, unchecked


def test_the_old_name_says_the_new_one():
    with pytest.raises(ValueError, match="'fp8_gelu_erf' .* is not a setting: it is gelu_erf now"):
        configurator.load_config(["--fp8_gelu_erf=fast"])


def test_the_passes_in_the_interpreter():
    """run() in Triton's interpreter, forward and backward, bf16 and float32, over several programs that do not
    divide the tensor: the values of reference() to one step of the dtype (the interpreter truncates where a GPU
    rounds) and 1e-6 where erf cancels, GELU(h) of both passes the same; verify() passes there."""
    in_interpreter(
        "import torch\n"
        "from speedgpt.features import gelu_pass\n"
        "torch.manual_seed(0)\n"
        "for dt, step in ((torch.bfloat16, 2.0 ** -7), (torch.float32, 2.0 ** -22)):\n"
        "    h = (3 * torch.randn(70, 33)).to(dt); dy = torch.randn(70, 33).to(dt)\n"
        "    y = gelu_pass.run(h, block=256)\n"
        "    dh, y2 = gelu_pass.run(h, dy, block=256)\n"
        "    ry = gelu_pass.reference(h); rdh, _ = gelu_pass.reference(h, dy)\n"
        "    assert y.dtype == dh.dtype == dt and torch.equal(y, y2)\n"
        "    near = 1e-6 * (1 + h.float().abs())      # exp2 for exp where erf cancels in 1 - erf (h below -2)\n"
        "    assert ((y.float() - ry).abs() <= step * ry.abs() + near).all()\n"
        "    assert ((dh.float() - rdh).abs() <= step * rdh.abs() + near * dy.float().abs()).all()\n"
        "assert gelu_pass.verify(torch.device('cpu'), (100, 130)) is None\n")


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_each_pass_compiles_for_hopper_without_libdevice_erf(backward, monkeypatch):
    """Each pass as run() launches it at 124M's shape, compiled for sm_90: the fast erf's approximate reciprocal and
    no libdevice erf, loads and stores of 16 bytes (8 bf16 values per thread)."""
    pytest.importorskip("triton", reason="needs Triton (its compiler)")
    forward_kernel, backward_kernel = gelu_pass.kernels()
    jit, launch = (backward_kernel if backward else forward_kernel), Launch()
    monkeypatch.setattr(gelu_pass, "kernels", lambda: (launch, launch))
    h = torch.zeros(65536, 3072, dtype=torch.bfloat16)
    gelu_pass.run(h, torch.zeros_like(h) if backward else None)
    bound = {**dict(zip([p.name for p in jit.params], launch.args)), **launch.kwargs, "PTX": True}
    ptx = hopper_ptx(jit, bound, bound.pop("num_warps"))
    assert "rcp.approx" in ptx and "erf" not in ptx.lower()
    assert "ld.global.v4" in ptx and "st.global.v4" in ptx


def test_after_fp8_the_passes_take_only_the_gelus_its_casts_do_not():
    """With fp8_gelu_cast every MLP's GELU is in its FP8 casts (with the fast erf) and none is swapped here; with the
    MLPs left in bf16 (fp8_layers without fc and mlp_proj) each MLP's GELU is a pass here."""
    from conftest import tiny_model
    fp8_cfg = dict(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32, gelu_erf="fast")
    for extra, line in ((dict(fp8_gelu_cast=True), "2 MLPs' FP8 casts (fp8_gelu_cast)"),
                        (dict(fp8_layers="qkv,attn_proj"), "2 MLPs' GELU passes (speedgpt/features/gelu_pass.py)")):
        model, cfg = tiny_model(n_embd=64), configurator.Config(**fp8_cfg, **extra)
        fp8.convert(model, cfg)
        assert gelu_pass.apply(model, cfg, on("cpu")) == f"gelu_erf: the fast erf in {line}"
        swapped = [type(b.mlp.c_proj) is gelu_pass.GeluLinear for b in model.transformer.h]
        assert swapped == [not cfg.fp8_gelu_cast] * 2
        assert all(getattr(b.mlp.c_proj, "fp8_fast_erf", False) for b in model.transformer.h) == cfg.fp8_gelu_cast


def test_a_later_fp8_gelu_cast_false_keeps_a_config_files_fast_erf(tmp_path):
    """gelu_erf='fast' from a config file stays when a later flag turns fp8_gelu_cast off: without FP8 the bf16 GELU
    passes take it; a later activation without erf drops it (it would do nothing)."""
    (tmp_path / "ge.py").write_text("gelu_erf = 'fast'\n")
    cfg = configurator.load_config(["--config", str(tmp_path / "ge.py"), "--fp8_gelu_cast=False"])
    assert cfg.gelu_erf == "fast"
    cfg = configurator.load_config(["--config", str(tmp_path / "ge.py"), "--activation=relu2"])
    assert cfg.gelu_erf == "exact"
