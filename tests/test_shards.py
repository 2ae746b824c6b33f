"""speedgpt/shards.py on the CPU: the shard format (uint16 and uint32 tokens; llm.c's fineweb shards load as they
are), corrupt or missing shards, meta.json (older, incomplete, corrupt), the hints for a data folder that is not
one, and a preparation that replaces its folder whole or leaves it as it was."""
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import data
import train
from conftest import ROOT, _folder_state, _foreign_shards, _write_jsonl, tiny_args


def test_uint32_shards_never_wrap(tmp_path):
    small, big = np.array([0, 65535, 7]), np.array([0, 65536, 70000, 2**31])
    data.write_shard(str(tmp_path / "train_000000.bin"), small)
    data.write_shard(str(tmp_path / "train_000001.bin"), big)
    assert data.read_header(str(tmp_path / "train_000000.bin")) == (3, np.uint16)
    assert data.read_header(str(tmp_path / "train_000001.bin")) == (4, np.uint32)
    assert np.array_equal(data.read_shard(str(tmp_path / "train_000001.bin")), big)
    assert np.array_equal(data.read_shard(str(tmp_path / "train_000000.bin")), small)


def test_corrupt_and_missing_shards(tmp_path):
    good = str(tmp_path / "train_000000.bin")
    data.write_shard(good, np.arange(100))
    raw = open(good, "rb").read()
    cases = {"truncated": raw[:-10], "header": raw[:100], "magic": b"\0" * 4 + raw[4:],
             "version": raw[:4] + np.int32(9).tobytes() + raw[8:]}
    for name, content in cases.items():
        path = str(tmp_path / f"{name}_train_000000.bin")
        open(path, "wb").write(content)
        with pytest.raises(ValueError, match=path.replace(".", r"\.")):
            data.read_header(path)
    with pytest.raises(ValueError, match="truncated"):
        data.read_header(str(tmp_path / "truncated_train_000000.bin"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.find_shards(str(tmp_path / "nowhere"), "train")
    with pytest.raises(FileNotFoundError, match=r"--out .*shakespeare_gpt2 --tokenizer gpt2`"):   # the name says it
        data.find_shards(str(tmp_path / "shakespeare_gpt2"), "train")
    with pytest.raises(FileNotFoundError, match="no val"):
        data.find_shards(str(tmp_path), "val")
    with pytest.raises(FileNotFoundError):
        data.prepare(str(tmp_path / "missing_input"), str(tmp_path / "o"), "byte")


def test_older_or_incomplete_meta_json_is_refused(byte_data, tmp_path):
    import shutil
    folder = tmp_path / "d"
    shutil.copytree(byte_data, folder)
    meta = json.load(open(folder / "meta.json"))
    json.dump({**meta, "format": 1}, open(folder / "meta.json", "w"))
    with pytest.raises(ValueError, match=f"format 1 .* older data.py.*python data.py --input {meta['input']} "
                                         f"--out {folder} --tokenizer byte"):
        data.Loader(str(folder), "train", 2, 16)
    json.dump({**meta, "shards": {"train": [], "val": []}}, open(folder / "meta.json", "w"))
    with pytest.raises(ValueError, match="does not list the shards in the folder .*train_000000.bin"):
        data.load_meta(folder)
    json.dump(meta, open(folder / "meta.json", "w"))
    shutil.copy(folder / "train_000000.bin", folder / "fineweb_train_000001.bin")     # a foreign shard mixed in
    with pytest.raises(ValueError, match="does not list the shards in the folder .*fineweb_train_000001.bin"):
        data.Loader(str(folder), "train", 2, 16)
    os.remove(folder / "fineweb_train_000001.bin")
    os.remove(folder / "train_000000.idx.npz")
    with pytest.raises(ValueError, match="train_000000.bin has no index"):
        data.Loader(str(folder), "train", 2, 16)


def test_corrupt_meta_json(byte_data, tmp_path):
    import shutil
    data_dir = tmp_path / "d"
    shutil.copytree(byte_data, data_dir)
    (data_dir / "meta.json").write_text("{'tokenizer': 'byte'")
    with pytest.raises(ValueError, match="meta.json is not valid JSON"):
        train.main(tiny_args(data_dir, tmp_path / "o"))
    (data_dir / "meta.json").write_text('{"tokenizer": "byte", "vocab_size": 257}')
    with pytest.raises(ValueError, match="meta.json lacks eot_id"):
        train.main(tiny_args(data_dir, tmp_path / "o"))


def test_llmc_fineweb_shard_loads_as_is(tmp_path):
    toks = np.random.default_rng(0).integers(0, 50256, size=5000)
    toks[::97] = 50256
    _foreign_shards(tmp_path, toks)
    loader = data.Loader(str(tmp_path), "train", batch_size=3, block_size=32, seed=0)
    assert (tmp_path / "fineweb_train_000000.idx.npz").exists()      # indexed on first use, saved beside
    b = next(loader)
    assert loader.eot == 50256 and b.x.shape == (3, 32) and b.x.dtype == torch.int64 and b.n_valid == 3 * 32
    for row_x, row_y, ids in zip(b.x.numpy(), b.y.numpy(), b.doc_ids.numpy()):
        start = next(i for i in range(0, len(toks) - 32, 32) if np.array_equal(toks[i:i + 32], row_x))
        assert np.array_equal(toks[start + 1:start + 33], row_y)
        assert np.array_equal(ids, np.cumsum(row_x == 50256) - (row_x[0] == 50256))   # a BOS opens a document
    padded = data.Loader(str(tmp_path), "train", batch_size=4, block_size=256, seed=0, packing=False)
    assert padded.n_rows == len(np.flatnonzero(toks == 50256)) + (toks[0] != 50256)   # one piece per document


def test_data_dir_given_a_corpus_file_suggests_a_command_that_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "corpus.jsonl", [f"story {i} " * 30 for i in range(50)])
    with pytest.raises(FileNotFoundError) as e:
        data.Loader("corpus.jsonl", "train", 2, 16)
    command, data_dir = str(e.value).split("`")[1], str(e.value).rsplit("--data_dir=", 1)[1]
    assert command.startswith("python data.py ")
    subprocess.run([sys.executable, os.path.join(ROOT, "data.py"), *command.split()[2:]], check=True,
                   capture_output=True)
    assert next(data.Loader(data_dir, "train", 2, 16)).x.shape == (2, 16)
    data.write_shard(str(tmp_path / "train_000000.bin"), np.arange(10))
    with pytest.raises(FileNotFoundError, match=r"pass the folder that holds this shard: --data_dir=\."):
        data.find_shards("train_000000.bin", "train")


def test_data_dir_given_the_folder_above_prepared_data_names_them(tmp_path, monkeypatch):
    """--data_dir=data, which holds prepared folders (data.py's meta.json in each): the line names them to pass,
    not a data.py command that would tokenize them again; the named folder trains."""
    monkeypatch.chdir(tmp_path)
    for name in ("b_tokens", "a_tokens"):
        os.makedirs(os.path.join("data", name))
        data.write_shard(os.path.join("data", name, "train_000000.bin"), np.arange(100) % 7)
        (tmp_path / "data" / name / "meta.json").write_text('{"vocab_size": 7}')
    (tmp_path / "data" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"^data folder 'data' holds no shards but prepared data folders of "
                                                r"its own: pass one, --data_dir=data/a_tokens or data/b_tokens$"):
        data.find_shards("data", "train")
    assert data.find_shards("data/a_tokens", "train") == ["data/a_tokens/train_000000.bin"]


def test_data_dir_given_a_folder_of_text_suggests_preparing_it_elsewhere(tmp_path, monkeypatch):
    """A corpus folder passed as --data_dir: the data.py command that prepares it into data/NAME (not into
    itself, which data.py refuses), and that command works."""
    monkeypatch.chdir(tmp_path)
    for where in ("texts", "data/texts"):           # the second one is where the first suggestion would go
        os.makedirs(where)
        for i in range(4):
            (tmp_path / where / f"part_{i}.txt").write_text(f"story {i} " * 40)
        with pytest.raises(FileNotFoundError) as e:
            train.main(tiny_args(where, tmp_path / "out"))
        command, data_dir = str(e.value).split("`")[1], str(e.value).rsplit("--data_dir=", 1)[1]
        assert str(e.value).startswith(f"data folder '{where}' holds no shards but 4 other files (part_0.txt, "
                                       "part_1.txt, part_2.txt, ...): if it is a corpus, prepare it with `python "
                                       f"data.py --input {where} --out data/texts"), str(e.value)
        assert data_dir == ("data/texts" if where == "texts" else "data/texts_tokens")
    subprocess.run([sys.executable, os.path.join(ROOT, "data.py"), *command.split()[2:]], check=True,
                   capture_output=True)
    assert next(data.Loader(data_dir, "train", 2, 16)).x.shape == (2, 16)


def test_missing_data_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare it"):
        train.main(tiny_args(tmp_path / "no_data", tmp_path))


def test_a_failed_preparation_leaves_the_old_folder_as_it_was(tmp_path, capsys):
    """Preparing over a good folder from an input that fails part way (a bad line after shards were
    written; a parquet whose text is null at row 30) leaves the good folder byte for byte, and no temp
    folder beside it; it still loads. A preparation that succeeds replaces it whole."""
    good = [f"document {i} " * 15 for i in range(40_000)]                # 8 MB: several 1 MB chunks
    _write_jsonl(tmp_path / "good.jsonl", good)
    _write_jsonl(tmp_path / "bad.jsonl", good)
    with open(tmp_path / "bad.jsonl", "a") as f:
        f.write("not json\n")
    out, kw = tmp_path / "out", dict(val_frac=0.1, workers=2, shard_tokens=500_000)
    data.prepare(str(tmp_path / "good.jsonl"), str(out), "byte", **kw)
    before = _folder_state(out)
    with pytest.raises(ValueError, match="bad.jsonl:40001"):
        data.prepare(str(tmp_path / "bad.jsonl"), str(out), "byte", **kw)
    assert _folder_state(out) == before and sorted(os.listdir(tmp_path)) == ["bad.jsonl", "good.jsonl", "out"]
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": good[:30] + [None] + good[:10]}), tmp_path / "n.parquet", row_group_size=8)
    with pytest.raises(ValueError, match="n.parquet row 30: 'text' must be a string, got NoneType"):
        data.prepare(str(tmp_path / "n.parquet"), str(out), "byte", **kw)
    assert _folder_state(out) == before and next(data.Loader(str(out), "train", 2, 16)).x.shape == (2, 16)
    capsys.readouterr()
    data.prepare(str(tmp_path / "good.jsonl"), str(out), "byte", **{**kw, "max_tokens": 1000})
    assert json.load(open(out / "meta.json"))["max_tokens"] == 1000 and _folder_state(out) != before
    assert f"note: {out} holds prepared data: it is replaced once this preparation is whole" in capsys.readouterr().out
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files data.py did not write .notes.txt."):
        data.prepare(str(tmp_path / "good.jsonl"), str(out), "byte", **kw)


def test_an_output_folder_that_cannot_be_created_is_named_with_the_way_out(tmp_path):
    """folder_creation_error names the user's folder and where and why mkdir failed, in words."""
    import errno
    from speedgpt.shards import folder_creation_error
    (tmp_path / "afile").write_text("")
    cases = [(tmp_path / "afile" / "a" / "b", errno.ENOTDIR, f"{tmp_path}/afile is a file, not a folder; "
                                                             "choose another --out"),
             (tmp_path / "new" / "x", errno.EACCES, f"permission denied in {tmp_path}; choose another --out, "
                                                     f"or fix the permissions of {tmp_path}")]
    if os.path.isdir("/proc"):                 # Linux: mkdir there fails with ENOENT, in a folder that exists
        cases.append(("/proc/x/y", errno.ENOENT, "/proc does not take new folders; choose another --out"))
    for folder, code, says in cases:
        e = folder_creation_error(str(folder), OSError(code, os.strerror(code)), "--out")
        assert str(e) == f"cannot create the output folder {folder}: {says}"


def test_an_output_folder_that_is_a_link_is_prepared_where_it_points(tmp_path):
    """--out linked to a folder on another disk (data/fw -> /big/fw) gets the shards there, run after run: the
    link stayed a link (it was renamed away and replaced by a folder beside it, on the smaller disk, and the
    second run failed on the renamed link, leaving its temp folder)."""
    _write_jsonl(tmp_path / "in.jsonl", [f"document {i} " * 10 for i in range(20)])
    (tmp_path / "big" / "fw").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "big" / "fw", tmp_path / "data" / "fw")
    os.symlink(tmp_path / "big" / "new", tmp_path / "data" / "new")      # a link to a folder not made yet
    for out in ("fw", "fw", "new"):
        data.prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "data" / out), "byte", val_frac=0.2, workers=1)
        assert os.path.islink(tmp_path / "data" / out) and sorted(os.listdir(tmp_path / "data")) == ["fw", "new"]
        assert "meta.json" in os.listdir(tmp_path / "big" / out)
        assert next(data.Loader(str(tmp_path / "data" / out), "train", 2, 16)).x.shape == (2, 16)
    assert sorted(os.listdir(tmp_path / "big")) == ["fw", "new"]


def test_a_loop_of_links_as_out_is_named(tmp_path):
    """--out a link that points to itself: one line that says so, where the line said 'Not a directory' and
    suggested freeing space."""
    _write_jsonl(tmp_path / "in.jsonl", [f"document {i} " * 10 for i in range(20)])
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    with pytest.raises(ValueError, match=r"^output .*loop is a loop of symbolic links: remove it, or choose another "
                                         r"--out$"):
        data.prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "loop"), "byte", workers=1)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "loop"]


def test_the_current_folder_as_out_is_refused(tmp_path, monkeypatch):
    """--out . (or a folder holding the current one) would be replaced by a new folder at the end, leaving the shell
    in the old one, deleted: "wrote ." and an empty `ls`. Refused in one line, nothing written."""
    _write_jsonl(tmp_path / "in.jsonl", [f"document {i} " * 10 for i in range(20)])
    (tmp_path / "here" / "inner").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "here" / "inner")
    for out in (".", "..", str(tmp_path / "here")):
        with pytest.raises(ValueError, match=r"is the current folder or holds it, .*: run data.py from its parent "
                                             r"with --out NAME$"):
            data.prepare(str(tmp_path / "in.jsonl"), out, "byte", workers=1)
    assert sorted(os.listdir(tmp_path)) == ["here", "in.jsonl"] and os.listdir(tmp_path / "here") == ["inner"]
    data.prepare(str(tmp_path / "in.jsonl"), "sub", "byte", workers=1)       # a folder inside it is fine
    assert "meta.json" in os.listdir("sub")


KILLED_WITH_A_WORKER_LEFT = """
import os, signal, sys, time
from speedgpt.shards import prepared_folder
with prepared_folder(sys.argv[1]):
    child = os.fork()
    if child == 0:                      # a tokenizer worker that outlives the preparation
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="a forked worker")
def test_a_worker_left_by_a_killed_preparation_holds_no_copy_of_its_lock(tmp_path):
    """data.py killed outright while a forked worker lives on: the worker closed its copy of the lock file at the
    fork (a flock lasts while any copy is open), so the next preparation into that --out is not refused."""
    from speedgpt.shards import prepared_folder
    out = tmp_path / "out"
    with open(tmp_path / "pid", "w") as said:       # a file: the worker would hold a pipe open
        proc = subprocess.run([sys.executable, "-c", KILLED_WITH_A_WORKER_LEFT, str(out)], cwd=ROOT, stdout=said,
                              timeout=60)
    worker = int((tmp_path / "pid").read_text())
    (tmp_path / "pid").unlink()
    try:
        assert proc.returncode == -signal.SIGKILL and (tmp_path / ".out.lock").exists()
        with prepared_folder(str(out)):
            pass
        assert sorted(os.listdir(tmp_path)) == ["out"]
    finally:
        os.kill(worker, signal.SIGKILL)


def test_a_second_preparation_into_the_same_folder_waits_for_none_and_breaks_none(tmp_path):
    """Two preparations into one --out at once: the second removed the first's temp folder as a killed run's, the
    first's shards went on into the second's, and a folder of mixed shards came out. Now the second is refused in
    one line while the first holds the folder's lock; a lock file left by a killed preparation blocks nothing."""
    from speedgpt.shards import prepared_folder
    out = tmp_path / "out"
    with prepared_folder(str(out)) as tmp:
        (tmp_path / ".out.preparing" / "train_000000.bin").write_bytes(b"the first's")
        with pytest.raises(ValueError, match=re.escape(f"output {out} is being prepared by another data.py now (it "
                                                       f"holds {tmp_path}/.out.lock): wait for it to finish, or "
                                                       "choose another --out")):
            with prepared_folder(str(out)):
                pass
        assert os.listdir(tmp) == ["train_000000.bin"]
    assert os.listdir(out) == ["train_000000.bin"] and sorted(os.listdir(tmp_path)) == ["out"]
    (tmp_path / ".out.lock").write_text("")          # a killed preparation's: no process holds it
    with prepared_folder(str(out)):
        pass
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_mount_point_as_out_is_refused_before_any_work(tmp_path, monkeypatch):
    """The preparation ends by renaming the new folder over out_dir, which a mount point refuses (EBUSY): found
    only after the whole corpus was tokenized. Now refused first, naming a folder inside it."""
    from speedgpt.shards import prepared_folder
    mount = tmp_path / "disk"
    mount.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) == str(mount) or real(p))
    with pytest.raises(ValueError, match=re.escape(f"output {mount} is a mount point, and a preparation replaces its "
                                                   "folder by a rename, which a mount point refuses: choose a folder "
                                                   f"inside it (--out {mount}/NAME)")):
        with prepared_folder(str(mount)):
            raise AssertionError("prepared into a mount point")
    assert os.listdir(tmp_path) == ["disk"]
