"""benchmarks/profile_summary.py on a hand-made trace: the kernels' time summed by kind."""
import os
import sys

from conftest import ROOT


def test_profile_summary_sums_kernels_by_kind(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import gzip, json
    import profile_summary
    events = [{"cat": "kernel", "name": "nvjet_sm90_tst_256x128_64x4", "ts": 0, "dur": 300},
              {"cat": "kernel", "name": "triton_tem_fused_flex_attention_backward_8", "ts": 300, "dur": 100},
              {"cat": "kernel", "name": "triton_red_fused__log_softmax__to_copy_3", "ts": 400, "dur": 50},
              {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 500, "dur": 50},
              {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 999}]
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    text = "\n".join(profile_summary.summarize(str(tmp_path / "t.json.gz")))
    assert "(90.9%;" in text                  # kernels span 0..550 us and are busy for 500 us of it
    rows = {l.split("|")[1].strip(): float(l.split("|")[2])
            for l in text.splitlines() if l.startswith("| ") and "%" in l}
    assert rows == {"matmul (GEMM)": 0.3, "attention": 0.1, "Triton (Inductor fused)": 0.1, "copy / memset": 0.1}


def test_a_cpu_runs_trace_is_refused_with_the_way_out(tmp_path):
    """A CPU run's trace has no GPU kernels: profile_summary.py printed that to stdout and exited 0, unlike
    roofline.py and kernel_diff.py; it is an error line naming the way out, exit 1."""
    import gzip
    import json
    import subprocess
    with gzip.open(tmp_path / "cpu.json.gz", "wt") as f:
        json.dump({"traceEvents": [{"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9}]}, f)
    proc = subprocess.run([sys.executable, "benchmarks/profile_summary.py", str(tmp_path / "cpu.json.gz")],
                          cwd=ROOT, capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"error: {tmp_path / 'cpu.json.gz'} holds no GPU kernels (a CPU run?): profile on the GPU\n"
