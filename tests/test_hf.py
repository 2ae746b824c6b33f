"""Hugging Face interop (hf.py), on the CPU and without network: a random tiny GPT2LMHeadModel saved to
a folder stands in for OpenAI's GPT-2 (the real `gpt2` download cannot be tried here)."""
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

import configurator
import data
import hf
import train
from conftest import ROOT, gpt2_tokenizer, tiny_args
from model import GPT, GPTConfig
from speedgpt.checkpoint import load_checkpoint, load_weights

transformers = pytest.importorskip("transformers")     # an optional package: this file skips without it
CPU = torch.device("cpu")   # every test here runs on the CPU


def save_tiny_gpt2(path, vocab_size=257, n_positions=64, activation="gelu_new", seed=0):
    """A random 2-layer GPT2LMHeadModel saved to `path`. Every parameter is perturbed, so biases and
    LayerNorm weights are not their trivial init (0 and 1) and a transposition or a dropped bias shows."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=32, n_layer=2, n_head=2,
                                     activation_function=activation, bos_token_id=vocab_size - 1,
                                     eos_token_id=vocab_size - 1)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return str(path)


def hf_model(path):
    return transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return save_tiny_gpt2(tmp_path_factory.mktemp("hf_gpt2"))


def model_from_ckpt(path, attention="sdpa"):
    ckpt = load_checkpoint(str(path))
    m = GPT(GPTConfig.from_dict(ckpt["config"], ckpt["meta"]["vocab_size"], attention=attention))
    load_weights(m, ckpt, str(path))
    return m.eval()


@torch.no_grad()
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("activation", ["gelu_new", "gelu"])
def test_load_matches_hf_logits_and_loss(tmp_path, activation, attention):
    """GPT-2 weights loaded by load_hf_gpt2 give GPT2LMHeadModel's logits and loss within 1e-5 (float32).
    The loss also checks that the padded vocabulary (zero rows: logit 0) stays out of the softmax."""
    path = save_tiny_gpt2(tmp_path / "m", activation=activation)
    ref = hf_model(path)
    asked = GPTConfig(vocab_size=257, block_size=64, n_layer=4, n_head=4, n_embd=128, attention=attention)
    m = hf.load_hf_gpt2(path, asked).eval()             # the shape is the HF model's
    assert m.config.activation == {"gelu_new": "gelu_tanh", "gelu": "gelu"}[activation] and m.config.bias
    assert (m.config.n_layer, m.config.n_head, m.config.n_embd, m.config.padded_vocab_size) == (2, 2, 32, 320)
    assert m.lm_head.weight is m.transformer.wte.weight and m.lm_head.weight[257:].abs().sum() == 0
    idx = torch.randint(0, 257, (3, 64), generator=torch.Generator().manual_seed(1))
    out = ref(idx, labels=idx)
    logits, loss = m(idx[:, :-1], idx[:, 1:].contiguous())
    torch.testing.assert_close(logits[..., :257], out.logits[:, :-1], rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, out.loss, rtol=0, atol=1e-5)
    assert torch.isneginf(logits[..., 257:]).all()
    full = hf.load_hf_gpt2(path)                               # no config: every setting from the HF model
    assert full.config == GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=2, n_embd=32, bias=True,
                                    activation=m.config.activation)


def test_gpt2_name_reads_the_hugging_face_cache(hf_dir, tmp_path):
    """init_from='gpt2' takes the weights from the Hugging Face cache, with no network: a cache laid out
    as huggingface_hub lays it ($HF_HOME/hub/models--gpt2), holding the tiny model under the name gpt2."""
    repo = tmp_path / "hub" / "models--gpt2"
    shutil.copytree(hf_dir, repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    code = ("import torch, hf; m = hf.load_hf_gpt2('gpt2').eval(); "
            f"print(float(m(torch.arange(10)[None])[0][..., :257].sum()))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "HF_HOME": str(tmp_path)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with torch.no_grad():
        want = hf_model(hf_dir)(torch.arange(10)[None]).logits.sum().item()
    assert float(r.stdout.splitlines()[-1]) == pytest.approx(want, abs=1e-3)


def test_a_gpt2_name_offline_and_not_cached_fails_at_once_in_one_line(tmp_path, monkeypatch):
    """init_from='gpt2' not in the cache with the hub unreachable: one line naming the cache and the way out,
    without trying the download (whose client retries for some 20 s offline); with HF_HUB_OFFLINE, no probe."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))                  # an empty cache
    probed, downloads = [], []

    def no_network(address, timeout):
        probed.append(address)
        raise OSError("network is unreachable")

    def load(name, local_files_only=False, **kw):
        if not local_files_only:
            downloads.append(name)
        raise OSError(f"{name} is not in the cache")
    monkeypatch.setattr("socket.create_connection", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example:8443")
    with pytest.raises(FileNotFoundError, match=r"could not load 'gpt2' through transformers: it is not in the "
                                                r"Hugging Face cache and hub.example is not reachable "
                                                r".*Offline it must"):
        hf._from_hub_or_folder(load, "gpt2")
    assert probed == [("hub.example", 8443)] and downloads == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set"):
        hf._from_hub_or_folder(load, "gpt2")
    assert len(probed) == 1 and downloads == []


@torch.no_grad()
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_train_main_loads_the_hf_model(byte_data, hf_dir, tmp_path, attention):
    """train.main with init_from=<folder>: the shape keys come from the HF model (and are saved in the
    checkpoint), and the step-0 validation loss is the HF model's on the same batches."""
    summary = train.main(tiny_args(byte_data, tmp_path, f"--init_from={hf_dir}", f"--attention={attention}",
                                   "--max_iters=0", "--document_mask=False"))
    ckpt = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert (ckpt["config"]["bias"], ckpt["config"]["activation"], ckpt["step"]) == (True, "gelu_tanh", 0)
    assert json.load(open(tmp_path / "config.json"))["activation"] == "gelu_tanh"
    ref = hf_model(hf_dir)
    loader = data.Loader(str(byte_data), "val", batch_size=4, block_size=64, seed=configurator.Config().seed + 1,
                         eot=256, vocab_size=257, document_mask=False)
    total, n = 0.0, 0
    for _ in range(2):                                         # tiny_args: eval_tokens=512, 2 batches of 4 x 64
        b = next(loader)
        total += F.cross_entropy(ref(b.x).logits.flatten(0, 1), b.y.flatten(), ignore_index=-1, reduction="sum").item()
        n += b.n_valid
    assert summary["val_loss"] == pytest.approx(total / n, abs=1e-5)


GPT2_CANNOT = [("norm", "rmsnorm", "LayerNorm"), ("rope", True, r"learned absolute positions \(wpe\)"),
               ("qk_norm", True, "no QK-norm"), ("activation", "relu2", "gelu_tanh or gelu"),
               ("tie_embeddings", False, "the output head tied to the embedding")]


@pytest.mark.parametrize("key, value, has", GPT2_CANNOT, ids=[c[0] for c in GPT2_CANNOT])
def test_export_refuses_a_block_gpt2_does_not_have(tmp_path, monkeypatch, key, value, has):
    """A checkpoint of a model with a block GPT-2 has no place for is refused in one line naming the setting,
    before transformers is imported and before anything is written; the same model with GPT-2's block exports."""
    torch.manual_seed(0)
    shape, meta = dict(vocab_size=257, block_size=32, n_layer=1, n_head=2, n_embd=32), \
        {"tokenizer": "byte", "vocab_size": 257, "eot_id": 256}
    fake_checkpoint(tmp_path / "ckpt.pt", GPT(GPTConfig(**shape, **{key: value})), meta)
    fake_checkpoint(tmp_path / "gpt2.pt", GPT(GPTConfig(**shape)), meta)
    line = rf"^{re.escape(str(tmp_path))}/ckpt.pt was trained with {key}={value!r}, which Hugging Face's GPT-2 " \
           rf"cannot hold \(it has {has}\): [^\n]*$"
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "transformers", None)              # refused before transformers is needed
        with pytest.raises(ValueError, match=line):
            hf.export_hf(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    assert not os.path.exists(tmp_path / "hf")
    hf.export_hf(str(tmp_path / "gpt2.pt"), str(tmp_path / "hf"))


def test_export_names_every_block_gpt2_does_not_have_at_once(tmp_path):
    """A model with several foreign blocks hears of all of them in the one line, not one per attempt."""
    shape = dict(vocab_size=257, block_size=32, n_layer=1, n_head=2, n_embd=32)
    fake_checkpoint(tmp_path / "ckpt.pt", GPT(GPTConfig(**shape, **{k: v for k, v, _ in GPT2_CANNOT})),
                    {"tokenizer": "byte", "vocab_size": 257, "eot_id": 256})
    with pytest.raises(ValueError) as e:
        hf.export_hf(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    line = str(e.value)
    assert "\n" not in line and line.endswith("sample.py and eval.py read the checkpoint itself")
    for key, value, has in GPT2_CANNOT:
        assert f"{key}={value!r}" in line and re.search(has, line), (key, line)
    assert "only a model trained with norm='layernorm', rope=False, qk_norm=False, tie_embeddings=True, " \
           "activation='gelu_tanh' or 'gelu' exports" in line


def test_gpt2_weights_bring_gpt2s_blocks():
    """init_from a GPT-2: its blocks (LayerNorm, learned positions, no QK-norm, the tied head) replace a config that
    asks for others, as its shape does, so the weights are loaded into the architecture they were trained in."""
    asked = GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=2, n_embd=32, norm="rmsnorm", rope=True,
                      qk_norm=True, activation="relu2", tie_embeddings=False, attention="naive")
    got = hf.gpt_config_from_hf(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64,
                                                        vocab_size=257), "tiny", asked)
    assert (got.norm, got.rope, got.qk_norm, got.activation, got.tie_embeddings, got.attention) == \
        ("layernorm", False, False, "gelu_tanh", True, "naive")


def test_fine_tune_export_and_back(byte_data, hf_dir, tmp_path, monkeypatch, capsys):
    """Fine-tune from the HF folder, resume, sample, export: transformers loads the export with our
    logits, the head stays tied to the embedding, and loading the export again gives the same model."""
    out = tmp_path / "out"
    train.main(tiny_args(byte_data, out, f"--init_from={hf_dir}", "--max_iters=4"))
    assert ("its shape replaces the config's: bias=True (config: False), activation='gelu_tanh'"
            in capsys.readouterr().out)
    with pytest.raises(ValueError, match="'bias'=False differs from the checkpoint's True"):
        train.main(tiny_args(byte_data, out, "--init_from=resume", "--max_iters=6", "--bias=False"))
    train.main(tiny_args(byte_data, out, "--init_from=resume", "--max_iters=6"))     # the shape is the checkpoint's
    ours = model_from_ckpt(out / "ckpt.pt")
    assert not torch.equal(ours.transformer.wpe.weight, hf_model(hf_dir).transformer.wpe.weight)   # it trained

    import sample                                              # sample.py builds the checkpoint's model
    built = []
    monkeypatch.setattr(sample, "GPT", lambda c: built.append(c) or GPT(c))
    monkeypatch.setattr(sys, "argv", ["sample.py", f"--out_dir={out}", "--num_samples=1", "--max_new_tokens=5"])
    sample.main()
    assert (built[0].activation, built[0].bias) == ("gelu_tanh", True)

    to = hf.export_hf(str(out / "ckpt.pt"), str(tmp_path / "hf"))
    exported = transformers.AutoModelForCausalLM.from_pretrained(to).eval()
    assert exported.config.activation_function == "gelu_new" and exported.config.tie_word_embeddings
    assert exported.lm_head.weight.data_ptr() == exported.transformer.wte.weight.data_ptr()
    from safetensors import safe_open
    with safe_open(os.path.join(to, "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and f.get_tensor("transformer.wte.weight").shape == (257, 32)
    idx = torch.randint(0, 257, (2, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ours(idx)[0][..., :257]
        torch.testing.assert_close(exported(idx).logits, want, rtol=0, atol=1e-5)
        back = hf.load_hf_gpt2(to).eval()                      # the round trip
        assert back.lm_head.weight is back.transformer.wte.weight
        torch.testing.assert_close(back(idx)[0], ours(idx)[0], rtol=0, atol=1e-5)


def test_export_with_bias_false_through_the_cli(byte_data, tmp_path):
    """A scratch run (bias=False, exact gelu) exports through `python hf.py export` as zero biases and
    activation "gelu", with our logits for both attention backends."""
    train.main(tiny_args(byte_data, tmp_path, "--max_iters=4"))
    r = subprocess.run([sys.executable, "hf.py", "export", f"--out_dir={tmp_path}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "bias=False written as zero biases" in r.stdout and "no Hugging Face tokenizer" in r.stdout
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert exported.config.activation_function == "gelu" and exported.config.eos_token_id == 256
    biases = [p for n, p in exported.named_parameters() if n.endswith(".bias")]
    assert len(biases) == 2 * 6 + 1 and all(torch.all(b == 0) for b in biases)
    idx = torch.randint(0, 257, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = exported(idx).logits
        for attention in ("naive", "sdpa"):
            torch.testing.assert_close(got, model_from_ckpt(tmp_path / "ckpt.pt", attention)(idx)[0][..., :257],
                                       rtol=0, atol=1e-5)
    kept = tmp_path / "ckpt_step000004.pt"                  # a kept step's file exports as sample.py reads it,
    before = {f: os.path.getmtime(tmp_path / "hf" / f) for f in os.listdir(tmp_path / "hf")}
    hf.main(["export", f"--out_dir={kept}"])                # to a folder of its own: ckpt.pt's export stays
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf_step000004")).eval()
    with torch.no_grad():
        assert torch.equal(again(idx).logits, got)
    assert {f: os.path.getmtime(tmp_path / "hf" / f) for f in os.listdir(tmp_path / "hf")} == before


def fake_checkpoint(path, model, meta, **config):
    """A speedgpt checkpoint of `model` with `meta`, as train.py writes one (no optimizer state)."""
    cfg = asdict(configurator.Config(**{k: getattr(model.config, k) for k in configurator.MODEL_KEYS}, **config))
    torch.save({"model": model.state_dict(), "optimizer": {}, "scaler": {}, "step": 0, "best_val_loss": None,
                "config": cfg, "meta": meta, "loader": {}, "rng": {}}, path)


def test_hf_without_a_command_names_export(capsys):
    with pytest.raises(SystemExit) as e:
        hf.main([])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: hf.py needs a command: export (python hf.py export --out_dir=out writes out/hf); to fine-tune from "
        "GPT-2, train.py takes --init_from=gpt2 (or gpt2-medium, gpt2-large, gpt2-xl, a Hugging Face folder)\n")


def test_sampling_or_scoring_a_hugging_face_folder_by_out_dir_names_init_from(hf_dir, capsys):
    """eval.py / sample.py --out_dir=<an exported Hugging Face folder> said "train first"; the folder is a model to
    read with --init_from, and the line says so."""
    import eval as eval_script
    from speedgpt.checkpoint import no_checkpoint
    said = (f"no checkpoint at {os.path.join(hf_dir, 'ckpt.pt')}: {hf_dir} holds a Hugging Face model (config.json, "
            f"as hf.py export writes): read it with --init_from={hf_dir}")
    assert no_checkpoint(str(hf_dir)) == said
    with pytest.raises(SystemExit) as e:
        eval_script.main([f"--out_dir={hf_dir}", "--device=cpu"])
    assert said in capsys.readouterr().err and e.value.code == 1


def test_an_empty_to_is_one_line(tmp_path, capsys):
    """--to= (empty) exported to the default folder, unsaid, where data.py refuses an empty --out."""
    with pytest.raises(SystemExit) as e:
        hf.main(["export", f"--out_dir={tmp_path}", "--to="])
    assert e.value.code == 2 and capsys.readouterr().err == \
        "error: --to is empty: give the folder to write, or leave --to out for OUT_DIR/hf\n"


def test_out_for_the_output_folder_names_to(tmp_path, capsys):
    """The closest known name, --out_dir, is the run to export: the hint sent users to the wrong flag."""
    with pytest.raises(SystemExit) as e:
        hf.main(["export", f"--out_dir={tmp_path}", "--out=x"])
    assert e.value.code == 2 and capsys.readouterr().err == \
        "error: unknown flag '--out': the folder to write is --to (--out_dir names the training run to export)\n"


def test_an_export_without_the_tokenizers_files_writes_nothing(tmp_path, monkeypatch):
    """Offline without tiktoken's cache, exporting a GPT-2-token run wrote config.json and model.safetensors, then
    failed on the tokenizer: a model without its tokenizer (or beside an earlier export's). The files are read
    first: one line, and the folder is not made."""
    import tiktoken.load
    model = GPT(GPTConfig(vocab_size=50257, block_size=32, n_layer=1, n_head=2, n_embd=32)).eval()
    fake_checkpoint(tmp_path / "ckpt.pt", model, {"tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256})

    def offline(url, sha256):
        raise OSError("no network")
    monkeypatch.setattr(tiktoken.load, "read_file_cached", offline)
    with pytest.raises(FileNotFoundError, match=r"^could not read tiktoken's GPT-2 file vocab.bpe \(no network\): "
                                                r"offline, point TIKTOKEN_CACHE_DIR at a folder holding it$"):
        hf.export_hf(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()


def test_export_writes_the_gpt2_tokenizer(tmp_path):
    """GPT-2 BPE data: the export holds the GPT-2 tokenizer (from tiktoken's files), which encodes as
    data.py does; greedy generation in transformers matches model.generate. The checkpoint predates the
    activation key (read as gelu). A later byte-level export into the same folder removes the tokenizer."""
    tok = gpt2_tokenizer()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50257, block_size=32, n_layer=1, n_head=2, n_embd=32)).eval()
    fake_checkpoint(tmp_path / "ckpt.pt", model, {"tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256})
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    del ckpt["config"]["activation"]
    torch.save(ckpt, tmp_path / "ckpt.pt")
    to = hf.export_hf(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.json", "merges.txt"} <= set(os.listdir(to))
    hf_tok = transformers.AutoTokenizer.from_pretrained(to)
    text = "ROMEO:\nBut, soft! what light through yonder window breaks?  naïve café ☕\n\n\tdef f(x): return x**2"
    ids = tok.encode(text)
    assert hf_tok.encode(text) == ids and hf_tok.decode(ids) == text and hf_tok.eos_token_id == 50256
    exported = transformers.AutoModelForCausalLM.from_pretrained(to).eval()
    assert exported.config.activation_function == "gelu" and exported.config.eos_token_id == 50256
    prompt = torch.tensor([ids[:8]])
    with torch.no_grad():
        want = model.generate(prompt, 6, top_k=1)
        got = exported.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=50256)
    assert got.tolist() == want.tolist()
    byte_model = GPT(GPTConfig(vocab_size=257, block_size=32, n_layer=1, n_head=2, n_embd=32))
    fake_checkpoint(tmp_path / "byte.pt", byte_model, {"tokenizer": "byte", "vocab_size": 257, "eot_id": 256})
    hf.export_hf(str(tmp_path / "byte.pt"), to)               # over the GPT-2 export: its tokenizer goes
    assert not set(hf.TOKENIZER_FILES) & set(os.listdir(to))


def test_errors_are_one_line(byte_data, hf_dir, tmp_path, monkeypatch):
    """Bad input gets one line naming the problem: init_from values, shapes that do not fit, a model
    GPT-2 (or model.py) cannot express, a missing package, exports that would lose or clobber something."""
    errors = []

    def check(error, match, fn, *args):
        with pytest.raises(error, match=match) as e:
            fn(*args)
        errors.append(str(e.value))

    check(ValueError, "'init_from' must be scratch, resume, gpt2, gpt2-medium", configurator.load_config,
          ["--init_from=gpt3"])
    check(ValueError, r"a folder without config.json", configurator.load_config, [f"--init_from={tmp_path}"])
    run = tmp_path / "trained"                  # a training run's folder: its config.json is ours, not HF's
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "ckpt.pt").write_bytes(b"")
    check(ValueError, rf"^init_from='{run}' is a training run's folder: start from its checkpoint, "
          rf"--init_from={run}/ckpt.pt \(or another kept file there\), or continue the run with --init_from=resume "
          rf"--out_dir={run}$", configurator.load_config, [f"--init_from={run}"])
    (run / "ckpt.pt").unlink()                  # lost: its newest kept step is named instead
    for name in ("ckpt_step000002.pt", "ckpt_step000010.pt", "ckpt_best.pt"):
        (run / name).write_bytes(b"")
    check(ValueError, rf"^init_from='{run}' is a training run's folder: start from its checkpoint, "
          rf"--init_from={run}/ckpt_step000010.pt \(or", configurator.load_config, [f"--init_from={run}"])
    check(ValueError, "block_size=128 exceeds the 64 positions of", train.main,
          tiny_args(byte_data, tmp_path / "o", f"--init_from={hf_dir}", "--block_size=128"))
    big_vocab = save_tiny_gpt2(tmp_path / "v300", vocab_size=300)
    check(ValueError, "has a 300-token vocabulary but the data has 257", train.main,
          tiny_args(byte_data, tmp_path / "o", f"--init_from={big_vocab}"))
    bad = tmp_path / "bad"                                     # config.json and weights disagree
    shutil.copytree(hf_dir, bad)
    c = json.load(open(bad / "config.json"))
    json.dump({**c, "n_embd": 64}, open(bad / "config.json", "w"))
    check(ValueError, r"has shape \(.*\) in the weights but \(.*\) by its config.json", hf.load_hf_gpt2, str(bad))
    json.dump({**c, "n_inner": 64}, open(bad / "config.json", "w"))
    check(ValueError, "n_inner=64, which model.py cannot express", hf.load_hf_gpt2, str(bad))
    json.dump({"model_type": "llama"}, open(bad / "config.json", "w"))
    check(ValueError, "is a 'llama' model, not GPT-2", hf.load_hf_gpt2, str(bad))
    os.remove(bad / "model.safetensors")
    json.dump(c, open(bad / "config.json", "w"))
    check(FileNotFoundError, "could not load .* no file named model.safetensors", hf.load_hf_gpt2, str(bad))
    state = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).state_dict()
    state["transformer.h.1.mlp.c_fc.weight"] = state["transformer.h.1.mlp.c_fc.weight"][:, :100]
    check(ValueError, r"h.1.mlp.c_fc.weight has shape \(100, 32\) \(Conv1D, transposed\) "
                      r"but the model needs \(128, 32\)",
          hf.copy_hf_state, GPT(GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=2, n_embd=32, bias=True)),
          state, "m")

    train.main(tiny_args(byte_data, tmp_path / "run", "--max_iters=2"))
    ckpt_path = str(tmp_path / "run" / "ckpt.pt")
    check(ValueError, "is the checkpoint's folder", hf.export_hf, ckpt_path, str(tmp_path / "run"))
    check(FileNotFoundError, "no checkpoint at", hf.export_hf, str(tmp_path / "none" / "ckpt.pt"), str(tmp_path / "x"))
    with pytest.raises(SystemExit, match="^error: no checkpoint at"):
        hf.main(["export", f"--out_dir={tmp_path / 'none'}"])
    (tmp_path / "afile").write_text("")                      # --to under a file: the folder named, and the way out
    with pytest.raises(SystemExit, match=re.escape(f"error: cannot create the output folder {tmp_path}/afile/sub: "
                                                   f"{tmp_path}/afile is a file, not a folder; choose another --to")):
        hf.main(["export", f"--out_dir={tmp_path / 'run'}", f"--to={tmp_path / 'afile' / 'sub'}"])
    torch.manual_seed(0)
    untied = GPT(GPTConfig(vocab_size=257, block_size=32, n_layer=1, n_head=2, n_embd=32, tie_embeddings=False))
    fake_checkpoint(tmp_path / "untied.pt", untied, {"tokenizer": "byte", "vocab_size": 257, "eot_id": 256})
    check(ValueError, r"trained with tie_embeddings=False, which Hugging Face's GPT-2 cannot hold \(it has the output "
                      r"head tied to the embedding\)", hf.export_hf, str(tmp_path / "untied.pt"), str(tmp_path / "x"))

    class GPTWithExtra(GPT):                                   # a model.py feature GPT-2 has no place for
        def __init__(self, config):
            super().__init__(config)
            self.gate = torch.nn.Parameter(torch.ones(1))
    monkeypatch.setattr(hf, "GPT", GPTWithExtra)
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["model"]["gate"] = torch.ones(1)
    torch.save(ckpt, tmp_path / "extra.pt")
    check(ValueError, "cannot be expressed as HF GPT-2: it has no place for gate", hf.export_hf,
          str(tmp_path / "extra.pt"), str(tmp_path / "x"))
    monkeypatch.undo()
    monkeypatch.setitem(hf.ACTIVATION_TO_HF, "gelu", "relu")    # a mapping that is wrong: the check catches it
    check(ValueError, "exported logits differ from the checkpoint's", hf.export_hf, ckpt_path, str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x")                 # nothing written by a refused export
    monkeypatch.undo()

    monkeypatch.setitem(sys.modules, "transformers", None)    # transformers not installed
    check(ValueError, r"init_from='.*' needs the transformers package: pip install transformers", train.main,
          tiny_args(byte_data, tmp_path / "o", f"--init_from={hf_dir}"))
    check(ValueError, "export needs the transformers package", hf.export_hf, ckpt_path, str(tmp_path / "x"))
    assert all("\n" not in e for e in errors), errors


def test_gpt2_weights_on_data_of_another_tokenizer_are_refused_before_any_download(byte_data, tmp_path, monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("downloaded before the check")
    monkeypatch.setattr(hf, "load_hf_gpt2", no_download)
    with pytest.raises(ValueError, match=r"init_from='gpt2' is GPT-2 weights, for GPT-2 tokens, but .* holds byte "
                                         r"tokens: prepare the data with `python data.py --tokenizer gpt2"):
        train.main(tiny_args(byte_data, tmp_path, "--init_from=gpt2"))


def test_export_refuses_the_checkpoints_folder_through_a_link(tmp_path):
    """--to a symbolic link to the run's folder (or --out_dir through one) passed the check, compared with abspath,
    and the export overwrote the training config.json: refused as the folder itself is, before anything is read."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    for ckpt, to in (("run", "link"), ("link", "run")):
        with pytest.raises(ValueError, match=f"^--to {tmp_path / to} is the checkpoint's folder"):
            hf.export_hf(str(tmp_path / ckpt / "ckpt.pt"), str(tmp_path / to))
    assert (tmp_path / "run" / "config.json").read_text() == "{}"


def test_export_refuses_another_runs_folder(byte_data, tmp_path):
    """--to another training run's folder (train.py's out_dir) passed the checkpoint's-folder check, and the export's
    config.json replaced that run's resolved config, unsaid: refused in one line, the run's files untouched."""
    train.main(tiny_args(byte_data, tmp_path / "run", "--max_iters=2"))
    other = tmp_path / "other"
    for kept in ("ckpt.pt", "metrics.jsonl", "ckpt_step000010.pt"):     # each alone marks a run's folder
        other.mkdir()
        (other / "config.json").write_text('{"out_dir": "other"}')
        (other / kept).write_bytes(b"")
        with pytest.raises(SystemExit, match=f"^error: --to {other} is a training run's folder: its config.json "
                                             f"would overwrite the run's; export to a subfolder, e.g. {other}/hf$"):
            hf.main(["export", f"--out_dir={tmp_path / 'run'}", f"--to={other}"])
        assert (other / "config.json").read_text() == '{"out_dir": "other"}'
        shutil.rmtree(other)
    hf.main(["export", f"--out_dir={tmp_path / 'run'}", f"--to={tmp_path / 'hf'}"])     # a folder of its own: written
    hf.main(["export", f"--out_dir={tmp_path / 'run'}", f"--to={tmp_path / 'hf'}"])     # and written again
    # any other model's folder, or one of a user's files, is left alone: its config and tokenizer were replaced
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text('{"model_type": "llama"}')
    (llama / "tokenizer.json").write_text("{}")
    with pytest.raises(SystemExit, match=re.escape(f"error: --to {llama} holds files hf.py export did not write "
                                                   "(config.json, tokenizer.json): export into a new or empty folder, "
                                                   "or an earlier export's")):
        hf.main(["export", f"--out_dir={tmp_path / 'run'}", f"--to={llama}"])
    assert sorted(os.listdir(llama)) == ["config.json", "tokenizer.json"]
    assert (llama / "config.json").read_text() == '{"model_type": "llama"}'
    (tmp_path / "empty").mkdir()
    hf.main(["export", f"--out_dir={tmp_path / 'run'}", f"--to={tmp_path / 'empty'}"])    # an empty folder: written
