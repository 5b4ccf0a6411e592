"""Chat templates (tiny ChatML and the shipped Qwen2.5-style file): tools render, odd inputs never crash."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from swarm.policy.tiny import load_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
ODD = [
    {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
    {"role": "user", "content": "Weather?", "name": "alice"},
    {"role": "user", "content": [{"type": "text", "text": "In Paris."}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Par'}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": None},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
    },
    {"role": "tool", "tool_call_id": "c3", "content": [{"type": "text", "text": "rain"}]},
    {"role": "assistant", "content": "Sunny in Paris."},
]


@pytest.fixture(params=["tiny_chatml", "chatml_qwen"])
def tok(request, tiny_model_path):
    t = AutoTokenizer.from_pretrained(tiny_model_path)
    t.chat_template = load_template(request.param)
    return t


def test_tools_and_tool_calls_render(tok):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '"name": "get_weather"' in text and "Weather in Paris?" in text
    assert text.endswith("<|im_start|>assistant\n")
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    full = tok.apply_chat_template(
        msgs + [{"role": "assistant", "content": None, "tool_calls": [call]}], tools=TOOLS, tokenize=False
    )
    block = full.split("<tool_call>\n", 2)[-1].split("\n</tool_call>")[0]
    assert json.loads(block) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    # a prompt is a text prefix of the conversation continued by the assistant
    assert full.startswith(text)


def test_odd_inputs_render(tok):
    text = tok.apply_chat_template(ODD, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    for piece in ("Be brief.", "In Paris.", "sunny", "rain", '{"city": "Par', '"city": "Rome"', "Sunny in Paris."):
        assert piece in text
    assert "None" not in text
    # without tools and with no system message
    assert "Weather?" in tok.apply_chat_template(ODD[1:], tokenize=False)


def test_tiny_template_uses_tool_role(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    text = tok.apply_chat_template(ODD, tools=TOOLS, tokenize=False)
    assert "<|im_start|>tool\nsunny<|im_end|>" in text
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
