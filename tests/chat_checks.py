"""Shared checks of multi-turn chats through the gateway: a streamed reply as a message, prefix-consistent steps."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def streamed_message(chunks: Iterable[Any]) -> dict[str, Any]:
    """The assistant message a streamed chat completion adds up to (content and tool calls)."""
    content, calls = "", []
    for chunk in chunks:
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": c.function.arguments}} for c in calls]
    return msg


def assert_prefix_chain(steps: Sequence[Any]) -> None:
    """Every step extends the one before it token for token (prompt + reply), and says so."""
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.prefix_consistent is True, b.metadata
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
