"""Research-agent fixtures: a scripted OpenAI-compatible fake LLM on 127.0.0.1 and a Prefect harness.

The fake LLM is a test double for an outside paid service: a tiny FastAPI app answering
``/v1/chat/completions`` in OpenAI's shape from a script (a function of the request's messages).
A script may return a starlette ``Response`` instead of text, to serve a broken body as-is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Response

from swarm.stack import ServerThread


@dataclass
class FakeLLM:
    url: str
    requests: list[list[dict[str, Any]]] = field(default_factory=list)

    def settings(self) -> Any:
        from research_agent.llm import LLMSettings

        return LLMSettings(model="fake-coder", base_url=self.url, api_key="test-key", timeout_s=30, retry_wait_s=0.0)


def _app(script: Callable[[list[dict[str, Any]]], Any], seen: list) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions", response_model=None)
    def chat(body: dict[str, Any]) -> Any:
        seen.append(body["messages"])
        text = script(body["messages"])
        if isinstance(text, Response):
            return text
        return {"id": f"chatcmpl-fake-{len(seen)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "fake"),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    return app


@pytest.fixture
def fake_llm() -> Iterator[Callable[[Callable[[list[dict[str, Any]]], str]], FakeLLM]]:
    """``fake_llm(script)`` starts a fake OpenAI server answering ``script(messages)``."""
    servers: list[ServerThread] = []

    def start(script: Callable[[list[dict[str, Any]]], str]) -> FakeLLM:
        seen: list = []
        server = ServerThread(_app(script, seen)).start()
        servers.append(server)
        return FakeLLM(f"{server.url}/v1", seen)

    yield start
    for s in servers:
        s.stop()
