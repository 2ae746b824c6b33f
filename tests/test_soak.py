"""benchmarks/soak.py on the CPU: a run that train.py refuses stops the soak in one line."""
import os
import subprocess
import sys

from conftest import ROOT


def test_a_refused_run_stops_the_soak_in_one_line(tmp_path):
    """A flag train.py refuses (or config/fast.py on a CPU): the soak ran all four runs, then ended in a traceback
    on the first run's missing metrics.jsonl. It stops after the first, in one line, and claims nothing."""
    proc = subprocess.run([sys.executable, "benchmarks/soak.py", "--config=", f"--out={tmp_path / 's'}",
                           "--no_such_flag=1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: the uninterrupted run (seed 1337) failed, "
                                                           "train.py exit ")
    assert "spread" not in proc.stdout and not os.path.exists(tmp_path / "s" / "straight_1338")
