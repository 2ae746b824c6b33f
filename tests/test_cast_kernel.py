"""speedgpt/features/cast_kernel.py (fp8_cast_kernel) on the CPU: the delayed layer goes through the custom op in
its forward and backward and gives the step of the PyTorch ops (the op's CPU path is its reference), eager and
compiled; the flag is refused where it cannot work; the Triton kernel in Triton's interpreter. Its bytes on a GPU:
tests/test_gpu.py."""
import dataclasses
import re
import sys
import types

import pytest
import torch

import configurator
from conftest import in_interpreter, on
from speedgpt.features import cast_kernel, fp8, gelu_pass


def delayed_layer(kernel):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16)
    m = torch.nn.Module()
    m.mlp = torch.nn.Module()
    m.mlp.c_fc = lin
    m.block_linears = lambda: [("mlp.c_fc", "fc", lin)]                # what a GPT answers (model.py)
    cfg = configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32, fp8_cast_kernel=kernel)
    fp8.convert(m, cfg)
    lin.fp8_amax[:, 1] = torch.tensor([2.0, 1e-3])                     # a history: scales known before the cast
    lin.fp8_scaled = True
    return lin


@pytest.fixture
def op_calls(monkeypatch):
    """cast_amax's CPU path (reference), counted: (e5m2, gelu, with gelu_input) of each call, in order."""
    calls, reference = [], cast_kernel.reference

    def counted(x, scale, amax, e5m2=False, gelu=False, gelu_input=None):
        calls.append((e5m2, gelu, gelu_input is not None))
        return reference(x, scale, amax, e5m2, gelu, gelu_input)
    monkeypatch.setattr(cast_kernel, "reference", counted)
    return calls


@pytest.mark.parametrize("compiled", [False, True])
def test_the_kernel_path_gives_the_step_of_the_pytorch_ops(compiled, op_calls):
    """With fp8_cast_kernel the layer casts x in its forward and dy in its backward through cast_amax (e4m3 row 0,
    e5m2 row 1 of the history), the weight gradient taking the transposed copies it makes, and its output, both
    gradients and the amax the step recorded are those of the layer without the flag, bit for bit; values past the
    scale's range saturate alike."""
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(32, 64, generator=g)).bfloat16()                 # past 2.0: some values saturate
    dy = torch.randn(32, 96, generator=g).bfloat16()
    outs = []
    for kernel in (False, True):
        lin = delayed_layer(kernel)
        xi = x.clone().requires_grad_()
        y = (torch.compile(lin) if compiled else lin)(xi)
        y.backward(dy)
        outs.append((y, xi.grad, lin.weight.grad, lin.fp8_amax))
    assert op_calls == [(False, False, False), (True, False, False)]
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    amax = outs[1][3]
    assert amax[0, 0] == x.abs().max() and amax[1, 0] == dy.abs().max()
    assert torch.equal(amax[:, 1], torch.tensor([2.0, 1e-3]))             # the history untouched


def gelu_mlp(fused, dtype=torch.bfloat16, erf="exact"):
    """A GPT's MLP (model.py) with c_fc and c_proj converted to delayed FP8 layers (fp8_gelu_cast as `fused`), their
    histories set (a little above this test's amaxes) so that the scales are known before the cast."""
    import types

    import model
    torch.manual_seed(0)
    m = torch.nn.Module()
    m.mlp = model.MLP(types.SimpleNamespace(n_embd=64, bias=False, activation="gelu", dropout=0.0)).to(dtype)
    m.block_linears = lambda: [("mlp.c_fc", "fc", m.mlp.c_fc), ("mlp.c_proj", "mlp_proj", m.mlp.c_proj)]
    fp8.convert(m, configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32,
                                       fp8_gelu_cast=fused, gelu_erf=erf))
    for lin, history in ((m.mlp.c_fc, [8.0, 1.3]), (m.mlp.c_proj, [5.0, 4.5])):
        lin.fp8_amax[:, 1] = torch.tensor(history)
        lin.fp8_scaled = True
    return m.mlp


@pytest.mark.parametrize("compiled", [False, True])
def test_gelu_in_the_cast_gives_the_mlp_step_of_gelu_then_cast(compiled, op_calls, monkeypatch):
    """fp8_gelu_cast: convert makes the MLP's act an identity and c_proj takes the pre-activation h; its forward casts
    GELU(h) through cast_amax (GELU in float32, cast once, as compiled code does) and records the amax of GELU's
    output; its backward hands on the gradient of GELU's output, and c_fc's backward casts that times GELU'(h)
    through cast_amax and records the amax of the product. The plain eager path rounds GELU's output, and its
    derivative's, to bfloat16 before the cast, so the two agree to that rounding, not bit for bit: about one value in
    32 lands on a float8 rounding midpoint and moves one step (6%), so the output and every gradient agree within 2%
    of their norm, eager and compiled. Evaluating runs GELU first, without the op, as the MLP without the flag."""
    g = torch.Generator().manual_seed(1)
    x = (2 * torch.randn(64, 64, generator=g)).bfloat16()
    dy = torch.randn(64, 64, generator=g).bfloat16()
    outs, amax = [], []
    for fused in (False, True):
        mlp = gelu_mlp(fused)
        assert isinstance(mlp.act, torch.nn.Identity) == fused and mlp.c_proj.fp8_gelu == mlp.c_fc.fp8_gelu_out == fused
        xi = x.clone().requires_grad_()
        y = (torch.compile(mlp) if compiled else mlp)(xi)
        y.backward(dy)
        outs.append((y, xi.grad, mlp.c_fc.weight.grad, mlp.c_proj.weight.grad))
        amax.append(torch.stack([mlp.c_fc.fp8_amax[:, 0], mlp.c_proj.fp8_amax[:, 0]]))
        if fused:
            h = mlp.c_fc(x).detach()
            assert mlp.c_proj.fp8_amax[0, 0] == torch.nn.functional.gelu(h.float()).abs().max()
    assert op_calls == [(False, True, False), (True, False, True)]         # c_proj's x forward, c_fc's dy backward
    for a, b in zip(*outs):
        assert (a.float() - b.float()).norm() <= 0.02 * b.float().norm(), ((a - b).float().norm() / b.float().norm())
    assert torch.allclose(*amax, rtol=0.01)                               # c_fc's dy amax: GELU's derivative's too
    mlp = gelu_mlp(True).eval()
    monkeypatch.setattr(cast_kernel, "reference", lambda *a: pytest.fail("the op ran in evaluation"))
    with torch.no_grad():
        assert torch.equal(mlp(x), gelu_mlp(False).eval()(x))


def test_gelu_in_the_cast_without_scales_gives_the_mlp_step_bit_for_bit(op_calls):
    """Calibrating (no history yet: dynamic scales, which need the tensor first), both layers of fp8_gelu_cast run
    GELU and its derivative as the MLP does, before their casts: the step of the MLP without the flag, bit for bit,
    and the op never runs."""
    g = torch.Generator().manual_seed(2)
    x = (2 * torch.randn(64, 64, generator=g)).bfloat16()
    dy = torch.randn(64, 64, generator=g).bfloat16()
    outs = []
    for fused in (False, True):
        mlp = gelu_mlp(fused)
        for lin in (mlp.c_fc, mlp.c_proj):
            lin.fp8_scaled = False
        xi = x.clone().requires_grad_()
        y = mlp(xi)
        y.backward(dy)
        outs.append((y, xi.grad, mlp.c_fc.weight.grad, mlp.c_proj.weight.grad, mlp.c_fc.fp8_amax, mlp.c_proj.fp8_amax))
    assert op_calls == []
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_the_fast_erf_reaches_both_casts_of_gelu_in_the_cast_and_is_refused_without_them(monkeypatch):
    """gelu_erf='fast': convert marks both Linears around the MLP's GELU, and the cast of c_proj's input
    (forward) and of c_fc's output gradient (backward) hand the op fast_erf=True; 'exact' (the default) hands False.
    The values of the fast erf: the interpreter test below, and tests/test_gpu.py on a GPU. Without fp8_gelu_cast,
    with every MLP's Linears in FP8, the setting would do nothing and is refused in one line naming the way out
    (speedgpt/features/gelu_pass.py: it takes the GELU of the bf16 MLPs)."""
    calls, op = [], cast_kernel.cast_amax

    def recorded(x, scale, amax, row, e5m2, gelu=False, gelu_input=None, fast_erf=False):
        calls.append((gelu, gelu_input is not None, fast_erf))
        return op(x, scale, amax, row, e5m2, gelu, gelu_input)
    monkeypatch.setattr(cast_kernel, "cast_amax", recorded)
    x = torch.randn(64, 64).bfloat16().requires_grad_()
    for erf in ("fast", "exact"):
        mlp = gelu_mlp(True, erf=erf)
        assert mlp.c_fc.fp8_fast_erf == mlp.c_proj.fp8_fast_erf == (erf == "fast")
        mlp(x).sum().backward()
        assert calls == [(True, False, erf == "fast"), (False, True, erf == "fast")], calls
        calls.clear()
    monkeypatch.setattr(fp8, "capability", lambda device: (9, 0))          # an FP8 GPU, stood in for
    cfg = configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", n_embd=1024, n_head=16, gelu_erf="fast")
    fp8.check(cfg, on("cuda"))
    with pytest.raises(ValueError, match=r"^gelu_erf='fast' would do nothing: every MLP's GELU feeds an FP8 Linear "
                                         r"whose cast does not take it in. Add --fp8_gelu_cast=True \(its casts take "
                                         r"the fast erf\), or --gelu_erf=exact$"):
        gelu_pass.check(cfg, on("cuda"))


def test_gelu_in_the_cast_reaches_every_block_of_a_gpt_and_keeps_its_checkpoint_keys():
    """On a GPT, convert folds each block's GELU into its c_proj (and only there); the state dict's keys are those
    of the model without the flag, so checkpoints load either way; a GELU of another form is left alone."""
    from conftest import tiny_model
    cfg = dict(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32)
    plain, folded = tiny_model(n_embd=64), tiny_model(n_embd=64)
    fp8.convert(plain, configurator.Config(**cfg))
    fp8.convert(folded, configurator.Config(**cfg, fp8_gelu_cast=True))
    for block in folded.transformer.h:
        assert isinstance(block.mlp.act, torch.nn.Identity)
        assert block.mlp.c_proj.fp8_gelu and block.mlp.c_fc.fp8_gelu_out
        assert not block.mlp.c_fc.fp8_gelu and not block.attn.c_proj.fp8_gelu and not block.mlp.c_proj.fp8_gelu_out
    assert list(plain.state_dict()) == list(folded.state_dict())
    tanh = tiny_model(n_embd=64, activation="gelu_tanh")
    with pytest.raises(ValueError, match="no MLP's exact GELU lies between two FP8 Linears"):
        fp8.convert(tanh, configurator.Config(**cfg, fp8_gelu_cast=True))
    biased = tiny_model(n_embd=64, bias=True)
    with pytest.raises(ValueError, match=r"no MLP's exact GELU lies between two FP8 Linears of this model \(the first "
                                         r"without bias\)"):
        fp8.convert(biased, configurator.Config(**cfg, fp8_gelu_cast=True))


@pytest.mark.parametrize("flag, extra, message", [
    ("fp8_gelu_cast", dict(activation="relu2"), "fp8_gelu_cast=True folds the MLP's GELU into the casts of the FP8 "
     "Linears around it, and activation='relu2' is not the exact GELU: use --activation=gelu, or add "
     "--fp8_gelu_cast=False"),
    ("fp8_gelu_cast", dict(fp8_layers="qkv,fc"), "and the MLP's c_proj (4096 -> 1024) is not converted with "
     "fp8_layers='qkv,fc' and fp8_min_dim=1024: convert it (mlp_proj in fp8_layers, fp8_min_dim at most 1024), or "
     "add --fp8_gelu_cast=False"),
    ("fp8_gelu_cast", dict(fp8_layers="qkv"), "and the MLP's c_fc (1024 -> 4096) and c_proj (4096 -> 1024) are not "
     "converted with fp8_layers='qkv' and fp8_min_dim=1024: convert them (fc and mlp_proj in fp8_layers, fp8_min_dim "
     "at most 1024), or add --fp8_gelu_cast=False"),
    ("fp8_gelu_cast", dict(bias=True), "and bias=True puts c_fc's bias between its matmul and GELU: use --bias=False, "
     "or add --fp8_gelu_cast=False"),
    ("fp8_norm_cast", dict(norm="rmsnorm"), "fp8_norm_cast=True folds the LayerNorm into the cast of the FP8 Linear "
     "it feeds, and norm='rmsnorm' is not LayerNorm: use --norm=layernorm, or add --fp8_norm_cast=False"),
    ("fp8_norm_cast", dict(fp8_layers="attn_proj,mlp_proj"), "and neither the qkv nor the fc Linear (1024 wide in) "
     "is converted with fp8_layers='attn_proj,mlp_proj' and fp8_min_dim=1024: convert them (qkv or fc in "
     "fp8_layers, fp8_min_dim at most 1024), or add --fp8_norm_cast=False"),
])
def test_a_fold_with_nothing_to_fold_is_refused_with_its_way_out(flag, extra, message, hopper):
    """fp8_gelu_cast without an exact GELU between two FP8 Linears (another activation, a Linear not converted,
    c_fc's bias), fp8_norm_cast without a LayerNorm feeding one (RMSNorm, neither Linear converted): one line with
    the way out, on an FP8 GPU (stood in for)."""
    cfg = configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", n_embd=1024, n_head=16, **{flag: True},
                              **extra)
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        fp8.check(cfg, hopper)


@pytest.mark.parametrize("extra", [dict(activation="relu2"), dict(bias=True), dict(fp8_layers="qkv"),
                                   dict(fp8_recipe="tensorwise_fused"), dict(dtype="float16"),
                                   dict(dtype="float16", fp8_precast=True)])
def test_a_way_out_with_the_fast_erf_is_not_refused_next(extra, hopper):
    """With gelu_erf='fast' beside fp8_gelu_cast, a refusal's last way out turns both off (gelu_erf alone
    is refused as doing nothing), and the config it gives passes fp8.check: no loop of refusals."""
    cfg = configurator.Config(**{**dict(fp8=True, fp8_recipe="tensorwise_delayed", n_embd=1024, n_head=16,
                                        fp8_gelu_cast=True, gelu_erf="fast"), **extra})
    with pytest.raises(ValueError) as e:
        fp8.check(cfg, hopper)
    last = str(e.value).rsplit(", or ", 1)[1]
    assert "--fp8_gelu_cast=False --gelu_erf=exact" in last, str(e.value)
    way = dict(re.findall(r"--(\w+)=(\w+)", last))
    fp8.check(dataclasses.replace(cfg, **{k: {"False": False}.get(v, v) for k, v in way.items()}), hopper)


def test_evaluation_records_nothing_and_skips_the_kernel(monkeypatch):
    monkeypatch.setattr(cast_kernel, "reference", lambda *a: pytest.fail("the op ran in evaluation"))
    lin = delayed_layer(True).eval()
    with torch.no_grad():
        lin(torch.randn(8, 64).bfloat16())
    assert (lin.fp8_amax[:, 0] == 0).all()


@pytest.mark.parametrize("flag", cast_kernel.FLAGS)
def test_each_cast_flag_is_refused_where_it_would_do_nothing_or_cannot_run(flag, monkeypatch):
    """Every flag of cast_kernel.FLAGS: off an FP8 GPU the device's refusal names it among the FP8 settings to leave
    out; without fp8 it is a detail that does nothing (never "add --fp8=True" where FP8 cannot run); with another
    recipe it does nothing (only delayed scales are known before the cast); its kernels need a CUDA GPU, and
    several flags are named at once."""
    delayed = dict(fp8=True, fp8_recipe="tensorwise_delayed", n_embd=1024, n_head=16, **{flag: True})
    with pytest.raises(ValueError, match=f"this run is on the CPU: add --fp8=False and leave out fp8_recipe, {flag} "
                                         "where the command line gives them$"):
        fp8.check(configurator.Config(**delayed), on("cpu"))
    with pytest.raises(ValueError, match=f"^{flag}=True would do nothing: it is a setting of the block Linears' FP8, "
                                         f"which needs a GPU .* on the CPU\\). Leave {flag} out$"):
        fp8.check(configurator.Config(**{flag: True}), on("cpu"))
    with pytest.raises(ValueError, match=f"^fp8_head=True needs a GPU .* on the CPU: add --fp8_head=False and leave "
                                         f"out {flag} where the command line gives them"):   # both at once
        fp8.check(configurator.Config(fp8_head=True, fused_ce=True, **{flag: True}), on("cpu"))
    cast_kernel.check(configurator.Config(), torch.device("cpu"))          # off: nothing to check
    with pytest.raises(ValueError, match=f"^{flag}=True runs Triton kernels on a CUDA GPU; this run is on cpu: add "
                                         f"--{flag}=False$"):
        cast_kernel.check(configurator.Config(**delayed), torch.device("cpu"))
    other = next(f for f in cast_kernel.FLAGS if f != flag)
    a, b = (f for f in cast_kernel.FLAGS if f in (flag, other))                 # named in FLAGS' order
    with pytest.raises(ValueError, match=f"^{a}=True and {b}=True run Triton kernels on a CUDA GPU; this run is on "
                                         f"cpu: add --{a}=False --{b}=False$"):
        cast_kernel.check(configurator.Config(**delayed, **{other: True}), torch.device("cpu"))
    monkeypatch.setattr(fp8, "capability", lambda device: (9, 0))          # an FP8 GPU, stood in for
    with pytest.raises(ValueError, match=f"{flag}=True would do nothing with fp8_recipe='tensorwise_fused'"):
        fp8.check(configurator.Config(**{**delayed, "fp8_recipe": "tensorwise_fused"}), on("cuda"))


def test_verify_runs_only_the_kernels_of_the_flags_given_and_names_a_wrong_transposed_copy(monkeypatch):
    """A kernel that writes a foreign byte into the transposed copy of GELU's derivative only (what an H100 showed):
    fp8_gelu_cast is refused in a line that names the derivative and the transposed copy; fp8_cast_kernel and
    fp8_norm_cast, which never run that case, are not. The way out names the flag (--X=False: a preset may have set
    it), and a CUDA 13 ptxas unless Triton compiles with one already."""
    def run(x, scale, amax, e5m2=False, gelu=False, transpose=False, out=None, gelu_input=None, **_):
        got = cast_kernel.reference(x, scale, amax, e5m2, gelu, gelu_input)
        got_t = got.t().contiguous()
        if gelu_input is not None:
            got_t.view(torch.uint8)[0, 5] ^= 0x60
        return got, got_t
    monkeypatch.setattr(cast_kernel, "run", run)
    monkeypatch.setattr(cast_kernel, "_verify_norm", lambda *a: None)
    monkeypatch.setattr(cast_kernel, "_verified", {})
    ptxas = types.SimpleNamespace(version="12.8")                  # the ptxas Triton compiles with (triton.knobs)
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(     # its line names the version
        __version__="3.6.0", knobs=types.SimpleNamespace(nvidia=types.SimpleNamespace(ptxas=ptxas))))
    cpu = torch.device("cpu")
    problem = cast_kernel.verify(cpu, (40, 24), flags=("fp8_gelu_cast",))
    assert problem and "GELU's derivative" in problem and "1 in the transposed copy" in problem, problem
    assert cast_kernel.verify(cpu, (40, 24), flags=("fp8_cast_kernel",)) is None
    assert cast_kernel.verify(cpu, (40, 24), flags=("fp8_norm_cast",)) is None
    assert cast_kernel.verify(cpu, (40, 24)) == problem                        # every flag's cases by default
    monkeypatch.setattr(cast_kernel, "refuse_unready_kernel", lambda *a: None)      # as if on a CUDA GPU with Triton
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cfg = configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_gelu_cast=True, fp8_norm_cast=True,
                              fp8_cast_kernel=True)
    with pytest.raises(ValueError) as e:                     # the way out names only the flag whose kernel is wrong
        cast_kernel.check(cfg, cpu)
    assert str(e.value).startswith("fp8_gelu_cast=True: ") and str(e.value).endswith(
        "; add --fp8_gelu_cast=False (the others passed), or set TRITON_PTXAS_PATH to a CUDA 13 ptxas (this Triton "
        "compiles with ptxas 12.8)"), str(e.value)
    ptxas.version = "13.0"                                         # TRITON_PTXAS_PATH naming one already
    with pytest.raises(ValueError) as e:
        cast_kernel.check(cfg, cpu)
    assert str(e.value).endswith("; add --fp8_gelu_cast=False (the others passed)"), str(e.value)
    # with gelu_erf='fast' the way out takes it too (alone it would be refused as doing nothing) ...
    fast = configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_gelu_cast=True, fp8_norm_cast=True,
                               fp8_cast_kernel=True, gelu_erf="fast")
    with pytest.raises(ValueError) as e:
        cast_kernel.check(fast, cpu)
    assert str(e.value).endswith("; add --fp8_gelu_cast=False --gelu_erf=exact (the others passed)"), str(e.value)
    # ... and where only the fast erf's passes are wrong, the way out is the exact erf
    monkeypatch.setattr(cast_kernel, "_verified", {})
    monkeypatch.setattr(cast_kernel, "run", lambda *a, fast_erf=False, **k: run(*a, **k) if fast_erf else
                        right(*a, **k))

    def right(x, scale, amax, e5m2=False, gelu=False, transpose=False, out=None, gelu_input=None, **_):
        got = cast_kernel.reference(x, scale, amax, e5m2, gelu, gelu_input)
        return got, got.t().contiguous()
    with pytest.raises(ValueError, match=r"^gelu_erf='fast': Triton .* times GELU's derivative with "
                                         r"gelu_erf='fast' .*; add --gelu_erf=exact \(the exact erf's passes "
                                         r"are right here\)$"):
        cast_kernel.check(fast, cpu)
    cast_kernel.check(cfg, cpu)                                              # the exact erf: every pass right


def test_the_kernel_in_the_interpreter():
    """run() in Triton's interpreter, both float8 formats, on tiles that do not divide the shape, its amax a view into
    row 1 of a layer's history: the amax is x's largest |value| folded into what was there, the rest of the history
    untouched, every value cast as reference() casts it, to the interpreter's float8 rounding (not a GPU's: the bytes
    are compared on a GPU only), the transposed copy the same bytes transposed, and the same bytes without it; GELU
    in front (e4m3) and GELU's derivative (e5m2) as reference() computes them; the LayerNorm kernel (with and
    without weight and bias) as norm_reference(), its row statistics too."""
    code = ("import torch\n"
            "from speedgpt.features import cast_kernel\n"
            "torch.manual_seed(0)\n"
            "x = (torch.randn(70, 200) * 2).bfloat16()\n"
            "for e5m2 in (False, True):\n"
            "    hist = torch.full((2, 17), 0.5)\n"
            "    scale = torch.tensor((57344.0 if e5m2 else 448.0) / 4)\n"
            "    out, out_t = cast_kernel.run(x, scale, hist[1, 0:1], e5m2, transpose=True, block=(16, 64))\n"
            "    assert out_t.shape == (200, 70) and torch.equal(out_t.view(torch.uint8), out.view(torch.uint8).t())\n"
            "    assert torch.equal(cast_kernel.run(x, scale, torch.zeros(1), e5m2).view(torch.uint8), "
            "out.view(torch.uint8))\n"
            "    want_hist = torch.full((2, 17), 0.5); want = cast_kernel.reference(x, scale, want_hist[1, 0:1], e5m2)\n"
            "    assert torch.equal(hist, want_hist), (hist, want_hist)\n"
            "    a, w = out.float(), want.float()\n"   # the interpreter does not round float8 as a GPU does
            "    assert out.dtype == want.dtype and ((a * w) >= 0).all() and ((a - w).abs() <= 0.5 * "
            "torch.maximum(a.abs(), w.abs()) + 2 ** -6).all(), e5m2\n"
            "amax, want_amax = torch.zeros(1), torch.zeros(1)\n"       # fp8_gelu_cast's: GELU first, e4m3
            "out = cast_kernel.run(x, torch.tensor(100.0), amax, gelu=True).float()\n"
            "want = cast_kernel.reference(x, torch.tensor(100.0), want_amax, gelu=True).float()\n"
            "assert torch.allclose(amax, want_amax) and ((out - want).abs() <= 0.5 * want.abs() + 2 ** -6).all()\n"
            # with the transposed copy: as 32-bit words at 68 rows (run() picks them for GELU), byte by byte at 70
            "for rows in (68, 70):\n"
            "    out, out_t = cast_kernel.run(x[:rows], torch.tensor(100.0), torch.zeros(1), gelu=True, transpose=True)\n"
            "    assert torch.equal(out_t.view(torch.uint8), out.view(torch.uint8).t()), rows\n"
            "    assert torch.equal(out.view(torch.uint8), cast_kernel.run(x[:rows], torch.tensor(100.0), torch.zeros(1), "
            "gelu=True).view(torch.uint8)), rows\n"
            # gelu_erf='fast': the cheaper erf, within the same rounding of the exact GELU
            "for rows in (68, 70):\n"
            "    amax, wa = torch.zeros(1), torch.zeros(1)\n"
            "    out, out_t = cast_kernel.run(x[:rows], torch.tensor(100.0), amax, gelu=True, transpose=True, "
            "fast_erf=True)\n"
            "    w8 = cast_kernel.reference(x[:rows], torch.tensor(100.0), wa, gelu=True).float()\n"
            "    assert torch.equal(out_t.view(torch.uint8), out.view(torch.uint8).t()) and torch.allclose(amax, wa)\n"
            "    assert ((out.float() - w8).abs() <= 0.5 * w8.abs() + 2 ** -6).all(), rows\n"
            "h, amax, want_amax = (torch.randn(70, 200) * 2).bfloat16(), torch.zeros(1), torch.zeros(1)\n"
            "out = cast_kernel.run(x, torch.tensor(1000.0), amax, True, gelu_input=h).float()\n"  # its backward, e5m2
            "want = cast_kernel.reference(x, torch.tensor(1000.0), want_amax, True, gelu_input=h).float()\n"
            "assert torch.allclose(amax, want_amax) and ((out - want).abs() <= 0.5 * want.abs() + 2 ** -6).all()\n"
            "t8, t8_t = cast_kernel.run(x, torch.tensor(1000.0), torch.zeros(1), True, transpose=True, gelu_input=h)\n"
            "assert torch.equal(t8_t.view(torch.uint8), t8.view(torch.uint8).t())\n"     # the byte tile (BYTE_TILE)
            "assert ((t8.float() - want).abs() <= 0.5 * want.abs() + 2 ** -6).all()\n"
            "amax = torch.zeros(1)\n"                                    # and with the fast erf
            "t8, t8_t = cast_kernel.run(x, torch.tensor(1000.0), amax, True, transpose=True, gelu_input=h, "
            "fast_erf=True)\n"
            "assert torch.equal(t8_t.view(torch.uint8), t8.view(torch.uint8).t()) and torch.allclose(amax, want_amax)\n"
            "assert ((t8.float() - want).abs() <= 0.5 * want.abs() + 2 ** -6).all()\n"
            # fp8_norm_cast's kernel
            "r, w, b = 3 * torch.randn(70, 200) + 1, 1 + 0.2 * torch.randn(200), 0.1 * torch.randn(200)\n"
            "for weight, bias in ((w, b), (w, None), (None, None)):\n"
            "    amax, want_amax = torch.zeros(1), torch.zeros(1)\n"
            "    out, out_t, mean, rstd = cast_kernel.run_norm(r, weight, bias, 1e-5, torch.tensor(50.0), amax)\n"
            "    want, want_mean, want_rstd = cast_kernel.norm_reference(r, weight, bias, 1e-5, torch.tensor(50.0), "
            "want_amax)\n"
            "    assert torch.equal(out_t.view(torch.uint8), out.view(torch.uint8).t())\n"
            "    assert all(torch.allclose(a, b, rtol=1e-5) for a, b in ((mean, want_mean), (rstd, want_rstd), "
            "(amax, want_amax)))\n"
            "    a, w8 = out.float(), want.float()\n"
            "    assert ((a - w8).abs() <= 0.5 * w8.abs() + 2 ** -6).all()\n")
    in_interpreter(code)


def test_every_tile_of_the_sweep_in_the_interpreter():
    """Each tile benchmarks/fp8_cast.py --tiles times (GELU's pass and its derivative's, the copy as words or byte by
    byte, words for the derivative too) in Triton's interpreter at a shape no tile divides: the transposed copy is
    the bytes transposed, the bytes are the pass's without the copy, every value as reference() casts it to the
    interpreter's float8 rounding, the amax reference()'s. words=True with rows not a multiple of 4 is refused."""
    code = ("import sys, os, torch\n"
            "sys.path.insert(0, os.path.join(os.getcwd(), 'benchmarks'))\n"
            "import fp8_cast\n"
            "from speedgpt.features import cast_kernel\n"
            "torch.manual_seed(0)\n"
            "x, h = ((torch.randn(68, 200) * 2).bfloat16() for _ in range(2))\n"
            "for name, words, block, warps in fp8_cast.TILES:\n"
            "    grad = h if name == 'gelu_backward' else None\n"
            "    e5m2, s = grad is not None, torch.tensor(1000.0 if grad is not None else 100.0)\n"
            "    kw = dict(gelu=grad is None, gelu_input=grad, block=block, num_warps=warps)\n"
            "    amax, want_amax = torch.zeros(1), torch.zeros(1)\n"
            "    out, out_t = cast_kernel.run(x, s, amax, e5m2, transpose=True, words=words, **kw)\n"
            "    assert torch.equal(out_t.view(torch.uint8), out.view(torch.uint8).t()), (name, block, words)\n"
            "    alone = cast_kernel.run(x, s, torch.zeros(1), e5m2, **kw)\n"
            "    assert torch.equal(out.view(torch.uint8), alone.view(torch.uint8)), (name, block, words)\n"
            "    want = cast_kernel.reference(x, s, want_amax, e5m2, grad is None, grad).float()\n"
            "    assert torch.allclose(amax, want_amax), (name, block)\n"
            "    assert ((out.float() - want).abs() <= 0.5 * want.abs() + 2 ** -6).all(), (name, block, words)\n"
            "try:\n"
            "    cast_kernel.run(x[:66], torch.tensor(1.0), torch.zeros(1), gelu=True, transpose=True, words=True)\n"
            "    raise AssertionError('66 rows as words')\n"
            "except ValueError as e:\n"
            "    assert 'a multiple of 4 (got 66)' in str(e), e\n")
    in_interpreter(code)


@pytest.mark.parametrize("e5m2,gelu,grad,fast", [(False, False, False, False), (True, False, False, False),
                                                (False, True, False, False), (True, False, True, False),
                                                (False, True, False, True), (True, False, True, True)],
                         ids=["e4m3", "e5m2", "gelu", "gelu_backward", "gelu_fast_erf", "gelu_backward_fast_erf"])
def test_each_pass_with_a_transposed_copy_compiles_without_byte_permutes(e5m2, gelu, grad, fast, monkeypatch):
    """Each pass training runs with the transposed copy (the plain cast in both formats, GELU's, GELU's derivative's),
    launched as run() launches it (its tile, warps and arguments, recorded) at 124M's shape and compiled for a Hopper
    GPU: its PTX has no byte permute (prmt). Triton 3.6 changes a float8 tile's layout with them where it cannot
    recompute the cast in the store's layout (GELU's derivative at 64 x 64, 4 warps), or where it may take the row
    count a multiple of 16, and the ptxas 12.8 and 12.9 it bundles mis-lower them: half the transposed copy's bytes
    were foreign on an H100, none with ptxas 13.0 or without permutes (benchmarks/results/h100.md). The bytes
    themselves are checked on a GPU (tests/test_gpu.py). With gelu_erf='fast' GELU's passes take no erf from
    libdevice."""
    pytest.importorskip("triton", reason="needs Triton (its compiler)")
    from conftest import Launch, hopper_ptx
    jit, launch = cast_kernel.kernel(), Launch()
    monkeypatch.setattr(cast_kernel, "kernel", lambda: launch)
    x = torch.zeros(65536, 768, dtype=torch.bfloat16)
    cast_kernel.run(x, torch.tensor(1.0), torch.zeros(1), e5m2, gelu=gelu, transpose=True,
                    gelu_input=torch.zeros_like(x) if grad else None, fast_erf=fast)
    bound = {**dict(zip([p.name for p in jit.params], launch.args)), **launch.kwargs, "PTX": True}   # a GPU's launch
    ptx = hopper_ptx(jit, bound, bound.pop("num_warps"))
    assert "st.global" in ptx and "prmt" not in ptx, ptx.count("prmt")
    libdevice_erf = (gelu or grad) and not fast         # its erff's labels name it; the fast erf's reciprocal shows
    assert bound["FAST_ERF"] == fast and ("erf" in ptx.lower()) == libdevice_erf and ("rcp.approx" in ptx) == fast
    # GELU's pass writes the copy as words whose bytes come from PTX's own cvt (Triton's float8 bytes made ~43% of
    # them wrong on an H100), each converted beside a zero: not from a bitcast of Triton's float8 values
    assert bound["WORDS"] == gelu and ("mov.f32 z, 0f00000000;" in ptx) == gelu


def test_only_gelus_pass_writes_words_and_only_where_the_rows_make_whole_words(monkeypatch):
    """run() writes the transposed copy as 32-bit words for GELU's forward pass (faster there, as fast or slower in
    the other passes on one H100) where the row count is a multiple of 4, into the copy viewed as int32; byte by byte
    otherwise, and with WORDS off."""
    from conftest import Launch
    launch = Launch()
    monkeypatch.setattr(cast_kernel, "kernel", lambda: launch)
    x = torch.zeros(68, 200, dtype=torch.bfloat16)
    for rows, kwargs, words in ((68, {"gelu": True}, True), (70, {"gelu": True}, False), (68, {}, False),
                                (68, {"e5m2": True, "gelu_input": x}, False)):
        t = torch.zeros(rows, 200, dtype=torch.bfloat16)
        kwargs = {k: (t if k == "gelu_input" else v) for k, v in kwargs.items()}
        cast_kernel.run(t, torch.tensor(1.0), torch.zeros(1), transpose=True, **kwargs)
        assert launch.kwargs["WORDS"] == words, (rows, kwargs)
        assert launch.args[3].dtype == (torch.int32 if words else torch.float8_e5m2 if kwargs.get("e5m2") else
                                        torch.float8_e4m3fn)
        assert (launch.kwargs["BLOCK_M"], launch.kwargs["BLOCK_N"], launch.kwargs["num_warps"]) == \
            (cast_kernel.WORD_TILE if words else (launch.kwargs["BLOCK_M"], launch.kwargs["BLOCK_N"],
                                                  launch.kwargs["num_warps"]))
    monkeypatch.setattr(cast_kernel, "WORDS", False)
    cast_kernel.run(x, torch.tensor(1.0), torch.zeros(1), gelu=True, transpose=True)
    assert not launch.kwargs["WORDS"]


def norm_gpt(folded, gelu=False):
    """A tiny GPT (n_embd 64) whose block Linears are delayed FP8 layers, with fp8_norm_cast as `folded` (and
    fp8_gelu_cast as `gelu`, without biases then), and one batch of it."""
    from conftest import tiny_model
    m = tiny_model(n_embd=64, bias=not gelu)
    fp8.convert(m, configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32,
                                       fp8_norm_cast=folded, fp8_gelu_cast=gelu))
    g = torch.Generator().manual_seed(3)
    return m, torch.randint(0, 257, (2, 64), generator=g), torch.randint(0, 257, (2, 64), generator=g)


def norm_gpt_step(folded, calibrated, compiled=False, gelu=False):
    """One forward and backward of norm_gpt under bf16 autocast: the loss, every gradient and every amax recorded.
    calibrated: the histories filled first by one step with dynamic scales (fp8.calibrate's way), so the step's
    scales are known before the casts."""
    m, x, y = norm_gpt(folded, gelu)
    mods = [lin for _, lin in fp8.delayed_linears(m)]
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    if calibrated:
        with ctx:
            m(x, y)[1].backward()
        fp8.end_step(mods, True)
        for lin in mods:
            lin.fp8_scaled = True
        m.zero_grad(set_to_none=True)
    with ctx:
        loss = (torch.compile(m) if compiled else m)(x, y)[1]
    loss.backward()
    return m, [loss] + [p.grad for p in m.parameters()] + [lin.fp8_amax[:, 0] for lin in mods]


def test_norm_in_the_cast_folds_each_blocks_layernorm_into_the_linear_it_feeds():
    """fp8_norm_cast: convert makes ln_1 and ln_2 pass-throughs (their weights, biases and state-dict keys stay) and
    hands qkv and fc the residual stream; ln_f, the norms of other Linears and other norms are left alone; a
    model without a LayerNorm to fold is refused."""
    from conftest import tiny_model
    plain, _, _ = norm_gpt(False)
    m, _, _ = norm_gpt(True)
    for block in m.transformer.h:
        assert type(block.ln_1) is fp8.FoldedLayerNorm and type(block.ln_2) is fp8.FoldedLayerNorm
        assert block.attn.c_attn.fp8_norm[0] is block.ln_1 and block.mlp.c_fc.fp8_norm[0] is block.ln_2
        assert block.attn.c_proj.fp8_norm is None and block.mlp.c_proj.fp8_norm is None
    assert type(m.transformer.ln_f) is torch.nn.LayerNorm
    assert list(m.state_dict()) == list(plain.state_dict())
    rms = tiny_model(n_embd=64, norm="rmsnorm")
    with pytest.raises(ValueError, match="no LayerNorm of this model feeds an FP8 Linear alone"):
        fp8.convert(rms, configurator.Config(fp8=True, fp8_recipe="tensorwise_delayed", fp8_min_dim=32,
                                             fp8_norm_cast=True))


@pytest.mark.parametrize("gelu", [False, True])
def test_norm_in_the_cast_without_scales_gives_the_step_of_the_model_bit_for_bit(gelu, monkeypatch):
    """Calibrating (dynamic scales, which need the tensor first), the folded layers run aten's LayerNorm before the
    cast and its backward after: the loss, every gradient (the norms' weights and biases too) and every amax are
    those of the model without the flag, bit for bit, and the op never runs; with fp8_gelu_cast too (c_fc then
    both takes the residual stream and hands GELU its output)."""
    monkeypatch.setattr(cast_kernel, "norm_reference", lambda *a: pytest.fail("the op ran without scales"))
    monkeypatch.setattr(cast_kernel, "reference", lambda *a: pytest.fail("the op ran without scales"))
    want, got = norm_gpt_step(False, False, gelu=gelu)[1], norm_gpt_step(True, False, gelu=gelu)[1]
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def bf16_rounded_norm_reference(calls):
    """cast_kernel.norm_reference with LayerNorm's output rounded to bfloat16 before the cast, as the Linear without
    fp8_norm_cast takes it; each call counted in `calls`."""
    def reference(x, weight, bias, eps, scale, amax):
        calls.append(x.shape)
        y, mean, rstd = torch.ops.aten.native_layer_norm(x.float(), [x.size(-1)], weight, bias, eps)
        y = y.bfloat16().float()
        amax.copy_(torch.maximum(amax, y.abs().amax(dim=-1).amax()))
        return (y * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), mean, rstd
    return reference


@pytest.mark.parametrize("compiled, gelu", [(False, False), (True, False), (False, True)])
def test_norm_in_the_cast_gives_the_step_of_the_model(compiled, gelu, monkeypatch):
    """With the scales known, each folded layer normalizes and casts through norm_cast_amax, twice a block (ln_1 ->
    qkv, ln_2 -> fc), and its backward runs LayerNorm's from the statistics the op returned. With the op's LayerNorm
    output rounded to bfloat16 as the plain Linear takes it, eager, the loss, every gradient (the norms' too) and
    every amax are the model's without the flag, bit for bit: the wiring adds nothing. Compiled, Inductor's own
    LayerNorm differs from aten's in the last bits and float8 rounding at this tiny width magnifies that in the
    gradients: the loss within 0.1%, every amax within 5%, every gradient within 15% of its norm (a lost LayerNorm
    backward is off by its whole size). Evaluating runs LayerNorm first, without the op, and gives the model's
    output. With fp8_gelu_cast on both sides, the same."""
    calls = []
    monkeypatch.setattr(cast_kernel, "norm_reference", bf16_rounded_norm_reference(calls))
    want = norm_gpt_step(False, True, compiled, gelu)[1]
    calls.clear()
    m, got = norm_gpt_step(True, True, compiled, gelu)
    assert len(calls) == 2 * len(m.transformer.h)
    if not compiled:
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    else:
        n = len(list(m.parameters()))
        assert abs(got[0] - want[0]) <= 1e-3 * want[0]
        assert all(torch.allclose(a, b, rtol=0.05) for a, b in zip(got[1 + n:], want[1 + n:]))
        for a, b in zip(got[1:1 + n], want[1:1 + n]):
            assert (a - b).norm() <= 0.15 * b.norm(), ((a - b).norm() / b.norm())
    calls.clear()
    plain = norm_gpt_step(False, True, gelu=gelu)[0].eval()
    m.eval()
    _, x, y = norm_gpt(False, gelu)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(m(x, y)[0], plain(x, y)[0])
    assert calls == []
