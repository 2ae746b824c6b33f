"""Read the history a W&B offline run wrote, from its .wandb transaction log (LevelDB-style log
framing: 32 KiB blocks, 7-byte record headers of crc32, length, type; a 7-byte file header)."""
import glob
import os
import json
import struct

BLOCK = 32768


def read_records(path):
    from wandb.proto import wandb_internal_pb2
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, chunks = 7, []
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:                     # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left_in_block
            continue
        if pos + 7 + length > len(data):          # still being written, or cut by a kill: not a record yet
            break
        chunks.append(data[pos + 7:pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):                        # FULL or LAST: a whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(b"".join(chunks))
            chunks = []
            yield rec


def record_types(run_dir):
    """Count of each record type in the run's log (for failure messages)."""
    import collections
    (path,) = glob.glob(f"{run_dir}/**/offline-run-*/*.wandb", recursive=True)
    return collections.Counter(r.WhichOneof("record_type") for r in read_records(path))


def history(run_dir):
    """List of {key: value} dicts, one per wandb.log call, from the run under run_dir."""
    (path,) = glob.glob(f"{run_dir}/**/offline-run-*/*.wandb", recursive=True)
    rows = []
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({item.nested_key[0] if item.nested_key else item.key: json.loads(item.value_json)
                         for item in rec.history.item})
    return rows


def runs(run_dir):
    """[(run id, history)] of every offline run under run_dir, in the order they started."""
    paths = sorted(glob.glob(f"{run_dir}/**/offline-run-*/*.wandb", recursive=True))
    out = []
    for path in paths:
        run_id = os.path.basename(path)[len("run-"):-len(".wandb")]
        rows = [{item.nested_key[0] if item.nested_key else item.key: json.loads(item.value_json)
                 for item in rec.history.item}
                for rec in read_records(path) if rec.WhichOneof("record_type") == "history"]
        out.append((run_id, rows))
    return out
