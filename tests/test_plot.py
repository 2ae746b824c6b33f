"""plot.py on two hand-written runs (train.py's record shapes): the picture, what each panel holds, and the
bad input it refuses in one line. The refusals, the cut-short last line and the missing-matplotlib message
run without matplotlib; the drawing tests skip, saying so, where it is missing."""
import json
import struct
import subprocess
import sys

import pytest

import plot
from conftest import ROOT

NO_MATPLOTLIB = "matplotlib is not installed (requirements-extra.txt): plot.py draws nothing without it"


def write_run(folder, steps, mfu, cut=False):
    """folder/metrics.jsonl as train.py writes it: an evaluation every 10 steps (step 0 and the last
    included), a training row per step, step 0 untimed (no tokens/s or MFU); mfu None as on a CPU.
    cut: a last line cut short mid-write, as a crash leaves it."""
    folder.mkdir()
    rows = []
    for step in range(steps + 1):
        if step % 10 == 0 or step == steps:
            rows.append({"step": step, "val_loss": 5.0 - step / 10, "val_bpb": 7.2 - step / 7})
        if step < steps:
            timed = step > 0
            rows.append({"step": step, "loss": 5.2 - step / 10, "lr": 1e-3 * min(1, (step + 1) / 5),
                         "step_ms": 100.0 if timed else None, "tokens_per_sec": 2000.0 + step if timed else None,
                         "mfu": mfu if timed else None, "mem_gb": None, "pad_frac": 0.0, "grad_norm": 1.0})
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (folder / "metrics.jsonl").write_text(text + ('{"step": 20, "loss": 3.1, "l' if cut else ""))
    return folder, rows


def png_size(path):
    """(width, height) in pixels of a PNG file; fails on anything else."""
    head = open(path, "rb").read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


def test_plot_draws_two_runs_into_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason=NO_MATPLOTLIB)
    a, _ = write_run(tmp_path / "out-fast", 20, mfu=0.4)
    b, _ = write_run(tmp_path / "out-mine", 30, mfu=None, cut=True)
    out = tmp_path / "pics" / "runs.png"                  # its folder is made
    proc = subprocess.run([sys.executable, "plot.py", str(a), str(b), "--out", str(out), "--log_step"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"warning: the last line of {b / 'metrics.jsonl'} was cut short (a run stopped while writing it): dropped",
        f"wrote {out}: {a}, {b}"]
    assert png_size(out) == (1200, 800) and out.stat().st_size > 20_000     # 12 x 8 inches at 100 dpi, drawn on


def test_the_picture_goes_beside_the_first_run_by_default(tmp_path):
    pytest.importorskip("matplotlib", reason=NO_MATPLOTLIB)
    a, _ = write_run(tmp_path / "out-fast", 20, mfu=0.4)
    assert plot.main([str(a)]) == str(a / "runs.png") and png_size(a / "runs.png") == (1200, 800)


def test_plot_panels_hold_each_run(tmp_path):
    pytest.importorskip("matplotlib", reason=NO_MATPLOTLIB)
    runs = {"out-fast": write_run(tmp_path / "a", 20, mfu=0.4)[1],
            "out-mine": write_run(tmp_path / "b", 30, mfu=None)[1]}
    loss, tps, mfu, lr = plot.figure(runs).axes
    assert loss.get_legend_handles_labels()[1] == ["out-fast", "out-mine"]
    fast_train, fast_val, mine_train, mine_val = loss.lines
    assert list(fast_val.get_xdata()) == [0, 10, 20] and list(fast_val.get_ydata()) == [5.0, 4.0, 3.0]
    assert fast_val.get_color() == fast_train.get_color() != mine_train.get_color() == mine_val.get_color()
    assert list(mine_train.get_xdata()) == list(range(30))
    assert [len(line.get_xdata()) for line in tps.lines] == [19, 29]         # step 0 is warm-up: untimed
    assert len(mfu.lines) == 1 and set(mfu.lines[0].get_ydata()) == {40.0}   # out-mine has no MFU (a CPU)
    assert len(lr.lines) == 2 and not mfu.texts
    cpu_only = plot.figure({"out-mine": runs["out-mine"]}, log_step=True)
    assert not cpu_only.axes[2].lines and cpu_only.axes[2].texts[0].get_text().startswith("no MFU")
    assert {ax.get_xscale() for ax in cpu_only.axes} == {"symlog"}


def test_plot_cut_short_last_line_is_dropped_with_one_line(tmp_path, capsys):
    folder, rows = write_run(tmp_path / "crashed", 20, mfu=None, cut=True)
    assert plot.load_run(str(folder)) == rows
    assert capsys.readouterr().out == (f"warning: the last line of {folder / 'metrics.jsonl'} was cut short "
                                       "(a run stopped while writing it): dropped\n")


def test_plot_refuses_bad_input_in_one_line(tmp_path, capsys):
    good, _ = write_run(tmp_path / "good", 10, mfu=None)
    (tmp_path / "no_metrics").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    (tmp_path / "a_file").write_text("x")
    broken, _ = write_run(tmp_path / "broken", 10, mfu=None)
    lines = (broken / "metrics.jsonl").read_text().splitlines(keepends=True)
    (broken / "metrics.jsonl").write_text("".join(lines[:3] + ['{"step": 2, "lo\n'] + lines[3:]))
    (tmp_path / "corrupt").mkdir()           # no line parses: corrupt, not a torn last line of an empty run
    (tmp_path / "corrupt" / "metrics.jsonl").write_text("\nnot json\n")
    cases = [
        ([str(tmp_path / "missing")], f"error: {tmp_path / 'missing'} does not exist: give run folders"),
        ([str(tmp_path / "a_file")], f"error: {tmp_path / 'a_file'} is a file: give run folders"),
        ([str(good), str(tmp_path / "no_metrics")], f"error: {tmp_path / 'no_metrics'} has no metrics.jsonl: "
                                                     "is it a train.py out_dir?"),
        ([str(tmp_path / "empty")], f"error: {tmp_path / 'empty' / 'metrics.jsonl'} is empty: the run has logged "
                                    "no step yet"),
        ([str(broken)], f"error: {broken / 'metrics.jsonl'} is corrupt: line 4 is not JSON"),
        ([str(tmp_path / "corrupt")], f"error: {tmp_path / 'corrupt' / 'metrics.jsonl'} is corrupt: line 2, its "
                                      "only line, is not JSON"),
        ([str(good), f"{good}/"], f"error: {good}/ is given twice"),
        ([], "error: the following arguments are required: runs"),
    ]
    for argv, start in cases:
        with pytest.raises(SystemExit) as e:
            plot.main([*argv, "--out", str(tmp_path / "runs.png")])
        out, err = capsys.readouterr()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith(start), (argv, err)
        assert out == "", (argv, out)            # the one line only: no "cut short" warning before it
    assert not (tmp_path / "runs.png").exists()


def test_plot_refuses_an_out_it_cannot_write(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason=NO_MATPLOTLIB)
    good, _ = write_run(tmp_path / "good", 10, mfu=None)
    for out in ("runs", "runs.xyz"):
        with pytest.raises(SystemExit) as e:
            plot.main([str(good), "--out", str(tmp_path / out)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: --out {tmp_path / out}: give a file ending in .png")
    assert list(tmp_path.iterdir()) == [good]
    (tmp_path / "notes.md").write_text("a file")       # --out notes.md/x.png said "File exists", naming no file
    with pytest.raises(SystemExit) as e:
        plot.main([str(good), "--out", str(tmp_path / "notes.md" / "x.png")])
    assert e.value.code == 2 and f"{tmp_path / 'notes.md'} is a file, not a folder; choose another --out" in \
        capsys.readouterr().err


def test_plot_without_matplotlib_says_how_to_install(tmp_path):
    """A fresh process in which `import matplotlib` fails, installed or not: the one line, no picture."""
    good, _ = write_run(tmp_path / "good", 10, mfu=None)
    hide = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'plot.py'; "
            "runpy.run_path('plot.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", hide, str(good), "--out", str(tmp_path / "runs.png")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "error: plot.py needs matplotlib: pip install "
                                                                  "matplotlib\n")
    assert not (tmp_path / "runs.png").exists()
