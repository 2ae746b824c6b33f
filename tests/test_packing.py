"""The packing guarantee: no token attends to, or is predicted from, another document; and the
end-of-text convention: every document is learned from its first token to its end."""
import json
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import data
from configurator import load_config
from speedgpt import attention as attn
import train
from conftest import (ROOT, assert_same_outputs, outputs_and_grads, packed_b_logits_and_grad, read_metrics,
                      set_qk_blocks, tiny_args)
from model import GPT, GPTConfig
from speedgpt.attention import position_ids
from speedgpt.mask_check import check_attention_mask

BACKENDS = ["naive", "sdpa", "flex", "varlen"]   # flex runs forward-only on the CPU (no backward there);
                                                  # varlen runs its reference (SDPA per sequence) on the CPU

HAND_BUILT = {
    "one document longer than the row": [0] * 16,
    "row starting mid-document, then two more": [0] * 5 + [1] * 6 + [2] * 5,
    "one-token documents": [0, 1, 2, 2, 3, 4, 4, 4, 5, 6, 6, 6, 6, 6, 7, 8],
    "long run then one token": [0] * 15 + [1],
}


def tiny(attention, T=16, **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=T, vocab_size=64, n_layer=2, n_head=2, n_embd=16, attention=attention, **kw)).eval()


@pytest.mark.parametrize("attention", BACKENDS)
@pytest.mark.parametrize("case", list(HAND_BUILT))
def test_mask_block_diagonal_hand_built(attention, case):
    doc_ids = torch.tensor([HAND_BUILT[case], HAND_BUILT["one-token documents"]])
    check_attention_mask(tiny(attention).attention_mask(doc_ids, 16, "cpu"), doc_ids)
    if attention == "varlen":                        # the loader's cu_seqlens (numpy), and with empty sequences after
        cu = torch.from_numpy(data.varlen_metadata(doc_ids.numpy())[0])
        for tail in (0, 5):
            check_attention_mask(torch.cat([cu, cu[-1:].repeat(tail)]), doc_ids)


@pytest.mark.parametrize("attention", BACKENDS)
def test_mask_block_diagonal_loader_batches(short_data, byte_data, attention):
    """Loader rows hold many short documents (short_data) or start mid-way through a long one (byte_data)."""
    m = tiny(attention, T=256)
    for folder in (short_data, byte_data):
        loader = data.Loader(str(folder), "train", batch_size=8, block_size=256, seed=1)
        batches = [next(loader) for _ in range(3)]
        for b in batches:
            check_attention_mask(m.attention_mask(b.doc_ids, 256, "cpu", b.cu_seqlens), b.doc_ids)
            assert torch.equal(b.position_ids, position_ids(b.doc_ids))
        x = torch.cat([b.x for b in batches])
        if folder == short_data:                              # rows of several documents
            assert (torch.cat([b.doc_ids for b in batches]).amax(1) >= 2).float().mean() > 0.5
        else:                                                 # rows that start inside a document
            assert (x[:, 0] != loader.eot).any()


def test_mask_check_can_fail():
    doc_ids = torch.tensor([[0] * 6 + [1] * 10])
    causal_only = attn.dense_attention_mask(torch.zeros_like(doc_ids))
    with pytest.raises(AssertionError, match="attends across a document boundary"):
        check_attention_mask(causal_only, doc_ids)
    too_strict = attn.dense_attention_mask(torch.arange(16)[None])
    with pytest.raises(AssertionError, match="blocks its own document"):
        check_attention_mask(too_strict, doc_ids)
    with pytest.raises(AssertionError, match="attends across"):
        check_attention_mask(None, doc_ids)
    # a BlockMask whose block structure leaks: every block marked full, so no mask_mod runs
    from torch.nn.attention.flex_attention import create_block_mask
    doc_ids = torch.tensor([[0] * 200 + [1] * 56])
    check_attention_mask(tiny("flex").attention_mask(doc_ids, 256, "cpu"), doc_ids)
    leaky = create_block_mask(lambda b, h, q, kv: q >= 0, 1, None, 256, 256, device="cpu")
    leaky.mask_mod = lambda b, h, q, kv: attn.document_causal_mask(doc_ids, q, kv, b)
    with pytest.raises(AssertionError, match="attends across"):
        check_attention_mask(leaky, doc_ids)
    # varlen: a missing boundary, a sequence across two rows, offsets that do not reach B*T
    doc_ids = torch.tensor([[0] * 6 + [1] * 10, [0] * 16])
    check_attention_mask(torch.tensor([0, 6, 16, 32, 32], dtype=torch.int32), doc_ids)
    with pytest.raises(AssertionError, match="attends across"):
        check_attention_mask(torch.tensor([0, 16, 32, 32], dtype=torch.int32), doc_ids)
    with pytest.raises(AssertionError, match="spans rows 0 and 1"):
        check_attention_mask(torch.tensor([0, 6, 20, 32], dtype=torch.int32), doc_ids)
    with pytest.raises(AssertionError, match="rise from 0 to B"):
        check_attention_mask(torch.tensor([0, 6, 16, 30], dtype=torch.int32), doc_ids)


def _b_logits(m, a, b, document_mask=True):
    """Pack document a then document b in one row; return b's logits."""
    idx = torch.tensor([a + b])
    doc_ids = torch.tensor([[0] * len(a) + [1] * len(b)]) if document_mask else None
    with torch.no_grad():
        logits, _ = m(idx, doc_ids=doc_ids)
    return logits[0, len(a):]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")   # eager flex: the CPU's only
@pytest.mark.parametrize("attention", BACKENDS)
def test_no_contamination_across_documents(attention):
    m = tiny(attention, T=32).double()
    g = torch.Generator().manual_seed(0)
    a, a2 = torch.randint(0, 64, (2, 13), generator=g).tolist()
    b = torch.randint(0, 64, (19,), generator=g).tolist()
    with torch.no_grad():
        alone = m(torch.tensor([b]))[0][0]
    packed = _b_logits(m, a, b)
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)          # as if b were alone
    torch.testing.assert_close(_b_logits(m, a2, b), packed, rtol=1e-10, atol=1e-10)  # a's tokens do not matter
    # the same test without the document mask detects the leak: so it can fail
    leaked = _b_logits(m, a, b, document_mask=False)
    assert (leaked - alone).abs().max() > 1e-3
    assert (_b_logits(m, a2, b, document_mask=False) - leaked).abs().max() > 1e-3


QK_BLOCKS = {"rope": dict(rope=True), "qk_norm": dict(qk_norm=True), "rope+qk_norm": dict(rope=True, qk_norm=True)}


@pytest.mark.parametrize("blocks", QK_BLOCKS)
@pytest.mark.parametrize("attention", ["naive", "sdpa", "varlen"])
def test_q_and_k_change_in_one_place_for_every_backend(attention, blocks):
    """Rotary embeddings from per-document positions and QK-norm, applied once in CausalSelfAttention.transform_qk,
    reach the backend (the output changes) and keep the packing guarantee, forward and backward: b packed after a
    gives b's logits alone (its positions restart at 0), and sends a's embeddings no gradient (tests/test_gpu.py:
    flex, varlen on the GPU)."""
    m = tiny(attention, T=32, **QK_BLOCKS[blocks]).double().train()
    on = {"rope": False, "qk_norm": False, **QK_BLOCKS[blocks]}
    with torch.no_grad():                   # sharper attention than at init, so that positions matter
        for block in m.transformer.h:
            block.attn.c_attn.weight.mul_(20)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 64, (13,), generator=g).tolist()
    b = torch.randint(0, 64, (19,), generator=g).tolist()
    with torch.no_grad():
        alone = m(torch.tensor([b]))[0][0]
        set_qk_blocks(m, rope=False, qk_norm=False)
        plain = m(torch.tensor([b]))[0][0]
        set_qk_blocks(m, **on)
    assert (alone - plain).abs().max() > 1e-3                     # the change to q and k is applied
    logits, grad_a, grad_b = packed_b_logits_and_grad(m, a, b)
    torch.testing.assert_close(logits, alone, rtol=1e-10, atol=1e-10)
    assert grad_a.abs().max() == 0 and grad_b.abs().max() > 0


@pytest.mark.parametrize("attention", ["naive", "sdpa", "varlen"])
def test_no_gradient_flows_across_documents(attention):
    """Training view: b's loss has zero gradient with respect to a's embeddings."""
    m = tiny(attention, T=32).double().train()
    a, b = list(range(10)), list(range(20, 40))
    idx = torch.tensor([a + b])
    doc_ids = torch.tensor([[0] * 10 + [1] * 20])
    emb = m.transformer.wte(idx).detach().requires_grad_(True)
    pos = m.transformer.wpe(position_ids(doc_ids))
    mask = m.attention_mask(doc_ids, 30, "cpu")
    x = emb + pos
    for block in m.transformer.h:
        x = block(x, mask)
    x[0, 10:].sum().backward()
    assert emb.grad[0, :10].abs().max() == 0 and emb.grad[0, 10:].abs().max() > 0


def test_positions_restart_and_no_target_crosses(short_data):
    """Under the BOS convention: positions restart at each end-of-text (a document's first token), and
    the only target across a document boundary is that end-of-text, a constant id."""
    loader = data.Loader(str(short_data), "train", batch_size=8, block_size=128, seed=2)
    eot = loader.eot
    for _ in range(3):
        b = next(loader)
        pos = position_ids(b.doc_ids)
        starts = b.x == eot
        starts[:, 0] = True
        assert torch.equal(pos == 0, starts)                                   # restart at each BOS
        crossing = b.doc_ids[:, 1:] != b.doc_ids[:, :-1]                       # the target is another document's
        assert (b.y[:, :-1][crossing] == eot).all() and (b.x[:, 1:][crossing] == eot).all()
        assert (b.y != -1).all()                                               # and every token is learned
        assert b.doc_ids.max() >= 2                                            # rows really hold several documents


@pytest.mark.parametrize("attention", BACKENDS)
def test_doc_ids_runs_are_documents(attention):
    """doc_ids [[0,0,0,0,1,1,1,1,0,0,0,0]]: the last four tokens are a document of their own (a run of
    equal ids), not part of the first four's."""
    m = tiny(attention, T=12).double()
    idx = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    doc_ids = torch.tensor([[0] * 4 + [1] * 4 + [0] * 4])
    check_attention_mask(m.attention_mask(doc_ids, 12, "cpu"), doc_ids)
    with torch.no_grad():
        packed = m(idx, doc_ids=doc_ids)[0][0, 8:]
        alone = m(idx[:, 8:])[0][0]
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)


def test_trainer_passes_doc_ids_only_with_the_mask(short_data, tmp_path, monkeypatch, capsys):
    seen = []
    forward = GPT.forward

    def spy(self, idx, targets=None, doc_ids=None, cu_seqlens=None, position_ids=None):
        seen.append(doc_ids is not None)
        if doc_ids is not None:      # the loader's metadata comes along: the step computes neither
            assert torch.equal(position_ids, attn.position_ids(doc_ids))
            check_attention_mask(cu_seqlens, doc_ids)
        return forward(self, idx, targets, doc_ids, cu_seqlens, position_ids)
    monkeypatch.setattr(GPT, "forward", spy)
    train.main(tiny_args(short_data, tmp_path / "a", "--max_iters=2", "--check_mask=True", "--attention=auto",
                         "--device=cpu"))
    assert seen and all(seen)
    assert json.load(open(tmp_path / "a" / "config.json"))["attention"] == "sdpa"    # auto on the CPU
    seen.clear()
    train.main(tiny_args(short_data, tmp_path / "b", "--max_iters=2", "--document_mask=False", "--device=cpu"))
    assert ("warning: packing=True with document_mask=False: tokens attend across document boundaries"
            in capsys.readouterr().out)
    assert seen and not any(seen)


def test_padding_excluded_from_tokens_per_sec(short_data, tmp_path):
    train.main(tiny_args(short_data, tmp_path, "--packing=False", "--max_iters=6"))
    rows = [r for r in read_metrics(tmp_path) if r.get("tokens_per_sec")]
    B, T = 4, 64
    assert rows and all(r["pad_frac"] > 0.1 for r in rows)     # short documents: much padding
    assert sum(r["pad_frac"] for r in rows) / len(rows) > 0.3
    for r in rows:                                            # one step per interval: tokens = real tokens
        assert r["tokens_per_sec"] * r["step_ms"] / 1000 == pytest.approx((1 - r["pad_frac"]) * B * T)


@pytest.mark.parametrize("seed", range(4))
def test_flex_block_mask_exact_on_random_doc_ids(seed):
    """The direct BlockMask construction (T a multiple of 128) against the reference, including
    long documents (full blocks) and one-token documents."""
    g = torch.Generator().manual_seed(seed)
    T = 512
    rate = [0.001, 0.01, 0.3, 0.05][seed]
    doc_ids = torch.cumsum(torch.rand(4, T, generator=g) < rate, dim=1)
    mask = attn.flex_block_mask(doc_ids)
    check_attention_mask(mask, doc_ids)
    if seed == 0:
        assert mask.full_kv_num_blocks.sum() > 0     # long documents do produce full blocks


def test_varlen_metadata_hand_built():
    """The loader's cu_seqlens and positions (numpy) on the cases that break offset logic: a row starting
    mid-document, one-token documents, rows of one document."""
    rows = [[0] * 5 + [1] * 6 + [2] * 5,                           # starts mid-document (doc 0 is a piece)
            [0, 1, 2, 2, 3, 4, 4, 4, 5, 6, 6, 6, 6, 6, 7, 8],      # one-token documents, one at each end
            [0] * 16, [3] * 16]                                    # rows of one document
    doc_ids = np.array(rows)
    cu, pos = data.varlen_metadata(doc_ids)
    want = [0, 5, 11, 16, 17, 18, 20, 21, 24, 25, 30, 31, 32, 48]  # every run, row starts included
    assert cu.dtype == np.int32 and cu.tolist() == want + [64]     # exact: the loader's default
    assert torch.equal(torch.from_numpy(pos), position_ids(torch.from_numpy(doc_ids)))
    assert pos[2].tolist() == list(range(16)) and pos[1, :4].tolist() == [0, 0, 0, 1]
    # the model's torch twin gives the same sequences, at its own (worst-case) length
    twin = attn.varlen_cu_seqlens(torch.from_numpy(doc_ids))
    assert len(twin) == 4 * 16 + 1 and twin[:len(want)].tolist() == want and (twin[len(want):] == 64).all()


def test_varlen_metadata_refuses_more_sequences_than_the_kernels_take_only_where_varlen_runs(byte_data):
    """The varlen kernels take at most 65,535 sequences a call: the loader refuses a batch of more where train.py
    runs attention='varlen' (max_docs), and nowhere else (sdpa, flex and naive have no such limit)."""
    limit = data.VARLEN_MAX_SEQS
    assert len(data.varlen_metadata(np.zeros((2, 8), dtype=np.int64), limit)[0]) == 3   # two rows, two sequences
    assert len(data.varlen_metadata(np.arange(65_535)[None], limit)[0]) == 65_536  # one-token documents, the limit
    many = np.arange(70_000 * 2).reshape(2, 70_000)
    with pytest.raises(ValueError, match="exceeds the 65,535 sequences"):
        data.varlen_metadata(many, limit)
    assert len(data.varlen_metadata(many)[0]) == 140_001
    proc = SimpleNamespace(device=torch.device("cpu"), rank=0, world=1, master=True)
    for attention, want in (("sdpa", None), ("varlen", limit)):
        cfg = load_config(["--device=cpu", f"--data_dir={byte_data}", f"--attention={attention}"])
        assert train.build_data(cfg, proc, 1, None)[1].max_docs == want


def test_varlen_paths_agree_with_sdpa_forward_and_grads(short_data):
    """varlen (its CPU reference) with the loader's cu_seqlens and positions (exact, and padded with empty
    sequences at the end), and with doc_ids alone, against sdpa's boolean document mask: the same logits and
    gradients, on a loader batch."""
    loader = data.Loader(str(short_data), "train", batch_size=4, block_size=64, seed=4)
    b = next(b for _, b in zip(range(50), loader) if b.doc_ids.max() >= 2)
    assert len(b.cu_seqlens) == (b.cu_seqlens < 4 * 64).sum() + 1                            # exact
    bp = b._replace(cu_seqlens=torch.cat([b.cu_seqlens, torch.full((9,), 4 * 64, dtype=torch.int32)]))
    out = {}
    for name, attention, kw in [("sdpa", "sdpa", {}), ("varlen, doc_ids only", "varlen", {}),
                                ("varlen, loader", "varlen",
                                 dict(cu_seqlens=b.cu_seqlens, position_ids=b.position_ids)),
                                ("varlen, padded", "varlen",
                                 dict(cu_seqlens=bp.cu_seqlens, position_ids=bp.position_ids))]:
        torch.manual_seed(0)
        m = GPT(GPTConfig(block_size=64, vocab_size=257, n_layer=2, n_head=2, n_embd=16, attention=attention)).double()
        out[name] = outputs_and_grads(m, b.x, b.y, b.doc_ids, **kw)
    for name in ("varlen, doc_ids only", "varlen, loader", "varlen, padded"):
        assert_same_outputs(out[name], out["sdpa"], rtol=1e-10, atol=1e-10, grad_rtol=1e-9, grad_atol=1e-12)


@pytest.mark.parametrize("kernel", ["FA2", "FA3"])
def test_varlen_kernel_path_traces_as_one_graph(kernel, monkeypatch):
    """On the GPU varlen calls a custom op: torch's varlen_attn (FA2), or fa3.py's packed-qkv op where
    FA3 loads. torch.compile must trace the whole model, forward and backward, with no graph break
    (fullgraph=True raises on one). The meta device runs the ops' fake implementations, so this checks
    the GPU paths' tracing, and the shapes the fakes give, on the CPU."""
    import warnings
    monkeypatch.setattr(attn, "_varlen_kernel_name", "FA3 (as if found)" if kernel == "FA3" else None)
    if kernel == "FA2" and attn.causal_varlen_attn() is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    with torch.device("meta"):
        m = tiny("varlen", T=32).train()
    doc_ids = torch.cumsum(torch.rand(3, 32) < 0.15, dim=1)
    cu, pos = data.varlen_metadata(doc_ids.numpy())
    idx = torch.zeros(3, 32, dtype=torch.long, device="meta")
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # nll_loss on the meta device warns about its autograd kernel
        _, loss = compiled(idx, idx, doc_ids.to("meta"), cu_seqlens=torch.from_numpy(cu).to("meta"),
                           position_ids=torch.from_numpy(pos).to("meta"))
        loss.backward()
    assert m.transformer.h[0].attn.c_attn.weight.grad.shape == (48, 16)
    torch._dynamo.reset()


def test_documents_are_learned_from_first_token_to_end(tmp_path):
    """Every document starts with '#' and ends with '.': after a short CPU training, sample.py from an
    empty prompt (one end-of-text, the BOS) starts most samples with '#', and most end with '.' where
    the model predicts the next document's BOS. Neither can be learned when a document's first token
    is never a target, or its last token's target is masked."""
    rng = random.Random(0)
    words = ["apple", "river", "stone", "cloud", "tiger", "lamp", "moon"]
    with open(tmp_path / "d.jsonl", "w") as f:
        for _ in range(400):
            f.write(json.dumps({"text": "#" + " ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) + "."})
                    + "\n")
    data.prepare(str(tmp_path / "d.jsonl"), str(tmp_path / "d"), "byte", val_frac=0.05, workers=1)
    train.main(tiny_args(tmp_path / "d", tmp_path / "o", "--max_iters=100", "--eval_interval=100", "--batch_size=8",
                         "--learning_rate=1e-2", "--log_interval=50"))
    proc = subprocess.run([sys.executable, "sample.py", f"--out_dir={tmp_path / 'o'}", "--start=", "--num_samples=20",
                           "--max_new_tokens=40", "--device=cpu"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    samples = [s.removesuffix("\n") for s in proc.stdout.split("-" * 60 + "\n")[:-1]]
    assert len(samples) == 20
    assert sum(s.startswith("#") for s in samples) >= 15, samples
    assert sum(s.endswith(".") and "#" not in s[1:] for s in samples) >= 15, samples
    # a checkpoint with only what sampling needs (weights, config, tokenizer metadata) samples too
    ckpt = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    os.makedirs(tmp_path / "slim")
    torch.save({k: ckpt[k] for k in ("model", "config", "meta")}, tmp_path / "slim" / "ckpt.pt")
    proc = subprocess.run([sys.executable, "sample.py", f"--out_dir={tmp_path / 'slim'}", "--num_samples=1",
                           "--max_new_tokens=5", "--device=cpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.count("-" * 60) == 1, proc.stderr
