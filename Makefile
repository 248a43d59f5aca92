# Set-up on a fresh machine is one of two commands; each creates the environment first if needed:
#   make run    fine-tune + compress + export + evaluate the quickstart recipe (offline, CPU is enough)
#   make test   lint (ruff), then the test suite (CPU: Triton kernels in the interpreter, GPU tests skipped)
# TORCH picks the PyTorch requirement: the default is the CPU build; on a GPU machine with a CUDA
# build of torch in the environment, `make test TORCH=torch` keeps it.
VENV ?= .venv
TORCH ?= torch==2.13.0
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test env

env: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q '$(TORCH)'
	$(PYTHON) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/compress run --config recipes/quickstart.yaml --overwrite

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PYTHON) -m pytest -q -n 2
