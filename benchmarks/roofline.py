"""
A roofline of one training step: every GPU kernel of a profiled step, grouped by class, against its floor.

    TORCHINDUCTOR_BENCHMARK_KERNEL=1 python train.py --config config/fast.py --profile=True \
        --max_iters=8 --timing_warmup=5 --eval_tokens=0 --save_checkpoints=False --out_dir=out-roofline
    python benchmarks/roofline.py out-roofline [--json roofline.json] [--no-measure]

The first command writes out_dir/profile_trace.json.gz (one optimizer step, shapes recorded); the environment
variable makes Inductor note the bytes each of its Triton kernels must move (`kernel_num_gb`), which the trace
keeps. The presets as they run today, and their bf16 path (the same preset with --fp8=False --fp8_head=False:
just another profile), at 124M and 774M:

    export TORCHINDUCTOR_BENCHMARK_KERNEL=1 P="--profile=True --max_iters=8 --timing_warmup=5 --eval_tokens=0 \
        --save_checkpoints=False"
    python train.py --config config/fast.py $P --out_dir=out-roofline-124m                # FP8 blocks and head
    python train.py --config config/fast.py $P --fp8=False --fp8_head=False --out_dir=out-roofline-124m-bf16
    python train.py --config config/gpt2-large.py $P --out_dir=out-roofline-774m
    python train.py --config config/gpt2-large.py $P --fp8=False --fp8_head=False --out_dir=out-roofline-774m-bf16
    for d in out-roofline-*; do python benchmarks/roofline.py $d --json $d/roofline.json; done

It sums the kernels by class:

  GEMM            each (operation, shapes, layout, dtypes) of aten::mm / addmm / bmm / _scaled_mm on its own
                  row: the block GEMMs and the head's; floor = the best time of that shape measured alone in
                  this process (bf16 / fp32: the best of the four operand layouts; float8: its own layout, the
                  only one torch._scaled_mm takes). A second floor, the peak floor: its FLOPs at the rate of the
                  8192^3 matmul of its dtype measured here (float8: torch._scaled_mm in e4m3 with fast
                  accumulation, FP8's own peak; bf16: the bf16 matmul), which no shape of it could beat
  attention       forward and backward kernels (FlashAttention, FlexAttention); floor = their FLOPs (causal
                  attention over whole rows: the document mask removes some) at the bf16 matmul rate measured
                  here on 8192^3 (the exponentials' cost is not counted)
  FP8 cast        each kernel (Inductor's, or ATen's copy) that mixes float8 with a wider type: in training a
                  cast that writes float8 (only the GEMMs and the softmax pass read float8), an amax or a
                  transpose fused in or not
  FP8 transpose   each kernel whose tensors are all float8: a float8 -> float8 copy, the transposed operand
                  torch._scaled_mm needs (it takes K-major operands only); both FP8 kinds: floor = their bytes
                  (Inductor's count, or the copy's operands) at the copy bandwidth
  Triton          each other kernel Inductor generated (the name without its number), tagged: the head's
                  softmax pass (a logsumexp), fused elementwise (LayerNorm, GELU, residual adds, ...); floor =
                  its bytes (Inductor's count) at the bandwidth of a device-to-device copy measured here. With
                  head_kernel the softmax pass is our two kernels instead, one row (floor: 4 bytes per logit)
  optimizer       the fused AdamW kernels; floor = parameters, gradients and both moments read once, and all but the
                  gradients written once, at the copy bandwidth
  other           the rest (copies, memsets, ATen's elementwise kernels, our cast passes); floor = the bytes of
                  their operation's inputs, and of what it writes where the inputs tell (op_bytes: an in-place
                  op's first input read and written, our cast passes' two float8 copies), at the copy bandwidth
                  (a lower bound of what they move)

and prints a Markdown table sorted by milliseconds above the floor, per optimizer step: time, work, floor,
time / floor (and for GEMMs the peak floor and time / peak floor), then the totals by kind, and last the step with
each class at its floor or its time, whichever is less (at_floors), with and without attention at its floor: what
faster kernels doing the same work could give (a GEMM counts no faster than its shape alone, and fusing work across
classes is not priced). --no-measure (or no GPU) measures on the CPU instead, for the smoke test
(tests/test_roofline.py); its floors are then the CPU's.
"""
import argparse
import gzip
import json
import math
import os
import re
import sys
from collections import defaultdict

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_mm")
ATTENTION = re.compile(r"flash|fmha|flex_attention|FlashAttn|attention", re.IGNORECASE)
BACKWARD = re.compile(r"bwd|backward|Bwd", re.IGNORECASE)
OPTIMIZER = re.compile(r"adam|multi_tensor", re.IGNORECASE)
# the FP8 head's softmax pass in speedgpt/features/softmax_pass.py's kernels (head_kernel): its floor reads each bf16
# logit once and writes both float8 copies, 4 bytes per logit (the row statistics' own read is above the floor)
SOFTMAX_PASS_OP = "speedgpt::softmax_grad_fp8"
SOFTMAX_PASS = "the head's softmax pass (speedgpt/features/softmax_pass.py: row_stats + grad_fp8)"
GEMM_KERNEL = re.compile(r"gemm|cutlass|nvjet|cublas|xmma|wgmma", re.IGNORECASE)
ELEMENT_SIZE = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
                "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "bool": 1, "unsigned char": 1, "signed char": 1,
                "short int": 2}
TORCH_DTYPE = {"float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16",
               "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2"}


# -----------------------------------------------------------------------------
# reading the trace


def load_trace(path):
    """The trace's events (a list of dicts) from a Chrome trace .json or .json.gz written by torch.profiler."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    if not isinstance(events, list):
        raise TypeError('"traceEvents" is not a list')
    return events


def launching_ops(events):
    """{correlation id: the innermost CPU operation (event dict) around the launch of that GPU work}. A kernel
    carries the correlation id of its runtime launch call; the launch lies in time inside the operations of its
    thread, and the innermost of them (the latest to start) is the one that launched it (aten::mm, a Triton
    kernel's record, flash_attn_3::fwd, ...)."""
    ops_by_tid = defaultdict(list)
    launches = []
    for e in events:
        cat = e.get("cat")
        if cat in ("cpu_op", "user_annotation") and "dur" in e:
            ops_by_tid[e.get("tid")].append(e)
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches.append(e)
    for ops in ops_by_tid.values():
        ops.sort(key=lambda o: (o["ts"], -o["dur"]))
    found = {}
    by_tid = defaultdict(list)
    for e in launches:
        by_tid[e.get("tid")].append(e)
    for tid, ls in by_tid.items():
        ls.sort(key=lambda e: e["ts"])
        ops, stack, i = ops_by_tid.get(tid, []), [], 0
        for launch in ls:
            t = launch["ts"]
            while i < len(ops) and ops[i]["ts"] <= t:       # push every op that started before the launch
                while stack and stack[-1]["ts"] + stack[-1]["dur"] < ops[i]["ts"]:
                    stack.pop()
                stack.append(ops[i])
                i += 1
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < t:
                stack.pop()
            inner = next((o for o in reversed(stack) if o["ts"] <= t <= o["ts"] + o["dur"]), None)
            if inner is not None:
                found[launch["args"]["correlation"]] = inner
    return found


def external_ops(events):
    """{External id: CPU operation}: the profiler's own link from a kernel to an operation, used where no
    launch call was recorded."""
    return {e["args"]["External id"]: e for e in events
            if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}


def tensor_bytes(dims, dtype):
    """Bytes of one recorded tensor argument (dims a list of ints), 0 for scalars and unknown types."""
    if not isinstance(dims, list) or not dims or not all(isinstance(d, int) for d in dims):
        return 0
    return math.prod(dims) * ELEMENT_SIZE.get(dtype, 0)


def args_bytes(op, written=()):
    """Bytes of every tensor (and tensor list) among a recorded operation's inputs, those at the positions
    `written` counted twice (read and written). The profiler records no dtype for a tensor list: its tensors
    count as float32 (AdamW's parameters and states)."""
    args = op.get("args", {}) if op else {}
    total = 0
    for i, (dims, dtype) in enumerate(zip(args.get("Input Dims", []), args.get("Input type", []))):
        if dims and isinstance(dims[0], list):                      # a tensor list: e.g. AdamW's params
            n = sum(tensor_bytes(d, "float") for d in dims)
        else:
            n = tensor_bytes(dims, dtype)
        total += n * (2 if i in written else 1)
    return total


# our custom ops that write float8 copies of their first input (x8 and the transposed x8_t, one byte per element
# each), beside the row statistics of the LayerNorm's: their writes, which the recorded inputs do not show
CAST_OPS = {"speedgpt::cast_amax": 0, "speedgpt::norm_cast_amax": 8}     # bytes per row written besides the copies
# in place, but the first input only written (copies, fills, random fills), or only its indexed part touched (index and
# scatter ops): their inputs alone, as any other op
NOT_READ_IN_PLACE = re.compile(r"aten::(copy|fill|zero|normal|uniform|bernoulli|random|exponential|geometric|"
                               r"log_normal|cauchy|_?index\w*|scatter\w*|masked_scatter|put)_$")


def op_bytes(op):
    """Bytes an "other" operation moves, as far as its recorded inputs tell: the inputs read; an in-place ATen op
    (add_, mul_, ...: the name ends in _; not NOT_READ_IN_PLACE) writes its first input too; our cast passes write two
    float8 copies of their first input (and the LayerNorm's its row statistics)."""
    name = op.get("name", "") if op else ""
    if name in CAST_OPS:
        dims = op.get("args", {}).get("Input Dims", [[]])[0]
        rows, n = (math.prod(dims[:-1]), math.prod(dims)) if isinstance(dims, list) and dims and \
            all(isinstance(d, int) for d in dims) else (0, 0)
        return args_bytes(op) + 2 * n + CAST_OPS[name] * rows
    in_place = name.startswith("aten::") and name.endswith("_") and not NOT_READ_IN_PLACE.match(name)
    return args_bytes(op, written=(0,) if in_place else ())


def gemm_key(op):
    """(op name, ((dims, strides, dtype) of each matrix operand), concrete scalars) of a recorded GEMM."""
    args = op["args"]
    n = {"aten::addmm": 3}.get(op["name"], 2)
    first = 1 if op["name"] == "aten::addmm" else 0
    operands = tuple((tuple(d), tuple(s), t) for d, s, t in zip(args["Input Dims"][first:first + n],
                                                                 args["Input Strides"][first:first + n],
                                                                 args["Input type"][first:first + n]))[:2]
    extra = ()
    if op["name"] == "aten::_scaled_mm":      # (scale_a dims, scale_b dims, out_dtype, use_fast_accum)
        concrete = args.get("Concrete Inputs", []) + [""] * 8
        extra = (tuple(args["Input Dims"][2]), tuple(args["Input Dims"][3]), concrete[6], concrete[7])
    return op["name"], operands, extra


def gemm_flops(key):
    """2 M N K (times the batch for bmm)."""
    (a_dims, _, _), (b_dims, _, _) = key[1]
    batch = a_dims[0] if len(a_dims) == 3 else 1
    return 2 * batch * a_dims[-2] * a_dims[-1] * b_dims[-1]


def describe_gemm(key, vocab):
    """'head' or 'block' (an operand or the output has the padded vocabulary), shapes and dtype."""
    name, ((a, _, at), (b, _, bt)), _ = key
    dims = set(a) | set(b)
    where = "head" if vocab and vocab in dims else "block"
    dtype = TORCH_DTYPE.get(at, at) + ("" if at == bt else "/" + TORCH_DTYPE.get(bt, bt))
    return f"{where} GEMM {'x'.join(map(str, a))} @ {'x'.join(map(str, b))} {dtype}" + \
        (" (_scaled_mm)" if name == "aten::_scaled_mm" else "")


def fp8_kind(op):
    """'FP8 transpose' when every tensor (more than one element) among a recorded operation's inputs, or a Triton
    kernel's arguments, is float8, 'FP8 cast' when float8 is among them beside a wider type, else None. A float8 ->
    float8 kernel is the transposed copy torch._scaled_mm's operand needs; in training a kernel mixing float8 with
    a wider type writes the float8 (only the GEMMs and the softmax pass read it). Scales (one element) don't count."""
    args = op.get("args", {}) if op else {}
    types = {t for d, t in zip(args.get("Input Dims", []), args.get("Input type", []))
             if d and not isinstance(d[0], list) and math.prod(d) > 1}
    fp8 = {t for t in types if "Float8" in t}
    return None if not fp8 else "FP8 transpose" if fp8 == types else "FP8 cast"


def classify(events, vocab=None):
    """{class name: dict(kind, ms, calls, bytes, flops, gemm)} of the trace's GPU kernels (durations summed over
    the whole trace; bytes and flops of the work done)."""
    ops, by_external = launching_ops(events), external_ops(events)
    classes = {}

    def add(name, kind, dur_us, nbytes=0, flops=0, gemm=None):
        c = classes.setdefault(name, dict(kind=kind, ms=0.0, calls=0, bytes=0.0, flops=0.0, gemm=gemm))
        c["ms"] += dur_us / 1e3
        c["calls"] += 1
        c["bytes"] += nbytes
        c["flops"] += flops

    gemm_seen = set()
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset") or "dur" not in e:
            continue
        kargs = e.get("args", {})
        kname = e["name"]
        op = ops.get(kargs.get("correlation")) or by_external.get(kargs.get("External id"))
        oname = op["name"] if op else ""
        if oname in GEMM_OPS and "Input Strides" in op.get("args", {}):
            key = gemm_key(op)
            first = (key, op["ts"]) not in gemm_seen     # a GEMM may launch more than one kernel (split-K)
            gemm_seen.add((key, op["ts"]))
            add(describe_gemm(key, vocab), "GEMM", e["dur"], flops=gemm_flops(key) if first else 0, gemm=key)
        elif ATTENTION.search(kname) or ATTENTION.search(oname):
            add("attention " + ("backward" if BACKWARD.search(kname) or BACKWARD.search(oname) else "forward"),
                "attention", e["dur"])
        elif OPTIMIZER.search(kname) or OPTIMIZER.search(oname):
            add("optimizer (AdamW)", "optimizer", e["dur"], nbytes=0)
            classes["optimizer (AdamW)"]["op_bytes"] = classes["optimizer (AdamW)"].get("op_bytes", {})
            if op is not None:         # _fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, ...): grads only read
                classes["optimizer (AdamW)"]["op_bytes"][op["ts"]] = args_bytes(op, written=(0, 2, 3))
        elif oname == SOFTMAX_PASS_OP or kname in ("row_stats", "grad_fp8"):
            add(SOFTMAX_PASS, "Triton", e["dur"])
            per_op = classes[SOFTMAX_PASS].setdefault("op_bytes", {})
            if op is not None and op.get("args", {}).get("Input Dims"):   # logits (n, V): 4 bytes per logit
                per_op[op["ts"]] = 4 * math.prod(op["args"]["Input Dims"][0])
        elif kname.startswith("triton_") or oname.startswith("triton_"):
            name = re.sub(r"_\d+$", "", oname if oname.startswith("triton_") else kname)
            args = op.get("args", {}) if op else {}
            gb = args.get("kernel_num_gb")
            nbytes = float(gb) * 1e9 if gb is not None else args_bytes(op)
            kind = fp8_kind(op) or "Triton"
            tag = kind if kind != "Triton" else "Triton softmax pass" if "logsumexp" in name else \
                "Triton fused elementwise"
            add(f"{tag}: {name[:80]}", kind, e["dur"], nbytes=nbytes)
            classes[f"{tag}: {name[:80]}"]["bytes_counted"] = "Inductor" if gb is not None else "inputs"
        elif GEMM_KERNEL.search(kname):
            add("GEMM (shape not recorded)", "GEMM", e["dur"])
        else:
            kind = (fp8_kind(op) if e["cat"] == "kernel" else None) or "other"     # ATen's copies to float8 too
            nbytes = e.get("args", {}).get("bytes", 0) if e["cat"] != "kernel" else \
                args_bytes(op) if kind != "other" else op_bytes(op)
            add(f"{kind}: {(oname or kname)[:60]}", kind, e["dur"], nbytes=nbytes)
    for name in ("optimizer (AdamW)", SOFTMAX_PASS):  # per call, not per kernel: a call launches several
        if name in classes:
            classes[name]["bytes"] = sum(classes[name].pop("op_bytes", {}).values())
    return classes


def attention_flops(cfg, micro_batches):
    """(forward, backward) FLOPs of causal attention over whole rows for one optimizer step of config `cfg`:
    QK^T and PV are 2 T^2 hs per head each, halved by causality, so 2 T^2 C per layer and row forward; the
    backward is 2.5 times that (five matmuls against two). Source: FlashAttention-2 (Dao 2023), section 4.1."""
    fwd = 2 * cfg["block_size"] ** 2 * cfg["n_embd"] * cfg["n_layer"] * cfg["batch_size"] * micro_batches
    return fwd, 2.5 * fwd


# -----------------------------------------------------------------------------
# the floors, measured in this process


def timer(device):
    """A function ms(fn, iters) -> median milliseconds of fn() on `device` (CUDA events on a GPU)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from speedgpt.measure import cuda_time_ms
    return lambda fn, iters=20, warmup=3: cuda_time_ms(fn, warmup, iters, device)


def copy_bandwidth(device, ms, nbytes):
    """Bytes per second of a device-to-device copy of `nbytes` (read + written counted)."""
    import torch
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / (ms(lambda: dst.copy_(src)) / 1e3)


def matmul_rate(device, ms, n):
    """FLOP/s of an n x n x n matmul in bf16 (float32 on the CPU), random data."""
    import torch
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return 2 * n ** 3 / (ms(lambda: a @ b) / 1e3)


def fp8_matmul_rate(device, ms, n):
    """FLOP/s of an n x n x n torch._scaled_mm in float8 e4m3 (a row-major, b column-major, unit tensorwise scales,
    bf16 out, fast accumulation), random data: FP8's own peak here. None where torch._scaled_mm takes no float8 (a
    GPU below compute capability 8.9), with a note."""
    import torch
    a, b = (torch.randn(n, n, device=device).clamp(-4, 4).to(torch.float8_e4m3fn) for _ in range(2))
    one = torch.ones((), device=device)
    try:
        t = ms(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                        use_fast_accum=True))
    except RuntimeError as e:
        print(f"note: no float8 matmul here ({str(e).splitlines()[0]}): float8 GEMMs get no peak floor")
        return None
    return 2 * n ** 3 / (t / 1e3)


def gemm_floor_ms(key, device, ms):
    """Best milliseconds of the recorded GEMM alone on `device`: bf16 / fp32 the best over the four operand
    layouts (transposed or not), float8 in the layout recorded (the one torch._scaled_mm takes). Random data."""
    import torch
    name, ((a_dims, a_strides, at), (b_dims, b_strides, bt)), extra = key
    dt = lambda t: getattr(torch, TORCH_DTYPE.get(t, "float32"))

    def make(dims, dtype, layout):          # random values in float8's range, row- or column-major
        x = torch.randn(*dims, device=device).clamp(-4, 4).to(dtype)
        return x if layout == "row" else x.mT.contiguous().mT
    if name == "aten::_scaled_mm":
        a, b = make(a_dims, dt(at), "row"), make(b_dims, dt(bt), "column")
        sa_dims, sb_dims, out_dtype, fast = extra
        sa, sb = torch.ones(sa_dims, device=device), torch.ones(sb_dims, device=device)
        out = torch.float32 if out_dtype == "6" else torch.bfloat16         # ScalarType 6 = Float, 15 = BFloat16
        return ms(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out, use_fast_accum=fast == "True"))
    best = math.inf
    for la in ("row", "column"):
        for lb in ("row", "column"):
            a, b = make(a_dims, dt(at), la), make(b_dims, dt(bt), lb)
            fn = (lambda: torch.bmm(a, b)) if name == "aten::bmm" else (lambda: torch.mm(a, b))
            best = min(best, ms(fn))
    return best


# -----------------------------------------------------------------------------
# the table


def roofline(classes, steps, bandwidth, rate, gemm_ms, attn_flops, fp8_rate=None):
    """Rows (dicts) per class, per optimizer step: ms, work, floor_ms, ratio, above_ms, and for GEMMs peak_floor_ms
    and peak_ratio; sorted by above_ms. bandwidth in B/s, rate (bf16 matmul) and fp8_rate (e4m3 _scaled_mm, or
    None) in FLOP/s, gemm_ms {gemm key: floor ms of one call}, attn_flops (fwd, bwd) of one step or None."""
    rows = []
    for name, c in classes.items():
        t = c["ms"] / steps
        floor, work, peak = None, "", None
        if c["kind"] == "GEMM" and c["gemm"] is not None:
            peak = fp8_rate if "Float8" in c["gemm"][1][0][2] else rate         # the dtype of operand a
            peak = c["flops"] / steps / peak * 1e3 if peak else None
            work = f"{c['flops'] / steps / 1e12:.2f} TFLOP"
        if c["kind"] == "GEMM" and c["gemm"] is not None and c["gemm"] in gemm_ms:
            n_calls = c["flops"] / gemm_flops(c["gemm"])
            floor = gemm_ms[c["gemm"]] * n_calls / steps
        elif c["kind"] == "attention" and attn_flops:
            f = attn_flops[1 if name.endswith("backward") else 0]
            floor, work = f / rate * 1e3, f"{f / 1e12:.2f} TFLOP (causal rows)"
        elif c["bytes"]:
            floor = c["bytes"] / steps / bandwidth * 1e3
            work = f"{c['bytes'] / steps / 1e9:.2f} GB" + {"inputs": " (inputs)", "parameters": " (from the parameter "
                                                             "count)"}.get(c.get("bytes_counted"), "")
        rows.append(dict(name=name, kind=c["kind"], calls=c["calls"] // steps if c["calls"] >= steps else c["calls"],
                         ms=t, work=work, floor_ms=floor, ratio=t / floor if floor else None,
                         above_ms=t - floor if floor is not None else t, peak_floor_ms=peak,
                         peak_ratio=t / peak if peak else None))
    return sorted(rows, key=lambda r: -r["above_ms"])


def table(rows, top):
    """Markdown lines of the first `top` rows, then the totals by kind."""
    out = ["| class | calls | ms | work | floor ms | time / floor | ms above floor | peak floor ms | "
           "time / peak floor |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows[:top]:
        floor = f"{r['floor_ms']:.2f}" if r["floor_ms"] is not None else "n/a"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "n/a"
        peak = f"{r['peak_floor_ms']:.2f} | {r['peak_ratio']:.2f}x" if r.get("peak_floor_ms") else " |"
        out.append(f"| {r['name']} | {r['calls']} | {r['ms']:.2f} | {r['work']} | {floor} | {ratio} | "
                   f"{r['above_ms']:.2f} | {peak} |")
    if len(rows) > top:
        rest = rows[top:]
        out.append(f"| {len(rest)} more classes | | {sum(r['ms'] for r in rest):.2f} | | "
                   f"{sum(r['floor_ms'] or 0 for r in rest):.2f} | | {sum(r['above_ms'] for r in rest):.2f} | | |")
    out += ["", "| kind | ms | floor ms | time / floor |", "|---|---:|---:|---:|"]
    for kind in sorted({r["kind"] for r in rows}, key=lambda k: -sum(r["ms"] for r in rows if r["kind"] == k)):
        t = sum(r["ms"] for r in rows if r["kind"] == kind)
        f = sum(r["floor_ms"] or 0 for r in rows if r["kind"] == kind)
        out.append(f"| {kind} | {t:.2f} | {f:.2f} | {t / f:.2f}x |" if f else f"| {kind} | {t:.2f} | n/a | n/a |")
    t, f = sum(r["ms"] for r in rows), sum(r["floor_ms"] or 0 for r in rows)
    out.append(f"| all | {t:.2f} | {f:.2f} | {t / f:.2f}x |" if f else f"| all | {t:.2f} | n/a | n/a |")
    best, kept = at_floors(rows), at_floors(rows, kept=("attention",))
    if best > 0:
        out += ["", f"Every class at its floor (none slower than it ran): {best:.2f} ms, the step {t / best:.3f}x as "
                f"fast; every class but attention, attention as it ran: {kept:.2f} ms, {t / kept:.3f}x."]
    return out


def at_floors(rows, kept=()):
    """ms of the step with each class at its floor or its time, whichever is less (a class without a floor, or of a
    kind in `kept`, as it ran): what faster kernels doing the same work in the other classes could give at most (a
    GEMM no faster than its shape alone; work fused across classes is not priced)."""
    return sum(r["ms"] if r["floor_ms"] is None or r["kind"] in kept else min(r["ms"], r["floor_ms"]) for r in rows)


def positive(text):
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: a positive integer")
    return value


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from configurator import FlagParser          # every refusal one line, as the project's other scripts
    p = FlagParser(prog="benchmarks/roofline.py", description=__doc__.split("\n\n")[0],
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", help="a train.py out_dir holding profile_trace.json.gz and config.json")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--top", type=positive, default=25, help="rows to print (the rest summed in one)")
    p.add_argument("--no-measure", action="store_true", help="measure the floors on the CPU (for the smoke test: "
                   "small sizes unless given)")
    p.add_argument("--copy-mb", type=positive, help="size of the copy that measures the bandwidth (2048; 8 with "
                   "--no-measure)")
    p.add_argument("--matmul-n", type=positive, help="n of the n^3 bf16 and e4m3 matmuls that measure the rates "
                   "(8192; 64 with --no-measure)")
    args = p.parse_args(argv)
    args.copy_mb = args.copy_mb or (8 if args.no_measure else 2048)
    args.matmul_n = args.matmul_n or (64 if args.no_measure else 8192)
    if not os.path.isdir(args.out_dir):
        what = "a file, not a folder" if os.path.isfile(args.out_dir) else "no folder"
        sys.exit(f"error: {what}: {args.out_dir}: give the out_dir of a train.py run with --profile=True (see this "
                 "script's header)")
    if args.json and (os.path.isdir(args.json) or not os.path.isdir(os.path.dirname(os.path.abspath(args.json)))):
        sys.exit(f"error: --json {args.json}: " + ("a folder, not a file" if os.path.isdir(args.json) else
                                                   "its folder does not exist") + "; give a file name to write")
    trace, cfg_path = (os.path.join(args.out_dir, f) for f in ("profile_trace.json.gz", "config.json"))
    for f in (trace, cfg_path):
        if not os.path.isfile(f):
            sys.exit(f"error: {f} is missing: run train.py with --profile=True and --out_dir={args.out_dir} first "
                     "(see this script's header)")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
        keys = ("batch_size", "block_size", "n_layer", "n_embd")
        missing = [k for k in keys if k not in cfg]
        wrong = [f"{k}={cfg[k]!r}" for k in keys if k in cfg and not (type(cfg[k]) is int and cfg[k] > 0)]
        if not isinstance(cfg.get("total_batch_size", 0), int):
            wrong.append(f"total_batch_size={cfg['total_batch_size']!r}")
        problem = f"no {', '.join(missing)}" if missing else f"{', '.join(wrong)}, not a positive integer" \
            if wrong else None
    except (ValueError, TypeError) as e:                    # not JSON, or JSON but not an object
        problem = f"{type(e).__name__}: {e}"
    if problem:
        sys.exit(f"error: {cfg_path} is not a train.py config ({problem}): profile again with train.py --profile=True")
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() and not args.no_measure else "cpu")
    ms = timer(device)
    try:
        events = load_trace(trace)
    except (OSError, EOFError, ValueError, KeyError, TypeError) as e:   # not gzip, cut short, not a trace
        sys.exit(f"error: {trace} is not a torch.profiler trace ({type(e).__name__}: {e}): profile again with "
                 "train.py --profile=True")
    vocab, meta = 50304, os.path.join(cfg.get("data_dir", ""), "meta.json")   # GPT-2's padded vocabulary
    if os.path.isfile(meta):
        with open(meta) as f:
            vocab = -(-json.load(f)["vocab_size"] // 64) * 64
    classes = classify(events, vocab)
    if not classes:
        sys.exit(f"error: {trace} holds no GPU kernels (a CPU run?): profile on the GPU")
    tokens = cfg["batch_size"] * cfg["block_size"]
    micro = max(1, cfg.get("total_batch_size", 0) // tokens) if cfg.get("total_batch_size") else 1
    bandwidth = copy_bandwidth(device, ms, args.copy_mb << 20)
    rate = matmul_rate(device, ms, args.matmul_n)
    fp8_rate = fp8_matmul_rate(device, ms, args.matmul_n)
    gemm_ms = {}
    for c in classes.values():
        if c["gemm"] is not None and c["gemm"] not in gemm_ms:
            try:
                gemm_ms[c["gemm"]] = gemm_floor_ms(c["gemm"], device, ms)
            except (RuntimeError, TypeError, ValueError) as e:
                print(f"note: {describe_gemm(c['gemm'], vocab)} not timed alone: {str(e).splitlines()[0]}")
    opt = classes.get("optimizer (AdamW)")
    C, L = cfg["n_embd"], cfg["n_layer"]
    params = 12 * L * C * C + 13 * L * C + vocab * C + cfg["block_size"] * C + C         # GPT (bias=False)
    if opt is not None and cfg.get("optimizer", "adamw") == "adamw" and opt["bytes"] < 28 * params:
        # its calls recorded without (all) their tensors' shapes: every parameter is AdamW's, in float32,
        # so the parameters and both moments are read and written and the gradients read once
        opt["bytes"], opt["bytes_counted"] = 28 * params, "parameters"
    rows = roofline(classes, 1, bandwidth, rate, gemm_ms, attention_flops(cfg, micro), fp8_rate)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    fp8 = f"{fp8_rate / 1e12:.0f} TFLOP/s" if fp8_rate else "n/a"
    print(f"{trace}: one optimizer step of {micro} micro-batch(es) of {cfg['batch_size']} x {cfg['block_size']}, "
          f"{cfg['n_layer']} layers x {cfg['n_embd']}; {name}: copy {bandwidth / 1e12:.2f} TB/s (read + write), "
          f"bf16 matmul {rate / 1e12:.0f} TFLOP/s, e4m3 _scaled_mm {fp8} ({args.matmul_n}^3), "
          f"torch {torch.__version__}\n")
    print("\n".join(table(rows, args.top)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(trace=trace, device=name, copy_bytes_per_s=bandwidth, matmul_flop_per_s=rate,
                           fp8_matmul_flop_per_s=fp8_rate, micro_batches=micro, rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
