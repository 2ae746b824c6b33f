"""
Score a model on HellaSwag (speedgpt/hellaswag.py) apart from training: a speedgpt checkpoint, or GPT-2
weights through Hugging Face; or, with --lm_eval, on EleutherAI's lm-evaluation-harness tasks.

    python eval.py --out_dir out-fast                          # out-fast/ckpt.pt, with its run's tokenizer
    python eval.py --init_from gpt2                            # OpenAI's GPT-2 124M (llm.c: acc_norm 0.2955)
    python eval.py --init_from path/to/hf_folder --hellaswag_path hellaswag_val.jsonl --examples 1000
    torchrun --standalone --nproc_per_node=8 eval.py --init_from gpt2-xl   # the examples split across ranks
    python eval.py --out_dir out-gpt2 --lm_eval hellaswag,arc_easy         # the harness's tasks (docs/evaluation.md)

Prints acc_norm, acc, the examples scored and the seconds taken. The file is downloaded to
data/hellaswag/ on first use unless --hellaswag_path names one (docs/evaluation.md: offline). A script of
its own, beside sample.py, rather than a subcommand of hf.py: it scores our checkpoints as well as Hugging
Face weights. --lm_eval=TASKS exports a checkpoint to a temporary Hugging Face folder (hf.py) and hands it
to the harness's own Hugging Face model (its HFLM: the harness tokenizes and scores), then prints the
harness's table; TASKS are its task names or YAML files, and hellaswag_local (speedgpt/hellaswag_local.yaml)
is its HellaSwag read from our file. Bad input is one line, `error: ...`: exit status 2 for a flag that
does not parse (unknown, no value, a wrong type: configurator.FlagParser, `--key=value` or `--key value`
as train.py), else 1.
"""
import argparse
import os
import re
import sys
import tempfile
import time
from contextlib import nullcontext

import torch

from configurator import FlagParser
from data import get_tokenizer
from sample import DTYPES, TOKENIZER_OF_VOCAB, load_model
from speedgpt import hellaswag
from speedgpt.checkpoint import checkpoint_file, no_checkpoint
from speedgpt.distributed import leave, print0, setup_processes

TASKS_DIR = os.path.dirname(os.path.abspath(hellaswag.__file__))   # --lm_eval finds hellaswag_local.yaml by name


def check_source(args):
    """Raise FileNotFoundError, naming the way out, unless the model `args` name is there to load: out_dir
    holds ckpt.pt, or init_from is a GPT-2 name or a Hugging Face folder (config.json). Cheap: run before
    the HellaSwag file is fetched and before any weights are read."""
    from configurator import HF_GPT2
    where = args.init_from
    if not where:
        path = checkpoint_file(args.out_dir)
        if not os.path.isfile(path):
            raise FileNotFoundError(no_checkpoint(args.out_dir))
    elif where not in HF_GPT2 and os.path.isfile(where):      # a checkpoint file: the flag that takes it
        run = f"{os.path.dirname(where) or '.'} (its ckpt.pt)" if os.path.basename(where) == "ckpt.pt" else \
            where                      # a kept step's file (--out_dir takes it): its folder would score ckpt.pt
        raise FileNotFoundError(f"--init_from {where!r} is a file, not a Hugging Face folder: score a speedgpt run "
                                f"with --out_dir {run}; a nanoGPT ckpt.pt first starts a run (python train.py "
                                f"--init_from={where})")
    elif where not in HF_GPT2 and (os.path.isfile(os.path.join(where, "ckpt.pt"))        # a run's config.json is
                                   or not os.path.isfile(os.path.join(where, "config.json"))):   # train.py's, not HF's
        raise FileNotFoundError(
            f"--init_from {where!r}: " + ("a speedgpt run folder: score its checkpoint with --out_dir " + where
                                         if os.path.isfile(os.path.join(where, "ckpt.pt")) else
                                         "a folder without config.json" if os.path.isdir(where) else "no such folder")
            + f" (--init_from takes {', '.join(HF_GPT2)} or a Hugging Face GPT-2 folder)")


def load(args, device):
    """(model in eval mode on `device`, tokenizer name): out_dir/ckpt.pt, or args.init_from through hf.py."""
    if not args.init_from:
        model, meta = load_model(args.out_dir, device)
        return model, meta["tokenizer"]
    from hf import load_hf_gpt2
    where = args.init_from
    model = load_hf_gpt2(where)
    tokenizer = TOKENIZER_OF_VOCAB.get(model.config.vocab_size)
    if tokenizer is None:
        raise ValueError(f"{args.init_from} has a {model.config.vocab_size:,}-token vocabulary: eval.py scores GPT-2 "
                         "BPE (50,257) and byte-level (257) models")
    return model.eval().to(device), tokenizer


def check_args(args):
    """Raise ValueError naming the flag for a setting that cannot be run, before any work."""
    if args.examples < 0:
        raise ValueError(f"--examples must be >= 0 (0: all), got {args.examples}")
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1 (examples per forward), got {args.batch_size}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", args.device):
        raise ValueError(f"--device must be auto, cpu, cuda, cuda:N or mps, got {args.device!r}")


def evaluate(args):
    """Score the model `args` name on the HellaSwag file it names (every rank its share, the counts summed);
    returns speedgpt.hellaswag's result dict. Raises ValueError / FileNotFoundError for bad input."""
    proc, clean = setup_processes(args), False
    try:
        check_source(args)
        if not args.init_from:                            # before the file is fetched for nothing
            refuse_characters(checkpoint_file(args.out_dir))
        path = hellaswag.fetch(args.hellaswag_path, proc)          # before the weights: none loaded for nothing
        examples = hellaswag.load(path, args.examples)
        model, tokenizer = load(args, proc.device)
        scorer = hellaswag.HellaSwag(examples, get_tokenizer(tokenizer), model.config.block_size, proc.device,
                                     proc.rank, proc.world, args.batch_size)
        ctx = nullcontext() if args.dtype == "float32" else torch.autocast(proc.device.type, dtype=DTYPES[args.dtype])
        result = scorer.evaluate(model, ctx)
        clean = True
    finally:
        leave(proc, clean)
    print0(f"{args.init_from or checkpoint_file(args.out_dir)} on {path}: {hellaswag.describe(result)}"
           f" | {proc.world} process(es), {args.dtype}")
    return result


# -----------------------------------------------------------------------------
# lm-evaluation-harness

def checkpoint_tokenizer(path):
    """The tokenizer named in checkpoint `path`'s meta, read with the weights left on disk (mmap), or None
    where it cannot be read that way (hf.export_hf's load later says what is wrong)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)["meta"]["tokenizer"]
    except Exception:
        return None


def refuse_characters(path):
    """Raise ValueError in one line where checkpoint `path` is a model of nanoGPT's characters (its meta.pkl) or of
    ids whose text is unknown, which HellaSwag cannot score, naming the evaluation that can: its validation loss on
    its data."""
    tokenizer = checkpoint_tokenizer(path)
    if tokenizer in hellaswag.NO_HELLASWAG:
        hellaswag.refuse_characters(tokenizer, path, f"its validation loss: {validation_loss_command(path)}")


def validation_loss_command(path):
    """The command that scores checkpoint `path` on its own data's validation split (a model HellaSwag and the
    harness cannot score: nanoGPT's characters)."""
    data_dir = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["config"]["data_dir"]
    return f"python train.py --init_from={path} --data_dir={data_dir} --eval_only=True --out_dir=OTHER_FOLDER"


def check_harness_model(args):
    """Raise ValueError, in one line, for a model `args` name that has no Hugging Face tokenizer (a
    byte-level checkpoint, or a folder without tokenizer files): transformers would hand the harness an
    empty GPT-2 tokenizer, which encodes every text as no tokens."""
    from configurator import HF_GPT2
    from hf import TOKENIZER_FILES
    if args.init_from:
        where, what = args.init_from, "a folder without tokenizer files"
        has = where in HF_GPT2 or any(os.path.isfile(os.path.join(where, f)) for f in TOKENIZER_FILES)
    else:
        where = checkpoint_file(args.out_dir)
        tokenizer = checkpoint_tokenizer(where)
        has, what = tokenizer in ("gpt2", None), f"{tokenizer} tokens"
    if not has:         # HellaSwag, eval.py's other score, refuses nanoGPT's characters too: their validation loss
        other = f"its validation loss measures this one: {validation_loss_command(where)}" \
            if what in ("char tokens", "ids tokens") else "without --lm_eval, eval.py scores this one on HellaSwag"
        raise ValueError(f"{where} has no Hugging Face tokenizer ({what}), and lm-evaluation-harness reads text "
                         f"through one: --lm_eval scores GPT-2 BPE models (data.py --tokenizer gpt2); {other}")


def run_harness(args):
    """Score the model `args` name on the lm-evaluation-harness tasks args.lm_eval (comma-separated task
    names or YAML files; hellaswag_local among the names) with the harness's HFLM in one process, print
    the harness's table and return simple_evaluate's result: "results" per task, and "samples", each
    item's requests ("arguments": context, continuation) and log-likelihoods ("resps"). A checkpoint is
    exported (hf.export_hf) to a temporary folder first. --examples is the harness's limit (the first N
    items of each task), --dtype the weights' dtype. Raises ValueError (no lm_eval, a task it does not
    know, a model it cannot read) or FileNotFoundError (no model, no HellaSwag file), each in one line,
    before any export."""
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise ValueError("--lm_eval runs in one process: for several GPUs, export (python hf.py export) and run "
                         "the harness's own `accelerate launch -m lm_eval --model hf ...`")
    setup_processes(args)     # a --device this machine lacks: one line, not the harness's traceback after the export
    # a list of commas names no task: the export ran, then the harness said "No tasks specified"; spaces after the
    # commas (hellaswag, arc_easy) are no part of a name
    tasks = [t.strip() for t in args.lm_eval.split(",") if t.strip()]
    if not tasks:
        raise ValueError(f"--lm_eval {args.lm_eval!r} names no task: give the harness's task names or YAML files, "
                         "comma-separated (hellaswag_local: its HellaSwag on our file)")
    if args.hellaswag_path:
        raise ValueError("--hellaswag_path is read by our HellaSwag, not by --lm_eval: the harness's hellaswag_local "
                         f"reads {hellaswag.CACHE}, relative to the working directory")
    check_source(args)
    check_harness_model(args)
    from hf import export_hf, import_transformers
    try:
        import_transformers("--lm_eval")              # first: it keeps torchao's warnings out of transformers
    except ValueError:
        # lm-eval[hf] installs transformers too: one line for both, where "pip install transformers" was
        # followed by a second refusal for the harness
        raise ValueError("--lm_eval needs lm-evaluation-harness and transformers (transformers is not installed): "
                         "pip install 'lm-eval[hf]'") from None
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
        from lm_eval.utils import make_table
    except ImportError as e:
        raise ValueError(f"--lm_eval needs lm-evaluation-harness ({e}): pip install 'lm-eval[hf]'") from None
    manager = TaskManager(include_path=TASKS_DIR)
    for t in tasks:
        if t.endswith(".yaml") and not os.path.isfile(t):
            raise ValueError(f"--lm_eval {t}: no such task file")
        if not t.endswith(".yaml") and t not in manager.all_tasks:
            raise ValueError(f"--lm_eval {t}: lm-evaluation-harness has no such task (`lm_eval ls tasks` lists them)")
    if "hellaswag_local" in tasks and not os.path.isfile(hellaswag.CACHE):
        hellaswag.download(hellaswag.CACHE, hellaswag.URL)      # as our HellaSwag does on first use
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    with tempfile.TemporaryDirectory(prefix="speedgpt-hf-") as tmp:
        folder = args.init_from or export_hf(checkpoint_file(args.out_dir), tmp)
        result = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": folder, "dtype": args.dtype},
                                         tasks=tasks, device=device, batch_size=args.batch_size,
                                         limit=args.examples or None, task_manager=manager)
    print(make_table(result))
    return result


def main(argv=None):
    parser = FlagParser(prog="eval.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="", help="the training run's folder, holding ckpt.pt (default out)")
    parser.add_argument("--init_from", default="", help="instead of a checkpoint: gpt2[-medium|-large|-xl] or a "
                        "Hugging Face GPT-2 folder")
    parser.add_argument("--hellaswag_path", default="", help=f"HellaSwag's jsonl (default: {hellaswag.CACHE}, "
                        "downloaded when missing)")
    parser.add_argument("--examples", type=int, default=0, help="score the first N examples (0: all; --lm_eval: "
                        "of each task)")
    parser.add_argument("--batch_size", type=int, default=8, help="examples per forward (4 rows each; --lm_eval: "
                        "the harness's requests per forward)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps (torchrun: "
                        "each rank its GPU)")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES),
                        help="autocast precision (--lm_eval: the weights' dtype)")
    parser.add_argument("--lm_eval", default="", help="instead of our HellaSwag: lm-evaluation-harness tasks, "
                        "comma-separated names or YAML files (hellaswag_local: its HellaSwag on our file)")
    args = parser.parse_args(argv)
    if args.out_dir and args.init_from:          # one model is scored: say which instead of ignoring one
        parser.error(f"--out_dir {args.out_dir} and --init_from {args.init_from} name two models: give one of them")
    args.out_dir = args.out_dir or "out"
    try:
        check_args(args)
        return run_harness(args) if args.lm_eval else evaluate(args)
    except (ValueError, FileNotFoundError) as e:             # bad input: one line, no traceback
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:        # once per node, as train.py
            print(f"error: {e}", file=sys.stderr, flush=True)
        else:                                                # torchrun stops the other workers when one exits
            time.sleep(3)
        sys.exit(1)


if __name__ == "__main__":
    main()
