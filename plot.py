"""
A picture of one run or several: training loss with validation loss, real tokens/s, MFU and the learning
rate against the step, one line per run, labelled by its folder, from each run's out_dir/metrics.jsonl.

    python plot.py out                                  # -> out/runs.png
    python plot.py out-fast out-mine --out compare.png --log_step

A run still training (or one that crashed) plots too: a last line cut short mid-write is dropped, with a
warning. Needs matplotlib (pip install matplotlib); the format follows --out's suffix (.png, .pdf, .svg).
"""
import argparse
import os

from configurator import FlagParser
from speedgpt.measure import read_metrics

# (metrics key, y label), in reading order. The fourth is the learning rate rather than val bits/byte:
# a run's bpb is its val loss times a constant (tokens per byte of its val split), so its curve repeats
# the loss panel's, while the schedule explains that panel's bends (warm-up, decay, a resume).
PANELS = [("loss", "loss (train solid, val dashed)"), ("tokens_per_sec", "real tokens / s"),
          ("mfu", "MFU (%)"), ("lr", "learning rate")]


def load_run(folder):
    """The records of `folder`/metrics.jsonl (train.py's out_dir), a list of dicts with "step". A last line
    cut short (a crash or a run still writing) is dropped with a one-line warning. Raises ValueError in
    one line for a missing folder, no metrics.jsonl, an empty one, or a corrupt one (a broken line before the
    last, or no line that is JSON)."""
    path = os.path.join(folder, "metrics.jsonl")
    if not os.path.isdir(folder):
        raise ValueError(f"{folder} {'is a file' if os.path.exists(folder) else 'does not exist'}: give run folders "
                         "(train.py's out_dir, which holds metrics.jsonl)")
    if not os.path.isfile(path):
        raise ValueError(f"{folder} has no metrics.jsonl: is it a train.py out_dir? (a run writes it from its "
                         "first step)")
    try:
        records, note = read_metrics(path)
    except ValueError as e:     # a broken line before the last: no crash tears those, the file is corrupt
        raise ValueError(f"{path} is corrupt: {str(e).removeprefix(f'{path} ')}") from None
    if not records and note:    # its one line is not JSON: a torn last line is a run's later one, not its only
        with open(path) as f:
            n = next(i for i, line in enumerate(f, 1) if line.strip())
        raise ValueError(f"{path} is corrupt: line {n}, its only line, is not JSON: is it train.py's? "
                         "(delete it and train again)")
    if note:
        print(f"warning: {note}")
    if not records:
        raise ValueError(f"{path} is empty: the run has logged no step yet")
    if not all(isinstance(r, dict) and "step" in r for r in records):
        raise ValueError(f"{path} holds a line that is not a metrics record (no \"step\"): is it train.py's?")
    return records


def series(records, key):
    """(steps, values) of the records that hold a number for `key` (warm-up steps have no tokens/s; MFU
    is null on a CPU or an unknown GPU); MFU in percent."""
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in points], [100 * v if key == "mfu" else v for _, v in points]


def figure(runs, log_step=False):
    """The 2 x 2 figure of `runs` ({label: records}): one colour per run across the panels; a panel no
    run has numbers for says so. log_step: a symlog step axis (linear below 1, so step 0 stays on it)."""
    from matplotlib.figure import Figure    # not pyplot: no display, no backend, no global figure list
    fig = Figure(figsize=(12, 8))
    axes = fig.subplots(2, 2, sharex=True)
    for ax, (key, ylabel) in zip(axes.flat, PANELS):
        for i, (label, records) in enumerate(runs.items()):
            steps, values = series(records, key)
            if steps:
                ax.plot(steps, values, color=f"C{i}", label=label)
            steps, values = series(records, "val_loss") if key == "loss" else ([], [])
            if steps:
                ax.plot(steps, values, color=f"C{i}", linestyle="--", marker="o", markersize=3)
        if not ax.lines:
            why = "no MFU: a CPU or an unknown GPU (--peak_flops sets a peak)" if key == "mfu" else f"no {key}"
            ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="gray")
        elif key in ("tokens_per_sec", "mfu"):
            ax.set_ylim(bottom=0)            # from zero: a run twice as fast looks twice as high
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if log_step:
            ax.set_xscale("symlog", linthresh=1)
    for ax in axes[1]:
        ax.set_xlabel("step" + (" (log)" if log_step else ""))
    axes[0, 0].legend(fontsize="small")
    fig.tight_layout()
    return fig


def main(argv=None):
    parser = FlagParser(prog="plot.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run folders (train.py's out_dir), one line each")
    parser.add_argument("--out", default="", help="the picture (default runs.png in the first run's folder)")
    parser.add_bool("--log_step", help="a log-scale step axis")
    args = parser.parse_args(argv)
    args.out = args.out or os.path.join(args.runs[0], "runs.png")      # beside its run, not in the repository
    runs = {}
    for folder in args.runs:                # every folder checked before matplotlib is needed
        label = os.path.normpath(folder)
        if label in runs:
            parser.error(f"{folder} is given twice")
        try:
            runs[label] = load_run(folder)
        except ValueError as e:
            parser.error(str(e))
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SystemExit("error: plot.py needs matplotlib: pip install matplotlib") from None
    kinds = Figure().canvas.get_supported_filetypes()
    if os.path.splitext(args.out)[1].lstrip(".").lower() not in kinds:     # savefig would guess or raise
        parser.error(f"--out {args.out}: give a file ending in .png (or .{', .'.join(k for k in kinds if k != 'png')})")
    fig = figure(runs, args.log_step)
    from speedgpt.shards import describe_os_error, folder_creation_error
    try:
        if os.path.dirname(args.out):
            os.makedirs(os.path.dirname(args.out), exist_ok=True)
    except OSError as e:                 # a file in the way says so ("File exists" did not say which)
        parser.error(f"--out {args.out}: {folder_creation_error(os.path.dirname(args.out), e, '--out')}")
    try:
        fig.savefig(args.out, dpi=100)
    except OSError as e:
        parser.error(f"--out {args.out}: cannot write it ({describe_os_error(e)}): choose another --out")
    print(f"wrote {args.out}: {', '.join(runs)}")
    return args.out


if __name__ == "__main__":
    main()
