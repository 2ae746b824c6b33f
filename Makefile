# The two commands of a fresh machine; each sets up .venv first (once), then does its job:
#   make quickstart   train the CPU quickstart (python train.py): core packages only
#   make test         the test suite, with every optional package (make test-fast: without the slow tests)
# torch: a build already installed in the range of requirements.txt is used (the venv sees the packages of
# the Python that made it, after its own: a GPU box's preinstalled torch is kept); else the CUDA build where
# nvidia-smi sees a GPU, else the CPU build (TORCH_CPU, from PyTorch's CPU index when it is reachable:
# about 0.9 GB instead of several).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
TORCH := $(shell grep -E '^torch[<>=]' requirements.txt | cut -d' ' -f1)
TORCH_CPU ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: quickstart test test-fast setup setup-test

quickstart: $(VENV)/.core
	$(PY) train.py

test: $(VENV)/.extra
	$(PY) -m pytest -q tests

test-fast: $(VENV)/.extra
	$(PY) -m pytest -q -m "not slow" tests

setup: $(VENV)/.core
setup-test: $(VENV)/.extra

$(VENV)/.core: requirements.txt
	@test -x $(PY) || { $(PYTHON) -m venv $(VENV) && \
	    $(PYTHON) -c "import site; print('\n'.join(site.getsitepackages()))" > \
	    "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_outer_site.pth"; }
	@if $(PY) -c "import sys, torch; from pip._vendor.packaging.requirements import Requirement; \
	        sys.exit(not Requirement('$(TORCH)').specifier.contains(torch.__version__.split('+')[0]))" 2>/dev/null; then \
	    echo "torch: using the installed $$($(PY) -c 'import torch; print(torch.__version__)' 2>/dev/null)"; \
	elif nvidia-smi -L >/dev/null 2>&1; then echo "torch: a GPU is here, installing $(TORCH) (CUDA)"; $(PIP) "$(TORCH)"; \
	elif $(PY) -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then \
	    echo "torch: no GPU, installing $(TORCH_CPU) (CPU) from $(TORCH_CPU_INDEX)"; $(PIP) $(TORCH_CPU) --index-url $(TORCH_CPU_INDEX); \
	else echo "torch: no GPU, installing $(TORCH_CPU) from the default index"; $(PIP) $(TORCH_CPU); fi
	$(PIP) -r requirements.txt
	@touch $@

$(VENV)/.extra: $(VENV)/.core requirements-extra.txt
	$(PIP) -r requirements-extra.txt || echo "note: the optional packages could not all be installed (offline?): their tests skip"
	@touch $@
