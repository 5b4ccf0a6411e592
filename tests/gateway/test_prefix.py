"""Prefix-consistent tokenization (swarm.gateway.prefix) on the tiny model's and a Qwen-style template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swarm.gateway.prefix import PreviousCall, normalize_messages, plan_prompt
from swarm.policy.tiny import load_template

TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two numbers",
                                            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


class TemplateBackend:
    """render/encode/decode of a real HF tokenizer with a chosen chat template (no model)."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self.tok = tokenizer
        self.template = template

    def render_chat(self, policy: str, messages: list, tools: list | None, add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, chat_template=self.template)

    def encode(self, policy: str, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, policy: str, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)


@pytest.fixture(scope="module", params=["tiny_chatml", "chatml_qwen"])
def backend(request: pytest.FixtureRequest, tiny_model_path: Path) -> TemplateBackend:
    from transformers import AutoTokenizer

    return TemplateBackend(AutoTokenizer.from_pretrained(str(tiny_model_path)), load_template(request.param))


def _reply(b: TemplateBackend, text: str, eos: bool = True) -> list[int]:
    return b.encode("p", text) + (b.encode("p", "<|im_end|>") if eos else [])


def _prev(step: str, messages: list, tools: list | None, prompt: list[int], resp: list[int], content: str,
          calls: list | None = None) -> PreviousCall:
    return PreviousCall(step, messages, tools, prompt, resp, content, calls or [])


def _is_prefix(a: list[int], b: list[int]) -> bool:
    return b[: len(a)] == a


def test_first_call_is_a_full_render(backend: TemplateBackend) -> None:
    msgs = normalize_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "bob"}])
    plan = plan_prompt(backend, "p", msgs, None, [])
    assert plan.prefix_consistent is None
    assert backend.decode("p", plan.prompt_ids) == backend.render_chat("p", msgs, None, True)


def test_three_plain_turns_are_exact_prefixes(backend: TemplateBackend) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    prev: list[PreviousCall] = []
    sequences = []
    for k in range(3):
        plan = plan_prompt(backend, "p", msgs, None, prev)
        assert plan.prefix_consistent is (None if k == 0 else True)
        # plain text turns: the spliced ids spell exactly the template's rendering
        assert backend.decode("p", plan.prompt_ids) == backend.render_chat("p", msgs, None, True)
        resp = _reply(backend, f"answer {k}")
        sequences.append(plan.prompt_ids + resp)
        prev = [_prev(f"s{k}", list(msgs), None, plan.prompt_ids, resp, f"answer {k}")]
        msgs = msgs + [{"role": "assistant", "content": f"answer {k}"}, {"role": "user", "content": f"next {k}"}]
    for a, b in zip(sequences, sequences[1:], strict=False):
        assert _is_prefix(a, b)


@pytest.mark.parametrize("spacing", ["template", "compact"])
def test_tool_call_turns_keep_the_models_own_ids(backend: TemplateBackend, spacing: str) -> None:
    msgs = [{"role": "user", "content": "add 1"}]
    p1 = plan_prompt(backend, "p", msgs, TOOLS, [])
    call_json = ('{"name": "add", "arguments": {"a": 1}}' if spacing == "template"
                 else '{"name":"add","arguments":{"a":1}}')
    generated = "<tool_call>\n" + call_json + "\n</tool_call>"
    resp = _reply(backend, generated)
    calls = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1})}}]
    prev = [_prev("s1", msgs, TOOLS, p1.prompt_ids, resp, "", calls)]
    # what the OpenAI SDK sends back: content None, the call with our id, then the tool result
    msgs2 = normalize_messages(msgs + [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "2", "name": "add"},
    ])
    p2 = plan_prompt(backend, "p", msgs2, TOOLS, prev)
    assert p2.prefix_consistent is True, p2.reason
    assert p2.template_mismatch is (spacing == "compact")
    assert _is_prefix(p1.prompt_ids + resp, p2.prompt_ids)
    full = backend.render_chat("p", msgs2, TOOLS, True)
    after = backend.render_chat("p", msgs2[:2], TOOLS, False)
    assert backend.decode("p", p2.prompt_ids).endswith(full[len(after):])
    if backend.decode("p", resp) in full:
        assert backend.decode("p", p2.prompt_ids) == full
    # third turn: a plain answer, then another user message
    resp2 = _reply(backend, "it is 2")
    prev2 = [_prev("s2", msgs2, TOOLS, p2.prompt_ids, resp2, "it is 2")]
    msgs3 = msgs2 + [{"role": "assistant", "content": "it is 2"}, {"role": "user", "content": "thanks"}]
    p3 = plan_prompt(backend, "p", msgs3, TOOLS, prev2)
    assert p3.prefix_consistent is True, p3.reason
    assert _is_prefix(p2.prompt_ids + resp2, p3.prompt_ids)


def test_invalid_json_arguments_in_history_do_not_break(backend: TemplateBackend) -> None:
    msgs = normalize_messages([
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "err"},
    ])
    plan = plan_prompt(backend, "p", msgs, TOOLS, [])
    assert plan.prompt_ids


def test_truncated_reply_gets_its_turn_closed(backend: TemplateBackend) -> None:
    msgs = [{"role": "user", "content": "hello"}]
    p1 = plan_prompt(backend, "p", msgs, None, [])
    resp = _reply(backend, "cut sho", eos=False)  # finish_reason "length": no end token
    prev = [_prev("s1", msgs, None, p1.prompt_ids, resp, "cut sho")]
    msgs2 = msgs + [{"role": "assistant", "content": "cut sho"}, {"role": "user", "content": "go on"}]
    p2 = plan_prompt(backend, "p", msgs2, None, prev)
    assert p2.prefix_consistent is True
    assert _is_prefix(p1.prompt_ids + resp, p2.prompt_ids)
    assert backend.decode("p", p2.prompt_ids) == backend.render_chat("p", msgs2, None, True)


def test_edited_history_or_changed_tools_fall_back_to_a_full_render(backend: TemplateBackend) -> None:
    msgs = [{"role": "user", "content": "hello"}]
    p1 = plan_prompt(backend, "p", msgs, None, [])
    resp = _reply(backend, "hi")
    prev = [_prev("s1", msgs, None, p1.prompt_ids, resp, "hi")]
    edited = [{"role": "user", "content": "HELLO"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "?"}]
    other_reply = msgs + [{"role": "assistant", "content": "something else"}, {"role": "user", "content": "?"}]
    same = msgs + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "?"}]
    for m, tools in ((edited, None), (other_reply, None), (same, TOOLS)):
        plan = plan_prompt(backend, "p", m, tools, prev)
        assert plan.prefix_consistent is False
        assert backend.decode("p", plan.prompt_ids) == backend.render_chat("p", m, tools, True)


def test_any_of_n_sibling_samples_can_be_continued(backend: TemplateBackend) -> None:
    msgs = [{"role": "user", "content": "pick"}]
    p1 = plan_prompt(backend, "p", msgs, None, [])
    sibs = [_prev(f"s{i}", msgs, None, p1.prompt_ids, _reply(backend, f"choice {i}"), f"choice {i}") for i in range(3)]
    msgs2 = msgs + [{"role": "assistant", "content": "choice 2"}, {"role": "user", "content": "ok"}]
    plan = plan_prompt(backend, "p", msgs2, None, sibs)
    assert plan.prefix_consistent is True and plan.parent_step_id == "s2"
    assert _is_prefix(sibs[2].prompt_ids + sibs[2].response_ids, plan.prompt_ids)
