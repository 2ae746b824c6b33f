"""benchmarks/ab.py on the CPU: variants alternated round by round in fresh processes, one table; bad variants
refused in one line before any run."""
import json
import os
import subprocess
import sys
import types

import pytest

from conftest import ROOT, sigterm_once_a_child_runs

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import ab  # noqa: E402

TINY = ["--", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=64", "--batch_size=4", "--device=cpu"]


def test_two_variants_alternate_and_print_one_table(byte_data, tmp_path):
    out = tmp_path / "ab"
    proc = subprocess.run([sys.executable, "benchmarks/ab.py", "--config=", "--steps=2", "--warmup=1", "--rounds=2",
                           f"--out={out}", "a=", "b=--n_embd=48", *TINY, f"--data_dir={byte_data}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in open(out / "rows.jsonl")]
    assert [(r["variant"], r["round"]) for r in rows] == [("a", 1), ("b", 1), ("b", 2), ("a", 2)]   # B A: reversed
    assert all("--total_batch_size=0" in r["command"] and "--max_iters=3" in r["command"] for r in rows)
    assert "--n_embd=48" in rows[1]["command"] and "--n_embd=48" not in rows[0]["command"]
    assert "--n_embd=32" in rows[0]["command"] and "--n_embd=32" not in rows[1]["command"]   # replaced, not given twice
    table = proc.stdout.split("\n\n")[-1].strip().splitlines()
    assert table[0].startswith("| variant | tok/s, each round | mean | spread | against a |") and len(table) == 4
    tps = {r["variant"]: [x["tokens_per_sec"] for x in rows if x["variant"] == r["variant"]] for r in rows}
    assert table[2].startswith(f"| a | {tps['a'][0]:,.0f} / {tps['a'][1]:,.0f} | ") and "| 1.000x |" in table[2]
    ratio = (tps["b"][0] + tps["b"][1]) / (tps["a"][0] + tps["a"][1])
    assert f"| {ratio:.3f}x |" in table[3]
    assert (out / "ab.md").read_text().strip().splitlines() == table


@pytest.mark.parametrize("given, said", [
    (["a="], "1 variant given: compare two or more"),
    (["a=", "a=--n_layer=3"], "variant name 'a' given twice"),
    (["a", "b="], "variant 'a': give NAME=FLAGS"),
    (["a=", "b=--max_iters=9"], "b: ab.py sets max_iters itself on every run"),
    (["a=", "b=", "--", "--out_dir=x"], "after --: ab.py sets out_dir itself"),
    (["a=", "b=--n_layr=3"], "variant b: unknown config key 'n_layr'"),
    (["--steps=0", "a=", "b="], "--steps 0 (at least 1)"),
    (["a=", "b=--fp8=True", *TINY], "variant b: fp8=True needs a GPU"),       # train.py's refusal, before a's run
    (["a=", "b=--device=cuda:99", *TINY], "variant b: device='cuda:99' but "),   # its start's, before a's run too
])
def test_a_bad_comparison_is_one_line_before_any_run(given, said, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ab.main(["--config=", f"--out={tmp_path / 'ab'}", *given])
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "ab").exists()


def test_sigterm_stops_the_run_under_way_in_one_line(byte_data, tmp_path):
    """SIGTERM to ab.py (a scheduler, `timeout`) stops the train.py under way with it, and ab.py exits 143 in one
    line naming what it kept."""
    out = tmp_path / "ab"
    code, err, alive = sigterm_once_a_child_runs([sys.executable, "benchmarks/ab.py", "--config=", "--steps=5000",
                                                  "--warmup=1", f"--out={out}", "a=", "b=", *TINY,
                                                  f"--data_dir={byte_data}"])
    assert code == 143 and err.strip().splitlines()[-1] == \
        f"ab.py: stopped; the finished runs are in {out / 'rows.jsonl'}", err[-2000:]
    assert not alive, "the run outlived ab.py"


def test_a_flag_given_twice_in_a_variant_is_said_before_the_runs(tmp_path, capsys):
    """It was said in the run's log alone, and the table measured the last value unsaid."""
    args = types.SimpleNamespace(config="", out=str(tmp_path), warmup=1, steps=1, extra=TINY[1:])
    assert ab.refusal("b", ["--n_layer=3", "--n_layer=4"], args) is None
    assert capsys.readouterr().out == "warning: variant b: --n_layer is given 2 times (3, 4): the last, 4, is used\n"
