"""speedgpt/compilation.py on the CPU: a compiled run trains, and its checkpoint holds the plain model's keys.
Regional compilation against whole-model compilation is in tests/test_gpu.py."""
import pytest
import torch

import train
from conftest import tiny_args


@pytest.mark.slow
def test_compile_run(byte_data, tmp_path):
    summary = train.main(tiny_args(byte_data, tmp_path, "--compile=True", "--max_iters=6"))
    assert summary["median_tokens_per_sec"] > 0
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])


def test_compile_tuning_turns_on_inductors_tuner():
    """compile_tuning=True sets Inductor's coordinate-descent tuner before the model is compiled; without it the
    setting is left as it was. (Inductor's config is restored by its own patch(): monkeypatch's undo left the
    key hidden, and every later compile in the process failed.)"""
    import torch._inductor.config as inductor_config
    from model import GPT, GPTConfig
    from speedgpt import compilation
    with inductor_config.patch(coordinate_descent_tuning=False):
        model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8))
        compilation.apply(model)
        assert inductor_config.coordinate_descent_tuning is False
        compilation.apply(model, tuning=True)
        assert inductor_config.coordinate_descent_tuning is True
    assert inductor_config.coordinate_descent_tuning is False
