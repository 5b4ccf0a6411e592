"""The upstream backend behind a real gateway, against a scripted OpenAI-compatible server on loopback.

Covers: no tokenizer needed; no token claims (empty ids, prefix_consistent false); errors mapped to
the right status without the upstream's URL or auth details; the api key from the environment;
a bounded max_tokens; the stop-list limit; /v1/completions refused for a foreign vocabulary;
streaming with tool calls; the exact upstream body for tool_choice (none/auto/required/named),
parallel_tool_calls, response_format and top_logprobs; the server's top_logprobs back to the
openai SDK (never stored as token claims); logprobs refused where the server has none; the api key
never reaches the MLflow params.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swarm.policy.upstream import UpstreamBackend
from swarm.pool import StepFilter
from swarm.stack import ServerThread

SECRET = "sk-upstream-secret-123"
CALL = {"id": "call_up1", "type": "function", "function": {"name": "vote", "arguments": '{"target": "p3"}'}}


class Scripted:
    """An OpenAI-compatible server whose next answers the test chooses; it records every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.mode = "ok"
        self.streams: list[str] = []  # "slow" mode: how each stream ended ("finished" or "closed at chunk k")
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.requests.append({"auth": request.headers.get("authorization"), "body": body})
            if self.mode.startswith("slow"):  # a long stream, a chunk every 50 ms: it notes whether it was stopped
                return StreamingResponse(self._slow(body["model"], tool=self.mode == "slow_tool"),
                                         media_type="text/event-stream")
            if self.mode != "ok":
                status = {"bad": 400, "auth": 401, "rate": 429, "down": 503}[self.mode]
                return JSONResponse({"error": {"message": f"scripted {self.mode} at http://10.0.0.9/internal "
                                               f"with key {SECRET}", "type": "x"}}, status_code=status)
            last = body["messages"][-1].get("content") or ""
            call = body.get("tools") and "vote" in last and body.get("tool_choice") != "none"  # honours "none"
            msg = {"role": "assistant", "content": None if call else f"heard: {last}"}
            if call:
                msg["tool_calls"] = [CALL]
            logprobs = _logprobs(msg["content"], body.get("top_logprobs") or 0) if body.get("logprobs") else None
            if body.get("stream"):
                def events() -> Iterator[bytes]:
                    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
                    delta: dict[str, Any] = {"role": "assistant"}
                    if call:
                        delta["tool_calls"] = [{"index": 0, **CALL}]
                    else:
                        delta["content"] = msg["content"]
                    for ch in ([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}],
                               [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if call else "stop"}]):
                        yield f"data: {json.dumps({**base, 'choices': ch})}\n\n".encode()
                    yield b"data: [DONE]\n\n"
                return StreamingResponse(events(), media_type="text/event-stream")
            return {"id": "c1", "object": "chat.completion", "created": 1, "model": body["model"],
                    "choices": [{"index": 0, "message": msg, "logprobs": logprobs,
                                 "finish_reason": "tool_calls" if call else "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}

        self.server = ServerThread(app).start()
        self.url = self.server.url + "/v1"

    async def _slow(self, model: str, tool: bool = False) -> Any:
        k = 0
        try:
            for k in range(100):  # with ``tool``: a tool call being written, which the gateway holds back
                text = ("<tool_call>" if k == 0 else f" a{k}") if tool else f"w{k} "
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                         "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                await asyncio.sleep(0.05)
            yield b"data: [DONE]\n\n"
            self.streams.append("finished")
        finally:
            if not self.streams or self.streams[-1] != "finished":
                self.streams.append(f"closed at chunk {k}")


def _logprobs(content: str | None, k: int) -> dict[str, Any] | None:
    """Two text tokens with ``k`` (at most 2) alternatives each, as an API model sends them: no token ids."""
    if not content:
        return None
    entries = []
    for tok, lp in ((content[:5], -0.5), (content[5:], -1.25)):
        alts = [{"token": tok, "logprob": lp, "bytes": list(tok.encode())}, {"token": "?", "logprob": -4.0, "bytes": [63]}]
        entries.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": alts[:k]})
    return {"content": entries, "refusal": None}


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[Scripted]:
    monkeypatch.setenv("SWARM_UPSTREAM_API_KEY", SECRET)
    s = Scripted()
    yield s
    s.server.stop()


@pytest.fixture
def up_gateway(make_gateway: Any, upstream: Scripted) -> Any:
    backend = UpstreamBackend(upstream.url, model="big-235b", policies=["opponent"])  # no tokenizer_path
    return make_gateway(backend)


def _client(gw: Any) -> tuple[openai.OpenAI, dict[str, Any]]:
    ep = gw.episode()
    return openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0), ep


def test_chat_without_tokenizer_records_no_token_claims(up_gateway: Any, upstream: Scripted) -> None:
    client, ep = _client(up_gateway)
    msgs: list[Any] = [{"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model="opponent", messages=msgs)
    assert r.choices[0].message.content == "heard: hello"
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "again"}]
    client.chat.completions.create(model="opponent", messages=msgs, max_tokens=100_000 // 10)
    sent = [q["body"] for q in upstream.requests]
    assert all(q["auth"] == f"Bearer {SECRET}" for q in upstream.requests)  # from the environment
    assert sent[0]["model"] == "big-235b" and sent[0]["max_tokens"] <= 4096  # not the whole context
    assert sent[1]["max_tokens"] == 4096
    steps = up_gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"]), with_tokens=True, order="episode")
    assert len(steps) == 2
    for s in steps:  # nothing claimed that the server did not give
        assert s.prompt_ids == [] and s.response_ids == [] and s.response_logprobs is None
        assert s.prefix_consistent is False and "tokenizes for itself" in s.metadata["prefix_reason"]


def test_tool_calls_sync_and_streaming(up_gateway: Any) -> None:
    client, _ = _client(up_gateway)
    tools = [{"type": "function", "function": {"name": "vote", "parameters": {"type": "object"}}}]
    r = client.chat.completions.create(model="opponent", messages=[{"role": "user", "content": "vote now"}],
                                       tools=tools)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls[0].function.name == "vote"
    stream = client.chat.completions.create(model="opponent", messages=[{"role": "user", "content": "vote"}],
                                            tools=tools, stream=True)
    calls = [tc for chunk in stream for c in chunk.choices for tc in (c.delta.tool_calls or [])]
    assert calls and calls[0].function.name == "vote" and json.loads(calls[0].function.arguments) == {"target": "p3"}


@pytest.mark.parametrize(("mode", "status"), [("bad", 400), ("rate", 429), ("auth", 502), ("down", 502)])
def test_upstream_errors_map_without_leaking(up_gateway: Any, upstream: Scripted, mode: str, status: int) -> None:
    client, _ = _client(up_gateway)
    upstream.mode = mode
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="opponent", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == status
    text = json.dumps(err.value.body)
    for leak in (upstream.url, "127.0.0.1", SECRET, "Bearer"):
        assert leak not in text
    if mode == "bad":
        assert "scripted bad" in text  # the upstream's reason for refusing the request is the caller's to see
    if mode == "auth":
        assert "credentials" in text and "401" not in text


@pytest.mark.parametrize("mode", ["slow", "slow_tool"])
def test_a_client_that_goes_away_mid_stream_stops_the_upstream_stream(up_gateway: Any, upstream: Scripted,
                                                                       mode: str) -> None:
    """Also while nothing is being sent (``slow_tool``: a tool call being written is held back)."""
    import httpx

    ep = up_gateway.episode()
    upstream.mode = mode
    tools = {"tools": VOTE} if mode == "slow_tool" else {}
    with httpx.Client(timeout=10) as client, client.stream(
            "POST", ep["base_url"] + "/chat/completions", headers={"Authorization": f"Bearer {ep['api_key']}"},
            json={"model": "opponent", "messages": [{"role": "user", "content": "hi"}], "stream": True, **tools}) as r:
        lines = r.iter_lines()
        if mode == "slow":
            assert [next(lines) for _ in range(4)][2].startswith("data: ")  # a chunk or two arrived
        else:
            assert '"role":"assistant"' in next(lines)  # the opening chunk; then nothing while the call is written
            time.sleep(0.3)
    # the connection is closed: the gateway closes its upstream stream, long before the upstream's 5 s
    deadline = time.monotonic() + 4
    while not upstream.streams and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upstream.streams and upstream.streams[0].startswith("closed at chunk"), upstream.streams
    assert int(upstream.streams[0].split()[-1]) < 60


def test_stop_limit_and_completions_refused(up_gateway: Any, upstream: Scripted) -> None:
    client, _ = _client(up_gateway)
    with pytest.raises(openai.BadRequestError, match="at most 4 stop"):
        client.chat.completions.create(model="opponent", messages=[{"role": "user", "content": "x"}],
                                       stop=["a", "b", "c", "d", "e"])
    with pytest.raises(openai.BadRequestError, match="chat/completions"):
        client.completions.create(model="opponent", prompt=[1, 2, 3], max_tokens=4)
    assert upstream.requests == []  # neither reached the upstream


def test_api_key_never_reaches_mlflow_params() -> None:
    from flows.tracking import flatten, redact

    cfg = {"model": {"backend": "upstream", "api_key": SECRET, "api_key_env": "SWARM_UPSTREAM_API_KEY",
                     "max_tokens": 4096, "replicas": [{"api_key": SECRET}]}}
    params = flatten(cfg)
    assert SECRET not in json.dumps(params) and SECRET not in json.dumps(redact(cfg))
    assert params["model.api_key_env"] == "SWARM_UPSTREAM_API_KEY" and params["model.max_tokens"] == "4096"


VOTE = [{"type": "function", "function": {"name": "vote", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_choice": "auto"},
        {"tool_choice": "none"},
        {"tool_choice": "required"},  # one tool: still "required", not rebuilt as a named choice
        {"tool_choice": {"type": "function", "function": {"name": "vote"}}},
        {"parallel_tool_calls": False},
        {"response_format": SCHEMA},  # no "strict": forwarded as sent
        {"response_format": {"type": "json_object"}},
        {"logprobs": True, "top_logprobs": 2},
    ],
)
def test_forwarded_body_is_exact(up_gateway: Any, upstream: Scripted, fields: dict[str, Any]) -> None:
    client, _ = _client(up_gateway)
    msgs = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="opponent", messages=msgs, tools=VOTE, max_tokens=16, **fields)
    [sent] = [q["body"] for q in upstream.requests]
    # the client's body as sent (no sampling default added), plus the upstream's model id and logprobs
    assert sent == {"model": "big-235b", "max_tokens": 16, "messages": msgs, "tools": VOTE, "logprobs": True, **fields}


def test_tool_choice_none_reaches_the_upstream(up_gateway: Any, upstream: Scripted) -> None:
    client, ep = _client(up_gateway)
    msgs = [{"role": "user", "content": "vote now"}]
    r = client.chat.completions.create(model="opponent", messages=msgs, tools=VOTE, tool_choice="none")
    assert upstream.requests[-1]["body"]["tool_choice"] == "none"  # passed on, not emulated here
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == "heard: vote now"
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="opponent", messages=msgs, tools=VOTE, tool_choice="auto")
    assert upstream.requests[-1]["body"]["tool_choice"] == "auto" and r.choices[0].message.tool_calls
    steps = up_gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"]), order="episode")
    assert [len(s.tool_calls) for s in steps] == [0, 1]


def test_top_logprobs_come_back_through_the_gateway(up_gateway: Any, upstream: Scripted) -> None:
    client, ep = _client(up_gateway)
    msgs = [{"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model="opponent", messages=msgs, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in content] == [("heard", -0.5), (": hello", -1.25)]
    assert [[(a.token, a.logprob) for a in t.top_logprobs] for t in content] == [
        [("heard", -0.5), ("?", -4.0)], [(": hello", -1.25), ("?", -4.0)]]
    stream = client.chat.completions.create(model="opponent", messages=msgs, logprobs=True, top_logprobs=1,
                                            stream=True)
    streamed = [t for chunk in stream for c in chunk.choices if c.logprobs for t in c.logprobs.content or []]
    assert [[a.token for a in t.top_logprobs] for t in streamed] == [["heard"], [": hello"]]
    r = client.chat.completions.create(model="opponent", messages=msgs)  # not asked: none returned
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(model="opponent", messages=msgs, logprobs=True)  # no alternatives asked
    assert all(t.top_logprobs == [] for t in r.choices[0].logprobs.content)
    assert "top_logprobs" not in upstream.requests[-1]["body"]
    steps = up_gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"]), with_tokens=True, order="episode")
    assert len(steps) == 4  # the server's logprobs have no token ids: the steps claim neither
    assert all(s.response_ids == [] and s.response_logprobs is None for s in steps)


def test_logprobs_refused_where_the_upstream_has_none(make_gateway: Any, upstream: Scripted) -> None:
    gw = make_gateway(UpstreamBackend(upstream.url, model="big-235b", policies=["opponent"], logprobs=False))
    client, _ = _client(gw)
    msgs = [{"role": "user", "content": "hello"}]
    for kwargs, param in (({"logprobs": True}, "logprobs"), ({"logprobs": True, "top_logprobs": 2}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="opponent", messages=msgs, **kwargs)
        assert err.value.body["param"] == param
    assert upstream.requests == []
    r = client.chat.completions.create(model="opponent", messages=msgs)
    assert r.choices[0].message.content == "heard: hello" and "logprobs" not in upstream.requests[0]["body"]


def test_the_upstream_connections_are_aiohttp_per_loop_and_closed_with_the_gateway(make_gateway: Any,
                                                                                   upstream: Scripted) -> None:
    """No transport given: calls go over aiohttp (swarm/policy/_http.py), one session per event loop; the gateway's
    lifespan closes its loop's session as it stops, and the backend keeps serving from another loop afterwards."""
    import asyncio

    import aiohttp

    from swarm.policy.base import GenerateRequest

    backend = UpstreamBackend(upstream.url, model="big-235b", policies=["opponent"])
    gw = make_gateway(backend)
    client, _ = _client(gw)
    assert client.chat.completions.create(model="opponent", messages=[{"role": "user", "content": "hi"}])
    loops = backend._client._loops
    (session,) = [t.client for t in loops._by_loop.values()]
    assert isinstance(session, aiohttp.ClientSession) and not session.closed
    gw.stop()
    assert session.closed and not loops._by_loop  # closed by the gateway's lifespan, in its loop

    async def call(text: str) -> str:
        try:
            (g,) = await backend.generate(GenerateRequest("opponent", messages=[{"role": "user", "content": text}]))
            return g.text
        finally:
            await backend.aclose()

    assert [asyncio.run(call(t)) for t in ("one", "two")] == ["heard: one", "heard: two"]  # two loops, two sessions
    assert not loops._by_loop
