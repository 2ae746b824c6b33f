"""train.py on the CPU: gradient accumulation, a few steps in each dtype, the config errors train.main gives
(every module's checks, each one line, before any work), the data a run prepares or goes without, and
divergence (the weights and the checkpoint kept, skipped steps bounded)."""
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import nullcontext

import pytest
import torch

import data
import train
from conftest import ROOT, read_metrics, tiny_args, tiny_model


@pytest.mark.parametrize("packing", [False, True])
def test_grad_accumulation_equivalence(short_data, packing):
    """4 micro-batches of 2 rows give the gradient of 1 batch of 8, though their real-token counts differ."""
    kw = dict(block_size=64, seed=5, packing=packing)
    big = next(data.Loader(str(short_data), "train", batch_size=8, **kw))
    small_loader = data.Loader(str(short_data), "train", batch_size=2, **kw)
    small = [next(small_loader) for _ in range(4)]
    assert torch.equal(torch.cat([b.x for b in small]), big.x)        # the same rows
    counts = [b.n_valid for b in small]
    assert sum(counts) == big.n_valid
    if not packing:
        assert len(set(counts)) > 1, "padding should make the micro-batches' token counts differ"
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    grads = []
    for batches in ([big], small):
        model = tiny_model().double()
        loss = train.forward_backward(model, batches, sum(b.n_valid for b in batches), nullcontext(), scaler)
        grads.append((loss, {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-12)
    for name, g in grads[0][1].items():
        torch.testing.assert_close(g, grads[1][1][name], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_few_cpu_steps_per_dtype(byte_data, tmp_path, dtype):
    summary = train.main(tiny_args(byte_data, tmp_path, f"--dtype={dtype}", "--max_iters=12", "--learning_rate=1e-2"))
    rows = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert len(rows) == 12 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert summary["val_loss"] < 5.0
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert bool(ckpt["scaler"]) == (dtype == "float16")             # a GradScaler for float16 only


@pytest.mark.parametrize("args, error, match", [
    (["--n_layr=4"], ValueError, "unknown config key 'n_layr'"),
    (["--n_layer=4.5"], TypeError, "'n_layer' .* must be int"),
    (["--compile=yes"], TypeError, "'compile' .* must be bool"),
    (["--dtype=float64"], ValueError, "'dtype' .* must be one of"),
    (["--config", "config/nope.py"], FileNotFoundError, "nope.py"),
    (["n_layer=4"], ValueError, "cannot parse argument"),
    (["--attention=flex", "--device=cpu"], ValueError, "FlexAttention has no backward pass on the CPU"),
    (["--fp8=True", "--device=cpu"], ValueError, "compute capability 8.9"),
    (["--fp8_head=True", "--fused_ce=True", "--device=cpu"], ValueError,
     "fp8_head=True needs a GPU of compute capability 8.9"),
    (["--fp8_head=True", "--device=cpu"], ValueError, "fp8_head=True needs a GPU of compute capability 8.9"),
    (["--check_mask=True", "--packing=False"], ValueError,
     "check_mask=True checks the document mask: it needs packing"),
    (["--config", "config/fast.py", "--device=cpu"], ValueError,
     r"\[1\] fp8=True and fp8_head=True need a GPU .* this run is on the CPU: add --fp8=False --fp8_head=False "
     r"and leave out fp8_recipe, fp8_min_dim, fp8_gelu_cast where the command line gives them \(config/fast.py and "
     r"config/gpt2-\*.py set fp8=True and fp8_head=True; --fp8=False drops their other FP8 settings\); "
     r"\[2\] gelu_erf='fast' runs Triton kernels on a CUDA GPU; this run is on cpu: add --gelu_erf=exact; "
     r"\[3\] head_kernel=True runs Triton kernels on a CUDA GPU; this run is on cpu: add --head_kernel=False;"
     r".* or train on a CPU at the quickstart's size \(python train.py\)$"),     # that way out once, at the end
    (["--config", "config/fast.py", "--fp8=False", "--device=cpu"], ValueError,
     r"this run is on the CPU: add --fp8_head=False \(config/fast.py and config/gpt2-\*.py set fp8_head=True; "
     r"--fp8=False drops their other FP8 settings\); \[2\] "),
    (["--fused_ce=True", "--dtype=float16"], ValueError, "fused_ce=True with dtype='float16' is not supported"),
    (["--fused_ce=True", "--fp8_head=True", "--fp8_recipe=rowwise"], ValueError,     # the device first (no loop)
     r"fp8_head=True needs a GPU .* add --fp8_head=False and leave out fp8_recipe where the command line gives them"),
    (["--fused_ce_chunk=0"], ValueError, "'fused_ce_chunk' must be positive"),
    (["--fp8_min_dim=-1"], ValueError, "'fp8_min_dim' must be >= 0, got -1"),
    (["--fused_ce_chunk=4096"], ValueError, "fused_ce_chunk=4096 would do nothing: .* Add --fused_ce=True"),
    (["--attention=varlen", "--device=cpu"], ValueError, "varlen kernels do not run on the CPU"),
    (["--attention=varlen", "--dtype=bfloat16", "--device=cpu"], ValueError, "varlen kernels do not run on the CPU"),
    (["--compile_regional=True"], ValueError,
     "compile_regional=True chooses how the model is compiled: it needs compile"),
    (["--compile_tuning=True", "--device=cpu"], ValueError,
     "compile_tuning=True tunes the Triton kernels compiled for a GPU; on cpu"),
    (["--compile_regional=True", "--compile=False"], ValueError, "compile_regional=True chooses how the model is "
     "compiled: it needs compile=True: add --compile=True, or leave compile_regional out"),
    (["--parallelism=fsdp"], ValueError, "torchrun"),
    (["--optimizer=sgd"], ValueError, r"'optimizer' \(command line\) must be one of \('adamw', 'muon'\)"),
    (["--lr_schedule=wsd", "--wsd_decay_frac=0"], ValueError, r"wsd_decay_frac=0.0: the share of lr_decay_iters"),
    (["--optimizer=muon", "--muon_lr=0"], ValueError, "muon_lr=0.0 must be positive"),
    (["--muon_batched=False"], ValueError, "muon_batched=False would do nothing: .* Add --optimizer=muon"),
    (["--muon_lr=0.05"], ValueError, "muon_lr=0.05 would do nothing: it is a setting of Muon's"),
    (["--muon_momentum=0.9"], ValueError, "muon_momentum=0.9 would do nothing"),
    (["--muon_momentum=0.9", "--muon_lr=0.05"], ValueError,      # every such key named at once, not one per try
     r"muon_lr=0.05 and muon_momentum=0.9 would do nothing: each is .* leave muon_lr and muon_momentum out$"),
    (["--fp8_gelu_cast=True", "--fp8_cast_kernel=True"], ValueError,
     "^fp8_cast_kernel=True and fp8_gelu_cast=True would do nothing: each is .* Leave fp8_cast_kernel and fp8_gelu_cast out$"),
    (["--wsd_decay_frac=0.5"], ValueError, "wsd_decay_frac=0.5 would do nothing: .* Add --lr_schedule=wsd"),
    (["--lr_schedule=constant", "--min_lr=1e-5"], ValueError, "^min_lr=1e-05 would do nothing: it is a setting of a "
     "decaying schedule .* Add --lr_schedule=cosine or --lr_schedule=wsd, or leave min_lr out$"),
    (["--lr_schedule=constant", "--lr_decay_iters=100", "--min_lr=1e-5"], ValueError,
     "^min_lr=1e-05 and lr_decay_iters=100 would do nothing: each is .* leave min_lr and lr_decay_iters out$"),
    (["--optimizer=muon", "--muon_momentum=1.5"], ValueError, r"muon_momentum=1.5: Muon's momentum is a fraction"),
    (["--fp8_recipe=tensorwise_fused"], ValueError,        # on the CPU: not "add --fp8=True", which it would refuse
     r"fp8_recipe='tensorwise_fused' would do nothing: .* which needs a GPU .* Leave fp8_recipe out$"),
    (["--fp8_min_dim=512"], ValueError, "fp8_min_dim=512 would do nothing"),
    (["--compile=True", "--compile_tuning=True"], ValueError, "on cpu it would do nothing: leave it out"),
    (["--tf32=True"], ValueError, "^tf32=True lets an NVIDIA GPU's float32 matmuls run in TF32; on cpu it would do "
     "nothing: leave it out$"),
    (["--compile=True", "--compile_persistent_rows=2048"], ValueError,
     "^compile_persistent_rows=2048 lays out the Triton kernels compiled for a GPU; on cpu it would do nothing"),
    (["--compile=True", "--compile_persistent_rows=-1"], ValueError,       # any value: first, no value helps here
     "^compile_persistent_rows=-1 lays out the Triton kernels compiled for a GPU; on cpu it would do nothing"),
    (["--init_from=resume"], FileNotFoundError, "ckpt.pt"),
    (["--batch_size=0"], ValueError, "'batch_size' must be positive"),
    (["--max_iters=-1"], ValueError, "'max_iters' must be >= 0"),
    (["--n_embd=30", "--n_head=4"], ValueError, "divisible by n_head"),
    (["--device=tpu"], ValueError, "'device' must be auto, cpu, cuda, cuda:N or mps"),
    (["--eval_interval=0"], ValueError, r"'eval_interval' must be positive, got 0 \(to turn evaluation off, "
                                        r"--eval_tokens=0\)"),
    (["--grad_clip=-1"], ValueError, "'grad_clip' must be >= 0"),
    (["--learning_rate=nan"], ValueError, "'learning_rate' .command line. must be a finite number, got 'nan'"),
    (["--min_lr=inf"], ValueError, "'min_lr' .command line. must be a finite number"),
    (["--profile=True", "--timing_warmup=1"], ValueError, "timing_warmup >= 2"),
    (["--sdpa_backend=cudnn", "--attention=naive"], ValueError,
     r"applies to attention='sdpa' only, not 'naive': leave sdpa_backend out \(on the CPU it picks no kernel\)$"),
    (["--sdpa_backend=flash", "--attention=flex", "--device=cpu"], ValueError,      # both ways out in one line
     "not 'flex': leave sdpa_backend out, and attention='flex' needs a CUDA GPU: use 'sdpa' or 'naive' on the CPU$"),
    (["--sdpa_backend=flash", "--attention=auto", "--device=cpu"], ValueError,      # not --attention=sdpa, refused next
     "not 'auto': leave sdpa_backend out \\(on the CPU it picks no kernel\\)$"),
    (["--sdpa_backend=flash", "--device=cpu"], ValueError, "use sdpa_backend='auto' on the CPU"),
    (["--sdpa_backend=cudnn", "--dtype=bfloat16", "--device=cpu"], ValueError, "use sdpa_backend='auto' on the CPU"),
    (["--sdpa_backend=flash", "--dtype=bfloat16", "--packing=False", "--device=cpu"], ValueError,
     "use sdpa_backend='auto' on the CPU"),
    (["--profile=True", "--timing_warmup=3", "--max_iters=2"], ValueError, "max_iters=2 ends before it"),
    (["--beta2=1.0"], ValueError, r"'beta2' \(AdamW\) must be in \[0, 1\)"),
    (["--config"], ValueError, "--config needs a file path"),
    (["--config", "config"], FileNotFoundError, "is a folder, not a file"),
])
def test_config_errors(byte_data, tmp_path, args, error, match):
    with pytest.raises(error, match=match):
        train.main(tiny_args(byte_data, tmp_path, *args))


def test_setup_errors_come_before_any_work(byte_data, tmp_path):
    """Bad input found at setup is a one-line error naming the problem, before data or model work."""
    never = tmp_path / "never" / "stdlib_byte"          # would be prepared on first use
    with pytest.raises(ValueError, match="compute capability 8.9"):
        train.main(tiny_args(never, tmp_path / "o1", "--fp8=True", "--device=cpu"))
    with pytest.raises(FileNotFoundError, match="ckpt.pt"):
        train.main(tiny_args(never, tmp_path / "o2", "--init_from=resume"))
    with pytest.raises(ValueError, match="varlen kernels do not run on the CPU"):
        train.main(tiny_args(never, tmp_path / "o3", "--attention=varlen", "--dtype=bfloat16", "--device=cpu"))
    assert not never.exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        train.main(tiny_args(byte_data, tmp_path / "afile"))


def test_a_gpu_preset_on_the_cpu_is_refused_once_naming_every_change(tmp_path, monkeypatch):
    """config/fast.py on a CPU, offline: FP8, the head's Triton kernels, memory, the GPT-2 tokenizer files and the time
    of a step, in one line, before any work, instead of one refusal per try; a GPU-sized run of one micro-batch a step
    with nothing to refuse goes on."""
    monkeypatch.setattr(train.memory, "available", lambda device: 16e9)          # any laptop's
    monkeypatch.setattr(data, "get_tokenizer", lambda name: (_ for _ in ()).throw(
        FileNotFoundError("could not load tiktoken's GPT-2 files (offline). Offline, point TIKTOKEN_CACHE_DIR ...")))
    unprepared = tmp_path / "data" / "stdlib_gpt2"
    argv = ["--config", "config/fast.py", f"--data_dir={unprepared}", f"--out_dir={tmp_path / 'out'}", "--device=cpu"]
    with pytest.raises(ValueError) as e:
        train.main(argv)
    line = str(e.value)
    assert "\n" not in line and line.startswith("a GPU-sized run (steps of 524,288 tokens) on the CPU: every change it "
                                                "needs, at once: [1] fp8=True and fp8_head=True need a GPU"), line
    assert re.search(r"\[2\] gelu_erf='fast' runs Triton kernels on a CUDA GPU.*; \[3\] head_kernel=True runs Triton "
                     r"kernels on a CUDA GPU.*; \[4\] this run needs about "
                     r"[\d.]+ GB per process .*; \[5\] could not load tiktoken's GPT-2 files .*; \[6\] on a CPU, a "
                     r"step of 8 micro-steps \(524,288 tokens in micro-batches of 64 x 1024\) is slow, .*\(evaluations "
                     r"of 524,288 tokens are slow too\): add --total_batch_size=0 .*, and --eval_tokens=16384; or "
                     r"train on a CPU at the quickstart's size \(python train.py\)$",
                     line), line
    assert not unprepared.exists() and not (tmp_path / "out" / "config.json").exists()
    with pytest.raises(ValueError) as e:                  # [4] sized as the run will be without FP8, as [1] says
        train.main(argv + ["--fp8=False", "--fp8_head=False"])
    assert re.search(r"needs about [\d.]+ GB", str(e.value))[0] == re.search(r"needs about [\d.]+ GB", line)[0], line
    cfg = train.load_config(tiny_args(tmp_path / "data" / "stdlib_byte", tmp_path / "o", "--total_batch_size=131072",
                                      "--batch_size=2048"))                          # one micro-batch a step
    assert train.check_flags(cfg, train.Proc(0, 0, 1, torch.device("cpu"))).total_batch_size == 131072


def test_a_gpu_sized_step_of_micro_steps_on_the_cpu_is_refused_on_its_own(byte_data, tmp_path, monkeypatch):
    """config/baseline.py shrunk for a CPU (4 x 64-token micro-batches): nothing else is refused, yet its step of
    524,288 tokens is 2,048 micro-steps, and a SIGTERM or Ctrl-C waits for a step's end: refused in one line naming
    them and the way out, before any work. Each way out named passes every check: one micro-batch a step, or a step
    below a GPU's size; under torchrun the micro-steps counted are a process's."""
    monkeypatch.setattr(train.memory, "available", lambda device: 16e9)
    argv = ["--config", "config/baseline.py", f"--data_dir={byte_data}", f"--out_dir={tmp_path / 'out'}",
            "--device=cpu", "--batch_size=4", "--block_size=64"]
    cpu = train.Proc(0, 0, 1, torch.device("cpu"))
    with pytest.raises(ValueError) as e:
        train.check_flags(train.load_config(argv), cpu)              # (were it let through, train.main would train)
    with pytest.raises(ValueError, match=re.escape(str(e.value))):
        train.main(argv)
    assert str(e.value) == ("on a CPU, a step of 2,048 micro-steps (524,288 tokens in micro-batches of 4 x 64) is "
                            "slow, and a Ctrl-C or SIGTERM waits for its end (evaluations of 524,288 tokens are slow "
                            "too): add --total_batch_size=0 (one optimizer step per micro-batch) or a --total_batch_size "
                            "below 65,536, and --eval_tokens=16384"), str(e.value)
    assert not (tmp_path / "out").exists()
    for way, steps in (("--total_batch_size=0", 1), ("--total_batch_size=32768", 128)):
        cfg = train.check_flags(train.load_config(argv + [way, "--eval_tokens=16384"]), cpu)
        assert train.plan_batch(cfg, 1) == steps
    assert "a step of 1,024 micro-steps (524,288 tokens in micro-batches of 4 x 64 x 2 processes)" in \
        train.memory.cpu_slow_work(train.load_config(argv), torch.device("cpu"), 2, False)


def test_a_small_models_step_of_many_tokens_in_micro_steps_passes_on_the_cpu(byte_data, tmp_path):
    """The same refusal counts a step's FLOPs, not its tokens: a 2-layer model on bytes with steps of 65,536 tokens in
    8 micro-steps trains a step in seconds on a CPU (under memory.CPU_STEP_FLOP) and passes every check; the same
    step of GPT-2 124M's shape is refused."""
    argv = [f"--data_dir={byte_data}", f"--out_dir={tmp_path / 'out'}", "--device=cpu", "--n_layer=2", "--n_head=2",
            "--n_embd=64", "--batch_size=32", "--block_size=256", "--total_batch_size=65536", "--eval_tokens=16384"]
    cpu = train.Proc(0, 0, 1, torch.device("cpu"))
    cfg = train.check_flags(train.load_config(argv), cpu)
    assert train.plan_batch(cfg, 1) == 8
    assert train.memory.step_flop(cfg) < train.memory.CPU_STEP_FLOP
    with pytest.raises(ValueError, match=r"^on a CPU, a step of 8 micro-steps \(65,536 tokens"):
        train.check_flags(train.load_config(argv + ["--n_layer=12", "--n_head=12", "--n_embd=768"]), cpu)


def test_a_gpu_preset_on_the_cpu_runs_at_the_second_try(byte_data, tmp_path, monkeypatch):
    """config/fast.py with config/speedrun.py (one micro-batch of 64 x 1024 a step) on a CPU where that micro-batch
    does not fit: the first refusal's changes, every one taken (a smaller micro-batch with one micro-batch a step,
    not the step's 65,536 tokens in micro-steps, which are refused on a CPU), pass every check."""
    monkeypatch.setattr(train.memory, "available", lambda device: 8e9)
    argv = ["--config", "config/fast.py", "--config", "config/speedrun.py", f"--data_dir={byte_data}",
            f"--out_dir={tmp_path / 'out'}", "--device=cpu"]
    with pytest.raises(ValueError) as e:
        train.main(argv)
    line = str(e.value)
    fit = re.search(r"lower --batch_size \((\d+) fits\) or --block_size, and add --total_batch_size=0 ", line)
    assert fit and "\n" not in line, line
    taken = ["--fp8=False", "--fp8_head=False", "--head_kernel=False", f"--batch_size={fit[1]}",
             "--total_batch_size=0", "--eval_tokens=16384"]
    for said in ("add --fp8=False --fp8_head=False", "add --head_kernel=False", "add --eval_tokens=16384"):
        assert said in line, (said, line)
    cpu = train.Proc(0, 0, 1, torch.device("cpu"))
    assert train.plan_batch(train.check_flags(train.load_config(argv + taken), cpu), 1) == 1
    with pytest.raises(ValueError, match=rf"^on a CPU, a step of {64 // int(fit[1])} micro-steps .*: add "
                                         r"--total_batch_size=0 "):        # the step kept: its micro-steps refused
        train.check_flags(train.load_config(argv + [f for f in taken if f != "--total_batch_size=0"]), cpu)


def test_gpu_flags_on_a_small_cpu_run_are_refused_together(byte_data, tmp_path):
    """A quickstart-sized run on the CPU given several GPU-only flags hears every one in one line, before any work
    (the attention backend's and a missing data folder's too), not one per try, and no out_dir is made; a single
    refusal stays as it is."""
    args = tiny_args(byte_data, tmp_path / "o", "--fused_ce=True", "--head_kernel=True", "--fp8_head=True",
                     "--compile=True", "--compile_tuning=True", "--device=cpu")
    with pytest.raises(ValueError) as e:
        train.main(args)
    line = str(e.value)
    assert "\n" not in line and line.startswith("this run on the CPU: every change it needs, at once: [1] "), line
    for said in ("compile_tuning=True tunes the Triton kernels", "fp8_head=True needs a GPU of compute capability",
                 "head_kernel=True runs Triton kernels on a CUDA GPU"):
        assert said in line, (said, line)
    assert "[3]" in line and "[4]" not in line and line.endswith("leave it out"), line
    assert not (tmp_path / "o").exists()                                  # a refused run makes no out_dir
    with pytest.raises(ValueError, match=r"^compile_tuning=True tunes the Triton kernels compiled for a GPU; on cpu"):
        train.main(tiny_args(byte_data, tmp_path / "o", "--compile=True", "--compile_tuning=True", "--device=cpu"))
    missing = tmp_path / "nosuch"                                         # the data folder, a check of its own
    with pytest.raises(ValueError, match=r"^this run on the CPU: .*\[1\] attention='flex' needs a CUDA GPU.*; \[2\] "
                                         r"fp8=True needs a GPU .*add --fp8=False; \[3\] data folder '.*nosuch' does "
                                         r"not exist: prepare it with `python data.py --input CORPUS --out .*nosuch`$"):
        train.main(tiny_args(missing, tmp_path / "o", "--attention=flex", "--fp8=True", "--device=cpu"))
    assert not (tmp_path / "o").exists() and not missing.exists()


@pytest.mark.parametrize("argv, message", [
    (["--fused_ce=True", "--fp8_head=True", "--fp8_recipe=rowwise"],
     "fp8_recipe='rowwise' would do nothing: .* --fp8=True"),
    (["--fp8_head=True", "--fused_ce=True", "--n_embd=40", "--n_head=4"],
     r"n_embd \(40\), .* multiples of 16 .*, or add --fp8_head=False"),
    (["--fp8_head=True", "--fused_ce=True", "--fused_ce_chunk=1000"],
     r"and fused_ce_chunk \(1000\) to be multiples of 16"),
])
def test_the_fp8_heads_settings_are_refused_on_an_fp8_gpu(argv, message, hopper):
    """What fp8.check refuses after its device check, on an FP8 GPU (stood in for): on a CPU its device's refusal
    comes first (test_config_errors)."""
    from configurator import load_config
    from speedgpt.features import fp8
    with pytest.raises(ValueError, match=message):
        fp8.check(load_config(argv), hopper)


@pytest.mark.parametrize("flags, why", [
    (["--attention=flex"], r"^attention='flex' needs a CUDA GPU"),
    (["--attention=varlen", "--dtype=bfloat16"], r"^attention='varlen' needs a CUDA GPU"),
    (["--fp8=True", "--fp8_min_dim=0"], r"^fp8=True needs a GPU of compute capability 8.9 or newer .*this run is on "
                                        r"Apple's GPU \(MPS\)"),
    (["--compile=True", "--compile_tuning=True"], r"^compile_tuning=True tunes the Triton kernels compiled for a GPU; "
                                                  r"on mps it would do nothing"),
    (["--sdpa_backend=flash", "--dtype=bfloat16", "--packing=False"], r"^sdpa_backend='flash' picks a CUDA kernel"),
])
def test_what_needs_cuda_is_refused_on_mps_in_one_line(tmp_path, monkeypatch, flags, why):
    """Apple's MPS (patched in: no Mac here): each CUDA-only path refused by its feature's check, before any work;
    the quickstart passes every check there (fused AdamW and bfloat16 on macOS 14 too: MPS has both)."""
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 16 * 2**30)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: True)
    mps = train.Proc(0, 0, 1, torch.device("mps"))
    quickstart = ["--data_dir=data/stdlib_byte", f"--out_dir={tmp_path}", "--device=mps"]
    with pytest.raises(ValueError, match=why):
        train.check_flags(train.load_config([*quickstart, *flags]), mps)
    cfg = train.load_config([*quickstart, "--fused_adamw=True", "--dtype=bfloat16", "--compile=True"])
    assert train.check_flags(cfg, mps) == cfg


def test_data_without_val_split_trains_without_evaluation(corpus_dir, tmp_path):
    data.prepare(str(corpus_dir), str(tmp_path / "d"), tokenizer="byte", val_frac=0)
    summary = train.main(tiny_args(tmp_path / "d", tmp_path / "o", "--eval_tokens=0", "--save_checkpoints=False"))
    assert summary["median_tokens_per_sec"] > 0


def test_scratch_run_starts_a_fresh_metrics_file(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with pytest.raises(ValueError, match="ckpt.pt holds a run: continue it with --init_from=resume, or start afresh"):
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))       # a forgotten --init_from=resume
    for writes_none in (["--save_checkpoints=False"], ["--eval_only=True"]):    # its metrics would be replaced
        with pytest.raises(ValueError, match="ckpt.pt holds a run: continue it with --init_from=resume"):
            train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", *writes_none))
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--init_from=scratch"))
    steps = [r["step"] for r in read_metrics(tmp_path) if "loss" in r]
    assert steps == [0, 1, 2, 3]


def test_a_scratch_run_that_writes_no_checkpoint_is_refused_over_a_run(byte_data, tmp_path):
    """--init_from=scratch replaces out_dir's run at its first checkpoint; with save_checkpoints=False there is none,
    and the old run's checkpoints stayed beside the new run's metrics and config.json (a resume then took the new
    run's records as its own history): refused in one line before anything there changes."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    before = {f: os.path.getmtime(tmp_path / f) for f in os.listdir(tmp_path)}
    with pytest.raises(ValueError, match=r"holds a run, which --init_from=scratch replaces at its first checkpoint, "
                                         r"but save_checkpoints=False writes none: .* another --out_dir"):
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--init_from=scratch", "--save_checkpoints=False"))
    assert {f: os.path.getmtime(tmp_path / f) for f in os.listdir(tmp_path)} == before
    train.main(tiny_args(byte_data, tmp_path / "new", "--init_from=scratch", "--save_checkpoints=False"))


def test_a_run_from_weights_never_replaces_the_run_in_its_out_dir(byte_data, tmp_path):
    """init_from a checkpoint file (a kept step of the same folder, or another run's) into an out_dir that holds a
    run is refused before any step, as a forgotten --init_from=resume is: it used to train and then delete the
    folder's newer checkpoints, the one it started from among them, and its metrics. Nothing in the folder changes."""
    train.main(tiny_args(byte_data, tmp_path / "a", "--max_iters=4", "--eval_interval=2", "--keep_checkpoints=3"))
    before = {f: os.path.getsize(tmp_path / "a" / f) for f in os.listdir(tmp_path / "a")}
    kept = tmp_path / "a" / "ckpt_step000002.pt"
    assert kept.is_file()
    with pytest.raises(ValueError, match=r"ckpt.pt holds a run, which a new run from .*ckpt_step000002.pt would "
                                         r"replace .*--init_from=resume, or from a kept step with --resume_from=STEP, "
                                         r"or give the new run another --out_dir$"):    # no rm -rf: it holds the file
        train.main(tiny_args(byte_data, tmp_path / "a", f"--init_from={kept}", "--max_iters=3"))
    train.main(tiny_args(byte_data, tmp_path / "b", "--max_iters=2"))
    with pytest.raises(ValueError, match=r"would replace .*--init_from=resume, or give the new run another --out_dir "
                                         r"\(rm -rf .* to start it there\)$"):
        train.main(tiny_args(byte_data, tmp_path / "a", f"--init_from={tmp_path / 'b' / 'ckpt.pt'}", "--max_iters=3"))
    assert {f: os.path.getsize(tmp_path / "a" / f) for f in os.listdir(tmp_path / "a")} == before
    train.main(tiny_args(byte_data, tmp_path / "c", f"--init_from={kept}", "--max_iters=3"))    # a new folder: fine
    assert (tmp_path / "c" / "ckpt.pt").is_file()
    with pytest.raises(ValueError, match=r"^init_from='.*ckpt_step000009.pt': no such checkpoint file$"):
        train.main(tiny_args(byte_data, tmp_path / "d", f"--init_from={tmp_path / 'a' / 'ckpt_step000009.pt'}"))


def test_a_folder_that_lost_its_ckpt_pt_still_holds_its_run(byte_data, tmp_path, capsys):
    """ckpt.pt deleted, its kept steps and ckpt_best.pt left: a new run there is refused (it used to start afresh and
    remove them), a resume names the kept step that continues it, sampling names a kept file; each way out works.
    With ckpt_best.pt alone, the way out is that file."""
    from speedgpt.checkpoint import no_checkpoint
    out = tmp_path / "a"
    train.main(tiny_args(byte_data, out, "--max_iters=4", "--eval_interval=2", "--keep_checkpoints=3"))
    (out / "ckpt.pt").unlink()
    before = sorted(os.listdir(out))
    with pytest.raises(ValueError, match=rf"^{out} holds a run's checkpoints without its ckpt.pt \(steps 2, 4\), "
                                         r"which a new run would remove: continue it with --resume_from=4, or give "
                                         r"the new run another --out_dir, or start afresh there with "
                                         r"--init_from=scratch \(which removes them\)$"):
        train.main(tiny_args(byte_data, out, "--max_iters=4"))
    with pytest.raises(FileNotFoundError, match=r"ckpt.pt: resume a kept one with --resume_from=4 \(steps 2, 4\)$"):
        train.main(tiny_args(byte_data, out, "--max_iters=6", "--init_from=resume"))
    assert sorted(os.listdir(out)) == before
    assert no_checkpoint(str(out)) == (f"no checkpoint at {out / 'ckpt.pt'}, but the folder keeps steps 2, 4: "
                                       f"name one, --out_dir={out / 'ckpt_step000004.pt'}")
    train.main(tiny_args(byte_data, out, "--max_iters=6", "--resume_from=4"))
    assert (out / "ckpt.pt").is_file()
    for f in out.glob("ckpt*.pt"):
        if f.name != "ckpt_best.pt":
            f.unlink()
    with pytest.raises(ValueError, match=rf"without its ckpt.pt \(ckpt_best.pt\), .* --resume_from={out}/ckpt_best.pt,"
                                         r" or give the new run another --out_dir, or start afresh there with "
                                         r"--init_from=scratch \(which removes them\)$"):
        train.main(tiny_args(byte_data, out, "--max_iters=4"))


def test_an_unfinished_stdlib_folder_is_prepared_again(tmp_path):
    """A Ctrl-C during the first run's automatic preparation leaves data/stdlib_byte without meta.json:
    the next run prepares it again instead of refusing it forever."""
    folder = tmp_path / "stdlib_byte"
    folder.mkdir()
    (folder / "train_000000.bin.tmp").write_bytes(b"half")     # what an interrupted preparation leaves
    train.main(tiny_args(folder, tmp_path / "o", "--device=cpu", "--max_iters=1", "--eval_tokens=0"))
    assert (folder / "meta.json").is_file() and not (folder / "train_000000.bin.tmp").exists()


# -----------------------------------------------------------------------------
# divergence


def strict_json(path):
    """Parse a JSON or JSON-lines file, refusing NaN / Infinity (Python's json accepts them by default)."""
    def refuse(name):
        raise ValueError(f"{path}: {name} is not JSON")
    with open(path) as f:
        if str(path).endswith(".json"):
            return [json.load(f, parse_constant=refuse)]
        return [json.loads(line, parse_constant=refuse) for line in f if line.strip()]


def cli(args, env=None, **kw):
    return subprocess.run([sys.executable, "train.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, **kw)


def test_divergence_never_reaches_the_weights_or_the_checkpoint(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    good = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    bad = ["--init_from=resume", "--learning_rate=1e30", "--min_lr=1e30", "--grad_clip=0"]
    with pytest.raises(train.RunStopped, match=r"step \d+: the loss or gradient norm is not finite: the run diverged; "
                                               r".*ckpt.pt still holds step 4") as e:
        train.main(tiny_args(byte_data, tmp_path, *bad))
    assert e.value.exit_code == 1
    kept = torch.load(tmp_path / "ckpt.pt", weights_only=True)        # the last good checkpoint survives
    assert kept["step"] == 4 and kept["best_val_loss"] == good["best_val_loss"]
    for name, p in good["model"].items():
        assert torch.equal(kept["model"][name], p), name
    summary = strict_json(tmp_path / "summary.json")[0]             # strict JSON: null, never NaN
    assert "diverged" in summary["stopped"]
    rows = strict_json(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == list(range(4)) + [4, 5]
    assert rows[-1]["loss"] is None and rows[-2]["loss"] > 0        # step 5's NaN loss, written as null

    # the command line: a non-zero exit and one line naming the step, no traceback
    proc = cli(tiny_args(byte_data, tmp_path, *bad))
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"^error: step \d+: the loss or gradient norm is not finite", proc.stderr, re.M), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_features_grad_hooks_see_each_applied_updates_final_gradients(byte_data, tmp_path, monkeypatch):
    """A feature's grad_hooks run once per applied update, on the gradients the optimizer takes: summed over the
    micro-steps and clipped (the norm at most grad_clip); what a hook does to them is what the update applies
    (zeroed here: AdamW without weight decay leaves every weight as it was); a skipped step calls none."""
    import types
    seen = []

    def grad_hooks(model, cfg):
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        seen.append(start)

        def hook():
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
            for g in grads:
                g.zero_()
        return [hook]
    monkeypatch.setattr(train, "FEATURES", (*train.FEATURES, types.SimpleNamespace(
        grad_hooks=grad_hooks, apply=lambda model, cfg, proc: None)))
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=3", "--grad_clip=1e-3", "--weight_decay=0",
                         "--total_batch_size=512", "--eval_interval=3"))           # 2 micro-steps of 4 x 64
    start, norms = seen[0], seen[1:]
    assert len(norms) == 3 and all(0 < n <= 1e-3 * (1 + 1e-4) for n in norms), norms
    kept = torch.load(tmp_path / "ckpt.pt", weights_only=True)["model"]
    for name, p in start.items():
        assert torch.equal(kept[name].to(p.dtype), p), name

    seen.clear()                                    # a step whose gradient is not finite is skipped: no hook
    with pytest.raises(train.RunStopped, match="diverged"):
        train.main(tiny_args(byte_data, tmp_path / "b", "--max_iters=3", "--learning_rate=1e30", "--min_lr=1e30",
                             "--warmup_iters=0", "--grad_clip=0", "--max_skipped_steps=0"))
    rows = [r for r in read_metrics(tmp_path / "b") if "loss" in r]
    assert len(seen) - 1 == len(rows) - 1, rows    # each step but the last, skipped, applied its update


def test_skipped_steps_are_bounded(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    bad = ["--init_from=resume", "--learning_rate=1e30", "--min_lr=1e30", "--grad_clip=0", "--max_iters=20",
           "--eval_interval=100"]
    with pytest.raises(train.RunStopped, match="diverged"):
        train.main(tiny_args(byte_data, tmp_path, *bad, "--max_skipped_steps=3"))
    rows = [r for r in strict_json(tmp_path / "metrics.jsonl") if "loss" in r]
    # step 4 applies a huge but finite update; steps 5, 6, 7 are skipped; step 8 is one too many
    assert [r["step"] for r in rows][-5:] == [4, 5, 6, 7, 8]
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 4


def test_a_rerun_of_a_finished_run_changes_nothing_and_says_so(byte_data, tmp_path, capsys):
    """A run stopped at its target_val_loss, or at max_iters, run again with the same command (resuming): one line
    says it is finished and how to train on; not a byte of out_dir changes (summary.json keeps the time to the
    target). A lower target trains on from the checkpoint."""
    from conftest import _folder_state
    args = ["--max_iters=12", "--eval_interval=4"]
    train.main(tiny_args(byte_data, tmp_path / "straight", *args, "--save_checkpoints=False"))
    vals = {r["step"]: r["val_loss"] for r in read_metrics(tmp_path / "straight") if "val_loss" in r}
    assert vals[4] < vals[0] and vals[8] < vals[4]
    for name, extra in (("target", [f"--target_val_loss={vals[4]}"]), ("max_iters", [])):
        out = tmp_path / name
        first = train.main(tiny_args(byte_data, out, *args, *extra))
        assert first["steps"] == (4 if extra else 12)
        before = _folder_state(out)
        capsys.readouterr()
        again = train.main(tiny_args(byte_data, out, *args, *extra, "--init_from=resume"))
        said = [line for line in capsys.readouterr().out.splitlines() if not line.startswith(("memory:", "warning"))]
        assert again["finished"] and len(said) == 1 and said[0].startswith(f"this run is finished: {out / 'ckpt.pt'} ")
        assert (f"reached target_val_loss={vals[4]} at step 4 (val loss {vals[4]:.4f}; 1,024 tokens" in said[0]
                and "to train on, give a lower --target_val_loss" in said[0]) if extra else \
            "is at step 12 = max_iters; to train on, give a larger --max_iters" in said[0]
        assert _folder_state(out) == before
    summary = train.main(tiny_args(byte_data, tmp_path / "target", *args, f"--target_val_loss={vals[8]}",
                                   "--init_from=resume"))
    assert summary["target_reached"]["step"] == 8 and summary["steps"] == 8


def test_a_resume_onto_data_prepared_again_is_refused_and_a_moved_copy_resumes(byte_data, tmp_path):
    """The loader resumes at a place in the tokens the run trained on: a data_dir prepared again (here with another
    split seed: as many rows, other ones) is refused in one line naming what changed and the way out, where it went on
    silently (or, with other row counts, blamed data_dir, block_size or packing); the same data moved elsewhere
    resumes."""
    out = tmp_path / "o"
    train.main(tiny_args(byte_data, out, "--max_iters=2"))
    moved, again = tmp_path / "moved", tmp_path / "again"
    shutil.copytree(byte_data, moved)
    shutil.copytree(byte_data, again)
    meta = json.loads((again / "meta.json").read_text())
    (again / "meta.json").write_text(json.dumps({**meta, "seed": meta["seed"] + 1}))
    with pytest.raises(ValueError, match=rf"^data_dir={re.escape(str(again))} holds other tokens than this run trained "
                                         rf"on \(seed {meta['seed']} -> {meta['seed'] + 1}: prepared again\?\): resume on "
                                         rf"the data it trained on, or start a new run from its weights in a new folder "
                                         rf"\(--init_from=.*ckpt.pt --out_dir=NEW_FOLDER\)$"):
        train.main(tiny_args(again, out, "--max_iters=4", "--init_from=resume"))
    assert train.main(tiny_args(moved, out, "--max_iters=4", "--init_from=resume"))["steps"] == 4


def test_a_resume_onto_a_stdlib_corpus_prepared_on_first_use_is_held_to_the_checkpoints_data(byte_data, tmp_path,
                                                                                             monkeypatch):
    """data/stdlib_byte missing at a resume is prepared then (here: as a copy whose meta names GPT-2's tokens), after
    the resume's checks: its tokens are held to the checkpoint's once there, and refused in the data's own line, not
    in a weights mismatch (wte.weight of another shape) or, at as many rows, not at all."""
    out, fresh = tmp_path / "o", tmp_path / "fresh" / "stdlib_byte"
    train.main(tiny_args(byte_data, out, "--max_iters=2"))

    def prepare(_, out_dir, tokenizer):
        shutil.copytree(byte_data, out_dir)
        meta = json.loads((fresh / "meta.json").read_text())
        (fresh / "meta.json").write_text(json.dumps({**meta, "vocab_size": 50257, "tokenizer": "gpt2"}))
    monkeypatch.setattr(train, "prepare", prepare)
    with pytest.raises(ValueError, match=r"^vocab_size 257 in the checkpoint, 50257 in data: give --data_dir data of "
                                         r"`python data.py --tokenizer byte`$"):
        train.main(tiny_args(fresh, out, "--max_iters=4", "--init_from=resume"))


def test_a_resume_onto_the_same_corpus_prepared_again_another_way_resumes(byte_data, corpus_dir, tmp_path):
    """The corpus prepared again with its path spelled otherwise (a relative path, another mount on another node),
    read as utf-8:replace, under a max_tokens it never reaches: the same tokens, so the resume goes on, where the
    input's name and how it was read counted as other data."""
    out, again = tmp_path / "o", tmp_path / "again"
    train.main(tiny_args(byte_data, out, "--max_iters=2"))
    data.prepare(str(corpus_dir) + os.sep, str(again), "byte", val_frac=0.2, seed=0, workers=2,
                 encoding="utf-8:replace", max_tokens=10**12)
    assert json.loads((again / "meta.json").read_text())["input"] != str(corpus_dir)
    assert train.main(tiny_args(again, out, "--max_iters=4", "--init_from=resume"))["steps"] == 4


def test_a_resume_onto_data_of_another_tokenizer_names_the_tokenizer_to_prepare(byte_data, tmp_path):
    out = tmp_path / "o"
    train.main(tiny_args(byte_data, out, "--max_iters=2"))
    other = tmp_path / "gpt2_data"
    shutil.copytree(byte_data, other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "vocab_size": 50257, "tokenizer": "gpt2"}))
    with pytest.raises(ValueError, match=r"^vocab_size 257 in the checkpoint, 50257 in data: give --data_dir data of "
                                         r"`python data.py --tokenizer byte`$"):
        train.main(tiny_args(other, out, "--max_iters=4", "--init_from=resume"))
