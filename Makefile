# encoder-eval-harness: install, test, lint, demo.
# `make install` builds .venv. On a machine without a GPU it installs the CPU build of
# torch first (TORCH_CPU), so pip never pulls a multi-GB CUDA build; on a GPU machine it
# uses uv when present. Elsewhere on a CPU-only machine, point TORCH_CPU at PyTorch's CPU
# index, e.g.  make install TORCH_CPU="torch --index-url https://download.pytorch.org/whl/cpu"
# On ROCm (rocm-smi on PATH) PyPI's torch is a CUDA build that would run every cell on the
# CPU: give PyTorch's ROCm wheel, e.g.
#   make install TORCH_ROCM="torch --index-url https://download.pytorch.org/whl/rocm6.4"
# (docs/install.md); without it `make install` stops before installing anything.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU ?= torch==2.13.0
TORCH_ROCM ?=
EXTRAS ?= dev,demo,trackers,neuco,push
STAMP := $(VENV)/.installed-$(shell echo $(EXTRAS) | tr ',' '-')
HAS_ROCM := $(shell command -v rocm-smi >/dev/null && echo yes)
HAS_GPU := $(shell (command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1) || command -v rocm-smi >/dev/null && echo yes)

.PHONY: install test test-fast lint format demo smoke-paws clean

install: $(STAMP)

$(STAMP): pyproject.toml
ifeq ($(HAS_ROCM)$(TORCH_ROCM),yes)
	@echo "error: rocm-smi is on PATH, and PyPI's torch is a CUDA build (every cell would run on the CPU); run: make install TORCH_ROCM=\"torch --index-url https://download.pytorch.org/whl/rocm6.4\" (your ROCm version), see docs/install.md" >&2; exit 2
endif
	@echo "install: 4 steps, about 2.3 GB and 6 minutes on a first download, about 1 minute"
	@echo "         from pip's cache (2-core VM: issue 40, docs/install.md; pip itself is quiet)"
	@echo "install: 1/4 a virtual environment in $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@echo "install: 2/4 the latest pip"
	@$(PY) -m pip install -q --upgrade pip
ifneq ($(TORCH_ROCM),)
	@echo "install: 3/4 PyTorch for ROCm: $(TORCH_ROCM) (the largest download)"
	@$(PY) -m pip install -q $(TORCH_ROCM)
else ifneq ($(HAS_GPU),yes)
	@echo "install: 3/4 PyTorch, CPU build: $(TORCH_CPU)"
	@$(PY) -m pip install -q $(TORCH_CPU)
else
	@echo "install: 3/4 PyTorch with CUDA comes with step 4 (the largest download)"
endif
	@echo "install: 4/4 the harness with [$(EXTRAS)]: transformers, datasets, scipy, pytest,"
	@echo "         ruff, and TensorBoard, MLflow, W&B, Optuna, huggingface_hub (most of the"
	@echo "         time; EXTRAS=dev,demo installs less)"
	@if [ "$(HAS_GPU)" = yes ] && [ -z "$(TORCH_ROCM)" ] && command -v uv >/dev/null; then \
	  uv pip install -q --python $(PY) -e ".[$(EXTRAS)]"; \
	else \
	  $(PY) -m pip install -q -e ".[$(EXTRAS)]"; \
	fi
	@$(PY) -c "import torch; print('install: done; torch', torch.__version__, '| GPU visible:', torch.cuda.is_available())"
	@touch $(STAMP)

# The test command CI runs (.ci/run). Tests never reach the Hub.
# TEST_WORKERS pytest-xdist processes: most tests wait on the cell processes they start, so
# two keep a 2-core CI machine busy (the Slurm tests stay on one worker, tests/conftest.py);
# TEST_WORKERS=0 runs everything in one process. --storm: the kill storm's every round
# (tests/test_kills.py), where a plain pytest runs a few.
TEST_WORKERS ?= 2
test: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --storm

# While developing: every test but the slow ones (whole pipelines, the kill storm) and the
# Slurm ones; `make test` still runs them all.
test-fast: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup \
	  -m "not slow and not storm and not slurm"

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

# Verify and measure the GPU path on a GPU machine in one command, within 8 minutes: the
# per-width first-meeting cost, cells per GPU-hour of the speed settings, warm against fresh
# processes to the last bit, --graph-step against eager and bench/bench_gpu.py (`--only all`
# adds issue 38's checks); every figure as JSON under GPU_CHECK_OUT (bench/gpu_check.py;
# `--dry-run` is its CPU form, run by the test suite).
GPU_CHECK_OUT ?= bench/results/gpu_check
.PHONY: gpu-check
gpu-check: install
	HF_HUB_OFFLINE=1 $(PY) bench/gpu_check.py --out $(GPU_CHECK_OUT)
