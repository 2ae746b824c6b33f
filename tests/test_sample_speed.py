"""benchmarks/sample_speed.py: bad flags are one line, before any model is built."""
import pytest
import torch

from benchmarks import sample_speed
from configurator import flag_keys, without_keys

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32", "--vocab_size=50", "--max_new_tokens=4"]


@pytest.mark.parametrize("args, error", [
    # a model of no blocks was built and timed; 0 repeats or prompt tokens ended in a traceback
    (["--n_layer=-3"], "error: argument --n_layer: must be a whole number >= 1, got '-3'\n"),
    (["--repeats=0"], "error: argument --repeats: must be a whole number >= 1, got '0'\n"),
    (["--prompt_tokens=0"], "error: argument --prompt_tokens: must be a whole number >= 1, got '0'\n"),
    (["--n_head=5"], "error: --n_embd 32 must be a multiple of --n_head 5 (the head size)\n"),      # an AssertionError
    (["--device=gpu"], "error: --device must be cpu, cuda, cuda:N or mps, got 'gpu'\n"),
    (["--device=cuda"], "error: --device cuda: no CUDA GPU is available (time the CPU: --device cpu)\n"),
    # the checkpoint's shape was timed, the flags dropped unsaid
    (["--out_dir=out"], "error: --n_layer, --n_head, --n_embd, --block_size, --vocab_size would do nothing with "
     "--out_dir, whose checkpoint has its own shape: leave them out, or leave out --out_dir to time a new model of "
     "that shape\n"),
])
def test_bad_flags_are_one_line(capsys, monkeypatch, args, error):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)        # a CPU machine's answers, on a GPU one too
    monkeypatch.setattr(sample_speed, "build_model", lambda args: pytest.fail("a model was built"))
    with pytest.raises(SystemExit) as e:
        sample_speed.main([*without_keys(TINY, flag_keys(args)), *args])      # each flag once: no warning
    assert e.value.code == 2 and capsys.readouterr().err == error


def test_a_tiny_model_is_timed(capsys):
    sample_speed.main([*TINY, "--device=cpu"])
    out = capsys.readouterr().out
    assert "new model: n_layer 1, n_head 2, n_embd 32" in out and "| on |" in out and "| off |" in out
