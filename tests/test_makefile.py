"""The Makefile's own targets (no .venv made): `make help` lists every target with its line, and `make clean`
removes what runs and tests leave and keeps .venv and data/. Skipped where make is not installed."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
MAKEFILE = os.path.join(ROOT, "Makefile")


def make(*args, cwd=ROOT):
    return subprocess.run(["make", "--no-print-directory", "-f", MAKEFILE, *args], cwd=cwd, capture_output=True,
                          text=True, check=True).stdout


def test_help_lists_every_target_with_one_line():
    phony = re.search(r"^\.PHONY: (.*)$", open(MAKEFILE).read(), re.M).group(1).split()
    lines = make("help").splitlines()
    assert [line.split()[1] for line in lines] == phony, lines
    assert all(re.fullmatch(r"  make [a-z-]+ +\S.*", line) for line in lines), lines


def test_clean_removes_runs_and_caches_and_keeps_the_venv_and_data(tmp_path):
    kept = [".venv/bin/python", "data/stdlib_byte/meta.json", "train.py", "outline.txt"]
    gone = ["out/ckpt.pt", "out-fast/metrics.jsonl", "bench_out/rows.jsonl", "bench_cpu/x", "wandb/run/x",
            ".pytest_cache/v", "__pycache__/a.pyc", "speedgpt/__pycache__/b.pyc"]
    for path in kept + gone:
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        (tmp_path / path).write_text("x")
    make("clean", cwd=tmp_path)
    assert all((tmp_path / p).exists() for p in kept)
    assert not any((tmp_path / p.split("/")[0]).exists() for p in gone if not p.startswith("speedgpt"))
    assert not (tmp_path / "speedgpt" / "__pycache__").exists() and (tmp_path / "speedgpt").is_dir()


def test_quickstart_passes_args_to_train_py_and_says_how_when_it_continues(tmp_path):
    """A second `make quickstart` continues out/ckpt.pt; a finished run asks for a larger --max_iters, which make
    takes as ARGS. A stand-in python (the venv made already) prints what it was given."""
    (tmp_path / "requirements.txt").write_text("torch>=2.4\n")
    os.makedirs(tmp_path / ".venv" / "bin")
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text("#!/bin/sh\necho ran: \"$@\"\n")
    python.chmod(0o755)
    (tmp_path / ".venv" / ".core").write_text("")
    os.utime(tmp_path / "requirements.txt", (1, 1))             # older than .core: the venv is up to date
    assert "ran: train.py --max_iters=20" in make("quickstart", "ARGS=--max_iters=20", cwd=tmp_path)
    os.makedirs(tmp_path / "out")
    (tmp_path / "out" / "ckpt.pt").write_text("x")
    out = make("quickstart", "ARGS=--max_iters=1000", cwd=tmp_path)
    assert "ran: train.py --init_from=resume --max_iters=1000" in out
    assert "make quickstart ARGS=--max_iters=1000" in out
