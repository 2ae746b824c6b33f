"""
Data preparation at corpus scale, on the CPU: the streaming data.py against the one before it
(`git show efb5d1b:data.py`, which reads every document into a list first), then the loader's
start-up on 100 shards, then a few training steps on the prepared parquet corpus.

    python benchmarks/data_prep.py --workdir /tmp/dp_bench --gb 0.5 2     # ~40 min on 2 busy cores
    python benchmarks/data_prep.py --workdir /tmp/dp_bench --only startup

Needs psutil (memory polling; pip install psutil), pyarrow, git, and the GPT-2 tokenizer files
(offline: TIKTOKEN_CACHE_DIR). Prints a markdown report; the corpora and shards under --workdir
are deleted at the end unless --keep. Steps:
 1. corpora of --gb GB of text: this Python's stdlib sources (and --stories, if given), copied over and over,
    each copy with its documents shuffled and a first line "# copy N", as .jsonl and as .parquet
    (row groups of 1,000 documents);
 2. before each preparation, one process's tiktoken GPT-2 rate on 32 MB of that text (tokens per
    second of wall time and of CPU time): the unit of the throughput target;
 3. each preparation in a fresh process, polled every 0.2 s: wall time, tokens/s, peak memory of the
    whole process tree (the sum of PSS, which counts pages shared after fork once; and the largest
    single RSS), the processes seen, the tree's CPU seconds, and the whole machine's CPU seconds
    (the rest is what other users ran meanwhile);
 4. Loader start-up (construction and first batch, in a fresh process) on 100 shards of 100M tokens
    with 100k documents each (10B tokens, like FineWeb-10B): sparse files with real headers and
    indexes, so nothing but the start-up is measured; the old loader too;
 5. config/fast.py's model, tiny, for 5 CPU steps on the prepared parquet corpus.
"""
import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from speedgpt import corpus  # noqa: E402
import data    # noqa: E402


def make_corpus(workdir, gb, stories):
    """Write corpus_{gb}gb.jsonl and .parquet of about gb * 1e9 bytes of text; return their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    texts = [d.text for d in corpus.iter_texts(None) if d.text] + \
        ([d.text for d in corpus.iter_texts(stories)] if stories else [])
    stem = os.path.join(workdir, f"corpus_{gb:g}gb")
    writer = pq.ParquetWriter(stem + ".parquet", pa.schema([("text", pa.string())]))
    written, copy, batch = 0, 0, []
    with open(stem + ".jsonl", "w") as f:
        while written < gb * 1e9:
            order = list(range(len(texts)))
            random.Random(copy).shuffle(order)
            for i in order:
                text = f"# copy {copy}\n{texts[i]}"
                f.write(json.dumps({"text": text}) + "\n")
                batch.append(text)
                written += len(text.encode())
                if len(batch) == 1000:
                    writer.write_table(pa.table({"text": batch}))
                    batch = []
                if written >= gb * 1e9:
                    break
            copy += 1
    if batch:
        writer.write_table(pa.table({"text": batch}))
    writer.close()
    return stem + ".jsonl", stem + ".parquet"


def tiktoken_rate(jsonl, mb=32):
    """One process's GPT-2 tokens per second (wall, CPU) on the first `mb` MB of documents."""
    enc = data.get_tokenizer("gpt2").enc
    texts, size = [], 0
    for _, text, _ in corpus.iter_texts(jsonl):
        texts.append(text)
        size += len(text)
        if size >= mb * 1e6:
            break
    wall, cpu = time.perf_counter(), time.process_time()
    n = sum(len(enc.encode_ordinary(t)) for t in texts)
    return n / (time.perf_counter() - wall), n / (time.process_time() - cpu)


def reader_rate(path, mb=256):
    """MB/s of text that corpus.iter_texts alone delivers from `path` (one process, no tokenizer): the
    rate at which the preparing process can feed its workers."""
    start, size = time.perf_counter(), 0
    for _, text, _ in corpus.iter_texts(path):
        size += len(text)
        if size >= mb * 1e6:
            break
    return size / 1e6 / (time.perf_counter() - start)


def run_monitored(cmd, log):
    """Run cmd; return wall seconds, peak PSS sum and largest RSS (bytes) of its process tree, most
    processes seen at once, CPU seconds of the tree, CPU seconds of the whole machine meanwhile."""
    import psutil
    r0, m0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), psutil.cpu_times(), time.perf_counter()
    with open(log, "w") as out:
        proc = psutil.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        peak_pss = peak_rss = most = 0
        while proc.poll() is None:
            pss = 0
            tree = [proc] + proc.children(recursive=True)
            for p in tree:
                try:
                    m = p.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                pss, peak_rss = pss + m.pss, max(peak_rss, m.rss)
            peak_pss, most = max(peak_pss, pss), max(most, len(tree))
            time.sleep(0.2)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: see {log}")
    r1, m1 = resource.getrusage(resource.RUSAGE_CHILDREN), psutil.cpu_times()
    tree_cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    machine_cpu = sum(getattr(m1, k) - getattr(m0, k) for k in ("user", "system", "nice", "irq", "softirq", "steal"))
    return wall, peak_pss, peak_rss, most, tree_cpu, machine_cpu


def prep_row(name, cmd, out, workdir, workers, jsonl):
    rate_wall, rate_cpu = tiktoken_rate(jsonl)
    load = os.getloadavg()[0]
    wall, pss, rss, most, tree_cpu, machine_cpu = run_monitored(cmd, os.path.join(workdir, name + ".log"))
    meta = json.load(open(os.path.join(out, "meta.json")))
    tokens = meta["train_tokens"] + meta["val_tokens"]
    return (f"| {name} | {tokens / 1e6:,.0f}M | {wall:,.0f} s | {tokens / wall / 1e6:.2f}M | "
            f"{tokens / wall / (workers * rate_wall):.2f} | {tokens / tree_cpu / rate_cpu:.2f} | "
            f"{pss / 2**30:.2f} GiB | {rss / 2**30:.2f} GiB | {most} | {tree_cpu / wall:.2f} | "
            f"{(machine_cpu - tree_cpu) / wall:.2f} | {rate_wall / 1e6:.2f}M | {load:.1f} |")


def startup_rows(workdir, old_data):
    """Loader start-up on 100 sparse shards of 100M tokens (10B tokens, 10M documents)."""
    import numpy as np
    folder = os.path.join(workdir, "startup")
    os.makedirs(folder, exist_ok=True)
    names = {"train": [f"train_{i:06d}.bin" for i in range(100)], "val": ["val_000000.bin"]}
    for split, files in names.items():
        for name in files:
            path = os.path.join(folder, name)
            header = np.zeros(data.HEADER_INTS, dtype=np.int32)
            header[:3] = data.MAGIC, 1, 100_000_000
            with open(path, "wb") as f:
                f.write(header.tobytes())
                f.truncate(data.HEADER_BYTES + 2 * 100_000_000)     # sparse: no disk, reads as zeros
            data.write_index(path, 100_000_000, 50255, np.arange(0, 100_000_000, 1000), 50256)
    json.dump({"tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256, "format": data.FORMAT, "shards": names},
              open(os.path.join(folder, "meta.json"), "w"))
    rows = []
    for which, module in (("new", ROOT), ("old", os.path.dirname(old_data))):
        for packing in (True, False):
            code = (f"import sys, time; sys.path.insert(0, {module!r}); "
                    f"import {'data' if which == 'new' else 'old_data'} as d; "
                    f"t = time.perf_counter(); l = d.Loader({folder!r}, 'train', 16, 1024, packing={packing}); "
                    f"a = time.perf_counter(); next(l); print(a - t, time.perf_counter() - t)")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout.split()
            rows.append(f"| {which} | {packing} | {float(out[0]):.2f} s | {float(out[1]):.2f} s |")
    shutil.rmtree(folder)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/dp_bench")
    p.add_argument("--gb", type=float, nargs="+", default=[0.5, 2.0], help="corpus sizes; the last one also as parquet")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--old_max_gb", type=float, default=0.5, help="run the old preparation on corpora up to this "
                   "size only: it holds the whole corpus in memory (~4.7 GiB per GB of text)")
    p.add_argument("--stories", default="", help="a .jsonl of varied-length documents mixed into the corpora "
                   "(optional; without it, the stdlib sources alone)")
    p.add_argument("--only", choices=["prep", "startup", "train"], nargs="+", default=["prep", "startup", "train"])
    p.add_argument("--keep", action="store_true", help="keep the corpora and shards under --workdir")
    args = p.parse_args()
    try:
        import psutil  # noqa: F401
    except ImportError:
        raise SystemExit("benchmarks/data_prep.py needs psutil: pip install psutil")
    os.makedirs(args.workdir, exist_ok=True)
    old_data = os.path.join(args.workdir, "old", "old_data.py")
    os.makedirs(os.path.dirname(old_data), exist_ok=True)
    with open(old_data, "w") as f:
        f.write(subprocess.run(["git", "show", "efb5d1b:data.py"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout)
    report = [f"CPU: {os.cpu_count()} cores; {args.workers} workers; {time.strftime('%Y-%m-%d %H:%M')}", ""]
    parquet_out = os.path.join(args.workdir, "shards_parquet")
    readers = []
    if "prep" in args.only:
        report += ["| run | tokens | wall | tokens/s | / (workers x 1-process rate) | tokens per CPU-s / 1-process's | "
                   "peak memory (PSS, tree) | largest RSS | processes | our CPUs busy | others' CPUs busy | "
                   "1-process rate | load before |",
                   "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for gb in args.gb:
            jsonl, parquet = make_corpus(args.workdir, gb, args.stories)
            common = ["--tokenizer", "gpt2", "--workers", str(args.workers)]
            readers.append(f"| {gb:g} GB | {reader_rate(jsonl):.0f} | {reader_rate(parquet):.0f} |")
            runs = [(f"new jsonl {gb:g} GB", [sys.executable, "data.py", "--input", jsonl,
                                              "--out", os.path.join(args.workdir, "s"), *common])]
            if gb <= args.old_max_gb:
                runs.append((f"old jsonl {gb:g} GB", [sys.executable, old_data, "--input", jsonl,
                                                      "--out", os.path.join(args.workdir, "s"), *common]))
            if gb == args.gb[-1]:
                runs.append((f"new parquet {gb:g} GB", [sys.executable, "data.py", "--input", parquet,
                                                        "--out", parquet_out, *common]))
            for name, cmd in runs:
                out = cmd[cmd.index("--out") + 1]
                report.append(prep_row(name, cmd, out, args.workdir, args.workers, jsonl))
                print(report[-1], flush=True)
                if out != parquet_out:
                    shutil.rmtree(out)
            os.remove(jsonl)
            os.remove(parquet)
        report += ["", "| corpus | reader alone, jsonl (MB/s of text) | parquet |", "|---|---:|---:|", *readers]
    if "startup" in args.only:
        report += ["", "| loader | packing | construction | + first batch (16 x 1024) |", "|---|---|---:|---:|"]
        report += startup_rows(args.workdir, old_data)
        print("\n".join(report[-4:]), flush=True)
    if "train" in args.only and os.path.isdir(parquet_out):
        cmd = [sys.executable, "train.py", "--config", "config/fast.py", "--fp8=False", "--fp8_head=False",
               "--n_layer=2", "--n_embd=64", "--n_head=2", "--block_size=128", "--batch_size=4", "--total_batch_size=0",
               "--compile=False", "--attention=sdpa", "--dtype=float32", "--max_iters=5", "--eval_tokens=512",
               f"--data_dir={parquet_out}", f"--out_dir={os.path.join(args.workdir, 'train_out')}"]
        log = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        lines = [l for l in log.stdout.splitlines() if l.startswith(("step", "median", "note", "error"))]
        report += ["", "```", "$ " + " ".join(cmd[1:]), *lines, *log.stderr.splitlines()[-3:], "```"]
    print("\n".join(report))
    if not args.keep:
        shutil.rmtree(args.workdir)


if __name__ == "__main__":
    main()
