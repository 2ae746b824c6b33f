import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("WANDB_MODE", "offline")
_shared_cache = os.path.join(ROOT, "..", "shared", "tiktoken_cache")
if "TIKTOKEN_CACHE_DIR" not in os.environ and os.path.isdir(_shared_cache):
    os.environ["TIKTOKEN_CACHE_DIR"] = _shared_cache

from speedgpt import corpus  # noqa: E402
import data  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a minute or more on a 2-core CPU (torchrun, signals, compile, bench.py's "
                                       "ladder); make test-fast leaves them out")
    # torchao's own use of a deprecated torch API, not the project's
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def gpt2_tokenizer():
    """data.get_tokenizer("gpt2"), or the calling test skipped with the reason: tiktoken's GPT-2 files are missing
    (offline without TIKTOKEN_CACHE_DIR)."""
    try:
        return data.get_tokenizer("gpt2")
    except FileNotFoundError as e:
        pytest.skip(f"GPT-2 tokenizer files unavailable: {str(e).split(' (')[0]}")


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """A folder of 80 real documents of varied length: the first stdlib .py files."""
    src = tmp_path_factory.mktemp("corpus")
    for i, (path, _, _) in enumerate(corpus.iter_texts(None)):
        if i >= 80:
            break
        shutil.copy(path, src / f"{i:03d}_{os.path.basename(path)}")
    return src


@pytest.fixture(scope="session")
def byte_data(corpus_dir, tmp_path_factory):
    """corpus_dir prepared with the byte tokenizer, 20% of documents in val."""
    out = tmp_path_factory.mktemp("byte_data")
    data.prepare(str(corpus_dir), str(out), "byte", val_frac=0.2, seed=0, workers=2)
    return out


def tiny_args(data_dir, out_dir, *extra):
    """Command line for a small, fast CPU run of train.main."""
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--n_layer=2", "--n_head=2", "--n_embd=32",
            "--block_size=64", "--batch_size=4", "--max_iters=8", "--eval_interval=4", "--eval_tokens=512",
            "--log_interval=1", "--timing_warmup=1", "--warmup_iters=2", *extra]


def sigterm_in_step(monkeypatch, at):
    """Make the run send itself SIGTERM as optimizer step `at` begins (optim.set_lr's call): train.py's handler only
    sets a flag, so step `at` ends, then the stop's checkpoint is written. Returns the real set_lr, to put back."""
    import signal

    from speedgpt import optim
    real = optim.set_lr

    def signal_at(opt, step, *args):
        if step == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(opt, step, *args)
    monkeypatch.setattr(optim, "set_lr", signal_at)
    return real


def proc_stat(pid):
    """(state, parent pid) of a process from Linux's /proc, or None where there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    return fields[0], int(fields[1])


def children(pid):
    """The pids whose parent is `pid`."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and (proc_stat(e) or (None, None))[1] == pid]


def sigterm_once_a_child_runs(cmd):
    """Start `cmd` (a script that runs train.py processes) from ROOT, send it SIGTERM once its first child runs,
    and return (its exit status, its stderr, the children that outlived it). Nothing of it is left running."""
    import signal
    import subprocess
    import time
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, child = time.time() + 120, []
    while not child and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        child = children(proc.pid)
    try:
        assert child, "no child started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        time.sleep(0.5)
        return proc.returncode, err, [pid for pid in child if (proc_stat(pid) or ("Z",))[0] != "Z"]  # zombies: dead
    finally:                                # nothing of the test left training
        proc.kill()
        for pid in children(proc.pid) + child:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def read_metrics(out_dir, running=False):
    """The records of out_dir/metrics.jsonl. running=True for a file another process may be writing now: its
    last line, half written, is left out (as a resume leaves out a line a crash cut short) instead of failing."""
    import json
    if running:
        from speedgpt.measure import read_metrics as read_running
        return read_running(os.path.join(out_dir, "metrics.jsonl"))[0]
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="session")
def short_data(corpus_dir, tmp_path_factory):
    """400 short documents (1 to 300 bytes: slices of real source files), byte tokenizer: most
    rows of a padded batch are mostly padding, and a packed row holds several documents."""
    import random
    text = "".join(p.read_text(errors="replace") for p in sorted(corpus_dir.iterdir())[:5])
    rng = random.Random(0)
    src = tmp_path_factory.mktemp("short_docs")
    for i in range(400):
        n = rng.choice([1, 2, rng.randint(3, 40), rng.randint(40, 300)])
        start = rng.randrange(len(text) - n)
        (src / f"{i:04d}.txt").write_text(text[start:start + n])
    out = tmp_path_factory.mktemp("short_data")
    data.prepare(str(src), str(out), "byte", val_frac=0.1, seed=0, workers=2)
    return out


def outputs_and_grads(model, *args, **kwargs):
    """(logits or None, loss, {parameter name: gradient}) of one forward and backward of `model`: what
    the backend-parity tests compare between two ways of computing the same thing."""
    logits, loss = model(*args, **kwargs)
    loss.backward()
    return (None if logits is None else logits.detach()), loss.detach(), \
        {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_same_outputs(got, want, rtol, atol, grad_rtol=None, grad_atol=None):
    """outputs_and_grads results `got` and `want` agree: the loss, and the logits where both have them,
    to rtol/atol; every gradient to grad_rtol/grad_atol (default the same), naming the parameter."""
    import torch
    if got[0] is not None and want[0] is not None:
        torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=atol)
    torch.testing.assert_close(got[1], want[1], rtol=rtol, atol=atol)
    assert got[2].keys() == want[2].keys()
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, rtol=grad_rtol if grad_rtol is not None else rtol,
                                   atol=grad_atol if grad_atol is not None else atol, msg=lambda m: f"{name}: {m}")


def rotary_reference(x, position_ids, base=10000.0):
    """The rotary embedding (Su et al. 2021, RoFormer, section 3.4) of x (B, T, nh, hs) at positions position_ids
    ((T,) or (B, T)), written apart from model.py's: channels i and i + hs/2 of a head as one complex number,
    multiplied by exp(1j * position * base^(-2i/hs)) (the half-split pairing of GPT-NeoX and Llama's Hugging Face
    port), in float64. The reference model.rotary is tested against."""
    import torch
    hs = x.size(-1)
    pos = position_ids if position_ids.dim() == 2 else position_ids[None]
    angle = pos[..., None].double() * base ** (-torch.arange(0, hs, 2, dtype=torch.float64, device=x.device) / hs)
    z = torch.complex(x[..., :hs // 2].double(), x[..., hs // 2:].double())
    z = z * torch.polar(torch.ones_like(angle), angle)[:, :, None]                     # (B, T, nh, hs/2)
    return torch.cat((z.real, z.imag), dim=-1).to(x.dtype)


def set_qk_blocks(model, rope, qk_norm):
    """Turn rotary embeddings and QK-norm on or off in every layer of `model` (a GPT built with them, for the
    QK-norm gains), weights unchanged: the same model with and without the change to q and k."""
    for block in model.transformer.h:
        block.attn.rope, block.attn.qk_norm = rope, qk_norm


def packed_b_logits_and_grad(m, a, b, device="cpu"):
    """Documents a then b (lists of ids) packed in one row of `m` (a GPT) with the document mask: (b's logits,
    the gradient of their sum with respect to the token embeddings of a, and of b)."""
    import torch
    idx = torch.tensor([a + b], device=device)
    doc_ids = torch.tensor([[0] * len(a) + [1] * len(b)], device=device)
    emb = []

    def keep(module, inputs, out):          # returns None: the output is unchanged
        out.retain_grad()
        emb.append(out)
    hook = m.transformer.wte.register_forward_hook(keep)
    try:
        logits, _ = m(idx, doc_ids=doc_ids)
    finally:
        hook.remove()
    logits[0, len(a):].float().sum().backward()
    return logits[0, len(a):].detach(), emb[0].grad[0, :len(a)], emb[0].grad[0, len(a):]


def tiny_model(seed=0, **kw):
    """A float32 GPT of 2 layers, n_embd 32, the byte vocabulary (257), block_size 64 (tests/test_train.py,
    tests/test_optim.py)."""
    import torch
    from model import GPT, GPTConfig
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**dict(block_size=64, vocab_size=257, n_layer=2, n_head=2, n_embd=32), **kw}))


def tiny_gpt(attention="sdpa", dropout=0.1, vocab_size=64, **kw):
    """A float64 GPT of 3 layers, n_embd 32, block_size 32, dropout on: the model of the transform and
    fused-head tests (tests/test_activation_checkpointing.py, tests/test_fused_ce.py)."""
    import torch
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, vocab_size=vocab_size, n_layer=3, n_head=2, n_embd=32, dropout=dropout,
                         attention=attention, **kw)).double()


def losses(out_dir):
    """{step: training loss} of a run's metrics.jsonl."""
    return {r["step"]: r["loss"] for r in read_metrics(out_dir) if "loss" in r}


def run_with_file_limit(args, limit, tmp_path):
    """train.py in a subprocess whose files may not grow past `limit` bytes (RLIMIT_FSIZE: the write that
    passes it fails as a full disk would, EFBIG instead of ENOSPC)."""
    import resource
    import signal
    import subprocess
    def limit_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)                 # fail the write instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                          preexec_fn=limit_files, env=env, timeout=300)


def build_preset(path):
    """(config, GPT on the meta device) of the preset config file `path` (tests/test_presets.py,
    tests/test_fp8.py)."""
    import torch
    from configurator import load_config
    from model import GPT, GPTConfig
    cfg = load_config(["--config", path])
    with torch.device("meta"):
        return cfg, GPT(GPTConfig.from_dict(vars(cfg), 50257, attention="sdpa"))   # auto resolves on the GPU


# -----------------------------------------------------------------------------
# bits per byte: texts of characters of 1 to 4 UTF-8 bytes (tests/test_evaluation.py, tests/test_corpus.py)


TEXTS = ["héllo wörld, ünïcode ✓ 日本語", "def f(x):\n    return x * 2\n", "naïve café: «quotes» — dash",
         "plain ascii text, nothing more", "emoji 🙂 and a tab\there", "Ωμέγα and ÅÄÖ, 中文字"]


# -----------------------------------------------------------------------------
# data files (tests/test_data.py, tests/test_corpus.py, tests/test_shards.py)


DOCS = ["def f(x):\n    return x + 1\n", "print('<|endoftext|> is just text here')\n",
        "naïve café ☕ — unicode\n", "x", "a" * 500, "class A:\n    pass\n"]


def _write_docs(folder, docs):
    os.makedirs(folder, exist_ok=True)
    for i, d in enumerate(docs):
        with open(os.path.join(folder, f"doc{i:03d}.txt"), "w", encoding="utf-8") as f:
            f.write(d)


def _write_jsonl(path, docs, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d, "title": "t"}) + "\n")


def _stream(out, split):
    """A split's tokens, all shards end to end."""
    import numpy as np
    return np.concatenate([np.asarray(data.read_shard(p)) for p in data.find_shards(out, split)])


def _split_docs(tokens, eot):
    """Documents of a stream under the BOS convention: each starts with end-of-text."""
    import numpy as np
    assert len(tokens) == 0 or tokens[0] == eot, "every document must start with end-of-text"
    starts = np.flatnonzero(tokens == eot)
    return [tokens[a + 1:b].tolist() for a, b in zip(starts, np.append(starts[1:], len(tokens)))]


def _folder_state(folder):
    """{file name: bytes} of a folder: what "exactly as it was" compares."""
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder))}


def _foreign_shards(folder, toks):
    """Shards as llm.c's fineweb.py writes them: no meta.json, its file names, EOT before each document."""
    import numpy as np
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    for split in ("train", "val"):
        with open(folder / f"fineweb_{split}_000000.bin", "wb") as f:
            f.write(header.tobytes())
            f.write(toks.astype(np.uint16).tobytes())


@pytest.fixture(scope="session")
def big_jsonl(tmp_path_factory):
    """~60 MB of JSON lines: a preparation that lasts several seconds with one worker."""
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    _write_jsonl(path, [f"line {i} " * 50 for i in range(180_000)])
    return path


# -----------------------------------------------------------------------------
# HellaSwag (tests/test_hellaswag.py, tests/test_eval.py)


HELLASWAG_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "hellaswag_fixture.jsonl")


@pytest.fixture(scope="module")
def hf_gpt2_dir(tmp_path_factory):
    """A random tiny GPT-2 with GPT-2's vocabulary, saved as Hugging Face saves it."""
    import torch
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128,
                                                              vocab_size=50257))
    with torch.no_grad():              # weights off their init, so the endings' losses differ clearly
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf_gpt2_50257")
    hf.save_pretrained(path)
    return str(path)


@pytest.fixture(autouse=True)
def wandb_session_ends_with_its_test():
    """A W&B session outlives train.main: a test that fails before its wandb.teardown() would leave it to the
    next test, whose WANDB_DIR it would then ignore. End it after every test that started one."""
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


def poison_step(monkeypatch, step, value):
    """train.forward_backward with `value` (inf or nan) injected at optimizer step `step` into one activation (an
    input of block 0's c_attn) and into the gradient flowing back through block 0's MLP."""
    import train
    real, calls = train.forward_backward, []

    def poisoned(model, batches, *args, **kwargs):
        calls.append(1)
        if len(calls) - 1 != step:
            return real(model, batches, *args, **kwargs)
        block = model.transformer.h[0]

        def activation(module, inputs, out):
            out = out.clone()
            out[0, 1, 2] = value
            return out

        def gradient(module, inputs, out):
            out.register_hook(lambda g: g * value)
        hooks = [block.ln_1.register_forward_hook(activation), block.ln_2.register_forward_hook(gradient)]
        try:
            return real(model, batches, *args, **kwargs)
        finally:
            for h in hooks:
                h.remove()
    monkeypatch.setattr(train, "forward_backward", poisoned)
    return calls                            # clear it to poison the same step of the next run


def on(device, world=1):
    """A single process's Proc on `device` (a name or a torch.device), for a feature's check(cfg, proc)."""
    import torch
    from speedgpt.distributed import Proc
    return Proc(0, 0, world, torch.device(device))


@pytest.fixture
def hopper(monkeypatch):
    """A stand-in FP8 GPU for fp8.check where none is: speedgpt.features.fp8.capability answers (9, 0) for any
    device, so the checks after its device check run (they refuse before any kernel would). Returns a Proc on cuda."""
    from speedgpt.features import fp8
    monkeypatch.setattr(fp8, "capability", lambda device: (9, 0))
    return on("cuda")


class Launch:
    """Stands in for a Triton kernel (or autotuned one): records the arguments of its launch, kernel[grid](...)."""

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def in_interpreter(code):
    """Run `code` (Python, with the checkout and tests/ on its path) in a fresh process with TRITON_INTERPRET=1 set
    before Triton is imported: Triton binds its own jit helpers (in triton.language) to the interpreter at import, so
    once another test has imported Triton, setting the variable here would no longer take effect. Triton 3.6's
    interpreter takes int() of a scalar argument, which it holds as a one-element array and numpy 2.4 refuses to
    convert (a loop bound such as range(0, w, BLOCK)): that process takes .item() instead. Skips without Triton."""
    import subprocess
    pytest.importorskip("triton", reason="needs Triton (for its interpreter)")
    fix = ("import triton.runtime.interpreter as i\n"
           "def patch(tensor, scope, patch=i._patch_lang_tensor):\n"
           "    patch(tensor, scope)\n"
           "    scope.set_attr(tensor, '__index__', lambda self: int(self.handle.data.item()))\n"
           "i._patch_lang_tensor = patch\n")
    path = f"import sys; sys.path[:0] = [{ROOT!r}, {os.path.join(ROOT, 'tests')!r}]\n"
    out = subprocess.run([sys.executable, "-c", path + fix + code], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def hopper_ptx(kernel, bound, num_warps):
    """The PTX Triton makes of `kernel` (a triton.jit function) launched with `bound` ({parameter: the value a launch
    passes}, tensors on any device) for a Hopper GPU (sm_90), compiled here without one and specialized as a launch
    specializes (Triton's own rule: pointers, and integers that are multiples of 16 unless the kernel says
    do_not_specialize). Skips the test without Triton, or with one whose compiler API this does not know."""
    pytest.importorskip("triton", reason="needs Triton (its compiler)")
    try:
        import triton
        from triton.backends.compiler import BaseBackend, GPUTarget
        from triton.compiler import ASTSource
        from triton.runtime.jit import native_specialize_impl
    except ImportError as e:
        pytest.skip(f"this Triton ({triton.__version__}) compiles another way: {e}")
    sig, const, attrs = {}, {}, {}
    for p in kernel.params:
        if p.is_constexpr:
            sig[p.name], const[p.name] = "constexpr", bound[p.name]
            continue
        sig[p.name], key = native_specialize_impl(BaseBackend, bound[p.name], p.is_const, not p.do_not_specialize,
                                                  not p.do_not_specialize_on_alignment)
        if key:
            attrs[(p.num,)] = BaseBackend.parse_attr(key)
    return triton.compile(ASTSource(kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps}).asm["ptx"]
