"""Prefix-consistent tokenization: reuse the exact ids of the previous call of an episode.

When a chat call's messages extend the previous call (its messages, then an assistant message
equivalent to the reply we returned, then new messages), the prompt ids are::

    previous prompt ids + previous response ids + encode(tail + new_text)

so turn k's prompt + response is an exact token prefix of turn k+1's prompt (what the trainer
merges on), instead of re-tokenizing text that may tokenize differently the second time.

- ``tail`` is the part of the template's assistant turn that the model did not generate. The
  template's turn text is ``render(prev + [asst], gen=False)[len(render(prev, gen=True)):]``
  (e.g. ``"hi<|im_end|>\\n"``); the model generated ``"hi<|im_end|>"``; the tail is ``"\\n"``.
- ``new_text`` is ``render(messages, gen=True)[len(render(prev + [asst], gen=False)):]``.
- When the template renders the assistant turn differently from what the model produced (tool
  calls re-serialized, reasoning stripped, a stop string cut off), the model's own response ids
  are still used for that turn (they are what the model saw itself produce), and the tail is the
  template's turn ending (found by rendering a sentinel reply) minus the end token the model
  already produced. Such steps are still prefix consistent; ``template_mismatch`` marks them.
- Otherwise (history edited, tools changed, a template that is not prefix-stable) the prompt is a
  full re-render and the step records ``prefix_consistent=False``; first calls record ``None``.

Pure functions over the backend's ``render_chat`` / ``encode`` / ``decode``; no I/O, no storage.
Only the previous call (and its n sibling samples) is considered, not older branches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from swarm.policy.base import PolicyBackend

__all__ = ["PreviousCall", "PromptPlan", "normalize_messages", "assistant_matches", "plan_prompt", "canonical_tools",
           "render_key"]

_SENTINEL = "SWARMSENTINEL7f3a9c"


@dataclass(frozen=True)
class PreviousCall:
    """What the prefix logic needs from one stored step of the episode's previous call."""

    step_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]
    response_ids: list[int]
    response_text: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # render(messages, tools, gen=True) as this gateway rendered it for that call, and the render_key it was
    # rendered under: the next call's "head" without rendering the history a third time (None: not known here)
    rendered: str | None = None
    rendered_key: str | None = None


@dataclass(frozen=True)
class PromptPlan:
    prompt_ids: list[int]
    prefix_consistent: bool | None
    parent_step_id: str | None
    reason: str
    template_mismatch: bool = False
    rendered: str | None = None  # render(messages, tools, gen=True): the next call's head (PreviousCall.rendered)
    rendered_key: str | None = None


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as stored and rendered: text parts joined, ``None`` values dropped, keys kept."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = "\n".join(p.get("text") or "" for p in content if isinstance(p, dict))
        if "tool_calls" in m:
            m["tool_calls"] = [{k: v for k, v in tc.items() if v is not None} for tc in m["tool_calls"]] or None
            if m["tool_calls"] is None:
                del m["tool_calls"]
        out.append(m)
    return out


def canonical_tools(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True, separators=(",", ":"))


def render_key(policy: str, tools: list[dict[str, Any]] | None) -> str:
    """What a rendering depends on besides the messages: the policy (its template) and the tools *as ordered*
    (a template may print their keys in the order given, so equal dicts in another order may render otherwise)."""
    return policy + "\x00" + (json.dumps(tools, separators=(",", ":")) if tools else "")


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _calls_key(calls: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    key = []
    for c in calls or []:
        fn = c.get("function") or {}
        key.append((str(fn.get("name")), json.dumps(_args(fn.get("arguments")), sort_keys=True)))
    return key


def assistant_matches(message: dict[str, Any], prev: PreviousCall) -> bool:
    """Whether a history message is the reply we returned for ``prev`` (same text, same tool calls)."""
    if message.get("role") != "assistant":
        return False
    # whitespace around the text is not compared: frameworks strip it, and the turn's tokens are
    # the model's own ids either way (a differing rendering goes through the mismatch path)
    if (message.get("content") or "").strip() != (prev.response_text or "").strip():
        return False
    return _calls_key(message.get("tool_calls")) == _calls_key(prev.tool_calls)


def _full(backend: PolicyBackend, policy: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
          consistent: bool | None, reason: str, parent: str | None) -> PromptPlan:
    text = backend.render_chat(policy, messages, tools, True)
    return PromptPlan(backend.encode(policy, text), consistent, parent, reason, rendered=text,
                      rendered_key=render_key(policy, tools))


def _turn_tail(backend: PolicyBackend, policy: str, prev: PreviousCall, tools: list[dict[str, Any]] | None,
               turn: str, head: str) -> tuple[str | None, bool]:
    """(text the template adds after the model's own tokens, whether the template disagreed)."""
    generated = backend.decode(policy, prev.response_ids)
    if turn.startswith(generated):
        return turn[len(generated):], False
    probe = backend.render_chat(policy, prev.messages + [{"role": "assistant", "content": _SENTINEL}], tools, False)
    if not probe.startswith(head) or _SENTINEL not in probe[len(head):]:
        return None, True
    ending = probe[len(head):].split(_SENTINEL, 1)[1]  # e.g. "<|im_end|>\n"
    last = backend.decode(policy, prev.response_ids[-1:]) if prev.response_ids else ""
    if last and ending.startswith(last):
        return ending[len(last):], True  # the model closed its turn itself
    return ending, True  # cut at a stop string or max_tokens: close the turn for it


def plan_prompt(backend: PolicyBackend, policy: str, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None, candidates: list[PreviousCall]) -> PromptPlan:
    """Prompt ids for ``messages`` (already normalized), reusing a candidate's ids when they extend it."""
    if not candidates:
        return _full(backend, policy, messages, tools, None, "first call of the episode", None)
    tools_key = canonical_tools(tools)
    reason = "history does not extend the previous call"
    for prev in candidates:
        k = len(prev.messages)
        if canonical_tools(prev.tools) != tools_key:
            reason = "tools differ from the previous call"
            continue
        if len(messages) <= k or messages[:k] != prev.messages:
            continue
        if not assistant_matches(messages[k], prev):
            reason = f"message {k} is not the assistant reply returned by the previous call"
            continue
        key = render_key(policy, tools)
        head = prev.rendered if prev.rendered is not None and prev.rendered_key == key else \
            backend.render_chat(policy, prev.messages, tools, True)
        with_reply = backend.render_chat(policy, messages[: k + 1], tools, False)
        full = backend.render_chat(policy, messages, tools, True)
        if not (with_reply.startswith(head) and full.startswith(with_reply)):
            return _full(backend, policy, messages, tools, False, "chat template is not prefix-stable here", prev.step_id)
        tail, mismatch = _turn_tail(backend, policy, prev, tools, with_reply[len(head):], head)
        if tail is None:
            return _full(backend, policy, messages, tools, False, "cannot locate the assistant turn ending", prev.step_id)
        new_ids = backend.encode(policy, tail + full[len(with_reply):])
        ids = list(prev.prompt_ids) + list(prev.response_ids) + new_ids
        return PromptPlan(ids, True, prev.step_id, f"extends {prev.step_id}", mismatch, rendered=full, rendered_key=key)
    return _full(backend, policy, messages, tools, False, reason, candidates[0].step_id)
