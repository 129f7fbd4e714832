# encoder-eval-harness: install, test, lint, demo.
# `make install` builds .venv. On a machine without a GPU it installs the CPU build of
# torch first (TORCH_CPU), so pip never pulls a multi-GB CUDA build; on a GPU machine it
# uses uv when present. Elsewhere on a CPU-only machine, point TORCH_CPU at PyTorch's CPU
# index, e.g.  make install TORCH_CPU="torch --index-url https://download.pytorch.org/whl/cpu"

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU ?= torch==2.13.0
EXTRAS ?= dev,demo,trackers,neuco,push
STAMP := $(VENV)/.installed-$(shell echo $(EXTRAS) | tr ',' '-')
HAS_GPU := $(shell (command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1) || command -v rocm-smi >/dev/null && echo yes)

.PHONY: install test test-fast lint format demo smoke-paws clean

install: $(STAMP)

$(STAMP): pyproject.toml
ifeq ($(HAS_GPU),yes)
	@if command -v uv >/dev/null; then \
	  uv venv $(VENV) && uv pip install --python $(PY) -e ".[$(EXTRAS)]"; \
	else \
	  $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q --upgrade pip && \
	  $(PY) -m pip install -q -e ".[$(EXTRAS)]"; \
	fi
else
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_CPU)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
endif
	@touch $(STAMP)

# The test command CI runs (.ci/run). Tests never reach the Hub.
# TEST_WORKERS pytest-xdist processes: most tests wait on the cell processes they start, so
# two keep a 2-core CI machine busy (the Slurm tests stay on one worker, tests/conftest.py);
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
test: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The whole protocol on an embedded default (MiniLM + synthetic tasks, CPU, no Hub).
# `make demo DATA_DIR=../shared/data` runs it on real GLUE tasks from a mirror instead.
DATA_DIR ?=
DEMO_OUT ?= $(if $(DATA_DIR),demo_out_mirror,demo_out)
DEMO_TASKS ?= $(if $(DATA_DIR),glue_sst2$(comma)glue_rte,)
comma := ,
demo: install
	HF_HUB_OFFLINE=1 $(PY) -m encoder_eval.demo --out $(DEMO_OUT) \
	  $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(if $(DEMO_TASKS),--tasks $(DEMO_TASKS))

# A fast, 1000-step XLM-R PAWS-X cell: needs the Hub and a GPU.
smoke-paws: install
	mkdir -p results/smoke
	$(PY) -m encoder_eval.run \
	  --model-key xlm-r-base --task paws_x \
	  --lr 3.59e-05 --seed 45 --bsz 32 --max-steps 1000 --max-seq-len 256 \
	  --early-stop --patience 3 --epoch-cap 20 \
	  --results-dir results/smoke   # writes xlm-r-base_paws_x_lr06_s45.json

clean:
	rm -rf .pytest_cache .ruff_cache build *.egg-info

# Verify the GPU path on a GPU machine in one command, within 8 minutes: a real MiniLM RTE
# cell on cuda, a real out-of-memory retry under a memory cap, tests/test_oom.py on cuda, two
# workers on one GPU and bench/bench_gpu.py; every figure as JSON under GPU_CHECK_OUT
# (bench/gpu_check.py; `--dry-run` is its CPU form, run by the test suite).
GPU_CHECK_OUT ?= bench/results/gpu_check
.PHONY: gpu-check
gpu-check: install
	HF_HUB_OFFLINE=1 $(PY) bench/gpu_check.py --out $(GPU_CHECK_OUT)
