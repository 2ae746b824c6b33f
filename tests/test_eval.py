"""eval.py on the CPU, without network, on tests/fixtures/hellaswag_fixture.jsonl: bad input is one line, and two
ranks (torchrun, gloo) score as one process. speedgpt/hellaswag.py's own tests are in tests/test_hellaswag.py."""
import os
import subprocess
import sys

import pytest

import eval as eval_script
from conftest import HELLASWAG_FIXTURE as FIXTURE
from conftest import ROOT


@pytest.mark.parametrize("args, error", [
    (["--out_dir={tmp}/nothing"], "error: no checkpoint at {tmp}/nothing/ckpt.pt: train first"),
    (["--init_from={hf}", "--hellaswag_path={tmp}/no.jsonl"], "error: hellaswag_path='{tmp}/no.jsonl': no such file"),
    (["--init_from={hf}", "--examples=-1"], "error: --examples must be >= 0"),
    (["--init_from={tmp}/none", f"--hellaswag_path={FIXTURE}"], "error: --init_from '{tmp}/none': no such folder "
     "(--init_from takes gpt2, gpt2-medium, gpt2-large, gpt2-xl or a Hugging Face GPT-2 folder)"),
    (["--init_from={tmp}", f"--hellaswag_path={FIXTURE}"], "error: --init_from '{tmp}': a speedgpt run folder: score "
     "its checkpoint with --out_dir {tmp}"),
])
def test_eval_bad_input_is_one_line(hf_gpt2_dir, tmp_path, capsys, args, error):
    fill = dict(tmp=tmp_path, hf=hf_gpt2_dir)
    (tmp_path / "ckpt.pt").write_bytes(b"")               # tmp_path: a run folder, which --init_from is not for
    with pytest.raises(SystemExit) as e:
        eval_script.main([a.format(**fill) for a in args] + ["--device=cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith(error.format(**fill)) and err.count("\n") == 1, err


@pytest.mark.slow
def test_two_ranks_score_as_one(hf_gpt2_dir):
    """eval.py under torchrun with 2 CPU processes (gloo), the fixture's examples split between them,
    prints the single process's score (acc_norm, acc, n)."""
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
