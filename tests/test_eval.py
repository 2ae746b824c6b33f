"""eval.py on the CPU, without network, on tests/fixtures/hellaswag_fixture.jsonl: bad input is one line, and two
ranks (torchrun, gloo) score as one process; --lm_eval, lm-evaluation-harness on a checkpoint, gives our model's
log-likelihoods (skipped where lm_eval is not installed). speedgpt/hellaswag.py's own tests are in
tests/test_hellaswag.py."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import eval as eval_script
from conftest import HELLASWAG_FIXTURE as FIXTURE
from conftest import ROOT, gpt2_tokenizer
from speedgpt.corpus import get_tokenizer


@pytest.mark.parametrize("args, error", [
    (["--out_dir={tmp}/nothing"], "error: no checkpoint at {tmp}/nothing/ckpt.pt: train first"),
    (["--init_from={hf}", "--hellaswag_path={tmp}/no.jsonl"], "error: hellaswag_path='{tmp}/no.jsonl': no such file"),
    (["--init_from={hf}", "--hellaswag_path=/dev/null"], "error: hellaswag_path='/dev/null' is not a regular file: "
     "name HellaSwag's jsonl file, or leave hellaswag_path empty to download it to data/hellaswag/hellaswag_val.jsonl"),
    (["--init_from={hf}", "--examples=-1"], "error: --examples must be >= 0 (0: all), got -1\n"),
    (["--init_from={hf}", "--batch_size=0"], "error: --batch_size must be >= 1 (examples per forward), got 0\n"),
    (["--init_from={tmp}/none", f"--hellaswag_path={FIXTURE}"], "error: --init_from '{tmp}/none': no such folder "
     "(--init_from takes gpt2, gpt2-medium, gpt2-large, gpt2-xl or a Hugging Face GPT-2 folder)"),
    (["--init_from={tmp}", f"--hellaswag_path={FIXTURE}"], "error: --init_from '{tmp}': a speedgpt run folder: score "
     "its checkpoint with --out_dir {tmp}"),
    (["--init_from={tmp}/ckpt.pt", f"--hellaswag_path={FIXTURE}"], "error: --init_from '{tmp}/ckpt.pt' is a file, "
     "not a Hugging Face folder: score a speedgpt run with --out_dir {tmp} (its ckpt.pt)"),
])
def test_eval_bad_input_is_one_line(hf_gpt2_dir, tmp_path, capsys, args, error):
    fill = dict(tmp=tmp_path, hf=hf_gpt2_dir)
    (tmp_path / "ckpt.pt").write_bytes(b"")               # tmp_path: a run folder, which --init_from is not for
    (tmp_path / "config.json").write_text("{}")           # as train.py writes it: not a Hugging Face folder's
    with pytest.raises(SystemExit) as e:
        eval_script.main([a.format(**fill) for a in args] + ["--device=cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith(error.format(**fill)) and err.count("\n") == 1, err


def test_a_kept_steps_file_as_init_from_names_that_file_as_out_dir(tmp_path, capsys):
    """--init_from out/ckpt_step000004.pt said '--out_dir out (its ckpt.pt)': the latest checkpoint, another model
    than the one named; --out_dir takes the step's file itself."""
    step = tmp_path / "ckpt_step000004.pt"
    step.write_bytes(b"")
    with pytest.raises(SystemExit) as e:
        eval_script.main([f"--init_from={step}", f"--hellaswag_path={FIXTURE}", "--device=cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and f"score a speedgpt run with --out_dir {step}; a nanoGPT" in err, err


@pytest.mark.slow
def test_two_ranks_score_as_one(hf_gpt2_dir):
    """eval.py under torchrun with 2 CPU processes (gloo), the fixture's examples split between them,
    prints the single process's score (acc_norm, acc, n)."""
    gpt2_tokenizer()                            # skips offline without tiktoken's files: eval.py encodes with them

    def score(*launch):
        cmd = [sys.executable, *launch, "eval.py", f"--init_from={hf_gpt2_dir}", f"--hellaswag_path={FIXTURE}",
               "--device=cpu", "--batch_size=3"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (line,) = [line for line in proc.stdout.splitlines() if "hellaswag acc_norm" in line]
        return line.split(": ", 1)[1].rsplit(" | ", 2)[0], line
    one, line1 = score()
    two, line2 = score("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    assert one == two and "| 8 examples" in one, (line1, line2)
    assert "1 process(es)" in line1 and "2 process(es)" in line2


def test_a_checkpoint_and_hugging_face_weights_together_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        eval_script.main(["--out_dir=out-mine", "--init_from=gpt2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == "error: --out_dir out-mine and --init_from gpt2 name two models: give one of " \
                                        "them\n", err


# -----------------------------------------------------------------------------
# --lm_eval: EleutherAI's lm-evaluation-harness through the export and its own HFLM, offline on the CPU

@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    """The folder of a train.py run on GPT-2 BPE data (6 parts of data_sources/shakespeare, 8 steps of a
    2-layer model, block_size 64): a checkpoint the harness can read."""
    import data
    import train
    from conftest import tiny_args
    try:
        data.get_tokenizer("gpt2")
    except FileNotFoundError as e:
        pytest.skip(f"GPT-2 tokenizer files unavailable: {e}")
    src = tmp_path_factory.mktemp("shakespeare")
    for i in range(6):
        shutil.copy(os.path.join(ROOT, "data_sources", "shakespeare", f"part_{i:02d}.txt"), src)
    data_dir, out = tmp_path_factory.mktemp("shakespeare_gpt2"), tmp_path_factory.mktemp("gpt2_run")
    data.prepare(str(src), str(data_dir), "gpt2", val_frac=0.3, seed=0, workers=1)
    train.main(tiny_args(data_dir, out, "--learning_rate=3e-3"))
    return out


def our_losses(out_dir, items):
    """(summed loss in nats, scored tokens), each (len(items), 4), of each item's 4 endings as continuations
    of its ctx (" " + ending), by speedgpt/hellaswag.py's scoring of the checkpoint in out_dir, float32."""
    from contextlib import nullcontext
    from sample import load_model
    from speedgpt import hellaswag
    from speedgpt.corpus import get_tokenizer
    model, meta = load_model(str(out_dir), "cpu")
    examples = [{"ctx": it["ctx"], "endings": it["endings"], "label": it["label"]} for it in items]
    return hellaswag.HellaSwag(examples, get_tokenizer(meta["tokenizer"]), model.config.block_size, "cpu",
                               batch_size=3).losses(model, nullcontext())


def harness_items(result, task):
    """The harness's items of `task`, in order: {"ctx": its context, "endings": its continuations without the
    delimiter, "lls": their log-likelihoods, "acc", "acc_norm": its per-item scores}."""
    items = []
    for s in sorted(result["samples"][task], key=lambda s: s["doc_id"]):
        contexts, continuations = zip(*s["arguments"])
        assert set(contexts) == {contexts[0]} and all(c[0] == " " for c in continuations)
        items.append({"ctx": contexts[0], "endings": [c[1:] for c in continuations],
                      "lls": [float(r[0][0]) for r in s["resps"]], "label": int(s["target"]),
                      "acc": s["acc"], "acc_norm": s["acc_norm"]})
    return items


MC_ITEMS = [   # 4 choices each (speedgpt/hellaswag.py scores 4); non-ASCII text, a line break, a context past block_size
    {"question": "The capital of France is", "choices": ["Paris.", "a river in spring.", "blue.", "Rome"], "answer": 0},
    {"question": "She ordered a café au lait and a", "choices": ["croissant.", "naïve bicycle.", "☕ with sugar.",
                                                                 "déjà vu."], "answer": 1},
    {"question": "ROMEO:\nBut, soft! what light through yonder window", "choices": ["breaks?", "sings?", "falls, my lord?",
                                                                                   "bends?"], "answer": 0},
    {"question": "To be, or not to be, that is the question: " * 8 + "whether 'tis nobler in the mind to",
     "choices": ["suffer", "sing the slings and arrows", "dance", "take arms against a sea of troubles"], "answer": 3},
]
MC_TASK = """task: speedgpt_mc
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {data}
output_type: multiple_choice
validation_split: validation
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
"""


@pytest.mark.parametrize("args, error", [
    (["--out_dir={tmp}"], "error: {tmp}/ckpt.pt has no Hugging Face tokenizer (byte tokens), and lm-evaluation-harness "
     "reads text through one: --lm_eval scores GPT-2 BPE models (data.py --tokenizer gpt2); without --lm_eval, "
     "eval.py scores this one on HellaSwag"),
    (["--out_dir={tmp}/ckpt.pt"], "error: {tmp}/ckpt.pt has no Hugging Face tokenizer (byte tokens)"),   # a file named
    (["--init_from={hf}"], "error: {hf} has no Hugging Face tokenizer (a folder without tokenizer files)"),
    (["--out_dir={tmp}", f"--hellaswag_path={FIXTURE}"], "error: --hellaswag_path is read by our HellaSwag, not by "
     "--lm_eval: the harness's hellaswag_local reads data/hellaswag/hellaswag_val.jsonl"),
])
def test_lm_eval_bad_input_is_one_line_before_any_work(hf_gpt2_dir, tmp_path, capsys, monkeypatch, args, error):
    """A model without a Hugging Face tokenizer (a byte-level checkpoint, a folder saved without one) is
    refused before the harness is imported: transformers would give it an empty tokenizer."""
    torch.save({"meta": {"tokenizer": "byte", "vocab_size": 257, "eot_id": 256}}, tmp_path / "ckpt.pt")
    monkeypatch.setitem(sys.modules, "lm_eval", None)      # never imported: `import lm_eval` would fail
    fill = dict(tmp=tmp_path, hf=hf_gpt2_dir)
    with pytest.raises(SystemExit) as e:
        eval_script.main([a.format(**fill) for a in args] + ["--lm_eval=hellaswag_local", "--device=cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith(error.format(**fill)) and err.count("\n") == 1, err


def test_lm_eval_on_characters_names_their_validation_loss(tmp_path, capsys, monkeypatch):
    """--lm_eval on a model of nanoGPT's characters names their validation loss as the way out: it named eval.py's
    HellaSwag, which refuses such a model too."""
    torch.save({"meta": {"tokenizer": "char", "vocab_size": 65, "eot_id": -1},
                "config": {"data_dir": "data/shakespeare_char"}}, tmp_path / "ckpt.pt")
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(SystemExit) as e:
        eval_script.main([f"--out_dir={tmp_path}", "--lm_eval=hellaswag_local", "--device=cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err == f"error: {tmp_path}/ckpt.pt has no Hugging Face tokenizer (char tokens), and " \
        "lm-evaluation-harness reads text through one: --lm_eval scores GPT-2 BPE models (data.py --tokenizer gpt2); " \
        f"its validation loss measures this one: python train.py --init_from={tmp_path}/ckpt.pt " \
        "--data_dir=data/shakespeare_char --eval_only=True --out_dir=OTHER_FOLDER\n", err


def test_lm_eval_unknown_task_and_missing_package_are_one_line(gpt2_run, capsys, monkeypatch):
    """A task the harness lacks is named before the export; without lm_eval installed, the install line, one for
    the harness and transformers both (lm-eval[hf]): without transformers it said "pip install transformers" alone."""
    import hf
    monkeypatch.setattr(hf, "export_hf", lambda *a: pytest.fail("exported before the input was checked"))

    def error(*args):
        with pytest.raises(SystemExit) as e:
            eval_script.main([f"--out_dir={gpt2_run}", "--device=cpu", *args])
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.count("\n") == 1, err
        return err
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "lm_eval", None)
        assert "--lm_eval needs lm-evaluation-harness" in error("--lm_eval=hellaswag_local") and \
            error("--lm_eval=hellaswag_local").endswith(": pip install 'lm-eval[hf]'\n")
        m.setitem(sys.modules, "transformers", None)           # neither installed: still the one line
        assert error("--lm_eval=hellaswag_local") == "error: --lm_eval needs lm-evaluation-harness and transformers " \
            "(transformers is not installed): pip install 'lm-eval[hf]'\n"
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness not installed: pip install 'lm-eval[hf]'")
    assert error("--lm_eval=hellaswag_local,no_such_task") == "error: --lm_eval no_such_task: lm-evaluation-harness " \
        "has no such task (`lm_eval ls tasks` lists them)\n"
    assert error("--lm_eval=hellaswag_local, no_such_task").startswith("error: --lm_eval no_such_task: ")   # no space
    assert error("--lm_eval=nowhere/task.yaml") == "error: --lm_eval nowhere/task.yaml: no such task file\n"


def test_lm_eval_log_likelihoods_are_our_models(gpt2_run, tmp_path):
    """eval.py --lm_eval on a checkpoint: the export read by the harness's HFLM and scored on a multiple-choice
    task defined here (a YAML over a local JSONL) gives, for every item and choice, the log-likelihood our
    own model gives the same continuation (speedgpt/hellaswag.py's scoring), within float32 rounding, the
    item past block_size cut the same way; and the harness's acc is the argmax of our log-likelihoods."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness not installed: pip install 'lm-eval[hf]'")
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(it) + "\n" for it in MC_ITEMS), encoding="utf-8")
    (tmp_path / "mc.yaml").write_text(MC_TASK.format(data=tmp_path / "mc.jsonl"))
    result = eval_script.main([f"--out_dir={gpt2_run}", f"--lm_eval={tmp_path / 'mc.yaml'}", "--device=cpu",
                               "--batch_size=3"])
    theirs = harness_items(result, "speedgpt_mc")
    assert [(it["ctx"], it["endings"]) for it in theirs] == [(m["question"], m["choices"]) for m in MC_ITEMS]
    sums, _ = our_losses(gpt2_run, theirs)
    assert len(get_tokenizer("gpt2").encode(theirs[3]["ctx"])) > 64          # past block_size: both cut its start
    lls = torch.tensor([it["lls"] for it in theirs])
    torch.testing.assert_close(lls, -sums, rtol=0, atol=2e-4)
    assert [it["acc"] for it in theirs] == [float(k == m["answer"]) for k, m in zip(lls.argmax(1).tolist(), MC_ITEMS)]
    assert result["results"]["speedgpt_mc"]["acc,none"] == pytest.approx(sum(it["acc"] for it in theirs) / 4)


def test_lm_eval_hellaswag_against_ours(gpt2_run, tmp_path, monkeypatch):
    """The harness's HellaSwag (speedgpt/hellaswag_local.yaml: its preprocessing, our file) against
    speedgpt/hellaswag.py on the fixture's 8 items, the same checkpoint. Given the harness's text, our scoring
    gives its log-likelihoods, and its acc and acc_norm per item are ours with its choices: acc the
    largest summed log-likelihood (ours too), acc_norm the largest per character of the ending (ours: per
    token). What differs is the text: it prefixes the activity label and capitalises ctx_b, and removes
    WikiHow's [header]/[title]/[step] markers, which we keep."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness not installed: pip install 'lm-eval[hf]'")
    from speedgpt import hellaswag
    os.makedirs(tmp_path / "data" / "hellaswag")
    shutil.copy(FIXTURE, tmp_path / hellaswag.CACHE)
    monkeypatch.chdir(tmp_path)                       # hellaswag_local reads data/hellaswag/hellaswag_val.jsonl
    result = eval_script.main([f"--out_dir={gpt2_run}", "--lm_eval=hellaswag_local", "--device=cpu"])
    theirs, ours = harness_items(result, "hellaswag_local"), hellaswag.load(FIXTURE)
    assert [it["label"] for it in theirs] == [ex["label"] for ex in ours]
    for it, ex in zip(theirs, ours):
        assert it["ctx"].startswith(ex["activity_label"] + ": ") and it["ctx"] != ex["ctx"]
        assert not any("[" in t for t in [it["ctx"], *it["endings"]])
    sums, _ = our_losses(gpt2_run, theirs)
    lls = torch.tensor([it["lls"] for it in theirs])
    torch.testing.assert_close(lls, -sums, rtol=0, atol=2e-4)
    chars = torch.tensor([[len(e) for e in it["endings"]] for it in theirs], dtype=torch.float64)
    labels = torch.tensor([it["label"] for it in theirs])
    assert [it["acc"] for it in theirs] == (lls.argmax(1) == labels).double().tolist()
    assert [it["acc_norm"] for it in theirs] == ((lls.double() / chars).argmax(1) == labels).double().tolist()


@pytest.mark.parametrize("device, error", [
    ("cuda", "error: device='cuda' but "),
    ("mps", "error: device='mps' but Apple's MPS backend is not available here")])
def test_lm_eval_on_a_device_this_machine_lacks_is_one_line_before_the_export(tmp_path, capsys, monkeypatch, device,
                                                                             error):
    """--lm_eval --device=cuda on a machine without CUDA (or mps without MPS) exported the checkpoint and then ended
    in the harness's traceback (AssertionError: Torch not compiled with CUDA enabled); our HellaSwag refused it in
    one line: now --lm_eval does too, before anything is read."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "lm_eval", None)      # never imported: `import lm_eval` would fail
    with pytest.raises(SystemExit) as e:
        eval_script.main([f"--out_dir={tmp_path}", "--lm_eval=hellaswag_local", f"--device={device}"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith(error) and err.count("\n") == 1, err


def test_lm_eval_of_commas_alone_names_no_task_before_any_work(tmp_path, capsys, monkeypatch):
    """--lm_eval=, exported the checkpoint, then ended in the harness's "No tasks specified": one line of ours now,
    before the checkpoint is read (it is not even one here) or the harness imported."""
    monkeypatch.setitem(sys.modules, "lm_eval", None)      # never imported: `import lm_eval` would fail
    with pytest.raises(SystemExit) as e:
        eval_script.main([f"--out_dir={tmp_path}", "--lm_eval=, ,", "--device=cpu"])
    assert e.value.code == 1 and capsys.readouterr().err == "error: --lm_eval ', ,' names no task: give the " \
        "harness's task names or YAML files, comma-separated (hellaswag_local: its HellaSwag on our file)\n"
