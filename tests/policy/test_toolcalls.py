"""Parsing <tool_call> blocks from generated text into OpenAI tool_calls; malformed blocks stay text."""

from __future__ import annotations

import json

from swarm.policy.toolcalls import split_tool_calls


def test_parses_one_and_many_calls():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = split_tool_calls(text)
    assert content == "Let me check."
    assert len(calls) == 1
    c = calls[0]
    assert c["type"] == "function" and c["id"].startswith("call_")
    assert c["function"]["name"] == "get_weather"
    assert json.loads(c["function"]["arguments"]) == {"city": "Paris"}
    two = text + '<tool_call>{"name": "search", "arguments": "{\\"q\\": 1}"}</tool_call>'
    calls = split_tool_calls(two)[1]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "search"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"q": 1}
    assert calls[0]["id"] != calls[1]["id"]
    assert json.loads(split_tool_calls('<tool_call>{"name": "f"}</tool_call>')[1][0]["function"]["arguments"]) == {}


def test_malformed_blocks_are_kept_as_text():
    for text in [
        '<tool_call>{"name": "f", "arguments": {"a": </tool_call>',
        "<tool_call>not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>["f"]</tool_call>',
        '<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {}}',
        "plain text",
        "",
    ]:
        assert split_tool_calls(text) == (text, [])
    mixed = '<tool_call>oops</tool_call> and <tool_call>{"name": "g", "arguments": {}}</tool_call>'
    content, calls = split_tool_calls(mixed)
    assert content == "<tool_call>oops</tool_call> and" and len(calls) == 1
