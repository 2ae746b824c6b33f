import json
import os
import subprocess
import sys
from contextlib import nullcontext

import pytest
import torch

import configurator
import data
import train
from speedgpt import optim
from conftest import ROOT, read_metrics, tiny_args
from model import GPT, GPTConfig


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**dict(block_size=64, vocab_size=257, n_layer=2, n_head=2, n_embd=32), **kw}))


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


def test_fused_adamw_matches_default():
    cfgs = [configurator.Config(fused_adamw=f, learning_rate=1e-2) for f in (False, True)]
    models = [tiny_model(), tiny_model()]
    opts = [optim.build(m, c, torch.device("cpu")) for m, c in zip(models, cfgs)]
    assert opts[1].defaults["fused"] and not opts[0].defaults.get("fused")
    assert [len(g["params"]) for g in opts[0].param_groups] == [2 * 4 + 1 + 1, 2 * 2 + 1]  # matrices / vectors
    for step in range(5):
        for m, o in zip(models, opts):
            g = torch.Generator().manual_seed(step)      # the same gradients for both
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            o.step()
    for p, q in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_few_cpu_steps_per_dtype(byte_data, tmp_path, dtype):
    summary = train.main(tiny_args(byte_data, tmp_path, f"--dtype={dtype}", "--max_iters=12", "--learning_rate=1e-2"))
    rows = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert len(rows) == 12 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert summary["val_loss"] < 5.0
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert bool(ckpt["scaler"]) == (dtype == "float16")             # a GradScaler for float16 only


@pytest.mark.slow
def test_compile_run(byte_data, tmp_path):
    summary = train.main(tiny_args(byte_data, tmp_path, "--compile=True", "--max_iters=6"))
    assert summary["median_tokens_per_sec"] > 0
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])


def test_metrics_timing_and_checkpoint(byte_data, tmp_path):
    summary = train.main(tiny_args(byte_data, tmp_path, "--peak_flops=1e12"))
    rows = [r for r in read_metrics(tmp_path) if "loss" in r]
    for key in ("step", "loss", "lr", "step_ms", "tokens_per_sec", "mfu", "mem_gb", "pad_frac"):
        assert all(key in r for r in rows)
    assert rows[0]["tokens_per_sec"] is None                        # warm-up step: untimed
    timed = [r for r in rows if r["tokens_per_sec"] is not None]
    assert len(timed) == 7 and all(r["mfu"] > 0 for r in timed)
    fpt = GPT(GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=2, n_embd=32)).flops_per_token()
    for r in timed:
        assert r["mfu"] == pytest.approx(fpt * r["tokens_per_sec"] / 1e12)
    assert summary["median_tokens_per_sec"] in [r["tokens_per_sec"] for r in timed]
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 8 and set(ckpt) >= {"model", "optimizer", "loader", "rng", "config", "meta"}
    assert not os.path.exists(tmp_path / "ckpt.pt.tmp")
    assert json.load(open(tmp_path / "config.json"))["n_embd"] == 32


def test_fused_ce_chunk_is_used_and_gives_the_plain_losses(byte_data, tmp_path, capsys):
    """fused_ce with fused_ce_chunk=40 (chunks that do not divide a micro-batch's 256 tokens) trains
    step for step as the plain head does (float32), and the chunk is the one printed and set."""
    plain = tiny_args(byte_data, tmp_path / "plain", "--max_iters=4")
    fused = tiny_args(byte_data, tmp_path / "fused", "--max_iters=4", "--fused_ce=True", "--fused_ce_chunk=40")
    train.main(plain)
    train.main(fused)
    assert "fused_ce: head + cross-entropy in chunks of 40 tokens, matmuls in float32" in capsys.readouterr().out
    a, b = ([r["loss"] for r in read_metrics(tmp_path / d) if "loss" in r] for d in ("plain", "fused"))
    assert len(a) == len(b) == 4
    for step, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) < 1e-5, f"step {step}: plain {x} vs fused_ce {y}"


def test_resume_continues_exactly(byte_data, tmp_path):
    common = ["--max_iters=16", "--lr_decay_iters=16", "--eval_interval=8", "--dropout=0.1"]
    train.main(tiny_args(byte_data, tmp_path / "full", *common))
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--max_iters=8"))
    train.main(tiny_args(byte_data, tmp_path / "part", *common, "--init_from=resume"))
    full = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "full") if "loss" in r}
    part = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "part") if "loss" in r}
    assert sorted(part) == sorted(full) == list(range(16))
    for step in range(8, 16):
        assert part[step] == full[step], f"step {step}: resumed {part[step]} vs uninterrupted {full[step]}"


def test_resume_keeps_the_checkpoint_steps_evaluation_once(byte_data, tmp_path):
    """The evaluation a run made at its last step, before saving, stays in metrics.jsonl after a resume:
    once, whether the resumed run evaluates that step again (same eval_interval) or not (another)."""
    common = ["--max_iters=8", "--lr_decay_iters=8", "--eval_interval=4"]
    for name, resume in (("same", ["--eval_interval=4"]), ("other", ["--eval_interval=100"])):
        train.main(tiny_args(byte_data, tmp_path / name, *common))
        before = [r for r in read_metrics(tmp_path / name) if "val_loss" in r]
        train.main(tiny_args(byte_data, tmp_path / name, *common, *resume, "--max_iters=10", "--init_from=resume"))
        evals = {}
        for r in read_metrics(tmp_path / name):
            if "val_loss" in r:
                evals.setdefault(r["step"], []).append(r["val_loss"])
        assert [r["step"] for r in before] == [0, 4, 8] and evals[8] == [before[-1]["val_loss"]], (name, evals)
        assert sorted(evals) == [0, 4, 8, 10]


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
    (["--fp8_head=True"], ValueError, "fp8_head=True runs the fused head's matmuls in float8: it needs fused_ce=True"),
    (["--check_mask=True", "--packing=False"], ValueError,
     "check_mask=True checks the document mask: it needs packing"),
    (["--config", "config/fast.py", "--device=cpu"], ValueError,
     r"this run is on the CPU: add --fp8_head=False \(config/fast.py and config/gpt2-\*.py set fp8_head=True\)"),
    (["--config", "config/fast.py", "--fp8=True", "--device=cpu"], ValueError,
     r"^fp8=True and fp8_head=True need a GPU .* add --fp8=False --fp8_head=False"),
    (["--fused_ce=True", "--dtype=float16"], ValueError, "fused_ce=True with dtype='float16' is not supported"),
    (["--fused_ce=True", "--fp8_head=True", "--fp8_recipe=rowwise"], ValueError,
     "fp8_recipe='rowwise' would do nothing: .* --fp8=True"),
    (["--fp8_head=True", "--fused_ce=True", "--n_embd=40", "--n_head=4"], ValueError,
     r"n_embd \(40\), .* multiples of 16 .*, or add --fp8_head=False"),
    (["--fp8_head=True", "--fused_ce=True", "--fused_ce_chunk=1000"], ValueError,
     r"and fused_ce_chunk \(1000\) to be multiples of 16"),
    (["--fused_ce_chunk=0"], ValueError, "'fused_ce_chunk' must be positive"),
    (["--attention=varlen"], ValueError, "attention='varlen' .* takes bfloat16 or float16"),
    (["--attention=varlen", "--dtype=bfloat16", "--device=cpu"], ValueError, "varlen kernels do not run on the CPU"),
    (["--compile_regional=True"], ValueError,
     "compile_regional=True chooses how the model is compiled: it needs compile"),
    (["--parallelism=fsdp"], ValueError, "torchrun"),
    (["--optimizer=sgd"], ValueError, r"'optimizer' \(command line\) must be one of \('adamw', 'muon'\)"),
    (["--lr_schedule=wsd", "--wsd_decay_frac=0"], ValueError, r"wsd_decay_frac=0.0: the share of lr_decay_iters"),
    (["--optimizer=muon", "--muon_lr=0"], ValueError, "muon_lr=0.0 must be positive"),
    (["--init_from=resume"], FileNotFoundError, "ckpt.pt"),
    (["--batch_size=0"], ValueError, "'batch_size' must be positive"),
    (["--max_iters=-1"], ValueError, "'max_iters' must be >= 0"),
    (["--n_embd=30", "--n_head=4"], ValueError, "divisible by n_head"),
    (["--device=tpu"], ValueError, "'device' must be auto, cpu, cuda or cuda:N"),
    (["--grad_clip=-1"], ValueError, "'grad_clip' must be >= 0"),
    (["--learning_rate=nan"], ValueError, "'learning_rate' .command line. must be a finite number, got 'nan'"),
    (["--min_lr=inf"], ValueError, "'min_lr' .command line. must be a finite number"),
    (["--profile=True", "--timing_warmup=1"], ValueError, "timing_warmup >= 2"),
    (["--sdpa_backend=cudnn", "--attention=naive"], ValueError, "applies to attention='sdpa' only"),
    (["--sdpa_backend=flash", "--dtype=bfloat16"], ValueError, "takes no attention mask"),
    (["--sdpa_backend=cudnn", "--dtype=bfloat16", "--device=cpu"], ValueError, "use sdpa_backend='auto' on the CPU"),
    (["--sdpa_backend=flash", "--dtype=bfloat16", "--packing=False", "--device=cpu"], ValueError,
     "use sdpa_backend='auto' on the CPU"),
    (["--sdpa_backend=cudnn"], ValueError, "take bfloat16 or float16"),
    (["--profile=True", "--timing_warmup=3", "--max_iters=2"], ValueError, "max_iters=2 ends before it"),
    (["--beta2=1.0"], ValueError, r"'beta2' \(AdamW\) must be in \[0, 1\)"),
    (["--config"], ValueError, "--config needs a file path"),
    (["--config", "config"], FileNotFoundError, "is a folder, not a file"),
])
def test_config_errors(byte_data, tmp_path, args, error, match):
    with pytest.raises(error, match=match):
        train.main(tiny_args(byte_data, tmp_path, *args))


def test_config_file_errors(tmp_path):
    (tmp_path / "c.py").write_text("n_layer = 2\nlearning_rat = 1e-3\n")
    with pytest.raises(ValueError, match=r"unknown config key 'learning_rat' \(.*c.py\)"):
        configurator.load_config(["--config", str(tmp_path / "c.py")])
    (tmp_path / "s.py").write_text("batch_size = \n")
    with pytest.raises(ValueError, match="s.py.* does not run: SyntaxError"):
        configurator.load_config(["--config", str(tmp_path / "s.py")])
    (tmp_path / "d.py").write_text("batch_size = '8'\n")
    with pytest.raises(TypeError, match="'batch_size'"):
        configurator.load_config(["--config", str(tmp_path / "d.py")])
    cfg = configurator.load_config(["--config", "config/fast.py", "--batch_size=4", "--learning_rate=1"])
    assert (cfg.n_layer, cfg.batch_size, cfg.learning_rate, cfg.compile) == (12, 4, 1.0, True)
    cfg = configurator.load_config(["--batch_size=4", "--config", "config/fast.py"])    # an override beats
    assert (cfg.n_layer, cfg.batch_size) == (12, 4)                                     # the file, wherever
    (tmp_path / "m.py").write_text("import math\nlearning_rate = math.sqrt(1e-6)\n")    # modules are no keys
    assert configurator.load_config(["--config", str(tmp_path / "m.py")]).learning_rate == 1e-3


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


def test_corrupt_meta_json(byte_data, tmp_path):
    import shutil
    data_dir = tmp_path / "d"
    shutil.copytree(byte_data, data_dir)
    (data_dir / "meta.json").write_text("{'tokenizer': 'byte'")
    with pytest.raises(ValueError, match="meta.json is not valid JSON"):
        train.main(tiny_args(data_dir, tmp_path / "o"))
    (data_dir / "meta.json").write_text('{"tokenizer": "byte", "vocab_size": 257}')
    with pytest.raises(ValueError, match="meta.json lacks eot_id"):
        train.main(tiny_args(data_dir, tmp_path / "o"))


def test_foreign_or_mismatched_checkpoint(byte_data, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    torch.save({"model": {}, "iter_num": 5}, out / "ckpt.pt")            # a nanoGPT-style checkpoint
    with pytest.raises(ValueError, match="not a speedgpt checkpoint: it lacks optimizer, scaler, step"):
        train.main(tiny_args(byte_data, out, "--init_from=resume"))
    # a real one, then damage its weights
    train.main(tiny_args(byte_data, out, "--max_iters=4", "--init_from=scratch"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["model"]["lm_head.weight"] = ckpt["model"]["lm_head.weight"][:, :16]
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(ValueError, match="does not fit the model"):
        train.main(tiny_args(byte_data, out, "--init_from=resume"))


def test_data_without_val_split_trains_without_evaluation(corpus_dir, tmp_path):
    data.prepare(str(corpus_dir), str(tmp_path / "d"), tokenizer="byte", val_frac=0)
    summary = train.main(tiny_args(tmp_path / "d", tmp_path / "o", "--eval_tokens=0", "--save_checkpoints=False"))
    assert summary["median_tokens_per_sec"] > 0


def test_missing_data_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare it"):
        train.main(tiny_args(tmp_path / "no_data", tmp_path))


def test_wandb_offline_records_metrics(byte_data, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B is in requirements.txt; this machine lacks it")
    from wandb_reader import history, record_types
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    train.main(tiny_args(byte_data, tmp_path / "out", "--wandb_log=True", "--peak_flops=1e12", "--wandb_run_name=t"))
    import time
    import wandb
    wandb.teardown()                  # stop the W&B service so it closes (flushes) the run's log
    for _ in range(60):               # and give a loaded machine time to finish writing it
        rows = history(tmp_path)
        steps = [r for r in rows if "tokens_per_sec" in r]
        if len(steps) >= 8:
            break
        time.sleep(0.5)
    assert [r["_step"] for r in steps] == list(range(8)), (rows, record_types(tmp_path))
    timed = [r for r in steps if r["tokens_per_sec"] is not None]
    assert len(timed) == 7 and all(r["tokens_per_sec"] > 0 and r["mfu"] > 0 for r in timed)
    assert any("val_loss" in r for r in rows)


def test_resume_refuses_a_mismatched_or_corrupt_checkpoint(byte_data, short_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with pytest.raises(ValueError, match="past max_iters=2"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume", "--max_iters=2"))
    (tmp_path / "ckpt.pt").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot be read"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=resume"))


def test_resume_checks_fp8_shapes_of_the_checkpoint(byte_data, tmp_path):
    """A resumed run takes n_embd from the checkpoint when it is not set: fp8_head's multiple-of-16 check
    sees that shape (40), not the command's default (128), and refuses before any work."""
    train.main(tiny_args(byte_data, tmp_path, "--n_embd=40", "--n_head=4", "--max_iters=2"))
    shapeless = [a for a in tiny_args(byte_data, tmp_path, "--max_iters=4")
                 if not a.startswith(("--n_embd", "--n_head"))]
    with pytest.raises(ValueError, match=r"fp8_head=True needs n_embd \(40\)"):
        train.main(shapeless + ["--init_from=resume", "--fp8_head=True", "--fused_ce=True"])


def test_scratch_run_starts_a_fresh_metrics_file(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    with pytest.raises(ValueError, match="ckpt.pt holds a run: continue it with --init_from=resume, or start afresh"):
        train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))       # a forgotten --init_from=resume
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4", "--init_from=scratch"))
    steps = [r["step"] for r in read_metrics(tmp_path) if "loss" in r]
    assert steps == [0, 1, 2, 3]


def test_profile_writes_a_table_and_a_trace(byte_data, tmp_path):
    train.main(tiny_args(byte_data, tmp_path, "--profile=True", "--timing_warmup=2", "--max_iters=4"))
    table = (tmp_path / "profile.txt").read_text()
    assert "aten::" in table and "Self CPU" in table
    import gzip, json
    trace = json.load(gzip.open(tmp_path / "profile_trace.json.gz"))
    assert any(e.get("name", "").startswith("aten::mm") for e in trace["traceEvents"])


def test_profile_summary_sums_kernels_by_kind(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import gzip, json
    import profile_summary
    events = [{"cat": "kernel", "name": "nvjet_sm90_tst_256x128_64x4", "ts": 0, "dur": 300},
              {"cat": "kernel", "name": "triton_tem_fused_flex_attention_backward_8", "ts": 300, "dur": 100},
              {"cat": "kernel", "name": "triton_red_fused__log_softmax__to_copy_3", "ts": 400, "dur": 50},
              {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 500, "dur": 50},
              {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 999}]
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    text = "\n".join(profile_summary.summarize(str(tmp_path / "t.json.gz")))
    assert "(90.9%;" in text                  # kernels span 0..550 us and are busy for 500 us of it
    rows = {l.split("|")[1].strip(): float(l.split("|")[2])
            for l in text.splitlines() if l.startswith("| ") and "%" in l}
    assert rows == {"matmul (GEMM)": 0.3, "attention": 0.1, "Triton (Inductor fused)": 0.1, "copy / memset": 0.1}


@pytest.mark.parametrize("error", ["torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 24.00 GiB')",
                                   "RuntimeError(\"DefaultCPUAllocator: can't allocate memory: "
                                   "you tried to allocate 6e11 bytes\")",
                                   "MemoryError()"])
def test_out_of_memory_is_one_line_naming_the_knobs(byte_data, tmp_path, error):
    """A micro-batch that does not fit ends in one line naming batch_size, block_size and
    grad_checkpointing, not a traceback: CUDA's OutOfMemoryError, the CPU allocator's error and numpy's
    MemoryError, raised by the model's forward (a real allocation failure depends on the OS: where it
    overcommits, the kernel kills the process instead)."""
    launch = ("import runpy, sys, torch, model\n"
              f"def oom(*a, **k): raise {error}\n"
              "model.GPT.forward = oom\n"
              "sys.argv = ['train.py'] + sys.argv[1:]\n"
              "runpy.run_path('train.py', run_name='__main__')")
    cmd = [sys.executable, "-c", launch, *tiny_args(byte_data, tmp_path / "o", "--device=cpu", "--eval_tokens=0")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error: out of memory"), proc.stderr[-2000:]
    assert "--batch_size" in proc.stderr and "--grad_checkpointing=full" in proc.stderr


def test_an_unfinished_stdlib_folder_is_prepared_again(tmp_path):
    """A Ctrl-C during the first run's automatic preparation leaves data/stdlib_byte without meta.json:
    the next run prepares it again instead of refusing it forever."""
    folder = tmp_path / "stdlib_byte"
    folder.mkdir()
    (folder / "train_000000.bin.tmp").write_bytes(b"half")     # what an interrupted preparation leaves
    train.main(tiny_args(folder, tmp_path / "o", "--device=cpu", "--max_iters=1", "--eval_tokens=0"))
    assert (folder / "meta.json").is_file() and not (folder / "train_000000.bin.tmp").exists()


def test_sample_says_what_it_does_with_odd_prompts(byte_data, tmp_path):
    """sample.py: a prompt longer than block_size is cropped with a note; a prompt file that is not UTF-8
    is one line, not a traceback."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=1"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    run = lambda start: subprocess.run([sys.executable, "sample.py", f"--out_dir={tmp_path}", f"--start={start}",
                                        "--num_samples=1", "--max_new_tokens=2", "--device=cpu"],
                                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    proc = run(f"FILE:{tmp_path / 'latin1.txt'}")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: prompt file {tmp_path / 'latin1.txt'} is not UTF-8 text (byte 0xe9 at offset 3): "
        "convert it to UTF-8 first"]
    proc = run("x" * 100)
    assert proc.returncode == 0 and "note: the prompt is 101 tokens (with its end-of-text), longer than block_size=64" \
        in proc.stderr
