"""speedgpt/memory.py: the estimate against measured peaks (the H200's, from BENCHMARKS.md and
benchmarks/results/; a real CPU step), the refusal of the reported run (issue 37) in one line, the override,
where a CPU's and a GPU's memory are read from, and a micro-batch that does not fit ending the run in one line
naming the knobs. Runs on the CPU: the GPU is faked where the check reads one."""
import glob
import json
import os
import re
import subprocess
import sys
import types
from dataclasses import replace

import pytest
import torch

from configurator import Config, load_config
from conftest import on, tiny_args
from speedgpt import attention, memory
from train import FEATURES, TRANSFORMS   # each reports what it changes in the estimate (its memory())

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2_VOCAB, BYTE_VOCAB = 50257, 257
H200 = 141e9        # the vendor's 141 GB; torch reports 150.1e9 (benchmarks/results/history.md, section 5)

# Peak GB (torch.cuda.max_memory_allocated) on one H200: (command line, attention as it ran, GB, where measured)
MEASURED = [
    (["--config", "config/fast.py"], "varlen", 30.1, "family_side_by_side_h200.md, 124m (642d9e0)"),
    (["--config", "config/fast.py", "--fp8=False"], "varlen", 37.5, "BENCHMARKS.md, Memory (e020850)"),
    (["--config", "config/gpt2-medium.py", "--fp8_gelu_cast=False"], "varlen", 63.7, "BENCHMARKS.md, Memory (3f9797b)"),
    (["--config", "config/gpt2-large.py", "--fp8_gelu_cast=False"], "varlen", 46.7, "BENCHMARKS.md, Memory"),
    (["--config", "config/gpt2-xl.py", "--fp8_gelu_cast=False"], "varlen", 78.6, "BENCHMARKS.md, Memory"),
    (["--config", "config/gpt2-xl.py", "--batch_size=16", "--fp8_gelu_cast=False"], "varlen", 50.2, "BENCHMARKS.md, Memory"),
    (["--config", "config/fast.py", "--fp8=False", "--fused_ce=False", "--fp8_head=False"], "varlen", 44.3,
     "features_124m_h200.md, fused_ce (9eeaef6)"),
    (["--config", "config/fast.py", "--fp8=False", "--fused_ce_chunk=16384"], "varlen", 28.2,
     "features_124m_h200.md, chunk"),
    (["--config", "config/gpt2-medium.py", "--fused_ce_chunk=65536", "--fp8_gelu_cast=False"], "varlen", 73.4, "features_124m_h200.md"),
    (["--config", "config/gpt2-large.py", "--fp8=False"], "varlen", 66.3, "family_side_by_side_h200.md"),
    # the launches of benchmarks/first_step.py at bf01b54 (as shipped then: evaluation, 8-16 micro-batches a step)
    (["--config", "config/gpt2-medium.py", "--fp8_gelu_cast=False"], "varlen", 56.9, "long_run_h200.md (bf01b54)"),
    (["--config", "config/gpt2-large.py", "--fp8_gelu_cast=False"], "varlen", 60.3, "long_run_h200.md (bf01b54)"),
    (["--config", "config/gpt2-xl.py", "--fp8_gelu_cast=False"], "varlen", 102.3, "long_run_h200.md (bf01b54)"),
    # one H100, one optimizer step per micro-batch (the allocator's peak does not depend on the card)
    (["--config", "config/gpt2-medium.py"], "varlen", 55.5, "h100.md, ninth part (bf01b54)"),
    (["--config", "config/gpt2-large.py"], "varlen", 57.2, "ibid."),
    (["--config", "config/gpt2-xl.py", "--batch_size=16"], "varlen", 59.0, "ibid."),
    (["--config", "config/large.py"], "flex", 52.8, "BENCHMARKS.md, Memory: config/large.py at batch 8"),
    (["--config", "config/large.py", "--grad_checkpointing=selective"], "flex", 37.4, "ibid."),
    (["--config", "config/large.py", "--grad_checkpointing=full"], "flex", 25.9, "ibid."),
    (["--config", "config/baseline.py", "--packing=False"], "naive", 34.2, "BENCHMARKS.md, the ladder's baseline"),
    (["--config", "config/baseline.py", "--packing=False", "--dtype=bfloat16"], "naive", 31.7, "ibid., + bf16"),
    (["--config", "config/baseline.py", "--packing=False", "--dtype=bfloat16", "--compile=True"], "naive", 22.1,
     "ibid., + torch.compile"),
]


def resolved(argv, attention_as_run):
    cfg = load_config(argv)
    return replace(cfg, attention=attention_as_run, document_mask=cfg.packing and cfg.document_mask)


def fake_gpu(monkeypatch, total):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=total))


@pytest.mark.parametrize("argv, attention_as_run, gb, source", MEASURED,
                         ids=[" ".join(m[0][1:]) for m in MEASURED])
def test_the_estimate_is_near_each_measured_peak(argv, attention_as_run, gb, source):
    est = memory.estimate(resolved(argv, attention_as_run), GPT2_VOCAB, features=FEATURES)
    assert 0.6 * gb * 1e9 < est.total < 1.6 * gb * 1e9, f"{est.describe()} against {gb} GB measured ({source})"


def test_checkpointing_and_fp8_shrink_the_activations_in_the_measured_order():
    """Each feature's memory() changes the estimate by what it keeps; without the features the estimate is the
    model's alone, whatever their keys say."""
    cfgs = [resolved(["--config", "config/large.py", f"--grad_checkpointing={g}"], "flex")
            for g in ("none", "selective", "full")]
    none, selective, full = (memory.estimate(cfg, GPT2_VOCAB, features=FEATURES) for cfg in cfgs)
    assert full.activations < selective.activations < none.activations
    assert full.weights == selective.weights == none.weights and full.head == none.head
    assert len({memory.estimate(cfg, GPT2_VOCAB) for cfg in cfgs}) == 1            # the model alone
    fp8 = memory.estimate(resolved(["--config", "config/gpt2-large.py"], "varlen"), GPT2_VOCAB, features=FEATURES)
    bf16 = memory.estimate(resolved(["--config", "config/gpt2-large.py", "--fp8=False"], "varlen"), GPT2_VOCAB,
                           features=FEATURES)
    rowwise = memory.estimate(resolved(["--config", "config/gpt2-large.py", "--fp8_recipe=rowwise_bf16_wgrad",
                                        "--fp8_gelu_cast=False"], "varlen"), GPT2_VOCAB,
                              features=FEATURES)                                   # the GELU cast is delayed's
    assert fp8.activations < bf16.activations == rowwise.activations
    # fp8_gelu_cast keeps mlp_proj's transposed float8 input besides: measured 32.1 against 29.8 GB at 124M (one H100,
    # benchmarks/results/h100.md, sixth part), 2.4 GB here: 12 layers x 65,536 tokens x 3,072 bytes
    gelu, plain = (memory.estimate(resolved(["--config", "config/fast.py", f"--fp8_gelu_cast={g}"], "varlen"),
                                   GPT2_VOCAB, features=FEATURES) for g in (True, False))
    assert gelu.activations - plain.activations == 12 * 65536 * 3072


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "config", "*.py"))),
                         ids=lambda p: os.path.basename(p))
def test_no_preset_is_refused_on_an_h200(path, monkeypatch):
    """Each preset as the H200 runs it (attention='auto': FA3 varlen) passes the check on a 141 GB GPU."""
    fake_gpu(monkeypatch, H200)
    cfg = load_config(["--config", path])
    cfg = replace(cfg, attention="varlen" if cfg.attention == "auto" else cfg.attention,
                  document_mask=cfg.packing and cfg.document_mask)
    line = memory.fits(cfg, GPT2_VOCAB, torch.device("cuda:0"), 1, FEATURES)
    assert line.startswith("memory: about ") and line.endswith("; fits in the 141.0 GB of cuda:0")


GPT2_124M = 124_475_904      # GPT-2 small with its embedding padded to 50,304 rows: 50,304 x 768 + 1,024 x 768 (wpe)
                             # + 12 x (12 x 768^2 + 13 x 768) + 2 x 768 (ln_f)
BLOCKS = {"": 0, "--rope=True": -1024 * 768,                            # no wpe
          "--tie_embeddings=False": 50304 * 768,                        # a head of its own
          "--norm=rmsnorm": -(2 * 12 + 1) * 768,                        # norms without a bias (bias=True here)
          "--qk_norm=True": 12 * 2 * 64}                                # a gain per channel of a head, q and k


@pytest.mark.parametrize("flag", BLOCKS)
def test_the_parameters_counted_are_gpt2s_and_each_block_changes_them(flag):
    """memory.n_params of GPT-2 small (bias=True) is its known count, and each block flag moves it by what it adds
    or removes; Muon's share (the block matrices, 12 C^2 a layer) stays."""
    cfg = load_config(["--n_layer=12", "--n_head=12", "--n_embd=768", "--block_size=1024", "--bias=True",
                       *([flag] if flag else [])])
    assert memory.n_params(cfg, GPT2_VOCAB) == (GPT2_124M + BLOCKS[flag], 12 * 12 * 768 ** 2)


def widened(model, hidden):
    """`model` with each block's MLP `hidden` wide (a forker's MLP), on the device of its weights."""
    device = model.lm_head.weight.device
    for block in model.transformer.h:
        C = block.mlp.c_fc.in_features
        block.mlp.c_fc = torch.nn.Linear(C, hidden, bias=False, device=device)
        block.mlp.c_proj = torch.nn.Linear(hidden, C, bias=False, device=device)
    return model


def saved_bytes_per_token(model, B, T):
    """Bytes per token per layer the blocks of `model` save for the backward under bf16 autocast on the CPU, each
    storage once (torch.autograd.graph.saved_tensors_hooks); the weights' bf16 copies (no token dimension) left
    out."""
    seen = {}

    def pack(t):
        if t.dim() >= 2 and t.shape[0] in (B, B * T):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    x = model.transformer.wte(torch.randint(0, 256, (B, T)))
    with torch.autocast("cpu", torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for block in model.transformer.h:
            x = block(x, None, torch.arange(T))
    return sum(seen.values()) / (B * T * model.config.n_layer)


def test_the_activation_bytes_are_read_from_the_models_linears(monkeypatch):
    """block_bytes_per_token counts what the blocks keep from the model's own Linears: 34 C for GPT-2's block, more
    for a wider MLP (which the estimate then holds), 4 C more for rope; each near what torch saves for the
    backward in an eager CPU step (the dropout masks, counted, are absent at dropout=0; the residual stream's
    norms keep float32 inputs). relu2 keeps what GELU keeps."""
    from model import GPT, GPTConfig
    C, B, T = 128, 3, 64                    # B and B * T differ from every weight's first dimension

    def model(hidden=None, **flags):
        torch.manual_seed(0)
        m = GPT(GPTConfig(block_size=T, vocab_size=256, n_layer=2, n_head=4, n_embd=C, **flags))
        return widened(m, hidden) if hidden else m
    for hidden, flags, counted in ((None, {}, 34), (None, {"activation": "relu2"}, 34), (8 * C, {}, 50),
                                   (None, {"rope": True}, 38)):
        m = model(hidden, **flags)
        assert memory.block_bytes_per_token(m) == counted * C, (hidden, flags)
        assert 0.9 < saved_bytes_per_token(m, B, T) / (counted * C) < 1.15, (hidden, flags)
    assert saved_bytes_per_token(model(activation="relu2"), B, T) == saved_bytes_per_token(model(), B, T)
    cfg = load_config([f"--n_embd={C}", "--dtype=bfloat16"])
    plain = memory.estimate(cfg, 256)
    wide = widened(memory.meta_model(cfg, 256), 8 * C)
    monkeypatch.setattr(memory, "meta_model", lambda cfg, vocab_size: wide)
    assert memory.estimate(cfg, 256).activations - plain.activations == \
        cfg.batch_size * cfg.block_size * cfg.n_layer * 16 * C      # the fc's output and mlp_proj's input, 2 x 4 C


def reported_run():
    """Issue 37: `python train.py --config config/fast.py --fp8=False --fp8_head=False` on a CPU, flags resolved as
    train.py's check_flags resolves them there (attention='auto' -> sdpa, with the document mask)."""
    cfg = attention.check(load_config(["--config", "config/fast.py", "--fp8=False", "--fp8_head=False"]), on("cpu"))
    assert cfg.attention == "sdpa" and cfg.document_mask and cfg.compile and cfg.dtype == "bfloat16"
    return cfg


def test_the_reported_run_is_refused_on_a_24_gb_cpu_in_one_line(monkeypatch):
    monkeypatch.setattr(memory, "available", lambda device: 24e9)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ValueError) as e:
        memory.fits(reported_run(), GPT2_VOCAB, torch.device("cpu"), 1, FEATURES)
    n = r"\d+\.\d"
    assert pytest.approx(float(str(e.value).split()[4]), rel=0.05) == 36.0     # its estimate, in GB
    assert re.fullmatch(
        rf"this run needs about {n} GB per process \(weights \+ optimizer {n} GB, activations {n} GB, head {n} GB\), "
        r"more than 90% of the 24\.0 GB cpu has available: on a CPU, the quickstart's size \(python train\.py; these "
        r"steps are 524,288 tokens\), or lower --batch_size \((\d+) fits\) or --block_size, and add "
        r"--total_batch_size=0 \(one micro-batch a step: on a CPU, a step this size of several is refused\), or use "
        r"--grad_checkpointing=full, or a smaller --fused_ce_chunk; "
        r"--memory_check=False skips "
        r"this check", str(e.value)), str(e.value)
    fit = int(re.search(r"--batch_size \((\d+) fits", str(e.value))[1])      # the largest half that fits, named
    assert memory.fits(replace(reported_run(), batch_size=fit), GPT2_VOCAB, torch.device("cpu"), 1, FEATURES)
    # with the step given as total_batch_size=0, as the line says: the micro-steps of 524,288 tokens that lowering
    # batch_size alone would make are a refusal of their own on a CPU (memory.cpu_slow_work), the next try's
    asked = replace(reported_run(), batch_size=fit)
    assert memory.cpu_slow_work(asked, torch.device("cpu"), 1, False).startswith(f"on a CPU, a step of {512 // fit} ")
    assert not memory.cpu_slow_work(replace(asked, total_batch_size=0), torch.device("cpu"), 1, False)
    with pytest.raises(ValueError):
        memory.fits(replace(reported_run(), batch_size=2 * fit), GPT2_VOCAB, torch.device("cpu"), 1, FEATURES)


def test_the_batch_size_named_divides_the_step(monkeypatch):
    """The micro-batch named as fitting is one the step's rows divide (train.py's batch plan takes it): at 64 rows a
    step and a micro-batch of 48, not 24 (48 halved). On a 24 GB GPU (stood in for): on a CPU such a step of several
    micro-steps is refused (test_the_reported_run_is_refused_on_a_24_gb_cpu_in_one_line)."""
    from speedgpt.distributed import plan_batch
    monkeypatch.setattr(memory, "available", lambda device: 24e9)
    gpu = torch.device("cuda", 0)
    cfg = replace(reported_run(), batch_size=48, total_batch_size=64 * 1024)
    with pytest.raises(ValueError) as e:
        memory.fits(cfg, GPT2_VOCAB, gpu, 1, FEATURES)
    fit = int(re.search(r"--batch_size \((\d+) fits", str(e.value))[1])
    assert 64 % fit == 0 and plan_batch(replace(cfg, batch_size=fit), 1) == 64 // fit
    assert memory.fits(replace(cfg, batch_size=fit), GPT2_VOCAB, gpu, 1, FEATURES)
    with pytest.raises(ValueError) as e:                # a step of partial rows: no micro-batch divides it
        memory.fits(replace(cfg, total_batch_size=64 * 1024 - 8), GPT2_VOCAB, gpu, 1, FEATURES)
    assert "lower --batch_size (total_batch_size keeps the step's tokens)" in str(e.value)
    with pytest.raises(ValueError) as e:                # one micro-batch a step: lowering it lowers the step
        memory.fits(replace(cfg, total_batch_size=0), GPT2_VOCAB, gpu, 1, FEATURES)
    assert re.search(r"lower --batch_size \(24 fits; with total_batch_size=0 the step shrinks with it: give "
                     r"--total_batch_size to keep it\)", str(e.value)), str(e.value)


def test_memory_check_false_tries_anyway(monkeypatch):
    def unread(device):
        raise AssertionError("memory_check=False reads no memory")
    monkeypatch.setattr(memory, "available", unread)
    line = memory.fits(replace(reported_run(), memory_check=False), GPT2_VOCAB, torch.device("cpu"), 1, FEATURES)
    assert line.startswith("memory: about 3") and line.endswith("not checked (memory_check=False)")
    assert load_config(["--memory_check=False"]).memory_check is False and Config().memory_check is True


def test_the_way_out_names_what_holds_the_memory(monkeypatch):
    """naive attention's scores and a plain head's logits get their own way out (the head's, as the fused head's
    memory() names it); under DDP the weights do."""
    monkeypatch.setattr(memory, "available", lambda device: 4e9)
    baseline = resolved(["--config", "config/baseline.py"], "naive")
    with pytest.raises(ValueError, match=r"or --attention=sdpa \(no T x T scores\), or --fused_ce=True"):
        memory.fits(baseline, GPT2_VOCAB, torch.device("cpu"), features=FEATURES)
    with pytest.raises(ValueError, match=r"or --attention=sdpa \(no T x T scores\); --memory_check"):
        memory.fits(baseline, GPT2_VOCAB, torch.device("cpu"))                     # no feature: none of theirs
    monkeypatch.setattr(memory, "available", lambda device: 25e9)
    with pytest.raises(ValueError, match=r"or --parallelism=fsdp \(shards the weights\); --memory_check"):
        memory.fits(resolved(["--config", "config/large.py", "--batch_size=1", "--grad_checkpointing=full"], "flex"),
                    GPT2_VOCAB, torch.device("cuda:1"), world=2, features=TRANSFORMS)
    assert memory.fits(resolved(["--config", "config/large.py", "--batch_size=1", "--parallelism=fsdp",
                                 "--grad_checkpointing=full"], "flex"), GPT2_VOCAB, torch.device("cuda:1"), world=2,
                       features=TRANSFORMS)


def test_the_quickstart_fits_a_small_machine(monkeypatch):
    """The defaults (python train.py) on a 2-core CI machine or the 24 GB one: far inside even 4 GB free;
    processes that torchrun starts on one CPU machine share its memory."""
    cfg = attention.check(Config(), on("cpu"))
    assert memory.estimate(cfg, BYTE_VOCAB, features=FEATURES).total < 0.5e9
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for free in (24e9, 4e9):
        monkeypatch.setattr(memory, "available", lambda device: free)
        line = memory.fits(cfg, BYTE_VOCAB, torch.device("cpu"), 1, FEATURES)
        # a small model's sizes in MB, each part in its own unit: never '0.0 GB'
        assert re.fullmatch(r"memory: about 1\d\d\.\d MB per process \(weights \+ optimizer \d+\.\d MB, activations "
                            r"\d+\.\d MB, head \d+\.\d MB\); fits in the \d+\.\d GB cpu has available", line), line
    monkeypatch.setattr(memory, "available", lambda device: 0.5e9)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"per process .* \(4 processes on this machine: \d{3}\.\d MB\), more than "
                                         r"90% of the 500\.0 MB cpu has available"):
        memory.fits(cfg, BYTE_VOCAB, torch.device("cpu"), 4, FEATURES)


def test_parallelism_and_the_optimizer_change_the_state_kept():
    cfg = resolved(["--config", "config/large.py", "--batch_size=4"], "flex")
    n, in_matrices = memory.n_params(cfg, GPT2_VOCAB)
    one = memory.estimate(cfg, GPT2_VOCAB)
    assert (one.params, one.grads, one.optimizer) == (4 * n, 4 * n, 8 * n)
    assert memory.estimate(cfg, GPT2_VOCAB, world=2) == one                # the model alone: one process's state
    ddp = memory.estimate(cfg, GPT2_VOCAB, world=2, features=TRANSFORMS)   # DDP's buckets: a copy of the grads
    fsdp = memory.estimate(replace(cfg, parallelism="fsdp"), GPT2_VOCAB, world=2, features=TRANSFORMS)
    assert ddp.grads == 8 * n and fsdp.weights == one.weights // 2 and fsdp.activations == one.activations
    assert ddp.weights_way_out == "--parallelism=fsdp (shards the weights)" and not fsdp.weights_way_out
    assert memory.estimate(cfg, GPT2_VOCAB, world=1, features=TRANSFORMS) == memory.estimate(cfg, GPT2_VOCAB,
                                                                                             features=FEATURES)
    muon = memory.estimate(replace(cfg, optimizer="muon"), GPT2_VOCAB)     # one buffer on the block matrices
    assert muon.optimizer == 8 * (n - in_matrices) + 4 * in_matrices


def test_cpu_memory_is_meminfo_capped_by_the_cgroup(tmp_path, monkeypatch):
    def write(name, text):
        (tmp_path / name).write_text(text)
        return str(tmp_path / name)
    meminfo = write("meminfo", "MemTotal:       24683584 kB\nMemFree:        1000 kB\nMemAvailable:   21191406 kB\n")
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    v2, v1 = str(tmp_path / "memory.max"), str(tmp_path / "memory.limit_in_bytes")
    monkeypatch.setattr(memory, "CGROUP_LIMITS", (v2, v1))
    assert memory.available("cpu") == 21191406 * 1024                      # no cgroup files: MemAvailable
    write("memory.max", "max\n")
    write("memory.limit_in_bytes", "9223372036854771712\n")                # v2 unlimited, v1 unlimited
    assert memory.available(torch.device("cpu")) == 21191406 * 1024
    write("memory.max", "8589934592\n")                                    # a container's 8 GiB
    assert memory.available("cpu") == 8589934592
    os.remove(v2)
    write("memory.limit_in_bytes", "4294967296\n")                         # cgroup v1, 4 GiB
    assert memory.available("cpu") == 4294967296
    os.remove(v1)
    write("meminfo", "MemTotal:       24683584 kB\nMemFree:        1000 kB\n")   # a kernel before 3.14
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(memory.os, "sysconf", lambda name: pages[name])
    assert memory.available("cpu") == 4096000


def test_gpu_memory_is_the_devices_total(monkeypatch):
    fake_gpu(monkeypatch, 150_100_000_000)
    assert memory.available(torch.device("cuda:0")) == memory.available("cuda") == 150_100_000_000


def test_mps_memory_is_metals_recommended_working_set(monkeypatch):
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 12 * 2**30)
    assert memory.available(torch.device("mps")) == 12 * 2**30


def test_gpt2_weights_to_start_from_are_estimated_at_their_shape(tmp_path, monkeypatch):
    """init_from=gpt2-xl (nanoGPT's finetune_shakespeare.py) is 1.5B parameters before its weights are read: on a
    24 GB CPU its weights and AdamW's state alone do not fit, which no micro-batch changes."""
    from configurator import HF_GPT2
    assert tuple(memory.GPT2_SHAPES) == HF_GPT2
    cfg = replace(Config(), init_from="gpt2-xl", batch_size=1, block_size=64)
    n, _ = memory.n_params(memory.weights_shape(cfg), GPT2_VOCAB)
    assert 1.55e9 < n < 1.57e9 and memory.estimate(memory.weights_shape(cfg), GPT2_VOCAB).weights == 16 * n
    monkeypatch.setattr(memory, "available", lambda device: 24e9)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"the weights, gradients and optimizer state alone \(2\d\.\d GB\) do not fit: "
                                         r"a smaller model \(a smaller init_from, or --n_layer, --n_embd\); --memory"):
        memory.fits(memory.weights_shape(cfg), GPT2_VOCAB, torch.device("cpu"))
    (tmp_path / "config.json").write_text(json.dumps({"n_layer": 3, "n_head": 4, "n_embd": 128}))   # a HF folder
    mine = memory.weights_shape(replace(cfg, init_from=str(tmp_path)))
    assert (mine.n_layer, mine.n_head, mine.n_embd, mine.bias) == (3, 4, 128, True)
    assert memory.weights_shape(Config()) == Config()                           # scratch: the config's own


def test_the_vocabulary_is_known_before_the_data_is_prepared(tmp_path):
    prepared = tmp_path / "mine"
    prepared.mkdir()
    (prepared / "meta.json").write_text(json.dumps({"tokenizer": "byte", "vocab_size": BYTE_VOCAB, "eot_id": 256}))
    assert memory.vocab_size(str(prepared)) == BYTE_VOCAB
    assert memory.vocab_size(str(tmp_path / "stdlib_byte")) == BYTE_VOCAB        # prepared on first use
    assert memory.vocab_size(str(tmp_path / "stdlib_gpt2") + "/") == GPT2_VOCAB
    assert memory.vocab_size(str(tmp_path / "fineweb")) == GPT2_VOCAB            # foreign shards: GPT-2's


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


def test_the_memory_line_comes_once_every_check_has_passed(byte_data, tmp_path, capsys):
    """A run refused by a check after memory's (here the output folder's) prints its refusal alone, not the memory
    estimate before it; a run that starts prints the estimate once."""
    import train
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match="cannot create the output folder"):
        train.main(tiny_args(byte_data, tmp_path / "a_file" / "out", "--device=cpu"))
    assert "memory:" not in capsys.readouterr().out
    train.main(tiny_args(byte_data, tmp_path / "out", "--device=cpu", "--max_iters=1", "--eval_tokens=0"))
    assert capsys.readouterr().out.count("memory: about ") == 1
