"""speedgpt/features/compilation.py on the CPU: a compiled run trains without recompiling, and its checkpoint holds the plain
model's keys.
Regional compilation against whole-model compilation is in tests/test_gpu.py."""
import pytest
import torch

import train
from conftest import tiny_args


@pytest.mark.slow
def test_a_compiled_run_compiles_once_per_mode(byte_data, tmp_path, monkeypatch):
    """compile=True with the document mask (cu_seqlens: its length changes every batch) and FP8's delayed scales
    (float8 emulated on the CPU): Dynamo makes one graph for training, the whole model, and for evaluation the
    regional ones, one block's (reused by every block) and the head's, whatever the later steps bring. Before,
    cu_seqlens' new length at step 1 and the amax history's arrival after step 0 each recompiled the model
    (tests/test_gpu.py checks the same on the GPU), and evaluation compiled the whole model a second time. The
    checkpoint holds the plain model's keys."""
    from torch._dynamo.utils import counters
    from speedgpt.features import fp8
    monkeypatch.setattr(fp8, "check", lambda cfg, device: None)
    torch._dynamo.reset()
    counters.clear()
    summary = train.main(tiny_args(byte_data, tmp_path, "--compile=True", "--max_iters=6", "--fp8=True",
                                   "--fp8_recipe=tensorwise_delayed", "--fp8_min_dim=32"))
    assert summary["median_tokens_per_sec"] > 0
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])


def test_compile_tuning_turns_on_inductors_tuner():
    """compile_tuning=True sets Inductor's coordinate-descent tuner before the model is compiled; without it the
    setting is left as it was. (Inductor's config is restored by its own patch(): monkeypatch's undo left the
    key hidden, and every later compile in the process failed.)"""
    import torch._inductor.config as inductor_config
    from model import GPT, GPTConfig
    from speedgpt.features import compilation
    with inductor_config.patch(coordinate_descent_tuning=False):
        model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8))
        compilation.compile_model(model)
        assert inductor_config.coordinate_descent_tuning is False
        compilation.compile_model(model, tuning=True)
        assert inductor_config.coordinate_descent_tuning is True
    assert inductor_config.coordinate_descent_tuning is False
