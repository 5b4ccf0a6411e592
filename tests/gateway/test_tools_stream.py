"""Tool calls through the gateway (echo backend): parsed calls, streamed tool_calls deltas with the
markup held back, and the tool loop staying prefix consistent; the stream hold-back itself."""

from __future__ import annotations

import json
from typing import Any

import openai

from swarm.gateway.streaming import Holdback
from swarm.pool import StepFilter

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def test_holdback_never_streams_markup_or_trailing_space() -> None:
    h = Holdback(("<tool_call>",))
    out = "".join(h.push(p) for p in ["Let", " me", " check.", "\n<to", "ol_call>\n{", '"name": 1}'])
    assert out == "Let me check." == h.sent
    h2 = Holdback(("<tool_call>",))
    assert "".join(h2.push(p) for p in ["a <", "b"]) == "a <b"


def test_tool_loop_sync_and_streaming_stays_prefix_consistent(gateway: Any) -> None:
    ep = gateway.episode()
    client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "find foxes"}]
    r = client.chat.completions.create(model="default", messages=msgs, tools=TOOLS, max_tokens=200)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "search"
    assert json.loads(call.function.arguments) == {"input": "find foxes"}
    msgs += [r.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "3 foxes", "name": "search"}]
    # the echo backend answers a tool turn with its text; then a new user turn asks for a tool again
    r2 = client.chat.completions.create(model="default", messages=msgs, tools=TOOLS, max_tokens=200)
    assert r2.choices[0].message.content == "3 foxes"
    msgs += [r2.choices[0].message, {"role": "user", "content": "more"}]
    stream = client.chat.completions.create(model="default", messages=msgs, tools=TOOLS, max_tokens=200,
                                            stream=True)
    content, calls, finish = "", [], None
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert content == "" and finish == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "search" and calls[0].id
    msgs += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function",
         "function": {"name": "search", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "none"}]
    client.chat.completions.create(model="default", messages=msgs, tools=TOOLS, max_tokens=200)
    steps = gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"]), with_tokens=True, order="episode")
    assert len(steps) == 4
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.prefix_consistent is True, b.metadata
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
    assert steps[0].tool_calls[0]["id"] == call.id and steps[2].finish_reason == "tool_calls"
