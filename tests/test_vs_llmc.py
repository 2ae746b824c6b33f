"""benchmarks/vs_llmc.py on the CPU: llm.c's build command (with cuDNN, then without), our shards read by llm.c's
loader rules, its tokens/s from its own step lines, the table, and one whole run with a stand-in llm.c (a Makefile
that refuses cuDNN as llm.c's does, and a train_gpt2cu printing llm.c's lines), a stand-in nanoGPT, and our real
train.py with a tiny model."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import vs_llmc  # noqa: E402
from speedgpt.shards import write_shard  # noqa: E402

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make (llm.c's build)")
# train_gpt2.cu's printf0 of each step, word for word (Python's % formats these conversions as C's printf does)
STEP_LINE = ("step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | "
             "%.0f tok/s")
# a stand-in llm.c checkout: its Makefile refuses USE_CUDNN=1 unless cudnn-frontend/include lies in $HOME (as
# llm.c's does), fails the cuDNN build when the file fail_cudnn exists, and its "binary" prints llm.c's lines:
# steps 1-5 take 1000 ms, then 4*B + step % 3 ms
MAKEFILE = """ifeq ($(USE_CUDNN), 1)
  ifneq ($(shell [ -d $(HOME)/cudnn-frontend/include ] && echo exists), exists)
    $(error cuDNN not found)
  endif
endif
train_gpt2cu:
\t@echo "USE_CUDNN=$(USE_CUDNN) CUDNN_FRONTEND_PATH=$(CUDNN_FRONTEND_PATH) NO_MULTI_GPU=$(NO_MULTI_GPU)"
\t@echo "NVCC_APPEND_FLAGS=$$NVCC_APPEND_FLAGS"
\t@if [ "$(USE_CUDNN)" = 1 ] && [ -e fail_cudnn ]; then echo "cudnn_att.cpp: error"; exit 1; fi
\tcp fake_train.py train_gpt2cu && chmod +x train_gpt2cu
"""
FAKE_TRAIN = """#!{python}
import sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
print("args:", " ".join(sys.argv[1:]))
B, steps = int(args["-b"]), int(args["-x"])
print("val loss 10.990000")
for step in range(1, steps + 1):
    ms = 1000.0 if step <= 5 else 4.0 * B + step % 3
    print({line!r} % (step, steps, 10.9, 0.0, 1.25, 0.0, 3e-4, ms, -100.0, 123456.0))
print("total average iteration time: 99.000000 ms")
"""


@pytest.fixture
def fake_llmc(tmp_path):
    llmc = tmp_path / "llm.c"
    llmc.mkdir()
    (llmc / "train_gpt2.cu").write_text("// stand-in\n")
    (llmc / "Makefile").write_text(MAKEFILE)
    (llmc / "fake_train.py").write_text(FAKE_TRAIN.format(python=sys.executable, line=STEP_LINE))
    frontend = tmp_path / "cudnn-frontend"
    (frontend / "include").mkdir(parents=True)
    (frontend / "include" / "cudnn_frontend.h").write_text("// stand-in\n")
    return llmc, frontend


@pytest.fixture
def fake_nanogpt(tmp_path):
    nanogpt = tmp_path / "nanoGPT"
    nanogpt.mkdir()
    (nanogpt / "model.py").write_text("class GPTConfig:\n    def __init__(self, **kw):\n        self.kw = kw\n")
    (nanogpt / "bench.py").write_text("print('time per iteration: 250.0000ms, MFU: 40.00%')\n")
    return nanogpt


def env_for(tmp_path):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return vs_llmc.build_env(str(home), site_dirs=[], lib_dirs=[])


@needs_make
def test_llmc_builds_with_cudnn_and_its_frontend(fake_llmc, tmp_path):
    llmc, frontend = fake_llmc
    binary, how = vs_llmc.build(str(llmc), str(frontend), env_for(tmp_path), str(tmp_path), 60)
    assert binary == str(llmc / "train_gpt2cu") and how == "cuDNN"
    log = (tmp_path / "build_cudnn.log").read_text()
    assert f"USE_CUDNN=1 CUDNN_FRONTEND_PATH={frontend}/include NO_MULTI_GPU=1" in log
    assert "-include " in log and "llmc_cuda13.h" in log           # the CUDA 13 shim reaches nvcc


@needs_make
def test_a_failed_cudnn_build_falls_back_to_one_without_and_says_so(fake_llmc, tmp_path):
    llmc, frontend = fake_llmc
    (llmc / "fail_cudnn").write_text("")
    binary, how = vs_llmc.build(str(llmc), str(frontend), env_for(tmp_path), str(tmp_path), 60)
    assert binary is not None and how == "no cuDNN (its cuDNN build failed: build_cudnn.log)"
    assert "USE_CUDNN= CUDNN_FRONTEND_PATH= NO_MULTI_GPU=1" in (tmp_path / "build.log").read_text()


@needs_make
def test_a_build_that_fails_leaves_no_binary_from_before(fake_llmc, tmp_path):
    llmc, frontend = fake_llmc
    (llmc / "Makefile").write_text("train_gpt2cu:\n\texit 1\n")
    (llmc / "train_gpt2cu").write_text("an old build")
    assert vs_llmc.build(str(llmc), None, env_for(tmp_path), str(tmp_path), 60) == \
        (None, "no cuDNN (no cudnn-frontend: --cudnn_frontend)")
    assert not (llmc / "train_gpt2cu").exists()


def test_the_build_finds_nvidias_wheels_and_links_their_plain_names(tmp_path):
    site, driver = tmp_path / "site", tmp_path / "driver"
    for folder, name in [("cudnn/lib", "libcudnn.so.9"), ("cudnn/lib", "libcudnn_ops.so.9"), ("cu13/lib",
                         "libcublas.so.13"), ("cu13/lib", "libcublasLt.so.13"), ("cu13/lib", "libnvrtc.so.13"),
                         ("cudnn/include", "cudnn.h"), ("cu13/include", "cublas_v2.h")]:
        (site / "nvidia" / folder).mkdir(parents=True, exist_ok=True)
        (site / "nvidia" / folder / name).write_text("")
    driver.mkdir()
    (driver / "libnvidia-ml.so.1").write_text("")
    home = tmp_path / "home"
    env = vs_llmc.build_env(str(home), site_dirs=[str(site)], lib_dirs=[str(driver)])
    links = home / "lib"
    assert os.readlink(links / "libcudnn.so") == str(site / "nvidia/cudnn/lib/libcudnn.so.9")
    assert os.readlink(links / "libcublasLt.so") == str(site / "nvidia/cu13/lib/libcublasLt.so.13")
    assert os.readlink(links / "libnvidia-ml.so") == str(driver / "libnvidia-ml.so.1")
    assert env["LIBRARY_PATH"].split(os.pathsep)[0] == str(links) and env["HOME"] == str(home)
    assert env["CPATH"].split(os.pathsep)[:2] == [str(site / "nvidia/cu13/include"), str(site / "nvidia/cudnn/include")]
    assert set(env["LD_LIBRARY_PATH"].split(os.pathsep)[:3]) == {str(site / "nvidia/cudnn/lib"),
                                                                 str(site / "nvidia/cu13/lib"), str(driver)}
    assert "cudaMemLocation" in (home / "llmc_cuda13.h").read_text()


def test_our_shard_is_what_llmcs_loader_reads(tmp_path):
    """A shard we write, read back by llm.c's rules (llmc/dataloader.h): 256 int32 of header, magic 20240520,
    version 1, the token count, then that many uint16 tokens and nothing more."""
    tokens = np.random.default_rng(0).integers(0, 50257, 5000)
    path = str(tmp_path / "train_000000.bin")
    write_shard(path, tokens)
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert list(header[:3]) == [20240520, 1, 5000] and not header[3:].any()
    assert len(raw) == 1024 + 2 * 5000
    assert np.array_equal(np.frombuffer(raw[1024:], dtype="<u2"), tokens)
    assert vs_llmc.check_shard(path, 5000) is None
    assert vs_llmc.check_shard(path, 5001) == "5000 tokens, fewer than one micro-batch (5001)"


def test_shards_llmc_would_refuse_are_named(tmp_path):
    wide = str(tmp_path / "wide.bin")
    write_shard(wide, [70000, 1, 2])                                   # ids past uint16: version 2
    assert "version 2: llm.c's GPT-2 loader reads version 1" in vs_llmc.check_shard(wide, 1)
    cut = str(tmp_path / "cut.bin")
    write_shard(cut, np.arange(100))
    with open(cut, "r+b") as f:
        f.truncate(1024 + 150)
    assert vs_llmc.check_shard(cut, 1) == "1174 bytes, not the 1024 + 2 x 100 its header promises"
    (tmp_path / "junk.bin").write_bytes(b"junk" * 300)
    assert vs_llmc.check_shard(str(tmp_path / "junk.bin"), 1) == "not an llm.c shard (no magic 20240520)"


def test_llmc_reads_our_folder_and_a_short_val_split_falls_back_to_train(tmp_path):
    write_shard(str(tmp_path / "train_000000.bin"), np.arange(3000) % 50257)
    write_shard(str(tmp_path / "val_000000.bin"), np.arange(2000))
    train, val = vs_llmc.llmc_data(str(tmp_path), 1)                   # B=1: 1025 tokens a shard at least
    assert train == str(tmp_path / "train_*.bin") and val == str(tmp_path / "val_*.bin")
    assert vs_llmc.llmc_data(str(tmp_path), 2) == (train, train)       # 2049 > 2000: val too short for llm.c
    with pytest.raises(SystemExit, match=r"llm.c cannot read .*train_000000.bin: 3000 tokens, fewer than one "
                                         r"micro-batch \(4097\); prepare .* or lower --llmc_batches"):
        vs_llmc.llmc_data(str(tmp_path), 4)


def test_llmcs_tokens_per_sec_is_the_median_of_its_step_times_after_warm_up():
    lines = ["val loss 10.990000"] + [STEP_LINE % (s, 9, 10.9, 0.1, 1.25, -0.2, 3e-4, ms, mfu, 777777.0)
                                      for s, ms, mfu in [(1, 900.0, 1.0), (2, 50.0, 40.0), (3, 50.0, 40.0),
                                                         (4, 50.0, 40.0), (5, 50.0, 40.0), (6, 100.0, -100.0),
                                                         (7, 200.0, -100.0), (8, 110.0, 40.0), (9, 90.25, 40.0)]]
    text = "\n".join(lines + ["total average iteration time: 100.000000 ms"])
    assert "step    6/9 | loss 10.900000 (+0.10z)| norm 1.2500 (-0.20z)| lr 3.00e-04 | 100.00 ms | -100.0% bf16 " \
           "MFU | 777777 tok/s" in text
    assert vs_llmc.llmc_tokens_per_sec(text, 16) == round(16 * 1024 / (105.0 / 1e3))   # median of 100, 200, 110, 90.25
    assert vs_llmc.llmc_tokens_per_sec("\n".join(lines[:6]), 16) == 0                   # warm-up only: no number


def test_the_table_gives_each_side_against_ours():
    rows = [("nanoGPT bench.py", 64, 500_000, "nanogpt.log"), ("llm.c train_gpt2cu, cuDNN", 32, 0, "llmc_b32.log"),
            ("llm.c train_gpt2cu, cuDNN", 64, 550_000, "llmc_b64.log"), ("ours", 64, 625_000, "ours.log")]
    assert vs_llmc.table(rows) == [
        "| side | micro-batch | tok/s | ratio to ours |", "|---|---:|---:|---:|",
        "| nanoGPT bench.py | 64 | 500,000 | 0.800x |",
        "| llm.c train_gpt2cu, cuDNN | 32 | failed (see llmc_b32.log) | |",
        "| llm.c train_gpt2cu, cuDNN | 64 | 550,000 | 0.880x |",
        "| ours | 64 | 625,000 | 1.000x |"]
    assert vs_llmc.table(rows[:1] + [("ours", 64, 0, "ours.log")])[2] == "| nanoGPT bench.py | 64 | 500,000 | n/a |"


@pytest.mark.parametrize("argv, message", [
    ([], r"^error: --llmc is missing: give --llmc PATH, a clone of https://github.com/karpathy/llm.c$"),
    (["--llmc", "/nonexistent"], "no train_gpt2.cu in '/nonexistent'"),
])
def test_bad_input_is_refused_in_one_line(argv, message):
    with pytest.raises(SystemExit, match=message):
        vs_llmc.main(argv)


def test_bad_batches_and_frontends_are_refused_in_one_line(fake_llmc, fake_nanogpt, tmp_path):
    llmc, _ = fake_llmc
    base = ["--llmc", str(llmc), "--nanogpt", str(fake_nanogpt), "--out", str(tmp_path / "out")]
    for bad in ("16,x", "16,,32", "²", "0"):
        with pytest.raises(SystemExit, match=f"--llmc_batches '{bad}': positive integers, comma-separated"):
            vs_llmc.main(base + ["--llmc_batches", bad])
    with pytest.raises(SystemExit, match="--batch 0: a positive micro-batch"):
        vs_llmc.main(base + ["--batch", "0"])
    with pytest.raises(SystemExit, match=r"^error: --nanogpt is missing: give --nanogpt PATH"):
        vs_llmc.main(base[:2])
    with pytest.raises(SystemExit, match=r"^error: --iters 5 / --timeout 900: more than 5 steps"):
        vs_llmc.main(base + ["--iters", "5"])
    import torch
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: False)
        with pytest.raises(SystemExit, match=r"^error: vs_llmc.py times trainers on a CUDA GPU, and this machine "
                                             r"has none: run it on one$"):
            vs_llmc.main(base)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit, match=f"no include/cudnn_frontend.h in {tmp_path}: give --cudnn_frontend PATH"):
        vs_llmc.main(base + ["--cudnn_frontend", str(tmp_path)])


@needs_make
def test_one_run_builds_llmc_runs_all_three_sides_and_prints_one_table(fake_llmc, fake_nanogpt, byte_data,
                                                                      tmp_path, capsys):
    llmc, frontend = fake_llmc
    (llmc / "fail_cudnn").write_text("")
    out = tmp_path / "out"
    tiny = ("--n_layer=1 --n_head=2 --n_embd=32 --compile=False --fp8=False --fp8_head=False --head_kernel=False "
            "--gelu_erf=exact --dtype=float32 --device=cpu")
    rows = vs_llmc.main(["--llmc", str(llmc), "--cudnn_frontend", str(frontend), "--nanogpt", str(fake_nanogpt),
                         "--batch", "1", "--llmc_batches", "1,2", "--iters", "7", "--data_dir", str(byte_data),
                         "--ours_args", tiny, "--out", str(out), "--timeout", "300"])
    how = "llm.c train_gpt2cu, no cuDNN (its cuDNN build failed: build_cudnn.log)"
    ours = json.loads((out / "ours" / "summary.json").read_text())["median_tokens_per_sec"]
    assert rows[:3] == [("nanoGPT bench.py", 1, 4096, "nanogpt.log"),           # 1 x 1024 tokens in 250 ms
                        (how, 1, round(1024 / 4.5e-3), "llmc_b1.log"),          # steps 6, 7: 4 and 5 ms
                        (how, 2, round(2048 / 8.5e-3), "llmc_b2.log")]
    assert rows[3] == ("ours: config/fast.py --total_batch_size=0", 1, round(ours), "ours.log")
    args = (out / "llmc_b2.log").read_text().splitlines()[0].split()
    assert args[:3] == ["args:", "-i", str(byte_data / "train_*.bin")] and " ".join(args[3:]).startswith(
        f"-j {byte_data / 'val_*.bin'} -e d12 -b 2 -t 1024 -d 2048 -x 7")
    config = json.loads((out / "ours" / "config.json").read_text())
    assert (config["total_batch_size"], config["batch_size"], config["block_size"]) == (0, 1, 1024)
    printed = capsys.readouterr().out
    assert f"| {how} | 2 | {round(2048 / 8.5e-3):,} | {round(2048 / 8.5e-3) / round(ours):.3f}x |" in printed
    assert printed.rstrip().endswith(f"| ours: config/fast.py --total_batch_size=0 | 1 | {round(ours):,} | 1.000x |")


@needs_make
def test_build_only_builds_and_a_no_build_run_times_that_binary(fake_llmc, fake_nanogpt, byte_data, tmp_path,
                                                                 capsys):
    """--build_only needs no nanoGPT and no data; a --no_build run then times that binary without building."""
    llmc, frontend = fake_llmc
    base = ["--llmc", str(llmc), "--cudnn_frontend", str(frontend), "--out", str(tmp_path / "out"),
            "--timeout", "300"]
    run_args = base + ["--nanogpt", str(fake_nanogpt), "--data_dir", str(byte_data)]
    with pytest.raises(SystemExit, match="--no_build, but no train_gpt2cu and train_gpt2cu.how in .*--build_only"):
        vs_llmc.main(run_args + ["--no_build"])
    with pytest.raises(SystemExit, match="--build_only and --no_build together"):
        vs_llmc.main(base + ["--build_only", "--no_build"])
    assert vs_llmc.main(base + ["--build_only", "--data_dir", str(tmp_path / "none")]) == []
    assert "llm.c: built, cuDNN: " in capsys.readouterr().out
    assert not (tmp_path / "out" / "nanogpt.log").exists() and not (tmp_path / "out" / "prep.log").exists()
    (llmc / "Makefile").write_text("train_gpt2cu:\n\texit 1\n")       # a build now would fail: it must not happen
    tiny = ("--n_layer=1 --n_head=2 --n_embd=32 --compile=False --fp8=False --fp8_head=False --head_kernel=False "
            "--gelu_erf=exact --dtype=float32 --device=cpu")
    rows = vs_llmc.main(run_args + ["--no_build", "--batch", "1", "--llmc_batches", "1", "--iters", "7",
                                    "--ours_args", tiny])
    assert rows[1] == ("llm.c train_gpt2cu, cuDNN", 1, round(1024 / 4.5e-3), "llmc_b1.log")


@needs_make
def test_a_make_that_fails_is_a_failed_build_though_it_left_a_file(fake_llmc, tmp_path):
    """make's exit status decides: a link that fails after writing train_gpt2cu is no build, no .how is written,
    and --build_only says so in one line with make's last line and where its output is."""
    llmc, frontend = fake_llmc
    (llmc / "Makefile").write_text("train_gpt2cu:\n\t@touch train_gpt2cu\n\t@echo 'nvcc: link error'\n\t@exit 1\n")
    with pytest.raises(SystemExit, match=r"^error: llm.c did not build: nvcc: link error \(the make output: "
                                         r".*build_cudnn.log, .*build.log\); it needs nvcc"):
        vs_llmc.main(["--llmc", str(llmc), "--cudnn_frontend", str(frontend), "--out", str(tmp_path / "out"),
                      "--build_only"])
    assert "nvcc: link error" in (tmp_path / "out" / "build.log").read_text()
    assert not (llmc / "train_gpt2cu").exists() or not (llmc / "train_gpt2cu.how").exists()
