"""The GPT-2 family's presets (config/fast.py and config/gpt2-*.py): each builds GPT-2's shape and
parameter count, and converts to FP8 exactly the layers BENCHMARKS.md's measurements chose (CPU, meta device)."""
import pytest
import torch

from configurator import load_config
from model import GPT, GPTConfig
from speedgpt import fp8

# Hugging Face's GPT-2 checkpoints: (n_layer, n_head, n_embd, parameters with biases and vocabulary 50,257)
GPT2 = {"config/fast.py": (12, 12, 768, 124_439_808), "config/gpt2-medium.py": (24, 16, 1024, 354_823_168),
        "config/gpt2-large.py": (36, 20, 1280, 774_030_080), "config/gpt2-xl.py": (48, 25, 1600, 1_557_611_200)}
FP8 = {"config/fast.py": False, "config/gpt2-medium.py": "rowwise_bf16_wgrad", "config/gpt2-large.py": "tensorwise",
       "config/gpt2-xl.py": "tensorwise"}


def build(path):
    cfg = load_config(["--config", path])
    with torch.device("meta"):
        return cfg, GPT(GPTConfig.from_dict(vars(cfg), 50257, attention="sdpa"))   # auto resolves on the GPU


@pytest.mark.parametrize("path", GPT2)
def test_preset_is_gpt2s_shape_and_size(path):
    """GPT-2's count less its biases (bias=False: 11 vectors of n_embd per block, and ln_f's) plus the 47 rows
    that pad the vocabulary to 50,304."""
    cfg, model = build(path)
    L, H, C, hf_params = GPT2[path]
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.bias) == (L, H, C, 1024, False)
    assert model.num_params(non_embedding=False) == hf_params - (11 * L + 1) * C + 47 * C
    assert cfg.total_batch_size == 524288 and cfg.dtype == "bfloat16" and cfg.compile and cfg.fused_ce


@pytest.mark.parametrize("path", GPT2)
def test_preset_converts_the_block_linears_the_measurements_chose(path):
    """FP8 where it measured faster end to end (BENCHMARKS.md): off at 124M, this project's rowwise recipe at 350M,
    torchao's tensorwise at 774M and 1.5B; then every block Linear (qkv, attention proj, MLP fc and proj),
    never the head."""
    cfg, model = build(path)
    assert cfg.fp8 is bool(FP8[path])
    if not cfg.fp8:
        return
    assert cfg.fp8_recipe == FP8[path]
    if cfg.fp8_recipe != "rowwise_bf16_wgrad":
        pytest.importorskip("torchao")
    names = fp8.convert(model, cfg)
    kinds = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    assert sorted(names) == sorted(f"transformer.h.{i}.{k}" for i in range(cfg.n_layer) for k in kinds)


def test_a_preset_on_the_cpu_names_the_way_out():
    cfg = load_config(["--config", "config/gpt2-xl.py"])
    with pytest.raises(ValueError, match=r"fp8=True and fp8_head=True need a GPU .* add --fp8=False --fp8_head=False"):
        fp8.check(cfg, torch.device("cpu"))


def test_fp8_layers_picks_the_kinds_to_convert():
    """fp8_layers converts the kinds it names (one kind at a time measures FP8 per kind end to end), refuses an
    unknown kind naming the kinds, and is refused without fp8=True (it would do nothing)."""
    pytest.importorskip("torchao")
    for layers, ends in (("fc,mlp_proj", ("mlp.c_fc", "mlp.c_proj")), ("qkv", ("attn.c_attn",)),
                         (" attn_proj ", ("attn.c_proj",))):
        cfg = load_config(["--config", "config/gpt2-large.py", f"--fp8_layers={layers}"])
        _, model = build("config/gpt2-large.py")
        names = fp8.convert(model, cfg)
        assert sorted(names) == sorted(f"transformer.h.{i}.{e}" for i in range(cfg.n_layer) for e in ends)
    gpu = torch.device("cuda")                              # the kinds are checked before the device
    for bad, message in (("fc,mlp", "unknown kind mlp; the kinds are qkv, attn_proj, fc, mlp_proj"),
                         (",", "no kind; the kinds are")):
        with pytest.raises(ValueError, match=f"fp8_layers={bad!r}: {message}"):
            fp8.check(load_config(["--config", "config/gpt2-large.py", f"--fp8_layers={bad}"]), gpu)
    with pytest.raises(ValueError, match=r"fp8_layers='fc' would do nothing: .* Add --fp8=True"):
        fp8.check(load_config(["--config", "config/fast.py", "--fp8_layers=fc"]), gpu)
