"""Tool-call parsers per family (hermes, llama3_json, mistral): the emit contract round-trips, bad output stays text."""

from __future__ import annotations

import json

import pytest

from swarm.errors import ValidationError
from swarm.policy.templates import parser_for
from swarm.policy.toolcalls import TOOL_PARSERS, get_tool_parser, split_tool_calls

NAMES = sorted(TOOL_PARSERS)


@pytest.mark.parametrize("name", NAMES)
def test_one_call_in_the_declared_shape_parses(name: str) -> None:
    p = get_tool_parser(name)
    text = p.call_prefix + json.dumps({"name": "vote", p.arguments_key: {"target": "p3"}}) + p.call_suffix
    assert text == p.format_call("vote", {"target": "p3"})  # what constrained decoding builds on
    content, calls = p.split(text)
    assert content == "" and len(calls) == 1
    assert calls[0]["function"]["name"] == "vote" and json.loads(calls[0]["function"]["arguments"]) == {"target": "p3"}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert any(m in text for m in p.markers)  # streaming holds the call back


@pytest.mark.parametrize("name", NAMES)
def test_broken_calls_stay_in_the_content(name: str) -> None:
    p = get_tool_parser(name)
    for text in (p.call_prefix + '{"name": "vote", "argu' + p.call_suffix, p.call_prefix + '{"arguments": {}}' + p.call_suffix,
                 "just words", p.call_prefix + "[[[[" * 3):
        assert p.split(text) == (text, [])


def test_hermes_keeps_surrounding_text_and_several_calls() -> None:
    p = get_tool_parser("hermes")
    text = "Let me look.\n" + p.format_call("a", {"x": 1}) + "\n" + p.format_call("b", '{"y": 2}')
    content, calls = p.split(text)
    assert content == "Let me look." and [c["function"]["name"] for c in calls] == ["a", "b"]
    assert split_tool_calls(text)[1][1]["function"]["arguments"] == '{"y": 2}'


def test_llama3_json_is_the_whole_reply() -> None:
    p = get_tool_parser("llama3_json")
    _, calls = p.split('<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}')
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    prose = 'The answer is {"name": "a", "parameters": {}}'
    assert p.split(prose) == (prose, [])  # a call inside prose is not a call
    trailing = '{"name": "a", "parameters": {}} and then more'
    assert p.split(trailing) == (trailing, [])


def test_mistral_list_of_calls_after_text() -> None:
    p = get_tool_parser("mistral")
    content, calls = p.split('Checking.[TOOL_CALLS] [{"name": "a", "arguments": {"q": "x"}}, {"name": "b", "arguments": {}}]')
    assert content == "Checking." and [c["function"]["name"] for c in calls] == ["a", "b"]


def test_parser_choice_per_model_config() -> None:
    assert parser_for(None, None).name == "hermes"
    assert parser_for(None, "llama3").name == "llama3_json"
    assert parser_for(None, "mistral").name == "mistral"
    assert parser_for(None, "qwen3").name == "hermes"
    assert parser_for("mistral", "llama3").name == "mistral"  # model.tool_parser wins
    with pytest.raises(ValidationError, match="model.tool_parser"):
        get_tool_parser("pythonic")
