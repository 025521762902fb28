# leetrepro: `make install` then `make test`. `make help` lists the rest.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# On a machine with an NVIDIA driver, torch from the registry (CUDA build, brings Triton);
# elsewhere torch 2.13.0, whose CPU build is what CI and the dev machines install, plus the
# Triton release of the GPU image (3.6.0) for the interpreter tests (its interpreter needs numpy < 2.3).
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
TORCH  ?= $(if $(HAS_GPU),torch,torch==2.13.0 triton==3.6.0 "numpy<2.3")
PYTEST_ARGS ?=

GPU    ?= $(shell $(PY) -c "from leetrepro.bench import gpu_tag; print(gpu_tag())" 2>/dev/null || echo gpu)
DATA   ?= data/$(GPU)

.PHONY: help install test clean gpu-check bench-kernels

help:
	@echo "make install   virtualenv in $(VENV) + editable install with test and notebook extras"
	@echo "make test      the test suite (CPU; Triton kernels under TRITON_INTERPRET=1)"
	@echo "make gpu-check     (GPU) every method x dtype x mask x shape vs the oracle -> $(DATA)/correctness.csv"
	@echo "make bench-kernels (GPU) kernels and PyTorch twins at the paper's shapes -> $(DATA)/kernels.csv"

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

gpu-check: $(VENV)/.installed
	$(PY) -m leetrepro.gpu_check --out $(DATA) --huge

bench-kernels: $(VENV)/.installed
	$(PY) -m leetrepro.kernel_bench --out $(DATA)

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
