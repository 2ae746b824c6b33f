"""benchmarks/kernel_diff.py on hand-made traces, on the CPU."""
import gzip
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_cpu_runs_trace_is_named_as_such(tmp_path):
    """A trace of train.py --profile=True on the CPU holds no GPU kernels: kernel_diff.py said 'not two readable
    profiler traces: ValueError: max() arg is an empty sequence'. It says what the trace is and the way out."""
    with gzip.open(tmp_path / "cpu.json.gz", "wt") as f:
        json.dump({"traceEvents": [{"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9}]}, f)
    proc = subprocess.run([sys.executable, "benchmarks/kernel_diff.py", str(tmp_path / "cpu.json.gz"),
                           str(tmp_path / "cpu.json.gz")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"error: {tmp_path / 'cpu.json.gz'} holds no GPU kernels (a CPU run?): profile on the GPU\n"
