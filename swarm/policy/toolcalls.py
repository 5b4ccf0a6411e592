"""Parse ``<tool_call>{json}</tool_call>`` blocks in generated text into OpenAI ``tool_calls``.

The Qwen2.5 / Hermes convention: each call is a JSON object ``{"name": ..., "arguments": {...}}``
between ``<tool_call>`` and ``</tool_call>``. A block that does not parse (bad JSON, no name,
unterminated) is not a tool call: it stays in the content text as generated. This module does
not validate arguments against the tool schemas, and never raises on model output.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

__all__ = ["parse_tool_calls", "split_tool_calls", "TOOL_CALL_OPEN", "TOOL_CALL_CLOSE"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _to_call(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # already JSON text: keep it only if it is valid JSON
        try:
            json.loads(args)
        except ValueError:
            return None
        args_text = args
    else:
        args_text = json.dumps({} if args is None else args, ensure_ascii=False)
    return {"id": _new_id(), "type": "function", "function": {"name": obj["name"], "arguments": args_text}}


def split_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """``(content, tool_calls)``: the text with parsed blocks removed (stripped), and the calls.

    Blocks that fail to parse are left in the content untouched. When nothing parses, the content
    is ``text`` unchanged (not stripped).
    """
    calls: list[dict[str, Any]] = []
    pieces: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _to_call(m.group(1))
        if call is None:
            continue
        calls.append(call)
        pieces.append(text[pos : m.start()])
        pos = m.end()
    if not calls:
        return text, []
    pieces.append(text[pos:])
    return "".join(pieces).strip(), calls


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """Only the OpenAI-shaped tool calls found in ``text`` (possibly empty)."""
    return split_tool_calls(text)[1]
