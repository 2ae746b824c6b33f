"""speedgpt/attention.py on the CPU: position ids restart at each document. The document mask across every
backend is in tests/test_packing.py, the GPU kernels in tests/test_gpu.py."""
from types import SimpleNamespace

import pytest
import torch

from configurator import Config
from speedgpt import attention
from speedgpt.attention import position_ids


def test_position_ids_restart():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 2, 3, 3, 3, 3]])
    assert position_ids(doc_ids).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]]


@pytest.mark.parametrize("flags, cpu, gpu", [
    (dict(attention="varlen"), "varlen kernels do not run on the CPU", r"'varlen' \(FlashAttention\) takes bfloat16"),
    (dict(sdpa_backend="flash"), r"^sdpa_backend='flash' picks a CUDA kernel", "kernels take bfloat16 or float16"),
    (dict(sdpa_backend="flash", dtype="bfloat16"), "picks a CUDA kernel", "takes no attention mask"),
])
def test_a_gpu_path_on_the_cpu_names_the_device_first(monkeypatch, flags, cpu, gpu):
    """On a CPU the refusal names the device, not a dtype or a mask that would only lead to the next refusal; on a
    GPU (a cuda device, the kernel lookup patched: no GPU here) the same flags name the dtype or the mask."""
    with pytest.raises(ValueError, match=cpu):
        attention.check(Config(**flags), SimpleNamespace(device=torch.device("cpu")))
    monkeypatch.setattr(attention, "varlen_kernel", lambda device: "FA2")
    with pytest.raises(ValueError, match=gpu):
        attention.check(Config(**flags), SimpleNamespace(device=torch.device("cuda")))


@pytest.mark.parametrize("flags, message", [
    (dict(sdpa_backend="flash"), "picks a CUDA kernel: use sdpa_backend='auto' on Apple's MPS"),
    (dict(attention="flex"), "no backward pass on Apple's MPS. Use attention='sdpa' .* or 'naive' on Apple's MPS"),
])
def test_a_cuda_path_on_mps_names_mps_not_the_cpu(flags, message):
    with pytest.raises(ValueError, match=message):
        attention.check(Config(**flags), SimpleNamespace(device=torch.device("mps")))
