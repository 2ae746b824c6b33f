"""HellaSwag (speedgpt/hellaswag.py) on the CPU, without network, on tests/fixtures/hellaswag_fixture.jsonl:
8 made-up examples in HellaSwag's format, labels 0, 1, 2, 3, 2, 0, 2, 3. eval.py's own tests are in
tests/test_eval.py."""
import json
from contextlib import nullcontext

import pytest
import torch
import torch.nn as nn

import eval as eval_script
import train
from conftest import HELLASWAG_FIXTURE as FIXTURE
from conftest import gpt2_tokenizer, read_metrics, tiny_args
from model import GPT, GPTConfig
from speedgpt import hellaswag
from speedgpt.corpus import get_tokenizer

LABELS = [0, 1, 2, 3, 2, 0, 2, 3]


def examples():
    return hellaswag.load(FIXTURE)


def test_the_fixture_is_hellaswag_format():
    exs = examples()
    assert [e["label"] for e in exs] == LABELS
    assert all(list(e) == list(hellaswag.FIELDS) and len(e["endings"]) == 4 for e in exs)
    assert all(e["ctx"] == (e["ctx_a"] + " " + e["ctx_b"] if e["ctx_b"] else e["ctx_a"]) for e in exs)


@torch.no_grad()
def test_losses_match_transformers_log_probabilities(hf_gpt2_dir):
    """Our score of GPT-2 weights loaded our way (load_hf_gpt2) equals one computed independently with
    GPT2LMHeadModel and tiktoken, ending by ending: summed and mean loss, and the predicted labels."""
    import tiktoken
    import transformers
    from hf import load_hf_gpt2
    gpt2_tokenizer()                                   # skips without tiktoken's GPT-2 files
    exs = examples()
    ours = load_hf_gpt2(hf_gpt2_dir).eval()
    scorer = hellaswag.HellaSwag(exs, get_tokenizer("gpt2"), ours.config.block_size, "cpu", batch_size=3)
    sums, counts = scorer.losses(ours, nullcontext())
    ref, enc = transformers.GPT2LMHeadModel.from_pretrained(hf_gpt2_dir).eval(), tiktoken.get_encoding("gpt2")
    want_sums, want_counts = torch.zeros(len(exs), 4), torch.zeros(len(exs), 4, dtype=torch.long)
    for i, ex in enumerate(exs):
        ctx = enc.encode(ex["ctx"])
        for j, ending in enumerate(ex["endings"]):
            end = enc.encode(" " + ending)
            logp = ref(torch.tensor([ctx + end])).logits[0].float().log_softmax(-1)       # (T, V)
            want_sums[i, j] = -logp[len(ctx) - 1:-1].gather(1, torch.tensor(end)[:, None]).sum()
            want_counts[i, j] = len(end)
    assert torch.equal(counts, want_counts)
    torch.testing.assert_close(sums, want_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sums / counts, want_sums / want_counts, rtol=1e-5, atol=1e-5)
    norm, total = (want_sums / want_counts).argmin(1), want_sums.argmin(1)
    assert torch.equal((sums / counts).argmin(1), norm) and torch.equal(sums.argmin(1), total)
    labels = torch.tensor(LABELS)
    got = scorer.counts(ours, nullcontext())
    assert got.tolist() == [(norm == labels).sum().item(), (total == labels).sum().item(), 8]


class Oracle(nn.Module):
    """A test double: it predicts each next token of the row "context + ending `choose(example)`" of every
    example with all the mass (logit 100), and is uniform elsewhere: that ending has loss ~0, every
    other one pays 100 nats at its first token that differs."""

    def __init__(self, exs, tok, choose):
        super().__init__()
        self.vocab_size, self.next, self.calls, self.modes = tok.vocab_size, {}, 0, set()
        for ex in exs:
            ctx, ends = hellaswag.render(ex, tok)
            row = ctx + ends[choose(ex)]
            for t in range(1, len(row)):
                self.next[tuple(row[:t])] = row[t]

    def forward(self, idx):
        self.calls += 1
        self.modes.add(self.training)
        B, T = idx.shape
        logits = torch.zeros(B, T, self.vocab_size)
        for b, row in enumerate(idx.tolist()):
            for t in range(T):
                token = self.next.get(tuple(row[:t + 1]))
                if token is not None:
                    logits[b, t, token] = 100.0
        return logits, None


@pytest.mark.parametrize("choose, want", [(lambda ex: ex["label"], 1.0)] +
                         [((lambda ex, j=j: j), LABELS.count(j) / 8) for j in range(4)],
                         ids=["the label", "ending 0", "ending 1", "ending 2", "ending 3"])
def test_a_model_told_the_answer_scores_all_and_a_fixed_ending_scores_its_share(choose, want):
    """Told the label: 100% acc and acc_norm. Always preferring ending j: the fraction of labels equal to
    j (2/8, 1/8, 3/8, 2/8 on the fixture). The model is put in eval mode and given back in train mode."""
    exs, tok = examples(), get_tokenizer("byte")
    oracle = Oracle(exs, tok, choose).train()
    result = hellaswag.HellaSwag(exs, tok, 256, "cpu", batch_size=3).evaluate(oracle, nullcontext())
    assert (result["hellaswag_acc_norm"], result["hellaswag_acc"], result["hellaswag_n"]) == (want, want, 8)
    assert oracle.modes == {False} and oracle.training and oracle.calls == 3


def test_ranks_split_the_examples_and_run_as_many_forwards():
    """Rank r of W scores examples r, r + W, ...: the per-rank counts add up to one process's, each rank's
    losses are its examples' rows of one process's, and every rank runs as many forwards (FSDP gathers
    the weights in each) though rank 2 of 3 has fewer examples."""
    exs, tok = examples(), get_tokenizer("byte")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=257, n_layer=1, n_head=2, n_embd=32)).eval()
    one = hellaswag.HellaSwag(exs, tok, 64, "cpu", batch_size=2)
    sums, _ = one.losses(model, nullcontext())
    for world in (2, 3):
        ranks = [hellaswag.HellaSwag(exs, tok, 64, "cpu", r, world, batch_size=2) for r in range(world)]
        assert sum(r.counts(model, nullcontext()) for r in ranks).tolist() == one.counts(model, nullcontext()).tolist()
        for r, rank in enumerate(ranks):
            torch.testing.assert_close(rank.losses(model, nullcontext())[0], sums[r::world], rtol=1e-5, atol=1e-5)
        assert len({rank.n_batches for rank in ranks}) == 1
    calls = []
    for r in range(3):
        oracle = Oracle(exs, tok, lambda ex: 0)
        hellaswag.HellaSwag(exs, tok, 64, "cpu", r, 3, batch_size=2).counts(oracle, nullcontext())
        calls.append(oracle.calls)
    assert calls == [2, 2, 2]                                 # 3, 3 and 2 examples, 2 per forward


def test_a_batch_larger_than_the_examples_pads_no_further():
    """batch_size beyond a rank's examples (eval.py --batch_size=100000 on 8) takes that rank's examples in one
    forward of 4 rows each, not 4 x batch_size mostly empty rows (which ran out of memory); the score is the same."""
    exs, tok = examples(), get_tokenizer("byte")
    oracle = Oracle(exs, tok, lambda ex: ex["label"])
    rows = []
    oracle.forward = (lambda f: lambda idx: (rows.append(idx.shape[0]), f(idx))[1])(oracle.forward)
    scorer = hellaswag.HellaSwag(exs, tok, 256, "cpu", 1, 3, batch_size=100_000)
    assert scorer.evaluate(oracle, nullcontext())["hellaswag_acc"] == 1.0
    assert rows == [4 * 3]                                    # rank 1 of 3 holds 3 examples; rank 0's count: 3


def test_long_rows_keep_their_end_and_rows_pad_to_a_few_lengths():
    """A row longer than block_size keeps its last block_size + 1 tokens, the ending's targets whole; rows
    are padded to a multiple of 64 (at most block_size), and a batch to a fixed number of rows."""
    ctx, ends = list(range(1, 101)), [[201, 202], [203], [204, 205, 206], [207]]
    x, y = hellaswag.make_batch([(ctx, ends)], 64, 0, 8)
    assert x.shape == y.shape == (8, 64)
    row = ctx + ends[2]                                       # 103 tokens: the last 65 are kept
    assert x[2].tolist() == row[-65:-1] and y[2].tolist() == [-1] * 61 + [204, 205, 206]
    assert (y[4:] == -1).all()                                # the padding rows score nothing
    x, y = hellaswag.make_batch([(ctx[:10], ends)], 256, 0, 4)
    assert x.shape == (4, 64) and x[0, :11].tolist() == ctx[:10] + [201] and y[0, 9:12].tolist() == [201, 202, -1]


@pytest.mark.parametrize("change, error", [
    (lambda lines: lines.__setitem__(2, "{not json"), "line 3 is not JSON"),
    (lambda lines: lines.__setitem__(1, json.dumps({k: v for k, v in json.loads(lines[1]).items() if k != "ctx_b"})),
     "line 2 lacks ctx_b"),
    (lambda lines: lines.__setitem__(4, json.dumps({**json.loads(lines[4]), "endings": ["a", "b", "c"]})),
     "line 5: endings must be a list of 4 strings"),
    (lambda lines: lines.__setitem__(0, json.dumps({**json.loads(lines[0]), "label": 4})),
     "line 1: label must be 0, 1, 2 or 3"),
])
def test_a_corrupt_file_names_the_file_and_line(tmp_path, change, error):
    lines = open(FIXTURE).read().splitlines()
    change(lines)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"{path}, {error}"):
        hellaswag.load(str(path))
    with pytest.raises(ValueError, match=error):             # train.py: at start, before any work
        train.main(tiny_args(tmp_path / "never" / "stdlib_byte", tmp_path / "o", "--hellaswag=on",
                             f"--hellaswag_path={path}"))
    assert not (tmp_path / "never").exists()


def test_on_without_the_file_stops_before_any_work(tmp_path, monkeypatch):
    """hellaswag=on: a named file that is not there, or a download that fails (here an unreachable URL),
    is one error naming the file and the way out, before any data or model work; no file is left."""
    monkeypatch.chdir(tmp_path)                               # the cache is relative to the working directory
    never = tmp_path / "never" / "stdlib_byte"                # would be prepared on first use
    with pytest.raises(FileNotFoundError, match="hellaswag_path='missing.jsonl': no such file; leave hellaswag_path "
                                                "empty to download"):
        train.main(tiny_args(never, tmp_path / "o", "--hellaswag=on", "--hellaswag_path=missing.jsonl"))
    monkeypatch.setattr(hellaswag, "URL", "http://127.0.0.1:1/hellaswag_val.jsonl")
    with pytest.raises(FileNotFoundError) as e:
        train.main(tiny_args(never, tmp_path / "o", "--hellaswag=on"))
    cache = tmp_path / "data" / "hellaswag" / "hellaswag_val.jsonl"
    assert "could not download http://127.0.0.1:1/hellaswag_val.jsonl" in str(e.value)
    assert f"curl -L -o hellaswag_val.jsonl http://127.0.0.1:1/hellaswag_val.jsonl) and put it at {cache}" in \
        str(e.value) and "--hellaswag_path=FILE" in str(e.value)
    assert not never.exists() and not cache.parent.exists()         # nor an empty data/hellaswag/
    with pytest.raises(ValueError, match="eval_tokens=0 turns evaluation off"):
        train.main(tiny_args(never, tmp_path / "o", "--hellaswag=on", f"--hellaswag_path={FIXTURE}", "--eval_tokens=0"))
    with pytest.raises(FileNotFoundError, match=f"hellaswag_path='{tmp_path}' is a folder: name HellaSwag's jsonl"):
        train.main(tiny_args(never, tmp_path / "o", "--hellaswag=on", f"--hellaswag_path={tmp_path}"))
    with pytest.raises(ValueError, match="hellaswag_path='x.jsonl' is set but hellaswag='off' would not read it"):
        train.main(tiny_args(never, tmp_path / "o", "--hellaswag_path=x.jsonl"))     # a flag never ignored
    with pytest.raises(ValueError, match="hellaswag_examples=100 is set but hellaswag='off' would not read it"):
        train.main(tiny_args(never, tmp_path / "o", "--hellaswag_examples=100"))
    assert not never.exists()


def test_auto_without_the_file_is_off_in_one_line(byte_data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    summary = train.main(tiny_args(byte_data, tmp_path / "o", "--hellaswag=auto", "--max_iters=0"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "hellaswag" in line]
    assert lines[0] == "hellaswag: auto -> off (no data/hellaswag/hellaswag_val.jsonl; --hellaswag=on downloads it, " \
                       "--hellaswag_path=FILE reads one)"
    assert len(lines) == 1                                   # resolved to the default, off: not in the config line
    assert summary["hellaswag_acc_norm"] is None and not any("hellaswag_acc" in r for r in read_metrics(tmp_path / "o"))


def test_a_run_logs_hellaswag_beside_the_loss(byte_data, tmp_path, monkeypatch):
    """A byte-level run with hellaswag=on logs acc_norm, acc, n and seconds at each evaluation, in
    metrics.jsonl and the W&B offline run, the step records as they were; the last acc_norm is the one
    eval.py gives the final checkpoint."""
    pytest.importorskip("wandb", reason="W&B is in requirements-extra.txt; this machine lacks it")
    import time
    import wandb
    from wandb_reader import history
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    out = tmp_path / "out"
    summary = train.main(tiny_args(byte_data, out, "--hellaswag=on", f"--hellaswag_path={FIXTURE}", "--wandb_log=True"))
    rows = read_metrics(out)
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [0, 4, 8]
    assert all(set(r) == {"step", "val_loss", "val_bpb", "train_seconds", "tokens", "hellaswag_acc_norm", "hellaswag_acc",
                          "hellaswag_n", "hellaswag_s"} and r["hellaswag_n"] == 8 and r["hellaswag_s"] > 0 for r in evals)
    steps = [r for r in rows if "loss" in r]
    base = {"step", "loss", "lr", "step_ms", "tokens_per_sec", "mfu", "mfu_fp8", "mem_gb", "pad_frac", "grad_norm"}
    assert [r["step"] for r in steps] == list(range(8)) and set(steps[0]) == base
    assert all(set(r) == base | {"tokens_per_sec_per_gpu"} and r["tokens_per_sec"] > 0 for r in steps[1:])
    assert summary["hellaswag_acc_norm"] == evals[-1]["hellaswag_acc_norm"]
    result = eval_script.main([f"--out_dir={out}", f"--hellaswag_path={FIXTURE}", "--device=cpu", "--batch_size=1"])
    assert result["hellaswag_acc_norm"] == evals[-1]["hellaswag_acc_norm"]
    assert result["hellaswag_acc"] == evals[-1]["hellaswag_acc"]
    wandb.teardown()                  # stop the W&B service so it closes (flushes) the run's log
    for _ in range(240):              # a loaded machine may take a while (returns when it is written)
        logged = [r for r in history(tmp_path) if "hellaswag_acc_norm" in r]
        if len(logged) == 3:
            break
        time.sleep(0.5)
    assert [(r["_step"], r["hellaswag_acc_norm"], r["val_bpb"]) for r in logged] == \
        [(r["step"], r["hellaswag_acc_norm"], r["val_bpb"]) for r in evals]
