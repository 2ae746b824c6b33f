"""
Where two profiled steps differ: GPU kernel time per kernel name in two traces written by
`train.py --profile=True` (out_dir/profile_trace.json.gz), largest differences first, with each
trace's GPU busy time and kernel span (their difference is time the GPU sat idle).

    python benchmarks/kernel_diff.py out_a/profile_trace.json.gz out_b/profile_trace.json.gz
"""
import gzip
import json
import re
import sys
from collections import defaultdict


def load(path):
    """({kernel name: [us, calls]}, busy us, span us) of the trace at `path` (.json.gz). Inductor's
    numbered kernel names (triton_..._3) are merged by their stem."""
    events = json.load(gzip.open(path, "rt"))["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not kernels:       # a CPU run's trace: readable, but nothing to compare (max() below would say only that)
        sys.exit(f"error: {path} holds no GPU kernels (a CPU run?): profile on the GPU")
    by_name = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        entry = by_name[re.sub(r"_\d+$", "", e["name"])[:110]]
        entry[0] += e["dur"]
        entry[1] += 1
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    return by_name, sum(e["dur"] for e in kernels), span


def main(a_path, b_path, top=40):
    (a, busy_a, span_a), (b, busy_b, span_b) = load(a_path), load(b_path)
    print(f"A {a_path}: GPU busy {busy_a / 1e3:.1f} ms, span {span_a / 1e3:.1f} ms")
    print(f"B {b_path}: GPU busy {busy_b / 1e3:.1f} ms, span {span_b / 1e3:.1f} ms")
    print("| kernel | A ms (calls) | B ms (calls) | A-B ms |\n|---|---:|---:|---:|")
    for name in sorted(set(a) | set(b), key=lambda n: -abs(a.get(n, [0])[0] - b.get(n, [0])[0]))[:top]:
        (ta, ca), (tb, cb) = a.get(name, [0.0, 0]), b.get(name, [0.0, 0])
        print(f"| {name} | {ta / 1e3:.2f} ({ca}) | {tb / 1e3:.2f} ({cb}) | {(ta - tb) / 1e3:+.2f} |")


if __name__ == "__main__":
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__.strip())
        sys.exit(0)
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    try:
        main(sys.argv[1], sys.argv[2])
    except (OSError, EOFError, ValueError, KeyError) as e:
        sys.exit(f"error: not two readable profiler traces: {type(e).__name__}: {e}")
