"""
Hugging Face interop: GPT-2 weights in, the trained model out.

    python train.py --config config/finetune_shakespeare.py   # init_from='gpt2': fine-tune OpenAI's GPT-2
    python train.py --init_from=path/to/hf_folder ...          # any Hugging Face GPT-2 folder
    python hf.py export --out_dir=out                          # out/ckpt.pt -> out/hf, a GPT-2 folder

The exported folder loads anywhere the Hugging Face stack does:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("out/hf")     # the tokenizer too, for GPT-2 BPE data

model.py's GPT and Hugging Face's GPT2LMHeadModel share their parameter names. The differences the
mapping handles: HF stores the block matrices (GPT.block_linears) as Conv1D, (in, out), where nn.Linear
holds (out, in), so they are transposed; the embedding (tied to the output head in both) has vocab_size
rows there and padded_vocab_size here, the padding zeros (model.py keeps padded ids out of the
softmax); activation 'gelu_tanh' is HF's "gelu_new" (GPT-2's tanh approximation), 'gelu' is "gelu".
GPT-2's format holds GPT-2's blocks only: export refuses a model trained with another (GPT2_BLOCKS: rmsnorm,
rope, qk_norm, an untied head; relu2 through ACTIVATION_TO_HF), in one line naming every such setting.
transformers (with safetensors, which it uses for the weights) is imported only by these functions.
"""
import json
import os
import sys
from dataclasses import replace

import torch

from configurator import GPT2_BLOCKS, HF_GPT2, FlagParser
from model import GPT, GPTConfig
from speedgpt.checkpoint import checkpoint_file, load_checkpoint, load_weights, newest_kept
from speedgpt.distributed import print0
from speedgpt.shards import describe_os_error, folder_creation_error

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ACTIVATION_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
ACTIVATION_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu"}
# the GPT-2 BPE files tiktoken reads (tiktoken_ext/openai_public.py: URL and sha256); HF's merges.txt and
# vocab.json are these same two files
GPT2_BPE_FILES = {
    "merges.txt": ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
                   "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
    "vocab.json": ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
                   "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
}


def import_transformers(why):
    """The transformers module; ValueError naming the package (and `why` it is needed) when missing.
    transformers imports torchao where it is installed (for its quantizers, unused here), which prints
    warnings about torchao's own extensions: torchao is hidden from it unless this process uses it."""
    hide = "torchao" not in sys.modules
    if hide:
        sys.modules["torchao"] = None
    try:
        import transformers
        getattr(transformers.utils.import_utils, "is_torchao_available", lambda: None)()   # cached as False
    except ImportError as e:
        raise ValueError(f"{why} needs the transformers package: pip install transformers") from e
    finally:
        if hide:
            del sys.modules["torchao"]
    transformers.utils.logging.disable_progress_bar()
    return transformers


def hub_unreachable(timeout=3.0):
    """Why Hugging Face's hub cannot be reached ('' when it can): HF_HUB_OFFLINE set, or no connection to its
    host (HF_ENDPOINT's, else huggingface.co) within `timeout` seconds. Asked before a download, because offline
    the hub's client retries for some 20 s before it gives up."""
    import socket
    from urllib.parse import urlparse
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or (80 if url.scheme == "http" else 443)), timeout).close()
        return ""
    except OSError as e:
        return f"{url.hostname} is not reachable ({type(e).__name__})"


def _from_hub_or_folder(load, name_or_path):
    """load(name_or_path, **kw) for a folder; for a hub name the local cache first (no network: instant
    offline), then a download when the hub answers. Raises FileNotFoundError (not there, offline and not
    cached) or ValueError (unreadable) in one line."""
    try:
        if os.path.isdir(name_or_path):
            return load(name_or_path)
        try:
            return load(name_or_path, local_files_only=True)
        except OSError as cached:
            why = hub_unreachable()
            if why:
                raise OSError(f"it is not in the Hugging Face cache and {why}") from cached
            return load(name_or_path)
    except OSError as e:
        where = ("" if os.path.isdir(name_or_path) else " Offline it must be in the Hugging Face cache "
                 "(~/.cache/huggingface/hub, or $HF_HOME/hub): copy it there from a machine with internet, "
                 "or pass init_from=<a local folder saved with save_pretrained>")
        raise FileNotFoundError(f"could not load {name_or_path!r} through transformers: "
                                f"{str(e).splitlines()[0].rstrip('.')}.{where}") from e
    except ValueError as e:
        raise ValueError(f"could not load {name_or_path!r} through transformers: {str(e).splitlines()[0]}") from e


def gpt_config_from_hf(hf_config, name, config=None):
    """The GPTConfig of a Hugging Face GPT2Config `hf_config` (of model `name`, for messages).
    Shape (n_layer, n_head, n_embd, vocab_size; bias=True; activation; GPT-2's blocks: GPT2_BLOCKS) comes from
    hf_config. With
    `config` (a GPTConfig: what the user asked for), the rest comes from it (dropout, attention, the
    fused head), block_size too when it is at most hf_config.n_positions (the position table is
    cropped, as nanoGPT's crop_block_size), and every shape key it sets differently is printed; without
    `config`, block_size is n_positions and the rest GPTConfig's defaults (dropout 0, attention sdpa).
    Raises ValueError for a model model.py cannot express (another architecture, activation, MLP width,
    LayerNorm eps, attention scaling, untied head), a block_size beyond n_positions, or a vocabulary
    other than config's."""
    c = hf_config
    if c.model_type != "gpt2":
        raise ValueError(f"{name} is a {c.model_type!r} model, not GPT-2")
    unsupported = {"activation_function": (c.activation_function not in ACTIVATION_FROM_HF,
                                           "gelu_new, gelu_pytorch_tanh or gelu"),
                   "n_inner": (c.n_inner not in (None, 4 * c.n_embd), f"None or 4 * n_embd = {4 * c.n_embd}"),
                   "layer_norm_epsilon": (c.layer_norm_epsilon != 1e-5, "1e-05 (nn.LayerNorm's)"),
                   "scale_attn_weights": (not c.scale_attn_weights, "True"),
                   "scale_attn_by_inverse_layer_idx": (c.scale_attn_by_inverse_layer_idx, "False"),
                   "add_cross_attention": (c.add_cross_attention, "False"),
                   "tie_word_embeddings": (not c.tie_word_embeddings, "True: model.py ties the head to the embedding")}
    for key, (bad, want) in unsupported.items():
        if bad:
            raise ValueError(f"{name} has {key}={getattr(c, key)!r}, which model.py cannot express: it needs {want}")
    theirs = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, bias=True,
                  activation=ACTIVATION_FROM_HF[c.activation_function], **{k: v for k, (v, _) in GPT2_BLOCKS.items()})
    if config is None:
        return GPTConfig(vocab_size=c.vocab_size, block_size=c.n_positions, **theirs)
    if config.vocab_size != c.vocab_size:
        raise ValueError(f"{name} has a {c.vocab_size}-token vocabulary but the data has {config.vocab_size}: "
                         "prepare the data with the model's tokenizer (data.py --tokenizer gpt2 for GPT-2)")
    if config.block_size > c.n_positions:
        raise ValueError(f"block_size={config.block_size} exceeds the {c.n_positions} positions of {name}")
    taken = [f"{k}={v!r} (config: {getattr(config, k)!r})" for k, v in theirs.items() if getattr(config, k) != v]
    if taken:
        print0(f"init_from={name}: its shape replaces the config's: {', '.join(taken)}")
    if config.block_size < c.n_positions:
        print0(f"init_from={name}: block_size={config.block_size}, its first {config.block_size} of "
               f"{c.n_positions} positions")
    return replace(config, **theirs)


@torch.no_grad()
def copy_hf_state(model, hf_state, name):
    """Copy a Hugging Face GPT-2 state dict `hf_state` (of model `name`, for messages) into `model` (a
    GPT): Conv1D weights transposed, the embedding's padded rows set to 0, the position table cropped
    to block_size. Raises ValueError naming the first missing tensor or shape that does not fit."""
    V, T = model.config.vocab_size, model.config.block_size
    conv1d = {f"{name}.weight" for name, _, _ in model.block_linears()}          # HF (in, out)
    for key, p in model.state_dict(keep_vars=True).items():
        if key == "lm_head.weight":                        # tied: it is transformer.wte.weight
            continue
        if key not in hf_state:
            raise ValueError(f"{name} has no tensor {key}")
        t = hf_state[key]
        t = t.t() if key in conv1d else t
        t = t[:T] if key == "transformer.wpe.weight" else t
        want = (V, p.shape[1]) if key == "transformer.wte.weight" else tuple(p.shape)
        if tuple(t.shape) != want:
            raise ValueError(f"{name}: {key} has shape {tuple(t.shape)}"
                             + (" (Conv1D, transposed)" if key in conv1d else "")
                             + f" but the model needs {want}")
        if key == "transformer.wte.weight":
            p[V:].zero_()                                  # padded ids: never produced, masked in the loss
            p = p[:V]
        p.copy_(t)


def check_tokens(init_from, data_dir):
    """Raise ValueError before any download when `init_from` names OpenAI's GPT-2 weights (HF_GPT2) but
    data_dir was prepared with another tokenizer (its meta.json, when there). A folder may hold a GPT-2 of
    any vocabulary: its size is checked against the data's once it is read."""
    meta = os.path.join(data_dir, "meta.json")
    if init_from not in HF_GPT2 or not os.path.isfile(meta):
        return
    with open(meta) as f:
        tokenizer = json.load(f).get("tokenizer")
    if tokenizer not in (None, "gpt2"):
        raise ValueError(f"init_from={init_from!r} is GPT-2 weights, for GPT-2 tokens, but {data_dir} holds "
                         f"{tokenizer} tokens: prepare the data with `python data.py --tokenizer gpt2 ...`, or train "
                         "from scratch")


def load_hf_gpt2(name_or_path, config=None):
    """A GPT (float32, on the CPU) holding the weights of the Hugging Face GPT-2 `name_or_path`: one of
    gpt2, gpt2-medium, gpt2-large, gpt2-xl (read from the Hugging Face cache, else downloaded by
    transformers) or a local folder holding config.json and the weights (as save_pretrained writes).
    `config` (a GPTConfig) gives the vocabulary the data needs, block_size (at most the model's
    positions: cropped down), dropout and attention; the shape is the HF model's: see
    gpt_config_from_hf. Its logits equal GPT2LMHeadModel's within 1e-5 in float32.
    Raises ValueError (transformers missing, a model or config that does not fit, shapes that do not
    match) or FileNotFoundError (not found, or offline and not cached), each in one line."""
    transformers = import_transformers(f"init_from={name_or_path!r}")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()             # we raise our own one-line errors instead
    try:
        # the config first: a model that cannot fit is refused before its weights are downloaded
        hf_config = _from_hub_or_folder(transformers.AutoConfig.from_pretrained, name_or_path)
        gpt_config = gpt_config_from_hf(hf_config, name_or_path, config)
        hf, info = _from_hub_or_folder(lambda p, **kw: transformers.GPT2LMHeadModel.from_pretrained(
            p, config=hf_config, ignore_mismatched_sizes=True, output_loading_info=True, **kw), name_or_path)
    finally:
        transformers.logging.set_verbosity(verbosity)
    if info["mismatched_keys"]:
        key, saved, want = sorted(info["mismatched_keys"])[0]
        raise ValueError(f"{name_or_path}: {key} has shape {tuple(saved)} in the weights but {tuple(want)} "
                         f"by its config.json ({len(info['mismatched_keys'])} tensors do not fit)")
    if info["missing_keys"]:
        raise ValueError(f"{name_or_path}: the weights lack {sorted(info['missing_keys'])[0]} "
                         f"({len(info['missing_keys'])} tensors missing)")
    model = GPT(gpt_config)
    copy_hf_state(model, {k: v.float() for k, v in hf.state_dict().items()}, name_or_path)
    print0(f"init_from={name_or_path}: {sum(p.numel() for p in hf.parameters()):,} parameters loaded")
    return model

# -----------------------------------------------------------------------------
# export

def write_gpt2_tokenizer(to, transformers, blobs=None):
    """Write the GPT-2 tokenizer to folder `to`: vocab.json and merges.txt (tiktoken's cached GPT-2 BPE
    files, byte for byte the ones Hugging Face ships), then tokenizer.json and tokenizer_config.json as
    transformers writes them (`blobs`: gpt2_bpe_blobs(), read already). Offline this needs tiktoken's cache
    ($TIKTOKEN_CACHE_DIR), as data.py does; raises FileNotFoundError in one line without it. Note: HF's tokenizer
    encodes a literal "<|endoftext|>" in text as the special id 50256, where data.py encodes it as plain text."""
    for filename, blob in (blobs or gpt2_bpe_blobs()).items():
        with open(os.path.join(to, filename), "wb") as f:
            f.write(blob)
    transformers.GPT2TokenizerFast.from_pretrained(to).save_pretrained(to)


def gpt2_bpe_blobs():
    """{filename: bytes} of GPT2_BPE_FILES from tiktoken's cache (or its download); FileNotFoundError in one line
    without either. Read before an export writes anything, so that one offline leaves no model without its
    tokenizer (or beside an earlier export's)."""
    import tiktoken.load
    blobs = {}
    for filename, (url, sha256) in GPT2_BPE_FILES.items():
        try:
            blobs[filename] = tiktoken.load.read_file_cached(url, sha256)
        except Exception as e:                             # no network and no cache
            raise FileNotFoundError(f"could not read tiktoken's GPT-2 file {url.rsplit('/', 1)[1]} "
                                    f"({str(e).splitlines()[0]}): "
                                    "offline, point TIKTOKEN_CACHE_DIR at a folder holding it") from e
    return blobs


@torch.no_grad()
def export_hf(ckpt_path, to):
    """Write the speedgpt checkpoint `ckpt_path` (train.py's out_dir/ckpt.pt) to folder `to` as a Hugging
    Face GPT-2: config.json, model.safetensors (float32; the head tied to the embedding, the padded
    vocabulary rows dropped), generation_config.json and, for GPT-2 BPE data (meta tokenizer 'gpt2'),
    the GPT-2 tokenizer. bias=False is written as zero biases (HF's GPT-2 always has them; adding zero
    changes nothing); byte-level data gives a model of vocabulary 257 (ids 0-255 the UTF-8 bytes,
    256 end-of-text) and no tokenizer files. Before writing, the HF model's logits are checked against
    ours on a few tokens. Returns `to`. Raises FileNotFoundError (no checkpoint) or ValueError
    (transformers missing, `to` a file, the checkpoint's folder or another run's, a folder holding files no export
    wrote, a folder that cannot be created,
    a block GPT-2 does not have (GPT2_BLOCKS, the activation: checked before transformers is imported), a
    parameter GPT-2 cannot express), each in one line; OSError for a write that fails."""
    if os.path.isfile(to):
        raise ValueError(f"--to {to} is a file, not a folder")
    if os.path.realpath(to) == os.path.realpath(os.path.dirname(ckpt_path) or "."):     # a link to it too
        raise ValueError(f"--to {to} is the checkpoint's folder: its config.json would overwrite the training config; "
                         f"export to a subfolder, e.g. {os.path.join(to, 'hf')}")
    # another run's folder (train.py's out_dir) is clobbered the same way: its config.json, the run's whole resolved
    # config, was replaced by the Hugging Face one, unsaid
    if os.path.isdir(to) and (any(os.path.isfile(os.path.join(to, f)) for f in ("ckpt.pt", "metrics.jsonl"))
                              or newest_kept(to)):
        raise ValueError(f"--to {to} is a training run's folder: its config.json would overwrite the run's; "
                         f"export to a subfolder, e.g. {os.path.join(to, 'hf')}")
    # any other folder's files would be replaced (config.json, a tokenizer) or left beside a model they do not
    # describe: only a new or empty folder, or an earlier export (its speedgpt.json), is written into
    held = sorted(os.listdir(to)) if os.path.isdir(to) else []
    if held and "speedgpt.json" not in held:
        raise ValueError(f"--to {to} holds files hf.py export did not write ({', '.join(held[:3])}"
                         f"{', ...' if len(held) > 3 else ''}): export into a new or empty folder, or an earlier "
                         "export's")
    ckpt = load_checkpoint(ckpt_path)
    ckpt.pop("optimizer")                                  # twice the weights, and not exported
    cfg, meta = ckpt["config"], ckpt["meta"]
    c = GPTConfig.from_dict(cfg, meta["vocab_size"], attention="sdpa")      # a key the checkpoint predates: default
    foreign = [(key, getattr(c, key), has, repr(gpt2)) for key, (gpt2, has) in GPT2_BLOCKS.items()
               if getattr(c, key) != gpt2]
    if c.activation not in ACTIVATION_TO_HF:
        foreign.append(("activation", c.activation, " or ".join(ACTIVATION_TO_HF),
                        " or ".join(map(repr, ACTIVATION_TO_HF))))
    if foreign:                                            # every one at once: a user retrains once, not once each
        raise ValueError(f"{ckpt_path} was trained with " + ", ".join(f"{k}={v!r}" for k, v, _, _ in foreign)
                         + ", which Hugging Face's GPT-2 cannot hold (it has " + "; ".join(h for _, _, h, _ in foreign)
                         + "): only a model trained with " + ", ".join(f"{k}={g}" for k, _, _, g in foreign)
                         + " exports; sample.py and eval.py read the checkpoint itself")
    transformers = import_transformers("export")
    model = GPT(c).eval()
    load_weights(model, ckpt, ckpt_path)
    eot = meta["eot_id"] if meta["eot_id"] >= 0 else None       # nanoGPT's characters have none
    hf_config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        activation_function=ACTIVATION_TO_HF[c.activation], resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.dropout, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
        bos_token_id=eot, eos_token_id=eot)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    ours, used = model.state_dict(), {"lm_head.weight"}
    conv1d = {f"{name}.weight" for name, _, _ in model.block_linears()}          # HF (in, out)
    for key, p in hf.named_parameters():                   # tied: lm_head.weight is not listed
        if key in ours:
            t = ours[key].t() if key in conv1d else ours[key]
            t = t[:c.vocab_size] if key == "transformer.wte.weight" else t
            used.add(key)
        elif key.endswith(".bias") and not c.bias:
            t = torch.zeros_like(p)                        # bias=False: exactly a zero bias
        else:
            raise ValueError(f"HF GPT-2 has a parameter {key} that the checkpoint lacks")
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{ckpt_path}: {key} has shape {tuple(t.shape)} but HF GPT-2 needs {tuple(p.shape)}")
        p.copy_(t)
    if set(ours) - used:
        raise ValueError(f"{ckpt_path} cannot be expressed as HF GPT-2: it has no place for "
                         f"{', '.join(sorted(set(ours) - used))}")
    # the check: a setting of model.py that this mapping does not know would show here
    idx = torch.randint(0, c.vocab_size, (1, min(16, c.block_size)), generator=torch.Generator().manual_seed(0))
    want, got = model(idx)[0][..., :c.vocab_size], hf(idx).logits
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
        raise ValueError(f"exported logits differ from the checkpoint's by {(got - want).abs().max().item():.2e}: "
                         "the model has a setting this exporter does not map")
    blobs = gpt2_bpe_blobs() if meta["tokenizer"] == "gpt2" else None      # offline without them: nothing written
    try:
        os.makedirs(to, exist_ok=True)
    except OSError as e:
        raise folder_creation_error(to, e, "--to") from None
    hf.save_pretrained(to)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(os.path.join(to, "model.safetensors"), 0o666 & ~umask)     # safetensors writes it 0600
    if meta["tokenizer"] == "gpt2":
        write_gpt2_tokenizer(to, transformers, blobs)
    else:
        for name in TOKENIZER_FILES:                       # never leave an earlier export's tokenizer beside this model
            if os.path.exists(os.path.join(to, name)):
                os.remove(os.path.join(to, name))
        print0(f"note: {meta['tokenizer']!r} tokens have no Hugging Face tokenizer; "
                + ("ids 0-255 are UTF-8 bytes, 256 is end-of-text" if meta["tokenizer"] == "byte" else
                   "id i is the character meta['chars'][i] in speedgpt.json (nanoGPT's meta.pkl)"
                   if meta["tokenizer"] == "char" else
                   "its ids came without their text (a meta.pkl of a vocab_size alone): encode input with the "
                   "tokenizer that made the data" if meta["tokenizer"] == "ids" else "encode them as data.py does"))
    with open(os.path.join(to, "speedgpt.json"), "w") as f:       # where it came from
        json.dump({"checkpoint": os.path.abspath(ckpt_path), "step": ckpt["step"], "config": cfg, "meta": meta}, f,
                  indent=1)
    print0(f"wrote {to}: GPT-2 {c.n_layer} layers x {c.n_embd}, vocabulary {c.vocab_size}, step {ckpt['step']}"
            + (" (bias=False written as zero biases)" if not c.bias else "") + f"; max |logit difference| "
            f"{(got - want).abs().max().item():.1e}")
    return to


def main(argv=None):
    parser = FlagParser(prog="hf.py", description="Hugging Face interop. Fine-tuning from GPT-2 is train.py's "
                                     f"init_from ({', '.join(HF_GPT2)} or a folder); this exports.")
    sub = parser.add_subparsers(dest="command")
    ex = sub.add_parser("export", help="write out_dir/ckpt.pt as a Hugging Face GPT-2 folder",
                        hints={"--out": "the folder to write is --to (--out_dir names the training run to export)"})
    ex.add_argument("--out_dir", default="out", help="the training run's folder, holding ckpt.pt, or a kept step's "
                    "file (out/ckpt_step000500.pt)")
    ex.add_argument("--to", default=None, help="the folder to write (default: OUT_DIR/hf; for a kept step's file, "
                    "OUT_DIR/hf_step000500)")
    args = parser.parse_args(argv)
    if args.command is None:                  # argparse's words ("arguments are required: command") name no command
        parser.error("hf.py needs a command: export (python hf.py export --out_dir=out writes out/hf); to fine-tune "
                     f"from GPT-2, train.py takes --init_from=gpt2 (or {', '.join(HF_GPT2[1:])}, a Hugging Face "
                     "folder)")
    if args.to == "":                         # else the default folder, unsaid, where the user named one
        parser.error("--to is empty: give the folder to write, or leave --to out for OUT_DIR/hf")
    path = checkpoint_file(args.out_dir)
    # each checkpoint file its own default folder: a kept step's export never replaces ckpt.pt's (out/hf)
    stem = os.path.splitext(os.path.basename(path))[0]
    to = args.to or os.path.join(os.path.dirname(path), "hf" + (stem[4:] if stem.startswith("ckpt") else "_" + stem))
    try:
        export_hf(path, to)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    except OSError as e:
        if e.errno is None:                    # our own FileNotFoundError (no checkpoint): its message says it
            raise SystemExit(f"error: {e}")
        # a write that failed: a full disk, a read-only folder
        raise SystemExit(f"error: cannot write the output folder {to}: {describe_os_error(e)}; free space there, "
                         "or choose another --to")


if __name__ == "__main__":
    main()
