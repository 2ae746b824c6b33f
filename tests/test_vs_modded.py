"""benchmarks/vs_modded.py on the CPU: what it reads of modded-nanogpt's train_gpt.py without running it (its
Hyperparameters, its stages' tokens per step), our shards written as its files (or refused), the copy with its
one-line edits and the kernel hub's stand-in serving FlashAttention-3, its log's evaluations, the row in
time_to_target.py's table, the refusals, and one whole run under torchrun of a stand-in train_gpt.py of the same
shape that prints train_gpt.py's lines."""
import json
import os
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import time_to_target as ttt  # noqa: E402
import vs_modded  # noqa: E402
from speedgpt.shards import read_shard, write_shard  # noqa: E402

# train_gpt.py's print0 lines, word for word: an evaluation and a training step
VAL_LINE = ("step:{step}/{train_steps} val_loss:{val_loss:.4f} train_time:{training_time_ms:.0f}ms "
            "step_avg:{step_avg:.2f}ms")
STEP_LINE = "step:{step}/{train_steps} train_time:{approx_training_time_ms:.0f}ms step_avg:{step_avg:.2f}ms"
# a stand-in train_gpt.py of train_gpt.py's shape (its Hyperparameters fields, grad_accum_steps, TRAINING_STAGES, the
# kernel hub's call) at a toy size: steps 0-2 of 512 tokens, 3-5 and the extension's 6-7 of 1,024. Under torchrun it
# reads its data files, gets FlashAttention-3 through `kernels`, and prints train_gpt.py's lines: val loss
# 11 - 0.8 x step, 1 s of training per step
FAKE = '''import glob
import os
import sys
import time
from dataclasses import dataclass

world_size = int(os.environ["WORLD_SIZE"])
grad_accum_steps = 8 // world_size
from kernels import get_kernel
flash_attn_interface = get_kernel('kernels-community/flash-attn3', version=1).flash_attn_interface
assert flash_attn_interface.flash_attn_varlen_func() == "fa3"


@dataclass
class Hyperparameters:
    data_path = os.environ.get("DATA_PATH", ".")
    train_files: str = os.path.join(data_path, "data/fineweb10B/fineweb_train_*.bin")
    val_files: str = os.path.join(data_path, "data/fineweb10B/fineweb_val_*.bin")
    val_tokens: int = 4096
    val_batch_size: int = 4 * 256
    num_scheduled_iterations: int = 6
    num_extension_iterations: int = 2
    val_loss_every: int = 3  # steps between evaluations (a comment)


@dataclass
class TrainingStage:
    batch_size: int
    train_max_seq_len: int
    duration: float = None


args = Hyperparameters()
TRAINING_STAGES = [
    TrainingStage(duration=1/2, train_max_seq_len=64, batch_size=8 * 64),
    TrainingStage(duration=1/2, train_max_seq_len=128, batch_size=8 * 128),
    TrainingStage(train_max_seq_len=128, batch_size=8 * 128),
]
assert len(glob.glob(args.train_files)) == 1 and len(glob.glob(args.val_files)) == 1
os.makedirs("logs", exist_ok=True)
with open("logs/0f1e.txt", "w") as f:
    f.write("its own log\\n")
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
print("Compiling model and warming up kernels (~7 minutes on first execution)")
time.sleep(0.3)
print("Resetting Model")
train_steps = args.num_scheduled_iterations + args.num_extension_iterations
for step in range(train_steps + 1):
    ms = 1000.0 * step
    if step == train_steps or step % args.val_loss_every == 0:
        print(f"{val_line}".format(step=step, train_steps=train_steps, val_loss=11 - 0.8 * step,
                                   training_time_ms=ms, step_avg=ms / max(step, 1)))
    if step == train_steps:
        break
    print(f"{step_line}".format(step=step + 1, train_steps=train_steps, approx_training_time_ms=ms + 1000,
                                step_avg=(ms + 1000) / (step + 1)))
print("peak memory allocated: 1 MiB reserved: 2 MiB")
'''.replace("{val_line}", VAL_LINE.replace("{", "{{").replace("}", "}}")).replace(
    "{step_line}", STEP_LINE.replace("{", "{{").replace("}", "}}"))
STEPS = [512] * 3 + [1024] * 5


@pytest.fixture
def modded(tmp_path):
    checkout = tmp_path / "modded-nanogpt"
    checkout.mkdir()
    (checkout / "train_gpt.py").write_text(FAKE)
    (checkout / "triton_kernels.py").write_text("# stand-in\n")
    (checkout / "README.md").write_text("not copied\n")
    return checkout


@pytest.fixture
def fa3(tmp_path, monkeypatch):
    """A stand-in flash_attn_interface on this process's path and its children's."""
    folder = tmp_path / "fa3"
    folder.mkdir()
    (folder / "flash_attn_interface.py").write_text("def flash_attn_varlen_func(*args, **kwargs):\n    return 'fa3'\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    monkeypatch.delitem(sys.modules, "flash_attn_interface", raising=False)
    return folder


def gpt2_data(folder, train_docs=300, val_tokens=5000, doc=100):
    """A folder of llm.c-named shards (GPT-2 tokens, no meta.json): `train_docs` documents of `doc` tokens, each
    after an EOT, and a val split of `val_tokens`."""
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    train = rng.integers(0, 50256, train_docs * doc)
    train[::doc] = 50256
    val = rng.integers(0, 50256, val_tokens)
    val[::doc] = 50256
    write_shard(str(folder / "fineweb_train_000000.bin"), train)
    write_shard(str(folder / "fineweb_val_000000.bin"), val)
    return train, val


def test_train_gpts_settings_and_tokens_per_step_are_read_without_running_it():
    s = vs_modded.read_settings(FAKE)
    assert {k: s[k] for k in vs_modded.HYPERPARAMETERS} == {
        "val_tokens": 4096, "val_batch_size": 1024, "num_scheduled_iterations": 6, "num_extension_iterations": 2,
        "val_loss_every": 3}
    assert s["grad_accum_steps"] == 8 and s["stages"] == [(0.5, 512, 64), (0.5, 1024, 128), (None, 1024, 128)]
    assert vs_modded.tokens_per_step(s) == STEPS
    longer = vs_modded.read_settings(vs_modded.set_field(FAKE, "num_scheduled_iterations", 10)[0])
    assert vs_modded.tokens_per_step(longer) == [512] * 5 + [1024] * 7       # the stages' bounds follow the schedule
    with pytest.raises(ValueError, match="no val_tokens"):
        vs_modded.read_settings(FAKE.replace("val_tokens: int = 4096", "val_size = 4096"))
    with pytest.raises(ValueError, match="add up to 0.5 of the schedule"):
        vs_modded.tokens_per_step(vs_modded.read_settings(FAKE.replace("duration=1/2, train_max_seq_len=128",
                                                                       "duration=0, train_max_seq_len=128")))


def test_a_field_is_set_on_its_one_line_and_the_edit_is_given_back():
    source, change = vs_modded.set_field(FAKE, "val_loss_every", 2)
    assert change == ("val_loss_every: int = 3  # steps between evaluations (a comment)",
                      "val_loss_every: int = 2")
    assert source.count("val_loss_every: int = 2\n") == 1 and len(source.splitlines()) == len(FAKE.splitlines())
    with pytest.raises(ValueError, match="0 lines `warmup: int = ...`, not one"):
        vs_modded.set_field(FAKE, "warmup", 2)


def test_the_copy_leaves_the_checkout_alone_and_its_kernel_hub_serves_fa3(modded, fa3, tmp_path, monkeypatch):
    before = {p.name: p.read_bytes() for p in modded.iterdir()}
    copy = tmp_path / "copy"
    assert vs_modded.make_copy(str(modded), str(copy), {"val_loss_every": 2}) == [
        ("val_loss_every: int = 3  # steps between evaluations (a comment)",
         "val_loss_every: int = 2")]
    assert {p.name: p.read_bytes() for p in modded.iterdir()} == before
    assert sorted(os.listdir(copy)) == ["kernels.py", "train_gpt.py", "triton_kernels.py"]
    assert "    val_loss_every: int = 2\n" in (copy / "train_gpt.py").read_text()
    monkeypatch.syspath_prepend(str(copy))
    monkeypatch.delitem(sys.modules, "kernels", raising=False)
    import flash_attn_interface
    import kernels
    assert kernels.get_kernel("kernels-community/flash-attn3", version=1).flash_attn_interface is flash_attn_interface
    with pytest.raises(ImportError, match="serves \\['kernels-community/flash-attn3'\\] only, not 'other/kernel'"):
        kernels.get_kernel("other/kernel")
    assert vs_modded.kernel_requests(FAKE) == ([("kernels-community/flash-attn3", "flash_attn_interface")],
                                               ["flash_attn_varlen_func"])


def test_our_tokens_become_its_files_in_llmcs_format(tmp_path):
    train, val = gpt2_data(tmp_path / "data")
    paths = vs_modded.write_data(str(tmp_path / "data"), str(tmp_path / "copy"), vs_modded.read_settings(FAKE))
    folder = tmp_path / "copy" / "data" / "fineweb10B"
    assert paths == [str(folder / "fineweb_val_000000.bin"), str(folder / "fineweb_train_000000.bin")]
    raw = (folder / "fineweb_val_000000.bin").read_bytes()
    assert list(np.frombuffer(raw[:12], dtype="<i4")) == [20240520, 1, 5000] and len(raw) == 1024 + 2 * 5000
    assert np.array_equal(read_shard(paths[0]), val) and np.array_equal(read_shard(paths[1]), train)


def test_a_val_split_short_of_its_val_tokens_is_refused_before_writing(tmp_path):
    gpt2_data(tmp_path / "data", val_tokens=4097)
    with pytest.raises(SystemExit, match=r"^error: the val split of .* holds 4,097 tokens; modded-nanogpt evaluates "
                                         r"on 4,096 \(its val_tokens\) and reads 4,098: prepare the data with a larger "
                                         r"--val_frac"):
        vs_modded.write_data(str(tmp_path / "data"), str(tmp_path / "copy"), vs_modded.read_settings(FAKE))
    assert not (tmp_path / "copy").exists()


def test_a_train_split_its_schedule_would_run_out_of_is_refused(tmp_path):
    # 6,656 tokens planned; 64 micro-batches may each lose up to 64 tokens, the shard's tail 128: 10,880 needed of
    # documents cut at 64 tokens. 160 documents of 100 tokens give 10,240; 200 give 12,800
    settings = vs_modded.read_settings(FAKE)
    gpt2_data(tmp_path / "short", train_docs=160)
    with pytest.raises(SystemExit, match=r"schedule trains 6,656 tokens, and its loader .* cut at 64 tokens\) can "
                                         r"take at most about 6,016 of the train split .* --modded_steps"):
        vs_modded.write_data(str(tmp_path / "short"), str(tmp_path / "copy"), settings)
    gpt2_data(tmp_path / "enough", train_docs=200)
    assert len(vs_modded.write_data(str(tmp_path / "enough"), str(tmp_path / "copy"), settings)) == 2


def test_byte_tokens_are_refused(byte_data, tmp_path):
    with pytest.raises(SystemExit, match="holds byte tokens: modded-nanogpt's model is GPT-2's vocabulary"):
        vs_modded.write_data(str(byte_data), str(tmp_path / "copy"), vs_modded.read_settings(FAKE))


def test_its_log_gives_each_evaluations_val_loss_training_time_and_tokens():
    lines = ["logs/0f1e.txt", "Running PyTorch 2.10.0 compiled for CUDA 12.8", "=" * 100,
             "Compiling model and warming up kernels (~7 minutes on first execution)",
             "Sampling steps [0, 1, 2, 3] for warmup", "Resetting Model",
             VAL_LINE.format(step=0, train_steps=8, val_loss=10.8254, training_time_ms=0, step_avg=0.0)]
    for step in range(1, 9):
        lines.append(STEP_LINE.format(step=step, train_steps=8, approx_training_time_ms=250.4 * step, step_avg=250.4))
        if step in (4, 8):
            lines.append(VAL_LINE.format(step=step, train_steps=8, val_loss=3.3 if step == 4 else 3.27994,
                                         training_time_ms=250.4 * step, step_avg=250.4))
    text = "\n".join(lines + ["peak memory allocated: 70000 MiB reserved: 71000 MiB"])
    assert "step:4/8 val_loss:3.3000 train_time:1002ms step_avg:250.40ms" in text
    rows = vs_modded.evaluations(text, STEPS)
    assert rows == [(0, 10.8254, 0, 0.0), (4, 3.3, 2560, 1.002), (8, 3.2799, 6656, 2.003)]
    assert ttt.first_at_or_below(rows, 3.28) == (8, 3.2799, 6656, 2.003)
    with pytest.raises(ValueError, match="its log counts 8 steps, its schedule as read 12"):
        vs_modded.evaluations(text, STEPS + [1024] * 4)


def test_its_row_stands_in_time_to_targets_table():
    runs = [([(0, 10.8, 0, 0.0), (4, 3.3, 2560, 1.0), (8, 3.2, 6656, 2.0)], 400.0),
            ([(0, 10.8, 0, 0.0), (4, 3.5, 2560, 1.2), (8, 3.3, 6656, 2.4)], 420.0)]
    row = vs_modded.modded_row("modded-nanogpt train_gpt.py", STEPS, runs, 3.3)
    assert ttt.table([row])[2] == ("| modded-nanogpt train_gpt.py | 512-1,024 | its own | 2 of 2 | 1.7 ± 1.0 | "
                                   "4,608 ± 2,896 | 3.2500 ± 0.0707 | 410.0 ± 14.1 |")
    assert vs_modded.modded_row("x", [1024] * 3, runs[:1], 3.0)["batch_tokens"] == 1024


@pytest.mark.parametrize("argv, message", [
    ([], r"^error: --target is missing: give the val loss to reach"),
    (["--target", "3.28"], r"^error: --modded is missing: give --modded PATH, a clone of "
                           r"https://github.com/KellerJordan/modded-nanogpt$"),
    (["--target", "3.28", "--modded", "/nonexistent"], r"no train_gpt.py in '/nonexistent'"),
    (["--target", "3.28", "--runs", "0"], r"argument --runs: 0: a positive integer"),
])
def test_bad_input_is_refused_in_one_line(argv, message):
    with pytest.raises(SystemExit, match=message):
        vs_modded.main(argv)


def test_what_it_cannot_run_is_refused_in_one_line_before_any_data_is_written(modded, tmp_path, monkeypatch):
    import torch
    gpt2_data(tmp_path / "data")
    base = ["--target", "3.28", "--modded", str(modded), "--data_dir", str(tmp_path / "data"), "--out",
            str(tmp_path / "out")]
    with pytest.raises(SystemExit, match="--data_dir '/nonexistent' is not a folder"):
        vs_modded.main(base[:4] + ["--data_dir", "/nonexistent"])
    with pytest.raises(SystemExit, match=r"^error: --data_dir is missing: give our prepared GPT-2 folder"):
        vs_modded.main(base[:4])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^error: modded-nanogpt's train_gpt.py needs a CUDA GPU .*: run this on "
                                         r"one$"):
        vs_modded.main(base)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)             # not installed
    with pytest.raises(SystemExit, match=r"attention is FlashAttention-3, and flash_attn_interface does not import "
                                         r"\(.*\): build FlashAttention's hopper/ directory .*cd hopper && python "
                                         r"setup.py install\)$"):
        vs_modded.main(base)
    (modded / "train_gpt.py").write_text(FAKE.replace("kernels-community/flash-attn3", "kernels-community/other"))
    with pytest.raises(SystemExit, match="asks the kernel hub for kernels-community/other.flash_attn_interface"):
        vs_modded.main(base)
    (modded / "train_gpt.py").write_text(FAKE.replace("TRAINING_STAGES = [", "STAGES = ["))
    with pytest.raises(SystemExit, match=r"is not the train_gpt.py this script reads \(no TRAINING_STAGES\)"):
        vs_modded.main(base)
    assert not (tmp_path / "out").exists()


def test_one_run_under_torchrun_gives_its_row_and_its_table(modded, fa3, tmp_path, monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpt2_data(tmp_path / "data")
    out = tmp_path / "out"
    row = vs_modded.main(["--target", "7.0", "--modded", str(modded), "--data_dir", str(tmp_path / "data"),
                          "--val_every", "2", "--out", str(out), "--timeout", "120"])
    # evaluations at steps 0, 2, 4, 6, 8 (--val_every 2); 11 - 0.8 x 6 = 6.2 is the first at or below 7.0
    assert (row["reached"], row["train_seconds"], row["tokens"]) == (1, [6.0], [512 * 3 + 1024 * 3])
    assert row["final"] == [pytest.approx(4.6)] and row["compile_s"][0] >= 0.3
    saved = json.loads((out / "vs_modded.json").read_text())
    assert [e["step"] for e in saved["runs"][0]["evals"]] == [0, 2, 4, 6, 8] and saved["tokens_per_step"] == STEPS
    printed = capsys.readouterr().out.strip().splitlines()
    assert "`val_loss_every: int = 3  # steps between evaluations (a comment)` -> " \
           "`val_loss_every: int = 2`" in printed[0]
    assert printed[-1].startswith("| modded-nanogpt train_gpt.py | 512-1,024 | its own | 1 of 1 | 6.0 | 4,608 | "
                                  "4.6000 | ")
    assert "step:8/8 val_loss:4.6000 train_time:8000ms step_avg:1000.00ms" in (out / "modded_run1.log").read_text()
    assert "    val_loss_every: int = 3  #" in (modded / "train_gpt.py").read_text()     # the checkout as it was
    assert (out / "modded_run1_0f1e.txt").read_text() == "its own log\n"


def test_a_run_past_its_time_is_stopped_and_said_so(modded, fa3, tmp_path, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("FAKE_SLEEP", "60")
    gpt2_data(tmp_path / "data")
    with pytest.raises(SystemExit, match=r"^error: modded-nanogpt run 1 failed: stopped after --timeout 3 s \(log: "):
        vs_modded.main(["--target", "7.0", "--modded", str(modded), "--data_dir", str(tmp_path / "data"), "--out",
                        str(tmp_path / "out"), "--timeout", "3"])
