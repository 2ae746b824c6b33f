"""speedgpt/attention.py on the CPU: position ids restart at each document. The document mask across every
backend is in tests/test_packing.py, the GPU kernels in tests/test_gpu.py."""
import torch

from speedgpt.attention import position_ids


def test_position_ids_restart():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 2, 3, 3, 3, 3]])
    assert position_ids(doc_ids).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]]
