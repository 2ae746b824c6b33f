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


def test_persistent_rows_keeps_rows_up_to_its_width_whole_and_leaves_the_rest_to_inductor():
    """compile_persistent_rows: Inductor's heuristics, but a row reduction (INNER) of at most the width is
    persistent; Inductor's own rule says no at 1,280 (774M's LayerNorm) and yes at 1,024. Other reductions and wider
    rows get Inductor's answer. The factory Inductor's config holds pickles (its compile cache's key, torch 2.11) and
    names the width (uuid: the key, torch 2.13); compile_model sets it, and this thread's heuristics, and the test
    puts both back. (The kernels it changes are Triton's, so a CPU compile cannot show them: tests/test_gpu.py
    compiles a LayerNorm on a GPU.)"""
    import pickle
    import sympy
    import torch._inductor.config as inductor_config
    from torch._inductor.choices import InductorChoices
    from torch._inductor.runtime.hints import ReductionHint
    from torch._inductor.sizevars import SizeVarAllocator
    from torch._inductor.virtualized import V
    from model import GPT, GPTConfig
    from speedgpt.features import compilation

    class Features:                  # what the heuristic reads of a kernel
        def __init__(self, width, hint=ReductionHint.INNER):
            self.reduction_numel, self.numel, self.hint = sympy.Integer(width), sympy.Integer(4096 * width), hint

        def get_reduction_hint(self, *args):
            return self.hint

    class Graph:
        sizevars = SizeVarAllocator()
    ours, inductors = compilation.persistent_rows_choices(2048), InductorChoices()
    with V.set_graph_handler(Graph()):
        assert [inductors.should_use_persistent_reduction(Features(w), False) for w in (1024, 1280)] == [True, False]
        assert [ours.should_use_persistent_reduction(Features(w), False) for w in (768, 1280, 1600, 2048, 3072)] == \
            [True, True, True, True, False]
        assert ours.should_use_persistent_reduction(Features(1280, ReductionHint.DEFAULT), False) is False
        with inductor_config.patch({"triton.persistent_reductions": False}):
            assert ours.should_use_persistent_reduction(Features(1280), False) is False
    assert ours.uuid() != compilation.persistent_rows_choices(4096).uuid()
    before = V.choices
    try:
        with inductor_config.patch(inductor_choices_class=None):
            compilation.compile_model(GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8)),
                                      persistent_rows=2048)
            factory = inductor_config.inductor_choices_class
            assert factory().uuid() == ours.uuid() == pickle.loads(pickle.dumps(factory))().uuid()
            assert V.choices.uuid() == ours.uuid()
        assert inductor_config.inductor_choices_class is None
    finally:
        V.set_choices_handler(before)


@pytest.mark.parametrize("rows", [-1, 16385])
def test_persistent_rows_outside_its_range_is_refused_on_a_gpu_and_any_value_off_one(rows):
    """compile_persistent_rows outside 0..16,384 is refused in one line naming the range and a value to try, on a
    CUDA device; off one any value is refused first as doing nothing there (a value to try would be refused next)."""
    import configurator
    from conftest import on
    from speedgpt.features import compilation
    cfg = configurator.Config(compile=True, compile_persistent_rows=rows)
    with pytest.raises(ValueError, match=rf"^compile_persistent_rows={rows}: the widest row .* from 1 to 16,384 "
                                         r"values \(0: Inductor's own 1,024\); try 2048$"):
        compilation.check(cfg, on("cuda"))
    with pytest.raises(ValueError, match=rf"^compile_persistent_rows={rows} lays out .* on cpu it would do nothing"):
        compilation.check(cfg, on("cpu"))
    compilation.check(configurator.Config(compile=True, compile_persistent_rows=2048), on("cuda"))
