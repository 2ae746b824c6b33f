"""
Where a profiled step's GPU time goes: sums the kernels of a trace written by `train.py --profile=True`
(out_dir/profile_trace.json.gz) by kind, and compares their sum with the span from the first kernel's
start to the last one's end (the difference is time the GPU sat idle).

    python benchmarks/profile_summary.py out-fast/profile_trace.json.gz

Kinds are guessed from kernel names (cuBLAS/CUTLASS GEMMs, attention kernels, Triton kernels that
Inductor generated, the fused optimizer, copies); the guess is printed with the top kernels so it can be
checked.
"""
import gzip
import json
import re
import sys
from collections import defaultdict

KINDS = [  # first match wins
    ("attention", r"flash|fmha|flex|attention|cudnn|sdpa"),
    ("matmul (GEMM)", r"gemm|cutlass|xmma|nvjet|cublas|sm\d+_.*_tn|wgmma"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("communication", r"nccl|allreduce|all_gather|reduce_scatter"),
    ("Triton (Inductor fused)", r"^triton_"),     # before copies: Inductor names kernels after ops like _to_copy
    ("copy / memset", r"memcpy|memset|copy"),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


class NoGPUKernels(Exception):
    """A readable trace without a GPU kernel: a CPU run's."""


def summarize(path, top=15):
    """Lines of a Markdown summary of the Chrome trace at `path` (.json or .json.gz; durations in us,
    printed in ms). Raises OSError for an unreadable file, ValueError for one that is not JSON, and
    KeyError / TypeError for JSON without a "traceEvents" list, NoGPUKernels for a trace without GPU kernels."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    if not isinstance(events, list):
        raise TypeError('"traceEvents" is not a list')
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not kernels:
        raise NoGPUKernels(f"{path} holds no GPU kernels (a CPU run?): profile on the GPU")
    by_kind, by_name = defaultdict(float), defaultdict(lambda: [0.0, 0])
    for e in kernels:
        by_kind[kind_of(e["name"])] += e["dur"]
        by_name[e["name"]][0] += e["dur"]
        by_name[e["name"]][1] += 1
    busy = sum(by_kind.values())
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    lines = [f"{path}: {len(kernels)} kernels, GPU busy {busy / 1e3:.1f} ms of a {span / 1e3:.1f} ms span "
             f"({100 * busy / span:.1f}%; overlapping streams can exceed 100%)", "",
             "| kind | ms | share of busy |", "|---|---:|---:|"]
    for kind, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {t / 1e3:.1f} | {100 * t / busy:.1f}% |")
    lines += ["", f"top {top} kernels:", "| kernel | kind | calls | ms |", "|---|---|---:|---:|"]
    for name, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name[:90]} | {kind_of(name)} | {n} | {t / 1e3:.2f} |")
    return lines


if __name__ == "__main__":
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__.strip())
        sys.exit(0)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        print("\n".join(summarize(sys.argv[1])))
    except NoGPUKernels as e:
        sys.exit(f"error: {e}")
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError) as e:   # missing, not gzip, not a trace
        sys.exit(f"error: {sys.argv[1]} is not a readable profiler trace (train.py --profile=True writes "
                 f"out_dir/profile_trace.json.gz): {type(e).__name__}: {e}")
