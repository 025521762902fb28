# leetrepro: `make install` then `make test`. `make help` lists the rest.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# On a machine with an NVIDIA driver, torch from the registry (CUDA build, brings Triton);
# elsewhere torch 2.13.0, whose CPU build is what CI and the dev machines install, plus the
# Triton release of the GPU image (3.6.0) for the interpreter tests (its interpreter needs numpy < 2.3).
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
# TRITON: the release the CPU tests pin (the GPU image's); TRITON_NEXT: the newest release, whose
# interpreter `make test-triton-next` runs the tests under in a virtualenv of its own
TRITON ?= 3.6.0
TRITON_NEXT ?= 3.9.0
TORCH  ?= $(if $(HAS_GPU),torch,torch==2.13.0 triton==$(TRITON) "numpy<2.3")
PYTEST_ARGS ?=
NOTEBOOKS := $(patsubst %.py,%.ipynb,$(wildcard notebooks/*.py))

# HERE: this machine's tag (h100, a100, … or cpu). GPU: whose tables to make; on a machine without
# a GPU the GPU tables are re-rendered from the committed data/$(GPU)/ (default h100).
# Found on first use (a Python start, ~3 s with torch): targets that never ask, `make help` among
# them, do not pay for it.
HERE    = $(eval HERE := $(shell $(PY) -c "from leetrepro._device import gpu_tag; print(gpu_tag())" 2>/dev/null || echo cpu))$(HERE)
GPU    ?= $(if $(filter cpu,$(HERE)),h100,$(HERE))
DATA   ?= data/$(GPU)
# where tables, figures and executed notebooks go; without a GPU, re-rendered tables go to
# rerendered/ so the committed GPU-executed notebooks stay as run
RESULTS ?= $(if $(filter cpu,$(HERE)),rerendered,.)
DTYPE  ?= float32
# QUICK=1: the settings of the committed runs (make reproduce in about half an hour on one GPU):
# 5 repetitions and a 2 s limit per call in Tables 3-6 and 9 (slower cells read >limit; the same
# limit in the long-prompt sweep, whose PyTorch twins would otherwise run for minutes), one run
# over the prompt set in Tables 7-8 with slow methods timed on the first prompts (set_limit)
QUICK  ?=
REPS   ?= $(if $(QUICK),5,15)
LIMIT  := $(if $(QUICK),-p time_limit 2)
LLM_QUICK := $(if $(QUICK),-p runs 1 -p set_limit 30)
NBFLAGS ?=
# the venv by default; on an offline GPU host: make reproduce PY=python3 INSTALLED= (see README)
INSTALLED ?= $(VENV)/.installed
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
NB     = $(PY) -m leetrepro.reproduce.execute -k python3 --log-level WARNING
LEMMA_CPU := -y "ks: [8, 9, 10, 11, 12, 13]" -p heads 4 -p reps 3
LEMMA_ARGS ?= $(if $(filter cpu,$(HERE)),$(LEMMA_CPU))
TABLES := table3 table4 table5 table6

.PHONY: help install test test-gpu test-fast test-triton-next lint clean gpu-check bench-kernels reproduce $(TABLES) table9 lemma31 \
        derivations long-prompts claims wheelhouse floor profile tune table7 table8 notebooks bench-train train \
        bench-sp scaling bench-serve cross-gpu results layouts bench-layer lab eca related bench-gates gates bench-ssd bench-model bench-hf

help:
	@echo "make install   virtualenv in $(VENV) + editable install with test and notebook extras"
	@echo "make test      the test suite (CPU; Triton kernels under TRITON_INTERPRET=1)"
	@echo "make test-gpu  (GPU) the correctness matrix in pytest (-m gpu; GPU_MATRIX=quick or full)"
	@echo "make test-fast the quick lane: everything not marked slow (README: how long each takes)"
	@echo "make lint      ruff over the package, kernels, tests and notebooks (CI runs it)"
	@echo "make test-triton-next  the tests under the newest Triton ($(TRITON_NEXT)) in .venv-triton-next"
	@echo "make notebooks the .ipynb files papermill runs, from their sources notebooks/*.py"
	@echo "make lab       JupyterLab on notebooks/: the .py sources open as notebooks (paired .ipynb on save); runs write under scratch/"
	@echo "make gpu-check     (GPU) every method x dtype x mask x shape vs the oracle -> data/<gpu>/correctness.csv"
	@echo "make bench-kernels (GPU) kernels and PyTorch twins at the paper's shapes -> data/<gpu>/kernels.csv"
	@echo "make reproduce  every table and figure (GPU: measured; no GPU: re-rendered from data/<gpu>)"
	@echo "make table3 … table9 lemma31 derivations long-prompts claims floor   one each"
	@echo "make eca       Exact Causal Attention: identities, counts, error, time on this CPU (+ GPU) against the standard products, its claims"
	@echo "make related   the kernel paper's normalised linear attention and the blog's methods through the operator, the kernel paper's claims"
	@echo "    variables: GPU=<this GPU, h100 without one> DTYPE=$(DTYPE) REPS=$(REPS) RESULTS=<. on a GPU, rerendered without one> QUICK=$(QUICK) NBFLAGS='-p seqlens ...'"
	@echo "    QUICK=1: 5 repetitions, 2 s per call, Tables 7-8 in one run (the committed runs' settings)"
	@echo "make floor     Chunk/LA vs flash-linear-attention and the memory floor (GPU: measured -> data/<gpu>/floor.csv; no GPU: re-rendered)"
	@echo "make profile   (GPU, ncu) what limits each floor cell short of its target -> data/<gpu>/ncu_limits.txt; each kernel of the gated backward and forward -> ncu_backward.txt, ncu_forward.txt, their eager host time -> host_calls.txt"
	@echo "make bench-serve packed prefill, decode step, generation vs fla (GPU: measured -> data/<gpu>/serve.csv, generation.csv; no GPU: re-rendered)"
	@echo "make bench-sp  (GPUs) sequence parallelism over GPUS=N GPUs of this host (torchrun) -> data/<gpu>x<N>/sp.csv"
	@echo "make results   figures/results.md: every measured table, written from data/ alone (no GPU needed)"
	@echo "make cross-gpu the paper's tables and claims on every GPU with committed data, beside the A6000"
	@echo "make scaling   the sequence-parallel notebook from data/SP_TAG/sp.csv (default $(SP_TAG)), the model of larger scales"
	@echo "make tune      (GPU) Chunk's and LA's launch tables -> data/<gpu>/chunk_config.csv, la_config.csv, Chunk's kernel per head shape -> chunk_kernel.csv, then every method on a grid -> data/<gpu>/dispatch.csv (what method=auto uses)"
	@echo "make bench-train (GPU) forward + backward vs the 11-pass floor and fla -> data/<gpu>/train.csv, train_sweeps.csv, layouts*.csv"
	@echo "make bench-gates (GPU) per-token gates vs the per-head decay and fla's gated path, eager and graphs -> data/<gpu>/gates.csv"
	@echo "make bench-model (GPU) a decoder LM (125M, 1.3B) trained with each mixer: tokens/s, peak memory, the operator's share -> data/<gpu>/model.csv, figures/<gpu>/model.png"
	@echo "make bench-ssd (GPU) Mamba-2's SSD and Mamba-3's SISO drop-ins vs mamba_ssm's Triton kernels (and fla), the Mamba-2 block and LM with each -> data/<gpu>/ssd.csv, ssd_lm.csv"
	@echo "make bench-hf  (GPU) transformers' Zamba2, Falcon-H1, Granite-4.0-H trained and generating here vs its fallback and mamba_ssm's kernels -> data/<gpu>/hf.csv"
	@echo "make gates     the paper's methods under per-token gates (notebooks/gates.py; CPU, with the GPU rows of data/<gpu>/gates.csv)"
	@echo "make layouts   (GPU) method=auto beside Chunk and LA in the layouts and shapes models use, eager and graphs -> data/<gpu>/layouts.csv, layouts_graph.csv; every head shape beside fla -> layouts_shapes*.csv"
	@echo "make bench-layer (GPU) one attention layer, forward + backward, vs fla's op -> data/<gpu>/layer.csv"
	@echo "make train     a byte-level LM trained with every method (notebook; GPU, or re-rendered)"
	@echo "make wheelhouse  wheels of the notebook stack for an offline GPU host -> wheelhouse/"

# (pip without the exported PYTHONPATH: through it pip would see the checkout's egg-info and
# report its requirements missing from a venv still being built)
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	PYTHONPATH= $(PIP) install -q --upgrade pip
	PYTHONPATH= $(PIP) install -q $(TORCH)
	PYTHONPATH= $(PIP) install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

# the suite over TEST_JOBS processes (pytest-xdist; 0: one process), the CPU's on any machine
# (a GPU hidden: the tests that are not marked gpu are written for the interpreter; a GPU's are
# make test-gpu's)
# (work-stealing: a process that runs out of tests takes some of the other's, so the minute-long
# compile checks do not end the run on one process: 16.4 → 15.3 minutes on two cores, notes/house.md)
TEST_JOBS ?= 2
XDIST = -n $(TEST_JOBS) $(if $(filter 0,$(TEST_JOBS)),,--dist worksteal)
CPU_ONLY = CUDA_VISIBLE_DEVICES=
test: $(VENV)/.installed
	$(CPU_ONLY) $(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# pyflakes' and pycodestyle's checks (ruff; its settings in pyproject.toml), a few seconds
lint: $(VENV)/.installed
	$(PY) -m ruff check leetrepro tests notebooks

# the correctness matrix on this machine's GPU and every other test marked gpu (pytest -m gpu:
# the published models' generation, Chunk's repair launch at long wide lanes; GPU_MATRIX=full for the whole of
# make gpu-check's cases and the head shapes, about half an hour on an H100 in 8 processes)
GPU_MATRIX ?= quick
test-gpu: $(VENV)/.installed
	$(needs_gpu)
	LEETREPRO_GPU_MATRIX=$(GPU_MATRIX) $(PY) -m pytest -q -m gpu -n $(GPU_TEST_JOBS) tests/ $(PYTEST_ARGS)
GPU_TEST_JOBS ?= 8

test-fast: $(VENV)/.installed
	$(CPU_ONLY) $(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

# the tests under the newest Triton's interpreter (CI runs its quick lane: NEXT_ARGS='-m "not slow"')
NEXT_ARGS ?=
# (its own virtualenv holds only that Triton; every other package, leetrepro's editable install
# included, is read from $(VENV)'s, through a .pth file: no second torch to download and install)
test-triton-next: $(VENV)/.installed
	test -x .venv-triton-next/bin/python || $(PYTHON) -m venv .venv-triton-next
	.venv-triton-next/bin/python -c "import site, sys; open(site.getsitepackages()[0] + '/leetrepro-main-venv.pth', 'w').write('import site; site.addsitedir(%r)\\n' % sys.argv[1])" \
		"$$($(PY) -c 'import site; print(site.getsitepackages()[0])')"
	# (setuptools as pyproject.toml asks: the wheel test builds without isolation, and a new
	# virtualenv's own setuptools is older and comes before the main one's)
	PYTHONPATH= .venv-triton-next/bin/python -m pip install -q triton==$(TRITON_NEXT) "setuptools>=77"
	.venv-triton-next/bin/python -c "import triton; assert triton.__version__ == '$(TRITON_NEXT)', triton.__version__"
	# (the main virtualenv's Jupyter configuration: jupytext's contents manager is enabled there)
	$(CPU_ONLY) JUPYTER_CONFIG_PATH=$(CURDIR)/$(VENV)/etc/jupyter \
		.venv-triton-next/bin/python -m pytest -q $(XDIST) -p no:cacheprovider $(NEXT_ARGS) $(PYTEST_ARGS)

# JupyterLab on the notebooks: a double-clicked .py source opens as a notebook (jupytext's viewer,
# set as the default for Python files in this virtualenv's JupyterLab), saving writes the source
# and its paired .ipynb (notebooks/jupytext.toml); a run by hand writes under scratch/
# (out_root=None). LAB_ARGS: e.g. --no-browser --port 8889
LAB_ARGS ?=
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
lab: $(VENV)/.installed $(LAB_SETTINGS)
	$(PY) -m jupyterlab --ServerApp.root_dir=$(CURDIR) --ServerApp.ip=127.0.0.1 \
	  --LabApp.default_url=/lab/tree/notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)
$(LAB_SETTINGS):
	@mkdir -p $(dir $@)
	@echo '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"python": "Jupytext Notebook"}}}' > $@

# notebooks are kept as readable py:percent sources; papermill runs the .ipynb made from them
notebooks: $(NOTEBOOKS)
notebooks/%.ipynb: notebooks/%.py
	$(PY) -m jupytext --quiet --to ipynb --output $@ $<

gpu-check: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.gpu_check --out $(DATA) --huge --serving
	$(PY) -m leetrepro.bench.gpu_check --out $(DATA) --methods Chunk --heads-only --chunk-kernel hopper --csv correctness_hopper_heads.csv

bench-kernels: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.kernels --out $(DATA)

# $(1) notebook, $(2) executed copy under figures/<tag>/, $(3) tag, $(4) papermill arguments
# the first line of every target that measures on a GPU: without one, one line and status 2
needs_gpu = @if [ "$(HERE)" = cpu ]; then echo "make $@: needs a CUDA GPU (none found on this machine)" >&2; exit 2; fi

define run_notebook
	@mkdir -p $(RESULTS)/figures/$(3)
	@$(MAKE) --no-print-directory notebooks/$(1).ipynb
	$(NB) notebooks/$(1).ipynb $(RESULTS)/figures/$(3)/$(2).ipynb -p out_root $(RESULTS) $(4) $(NBFLAGS)
endef

# said after a target that times on a GPU and, on a machine without one, only re-rendered
define rerendered_note
	@$(if $(filter cpu,$(HERE)),echo "$@: NO GPU HERE: nothing was timed; re-rendered from the committed data/$(GPU)/ into $(RESULTS)/figures/$(GPU)/",true)
endef

NO_GPU_NOTE = NO GPU HERE: nothing was timed on a GPU. The GPU tables and claims were RE-RENDERED from the committed data/$(GPU)/ into $(RESULTS)/; Lemma 3.1 was timed on this CPU ($(RESULTS)/data/cpu/).

reproduce: derivations lemma31 $(TABLES) table9 long-prompts table7 table8 claims floor eca related
	@echo "reproduce: done. Tables, figures and executed notebooks under $(RESULTS)/figures/ and $(RESULTS)/data/."
	@$(if $(filter cpu,$(HERE)),echo "$(NO_GPU_NOTE)",true)

# a measuring setting given on the command line where nothing is measured: said, not dropped
define unused_here
	@$(if $(and $(filter cpu,$(HERE)),$(filter command line,$(origin $(1)))),echo "$@: $(1)=$($(1)) is not used: no GPU here and nothing is timed (re-rendered from $(DATA)/)",true)
endef

$(TABLES): $(INSTALLED)
	$(call unused_here,REPS)
	$(call run_notebook,latency,$@,$(GPU),-p table $(subst table,,$@) -p gpu $(GPU) -p dtype $(DTYPE) -p reps $(REPS) $(LIMIT))

# Tables 7-8: the methods inside TransNormerLLM-7B / toy-retnet-1.3B layers (the paper's protocol;
# QUICK=1: one run over the set)
# (no GPU and no committed data/$(GPU)/table7.csv to re-render: said, and skipped)
table7 table8: $(INSTALLED)
	$(if $(and $(filter cpu,$(HERE)),$(if $(wildcard $(DATA)/$@.csv),,none)),\
	  @echo "$@: no $(DATA)/$@.csv to re-render without a GPU (make $@ on that GPU writes it): skipped",\
	  $(call run_notebook,llm,$@,$(GPU),-p table $(subst table,,$@) -p gpu $(GPU) -p dtype $(DTYPE) $(LLM_QUICK)))

table9: $(INSTALLED)
	$(call unused_here,REPS)
	$(call run_notebook,table9,table9,$(GPU),-p gpu $(GPU) -p dtype $(DTYPE) -p reps $(REPS) $(LIMIT))

long-prompts: $(INSTALLED)
	$(call run_notebook,long_prompts,long_prompts,$(GPU),-p gpu $(GPU) $(LIMIT))

claims: $(INSTALLED)
	$(call run_notebook,claims,claims,$(GPU),-p gpu $(GPU))

# the paper's tables and claims on every GPU with committed data, beside the A6000 (no GPU needed)
cross-gpu: $(INSTALLED)
	$(call run_notebook,cross_gpu,cross_gpu,cross_gpu,)

lemma31: $(INSTALLED)
	$(call run_notebook,lemma31,lemma31,$(HERE),$(LEMMA_ARGS))

# the other papers: ECA (Exact Causal Attention) timed on this CPU and, with a GPU, on it (the
# committed GPUs' rows re-rendered); the kernel paper's normalised linear attention and the
# blog's methods through the operator (GPU: measured, fla-core as the peer; else re-rendered)
eca: $(INSTALLED)
	$(call run_notebook,eca,eca,eca,)
related: $(INSTALLED)
	$(call run_notebook,related_methods,related_methods,related_methods,)

# our kernels vs flash-linear-attention and the floor (GPU: measured; else re-rendered)
floor: $(INSTALLED)
	$(if $(filter cpu,$(HERE)),,$(PY) -m leetrepro.bench.floor --out $(RESULTS)/data/$(GPU))
	$(if $(filter cpu,$(HERE)),,$(PY) -m leetrepro.bench.layouts --out $(RESULTS)/data/$(GPU))
	$(call run_notebook,floor,floor,$(GPU),-p gpu $(GPU))
	$(rerendered_note)

# what limits each floor cell still short of its target: Nsight Compute over one call of Chunk as
# it ships, per cell (GPU and ncu only) -> data/<gpu>/ncu_limits.txt; then each kernel of the
# gated backward beside the per-head decay's -> data/<gpu>/ncu_backward.txt, and of the gated
# forward beside γ's -> data/<gpu>/ncu_forward.txt; and where their eager calls' host time goes
# -> data/<gpu>/host_calls.txt
profile: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.probes.ncu --out $(DATA)
	$(PY) -m leetrepro.probes.ncu --out $(DATA) --cells bf16_bwd_gates_mamba2 bf16_bwd_gamma_mamba2 \
		bf16_bwd_gates_mamba2_64 bf16_bwd_gates_gla bf16_fwd_gates_mamba2 bf16_fwd_gamma_mamba2 \
		bf16_fwd_gates_mamba2_64 bf16_fwd_gamma_mamba2_64
	$(PY) -m leetrepro.probes.host --out $(DATA)

# the launch tables of Chunk and LA, then the dispatch table of method="auto" for this GPU and
# auto's regret (GPU only)
# TUNE_ARGS=--resume: a cut-off run goes on where it stopped (measured cells kept)
TUNE_ARGS ?=
tune: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.sweep --out $(RESULTS)/data/$(GPU)
	$(PY) -m leetrepro.bench.tune --out $(RESULTS)/data/$(GPU) $(TUNE_ARGS)

# forward + backward against its floor, flash-linear-attention beside it (GPU only); then the
# layouts models hand the operator, eager and in CUDA graphs
bench-train: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.train --out $(DATA) --sweeps
	$(MAKE) --no-print-directory layouts

# the operator as models call it (GPU only): method="auto" beside Chunk and LA at batch 1-4,
# N = 2048-16384, the head shapes and counts models use, head-major, time-major views and a fused
# projection -> $(DATA)/layouts.csv; every head shape Chunk takes, every layout, beside fla ->
# $(DATA)/layouts_shapes.csv; each eager and in CUDA graphs (*_graph.csv)
# (eager rounds: 61, as host time makes two runs of one call differ by up to 10-18 % at 31)
layouts: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.layouts --out $(DATA) --reps 61
	$(PY) -m leetrepro.bench.layouts --out $(DATA) --graph --csv layouts_graph.csv
	$(PY) -m leetrepro.bench.layouts --out $(DATA) --grid shapes --csv layouts_shapes.csv
	$(PY) -m leetrepro.bench.layouts --out $(DATA) --grid shapes --graph --csv layouts_shapes_graph.csv

# per-token gates against the per-head decay and flash-linear-attention's gated path, forward and
# forward + backward, eager and in CUDA graphs, at simple GLA's and Mamba-2's shapes (GPU only)
bench-gates: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.gates --out $(DATA)

# a decoder language model's training step with its token mixer swapped (this project's operator,
# its drop-in, fla, softmax SDPA, per-token gates, Mamba-2 with each SSD), eager and compiled
bench-model: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.model --out $(DATA)
	$(PY) -m leetrepro.reproduce.model_figure

# Mamba-2's SSD (the drop-in) against mamba_ssm's Triton kernels ($$LEETREPRO_PEERS: its public
# source, or an install) and fla's gated path; the Mamba-2 block and LM with each SSD
bench-ssd: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.ssd --block --lm --mamba3 --out $(DATA)

bench-hf: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.hf --out $(DATA)

# the paper's methods under per-token gates: which extend, their cost, their numerical range, the
# kernels' times from data/<gpu>/gates.csv (CPU)
gates: $(INSTALLED)
	$(call run_notebook,gates,gates,$(GPU),-p gpu $(GPU))

# one attention layer (projections, the operator, forward + backward) against the same layer with
# fla's op, tokens/s (GPU only) -> $(DATA)/layer.csv
bench-layer: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m leetrepro.bench.layer --out $(DATA)

# packed prefill, the decode step, generation in Tables 7-8's models; fla beside (GPU only)
bench-serve: $(INSTALLED)
	$(if $(filter cpu,$(HERE)),,$(PY) -m leetrepro.bench.serve --out $(RESULTS)/data/$(GPU))
	$(call run_notebook,serve,serve,$(GPU),-p gpu $(GPU))
	$(rerendered_note)

# sequence parallelism over the GPUs of this host (GPUS of them), one torchrun job -> data/<gpu>x<GPUS>/sp.csv
GPUS ?= $(shell nvidia-smi -L 2>/dev/null | wc -l)
SP_ARGS ?=
bench-sp: $(INSTALLED)
	$(needs_gpu)
	$(PY) -m torch.distributed.run --nproc-per-node=$(GPUS) -m leetrepro.bench.sp $(SP_ARGS) \
	  --out $(RESULTS)/data/$(GPU)x$(GPUS)

# the scaling notebook from data/$(SP_TAG)/sp.csv (no GPU needed): plots and the model of larger scales
SP_TAG ?= h200x2
scaling: $(INSTALLED)
	$(call run_notebook,scaling,scaling,$(SP_TAG),-p tag $(SP_TAG))

# the results page: every measured table with its GPU and commit, from data/ alone (no GPU needed)
results: $(INSTALLED)
	$(PY) -m leetrepro.reproduce.results

# a small byte-level language model trained once per method (GPU: measured; else re-rendered)
train: $(INSTALLED)
	$(call run_notebook,train,train,$(GPU),-p gpu $(GPU))
	$(rerendered_note)

derivations: $(INSTALLED)
	$(call run_notebook,derivations,derivations,derivations,)

WHEEL_PY ?= 3.12
wheelhouse:
	$(PYTHON) -m pip download -d wheelhouse --only-binary=:all: --python-version $(WHEEL_PY) \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 --platform any papermill ipykernel nbformat nbclient sympy tqdm \
	  fla-core einops pytest hypothesis pytest-xdist execnet jupytext "transformers>=5.24,<5.25"
	@echo "copy wheelhouse/ to the GPU host, then: python3 -m pip install --no-index --find-links wheelhouse papermill ipykernel sympy jupytext"

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis notebooks/*.ipynb
