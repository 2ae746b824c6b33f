"""benchmarks/vs_nanogpt.py on the CPU: the launcher gives nanoGPT's bench.py the size's shape and nothing else
(a stand-in nanoGPT records what it was given), the peer's tokens/s come from its own timing line, and bad
input is refused in one line."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import vs_nanogpt  # noqa: E402


@pytest.fixture
def fake_nanogpt(tmp_path):
    (tmp_path / "model.py").write_text("class GPTConfig:\n    def __init__(self, **kw):\n        self.kw = kw\n")
    (tmp_path / "bench.py").write_text(
        "import sys\nfrom model import GPTConfig\n"
        "c = GPTConfig(block_size=1024, n_layer=12, n_head=12, n_embd=768, dropout=0, bias=False)\n"
        "print(sys.argv[1:], sorted(c.kw.items()))\n"
        "print('time per iteration: 250.0000ms, MFU: 40.00%')\n")
    return tmp_path


def test_the_peer_runs_its_own_bench_at_the_size_and_batch(fake_nanogpt, tmp_path):
    log = tmp_path / "peer.log"
    assert vs_nanogpt.peer(str(fake_nanogpt), "774m", 32, str(log), 60) == round(32 * 1024 / 0.25)
    text = log.read_text()
    assert "['--real_data=False', '--batch_size=32']" in text
    assert "('n_embd', 1280), ('n_head', 20), ('n_layer', 36)" in text and "('dropout', 0)" in text


def test_a_peer_without_its_timing_line_counts_zero(fake_nanogpt, tmp_path):
    (fake_nanogpt / "bench.py").write_text("raise SystemExit('no GPU')\n")
    assert vs_nanogpt.peer(str(fake_nanogpt), "124m", 64, str(tmp_path / "p.log"), 60) == 0


@pytest.mark.parametrize("argv, message", [
    ([], r"^error: --nanogpt is missing: give --nanogpt PATH"),
    (["--nanogpt", "/nonexistent"], "no nanoGPT bench.py in '/nonexistent'"),
])
def test_bad_input_is_refused_in_one_line(argv, message):
    with pytest.raises(SystemExit, match=message):
        vs_nanogpt.main(argv)


@pytest.mark.parametrize("argv, message", [
    (["--batch", "-1"], r"^error: --batch -1: a positive micro-batch \(0, the default: each preset's\)$"),
    (["--peer_batches", "16,x"], r"^error: --peer_batches '16,x': positive micro-batches, comma-separated"),
    (["--peer_batches", "0"], r"^error: --peer_batches '0': positive micro-batches"),
    (["--iters", "5"], r"^error: --iters 5 / --timeout 900: at least 6 steps"),
])
def test_bad_numbers_are_refused_in_one_line_before_anything_is_written(fake_nanogpt, tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        vs_nanogpt.main(["--nanogpt", str(fake_nanogpt), "--out", str(tmp_path / "out"), *argv])
    assert not (tmp_path / "out").exists()


def test_a_machine_without_a_gpu_is_refused_before_anything_is_written(fake_nanogpt, tmp_path, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^error: vs_nanogpt.py times trainers on a CUDA GPU, and this machine has "
                                         r"none: run it on one$"):
        vs_nanogpt.main(["--nanogpt", str(fake_nanogpt), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_fetch_comes_after_every_check_that_needs_no_clone(tmp_path, monkeypatch):
    """--fetch goes online: a bad number or a machine without a GPU is refused first, nothing fetched or written."""
    import torch
    fetched = []
    monkeypatch.setattr(vs_nanogpt, "fetch", fetched.append)
    with pytest.raises(SystemExit, match=r"^error: --iters 2 / --timeout 900"):
        vs_nanogpt.main(["--fetch", str(tmp_path / "clone"), "--iters", "2", "--out", str(tmp_path / "out")])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^error: vs_nanogpt.py times trainers on a CUDA GPU"):
        vs_nanogpt.main(["--fetch", str(tmp_path / "clone"), "--out", str(tmp_path / "out")])
    assert fetched == [] and not (tmp_path / "out").exists()


def test_a_run_whose_every_side_failed_exits_with_an_error(fake_nanogpt, tmp_path, monkeypatch):
    monkeypatch.setattr(vs_nanogpt, "peer", lambda *a: 0)
    monkeypatch.setattr(vs_nanogpt, "ours", lambda *a: None)
    with pytest.raises(SystemExit, match=f"^error: every run failed: see the logs in {tmp_path / 'out'}$"):
        vs_nanogpt.main(["--nanogpt", str(fake_nanogpt), "--out", str(tmp_path / "out"), "--ours_args=--device=cpu"])


def test_an_unknown_size_is_refused_naming_the_sizes(fake_nanogpt):
    with pytest.raises(SystemExit, match="unknown 99m; the sizes are 124m, 350m, 774m, 1558m"):
        vs_nanogpt.main(["--nanogpt", str(fake_nanogpt), "--sizes", "99m"])


def test_a_program_that_cannot_start_is_logged_not_raised(tmp_path):
    log = tmp_path / "missing.log"
    out = vs_nanogpt.run([str(tmp_path / "no-such-program")], str(tmp_path), str(log), 60)
    assert out.startswith(f"could not start {tmp_path / 'no-such-program'}: ") and log.read_text() == out


def test_a_process_runs_in_the_environment_given(tmp_path):
    out = vs_nanogpt.run([sys.executable, "-c", "import os; print(os.environ['PEER_SETTING'])"], str(tmp_path),
                         str(tmp_path / "env.log"), 60, env=dict(os.environ, PEER_SETTING="given"))
    assert out == "given\n"
