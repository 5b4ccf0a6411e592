"""The upstream backend forwards the client's body as sent and returns the upstream's usage, against a strict fake
server on loopback: the backend alone, and end to end behind a real gateway (uvicorn on loopback) that records
the usage on the step. Streamed usage is other numbers there, so a usage counted by the gateway could not pass."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swarm.app import GatewaySettings, create_app
from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.upstream import CLIENT_BODY, UpstreamBackend, UpstreamGeneration
from swarm.pool import Pool, StepFilter
from swarm.stack import ServerThread

USAGE = {"prompt_tokens": 31, "completion_tokens": 2, "total_tokens": 33,
         "prompt_tokens_details": {"cached_tokens": 16}}
STREAM_USAGE = {"prompt_tokens": 41, "completion_tokens": 3, "total_tokens": 44}
# what OpenAI's chat endpoint knows; anything else is an extra_body key the client chose to send
KNOWN = {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "temperature", "top_p",
         "n", "seed", "stop", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "stream",
         "stream_options", "user", "top_k"}


class StrictUpstream:
    """An OpenAI-compatible server that refuses what OpenAI refuses, logs every body, and tokenizes as vLLM does."""

    def __init__(self, stream_usage: dict[str, Any] = USAGE) -> None:
        self.bodies: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            unknown = set(body) - KNOWN
            if unknown or ("stream_options" in body and not body.get("stream")):
                why = f"unknown fields {sorted(unknown)}" if unknown else "stream_options needs stream: true"
                return JSONResponse({"error": {"message": why, "type": "invalid_request_error"}}, status_code=400)
            content = [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                       for t, lp in ((17, -0.25), (18, -1.5))]
            if not body.get("stream"):
                return {"id": "c1", "object": "chat.completion", "created": 1, "model": body["model"],
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Sunny"},
                                     "logprobs": {"content": content}, "finish_reason": "stop"}],
                        "usage": USAGE}

            def events() -> Iterator[bytes]:
                base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
                for i, (text, entry) in enumerate((("Sun", content[0]), ("ny", content[1]))):
                    ch = {"index": 0, "delta": {"content": text}, "logprobs": {"content": [entry]},
                          "finish_reason": "stop" if i else None}
                    yield f"data: {json.dumps({**base, 'choices': [ch]})}\n\n".encode()
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({**base, 'choices': [], 'usage': stream_usage})}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        self.server = ServerThread(app).start()
        self.url = self.server.url + "/v1"


@pytest.fixture(scope="module")
def upstream() -> Iterator[StrictUpstream]:
    s = StrictUpstream()
    yield s
    s.server.stop()


PARTS = [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]}]


def _request(client_body: dict[str, Any], max_tokens: int = 64) -> GenerateRequest:
    """What the gateway builds: flattened messages and filled-in sampling, plus the client's body as sent."""
    flat = [{**m, "content": m["content"] if isinstance(m["content"], str) else "\n".join(p["text"] for p in m["content"])}
            for m in client_body["messages"]]
    return GenerateRequest("opponent", messages=flat, sampling=SamplingParams(max_tokens=max_tokens),
                           client_fields={CLIENT_BODY: client_body})


def _backend(upstream: StrictUpstream, **kw: Any) -> UpstreamBackend:
    return UpstreamBackend(upstream.url, api_key="k", model="big-235b", policies=["opponent"], **kw)


def test_body_forwarded_as_sent_and_usage_returned(upstream: StrictUpstream) -> None:
    sent = {"model": "opponent", "messages": PARTS, "max_completion_tokens": 12, "top_k": 5}  # no temperature, top_p, n
    b = _backend(upstream)
    [g] = asyncio.run(b.generate(_request(sent)))
    assert upstream.bodies[-1] == {**sent, "model": "big-235b", "logprobs": True}  # the one addition: logprobs
    assert isinstance(g, UpstreamGeneration) and g.usage == USAGE  # usage round-trips, details included
    assert g.text == "Sunny" and g.response_ids == [17, 18] and g.logprobs == [-0.25, -1.5]  # still trainable
    capped = {**sent, "max_completion_tokens": 10**6}
    asyncio.run(_backend(upstream, max_tokens=100).generate(_request(capped)))
    assert upstream.bodies[-1]["max_completion_tokens"] == 100 and "max_tokens" not in upstream.bodies[-1]
    no_limit = {"model": "opponent", "messages": PARTS, "temperature": 0.3}
    asyncio.run(_backend(upstream, max_tokens=100).generate(_request(no_limit, max_tokens=40)))
    assert upstream.bodies[-1] == {**no_limit, "model": "big-235b", "max_tokens": 40, "logprobs": True}


async def _drain(b: UpstreamBackend, req: GenerateRequest) -> list[Any]:
    return [item async for item in b.stream(req)]


def test_stream_keeps_stream_options_and_returns_the_usage_chunk(upstream: StrictUpstream) -> None:
    sent = {"model": "opponent", "messages": PARTS, "stream": True, "max_tokens": 8,
            "stream_options": {"include_usage": True}, "seed": 7}
    items = asyncio.run(_drain(_backend(upstream), _request(sent)))
    assert upstream.bodies[-1] == {**sent, "model": "big-235b", "logprobs": True}
    final = items[-1]
    assert final.usage == USAGE and final.text == "Sunny" and final.response_ids == [17, 18]
    assert final.logprobs == [-0.25, -1.5]
    # a client that streams without asking for usage: include_usage is added, so the step still gets it
    quiet = {k: v for k, v in sent.items() if k != "stream_options"}
    items = asyncio.run(_drain(_backend(upstream), _request(quiet)))
    assert upstream.bodies[-1] == {**quiet, "model": "big-235b", "logprobs": True,
                                   "stream_options": {"include_usage": True}}
    assert items[-1].usage == USAGE


def test_without_the_client_body_the_request_is_built_from_sampling(upstream: StrictUpstream) -> None:
    req = GenerateRequest("opponent", messages=[{"role": "user", "content": "hi"}],
                          sampling=SamplingParams(max_tokens=5, temperature=0.5))
    [g] = asyncio.run(_backend(upstream).generate(req))
    body = upstream.bodies[-1]
    assert body["temperature"] == 0.5 and body["max_tokens"] == 5 and g.usage == USAGE


# -- behind the gateway --
@pytest.fixture(scope="module")
def streaming_upstream() -> Iterator[StrictUpstream]:
    s = StrictUpstream(stream_usage=STREAM_USAGE)
    yield s
    s.server.stop()


@pytest.fixture
def gateway(tmp_path: Path, streaming_upstream: StrictUpstream) -> Iterator[tuple[httpx.Client, Pool]]:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    backend = UpstreamBackend(streaming_upstream.url, api_key="k", model="big-235b", policies=["opponent"])
    server = ServerThread(create_app(pool, backend, GatewaySettings())).start()
    http = httpx.Client(base_url=server.url, timeout=60)
    try:
        yield http, pool
    finally:
        http.close()
        server.stop()
        pool.close()


def _episode(http: httpx.Client) -> tuple[str, dict[str, str]]:
    r = http.post("/v1/episodes", json={"task": "t"})
    assert r.status_code == 200, r.text
    ep = r.json()
    return ep["episode_id"], {"Authorization": f"Bearer {ep['api_key']}"}


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    lines = [ln[len("data: "):] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_the_upstream_gets_the_body_as_sent_and_the_client_its_usage(gateway: Any, streaming_upstream: StrictUpstream) -> None:
    http, pool = gateway
    episode_id, auth = _episode(http)
    # no temperature, top_p or n; the OpenAI length key of today; content parts; vLLM's top_k and a user
    sent = {"model": "opponent", "messages": PARTS, "max_completion_tokens": 12, "top_k": 5, "user": "u1"}
    r = http.post("/v1/chat/completions", json=sent, headers=auth)
    assert r.status_code == 200, r.text
    assert streaming_upstream.bodies[-1] == {**sent, "model": "big-235b", "logprobs": True}  # recording's one addition
    assert r.json()["usage"] == USAGE and r.json()["choices"][0]["message"]["content"] == "Sunny"
    [step] = pool.query_steps(StepFilter(episode_id=episode_id), order="episode")
    assert step.metadata["usage"] == USAGE
    # a repeat with the same Idempotency-Key is answered from the step: the same usage, no second upstream call
    calls = len(streaming_upstream.bodies)
    for _ in range(2):
        r = http.post("/v1/chat/completions", json={**sent, "messages": PARTS[1:]}, headers={**auth, "Idempotency-Key": "k1"})
        assert r.status_code == 200 and r.json()["usage"] == USAGE
    assert len(streaming_upstream.bodies) == calls + 1


def test_streamed_calls_keep_stream_options_and_send_the_upstreams_usage_chunk(gateway: Any,
                                                                                streaming_upstream: StrictUpstream) -> None:
    http, pool = gateway
    episode_id, auth = _episode(http)
    sent = {"model": "opponent", "messages": PARTS, "stream": True, "max_tokens": 8, "seed": 7,
            "stream_options": {"include_usage": True}}
    r = http.post("/v1/chat/completions", json=sent, headers=auth)
    assert r.status_code == 200, r.text
    assert streaming_upstream.bodies[-1] == {**sent, "model": "big-235b", "logprobs": True}
    chunks = _events(r)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Sunny"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == STREAM_USAGE
    # not asked by the client: the upstream is asked anyway (so the step gets it), the client gets no usage chunk
    quiet = {k: v for k, v in sent.items() if k != "stream_options"}
    r = http.post("/v1/chat/completions", json=quiet, headers=auth)
    assert streaming_upstream.bodies[-1] == {**quiet, "model": "big-235b", "logprobs": True,
                                   "stream_options": {"include_usage": True}}
    assert all("usage" not in c for c in _events(r))
    steps = pool.query_steps(StepFilter(episode_id=episode_id), order="episode")
    assert [s.metadata["usage"] for s in steps] == [STREAM_USAGE, STREAM_USAGE]


def test_a_client_that_sets_sampling_fields_gets_them_forwarded_unchanged(gateway: Any,
                                                                          streaming_upstream: StrictUpstream) -> None:
    http, _ = gateway
    _, auth = _episode(http)
    sent = {"model": "opponent", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2,
            "top_p": 0.5, "n": 1, "stop": "\n", "max_tokens": 5, "top_k": -1}
    r = http.post("/v1/chat/completions", json=sent, headers=auth)
    assert r.status_code == 200, r.text
    assert streaming_upstream.bodies[-1] == {**sent, "model": "big-235b", "logprobs": True}
