"""bench.py: a smoke test of the ladder's shape with a tiny model (its numbers mean nothing). On a CPU the
FP8 rungs are skipped; on a GPU of compute capability 8.9+ the FP8 head's runs (no torchao needed), and so does its
leave-one-out row; the FP8 blocks rung is skipped for the tiny model, narrower than config/fast.py's fp8_min_dim."""
import json
import os
import re
import struct
import subprocess
import sys
import types

import pytest
import torch

import bench
from conftest import ROOT, sigterm_once_a_child_runs


NO_MATPLOTLIB = ("matplotlib is not installed (requirements-extra.txt): bench.py draws no bench.png, and "
                 "test_bench_ladder_and_leave_one_out checks the line saying so instead")


def matplotlib_importable():
    try:
        import matplotlib.figure  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.slow
def test_bench_ladder_and_leave_one_out(short_data, tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "bench.py", "--steps", "2", "--warmup", "1", "--batch_size", "4", "--out", str(out),
           "--loo", "packing", "--",                             # one leave-one-out row: each rung compiles anew
           "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=64", f"--data_dir={short_data}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.load(open(out / "bench.json"))
    names = [r["rung"] for r in rows]
    fp8 = bench.fp8_supported()
    loo = ["all on - packing"]
    assert names[:10] == ["baseline", "+ bf16 autocast", "+ torch.compile", "+ FlashAttention (sdpa)",
                          "+ fused AdamW", "+ packing, document mask", "+ fused head + cross-entropy", "+ FP8 head",
                          "+ FP8 blocks", "+ GELU's fast erf"]
    assert names[10:] == loo
    from configurator import load_config
    tiny = load_config(["--config", "config/fast.py", "--n_head=2", "--n_embd=32"])
    erf = bench.fast_erf_skipped(tiny, "narrow") is None                    # the tiny model's FP8 blocks are skipped
    ran = [r for r in rows if (r["rung"] != "+ FP8 head" or fp8) and r["rung"] != "+ FP8 blocks"
           and (r["rung"] != "+ GELU's fast erf" or erf)]
    assert rows[8]["error"] == "skipped: no block Linear is eligible (n_embd=32, fp8_min_dim=768)"
    assert rows[9]["ok"] if erf else rows[9]["error"] == "skipped: its passes are Triton kernels on a CUDA GPU"
    assert all(r["ok"] and r["tokens_per_sec"] > 0 and r["timed_steps"] == 2 for r in ran), rows
    assert rows[7]["ok"] if fp8 else "skipped" in rows[7]["error"]        # no FP8 on a CPU
    assert rows[0]["pad_frac"] > 0.3 and rows[5]["pad_frac"] < 0.1         # the padded baseline pads
    for r in ran[1:7]:
        assert abs(r["x_base"] - r["tokens_per_sec"] / rows[0]["tokens_per_sec"]) < 1e-9
    md = open(out / "bench.md").read()
    assert md.count("\n| ") == 2 + 10 + len(loo) and "Largest single gain on the ladder" in md and "Total speedup" in md
    assert "Largest single gain by leave-one-out" in md
    assert open(out / "bench.csv").read().count("\n") == 1 + 10 + len(loo)
    if matplotlib_importable():
        assert os.path.getsize(out / "bench.png") > 1000
    else:                                   # the chart alone needs it: test_bench_chart skips, saying so
        assert "matplotlib is not installed: no bench.png" in proc.stdout and not (out / "bench.png").exists()
    assert "--compile=True" in rows[2]["command"] and "--packing=False" in rows[0]["command"]
    assert "--fused_ce=True" in rows[6]["command"] and "--fused_ce=False" in rows[5]["command"]

    # --resume: a bench cut short continues; finished rungs with the same settings are not run again
    again = subprocess.run(cmd[:2] + ["--resume"] + cmd[2:], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("reused from") == len(ran), again.stdout[-2000:]
    assert [r.get("tokens_per_sec") for r in json.load(open(out / "bench.json"))] == \
        [r.get("tokens_per_sec") for r in rows]
    kept = [l for l in open(out / "rows.jsonl") if '"+ fused AdamW"' not in l]
    open(out / "rows.jsonl", "w").writelines(kept + ['{"rung": "+ fused Ad'])     # and a last line cut by a stop
    ladder_only = [a for a in cmd[2:] if a not in ("--loo", "packing")]           # --no_loo with --loo is refused
    part = subprocess.run(cmd[:2] + ["--resume", "--no_loo"] + ladder_only, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert part.returncode == 0 and part.stdout.count("reused from") == 6 + fp8, part.stdout[-2000:]
    assert "=== + fused AdamW\n" in part.stdout                            # the one missing rung ran
    assert f"line(s) {len(kept) + 1} are not a row (cut by a stop?): passed over" in part.stdout
    assert sum('"+ fused AdamW"' in l for l in open(out / "rows.jsonl")) == 1        # on a line of its own


def test_fp8_blocks_rung_runs_where_the_config_converts_a_block():
    """config/fast.py's FP8 blocks are a rung of the ladder; a config with bf16 blocks, or a shape narrower than
    its fp8_min_dim (a small model after --), skips it with the reason instead of failing on the GPU."""
    from configurator import load_config
    runs_here = bench.fp8_supported(torchao=False)       # tensorwise_delayed is ours: torchao is not asked for
    # the config's FP8 settings the skipped rung would have measured are named
    assert bench.fp8_blocks_skipped(load_config(["--config", "config/fast.py"])) == \
        (None if runs_here else "FP8 needs a GPU of compute capability 8.9+, so fp8_recipe='tensorwise_delayed', "
         "fp8_min_dim=768, fp8_gelu_cast=True go unmeasured")
    assert bench.fp8_blocks_skipped(load_config(["--fp8=True", "--fp8_min_dim=16"])) == \
        (None if bench.fp8_supported(torchao=True) else
         "FP8 needs a GPU of compute capability 8.9+ and torchao (tensorwise), so fp8_min_dim=16 goes unmeasured")
    assert bench.fp8_blocks_skipped(load_config(["--config", "config/fast.py", "--fp8=False"])) == \
        "the config keeps its blocks in bf16 (fp8=False)"
    assert bench.fp8_blocks_skipped(load_config(["--config", "config/fast.py", "--n_embd=512", "--n_head=8"])) == \
        "no block Linear is eligible (n_embd=512, fp8_min_dim=768)"


def test_bench_stops_at_the_first_failed_rung_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "bench.py", "--steps", "1", "--out", str(tmp_path / "b"), "--",
                           f"--data_dir={tmp_path / 'no_data'}", "--n_layer=1", "--n_head=2", "--n_embd=32"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: rung 'baseline' failed: data folder '{tmp_path / 'no_data'}' "
        f"does not exist: prepare it with `python data.py --input CORPUS --out "
        f"{tmp_path / 'no_data'}` (log: {tmp_path / 'b' / 'runs' / 'baseline' / 'stdout.log'})"]
    assert "=== + bf16 autocast" not in proc.stdout


def test_failed_rung_that_does_not_fit_names_bench_ways_out():
    """train.py's memory advice names its --batch_size and --attention, which bench.py sets itself and refuses
    after --: the line ends with bench.py's own way out (on a CPU, the docstring's CPU example, whole)."""
    need = ("error: this run needs about 23.8 GB per process (weights + optimizer 1.4, activations 22.3, head 0.1), "
            "more than 90% of the 24.3 GB cpu has available: lower --batch_size (total_batch_size keeps the step's "
            "tokens), or --block_size, or use --grad_checkpointing=full, or --attention=sdpa (no T x T scores); "
            "--memory_check=False skips this check")
    row = {"rung": "baseline", "error": need, "log": "b/runs/baseline/stdout.log"}
    args = types.SimpleNamespace(batch_size=16, config="config/fast.py", extra=[])
    cpu, gpu = bench.failed_line(row, args, cuda=False), bench.failed_line(row, args, cuda=True)
    assert cpu == (f"error: rung 'baseline' failed: {need[len('error: '):]} (log: b/runs/baseline/stdout.log); "
                   f"in bench.py: --batch_size below 16, or on a CPU: {bench.CPU_EXAMPLE}")
    assert cpu.count("error: ") == 1 and gpu.endswith("(log: b/runs/baseline/stdout.log); in bench.py: "
                                                      "--batch_size below 16")
    assert " ".join(bench.__doc__.replace("\\\n", " ").split()).count(bench.CPU_EXAMPLE) == 1   # the --help's line
    other = {"rung": "all on - packing", "error": "error: data folder 'x' does not exist", "log": "l"}
    assert bench.failed_line(other, args, cuda=False) == "error: rung 'all on - packing' failed: data folder 'x' " \
        "does not exist (log: l)"                  # no memory advice where the error is another
    mine = types.SimpleNamespace(batch_size=16, config="my config.py", extra=["--n_layer", "24", "--data_dir=d"])
    assert bench.failed_line(row, mine, cuda=False).endswith(
        "or on a CPU: python bench.py --config 'my config.py' --steps 2 --no_loo --batch_size 4 --out bench_cpu -- "
        "--n_layer=2 --n_head=2 --n_embd=64 --block_size=64 --data_dir=d")     # the user's bench, made small


def test_the_cpu_example_keeps_the_users_config_and_flags(tmp_path, monkeypatch, capsys):
    """On a CPU, config/large.py's ladder is refused with the small example, which dropped the --config and the
    train.py flags given: it suggested config/fast.py's bench on other data. It keeps them, less the model size it
    sets itself (--n_layer 24, either form)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench.main(["--config", "config/large.py", "--out", str(tmp_path / "b"), "--", "--n_layer", "24",
                    "--data_dir=data/stdlib_byte"])
    err = capsys.readouterr().err.strip().splitlines()
    example = ("python bench.py --config config/large.py --steps 2 --no_loo --batch_size 4 --out bench_cpu -- "
               "--n_layer=2 --n_head=2 --n_embd=64 --block_size=64 --data_dir=data/stdlib_byte")
    assert len(err) == 1 and err[0].startswith("error: on a CPU, every rung of config/large.py's model") and \
        err[0].endswith(f"On a CPU: {example}"), err
    assert not (tmp_path / "b").exists()


def test_a_first_rung_that_does_not_fit_is_refused_before_any_rung_runs(tmp_path, monkeypatch, capsys):
    """On a CPU, config/fast.py's ladder (GPT-2 124M) is refused in one line naming its work and the small example;
    a model that this CPU could train but whose float32 baseline (naive T x T attention) at bench.py's default
    micro-batch does not fit a 24 GB machine is refused with the estimate and bench.py's way out; both before any
    rung runs or --out is made; from a later rung (--start) the check is that rung's, which fits."""
    from speedgpt import memory
    monkeypatch.setattr(memory, "available", lambda device: 24e9)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path / "b")])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: on a CPU, every rung of config/fast.py's model (12 layers, n_embd 768) would train 358 TFLOP (35 "
        f"steps of 16 x 1024 tokens): hours for the ladder; the ladder measures a GPU. On a CPU: {bench.CPU_EXAMPLE}")
    monkeypatch.setattr(bench, "CPU_RUNG_FLOP", float("inf"))              # a CPU that could train it
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path / "b")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"error: the baseline rung at --batch_size 16 does not fit: this run needs about "
                        r"\d+\.\d GB per process \(.*\), more than 90% of the 24\.0 GB cpu has available; "
                        r"in bench\.py: --batch_size below 16, or on a CPU: " + re.escape(bench.CPU_EXAMPLE), err), err
    assert not (tmp_path / "b").exists()
    args = types.SimpleNamespace(start=2, batch_size=4, config="config/fast.py", steps=2, warmup=0)
    assert bench.first_rung_refusal(args, ["--total_batch_size=0", "--batch_size=4", "--data_dir=data/stdlib_byte"]) \
        is None


def test_a_later_rung_that_train_py_would_refuse_is_refused_before_any_rung_runs(tmp_path, capsys, monkeypatch):
    """A config file's setting of a feature that only a later rung turns on (compile_persistent_rows: the rungs before
    torch.compile's drop it with compile=False) is checked at start as that rung's train.py checks it, not found
    after the baseline and bf16 rungs ran."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)       # a CPU's bench, on a GPU machine too
    (tmp_path / "mine.py").write_text("compile_persistent_rows = 2048\n")
    with pytest.raises(SystemExit) as e:
        bench.main(["--steps", "1", "--no_loo", "--batch_size", "4", "--config", str(tmp_path / "mine.py"), "--out",
                    str(tmp_path / "b"), "--", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == ["error: the rung '+ torch.compile' would be refused: compile_persistent_rows="
                                         "2048 lays out the Triton kernels compiled for a GPU; on cpu it would do "
                                         "nothing: leave it out"], err
    assert not (tmp_path / "b").exists()
    (tmp_path / "mine.py").write_text("keep_checkpoints = 2\n")          # the rungs save none: it would do nothing
    with pytest.raises(SystemExit):
        bench.main(["--steps", "1", "--no_loo", "--batch_size", "4", "--config", str(tmp_path / "mine.py"), "--out",
                    str(tmp_path / "b"), "--", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the rung 'baseline' would be refused: keep_checkpoints=2 "
                                               "would do nothing") and err[0].endswith(
        f"(bench.py sets save_checkpoints itself: leave the refused setting out of {tmp_path / 'mine.py'})"), err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("setting, said", [
    ("eval_only = True", "eval_only=True evaluates once, and eval_tokens=0 (or eval_iters=0) evaluates nothing: give "
     "eval_tokens > 0, or leave eval_only out (bench.py sets eval_tokens itself: leave the refused setting out of "),
    ("target_val_loss = 3.0", "it needs eval_tokens > 0 (bench.py sets eval_tokens itself: leave the refused setting "
     "out of "),
    ("check_mask = True", "it needs packing=True and document_mask=True (bench.py sets document_mask, packing itself: "
     "leave the refused setting out of "),
    ("init_from = 'resume'", "bench.py's rungs each train afresh: leave init_from='resume' and resume_from out of "),
    ("resume_from = '4'", "bench.py's rungs each train afresh: leave init_from='resume' and resume_from out of "),
])
def test_a_config_setting_that_would_undo_the_rungs_own_is_refused_before_any_rung(tmp_path, capsys, monkeypatch,
                                                                                     setting, said):
    """A config file's setting that a rung would be refused for, whose way out is a key bench.py sets itself (the
    line says so), or that would make the rungs something else than fresh timed runs: one line before any rung."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "mine.py").write_text(setting + "\n")
    with pytest.raises(SystemExit):
        bench.main(["--steps", "1", "--no_loo", "--batch_size", "4", "--config", str(tmp_path / "mine.py"), "--out",
                    str(tmp_path / "b"), "--", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said + str(tmp_path / "mine.py") in err[0], err
    assert not (tmp_path / "b").exists()


def test_an_out_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit):
        bench.main(["--steps", "2", "--no_loo", "--batch_size", "4", "--out", str(tmp_path / "afile" / "b"), "--",
                    "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64"])
    assert capsys.readouterr().err == f"error: cannot create the output folder {tmp_path / 'afile' / 'b'}: " \
        f"{tmp_path / 'afile'} is a file, not a folder; choose another --out\n"


def test_an_empty_out_is_named_as_empty(tmp_path, capsys, monkeypatch):
    """--out '': makedirs('') failed and the line blamed the current folder's parent ("/work does not take new
    folders"); it says --out is empty, before any rung."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        bench.main(["--steps", "2", "--no_loo", "--batch_size", "4", "--config", os.path.join(ROOT, "config",
                    "fast.py"), "--out", "", "--", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64"])
    assert e.value.code == 2 and capsys.readouterr().err == \
        "error: --out is empty: give the folder for the table and the runs, e.g. --out bench_out\n"
    assert os.listdir(tmp_path) == []


def test_bench_config_that_is_a_folder_is_one_line(tmp_path, capsys):
    for config, why in ((tmp_path, "is a folder, not a file"), (tmp_path / "missing.py", "not found")):
        with pytest.raises(SystemExit) as e:
            bench.main(["--config", str(config), "--out", str(tmp_path / "b")])
        assert e.value.code == 2 and capsys.readouterr().err == f"error: config file {config} {why}\n"
    assert not (tmp_path / "b").exists()


def test_bench_refuses_overrides_it_sets_itself(tmp_path):
    """An override after -- of a key the ladder sets (fp8, dtype, batch_size, ...) would be silently
    undone by each rung's own flags, or undo the measurement: refused before any rung runs."""
    for extra, mode in ((["--fp8=True"], []), (["--batch_size=8"], []), (["--max_iters=5"], ["--find_max_batch"])):
        proc = subprocess.run([sys.executable, "bench.py", *mode, "--out", str(tmp_path / "b"), "--", *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        key = extra[0][2:].split("=")[0]
        assert proc.returncode == 2 and f"bench.py sets {key} itself" in proc.stderr, proc.stderr
        assert not (tmp_path / "b").exists()
    # a setting of a feature the ladder turns off (the baseline: all of them) would be refused by that rung
    for detail in ("--fp8_min_dim=16", "--fp8_recipe=rowwise", "--fused_ce_chunk=4096", "--compile_regional=True"):
        proc = subprocess.run([sys.executable, "bench.py", "--out", str(tmp_path / "b"), "--", detail],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        key = detail[2:].split("=")[0]
        assert proc.returncode == 2 and f"{key} after -- would reach the rungs that turn its feature off" in \
            proc.stderr and "set it in a config file of your own, given to --config" in proc.stderr, proc.stderr
        assert not (tmp_path / "b").exists()


def test_bench_option_after_the_separator_is_named_as_bench_pys(tmp_path, capsys):
    """The stop line's 'the same command with --resume', appended after --, reached train.py, which said "unknown
    config key 'resume': did you mean resume_from?" (a train.py flag that rewinds a run)."""
    for extra in ("--resume", "--steps=2", "--no_loo"):
        with pytest.raises(SystemExit) as e:
            bench.main(["--out", str(tmp_path / "b"), "--", "--n_layer=2", extra])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"error: {extra.split('=')[0]} after -- goes to train.py: it is bench.py's own " \
            "option, give it before --" in err, err
        assert not (tmp_path / "b").exists()


def test_no_loo_with_loo_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """--no_loo silently won over --loo packing: the leave-one-out row asked for was dropped without a word. Both
    given: one line naming both and the way out, before any check or --out; --no_loo=False with --loo is no clash."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)       # a CPU's bench, on a GPU machine too
    with pytest.raises(SystemExit) as e:
        bench.main(["--no_loo", "--loo", "packing", "--out", str(tmp_path / "b")])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: --no_loo and --loo 'packing' both given: keep --loo to choose the leave-one-out rows, or --no_loo "
        "(as --loo none) to skip the pass\n")
    assert not (tmp_path / "b").exists()
    with pytest.raises(SystemExit):             # refused later, for config/fast.py's size on a CPU
        bench.main(["--no_loo=False", "--loo", "packing", "--out", str(tmp_path / "b")])
    assert "both given" not in capsys.readouterr().err


def test_loo_names_match_whatever_their_case_spaces_or_underscores(tmp_path, monkeypatch, capsys):
    """--loo "fp8_blocks" was refused as an unknown change (the row is "FP8 blocks"), and a trailing comma as the
    unknown change ''. Case, spaces, '-' and '_' aside, a name is its change; empty entries name nothing; a --loo
    of commas alone is one line naming the changes."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    seen = []
    monkeypatch.setattr(bench, "first_rung_refusal", lambda args, extra: seen.append(args.loo) or "stopped here")
    for loo, rows in (("fp8_blocks,Packing,", ["FP8 blocks", "packing"]), ("TORCH.COMPILE, fused-adamw", [
            "torch.compile", "fused AdamW"]), ("None", []), ("all,", list(bench.UNDO))):
        with pytest.raises(SystemExit):
            bench.main(["--loo", loo, "--out", str(tmp_path / "b")])
        assert seen.pop() == rows and "stopped here" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.main(["--loo", " , ", "--out", str(tmp_path / "b")])
    assert e.value.code == 2 and "error: --loo ' , ' names no change: give some of bf16 autocast" in \
        capsys.readouterr().err and not seen
    with pytest.raises(SystemExit):
        bench.main(["--loo", "packng", "--out", str(tmp_path / "b")])
    assert "error: --loo: unknown change 'packng'" in capsys.readouterr().err


def test_an_interrupted_bench_exits_128_plus_the_signal_and_names_its_out(tmp_path, monkeypatch, capsys):
    """Ctrl-C (or SIGTERM, taken as one) while the rungs run: bench.py exited 1, and its line named the folder as
    `OUT/rows.jsonl`. It exits 128 + the signal's number (130, 143), as train.py and data.py, naming --out's."""
    import signal
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signal.SIGINT, signal.default_int_handler)      # Ctrl-C as in a terminal (a stop leaves it
            signal.signal(signal.SIGTERM, before[signal.SIGTERM])         # ignored: a second one never cuts it)
            monkeypatch.setattr(bench, "bench", lambda *a, signum=signum: os.kill(os.getpid(), signum))
            with pytest.raises(SystemExit) as e:
                try:
                    bench.main(["--steps", "2", "--no_loo", "--batch_size", "4", "--out", str(tmp_path / "b"), "--",
                                "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64"])
                except KeyboardInterrupt:       # escaping, it would stop pytest's session too
                    pytest.fail("the interrupt left bench.main with no exit status or line")
            err = capsys.readouterr().err.strip().splitlines()
            assert e.value.code == 128 + signum and err == [
                f"stopped ({signal.Signals(signum).name}): the rung under way was stopped; the rungs that finished "
                f"are in {tmp_path / 'b' / 'rows.jsonl'}, and the same command with --resume (before its --) takes "
                "them"], err
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_bench_chart(tmp_path):
    """bench.png: a bar per row that ran (a failed rung is left out), 9 inches wide, half an inch a bar."""
    pytest.importorskip("matplotlib", reason=NO_MATPLOTLIB)
    ladder = [{"rung": "baseline", "ok": True, "tokens_per_sec": 1000.0},
              {"rung": "+ bf16 autocast", "ok": True, "tokens_per_sec": 2500.0},
              {"rung": "+ FP8 head", "ok": False, "error": "skipped: FP8 needs a GPU"}]
    loo = [{"rung": "all on - packing", "ok": True, "tokens_per_sec": 2000.0}]
    assert bench.chart(ladder + loo, ladder, "fast.py on cpu", str(tmp_path / "bench.png"))
    head = open(tmp_path / "bench.png", "rb").read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (9 * 120, (3 * 0.5 + 1.5) * 120)
    assert not bench.chart(ladder[2:], ladder, "nothing ran", str(tmp_path / "none.png"))
    assert not (tmp_path / "none.png").exists()


def test_bench_chart_without_matplotlib_says_so(tmp_path, monkeypatch, capsys):
    for name in ("matplotlib", "matplotlib.figure"):      # None: `import` raises ImportError, installed or not
        monkeypatch.setitem(sys.modules, name, None)
    rows = [{"rung": "baseline", "ok": True, "tokens_per_sec": 1000.0}]
    assert not bench.chart(rows, rows, "fast.py on cpu", str(tmp_path / "bench.png"))
    assert capsys.readouterr().out == "matplotlib is not installed: no bench.png (pip install matplotlib)\n"
    assert not (tmp_path / "bench.png").exists()


def test_sigterm_stops_the_rung_under_way_too(tmp_path):
    """SIGTERM to bench.py alone (a scheduler, `timeout`) stops the train.py of the rung under way with it, instead
    of leaving it training with no parent, and bench.py ends in one line saying what it kept."""
    cmd = [sys.executable, "bench.py", "--steps", "500", "--no_loo", "--batch_size", "4", "--out", str(tmp_path / "b"),
           "--", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64"]
    code, err, alive = sigterm_once_a_child_runs(cmd)
    assert code == 143 and err.strip().splitlines()[-1].startswith(
        f"stopped (SIGTERM): the rung under way was stopped; the rungs that finished are in "
        f"{tmp_path / 'b' / 'rows.jsonl'}"), err[-2000:]
    assert not alive, "the rung's train.py outlived bench.py"


def test_resume_with_nothing_to_take_says_so(tmp_path, capsys):
    """--resume where --out holds no rows.jsonl (a mistyped --out), or only rows of other settings: one note line,
    then every rung runs (a bench that always passes --resume keeps working)."""
    import argparse
    args = argparse.Namespace(resume=True, out=str(tmp_path), config="config/fast.py", steps=2, warmup=1)
    assert bench.finished_rungs(args, []) == {}
    assert f"note: --resume: no {tmp_path / 'rows.jsonl'} to take rungs from" in capsys.readouterr().out
    (tmp_path / "rows.jsonl").write_text(json.dumps({"rung": "baseline", "ok": True,
                                                     "settings": bench.settings(args, ["--n_layer=2"])}) + "\n")
    assert bench.finished_rungs(args, []) == {}
    assert "no finished rung in" in capsys.readouterr().out
    assert list(bench.finished_rungs(args, ["--n_layer=2"])) == ["baseline"]
    assert capsys.readouterr().out == ""


def test_a_leave_one_out_row_that_cannot_run_here_is_named_with_the_reason():
    """--loo "GELU's fast erf" (or an FP8 row) on a machine that skips its rung printed nothing: the pass the user
    asked for was silently empty. plan() still drops it; the note says which and why."""
    args = types.SimpleNamespace(start=1, loo=["fused AdamW", "GELU's fast erf", "FP8 blocks"])
    skips = {"+ FP8 blocks": "the config keeps its blocks in bf16 (fp8=False)",
             "+ GELU's fast erf": "its passes are Triton kernels on a CUDA GPU"}
    ladder, loo = bench.plan(args, skips)
    assert [name for name, _ in loo] == ["all on - fused AdamW"]
    assert bench.dropped_rows(args.loo, ladder, loo) == [
        "note: --loo \"GELU's fast erf\" skipped: its passes are Triton kernels on a CUDA GPU",
        "note: --loo 'FP8 blocks' skipped: the config keeps its blocks in bf16 (fp8=False)"]
    assert bench.dropped_rows(["fused AdamW"], ladder, loo) == []


def test_each_modes_options_given_to_the_other_are_refused(tmp_path, monkeypatch, capsys):
    """--max_batch without --find_max_batch did nothing, unsaid, and refused a ladder's --batch_size above its
    default (512) though no search ran; --find_max_batch read none of the ladder's options (--steps, --loo, ...).
    Each is one line naming the options, before any work; a ladder's --batch_size has no bound but 1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)       # a CPU's bench, on a GPU machine too
    monkeypatch.setattr(bench, "first_rung_refusal", lambda args, extra: "stopped here")
    for args, error in ((["--max_batch", "64"], "error: --max_batch would do nothing without --find_max_batch, the "
                         "search it bounds: add --find_max_batch or leave it out\n"),
                        (["--find_max_batch", "--steps=3", "--no_loo"], "error: --no_loo, --steps would do nothing "
                         "with --find_max_batch, which runs no ladder: leave them out\n"),
                        (["--find_max_batch", "--max_batch", "4", "--batch_size", "8"],
                         "error: need 1 <= --batch_size <= --max_batch, got 8 and 4\n"),
                        (["--batch_size", "1024"], "error: stopped here\n")):       # past the checks of the flags
        with pytest.raises(SystemExit) as e:
            bench.main([*args, "--out", str(tmp_path / "b")])
        assert e.value.code == 2 and capsys.readouterr().err == error
    assert not (tmp_path / "b").exists()
