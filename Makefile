# The two commands of a fresh machine; each sets up .venv first (once), then does its job:
#   make quickstart   train the CPU quickstart (python train.py): core packages only; run again, it continues
#                     out/ckpt.pt (--init_from=resume), or says the run is finished (rm -rf out: afresh);
#                     ARGS= passes train.py flags (make quickstart ARGS=--max_iters=1000: train on past 500)
#   make test         the test suite, with every optional package (make test-fast: without the slow tests)
# make help lists every target; make clean removes what runs and tests leave (it keeps .venv and data/).
# The venv is isolated: it sees only what it installs, so `pip install transformers` there resolves against
# the venv alone. torch: where $(PYTHON) already has a build in the range of requirements.txt (a GPU box's
# preinstalled one), the venv is made with --system-site-packages to reuse it, and says so (it then sees
# every package of that Python); else the CUDA build where nvidia-smi sees a GPU, else the CPU build
# (TORCH_CPU, from PyTorch's CPU index when it is reachable: about 0.9 GB instead of several).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
TORCH := $(shell grep -E '^torch[<>=]' requirements.txt | cut -d' ' -f1)
TORCH_CPU ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# exit status 0 when the Python running it imports a torch in $(TORCH)'s range (packaging, or pip's copy)
TORCH_FITS := import sys, importlib, importlib.util, torch; \
    req = importlib.import_module(('' if importlib.util.find_spec('packaging') else 'pip._vendor.') + 'packaging.requirements'); \
    sys.exit(not req.Requirement('$(TORCH)').specifier.contains(torch.__version__.split('+')[0]))

.PHONY: help quickstart test test-fast setup setup-test clean
.DEFAULT_GOAL := quickstart

# each target's line: the comment after its `##`
help:  ## this list
	@awk -F ':.*## ' '/^[a-z-]+:.*## / {printf "  make %-11s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))

# train.py refuses a new run over an existing checkpoint; a second quickstart means "go on", so it resumes
# (a finished run says so and exits 0)
quickstart: $(VENV)/.core  ## train the CPU quickstart (python train.py), or continue it (out/ckpt.pt); ARGS=: its flags
	@if [ -f out/ckpt.pt ]; then \
	    echo "quickstart: out/ckpt.pt exists: continuing it (--init_from=resume; rm -rf out to start afresh;" \
	        "train.py's flags go in ARGS: make quickstart ARGS=--max_iters=1000)"; \
	    echo "$(PY) train.py --init_from=resume $(ARGS)"; $(PY) train.py --init_from=resume $(ARGS); \
	else echo "$(PY) train.py $(ARGS)"; $(PY) train.py $(ARGS); fi

test: $(VENV)/.extra  ## the whole test suite, every optional package installed
	$(PY) -m pytest -q tests

test-fast: $(VENV)/.extra  ## the test suite without the slow tests (torchrun, signals, compile, the ladder)
	$(PY) -m pytest -q -m "not slow" tests

setup: $(VENV)/.core  ## only make .venv: torch and the core packages (requirements.txt)
setup-test: $(VENV)/.extra  ## only make .venv with the optional packages too (requirements-extra.txt)

# the runs' folders (checkpoints included), bench.py's, W&B's offline runs and Python's and pytest's caches;
# not .venv, nor data/ (prepared corpora, the HellaSwag file)
clean:  ## rm -rf out*/ bench_out*/ bench_cpu/ wandb/ .pytest_cache/ and every __pycache__/ (keeps .venv, data/)
	rm -rf out*/ bench_out*/ bench_cpu/ wandb/ .pytest_cache/
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +

$(VENV)/.core: requirements.txt
	@test -x $(PY) || if $(PYTHON) -c "$(TORCH_FITS)" 2>/dev/null; then \
	    $(PYTHON) -m venv --system-site-packages $(VENV); else $(PYTHON) -m venv $(VENV); fi
	@if ls $(VENV)/lib/python*/site-packages/_outer_site.pth >/dev/null 2>&1; then echo "note: $(VENV) sees the" \
	    "outer Python's packages through _outer_site.pth (an older Makefile's): rm -rf $(VENV) and make again to" \
	    "isolate it"; fi
	@if $(PY) -c "$(TORCH_FITS)" 2>/dev/null; then $(PY) -W ignore -c "import sys, torch; print('torch: using the installed', \
	    torch.__version__, 'in the venv' if torch.__file__.startswith(sys.prefix) else \
	    'from the system Python (the venv sees its site-packages)')"; \
	elif nvidia-smi -L >/dev/null 2>&1; then echo "torch: a GPU is here, installing $(TORCH) (CUDA)"; $(PIP) "$(TORCH)"; \
	elif $(PY) -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then \
	    echo "torch: no GPU, installing $(TORCH_CPU) (CPU) from $(TORCH_CPU_INDEX)"; $(PIP) $(TORCH_CPU) --index-url $(TORCH_CPU_INDEX); \
	else echo "torch: no GPU, installing $(TORCH_CPU) from the default index"; $(PIP) $(TORCH_CPU); fi
	$(PIP) -r requirements.txt
	@touch $@

$(VENV)/.extra: $(VENV)/.core requirements-extra.txt
	$(PIP) -r requirements-extra.txt || echo "note: the optional packages could not all be installed (offline?): their tests skip"
	@touch $@
