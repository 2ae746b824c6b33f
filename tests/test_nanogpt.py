"""karpathy/nanoGPT's files in speedgpt, on the CPU (speedgpt/nanogpt.py, speedgpt/shards.py): its config files given
as the positional argument, each of its keys translated with its note, a key of its other scripts refused with the
way out; a data folder as its data/shakespeare_char/prepare.py writes one (train.bin, val.bin, meta.pkl) trained on
with a config like its train_shakespeare_char.py, and sampled from in characters; its ckpt.pt (written here in its
format) starting a run with the same logits, a resume from it refused. The files are stand-ins written here; with
NANOGPT_DIR set to a nanoGPT checkout, its own config files are read too and its model.py gives the same logits."""
import ast
import importlib.util
import os
import pickle
import re
import shutil
import warnings

import numpy as np
import pytest
import torch

import configurator
import sample
import train
from conftest import HELLASWAG_FIXTURE, ROOT, read_metrics
from model import GPT, GPTConfig
from speedgpt import nanogpt

NANOGPT_DIR = os.environ.get("NANOGPT_DIR", "")
needs_nanogpt = pytest.mark.skipif(not NANOGPT_DIR or not os.path.isfile(os.path.join(NANOGPT_DIR, "model.py")),
                                   reason="set NANOGPT_DIR to a karpathy/nanoGPT checkout to test against its files")

# config/train_shakespeare_char.py's keys and values, as nanoGPT ships it
SHAKESPEARE_CHAR = """
out_dir = 'out-shakespeare-char'
eval_interval = 250
eval_iters = 200
log_interval = 10
always_save_checkpoint = False
wandb_log = False
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-gpt'
dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
learning_rate = 1e-3
max_iters = 5000
lr_decay_iters = 5000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
"""
# a small model on the CPU, as nanoGPT's comment says for a laptop (device, compile) and smaller
TINY = ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32",
        "--batch_size=4", "--eval_iters=4", "--eval_interval=10", "--log_interval=5", "--warmup_iters=2",
        "--learning_rate=1e-2", "--max_iters=20", "--lr_decay_iters=20", "--dropout=0.0"]


def write_char_folder(folder):
    """A data folder as nanoGPT's data/shakespeare_char/prepare.py writes one: the sorted characters of a text as the
    vocabulary, its first 90% as train.bin and the rest as val.bin (uint16, no header), meta.pkl beside them."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read() * 2
    chars = sorted(set(text))
    stoi, itos = {c: i for i, c in enumerate(chars)}, dict(enumerate(chars))
    os.makedirs(folder, exist_ok=True)
    cut = int(len(text) * 0.9)
    for name, part in (("train.bin", text[:cut]), ("val.bin", text[cut:])):
        np.array([stoi[c] for c in part], dtype=np.uint16).tofile(os.path.join(folder, name))
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
    return chars


def notes(argv):
    """(config, [each note's text]) of load_config(argv)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = configurator.load_config(argv)
    return cfg, [str(w.message) for w in caught if issubclass(w.category, nanogpt.Note)]


def test_the_shakespeare_char_folder_trains_with_its_config_and_samples_in_characters(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)              # dataset='shakespeare_char' is data/shakespeare_char, as in nanoGPT
    chars = write_char_folder("data/shakespeare_char")
    (tmp_path / "train_shakespeare_char.py").write_text(SHAKESPEARE_CHAR)
    summary = train.main(["train_shakespeare_char.py", *TINY])
    out = capsys.readouterr().out
    assert "no document boundaries are known" in out and f"meta.pkl: {len(chars)} characters" in out
    assert "note: nanoGPT's dataset='shakespeare_char' -> data_dir='data/shakespeare_char'" in out
    assert summary["steps"] == 20
    evals = [r["val_loss"] for r in read_metrics("out-shakespeare-char") if "val_loss" in r]
    assert len(evals) == 3 and evals[-1] < evals[0] - 0.5, evals      # it learns the characters
    ckpt = torch.load("out-shakespeare-char/ckpt.pt", weights_only=True)
    assert ckpt["meta"]["vocab_size"] == len(chars) and ckpt["meta"]["chars"] == chars
    assert (ckpt["config"]["eval_tokens"], ckpt["config"]["total_batch_size"]) == (4 * 4 * 32, 4 * 32)
    assert (ckpt["config"]["beta2"], ckpt["config"]["lr_schedule"]) == (0.99, "cosine")
    sample.main(["--out_dir=out-shakespeare-char", "--device=cpu", "--start=The ", "--num_samples=1",
                 "--max_new_tokens=40"])
    text = capsys.readouterr().out.split("\n" + "-" * 60)[0]
    assert text.startswith("The ") and len(text) == 44 and set(text) <= set(chars), text
    with pytest.raises(SystemExit, match="no end-of-text to start a sample from: give a prompt"):
        sample.main(["--out_dir=out-shakespeare-char", "--device=cpu", "--start="])


def test_nanogpts_sample_py_flags_are_taken(tmp_path, monkeypatch, capsys):
    """nanoGPT's sample.py has --init_from (resume, or OpenAI's GPT-2: its README's `--init_from=gpt2-xl`), --dtype
    and --compile beside the flags ours shares: its command lines sample here too, GPT-2 through hf.py as eval.py
    reads it; an init_from that names nothing sample.py reads is one line with the way out."""
    write_char_folder(tmp_path / "chars")
    out = tmp_path / "out"
    train.main([f"--data_dir={tmp_path / 'chars'}", f"--out_dir={out}", *TINY, "--max_iters=2", "--eval_iters=0"])
    capsys.readouterr()
    common = [f"--out_dir={out}", "--device=cpu", "--start=The ", "--num_samples=1", "--max_new_tokens=8",
              "--seed=1", "--temperature=0.8", "--top_k=5"]
    sample.main([*common, "--init_from=resume", "--dtype=float32", "--compile=False"])
    exact = capsys.readouterr()
    assert exact.out.startswith("The ") and exact.err == "", exact
    sample.main([*common, "--dtype=bfloat16", "--compile=True"])
    half = capsys.readouterr()
    assert half.out.startswith("The ") and "note: --compile=True: sample.py samples uncompiled" in half.err
    import hf                                           # GPT-2 weights offline: a tiny byte-level one stands in
    monkeypatch.setattr(hf, "load_hf_gpt2", lambda name: GPT(GPTConfig(vocab_size=257, n_layer=1, n_head=2,
                                                                       n_embd=16, block_size=32)))
    sample.main(["--init_from=gpt2-xl", "--device=cpu", "--start=Hi", "--num_samples=1", "--max_new_tokens=4"])
    assert capsys.readouterr().out.startswith("Hi")
    for argv, said in ((["--init_from=gpt3"], "--init_from must be resume (the checkpoint in --out_dir), gpt2, "),
                       ([f"--init_from={out / 'ckpt.pt'}"], f"--init_from {out / 'ckpt.pt'} is a file: sample from a "
                                                             f"checkpoint file with --out_dir={out / 'ckpt.pt'}"),
                       ([f"--init_from={out}"], f"--init_from {out} is a training run's folder: sample its "   # its
                                                f"checkpoint with --out_dir={out}"),           # config.json is not HF's
                       (["--init_from=gpt2-xl", f"--out_dir={out}"], f"--out_dir {out} and --init_from gpt2-xl name "
                                                                     "two models: give one of them")):
        with pytest.raises(SystemExit) as e:
            sample.main([*argv, "--device=cpu"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: {said}") and len(err.splitlines()) == 1, err


def test_hellaswag_on_nanogpts_characters_is_one_line_before_any_download(tmp_path, monkeypatch, capsys):
    """HellaSwag's text needs GPT-2 BPE or byte tokens: on a folder of nanoGPT's characters (or a model of them) it
    is refused in one line with what evaluates such a model, before the file is fetched; 'auto' turns it off. It
    said "unknown tokenizer 'char': expected 'byte' or 'gpt2'", after downloading HellaSwag."""
    import eval as eval_script
    from speedgpt import hellaswag
    write_char_folder(tmp_path / "chars")
    monkeypatch.chdir(tmp_path)                                   # no HellaSwag file in the cache here
    monkeypatch.setattr(hellaswag, "download", lambda *a: pytest.fail("HellaSwag fetched for a character model"))
    args = [f"--data_dir={tmp_path / 'chars'}", *TINY, "--max_iters=2", "--eval_interval=2"]
    with pytest.raises(ValueError, match=r"^HellaSwag cannot score .*chars: its tokens are nanoGPT's characters "
                                         r"\(meta.pkl\), and HellaSwag's text needs GPT-2 BPE or byte-level tokens: "
                                         r"leave hellaswag off"):
        train.main([*args, "--out_dir=out-on", "--hellaswag=on"])
    shutil.copy(HELLASWAG_FIXTURE, tmp_path / "hs.jsonl")
    train.main([*args, "--out_dir=out", "--hellaswag=auto", "--hellaswag_path=hs.jsonl"])
    assert "hellaswag: auto -> off (" in capsys.readouterr().out and \
        not any("hellaswag_acc_norm" in r for r in read_metrics("out"))
    for more in ([], ["--hellaswag_path=hs.jsonl"]):
        with pytest.raises(SystemExit) as e:
            eval_script.main(["--out_dir=out", "--device=cpu", *more])
        err = capsys.readouterr().err
        assert err == f"error: HellaSwag cannot score {os.path.join('out', 'ckpt.pt')}: its tokens are nanoGPT's " \
            "characters (meta.pkl), and HellaSwag's text needs GPT-2 BPE or byte-level tokens: its validation loss: " \
            f"python train.py --init_from={os.path.join('out', 'ckpt.pt')} --data_dir={tmp_path / 'chars'} " \
            "--eval_only=True --out_dir=OTHER_FOLDER\n" and e.value.code == 1, err


def test_the_character_folder_refuses_one_document_per_row(tmp_path):
    write_char_folder(tmp_path / "chars")
    args = [f"--data_dir={tmp_path / 'chars'}", f"--out_dir={tmp_path / 'out'}", *TINY, "--packing=False"]
    with pytest.raises(ValueError, match="has no end-of-text token, so no documents to pad one per row: keep packing"):
        train.main(args)


def test_a_meta_pkl_of_numpy_numbers_loads_and_one_naming_code_is_refused(tmp_path, capsys):
    """A prepare.py that computed vocab_size with numpy pickles a numpy int, which nanoGPT's train.py reads: so does
    ours. A pickle that names any other class or function (it could run code) is refused in one line."""
    from speedgpt.shards import nanogpt_meta
    chars = write_char_folder(tmp_path / "chars")
    itos = {np.int64(i): c for i, c in enumerate(chars)}
    with open(tmp_path / "chars" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": np.int64(len(chars)), "itos": itos}, f)
    meta = nanogpt_meta(str(tmp_path / "chars"), verbose=False)
    assert (meta["vocab_size"], meta["chars"]) == (len(chars), chars) and type(meta["vocab_size"]) is int

    class Runs:
        def __reduce__(self):
            return (os.system, ("echo ran",))
    with open(tmp_path / "chars" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": Runs(), "itos": {}}, f)
    with pytest.raises(ValueError, match=r"meta.pkl is not nanoGPT's character vocabulary .*UnpicklingError: it "
                                         r"names (posix|nt|os)\.system"):
        nanogpt_meta(str(tmp_path / "chars"), verbose=False)
    assert "ran" not in capsys.readouterr().out


def test_a_broken_meta_pkl_is_refused_before_the_memory_line(tmp_path, capsys):
    """A meta.pkl whose vocab_size is 'abc': train.py printed its memory line for GPT-2's vocabulary (the fallback)
    and only then refused the folder. The refusal comes first and alone, in train.py and in bench.py (which
    took a traceback from the same lookup)."""
    import bench
    write_char_folder(tmp_path / "bad")
    with open(tmp_path / "bad" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": "abc", "itos": {0: "a"}, "stoi": {"a": 0}}, f)
    said = r"meta.pkl is not nanoGPT's character vocabulary .*TypeError"
    with pytest.raises(ValueError, match=said):
        train.main([f"--data_dir={tmp_path / 'bad'}", *TINY, "--max_iters=1", f"--out_dir={tmp_path / 'out'}"])
    assert "memory:" not in capsys.readouterr().out and not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        bench.main(["--no_loo", "--steps=1", "--out", str(tmp_path / "b"), "--", f"--data_dir={tmp_path / 'bad'}",
                    "--n_layer=1", "--n_head=1", "--n_embd=16", "--block_size=16"])
    err = capsys.readouterr().err
    assert re.search(f"^error: .*{said}", err) and "Traceback" not in err, err


def test_a_meta_pkl_of_a_vocab_size_alone_trains_and_sampling_says_it_has_no_tokenizer(tmp_path, monkeypatch,
                                                                                       capsys):
    """nanoGPT's train.py reads only vocab_size; a meta.pkl of nothing else (another tokenizer's ids) was refused
    before any training. It trains, without bits per byte (its ids' text is unknown); HellaSwag, which needs that
    text, turns off under auto and is refused under on, before any download; sample.py, which needs a tokenizer,
    says so in one line with the way out."""
    import eval as eval_script
    from speedgpt import hellaswag
    write_char_folder(tmp_path / "ids")
    with open(tmp_path / "ids" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 128}, f)                  # more ids than the data uses, as a padded vocabulary
    monkeypatch.chdir(tmp_path)                               # no HellaSwag file in the cache here
    monkeypatch.setattr(hellaswag, "download", lambda *a: pytest.fail("HellaSwag fetched for ids without text"))
    shutil.copy(HELLASWAG_FIXTURE, tmp_path / "hs.jsonl")
    args = [f"--data_dir={tmp_path / 'ids'}", *TINY, "--max_iters=10", "--eval_interval=5"]
    train.main([*args, "--out_dir=out", "--hellaswag=auto", "--hellaswag_path=hs.jsonl"])
    out = capsys.readouterr().out
    assert "meta.pkl: a vocab_size of 128 and no itos" in out and "hellaswag: auto -> off (" in out, out
    assert "bits/byte" not in out
    evals = [r for r in read_metrics("out") if "val_loss" in r]
    assert len(evals) == 3 and all(r["val_bpb"] is None for r in evals), evals
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5, evals          # it learns the ids
    meta = torch.load("out/ckpt.pt", weights_only=True)["meta"]
    assert (meta["tokenizer"], meta["vocab_size"]) == ("ids", 128)
    with pytest.raises(ValueError, match=r"^HellaSwag cannot score .*ids: its tokens are ids whose text is unknown "
                                         r"\(meta.pkl: a vocab_size alone\), .*: leave hellaswag off"):
        train.main([*args, "--out_dir=out-on", "--hellaswag=on"])
    with pytest.raises(SystemExit) as e:
        eval_script.main(["--out_dir=out", "--device=cpu"])
    assert capsys.readouterr().err.startswith(f"error: HellaSwag cannot score {os.path.join('out', 'ckpt.pt')}: its "
                                              "tokens are ids whose text is unknown") and e.value.code == 1
    with pytest.raises(SystemExit, match=r"^error: the model's tokens are ids whose text is unknown \(its data's "
                                         r"meta.pkl held a vocab_size and no itos\): no tokenizer encodes a prompt or "
                                         r"decodes a sample; train on data that has one \(.*\)$") as e:
        sample.main(["--out_dir=out", "--device=cpu", "--start=The "])
    assert "\n" not in str(e.value.code)
    if importlib.util.find_spec("transformers"):          # its Hugging Face export says what its ids are
        import hf
        hf.main(["export", "--out_dir=out"])
        assert "note: 'ids' tokens have no Hugging Face tokenizer; its ids came without their text (a meta.pkl of a " \
            "vocab_size alone): encode input with the tokenizer that made the data" in capsys.readouterr().out


def test_a_meta_pkl_smaller_than_its_tokens_is_named(tmp_path):
    """A meta.pkl whose vocabulary lacks ids the shards hold: the refusal names meta.pkl, not a meta.json the folder
    does not have."""
    chars = write_char_folder(tmp_path / "chars")
    small = len(chars) - 5
    with open(tmp_path / "chars" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": small, "itos": dict(enumerate(chars[:small])), "stoi": {}}, f)
    with pytest.raises(ValueError, match=rf"train.bin holds token id \d+, outside the vocabulary \({small} ids in "
                                         r"meta.pkl\): shards and meta.pkl disagree$"):
        train.main([f"--data_dir={tmp_path / 'chars'}", f"--out_dir={tmp_path / 'out'}", *TINY])
    with open(tmp_path / "chars" / "meta.pkl", "wb") as f:              # a vocab_size alone, as small
        pickle.dump({"vocab_size": small}, f)
    with pytest.raises(ValueError, match=rf"train.bin holds token id \d+, outside the vocabulary \({small} ids in "
                                         r"meta.pkl\): shards and meta.pkl disagree$"):
        train.main([f"--data_dir={tmp_path / 'chars'}", f"--out_dir={tmp_path / 'out'}", *TINY])


def test_an_empty_val_bin_is_a_split_too_short_not_an_mmap_error(tmp_path):
    """An empty val.bin (nanoGPT's prepare.py on a tiny text) stopped the run with numpy's 'cannot mmap an empty
    file', naming neither the file nor a way out: it is a val split of 0 tokens, refused as any too-short split."""
    from data import Loader
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "train.bin")
    (tmp_path / "val.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^val shards in .* hold 0 tokens, too few for one row .*--eval_tokens=0"):
        Loader(str(tmp_path), "val", batch_size=1, block_size=8, vocab_size=50257)


def test_a_gpt2_token_folder_splits_documents_at_end_of_text(tmp_path):
    """nanoGPT's openwebtext: GPT-2 tokens with end-of-text after each document and no meta.pkl."""
    from data import Loader
    from speedgpt.shards import load_meta
    docs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    stream = np.array([t for d in docs for t in d + [50256]], dtype=np.uint16)
    stream.tofile(tmp_path / "train.bin")
    stream.tofile(tmp_path / "val.bin")
    meta = load_meta(str(tmp_path))
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_id"]) == ("gpt2", 50257, 50256)
    batch = next(Loader(str(tmp_path), "train", batch_size=1, block_size=12, seed=0, vocab_size=50257))
    assert batch.x[0].tolist() == stream[:12].tolist()
    assert batch.doc_ids[0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 3]   # a document starts at each 50256


def test_the_config_file_may_stand_alone_as_in_nanogpt(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("n_layer = 3\nlearning_rate = 1e-3\n")
    flag = configurator.load_config(["--config", str(path), "--n_embd=64"])
    assert configurator.load_config([str(path), "--n_embd=64"]) == flag
    assert configurator.load_config(["--n_embd", "64", str(path)]) == flag      # an override wins wherever it stands
    bare = configurator.load_config(["--compile", str(path)])                    # a bare bool before it: True
    assert (bare.compile, bare.n_layer) == (True, 3)
    with pytest.raises(ValueError, match=r"^cannot parse argument 'n_layer=2': use --key=value or --key value "
                                         r"\(a config file: --config FILE or FILE.py\)$"):
        configurator.load_config(["n_layer=2"])
    with pytest.raises(FileNotFoundError, match="config file 'none.py' not found"):
        configurator.load_config(["none.py"])


@pytest.mark.parametrize("flag, ours, said", [
    ("--dataset=shakespeare_char", {"data_dir": "data/shakespeare_char"}, "dataset='shakespeare_char' -> data_dir"),
    ("--gradient_accumulation_steps=5", {"total_batch_size": 5 * 4 * 32},
     "gradient_accumulation_steps=5 -> total_batch_size=640 (5 x batch_size 4 x block_size 32"),
    ("--eval_iters=3", {"eval_tokens": 3 * 4 * 32},
     "eval_iters=3 -> eval_tokens=384 (3 x batch_size 4 x block_size 32"),
    ("--eval_iters=0", {"eval_tokens": 0}, "eval_iters=0 -> eval_tokens=0"),
    ("--eval_only=True", {"max_iters": 0, "save_checkpoints": False}, "eval_only=True -> max_iters=0"),
    ("--eval_only=False", {"max_iters": 500}, "eval_only=False: the run trains"),
    ("--always_save_checkpoint=False", {"save_checkpoints": True}, "keeps the best apart (ckpt_best.pt"),
    ("--decay_lr=False", {"lr_schedule": "constant", "warmup_iters": 0}, "decay_lr=False -> lr_schedule='constant'"),
    ("--decay_lr=True", {"lr_schedule": "cosine"}, "decay_lr=True: lr_schedule=cosine"),
    ("--backend=gloo", {}, "backend='gloo': the process group's backend follows the device"),
])
def test_each_key_of_nanogpts_is_read_with_one_note(flag, ours, said):
    cfg, said_here = notes(["--batch_size=4", "--block_size=32", flag])   # a command line: no file, no defaults
    assert {k: getattr(cfg, k) for k in ours} == ours
    assert len(said_here) == 1 and said_here[0].startswith("nanoGPT's ") and said in said_here[0], said_here


def test_a_config_file_of_nanogpts_takes_its_defaults_but_not_the_machines(tmp_path):
    """As train_gpt2.py, which leaves the model's shape and the schedule to nanoGPT's train.py."""
    (tmp_path / "gpt2.py").write_text("batch_size = 12\nblock_size = 1024\ngradient_accumulation_steps = 5 * 8\n")
    cfg, said = notes([str(tmp_path / "gpt2.py"), "--warmup_iters=100"])
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.learning_rate, cfg.min_lr) == (12, 12, 768, 6e-4, 6e-5)
    assert (cfg.warmup_iters, cfg.data_dir, cfg.total_batch_size, cfg.eval_tokens) == (100, "data/openwebtext",
                                                                                       491520, 200 * 12 * 1024)
    assert (cfg.device, cfg.dtype, cfg.compile) == ("auto", "float32", False)
    defaults = [s for s in said if s.startswith(f"{tmp_path / 'gpt2.py'} is nanoGPT's")]
    assert len(defaults) == 1 and "n_layer=12" in defaults[0] and "warmup_iters" not in defaults[0]
    assert defaults[0].endswith("; device, dtype and compile keep speedgpt's defaults (auto, float32, False; on a GPU "
                                "nanoGPT's: --dtype=bfloat16 --compile=True)"), defaults[0]
    # nanoGPT's README's CPU line gives device and compile: the note names only the machine key left to ours
    _, said = notes([str(tmp_path / "gpt2.py"), "--device=cpu", "--compile=False"])
    defaults = [s for s in said if s.startswith(f"{tmp_path / 'gpt2.py'} is nanoGPT's")]
    assert defaults[0].endswith("; dtype keeps speedgpt's default (float32; on a GPU nanoGPT's: --dtype=bfloat16)")
    _, said = notes([str(tmp_path / "gpt2.py"), "--device=cpu", "--compile=False", "--dtype=float32"])
    assert [s for s in said if " is nanoGPT's" in s][0].endswith("min_lr=6e-05)")
    # a config file of speedgpt's keys alone is ours: our defaults
    (tmp_path / "ours.py").write_text("batch_size = 12\n")
    assert notes([str(tmp_path / "ours.py")]) == (configurator.Config(batch_size=12), [])


@pytest.mark.parametrize("argv, error, message", [
    (["--max_new_tokens=100"], ValueError, "'max_new_tokens' (command line) is a flag of sample.py (as in nanoGPT), "
                                           "not of train.py: python sample.py --max_new_tokens=..."),
    (["--real_data=False"], ValueError, "'real_data' (command line) is a flag of bench.py"),
    (["--decay_lr=maybe"], TypeError, "nanoGPT's config key 'decay_lr' (command line) must be bool, got 'maybe'"),
    (["--gradient_accumulation_steps=0"], TypeError, "'gradient_accumulation_steps' (command line) must be int >= 1"),
    (["--grad_accum_steps=4"], ValueError, "it is derived: set total_batch_size"),
])
def test_a_key_without_an_equivalent_is_refused_with_the_way_out(argv, error, message):
    with pytest.raises(error) as e:
        configurator.load_config(argv)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("argv, ours", [
    (["--eval_only=True", "--save_checkpoints=True"], "save_checkpoints"),
    (["--lr_schedule=wsd", "--decay_lr=True"], "lr_schedule"),                      # either order
    (["--data_dir=data/a", "--dataset=b"], "data_dir"),
    (["--eval_iters=5", "--eval_tokens=0"], "eval_tokens"),
    (["--gradient_accumulation_steps=2", "--total_batch_size=256"], "total_batch_size"),
])
def test_a_key_of_nanogpts_and_one_of_ours_setting_it_otherwise_in_one_place_are_refused(tmp_path, argv, ours):
    with pytest.raises(ValueError, match=rf"\(nanoGPT's\) and .* \(command line\) both set {ours}: give one of them$"):
        configurator.load_config(argv)
    path = tmp_path / "both.py"                   # in one config file too
    lines = [(k, v if k in ("data_dir", "dataset", "lr_schedule") else ast.literal_eval(v)) for k, v in
             (a[2:].split("=", 1) for a in argv)]
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in lines))
    with pytest.raises(ValueError, match=rf"\({re.escape(str(path))}\) both set {ours}: "):
        configurator.load_config([str(path)])
    assert configurator.load_config(["--decay_lr=True", "--lr_schedule=cosine"]).lr_schedule == "cosine"   # agree


def test_eval_only_and_decay_lr_win_over_max_iters_and_warmup_iters_wherever_they_stand_as_in_nanogpt(tmp_path):
    """nanoGPT's eval_only=True stops after the first evaluation whatever max_iters is, and decay_lr=False leaves
    warmup_iters unused: both are nanoGPT's keys, so its config files set them side by side (eval_gpt2.py with
    train_gpt2.py's max_iters), and the note says which does not count."""
    path = tmp_path / "eval.py"
    path.write_text("eval_only = True\nmax_iters = 5000\ndecay_lr = False\nwarmup_iters = 100\n")
    cfg, said = notes([str(path), "--max_iters=20"])
    assert (cfg.max_iters, cfg.save_checkpoints, cfg.warmup_iters, cfg.lr_schedule) == (0, False, 0, "constant")
    assert f"nanoGPT's eval_only=True -> max_iters=0, save_checkpoints=False (one evaluation, then the run ends); " \
           f"max_iters=5000 ({path}), max_iters=20 (command line) beside it do not count, as in nanoGPT" in said, said
    assert any(s.startswith("nanoGPT's decay_lr=False -> lr_schedule='constant', warmup_iters=0") and
               s.endswith(f"; warmup_iters=100 ({path}) beside it does not count, as in nanoGPT") for s in said), said
    cfg, said = notes(["--warmup_iters=5", "--decay_lr=False"])
    assert cfg.warmup_iters == 0 and said[0].endswith("; warmup_iters=5 (command line) beside it does not count, as "
                                                      "in nanoGPT"), said


def test_decay_lr_false_leaves_lr_decay_iters_and_min_lr_unused_as_in_nanogpt(tmp_path):
    """nanoGPT's decay_lr=False never reads lr_decay_iters or min_lr: a config file of nanoGPT's that sets them beside
    it, or leaves them to nanoGPT's defaults (its finetune_shakespeare.py: 600000 and 6e-5), loads and passes the check
    that refuses them beside lr_schedule=constant; one of ours given after it is refused, and a later
    --lr_schedule=cosine keeps the file's."""
    from conftest import on
    from speedgpt import optim
    default = configurator.Config()
    (tmp_path / "char.py").write_text("decay_lr = False\nlearning_rate = 1e-3\nlr_decay_iters = 5000\nmin_lr = 1e-4\n")
    (tmp_path / "tune.py").write_text("dataset = 'shakespeare'\ndecay_lr = False\nlearning_rate = 3e-5\n")
    for name in ("char.py", "tune.py"):
        cfg, _ = notes([str(tmp_path / name)])
        assert (cfg.lr_schedule, cfg.lr_decay_iters, cfg.min_lr) == ("constant", default.lr_decay_iters,
                                                                     default.min_lr), name
        assert optim.check(cfg, on("cpu")) == cfg
    cfg, _ = notes([str(tmp_path / "char.py"), "--min_lr=1e-5"])
    with pytest.raises(ValueError, match="^min_lr=1e-05 would do nothing: "):
        optim.check(cfg, on("cpu"))
    cfg, _ = notes([str(tmp_path / "char.py"), "--lr_schedule=cosine"])
    assert (cfg.lr_schedule, cfg.lr_decay_iters, cfg.min_lr) == ("cosine", 5000, 1e-4)


def test_eval_only_that_could_not_evaluate_is_refused_with_a_way_that_does(tmp_path):
    """nanoGPT evaluates a run's checkpoint with eval_only=True and init_from='resume'; here a resume trains on (its
    checkpoint past max_iters=0 would be refused, and max_iters does not count beside eval_only): the way out starts
    from the checkpoint's weights in another folder. eval_tokens=0 would evaluate nothing."""
    with pytest.raises(ValueError, match=r"^eval_only=True with a resume: .* --init_from=out/ckpt.pt "
                                         r"--out_dir=OTHER_FOLDER, without init_from=resume and resume_from$"):
        configurator.load_config(["--eval_only=True", "--init_from=resume"])
    (tmp_path / "ckpt_step000004.pt").write_bytes(b"")                  # a kept step: the file it names
    with pytest.raises(ValueError, match=rf"--init_from={re.escape(str(tmp_path))}/ckpt_step000004.pt "
                                         r"--out_dir=OTHER_FOLDER"):
        configurator.load_config(["--eval_only=True", "--resume_from=4", f"--out_dir={tmp_path}"])
    with pytest.raises(FileNotFoundError, match=r"has no checkpoint of step 5 \(its steps: 4;"):
        configurator.load_config(["--eval_only=True", "--resume_from=5", f"--out_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"^eval_only=True evaluates once, and eval_tokens=0 \(or eval_iters=0\) "
                                         r"evaluates nothing: give eval_tokens > 0, or leave eval_only out$"):
        configurator.load_config(["--eval_only=True", "--eval_iters=0"])
    with pytest.raises(TypeError, match="must be bool, got 'false': give True or False$"):
        configurator.load_config(["--decay_lr=false"])


def test_our_key_on_the_command_line_beats_nanogpts_in_a_file_and_the_note_says_so(tmp_path):
    path = tmp_path / "eval_gpt2.py"
    path.write_text("eval_only = True\ndataset = 'owt'\ngradient_accumulation_steps = 2\n")
    cfg, said = notes([str(path), "--save_checkpoints=True", "--data_dir=data/mine", "--total_batch_size=4096"])
    assert (cfg.max_iters, cfg.save_checkpoints, cfg.data_dir, cfg.total_batch_size) == (0, True, "data/mine", 4096)
    assert "nanoGPT's eval_only=True -> max_iters=0, save_checkpoints=False (one evaluation, then the run ends); " \
           "save_checkpoints=True (command line), given after it, wins" in said
    assert any(s.startswith("nanoGPT's dataset='owt' -> data_dir='data/owt'") and
               s.endswith("; data_dir='data/mine' (command line), given after it, wins") for s in said), said
    assert f"nanoGPT's gradient_accumulation_steps=2 ({path}) is replaced by total_batch_size=4096 (command line), " \
           "given after it" in said
    assert not any("-> total_batch_size" in s for s in said)          # the replaced count says no note of its own


def nanogpt_checkpoint(model, path, **model_args):
    """Save `model` (ours) as nanoGPT's train.py saves its checkpoint: the compiled module's state dict
    (`_orig_mod.` prefixes), the vocabulary unpadded, a causal-mask buffer per layer (a torch without SDPA),
    model_args, iter_num, best_val_loss (a tensor), config and the optimizer's state."""
    c = model.config
    state = {}
    for name, t in model.state_dict().items():
        if name in ("transformer.wte.weight", "lm_head.weight"):
            t = t[:c.vocab_size]
        state[f"_orig_mod.{name}"] = t.clone()
    for i in range(c.n_layer):
        state[f"_orig_mod.transformer.h.{i}.attn.bias"] = torch.ones(c.block_size, c.block_size).tril().view(
            1, 1, c.block_size, c.block_size)
    args = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.block_size, bias=c.bias,
                vocab_size=c.vocab_size, dropout=0.0, **model_args)
    optimizer = torch.optim.AdamW(model.parameters())
    torch.save({"model": state, "optimizer": optimizer.state_dict(), "model_args": args, "iter_num": 250,
                "best_val_loss": torch.tensor(1.5), "config": {"dataset": "shakespeare_char", "batch_size": 64}}, path)


def test_a_nanogpt_checkpoint_starts_a_run_with_the_same_logits(tmp_path):
    chars = write_char_folder(tmp_path / "chars")
    torch.manual_seed(0)
    mine = GPT(GPTConfig(block_size=32, vocab_size=len(chars), n_layer=2, n_head=2, n_embd=32, bias=True)).eval()
    nanogpt_checkpoint(mine, tmp_path / "ckpt.pt")
    idx = torch.randint(0, len(chars), (2, 32))
    # learning_rate=0: the run's checkpoint holds the weights it started from
    args = [f"--data_dir={tmp_path / 'chars'}", f"--out_dir={tmp_path / 'out'}", *TINY, "--max_iters=2",
            "--learning_rate=0", "--min_lr=0", f"--init_from={tmp_path / 'ckpt.pt'}"]
    args.remove("--n_layer=2")                  # the shape comes from the checkpoint: bias=True, two layers
    train.main(args)
    model, _ = sample.load_model(str(tmp_path / "out"), "cpu")
    assert (model.config.n_layer, model.config.bias) == (2, True)
    torch.testing.assert_close(model(idx)[0], mine(idx)[0], rtol=0, atol=0)
    # our own checkpoint file starts a run the same way (weights and shape only)
    again = [a.replace(str(tmp_path / "out"), str(tmp_path / "again")) for a in args if not a.startswith("--init_from")]
    train.main([*again, f"--init_from={tmp_path / 'out' / 'ckpt.pt'}"])
    again_model, _ = sample.load_model(str(tmp_path / "again"), "cpu")
    torch.testing.assert_close(again_model(idx)[0], mine(idx)[0], rtol=0, atol=0)
    # a shorter block_size crops the positions; a different shape is refused in one line
    cfg = nanogpt.start_config(configurator.Config(init_from=str(tmp_path / "ckpt.pt"), block_size=16), {"block_size"})
    short = nanogpt.load_model(cfg.init_from, GPTConfig.from_dict(vars(cfg), len(chars))).eval()
    torch.testing.assert_close(short(idx[:, :16])[0], mine(idx[:, :16])[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^n_layer=3 differs from the checkpoint's 2 .*: leave n_layer out to take "
                                         r"the checkpoint's; where a config file sets it, add --n_layer=2 \("):
        train.main([*args, "--n_layer=3"])


def test_its_config_files_shape_against_its_checkpoint_is_refused_at_once_with_the_flags_that_win(tmp_path,
                                                                                                   monkeypatch):
    """train_shakespeare_char.py sets the whole shape (6 layers, 384 wide, block_size 256): starting from a smaller
    ckpt.pt under it names every key that differs in one line, and the command-line flags that take the
    checkpoint's; with them the run starts."""
    monkeypatch.chdir(tmp_path)
    chars = write_char_folder("data/shakespeare_char")
    (tmp_path / "train_shakespeare_char.py").write_text(SHAKESPEARE_CHAR)
    nanogpt_checkpoint(GPT(GPTConfig(block_size=32, vocab_size=len(chars), n_layer=2, n_head=2, n_embd=32)),
                       tmp_path / "ckpt.pt")
    tiny = [a for a in TINY if a.split("=")[0] not in ("--n_layer", "--n_head", "--n_embd", "--block_size")]
    args = ["train_shakespeare_char.py", *tiny, "--init_from=ckpt.pt", "--max_iters=1"]
    with pytest.raises(ValueError) as e:
        train.main(args)
    assert str(e.value) == ("n_layer=6, n_head=6, n_embd=384, block_size=256 differ from the checkpoint's 2, 2, 32, "
                            "32 (init_from=ckpt.pt): leave n_layer, n_head, n_embd, block_size out to take the "
                            "checkpoint's, or give a smaller block_size; where a config file sets them, add "
                            "--n_layer=2 --n_head=2 --n_embd=32 --block_size=32 (the command line beats a config file)")
    assert train.main([*args, "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32"])["steps"] == 1


def test_a_missing_nanogpt_dataset_folder_names_its_prepare_py(tmp_path, monkeypatch):
    """dataset='shakespeare' is data/shakespeare: where nanoGPT makes it, or data.py with its GPT-2 tokens."""
    from speedgpt.shards import find_shards
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        find_shards("data/shakespeare", "train")
    assert str(e.value) == ("data folder 'data/shakespeare' does not exist: nanoGPT's dataset='shakespeare' is the "
                            "folder its data/shakespeare/prepare.py writes: run that in nanoGPT and copy it here (cp -r "
                            "../nanoGPT/data/shakespeare data/); or prepare it with `python data.py --input CORPUS "
                            "--out data/shakespeare --tokenizer gpt2`")
    with pytest.raises(FileNotFoundError, match=r"data/shakespeare_char/prepare\.py .* --out data/shakespeare_char`$"):
        find_shards("data/shakespeare_char", "train")        # characters: data.py's default tokenizer, bytes
    with pytest.raises(FileNotFoundError, match=r"does not exist: prepare it with .* --out elsewhere/openwebtext`$"):
        find_shards("elsewhere/openwebtext", "train")         # not nanoGPT's data/<dataset>


def test_a_resume_from_a_nanogpt_checkpoint_is_refused_with_the_way_out(tmp_path):
    chars = write_char_folder(tmp_path / "chars")
    os.makedirs(tmp_path / "out")
    nanogpt_checkpoint(GPT(GPTConfig(block_size=32, vocab_size=len(chars), n_layer=2, n_head=2, n_embd=32)),
                       tmp_path / "out" / "ckpt.pt")
    args = [f"--data_dir={tmp_path / 'chars'}", f"--out_dir={tmp_path / 'out'}", *TINY, "--init_from=resume"]
    with pytest.raises(ValueError) as e:
        train.main(args)
    assert str(e.value).startswith(f"{tmp_path / 'out' / 'ckpt.pt'} is nanoGPT's checkpoint: start a run from its "
                                   f"weights with train.py --init_from={tmp_path / 'out' / 'ckpt.pt'} "
                                   "--data_dir=data/shakespeare_char --out_dir=NEW_FOLDER (its optimizer")


@needs_nanogpt
def test_nanogpts_own_config_files_load():
    """Parsed and translated only: they are sized for GPUs (train_gpt2.py: 8 of them)."""
    config = os.path.join(NANOGPT_DIR, "config")
    got = {name: notes([os.path.join(config, name)]) for name in sorted(os.listdir(config)) if name.endswith(".py")}
    assert set(got) >= {"train_shakespeare_char.py", "train_gpt2.py", "finetune_shakespeare.py", "eval_gpt2.py"}
    for name, (cfg, said) in got.items():
        assert any(s.startswith(f"{os.path.join(config, name)} is nanoGPT's") for s in said), name
    gpt2 = got["train_gpt2.py"][0]
    assert (gpt2.n_layer, gpt2.total_batch_size, gpt2.eval_tokens, gpt2.wandb_log) == (12, 491520, 2457600, True)
    char = got["train_shakespeare_char.py"][0]
    assert (char.data_dir, char.n_layer, char.dropout, char.beta2) == ("data/shakespeare_char", 6, 0.2, 0.99)
    tune = got["finetune_shakespeare.py"][0]
    assert (tune.init_from, tune.lr_schedule, tune.total_batch_size) == ("gpt2-xl", "constant", 32768)
    assert (got["eval_gpt2.py"][0].max_iters, got["eval_gpt2.py"][0].init_from) == (0, "gpt2")


@needs_nanogpt
def test_nanogpts_model_py_and_ours_give_the_same_logits(tmp_path):
    """A checkpoint of nanoGPT's own model (its model.py, its checkpoint's keys) loads into ours with its logits."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", os.path.join(NANOGPT_DIR, "model.py"))
    theirs_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(theirs_py)
    args = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, bias=True, vocab_size=65, dropout=0.0)
    torch.manual_seed(0)
    theirs = theirs_py.GPT(theirs_py.GPTConfig(**args)).eval()
    with torch.no_grad():           # weights far from GPT-2's small init, so a difference of activation would show
        for p in theirs.parameters():
            p.normal_(0.0, 0.5)
    torch.save({"model": theirs.state_dict(), "model_args": args, "iter_num": 10, "best_val_loss": torch.tensor(2.0),
                "config": {}, "optimizer": theirs.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").state_dict()},
               tmp_path / "ckpt.pt")
    cfg = nanogpt.start_config(configurator.Config(init_from=str(tmp_path / "ckpt.pt")), set())
    ours = nanogpt.load_model(cfg.init_from, GPTConfig.from_dict(vars(cfg), 65)).eval()
    idx = torch.randint(0, 65, (2, 32))
    want, want_loss = theirs(idx, idx)
    got, loss = ours(idx, idx)
    torch.testing.assert_close(got[..., :65], want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)


def test_a_nanogpt_checkpoint_on_other_data_names_the_data_it_was_trained_on(tmp_path, byte_data):
    """Its 65 characters against byte data (257): refused in one line naming its dataset's folder."""
    chars = write_char_folder(tmp_path / "chars")
    nanogpt_checkpoint(GPT(GPTConfig(block_size=32, vocab_size=len(chars), n_layer=2, n_head=2, n_embd=32)),
                       tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match=r"has a vocabulary of \d+ tokens, the data 257: train on the data it was "
                                         r"trained on \(dataset='shakespeare_char': --data_dir=data/shakespeare_char\)$"):
        train.main([f"--data_dir={byte_data}", f"--out_dir={tmp_path / 'out'}", *TINY,
                    f"--init_from={tmp_path / 'ckpt.pt'}"])
