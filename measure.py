"""
What train.py measures with: the peak-FLOPs table and MFU, the device sync before each clock reading,
and the profiler output. Tokens/s itself is counted in train.py's loop (real tokens only).
"""
import os

import torch

PEAK_FLOPS = {   # dense FLOP/s by device-name substring (first match wins) and precision; NVIDIA datasheets
    "H100 PCIe": dict(bf16=756e12, tf32=378e12, fp32=51e12),
    "H100 NVL": dict(bf16=835e12, tf32=418e12, fp32=60e12),
    "H100": dict(bf16=989e12, tf32=494.5e12, fp32=67e12),   # SXM
    "H200": dict(bf16=989e12, tf32=494.5e12, fp32=67e12),   # SXM; same chip as the H100 SXM
    "GH200": dict(bf16=989e12, tf32=494.5e12, fp32=67e12),
    "A100": dict(bf16=312e12, tf32=156e12, fp32=19.5e12),
    "L40S": dict(bf16=362e12, tf32=183e12, fp32=91.6e12),
    "L4": dict(bf16=121e12, tf32=60e12, fp32=30.3e12),
    "RTX 4090": dict(bf16=165e12, tf32=82.6e12, fp32=82.6e12),
}


def peak_flops_for(device, cfg):
    """Peak dense FLOP/s of `device` at the run's precision (bf16 for bfloat16/float16 and for FP8,
    whose MFU is reported against the bf16 peak; tf32 or fp32 for float32), or cfg.peak_flops when
    set. None when unknown (a CPU, or a GPU missing from PEAK_FLOPS)."""
    if cfg.peak_flops > 0:
        return cfg.peak_flops
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    precision = "bf16" if cfg.dtype != "float32" else ("tf32" if cfg.tf32 else "fp32")
    for key, table in PEAK_FLOPS.items():
        if key in name:
            return table[precision]
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"warning: no peak FLOP/s known for {name!r}; MFU is null (set --peak_flops=...)", flush=True)
    return None


def mfu(flops_per_token, tokens_per_sec, peak):
    """Model FLOPs utilisation: flops_per_token * tokens_per_sec / peak (PaLM, Chowdhery et al. 2022,
    Appendix B). Counts real tokens only; recomputation is not counted. None without a peak."""
    return None if not peak else flops_per_token * tokens_per_sec / peak


def sync(device):
    """Wait for the GPU's queued work: before every reading of the clock (CUDA calls are asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def write_profile(prof, device, out_dir):
    """Stop torch.profiler `prof` and write out_dir/profile.txt (ops by self GPU time, or CPU time on
    the CPU) and out_dir/profile_trace.json.gz (Chrome trace: chrome://tracing or ui.perfetto.dev;
    benchmarks/profile_summary.py sums its GPU kernels by kind)."""
    sync(device)
    prof.stop()
    if int(os.environ.get("RANK", 0)) == 0:
        key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        with open(os.path.join(out_dir, "profile.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by=key, row_limit=60))
        prof.export_chrome_trace(os.path.join(out_dir, "profile_trace.json.gz"))
        print(f"profile of one step written to {out_dir}/profile.txt and profile_trace.json.gz", flush=True)
