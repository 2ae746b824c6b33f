"""sample.py on the CPU: a temperature or top_k that cannot sample is refused in one line before any
checkpoint is read; good ones, in either flag form, sample, with the KV cache or without it; a prompt longer than
block_size is cropped with a note, and a prompt file that is not UTF-8, or is a folder, is one line."""
import re
import subprocess
import sys

import pytest

import sample
import train
from model import GPT
from conftest import ROOT, tiny_args


@pytest.mark.parametrize("flag, value, why", [
    ("--temperature", "nan", r"must be a finite number >= 0 \(0: greedy"),  # nan passes a `>= 0` check: a traceback
    ("--temperature", "inf", r"must be a finite number >= 0 \(0: greedy"),  # logits / inf: uniform noise
    ("--temperature", "-inf", r"must be a finite number >= 0 \(0: greedy"),
    ("--temperature", "-0.5", r"must be a finite number >= 0 \(0: greedy"),
    ("--temperature", "warm", r"must be a finite number >= 0 \(0: greedy"),
    ("--top_k", "2.5", r"must be a whole number >= 0 \(0: the whole vocabulary\)"),
    ("--top_k", "-1", r"must be a whole number >= 0 \(0: the whole vocabulary\)"),
    ("--top_k", "inf", r"must be a whole number >= 0 \(0: the whole vocabulary\)"),
    ("--top_k", "nan", r"must be a whole number >= 0 \(0: the whole vocabulary\)"),
    ("--max_new_tokens", "0", "must be a whole number >= 1"),
    ("--num_samples", "-2", "must be a whole number >= 1"),
    ("--kv_cache", "maybe", "must be True or False"),
])
@pytest.mark.parametrize("form", ["=", " "])
def test_bad_sampling_flags_are_one_line(tmp_path, capsys, flag, value, why, form):
    argv = [f"{flag}={value}"] if form == "=" else [flag, value]
    with pytest.raises(SystemExit) as e:           # before the (missing) checkpoint is looked for
        sample.main([f"--out_dir={tmp_path}", "--device=cpu", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: argument {flag}: ") and f"got {value!r}" in err and re.search(why, err), err


def test_top_k_at_temperature_zero_is_one_line(tmp_path, capsys):
    """--temperature=0 is greedy, the likeliest token whatever top_k is (0, the whole vocabulary, too): a top_k given
    with it would do nothing, so it is refused in one line with the way out, before any checkpoint is read."""
    for top_k in ("5", "0"):
        with pytest.raises(SystemExit) as e:
            sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--temperature=0", f"--top_k={top_k}"])
        assert e.value.code == 2 and capsys.readouterr().err == \
            f"error: --top_k {top_k} would do nothing at --temperature 0, which is greedy (the likeliest token each " \
            "time): leave out --top_k, or give a --temperature above 0 to sample from the top_k likeliest tokens\n"


def test_prompt_file_that_is_a_folder_is_one_line(tmp_path, capsys):
    """A folder exists: "not found" would send the user looking for it (train.py's --config says the same)."""
    for start, why in ((tmp_path, "is a folder, not a file"), (tmp_path / "missing.txt", "not found"),
                       ("/dev/null", "is not a regular file (a device or a pipe): give a text file")):
        with pytest.raises(SystemExit) as e:           # before the (missing) checkpoint is looked for
            sample.main([f"--out_dir={tmp_path}", "--device=cpu", f"--start=FILE:{start}"])
        assert e.value.code == 2 and capsys.readouterr().err == f"error: prompt file {start} {why}\n"
    with pytest.raises(SystemExit) as e:                # FILE: and nothing after it
        sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--start=FILE:"])
    assert e.value.code == 2 and capsys.readouterr().err == \
        "error: --start=FILE: names no file: give the prompt file after it (--start=FILE:prompt.txt)\n"


def test_cuda_without_a_gpu_names_the_cpu_way_out(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sample.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        sample.main([f"--out_dir={tmp_path}", "--device=cuda"])
    assert e.value.code == 2 and capsys.readouterr().err == \
        "error: --device cuda: no CUDA GPU is available (sample on the CPU: --device cpu)\n"


def test_good_flags_sample(byte_data, tmp_path, capsys):
    """A small temperature, top_k 1 (greedy) and top_k 0 (the whole vocabulary) sample, space form too;
    greedy decoding gives every sample the same text."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=1", "--eval_tokens=0"))
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path), "--device", "cpu", "--num_samples", "3", "--max_new_tokens", "8",
                 "--temperature", "1e-3", "--top_k", "1", "--start", "def"])
    greedy = capsys.readouterr().out.split("-" * 60 + "\n")[:-1]
    assert len(greedy) == 3 and len(set(greedy)) == 1 and greedy[0].startswith("def"), greedy
    sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--num_samples=1", "--max_new_tokens=8", "--top_k=0",
                 "--temperature=1.5"])
    out = capsys.readouterr().out
    assert out.startswith("def ") and out.endswith("-" * 60 + "\n"), out
    for seed in (1, 2):                             # --temperature=0: greedy, whatever the seed
        sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--num_samples=2", "--max_new_tokens=8",
                     "--temperature=0", f"--seed={seed}", "--start=def"])
    zero = capsys.readouterr().out.split("-" * 60 + "\n")[:-1]
    assert zero == greedy[:1] * 4, (zero, greedy)
    sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--max_new_tokens=8", "--temperature=0", "--start=def"])
    assert capsys.readouterr().out.split("-" * 60 + "\n")[:-1] == greedy[:1]     # greedy: one sample unless asked


def test_kv_cache_flag(byte_data, tmp_path, capsys, monkeypatch):
    """--kv_cache is on by default, --kv_cache=False turns it off, and both print the same samples (one seed)
    of 80 new tokens: past block_size (64)."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=1", "--eval_tokens=0"))
    use_cache, generate = [], GPT.generate

    def spy(self, *args, **kwargs):
        use_cache.append(kwargs["use_cache"])
        return generate(self, *args, **kwargs)
    monkeypatch.setattr(GPT, "generate", spy)
    texts = []
    for flags in ([], ["--kv_cache=False"], ["--kv_cache"]):
        capsys.readouterr()
        sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--num_samples=2", "--max_new_tokens=80", *flags])
        texts.append(capsys.readouterr().out)
    assert use_cache == [True, True, False, False, True, True]
    assert texts[0] == texts[1] == texts[2] and texts[0].startswith("def "), texts


def test_a_long_sample_shows_its_progress_on_stderr(byte_data, tmp_path, capsys, monkeypatch):
    """A line on stderr every Progress.EVERY seconds while a sample is drawn (a clock that moves 2 s a token here:
    every third token), naming the sample, the tokens so far and the rate; none after the last token, and the
    sample on stdout is as without it."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=1", "--eval_tokens=0"))
    flags = [f"--out_dir={tmp_path}", "--device=cpu", "--num_samples=2", "--max_new_tokens=9", "--temperature=0",
             "--seed=1"]
    capsys.readouterr()
    sample.main(flags[:3] + ["--max_new_tokens=9", "--temperature=0"])
    plain = capsys.readouterr()
    ticks = iter(range(0, 10**6, 2))
    monkeypatch.setattr(sample.Progress, "CLOCK", staticmethod(lambda: next(ticks)))
    sample.main(flags)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines == ["sample 1/2: 3 of 9 tokens (0.5 tokens/s)", "sample 1/2: 6 of 9 tokens (0.5 tokens/s)",
                     "sample 2/2: 3 of 9 tokens (0.5 tokens/s)", "sample 2/2: 6 of 9 tokens (0.5 tokens/s)"], err
    assert out.split("-" * 60 + "\n")[0] == plain.out.split("-" * 60 + "\n")[0] and plain.err == ""


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
