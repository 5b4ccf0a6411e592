"""The upstream (OpenAI-compatible) client against httpx.MockTransport: forwarded fields, token data when given, errors mapped."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from swarm.errors import BackendError, ContextLengthError, NotFoundError, ValidationError
from swarm.policy import build_backend
from swarm.policy.base import GenerateRequest, Generation, PolicyBackend, SamplingParams, TokenDelta
from swarm.policy.upstream import UpstreamBackend

MSGS = [{"role": "user", "content": "Weather in Paris?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def chat_response(model, logprobs=True, ids=False):
    content = [
        {"token": "token_id:17" if ids else "Sun", "logprob": -0.25, "bytes": [83, 117, 110], "top_logprobs": []},
        {"token": "token_id:18" if ids else "ny", "logprob": -1.5, "bytes": [110, 121], "top_logprobs": []},
    ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Sunny", "tool_calls": [CALL]},
                "logprobs": {"content": content} if logprobs else None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }


def sse(events):
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


def make(handler, **kw) -> UpstreamBackend:
    return UpstreamBackend("http://judge.test/v1", api_key="k", transport=httpx.MockTransport(handler), **kw)


def test_chat_records_text_tool_calls_and_logprobs():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers["authorization"], json.loads(request.content)))
        return httpx.Response(200, json=chat_response("gpt-judge"))

    b = make(handler, model="gpt-judge", policies=["judge"])
    assert isinstance(b, PolicyBackend) and b.policies() == ["judge"] and b.version("judge") == 0
    req = GenerateRequest(
        "judge",
        messages=MSGS,
        tools=[{"type": "function", "function": {"name": "get_weather"}}],
        sampling=SamplingParams(max_tokens=5, temperature=0.5, stop=("\n",), seed=3),
    )
    [g] = asyncio.run(b.generate(req))
    path, auth, body = seen[0]
    assert path == "/v1/chat/completions" and auth == "Bearer k"
    assert body["model"] == "gpt-judge" and body["messages"] == MSGS and body["logprobs"] is True
    assert body["stop"] == ["\n"] and body["seed"] == 3 and body["tools"][0]["function"]["name"] == "get_weather"
    assert g.text == "Sunny" and g.response_ids == [] and g.prompt_ids == []
    # no ids: the logprobs are not the step's (no logprobs without their tokens), but the client gets them as sent
    assert g.logprobs is None and [(e["token"], e["logprob"]) for e in g.logprobs_content] == [("Sun", -0.25), ("ny", -1.5)]
    assert g.tool_calls == [CALL] and g.finish_reason == "tool_calls" and g.policy_version == 0


def test_token_ids_when_the_server_gives_them_and_none_without_logprobs():
    mode = {"ids": True, "logprobs": True}

    def handler(request):
        return httpx.Response(200, json=chat_response("m", logprobs=mode["logprobs"], ids=mode["ids"]))

    b = make(handler, model="m")
    [g] = asyncio.run(b.generate(GenerateRequest("default", messages=MSGS)))
    assert g.response_ids == [17, 18] and g.logprobs == [-0.25, -1.5]
    mode["logprobs"] = False
    [g] = asyncio.run(b.generate(GenerateRequest("default", messages=MSGS)))
    assert g.response_ids == [] and g.logprobs is None and g.text == "Sunny"


def test_prompt_ids_use_completions():
    def handler(request):
        body = json.loads(request.content)
        assert request.url.path == "/v1/completions" and body["prompt"] == [1, 2, 3]
        choice = {
            "index": 0,
            "text": "ok",
            "finish_reason": "length",
            "token_ids": [7, 8],
            "prompt_token_ids": [1, 2, 3],
            "logprobs": {
                "tokens": ["o", "k"],
                "token_logprobs": [-0.1, -0.2],
                "text_offset": [0, 1],
                "top_logprobs": [],
            },
        }
        return httpx.Response(200, json={"id": "c", "object": "text_completion", "model": "m", "choices": [choice]})

    [g] = asyncio.run(make(handler, completions=True).generate(GenerateRequest("default", prompt_ids=[1, 2, 3])))
    assert (g.prompt_ids, g.response_ids, g.logprobs, g.text, g.finish_reason) == (
        [1, 2, 3],
        [7, 8],
        [-0.1, -0.2],
        "ok",
        "length",
    )


def test_streaming_chat_with_tool_call_deltas():
    def chunk(delta, finish=None, lp=None):
        return {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
        }

    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk(
            {"content": "Let"}, lp={"content": [{"token": "Let", "logprob": -0.5, "bytes": None, "top_logprobs": []}]}
        ),
        chunk(
            {"content": " me"}, lp={"content": [{"token": " me", "logprob": -0.25, "bytes": None, "top_logprobs": []}]}
        ),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({}, finish="tool_calls"),
        {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": {"total_tokens": 3}},
    ]
    b = make(lambda request: sse(events))

    async def collect():
        return [i async for i in b.stream(GenerateRequest("default", messages=MSGS))]

    items = asyncio.run(collect())
    deltas = [i for i in items if isinstance(i, TokenDelta)]
    [final] = [i for i in items if isinstance(i, Generation)]
    assert "".join(d.text for d in deltas) == final.text == "Let me"
    assert final.logprobs is None and final.finish_reason == "tool_calls"  # no ids: no logprobs claimed
    assert [e["token"] for e in final.logprobs_content] == ["Let", " me"]
    assert [e["logprob"] for d in deltas for e in d.logprobs_content or []] == [-0.5, -0.25]
    assert final.tool_calls == [
        {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]


def test_errors_are_mapped_without_internals():
    def handler(request):
        if b"long" in request.content:
            return httpx.Response(
                400,
                json={
                    "error": {
                        "message": "This model's maximum context length is 8 tokens",
                        "type": "invalid_request_error",
                    }
                },
            )
        if b"down" in request.content:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(500, text="boom")

    b = make(handler)
    with pytest.raises(ContextLengthError):
        asyncio.run(b.generate(GenerateRequest("default", messages=[{"role": "user", "content": "long"}])))
    with pytest.raises(BackendError, match="unreachable") as down:
        asyncio.run(b.generate(GenerateRequest("default", messages=[{"role": "user", "content": "down"}])))
    assert "judge.test" not in str(down.value)  # the upstream's address is not the agent's business
    with pytest.raises(BackendError, match="500"):
        asyncio.run(b.generate(GenerateRequest("default", messages=MSGS)))

    async def stream_fail():
        return [i async for i in b.stream(GenerateRequest("default", messages=MSGS))]

    with pytest.raises(BackendError):
        asyncio.run(stream_fail())
    with pytest.raises(NotFoundError):
        b.version("other")
    assert b.encode("default", b.render_chat("default", MSGS, None, True)) == []  # no tokenizer: no ids
    with pytest.raises(BackendError):
        b.decode("default", [1, 2])
    with pytest.raises(BackendError):
        b.load_weights("default", {}, 1)


def test_factory_and_local_tokenizer(tiny_model_path):
    b = build_backend(
        "upstream",
        base_url="http://x.test/v1",
        tokenizer_path=str(tiny_model_path),
        transport=httpx.MockTransport(lambda r: httpx.Response(500)),
    )
    text = b.render_chat("default", MSGS, None, True)
    assert b.decode("default", b.encode("default", text)) == text
    with pytest.raises(Exception, match="unknown"):
        build_backend("nope")


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
SCHEMA_FORMAT = {"type": "json_schema",
                 "json_schema": {"name": "answer", "description": "kept as sent", "schema": {"type": "object"}}}


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_choice": "auto"},
        {"tool_choice": "none"},
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        {"parallel_tool_calls": False},
        {"response_format": SCHEMA_FORMAT},  # no "strict", a description: forwarded as sent, not rebuilt
        {"tool_choice": "required", "parallel_tool_calls": True, "logprobs": True},
    ],
)
def test_client_fields_are_forwarded_exactly(fields):
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=chat_response("m"))

    req = GenerateRequest("default", messages=MSGS, tools=TOOLS, sampling=SamplingParams(max_tokens=5),
                          client_fields=dict(fields))
    asyncio.run(make(handler, model="m").generate(req))
    expected = {"model": "m", "max_tokens": 5, "temperature": 1.0, "top_p": 1.0, "n": 1, "messages": MSGS,
                "tools": TOOLS, "logprobs": True, **fields}
    assert seen == [expected]


def test_top_logprobs_forwarded_and_read_back_only_when_sent():
    tops = [{"token": "Sun", "logprob": -0.25, "bytes": [83, 117, 110]}, {"token": "Rain", "logprob": -2.0}]
    mode = {"tops": True}
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        r = chat_response("m")
        for e in r["choices"][0]["logprobs"]["content"]:
            e["top_logprobs"] = tops if mode["tops"] else []
        return httpx.Response(200, json=r)

    b = make(handler, model="m")
    req = GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=5, top_logprobs=2),
                          client_fields={"logprobs": True})
    [g] = asyncio.run(b.generate(req))
    assert seen[0]["logprobs"] is True and seen[0]["top_logprobs"] == 2
    assert g.logprobs_content[0]["top_logprobs"] == [{"token": "Sun", "logprob": -0.25, "bytes": [83, 117, 110]},
                                                     {"token": "Rain", "logprob": -2.0, "bytes": None}]
    assert g.top_logprobs is None  # no (token id, logprob) pairs: the server's ids are unknown here
    mode["tops"] = False
    [g] = asyncio.run(b.generate(req))
    assert all(e["top_logprobs"] == [] for e in g.logprobs_content)  # nothing made up


def test_unsupported_logprobs_are_refused_naming_the_parameter():
    seen = []
    b = make(lambda r: seen.append(r) or httpx.Response(200, json=chat_response("m", logprobs=False)),
             logprobs=False, completions=True)
    assert b.max_top_logprobs == 0
    for fields, top, param in (({"logprobs": True}, 0, "logprobs"), ({"logprobs": True}, 3, "top_logprobs")):
        req = GenerateRequest("default", messages=MSGS, sampling=SamplingParams(top_logprobs=top),
                              client_fields=fields)
        with pytest.raises(ValidationError) as err:
            asyncio.run(b.generate(req))
        assert err.value.context["param"] == param
    [g] = asyncio.run(b.generate(GenerateRequest("default", messages=MSGS)))  # not asked: served without
    assert g.logprobs is None and g.logprobs_content is None and "logprobs" not in json.loads(seen[0].content)
    with pytest.raises(ValidationError, match="at most 20") as err:
        asyncio.run(make(lambda r: None).generate(
            GenerateRequest("default", messages=MSGS, sampling=SamplingParams(top_logprobs=21))))
    assert err.value.context["param"] == "top_logprobs"
    with pytest.raises(ValidationError) as err:  # /v1/completions: alternatives are read back on chat only
        asyncio.run(b.generate(GenerateRequest("default", prompt_ids=[1, 2], sampling=SamplingParams(top_logprobs=2))))
    assert err.value.context["param"] == "logprobs" and len(seen) == 1
