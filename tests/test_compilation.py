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
