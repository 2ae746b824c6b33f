"""The presets of config/ (CPU). The GPT-2 family's (config/fast.py and config/gpt2-*.py): each builds GPT-2's
shape and parameter count, and converts to FP8 exactly the layers BENCHMARKS.md's measurements chose (meta
device). config/finetune_shakespeare.py: GPT-2 124M's shape, and the README's data command for its text."""
import os

import pytest

import configurator
import data
from conftest import ROOT, on
from conftest import build_preset as build
from speedgpt.features import compilation, fp8

# Hugging Face's GPT-2 checkpoints: (n_layer, n_head, n_embd, parameters with biases and vocabulary 50,257)
GPT2 = {"config/fast.py": (12, 12, 768, 124_439_808), "config/gpt2-medium.py": (24, 16, 1024, 354_823_168),
        "config/gpt2-large.py": (36, 20, 1280, 774_030_080), "config/gpt2-xl.py": (48, 25, 1600, 1_557_611_200)}
FP8 = {"config/fast.py": "tensorwise_delayed", "config/gpt2-medium.py": "tensorwise_delayed",
       "config/gpt2-large.py": "tensorwise_delayed", "config/gpt2-xl.py": "tensorwise_delayed"}


@pytest.mark.parametrize("path", GPT2)
def test_preset_is_gpt2s_shape_and_size(path):
    """GPT-2's count less its biases (bias=False: 11 vectors of n_embd per block, and ln_f's) plus the 47 rows
    that pad the vocabulary to 50,304."""
    cfg, model = build(path)
    L, H, C, hf_params = GPT2[path]
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.bias) == (L, H, C, 1024, False)
    assert model.num_params(non_embedding=False) == hf_params - (11 * L + 1) * C + 47 * C
    assert cfg.total_batch_size == 524288 and cfg.dtype == "bfloat16" and cfg.compile and cfg.fused_ce
    # the FP8 head with its softmax pass in our Triton kernels (measured faster at 124M, BENCHMARKS.md);
    # --fp8_head=False (a GPU without FP8) keeps the kernels for the bf16 head, --fused_ce=False drops both
    assert cfg.fp8_head and cfg.head_kernel
    off = configurator.load_config(["--config", path, "--fp8_head=False"])
    assert not off.fp8_head and off.head_kernel
    off = configurator.load_config(["--config", path, "--fused_ce=False"])
    assert not off.fused_ce and not off.head_kernel and off.fused_ce_chunk == 16384
    eager = configurator.load_config(["--config", path, "--compile=False"])    # drops compile_regional too
    assert not eager.compile and not eager.compile_regional
    compilation.check(eager, on("cpu"))


@pytest.mark.parametrize("path", GPT2)
def test_preset_converts_the_block_linears_the_measurements_chose(path):
    """FP8 where it measured faster end to end (BENCHMARKS.md): this project's tensorwise_delayed at every
    size, 124M with fp8_min_dim lowered to its 768 width; then every block Linear (qkv, attention proj, MLP fc
    and proj), never the head."""
    cfg, model = build(path)
    assert cfg.fp8 is bool(FP8[path])
    if not cfg.fp8:
        return
    assert cfg.fp8_recipe == FP8[path]
    if cfg.fp8_recipe not in fp8.OWN_RECIPES:
        pytest.importorskip("torchao")
    names = fp8.convert(model, cfg)
    kinds = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    assert sorted(names) == sorted(f"transformer.h.{i}.{k}" for i in range(cfg.n_layer) for k in kinds)


def test_muon_overlay_changes_only_the_optimizer_and_schedule():
    """config/muon.py laid over a preset (its header's command, and time_to_target.py's muon recipe) switches
    the optimizer to Muon and the schedule to WSD and leaves every other setting of the preset as it was."""
    from dataclasses import asdict
    base = asdict(configurator.load_config(["--config", "config/fast.py"]))
    muon = asdict(configurator.load_config(["--config", "config/fast.py", "--config", "config/muon.py"]))
    assert (muon["optimizer"], muon["lr_schedule"]) == ("muon", "wsd")
    assert {k for k in base if base[k] != muon[k]} == {"optimizer", "lr_schedule"}


def test_finetune_shakespeare_config_and_data(tmp_path):
    """config/finetune_shakespeare.py states GPT-2 124M's shape (so --init_from=resume matches it), and
    the README's data command makes a train/val split of the committed text."""
    cfg = configurator.load_config(["--config", "config/finetune_shakespeare.py"])
    assert (cfg.init_from, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.bias, cfg.activation) == \
        ("gpt2", 12, 12, 768, True, "gelu_tanh")
    assert configurator.load_config(["--config", "config/finetune_shakespeare.py",
                                     "--init_from=resume"]).init_from == "resume"
    meta = data.prepare(os.path.join(ROOT, "data_sources", "shakespeare"), str(tmp_path), "byte", val_frac=0.1,
                        workers=2)
    assert meta["train_docs"] + meta["val_docs"] == 40 and meta["val_docs"] >= 2
    folder = os.path.join(ROOT, "data_sources", "shakespeare")
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    assert meta["train_tokens"] + meta["val_tokens"] == size + 40 > 1_100_000   # every byte, one end-of-text per part
