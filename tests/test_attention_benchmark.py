"""benchmarks/attention.py, a GPU benchmark: on a CPU, and for bad input, one line instead of a traceback."""
import pytest
import torch

from benchmarks import attention as attention_benchmark


def test_on_a_cpu_it_says_it_needs_a_gpu(monkeypatch):
    """It ended in pin_memory's traceback (Cannot access accelerator device when none is available)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="^error: attention.py times CUDA kernels: it needs a GPU$"):
        attention_benchmark.main(["--data_dir=data/stdlib_byte"])


@pytest.mark.parametrize("args, error", [
    (["--data_dir={tmp}/none"], "error: data folder '{tmp}/none' does not exist"),           # a FileNotFoundError
    (["--data_dir={tmp}", "--batch_size=0"], "error: --batch_size 0: must be at least 1"),   # numpy's ValueError
    (["--data_dir={tmp}", "--match=("], "error: --match '(' is not a regular expression"),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, args, error):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)       # past the GPU check: these come before any
    with pytest.raises(SystemExit) as e:                                 # CUDA work
        attention_benchmark.main([a.format(tmp=tmp_path) for a in args])
    assert str(e.value).startswith(error.format(tmp=tmp_path)) and "\n" not in str(e.value), e.value
