"""Structured outputs through a real gateway with the openai SDK: json_schema, tool_choice, streaming, 400s."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel

NAMES = ["alice", "bob", "carol", "dave", "erin"]
VOTE = {"type": "object", "properties": {"target": {"type": "string", "enum": NAMES}},
        "required": ["target"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "vote", "strict": True, "schema": VOTE}}
TOOLS = [{"type": "function", "function": {"name": "vote", "parameters": VOTE}},
         {"type": "function", "function": {"name": "pass_turn", "parameters": {"type": "object", "properties": {}}}}]
MSGS = [{"role": "system", "content": "You play werewolves."}, {"role": "user", "content": "Day 1. Vote."}]


class Vote(BaseModel):
    target: Literal["alice", "bob", "carol", "dave", "erin"]


def _client(gw: Any) -> tuple[openai.OpenAI, dict[str, Any]]:
    ep = gw.episode()
    return openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0), ep


def test_json_schema_enum_fifty_samples_all_validate(hf_gateway: Any) -> None:
    client, ep = _client(hf_gateway)
    replies = []
    for k in range(25):  # 25 calls x n=2 = 50 samples
        r = client.chat.completions.create(model="default", messages=MSGS, response_format=RF, n=2,
                                           max_tokens=48, temperature=1.0, seed=k)
        replies += [c.message.content for c in r.choices]
        assert all(c.finish_reason == "stop" for c in r.choices)
    assert len(replies) == 50
    for text in replies:
        jsonschema.validate(json.loads(text), VOTE)
    assert len({json.loads(t)["target"] for t in replies}) > 1  # sampled, not forced to one value
    # the SDK's own structured-output path (pydantic model -> strict json_schema -> parsed object)
    for k in range(5):
        parsed = client.chat.completions.parse(model="default", messages=MSGS, response_format=Vote,
                                               max_tokens=48, seed=100 + k)
        assert parsed.choices[0].message.parsed.target in NAMES


def test_each_step_records_its_constraint(hf_gateway: Any) -> None:
    client, ep = _client(hf_gateway)
    r = client.chat.completions.create(model="default", messages=MSGS, response_format=RF, max_tokens=48, seed=1)
    step = hf_gateway.pool.get_step(r.model_extra["swarm"]["step_id"])
    rec = step.metadata["constraint"]
    assert rec["kind"] == "json_schema" and rec["schema"] == VOTE and rec["strict"] is True
    assert rec["vocab_size"] == 1024 and rec["library"].startswith("xgrammar")
    free = client.chat.completions.create(model="default", messages=MSGS, max_tokens=4, seed=1)
    assert "constraint" not in hf_gateway.pool.get_step(free.model_extra["swarm"]["step_id"]).metadata


def test_named_tool_choice_always_calls_that_tool(hf_gateway: Any) -> None:
    client, _ = _client(hf_gateway)
    for k in range(8):
        r = client.chat.completions.create(model="default", messages=MSGS, tools=TOOLS, max_tokens=96, seed=k,
                                           tool_choice={"type": "function", "function": {"name": "vote"}})
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch.message
        call = ch.message.tool_calls[0].function
        assert call.name == "vote"
        jsonschema.validate(json.loads(call.arguments), VOTE)


def test_required_tool_choice_calls_one_of_the_tools(hf_gateway: Any) -> None:
    client, _ = _client(hf_gateway)
    r = client.chat.completions.create(model="default", messages=MSGS, tools=TOOLS, tool_choice="required",
                                       n=6, max_tokens=96, seed=5)
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls", ch.message
        assert [c.function.name for c in ch.message.tool_calls][0] in {"vote", "pass_turn"}


def test_streaming_json_schema_and_tool_call(hf_gateway: Any) -> None:
    client, _ = _client(hf_gateway)
    for k in range(4):
        text, finish = "", None
        for chunk in client.chat.completions.create(model="default", messages=MSGS, response_format=RF,
                                                    max_tokens=48, seed=k, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        assert finish == "stop"
        jsonschema.validate(json.loads(text), VOTE)
    calls, finish = [], None
    for chunk in client.chat.completions.create(model="default", messages=MSGS, tools=TOOLS, max_tokens=96, seed=3,
                                                tool_choice={"type": "function", "function": {"name": "vote"}},
                                                stream=True):
        if chunk.choices:
            calls += chunk.choices[0].delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and [c.function.name for c in calls] == ["vote"]
    jsonschema.validate(json.loads(calls[0].function.arguments), VOTE)


def test_top_logprobs_are_filled(hf_gateway: Any) -> None:
    client, _ = _client(hf_gateway)
    r = client.chat.completions.create(model="default", messages=MSGS, response_format=RF, max_tokens=48, seed=2,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert content and all(1 <= len(t.top_logprobs) <= 3 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)
    # the first token of a compact JSON object: only '{' or '{"' may be sampled, so at most 2 alternatives
    assert {a.token for a in content[0].top_logprobs} <= {"{", '{"'}
    c = client.completions.create(model="default", prompt="hello", max_tokens=4, logprobs=2, seed=1)
    assert all(1 <= len(d) <= 2 for d in c.choices[0].logprobs.top_logprobs)


def test_tool_choice_none_never_returns_tool_calls(hf_gateway: Any) -> None:
    client, _ = _client(hf_gateway)
    r = client.chat.completions.create(model="default", messages=MSGS, tools=TOOLS, tool_choice="none", n=4,
                                       max_tokens=24, seed=9)
    assert all(not ch.message.tool_calls and ch.finish_reason in ("stop", "length") for ch in r.choices)


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/missing"}}, "required": ["a"]}}}}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": RF}, "tool_choice"),
    ({"top_logprobs": 3}, "top_logprobs"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(hf_gateway: Any, body: dict, param: str) -> None:
    ep = hf_gateway.episode()
    r = hf_gateway.chat(ep["api_key"], MSGS, max_tokens=8, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    assert hf_gateway.pool.last_step(ep["episode_id"], with_tokens=False) is None  # nothing stored


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": RF}, "response_format"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    ({"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
])
def test_a_backend_without_constrained_decoding_refuses(gateway: Any, body: dict, param: str) -> None:
    ep = gateway.episode()
    r = gateway.chat(ep["api_key"], MSGS, max_tokens=8, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    ok = gateway.chat(ep["api_key"], MSGS, max_tokens=8, response_format={"type": "text"}, tool_choice="auto",
                      top_logprobs=0)
    assert ok.status_code == 200, ok.text


def test_whitebox_steps_cannot_declare_a_constraint(gateway: Any) -> None:
    ep = gateway.episode()
    step = {"prompt_ids": [5, 6], "response_ids": [7], "metadata": {"constraint": {"kind": "json_object"}}}
    r = gateway.post("/v1/steps", ep["api_key"], json={"steps": [step]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "steps.0.metadata.constraint", r.text


def test_streamed_call_with_a_bad_schema_is_a_400_before_any_chunk(hf_gateway: Any) -> None:
    ep = hf_gateway.episode()
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/missing"}}, "required": ["a"]}}}
    r = hf_gateway.chat(ep["api_key"], MSGS, max_tokens=8, stream=True, response_format=bad)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


def test_completions_accept_response_format_too(hf_gateway: Any) -> None:
    client, _ = _client(hf_gateway)
    for k in range(3):
        r = client.completions.create(model="default", prompt="vote:", max_tokens=48, seed=k,
                                      extra_body={"response_format": RF})
        jsonschema.validate(json.loads(r.choices[0].text), VOTE)
